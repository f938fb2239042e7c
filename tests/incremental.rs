//! Differential test of incremental rendering (DESIGN §4): over long random sequences of
//! creates, updates and deletes, a render that replays memoized units must be byte-for-byte
//! the render from scratch — haproxy.cfg, every file, every status and every dropped object.
//!
//! The cluster is rendered through the six shipped libraries. Changes cover what makes
//! replay hard: shared state read across units (host ownership, the oldest default backend),
//! ordering (creation timestamps), `first_seen` (backends shared by two paths), statuses,
//! Secrets read by certificate units, endpoints and `current_config` slots, objects that
//! are refused and later fixed, HTTPRoutes/TLSRoutes contesting Ingress hosts (host
//! ownership across kinds, decided by age), and HTTPRoute mirrors and session persistence
//! (the mirror frontend and `lua-load` follow state the route units share).

use std::collections::BTreeMap;
use std::sync::Arc;

use haptic::config::Spec;
use haptic::render::current_config::CurrentConfig;
use haptic::render::{Engine, RenderCache, RenderInputs, Rendered};
use haptic::store::Store;
use serde_json::{json, Value};

#[path = "support/libraries.rs"]
mod libraries;
use libraries::spec;

/// xorshift64*: a deterministic generator, so a failing sequence can be replayed by seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const NAMESPACES: [&str; 3] = ["alpha", "beta", "gamma"];
const HOSTS: [&str; 5] = ["a.test", "b.test", "*.w.test", "x.w.test", ""];
const PATHS: [&str; 4] = ["/", "/api", "/api/v1", "/static/"];
const PEM_CERT: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJxVENDQVZDZ0F3SUJBZ0lVSVJEeU5ITXZPa0YyWDZsUDBvQkEydnRDd2VZd0NnWUlLb1pJemowRUF3SXcKRmpFVU1CSUdBMVVFQXd3TGMyVmpkWEpsTG5SbGMzUXdJQmNOTWpZeE1qQXlNakF3T1RBNFdoZ1BNakV5TmpFeApNRGd5TURBNU1EaGFNQll4RkRBU0JnTlZCQU1NQzNObFkzVnlaUzUwWlhOME1Ga3dFd1lIS29aSXpqMENBUVlJCktvWkl6ajBEQVFjRFFnQUVoeDdNcEVtdmpXS1hOSlBTVUNIajZhcHdIQ2RQUzF3b3Z0UFZGRm9ZcE1UL0lMV2QKRURTMUlCYVkvYllXU0RLTDduWUR0SjBYRm9OeFkxZkdRbEdSZ2FONk1IZ3dIUVlEVlIwT0JCWUVGUFpoOTAvQgpEa2gxWnpFRnRpTkc4WFpXc0puMU1COEdBMVVkSXdRWU1CYUFGUFpoOTAvQkRraDFaekVGdGlORzhYWldzSm4xCk1BOEdBMVVkRXdFQi93UUZNQU1CQWY4d0pRWURWUjBSQkI0d0hJSUxjMlZqZFhKbExuUmxjM1NDRFNvdWMyVmoKZFhKbExuUmxjM1F3Q2dZSUtvWkl6ajBFQXdJRFJ3QXdSQUlnV1VkOGVWUC9tZ0dia3drTXZjcmlhY2FNY2xZMgp0VlFUSHZteWluMEFDODhDSURyV1lpMkx4cG9nVEQwY3ZQS0xuaUxQRlpXNkN1MXBDSG9HcThaSGZKZmcKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=";
const PEM_KEY: &str = "LS0tLS1CRUdJTiBQUklWQVRFIEtFWS0tLS0tCk1JR0hBZ0VBTUJNR0J5cUdTTTQ5QWdFR0NDcUdTTTQ5QXdFSEJHMHdhd0lCQVFRZ1NyZzk1UVdOY2FpNnpFMXcKTis3NXFILzVqWDAwMHJWSnFhbWtQcWxhVVFHaFJBTkNBQVNISHN5a1NhK05ZcGMwazlKUUllUHBxbkFjSjA5TApYQ2krMDlVVVdoaWt4UDhndFowUU5MVWdGcGo5dGhaSU1vdnVkZ08wblJjV2czRmpWOFpDVVpHQgotLS0tLUVORCBQUklWQVRFIEtFWS0tLS0tCg==";

