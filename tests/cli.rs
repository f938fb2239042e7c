//! End-to-end tests of the `haptic` command line on the shipped example and on a config that
//! exercises every assertion type, with the real `haproxy -c`.

use std::path::PathBuf;
use std::process::{Command, Output};

fn haptic(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_haptic"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run haptic")
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn require_haproxy() {
    let ok = Command::new("haproxy")
        .arg("-v")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "haproxy is not installed: run scripts/test.sh (it installs it) or apt-get install -y haproxy");
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("haptic-cli-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const EXAMPLE: &str = "examples/haproxy-template-config.yaml";

#[test]
fn validate_example_passes() {
    require_haproxy();
    let out = haptic(&["validate", "-f", EXAMPLE]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.contains("3 passed, 0 failed"), "last line: {last}");
}

#[test]
fn render_example_gives_a_directory_haproxy_accepts() {
    require_haproxy();
    let dir = TempDir::new("render");
    let outdir = dir.0.join("out");
    let out = haptic(&[
        "render",
        "-f",
        EXAMPLE,
        "--fixtures",
        "examples/fixtures",
        "-o",
        outdir.to_str().unwrap(),
        "--validate",
        "--extra-context",
        "http_port=23456",
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("skipping ConfigMap demo/unrelated"),
        "unwatched objects are named: {stderr}"
    );
    assert!(stdout.contains("configuration is valid"), "{stdout}");
    let hash_line = stdout
        .lines()
        .find(|l| l.starts_with("bundle "))
        .expect("bundle hash printed");
    assert_eq!(hash_line.len(), "bundle ".len() + 64);
    let cfg = std::fs::read_to_string(outdir.join("haproxy.cfg")).unwrap();
    assert!(
        cfg.contains("bind *:23456"),
        "extra-context number used as a port:\n{cfg}"
    );
    assert!(
        cfg.contains("server SRV_1 127.0.0.1:18081 enabled"),
        "{cfg}"
    );
    let map = std::fs::read_to_string(outdir.join("maps/hosts.map")).unwrap();
    assert_eq!(map, "echo.local be_demo_echo\nhello.local be_demo_hello\n");
    // The directory works from anywhere, as promised: paths resolve relative to haproxy.cfg.
    let check = Command::new("haproxy")
        .arg("-c")
        .arg("-f")
        .arg(outdir.join("haproxy.cfg"))
        .current_dir("/")
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check.stderr));
    // Rendering again gives the same bundle.
    let again = haptic(&[
        "render",
        "-f",
        EXAMPLE,
        "--fixtures",
        "examples/fixtures",
        "-o",
        outdir.to_str().unwrap(),
        "--extra-context",
        "http_port=23456",
    ]);
    assert!(
        text(&again.stdout).contains(hash_line),
        "same inputs, same bundle hash"
    );
}

