//! The Kubernetes client, reflectors and Lease election against the dev API server
//! (`tests/apiserver`), including its fault injection.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use haptic::kube::client::{Client, ListParams, ResourceRef};
use haptic::kube::config::KubeConfig;
use haptic::kube::lease::{Elector, Leadership, LeaseConfig};
use haptic::kube::reflector::{snapshot, Reflector, ReflectorEvent, SharedStore};
use haptic::store::path::PathExpr;
use haptic::store::{ObjectFilter, Store};
use serde_json::json;
use support::{wait_for, DevApiServer, Proxy};

const WAIT: Duration = Duration::from_secs(20);

fn client(server: &DevApiServer) -> Client {
    Client::new(&KubeConfig::from_kubeconfig(&server.kubeconfig(), None).unwrap()).unwrap()
}

fn configmaps() -> ResourceRef {
    ResourceRef::new("v1", "configmaps", true)
}

fn cm(name: &str, value: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default", "labels": {"app": "t"}}, "data": {"v": value}})
}

/// Names and values of the ConfigMaps on the server.
fn server_state(c: &Client) -> BTreeSet<(String, String)> {
    let (items, _) = c
        .list_all(
            &configmaps(),
            Some("default"),
            &ListParams {
                label_selector: Some("app=t".into()),
                ..Default::default()
            },
        )
        .unwrap();
    items
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap().to_string(),
                o["data"]["v"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn store_state(store: &SharedStore) -> BTreeSet<(String, String)> {
    snapshot(store)
        .list()
        .map(|o| o.to_value())
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap().to_string(),
                o["data"]["v"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

struct RunningReflector {
    store: SharedStore,
    events: crossbeam_channel::Receiver<ReflectorEvent>,
    stop: Arc<AtomicBool>,
    synced: Arc<AtomicBool>,
}

impl Drop for RunningReflector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn start_reflector(c: &Client) -> RunningReflector {
    start_reflector_of(
        c,
        configmaps(),
        Some("default"),
        ListParams {
            label_selector: Some("app=t".into()),
            limit: Some(3),
            ..Default::default()
        },
        ObjectFilter {
            ignore_fields: vec![PathExpr::parse("metadata.managedFields").unwrap()],
            field_selector: None,
        },
    )
}

/// A reflector of `resource` with these list parameters and local filter, once synced.
fn start_reflector_of(
    c: &Client,
    resource: ResourceRef,
    namespace: Option<&str>,
    params: ListParams,
    filter: ObjectFilter,
) -> RunningReflector {
    let store: SharedStore = Arc::new(RwLock::new(Arc::new(Store::new(vec![
        PathExpr::parse("metadata.namespace").unwrap(),
        PathExpr::parse("metadata.name").unwrap(),
    ]))));
    let (tx, rx) = crossbeam_channel::unbounded();
    let stop = Arc::new(AtomicBool::new(false));
    let synced = Arc::new(AtomicBool::new(false));
    let reflector = Reflector {
        name: resource.resource.clone(),
        client: c.clone(),
        resource,
        namespace: namespace.map(str::to_string),
        params,
        filter,
        store: store.clone(),
        synced: synced.clone(),
        stop: stop.clone(),
        events: tx,
        watch_timeout: Duration::from_secs(60),
    };
    std::thread::spawn(move || reflector.run());
    wait_for("reflector synced", WAIT, || synced.load(Ordering::SeqCst));
    RunningReflector {
        store,
        events: rx,
        stop,
        synced,
    }
}

fn converges(c: &Client, r: &RunningReflector, what: &str) {
    wait_for(what, WAIT, || store_state(&r.store) == server_state(c));
}

#[test]
fn verbs_pagination_and_errors() {
    let server = DevApiServer::start(&[]);
    let c = client(&server);
    for i in 0..25 {
        c.create(
            &configmaps(),
            Some("default"),
            &cm(&format!("cm-{i:02}"), "x"),
        )
        .unwrap();
    }
    let params = ListParams {
        label_selector: Some("app=t".into()),
        limit: Some(7),
        ..Default::default()
    };
    let first: serde_json::Value = serde_json::from_str(
        &c.list_page(&configmaps(), Some("default"), &params, None)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(first["items"].as_array().unwrap().len(), 7);
    assert!(
        !first["metadata"]["continue"]
            .as_str()
            .unwrap_or_default()
            .is_empty(),
        "a continue token"
    );
    let (items, rv) = c.list_all(&configmaps(), Some("default"), &params).unwrap();
    let names: BTreeSet<_> = items
        .iter()
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names.len(), 25, "every object once across pages");
    assert!(!rv.is_empty());

    let got = c.get(&configmaps(), Some("default"), "cm-00").unwrap();
    let mut stale = got.clone();
    c.merge_patch(
        &configmaps(),
        Some("default"),
        "cm-00",
        &json!({"data": {"v": "patched"}}),
    )
    .unwrap();
    stale["data"]["v"] = json!("lost update");
    let err = c
        .update(&configmaps(), Some("default"), "cm-00", &stale)
        .unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert!(
        err.to_string()
            .starts_with("update /api/v1/namespaces/default/configmaps/cm-00: 409 Conflict: "),
        "{err}"
    );
    c.delete(&configmaps(), Some("default"), "cm-00").unwrap();
    let err = c.get(&configmaps(), Some("default"), "cm-00").unwrap_err();
    assert!(err.is_not_found());
    assert_eq!(err.to_string(), "get /api/v1/namespaces/default/configmaps/cm-00: 404 NotFound: configmaps \"cm-00\" not found");

    let services = ResourceRef::new("v1", "services", true);
    c.create(
        &services,
        Some("default"),
        &json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}}),
    )
    .unwrap();
    c.merge_patch_status(
        &services,
        Some("default"),
        "web",
        &json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.0.0.9"}]}}}),
    )
    .unwrap();
    let svc = c.get(&services, Some("default"), "web").unwrap();
    assert_eq!(
        svc["status"]["loadBalancer"]["ingress"][0]["ip"],
        "10.0.0.9"
    );

    assert!(c
        .is_namespaced("networking.k8s.io/v1", "ingresses")
        .unwrap());
    assert!(!c
        .is_namespaced("networking.k8s.io/v1", "ingressclasses")
        .unwrap());
    assert!(c.is_namespaced("v1", "nonsense").is_err());
}

#[test]
fn watch_delivers_adds_updates_deletes_in_order_with_bookmarks() {
    let server = DevApiServer::start(&["--bookmark-interval", "200ms"]);
    let c = client(&server);
    let (_, rv) = c
        .list_all(&configmaps(), Some("default"), &ListParams::default())
        .unwrap();
    let mut stream = c
        .watch(
            &configmaps(),
            Some("default"),
            &ListParams::default(),
            &rv,
            30,
        )
        .unwrap();
    c.create(&configmaps(), Some("default"), &cm("a", "1"))
        .unwrap();
    c.merge_patch(
        &configmaps(),
        Some("default"),
        "a",
        &json!({"data": {"v": "2"}}),
    )
    .unwrap();
    c.delete(&configmaps(), Some("default"), "a").unwrap();
    let mut kinds = Vec::new();
    let mut bookmarks = 0;
    while kinds.len() < 3 || bookmarks == 0 {
        let event = stream.next().expect("stream open").unwrap();
        let object = event.object.doc.unwrap().to_value();
        if event.kind == "BOOKMARK" {
            bookmarks += 1;
            assert!(object["metadata"]["resourceVersion"].as_str().is_some());
        } else {
            kinds.push((
                event.kind,
                object["data"]["v"].as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    let expected = [("ADDED", "1"), ("MODIFIED", "2"), ("DELETED", "2")];
    assert_eq!(kinds, expected.map(|(k, v)| (k.to_string(), v.to_string())));
}

#[test]
fn reflector_survives_dropped_watches_410_and_error_storms() {
    let server = DevApiServer::start(&[]);
    let c = client(&server);
    for i in 0..5 {
        c.create(
            &configmaps(),
            Some("default"),
            &cm(&format!("base-{i}"), "0"),
        )
        .unwrap();
    }
    let r = start_reflector(&c);
    converges(&c, &r, "initial list (paginated) in the store");

    // Adds, updates and deletes arrive through the watch.
    c.create(&configmaps(), Some("default"), &cm("new", "1"))
        .unwrap();
    c.merge_patch(
        &configmaps(),
        Some("default"),
        "base-0",
        &json!({"data": {"v": "changed"}}),
    )
    .unwrap();
    c.delete(&configmaps(), Some("default"), "base-1").unwrap();
    converges(&c, &r, "watched changes");

    // The watch is cut mid-stream while changes happen: nothing lost, nothing invented.
    server.faults(&json!({"closeWatches": "abrupt"}));
    c.create(&configmaps(), Some("default"), &cm("during-drop", "1"))
        .unwrap();
    c.delete(&configmaps(), Some("default"), "base-2").unwrap();
    converges(&c, &r, "changes made while the watch was down");

    // Events held back, objects deleted, history compacted: the resumed watch gets 410 and
    // the re-list must delete what disappeared meanwhile.
    while r.events.try_recv().is_ok() {}
    server.faults(&json!({"pause": ["configmaps"]}));
    c.delete(&configmaps(), Some("default"), "base-3").unwrap();
    c.create(&configmaps(), Some("default"), &cm("after-compaction", "1"))
        .unwrap();
    server.faults(&json!({"compact": true, "closeWatches": "clean", "resume": ["configmaps"]}));
    converges(&c, &r, "re-list after 410");
    let relisted = r
        .events
        .try_iter()
        .any(|e| matches!(e, ReflectorEvent::Relisted { .. }));
    assert!(relisted, "the reflector re-listed");
    assert!(
        !store_state(&r.store).iter().any(|(n, _)| n == "base-3"),
        "no phantom object"
    );

    // A burst of 5xx on lists and watches: back off, recover, converge.
    server.faults(&json!({"failNext": {"count": 6, "code": 503, "pathPrefix": "/api/v1/namespaces/default/configmaps"}, "closeWatches": "abrupt"}));
    // Our own writes may hit the storm too: retry them like any client would.
    wait_for("the write after the storm", WAIT, || {
        c.create(&configmaps(), Some("default"), &cm("after-storm", "1"))
            .is_ok()
    });
    wait_for("after the 503 storm", WAIT, || {
        store_state(&r.store)
            .iter()
            .any(|(n, _)| n == "after-storm")
    });
    converges(&c, &r, "state after the 503 storm");
    assert!(r.synced.load(Ordering::SeqCst));
}

#[test]
fn token_rotation_and_client_certificates() {
    let dir = support::TempDir::new("tokens");
    let token_file = dir.0.join("token");
    std::fs::write(&token_file, "first-token\n").unwrap();
    let server = DevApiServer::start(&["--token-file", token_file.to_str().unwrap()]);
    let c = client(&server);
    c.list_all(&configmaps(), Some("default"), &ListParams::default())
        .unwrap();
    // Rotate: the server now accepts only the new token, and the client re-reads its file.
    std::fs::write(&token_file, "second-token-which-is-longer\n").unwrap();
    wait_for("client works with the rotated token", WAIT, || {
        c.list_all(&configmaps(), Some("default"), &ListParams::default())
            .is_ok()
    });
    let stale = Client::new(&KubeConfig {
        credentials: haptic::kube::config::Credentials::Token("first-token".into()),
        ..KubeConfig::from_kubeconfig(&server.kubeconfig(), None).unwrap()
    })
    .unwrap();
    let err = stale
        .list_all(&configmaps(), Some("default"), &ListParams::default())
        .unwrap_err();
    assert_eq!(err.code(), Some(401), "{err}");

    let cert_config =
        KubeConfig::from_kubeconfig(&server.dir.0.join("kubeconfig-client-cert"), None).unwrap();
    assert!(cert_config.client_cert.is_some());
    Client::new(&cert_config)
        .unwrap()
        .list_all(&configmaps(), Some("default"), &ListParams::default())
        .unwrap();
}

struct Candidate {
    leadership: Arc<Leadership>,
    stop: Arc<AtomicBool>,
    proxy: Proxy,
    handle: Option<std::thread::JoinHandle<()>>,
}

fn candidate(server: &DevApiServer, identity: &str, timings: (u64, u64, u64)) -> Candidate {
    let upstream: std::net::SocketAddr = server.url.trim_start_matches("https://").parse().unwrap();
    let proxy = Proxy::start(upstream);
    let mut config = KubeConfig::from_kubeconfig(&server.kubeconfig(), None).unwrap();
    config.server = format!("https://127.0.0.1:{}", proxy.port);
    let (tx, _rx) = crossbeam_channel::unbounded();
    let stop = Arc::new(AtomicBool::new(false));
    let lease = LeaseConfig {
        namespace: "default".into(),
        name: "haptic-leader".into(),
        identity: identity.into(),
        lease_duration: Duration::from_millis(timings.0),
        renew_deadline: Duration::from_millis(timings.1),
        retry_period: Duration::from_millis(timings.2),
    };
    let elector = Elector::new(Client::new(&config).unwrap(), lease, tx, stop.clone());
    let leadership = elector.leadership();
    let handle = std::thread::spawn(move || elector.run());
    Candidate {
        leadership,
        stop,
        proxy,
        handle: Some(handle),
    }
}

/// Watches the candidates every few milliseconds and fails the test if two ever lead at once.
struct Monitor {
    stop: Arc<AtomicBool>,
    violation: Arc<AtomicBool>,
}

impl Monitor {
    fn start(views: Vec<Arc<Leadership>>) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let violation = Arc::new(AtomicBool::new(false));
        let (s, v) = (stop.clone(), violation.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if views.iter().filter(|l| l.is_leader()).count() > 1 {
                    v.store(true, Ordering::SeqCst);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        Monitor { stop, violation }
    }

    fn check(&self) {
        assert!(
            !self.violation.load(Ordering::SeqCst),
            "two candidates led at the same time"
        );
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn leader(cands: &[Candidate]) -> Option<usize> {
    cands.iter().position(|c| c.leadership.is_leader())
}

#[test]
fn lease_election_with_three_candidates() {
    let server = DevApiServer::start(&[]);
    // lease 3 s, renew deadline 2 s, retry 300 ms.
    let timings = (3000, 2000, 300);
    let mut cands: Vec<Candidate> = ["a", "b", "c"]
        .iter()
        .map(|id| candidate(&server, id, timings))
        .collect();
    let monitor = Monitor::start(cands.iter().map(|c| c.leadership.clone()).collect());
    wait_for("a first leader", WAIT, || leader(&cands).is_some());

    // Graceful hand-over: the leader releases the Lease (emptied, so nobody waits for it to
    // expire); a standby takes it.
    let first = leader(&cands).unwrap();
    let released = Instant::now();
    cands[first].stop.store(true, Ordering::SeqCst);
    cands[first].handle.take().unwrap().join().unwrap();
    let client =
        Client::new(&KubeConfig::from_kubeconfig(&server.kubeconfig(), None).unwrap()).unwrap();
    let lease = client
        .get(
            &haptic::kube::client::ResourceRef::new("coordination.k8s.io/v1", "leases", true),
            Some("default"),
            "haptic-leader",
        )
        .unwrap();
    let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default();
    assert_ne!(
        holder,
        ["a", "b", "c"][first],
        "the stopped leader still holds the Lease"
    );
    wait_for("a new leader after release", WAIT, || {
        leader(&cands).is_some_and(|i| i != first)
    });
    let graceful = released.elapsed();
    eprintln!(
        "graceful hand-over took {graceful:?} (retry period {}ms)",
        timings.2
    );
    monitor.check();

    // Partition the leader (its requests fail): it must stop acting before anyone else can take
    // the lease (the monitor checks continuously), and a standby takes over after expiry.
    let second = leader(&cands).unwrap();
    let cut = Instant::now();
    cands[second].proxy.set_cut(true);
    wait_for("the partitioned leader steps down", WAIT, || {
        !cands[second].leadership.is_leader()
    });
    let stepped_down = cut.elapsed();
    wait_for("a standby leads after the lease expired", WAIT, || {
        leader(&cands).is_some_and(|i| i != second)
    });
    let replaced = cut.elapsed();
    eprintln!("partitioned leader stopped after {stepped_down:?}; replaced after {replaced:?} (lease {}ms)", timings.0);
    assert!(
        stepped_down < replaced,
        "the old leader stopped before the new one started"
    );
    assert!(
        replaced >= Duration::from_millis(timings.0 - timings.1),
        "the lease was respected"
    );
    monitor.check();

    // The partition heals: the old leader rejoins as a follower; still exactly one leader.
    cands[second].proxy.set_cut(false);
    std::thread::sleep(Duration::from_millis(timings.2 * 4));
    assert_eq!(cands.iter().filter(|c| c.leadership.is_leader()).count(), 1);
    monitor.check();
    for c in &cands {
        c.stop.store(true, Ordering::SeqCst);
    }
}

#[test]
fn unserved_resources_do_not_block_and_are_watched_once_served() {
    use haptic::controller::watchers::{WatchDef, Watchers};
    let server = DevApiServer::start(&[]);
    let c = client(&server);
    let (tx, _rx) = crossbeam_channel::unbounded();
    let mut watchers = Watchers::new(c.clone(), tx);
    let def = WatchDef {
        api_version: "example.org/v1".into(),
        resources: "widgets".into(),
        namespace: None,
        label_selector: None,
        field_selector: None,
        index_by: vec!["metadata.namespace".into(), "metadata.name".into()],
        ignore_fields: vec![],
    };
    let defs = std::collections::BTreeMap::from([("widgets".to_string(), def)]);
    assert_eq!(watchers.apply(&defs), ["widgets"]);
    assert!(
        watchers.barrier().is_synced(),
        "an unserved resource must not block rendering"
    );
    assert_eq!(
        watchers.undiscovered().len(),
        1,
        "{:?}",
        watchers.undiscovered()
    );
    assert!(watchers.retry_discovery().is_empty());

    let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": "widgets.example.org"},
        "spec": {"group": "example.org", "scope": "Namespaced", "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}});
    c.create(
        &ResourceRef::new(
            "apiextensions.k8s.io/v1",
            "customresourcedefinitions",
            false,
        ),
        None,
        &crd,
    )
    .unwrap();
    let widgets = ResourceRef::new("example.org/v1", "widgets", true);
    wait_for("CRD served", WAIT, || {
        c.is_namespaced("example.org/v1", "widgets").is_ok()
    });
    c.create(
        &widgets,
        Some("default"),
        &json!({"apiVersion": "example.org/v1", "kind": "Widget", "metadata": {"name": "w1"}}),
    )
    .unwrap();
    assert_eq!(watchers.retry_discovery(), ["widgets"]);
    assert!(watchers.undiscovered().is_empty());
    wait_for("widget in the store", WAIT, || {
        watchers.store("widgets").is_some_and(|s| s.len() == 1)
    });
}

fn secret(name: &str, kind: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "default"}, "type": kind, "data": {"x": "eA=="}})
}

/// Names of the objects in a store.
fn names(store: &SharedStore) -> BTreeSet<String> {
    names_in(&snapshot(store))
}

fn names_in(store: &Store) -> BTreeSet<String> {
    store
        .list()
        .map(|o| {
            o.to_value()["metadata"]["name"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// A field selector goes to the API server, so that what it leaves out is never transferred or
/// held (Helm's release Secrets, by the thousand in a platform cluster, next to the few TLS
/// Secrets the templates read); one on a field the API server cannot select by is applied by
/// the controller to every object instead, and the watch still syncs.
#[test]
fn field_selectors_are_applied_by_the_api_server_or_else_locally() {
    use haptic::controller::watchers::{WatchDef, Watchers};
    let server = DevApiServer::start(&[]);
    let c = client(&server);
    let secrets = ResourceRef::new("v1", "secrets", true);
    for (name, kind) in [
        ("tls", "kubernetes.io/tls"),
        ("release", "helm.sh/release.v1"),
    ] {
        c.create(&secrets, Some("default"), &secret(name, kind))
            .unwrap();
    }
    c.create(&configmaps(), Some("default"), &cm("app", "1"))
        .unwrap();
    let mut other = cm("other", "2");
    other["metadata"]["labels"]["app"] = json!("u");
    c.create(&configmaps(), Some("default"), &other).unwrap();

    // The reflector alone, with no local selection: only the API server leaves the release out.
    let secrets_reflector = start_reflector_of(
        &c,
        secrets.clone(),
        None,
        ListParams {
            field_selector: Some("type!=helm.sh/release.v1".into()),
            ..Default::default()
        },
        ObjectFilter::new(&[], None),
    );
    let store = &secrets_reflector.store;
    c.create(
        &secrets,
        Some("default"),
        &secret("later", "helm.sh/release.v1"),
    )
    .unwrap();
    c.create(
        &secrets,
        Some("default"),
        &secret("tls-2", "kubernetes.io/tls"),
    )
    .unwrap();
    wait_for("the new TLS Secret watched", WAIT, || {
        names(store).contains("tls-2")
    });
    assert_eq!(names(store), BTreeSet::from(["tls".into(), "tls-2".into()]));
    drop(secrets_reflector);

    // Through the controller's watchers: the same selection, and a label path the API server
    // cannot select ConfigMaps by, applied locally.
    let (tx, _rx) = crossbeam_channel::unbounded();
    let mut watchers = Watchers::new(c.clone(), tx);
    let def = |api_version: &str, resources: &str, selector: &str| WatchDef {
        api_version: api_version.into(),
        resources: resources.into(),
        namespace: None,
        label_selector: None,
        field_selector: Some(selector.into()),
        index_by: vec!["metadata.namespace".into(), "metadata.name".into()],
        ignore_fields: vec![],
    };
    let defs = std::collections::BTreeMap::from([
        (
            "secrets".to_string(),
            def("v1", "secrets", "type!=helm.sh/release.v1"),
        ),
        (
            "configmaps".to_string(),
            def("v1", "configmaps", "metadata.labels.app=t"),
        ),
    ]);
    watchers.apply(&defs);
    wait_for("both watchers synced", WAIT, || {
        watchers.barrier().is_synced()
    });
    let stored = |name: &str| names_in(&watchers.store(name).unwrap_or_else(|| panic!("{name}")));
    wait_for("every selected object stored", WAIT, || {
        stored("secrets").len() == 2
    });
    assert_eq!(
        stored("secrets"),
        BTreeSet::from(["tls".into(), "tls-2".into()])
    );
    assert_eq!(stored("configmaps"), BTreeSet::from(["app".into()]));
    watchers.stop_all();
}
