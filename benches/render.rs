//! Render benchmark through the six shipped libraries (the configuration the chart installs):
//! N Ingresses, each with its own Service and an EndpointSlice of three endpoints
//! (`scripts/bench-objects.py`). Prints, per N, the full render, a re-render with nothing
//! changed, one EndpointSlice change, one new Ingress, and — the floor, in the same run —
//! `haproxy -c` on the same output and the raw JSON size of the objects. Given two sizes, it
//! then measures the growth from one to the other in pairs of neighbouring renders
//! (`render-growth`), which the machine's other load moves far less than the ratio of the two
//! medians.
//!
//!     cargo bench --bench render -- 1000 10000

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use haptic::render::current_config::CurrentConfig;
use haptic::render::{Engine, RenderCache, RenderInputs};
use haptic::store::{Doc, Store};
use haptic::validate::fixtures::load_fixture_stores;
use serde_json::{json, Value};

#[path = "../tests/support/libraries.rs"]
mod libraries;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The median of `runs` timings of `f`.
fn median(runs: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let mut times: Vec<Duration> = (0..runs).map(|_| f()).collect();
    times.sort();
    times[times.len() / 2]
}

/// The median of timings of `f` taken for at least `budget` and at least `runs` times (an odd
/// number): on a shared machine one run in several is slowed by others, and the growth from
/// 1,000 to 10,000 divides two medians, so each rests on as many runs as the budget allows.
fn median_over(budget: Duration, runs: usize, mut f: impl FnMut() -> Duration) -> Duration {
    let started = Instant::now();
    let mut times = Vec::new();
    while times.len() < runs || started.elapsed() < budget || times.len() % 2 == 0 {
        times.push(f());
        if std::env::var_os("HAPTIC_BENCH_TIMES").is_some() {
            eprintln!(
                "run {} {:.1} ms",
                times.len(),
                times[times.len() - 1].as_secs_f64() * 1e3
            );
        }
    }
    times.sort();
    times[times.len() / 2]
}

