//! Attacks on a victim tenant under real traffic: hostile Ingresses in other namespaces are
//! rendered together with the victim's through all six libraries, HAProxy runs the result,
//! and requests to the victim's host must see no effect of any of them.

use super::harness::{service_yaml, Echo, Scenario};

fn ingress(
    ns: &str,
    name: &str,
    host: &str,
    annotations: &[(&str, &str)],
    path: &str,
    path_type: &str,
    ts: &str,
) -> String {
    let annotations: String = annotations
        .iter()
        .map(|(k, v)| {
            format!(
                "    {k}: {}\n",
                serde_json::to_string(v).expect("json string")
            )
        })
        .collect();
    format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: {ns}\n  creationTimestamp: \"{ts}\"\n  annotations:\n{annotations}    x: y\n\
         spec:\n  ingressClassName: haproxy\n  rules:\n    - host: {host}\n      http: {{paths: [{{path: {path:?}, pathType: {path_type}, backend: {{service: {{name: web, port: {{name: http}}}}}}}}]}}\n"
    )
}

/// (namespace suffix, annotations, host, path, pathType)
type Attack<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str, &'a str, &'a str);

#[test]
fn hostile_tenants_cannot_touch_a_victims_traffic() {
    let victim = Echo::start("victim");
    let evil = Echo::start("evil");
    let old = "2024-01-01T00:00:00Z";
    let new = "2024-06-01T00:00:00Z";
    let mut m = service_yaml("victim", "web", &victim);
    m.push_str(&ingress(
        "victim",
        "site",
        "victim.test",
        &[],
        "/",
        "Prefix",
        old,
    ));
    let attacks: [Attack; 16] = [
        // A header name whose tab and '#' would comment out the rule's scoping condition.
        (
            "hdr",
            &[("haproxy.org/response-set-header", "Set-Cookie\tpwned=1\t#")],
            "hdr.test",
            "/",
            "Prefix",
        ),
        (
            "reqhdr",
            &[("haproxy.org/request-set-header", "X-Evil\t1\t#")],
            "reqhdr.test",
            "/",
            "Prefix",
        ),
        // A new line adding a rule of its own to the shared frontend.
        (
            "sethost",
            &[(
                "haproxy.org/set-host",
                "x\n  http-request return status 503",
            )],
            "sethost.test",
            "/",
            "Prefix",
        ),
        // Another namespace's users.
        (
            "auth",
            &[
                ("haproxy.org/auth-type", "basic-auth"),
                ("haproxy.org/auth-secret", "victim/users"),
            ],
            "auth.test",
            "/",
            "Prefix",
        ),
        // A regular expression whose alternation would match every host.
        (
            "regex",
            &[("haproxy-ingress.github.io/path-type", "regex")],
            "regex.test",
            "/x|.*",
            "ImplementationSpecific",
        ),
        // Paths added to the victim's host from another namespace.
        ("thief", &[], "victim.test", "/admin", "Prefix"),
        // A deny list that is no list, and a huge server pool.
        (
            "deny",
            &[("haproxy.org/denylist", "0.0.0.0/0 }")],
            "deny.test",
            "/",
            "Prefix",
        ),
        (
            "slots",
            &[("haproxy.org/scale-server-slots", "100000000")],
            "slots.test",
            "/",
            "Prefix",
        ),
        // A redirect switch that would add an unscoped rule of its own.
        (
            "sslredir",
            &[(
                "haproxy.org/ssl-redirect",
                "true\n  http-request redirect location https://evil.test code 302",
            )],
            "sslredir.test",
            "/",
            "Prefix",
        ),
        (
            "xff",
            &[("haproxy.org/forwarded-for", "false }\n  option httpclose #")],
            "xff.test",
            "/",
            "Prefix",
        ),
        // A frontend-wide timeout (every tenant's connections), with a line of its own.
        (
            "tclient",
            &[(
                "haproxy.org/timeout-client",
                "1ms\n  timeout http-request 1ms",
            )],
            "tclient.test",
            "/",
            "Prefix",
        ),
        // TLS passthrough of the victim's host from another namespace, and a switch that is no
        // switch.
        (
            "ptsteal",
            &[("haproxy-ingress.github.io/ssl-passthrough", "true")],
            "victim.test",
            "/",
            "Prefix",
        ),
        (
            "ptval",
            &[(
                "haproxy-ingress.github.io/ssl-passthrough",
                "true\n  use_backend ing_victim_site_web_http",
            )],
            "ptval.test",
            "/",
            "Prefix",
        ),
        // An HTTP port for the passthrough that would end the re-routing rule's condition and
        // take every request.
        (
            "ptport",
            &[
                ("haproxy-ingress.github.io/ssl-passthrough", "true"),
                (
                    "haproxy-ingress.github.io/ssl-passthrough-http-port",
                    "80 } || { always_true",
                ),
            ],
            "ptport.test",
            "/",
            "Prefix",
        ),
        // Cookie names that would end the cookie directive and add words or lines.
        (
            "scookie",
            &[(
                "haproxy.org/cookie-persistence-no-dynamic",
                "SRV insert\n  use_backend ing_victim_site_web_http",
            )],
            "scookie.test",
            "/",
            "Prefix",
        ),
        (
            "hidyn",
            &[
                ("haproxy-ingress.github.io/affinity", "cookie"),
                (
                    "haproxy-ingress.github.io/session-cookie-dynamic",
                    "false }",
                ),
            ],
            "hidyn.test",
            "/",
            "Prefix",
        ),
    ];
    for (ns, annotations, host, path, path_type) in attacks {
        let ns = format!("atk-{ns}");
        m.push_str(&service_yaml(&ns, "web", &evil));
        m.push_str(&ingress(&ns, "x", host, annotations, path, path_type, new));
    }
    // route-acl lives on a Service: a hostile condition, and a valid one true for every request
    // (each tenant's own Service and host).
    for (ns, host, acl) in [
        (
            "atk-racl",
            "racl.test",
            "cookie(x) -m found } || { always_true",
        ),
        ("atk-rogue", "rogue.test", "hdr(host) -m found"),
    ] {
        m.push_str(&service_yaml(ns, "web", &evil).replacen(
            &format!("metadata: {{name: web, namespace: {ns}}}"),
            &format!(
                "metadata: {{name: web, namespace: {ns}, annotations: {{haproxy.org/route-acl: {}}}}}",
                serde_json::to_string(acl).expect("json string")
            ),
            1,
        ));
        m.push_str(&ingress(ns, "x", host, &[], "/", "Prefix", new));
    }
    let s = Scenario::start("hostile", &m, &[]);
    let p = &s.proxy;

    for path in ["/", "/admin", "/x", "/anything/else"] {
        let r = p.http("victim.test", path);
        assert_eq!(
            (r.status, r.backend()),
            (200, Some("victim")),
            "victim.test{path}: {r:?}"
        );
        assert!(r.header("set-cookie").is_none(), "victim.test{path}: {r:?}");
        assert!(!r.body.contains("x-evil"), "victim.test{path}: {r:?}");
    }
    // The regex is confined to its own host: there `.*` matches everything (its own traffic),
    // and nowhere else (the victim's requests above went to the victim).
    assert_eq!(p.http("regex.test", "/x").backend(), Some("evil"));
    assert_eq!(p.http("regex.test", "/y").backend(), Some("evil"));
    assert_eq!(p.http("unknown.test", "/x").status, 404);
    // A condition true for every request re-routes only its own tenant's traffic.
    assert_eq!(p.http("rogue.test", "/").backend(), Some("evil"));
    // Every other attacker is left out whole, named with its field.
    for host in [
        "hdr.test",
        "reqhdr.test",
        "sethost.test",
        "auth.test",
        "deny.test",
        "slots.test",
        "sslredir.test",
        "xff.test",
        "tclient.test",
        "ptval.test",
        "ptport.test",
        "scookie.test",
        "hidyn.test",
        "racl.test",
    ] {
        assert_eq!(p.http(host, "/").status, 404, "{host} must be left out");
    }
    for (ns, field) in [
        ("hdr", "haproxy.org/response-set-header"),
        ("reqhdr", "haproxy.org/request-set-header"),
        ("sethost", "haproxy.org/set-host"),
        ("auth", "haproxy.org/auth-secret"),
        ("deny", "haproxy.org/denylist"),
        ("slots", "haproxy.org/scale-server-slots"),
        ("sslredir", "haproxy.org/ssl-redirect"),
        ("xff", "haproxy.org/forwarded-for"),
        ("tclient", "haproxy.org/timeout-client"),
        ("ptsteal", "belongs to namespace victim"),
        ("ptval", "haproxy-ingress.github.io/ssl-passthrough"),
        (
            "ptport",
            "haproxy-ingress.github.io/ssl-passthrough-http-port",
        ),
        ("scookie", "haproxy.org/cookie-persistence-no-dynamic"),
        ("hidyn", "haproxy-ingress.github.io/session-cookie-dynamic"),
        ("racl", "haproxy.org/route-acl"),
        ("thief", "belongs to namespace victim"),
    ] {
        let line = format!("Ingress atk-{ns}/x: left out of the configuration");
        let found = s
            .render_output
            .lines()
            .any(|l| l.contains(&line) && l.contains(field));
        assert!(
            found,
            "no refusal of atk-{ns} naming {field}:\n{}",
            s.render_output
        );
    }
}

