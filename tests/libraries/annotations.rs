//! haproxy-ingress.github.io annotations under real traffic (CORS preflight, HSTS, app-root,
//! redirect-to, rate limiting, path-type) and TLS passthrough to a TLS backend.

use super::harness::{self, service_yaml, unique_loopback, Echo, Ports, Scenario};

fn ingress(name: &str, host: &str, annotations: &str, paths: &str) -> String {
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: default\n  annotations:\n{annotations}spec:\n  ingressClassName: haproxy\n  tls: [{{hosts: [{host}], secretName: tls-{name}}}]\n  rules:\n    - host: {host}\n      http: {{paths: [{paths}]}}\n"
    )
}

fn to_web(path: &str, kind: &str) -> String {
    format!("{{path: \"{path}\", pathType: {kind}, backend: {{service: {{name: web, port: {{name: http}}}}}}}}")
}

#[test]
fn haproxy_ingress_cors_hsts_app_root_redirect_rate_limit_path_type() {
    let dir = harness::TempDir::new("pki-hi");
    let pki = harness::Pki::new(dir.path());
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    for (name, host) in [
        ("cors", "cors.test"),
        ("limited", "limited.test"),
        ("re", "re.test"),
        ("moved", "moved.test"),
    ] {
        m.push_str(&pki.secret_yaml("default", &format!("tls-{name}"), &[host]));
    }
    m.push_str(&ingress(
        "cors",
        "cors.test",
        concat!(
            "    haproxy-ingress.github.io/cors-enable: \"true\"\n",
            "    haproxy-ingress.github.io/cors-allow-origin: \"https://app.test\"\n",
            "    haproxy-ingress.github.io/cors-allow-methods: \"GET, POST\"\n",
            "    haproxy-ingress.github.io/cors-max-age: \"600\"\n",
            "    haproxy-ingress.github.io/hsts: \"true\"\n",
            "    haproxy-ingress.github.io/hsts-preload: \"true\"\n",
            "    haproxy-ingress.github.io/app-root: /app\n",
        ),
        &to_web("/", "Prefix"),
    ));
    m.push_str(&ingress(
        "limited",
        "limited.test",
        "    haproxy-ingress.github.io/limit-rps: \"2\"\n",
        &to_web("/", "Prefix"),
    ));
    m.push_str(&ingress(
        "re",
        "re.test",
        "    haproxy-ingress.github.io/path-type: regex\n",
        &to_web("/items/[0-9]+$", "ImplementationSpecific"),
    ));
    m.push_str(&ingress(
        "moved",
        "moved.test",
        "    haproxy-ingress.github.io/redirect-to: \"https://new.test/landing\"\n    haproxy-ingress.github.io/redirect-to-code: \"301\"\n",
        &to_web("/", "Prefix"),
    ));
    let s = Scenario::start("haproxy-ingress", &m, &[]);
    let p = &s.proxy;

    // CORS preflight is answered by HAProxy (the backend never sees it).
    let pre = [
        "-X",
        "OPTIONS",
        "-H",
        "Origin: https://app.test",
        "-H",
        "Access-Control-Request-Method: POST",
    ];
    let r = p.http_with("cors.test", "/api", &pre);
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(r.backend(), None, "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.test")
    );
    assert_eq!(r.header("access-control-allow-methods"), Some("GET, POST"));
    assert_eq!(r.header("access-control-max-age"), Some("600"));
    // A simple request from the allowed origin gets the header; another origin does not.
    let r = p.http_with("cors.test", "/api", &["-H", "Origin: https://app.test"]);
    assert_eq!(r.backend(), Some("web"));
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.test")
    );
    let r = p.http_with("cors.test", "/api", &["-H", "Origin: https://evil.test"]);
    assert_eq!(r.header("access-control-allow-origin"), None, "{r:?}");
    // An OPTIONS request from another origin is no preflight of ours: it reaches the backend.
    let r = p.http_with(
        "cors.test",
        "/api",
        &[
            "-X",
            "OPTIONS",
            "-H",
            "Origin: https://evil.test",
            "-H",
            "Access-Control-Request-Method: POST",
        ],
    );
    assert_eq!(r.backend(), Some("web"), "{r:?}");

    // HSTS on HTTPS responses only.
    let r = p.https("cors.test", "/x", &pki.ca, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.header("strict-transport-security"),
        Some("max-age=15768000; preload")
    );
    assert_eq!(
        p.http("cors.test", "/x")
            .header("strict-transport-security"),
        None
    );
    assert_eq!(
        p.https("limited.test", "/", &pki.ca, &[])
            .header("strict-transport-security"),
        None
    );

    // app-root redirects / only.
    let r = p.http("cors.test", "/");
    assert_eq!(
        (r.status, r.header("location")),
        (302, Some("/app")),
        "{r:?}"
    );
    assert_eq!(p.http("cors.test", "/app").backend(), Some("web"));

    // redirect-to.
    let r = p.http("moved.test", "/anything");
    assert_eq!(
        (r.status, r.header("location")),
        (301, Some("https://new.test/landing"))
    );

    // path-type regex.
    assert_eq!(p.http("re.test", "/items/42").backend(), Some("web"));
    assert_eq!(p.http("re.test", "/items/42/x").status, 404);
    assert_eq!(p.http("re.test", "/items/x").status, 404);

    // Rate limiting: more than 2 requests a second from one address get 429.
    let statuses: Vec<u16> = (0..10)
        .map(|_| p.http("limited.test", "/").status)
        .collect();
    assert_eq!(statuses[0], 200, "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "{statuses:?}"
    );
}