fn main() {
    // RUST_LOG=debug prints per-template and per-unit-template timings of every render.
    if let Some(level) = std::env::var("RUST_LOG")
        .ok()
        .and_then(|l| haptic::logger::parse_level(&l))
    {
        haptic::logger::init(level);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::env::set_current_dir(root).expect("repository root");
    let sizes: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let sizes = if sizes.is_empty() {
        vec![1000, 10000]
    } else {
        sizes
    };
    // HAPTIC_BENCH_LIBRARIES=a.yaml,b.yaml renders through other fragments (to find where time goes).
    let fragments: Vec<String> = match std::env::var("HAPTIC_BENCH_LIBRARIES") {
        Ok(list) => list.split(',').map(str::to_string).collect(),
        Err(_) => libraries::LIBRARIES.iter().map(|s| s.to_string()).collect(),
    };
    let spec = libraries::spec_of(&fragments);
    let engine = Engine::new(&spec).expect("the libraries compile");
    let work = std::env::temp_dir().join(format!("haptic-bench-render-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("work dir");
    // Every size's stores, kept for the paired growth measurement after the loop.
    let mut worlds: Vec<(usize, BTreeMap<String, Arc<Store>>)> = Vec::new();
    for &n in &sizes {
        let objects = work.join(format!("objects-{n}.yaml"));
        let status = Command::new("python3")
            .arg("scripts/bench-objects.py")
            .arg(n.to_string())
            .stdout(std::fs::File::create(&objects).expect("objects file"))
            .status()
            .expect("python3");
        assert!(status.success(), "bench-objects.py failed");
        let loaded =
            load_fixture_stores(&spec, &[objects.display().to_string()]).expect("fixtures");
        let (stores, skipped) = (loaded.stores, loaded.skipped);
        assert!(skipped.is_empty(), "{skipped:?}");
        let raw_json: usize = stores
            .values()
            .flat_map(|s| s.list())
            .map(|o| serde_json::to_vec(&**o).map(|v| v.len()).unwrap_or(0))
            .sum();
        let inputs = |stores: BTreeMap<String, Arc<Store>>| RenderInputs {
            stores,
            extra_context: spec.templating_settings.extra_context.clone(),
            current_config: None,
            base_dir: None,
        };

        // HAPTIC_BENCH_PROFILE=N: only N renders that replay (an Ingress added and removed in
        // turn, so every top level runs again), for a profiler; then stop.
        if let Some(runs) = std::env::var("HAPTIC_BENCH_PROFILE")
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
        {
            let mut cache = RenderCache::new();
            let extra = Arc::new(Doc::from_value(
                &json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                "metadata": {"name": "profile-extra", "namespace": "ns0", "creationTimestamp": "2025-01-01T00:00:00Z"},
                "spec": {"ingressClassName": "haproxy", "rules": [{"host": "extra.example.com",
                    "http": {"paths": [{"path": "/", "pathType": "Prefix",
                        "backend": {"service": {"name": "svc0", "port": {"number": 80}}}}]}}]}}),
            ).expect("doc"));
            for run in 0..=runs {
                let mut changed = stores.clone();
                if run % 2 == 1 {
                    let mut ingresses = (*stores["ingresses"]).clone();
                    ingresses.upsert(extra.clone()).expect("upsert");
                    changed.insert("ingresses".into(), Arc::new(ingresses));
                }
                engine
                    .render_cached(&inputs(changed), &mut cache)
                    .expect("render");
            }
            let _ = std::fs::remove_dir_all(&work);
            return;
        }
        // A full render as the reconciler's first one: into a new cache that it keeps. The
        // time is until the result is the caller's; what the caller keeps is freed untimed.
        let full_render = || {
            let mut cache = RenderCache::new();
            let started = Instant::now();
            let rendered = engine
                .render_cached(&inputs(stores.clone()), &mut cache)
                .expect("render");
            let took = started.elapsed();
            drop((rendered, cache));
            took
        };
        // HAPTIC_BENCH_PROFILE_FULL=N: only N of those full renders, for a profiler; then stop.
        if let Some(runs) = std::env::var("HAPTIC_BENCH_PROFILE_FULL")
            .ok()
            .and_then(|n| n.parse::<usize>().ok())
        {
            for _ in 0..runs {
                full_render();
            }
            let _ = std::fs::remove_dir_all(&work);
            return;
        }
        let full = median_over(Duration::from_secs(3), 5, full_render);
        let mut cache = RenderCache::new();
        let rendered = engine
            .render_cached(&inputs(stores.clone()), &mut cache)
            .expect("render");
        let units = cache.stats.rendered;

        let unchanged = median(5, || {
            let started = Instant::now();
            engine
                .render_cached(&inputs(stores.clone()), &mut cache)
                .expect("render");
            started.elapsed()
        });

        // One EndpointSlice changes (an endpoint becomes not ready), alternating so every run
        // is a real change. The store evolves as the controller's does: each version derives
        // from the last.
        let mut endpoints = stores["endpoints"].clone();
        let first = endpoints.list().next().expect("a slice").clone();
        let mut flipped = first.to_value();
        flipped["endpoints"][0]["conditions"]["ready"] = json!(false);
        let variants = [first, Arc::new(Doc::from_value(&flipped).expect("doc"))];
        let mut i = 0;
        let mut rendered_units = 0;
        let endpoint_change = median(9, || {
            i += 1;
            let mut store = (*endpoints).clone();
            store.upsert(variants[i % 2].clone()).expect("upsert");
            endpoints = Arc::new(store);
            let mut changed = stores.clone();
            changed.insert("endpoints".into(), endpoints.clone());
            let started = Instant::now();
            engine
                .render_cached(&inputs(changed), &mut cache)
                .expect("render");
            let took = started.elapsed();
            rendered_units = cache.stats.rendered;
            took
        });

        // What the reconciler does with a runtime change after the render, each over the whole
        // configuration: the bundle, its hash, the classification against the last bundle, and
        // the parse of the new config as the next render's current_config.
        let with = |variant: &Arc<Doc>| {
            let mut store = (*endpoints).clone();
            store.upsert(variant.clone()).expect("upsert");
            let mut changed = stores.clone();
            changed.insert("endpoints".into(), Arc::new(store));
            changed
        };
        let old_bundle = engine
            .render_cached(&inputs(with(&variants[0])), &mut cache)
            .expect("render")
            .to_bundle();
        let new_rendered = engine
            .render_cached(&inputs(with(&variants[1])), &mut cache)
            .expect("render");
        assert_ne!(
            old_bundle.haproxy_cfg, new_rendered.haproxy_cfg,
            "the two renders differ by one endpoint"
        );
        let timed = |f: &mut dyn FnMut()| {
            median(5, || {
                let started = Instant::now();
                f();
                started.elapsed()
            })
        };
        let mut new_bundle = None;
        let to_bundle = timed(&mut || new_bundle = Some(new_rendered.to_bundle()));
        let new_bundle = new_bundle.expect("bundle");
        let hash = timed(&mut || {
            std::hint::black_box(new_bundle.hash());
        });
        let classify = timed(&mut || {
            std::hint::black_box(haptic_agent::classify::classify(&old_bundle, &new_bundle));
        });
        let parse = timed(&mut || {
            std::hint::black_box(CurrentConfig::parse(&new_bundle.haproxy_cfg));
        });
        let previous = CurrentConfig::parse(&old_bundle.haproxy_cfg);
        let update = timed(&mut || {
            std::hint::black_box(previous.update(&old_bundle.haproxy_cfg, &new_bundle.haproxy_cfg));
        });
        println!(
            "render-reconcile n={n} config_bytes={} to_bundle_ms={:.1} hash_ms={:.1} classify_ms={:.1} current_config_parse_ms={:.1} current_config_update_ms={:.1}",
            new_bundle.haproxy_cfg.len(),
            ms(to_bundle),
            ms(hash),
            ms(classify),
            ms(parse),
            ms(update)
        );

        // One new Ingress (a new route and backend), added and removed in turn.
        let ingresses = stores["ingresses"].clone();
        let new_ingress: Value = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
            "metadata": {"name": "bench-new", "namespace": "ns0", "creationTimestamp": "2025-01-01T00:00:00Z"},
            "spec": {"ingressClassName": "haproxy", "rules": [{"host": "new.example.com",
                "http": {"paths": [{"path": "/", "pathType": "Prefix",
                    "backend": {"service": {"name": "svc0", "port": {"number": 80}}}}]}}]}});
        let new_ingress = Arc::new(Doc::from_value(&new_ingress).expect("doc"));
        let mut j = 0;
        let new_route = median(9, || {
            j += 1;
            let mut store = (*ingresses).clone();
            if j % 2 == 1 {
                store.upsert(new_ingress.clone()).expect("upsert");
            }
            let mut changed = stores.clone();
            changed.insert("ingresses".into(), Arc::new(store));
            let started = Instant::now();
            engine
                .render_cached(&inputs(changed), &mut cache)
                .expect("render");
            started.elapsed()
        });

        // The classification of that reload-class change (a backend section added, maps
        // changed), as the controller and every agent make it.
        let without = engine
            .render_cached(&inputs(stores.clone()), &mut cache)
            .expect("render")
            .to_bundle();
        let with_new = {
            let mut store = (*ingresses).clone();
            store.upsert(new_ingress.clone()).expect("upsert");
            let mut changed = stores.clone();
            changed.insert("ingresses".into(), Arc::new(store));
            engine
                .render_cached(&inputs(changed), &mut cache)
                .expect("render")
                .to_bundle()
        };
        let classify_reload = timed(&mut || {
            std::hint::black_box(haptic_agent::classify::classify(&without, &with_new));
        });
        println!(
            "render-reconcile-reload n={n} classify_new_ingress_ms={:.1}",
            ms(classify_reload)
        );

        // The floor: haproxy -c on the same output.
        let bundle = rendered.to_bundle();
        let check = median(3, || {
            let started = Instant::now();
            haptic::validate::haproxy::check_bundle("haproxy", &bundle).expect("valid output");
            started.elapsed()
        });
        println!(
            "render-libraries n={n} objects={} raw_json_bytes={raw_json} config_bytes={} units={units} \
             full_ms={:.1} unchanged_ms={:.1} endpoint_change_ms={:.1} (units_rendered={rendered_units}) \
             new_ingress_ms={:.1} haproxy_check_ms={:.1}",
            stores.values().map(|s| s.len()).sum::<usize>(),
            bundle.haproxy_cfg.len(),
            ms(full),
            ms(unchanged),
            ms(endpoint_change),
            ms(new_route),
            ms(check),
        );
        worlds.push((n, stores));
    }
    if let [(small, small_stores), (large, large_stores)] = &worlds[..] {
        let mut sorted = paired_growths(
            Duration::from_secs(20),
            9,
            || full_render_of(&engine, &spec, small_stores),
            || full_render_of(&engine, &spec, large_stores),
        );
        sorted.sort_by(f64::total_cmp);
        println!(
            "render-growth small={small} large={large} pairs={} paired_growth={:.2} lowest={:.2} highest={:.2}",
            sorted.len(),
            sorted[sorted.len() / 2],
            sorted[0],
            sorted[sorted.len() - 1],
        );
    }
    let _ = std::fs::remove_dir_all(&work);
}