/// A newer Ingress of another namespace passing a wildcard through (either annotation library)
/// would take, undecrypted, every name under it that no passthrough entry has: the names older
/// Ingresses of other namespaces serve with their own certificates too (host ownership lets
/// `*.victim.test` coexist with an older `a.victim.test`; exact wins for HTTP, not for SNI).
/// The attackers' TLS backend holds a certificate for the wildcards from the same CA, so a
/// takeover would verify. The victim's names must keep its own certificate and backend.
#[test]
fn passthrough_wildcards_cannot_take_a_victims_tls_name() {
    let dir = super::harness::TempDir::new("pki-hostile-pt");
    let pki = super::harness::Pki::new(dir.path());
    let (cert, key) = pki.server_files("evil-backend", &["*.victim.test", "*.victim2.test"]);
    let (ip, port) = (super::harness::unique_loopback(), 9443);
    let _evil_tls = super::harness::TlsServer::start(&cert, &key, &ip, port);
    let victim = Echo::start("victim");
    let mut m = service_yaml("victim", "web", &victim);
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("victim", "site-tls", &["a.victim.test", "a.victim2.test"]));
    let rule = |host: &str, svc: &str, port: &str| {
        format!("{{host: \"{host}\", http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: {svc}, port: {port}}}}}}}]}}}}")
    };
    m.push_str(&format!(
        "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: site, namespace: victim, creationTimestamp: \"2024-01-01T00:00:00Z\"}}\n\
         spec: {{ingressClassName: haproxy, tls: [{{hosts: [a.victim.test, a.victim2.test], secretName: site-tls}}], rules: [{}, {}]}}\n",
        rule("a.victim.test", "web", "{name: http}"),
        rule("a.victim2.test", "web", "{name: http}")
    ));
    for (ns, annotation, host) in [
        (
            "atk-hi",
            "haproxy-ingress.github.io/ssl-passthrough",
            "*.victim.test",
        ),
        ("atk-ht", "haproxy.org/ssl-passthrough", "*.victim2.test"),
    ] {
        m.push_str(&super::harness::tls_service_yaml_in(ns, "tls", &ip, port));
        m.push_str(&format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: x, namespace: {ns}, creationTimestamp: \"2024-06-01T00:00:00Z\", annotations: {{{annotation}: \"true\"}}}}\n\
             spec: {{ingressClassName: haproxy, rules: [{}]}}\n",
            rule(host, "tls", "{number: 443}")
        ));
    }
    let s = Scenario::start("hostile-passthrough-wildcard", &m, &[]);
    for host in ["a.victim.test", "a.victim2.test"] {
        let r = s.proxy.https(host, "/", &pki.ca, &[]);
        assert_eq!(
            (r.status, r.backend()),
            (200, Some("victim")),
            "{host}: {r:?}"
        );
        assert!(!r.body.contains("s_server"), "{host}: {r:?}");
    }
    for ns in ["atk-hi", "atk-ht"] {
        assert!(
            s.render_output.lines().any(|l| l
                .contains(&format!("Ingress {ns}/x: left out of the configuration"))
                && l.contains("a wildcard host cannot be passed through")),
            "no refusal of {ns}/x:\n{}",
            s.render_output
        );
    }
}