#[test]
fn ssl_passthrough_reaches_the_tls_backend_undecrypted() {
    let dir = harness::TempDir::new("pki-pt");
    let pki = harness::Pki::new(dir.path());
    let (cert, key) = pki.server_files("backend", &["pt.test"]);
    let (ip, port) = (unique_loopback(), 9443);
    let _backend = harness::TlsServer::start(&cert, &key, &ip, port);
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    // The passthrough Service points at the TLS server.
    m.push_str(&harness::tls_service_yaml_in("default", "tls", &ip, port));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("default", "tls-app", &["app.test"]));
    m.push_str(concat!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\n",
        "metadata: {name: pt, namespace: default, annotations: {haproxy.org/ssl-passthrough: \"true\"}}\n",
        "spec: {ingressClassName: haproxy, rules: [{host: pt.test, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: tls, port: {number: 443}}}}]}}]}\n",
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\n",
        "metadata: {name: app, namespace: default}\n",
        "spec: {ingressClassName: haproxy, tls: [{hosts: [app.test], secretName: tls-app}], rules: [{host: app.test, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}}]}\n",
    ));
    let s = Scenario::start("passthrough", &m, &[]);
    let p = &s.proxy;
    // The backend's own certificate (for pt.test, from the test CA) verifies, and the answer
    // is openssl's status page: TLS went through HAProxy undecrypted.
    let r = p.https("pt.test", "/", &pki.ca, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("s_server"), "{r:?}");
    assert_eq!(r.backend(), None);
    // Other names still terminate in HAProxy (through the loopback) and route normally.
    let r = p.https("app.test", "/x", &pki.ca, &[]);
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
}

