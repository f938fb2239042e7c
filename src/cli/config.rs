//! `haptic config merge -f A -f B`: the merged config as YAML (the merge the Helm chart does).

use super::args::{opt, parse, usage, Spec};
use super::CommandResult;

const OPTIONS: &[Spec] = &[opt(
    "file",
    Some('f'),
    "Config file to merge, in order (repeatable)",
)];

const SUMMARY: &str = "Merge config files in order and print the result as YAML.
Mappings merge by key (later wins, recursively), a null removes a key, lists are replaced.";

pub fn run(args: &[String]) -> CommandResult {
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
    print!("{}", merged.to_yaml());
    Ok(())
}