const GATEWAY_CLASS: &str = "---\napiVersion: gateway.networking.k8s.io/v1\nkind: GatewayClass\nmetadata: {name: haproxy}\nspec: {controllerName: haproxy-haptic.org/controller}\n";

/// Host ownership across kinds is decided by age: a newer Ingress of another namespace (no
/// annotation at all) naming the host of an older TLSRoute is left out, and the name passes
/// through to the TLSRoute's backend (bf03990 let any Ingress take it: the TLSRoute was left
/// out and HTTPS to the name was terminated and routed to the attacker).
#[test]
fn a_newer_ingress_cannot_take_an_older_tlsroutes_name() {
    let dir = super::harness::TempDir::new("pki-review-tlsroute");
    let pki = super::harness::Pki::new(dir.path());
    let (cert, key) = pki.server_files("victim-db", &["tls.victim.test"]);
    let (ip, port) = (super::harness::unique_loopback(), 9443);
    let _db = super::harness::TlsServer::start(&cert, &key, &ip, port);
    let evil = Echo::start("evil");
    let mut m = super::harness::tls_service_yaml_in("victim", "db", &ip, port);
    m.push_str(&service_yaml("evil", "web", &evil));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(GATEWAY_CLASS);
    m.push_str("---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: tls, namespace: default}\nspec:\n  gatewayClassName: haproxy\n  listeners:\n    - {name: pt, protocol: TLS, port: 443, tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}\n");
    m.push_str("---\napiVersion: gateway.networking.k8s.io/v1\nkind: TLSRoute\nmetadata: {name: db, namespace: victim, creationTimestamp: \"2024-01-01T00:00:00Z\", generation: 1}\nspec:\n  parentRefs: [{name: tls, namespace: default, sectionName: pt}]\n  hostnames: [tls.victim.test]\n  rules: [{backendRefs: [{name: db, port: 443}]}]\n");
    m.push_str(&ingress(
        "evil",
        "x",
        "tls.victim.test",
        &[],
        "/",
        "Prefix",
        "2024-06-01T00:00:00Z",
    ));
    let s = Scenario::start("hostile-tlsroute-vs-ingress", &m, &[]);
    let r = s.proxy.https("tls.victim.test", "/", &pki.ca, &[]);
    assert!(
        r.status == 200 && r.body.contains("s_server"),
        "the older TLSRoute's name must pass through to its backend: {r:?}\n{}",
        s.render_output
    );
    assert_ne!(s.proxy.http("tls.victim.test", "/").backend(), Some("evil"));
}