#[test]
fn haproxytech_cors_request_redirect_and_src_ip_header() {
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    let ing = |name: &str, annotations: &str| {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default, annotations: {{{annotations}}}}}\nspec: {{ingressClassName: haproxy, rules: [{{host: {name}.test, http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{name: http}}}}}}}}]}}}}]}}\n"
        )
    };
    m.push_str(&ing(
        "cors",
        "haproxy.org/cors-enable: \"true\", haproxy.org/cors-allow-origin: \"https://app.test\", haproxy.org/cors-allow-methods: \"GET, PUT\", haproxy.org/cors-max-age: 2m",
    ));
    m.push_str(&ing(
        "moved",
        "haproxy.org/request-redirect: \"new.test:8443\", haproxy.org/request-redirect-code: \"308\"",
    ));
    m.push_str(&ing(
        "inner",
        "haproxy.org/src-ip-header: X-Real-IP, haproxy.org/allow-list: \"10.0.0.0/8\"",
    ));
    let s = Scenario::start("haproxytech-cors", &m, &[]);
    let p = &s.proxy;

    // The preflight from the allowed origin is answered by HAProxy.
    let preflight = |origin: &str| {
        p.http_with(
            "cors.test",
            "/api",
            &[
                "-X",
                "OPTIONS",
                "-H",
                &format!("Origin: {origin}"),
                "-H",
                "Access-Control-Request-Method: PUT",
            ],
        )
    };
    let r = preflight("https://app.test");
    assert_eq!(r.status, 204, "{r:?}");
    assert_eq!(r.backend(), None, "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.test")
    );
    assert_eq!(r.header("access-control-allow-methods"), Some("GET, PUT"));
    assert_eq!(r.header("access-control-max-age"), Some("120"));
    // Another origin's OPTIONS is not ours to answer, and gets no CORS headers.
    let r = preflight("https://evil.test");
    assert_eq!(r.backend(), Some("web"), "{r:?}");
    assert_eq!(r.header("access-control-allow-origin"), None, "{r:?}");
    // A simple request from the allowed origin carries the header.
    let r = p.http_with("cors.test", "/x", &["-H", "Origin: https://app.test"]);
    assert_eq!(r.backend(), Some("web"), "{r:?}");
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some("https://app.test")
    );

    // request-redirect keeps the path and query, with the request's scheme.
    let r = p.http("moved.test", "/a/b?c=1");
    assert_eq!(r.status, 308, "{r:?}");
    assert_eq!(
        r.header("location"),
        Some("http://new.test:8443/a/b?c=1"),
        "{r:?}"
    );

    // src-ip-header: the allow-list judges the address the header names.
    assert_eq!(p.http("inner.test", "/").status, 403);
    let r = p.http_with("inner.test", "/", &["-H", "X-Real-IP: 10.1.2.3"]);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.backend(), Some("web"));
    let r = p.http_with("inner.test", "/", &["-H", "X-Real-IP: 192.0.2.1"]);
    assert_eq!(r.status, 403, "{r:?}");
    // Other Ingresses are untouched: the header means nothing for them.
    assert_eq!(
        p.http_with("cors.test", "/", &["-H", "X-Real-IP: 10.1.2.3"])
            .status,
        200
    );
}

#[test]
fn haproxytech_rate_limit_denies_past_the_limit_per_source() {
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    for (name, annotations) in [
        ("limited", "haproxy.org/rate-limit-requests: \"3\", haproxy.org/rate-limit-period: 1m, haproxy.org/rate-limit-status-code: \"429\""),
        ("open", "haproxy.org/timeout-server: 30s"),
        ("keyed", "haproxy.org/rate-limit-requests: \"2\", haproxy.org/rate-limit-period: 1m, haproxy.org/rate-limit-status-code: \"429\", haproxy.org/src-ip-header: X-Real-IP"),
    ] {
        m.push_str(&format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default, annotations: {{{annotations}}}}}\nspec: {{ingressClassName: haproxy, rules: [{{host: {name}.test, http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{name: http}}}}}}}}]}}}}]}}\n"
        ));
    }
    let s = Scenario::start("haproxytech-rate-limit", &m, &[]);
    let p = &s.proxy;
    // Three requests a minute pass; the fourth is refused with the configured status.
    let statuses: Vec<u16> = (0..5).map(|_| p.http("limited.test", "/").status).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    // Another Ingress's traffic is not counted or limited.
    let statuses: Vec<u16> = (0..5).map(|_| p.http("open.test", "/").status).collect();
    assert_eq!(statuses, [200; 5]);

    // What counts as one source (the address src-ip-header names): an IPv4 address; an IPv6
    // /64, which one host can fill with addresses; but behind NAT64 (64:ff9b::/96) each
    // address is an IPv4 client of its own, which a /64 key would limit all together.
    let from = |ip: &str| {
        p.http_with("keyed.test", "/", &["-H", &format!("X-Real-IP: {ip}")])
            .status
    };
    let sources = |ips: &[&str]| ips.iter().map(|ip| from(ip)).collect::<Vec<u16>>();
    assert_eq!(
        sources(&["192.0.2.1", "192.0.2.1", "192.0.2.1"]),
        [200, 200, 429]
    );
    assert_eq!(sources(&["192.0.2.2"]), [200]);
    assert_eq!(
        sources(&["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2::ffff"]),
        [200, 200, 429],
        "addresses of one /64 share a count"
    );
    assert_eq!(sources(&["2001:db8:1:3::1"]), [200], "another /64");
    assert_eq!(
        sources(&[
            "64:ff9b::c633:6401",
            "64:ff9b::c633:6401",
            "64:ff9b::c633:6401"
        ]),
        [200, 200, 429],
        "one NAT64 client (198.51.100.1)"
    );
    assert_eq!(
        sources(&["64:ff9b::c633:6402", "64:ff9b::c633:6403"]),
        [200, 200],
        "other IPv4 clients behind the same NAT64 are not limited by the first"
    );
}