fn ingress(rng: &mut Rng, ns: &str, name: &str, generation: u64) -> Value {
    let mut rules = Vec::new();
    for _ in 0..=rng.below(2) {
        // Mostly hosts of the namespace's own; sometimes contested ones (ownership changes).
        let own = format!("{ns}-{}.test", rng.below(3));
        let host = if rng.below(5) == 0 {
            rng.pick(&HOSTS).to_string()
        } else {
            own
        };
        let host = host.as_str();
        let mut paths = Vec::new();
        for _ in 0..=rng.below(2) {
            let svc = format!("svc{}", rng.below(3));
            let port = if rng.below(4) == 0 {
                json!({"name": "http"})
            } else {
                json!({"number": 80})
            };
            let path_type = *rng.pick(&["Prefix", "Exact", "ImplementationSpecific"]);
            let path = if rng.below(25) == 0 {
                "/bad path".to_string() // refused: the whole Ingress is left out
            } else {
                rng.pick(&PATHS).to_string()
            };
            paths.push(json!({"path": path, "pathType": path_type,
                "backend": {"service": {"name": svc, "port": port}}}));
        }
        let mut rule = json!({"http": {"paths": paths}});
        if !host.is_empty() {
            rule["host"] = json!(host);
        }
        rules.push(rule);
    }
    let mut annotations = serde_json::Map::new();
    if rng.below(4) == 0 {
        annotations.insert(
            "haproxy.org/timeout-server".into(),
            json!(format!("{}s", rng.below(90) + 1)),
        );
    }
    if rng.below(5) == 0 {
        annotations.insert(
            "haproxy.org/allowlist".into(),
            json!(*rng.pick(&["10.0.0.0/8", "192.168.0.0/16, 10.1.2.3", "not-an-ip"])),
        );
    }
    if rng.below(6) == 0 {
        annotations.insert(
            "haproxy.org/request-set-header".into(),
            json!(*rng.pick(&["X-Team alpha", "X-Bad\tname value"])),
        );
    }
    let mut spec = json!({"ingressClassName": "haproxy", "rules": rules});
    if rng.below(6) == 0 {
        spec["defaultBackend"] = json!({"service": {"name": "svc0", "port": {"number": 80}}});
    }
    if rng.below(3) == 0 {
        let hosts: Vec<&str> = rules_hosts(&spec);
        spec["tls"] = json!([{"hosts": hosts, "secretName": format!("tls{}", rng.below(2))}]);
    }
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": generation.to_string(),
            "creationTimestamp": format!("2024-01-01T00:00:{:02}Z", rng.below(30)),
            "annotations": annotations},
        "spec": spec,
    })
}

/// An HTTPRoute or a TLSRoute (store name, object) on the Gateway `default/gw`: hostnames of
/// its namespace or contested ones, with the Ingresses' creation timestamps, so that host
/// ownership across kinds changes hands in both directions.
fn route(rng: &mut Rng, ns: &str, name: &str, generation: u64) -> (&'static str, Value) {
    let tls = rng.below(3) == 0;
    let mut hostnames = Vec::new();
    for _ in 0..rng.below(3) {
        let h = if rng.below(2) == 0 {
            rng.pick(&HOSTS).to_string()
        } else {
            format!("{ns}-{}.test", rng.below(3))
        };
        if !h.is_empty() && !hostnames.contains(&h) {
            hostnames.push(h);
        }
    }
    let section = if tls {
        "pt"
    } else {
        *rng.pick(&["http", "wide"])
    };
    let (store, kind) = if tls {
        ("tlsroutes", "TLSRoute")
    } else {
        ("httproutes", "HTTPRoute")
    };
    let mut rule = json!({"backendRefs": [{"name": format!("svc{}", rng.below(3)), "port": 80}]});
    // HTTPRoute features with state shared across units: a RequestMirror (the mirror frontend
    // and lua-load follow "gateway_mirrors") and session persistence (backends of its own).
    // From a generator of their own, so the sequences of the other changes stay as they were.
    let mut extra = Rng(generation.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    if !tls && extra.below(3) == 0 {
        rule["filters"] = json!([{"type": "RequestMirror",
            "requestMirror": {"backendRef": {"name": format!("svc{}", extra.below(3)), "port": 80}}}]);
    }
    if !tls && extra.below(3) == 0 {
        let kind = *extra.pick(&["Cookie", "Header"]);
        rule["sessionPersistence"] = json!({"type": kind, "sessionName": "sid"});
    }
    let object = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": kind,
        "metadata": {"name": name, "namespace": ns, "resourceVersion": generation.to_string(),
            "generation": 1,
            "creationTimestamp": format!("2024-01-01T00:00:{:02}Z", rng.below(30))},
        "spec": {"parentRefs": [{"name": "gw", "namespace": "default", "sectionName": section}],
            "hostnames": hostnames,
            "rules": [rule]},
    });
    (store, object)
}