/// A host-less HTTPS listener serves its first certificate only (the default one, behind a
/// placeholder SNI filter). Its second certificate, naming victim.test (self-made: any name
/// its tenant likes), was written as a crt-list line without an SNI filter (6beba4c), so
/// HAProxy registered every name in it, and the line of namespace `a-evil` sorted before the
/// victim Ingress's certificate and answered victim.test.
#[test]
fn a_hostless_listeners_other_certificates_cannot_take_a_victims_sni() {
    let dir = super::harness::TempDir::new("pki-review-hostless");
    let pki = super::harness::Pki::new(dir.path());
    let victim = Echo::start("victim");
    let mut m = service_yaml("victim", "web", &victim);
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(&pki.secret_yaml("victim", "site-tls", &["victim.test"]));
    m.push_str(&pki.secret_yaml("a-evil", "first", &["evil-first.invalid"]));
    m.push_str(&pki.secret_yaml("a-evil", "second", &["evil-second.invalid", "victim.test"]));
    m.push_str(GATEWAY_CLASS);
    m.push_str("---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: g, namespace: a-evil, creationTimestamp: \"2025-01-01T00:00:00Z\"}\nspec:\n  gatewayClassName: haproxy\n  listeners:\n    - {name: any, protocol: HTTPS, port: 443, tls: {certificateRefs: [{name: first}, {name: second}]}}\n");
    m.push_str("---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: site, namespace: victim, creationTimestamp: \"2024-01-01T00:00:00Z\"}\nspec: {ingressClassName: haproxy, tls: [{hosts: [victim.test], secretName: site-tls}], rules: [{host: victim.test, http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {name: http}}}}]}}]}\n");
    let s = Scenario::start("hostile-hostless-second-cert", &m, &[]);
    let crt_list =
        std::fs::read_to_string(s.out.path().join("general/crt-list.txt")).unwrap_or_default();
    assert_eq!(
        super::harness::served_certificate(&s.proxy, Some("victim.test")),
        "victim.test",
        "crt-list.txt:\n{crt_list}"
    );
    assert!(!crt_list.contains("a-evil_second"), "{crt_list}");
    assert!(
        s.render_output
            .contains("only its first certificate is served"),
        "the listener's Accepted message says so:\n{}",
        s.render_output
    );
}

