//! Gateway API under real traffic: attachment through parentRefs and allowedRoutes, matching
//! precedence with fallback, filters, weights, unresolvable backendRefs, HTTPS listeners, and
//! the statuses the library declares.

use serde_json::Value;

use super::harness::{
    self, service_yaml, service_yaml_port, service_yaml_ports, Echo, HAProxy, Response, Scenario,
    Tied,
};
use crate::support::wait_for;

const GATEWAYS: &str = r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: haproxy, generation: 1}
spec: {controllerName: haproxy-haptic.org/controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: other}
spec: {controllerName: example.com/other}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: foreign, namespace: default}
spec: {gatewayClassName: other, listeners: [{name: http, protocol: HTTP, port: 80}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: default, generation: 3}
spec:
  gatewayClassName: haproxy
  listeners:
    - {name: http, protocol: HTTP, port: 80}
    - {name: shared, protocol: HTTP, port: 80, hostname: "*.shared.test", allowedRoutes: {namespaces: {from: All}}}
    - {name: https, protocol: HTTPS, port: 443, hostname: secure.test, tls: {certificateRefs: [{name: secure-cert}]}}
"#;

/// Our GatewayClass and a Gateway `name` in `default` with `listeners` (YAML list items).
fn gateway_yaml(name: &str, listeners: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {{name: haproxy}}\nspec: {{controllerName: haproxy-haptic.org/controller}}\n---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  gatewayClassName: haproxy\n  listeners:\n{listeners}"
    )
}

fn route(ns: &str, name: &str, ts: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{ts}\", generation: 1}}\nspec:\n{spec}"
    )
}

// 16 rules: the Gateway API's maximum (`spec.rules` MaxItems=16; the API server rejects a 17th
// and the library refuses it too). The method match shares the X-Version rule's backend.
const MAIN_RULES: &str = r#"  parentRefs: [{name: gw, sectionName: http}]
  hostnames: [gw.test]
  rules:
    - backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /api}, headers: [{name: X-Version, value: "2"}]}, {path: {type: PathPrefix, value: /method}, method: POST}]
      backendRefs: [{name: v2, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /api}}]
      backendRefs: [{name: v1, port: 80}]
    - matches: [{path: {type: Exact, value: /api/exact}}, {path: {type: PathPrefix, value: /q}, queryParams: [{name: debug, value: "1"}]}]
      backendRefs: [{name: exact, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /split}}]
      backendRefs: [{name: stable, port: 80, weight: 3}, {name: canary, port: 80, weight: 1}]
    - matches: [{path: {type: PathPrefix, value: /zero}}]
      backendRefs: [{name: stable, port: 80, weight: 1}, {name: canary, port: 80, weight: 0}]
    - matches: [{path: {type: PathPrefix, value: /allzero}}]
      backendRefs: [{name: stable, port: 80, weight: 0}]
    - matches: [{path: {type: PathPrefix, value: /missing}}]
      backendRefs: [{name: nope, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /crossns}}]
      backendRefs: [{name: teamweb, namespace: team, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /kind}}]
      backendRefs: [{group: example.com, kind: Bucket, name: web}]
    - matches: [{path: {type: PathPrefix, value: /to-https}}]
      filters: [{type: RequestRedirect, requestRedirect: {scheme: https, statusCode: 301}}]
    - matches: [{path: {type: PathPrefix, value: /moved}}]
      filters: [{type: RequestRedirect, requestRedirect: {hostname: r.test, port: 8443, path: {type: ReplacePrefixMatch, replacePrefixMatch: /new}}}]
    - matches: [{path: {type: PathPrefix, value: /full}}]
      filters: [{type: RequestRedirect, requestRedirect: {path: {type: ReplaceFullPath, replaceFullPath: /elsewhere}}}]
    - matches: [{path: {type: PathPrefix, value: /headers}}]
      filters:
        - type: RequestHeaderModifier
          requestHeaderModifier: {set: [{name: X-Set, value: s}], add: [{name: X-Add, value: b}], remove: [X-Remove]}
        - type: ResponseHeaderModifier
          responseHeaderModifier: {set: [{name: X-Resp, value: r}], add: [{name: Content-Type, value: extra}]}
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /rewrite}}]
      filters: [{type: URLRewrite, urlRewrite: {hostname: internal.test, path: {type: ReplacePrefixMatch, replacePrefixMatch: /rewritten}}}]
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /strip}}]
      filters: [{type: URLRewrite, urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /}}}]
      backendRefs: [{name: web, port: 80}]
"#;

/// The status the render declared for one object, parsed.
fn status_of(render_output: &str, kind: &str, id: &str) -> Option<Value> {
    let prefix = format!("status gateway.networking.k8s.io/v1 {kind} {id}: ");
    render_output
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|json| serde_json::from_str(json).expect("status JSON"))
}

/// The (status, reason) of condition `kind` in a conditions array.
fn condition(conditions: &Value, kind: &str) -> (String, String) {
    let c = conditions
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == kind))
        .unwrap_or_else(|| panic!("no {kind} condition in {conditions}"));
    (
        c["status"].as_str().unwrap_or_default().to_string(),
        c["reason"].as_str().unwrap_or_default().to_string(),
    )
}

fn pair(s: &str, r: &str) -> (String, String) {
    (s.to_string(), r.to_string())
}

#[test]
fn gateway_routes_attach_match_filter_and_split_traffic() {
    let dir = harness::TempDir::new("pki-gw");
    let pki = harness::Pki::new(dir.path());
    let names = ["web", "v1", "v2", "exact", "stable", "canary", "foreign"];
    let echoes: Vec<Echo> = names.iter().map(|n| Echo::start(n)).collect();
    let team = Echo::start("teamweb");
    let mut m: String = echoes
        .iter()
        .map(|e| service_yaml("default", &e.name, e))
        .collect();
    m.push_str(&service_yaml("team", "teamweb", &team));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("default", "secure-cert", &["secure.test"]));
    m.push_str(GATEWAYS);
    m.push_str(&route(
        "default",
        "main",
        "2024-01-01T00:00:00Z",
        MAIN_RULES,
    ));
    // Routes that must get no traffic: another controller's Gateway; a namespace the listener
    // does not allow; a hostname outside the listener's.
    m.push_str(&route(
        "default",
        "foreign",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: foreign}]\n  hostnames: [foreign.test]\n  rules: [{backendRefs: [{name: foreign, port: 80}]}]\n",
    ));
    m.push_str(&route(
        "team",
        "not-allowed",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: gw, namespace: default, sectionName: http}]\n  hostnames: [team.test]\n  rules: [{backendRefs: [{name: teamweb, port: 80}]}]\n",
    ));
    m.push_str(&route(
        "default",
        "no-host",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: gw, sectionName: shared}]\n  hostnames: [nomatch.test]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
    ));
    // Allowed from every namespace on the *.shared.test listener.
    m.push_str(&route(
        "team",
        "shared",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: gw, namespace: default, sectionName: shared}]\n  rules: [{backendRefs: [{name: teamweb, port: 80}]}]\n",
    ));
    // Attached to the HTTPS listener only.
    m.push_str(&route(
        "default",
        "secure",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: gw, sectionName: https}]\n  rules: [{backendRefs: [{name: v2, port: 80}]}]\n",
    ));
    let s = Scenario::start("gateway", &m, &[]);
    let p = &s.proxy;

    // Attachment.
    assert_eq!(
        p.http("foreign.test", "/").status,
        404,
        "another Gateway's route"
    );
    assert_eq!(
        p.http("team.test", "/").status,
        404,
        "namespace not allowed"
    );
    assert_eq!(
        p.http("nomatch.test", "/").status,
        404,
        "hostname outside the listener"
    );
    assert_eq!(p.http("a.shared.test", "/").backend(), Some("teamweb"));
    assert_eq!(p.http("x.y.shared.test", "/x").backend(), Some("teamweb"));
    assert_eq!(
        p.http("shared.test", "/").status,
        404,
        "*.x does not match x"
    );
    assert_eq!(
        p.http("secure.test", "/").status,
        404,
        "HTTPS-only route over HTTP"
    );
    let r = p.https("secure.test", "/", &pki.ca, &[]);
    assert_eq!((r.status, r.backend()), (200, Some("v2")), "{r:?}");
    // Nothing matches: 404.
    assert_eq!(p.http("unknown.test", "/").status, 404);

    // Precedence and fallback.
    let h2 = ["-H", "X-Version: 2"];
    let cases: [(&str, &[&str], &str); 10] = [
        ("/", &[], "web"),
        ("/api/x", &[], "v1"),
        ("/api", &[], "v1"),
        ("/api/x", &h2, "v2"),
        ("/api/exact", &h2, "exact"),
        ("/apix", &h2, "web"),
        ("/q?debug=1", &[], "exact"),
        ("/q?debug=2", &[], "web"),
        ("/method", &["-X", "POST"], "v2"),
        ("/method", &[], "web"),
    ];
    for (path, args, want) in cases {
        let r = p.http_with("GW.test:80", path, args);
        assert_eq!(r.backend(), Some(want), "{path} {args:?}: {r:?}");
    }

    // Unresolvable backendRefs and all-zero weights: 500.
    for path in ["/missing", "/crossns", "/kind", "/allzero"] {
        assert_eq!(p.http("gw.test", path).status, 500, "{path}");
    }

    // Weights: a 0-weight backend gets nothing; 3:1 is roughly 3:1.
    for _ in 0..20 {
        assert_eq!(p.http("gw.test", "/zero").backend(), Some("stable"));
    }
    let stable = (0..200)
        .filter(|_| p.http("gw.test", "/split").backend() == Some("stable"))
        .count();
    assert!(
        (115..=185).contains(&stable),
        "3:1 split gave {stable}/200 to stable"
    );

    // Redirects: the Location port is the listener's public port (80, left out), the
    // scheme's well-known port, or the one configured.
    let r = p.http("gw.test", "/to-https/x?y=1");
    assert_eq!(r.status, 301);
    assert_eq!(r.header("location"), Some("https://gw.test/to-https/x?y=1"));
    let r = p.http("gw.test", "/moved/x?q=1");
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("http://r.test:8443/new/x?q=1"));
    let r = p.http("gw.test", "/moved");
    assert_eq!(r.header("location"), Some("http://r.test:8443/new"));
    let r = p.http("gw.test", "/full/a");
    assert_eq!(r.header("location"), Some("http://gw.test/elsewhere"));

    // Header modifiers: set, add (appends to the existing header), remove; response too.
    let r = p.http_with(
        "gw.test",
        "/headers",
        &["-H", "X-Add: a", "-H", "X-Remove: x", "-H", "X-Set: old"],
    );
    assert_eq!(r.echoed("header:x-set"), Some("s"), "{r:?}");
    assert_eq!(r.echoed("header:x-add"), Some("a,b"), "{r:?}");
    assert_eq!(r.echoed("header:x-remove"), None, "{r:?}");
    assert_eq!(r.header("x-resp"), Some("r"));
    assert_eq!(r.header("content-type"), Some("text/plain,extra"));
    let r = p.http("gw.test", "/headers");
    assert_eq!(r.echoed("header:x-add"), Some("b"), "{r:?}");

    // URL rewrites.
    let r = p.http("gw.test", "/rewrite/x?q=1");
    assert_eq!(r.echoed("path"), Some("/rewritten/x?q=1"), "{r:?}");
    assert_eq!(r.echoed("host"), Some("internal.test"), "{r:?}");
    assert_eq!(
        p.http("gw.test", "/rewrite").echoed("path"),
        Some("/rewritten")
    );
    assert_eq!(p.http("gw.test", "/strip/a/b").echoed("path"), Some("/a/b"));
    assert_eq!(p.http("gw.test", "/strip").echoed("path"), Some("/"));

    // Statuses.
    let out = &s.render_output;
    let class = status_of(out, "GatewayClass", "/haproxy").expect("GatewayClass status");
    assert_eq!(
        condition(&class["conditions"], "Accepted"),
        pair("True", "Accepted")
    );
    assert!(status_of(out, "GatewayClass", "/other").is_none());
    assert!(status_of(out, "Gateway", "default/foreign").is_none());
    let gw = status_of(out, "Gateway", "default/gw").expect("Gateway status");
    assert_eq!(
        condition(&gw["conditions"], "Accepted"),
        pair("True", "Accepted")
    );
    assert_eq!(
        condition(&gw["conditions"], "Programmed"),
        pair("True", "Programmed")
    );
    let listeners = gw["listeners"].as_array().expect("listeners");
    let attached: Vec<(&str, i64)> = listeners
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap(),
                l["attachedRoutes"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(attached, [("http", 1), ("shared", 1), ("https", 1)], "{gw}");
    for l in listeners {
        assert_eq!(
            condition(&l["conditions"], "Programmed"),
            pair("True", "Programmed")
        );
        assert_eq!(l["conditions"][0]["observedGeneration"], 3);
    }
    let main = status_of(out, "HTTPRoute", "default/main").expect("main status");
    let parent = &main["parents"][0];
    assert_eq!(parent["controllerName"], "haproxy-haptic.org/controller");
    assert_eq!(parent["parentRef"]["sectionName"], "http");
    assert_eq!(
        condition(&parent["conditions"], "Accepted"),
        pair("True", "Accepted")
    );
    assert_eq!(
        condition(&parent["conditions"], "ResolvedRefs"),
        pair("False", "BackendNotFound")
    );
    let denied = status_of(out, "HTTPRoute", "team/not-allowed").expect("status");
    assert_eq!(
        condition(&denied["parents"][0]["conditions"], "Accepted"),
        pair("False", "NotAllowedByListeners")
    );
    let nohost = status_of(out, "HTTPRoute", "default/no-host").expect("status");
    assert_eq!(
        condition(&nohost["parents"][0]["conditions"], "Accepted"),
        pair("False", "NoMatchingListenerHostname")
    );
    assert!(status_of(out, "HTTPRoute", "default/foreign").is_none());
}

#[test]
fn gateway_route_status_keeps_other_controllers_entries() {
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    m.push_str(GATEWAYS);
    m.push_str(&route(
        "default",
        "both",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: gw, sectionName: http}, {name: foreign}]\n  hostnames: [both.test]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
    ));
    m.push_str(concat!(
        "status:\n  parents:\n",
        "    - {controllerName: example.com/other, parentRef: {name: foreign}, conditions: [{type: Accepted, status: \"True\", reason: Accepted, message: ok, lastTransitionTime: \"2024-01-01T00:00:00Z\"}]}\n",
        "    - {controllerName: haproxy-haptic.org/controller, parentRef: {name: stale}, conditions: []}\n",
    ));
    let s = Scenario::start("gateway-status", &m, &[]);
    assert_eq!(s.proxy.http("both.test", "/").backend(), Some("web"));
    let st = status_of(&s.render_output, "HTTPRoute", "default/both").expect("status");
    let parents = st["parents"].as_array().expect("parents");
    assert_eq!(parents.len(), 2, "{st}");
    assert_eq!(parents[0]["controllerName"], "example.com/other");
    assert_eq!(
        parents[1]["controllerName"],
        "haproxy-haptic.org/controller"
    );
    assert_eq!(parents[1]["parentRef"]["name"], "gw");
}