#[test]
fn haproxytech_server_ca_and_server_crt_verify_tls_backends() {
    let dir = harness::TempDir::new("pki-server-ca");
    let pki = harness::Pki::new(dir.path());
    let other_dir = harness::TempDir::new("pki-server-ca-other");
    let other = harness::Pki::new(other_dir.path());
    let (cert, key) = pki.server_files("backend", &["backend.internal"]);
    let ip = unique_loopback();
    let (open_port, mtls_port) = (9443, 9444);
    let _open = harness::TlsServer::start(&cert, &key, &ip, open_port);
    // This one asks for a client certificate from the test CA.
    let ca_path = pki.ca.display().to_string();
    let _mtls = harness::TlsServer::start_with(
        &cert,
        &key,
        &ip,
        mtls_port,
        &["-Verify", "1", "-CAfile", &ca_path],
    );
    let ca_secret = |name: &str, ca: &std::path::Path| {
        let pem = std::fs::read(ca).expect("CA file");
        format!(
            "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: default}}\ndata: {{ca.crt: {}}}\n",
            harness::base64(&pem)
        )
    };
    let mut m = harness::tls_service_yaml_in("default", "open", &ip, open_port);
    m.push_str(&harness::tls_service_yaml_in(
        "default", "mtls", &ip, mtls_port,
    ));
    m.push_str(&ca_secret("ca-good", &pki.ca));
    m.push_str(&ca_secret("ca-other", &other.ca));
    m.push_str(&pki.secret_yaml("default", "client", &["client.internal"]));
    let ing = |name: &str, svc: &str, annotations: &str| {
        format!("---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default, annotations: {{{annotations}}}}}\nspec: {{ingressClassName: haproxy, rules: [{{host: {name}.test, http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: {svc}, port: {{number: 443}}}}}}}}]}}}}]}}\n")
    };
    m.push_str(&ing("good", "open", "haproxy.org/server-ca: ca-good"));
    m.push_str(&ing(
        "wrongca",
        "open",
        "haproxy.org/server-ca: default/ca-other",
    ));
    m.push_str(&ing("noverify", "open", "haproxy.org/server-ssl: \"true\""));
    m.push_str(&ing(
        "client",
        "mtls",
        "haproxy.org/server-ca: ca-good, haproxy.org/server-crt: client",
    ));
    m.push_str(&ing("noclient", "mtls", "haproxy.org/server-ca: ca-good"));
    m.push_str(&ing(
        "foreign",
        "open",
        "haproxy.org/server-ca: other/ca-good",
    ));
    m.push_str(&ing("missing", "open", "haproxy.org/server-ca: nope"));
    let s = Scenario::start("server-ca", &m, &[]);
    let p = &s.proxy;
    let get = |host: &str| {
        let r = p.http(host, "/");
        (r.status, r.body.contains("s_server"))
    };
    // A failed TLS session to the backend: 503, or 502 when the backend refuses the missing
    // client certificate after a TLS 1.3 handshake HAProxy already took as done.
    let refused = |host: &str| {
        let (status, answered) = get(host);
        assert!(matches!(status, 502 | 503) && !answered, "{host}: {status}");
    };
    // The backend's certificate verifies against the Secret's CA: the answer is openssl's page.
    assert_eq!(get("good.test"), (200, true));
    // Another CA: the handshake fails, HAProxy has no server to send to.
    refused("wrongca.test");
    // server-ssl alone does not verify.
    assert_eq!(get("noverify.test"), (200, true));
    // A backend that asks for a client certificate gets server-crt's, and refuses without one.
    assert_eq!(get("client.test"), (200, true));
    refused("noclient.test");
    // Another namespace's Secret, or a missing one, leaves the Ingress out (never unverified).
    assert_ne!(get("foreign.test").0, 200);
    assert_ne!(get("missing.test").0, 200);
    let out = &s.render_output;
    assert!(
        out.contains("Ingress default/foreign")
            && out.contains("server-ca: the Secret must be in the Ingress's own namespace default"),
        "{out}"
    );
    assert!(
        out.contains("Ingress default/missing")
            && out.contains("Secret default/nope is missing or has no ca.crt"),
        "{out}"
    );
}

