//! `haptic render`: offline render of a config against fixture manifests into a directory that
//! `haproxy -f OUTDIR/haproxy.cfg` runs as is.

use std::path::PathBuf;
use std::sync::Arc;

use super::args::{opt, parse, switch, usage, Spec};
use super::{haproxy_bin, CommandResult};
use crate::render::current_config::CurrentConfig;
use crate::render::{Engine, RenderCache, RenderInputs};
use crate::validate::fixtures::{load_fixture_stores, FixtureStores};
use crate::validate::haproxy::{check_bundle, write_bundle};
use crate::validate::isolate::{render_validated, Failure};

const OPTIONS: &[Spec] = &[
    opt(
        "file",
        Some('f'),
        "Config file (HAProxyTemplateConfig manifest or bare spec); repeat to merge in order",
    ),
    opt(
        "fixtures",
        None,
        "YAML file or directory of manifests (or a validation-test `fixtures:` layout); repeatable",
    ),
    opt(
        "extra-context",
        None,
        "KEY=VALUE added to extraContext; VALUE is read as a YAML scalar; repeatable",
    ),
    opt(
        "current-config",
        None,
        "A haproxy.cfg to expose as current_config (keeps server slots stable)",
    ),
    opt("output", Some('o'), "Output directory (created if missing)"),
    switch("validate", "Check the result with haproxy -c"),
    switch(
        "timings",
        "Print load, render and write durations to stderr",
    ),
    opt(
        "haproxy-bin",
        None,
        "HAProxy binary for --validate (default: $HAPROXY_BIN or haproxy on PATH)",
    ),
];

const SUMMARY: &str = "Render a config against fixture manifests into a directory.";

/// `KEY=VALUE` with VALUE parsed as a YAML scalar (`http_port=8080` is a number).
pub(crate) fn parse_extra_context(
    items: &[String],
) -> Result<serde_json::Map<String, serde_json::Value>, String> {
    let mut map = serde_json::Map::new();
    for item in items {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("--extra-context {item:?}: expected KEY=VALUE"))?;
        if key.is_empty() {
            return Err(format!("--extra-context {item:?}: empty key"));
        }
        let value: serde_json::Value = if value.is_empty() {
            serde_json::Value::String(String::new())
        } else {
            serde_yaml::from_str(value).map_err(|e| format!("--extra-context {key}: {e}"))?
        };
        map.insert(key.to_string(), value);
    }
    Ok(map)
}

pub(super) fn run(args: &[String]) -> CommandResult {
    let parsed = parse(args, OPTIONS)?;
    if parsed.help {
        println!("{}", usage("render", SUMMARY, OPTIONS));
        return Ok(());
    }
    if let Some(extra) = parsed.positional.first() {
        return Err(format!("unexpected argument {extra:?}").into());
    }
    let files = parsed.all("file");
    if files.is_empty() {
        return Err("render needs at least one -f CONFIG".to_string().into());
    }
    let outdir = PathBuf::from(
        parsed
            .last("output")
            .ok_or_else(|| "render needs -o OUTDIR".to_string())?,
    );
    let sources = crate::config::describe_sources(&files);
    let spec = crate::config::load_files(&files)
        .and_then(|d| d.runtime_spec(&sources))
        .map_err(|e| e.to_string())?;
    let engine = Engine::new(&spec).map_err(|e| format!("{sources}: {e}"))?;

    let load_started = std::time::Instant::now();
    let FixtureStores {
        stores,
        warnings,
        skipped,
    } = load_fixture_stores(&spec, &parsed.all("fixtures"))?;
    for warning in warnings {
        eprintln!("warning: {warning}");
    }
    for problem in skipped {
        eprintln!("warning: skipping fixture {problem}");
    }
    let load_time = load_started.elapsed();
    let objects: usize = stores.values().map(|s| s.len()).sum();
    let mut extra_context = engine.extra_context().clone();
    extra_context.extend(parse_extra_context(&parsed.all("extra-context"))?);
    let current_config = match parsed.last("current-config") {
        Some(path) => Some(Arc::new(CurrentConfig::parse(
            &std::fs::read_to_string(&path).map_err(|e| format!("read {path}: {e}"))?,
        ))),
        None => None,
    };
    std::fs::create_dir_all(&outdir).map_err(|e| format!("create {}: {e}", outdir.display()))?;
    let outdir = outdir
        .canonicalize()
        .map_err(|e| format!("resolve {}: {e}", outdir.display()))?;
    let inputs = RenderInputs {
        stores,
        extra_context,
        current_config,
        base_dir: Some(outdir.display().to_string()),
    };
    let render_started = std::time::Instant::now();
    let validate = parsed.flag("validate");
    let bin = haproxy_bin(parsed.last("haproxy-bin"));
    // With --validate, objects whose configuration haproxy -c rejects are left out and named,
    // as the controller does (validate::isolate).
    let validated = render_validated(
        &engine,
        &inputs,
        &mut RenderCache::once(),
        &mut |_| validate,
        &mut |b| check_bundle(&bin, b),
    )
    .map_err(|e| match e {
        Failure::Render(e) => format!("render failed: {e}"),
        Failure::Check(e) => e.to_string(),
    })?;
    let render_time = render_started.elapsed();
    let rendered = validated.rendered;
    let bundle = validated.bundle;
    write_bundle(&bundle, &outdir).map_err(|e| format!("write {}: {e}", outdir.display()))?;
    println!(
        "wrote {} and {} auxiliary file(s)",
        outdir.join("haproxy.cfg").display(),
        bundle.files.len()
    );
    if parsed.flag("timings") {
        eprintln!(
            "timings: objects={objects} load_ms={:.1} render_ms={:.1} config_bytes={}",
            load_time.as_secs_f64() * 1000.0,
            render_time.as_secs_f64() * 1000.0,
            bundle.haproxy_cfg.len()
        );
    }
    for dropped in &rendered.dropped {
        eprintln!("warning: {dropped}");
    }
    for status in rendered.statuses.iter() {
        println!(
            "status {} {} {}/{}: {}",
            status.api_version, status.kind, status.namespace, status.name, status.status
        );
    }
    if let Some(warnings) = validated.warnings {
        if !warnings.is_empty() {
            eprintln!("{warnings}");
        }
        println!("haproxy -c: configuration is valid");
    }
    println!("bundle {}", bundle.hash());
    Ok(())
}