#[test]
fn gateway_with_parameters_ref_is_not_accepted_and_keeps_serving() {
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    m.push_str(GATEWAYS);
    // No kind of parameters is supported: any parametersRef (here a hostile name, which is
    // never read) gives Accepted=False InvalidParameters, as the conformance test
    // GatewayInvalidParametersRef expects; infrastructure labels alone are ignored.
    for (name, infra) in [
        (
            "params",
            r#"{parametersRef: {group: "", kind: ConfigMap, name: "missing\n  bind :22"}, labels: {team: a}}"#,
        ),
        ("labels", "{labels: {team: a}}"),
    ] {
        m.push_str(&format!("---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: {name}, namespace: default, generation: 2}}\nspec:\n  gatewayClassName: haproxy\n  infrastructure: {infra}\n  listeners: [{{name: http, protocol: HTTP, port: 80, hostname: {name}.test}}]\n"));
        m.push_str(&route(
            "default",
            name,
            "2024-01-01T00:00:00Z",
            &format!("  parentRefs: [{{name: {name}}}]\n  rules: [{{backendRefs: [{{name: web, port: 80}}]}}]\n"),
        ));
    }
    let s = Scenario::start("gateway-params", &m, &[]);
    let gw = |name: &str| {
        let st = status_of(&s.render_output, "Gateway", &format!("default/{name}"))
            .unwrap_or_else(|| panic!("no status for {name}:\n{}", s.render_output));
        let c = &st["conditions"];
        let listener = &st["listeners"][0]["conditions"];
        (
            condition(c, "Accepted"),
            condition(c, "Programmed"),
            condition(listener, "Programmed"),
        )
    };
    assert_eq!(
        gw("params"),
        (
            pair("False", "InvalidParameters"),
            pair("False", "Invalid"),
            pair("True", "Programmed")
        )
    );
    assert_eq!(
        gw("labels"),
        (
            pair("True", "Accepted"),
            pair("True", "Programmed"),
            pair("True", "Programmed")
        )
    );
    // As with spec.addresses, the listeners stay programmed: both Gateways' routes answer.
    assert_eq!(s.proxy.http("params.test", "/").backend(), Some("web"));
    assert_eq!(s.proxy.http("labels.test", "/").backend(), Some("web"));
    let cfg = std::fs::read_to_string(s.out.path().join("haproxy.cfg")).expect("haproxy.cfg");
    assert!(!cfg.contains("bind :22"), "{cfg}");
}

#[test]
fn gateway_route_timeouts_answer_504_from_slow_backends() {
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    m.push_str(GATEWAYS);
    m.push_str(&route(
        "default",
        "timeouts",
        "2024-01-01T00:00:00Z",
        r#"  parentRefs: [{name: gw, sectionName: http}]
  hostnames: [timeouts.test]
  rules:
    - matches: [{path: {type: PathPrefix, value: /backend}}]
      timeouts: {request: 10s, backendRequest: 500ms}
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /request}}]
      timeouts: {request: 1s}
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /disabled}}]
      timeouts: {request: 0s}
      backendRefs: [{name: web, port: 80}]
    - backendRefs: [{name: web, port: 80}]
"#,
    ));
    let s = Scenario::start("gateway-timeouts", &m, &[]);
    let p = &s.proxy;
    let slow = |path: &str, ms: u32| {
        let delay = format!("X-Echo-Delay-Ms: {ms}");
        p.http_with("timeouts.test", path, &["-H", &delay]).status
    };
    // backendRequest: a backend slower than 500 ms gets 504; a fast one answers.
    assert_eq!(slow("/backend", 1500), 504);
    assert_eq!(slow("/backend", 0), 200);
    // request alone bounds the backend's answer too.
    assert_eq!(slow("/request", 2000), 504);
    assert_eq!(slow("/request", 100), 200);
    // 0s disables the timeout (24 hours), and a rule without timeouts keeps HAProxy's own:
    // neither cuts a 1.5 s answer, although both share the backend of the rules above.
    assert_eq!(slow("/disabled", 1500), 200);
    assert_eq!(slow("/", 1500), 200);
}

/// The Python used for gRPC (grpcio): `.venv` as `scripts/test.sh` prepares it, or
/// `HAPTIC_PYTHON`.
fn grpc_python() -> std::path::PathBuf {
    let python = std::env::var_os("HAPTIC_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| harness::root().join(".venv/bin/python"));
    let ok = std::process::Command::new(&python)
        .args(["-c", "import grpc"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} cannot import grpc: run scripts/test.sh (it installs grpcio into .venv) or set HAPTIC_PYTHON",
        python.display()
    );
    python
}

/// Runs the gRPC client of grpc_echo.py (`mode` and its arguments); its output, trimmed.
fn grpc_client(python: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(python)
        .arg(harness::root().join("tests/libraries/grpc_echo.py"))
        .args(args)
        .output()
        .expect("gRPC client");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A gRPC server answering every method with "<name> /<service>/<method> <payload>".
struct GrpcEcho {
    child: std::process::Child,
    port: u16,
}

impl GrpcEcho {
    fn start(python: &std::path::Path, name: &str) -> GrpcEcho {
        GrpcEcho::start_with(python, &["server", name])
    }

    /// A gRPC server over TLS with this certificate and key.
    fn start_tls(
        python: &std::path::Path,
        name: &str,
        cert: &std::path::Path,
        key: &std::path::Path,
    ) -> GrpcEcho {
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        GrpcEcho::start_with(python, &["tls-server", name, &cert, &key])
    }

    fn start_with(python: &std::path::Path, args: &[&str]) -> GrpcEcho {
        use std::io::BufRead;
        let script = harness::root().join("tests/libraries/grpc_echo.py");
        let mut child = std::process::Command::new(python)
            .arg(&script)
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .tied()
            .spawn()
            .expect("start the gRPC echo server");
        let mut line = String::new();
        let stdout = child.stdout.take().expect("stdout");
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("gRPC server port");
        let port = line.trim().parse().expect("a port number");
        GrpcEcho { child, port }
    }
}

impl Drop for GrpcEcho {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn grpc_routes_carry_real_grpc_calls_by_service_and_method() {
    let python = grpc_python();
    let greeter = GrpcEcho::start(&python, "greeter");
    let other = GrpcEcho::start(&python, "other");
    let mut m = service_yaml_port("default", "greeter", greeter.port);
    m.push_str(&service_yaml_port("default", "other", other.port));
    m.push_str(GATEWAYS);
    m.push_str(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: grpc, namespace: default, creationTimestamp: "2024-01-01T00:00:00Z", generation: 1}
spec:
  parentRefs: [{name: gw, sectionName: http}]
  hostnames: [grpc.test]
  rules:
    - matches: [{method: {service: demo.Greeter, method: Hello}}]
      backendRefs: [{name: greeter, port: 80}]
    - matches: [{method: {service: demo.Other}}, {method: {type: RegularExpression, method: "Ping[0-9]+"}}]
      backendRefs: [{name: other, port: 80}]
    - matches: [{method: {service: demo.Greeter, method: Hdr}, headers: [{name: x-tenant, value: blue}]}]
      backendRefs: [{name: other, port: 80}]
"#,
    );
    let s = Scenario::start("gateway-grpc", &m, &[]);
    let target = format!("{}:{}", s.proxy.ports.ip, s.proxy.ports.http);
    let call_with = |authority: &str, method: &str, metadata: &str| {
        grpc_client(
            &python,
            &["client", &target, authority, method, "hi", metadata],
        )
    };
    let call = |authority: &str, method: &str| call_with(authority, method, "");
    // HTTP/2 cleartext (prior knowledge) through the HTTP frontend, routed by method.
    assert_eq!(
        call("grpc.test", "/demo.Greeter/Hello"),
        "greeter /demo.Greeter/Hello hi"
    );
    assert_eq!(
        call("grpc.test", "/demo.Other/Anything"),
        "other /demo.Other/Anything hi"
    );
    assert_eq!(
        call("grpc.test", "/demo.Greeter/Ping42"),
        "other /demo.Greeter/Ping42 hi",
        "a regex on the method alone"
    );
    // No rule for it, or the wrong host: HAProxy's 404 reaches the client as UNIMPLEMENTED.
    assert_eq!(
        call("grpc.test", "/demo.Greeter/Goodbye"),
        "status UNIMPLEMENTED"
    );
    assert_eq!(
        call("other.test", "/demo.Greeter/Hello"),
        "status UNIMPLEMENTED"
    );
    // A header match on gRPC metadata; without it (or with another value) nothing matches.
    assert_eq!(
        call_with("grpc.test", "/demo.Greeter/Hdr", "x-tenant=blue"),
        "other /demo.Greeter/Hdr hi"
    );
    assert_eq!(
        call_with("grpc.test", "/demo.Greeter/Hdr", "x-tenant=red"),
        "status UNIMPLEMENTED"
    );
    assert_eq!(
        call("grpc.test", "/demo.Greeter/Hdr"),
        "status UNIMPLEMENTED"
    );
}

#[test]
fn grpc_route_backend_ref_header_filters_apply_to_their_backend_only() {
    let python = grpc_python();
    let one = GrpcEcho::start(&python, "one");
    let two = GrpcEcho::start(&python, "two");
    let mut m = service_yaml_port("default", "one", one.port);
    m.push_str(&service_yaml_port("default", "two", two.port));
    m.push_str(GATEWAYS);
    m.push_str(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: befilters, namespace: default, creationTimestamp: "2024-01-01T00:00:00Z", generation: 1}
spec:
  parentRefs: [{name: gw, sectionName: http}]
  hostnames: [grpc-be.test]
  rules:
    - matches: [{method: {service: demo.Split}}]
      filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-rule, value: r}]}}]
      backendRefs:
        - name: one
          port: 80
          filters:
            - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: x-be, value: one}], remove: [x-drop]}}
            - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: x-resp-be, value: one}]}}
        - name: two
          port: 80
          filters:
            - {type: RequestHeaderModifier, requestHeaderModifier: {add: [{name: x-be, value: two}]}}
    - matches: [{method: {service: demo.Ext}}]
      backendRefs:
        - name: one
          port: 80
          filters: [{type: ExtensionRef, extensionRef: {group: example.com, kind: Filter, name: f}}]
"#,
    );
    let s = Scenario::start("gateway-grpc-befilters", &m, &[]);
    let target = format!("{}:{}", s.proxy.ports.ip, s.proxy.ports.http);
    // 40 calls on one HTTP/2 connection: each call is a request of its own to HAProxy, so
    // each picks a backendRef by weight and gets only that backendRef's filters.
    let out = grpc_client(
        &python,
        &[
            "calls",
            &target,
            "grpc-be.test",
            "/demo.Split/SayMeta",
            "hi",
            "40",
            "x-drop=d",
        ],
    );
    let mut seen = std::collections::BTreeMap::new();
    for full in out.lines() {
        // HAProxy's own X-Forwarded-For and X-Forwarded-Proto are not the filters' business.
        let words: Vec<&str> = full
            .split(' ')
            .filter(|w| !w.starts_with("x-forwarded-"))
            .collect();
        let line = words.join(" ");
        match line.as_str() {
            // x-drop removed, x-be set, the response gets x-resp-be: only for `one`.
            "one /demo.Split/SayMeta hi x-be=one x-rule=r | x-resp-be=one" => {}
            // `two` keeps x-drop, gets its own x-be (added), no response header.
            "two /demo.Split/SayMeta hi x-be=two x-drop=d x-rule=r |" => {}
            other => panic!("unexpected answer {other:?} in:\n{out}"),
        }
        *seen.entry(words[0]).or_insert(0) += 1;
    }
    assert_eq!(seen.values().sum::<usize>(), 40, "{out}");
    assert_eq!(
        seen.len(),
        2,
        "both backends answered in 40 calls: {seen:?}"
    );
    // A filter kind the library cannot apply (ExtensionRef) makes its rule answer 500 (not
    // OK for the client), named in the route's Accepted condition; the other rule is served.
    let out = grpc_client(
        &python,
        &[
            "calls",
            &target,
            "grpc-be.test",
            "/demo.Ext/SayMeta",
            "hi",
            "1",
        ],
    );
    assert!(
        out.starts_with("status ") && !out.contains("one /"),
        "{out}"
    );
    let st = status_of(&s.render_output, "GRPCRoute", "default/befilters").expect("status");
    let conditions = &st["parents"][0]["conditions"];
    assert_eq!(condition(conditions, "Accepted"), pair("True", "Accepted"));
    let message = conditions[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("rule 1: backendRef filter ExtensionRef is not supported (answers 500)"),
        "{message}"
    );
    assert!(!message.contains("rule 0"), "{message}");
}

#[test]
fn grpc_routes_carry_tls_and_streaming_calls_through_the_https_listener() {
    let python = grpc_python();
    let dir = harness::TempDir::new("pki-gw-grpcs");
    let pki = harness::Pki::new(dir.path());
    let greeter = GrpcEcho::start(&python, "greeter");
    let mut m = service_yaml_port("default", "greeter", greeter.port);
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("default", "grpcs-cert", &["grpcs.test"]));
    m.push_str(&gateway_yaml(
        "gws",
        "    - {name: https, protocol: HTTPS, port: 443, hostname: grpcs.test, tls: {certificateRefs: [{name: grpcs-cert}]}}\n",
    ));
    m.push_str(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: grpcs, namespace: default, creationTimestamp: "2024-01-01T00:00:00Z", generation: 1}
spec:
  parentRefs: [{name: gws, sectionName: https}]
  hostnames: [grpcs.test]
  rules:
    - matches: [{method: {service: demo.Greeter}}]
      backendRefs: [{name: greeter, port: 80}]
"#,
    );
    let s = Scenario::start("gateway-grpcs", &m, &[]);
    let target = format!("{}:{}", s.proxy.ports.ip, s.proxy.ports.https);
    let ca = pki.ca.display().to_string();
    let run = |mode: &str, method: &str| {
        grpc_client(&python, &[mode, &target, "grpcs.test", &ca, method, "hi"])
    };
    // TLS terminated by HAProxy with the listener's certificate (the client verifies it against
    // the test CA and negotiates h2 by ALPN), then HTTP/2 cleartext to the gRPC server.
    assert_eq!(
        run("tls-call", "/demo.Greeter/Hello"),
        "greeter /demo.Greeter/Hello hi"
    );
    // A server-streaming call: every message of the stream comes through, in order.
    assert_eq!(
        run("tls-stream", "/demo.Greeter/CountStream"),
        "greeter /demo.Greeter/CountStream hi 0\ngreeter /demo.Greeter/CountStream hi 1\ngreeter /demo.Greeter/CountStream hi 2"
    );
    // A service no rule matches: HAProxy's 404 reaches the client as UNIMPLEMENTED.
    assert_eq!(run("tls-call", "/demo.Other/Hello"), "status UNIMPLEMENTED");
}