#[test]
fn broken_template_exits_1_naming_template_and_line() {
    let dir = TempDir::new("broken");
    let original = std::fs::read_to_string(root().join(EXAMPLE)).unwrap();
    let broken = original.replace(
        "{% include \"backend\" %}",
        "{% include \"backend\" %}{{ 1 + }}",
    );
    assert_ne!(broken, original);
    let path = dir.0.join("broken.yaml");
    std::fs::write(&path, broken).unwrap();
    let out = haptic(&[
        "render",
        "-f",
        path.to_str().unwrap(),
        "--fixtures",
        "examples/fixtures",
        "-o",
        dir.0.join("o").to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("template haproxy.cfg line 21"), "{stderr}");
    assert!(stderr.contains("syntax error"), "{stderr}");

    let bad_spec = dir.0.join("bad-spec.yaml");
    std::fs::write(
        &bad_spec,
        original.replace(
            "indexBy: [\"metadata.namespace\", \"metadata.name\"]",
            "indexBy: []",
        ),
    )
    .unwrap();
    let out = haptic(&["validate", "-f", bad_spec.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains(
            "spec.watchedResources.services.indexBy: at least one expression is required"
        ),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn every_assertion_type_and_target_gives_the_right_verdict() {
    require_haproxy();
    let out = haptic(&[
        "validate",
        "-f",
        "tests/fixtures/assertions.yaml",
        "-o",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(1), "some tests are meant to fail");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    let tests = report["tests"].as_array().unwrap();
    let names: Vec<&str> = tests
        .iter()
        .map(|t| t["testName"].as_str().unwrap())
        .collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "results are sorted by name");
    for test in tests {
        let name = test["testName"].as_str().unwrap();
        let passed = test["passed"].as_bool().unwrap();
        assert_eq!(passed, name.starts_with("pass-"), "{name}: {test:#}");
    }
    let find = |name: &str| tests.iter().find(|t| t["testName"] == name).unwrap();
    let missing = &find("fail-missing-file")["assertions"][0]["error"];
    assert!(
        missing
            .as_str()
            .unwrap()
            .contains("no map named \"other.map\" was rendered (rendered: hosts.map)"),
        "{missing}"
    );
    let invalid = &find("fail-haproxy-invalid")["assertions"][0]["error"];
    assert!(
        invalid.as_str().unwrap().contains("no-such-directive"),
        "HAProxy's own message: {invalid}"
    );
    assert_eq!(report["passedTests"], 2);
    assert_eq!(report["failedTests"], tests.len() - 2);

    let one = haptic(&[
        "validate",
        "-f",
        "tests/fixtures/assertions.yaml",
        "--test",
        "pass-all-targets",
    ]);
    assert!(one.status.success(), "{}", text(&one.stdout));
    assert!(text(&one.stdout)
        .lines()
        .last()
        .unwrap()
        .contains("1 passed, 0 failed"));
    let unknown = haptic(&[
        "validate",
        "-f",
        "tests/fixtures/assertions.yaml",
        "--test",
        "nope",
    ]);
    assert!(text(&unknown.stderr).contains("no validation test named \"nope\""));
    let yaml = haptic(&[
        "validate",
        "-f",
        "tests/fixtures/assertions.yaml",
        "-o",
        "yaml",
        "--test",
        "pass-all-targets",
    ]);
    assert!(text(&yaml.stdout).contains("testName: pass-all-targets"));
}

#[test]
fn config_merge_prints_the_merged_config() {
    let dir = TempDir::new("merge");
    let over = dir.0.join("override.yaml");
    std::fs::write(&over, "spec:\n  templatingSettings:\n    extraContext: {http_port: 9999}\n  validationTests: null\napiVersion: haproxy-haptic.org/v1alpha1\nkind: HAProxyTemplateConfig\n").unwrap();
    let out = haptic(&[
        "config",
        "merge",
        "-f",
        EXAMPLE,
        "-f",
        over.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let merged: serde_json::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(
        merged["spec"]["templatingSettings"]["extraContext"],
        serde_json::json!({"http_port": 9999, "slots": 4})
    );
    assert!(
        merged["spec"].get("validationTests").is_none(),
        "null removes a key"
    );
    assert_eq!(merged["metadata"]["name"], "haptic-example");
}

#[test]
fn config_merge_takes_spec_fragments_refuses_ambiguous_shapes_and_validates() {
    let dir = TempDir::new("merge-fragments");
    let write = |name: &str, body: &str| {
        let p = dir.0.join(name);
        std::fs::write(&p, body).unwrap();
        p.to_str().unwrap().to_string()
    };
    let merge = |files: &[&str], extra: &[&str]| {
        let mut args = vec!["config", "merge"];
        args.extend_from_slice(extra);
        for f in files {
            args.extend_from_slice(&["-f", f]);
        }
        haptic(&args)
    };

    // `spec: {…}` alone, the way overrides are written, merges into the spec (not spec.spec).
    let fragment = write(
        "fragment.yaml",
        "spec:\n  templatingSettings:\n    extraContext: {http_port: 9999}\n",
    );
    let out = merge(&[EXAMPLE, &fragment], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let merged: serde_json::Value = serde_yaml::from_slice(&out.stdout).unwrap();
    assert_eq!(
        merged["spec"]["templatingSettings"]["extraContext"]["http_port"],
        9999
    );
    assert!(merged["spec"].get("spec").is_none(), "{merged}");

    // Ambiguous shapes are errors that say what to write instead.
    for (name, body, expected) in [
        (
            "mixed.yaml",
            "spec: {}\nmaps: {}\n",
            "a top-level `spec` next to spec fields (maps)",
        ),
        (
            "kindless.yaml",
            "metadata: {name: x}\nspec: {}\n",
            "`metadata` but no `apiVersion`/`kind`",
        ),
        ("scalar-spec.yaml", "spec: 3\n", "spec: expected a mapping"),
    ] {
        let file = write(name, body);
        let out = merge(&[EXAMPLE, &file], &[]);
        assert!(!out.status.success(), "{name}");
        assert!(
            text(&out.stderr).contains(expected),
            "{name}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(&file),
            "{name}: the error names the file"
        );
        assert!(out.stdout.is_empty(), "{name}");
    }

    // The merged result is validated: a snippet of the wrong shape and a template that does not
    // compile are refused; --no-validate prints the merge anyway.
    for (name, body, expected) in [
        (
            "wrong-type.yaml",
            "spec:\n  templateSnippets: {extra: \"text\"}\n",
            "spec.templateSnippets.extra",
        ),
        (
            "bad-template.yaml",
            "spec:\n  templateSnippets: {extra: {template: \"{{ unclosed\"}}\n",
            "template extra line 1: syntax error",
        ),
    ] {
        let file = write(name, body);
        let out = merge(&[EXAMPLE, &file], &[]);
        assert!(!out.status.success(), "{name}");
        assert!(
            text(&out.stderr).contains(expected),
            "{name}: {}",
            text(&out.stderr)
        );
        assert!(out.stdout.is_empty(), "{name}");
        let out = merge(&[EXAMPLE, &file], &["--no-validate"]);
        assert!(out.status.success(), "{name}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("extra:"), "{name}");
    }
}

#[test]
fn config_view_prints_a_published_config_and_names_what_is_wrong_with_one() {
    let dir = TempDir::new("view");
    let write = |name: &str, text: &str| {
        let p = dir.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let plain = write(
        "plain.yaml",
        "apiVersion: haproxy-haptic.org/v1alpha1\nkind: HAProxyCfg\nmetadata: {name: x-haproxycfg}\nspec: {content: \"global\\n\", compressed: false}\n",
    );
    let out = haptic(&["config", "view", "-f", &plain]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "global\n");
    let damaged = write(
        "damaged.yaml",
        "kind: HAProxyCfg\nspec: {content: \"global\\n\", compressed: true}\n",
    );
    let out = haptic(&["config", "view", "-f", &damaged]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("damaged.yaml") && err.contains("spec.content is not base64"),
        "{err}"
    );
    let tampered = write(
        "tampered.yaml",
        "kind: HAProxyCfg\nspec: {content: \"global\\n\", checksum: \"sha256:0000\"}\n",
    );
    let err = text(&haptic(&["config", "view", "-f", &tampered]).stderr);
    assert!(err.contains("does not match spec.checksum"), "{err}");
}

#[test]
fn help_and_version() {
    for cmd in [
        &["render", "--help"][..],
        &["validate", "--help"],
        &["config", "merge", "--help"],
        &["version", "--help"],
        &["--help"],
    ] {
        let out = haptic(cmd);
        assert!(out.status.success(), "{cmd:?}");
        assert!(
            text(&out.stdout).contains("Usage"),
            "{cmd:?}: {}",
            text(&out.stdout)
        );
    }
    let out = haptic(&["version"]);
    assert!(text(&out.stdout).starts_with("haptic "));
    let out = haptic(&["render", "--bogus"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("unknown option --bogus"));
}

#[test]
fn unindexable_fixtures_are_reported_and_skipped() {
    let dir = TempDir::new("unindexable");
    let fixtures = dir.0.join("f.yaml");
    std::fs::write(
        &fixtures,
        "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: orphan, namespace: demo}\nendpoints: []\n",
    )
    .unwrap();
    let out = haptic(&[
        "render",
        "-f",
        EXAMPLE,
        "--fixtures",
        "examples/fixtures",
        "--fixtures",
        fixtures.to_str().unwrap(),
        "-o",
        dir.0.join("o").to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("skipping fixture endpoints: object demo/orphan has no scalar value at indexBy expression"), "{stderr}");
}

#[test]
fn fixtures_layout_and_haproxy_pods_from_manifests() {
    let dir = TempDir::new("layout");
    let config = dir.0.join("pods.yaml");
    std::fs::write(
        &config,
        "podSelector: {matchLabels: {app: haproxy}}\n\
         watchedResources:\n  services: {apiVersion: v1, resources: services, indexBy: [metadata.namespace, metadata.name]}\n\
         haproxyConfig:\n  template: |\n    pods={{ controller.haproxy_pods.list() | map(attribute='metadata.name') | join(',') }}\n    \
         services={{ resources.services.list() | map(attribute='metadata.name') | join(',') }}\n",
    )
    .unwrap();
    let layout = dir.0.join("layout.yaml");
    std::fs::write(
        &layout,
        "fixtures:\n  services:\n    - metadata: {name: from-layout, namespace: a}\n",
    )
    .unwrap();
    let manifests = dir.0.join("manifests.yaml");
    std::fs::write(
        &manifests,
        "apiVersion: v1\nkind: Pod\nmetadata: {name: haproxy-0, namespace: ingress, labels: {app: haproxy}}\n---\n\
         apiVersion: v1\nkind: Pod\nmetadata: {name: other, namespace: ingress, labels: {app: web}}\n---\n\
         apiVersion: v1\nkind: Service\nmetadata: {name: from-manifest, namespace: a}\n",
    )
    .unwrap();
    let outdir = dir.0.join("out");
    let out = haptic(&[
        "render",
        "-f",
        config.to_str().unwrap(),
        "--fixtures",
        layout.to_str().unwrap(),
        "--fixtures",
        manifests.to_str().unwrap(),
        "-o",
        outdir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let cfg = std::fs::read_to_string(outdir.join("haproxy.cfg")).unwrap();
    assert_eq!(cfg, "pods=haproxy-0\nservices=from-layout,from-manifest\n");
    assert!(
        text(&out.stderr).contains("skipping Pod ingress/other"),
        "{}",
        text(&out.stderr)
    );
}

/// Hostile configs end in a clear error (exit 1, never a panic), with the field path where there
/// is one. No timing is asserted here; docs/operations.md ("Config limits") has the bounds.
#[test]
fn hostile_configs_are_refused_with_clear_errors() {
    let dir = TempDir::new("hostile");
    let write = |name: &str, content: &str| {
        let path = dir.0.join(name);
        std::fs::write(&path, content).unwrap();
        path.to_str().unwrap().to_string()
    };
    let outdir = dir.0.join("out");
    let outdir = outdir.to_str().unwrap();
    // Each file is checked alone, then merged after the shipped example.
    let refused = |path: &str, want: &str| {
        for args in [
            vec!["validate", "-f", path],
            vec!["render", "-f", path, "-o", outdir],
            vec!["validate", "-f", EXAMPLE, "-f", path],
        ] {
            let out = haptic(&args);
            let stderr = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
            assert!(
                stderr.contains(want),
                "{args:?}: want {want:?} in:\n{stderr}"
            );
            assert!(!stderr.contains("panicked"), "{stderr}");
        }
    };

    // 100,000 levels of nesting (200 KB), as YAML flow and as JSON.
    let deep = format!("a: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    refused(
        &write("deep.yaml", &deep),
        "deep.yaml: nested deeper than 64 levels at line 1 column 67",
    );
    let deep_json = format!(
        "{{\"a\": {}{}}}",
        "{\"b\": ".repeat(100_000),
        "}".repeat(100_000)
    );
    refused(
        &write("deep.json", &deep_json),
        "nested deeper than 64 levels",
    );

    // Billion laughs: nine levels of nine aliases.
    let mut bomb = String::from("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for (prev, c) in "abcdefgh".chars().zip("bcdefghi".chars()) {
        bomb.push_str(&format!(
            "{c}: &{c} [{}]\n",
            vec![format!("*{prev}"); 9].join(", ")
        ));
    }
    refused(&write("bomb.yaml", &bomb), "an alias bomb?");

    // Absurd durations and numbers name their field (merged over the example, which is valid).
    let with = |extra: &str| format!("{extra}\n");
    let refused = |path: &str, want: &str| {
        let out = haptic(&["validate", "-f", EXAMPLE, "-f", path]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{path}: {stderr}");
        assert!(stderr.contains(want), "{path}: want {want:?} in:\n{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    };
    refused(
        &write(
            "debounce.yaml",
            &with("controller: {reconciliation: {debounceInterval: 99999999999999999999999h}}"),
        ),
        "spec.controller.reconciliation.debounceInterval: duration \"99999999999999999999999h\" is too large",
    );
    refused(
        &write(
            "lease.yaml",
            &with("controller: {leaderElection: {leaseDuration: 9223372036854775807s}}"),
        ),
        "spec.controller.leaderElection.leaseDuration: duration \"9223372036854775807s\" is too large",
    );
    refused(
        &write("timeout.yaml", &with("dataplane: {deploymentTimeout: -5s}")),
        "spec.dataplane.deploymentTimeout: duration \"-5s\" is negative",
    );
    refused(
        &write("port.yaml", &with("dataplane: {port: 99999999999}")),
        "spec.dataplane.port: must be between 1 and 65535, got 99999999999",
    );
    refused(
        &write("parallel.yaml", &with("dataplane: {maxParallel: 1e400}")),
        "spec.dataplane.maxParallel: invalid type",
    );
    refused(
        &write("inf.yaml", &with("dataplane: {maxParallel: .inf}")),
        ".inf at line 1 column 26 is not a finite number",
    );
}