/// Our GatewayClass and one Gateway that admits routes of every namespace.
fn gateway_objects() -> [(&'static str, Value); 2] {
    [
        (
            "gatewayclasses",
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass",
                "metadata": {"name": "haproxy"},
                "spec": {"controllerName": "haproxy-haptic.org/controller"}}),
        ),
        (
            "gateways",
            json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
                "metadata": {"name": "gw", "namespace": "default"},
                "spec": {"gatewayClassName": "haproxy", "listeners": [
                    {"name": "http", "protocol": "HTTP", "port": 80,
                        "allowedRoutes": {"namespaces": {"from": "All"}}},
                    {"name": "wide", "protocol": "HTTP", "port": 80, "hostname": "*.w.test",
                        "allowedRoutes": {"namespaces": {"from": "All"}}},
                    {"name": "pt", "protocol": "TLS", "port": 443, "tls": {"mode": "Passthrough"},
                        "allowedRoutes": {"namespaces": {"from": "All"}}}]}}),
        ),
    ]
}

fn rules_hosts(spec: &Value) -> Vec<&str> {
    spec["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["host"].as_str())
        .collect()
}

fn service(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
}

/// A Service with backend annotations: haproxy.org/route-acl (valid or refused) re-routes the
/// Ingress paths to it (haproxytech's frontend units read it), timeout-server goes into its
/// backends (the Ingress backend units read it).
fn annotated_service(rng: &mut Rng, ns: &str, name: &str) -> Value {
    let mut svc = service(ns, name);
    let mut annotations = serde_json::Map::new();
    if rng.below(2) == 0 {
        annotations.insert(
            "haproxy.org/route-acl".into(),
            json!(*rng.pick(&[
                "cookie(canary) -m found",
                "hdr(x-env) -m str beta",
                "bad acl"
            ])),
        );
    }
    if rng.below(3) == 0 {
        annotations.insert(
            "haproxy.org/timeout-server".into(),
            json!(format!("{}s", rng.below(90) + 1)),
        );
    }
    svc["metadata"]["annotations"] = Value::Object(annotations);
    svc
}

fn slice(rng: &mut Rng, ns: &str, svc: &str) -> Value {
    let endpoints: Vec<Value> = (0..rng.below(4))
        .map(|_| {
            json!({"addresses": [format!("10.0.{}.{}", rng.below(4), rng.below(250) + 1)],
                "conditions": {"ready": rng.below(5) != 0}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{svc}-abc"), "namespace": ns,
            "labels": {"kubernetes.io/service-name": svc}},
        "ports": [{"name": "http", "port": 8080}], "endpoints": endpoints})
}

fn secret(rng: &mut Rng, ns: &str, name: &str) -> Value {
    let crt = if rng.below(6) == 0 {
        // Not PEM: the certificate's owner is left out.
        "Z2xvYmFsCiAgbG9nIGV2aWw=".to_string()
    } else {
        PEM_CERT.to_string()
    };
    json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": ns},
        "data": {"tls.crt": crt, "tls.key": PEM_KEY}})
}

