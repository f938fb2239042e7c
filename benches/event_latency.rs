//! Event-to-traffic latency (run by `scripts/bench.sh latency [N…]`): with N Ingresses loaded
//! (`BENCH_INGRESSES`, default 1,000), the time from an API write to a request through HAProxy
//! reaching the new endpoint — for EndpointSlice changes (runtime class, no reload) and for new
//! routes (reload class) — first with a warm standby controller running beside the leader, then
//! with the standby stopped (on this 2-core machine the standby shares the leader's cores, which
//! a cluster would not do). Then a burst: 1,000 EndpointSlice updates sent within about a
//! second, with the time until they are all served, and the renders and reloads they cost.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use haptic::kube::client::ResourceRef;
use serde_json::json;
use support::cluster::{Backend, Cluster, NS};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "latency {what} n={} p50_ms={:.0} p95_ms={:.0} max_ms={:.0}",
        samples.len(),
        percentile(&samples, 0.5).as_secs_f64() * 1000.0,
        percentile(&samples, 0.95).as_secs_f64() * 1000.0,
        samples.last().unwrap().as_secs_f64() * 1000.0
    );
}

fn wait(c: &Cluster, host: &str, body: &str) -> Duration {
    let started = Instant::now();
    loop {
        if (0..c.pods.len()).all(|n| {
            c.request(n, host, "/")
                .is_some_and(|(s, b)| s == 200 && b.contains(body))
        }) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{host} never answered {body}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn main() {
    let ingresses: usize = std::env::var("BENCH_INGRESSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let changes: usize = std::env::var("BENCH_CHANGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    // Every loaded Service starts at backend z: a request answers at once, before and after a
    // change (a closed port would make HAProxy retry for seconds and hide the latency).
    let z = Backend::start("z");
    let seed = support::TempDir::new("latency-seed");
    let mut items = Vec::new();
    for i in 0..ingresses {
        items.push(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("svc-{i}"), "namespace": NS}, "spec": {"ports": [{"name": "http", "port": 80}]}}));
        items.push(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": format!("svc-{i}-0"), "namespace": NS, "labels": {"kubernetes.io/service-name": format!("svc-{i}")}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": z.port, "protocol": "TCP"}], "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": true}}]}));
        items.push(json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": format!("ing-{i}"), "namespace": NS},
            "spec": {"ingressClassName": "haproxy", "rules": [{"host": format!("h{i}.example.com"), "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": format!("svc-{i}"), "port": {"number": 80}}}}]}}]}}));
    }
    std::fs::write(
        seed.0.join("objects.json"),
        json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
    )
    .unwrap();
    let mut c = Cluster::start(&["--load", seed.0.to_str().unwrap(), "--history", "1000000"]);
    c.apply_config(&c.config_object(""));
    c.add_pod();
    c.add_pod();
    c.start_controller("ctrl-a");
    c.start_controller("ctrl-b");
    let (a, b) = (Backend::start("a"), Backend::start("b"));
    c.create_service("web", &[&a]);
    let ing = |name: &str, host: &str, svc: &str| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name, "namespace": NS},
            "spec": {"ingressClassName": "haproxy", "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": {"service": {"name": svc, "port": {"number": 80}}}}]}}]}})
    };
    let ingress_res = ResourceRef::new("networking.k8s.io/v1", "ingresses", true);
    c.client
        .create(
            &ingress_res,
            Some(NS),
            &ing("web", "web.example.com", "web"),
        )
        .unwrap();
    let warmup = Instant::now();
    wait(&c, "web.example.com", "a");
    let first_route = warmup.elapsed();
    // Resident memory of each controller with everything loaded and rendered (the scrape's
    // process_resident_memory_bytes).
    std::thread::sleep(Duration::from_secs(1));
    let rss: Vec<f64> = (0..c.controllers.len())
        .map(|i| sample(&metrics(&c, i), "process_resident_memory_bytes ") / 1048576.0)
        .collect();
    let leader_rss = c
        .leader_index()
        .and_then(|i| rss.get(i).copied())
        .unwrap_or(f64::NAN);
    println!(
        "latency setup ingresses={ingresses} first_route_s={:.1} leader_rss_mib={leader_rss:.1} controllers_rss_mib={rss:.1?}",
        first_route.as_secs_f64()
    );

    let slices = ResourceRef::new("discovery.k8s.io/v1", "endpointslices", true);
    let leader = c.leader_index().expect("a leader");
    let leader_name = c.controllers[leader].name.clone();
    // Each sample is an isolated change: it starts after the previous one has settled for
    // longer than the config's debounceInterval (50 ms) or, for reloads, its
    // minDeploymentInterval (500 ms), which would otherwise hold it back on purpose (the
    // burst below measures back-to-back changes).
    let (runtime_gap, reload_gap) = (Duration::from_millis(100), Duration::from_millis(600));
    let phase = |standby: &str, c: &Cluster, offset: usize| {
        let log_start = c.controller_log(&leader_name).len();
        // Runtime class: move the endpoint between two backends with one EndpointSlice update.
        let mut runtime = Vec::new();
        for i in 0..changes {
            let (target, name) = if i % 2 == 0 { (&b, "b") } else { (&a, "a") };
            std::thread::sleep(runtime_gap);
            let started = Instant::now();
            let patch =
                json!({"ports": [{"name": "http", "port": target.port, "protocol": "TCP"}]});
            c.client
                .merge_patch(&slices, Some(NS), "web-slice-0", &patch)
                .unwrap();
            wait(c, "web.example.com", name);
            runtime.push(started.elapsed());
            if std::env::var_os("BENCH_PHASE_LOG").is_some() {
                println!(
                    "{} served after {:?}",
                    haptic_agent::time::now_rfc3339_millis(),
                    started.elapsed()
                );
            }
        }
        report(
            &format!("endpointslice_change (runtime) ingresses={ingresses} standby={standby}"),
            runtime,
        );
        let log = c.controller_log(&leader_name);
        breakdown(&format!("runtime standby={standby}"), &log[log_start..]);
        if std::env::var_os("BENCH_PHASE_LOG").is_some() {
            // Every controller's whole log: what the leader and the standby did before the
            // phase shows in its first samples.
            for ctrl in &c.controllers {
                println!(
                    "--- log of {} ---\n{}",
                    ctrl.name,
                    c.controller_log(&ctrl.name)
                );
            }
        }
        let log_start = log.len();
        // The leader's render (with its checks) and check histograms around the reload phase:
        // how a reload's reconcile splits between the render and `haproxy -c`.
        let steps = |c: &Cluster| {
            let text = metrics(c, leader);
            [
                "haptic_render_duration_seconds_sum ",
                "haptic_render_duration_seconds_count ",
                "haptic_validation_duration_seconds_sum ",
                "haptic_validation_duration_seconds_count ",
            ]
            .map(|prefix| sample(&text, prefix))
        };
        let steps_before = steps(c);
        // Reload class: a new Ingress for a new Service adds a backend.
        let mut reload = Vec::new();
        for i in offset..offset + changes.min(30) {
            let svc = format!("new-{i}");
            c.create_service(&svc, &[&a]);
            std::thread::sleep(reload_gap);
            let started = Instant::now();
            c.client
                .create(
                    &ingress_res,
                    Some(NS),
                    &ing(&svc, &format!("{svc}.example.com"), &svc),
                )
                .unwrap();
            wait(c, &format!("{svc}.example.com"), "a");
            reload.push(started.elapsed());
        }
        report(
            &format!("new_route (reload) ingresses={ingresses} standby={standby}"),
            reload,
        );
        breakdown(
            &format!("reload standby={standby}"),
            &c.controller_log(&leader_name)[log_start..],
        );
        let steps_after = steps(c);
        let d: Vec<f64> = (0..4).map(|i| steps_after[i] - steps_before[i]).collect();
        let mean_ms = |sum: f64, n: f64| if n > 0.0 { sum / n * 1000.0 } else { f64::NAN };
        println!(
            "latency steps reload standby={standby} renders={} checks={} render_with_checks_mean_ms={:.0} check_mean_ms={:.0} render_only_mean_ms={:.0}",
            d[1],
            d[3],
            mean_ms(d[0], d[1]),
            mean_ms(d[2], d[3]),
            mean_ms(d[0] - d[2], d[1])
        );
        if std::env::var_os("BENCH_PHASE_LOG").is_some() {
            println!(
                "--- leader log of the reload phase ---\n{}",
                &c.controller_log(&leader_name)[log_start..]
            );
        }
    };
    // Warm-up. Once the first configuration is out, the status writer reports every Ingress's
    // address; its writes come back as watch events, and the render after each batch of them
    // is a full one (the top level lists every Ingress, and each Ingress whose object changed
    // renders again). Changes made meanwhile are measured here, in pairs (the endpoint moves
    // to b and back), until the leader splices again; the phases below measure the settled
    // controller.
    let warm_started = Instant::now();
    let mut warm = Vec::new();
    loop {
        let log_start = c.controller_log(&leader_name).len();
        for (target, name) in [(&b, "b"), (&a, "a")] {
            std::thread::sleep(runtime_gap);
            let started = Instant::now();
            let patch =
                json!({"ports": [{"name": "http", "port": target.port, "protocol": "TCP"}]});
            c.client
                .merge_patch(&slices, Some(NS), "web-slice-0", &patch)
                .unwrap();
            wait(&c, "web.example.com", name);
            warm.push(started.elapsed());
        }
        let log = c.controller_log(&leader_name);
        let spliced = log[log_start..]
            .lines()
            .filter(|l| l.contains(" rendered class="))
            .all(|l| l.contains(" spliced) in "));
        if spliced || warm_started.elapsed() > Duration::from_secs(120) {
            break;
        }
    }
    report(
        &format!(
            "warmup (status writes after the first configuration) ingresses={ingresses} until_spliced_s={:.1}",
            warm_started.elapsed().as_secs_f64()
        ),
        warm,
    );
    phase("running", &c, 0);

    // The burst: the EndpointSlices of up to 1,000 Services move from backend z to backend a,
    // sent by four writers at once.
    let counters = |c: &Cluster| {
        let text = metrics(c, leader);
        (
            sample(&text, "haptic_reconciliation_total ") as u64,
            sample(&text, "haptic_deployment_total{result=\"reload\"} ") as u64,
        )
    };
    let burst = ingresses.min(1000);
    // The phase's last new route is served by both pods before the leader has counted the
    // pushes that carried it (a pod serves once its reload is done; the push is counted when
    // the agent's answer is in): start from counters that have stopped moving, or the burst
    // would count that route's reloads as its own.
    let (renders_before, reloads_before) = settled_counters(|| counters(&c));
    let burst_log_start = c.controller_log(&leader_name).len();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for w in 0..4 {
            let (client, slices) = (c.client.clone(), &slices);
            let port = a.port;
            scope.spawn(move || {
                for i in (w..burst).step_by(4) {
                    let patch =
                        json!({"ports": [{"name": "http", "port": port, "protocol": "TCP"}]});
                    client
                        .merge_patch(slices, Some(NS), &format!("svc-{i}-0"), &patch)
                        .unwrap();
                }
            });
        }
    });
    let sent = started.elapsed();
    // Bundles are cumulative: once the last Services answer, every earlier change is served.
    let mut last = vec![0, burst / 2];
    last.extend(burst.saturating_sub(4)..burst);
    last.sort_unstable();
    last.dedup();
    for i in last {
        wait(&c, &format!("h{i}.example.com"), "a");
    }
    let settled = started.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let (renders_after, reloads_after) = counters(&c);
    println!(
        "latency burst ingresses={ingresses} updates={burst} sent_ms={:.0} settled_ms={:.0} renders={} reload_pushes={} pods={}",
        sent.as_secs_f64() * 1000.0,
        settled.as_secs_f64() * 1000.0,
        renders_after - renders_before,
        reloads_after - reloads_before,
        c.pods.len()
    );
    breakdown("burst", &c.controller_log(&leader_name)[burst_log_start..]);
    if std::env::var_os("BENCH_BURST_LOG").is_some() {
        println!("{}", &c.controller_log(&leader_name)[burst_log_start..]);
    }

    // Without the standby.
    let standby = 1 - leader;
    c.controllers[standby].kill();
    phase("stopped", &c, 100);
}

