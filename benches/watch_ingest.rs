//! Watch ingest benchmark (run by `scripts/bench.sh watch`): list and watch throughput into
//! stores, and store memory, for 10,000 Ingresses + 10,000 Services + 10,000 EndpointSlices
//! served by the dev API server, compared with the raw JSON size of those objects.

#[path = "../tests/support/mod.rs"]
mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use haptic::kube::client::{Client, ListParams, ResourceRef};
use haptic::kube::config::KubeConfig;
use haptic::kube::reflector::{snapshot, Reflector, SharedStore};
use haptic::store::path::PathExpr;
use haptic::store::{Doc, ObjectFilter, Store};
use serde_json::json;

/// The system allocator, counting the bytes live on the heap: the store's RSS minus these is
/// the allocator's own (block headers, free holes) and the process's.
struct Counting;

static HEAP_LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let ptr = System.alloc(layout);
        if !ptr.is_null() {
            HEAP_LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        HEAP_LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = System.realloc(ptr, layout, new_size);
        if !new.is_null() {
            HEAP_LIVE.fetch_add(new_size, Ordering::Relaxed);
            HEAP_LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn heap_kb() -> u64 {
    (HEAP_LIVE.load(Ordering::Relaxed) / 1024) as u64
}

fn rss_kb() -> u64 {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free heap memory to the OS; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn ingress(i: usize) -> serde_json::Value {
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": format!("ing-{i}"), "namespace": format!("ns-{}", i % 50), "labels": {"app": format!("app-{i}")},
            "annotations": {"haproxy.org/timeout-server": "30s", "haproxy.org/ssl-redirect": "true"}},
        "spec": {"ingressClassName": "haproxy", "tls": [{"hosts": [format!("app-{i}.example.com")], "secretName": format!("tls-{i}")}],
            "rules": [{"host": format!("app-{i}.example.com"), "http": {"paths": [
                {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": format!("svc-{i}"), "port": {"number": 80}}}},
                {"path": "/api", "pathType": "Prefix", "backend": {"service": {"name": format!("svc-{i}"), "port": {"name": "http"}}}}]}}]}})
}

fn service(i: usize) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{i}"), "namespace": format!("ns-{}", i % 50), "labels": {"app": format!("app-{i}")}},
        "spec": {"type": "ClusterIP", "clusterIP": format!("10.96.{}.{}", i / 256 % 256, i % 256), "selector": {"app": format!("app-{i}")},
            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}})
}