#[test]
fn haproxytech_access_lists_apply_to_tls_passthrough() {
    let dir = harness::TempDir::new("pki-pt-acl");
    let pki = harness::Pki::new(dir.path());
    let hosts = ["allowed.test", "outside.test", "denied.test"];
    let (cert, key) = pki.server_files("backend", &hosts);
    let (ip, port) = (unique_loopback(), 9443);
    let _backend = harness::TlsServer::start(&cert, &key, &ip, port);
    let mut m = harness::tls_service_yaml_in("default", "tls", &ip, port);
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    // Clients here connect from 127.0.0.0/8.
    for (name, list) in [
        ("allowed", "haproxy.org/deny-list: 10.0.0.0/8"),
        ("outside", "haproxy.org/allow-list: 10.0.0.0/8"),
        ("denied", "haproxy.org/blacklist: 127.0.0.0/8"),
    ] {
        m.push_str(&format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default, annotations: {{haproxy.org/ssl-passthrough: \"true\", {list}}}}}\nspec: {{ingressClassName: haproxy, rules: [{{host: {name}.test, http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: tls, port: {{number: 443}}}}}}}}]}}}}]}}\n"
        ));
    }
    let s = Scenario::start("passthrough-acl", &m, &[]);
    let p = &s.proxy;
    // Allowed: the backend's own page, undecrypted through HAProxy.
    let r = p.https("allowed.test", "/", &pki.ca, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("s_server"), "{r:?}");
    // Outside the allow-list, or in the deny-list: the connection is closed before any byte
    // reaches the backend (no HTTP status at all).
    for host in ["outside.test", "denied.test"] {
        let r = p.https(host, "/", &pki.ca, &[]);
        assert_eq!(r.status, 0, "{host}: {r:?}");
    }
}

#[test]
fn haproxytech_tls_ingress_redirects_http_to_https_by_default() {
    let dir = harness::TempDir::new("pki-tls-redirect");
    let pki = harness::Pki::new(dir.path());
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("default", "tls-secure", &["secure.test"]));
    m.push_str(&pki.secret_yaml("default", "tls-optout", &["optout.test"]));
    let ing = |name: &str, annotations: &str, tls: &str| {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default, annotations: {{{annotations}}}}}\nspec: {{ingressClassName: haproxy, {tls}rules: [{{host: {name}.test, http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{name: http}}}}}}}}]}}}}]}}\n"
        )
    };
    m.push_str(&ing(
        "secure",
        "",
        "tls: [{hosts: [secure.test], secretName: tls-secure}], ",
    ));
    m.push_str(&ing(
        "optout",
        "haproxy.org/ssl-redirect: \"false\"",
        "tls: [{hosts: [optout.test], secretName: tls-optout}], ",
    ));
    m.push_str(&ing("plain", "", ""));
    let s = Scenario::start("haproxytech-tls-redirect", &m, &[]);
    let p = &s.proxy;
    // TLS without any annotation: HTTP answers 302 to the same URL on https; HTTPS serves.
    let r = p.http("secure.test", "/a/b?c=d");
    assert_eq!(r.status, 302, "{r:?}");
    assert_eq!(r.header("location"), Some("https://secure.test/a/b?c=d"));
    assert_eq!(r.backend(), None, "{r:?}");
    let r = p.https("secure.test", "/a", &pki.ca, &[]);
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    // ssl-redirect "false" keeps HTTP serving; an Ingress without TLS is not redirected.
    let r = p.http("optout.test", "/");
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    let r = p.http("plain.test", "/");
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
}