/// Host ownership across kinds, HTTPRoute against Ingress: a newer Ingress of another
/// namespace naming an older HTTPRoute's host is left out. Before, Ingress host ownership knew
/// only Ingresses and the Ingress maps route before the Gateway rules, so the Ingress took the
/// name's HTTP (and, on a shared HTTPS listener, HTTPS) traffic; with an ssl-passthrough
/// annotation it took the raw TLS too.
#[test]
fn a_newer_ingress_cannot_take_an_older_httproutes_name() {
    let victim = Echo::start("victim");
    let evil = Echo::start("evil");
    let mut m = service_yaml("victim", "web", &victim);
    m.push_str(&service_yaml("evil", "web", &evil));
    m.push_str(GATEWAY_CLASS);
    m.push_str("---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: default}\nspec:\n  gatewayClassName: haproxy\n  listeners:\n    - {name: http, protocol: HTTP, port: 80, allowedRoutes: {namespaces: {from: All}}}\n");
    m.push_str("---\napiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {name: app, namespace: victim, creationTimestamp: \"2024-01-01T00:00:00Z\", generation: 1}\nspec:\n  parentRefs: [{name: gw, namespace: default, sectionName: http}]\n  hostnames: [gw.victim.test]\n  rules: [{backendRefs: [{name: web, port: 80}]}]\n");
    m.push_str(&ingress(
        "evil",
        "x",
        "gw.victim.test",
        &[],
        "/",
        "Prefix",
        "2024-06-01T00:00:00Z",
    ));
    let s = Scenario::start("hostile-httproute-vs-ingress", &m, &[]);
    let r = s.proxy.http("gw.victim.test", "/");
    assert_eq!(
        (r.status, r.backend()),
        (200, Some("victim")),
        "{r:?}\n{}",
        s.render_output
    );
    assert!(
        s.render_output.contains(
            "host gw.victim.test belongs to namespace victim (HTTPRoute victim/app claimed it first)"
        ),
        "{}",
        s.render_output
    );
}

