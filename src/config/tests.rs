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
        "spec.validationTests.t.assertions[2].expected: must be an integer between 0 and 1000000000",
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

/// Sets `field` (a dotted path below spec) to `value` in the minimal spec.
fn with(path: &str, value: serde_json::Value) -> serde_json::Value {
    let mut spec = minimal();
    let mut at = &mut spec;
    let parts: Vec<&str> = path.trim_start_matches("spec.").split('.').collect();
    for part in &parts[..parts.len() - 1] {
        if at.get(*part).is_none() {
            at[*part] = json!({});
        }
        at = &mut at[*part];
    }
    at[parts[parts.len() - 1]] = value;
    spec
}

#[test]
fn every_duration_field_enforces_its_range() {
    use super::duration::format_duration;
    for field in model::DURATION_FIELDS {
        // The bounds themselves are accepted (the leader-election order aside).
        for ok in [field.min, field.max, field.default] {
            let found: Vec<String> = problems(with(field.path, json!(format_duration(ok))))
                .into_iter()
                .filter(|p| p.starts_with(field.path) && !p.contains("must be shorter"))
                .collect();
            assert!(found.is_empty(), "{}: {ok:?}: {found:?}", field.path);
        }
        let mut hostile = vec![
            "99999999999999999999999h".to_string(),
            "9223372036854775807s".to_string(),
            "2562047h47m16.854775808s".to_string(),
            format!("{}s", field.max.as_secs() + 1),
            "-1s".to_string(),
            "".to_string(),
            "15".to_string(),
            "1.5".to_string(),
            "1d".to_string(),
            "1..5s".to_string(),
            "NaN".to_string(),
        ];
        if !field.min.is_zero() {
            hostile.push("0".into());
            hostile.push(format!("{}ns", field.min.as_nanos() - 1));
        }
        for text in hostile {
            let found = problems(with(field.path, json!(text)));
            let prefix = format!("{}: ", field.path);
            assert!(
                found.iter().any(|p| p.starts_with(&prefix)),
                "{} = {text:?} accepted: {found:?}",
                field.path
            );
        }
    }
    let found = problems(with(
        "controller.reconciliation.debounceInterval",
        json!("99999999999999999999999h"),
    ));
    assert_eq!(
        found,
        ["spec.controller.reconciliation.debounceInterval: duration \"99999999999999999999999h\" is too large (the parser reads at most 2562047h47m16.854775807s); this field allows 0s to 1m"]
    );
    let found = problems(with("dataplane.deploymentTimeout", json!("2h")));
    assert_eq!(
        found,
        ["spec.dataplane.deploymentTimeout: \"2h\" is out of range: must be between 1s and 10m"]
    );
}

#[test]
fn leader_election_order_is_checked_between_valid_values_only() {
    let spec = with(
        "controller.leaderElection",
        json!({"leaseDuration": "9223372036854775807s", "renewDeadline": "20s"}),
    );
    let found = problems(spec);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("spec.controller.leaderElection.leaseDuration: duration"));
    let found = problems(with(
        "controller.leaderElection",
        json!({"leaseDuration": "1h", "renewDeadline": "1h", "retryPeriod": "10m"}),
    ));
    assert_eq!(
        found,
        ["spec.controller.leaderElection.renewDeadline: must be shorter than leaseDuration"]
    );
}

#[test]
fn every_number_enforces_its_range() {
    for field in model::INT_FIELDS {
        if field.path.contains('<') {
            continue; // per assertion: below
        }
        for ok in [field.min, field.max] {
            assert_eq!(problems(with(field.path, json!(ok))), Vec::<String>::new());
        }
        for bad in [field.min - 1, field.max + 1, i64::MIN, i64::MAX] {
            let found = problems(with(field.path, json!(bad)));
            let want = format!(
                "{}: must be between {} and {}, got {bad}",
                field.path, field.min, field.max
            );
            assert_eq!(found, [want]);
        }
        // Beyond i64, fractional, or not a number: type errors with the field path.
        for bad in [
            json!(u64::MAX),
            json!(1e300),
            json!(1.5),
            json!("80"),
            json!(true),
        ] {
            let found = problems(with(field.path, bad.clone()));
            assert_eq!(found.len(), 1, "{bad}: {found:?}");
            assert!(
                found[0].starts_with(&format!("test: {}: invalid", field.path)),
                "{bad}: {found:?}"
            );
        }
    }
    let with_test = |expected: serde_json::Value| {
        let mut spec = minimal();
        spec["validationTests"] = json!({"t": {"assertions": [
            {"type": "match_count", "target": "haproxy.cfg", "pattern": "x", "expected": expected}
        ]}});
        problems(spec)
    };
    let path = "spec.validationTests.t.assertions[0].expected";
    assert_eq!(with_test(json!(3)), Vec::<String>::new());
    assert_eq!(with_test(json!("1000000000")), Vec::<String>::new());
    assert_eq!(
        with_test(json!(1_000_000_001)),
        [format!(
            "{path}: must be between 0 and 1000000000, got 1000000001"
        )]
    );
    assert_eq!(
        with_test(json!(-1)),
        [format!("{path}: must be between 0 and 1000000000, got -1")]
    );
    for bad in [json!(1.5), json!(u64::MAX), json!("many"), json!("")] {
        assert_eq!(
            with_test(bad.clone()),
            [format!(
                "{path}: must be an integer between 0 and 1000000000"
            )],
            "{bad}"
        );
    }
}