struct Cluster {
    spec: Spec,
    stores: BTreeMap<String, Store>,
}

impl Cluster {
    fn new(spec: Spec) -> Cluster {
        let mut stores: BTreeMap<String, Store> = spec
            .watched_resources
            .iter()
            .map(|(name, r)| (name.clone(), Store::for_resource(r)))
            .collect();
        stores.insert(
            "haproxy-pods".into(),
            Store::new(haptic::render::pod_index()),
        );
        Cluster { spec, stores }
    }

    fn upsert(&mut self, store: &str, object: Value) {
        let s = self.stores.get_mut(store).expect("watched store");
        s.upsert_value(&object).expect("indexable object");
    }

    fn delete(&mut self, store: &str, ns: &str, name: &str) {
        if let Some(s) = self.stores.get_mut(store) {
            s.delete(&(ns.to_string(), name.to_string()));
        }
    }

    fn inputs(&self, current: Option<Arc<CurrentConfig>>) -> RenderInputs {
        let mut extra = self.spec.templating_settings.extra_context.clone();
        extra.insert("default_ssl_cert_name".into(), json!("missing"));
        RenderInputs {
            stores: self
                .stores
                .iter()
                .map(|(k, v)| (k.clone(), Arc::new(v.clone())))
                .collect(),
            extra_context: extra,
            current_config: current,
            base_dir: None,
        }
    }
}

fn describe(r: &Rendered) -> String {
    let mut out = r.haproxy_cfg.to_string();
    for f in &r.files {
        out.push_str(&format!("\n=== {} ===\n{}", f.path, f.content));
    }
    for s in r.statuses.iter() {
        out.push_str(&format!(
            "\n=== status {}/{} {}",
            s.namespace, s.name, s.status
        ));
    }
    for d in &r.dropped {
        out.push_str(&format!("\n=== dropped {d}"));
    }
    // Where each unit's lines are (what maps `haproxy -c` errors to objects).
    let mut spans: Vec<String> = r
        .units
        .iter()
        .map(|u| {
            format!(
                "\n=== unit {} {} {} {}-{}",
                u.unit, u.owner, u.output, u.first, u.last
            )
        })
        .collect();
    spans.sort();
    out.extend(spans);
    out
}

fn first_difference(a: &str, b: &str) -> String {
    let line = a
        .lines()
        .zip(b.lines())
        .position(|(x, y)| x != y)
        .unwrap_or_else(|| a.lines().count().min(b.lines().count()));
    let around = |t: &str| {
        t.lines()
            .skip(line.saturating_sub(3))
            .take(7)
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "first difference at line {}:\n--- incremental\n{}\n--- full\n{}",
        line + 1,
        around(a),
        around(b)
    )
}

/// Counts of what a sequence exercised.
#[derive(Default)]
struct Exercised {
    replayed: usize,
    rendered: usize,
    ok_renders: usize,
    with_dropped: usize,
    /// Renders where an Ingress and a route of different namespaces contested a name.
    cross_kind: usize,
    spliced: usize,
    /// Renders with a RequestMirror (the mirror frontend) and with session persistence.
    mirrored: usize,
    sticky: usize,
}