/// A TLSRoute wildcard matches names of any depth, but a newer TLSRoute of another namespace
/// was checked against the owner's wildcard one label up only: its exact a.b.victim.test (the
/// exact map wins over a wildcard) and its narrower *.c.victim.test (the longest wildcard wins)
/// took connections from the victim's older *.victim.test.
#[test]
fn a_newer_tlsroute_cannot_take_names_deep_under_an_older_tlsroutes_wildcard() {
    let dir = super::harness::TempDir::new("pki-review-tls-wildcard");
    let pki = super::harness::Pki::new(dir.path());
    let (victim_cert, victim_key) = pki.server_files(
        "victim-db",
        &["victim-backend.test", "a.b.victim.test", "x.c.victim.test"],
    );
    let (evil_cert, evil_key) = pki.server_files(
        "evil-db",
        &["evil-backend.test", "a.b.victim.test", "x.c.victim.test"],
    );
    let (victim_ip, evil_ip) = (
        super::harness::unique_loopback(),
        super::harness::unique_loopback(),
    );
    let _victim = super::harness::TlsServer::start(&victim_cert, &victim_key, &victim_ip, 9443);
    let _evil = super::harness::TlsServer::start(&evil_cert, &evil_key, &evil_ip, 9443);
    let mut m = super::harness::tls_service_yaml_in("victim", "db", &victim_ip, 9443);
    m.push_str(&super::harness::tls_service_yaml_in(
        "evil", "db", &evil_ip, 9443,
    ));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(GATEWAY_CLASS);
    m.push_str("---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: tls, namespace: default}\nspec:\n  gatewayClassName: haproxy\n  listeners:\n    - {name: pt, protocol: TLS, port: 443, tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}\n");
    for (ns, name, ts, host) in [
        ("victim", "db", "2024-01-01T00:00:00Z", "\"*.victim.test\""),
        ("evil", "deep", "2024-06-01T00:00:00Z", "a.b.victim.test"),
        (
            "evil",
            "narrow",
            "2024-06-02T00:00:00Z",
            "\"*.c.victim.test\"",
        ),
    ] {
        m.push_str(&format!("---\napiVersion: gateway.networking.k8s.io/v1\nkind: TLSRoute\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{ts}\", generation: 1}}\nspec:\n  parentRefs: [{{name: tls, namespace: default, sectionName: pt}}]\n  hostnames: [{host}]\n  rules: [{{backendRefs: [{{name: db, port: 443}}]}}]\n"));
    }
    let s = Scenario::start("hostile-tlsroute-deep-wildcard", &m, &[]);
    // The backend's own certificate tells which TLS server the connection reached.
    for sni in ["a.b.victim.test", "x.c.victim.test"] {
        assert_eq!(
            super::harness::served_certificate(&s.proxy, Some(sni)),
            "victim-backend.test",
            "{sni}\n{}",
            s.render_output
        );
    }
    assert!(
        s.render_output.contains("TLSRoute evil/deep")
            && s.render_output.contains("TLSRoute evil/narrow"),
        "{}",
        s.render_output
    );
}

