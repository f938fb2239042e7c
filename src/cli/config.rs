//! `haptic config merge -f A -f B`: the merged config as YAML (the merge the Helm chart does).

use std::path::Path;

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
        return Err("config needs a subcommand: merge or view"
            .to_string()
            .into());
    };
    match sub.as_str() {
        "merge" => merge(rest),
        "view" => view(rest),
        "--help" | "-h" => {
            println!("Config utilities.\n\nUsage: haptic config merge -f FILE [-f FILE …]\n       haptic config view [--config-name NAME] [--namespace NS] [--kubeconfig FILE] [-f FILE]");
            Ok(())
        }
        other => Err(format!("unknown config subcommand {other:?} (merge, view)").into()),
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

const VIEW_OPTIONS: &[Spec] = &[
    opt(
        "config-name",
        None,
        "The HAProxyTemplateConfig's name (env CONFIG_NAME; default haptic-config): reads <name>-haproxycfg",
    ),
    opt(
        "namespace",
        None,
        "The controller's namespace (env POD_NAMESPACE; default: from the kubeconfig)",
    ),
    opt(
        "kubeconfig",
        None,
        "kubeconfig file (env KUBECONFIG); absent: in-cluster service account",
    ),
    opt(
        "file",
        Some('f'),
        "Read an HAProxyCfg object (JSON or YAML, as kubectl get -o prints it; - for stdin) instead of the cluster",
    ),
];

const VIEW_SUMMARY: &str =
    "Print the haproxy.cfg the leading controller published (HAProxyCfg <name>-haproxycfg),
decompressed when it was published compressed (spec.compressed: configurations of at least
spec.controller.configPublishing.compressionThreshold bytes), and checked against its checksum.";

fn view(args: &[String]) -> CommandResult {
    let parsed = parse(args, VIEW_OPTIONS)?;
    if parsed.help {
        println!("{}", usage("config view", VIEW_SUMMARY, VIEW_OPTIONS));
        return Ok(());
    }
    if let Some(extra) = parsed.positional.first() {
        return Err(format!("unexpected argument {extra:?}").into());
    }
    let (object, what) = match parsed.last("file") {
        Some(file) => {
            let text = if file == "-" {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                    .map_err(|e| format!("stdin: {e}"))?;
                text
            } else {
                std::fs::read_to_string(&file).map_err(|e| format!("{file}: {e}"))?
            };
            let object: serde_json::Value =
                serde_yaml::from_str(&text).map_err(|e| format!("{file}: {e}"))?;
            (object, file)
        }
        None => {
            use super::run::flag_or_env;
            let kubeconfig = flag_or_env(&parsed, "kubeconfig", "KUBECONFIG");
            let kube = crate::kube::config::KubeConfig::load(kubeconfig.as_deref().map(Path::new))?;
            let client = crate::kube::client::Client::new(&kube)?;
            let namespace = flag_or_env(&parsed, "namespace", "POD_NAMESPACE")
                .unwrap_or_else(|| client.default_namespace().to_string());
            let name = crate::controller::hpcfg::name(
                &flag_or_env(&parsed, "config-name", "CONFIG_NAME")
                    .unwrap_or_else(|| "haptic-config".into()),
            );
            let object = client
                .get(
                    &crate::controller::status::haproxycfg_resource(),
                    Some(&namespace),
                    &name,
                )
                .map_err(|e| format!("HAProxyCfg {namespace}/{name}: {e}"))?;
            (object, format!("HAProxyCfg {namespace}/{name}"))
        }
    };
    let text = crate::controller::hpcfg::content(&object).map_err(|e| format!("{what}: {e}"))?;
    print!("{text}");
    Ok(())
}
