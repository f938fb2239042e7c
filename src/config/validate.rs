//! Structural validation of a spec: every problem is reported, each with its field path
//! (`spec.watchedResources.ingresses.indexBy: at least one expression is required`).
//!
//! Template syntax is checked separately when the render engine compiles the templates.

use std::fmt;

use std::time::Duration;

use super::duration::{format_duration, parse_duration};
use super::model::{
    DurationField, IntField, OutputTemplate, Spec, COMPRESSION_THRESHOLD, DATAPLANE_PORT,
    DEBOUNCE_INTERVAL, DEPLOYMENT_TIMEOUT, DRIFT_PREVENTION_INTERVAL, HAPROXY_PODS, LEASE_DURATION,
    MATCH_COUNT_EXPECTED, MAX_PARALLEL, MIN_DEPLOYMENT_INTERVAL, RAW_PUSH_THRESHOLD,
    RENEW_DEADLINE, RETRY_PERIOD,
};
use crate::store::path::PathExpr;
use crate::store::selector::{FieldSelector, LabelSelector};

/// One problem in a config, located by its field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

#[derive(Default)]
struct Problems(Vec<FieldError>);

impl Problems {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    }

    /// Checks a duration field against its range. Returns the effective value (the default
    /// when unset), or `None` after reporting a problem.
    fn duration(&mut self, field: &DurationField, value: &Option<String>) -> Option<Duration> {
        let Some(text) = value.as_deref() else {
            return Some(field.default);
        };
        let (min, max) = (format_duration(field.min), format_duration(field.max));
        match parse_duration(text) {
            Ok(d) if (field.min..=field.max).contains(&d) => Some(d),
            Ok(_) => {
                self.add(
                    field.path,
                    format!("{text:?} is out of range: must be between {min} and {max}"),
                );
                None
            }
            Err(e) => {
                self.add(field.path, format!("{e}; this field allows {min} to {max}"));
                None
            }
        }
    }

    /// Checks an integer field against its range.
    fn int(&mut self, field: &IntField, path: &str, value: Option<i64>) {
        if let Some(v) = value {
            if !(field.min..=field.max).contains(&v) {
                self.add(
                    path,
                    format!("must be between {} and {}, got {v}", field.min, field.max),
                );
            }
        }
    }

    fn regex(&mut self, path: &str, pattern: &str) {
        if let Err(e) = regex::Regex::new(pattern) {
            self.add(path, format!("invalid regular expression: {e}"));
        }
    }
}

/// Names a map, file or certificate may have: a plain file name, no directories.
fn check_file_name(problems: &mut Problems, path: &str, name: &str) {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        problems.add(path, "must be a plain file name (no '/', not '.' or '..')");
    }
}