/// Host ownership across kinds, in its TLS passthrough form, in both orders: between a
/// Gateway route and an Ingress with ssl-passthrough (haproxytech's or haproxy-ingress's) of
/// different namespaces, the older claim keeps the name's raw TLS. Which backend answers is
/// told by the certificate a real TLS client gets through HAProxy: the victim's backend and the
/// attacker's both hold one valid for the name, with different common names.
#[test]
fn ssl_passthrough_ownership_goes_to_the_older_claim_in_both_orders() {
    use super::harness::{served_certificate, tls_service_yaml_in, unique_loopback};
    let dir = super::harness::TempDir::new("pki-passthrough-ownership");
    let pki = super::harness::Pki::new(dir.path());
    let hosts = [
        "route-first.test",
        "ingress-first.test",
        "httproute-first.test",
    ];
    let mut victim_names = vec!["victim-backend.invalid"];
    victim_names.extend(hosts);
    let mut evil_names = vec!["evil-backend.invalid"];
    evil_names.extend(hosts);
    let (cert, key) = pki.server_files("victim-db", &victim_names);
    let (victim_ip, port) = (unique_loopback(), 9443);
    let _victim = super::harness::TlsServer::start(&cert, &key, &victim_ip, port);
    let (cert, key) = pki.server_files("evil-db", &evil_names);
    let evil_ip = unique_loopback();
    let _evil = super::harness::TlsServer::start(&cert, &key, &evil_ip, port);
    let web = Echo::start("victim-web");
    let mut m = tls_service_yaml_in("victim", "db", &victim_ip, port);
    m.push_str(&tls_service_yaml_in("evil", "db", &evil_ip, port));
    m.push_str(&service_yaml("victim", "web", &web));
    m.push_str(&pki.secret_yaml("default", "default-ssl-cert", &["default.invalid"]));
    m.push_str(GATEWAY_CLASS);
    m.push_str("---\napiVersion: gateway.networking.k8s.io/v1\nkind: Gateway\nmetadata: {name: gw, namespace: default}\nspec:\n  gatewayClassName: haproxy\n  listeners:\n    - {name: pt, protocol: TLS, port: 443, tls: {mode: Passthrough}, allowedRoutes: {namespaces: {from: All}}}\n    - {name: http, protocol: HTTP, port: 80, allowedRoutes: {namespaces: {from: All}}}\n");
    let route = |kind: &str, ns: &str, host: &str, ts: &str, section: &str, backend: &str| {
        format!("---\napiVersion: gateway.networking.k8s.io/v1\nkind: {kind}\nmetadata: {{name: r, namespace: {ns}, creationTimestamp: \"{ts}\", generation: 1}}\nspec:\n  parentRefs: [{{name: gw, namespace: default, sectionName: {section}}}]\n  hostnames: [{host}]\n  rules: [{{backendRefs: [{{name: {backend}, port: {{}}}}]}}]\n")
            .replace("port: {}", if backend == "db" { "port: 443" } else { "port: 80" })
    };
    let passthrough = |ns: &str, name: &str, host: &str, ts: &str, annotation: &str| {
        format!("---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {{name: {name}, namespace: {ns}, creationTimestamp: \"{ts}\", annotations: {{{annotation}: \"true\"}}}}\nspec: {{ingressClassName: haproxy, rules: [{{host: {host}, http: {{paths: [{{path: /, pathType: Prefix, backend: {{service: {{name: db, port: {{number: 443}}}}}}}}]}}}}]}}\n")
    };
    let (old, new) = ("2024-01-01T00:00:00Z", "2024-06-01T00:00:00Z");
    // An older TLSRoute, then a newer Ingress passing the same name through.
    m.push_str(&route("TLSRoute", "victim", hosts[0], old, "pt", "db"));
    m.push_str(&passthrough(
        "evil",
        "pt1",
        hosts[0],
        new,
        "haproxy.org/ssl-passthrough",
    ));
    // An older Ingress passing a name through, then a newer TLSRoute for it.
    m.push_str(&passthrough(
        "victim",
        "pt2",
        hosts[1],
        old,
        "haproxy.org/ssl-passthrough",
    ));
    m.push_str(&route("TLSRoute", "evil", hosts[1], new, "pt", "db"));
    // An older HTTPRoute (HTTP only), then a newer Ingress with haproxy-ingress's passthrough.
    m.push_str(&route("HTTPRoute", "victim", hosts[2], old, "http", "web"));
    m.push_str(&passthrough(
        "evil",
        "pt3",
        hosts[2],
        new,
        "haproxy-ingress.github.io/ssl-passthrough",
    ));
    let s = Scenario::start("hostile-passthrough-ownership", &m, &[]);
    let (p, out) = (&s.proxy, &s.render_output);
    for host in &hosts[..2] {
        assert_eq!(
            served_certificate(p, Some(host)),
            "victim-backend.invalid",
            "{host}: the older claim's backend answers TLS\n{out}"
        );
        let r = p.https(host, "/", &pki.ca, &[]);
        assert!(
            r.status == 200 && r.body.contains("s_server"),
            "{host}: {r:?}"
        );
    }
    // The HTTPRoute's name is not passed through at all: HAProxy terminates TLS for it (its
    // default certificate), and plain HTTP reaches the route's backend.
    assert_eq!(
        served_certificate(p, Some(hosts[2])),
        "default.invalid",
        "{out}"
    );
    let r = p.http(hosts[2], "/");
    assert_eq!((r.status, r.backend()), (200, Some("victim-web")), "{r:?}");
    // Each newer claim is left out, naming the owner.
    for (object, reason) in [
        ("Ingress evil/pt1", "spec.rules[0].host: host route-first.test belongs to namespace victim (TLSRoute victim/r claimed it first)"),
        ("TLSRoute evil/r", "spec.hostnames: host ingress-first.test belongs to namespace victim (Ingress victim/pt2 claimed it first)"),
        ("Ingress evil/pt3", "spec.rules[0].host: host httproute-first.test belongs to namespace victim (HTTPRoute victim/r claimed it first)"),
    ] {
        assert!(
            out.lines().any(|l| l.contains(&format!("{object}: ")) && l.ends_with(reason)),
            "{object} is not left out for {reason:?}:\n{out}"
        );
    }
}