/// One full render of `stores` into a new cache, timed as the benchmark's full render is.
fn full_render_of(
    engine: &Engine,
    spec: &haptic::config::Spec,
    stores: &BTreeMap<String, Arc<Store>>,
) -> Duration {
    let mut cache = RenderCache::new();
    let inputs = RenderInputs {
        stores: stores.clone(),
        extra_context: spec.templating_settings.extra_context.clone(),
        current_config: None,
        base_dir: None,
    };
    let started = Instant::now();
    let rendered = engine.render_cached(&inputs, &mut cache).expect("render");
    let took = started.elapsed();
    drop((rendered, cache));
    took
}

/// The growth from the small render to the large one, measured in pairs: small and large
/// renders alternate, and each large render is divided by the mean of the small ones just
/// before and after it. On a machine shared with others, the load changes over seconds and
/// a ratio of two medians taken a minute apart moves with it (8.3× to 14.3× for the same
/// binaries in one hour); a ratio of neighbours sees the same load on both sides. Each timed
/// render follows an untimed one of the same size, so it finds the caches as the medians'
/// repeated renders do, not emptied by the other size. At least `pairs` ratios, and as many
/// as `budget` allows (an odd number).
fn paired_growths(
    budget: Duration,
    pairs: usize,
    mut small: impl FnMut() -> Duration,
    mut large: impl FnMut() -> Duration,
) -> Vec<f64> {
    let mut warm_small = || {
        small();
        small()
    };
    let started = Instant::now();
    let mut growths = Vec::new();
    let mut before = warm_small();
    while growths.len() < pairs || started.elapsed() < budget || growths.len() % 2 == 0 {
        large();
        let big = large();
        let after = warm_small();
        growths.push(big.as_secs_f64() / ((before + after).as_secs_f64() / 2.0));
        before = after;
    }
    growths
}