pub fn validate_spec(spec: &Spec) -> Result<(), Vec<FieldError>> {
    let mut p = Problems::default();

    if spec.pod_selector.match_labels.is_empty() {
        p.add(
            "spec.podSelector.matchLabels",
            "at least one label is required to find the HAProxy pods",
        );
    }
    for (k, v) in &spec.pod_selector.match_labels {
        if k.is_empty() || v.is_empty() {
            p.add(
                format!("spec.podSelector.matchLabels.{k}"),
                "label keys and values must be non-empty",
            );
        }
    }
    if let Some(r) = &spec.credentials_secret_ref {
        if r.name.is_empty() {
            p.add("spec.credentialsSecretRef.name", "must not be empty");
        }
    }

    let le = &spec.controller.leader_election;
    let base = "spec.controller.leaderElection";
    let lease = p.duration(&LEASE_DURATION, &le.lease_duration);
    let renew = p.duration(&RENEW_DEADLINE, &le.renew_deadline);
    let retry = p.duration(&RETRY_PERIOD, &le.retry_period);
    // The order is checked only between values that are themselves valid (or defaults).
    if let (Some(lease), Some(renew)) = (lease, renew) {
        if renew >= lease {
            p.add(
                format!("{base}.renewDeadline"),
                "must be shorter than leaseDuration",
            );
        }
    }
    if let (Some(renew), Some(retry)) = (renew, retry) {
        if retry >= renew {
            p.add(
                format!("{base}.retryPeriod"),
                "must be shorter than renewDeadline",
            );
        }
    }
    if let Some(name) = &le.lease_name {
        if name.is_empty() {
            p.add(format!("{base}.leaseName"), "must not be empty");
        }
    }
    p.duration(
        &DEBOUNCE_INTERVAL,
        &spec.controller.reconciliation.debounce_interval,
    );
    p.int(
        &COMPRESSION_THRESHOLD,
        COMPRESSION_THRESHOLD.path,
        spec.controller.config_publishing.compression_threshold,
    );

    if let Some(level) = &spec.logging.level {
        let known = ["", "TRACE", "DEBUG", "INFO", "WARN", "ERROR"];
        if !known.contains(&level.to_ascii_uppercase().as_str()) {
            p.add(
                "spec.logging.level",
                format!("unknown level {level:?} (TRACE, DEBUG, INFO, WARN or ERROR)"),
            );
        }
    }

    check_dataplane(spec, &mut p);

    match spec.templating_settings.engine.as_deref() {
        None | Some("") | Some("minijinja") | Some("jinja") => {}
        Some(other) => p.add(
            "spec.templatingSettings.engine",
            format!("unsupported engine {other:?}: templates use Jinja2 syntax (engine \"minijinja\" or empty)"),
        ),
    }

    for (i, expr) in spec.watched_resources_ignore_fields.iter().enumerate() {
        if let Err(e) = PathExpr::parse(expr) {
            p.add(format!("spec.watchedResourcesIgnoreFields[{i}]"), e);
        }
    }

    check_watched_resources(spec, &mut p);
    check_templates(spec, &mut p);
    check_validation_tests(spec, &mut p);

    if p.0.is_empty() {
        Ok(())
    } else {
        Err(p.0)
    }
}

fn check_dataplane(spec: &Spec, p: &mut Problems) {
    let d = &spec.dataplane;
    p.int(&DATAPLANE_PORT, DATAPLANE_PORT.path, d.port);
    p.duration(&MIN_DEPLOYMENT_INTERVAL, &d.min_deployment_interval);
    p.duration(&DRIFT_PREVENTION_INTERVAL, &d.drift_prevention_interval);
    p.duration(&DEPLOYMENT_TIMEOUT, &d.deployment_timeout);
    p.int(&MAX_PARALLEL, MAX_PARALLEL.path, d.max_parallel);
    p.int(
        &RAW_PUSH_THRESHOLD,
        RAW_PUSH_THRESHOLD.path,
        d.raw_push_threshold,
    );
    let paths = spec.dataplane_paths();
    let fields = [
        ("configFile", &paths.config_file),
        ("mapsDir", &paths.maps_dir),
        ("sslCertsDir", &paths.ssl_certs_dir),
        ("generalStorageDir", &paths.general_storage_dir),
    ];
    for (field, value) in fields {
        if !value.starts_with('/') || value.split('/').any(|c| c == "..") {
            p.add(
                format!("spec.dataplane.{field}"),
                format!("must be an absolute path without '..', got {value:?}"),
            );
        }
    }
    // Auxiliary files are referenced relative to haproxy.cfg (`default-path config`), so they
    // must live in directories next to it.
    let base = parent(&paths.config_file);
    for (field, dir) in &fields[1..] {
        if parent(dir) != base {
            p.add(
                format!("spec.dataplane.{field}"),
                format!("must be a directory next to configFile (in {base:?}), got {dir:?}"),
            );
        }
    }
}

fn parent(path: &str) -> &str {
    path.trim_end_matches('/')
        .rsplit_once('/')
        .map(|(dir, _)| if dir.is_empty() { "/" } else { dir })
        .unwrap_or("")
}