/// Where the time goes, from the leader's log: the reconciliation (render, and `haproxy -c` for
/// reload-class bundles) and the push to the pods (first push to last answer), medians over the phase; and the
/// controller's own change-to-deployed figure (first change seen → applied on every pod).
fn breakdown(what: &str, log: &str) {
    let ms_after = |line: &str, key: &str| -> Option<f64> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let median = |mut v: Vec<f64>| -> f64 {
        if v.is_empty() {
            return f64::NAN;
        }
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut reconcile, mut push, mut deployed) = (Vec::new(), Vec::new(), Vec::new());
    for line in log.lines() {
        if line.contains(" rendered class=") {
            reconcile.extend(ms_after(line, " in "));
        } else if line.contains(" applied to ") {
            push.extend(ms_after(line, " pods in "));
            deployed.extend(ms_after(line, "change to deployed "));
        }
    }
    println!(
        "latency breakdown {what} renders={} reconcile_p50_ms={:.0} push_p50_ms={:.0} change_to_deployed_p50_ms={:.0}",
        reconcile.len(),
        median(reconcile),
        median(push),
        median(deployed)
    );
}

/// `read()` once it has answered the same for a second (longer than the config's
/// `minDeploymentInterval`, 500 ms, so a held-back reload would have gone out); the last
/// answer after 60 s.
fn settled_counters<T: PartialEq>(read: impl Fn() -> T) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = read();
    let mut since = Instant::now();
    while since.elapsed() < Duration::from_secs(1) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        let now = read();
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

/// The `/metrics` text of controller `i` (empty when it does not answer).
fn metrics(c: &Cluster, i: usize) -> String {
    let ctrl = &c.controllers[i];
    ctrl.get(ctrl.metrics_port, "/metrics")
        .map(|(_, t)| t)
        .unwrap_or_default()
}

/// The value of the sample line starting with `prefix` in Prometheus text (0 when absent).
fn sample(text: &str, prefix: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0)
}