#[test]
fn backend_tls_policy_verifies_grpc_backends_over_tls() {
    let python = grpc_python();
    let dir = harness::TempDir::new("pki-gw-grpc-btls");
    let pki = harness::Pki::new(dir.path());
    let (cert, key) = pki.server_files("grpc-backend", &["grpc.internal"]);
    let server = GrpcEcho::start_tls(&python, "secure", &cert, &key);
    let mut m = String::new();
    for svc in ["verified", "wrongname"] {
        m.push_str(&service_yaml_port("default", svc, server.port));
    }
    let pem = std::fs::read_to_string(&pki.ca).expect("CA file");
    let body: String = pem.lines().map(|l| format!("    {l}\n")).collect();
    m.push_str(&format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: ca, namespace: default}}\ndata:\n  ca.crt: |\n{body}"));
    m.push_str(GATEWAYS);
    m.push_str(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata: {name: grpc, namespace: default, creationTimestamp: "2024-01-01T00:00:00Z", generation: 1}
spec:
  parentRefs: [{name: gw, sectionName: http}]
  hostnames: [grpc.test]
  rules:
    - matches: [{method: {service: demo.Verified}}]
      backendRefs: [{name: verified, port: 80}]
    - matches: [{method: {service: demo.Wrong}}]
      backendRefs: [{name: wrongname, port: 80}]
"#,
    );
    for (svc, host) in [
        ("verified", "grpc.internal"),
        ("wrongname", "other.internal"),
    ] {
        m.push_str(&backend_tls_policy(
            svc,
            "2024-01-01T00:00:00Z",
            &format!("{{targetRefs: [{{group: '', kind: Service, name: {svc}}}], validation: {{caCertificateRefs: [{{group: '', kind: ConfigMap, name: ca}}], hostname: {host}}}}}"),
        ));
    }
    let s = Scenario::start("gateway-grpc-btls", &m, &[]);
    let target = format!("{}:{}", s.proxy.ports.ip, s.proxy.ports.http);
    let call = |method: &str| grpc_client(&python, &["client", &target, "grpc.test", method, "hi"]);
    // HTTP/2 cleartext from the client, HTTP/2 over TLS (ALPN h2) from HAProxy to the server,
    // whose certificate is verified against the ConfigMap's CA and the name grpc.internal.
    assert_eq!(
        call("/demo.Verified/Hello"),
        "secure /demo.Verified/Hello hi"
    );
    // The certificate does not carry other.internal: HAProxy's 503 reaches the client as
    // UNAVAILABLE, the call never reaches the server unverified.
    assert_eq!(call("/demo.Wrong/Hello"), "status UNAVAILABLE");
    assert_eq!(
        policy_conditions(&s.render_output, "verified"),
        (pair("True", "Accepted"), pair("True", "ResolvedRefs"))
    );
}

#[test]
fn gateway_listeners_are_isolated_by_hostname() {
    let names = ["any", "wild", "spec"];
    let echoes: Vec<Echo> = names.iter().map(|n| Echo::start(n)).collect();
    let mut m: String = echoes
        .iter()
        .map(|e| service_yaml("default", &e.name, e))
        .collect();
    m.push_str(&gateway_yaml(
        "iso",
        r#"    - {name: empty, protocol: HTTP, port: 80}
    - {name: wildcard, protocol: HTTP, port: 80, hostname: "*.iso.test"}
    - {name: specific, protocol: HTTP, port: 80, hostname: specific.iso.test}
"#,
    ));
    for (name, listener, path) in [
        ("any", "empty", "/"),
        ("wild", "wildcard", "/only-wild"),
        ("spec", "specific", "/only-spec"),
    ] {
        m.push_str(&route(
            "default",
            name,
            "2024-01-01T00:00:00Z",
            &format!("  parentRefs: [{{name: iso, sectionName: {listener}}}]\n  rules: [{{matches: [{{path: {{type: PathPrefix, value: {path}}}}}], backendRefs: [{{name: {name}, port: 80}}]}}]\n"),
        ));
    }
    let s = Scenario::start("gateway-isolation", &m, &[]);
    let p = &s.proxy;
    let to = |host: &str, path: &str| {
        let r = p.http(host, path);
        (r.status, r.backend().unwrap_or("").to_string())
    };
    // Each listener's own routes answer its hosts.
    assert_eq!(to("specific.iso.test", "/only-spec"), pair_n(200, "spec"));
    assert_eq!(to("x.iso.test", "/only-wild"), pair_n(200, "wild"));
    assert_eq!(to("other.test", "/anything"), pair_n(200, "any"));
    // A host of a more specific listener never reaches a less specific listener's routes,
    // even when none of its own routes matches the request.
    assert_eq!(to("specific.iso.test", "/"), pair_n(404, ""));
    assert_eq!(to("specific.iso.test", "/only-wild"), pair_n(404, ""));
    assert_eq!(to("x.iso.test", "/"), pair_n(404, ""));
    assert_eq!(to("deep.x.iso.test", "/only-spec"), pair_n(404, ""));
}

fn pair_n(status: u16, backend: &str) -> (u16, String) {
    (status, backend.to_string())
}

/// A certificate Secret a tenant grants to a shared Gateway, broken by that tenant (not PEM, or
/// a key that does not match its certificate), costs that listener alone: the Gateway, its
/// other listeners and their routes keep serving (before, the whole Gateway was left out).
#[test]
fn a_tenants_broken_certificate_costs_its_listener_not_the_gateway() {
    let dir = harness::TempDir::new("pki-gw-broken-cert");
    let pki = harness::Pki::new(dir.path());
    let (a, b) = (Echo::start("a"), Echo::start("b"));
    let mut m = service_yaml("default", "a", &a);
    m.push_str(&service_yaml("default", "b", &b));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("default", "own-cert", &["own.gw.test"]));
    // A key that does not match: haproxy -c refuses the certificate file.
    let (crt, _) = pki.leaf("team-key", &["key.gw.test"]);
    let (_, other_key) = pki.leaf("team-other", &["other.gw.test"]);
    m.push_str(&format!(
        "---\napiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata: {{name: bad-key, namespace: team}}\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
        harness::base64(crt.as_bytes()),
        harness::base64(other_key.as_bytes())
    ));
    m.push_str(&format!(
        "---\napiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata: {{name: not-pem, namespace: team}}\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
        harness::base64(b"certificate? no"),
        harness::base64(other_key.as_bytes())
    ));
    m.push_str(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: ReferenceGrant\nmetadata: {name: to-gw, namespace: team}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: default}]\n  to: [{group: \"\", kind: Secret}]\n",
    );
    m.push_str(&gateway_yaml(
        "shared",
        r#"    - {name: own, protocol: HTTPS, port: 443, hostname: own.gw.test, tls: {certificateRefs: [{name: own-cert}]}}
    - {name: key, protocol: HTTPS, port: 443, hostname: key.gw.test, tls: {certificateRefs: [{name: bad-key, namespace: team}]}}
    - {name: pem, protocol: HTTPS, port: 443, hostname: pem.gw.test, tls: {certificateRefs: [{name: not-pem, namespace: team}]}}
"#,
    ));
    m.push_str(&route(
        "default",
        "own",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: shared, sectionName: own}]\n  rules: [{backendRefs: [{name: a, port: 80}]}]\n",
    ));
    m.push_str(&route(
        "default",
        "key",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: shared, sectionName: key}]\n  rules: [{backendRefs: [{name: b, port: 80}]}]\n",
    ));
    let s = Scenario::start("gateway-broken-cert", &m, &[]);
    let out = &s.render_output;
    assert!(!out.contains("Gateway default/shared: left out"), "{out}");
    assert!(
        out.contains("Secret team/bad-key") && out.contains("haproxy -c"),
        "the certificate HAProxy refuses is left out, named: {out}"
    );
    let r = s.proxy.https("own.gw.test", "/", &pki.ca, &[]);
    assert_eq!((r.status, r.backend().unwrap_or("")), (200, "a"), "{out}");
    let gw = status_of(out, "Gateway", "default/shared").expect("Gateway status");
    let listener = |name: &str| {
        gw["listeners"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .unwrap_or_else(|| panic!("no listener {name}: {gw}"))
            .clone()
    };
    assert_eq!(
        condition(&listener("pem")["conditions"], "ResolvedRefs"),
        pair("False", "InvalidCertificateRef")
    );
    assert_eq!(
        condition(&listener("own")["conditions"], "Programmed"),
        pair("True", "Programmed")
    );
    // The listener whose key does not match serves no certificate of its own: its name gets
    // the default one, which a client checking the name refuses.
    let r = s.proxy.https("key.gw.test", "/", &pki.ca, &[]);
    assert_ne!(r.status, 200, "{out}");
}

/// Gateways of the class share HAProxy's addresses, so listener isolation spans them: a route
/// another namespace attaches to a shared Gateway's host-less listener never answers a name
/// that a team's own Gateway claims with a listener hostname, whatever its paths (a regular
/// expression outranks every prefix) or its age.
#[test]
fn listener_isolation_spans_the_gateways_of_the_class() {
    let (a, b) = (Echo::start("a"), Echo::start("b"));
    let mut m = service_yaml("team-a", "a", &a);
    m.push_str(&service_yaml("tenant-b", "b", &b));
    m.push_str(&gateway_yaml(
        "shared",
        r#"    - {name: any, protocol: HTTP, port: 80, allowedRoutes: {namespaces: {from: All}}}
"#,
    ));
    m.push_str(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: team-a, namespace: team-a}\nspec:\n  gatewayClassName: haproxy\n  listeners:\n    - {name: a, protocol: HTTP, port: 80, hostname: \"*.a.test\"}\n",
    );
    // The thief's route is the older one.
    m.push_str(&route(
        "tenant-b",
        "grab",
        "2023-01-01T00:00:00Z",
        "  parentRefs: [{name: shared, namespace: default}]\n  hostnames: [login.a.test, b.test]\n  rules: [{matches: [{path: {type: RegularExpression, value: \".*\"}}], backendRefs: [{name: b, port: 80}]}]\n",
    ));
    m.push_str(&route(
        "tenant-b",
        "catch",
        "2023-01-01T00:00:00Z",
        "  parentRefs: [{name: shared, namespace: default}]\n  rules: [{matches: [{path: {type: PathPrefix, value: /catch}}], backendRefs: [{name: b, port: 80}]}]\n",
    ));
    m.push_str(&route(
        "team-a",
        "login",
        "2024-01-01T00:00:00Z",
        // Attached to the shared Gateway too (listed first): the name is still the team's
        // listener's, so the route answers through it.
        "  parentRefs: [{name: shared, namespace: default}, {name: team-a}]\n  hostnames: [login.a.test]\n  rules: [{backendRefs: [{name: a, port: 80}]}]\n",
    ));
    // Many listener hostnames on the frontend (more than the 64 words of an HAProxy line, were
    // they written on each route line): the check stays one condition per line.
    for g in 0..2 {
        let many: String = (0..40)
            .map(|i| {
                format!("    - {{name: l{i}, protocol: HTTP, port: 80, hostname: l{g}-{i}.many.test}}\n")
            })
            .collect();
        m.push_str(&format!(
            "---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {{name: many-{g}, namespace: team-a}}\nspec:\n  gatewayClassName: haproxy\n  listeners:\n{many}"
        ));
    }
    let s = Scenario::start("gateway-isolation-across", &m, &[]);
    assert!(!s.render_output.contains("left out"), "{}", s.render_output);
    let to = |host: &str, path: &str| {
        let r = s.proxy.http(host, path);
        (r.status, r.backend().unwrap_or("").to_string())
    };
    assert_eq!(to("login.a.test", "/"), pair_n(200, "a"));
    assert_eq!(to("login.a.test", "/secret"), pair_n(200, "a"));
    // A name the team's listener claims and no route of theirs has: not the thief's
    // hostname-less route either.
    assert_eq!(to("other.a.test", "/catch"), pair_n(404, ""));
    assert_eq!(to("elsewhere.test", "/catch"), pair_n(200, "b"));
    // The shared listener still serves the names no other listener claims.
    assert_eq!(to("b.test", "/x"), pair_n(200, "b"));
    // A name one of the many listeners claims is not the shared listener's either.
    assert_eq!(to("l1-33.many.test", "/catch"), pair_n(404, ""));
}

/// A GRPCRoute takes gRPC requests only: on a hostname an HTTPRoute of another namespace
/// serves too, its service pattern `.*` (which spans slashes) does not take the HTTP requests.
#[test]
fn a_grpc_route_never_takes_http_requests_on_a_shared_hostname() {
    let python = grpc_python();
    let rpc = GrpcEcho::start(&python, "rpc");
    let web = Echo::start("web");
    let mut m = service_yaml("shop", "web", &web);
    m.push_str(&service_yaml_port("other", "rpc", rpc.port));
    m.push_str(&gateway_yaml(
        "shared",
        r#"    - {name: http, protocol: HTTP, port: 80, allowedRoutes: {namespaces: {from: All}}}
"#,
    ));
    m.push_str(&route(
        "shop",
        "web",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: shared, namespace: default}]\n  hostnames: [shop.test]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
    ));
    m.push_str(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: GRPCRoute\nmetadata: {name: g, namespace: other, creationTimestamp: \"2024-02-01T00:00:00Z\"}\nspec:\n  parentRefs: [{name: shared, namespace: default}]\n  hostnames: [shop.test]\n  rules: [{matches: [{method: {type: RegularExpression, service: \".*\"}}], backendRefs: [{name: rpc, port: 80}]}]\n",
    );
    let s = Scenario::start("gateway-grpc-http-shared", &m, &[]);
    let to = |path: &str, args: &[&str]| {
        let r = s.proxy.http_with("shop.test", path, args);
        (r.status, r.backend().unwrap_or("").to_string())
    };
    for path in ["/account/orders/42", "/a/b", "/cart"] {
        assert_eq!(to(path, &[]), pair_n(200, "web"), "{path}");
    }
    // A gRPC call is the GRPCRoute's.
    let target = format!("{}:{}", s.proxy.ports.ip, s.proxy.ports.http);
    assert_eq!(
        grpc_client(
            &python,
            &["client", &target, "shop.test", "/pkg.Svc/Call", "hi", ""]
        ),
        "rpc /pkg.Svc/Call hi"
    );
}