fn check_watched_resources(spec: &Spec, p: &mut Problems) {
    if spec.watched_resources.is_empty() {
        p.add(
            "spec.watchedResources",
            "at least one watched resource is required",
        );
    }
    for (name, wr) in &spec.watched_resources {
        let base = format!("spec.watchedResources.{name}");
        if name == HAPROXY_PODS {
            p.add(
                &base,
                format!("the name {HAPROXY_PODS:?} is reserved for the HAProxy pods"),
            );
        }
        if name.is_empty() {
            p.add(&base, "names must not be empty");
        }
        let (group, version) = wr.group_version();
        if wr.api_version.is_empty() {
            p.add(
                format!("{base}.apiVersion"),
                "is required (\"v1\" or \"group/version\")",
            );
        } else if version.is_empty()
            || version.contains('/')
            || (wr.api_version.contains('/') && group.is_empty())
        {
            p.add(
                format!("{base}.apiVersion"),
                format!("{:?} is not \"v1\" or \"group/version\"", wr.api_version),
            );
        }
        if wr.resources.is_empty() {
            p.add(
                format!("{base}.resources"),
                "is required (the plural resource name, e.g. \"ingresses\")",
            );
        } else if wr.resources != wr.resources.to_ascii_lowercase() || wr.resources.contains('/') {
            p.add(
                format!("{base}.resources"),
                format!(
                    "{:?} must be a lower-case plural resource name",
                    wr.resources
                ),
            );
        }
        if wr.index_by.is_empty() {
            p.add(
                format!("{base}.indexBy"),
                "at least one expression is required",
            );
        }
        for (i, expr) in wr.index_by.iter().enumerate() {
            if let Err(e) = PathExpr::parse(expr) {
                p.add(format!("{base}.indexBy[{i}]"), e);
            }
        }
        if let Some(sel) = &wr.label_selector {
            if let Err(e) = LabelSelector::parse(sel) {
                p.add(format!("{base}.labelSelector"), e);
            }
        }
        if let Some(sel) = &wr.field_selector {
            if let Err(e) = FieldSelector::parse(sel) {
                p.add(format!("{base}.fieldSelector"), e);
            }
        }
        if wr
            .namespace_selector
            .as_ref()
            .is_some_and(|v| !v.is_null() && v != &serde_json::json!({}) && v != "")
        {
            p.add(
                format!("{base}.namespaceSelector"),
                "is not supported; use `namespace` to watch one namespace, or a labelSelector",
            );
        }
        match wr.store.as_deref() {
            None | Some("") | Some("full") => {}
            Some("on-demand") => p.add(
                format!("{base}.store"),
                "\"on-demand\" is not supported by this version; use \"full\" and watchedResourcesIgnoreFields to save memory",
            ),
            Some(other) => p.add(format!("{base}.store"), format!("unknown store {other:?} (full)")),
        }
    }
}

fn check_output(p: &mut Problems, path: &str, out: &OutputTemplate) {
    if out.template.is_empty() {
        p.add(format!("{path}.template"), "must not be empty");
    }
    for (i, step) in out.post_processing.iter().enumerate() {
        let step_path = format!("{path}.postProcessing[{i}]");
        if step.kind != "regex_replace" {
            p.add(
                format!("{step_path}.type"),
                format!("unknown type {:?} (regex_replace)", step.kind),
            );
            continue;
        }
        match step.params.get("pattern") {
            Some(pattern) => p.regex(&format!("{step_path}.params.pattern"), pattern),
            None => p.add(format!("{step_path}.params.pattern"), "is required"),
        }
        if !step.params.contains_key("replace") {
            p.add(format!("{step_path}.params.replace"), "is required");
        }
        for key in step
            .params
            .keys()
            .filter(|k| *k != "pattern" && *k != "replace")
        {
            p.add(
                format!("{step_path}.params.{key}"),
                "unknown parameter (pattern, replace)",
            );
        }
    }
}