/// One EndpointSlice with as many addresses as the API server takes (1,000 endpoints of 100
/// addresses): its backend serves at most `max_backend_endpoints` of them, the check stays
/// quick, and the render takes time in proportion (collecting the addresses was quadratic:
/// five seconds for this Service alone, and `haproxy -c` on its 163,840 servers four minutes).
#[test]
fn an_endpointslice_of_100000_addresses_is_served_up_to_the_limit() {
    use super::harness::{render, Ports};
    let endpoints: Vec<String> = (0..1000)
        .map(|e| {
            let addrs: Vec<String> = (0..100)
                .map(|k| {
                    let n = e * 100 + k;
                    format!("\"10.{}.{}.{}\"", n / 65536 % 256, n / 256 % 256, n % 256)
                })
                .collect();
            format!(
                "{{addresses: [{}], conditions: {{ready: true}}}}",
                addrs.join(", ")
            )
        })
        .collect();
    let manifests = format!(
        "{}---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: big-a, namespace: team, labels: {{kubernetes.io/service-name: web}}}}\n\
         ports: [{{name: http, port: 8080}}]\nendpoints: [{}]\n{}",
        "---\napiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: team}\nspec: {ports: [{name: http, port: 80, targetPort: 8080}]}\n",
        endpoints.join(", "),
        ingress("team", "big", "big.example.com", &[], "/", "Prefix", "2024-01-01T00:00:00Z"),
    );
    let fixtures = crate::support::TempDir::new("big-slice-fixtures");
    std::fs::write(fixtures.path().join("objects.yaml"), manifests).unwrap();
    for (extra, served) in [(vec![], 8192), (vec![("max_backend_endpoints", "50")], 50)] {
        let out = crate::support::TempDir::new("big-slice-out");
        let log = render(fixtures.path(), out.path(), &Ports::pick(), &extra)
            .unwrap_or_else(|e| panic!("{e}"));
        let cfg = std::fs::read_to_string(out.path().join("haproxy.cfg")).unwrap();
        let enabled = cfg
            .lines()
            .filter(|l| l.trim_start().starts_with("server ") && l.contains(" enabled"))
            .count();
        assert_eq!(enabled, served, "{log}");
        assert!(
            cfg.contains(&format!(
                "# {} ready endpoint(s) left out: more than {served} in one backend (max_endpoints)",
                100_000 - served
            )),
            "{log}"
        );
    }
}
