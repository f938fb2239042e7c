//! The template libraries in `chart/libraries/` under real traffic: each test renders fixture
//! manifests with `haptic render` (all six libraries merged), runs a real HAProxy on the result
//! on free 127.0.0.1 ports, and sends requests with curl to echo backends that report what
//! they received. `libraries_validate` runs the libraries' own embedded validation tests.

mod support;

#[path = "libraries/harness.rs"]
mod harness;

#[path = "libraries/gateway.rs"]
mod gateway;

#[path = "libraries/annotations.rs"]
mod annotations;

#[path = "libraries/hostile.rs"]
mod hostile;

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
    // "Tests: N passed, 0 failed, N total": a run of zero tests proves nothing.
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("Tests: "))
        .unwrap_or_else(|| panic!("no summary line:\n{stdout}"));
    let count = |word: &str| -> usize {
        let words: Vec<&str> = summary
            .split(|c: char| c == ',' || c.is_whitespace())
            .collect();
        words
            .windows(2)
            .find(|w| w[1] == word)
            .and_then(|w| w[0].parse().ok())
            .unwrap_or_else(|| panic!("no {word} count in {summary:?}"))
    };
    let (passed, failed) = (count("passed"), count("failed"));
    assert_eq!(failed, 0, "{stdout}");
    // Every library brings its own tests; together well over 80.
    assert!(passed >= 80, "only {passed} library tests ran:\n{stdout}");
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
    let s = Scenario::start(
        "no-default",
        &manifests,
        &[("status_addresses", "[203.0.113.9, lb.example.com]")],
    );
    // Ingress status: the load-balancer addresses, through status.set.
    assert!(
        s.render_output.contains(r#"status networking.k8s.io/v1 Ingress default/app: {"loadBalancer":{"ingress":[{"ip":"203.0.113.9"},{"hostname":"lb.example.com"}]}}"#),
        "{}",
        s.render_output
    );
    assert_eq!(s.proxy.http("foo.test", "/app").backend(), Some("web"));
    let r = s.proxy.http("foo.test", "/other");
    assert_eq!(r.status, 404, "{r:?}");
    assert_eq!(s.proxy.http("bar.test", "/app").status, 404);
}

#[test]
fn tls_with_sni_per_ingress_certificates_and_default() {
    let dir = harness::TempDir::new("pki");
    let pki = harness::Pki::new(dir.path());
    let (a, b) = (Echo::start("a"), Echo::start("b"));
    let mut m = service_yaml("default", "a", &a) + &service_yaml("default", "b", &b);
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("default", "cert-a", &["a.test"]));
    m.push_str(&pki.secret_yaml("default", "cert-b", &["b.test", "*.b.test"]));
    m.push_str(&ingress(
        "tls",
        &format!(
            "  tls:\n    - {{hosts: [a.test], secretName: cert-a}}\n    - {{hosts: [b.test], secretName: cert-b}}\n  rules:\n    - host: a.test\n      http: {{paths: [{}]}}\n    - host: b.test\n      http: {{paths: [{}]}}\n    - host: c.test\n      http: {{paths: [{}]}}\n",
            path("/", "Prefix", "a"),
            path("/", "Prefix", "b"),
            path("/", "Prefix", "a"),
        ),
    ));
    // A second Ingress sharing cert-b adds its host to the same crt-list line.
    m.push_str(&ingress(
        "tls2",
        &format!(
            "  tls: [{{hosts: [x.b.test], secretName: cert-b}}]\n  rules:\n    - host: x.b.test\n      http: {{paths: [{}]}}\n",
            path("/", "Prefix", "b")
        ),
    ));
    let s = Scenario::start("tls", &m, &[]);
    let p = &s.proxy;
    // The certificate for each SNI name verifies against the test CA for that name.
    let r = p.https("a.test", "/x", &pki.ca, &[]);
    assert_eq!((r.status, r.backend()), (200, Some("a")), "{r:?}");
    assert_eq!(r.echoed("header:x-forwarded-proto"), Some("https"));
    let r = p.https("b.test", "/", &pki.ca, &[]);
    assert_eq!((r.status, r.backend()), (200, Some("b")), "{r:?}");
    let r = p.https("x.b.test", "/", &pki.ca, &[]);
    assert_eq!((r.status, r.backend()), (200, Some("b")), "{r:?}");
    // No certificate for c.test: the default one is served, so verification for c.test fails…
    let r = p.https("c.test", "/", &pki.ca, &[]);
    assert_eq!(r.status, 0, "c.test must not verify: {r:?}");
    // …but the default certificate is the one for default.invalid, and routing still works.
    let r = p.https(
        "c.test",
        "/",
        &pki.ca,
        &["-k", "-w", "%{ssl_verify_result}"],
    );
    assert_eq!(r.backend(), Some("a"), "{r:?}");
    // ALPN offers h2.
    let r = p.https("a.test", "/", &pki.ca, &["--http2"]);
    assert_eq!(r.status, 200, "{r:?}");
    let crt_list = std::fs::read_to_string(s.out.path().join("general/crt-list.txt")).unwrap();
    assert!(
        crt_list.contains("ssl/default_cert-b.pem b.test x.b.test"),
        "{crt_list}"
    );
}