fn run_sequence(seed: u64, steps: usize) -> Exercised {
    let spec = spec();
    let engine = Engine::new(&spec).expect("libraries compile");
    let mut cluster = Cluster::new(spec);
    let mut rng = Rng(seed);
    let mut cache = RenderCache::new();
    let mut current: Option<Arc<CurrentConfig>> = None;
    let mut generation = 0;
    let mut seen = Exercised::default();
    for ns in NAMESPACES {
        for s in 0..3 {
            cluster.upsert("services", service(ns, &format!("svc{s}")));
        }
    }
    for (store, object) in gateway_objects() {
        cluster.upsert(store, object);
    }
    for step in 0..steps {
        generation += 1;
        let ns = *rng.pick(&NAMESPACES);
        match rng.below(14) {
            0..=3 => {
                let name = format!("ing{}", rng.below(4));
                let obj = ingress(&mut rng, ns, &name, generation);
                cluster.upsert("ingresses", obj);
            }
            4 => cluster.delete("ingresses", ns, &format!("ing{}", rng.below(4))),
            5..=7 => {
                let svc = format!("svc{}", rng.below(3));
                let obj = slice(&mut rng, ns, &svc);
                cluster.upsert("endpoints", obj);
            }
            8 => {
                let name = format!("tls{}", rng.below(2));
                if rng.below(4) == 0 {
                    cluster.delete("secrets", ns, &name);
                } else {
                    let obj = secret(&mut rng, ns, &name);
                    cluster.upsert("secrets", obj);
                }
            }
            9 | 10 => {
                let name = format!("rt{}", rng.below(3));
                let (store, obj) = route(&mut rng, ns, &name, generation);
                // one kind per name: the other kind's object of that name goes
                let other = if store == "tlsroutes" {
                    "httproutes"
                } else {
                    "tlsroutes"
                };
                cluster.delete(other, ns, &name);
                cluster.upsert(store, obj);
            }
            11 => {
                let name = format!("rt{}", rng.below(3));
                let store = if rng.below(2) == 0 {
                    "httproutes"
                } else {
                    "tlsroutes"
                };
                cluster.delete(store, ns, &name);
            }
            12 => {
                let svc = format!("svc{}", rng.below(3));
                let obj = annotated_service(&mut rng, ns, &svc);
                cluster.upsert("services", obj);
            }
            _ => {} // nothing changed: a pure replay
        }
        let inputs = cluster.inputs(current.clone());
        let incremental = engine.render_cached(&inputs, &mut cache);
        let full = engine.render(&inputs);
        match (&incremental, &full) {
            (Ok(a), Ok(b)) => {
                seen.ok_renders += 1;
                if !b.dropped.is_empty() {
                    seen.with_dropped += 1;
                }
                let contested = |d: String| {
                    (d.starts_with("Ingress ") && d.contains("Route "))
                        || (d.contains("Route ") && d.contains("(Ingress "))
                };
                if b.dropped.iter().any(|d| contested(d.to_string())) {
                    seen.cross_kind += 1;
                }
                if b.haproxy_cfg.contains("frontend gateway_mirror") {
                    seen.mirrored += 1;
                }
                if b.haproxy_cfg.contains("backend gwsp_") {
                    seen.sticky += 1;
                }
                let (a, b) = (describe(a), describe(b));
                assert!(
                    a == b,
                    "seed {seed} step {step}: incremental render ({:?}) differs from the full render; {}",
                    cache.stats,
                    first_difference(&a, &b)
                );
            }
            (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "seed {seed} step {step}"),
            _ => panic!("seed {seed} step {step}: incremental {incremental:?} but full {full:?}"),
        }
        seen.replayed += cache.stats.replayed;
        seen.rendered += cache.stats.rendered;
        if cache.stats.spliced && incremental.is_ok() {
            seen.spliced += 1;
        }
        // As in the controller: the deployed config becomes current_config (server slots).
        if let Ok(r) = &full {
            if rng.below(2) == 0 {
                current = Some(Arc::new(CurrentConfig::parse(&r.haproxy_cfg)));
            }
        }
    }
    seen
}

#[test]
fn incremental_renders_equal_full_renders_over_random_changes() {
    let steps = 150;
    for seed in [0x9E37_79B9_7F4A_7C15, 42, 7_777_777] {
        let seen = run_sequence(seed, steps);
        eprintln!(
            "seed {seed}: {} of {steps} renders succeeded, {} with objects left out ({} contested across kinds), {} spliced; units replayed {}, rendered {}",
            seen.ok_renders, seen.with_dropped, seen.cross_kind, seen.spliced, seen.replayed, seen.rendered
        );
        // The sequences must exercise what they claim to, or the comparison proves nothing:
        // successful renders, replayed units, and objects left out.
        assert!(
            seen.cross_kind > 0,
            "seed {seed}: no render had an Ingress and a route contesting a name"
        );
        assert!(
            seen.mirrored > 0 && seen.sticky > 0,
            "seed {seed}: renders with a mirror: {}, with session persistence: {}",
            seen.mirrored,
            seen.sticky
        );
        assert!(
            seen.ok_renders * 10 >= steps * 9,
            "seed {seed}: only {} of {steps} renders succeeded",
            seen.ok_renders
        );
        assert!(
            seen.replayed > seen.rendered,
            "seed {seed}: too few units replayed ({} replayed, {} rendered)",
            seen.replayed,
            seen.rendered
        );
        assert!(
            seen.with_dropped > 0,
            "seed {seed}: no render left an object out"
        );
        assert!(
            seen.spliced * 10 >= steps,
            "seed {seed}: only {} renders were spliced",
            seen.spliced
        );
    }
}

