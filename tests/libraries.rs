//! The template libraries in `chart/libraries/` under real traffic: each test renders fixture
//! manifests with `haptic render` (all six libraries merged), runs a real HAProxy on the result
//! on free 127.0.0.1 ports, and sends requests with curl to echo backends that report what
//! they received. `libraries_validate` runs the libraries' own embedded validation tests.

#[path = "libraries/harness.rs"]
mod harness;

use std::process::Command;

use harness::{root, service_yaml, Echo, Scenario, LIBRARIES};

#[test]
fn libraries_validate() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_haptic"));
    cmd.current_dir(root()).arg("validate");
    for lib in LIBRARIES {
        cmd.arg("-f").arg(lib);
    }
    let out = cmd.output().expect("run haptic validate");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(" 0 failed"), "{stdout}");
}

fn ingress(name: &str, body: &str) -> String {
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default, creationTimestamp: \"2024-01-01T00:00:00Z\"}}\nspec:\n  ingressClassName: haproxy\n{body}"
    )
}

fn path(p: &str, kind: &str, svc: &str) -> String {
    format!("{{path: {p}, pathType: {kind}, backend: {{service: {{name: {svc}, port: {{name: http}}}}}}}}")
}

#[test]
fn ingress_routing_precedence_wildcards_and_default_backend() {
    let echoes: Vec<Echo> = ["web", "api", "exact", "wild", "hostless", "fallback"]
        .iter()
        .map(|n| Echo::start(n))
        .collect();
    let mut manifests: String = echoes
        .iter()
        .map(|e| service_yaml("default", &e.name, e))
        .collect();
    manifests.push_str(&ingress(
        "app",
        &format!(
            "  rules:\n    - host: foo.test\n      http:\n        paths: [{}, {}, {}, {}]\n    - host: \"*.wild.test\"\n      http:\n        paths: [{}]\n    - http:\n        paths: [{}]\n",
            path("/", "Prefix", "web"),
            path("/api", "Prefix", "api"),
            path("/api", "Exact", "exact"),
            path("/api/v1/", "ImplementationSpecific", "exact"),
            path("/", "Prefix", "wild"),
            path("/hostless", "Prefix", "hostless"),
        ),
    ));
    manifests.push_str(&ingress(
        "fallback",
        "  defaultBackend: {service: {name: fallback, port: {number: 80}}}\n",
    ));
    let s = Scenario::start("routing", &manifests, &[]);
    let p = &s.proxy;
    let cases = [
        ("foo.test", "/", "web"),
        ("foo.test", "/other", "web"),
        ("FOO.test:80", "/api/x", "api"),
        ("foo.test", "/api/", "api"),
        // Exact beats Prefix for the same path.
        ("foo.test", "/api", "exact"),
        // Path-segment semantics: /api does not match /apikey.
        ("foo.test", "/apikey", "web"),
        // Longest prefix wins; a trailing slash on the rule is ignored.
        ("foo.test", "/api/v1", "exact"),
        ("foo.test", "/api/v1/users", "exact"),
        ("foo.test", "/api/v10", "api"),
        // The query string is not part of the path.
        ("foo.test", "/api?x=/api/v1", "exact"),
        // *.wild.test matches exactly one label.
        ("a.wild.test", "/", "wild"),
        ("b.wild.test", "/deep/path", "wild"),
        ("x.a.wild.test", "/", "fallback"),
        ("wild.test", "/", "fallback"),
        // Host-less rules serve any host without a matching rule of its own.
        ("unknown.test", "/hostless/x", "hostless"),
        ("x.a.wild.test", "/hostless", "hostless"),
        // A host with its own rules falls back to host-less rules only when none matched:
        // foo.test has a catch-all, so it keeps its own.
        ("foo.test", "/hostless", "web"),
        // Nothing matches: the oldest spec.defaultBackend.
        ("unknown.test", "/nothing", "fallback"),
    ];
    for (host, path, want) in cases {
        let r = p.http(host, path);
        assert_eq!(r.backend(), Some(want), "{host}{path}: {r:?}");
    }
    let r = p.http("foo.test", "/api/x?q=1");
    assert_eq!(r.echoed("path"), Some("/api/x?q=1"));
    assert_eq!(r.echoed("header:x-forwarded-proto"), Some("http"));
    assert!(r.echoed("header:x-forwarded-for").is_some(), "{r:?}");
}

#[test]
fn ingress_without_default_backend_answers_404() {
    let web = Echo::start("web");
    let mut manifests = service_yaml("default", "web", &web);
    manifests.push_str(&ingress(
        "app",
        &format!(
            "  rules:\n    - host: foo.test\n      http:\n        paths: [{}]\n",
            path("/app", "Prefix", "web")
        ),
    ));
    let s = Scenario::start("no-default", &manifests, &[]);
    assert_eq!(s.proxy.http("foo.test", "/app").backend(), Some("web"));
    let r = s.proxy.http("foo.test", "/other");
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(s.proxy.http("bar.test", "/app").status, 404);
}