#[test]
fn gateway_https_answers_421_to_requests_for_another_listener() {
    let dir = harness::TempDir::new("pki-gw-421");
    let pki = harness::Pki::new(dir.path());
    let (a, b, w) = (Echo::start("a"), Echo::start("b"), Echo::start("w"));
    let mut m = service_yaml("default", "a", &a);
    m.push_str(&service_yaml("default", "b", &b));
    m.push_str(&service_yaml("default", "w", &w));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    // One certificate for every name, as clients that reuse connections across hosts see it.
    m.push_str(&pki.secret_yaml(
        "default",
        "shared-cert",
        &["a.tls.test", "b.tls.test", "*.w.tls.test"],
    ));
    m.push_str(&gateway_yaml(
        "tls",
        r#"    - {name: a, protocol: HTTPS, port: 443, hostname: a.tls.test, tls: {certificateRefs: [{name: shared-cert}]}}
    - {name: b, protocol: HTTPS, port: 443, hostname: b.tls.test, tls: {certificateRefs: [{name: shared-cert}]}}
    - {name: w, protocol: HTTPS, port: 443, hostname: "*.w.tls.test", tls: {certificateRefs: [{name: shared-cert}]}}
"#,
    ));
    for name in ["a", "b", "w"] {
        m.push_str(&route(
            "default",
            name,
            "2024-01-01T00:00:00Z",
            &format!("  parentRefs: [{{name: tls, sectionName: {name}}}]\n  rules: [{{backendRefs: [{{name: {name}, port: 80}}]}}]\n"),
        ));
    }
    let s = Scenario::start("gateway-421", &m, &[]);
    let p = &s.proxy;
    let call = |sni: &str, host: &str| {
        let header = format!("Host: {host}");
        let r = p.https(sni, "/", &pki.ca, &["-H", &header]);
        (r.status, r.backend().unwrap_or("").to_string())
    };
    assert_eq!(call("a.tls.test", "a.tls.test"), pair_n(200, "a"));
    assert_eq!(call("b.tls.test", "b.tls.test"), pair_n(200, "b"));
    // The same wildcard listener for both names: not misdirected.
    assert_eq!(call("x.w.tls.test", "y.w.tls.test"), pair_n(200, "w"));
    // The TLS name chose listener a; the Host belongs to listener b, to the wildcard listener,
    // or to no listener: 421, and the request reaches no backend.
    assert_eq!(call("a.tls.test", "b.tls.test"), pair_n(421, ""));
    assert_eq!(call("x.w.tls.test", "a.tls.test"), pair_n(421, ""));
    assert_eq!(call("a.tls.test", "elsewhere.test"), pair_n(421, ""));
    // A Host with a port still names its listener.
    assert_eq!(call("a.tls.test", "a.tls.test:443"), pair_n(200, "a"));
}

#[test]
fn gateway_backend_ref_filters_apply_to_their_backend_only() {
    let (one, two) = (Echo::start("one"), Echo::start("two"));
    let mut m = service_yaml("default", "one", &one);
    m.push_str(&service_yaml("default", "two", &two));
    m.push_str(GATEWAYS);
    m.push_str(&route(
        "default",
        "befilters",
        "2024-01-01T00:00:00Z",
        r#"  parentRefs: [{name: gw, sectionName: http}]
  hostnames: [be.test]
  rules:
    - filters:
        - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Rule, value: r}]}}
      backendRefs:
        - name: one
          port: 80
          filters:
            - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Be, value: one}], remove: [X-Drop]}}
            - {type: ResponseHeaderModifier, responseHeaderModifier: {set: [{name: X-Resp-Be, value: one}]}}
        - name: two
          port: 80
          filters:
            - {type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: X-Be, value: two}]}}
    - matches: [{path: {type: PathPrefix, value: /mirror}}]
      backendRefs:
        - name: one
          port: 80
          filters: [{type: RequestMirror, requestMirror: {backendRef: {name: two, port: 80}}}]
    - matches: [{path: {type: PathPrefix, value: /pick}}]
      backendRefs:
        - name: one
          port: 80
          filters: [{type: URLRewrite, urlRewrite: {hostname: one.internal, path: {type: ReplacePrefixMatch, replacePrefixMatch: /rewritten}}}]
        - name: two
          port: 80
          filters: [{type: RequestRedirect, requestRedirect: {hostname: moved.test, statusCode: 302}}]
    - matches: [{path: {type: PathPrefix, value: /both}}]
      filters: [{type: URLRewrite, urlRewrite: {hostname: rule.test}}]
      backendRefs: [{name: one, port: 80, filters: [{type: URLRewrite, urlRewrite: {hostname: be.internal}}]}]
"#,
    ));
    let s = Scenario::start("gateway-befilters", &m, &[]);
    let p = &s.proxy;
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let r = p.http_with("be.test", "/", &["-H", "X-Drop: d"]);
        assert_eq!(r.status, 200);
        let backend = r.backend().expect("a backend").to_string();
        assert_eq!(
            r.echoed("header:x-rule"),
            Some("r"),
            "the rule's filter applies to both"
        );
        assert_eq!(r.echoed("header:x-be"), Some(backend.as_str()));
        if backend == "one" {
            assert_eq!(r.echoed("header:x-drop"), None);
            assert_eq!(r.header("x-resp-be"), Some("one"));
        } else {
            assert_eq!(r.echoed("header:x-drop"), Some("d"));
            assert_eq!(r.header("x-resp-be"), None);
        }
        seen.insert(backend);
    }
    assert_eq!(
        seen.len(),
        2,
        "both backends were chosen in 40 requests: {seen:?}"
    );
    // URLRewrite and RequestRedirect on backendRefs: a request that chose `one` reaches it
    // rewritten (prefix and Host), one that chose `two` is redirected and reaches no backend.
    let mut picked = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let r = p.http("be.test", "/pick/x?q=1");
        match r.status {
            200 => {
                assert_eq!(r.backend(), Some("one"));
                assert_eq!(r.echoed("path"), Some("/rewritten/x?q=1"));
                assert_eq!(r.echoed("host"), Some("one.internal"));
                picked.insert("rewritten");
            }
            302 => {
                assert_eq!(r.backend(), None);
                assert_eq!(r.header("location"), Some("http://moved.test/pick/x?q=1"));
                picked.insert("redirected");
            }
            other => panic!("unexpected {other}: {r:?}"),
        }
    }
    assert_eq!(picked.len(), 2, "both backendRefs were chosen: {picked:?}");
    // A backendRef URLRewrite after the rule's own would act on the rewritten request: the
    // rule answers 500, named in the status.
    assert_eq!(p.http("be.test", "/both").status, 500);
    // A filter kind HAProxy cannot do (mirroring) still makes its rule answer 500, and the
    // route's status says so.
    assert_eq!(p.http("be.test", "/mirror").status, 500);
    let st = status_of(&s.render_output, "HTTPRoute", "default/befilters").expect("status");
    let conditions = &st["parents"][0]["conditions"];
    assert_eq!(condition(conditions, "Accepted"), pair("True", "Accepted"));
    let message = conditions[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("rule 1: backendRef filter RequestMirror is not supported"),
        "{message}"
    );
    assert!(
        message.contains("rule 3: a backendRef URLRewrite or RequestRedirect together with the rule's own URLRewrite or RequestRedirect is not supported (answers 500)"),
        "{message}"
    );
    assert!(!message.contains("rule 2"), "{message}");
}

#[test]
fn gateway_hostless_https_listener_serves_its_certificate_for_unclaimed_names() {
    let dir = harness::TempDir::new("pki-gw-hostless");
    let pki = harness::Pki::new(dir.path());
    let (any, secure, late) = (
        Echo::start("any"),
        Echo::start("secure"),
        Echo::start("late"),
    );
    let mut m = service_yaml("edge", "any", &any);
    m.push_str(&service_yaml("edge", "secure", &secure));
    m.push_str(&service_yaml("late", "late", &late));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("edge", "any-cert", &["catchall.test"]));
    m.push_str(&pki.secret_yaml("edge", "secure-cert", &["secure.test"]));
    m.push_str(&pki.secret_yaml("late", "late-cert", &["late.test"]));
    // Two Gateways with a host-less HTTPS listener: the older one's serves the unclaimed names.
    m.push_str(
        r#"---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: haproxy}
spec: {controllerName: haproxy-haptic.org/controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: edge, namespace: edge, creationTimestamp: "2024-01-01T00:00:00Z", generation: 1}
spec:
  gatewayClassName: haproxy
  listeners:
    - {name: any, protocol: HTTPS, port: 443, tls: {certificateRefs: [{name: any-cert}]}}
    - {name: secure, protocol: HTTPS, port: 443, hostname: secure.test, tls: {certificateRefs: [{name: secure-cert}]}}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: late, namespace: late, creationTimestamp: "2025-01-01T00:00:00Z", generation: 1}
spec:
  gatewayClassName: haproxy
  listeners:
    - {name: any, protocol: HTTPS, port: 443, tls: {certificateRefs: [{name: late-cert}]}}
"#,
    );
    for (ns, name, gw, listener) in [
        ("edge", "any", "edge", "any"),
        ("edge", "secure", "edge", "secure"),
        ("late", "late", "late", "any"),
    ] {
        m.push_str(&route(
            ns,
            name,
            "2024-01-01T00:00:00Z",
            &format!("  parentRefs: [{{name: {gw}, sectionName: {listener}}}]\n  rules: [{{backendRefs: [{{name: {name}, port: 80}}]}}]\n"),
        ));
    }
    let s = Scenario::start("gateway-hostless-https", &m, &[]);
    let p = &s.proxy;
    // A name no listener claims, and a client without SNI: the host-less listener's
    // certificate, not the admin's default one.
    assert_eq!(
        harness::served_certificate(p, Some("unknown.example")),
        "catchall.test"
    );
    assert_eq!(harness::served_certificate(p, None), "catchall.test");
    // The more specific listener keeps its name.
    assert_eq!(
        harness::served_certificate(p, Some("secure.test")),
        "secure.test"
    );
    // The newer Gateway's host-less listener serves nothing, not even its certificate's name.
    assert_eq!(
        harness::served_certificate(p, Some("late.test")),
        "catchall.test"
    );
    // Requests: verified for the certificate's own name; any other name reaches the host-less
    // listener's route over the same certificate (curl -k: it does not cover that name).
    let r = p.https("catchall.test", "/", &pki.ca, &[]);
    assert_eq!((r.status, r.backend()), (200, Some("any")), "{r:?}");
    let r = p.https("unknown.example", "/", &pki.ca, &["-k"]);
    assert_eq!((r.status, r.backend()), (200, Some("any")), "{r:?}");
    let r = p.https("secure.test", "/", &pki.ca, &[]);
    assert_eq!((r.status, r.backend()), (200, Some("secure")), "{r:?}");
    let r = p.https("late.test", "/", &pki.ca, &["-k"]);
    assert_eq!((r.status, r.backend()), (200, Some("any")), "{r:?}");
    // Statuses: the older Gateway's listener is programmed, the newer one's is Conflicted and
    // says which listener holds the unclaimed names.
    let out = &s.render_output;
    let edge = status_of(out, "Gateway", "edge/edge").expect("edge status");
    let l = &edge["listeners"][0];
    assert_eq!(
        condition(&l["conditions"], "Programmed"),
        pair("True", "Programmed")
    );
    assert_eq!(
        condition(&l["conditions"], "Conflicted"),
        pair("False", "NoConflicts")
    );
    let late_gw = status_of(out, "Gateway", "late/late").expect("late status");
    let l = &late_gw["listeners"][0];
    assert_eq!(
        condition(&l["conditions"], "Conflicted"),
        pair("True", "HostnameConflict")
    );
    assert_eq!(
        condition(&l["conditions"], "Programmed"),
        pair("False", "Invalid")
    );
    let message = l["conditions"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == "Conflicted"))
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default();
    assert!(
        message.contains("listener any of the older Gateway edge/edge"),
        "{message}"
    );
}

fn tls_route(ns: &str, name: &str, ts: &str, spec: &str) -> String {
    format!(
        "---\napiVersion: gateway.networking.k8s.io/v1\nkind: TLSRoute\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{ts}\", generation: 1}}\nspec:\n{spec}"
    )
}

#[test]
fn tls_routes_pass_raw_tls_through_by_sni() {
    let dir = harness::TempDir::new("pki-gw-tlsroute");
    let pki = harness::Pki::new(dir.path());
    // The backend's own certificate: clients verify it through HAProxy, so TLS was not
    // terminated there.
    let (cert, key) = pki.server_files("db", &["db.test", "x.wild.test"]);
    let (ip, port) = (harness::unique_loopback(), 9443);
    let _db = harness::TlsServer::start(&cert, &key, &ip, port);
    let web = Echo::start("web");
    let mut m = harness::tls_service_yaml_in("team", "db", &ip, port);
    m.push_str(&harness::tls_service_yaml_in("other", "db", &ip, port));
    m.push_str(&service_yaml("default", "web", &web));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("default", "secure-cert", &["secure.wild.test"]));
    m.push_str(&gateway_yaml(
        "tls",
        r#"    - {name: pt, protocol: TLS, port: 443, tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}
    - {name: pt-wild, protocol: TLS, port: 443, hostname: "*.wild.test", tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}
    - {name: secure, protocol: HTTPS, port: 443, hostname: secure.wild.test, tls: {certificateRefs: [{name: secure-cert}]}}
"#,
    ));
    let pt = |listener: &str, hosts: &str, backend_ns: &str| {
        format!("  parentRefs: [{{name: tls, namespace: default, sectionName: {listener}}}]\n  hostnames: [{hosts}]\n  rules: [{{backendRefs: [{{name: db, namespace: {backend_ns}, port: 443}}]}}]\n")
    };
    m.push_str(&tls_route(
        "team",
        "db",
        "2024-01-01T00:00:00Z",
        &pt("pt", "db.test", "team"),
    ));
    m.push_str(&tls_route(
        "team",
        "wild",
        "2024-01-02T00:00:00Z",
        &pt("pt-wild", "\"*.wild.test\"", "team"),
    ));
    // Another namespace's Service without a ReferenceGrant: connections are rejected.
    m.push_str(&tls_route(
        "team",
        "nogrant",
        "2024-01-03T00:00:00Z",
        &pt("pt", "nogrant.test", "other"),
    ));
    // A newer route of another namespace for a name team claimed first: left out.
    m.push_str(&tls_route(
        "thief",
        "db",
        "2024-02-01T00:00:00Z",
        &pt("pt", "db.test", "thief"),
    ));
    m.push_str(&route(
        "default",
        "secure",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: tls, sectionName: secure}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
    ));
    let s = Scenario::start("gateway-tlsroute", &m, &[]);
    // haproxy -c (its warnings are in the render output) does not ignore `option forwardfor`
    // in a mode tcp backend: they use the defaults without it.
    assert!(
        !s.render_output.contains("requires HTTP mode"),
        "{}",
        s.render_output
    );
    let p = &s.proxy;
    let passed_through = |sni: &str| {
        let r = p.https(sni, "/", &pki.ca, &[]);
        r.status == 200 && r.body.contains("s_server") && r.backend().is_none()
    };
    // Exact and wildcard names reach the TLS backend undecrypted (its certificate verifies).
    assert!(passed_through("db.test"));
    assert!(passed_through("x.wild.test"));
    assert_eq!(harness::served_certificate(p, Some("db.test")), "db.test");
    // A name of the HTTPS listener under the wildcard is terminated in HAProxy and routed.
    let r = p.https("secure.wild.test", "/", &pki.ca, &[]);
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    // A name no TLSRoute has is not passed through: HAProxy terminates it with its default
    // certificate, and nothing routes it.
    assert_eq!(
        harness::served_certificate(p, Some("unknown.test")),
        "default.invalid"
    );
    let r = p.https("unknown.test", "/", &pki.ca, &["-k"]);
    assert_eq!(
        (r.status, r.body.contains("s_server")),
        (404, false),
        "{r:?}"
    );
    // An unresolvable backendRef: the connection is closed, no TLS session at all.
    let r = p.https("nogrant.test", "/", &pki.ca, &["-k"]);
    assert_eq!(r.status, 0, "{r:?}");
    // Statuses.
    let out = &s.render_output;
    let st = status_of(out, "TLSRoute", "team/db").expect("TLSRoute status");
    assert_eq!(
        condition(&st["parents"][0]["conditions"], "Accepted"),
        pair("True", "Accepted")
    );
    let st = status_of(out, "TLSRoute", "team/nogrant").expect("status");
    assert_eq!(
        condition(&st["parents"][0]["conditions"], "ResolvedRefs"),
        pair("False", "RefNotPermitted")
    );
    let st = status_of(out, "TLSRoute", "thief/db").expect("status");
    assert_eq!(
        condition(&st["parents"][0]["conditions"], "Accepted"),
        pair("False", "UnsupportedValue")
    );
    assert!(
        out.contains("TLSRoute thief/db")
            && out.contains(
                "host db.test belongs to namespace team (TLSRoute team/db claimed it first)"
            ),
        "{out}"
    );
    let gw = status_of(out, "Gateway", "default/tls").expect("Gateway status");
    let listeners: Vec<(&str, i64, &str)> = gw["listeners"]
        .as_array()
        .expect("listeners")
        .iter()
        .map(|l| {
            (
                l["name"].as_str().unwrap_or_default(),
                l["attachedRoutes"].as_i64().unwrap_or(-1),
                l["supportedKinds"][0]["kind"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        listeners,
        [
            ("pt", 2, "TLSRoute"),
            ("pt-wild", 1, "TLSRoute"),
            ("secure", 1, "HTTPRoute")
        ],
        "{gw}"
    );
}

#[test]
fn gateway_route_ignored_retry_and_header_session_timeouts_are_reported() {
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    m.push_str(GATEWAYS);
    m.push_str(&route(
        "default",
        "ignored",
        "2024-01-01T00:00:00Z",
        r#"  parentRefs: [{name: gw, sectionName: http}]
  hostnames: [ignored.test]
  rules:
    - matches: [{path: {type: PathPrefix, value: /retry}}]
      retry: {codes: [503], attempts: 2}
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /sticky}}]
      sessionPersistence: {type: Header, sessionName: X-Session, absoluteTimeout: 1h}
      backendRefs: [{name: web, port: 80}]
"#,
    ));
    m.push_str(&route(
        "default",
        "plain",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: gw, sectionName: http}]\n  hostnames: [plain.test]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
    ));
    let s = Scenario::start("gateway-ignored-fields", &m, &[]);
    let p = &s.proxy;
    // The rules route as if the fields were absent: no cookie is set, the backend answers.
    for path in ["/retry", "/sticky"] {
        let r = p.http("ignored.test", path);
        assert_eq!((r.status, r.backend()), (200, Some("web")), "{path}: {r:?}");
        assert_eq!(r.header("set-cookie"), None, "{path}: {r:?}");
    }
    // The route stays Accepted, with a reason and a message naming each ignored field.
    let st = status_of(&s.render_output, "HTTPRoute", "default/ignored").expect("status");
    let conditions = &st["parents"][0]["conditions"];
    assert_eq!(
        condition(conditions, "Accepted"),
        pair("True", "UnsupportedField")
    );
    let message = conditions[0]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("rule 0: retry is not supported and is ignored")
            && message.contains("rule 1: sessionPersistence absoluteTimeout, idleTimeout and cookieConfig are not supported for type Header and are ignored"),
        "{message}"
    );
    // A route without them keeps the plain reason.
    let st = status_of(&s.render_output, "HTTPRoute", "default/plain").expect("status");
    assert_eq!(
        condition(&st["parents"][0]["conditions"], "Accepted"),
        pair("True", "Accepted")
    );
}

