use std::time::Duration;

use serde_json::json;

use super::*;

fn minimal() -> serde_json::Value {
    json!({
        "podSelector": {"matchLabels": {"app": "haproxy"}},
        "watchedResources": {"ingresses": {"apiVersion": "networking.k8s.io/v1", "resources": "ingresses", "indexBy": ["metadata.namespace"]}},
        "haproxyConfig": {"template": "global\n"}
    })
}

fn doc(spec: serde_json::Value) -> ConfigDocument {
    ConfigDocument {
        metadata: None,
        spec,
    }
}

fn problems(spec: serde_json::Value) -> Vec<String> {
    match doc(spec).valid_spec("test") {
        Err(ConfigError::Invalid(errors)) => errors.iter().map(|e| e.to_string()).collect(),
        Err(other) => vec![other.to_string()],
        Ok(_) => vec![],
    }
}

#[test]
fn defaults_are_applied() {
    let spec = doc(minimal()).valid_spec("test").unwrap();
    assert_eq!(spec.dataplane_port(), 5555);
    assert_eq!(spec.lease_duration(), Duration::from_secs(15));
    assert_eq!(spec.renew_deadline(), Duration::from_secs(10));
    assert_eq!(spec.retry_period(), Duration::from_secs(2));
    assert_eq!(spec.min_deployment_interval(), Duration::from_secs(2));
    assert_eq!(spec.drift_prevention_interval(), Duration::from_secs(60));
    assert_eq!(spec.debounce_interval(), Duration::from_millis(100));
    assert!(spec.leader_election_enabled());
    let paths = spec.dataplane_paths();
    assert_eq!(paths.config_file, "/etc/haproxy/haproxy.cfg");
    assert_eq!(paths.maps_dir, "/etc/haproxy/maps");
    assert_eq!(paths.ssl_certs_dir, "/etc/haproxy/ssl");
    assert_eq!(paths.general_storage_dir, "/etc/haproxy/general");
}

#[test]
fn explicit_values_override_defaults() {
    let mut spec = minimal();
    spec["controller"] = json!({"leaderElection": {"leaseDuration": "30s", "renewDeadline": "20s", "retryPeriod": "5s"}, "reconciliation": {"debounceInterval": "250ms"}});
    spec["dataplane"] = json!({"port": 6000, "minDeploymentInterval": "5s"});
    let spec = doc(spec).valid_spec("test").unwrap();
    assert_eq!(spec.lease_duration(), Duration::from_secs(30));
    assert_eq!(spec.debounce_interval(), Duration::from_millis(250));
    assert_eq!(spec.dataplane_port(), 6000);
    assert_eq!(spec.min_deployment_interval(), Duration::from_secs(5));
}

#[test]
fn every_problem_is_reported_with_its_path() {
    let spec = json!({
        "podSelector": {"matchLabels": {}},
        "controller": {"leaderElection": {"leaseDuration": "10s", "renewDeadline": "12s", "retryPeriod": "soon"}},
        "logging": {"level": "LOUD"},
        "dataplane": {"port": 70000, "mapsDir": "/var/maps"},
        "watchedResources": {
            "ingresses": {"apiVersion": "networking.k8s.io/v1", "resources": "ingresses", "indexBy": []},
            "haproxy-pods": {"apiVersion": "v1", "resources": "pods", "indexBy": ["metadata.name"]},
            "svc": {"apiVersion": "v1", "resources": "services", "indexBy": ["a..b"], "labelSelector": "bad key=1", "store": "on-demand"}
        },
        "maps": {"../evil.map": {"template": "x"}},
        "haproxyConfig": {"template": ""},
        "validationTests": {"t": {"fixtures": {"nope": []}, "assertions": [
            {"type": "contains", "target": "map", "pattern": "("},
            {"type": "jsonpath"},
            {"type": "match_count", "pattern": "x", "expected": "many"}
        ]}}
    });
    let found = problems(spec);
    let expected = [
        "spec.podSelector.matchLabels: at least one label is required",
        "spec.controller.leaderElection.retryPeriod: duration \"soon\"",
        "spec.controller.leaderElection.renewDeadline: must be shorter than leaseDuration",
        "spec.logging.level: unknown level \"LOUD\"",
        "spec.dataplane.port: must be between 1 and 65535",
        "spec.dataplane.mapsDir: must be a directory next to configFile",
        "spec.watchedResources.ingresses.indexBy: at least one expression is required",
        "spec.watchedResources.haproxy-pods: the name \"haproxy-pods\" is reserved",
        "spec.watchedResources.svc.indexBy[0]: invalid path \"a..b\"",
        "spec.watchedResources.svc.labelSelector: invalid label selector",
        "spec.watchedResources.svc.store: \"on-demand\" is not supported",
        "spec.maps.../evil.map: must be a plain file name",
        "spec.haproxyConfig.template: must not be empty",
        "spec.validationTests.t.fixtures.nope: is not a watched resource",
        "spec.validationTests.t.assertions[0].target: unknown target \"map\"",
        "spec.validationTests.t.assertions[0].pattern: invalid regular expression",
        "spec.validationTests.t.assertions[1].type: jsonpath assertions are not supported",
        "spec.validationTests.t.assertions[2].expected: must be a non-negative integer",
    ];
    for e in expected {
        assert!(
            found.iter().any(|f| f.starts_with(e)),
            "missing {e:?} in:\n{}",
            found.join("\n")
        );
    }
}