#[test]
fn haproxytech_forwarded_for_false_stops_x_forwarded_for_for_its_ingress() {
    let dir = harness::TempDir::new("pki-xff");
    let pki = harness::Pki::new(dir.path());
    let web = Echo::start("web");
    let mut m = service_yaml("default", "web", &web);
    // A default certificate, so the HTTPS frontend exists too.
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["on.test", "off.test"]));
    for (name, annotations) in [("on", ""), ("off", "haproxy.org/forwarded-for: \"false\"")] {
        m.push_str(&format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default, annotations: {{{annotations}}}}}\nspec: {{ingressClassName: haproxy, rules: [{{host: {name}.test, http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web, port: {{name: http}}}}}}}}]}}}}]}}\n"
        ));
    }
    // Clients of both address families: over IPv4 (curl connects from 127.0.0.0/8) and, where
    // the machine has one, over the IPv6 loopback (HAProxy 2.6's `except` takes one family).
    let mut families = vec![(Ports::pick(), "127.")];
    match Ports::ipv6_loopback() {
        Some(ports) => families.push((ports, "::1")),
        None => eprintln!("no IPv6 loopback here: IPv4 clients only"),
    }
    for (ports, client) in families {
        let s = Scenario::start_on("haproxytech-forwarded-for", &m, &[], ports);
        let p = &s.proxy;
        // By default the backend learns the client's address.
        let r = p.http("on.test", "/");
        assert_eq!(r.backend(), Some("web"), "{r:?}");
        let xff = r.echoed("header:x-forwarded-for").unwrap_or_default();
        assert!(xff.starts_with(client), "{client}: {r:?}");
        // forwarded-for "false": no header is added, and a client's own one passes unchanged.
        let r = p.http("off.test", "/");
        assert_eq!(r.backend(), Some("web"), "{client}: {r:?}");
        assert_eq!(r.echoed("header:x-forwarded-for"), None, "{client}: {r:?}");
        let r = p.http_with("off.test", "/", &["-H", "X-Forwarded-For: 192.0.2.7"]);
        let xff: Vec<&str> = r
            .body
            .lines()
            .filter_map(|l| l.strip_prefix("header:x-forwarded-for="))
            .collect();
        assert_eq!(xff, ["192.0.2.7"], "{client}: {r:?}");
        // Over HTTPS alike.
        let r = p.https("off.test", "/", &pki.ca, &[]);
        assert_eq!(r.backend(), Some("web"), "{client}: {r:?}");
        assert_eq!(r.echoed("header:x-forwarded-for"), None, "{client}: {r:?}");
        let r = p.https("on.test", "/", &pki.ca, &[]);
        let xff = r.echoed("header:x-forwarded-for").unwrap_or_default();
        assert!(xff.starts_with(client), "{client}: {r:?}");
        // The other Ingress's backend still appends the client's address to one it sends.
        let r = p.http_with("on.test", "/", &["-H", "X-Forwarded-For: 192.0.2.7"]);
        let xff: Vec<&str> = r
            .body
            .lines()
            .filter_map(|l| l.strip_prefix("header:x-forwarded-for="))
            .collect();
        assert!(
            xff.len() == 2 && xff[0] == "192.0.2.7" && xff[1].starts_with(client),
            "{client}: {r:?}"
        );
    }
}