/// A BackendTLSPolicy manifest in `default` (`spec` is its flow-style spec).
fn backend_tls_policy(name: &str, ts: &str, spec: &str) -> String {
    format!("---\napiVersion: gateway.networking.k8s.io/v1\nkind: BackendTLSPolicy\nmetadata: {{name: {name}, namespace: default, creationTimestamp: \"{ts}\", generation: 2}}\nspec: {spec}\n")
}

/// The Accepted and ResolvedRefs (status, reason) of a BackendTLSPolicy's entry for Gateway
/// default/gw.
fn policy_conditions(render_output: &str, name: &str) -> ((String, String), (String, String)) {
    let st = status_of(
        render_output,
        "BackendTLSPolicy",
        &format!("default/{name}"),
    )
    .unwrap_or_else(|| panic!("no status for BackendTLSPolicy {name}:\n{render_output}"));
    let ancestors = st["ancestors"].as_array().expect("ancestors");
    assert_eq!(ancestors.len(), 1, "{st}");
    let a = &ancestors[0];
    assert_eq!(a["ancestorRef"]["name"], "gw", "{st}");
    assert_eq!(a["ancestorRef"]["namespace"], "default", "{st}");
    assert_eq!(a["controllerName"], "haproxy-haptic.org/controller");
    assert_eq!(a["conditions"][0]["observedGeneration"], 2);
    (
        condition(&a["conditions"], "Accepted"),
        condition(&a["conditions"], "ResolvedRefs"),
    )
}

#[test]
fn backend_tls_policy_verifies_backends_by_ca_and_hostname() {
    let dir = harness::TempDir::new("pki-gw-btls");
    let pki = harness::Pki::new(dir.path());
    let other_dir = harness::TempDir::new("pki-gw-btls-other");
    let other = harness::Pki::new(other_dir.path());
    let (cert, key) = pki.server_files("backend", &["backend.internal"]);
    let (ip, port) = (harness::unique_loopback(), 9443);
    let _backend = harness::TlsServer::start(&cert, &key, &ip, port);
    let names = [
        "good",
        "wrongname",
        "wrongca",
        "missingca",
        "hostile",
        "system",
        "plain",
    ];
    let mut m = String::new();
    for n in names {
        m.push_str(&harness::tls_service_yaml_in("default", n, &ip, port));
    }
    let configmap = |name: &str, ca: &std::path::Path| {
        let pem = std::fs::read_to_string(ca).expect("CA file");
        let body: String = pem.lines().map(|l| format!("    {l}\n")).collect();
        format!("---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: default}}\ndata:\n  ca.crt: |\n{body}")
    };
    m.push_str(&configmap("ca-good", &pki.ca));
    m.push_str(&configmap("ca-other", &other.ca));
    m.push_str(GATEWAYS);
    let mut rules = String::from(
        "  parentRefs: [{name: gw, sectionName: http}]\n  hostnames: [btls.test]\n  rules:\n",
    );
    for n in names {
        rules.push_str(&format!("    - matches: [{{path: {{type: PathPrefix, value: /{n}}}}}]\n      backendRefs: [{{name: {n}, port: 443}}]\n"));
    }
    m.push_str(&route("default", "btls", "2024-01-01T00:00:00Z", &rules));
    let policy = |name: &str, ts: &str, svc: &str, validation: &str| {
        backend_tls_policy(
            name,
            ts,
            &format!("{{targetRefs: [{{group: '', kind: Service, name: {svc}, sectionName: https}}], validation: {validation}}}"),
        )
    };
    let ca = |cm: &str, host: &str| {
        format!(
            "{{caCertificateRefs: [{{group: '', kind: ConfigMap, name: {cm}}}], hostname: {host}}}"
        )
    };
    let t0 = "2024-01-01T00:00:00Z";
    m.push_str(&policy(
        "good",
        t0,
        "good",
        &ca("ca-good", "backend.internal"),
    ));
    // Newer, for the same Service port, and wrong: Conflicted, and the older one still applies.
    m.push_str(&policy(
        "good-newer",
        "2024-02-01T00:00:00Z",
        "good",
        &ca("ca-other", "other.internal"),
    ));
    m.push_str(&policy(
        "wrongname",
        t0,
        "wrongname",
        &ca("ca-good", "elsewhere.internal"),
    ));
    m.push_str(&policy(
        "wrongca",
        t0,
        "wrongca",
        &ca("ca-other", "backend.internal"),
    ));
    m.push_str(&policy(
        "missingca",
        t0,
        "missingca",
        &ca("nope", "backend.internal"),
    ));
    m.push_str(&policy(
        "hostile",
        t0,
        "hostile",
        &ca("ca-good", "'backend.internal verify none'"),
    ));
    // The test CA is not a system CA: verification against the system bundle fails.
    m.push_str(&policy(
        "system",
        t0,
        "system",
        "{wellKnownCACertificates: System, hostname: backend.internal}",
    ));
    let s = Scenario::start("gateway-btls", &m, &[]);
    let p = &s.proxy;
    let get = |path: &str| {
        let r = p.http("btls.test", path);
        (r.status, r.body.contains("s_server"))
    };
    // Verified against the ConfigMap's CA, with SNI and the certificate name backend.internal:
    // openssl's status page answers through HAProxy.
    assert_eq!(get("/good"), (200, true));
    // The certificate does not carry the policy's hostname, or another CA signed it, or there
    // is no system CA for it: the TLS session fails and HAProxy answers 503. A policy without
    // a usable CA, or left out for a hostile value, refuses requests itself (503): none of them
    // is ever sent unverified.
    for path in [
        "/wrongname",
        "/wrongca",
        "/system",
        "/missingca",
        "/hostile",
    ] {
        assert_eq!(get(path), (503, false), "{path}");
    }
    // Without a policy, HAProxy speaks plain HTTP to the TLS port: no answer from it.
    assert_ne!(get("/plain"), (200, true));
    let out = &s.render_output;
    assert_eq!(
        policy_conditions(out, "good"),
        (pair("True", "Accepted"), pair("True", "ResolvedRefs"))
    );
    assert_eq!(
        policy_conditions(out, "good-newer").0,
        pair("False", "Conflicted")
    );
    assert_eq!(
        policy_conditions(out, "wrongca"),
        (pair("True", "Accepted"), pair("True", "ResolvedRefs"))
    );
    assert_eq!(
        policy_conditions(out, "missingca"),
        (
            pair("False", "NoValidCACertificate"),
            pair("False", "InvalidCACertificateRef")
        )
    );
    assert_eq!(
        policy_conditions(out, "hostile").0,
        pair("False", "Invalid")
    );
    assert!(
        out.contains("BackendTLSPolicy default/hostile: left out of the configuration: spec.validation.hostname: \"backend.internal verify none\" contains a space"),
        "{out}"
    );
}

/// The status the render declared for one object of group/version `api`, parsed.
fn status_in(render_output: &str, api: &str, kind: &str, id: &str) -> Option<Value> {
    let prefix = format!("status {api} {kind} {id}: ");
    render_output
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|json| serde_json::from_str(json).expect("status JSON"))
}

/// The status entry of listener `name` in a Gateway status.
fn listener<'a>(gateway: &'a Value, name: &str) -> &'a Value {
    gateway["listeners"]
        .as_array()
        .and_then(|a| a.iter().find(|l| l["name"] == name))
        .unwrap_or_else(|| panic!("no listener {name} in {gateway}"))
}