fn check_templates(spec: &Spec, p: &mut Problems) {
    check_output(p, "spec.haproxyConfig", &spec.haproxy_config);
    let mut seen: std::collections::BTreeMap<&str, &str> =
        [("haproxy.cfg", "haproxyConfig")].into();
    for (name, snippet) in &spec.template_snippets {
        if snippet.template.is_empty() {
            p.add(
                format!("spec.templateSnippets.{name}.template"),
                "must not be empty",
            );
        }
        if let Some(other) = seen.insert(name, "templateSnippets") {
            p.add(
                format!("spec.templateSnippets.{name}"),
                format!("name is already used by {other}"),
            );
        }
    }
    let outputs = [
        ("maps", &spec.maps),
        ("files", &spec.files),
        ("sslCertificates", &spec.ssl_certificates),
    ];
    for (section, templates) in outputs {
        for (name, out) in templates {
            let path = format!("spec.{section}.{name}");
            check_file_name(p, &path, name);
            check_output(p, &path, out);
            if let Some(other) = seen.insert(name, section) {
                p.add(
                    &path,
                    format!("name is already used by {other}; template names share one namespace"),
                );
            }
        }
    }
}

const ASSERTION_TYPES: [&str; 7] = [
    "haproxy_valid",
    "contains",
    "not_contains",
    "equals",
    "match_count",
    "match_order",
    "deterministic",
];

fn check_validation_tests(spec: &Spec, p: &mut Problems) {
    for (name, test) in &spec.validation_tests {
        let base = format!("spec.validationTests.{name}");
        if test.assertions.is_empty() && name != "_global" {
            p.add(
                format!("{base}.assertions"),
                "at least one assertion is required",
            );
        }
        if !test.http_resources.is_empty() {
            p.add(
                format!("{base}.httpResources"),
                "HTTP resources are not supported by this version (templates cannot fetch URLs)",
            );
        }
        for key in test.fixtures.keys() {
            if key != HAPROXY_PODS && !spec.watched_resources.contains_key(key) {
                p.add(
                    format!("{base}.fixtures.{key}"),
                    "is not a watched resource (nor \"haproxy-pods\")",
                );
            }
        }
        for (i, a) in test.assertions.iter().enumerate() {
            let path = format!("{base}.assertions[{i}]");
            check_assertion(p, &path, a);
        }
    }
}

fn check_assertion(p: &mut Problems, path: &str, a: &super::model::Assertion) {
    if a.kind == "jsonpath" {
        p.add(
            format!("{path}.type"),
            "jsonpath assertions are not supported; use contains/equals on a target",
        );
        return;
    }
    if !ASSERTION_TYPES.contains(&a.kind.as_str()) {
        p.add(
            format!("{path}.type"),
            format!(
                "unknown assertion type {:?} ({})",
                a.kind,
                ASSERTION_TYPES.join(", ")
            ),
        );
        return;
    }
    if let Err(e) = crate::validate::suite::Target::parse(&a.target) {
        p.add(format!("{path}.target"), e);
    }
    match a.kind.as_str() {
        "contains" | "not_contains" | "match_count" => {
            if a.pattern.is_empty() {
                p.add(format!("{path}.pattern"), "is required");
            } else {
                p.regex(&format!("{path}.pattern"), &a.pattern);
            }
        }
        "match_order" => {
            if a.patterns.is_empty() {
                p.add(
                    format!("{path}.patterns"),
                    "at least one pattern is required",
                );
            }
            for (j, pattern) in a.patterns.iter().enumerate() {
                p.regex(&format!("{path}.patterns[{j}]"), pattern);
            }
        }
        _ => {}
    }
    match a.kind.as_str() {
        "equals" if a.expected.is_none() => p.add(format!("{path}.expected"), "is required"),
        "match_count" => {
            let n = a.expected.as_ref().and_then(|e| match e {
                serde_yaml::Value::Number(n) => n.as_i64(),
                serde_yaml::Value::String(s) => s.trim().parse::<i64>().ok(),
                _ => None,
            });
            match n {
                None => p.add(
                    format!("{path}.expected"),
                    format!(
                        "must be an integer between {} and {}",
                        MATCH_COUNT_EXPECTED.min, MATCH_COUNT_EXPECTED.max
                    ),
                ),
                Some(n) => p.int(&MATCH_COUNT_EXPECTED, &format!("{path}.expected"), Some(n)),
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::parent;

    #[test]
    fn parent_of_paths() {
        assert_eq!(parent("/etc/haproxy/maps"), "/etc/haproxy");
        assert_eq!(parent("/etc/haproxy/maps/"), "/etc/haproxy");
        assert_eq!(parent("/haproxy.cfg"), "/");
    }
}