#[test]
fn haproxy_ingress_ssl_passthrough_reaches_the_tls_backend_undecrypted() {
    let dir = harness::TempDir::new("pki-hi-pt");
    let pki = harness::Pki::new(dir.path());
    let (cert, key) = pki.server_files("backend", &["hipt.test", "outside.test", "hport.test"]);
    let (ip, port) = (unique_loopback(), 9443);
    let _backend = harness::TlsServer::start(&cert, &key, &ip, port);
    let web = Echo::start("web");
    let plain = Echo::start("dual-http");
    let mut m = service_yaml("default", "web", &web);
    m.push_str(&harness::tls_service_yaml_in("default", "tls", &ip, port));
    // A Service speaking TLS on 443 and plain HTTP on 80, for ssl-passthrough-http-port.
    m.push_str(&format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: dual, namespace: default}}\nspec: {{ports: [{{name: https, port: 443}}, {{name: http, port: 80}}]}}\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: dual-tls, namespace: default, labels: {{kubernetes.io/service-name: dual}}}}\nports: [{{name: https, port: {port}}}]\nendpoints: [{{addresses: [\"{ip}\"]}}]\n\
         ---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: dual-http, namespace: default, labels: {{kubernetes.io/service-name: dual}}}}\nports: [{{name: http, port: {}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n",
        plain.port
    ));
    // Another namespace's Service, for a newer Ingress that claims the same host.
    m.push_str(&service_yaml("evil", "tls", &web));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("default", "tls-app", &["app.test"]));
    let ing = |ns: &str, name: &str, host: &str, ts: &str, annotations: &str| {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{ts}\", annotations: {{{annotations}}}}}\nspec: {{ingressClassName: haproxy, rules: [{{host: {host}, http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: tls, port: {{number: 443}}}}}}}}]}}}}]}}\n"
        )
    };
    let pt = "haproxy-ingress.github.io/ssl-passthrough: \"true\"";
    m.push_str(&ing(
        "default",
        "hipt",
        "hipt.test",
        "2024-01-01T00:00:00Z",
        pt,
    ));
    // Clients here connect from 127.0.0.0/8, outside this range.
    m.push_str(&ing(
        "default",
        "outside",
        "outside.test",
        "2024-01-01T00:00:01Z",
        &format!("{pt}, haproxy-ingress.github.io/allowlist-source-range: \"10.0.0.0/8\""),
    ));
    m.push_str(&ing(
        "evil",
        "thief",
        "hipt.test",
        "2024-06-01T00:00:00Z",
        pt,
    ));
    m.push_str(
        &ing(
            "default",
            "hport",
            "hport.test",
            "2024-01-01T00:00:02Z",
            &format!("{pt}, haproxy-ingress.github.io/ssl-passthrough-http-port: \"80\""),
        )
        .replace("name: tls,", "name: dual,"),
    );
    m.push_str(concat!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\n",
        "metadata: {name: app, namespace: default}\n",
        "spec: {ingressClassName: haproxy, tls: [{hosts: [app.test], secretName: tls-app}], rules: [{host: app.test, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}}]}\n",
    ));
    let s = Scenario::start("haproxy-ingress-passthrough", &m, &[]);
    let p = &s.proxy;
    // The backend's own certificate verifies and openssl's status page answers: TLS went
    // through HAProxy undecrypted, to the Service of the namespace owning the host.
    let r = p.https("hipt.test", "/", &pki.ca, &[]);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r.body.contains("s_server"), "{r:?}");
    assert_eq!(r.backend(), None, "{r:?}");
    // Outside the source range: closed before any byte reaches the backend.
    let r = p.https("outside.test", "/", &pki.ca, &[]);
    assert_eq!(r.status, 0, "{r:?}");
    // The other namespace's claim on the host is refused, named.
    assert!(
        s.render_output
            .lines()
            .any(|l| l.contains("Ingress evil/thief") && l.contains("belongs to namespace default")),
        "{}",
        s.render_output
    );
    // Other names still terminate in HAProxy (through the loopback) and route normally.
    let r = p.https("app.test", "/x", &pki.ca, &[]);
    assert_eq!((r.status, r.backend()), (200, Some("web")), "{r:?}");
    // ssl-passthrough-http-port: TLS to the host still reaches the Service's TLS port
    // undecrypted, and plain HTTP to it goes to the Service's HTTP port.
    let r = p.https("hport.test", "/", &pki.ca, &[]);
    assert!(r.status == 200 && r.body.contains("s_server"), "{r:?}");
    let r = p.http("hport.test", "/some/path?q=1");
    assert_eq!((r.status, r.backend()), (200, Some("dual-http")), "{r:?}");
    assert_eq!(r.echoed("path"), Some("/some/path?q=1"), "{r:?}");
}

/// A Service `web2` with two EndpointSlices, one per echo backend (both on 127.0.0.1).
fn two_backend_service_yaml(a: &Echo, b: &Echo) -> String {
    let mut m = String::from("---\napiVersion: v1\nkind: Service\nmetadata: {name: web2, namespace: default}\nspec: {ports: [{name: http, port: 80}]}\n");
    for (i, e) in [a, b].iter().enumerate() {
        m.push_str(&format!(
            "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: web2-{i}, namespace: default, labels: {{kubernetes.io/service-name: web2}}}}\nports: [{{name: http, port: {}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n",
            e.port
        ));
    }
    m
}