fn annotated(name: &str, host: &str, svc: &str, annotations: &str) -> String {
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: default\n  annotations:\n{annotations}spec:\n  ingressClassName: haproxy\n  tls: [{{hosts: [{host}], secretName: tls-{name}}}]\n  rules:\n    - host: {host}\n      http: {{paths: [{}]}}\n",
        path("/", "Prefix", svc)
    )
}

#[test]
fn haproxytech_annotations_redirect_headers_rewrite_allowlist_auth() {
    let dir = harness::TempDir::new("pki-ann");
    let pki = harness::Pki::new(dir.path());
    let web = Echo::start("web");
    let hash = Command::new("openssl")
        .args(["passwd", "-5", "-salt", "pepper", "s3cret"])
        .output()
        .expect("openssl passwd");
    let hash = String::from_utf8_lossy(&hash.stdout).trim().to_string();
    let mut m = service_yaml("default", "web", &web);
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    for (name, host) in [
        ("open", "open.test"),
        ("closed", "closed.test"),
        ("auth", "auth.test"),
        ("redir", "redir.test"),
    ] {
        m.push_str(&pki.secret_yaml("default", &format!("tls-{name}"), &[host]));
    }
    m.push_str(&format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: users, namespace: default}}\ndata: {{alice: {}}}\n",
        harness::base64(hash.as_bytes())
    ));
    // These Ingresses have TLS, which redirects HTTP to HTTPS by default (as with the peer):
    // the HTTP checks below need ssl-redirect "false".
    m.push_str(&annotated(
        "open",
        "open.test",
        "web",
        "    haproxy.org/ssl-redirect: \"false\"\n    haproxy.org/allowlist: \"127.0.0.1/32\"\n    haproxy.org/request-set-header: \"X-Env prod\"\n    haproxy.org/response-set-header: \"X-Frame-Options DENY\"\n    haproxy.org/path-rewrite: \"^/old/(.*) /new/\\\\1\"\n    haproxy.org/set-host: backend.internal\n",
    ));
    m.push_str(&annotated(
        "closed",
        "closed.test",
        "web",
        "    haproxy.org/ssl-redirect: \"false\"\n    haproxy.org/allowlist: \"192.0.2.0/24\"\n",
    ));
    m.push_str(&annotated(
        "auth",
        "auth.test",
        "web",
        "    haproxy.org/ssl-redirect: \"false\"\n    haproxy.org/auth-type: basic-auth\n    haproxy.org/auth-secret: default/users\n    haproxy.org/auth-realm: Team\n",
    ));
    m.push_str(&annotated(
        "redir",
        "redir.test",
        "web",
        "    haproxy.org/ssl-redirect: \"true\"\n    haproxy.org/ssl-redirect-code: \"308\"\n",
    ));
    let s = Scenario::start("annotations", &m, &[]);
    let p = &s.proxy;

    // Allow list: 127.0.0.1 is allowed on open.test, not on closed.test — on both frontends.
    assert_eq!(p.http("open.test", "/").status, 200);
    assert_eq!(p.http("closed.test", "/").status, 403);
    assert_eq!(p.https("closed.test", "/", &pki.ca, &[]).status, 403);
    assert_eq!(p.https("open.test", "/", &pki.ca, &[]).status, 200);

    // Header modifiers, set-host and path rewrite, seen by the backend and the client.
    let r = p.http("open.test", "/old/thing?q=1");
    assert_eq!(r.echoed("header:x-env"), Some("prod"), "{r:?}");
    assert_eq!(r.echoed("host"), Some("backend.internal"), "{r:?}");
    assert_eq!(r.echoed("path"), Some("/new/thing?q=1"), "{r:?}");
    assert_eq!(r.header("x-frame-options"), Some("DENY"), "{r:?}");
    let r = p.https("open.test", "/old/x", &pki.ca, &[]);
    assert_eq!(
        r.echoed("path"),
        Some("/new/x"),
        "HTTPS runs the same filters: {r:?}"
    );
    assert_eq!(r.header("x-frame-options"), Some("DENY"));

    // Basic auth.
    let r = p.http("auth.test", "/");
    assert_eq!(r.status, 401, "{r:?}");
    assert!(
        r.header("www-authenticate")
            .unwrap_or_default()
            .contains("Team"),
        "{r:?}"
    );
    assert_eq!(
        p.http_with("auth.test", "/", &["-u", "alice:wrong"]).status,
        401
    );
    let r = p.http_with("auth.test", "/", &["-u", "alice:s3cret"]);
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");

    // ssl-redirect: HTTP redirects with the configured code, HTTPS serves.
    let r = p.http("redir.test", "/a/b?c=d");
    assert_eq!(r.status, 308, "{r:?}");
    assert_eq!(r.header("location"), Some("https://redir.test/a/b?c=d"));
    assert_eq!(p.https("redir.test", "/a", &pki.ca, &[]).status, 200);
}

