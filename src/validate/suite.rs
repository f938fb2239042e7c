//! The embedded validation tests of a config: fixtures → render → assertions.
//!
//! Each test gets fresh stores built from the `_global` fixtures merged with its own, the
//! config's `extraContext` overridden by `_global`'s and then by the test's, and the test's
//! `currentConfig`. Unlike
//! upstream, an unknown target is a config error and a missing file fails the assertion (never
//! a silent fallback to haproxy.cfg), and results are sorted by test name.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use haptic_agent::protocol::FileKind;
use serde::Serialize;
use serde_json::Value;

use super::fixtures::build_stores;
use super::haproxy::check_bundle;
use crate::config::model::{Assertion, ValidationTest};
use crate::config::Spec;
use crate::render::current_config::CurrentConfig;
use crate::render::{Engine, RenderInputs, Rendered};

pub(crate) const GLOBAL_TEST: &str = "_global";

/// What an assertion looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    HaproxyCfg,
    File(FileKind, String),
    RenderingError,
    /// The objects left out of the configuration, one `Kind ns/name: reason` line each.
    Dropped,
}

impl Target {
    pub(crate) fn parse(text: &str) -> Result<Target, String> {
        match text {
            "" | "haproxy.cfg" => return Ok(Target::HaproxyCfg),
            "rendering_error" => return Ok(Target::RenderingError),
            "dropped" => return Ok(Target::Dropped),
            _ => {}
        }
        let (kind, name) = text
            .split_once(':')
            .ok_or_else(|| format!("unknown target {text:?} (haproxy.cfg, map:NAME, file:NAME, cert:NAME, crt-list:NAME, rendering_error, dropped)"))?;
        let kind = match kind {
            "map" => FileKind::Map,
            "file" => FileKind::General,
            "cert" => FileKind::Cert,
            "crt-list" => FileKind::CrtList,
            other => {
                return Err(format!(
                    "unknown target kind {other:?} in {text:?} (map, file, cert, crt-list)"
                ))
            }
        };
        if name.is_empty() {
            return Err(format!("target {text:?} needs a file name after ':'"));
        }
        Ok(Target::File(kind, name.to_string()))
    }
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AssertionResult {
    #[serde(rename = "type")]
    pub kind: String,
    pub description: String,
    pub passed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_size: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_preview: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TestResult {
    pub test_name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub passed: bool,
    pub duration: f64,
    pub assertions: Vec<AssertionResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub render_error: Option<String>,
    #[serde(skip)]
    pub rendered: Option<Rendered>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SuiteResult {
    pub total_tests: usize,
    pub passed_tests: usize,
    pub failed_tests: usize,
    pub duration: f64,
    pub tests: Vec<TestResult>,
}

impl SuiteResult {
    pub(crate) fn all_passed(&self) -> bool {
        self.total_tests > 0 && self.failed_tests == 0
    }
}

/// Runs the named test, or every test (sorted by name) when `only` is `None`.
pub(crate) fn run_suite(
    spec: &Spec,
    engine: &Engine,
    haproxy_bin: &str,
    only: Option<&str>,
) -> Result<SuiteResult, String> {
    let started = Instant::now();
    let names: Vec<&String> = match only {
        Some(name) => {
            let key = spec
                .validation_tests
                .keys()
                .find(|k| *k == name)
                .ok_or_else(|| {
                    let known: Vec<&str> =
                        spec.validation_tests.keys().map(String::as_str).collect();
                    format!(
                        "no validation test named {name:?} (tests: {})",
                        known.join(", ")
                    )
                })?;
            vec![key]
        }
        // `_global` only supplies shared fixtures unless it asserts something itself.
        None => spec
            .validation_tests
            .iter()
            .filter(|(n, t)| *n != GLOBAL_TEST || !t.assertions.is_empty())
            .map(|(n, _)| n)
            .collect(),
    };
    let global = spec.validation_tests.get(GLOBAL_TEST);
    let tests: Vec<TestResult> = names
        .into_iter()
        .map(|name| {
            run_test(
                spec,
                engine,
                haproxy_bin,
                name,
                &spec.validation_tests[name],
                global,
            )
        })
        .collect();
    let passed = tests.iter().filter(|t| t.passed).count();
    Ok(SuiteResult {
        total_tests: tests.len(),
        passed_tests: passed,
        failed_tests: tests.len() - passed,
        duration: started.elapsed().as_secs_f64(),
        tests,
    })
}

/// `_global` fixtures first, then the test's; an object with the same identity (resource,
/// apiVersion, kind, namespace, name) in the test replaces the global one.
fn merged_fixtures(
    test: &ValidationTest,
    global: Option<&ValidationTest>,
) -> BTreeMap<String, Vec<Value>> {
    let identity = |o: &Value| {
        let s = |p: &str| {
            o.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        (
            s("/apiVersion"),
            s("/kind"),
            s("/metadata/namespace"),
            s("/metadata/name"),
        )
    };
    let mut merged = global.map(|g| g.fixtures.clone()).unwrap_or_default();
    for (resource, objects) in &test.fixtures {
        let list = merged.entry(resource.clone()).or_default();
        for object in objects {
            match list.iter().position(|o| identity(o) == identity(object)) {
                Some(i) => list[i] = object.clone(),
                None => list.push(object.clone()),
            }
        }
    }
    merged
}

fn run_test(
    spec: &Spec,
    engine: &Engine,
    haproxy_bin: &str,
    name: &str,
    test: &ValidationTest,
    global: Option<&ValidationTest>,
) -> TestResult {
    let started = Instant::now();
    let fixtures = if name == GLOBAL_TEST {
        test.fixtures.clone()
    } else {
        merged_fixtures(test, global)
    };
    // The config's extraContext, then `_global`'s (so tests can pin values an installation
    // overrides, such as ports), then the test's own.
    let mut extra = engine.extra_context().clone();
    if name != GLOBAL_TEST {
        extra.extend(global.map(|g| g.extra_context.clone()).unwrap_or_default());
    }
    extra.extend(test.extra_context.clone());
    let mut result = TestResult {
        test_name: name.to_string(),
        description: test.description.clone(),
        passed: false,
        duration: 0.0,
        assertions: Vec::new(),
        render_error: None,
        rendered: None,
    };
    // In a test, a fixture that cannot be stored is a mistake in the test: report it as such.
    let (stores, skipped) = build_stores(spec, fixtures);
    let stores = if skipped.is_empty() {
        Ok(stores)
    } else {
        Err(format!("fixtures not stored: {}", skipped.join("; ")))
    };
    let inputs = match stores {
        Ok(stores) => RenderInputs {
            stores,
            extra_context: extra,
            current_config: test
                .current_config
                .as_deref()
                .map(|c| Arc::new(CurrentConfig::parse(c))),
            base_dir: None,
        },
        Err(e) => {
            result.render_error = Some(e);
            result.duration = started.elapsed().as_secs_f64();
            return result;
        }
    };
    let rendered = engine.render(&inputs);
    let render_error = rendered.as_ref().err().map(|e| e.to_string());
    let ctx = AssertionContext {
        rendered: rendered.as_ref().ok(),
        render_error: render_error.as_deref(),
        engine,
        inputs: &inputs,
        haproxy_bin,
    };
    result.assertions = test.assertions.iter().map(|a| ctx.check(a)).collect();
    let expects_error = test
        .assertions
        .iter()
        .any(|a| a.target == "rendering_error");
    result.passed =
        result.assertions.iter().all(|a| a.passed) && (render_error.is_none() || expects_error);
    result.render_error = render_error;
    result.rendered = rendered.ok();
    result.duration = started.elapsed().as_secs_f64();
    result
}

struct AssertionContext<'a> {
    rendered: Option<&'a Rendered>,
    render_error: Option<&'a str>,
    engine: &'a Engine,
    inputs: &'a RenderInputs,
    haproxy_bin: &'a str,
}

fn preview(text: &str) -> String {
    text.chars().take(200).collect()
}

impl AssertionContext<'_> {
    /// The text a target names, or why it is not there.
    fn target_text(&self, target: &Target) -> Result<String, String> {
        match target {
            Target::RenderingError => Ok(self.render_error.unwrap_or_default().to_string()),
            _ if self.rendered.is_none() => Err(format!(
                "rendering failed: {}",
                self.render_error.unwrap_or_default()
            )),
            Target::Dropped => Ok(self
                .rendered
                .map(|r| {
                    r.dropped
                        .iter()
                        .map(|d| format!("{}: {}\n", d.owner, d.message))
                        .collect::<String>()
                })
                .unwrap_or_default()),
            Target::HaproxyCfg => Ok(self
                .rendered
                .map(|r| r.haproxy_cfg.to_string())
                .unwrap_or_default()),
            Target::File(kind, name) => {
                let files = &self
                    .rendered
                    .map(|r| r.files.as_slice())
                    .unwrap_or_default();
                let same_kind: Vec<_> = files.iter().filter(|f| f.kind == *kind).collect();
                let sanitized = crate::render::context::sanitize_file_name(name);
                same_kind
                    .iter()
                    .find(|f| f.name == *name || f.name == sanitized)
                    .map(|f| f.content.to_string())
                    .ok_or_else(|| {
                        let names: Vec<&str> = same_kind.iter().map(|f| f.name.as_str()).collect();
                        format!(
                            "no {kind} named {name:?} was rendered (rendered: {})",
                            if names.is_empty() {
                                "none".into()
                            } else {
                                names.join(", ")
                            }
                        )
                    })
            }
        }
    }

    fn check(&self, a: &Assertion) -> AssertionResult {
        let description = if a.description.is_empty() {
            default_description(a)
        } else {
            a.description.clone()
        };
        let mut result = AssertionResult {
            kind: a.kind.clone(),
            description,
            passed: false,
            error: None,
            target: None,
            target_size: None,
            target_preview: None,
        };
        let outcome = match a.kind.as_str() {
            "haproxy_valid" => self.haproxy_valid(),
            "deterministic" => self.deterministic(),
            _ => {
                let target = Target::parse(&a.target);
                let text = target.clone().and_then(|t| self.target_text(&t));
                match text {
                    Ok(text) => {
                        result.target = Some(if a.target.is_empty() {
                            "haproxy.cfg".into()
                        } else {
                            a.target.clone()
                        });
                        result.target_size = Some(text.len());
                        result.target_preview = Some(preview(&text));
                        check_text(a, &text)
                    }
                    Err(e) => Err(e),
                }
            }
        };
        match outcome {
            Ok(()) => result.passed = true,
            Err(e) => result.error = Some(e),
        }
        result
    }

    fn haproxy_valid(&self) -> Result<(), String> {
        let rendered = self.rendered.ok_or_else(|| {
            format!(
                "rendering failed: {}",
                self.render_error.unwrap_or_default()
            )
        })?;
        let bundle = rendered.to_bundle();
        check_bundle(self.haproxy_bin, &bundle)
            .map(|_| ())
            .map_err(|e| format!("{e} (config: {} bytes)", bundle.haproxy_cfg.len()))
    }

    fn deterministic(&self) -> Result<(), String> {
        let first = self.rendered.ok_or_else(|| {
            format!(
                "rendering failed: {}",
                self.render_error.unwrap_or_default()
            )
        })?;
        let second = self
            .engine
            .render(self.inputs)
            .map_err(|e| format!("second render failed: {e}"))?;
        if first.haproxy_cfg != second.haproxy_cfg {
            return Err(format!(
                "haproxy.cfg differs between two renders:\n{}",
                first_difference(&first.haproxy_cfg, &second.haproxy_cfg)
            ));
        }
        let paths = |r: &Rendered| r.files.iter().map(|f| f.path.clone()).collect::<Vec<_>>();
        if paths(first) != paths(&second) {
            return Err(format!(
                "the set of files differs between two renders: {:?} vs {:?}",
                paths(first),
                paths(&second)
            ));
        }
        for (a, b) in first.files.iter().zip(&second.files) {
            if a.content != b.content {
                return Err(format!(
                    "{} differs between two renders:\n{}",
                    a.path,
                    first_difference(&a.content, &b.content)
                ));
            }
        }
        Ok(())
    }
}

/// The first differing line of two texts, with one line of context.
fn first_difference(a: &str, b: &str) -> String {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let i = la
        .iter()
        .zip(&lb)
        .position(|(x, y)| x != y)
        .unwrap_or(la.len().min(lb.len()));
    format!(
        "line {}:\n- {}\n+ {}",
        i + 1,
        la.get(i).unwrap_or(&"<end>"),
        lb.get(i).unwrap_or(&"<end>")
    )
}

fn default_description(a: &Assertion) -> String {
    let target = if a.target.is_empty() {
        "haproxy.cfg"
    } else {
        a.target.as_str()
    };
    match a.kind.as_str() {
        "haproxy_valid" => "HAProxy accepts the configuration".into(),
        "deterministic" => "rendering twice gives identical output".into(),
        "contains" => format!("{target} contains /{}/", a.pattern),
        "not_contains" => format!("{target} does not contain /{}/", a.pattern),
        "equals" => format!("{target} equals the expected text"),
        "match_count" => format!(
            "{target} matches /{}/ {} times",
            a.pattern,
            expected_text(a)
        ),
        "match_order" => format!("{target} matches {} patterns in order", a.patterns.len()),
        other => other.to_string(),
    }
}

fn expected_text(a: &Assertion) -> String {
    match &a.expected {
        Some(serde_yaml::Value::String(s)) => s.clone(),
        Some(serde_yaml::Value::Number(n)) => n.to_string(),
        Some(serde_yaml::Value::Bool(b)) => b.to_string(),
        Some(serde_yaml::Value::Null) | None => String::new(),
        Some(other) => serde_yaml::to_string(other).unwrap_or_default(),
    }
}

fn compile(pattern: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(pattern).map_err(|e| format!("invalid pattern {pattern:?}: {e}"))
}

fn check_text(a: &Assertion, text: &str) -> Result<(), String> {
    match a.kind.as_str() {
        "contains" => {
            if compile(&a.pattern)?.is_match(text) {
                Ok(())
            } else {
                Err(format!("pattern /{}/ not found", a.pattern))
            }
        }
        "not_contains" => match compile(&a.pattern)?.find(text) {
            None => Ok(()),
            Some(m) => Err(format!(
                "pattern /{}/ unexpectedly found: {:?}",
                a.pattern,
                m.as_str()
            )),
        },
        "equals" => {
            let expected = expected_text(a);
            if text == expected {
                Ok(())
            } else {
                Err(format!("expected {expected:?}, got {:?}", preview(text)))
            }
        }
        "match_count" => {
            let expected: usize = expected_text(a)
                .trim()
                .parse()
                .map_err(|_| format!("expected must be an integer, got {:?}", expected_text(a)))?;
            let count = compile(&a.pattern)?.find_iter(text).count();
            if count == expected {
                Ok(())
            } else {
                Err(format!(
                    "pattern /{}/ matched {count} times, expected {expected}",
                    a.pattern
                ))
            }
        }
        "match_order" => {
            if a.patterns.is_empty() {
                return Err("match_order needs at least one pattern".into());
            }
            let mut last = 0usize;
            for (i, pattern) in a.patterns.iter().enumerate() {
                let m = compile(pattern)?
                    .find(text)
                    .ok_or_else(|| format!("pattern {} /{pattern}/ not found", i + 1))?;
                if m.start() < last {
                    return Err(format!(
                        "pattern {} /{pattern}/ first matches before pattern {}",
                        i + 1,
                        i
                    ));
                }
                last = m.start();
            }
            Ok(())
        }
        other => Err(format!("unknown assertion type {other:?}")),
    }
}