#[test]
fn static_cookies_pin_a_client_to_a_server_slot_in_both_libraries() {
    let (a, b) = (Echo::start("a"), Echo::start("b"));
    let mut m = two_backend_service_yaml(&a, &b);
    for (name, annotations) in [
        ("tech", "haproxy.org/cookie-persistence-no-dynamic: SRVID"),
        (
            "hi",
            "haproxy-ingress.github.io/affinity: cookie, haproxy-ingress.github.io/session-cookie-name: SID, haproxy-ingress.github.io/session-cookie-dynamic: \"false\"",
        ),
    ] {
        m.push_str(&format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: default, annotations: {{{annotations}}}}}\nspec: {{ingressClassName: haproxy, rules: [{{host: {name}.test, http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: web2, port: {{name: http}}}}}}}}]}}}}]}}\n"
        ));
    }
    let s = Scenario::start("static-cookies", &m, &[]);
    let p = &s.proxy;
    for (host, cookie) in [("tech.test", "SRVID"), ("hi.test", "SID")] {
        // Without a cookie, the answer sets one naming the server's slot.
        let r = p.http(host, "/");
        let set = r.header("set-cookie").unwrap_or_default().to_string();
        let value = set
            .strip_prefix(&format!("{cookie}="))
            .and_then(|v| v.split(';').next())
            .unwrap_or_default()
            .to_string();
        assert!(value == "SRV_1" || value == "SRV_2", "{host}: {r:?}");
        let first = r.backend().unwrap_or_default().to_string();
        // With it, every request goes to the same server; the other slot's cookie to the other.
        for _ in 0..4 {
            let r = p.http_with(host, "/", &["-b", &format!("{cookie}={value}")]);
            assert_eq!(r.backend(), Some(first.as_str()), "{host}: {r:?}");
        }
        let other = if value == "SRV_1" { "SRV_2" } else { "SRV_1" };
        let r = p.http_with(host, "/", &["-b", &format!("{cookie}={other}")]);
        assert!(
            r.backend().is_some() && r.backend() != Some(first.as_str()),
            "{host}: {r:?}"
        );
    }
}

#[test]
fn haproxytech_route_acl_sends_matching_requests_to_its_service_within_its_namespace() {
    let (web, canary, web2, canary2) = (
        Echo::start("web"),
        Echo::start("canary"),
        Echo::start("web2"),
        Echo::start("canary2"),
    );
    let acl = "metadata: {name: canary, namespace: NS, annotations: {haproxy.org/route-acl: \"cookie(staging) -m found\"}}";
    let annotated = |ns: &str, echo: &Echo| {
        service_yaml(ns, "canary", echo).replacen(
            &format!("metadata: {{name: canary, namespace: {ns}}}"),
            &acl.replace("NS", ns),
            1,
        )
    };
    let mut m = service_yaml("default", "web", &web);
    m.push_str(&annotated("default", &canary));
    m.push_str(&service_yaml("tenant2", "web", &web2));
    m.push_str(&annotated("tenant2", &canary2));
    let path = |svc: &str| {
        format!("{{path: /, pathType: Prefix, backend: {{service: {{name: {svc}, port: {{name: http}}}}}}}}")
    };
    for (ns, host) in [("default", "app.test"), ("tenant2", "t2.test")] {
        m.push_str(&format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: app, namespace: {ns}}}\nspec: {{ingressClassName: haproxy, rules: [{{host: {host}, http: {{paths: [{}, {}]}}}}]}}\n",
            path("web"),
            path("canary")
        ));
    }
    let s = Scenario::start("haproxytech-route-acl", &m, &[]);
    let p = &s.proxy;
    // Without the cookie the first path's Service answers; with it, the route-acl Service.
    assert_eq!(p.http("app.test", "/x").backend(), Some("web"));
    let r = p.http_with("app.test", "/x", &["-b", "staging=1"]);
    assert_eq!(r.backend(), Some("canary"), "{r:?}");
    // Each namespace's condition re-routes its own traffic only.
    assert_eq!(p.http("t2.test", "/").backend(), Some("web2"));
    let r = p.http_with("t2.test", "/", &["-b", "staging=1"]);
    assert_eq!(r.backend(), Some("canary2"), "{r:?}");
    // An unknown host with the cookie is nobody's traffic: still 404.
    let r = p.http_with("nobody.test", "/", &["-b", "staging=1"]);
    assert_eq!(r.status, 404, "{r:?}");
}