fn slice(i: usize) -> serde_json::Value {
    let endpoints: Vec<_> = (0..3)
        .map(|e| json!({"addresses": [format!("10.{}.{}.{}", e + 1, i / 256 % 256, i % 256)], "conditions": {"ready": true, "serving": true, "terminating": false},
            "nodeName": format!("node-{}", (i + e) % 20), "targetRef": {"kind": "Pod", "name": format!("app-{i}-{e}"), "namespace": format!("ns-{}", i % 50)}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-abcde"), "namespace": format!("ns-{}", i % 50), "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": endpoints})
}

struct Kind {
    name: &'static str,
    resource: ResourceRef,
    index: &'static [&'static str],
    make: fn(usize) -> serde_json::Value,
}

fn main() {
    let count: usize = std::env::var("BENCH_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let extra: usize = count / 5;
    let kinds = [
        Kind {
            name: "ingresses",
            resource: ResourceRef::new("networking.k8s.io/v1", "ingresses", true),
            index: &["metadata.namespace", "metadata.name"],
            make: ingress,
        },
        Kind {
            name: "services",
            resource: ResourceRef::new("v1", "services", true),
            index: &["metadata.namespace", "metadata.name"],
            make: service,
        },
        Kind {
            name: "endpointslices",
            resource: ResourceRef::new("discovery.k8s.io/v1", "endpointslices", true),
            index: &[
                "metadata.namespace",
                "metadata.labels['kubernetes.io/service-name']",
            ],
            make: slice,
        },
    ];

    // Seed through --load so setup time is not part of the measurement.
    let seed = support::TempDir::new("bench-seed");
    let mut raw_json_bytes = 0usize;
    let mut namespaces = String::new();
    for n in 0..50 {
        namespaces.push_str(&format!(
            "---\napiVersion: v1\nkind: Namespace\nmetadata: {{name: ns-{n}}}\n"
        ));
    }
    std::fs::write(seed.0.join("00-namespaces.yaml"), namespaces).unwrap();
    for kind in &kinds {
        let mut text = String::from("{\"apiVersion\": \"v1\", \"kind\": \"List\", \"items\": [");
        for i in 0..count {
            let object = serde_json::to_string(&(kind.make)(i)).unwrap();
            raw_json_bytes += object.len();
            if i > 0 {
                text.push(',');
            }
            text.push_str(&object);
        }
        text.push_str("]}");
        std::fs::write(seed.0.join(format!("{}.json", kind.name)), text).unwrap();
    }
    let server =
        support::DevApiServer::start(&["--load", seed.0.to_str().unwrap(), "--history", "1000000"]);
    let client =
        Client::new(&KubeConfig::from_kubeconfig(&server.kubeconfig(), None).unwrap()).unwrap();

    let rss_before = rss_kb();
    let heap_before = heap_kb();
    let started = Instant::now();
    let (tx, _rx) = crossbeam_channel::unbounded();
    let stop = Arc::new(AtomicBool::new(false));
    let mut stores = Vec::new();
    let mut synced = Vec::new();
    for kind in &kinds {
        let store: SharedStore = Arc::new(RwLock::new(Arc::new(Store::new(
            kind.index
                .iter()
                .map(|e| PathExpr::parse(e).unwrap())
                .collect(),
        ))));
        let flag = Arc::new(AtomicBool::new(false));
        let reflector = Reflector {
            name: kind.name.into(),
            client: client.clone(),
            resource: kind.resource.clone(),
            namespace: None,
            params: ListParams {
                limit: Some(500),
                ..Default::default()
            },
            filter: ObjectFilter {
                ignore_fields: vec![PathExpr::parse("metadata.managedFields").unwrap()],
                field_selector: None,
            },
            store: store.clone(),
            synced: flag.clone(),
            stop: stop.clone(),
            events: tx.clone(),
            watch_timeout: Duration::from_secs(300),
        };
        std::thread::spawn(move || reflector.run());
        stores.push(store);
        synced.push(flag);
    }
    support::wait_for("initial sync", Duration::from_secs(600), || {
        synced.iter().all(|f| f.load(Ordering::SeqCst))
    });
    let list_time = started.elapsed();
    let total: usize = stores.iter().map(|s| snapshot(s).len()).sum();
    let rss_after = rss_kb();
    let store_heap_kb = heap_kb().saturating_sub(heap_before);

    // Watch ingest: hold events back, create objects, release them as one burst.
    server.faults(&json!({"pause": ["ingresses.networking.k8s.io", "services", "endpointslices.discovery.k8s.io"]}));
    std::thread::scope(|scope| {
        for kind in &kinds {
            let client = client.clone();
            scope.spawn(move || {
                for i in count..count + extra {
                    let object = (kind.make)(i);
                    let ns = object["metadata"]["namespace"]
                        .as_str()
                        .unwrap()
                        .to_string();
                    client.create(&kind.resource, Some(&ns), &object).unwrap();
                }
            });
        }
    });
    let released = Instant::now();
    server.faults(&json!({"resume": ["ingresses.networking.k8s.io", "services", "endpointslices.discovery.k8s.io"]}));
    support::wait_for("watch burst ingested", Duration::from_secs(600), || {
        stores.iter().map(|s| snapshot(s).len()).sum::<usize>() == total + 3 * extra
    });
    let watch_time = released.elapsed();
    stop.store(true, Ordering::SeqCst);

    let store_kb = rss_after.saturating_sub(rss_before);
    // For scale: the same objects parsed into plain serde_json values on one thread.
    let before = rss_kb();
    let plain: Vec<serde_json::Value> = kinds
        .iter()
        .flat_map(|k| (0..count + extra).map(k.make))
        .collect();
    let plain_kb = rss_kb().saturating_sub(before);
    drop(plain);
    // What the stores hold: the compact documents' own bytes, and the same objects compacted
    // on one thread (RSS).
    let doc_bytes: usize = stores
        .iter()
        .flat_map(|s| {
            snapshot(s)
                .list()
                .map(|d| d.heap_bytes())
                .collect::<Vec<_>>()
        })
        .sum();
    // The objects as the API server serves them (with the metadata it adds) are larger than
    // the ones the benchmark wrote: their JSON as stored, for comparison.
    let served_json_bytes: usize = stores
        .iter()
        .flat_map(|s| {
            snapshot(s)
                .list()
                .map(|d| serde_json::to_vec(&**d).map_or(0, |v| v.len()))
                .collect::<Vec<_>>()
        })
        .sum();
    let before = rss_kb();
    let compact: Vec<Doc> = kinds
        .iter()
        .flat_map(|k| (0..count + extra).map(k.make))
        .map(|v| Doc::from_value(&v).unwrap())
        .collect();
    let compact_kb = rss_kb().saturating_sub(before);
    // And what indexing them in a store adds.
    let before = rss_kb();
    let mut indexed = Store::new(vec![
        PathExpr::parse("metadata.namespace").unwrap(),
        PathExpr::parse("metadata.name").unwrap(),
    ]);
    for d in compact {
        indexed.upsert(Arc::new(d)).unwrap();
    }
    let index_kb = rss_kb().saturating_sub(before);
    drop(indexed);
    println!(
        "watch-ingest objects={total} list_sync_s={:.2} list_objects_per_s={:.0} watch_events={} watch_s={:.2} watch_events_per_s={:.0} store_rss_kb={store_kb} raw_json_kb={} ratio={:.2} plain_values_kb={plain_kb} compact_docs_kb={compact_kb} index_kb={index_kb} doc_heap_kb={} served_json_kb={} store_heap_kb={store_heap_kb}",
        list_time.as_secs_f64(),
        total as f64 / list_time.as_secs_f64(),
        3 * extra,
        watch_time.as_secs_f64(),
        (3 * extra) as f64 / watch_time.as_secs_f64(),
        raw_json_bytes / 1024,
        store_kb as f64 / (raw_json_bytes as f64 / 1024.0),
        doc_bytes / 1024,
        served_json_bytes / 1024
    );
}
