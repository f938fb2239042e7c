//! Walks every shipped library for tenant data printed without a typed filter (SECURITY.md).
//!
//! Every validation test's fixtures are a sample of what the libraries read. For each string a
//! tenant controls in them (every field of Ingresses, Services, EndpointSlices, Secrets,
//! Gateways, routes and ReferenceGrants), the value is replaced with a payload that would end
//! the line and add a directive, and the config is rendered again. The render must still
//! succeed (one tenant never stops everyone: a refusal leaves only its object out), and the
//! payload must not reach any output — whichever library reads the field, with or without a
//! filter the author remembered.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use haptic::render::{Engine, RenderInputs};
use serde_json::Value;

#[path = "support/libraries.rs"]
mod libraries;

/// What a tenant writes: a line break, then a directive of its own, a comment and a brace.
const PAYLOAD: &str =
    "x\n  http-request return status 200 content-type text/plain string EVILPAYLOAD #{";
const MARKER: &str = "EVILPAYLOAD";

/// Kinds only admins write (cluster-scoped classes, namespaces) are not tenant data.
fn tenant_kind(object: &Value) -> bool {
    !matches!(
        object.get("kind").and_then(Value::as_str),
        Some("IngressClass" | "GatewayClass" | "Namespace" | "Pod")
    )
}

/// Every string leaf of `value`, as a path of keys and indices. Names and namespaces are
/// validated by the API server (they cannot hold a line break), so they are left alone.
fn string_paths(value: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        Value::String(_) => {
            let p = path.join(".");
            if !matches!(
                p.as_str(),
                "metadata.name" | "metadata.namespace" | "apiVersion" | "kind"
            ) && !p.starts_with("metadata.creationTimestamp")
                && !p.starts_with("metadata.labels")
            {
                out.push(path.clone());
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                path.push(k.clone());
                string_paths(v, path, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                path.push(i.to_string());
                string_paths(v, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

fn set_path(value: &mut Value, path: &[String], new: Value) {
    let mut current = value;
    for step in path {
        current = match current {
            Value::Object(map) => map.get_mut(step).expect("path exists"),
            Value::Array(items) => &mut items[step.parse::<usize>().expect("index")],
            _ => unreachable!("paths come from the same value"),
        };
    }
    *current = new;
}

/// The path with indices folded, so one field is attacked once however many tests show it.
fn shape(kind: &str, path: &[String]) -> String {
    let folded: Vec<&str> = path
        .iter()
        .map(|s| {
            if s.parse::<usize>().is_ok() {
                "[]"
            } else {
                s.as_str()
            }
        })
        .collect();
    format!("{kind}:{}", folded.join("."))
}

#[test]
fn no_tenant_string_reaches_the_configuration_unfiltered() {
    let spec = libraries::spec();
    let engine = Engine::new(&spec).expect("the libraries compile");
    let global = spec.validation_tests.get("_global");
    let mut attacked: BTreeSet<String> = BTreeSet::new();
    let mut failures: Vec<String> = Vec::new();
    let mut renders = 0;
    let mut refused = 0;
    for (test_name, test) in &spec.validation_tests {
        if test_name == "_global" || test.fixtures.is_empty() {
            continue;
        }
        let mut fixtures: BTreeMap<String, Vec<Value>> =
            global.map(|g| g.fixtures.clone()).unwrap_or_default();
        for (resource, objects) in &test.fixtures {
            fixtures
                .entry(resource.clone())
                .or_default()
                .extend(objects.iter().cloned());
        }
        let mut extra = spec.templating_settings.extra_context.clone();
        extra.extend(global.map(|g| g.extra_context.clone()).unwrap_or_default());
        extra.extend(test.extra_context.clone());
        // Raw snippets are the admin's explicit opt-in (`allow_config_snippets`), and the
        // default certificate is the admin's Secret: neither is tenant input.
        let snippets_allowed = extra.get("allow_config_snippets") == Some(&Value::Bool(true));
        let default_cert = (
            extra
                .get("default_ssl_cert_namespace")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            extra
                .get("default_ssl_cert_name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        );
        for (resource, objects) in &fixtures {
            for (i, object) in objects.iter().enumerate() {
                let name = |f: &str| {
                    object
                        .pointer(&format!("/metadata/{f}"))
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                if !tenant_kind(object)
                    || (object.get("kind").and_then(Value::as_str) == Some("Secret")
                        && (name("namespace"), name("name")) == default_cert)
                {
                    continue;
                }
                let kind = object
                    .get("kind")
                    .and_then(Value::as_str)
                    .unwrap_or(resource)
                    .to_string();
                let mut paths = Vec::new();
                string_paths(object, &mut Vec::new(), &mut paths);
                for path in paths {
                    let snippet = path.last().is_some_and(|p| {
                        p.ends_with("config-snippet") || p.ends_with("/config-backend")
                    });
                    if snippet && snippets_allowed {
                        continue;
                    }
                    if !attacked.insert(shape(&kind, &path)) {
                        continue;
                    }
                    let mut mutated = fixtures.clone();
                    let target = &mut mutated.get_mut(resource).expect("resource")[i];
                    // Secret data is base64: attack the decoded text.
                    let payload = if path.first().map(String::as_str) == Some("data") {
                        Value::from(haptic_agent::base64::encode(PAYLOAD.as_bytes()))
                    } else {
                        Value::from(PAYLOAD)
                    };
                    set_path(target, &path, payload);
                    let (stores, _) = haptic::validate::fixtures::build_stores(&spec, mutated);
                    let inputs = RenderInputs {
                        stores: stores
                            .into_iter()
                            .map(|(k, v)| (k, Arc::clone(&v)))
                            .collect(),
                        extra_context: extra.clone(),
                        current_config: None,
                        base_dir: None,
                    };
                    renders += 1;
                    let what = format!("{test_name}: {kind} {}", path.join("."));
                    match engine.render(&inputs) {
                        Err(e) => failures.push(format!("{what}: the whole render failed: {e}")),
                        Ok(r) => {
                            if !r.dropped.is_empty() {
                                refused += 1;
                            }
                            let leaked = r.haproxy_cfg.contains(MARKER)
                                || r.files.iter().any(|f| f.content.contains(MARKER));
                            if leaked {
                                failures.push(format!("{what}: the payload reached the output"));
                            }
                        }
                    }
                }
            }
        }
    }
    eprintln!(
        "attacked {} tenant fields ({renders} renders, {refused} of them left an object out; \
         the others ignore the field)",
        attacked.len()
    );
    // The libraries' tests show well over a hundred distinct tenant fields; far fewer would
    // mean the walk lost its input.
    assert!(renders > 150, "too few fields attacked: {renders}");
    assert!(
        refused * 2 > renders,
        "most attacked fields must be read and refused"
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