#[test]
fn accessors_never_return_out_of_range_values() {
    // Accessors on a spec that skipped validation fall back to the default.
    let mut spec = Spec::default();
    spec.controller.reconciliation.debounce_interval = Some("99999999999999999999999h".into());
    spec.controller.leader_election.lease_duration = Some("9223372036854775807s".into());
    spec.dataplane.port = Some(0);
    spec.dataplane.max_parallel = Some(-5);
    spec.controller.config_publishing.compression_threshold = Some(i64::MAX);
    assert_eq!(spec.debounce_interval(), Duration::from_millis(100));
    assert_eq!(spec.lease_duration(), Duration::from_secs(15));
    assert_eq!(spec.dataplane_port(), 5555);
    assert_eq!(spec.max_parallel(), 0);
    assert_eq!(spec.compression_threshold(), 1_048_576);
}

#[test]
fn docs_list_every_range() {
    use super::duration::format_duration;
    let docs = include_str!("../../docs/operations.md");
    for f in model::DURATION_FIELDS {
        let row = format!(
            "| `{}` | {} | {} | {} |",
            f.path,
            format_duration(f.min),
            format_duration(f.max),
            format_duration(f.default)
        );
        assert!(
            docs.contains(&row),
            "docs/operations.md lacks the row\n{row}"
        );
    }
    for f in model::INT_FIELDS {
        let default = f.default.map_or("none".to_string(), |d| d.to_string());
        let row = format!("| `{}` | {} | {} | {default} |", f.path, f.min, f.max);
        assert!(
            docs.contains(&row),
            "docs/operations.md lacks the row\n{row}"
        );
    }
    for limit in [
        format!("| file size | {} MiB |", input::MAX_INPUT_BYTES >> 20),
        format!("| nesting depth | {} levels |", input::MAX_DEPTH),
        format!("| nodes after alias expansion | {} |", input::MAX_NODES),
        format!(
            "| scalar text after alias expansion | {} MiB |",
            input::MAX_EXPANDED_BYTES >> 20
        ),
    ] {
        assert!(
            docs.contains(&limit),
            "docs/operations.md lacks the row\n{limit}"
        );
    }
}

#[test]
fn hostile_documents_are_refused_before_deserializing() {
    let deep = format!("a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let e = parse_fragments(&deep, "deep.yaml").unwrap_err().to_string();
    assert!(
        e.starts_with("deep.yaml: nested deeper than 64 levels at line 1"),
        "{e}"
    );
    let json = format!("{{\"a\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let e = parse_fragments(&json, "deep.json").unwrap_err().to_string();
    assert!(e.contains("nested deeper than 64 levels"), "{e}");
    let mut bomb = String::from("a: &a [x,x,x,x,x,x,x,x,x]\n");
    for (prev, c) in "abcdefgh".chars().zip("bcdefghi".chars()) {
        bomb.push_str(&format!(
            "{c}: &{c} [{}]\n",
            vec![format!("*{prev}"); 9].join(",")
        ));
    }
    let e = parse_fragments(&bomb, "bomb.yaml").unwrap_err().to_string();
    assert!(e.contains("alias bomb"), "{e}");
}

#[test]
fn live_objects_nested_too_deep_are_refused_with_the_path() {
    let mut deep = json!("x");
    for _ in 0..100 {
        deep = json!({ "k": deep });
    }
    let mut spec = minimal();
    spec["templatingSettings"] = json!({"extraContext": {"deep": deep}});
    let e = doc(spec).valid_spec("object").unwrap_err().to_string();
    assert!(
        e.starts_with("object: spec.templatingSettings.extraContext.deep.k.k"),
        "{e}"
    );
    assert!(e.contains("nested deeper than 64 levels"), "{e}");
}

#[test]
fn oversized_files_are_refused_without_reading_them_whole() {
    let dir = std::env::temp_dir().join(format!(
        "haptic-config-size-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.yaml");
    let mut text = String::from("podSelector: {matchLabels: {a: b}}\nx: \"");
    text.push_str(&"y".repeat(input::MAX_INPUT_BYTES));
    text.push_str("\"\n");
    std::fs::write(&big, &text).unwrap();
    let e = load_files(&[&big]).unwrap_err().to_string();
    assert!(
        e.contains("more than the 4 MiB a config file may have"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    // A device that never ends is cut off at the limit.
    let e = load_files(&["/dev/zero"]).unwrap_err().to_string();
    assert!(e.contains("4 MiB"), "{e}");
}
