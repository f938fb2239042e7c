//! `haptic config merge -f A -f B`: the merged config as YAML (the merge the Helm chart does).

use super::args::{opt, parse, switch, usage, Spec};
use super::CommandResult;

const OPTIONS: &[Spec] = &[
    opt(
        "file",
        Some('f'),
        "Config file to merge, in order (repeatable)",
    ),
    switch(
        "no-validate",
        "Print the merged config even when it is not a valid spec",
    ),
];

const SUMMARY: &str = "Merge config files in order and print the result as YAML.
Mappings merge by key (later wins, recursively), a null removes a key, lists are replaced.
A file is an HAProxyTemplateConfig manifest, a bare spec, or `spec: {…}` alone (a fragment).
The result is checked as `haptic validate` checks a config before running its tests (types,
names, references, templates that compile); one that fails is refused unless --no-validate.";

pub(super) fn run(args: &[String]) -> CommandResult {
    let Some((sub, rest)) = args.split_first() else {
        return Err("config needs a subcommand: merge".to_string().into());
    };
    match sub.as_str() {
        "merge" => merge(rest),
        "--help" | "-h" => {
            println!("Config utilities.\n\nUsage: haptic config merge -f FILE [-f FILE …]");
            Ok(())
        }
        other => Err(format!("unknown config subcommand {other:?} (merge)").into()),
    }
}

fn merge(args: &[String]) -> CommandResult {
    let parsed = parse(args, OPTIONS)?;
    if parsed.help {
        println!("{}", usage("config merge", SUMMARY, OPTIONS));
        return Ok(());
    }
    if let Some(extra) = parsed.positional.first() {
        return Err(format!("unexpected argument {extra:?} (config files go after -f)").into());
    }
    let files = parsed.all("file");
    if files.is_empty() {
        return Err("config merge needs at least one -f FILE".to_string().into());
    }
    let merged = crate::config::load_files(&files).map_err(|e| e.to_string())?;
    if !parsed.flag("no-validate") {
        // What `haptic validate` checks before it runs the tests: the typed spec and templates
        // that compile.
        let sources = crate::config::describe_sources(&files);
        let not_printed = "(the merge is not printed; --no-validate prints it anyway)";
        let spec = merged
            .valid_spec(&sources)
            .map_err(|e| format!("{e}\n{not_printed}"))?;
        crate::render::Engine::new(&spec).map_err(|e| format!("{sources}: {e}\n{not_printed}"))?;
    }
    print!("{}", merged.to_yaml());
    Ok(())
}