/// HAProxy bound to its nodes' ports (the chart's `hostNetwork` or `hostPorts` set
/// `status_node_addresses`): with no other address, Ingress and Gateway status publish the nodes
/// the HAProxy pods run on, each once; pods not scheduled yet and other pods add nothing.
#[test]
fn node_bound_haproxy_publishes_its_nodes_in_status() {
    let web = Echo::start("web");
    let pod = |name: &str, component: &str, status: &str| {
        format!("---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: haptic, labels: {{app.kubernetes.io/component: {component}}}}}\nspec: {{containers: [{{name: haproxy, image: haproxy}}]}}\nstatus: {{{status}}}\n")
    };
    let mut m = service_yaml("default", "web", &web);
    m.push_str(&ingress(
        "app",
        &format!(
            "  rules:\n    - host: a.test\n      http: {{paths: [{}]}}\n",
            path("/", "Prefix", "web")
        ),
    ));
    m.push_str("---\napiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: haproxy}\nspec: {controllerName: haproxy-haptic.org/controller}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: default}\nspec:\n  gatewayClassName: haproxy\n  listeners: [{name: http, protocol: HTTP, port: 80}]\n");
    m.push_str(&pod(
        "haproxy-b",
        "haproxy",
        "phase: Running, hostIP: 192.0.2.20",
    ));
    m.push_str(&pod(
        "haproxy-a",
        "haproxy",
        "phase: Running, hostIP: 192.0.2.10",
    ));
    m.push_str(&pod(
        "haproxy-c",
        "haproxy",
        "phase: Running, hostIP: 192.0.2.10",
    ));
    m.push_str(&pod("haproxy-pending", "haproxy", "phase: Pending"));
    m.push_str(&pod(
        "haproxy-odd",
        "haproxy",
        "phase: Running, hostIP: 'x y'",
    ));
    m.push_str(&pod(
        "haproxy-v6",
        "haproxy",
        "phase: Running, hostIP: '2001:db8::1'",
    ));
    m.push_str(&pod(
        "haproxy-failed",
        "haproxy",
        "phase: Failed, hostIP: 192.0.2.40",
    ));
    m.push_str(&pod("other", "web", "phase: Running, hostIP: 192.0.2.99"));
    m.push_str("---\napiVersion: v1\nkind: Pod\nmetadata: {name: haproxy-gone, namespace: haptic, deletionTimestamp: '2030-01-01T00:00:00Z', labels: {app.kubernetes.io/component: haproxy}}\nspec: {containers: [{name: haproxy, image: haproxy}]}\nstatus: {phase: Running, hostIP: 192.0.2.30}\n");
    // The HAProxy Service, without and with a load-balancer address.
    let service = |lb: &str| {
        format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: haproxy, namespace: haptic}}\nspec: {{type: LoadBalancer, ports: [{{port: 80}}]}}\nstatus: {{loadBalancer: {{ingress: [{lb}]}}}}\n")
    };
    let write = |dir: &harness::TempDir, text: &str| {
        std::fs::write(dir.path().join("manifests.yaml"), text).expect("write fixtures")
    };
    let fixtures = harness::TempDir::new("node-status-fixtures");
    write(&fixtures, &(m.clone() + &service("")));
    let render_in = |fixtures: &harness::TempDir, extra: &[(&str, &str)]| {
        let out = harness::TempDir::new("node-status-out");
        let mut extra = extra.to_vec();
        extra.extend([
            ("haproxy_service_namespace", "haptic"),
            ("haproxy_service_name", "haproxy"),
        ]);
        harness::render(fixtures.path(), out.path(), &harness::Ports::pick(), &extra)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let render = |extra: &[(&str, &str)]| render_in(&fixtures, extra);
    let status_line = |out: &str, prefix: &str| -> serde_json::Value {
        let json = out
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in:\n{out}"));
        serde_json::from_str(json).expect("status JSON")
    };
    let ingress_status = "status networking.k8s.io/v1 Ingress default/app: ";
    let gateway_status = "status gateway.networking.k8s.io/v1 Gateway default/gw: ";

    let out = render(&[("status_node_addresses", "true")]);
    assert_eq!(
        status_line(&out, ingress_status)["loadBalancer"]["ingress"],
        serde_json::json!([{"ip": "192.0.2.10"}, {"ip": "192.0.2.20"}, {"ip": "2001:db8::1"}]),
        "{out}"
    );
    assert_eq!(
        status_line(&out, gateway_status)["addresses"],
        serde_json::json!([{"type": "IPAddress", "value": "192.0.2.10"}, {"type": "IPAddress", "value": "192.0.2.20"}, {"type": "IPAddress", "value": "2001:db8::1"}]),
        "{out}"
    );
    // A load-balancer address on the HAProxy Service wins over the nodes.
    let with_lb = harness::TempDir::new("node-status-lb");
    write(&with_lb, &(m.clone() + &service("{ip: 203.0.113.5}")));
    let out = render_in(&with_lb, &[("status_node_addresses", "true")]);
    assert_eq!(
        status_line(&out, ingress_status)["loadBalancer"]["ingress"],
        serde_json::json!([{"ip": "203.0.113.5"}]),
        "{out}"
    );
    // So do the Service's external IPs, for the Gateway as for the Ingress.
    let external = harness::TempDir::new("node-status-external");
    write(
        &external,
        &(m.clone()
            + &service("").replace(
                "spec: {type: LoadBalancer, ",
                "spec: {type: LoadBalancer, externalIPs: [198.18.0.7], ",
            )),
    );
    let out = render_in(&external, &[("status_node_addresses", "true")]);
    assert_eq!(
        status_line(&out, ingress_status)["loadBalancer"]["ingress"],
        serde_json::json!([{"ip": "198.18.0.7"}]),
        "{out}"
    );
    assert_eq!(
        status_line(&out, gateway_status)["addresses"],
        serde_json::json!([{"type": "IPAddress", "value": "198.18.0.7"}]),
        "{out}"
    );
    // A Gateway's status holds at most 16 addresses (the API's limit); the Ingress's all.
    let many = harness::TempDir::new("node-status-many");
    let mut text = m.clone() + &service("");
    for i in 1..=20 {
        text.push_str(&pod(
            &format!("haproxy-n{i}"),
            "haproxy",
            &format!("phase: Running, hostIP: 198.51.100.{i}"),
        ));
    }
    write(&many, &text);
    let out = render_in(&many, &[("status_node_addresses", "true")]);
    let count = |v: &serde_json::Value| v.as_array().map(Vec::len).unwrap_or_default();
    assert_eq!(
        count(&status_line(&out, gateway_status)["addresses"]),
        16,
        "{out}"
    );
    assert_eq!(
        count(&status_line(&out, ingress_status)["loadBalancer"]["ingress"]),
        23,
        "{out}"
    );
    // Fixed addresses still win over the nodes.
    let out = render(&[
        ("status_node_addresses", "true"),
        ("status_addresses", "[lb.example.com]"),
    ]);
    assert_eq!(
        status_line(&out, ingress_status)["loadBalancer"]["ingress"],
        serde_json::json!([{"hostname": "lb.example.com"}]),
        "{out}"
    );
    // Off by default: a pod network behind a Service publishes no node.
    let out = render(&[]);
    assert!(!out.contains("192.0.2."), "{out}");
}