/// A Service change costs only the units that read that Service: with haproxytech's route-acl
/// decided inside each Ingress's frontend unit (issue #11), no top level lists the Services,
/// so the change is spliced into the last output, and the result is the full render's.
#[test]
fn a_service_change_is_spliced_into_the_last_render() {
    let spec = spec();
    let engine = Engine::new(&spec).expect("libraries compile");
    let mut cluster = Cluster::new(spec);
    let mut rng = Rng(11);
    for ns in NAMESPACES {
        for s in 0..3 {
            cluster.upsert("services", service(ns, &format!("svc{s}")));
        }
        for i in 0..4 {
            let obj = ingress(&mut rng, ns, &format!("ing{i}"), 1);
            cluster.upsert("ingresses", obj);
        }
    }
    // Without any route-acl in the cluster, Ingresses without haproxy.org/ annotations or TLS
    // get no haproxytech frontend unit at all; once one Service has one, every Ingress does.
    // (The units the last pass called: rendered there, or replayed from an earlier pass.)
    let units_called = |cluster: &Cluster| {
        let mut fresh = RenderCache::new();
        engine
            .render_cached(&cluster.inputs(None), &mut fresh)
            .expect("render");
        fresh.stats.rendered + fresh.stats.replayed
    };
    let without = units_called(&cluster);
    let mut canary = service("gamma", "canary");
    canary["metadata"]["annotations"] = json!({"haproxy.org/route-acl": "cookie(canary) -m found"});
    cluster.upsert("services", canary);
    let with = units_called(&cluster);
    assert!(
        with > without,
        "{with} units with a route-acl, {without} without"
    );
    let mut cache = RenderCache::new();
    engine
        .render_cached(&cluster.inputs(None), &mut cache)
        .expect("first render");
    assert!(!cache.stats.spliced, "{:?}", cache.stats);
    // A route-acl appears on one more Service, changes, then goes away again; its timeout too.
    let changes = [
        json!({"haproxy.org/route-acl": "cookie(canary) -m found"}),
        json!({"haproxy.org/route-acl": "hdr(x-env) -m str beta", "haproxy.org/timeout-server": "5s"}),
        json!({}),
    ];
    for annotations in changes {
        let mut svc = service("beta", "svc1");
        svc["metadata"]["annotations"] = annotations.clone();
        cluster.upsert("services", svc);
        let inputs = cluster.inputs(None);
        let incremental = engine.render_cached(&inputs, &mut cache).expect("render");
        let stats = cache.stats;
        assert!(stats.spliced, "{annotations}: {stats:?}");
        assert!(
            stats.rendered > 0 && stats.rendered * 10 < stats.replayed,
            "{annotations}: {} units rendered again, {} replayed",
            stats.rendered,
            stats.replayed
        );
        let full = engine.render(&inputs).expect("full render");
        let (a, b) = (describe(&incremental), describe(&full));
        assert!(a == b, "{annotations}: {}", first_difference(&a, &b));
    }
    // The last route-acl of the cluster goes: the answer changes, so the render is not a
    // splice, and it still equals the full render.
    cluster.upsert("services", service("gamma", "canary"));
    let inputs = cluster.inputs(None);
    let incremental = engine.render_cached(&inputs, &mut cache).expect("render");
    let full = engine.render(&inputs).expect("full render");
    let (a, b) = (describe(&incremental), describe(&full));
    assert!(
        a == b,
        "last route-acl removed: {}",
        first_difference(&a, &b)
    );
}