#[test]
fn type_errors_and_unknown_fields_name_the_field() {
    let mut spec = minimal();
    spec["watchedResources"]["ingresses"]["indexBy"] = json!("metadata.namespace");
    let err = doc(spec).typed_spec("cfg.yaml").unwrap_err().to_string();
    assert!(
        err.starts_with("cfg.yaml: spec.watchedResources.ingresses.indexBy: invalid type"),
        "{err}"
    );
    let mut spec = minimal();
    spec["watchedResource"] = json!({});
    let err = doc(spec).typed_spec("cfg.yaml").unwrap_err().to_string();
    assert!(err.contains("unknown field `watchedResource`"), "{err}");
}

#[test]
fn accepts_full_manifest_or_bare_spec() {
    let bare = serde_yaml::to_string(&minimal()).unwrap();
    let manifest = format!(
        "apiVersion: haproxy-haptic.org/v1alpha1\nkind: HAProxyTemplateConfig\nmetadata: {{name: x}}\nspec:\n{}",
        bare.lines().map(|l| format!("  {l}\n")).collect::<String>()
    );
    let a = parse_fragments(&bare, "a").unwrap();
    let b = parse_fragments(&manifest, "b").unwrap();
    assert_eq!(a[0].spec, b[0].spec);
    assert_eq!(b[0].metadata, Some(json!({"name": "x"})));
    let wrong = parse_fragments("apiVersion: v1\nkind: ConfigMap\n", "c")
        .unwrap_err()
        .to_string();
    assert!(
        wrong.contains("expected kind HAProxyTemplateConfig"),
        "{wrong}"
    );
    let old = parse_fragments(
        "apiVersion: haproxy-haptic.org/v1\nkind: HAProxyTemplateConfig\n",
        "d",
    )
    .unwrap_err()
    .to_string();
    assert!(old.contains("unsupported apiVersion"), "{old}");
}

#[test]
fn merge_maps_by_key_replaces_lists_and_null_deletes() {
    let mut base = doc(json!({
        "templateSnippets": {"a": {"template": "A"}, "b": {"template": "B"}},
        "watchedResources": {"x": {"indexBy": ["one", "two"], "apiVersion": "v1"}},
        "templatingSettings": {"extraContext": {"http_port": 80, "nested": {"k1": 1, "k2": 2}}}
    }));
    base.merge(doc(json!({
        "templateSnippets": {"b": null, "c": {"template": "C"}},
        "watchedResources": {"x": {"indexBy": ["three"]}},
        "templatingSettings": {"extraContext": {"http_port": 8080, "nested": {"k2": 20}}}
    })));
    assert_eq!(
        base.spec,
        json!({
            "templateSnippets": {"a": {"template": "A"}, "c": {"template": "C"}},
            "watchedResources": {"x": {"indexBy": ["three"], "apiVersion": "v1"}},
            "templatingSettings": {"extraContext": {"http_port": 8080, "nested": {"k1": 1, "k2": 20}}}
        })
    );
}

#[test]
fn multi_document_files_merge_in_order() {
    let text = "podSelector: {matchLabels: {a: b}}\n---\npodSelector: {matchLabels: {c: d}}\n---\n";
    let mut merged = ConfigDocument {
        metadata: None,
        spec: json!({}),
    };
    for fragment in parse_fragments(text, "x").unwrap() {
        merged.merge(fragment);
    }
    assert_eq!(
        merged.spec,
        json!({"podSelector": {"matchLabels": {"a": "b", "c": "d"}}})
    );
}