fn kinds_of(listener: &Value) -> Vec<String> {
    listener["supportedKinds"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|k| k["kind"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn gateway_http_listener_on_another_port_serves_its_routes() {
    let (alt, main) = (Echo::start("alt"), Echo::start("main"));
    let mut m = service_yaml("team", "alt", &alt);
    m.push_str(&service_yaml("team", "main", &main));
    // creationTimestamps decide which Gateway's listener claims a port first (the oldest).
    m.push_str(&gateway_yaml("ports", "").replace(
        "namespace: default}",
        "namespace: default, creationTimestamp: \"2024-01-01T00:00:00Z\"}",
    ));
    m.push_str(
        r#"    - {name: main, protocol: HTTP, port: 80, allowedRoutes: {namespaces: {from: All}}}
    - {name: alt, protocol: HTTP, port: 9080, allowedRoutes: {namespaces: {from: All}}}
    - {name: status, protocol: HTTP, port: 8404}
    - {name: low, protocol: HTTP, port: 81}
    - {name: webhook, protocol: HTTP, port: 9443}
"#,
    );
    m.push_str("---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: later, namespace: other, creationTimestamp: \"2030-01-01T00:00:00Z\"}\nspec:\n  gatewayClassName: haproxy\n  listeners: [{name: tcp-on-9080, protocol: TCP, port: 9080}]\n");
    for (name, parent, backend) in [
        (
            "alt",
            "{name: ports, namespace: default, port: 9080}",
            "alt",
        ),
        (
            "main",
            "{name: ports, namespace: default, sectionName: main}",
            "main",
        ),
        (
            "wrong",
            "{name: ports, namespace: default, port: 9999}",
            "alt",
        ),
    ] {
        m.push_str(&route(
            "team",
            name,
            "2024-01-01T00:00:00Z",
            &format!("  parentRefs: [{parent}]\n  hostnames: [alt.test]\n  rules: [{{backendRefs: [{{name: {backend}, port: 80}}]}}]\n"),
        ));
    }
    let s = Scenario::start("gateway-other-port", &m, &[]);
    let p = &s.proxy;
    let on = |port: u16, host: &str| {
        let r = harness::get(
            &format!("http://{}:{port}/", p.ports.ip),
            &["-H", &format!("Host: {host}")],
        );
        (r.status, r.backend().unwrap_or("").to_string())
    };
    // The listener on 9080 has a frontend of its own with the route attached by parentRef.port;
    // the fixed HTTP frontend (public port 80) serves the route attached to the port-80 listener.
    assert_eq!(on(9080, "alt.test"), pair_n(200, "alt"));
    assert_eq!(on(p.ports.http, "alt.test"), pair_n(200, "main"));
    assert_eq!(on(9080, "other.test"), pair_n(404, ""));
    // Refused ports are not bound.
    assert!(std::net::TcpStream::connect((p.ports.ip.as_str(), 81)).is_err());
    assert!(std::net::TcpStream::connect((p.ports.ip.as_str(), 9443)).is_err());

    let gw = status_of(&s.render_output, "Gateway", "default/ports").expect("Gateway status");
    let l = listener(&gw, "alt");
    assert_eq!(
        condition(&l["conditions"], "Programmed"),
        pair("True", "Programmed")
    );
    assert_eq!(l["attachedRoutes"], 1, "{l}");
    assert_eq!(kinds_of(l), ["HTTPRoute", "GRPCRoute"]);
    for name in ["status", "low", "webhook"] {
        let l = listener(&gw, name);
        assert_eq!(
            condition(&l["conditions"], "Accepted"),
            pair("False", "PortUnavailable"),
            "{l}"
        );
        assert_eq!(condition(&l["conditions"], "Programmed").0, "False", "{l}");
    }
    let msg = |name: &str| {
        listener(&gw, name)["conditions"][0]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        msg("status").contains("port 8404 is reserved"),
        "{}",
        msg("status")
    );
    assert!(
        msg("low").contains("gateway_listener_ports"),
        "{}",
        msg("low")
    );
    // The newer Gateway asking for TCP on the HTTP port is Conflicted and not programmed.
    let later = status_of(&s.render_output, "Gateway", "other/later").expect("Gateway status");
    let l = listener(&later, "tcp-on-9080");
    assert_eq!(
        condition(&l["conditions"], "Conflicted"),
        pair("True", "ProtocolConflict")
    );
    assert_eq!(condition(&l["conditions"], "Programmed").0, "False");
    // A parentRef.port no listener has attaches nowhere.
    let st = status_of(&s.render_output, "HTTPRoute", "team/wrong").expect("route status");
    assert_eq!(
        condition(&st["parents"][0]["conditions"], "Accepted"),
        pair("False", "NoMatchingParent")
    );
}

#[test]
fn gateway_tcp_routes_carry_raw_tcp_bytes() {
    let (db, db2) = (
        harness::TcpEcho::start("db"),
        harness::TcpEcho::start("db2"),
    );
    let mut m = harness::tcp_service_yaml("team", "db", 5432, db.port);
    m.push_str(&harness::tcp_service_yaml("team", "db2", 5432, db2.port));
    m.push_str(&harness::tcp_service_yaml("other", "db2", 5432, db2.port));
    m.push_str(&gateway_yaml(
        "tcp",
        r#"    - {name: tcp, protocol: TCP, port: 9000, allowedRoutes: {namespaces: {from: All}}}
    - {name: nogrant, protocol: TCP, port: 9001, allowedRoutes: {namespaces: {from: All}}}
    - {name: empty, protocol: TCP, port: 9002}
    - {name: split, protocol: TCP, port: 9003, allowedRoutes: {namespaces: {from: All}}}
"#,
    ));
    for (name, ts, section, backend) in [
        (
            "db",
            "2024-01-01T00:00:00Z",
            "tcp",
            "{name: db, port: 5432}",
        ),
        (
            "late",
            "2024-06-01T00:00:00Z",
            "tcp",
            "{name: db2, port: 5432}",
        ),
        (
            "nogrant",
            "2024-01-02T00:00:00Z",
            "nogrant",
            "{name: db2, namespace: other, port: 5432}",
        ),
        (
            "split",
            "2024-01-03T00:00:00Z",
            "split",
            "{name: db, port: 5432, weight: 1}, {name: db2, port: 5432, weight: 1}",
        ),
    ] {
        m.push_str(&format!("---\napiVersion: gateway.networking.k8s.io/v1alpha2\nkind: TCPRoute\nmetadata: {{name: {name}, namespace: team, creationTimestamp: \"{ts}\", generation: 1}}\nspec:\n  parentRefs: [{{name: tcp, namespace: default, sectionName: {section}}}]\n  rules: [{{backendRefs: [{backend}]}}]\n"));
    }
    let s = Scenario::start("gateway-tcproute", &m, &[]);
    // haproxy -c (its warnings are in the render output) does not ignore `option forwardfor`
    // in a mode tcp backend: they use the defaults without it.
    assert!(
        !s.render_output.contains("requires HTTP mode"),
        "{}",
        s.render_output
    );
    let ip = s.proxy.ports.ip.as_str();
    // The oldest TCPRoute on the listener carries the bytes, both ways, undecoded.
    assert_eq!(
        harness::tcp_exchange(ip, 9000, b"\x00raw\r\nbytes", 15),
        b"db:\x00raw\r\nbytes"
    );
    // A backendRef to another namespace without ReferenceGrant, and a listener without a
    // route: the connection is closed without reaching any backend.
    assert_eq!(harness::tcp_exchange(ip, 9001, b"hello", 9), b"");
    assert_eq!(harness::tcp_exchange(ip, 9002, b"hello", 9), b"");
    // Weights 1:1 choose a backend per connection: over 40 connections both carry bytes (each
    // connection's answer comes whole from one of them).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let got = harness::tcp_exchange(ip, 9003, b"x", 5);
        assert!(got == b"db:x" || got == b"db2:x", "{got:?}");
        seen.insert(got);
    }
    assert_eq!(seen.len(), 2, "both weighted backends carry connections");

    let api = "gateway.networking.k8s.io/v1alpha2";
    let st = status_in(&s.render_output, api, "TCPRoute", "team/db").expect("status");
    let c = &st["parents"][0]["conditions"];
    assert_eq!(condition(c, "Accepted"), pair("True", "Accepted"));
    assert_eq!(condition(c, "ResolvedRefs"), pair("True", "ResolvedRefs"));
    let st = status_in(&s.render_output, api, "TCPRoute", "team/late").expect("status");
    let c = &st["parents"][0]["conditions"];
    assert_eq!(
        condition(c, "Accepted"),
        pair("False", "NotAllowedByListeners")
    );
    assert!(
        c[0]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("team/db"),
        "{c}"
    );
    let st = status_in(&s.render_output, api, "TCPRoute", "team/nogrant").expect("status");
    assert_eq!(
        condition(&st["parents"][0]["conditions"], "ResolvedRefs"),
        pair("False", "RefNotPermitted")
    );
    let gw = status_of(&s.render_output, "Gateway", "default/tcp").expect("Gateway status");
    let l = listener(&gw, "tcp");
    assert_eq!(l["attachedRoutes"], 1, "{l}");
    assert_eq!(kinds_of(l), ["TCPRoute"]);
    assert_eq!(
        condition(&l["conditions"], "Programmed"),
        pair("True", "Programmed")
    );
}

#[test]
fn gateway_https_listeners_on_another_port_serve_their_own_certificates() {
    let dir = harness::TempDir::new("pki-gw-other-port");
    let pki = harness::Pki::new(dir.path());
    let (a, any, fixed) = (Echo::start("a"), Echo::start("any"), Echo::start("fixed"));
    let mut m = service_yaml("default", "a", &a);
    m.push_str(&service_yaml("default", "any", &any));
    m.push_str(&service_yaml("default", "fixed", &fixed));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("default", "a-cert", &["a.alt.test", "b.alt.test"]));
    m.push_str(&pki.secret_yaml("default", "any-cert", &["any.alt.test"]));
    m.push_str(&pki.secret_yaml("default", "fixed-cert", &["fixed.test"]));
    m.push_str(&gateway_yaml(
        "alt",
        r#"    - {name: a, protocol: HTTPS, port: 10443, hostname: a.alt.test, tls: {certificateRefs: [{name: a-cert}]}}
    - {name: any, protocol: HTTPS, port: 10443, tls: {certificateRefs: [{name: any-cert}]}}
    - {name: fixed, protocol: HTTPS, port: 443, hostname: fixed.test, tls: {certificateRefs: [{name: fixed-cert}]}}
"#,
    ));
    for name in ["a", "any", "fixed"] {
        m.push_str(&route(
            "default",
            name,
            "2024-01-01T00:00:00Z",
            &format!("  parentRefs: [{{name: alt, sectionName: {name}}}]\n  rules: [{{backendRefs: [{{name: {name}, port: 80}}]}}]\n"),
        ));
    }
    let s = Scenario::start("gateway-https-other-port", &m, &[]);
    let ip = s.proxy.ports.ip.clone();
    let ca = pki.ca.display().to_string();
    // curl verifies the certificate against the test CA for the name it asked for.
    let call = |port: u16, sni: &str, host: &str| {
        let resolve = format!("{sni}:{port}:{ip}");
        let header = format!("Host: {host}");
        let r = harness::get(
            &format!("https://{sni}:{port}/"),
            &["--resolve", &resolve, "--cacert", &ca, "-H", &header],
        );
        (r.status, r.backend().unwrap_or("").to_string())
    };
    // The listener's certificate on its port, and its routes.
    assert_eq!(call(10443, "a.alt.test", "a.alt.test"), pair_n(200, "a"));
    // The host-less listener of the port serves its certificate for names nobody claims, and
    // its routes answer them.
    assert_eq!(
        call(10443, "any.alt.test", "any.alt.test"),
        pair_n(200, "any")
    );
    // A name the a listener claims through its TLS connection, asked with another Host: 421.
    assert_eq!(call(10443, "a.alt.test", "any.alt.test"), pair_n(421, ""));
    // Certificates stay on their port: the fixed HTTPS frontend does not serve a.alt.test's
    // (verification fails), the port-10443 frontend does not serve fixed.test's, and the
    // fixed listener keeps working on the fixed frontend.
    assert_eq!(call(s.proxy.ports.https, "a.alt.test", "a.alt.test").0, 0);
    assert_eq!(call(10443, "fixed.test", "fixed.test").0, 0);
    assert_eq!(
        call(s.proxy.ports.https, "fixed.test", "fixed.test"),
        pair_n(200, "fixed")
    );
    let gw = status_of(&s.render_output, "Gateway", "default/alt").expect("Gateway status");
    for name in ["a", "any", "fixed"] {
        let l = listener(&gw, name);
        assert_eq!(
            condition(&l["conditions"], "Programmed"),
            pair("True", "Programmed"),
            "{l}"
        );
    }
}

#[test]
fn gateway_tls_listener_on_another_port_passes_raw_tls_through() {
    let dir = harness::TempDir::new("pki-gw-tls-other-port");
    let pki = harness::Pki::new(dir.path());
    let (cert, key) = pki.server_files("db", &["db.alt.test", "x.wild.alt.test"]);
    let (ip, port) = (harness::unique_loopback(), 9443);
    let _db = harness::TlsServer::start(&cert, &key, &ip, port);
    let mut m = harness::tls_service_yaml_in("team", "db", &ip, port);
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&gateway_yaml(
        "alt",
        r#"    - {name: pt, protocol: TLS, port: 10443, tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}
"#,
    ));
    m.push_str(&tls_route(
        "team",
        "db",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: alt, namespace: default, port: 10443}]\n  hostnames: [db.alt.test, \"*.wild.alt.test\"]\n  rules: [{backendRefs: [{name: db, port: 443}]}]\n",
    ));
    let s = Scenario::start("gateway-tls-other-port", &m, &[]);
    let proxy_ip = s.proxy.ports.ip.clone();
    let ca = pki.ca.display().to_string();
    let call = |port: u16, sni: &str| {
        let resolve = format!("{sni}:{port}:{proxy_ip}");
        let r = harness::get(
            &format!("https://{sni}:{port}/"),
            &["--resolve", &resolve, "--cacert", &ca],
        );
        r.status == 200 && r.body.contains("s_server")
    };
    // Exact and wildcard names reach the TLS backend undecrypted on the listener's port (the
    // client verifies the backend's own certificate).
    assert!(call(10443, "db.alt.test"));
    assert!(call(10443, "x.wild.alt.test"));
    // A name no route has is rejected on that port, and the route is not on 443.
    assert!(!call(10443, "other.alt.test"));
    assert!(!call(s.proxy.ports.https, "db.alt.test"));
    let gw = status_of(&s.render_output, "Gateway", "default/alt").expect("Gateway status");
    let l = listener(&gw, "pt");
    assert_eq!(
        condition(&l["conditions"], "Programmed"),
        pair("True", "Programmed")
    );
    assert_eq!(l["attachedRoutes"], 1, "{l}");
    assert_eq!(kinds_of(l), ["TLSRoute"]);
}

#[test]
fn tls_route_weights_split_connections_between_backends() {
    let dir = harness::TempDir::new("pki-gw-tls-weights");
    let pki = harness::Pki::new(dir.path());
    // Two TLS backends with certificates for the same name; the certificate's common name
    // tells which one a connection reached (TLS is passed through, not terminated).
    let (cert_a, key_a) = pki.server_files("a", &["a-backend.test", "w.test"]);
    let (cert_b, key_b) = pki.server_files("b", &["b-backend.test", "w.test"]);
    let (ip_a, ip_b) = (harness::unique_loopback(), harness::unique_loopback());
    let _a = harness::TlsServer::start(&cert_a, &key_a, &ip_a, 9443);
    let _b = harness::TlsServer::start(&cert_b, &key_b, &ip_b, 9443);
    let mut m = harness::tls_service_yaml_in("team", "a", &ip_a, 9443);
    m.push_str(&harness::tls_service_yaml_in("team", "b", &ip_b, 9443));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&gateway_yaml(
        "tls",
        "    - {name: pt, protocol: TLS, port: 443, tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}\n",
    ));
    for (name, host, refs) in [
        (
            "split",
            "w.test",
            "{name: a, port: 443, weight: 1}, {name: b, port: 443, weight: 1}",
        ),
        (
            "zero",
            "zero.test",
            "{name: a, port: 443, weight: 0}, {name: b, port: 443, weight: 1}",
        ),
        (
            "allzero",
            "allzero.test",
            "{name: a, port: 443, weight: 0}, {name: b, port: 443, weight: 0}",
        ),
    ] {
        m.push_str(&tls_route(
            "team",
            name,
            "2024-01-01T00:00:00Z",
            &format!("  parentRefs: [{{name: tls, namespace: default}}]\n  hostnames: [{host}]\n  rules: [{{backendRefs: [{refs}]}}]\n"),
        ));
    }
    let s = Scenario::start("gateway-tls-weights", &m, &[]);
    let p = &s.proxy;
    // 1:1: over 40 connections both backends answer (each connection reaches one of them).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..40 {
        let cn = harness::served_certificate(p, Some("w.test"));
        assert!(cn == "a-backend.test" || cn == "b-backend.test", "{cn}");
        seen.insert(cn);
    }
    assert_eq!(seen.len(), 2, "both weighted backends carry connections");
    // Weight 0 gets nothing.
    for _ in 0..10 {
        assert_eq!(
            harness::served_certificate(p, Some("zero.test")),
            "b-backend.test"
        );
    }
    // All weights 0: the connection is closed without a TLS session.
    let r = p.https("allzero.test", "/", &pki.ca, &["-k"]);
    assert_eq!(r.status, 0, "{r:?}");
    let st = status_of(&s.render_output, "TLSRoute", "team/split").expect("status");
    let c = &st["parents"][0]["conditions"];
    assert_eq!(condition(c, "Accepted"), pair("True", "Accepted"));
    assert_eq!(condition(c, "ResolvedRefs"), pair("True", "ResolvedRefs"));
}

/// A TLSRoute on `listener` of Gateway `mix` for `hosts`, to `backend` (port `bport`).
fn tls_route_to(name: &str, listener: &str, hosts: &str, backend: &str, bport: u16) -> String {
    tls_route(
        "team",
        name,
        "2024-01-01T00:00:00Z",
        &format!("  parentRefs: [{{name: mix, namespace: default, sectionName: {listener}}}]\n  hostnames: [{hosts}]\n  rules: [{{backendRefs: [{{name: {backend}, port: {bport}}}]}}]\n"),
    )
}

