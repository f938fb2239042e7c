//! `haptic validate`: runs a config's embedded validation tests and reports them.

use super::args::{opt, parse, switch, usage, Spec};
use super::{haproxy_bin, CommandResult, Reported};
use crate::render::Engine;
use crate::validate::suite::{run_suite, SuiteResult, TestResult};

const OPTIONS: &[Spec] = &[
    opt("file", Some('f'), "Config file; repeat to merge in order"),
    opt("test", None, "Run only this test"),
    opt(
        "output",
        Some('o'),
        "Output format: summary (default), json or yaml",
    ),
    switch(
        "verbose",
        "Show target sizes and previews of failed assertions",
    ),
    switch(
        "dump-rendered",
        "Print every test's rendered haproxy.cfg and files",
    ),
    opt(
        "haproxy-bin",
        None,
        "HAProxy binary for haproxy_valid (default: $HAPROXY_BIN or haproxy on PATH)",
    ),
];

const SUMMARY: &str =
    "Run the validation tests embedded in a config (offline; needs haproxy for haproxy_valid).";

pub(super) fn run(args: &[String]) -> CommandResult {
    let parsed = parse(args, OPTIONS)?;
    if parsed.help {
        println!("{}", usage("validate", SUMMARY, OPTIONS));
        return Ok(());
    }
    if let Some(extra) = parsed.positional.first() {
        return Err(format!("unexpected argument {extra:?}").into());
    }
    let files = parsed.all("file");
    if files.is_empty() {
        return Err("validate needs at least one -f CONFIG".to_string().into());
    }
    let format = parsed.last("output").unwrap_or_else(|| "summary".into());
    if !matches!(format.as_str(), "summary" | "json" | "yaml") {
        return Err(format!("unknown output format {format:?} (summary, json, yaml)").into());
    }
    let sources = crate::config::describe_sources(&files);
    let spec = crate::config::load_files(&files)
        .and_then(|d| d.valid_spec(&sources))
        .map_err(|e| e.to_string())?;
    if spec.validation_tests.is_empty() {
        return Err(format!("{sources}: no validation tests found").into());
    }
    let engine = Engine::new(&spec).map_err(|e| format!("{sources}: {e}"))?;
    let bin = haproxy_bin(parsed.last("haproxy-bin"));
    let result = run_suite(&spec, &engine, &bin, parsed.last("test").as_deref())?;

    match format.as_str() {
        "json" => println!(
            "{}",
            serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?
        ),
        "yaml" => print!(
            "{}",
            serde_yaml::to_string(&result).map_err(|e| e.to_string())?
        ),
        _ => print!("{}", summary(&result, parsed.flag("verbose"))),
    }
    if parsed.flag("dump-rendered") {
        for test in &result.tests {
            dump(test);
        }
    }
    if result.all_passed() {
        Ok(())
    } else {
        Err(Reported.into())
    }
}

fn indent(text: &str, prefix: &str) -> String {
    text.lines()
        .map(|l| format!("{prefix}{l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn summary(result: &SuiteResult, verbose: bool) -> String {
    let mut out = String::new();
    for test in &result.tests {
        let mark = if test.passed { "✓" } else { "✗" };
        out.push_str(&format!(
            "{mark} {} ({:.3}s)\n",
            test.test_name, test.duration
        ));
        if !test.description.is_empty() {
            out.push_str(&format!("  {}\n", test.description));
        }
        if let Some(error) = &test.render_error {
            let expected = test
                .assertions
                .iter()
                .any(|a| a.target.as_deref() == Some("rendering_error"));
            if !expected {
                out.push_str("  ✗ Template rendering failed\n");
                out.push_str(&format!(
                    "{}\n",
                    indent(&format!("Error: {error}"), "      ")
                ));
            }
        }
        for a in &test.assertions {
            let mark = if a.passed { "✓" } else { "✗" };
            out.push_str(&format!("  {mark} {}\n", a.description));
            if let Some(error) = &a.error {
                out.push_str(&format!(
                    "{}\n",
                    indent(&format!("Error: {error}"), "      ")
                ));
            }
            if verbose && !a.passed {
                if let (Some(target), Some(size)) = (&a.target, a.target_size) {
                    out.push_str(&format!("      Target: {target} ({size} bytes)\n"));
                }
                if let Some(preview) = &a.target_preview {
                    out.push_str(&format!(
                        "      Content preview:\n{}\n",
                        indent(preview, "        ")
                    ));
                    if a.target_size.unwrap_or(0) > 200 {
                        out.push_str("      (use --dump-rendered for the full content)\n");
                    }
                }
            }
        }
        out.push('\n');
    }
    out.push_str(&format!(
        "Tests: {} passed, {} failed, {} total ({:.3}s)\n",
        result.passed_tests, result.failed_tests, result.total_tests, result.duration
    ));
    out
}

fn dump(test: &TestResult) {
    let rule = "─".repeat(72);
    let Some(rendered) = &test.rendered else {
        println!("{rule}\n{}: nothing rendered\n", test.test_name);
        return;
    };
    println!(
        "{rule}\n{} — haproxy.cfg\n{rule}\n{}",
        test.test_name, rendered.haproxy_cfg
    );
    for file in &rendered.files {
        println!(
            "{rule}\n{} — {} {}\n{rule}\n{}",
            test.test_name, file.kind, file.path, file.content
        );
    }
}