#[test]
fn tls_terminate_listeners_send_decrypted_bytes_to_tls_routes_and_share_ports_with_https() {
    let dir = harness::TempDir::new("pki-gw-tls-terminate");
    let pki = harness::Pki::new(dir.path());
    let (echo, echo2) = (
        harness::TcpEcho::start("echo"),
        harness::TcpEcho::start("echo2"),
    );
    let web = Echo::start("web");
    let (cert, key) = pki.server_files("db", &["x.pt.alt.test"]);
    let (ip, port) = (harness::unique_loopback(), 9443);
    let _db = harness::TlsServer::start(&cert, &key, &ip, port);
    let mut m = harness::tcp_service_yaml("team", "echo", 7000, echo.port);
    m.push_str(&harness::tcp_service_yaml(
        "team", "echo2", 7000, echo2.port,
    ));
    m.push_str(&harness::tls_service_yaml_in("team", "db", &ip, port));
    m.push_str(&service_yaml("team", "web", &web));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("default", "term-cert", &["term.test"]));
    m.push_str(&pki.secret_yaml("default", "web-cert", &["web.alt.test"]));
    m.push_str(&pki.secret_yaml("default", "t-cert", &["*.t.alt.test"]));
    m.push_str(&pki.secret_yaml("default", "only-cert", &["only.test"]));
    m.push_str(&pki.secret_yaml("certs", "granted-cert", &["granted.test"]));
    m.push_str(&pki.secret_yaml("certs2", "stolen-cert", &["stolen.test"]));
    m.push_str("---\napiVersion: gateway.networking.k8s.io/v1\nkind: ReferenceGrant\nmetadata: {name: gw, namespace: certs}\nspec:\n  from: [{group: gateway.networking.k8s.io, kind: Gateway, namespace: default}]\n  to: [{group: \"\", kind: Secret}]\n");
    m.push_str(&gateway_yaml(
        "mix",
        r#"    - {name: term443, protocol: TLS, port: 443, hostname: term.test, tls: {mode: Terminate, certificateRefs: [{name: term-cert}]}, allowedRoutes: {namespaces: {from: All}}}
    - {name: web, protocol: HTTPS, port: 10443, hostname: web.alt.test, tls: {certificateRefs: [{name: web-cert}]}, allowedRoutes: {namespaces: {from: All}}}
    - {name: pt, protocol: TLS, port: 10443, hostname: "*.pt.alt.test", tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}
    - {name: term, protocol: TLS, port: 10443, hostname: "*.t.alt.test", tls: {mode: Terminate, certificateRefs: [{name: t-cert}]}, allowedRoutes: {namespaces: {from: All}}}
    - {name: only, protocol: TLS, port: 10444, hostname: only.test, tls: {certificateRefs: [{name: only-cert}]}, allowedRoutes: {namespaces: {from: All}}}
    - {name: granted, protocol: TLS, port: 10444, hostname: granted.test, tls: {certificateRefs: [{name: granted-cert, namespace: certs}]}, allowedRoutes: {namespaces: {from: All}}}
    - {name: nogrant, protocol: TLS, port: 10444, hostname: stolen.test, tls: {certificateRefs: [{name: stolen-cert, namespace: certs2}]}, allowedRoutes: {namespaces: {from: All}}}
"#,
    ));
    m.push_str(&tls_route_to(
        "term443",
        "term443",
        "term.test",
        "echo",
        7000,
    ));
    m.push_str(&tls_route_to("term", "term", "db.t.alt.test", "echo", 7000));
    m.push_str(&tls_route_to("pt", "pt", "\"*.pt.alt.test\"", "db", 443));
    // A weighted route on a terminating listener: a 1:1 split of the decrypted connections.
    m.push_str(&tls_route(
        "team",
        "only",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: mix, namespace: default, sectionName: only}]\n  hostnames: [only.test]\n  rules: [{backendRefs: [{name: echo, port: 7000, weight: 1}, {name: echo2, port: 7000, weight: 1}]}]\n",
    ));
    m.push_str(&tls_route_to(
        "granted",
        "granted",
        "granted.test",
        "echo",
        7000,
    ));
    m.push_str(&tls_route_to(
        "nogrant",
        "nogrant",
        "stolen.test",
        "echo",
        7000,
    ));
    m.push_str(&route(
        "team",
        "web",
        "2024-01-01T00:00:00Z",
        "  parentRefs: [{name: mix, namespace: default, sectionName: web}]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n",
    ));
    let s = Scenario::start("gateway-tls-terminate", &m, &[]);
    // haproxy -c (its warnings are in the render output) does not ignore `option forwardfor`
    // in a mode tcp backend: they use the defaults without it.
    assert!(
        !s.render_output.contains("requires HTTP mode"),
        "{}",
        s.render_output
    );
    let p = &s.proxy;
    let ip = p.ports.ip.as_str();
    let ca = Some(pki.ca.as_path());
    let exchange = |port: u16, sni: &str, verify: bool| {
        harness::tls_exchange(ip, port, sni, verify.then_some(ca).flatten(), b"hello", 10)
    };
    let routed = |cn: &str| harness::TlsExchange {
        common_name: cn.to_string(),
        reply: b"echo:hello".to_vec(),
    };
    // 443: the listener's certificate (verified for the name), then the decrypted bytes, raw,
    // to the TCP backend; HTTPS keeps its frontend on 443 for other names.
    assert_eq!(
        exchange(p.ports.https, "term.test", true),
        Ok(routed("term.test"))
    );
    assert_eq!(
        harness::served_certificate(p, Some("unknown.test")),
        "default.invalid"
    );
    // 10443, shared by HTTPS, passthrough and terminated TLS: each name reaches its own kind.
    assert_eq!(
        exchange(10443, "db.t.alt.test", true),
        Ok(routed("*.t.alt.test"))
    );
    let resolve = |sni: &str| format!("{sni}:10443:{ip}");
    let https = |sni: &str, host: &str| {
        let r = harness::get(
            &format!("https://{sni}:10443/"),
            &[
                "--resolve",
                &resolve(sni),
                "--cacert",
                &pki.ca.display().to_string(),
                "-H",
                &format!("Host: {host}"),
            ],
        );
        (r.status, r.backend().unwrap_or("").to_string(), r.body)
    };
    let (status, backend, _) = https("web.alt.test", "web.alt.test");
    assert_eq!((status, backend.as_str()), (200, "web"));
    // The 421 check of the port's HTTPS listeners holds behind the shared port.
    assert_eq!(https("web.alt.test", "db.t.alt.test").0, 421);
    // Passthrough: the client verifies the backend's own certificate through HAProxy.
    let (status, _, body) = https("x.pt.alt.test", "x.pt.alt.test");
    assert_eq!((status, body.contains("s_server")), (200, true), "{body}");
    // A name under the terminated wildcard that no TLSRoute has is not routed to the echo.
    let other = exchange(10443, "none.t.alt.test", false).expect("handshake");
    assert!(!other.reply.starts_with(b"echo:"), "{other:?}");
    // 10444, terminated TLS only: the listener's own certificate per name (one granted from
    // another namespace); a name without route gets the TLS session but no backend.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..24 {
        let x = exchange(10444, "only.test", true).expect("handshake");
        assert_eq!(x.common_name, "only.test");
        assert!(
            x.reply == b"echo:hello" || x.reply == b"echo2:hello",
            "{x:?}"
        );
        seen.insert(x.reply);
    }
    assert_eq!(seen.len(), 2, "both weighted backends carry connections");
    assert_eq!(
        exchange(10444, "granted.test", true),
        Ok(routed("granted.test"))
    );
    let unknown = exchange(10444, "unknown.test", false).expect("handshake");
    assert_eq!(unknown.reply, b"", "{unknown:?}");
    // The certificate of another namespace without a ReferenceGrant is never served.
    let stolen = exchange(10444, "stolen.test", false).expect("handshake");
    assert_ne!(stolen.common_name, "stolen.test");
    assert_eq!(stolen.reply, b"", "{stolen:?}");

    // Statuses.
    let gw = status_of(&s.render_output, "Gateway", "default/mix").expect("Gateway status");
    for name in ["term443", "web", "pt", "term", "only", "granted"] {
        let l = listener(&gw, name);
        assert_eq!(
            condition(&l["conditions"], "Programmed"),
            pair("True", "Programmed"),
            "{l}"
        );
        assert_eq!(
            condition(&l["conditions"], "Conflicted"),
            pair("False", "NoConflicts"),
            "{l}"
        );
        assert_eq!(l["attachedRoutes"], 1, "{l}");
    }
    assert_eq!(kinds_of(listener(&gw, "term")), ["TLSRoute"]);
    let l = listener(&gw, "nogrant");
    assert_eq!(
        condition(&l["conditions"], "ResolvedRefs"),
        pair("False", "RefNotPermitted")
    );
    assert_eq!(condition(&l["conditions"], "Programmed").0, "False");
    let st = status_of(&s.render_output, "TLSRoute", "team/term").expect("status");
    assert_eq!(
        condition(&st["parents"][0]["conditions"], "Accepted"),
        pair("True", "Accepted")
    );
}

/// The value of the cookie `name` a response sets, if any.
fn set_cookie(r: &harness::Response, name: &str) -> Option<String> {
    r.headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("set-cookie"))
        .find_map(|(_, v)| {
            let first = v.split(';').next()?;
            let (k, v) = first.split_once('=')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
}

#[test]
fn gateway_session_persistence_keeps_a_client_on_its_endpoint() {
    let pods: Vec<Echo> = ["a1", "a2", "a3"].iter().map(|n| Echo::start(n)).collect();
    let other = Echo::start("b1");
    let ports: Vec<u16> = pods.iter().map(|e| e.port).collect();
    let mut m = service_yaml_ports("default", "app", &ports);
    m.push_str(&service_yaml("default", "other", &other));
    m.push_str(GATEWAYS);
    m.push_str(&route(
        "default",
        "sticky",
        "2024-01-01T00:00:00Z",
        r#"  parentRefs: [{name: gw, sectionName: http}]
  hostnames: [sticky.test]
  rules:
    - matches: [{path: {type: PathPrefix, value: /s}}]
      sessionPersistence: {sessionName: SID}
      backendRefs: [{name: app, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /permanent}}]
      sessionPersistence: {sessionName: PID, absoluteTimeout: 1h, idleTimeout: 30m, cookieConfig: {lifetimeType: Permanent}}
      backendRefs: [{name: app, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /w}}]
      sessionPersistence: {sessionName: WID}
      backendRefs: [{name: app, port: 80, weight: 1}, {name: other, port: 80, weight: 1}]
    - matches: [{path: {type: PathPrefix, value: /plain}}]
      backendRefs: [{name: app, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /h}}]
      sessionPersistence: {type: Header, sessionName: X-Session}
      backendRefs: [{name: app, port: 80}]
"#,
    ));
    let s = Scenario::start("gateway-session-persistence", &m, &[]);
    let p = &s.proxy;

    // Without the cookie, requests are balanced over the three endpoints, and each answer
    // sets a cookie naming a server slot, never an address.
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..12 {
        let r = p.http("sticky.test", "/s");
        assert_eq!(r.status, 200, "{r:?}");
        let cookie = set_cookie(&r, "SID").unwrap_or_else(|| panic!("no SID cookie: {r:?}"));
        assert!(
            cookie.starts_with("b0-SRV_") && !cookie.contains("127.0.0.1"),
            "{cookie}"
        );
        seen.insert(r.backend().unwrap_or_default().to_string(), cookie);
    }
    assert_eq!(seen.len(), 3, "balanced over every endpoint: {seen:?}");
    // With it, every request goes to the endpoint the cookie names.
    for (backend, cookie) in &seen {
        let header = format!("Cookie: SID={cookie}");
        for _ in 0..10 {
            let r = p.http_with("sticky.test", "/s/more", &["-H", &header]);
            assert_eq!(
                (r.status, r.backend()),
                (200, Some(backend.as_str())),
                "{r:?}"
            );
        }
    }
    // A cookie naming no server is balanced again and replaced.
    let r = p.http_with("sticky.test", "/s", &["-H", "Cookie: SID=b0-SRV_99"]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        set_cookie(&r, "SID").is_some_and(|c| c != "b0-SRV_99"),
        "{r:?}"
    );
    // A rule without sessionPersistence sets no cookie.
    let r = p.http("sticky.test", "/plain");
    assert_eq!((r.status, r.header("set-cookie")), (200, None), "{r:?}");

    // Permanent: the cookie carries Max-Age (absoluteTimeout).
    let r = p.http("sticky.test", "/permanent");
    let raw = r.header("set-cookie").unwrap_or_default().to_string();
    assert!(
        raw.starts_with("PID=b0-SRV_") && raw.contains("Max-Age=3600"),
        "{raw}"
    );
    // A session cookie (the default) has none.
    let r = p.http("sticky.test", "/s");
    assert!(
        !r.header("set-cookie")
            .unwrap_or_default()
            .contains("Max-Age"),
        "{r:?}"
    );

    // Weighted backendRefs (two Services): the cookie also picks the Service.
    let mut by_service = std::collections::BTreeMap::new();
    for _ in 0..40 {
        let r = p.http("sticky.test", "/w");
        assert_eq!(r.status, 200, "{r:?}");
        let cookie = set_cookie(&r, "WID").unwrap_or_else(|| panic!("no WID cookie: {r:?}"));
        let service = if r.backend() == Some("b1") {
            "other"
        } else {
            "app"
        };
        by_service.insert(
            service,
            (cookie, r.backend().unwrap_or_default().to_string()),
        );
    }
    assert_eq!(by_service.len(), 2, "both Services chosen: {by_service:?}");
    for (cookie, backend) in by_service.values() {
        let header = format!("Cookie: WID={cookie}");
        for _ in 0..10 {
            let r = p.http_with("sticky.test", "/w", &["-H", &header]);
            assert_eq!(
                (r.status, r.backend()),
                (200, Some(backend.as_str())),
                "{r:?}"
            );
        }
    }
    // Type Header: the answer names the endpoint's slot in the header; a request carrying it
    // stays there; without it requests are balanced.
    let mut by_header = std::collections::BTreeMap::new();
    for _ in 0..12 {
        let r = p.http("sticky.test", "/h");
        assert_eq!(r.status, 200, "{r:?}");
        let value = r.header("x-session").unwrap_or_default().to_string();
        assert!(value.starts_with("b0-SRV_"), "{r:?}");
        by_header.insert(r.backend().unwrap_or_default().to_string(), value);
    }
    assert_eq!(
        by_header.len(),
        3,
        "balanced over every endpoint: {by_header:?}"
    );
    for (backend, value) in &by_header {
        let header = format!("X-Session: {value}");
        for _ in 0..10 {
            let r = p.http_with("sticky.test", "/h", &["-H", &header]);
            assert_eq!(
                (r.status, r.backend()),
                (200, Some(backend.as_str())),
                "{r:?}"
            );
        }
    }
    // The route is accepted without notes.
    let st = status_of(&s.render_output, "HTTPRoute", "default/sticky").expect("status");
    assert_eq!(
        condition(&st["parents"][0]["conditions"], "Accepted"),
        pair("True", "Accepted")
    );
}

#[test]
fn gateway_request_mirror_copies_requests_without_changing_answers() {
    let web = Echo::start("web");
    let shadow = Echo::start("shadow");
    let mut m = service_yaml("default", "web", &web);
    m.push_str(&service_yaml("default", "shadow", &shadow));
    // A mirror whose only endpoint refuses connections (nothing listens on port 1).
    m.push_str(&service_yaml_port("default", "down", 1));
    m.push_str(GATEWAYS);
    m.push_str(&route(
        "default",
        "mirror",
        "2024-01-01T00:00:00Z",
        r#"  parentRefs: [{name: gw, sectionName: http}]
  hostnames: [mirror.test]
  rules:
    - matches: [{path: {type: PathPrefix, value: /m}}]
      filters: [{type: RequestMirror, requestMirror: {backendRef: {name: shadow, port: 80}}}]
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /zero}}]
      filters: [{type: RequestMirror, requestMirror: {backendRef: {name: shadow, port: 80}, percent: 0}}]
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /half}}]
      filters: [{type: RequestMirror, requestMirror: {backendRef: {name: shadow, port: 80}, fraction: {numerator: 1, denominator: 2}}}]
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /down}}]
      filters: [{type: RequestMirror, requestMirror: {backendRef: {name: down, port: 80}}}]
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /missing}}]
      filters: [{type: RequestMirror, requestMirror: {backendRef: {name: nope, port: 80}}}]
      backendRefs: [{name: web, port: 80}]
"#,
    ));
    let s = Scenario::start("gateway-request-mirror", &m, &[]);
    let p = &s.proxy;
    let shadow_got = |path: &str| -> Vec<String> {
        let line = format!("path={path}\n");
        shadow
            .received()
            .into_iter()
            .filter(|r| r.contains(&line))
            .collect()
    };
    let wait_mirrored = |path: &str| {
        wait_for(
            &format!("a mirrored copy of {path}"),
            std::time::Duration::from_secs(10),
            || !shadow_got(path).is_empty(),
        )
    };

    // The client's answer comes from the route's backend, unchanged; a copy (method, path and
    // query, headers) reaches the mirror. A client's own X-Haptic-Mirror header cannot send
    // the copy elsewhere.
    let r = p.http_with(
        "mirror.test",
        "/m?x=1",
        &[
            "-H",
            "X-Mirror-Test: yes",
            "-H",
            "X-Haptic-Mirror: gw_default_web_80",
        ],
    );
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    assert_eq!(r.echoed("path"), Some("/m?x=1"), "{r:?}");
    assert_eq!(r.echoed("header:x-mirror-test"), Some("yes"), "{r:?}");
    wait_mirrored("/m?x=1");
    let copy = &shadow_got("/m?x=1")[0];
    assert!(
        copy.contains("method=GET\n")
            && copy.contains("header:x-mirror-test=yes\n")
            && copy.contains("host=mirror.test\n")
            && !copy.contains("x-haptic-mirror"),
        "{copy}"
    );
    // A request body is copied too.
    let r = p.http_with("mirror.test", "/m/post", &["-d", "hello-mirror"]);
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    wait_mirrored("/m/post");
    let copy = &shadow_got("/m/post")[0];
    assert!(
        copy.contains("method=POST\n") && copy.contains("body=hello-mirror\n"),
        "{copy}"
    );
    // The web backend saw each request once: the client's X-Haptic-Mirror header (passed to
    // web as any header) did not send the copy there.
    let web_got = web.received();
    assert_eq!(web_got.len(), 2, "{web_got:?}");
    // A body over 8 KiB reaches the backend whole; a copy, if one is made (only when the whole
    // body had already arrived), is never truncated.
    let big = "b".repeat(10_000);
    let r = p.http_with("mirror.test", "/m/big", &["--data-binary", &big]);
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    assert!(web
        .received()
        .iter()
        .any(|w| w.contains(&format!("body={big}\n"))));

    // 0 percent mirrors nothing; a mirror that is down or missing changes nothing for the
    // client. (A later copy of /m arriving shows that earlier ones had their chance.)
    for path in ["/zero", "/down", "/missing"] {
        for _ in 0..5 {
            let r = p.http("mirror.test", path);
            assert_eq!((r.status, r.backend()), (200, Some("web")), "{path}: {r:?}");
            assert_eq!(r.echoed("path"), Some(path), "{r:?}");
        }
    }
    // fraction 1/2: some of 40 requests are mirrored, not all.
    for _ in 0..40 {
        let r = p.http("mirror.test", "/half");
        assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    }
    p.http("mirror.test", "/m/last");
    wait_mirrored("/m/last");
    assert!(shadow_got("/zero").is_empty());
    for copy in shadow_got("/m/big") {
        assert!(
            copy.contains(&format!("body={big}\n")),
            "truncated copy: {copy}"
        );
    }
    wait_mirrored("/half");
    let half = shadow_got("/half").len();
    assert!(half < 40, "mirrored {half} of 40");

    // The unresolvable mirror backendRef is reported; the route is accepted.
    let st = status_of(&s.render_output, "HTTPRoute", "default/mirror").expect("status");
    let conditions = &st["parents"][0]["conditions"];
    assert_eq!(condition(conditions, "Accepted"), pair("True", "Accepted"));
    assert_eq!(
        condition(conditions, "ResolvedRefs"),
        pair("False", "BackendNotFound")
    );
}

/// A preflight (OPTIONS with Origin and Access-Control-Request-Method, `extra` more headers).
fn preflight(
    p: &HAProxy,
    host: &str,
    path: &str,
    origin: &str,
    method: &str,
    extra: &[&str],
) -> Response {
    let origin = format!("Origin: {origin}");
    let method = format!("Access-Control-Request-Method: {method}");
    let mut args = vec![
        "-X",
        "OPTIONS",
        "-H",
        origin.as_str(),
        "-H",
        method.as_str(),
    ];
    for h in extra {
        args.extend(["-H", h]);
    }
    p.http_with(host, path, &args)
}

/// HTTPRoute CORS filters (the Gateway API's HTTPRouteCORS conformance routes): preflights are
/// answered by HAProxy with the allowed origin echoed (exact, `*.` with any labels to its left,
/// a default port written or not), methods, headers, exposed headers, max age and credentials;
/// an origin not allowed gets no CORS header; the other requests reach the backend and their
/// answers get the headers; `*` answers `*` without credentials and echoes the origin with them.
#[test]
fn gateway_cors_filters_answer_preflights_and_mark_allowed_answers() {
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    m.push_str(GATEWAYS);
    m.push_str(&route(
        "default",
        "cors",
        "2024-01-01T00:00:00Z",
        r#"  parentRefs: [{name: gw, sectionName: http}]
  hostnames: [cors.test]
  rules:
    - matches: [{path: {type: PathPrefix, value: /cors-1}}]
      filters:
        - type: CORS
          cors:
            allowOrigins: ["https://www.foo.com", "https://*.bar.com", "http://local.test:8080"]
            allowMethods: [GET, OPTIONS]
            allowHeaders: [x-header-1, x-header-2]
            exposeHeaders: [x-header-3, x-header-4]
            allowCredentials: true
            maxAge: 3600
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /cors-2}}]
      filters: [{type: CORS, cors: {allowOrigins: ["https://www.foo.com"], allowMethods: ["*"]}}]
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /any}}]
      filters: [{type: CORS, cors: {allowOrigins: ["*"], allowMethods: [PUT], allowCredentials: false}}]
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /wild-creds}}]
      filters: [{type: CORS, cors: {allowOrigins: ["*"], allowMethods: ["*"], allowHeaders: ["*"], allowCredentials: true}}]
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /wild}}]
      filters: [{type: CORS, cors: {allowOrigins: ["*"], allowMethods: ["*"], allowHeaders: ["*"], exposeHeaders: ["*"]}}]
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /none}}]
      filters: [{type: CORS, cors: {allowCredentials: true, allowMethods: [GET]}}]
      backendRefs: [{name: web, port: 80}]
    - matches: [{path: {type: PathPrefix, value: /plain}}]
      backendRefs: [{name: web, port: 80}]
"#,
    ));
    let s = Scenario::start("gateway-cors", &m, &[]);
    let p = &s.proxy;
    let h = |r: &Response, name: &str| r.header(name).map(str::to_string);
    let some = |v: &str| Some(v.to_string());
    let hdrs = ["Access-Control-Request-Headers: x-header-1, x-header-2"];
    for origin in [
        "https://www.foo.com",
        "https://www.bar.com",
        "https://xpto.www.bar.com",
        "HTTPS://WWW.FOO.COM",
        "https://www.foo.com:443",
        "http://local.test:8080",
    ] {
        let r = preflight(p, "cors.test", "/cors-1", origin, "GET", &hdrs);
        assert_eq!(r.status, 204, "{origin}: {r:?}");
        assert_eq!(r.backend(), None, "answered by HAProxy: {r:?}");
        assert_eq!(h(&r, "access-control-allow-origin"), some(origin), "{r:?}");
        assert_eq!(h(&r, "access-control-allow-methods"), some("GET, OPTIONS"));
        assert_eq!(
            h(&r, "access-control-allow-headers"),
            some("x-header-1, x-header-2")
        );
        assert_eq!(
            h(&r, "access-control-expose-headers"),
            some("x-header-3, x-header-4")
        );
        assert_eq!(h(&r, "access-control-max-age"), some("3600"));
        assert_eq!(h(&r, "access-control-allow-credentials"), some("true"));
        assert_eq!(h(&r, "vary"), some("Origin"));
        // The same origin on an ordinary request: the backend answers, with the headers.
        let o = format!("Origin: {origin}");
        let r = p.http_with("cors.test", "/cors-1", &["-H", o.as_str()]);
        assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
        assert_eq!(h(&r, "access-control-allow-origin"), some(origin), "{r:?}");
        assert_eq!(h(&r, "access-control-allow-credentials"), some("true"));
        assert_eq!(
            h(&r, "access-control-expose-headers"),
            some("x-header-3, x-header-4")
        );
    }
    // Origins not allowed: another host, `*.bar.com` itself, another scheme or port, a lookalike.
    for origin in [
        "https://foobar.com",
        "https://bar.com",
        "http://www.foo.com",
        "https://www.foo.com:8443",
        "https://www.foo.com.evil.test",
        "https://evil.test/https://www.foo.com",
        "http://local.test",
    ] {
        let r = preflight(p, "cors.test", "/cors-1", origin, "GET", &hdrs);
        assert!(matches!(r.status, 200 | 204 | 403), "{origin}: {r:?}");
        assert_eq!(r.backend(), None, "{r:?}");
        assert_eq!(
            h(&r, "access-control-allow-origin"),
            None,
            "{origin}: {r:?}"
        );
        let o = format!("Origin: {origin}");
        let r = p.http_with("cors.test", "/cors-1", &["-H", o.as_str()]);
        assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
        assert_eq!(
            h(&r, "access-control-allow-origin"),
            None,
            "{origin}: {r:?}"
        );
        assert_eq!(h(&r, "access-control-allow-credentials"), None, "{r:?}");
    }
    // Two Origin headers, one allowed: neither is echoed.
    let r = p.http_with(
        "cors.test",
        "/cors-1",
        &[
            "-H",
            "Origin: https://www.foo.com",
            "-H",
            "Origin: https://evil.test",
        ],
    );
    assert_eq!(h(&r, "access-control-allow-origin"), None, "{r:?}");
    assert_eq!(h(&r, "access-control-allow-credentials"), None, "{r:?}");
    // No origin listed allows none, credentials or not.
    let r = preflight(p, "cors.test", "/none", "https://www.foo.com", "GET", &[]);
    assert!(matches!(r.status, 200 | 204 | 403), "{r:?}");
    assert_eq!(h(&r, "access-control-allow-origin"), None, "{r:?}");
    let r = p.http_with("cors.test", "/none", &["-H", "Origin: https://www.foo.com"]);
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    assert_eq!(h(&r, "access-control-allow-origin"), None, "{r:?}");
    assert_eq!(h(&r, "access-control-allow-credentials"), None, "{r:?}");
    // allowMethods ["*"] without credentials; no Access-Control-Allow-Credentials.
    let r = preflight(
        p,
        "cors.test",
        "/cors-2",
        "https://www.foo.com",
        "POST",
        &[],
    );
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        some("https://www.foo.com")
    );
    assert!(
        matches!(
            h(&r, "access-control-allow-methods").as_deref(),
            Some("*" | "POST")
        ),
        "{r:?}"
    );
    assert_eq!(h(&r, "access-control-allow-credentials"), None);
    assert_eq!(h(&r, "access-control-max-age"), some("5"), "the default");
    // Any origin without credentials: `*`, also for an origin with a port.
    let r = preflight(p, "cors.test", "/any", "https://foobar.com", "PUT", &[]);
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(h(&r, "access-control-allow-origin"), some("*"));
    assert_eq!(h(&r, "access-control-allow-methods"), some("PUT"));
    assert_eq!(h(&r, "access-control-allow-credentials"), None);
    let r = p.http_with(
        "cors.test",
        "/any",
        &["-X", "PUT", "-H", "Origin: https://foobar.com:12345"],
    );
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    assert_eq!(h(&r, "access-control-allow-origin"), some("*"));
    // Wildcards with credentials: the request's origin, method and headers echoed, never `*`.
    let r = preflight(
        p,
        "cors.test",
        "/wild-creds",
        "https://other.foo.com",
        "PUT",
        &hdrs,
    );
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        some("https://other.foo.com")
    );
    assert_eq!(h(&r, "access-control-allow-methods"), some("PUT"));
    assert_eq!(
        h(&r, "access-control-allow-headers"),
        some("x-header-1, x-header-2")
    );
    assert_eq!(h(&r, "access-control-allow-credentials"), some("true"));
    let r = preflight(
        p,
        "cors.test",
        "/wild-creds",
        "https://other.foo.com",
        "PUT",
        &[],
    );
    assert_eq!(
        h(&r, "access-control-allow-headers"),
        None,
        "none asked for: {r:?}"
    );
    let r = p.http_with(
        "cors.test",
        "/wild-creds",
        &["-H", "Origin: https://other.foo.com"],
    );
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    assert_eq!(
        h(&r, "access-control-allow-origin"),
        some("https://other.foo.com")
    );
    assert_eq!(h(&r, "access-control-allow-credentials"), some("true"));
    // Wildcards without credentials.
    let r = preflight(
        p,
        "cors.test",
        "/wild",
        "https://other.foo.com",
        "PUT",
        &hdrs,
    );
    assert_eq!(h(&r, "access-control-allow-origin"), some("*"), "{r:?}");
    assert_eq!(h(&r, "access-control-allow-methods"), some("*"));
    assert_eq!(h(&r, "access-control-allow-headers"), some("*"));
    assert_eq!(h(&r, "access-control-expose-headers"), some("*"));
    assert_eq!(h(&r, "access-control-allow-credentials"), None);
    // Requests without Origin, and routes without the filter, are untouched; OPTIONS without
    // Origin reaches the backend.
    let r = p.http("cors.test", "/cors-1");
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    assert_eq!(h(&r, "access-control-allow-origin"), None);
    let r = p.http_with(
        "cors.test",
        "/cors-1",
        &["-X", "OPTIONS", "-H", "Access-Control-Request-Method: GET"],
    );
    assert_eq!(r.backend(), Some("web"), "{r:?}");
    let r = preflight(p, "cors.test", "/plain", "https://www.foo.com", "GET", &[]);
    assert_eq!(r.backend(), Some("web"), "{r:?}");
    assert_eq!(h(&r, "access-control-allow-origin"), None);
    // The route is accepted, with nothing to report.
    let st = status_of(&s.render_output, "HTTPRoute", "default/cors").expect("status");
    assert_eq!(
        condition(&st["parents"][0]["conditions"], "Accepted"),
        pair("True", "Accepted")
    );
}
