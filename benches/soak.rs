//! Soak benchmark (`scripts/bench.sh soak`): steady load through both HAProxy pods (short
//! requests and 1.5 s long ones) while, one phase after another, endpoints roll, routes come and
//! go (reloads), the leader is killed and later SIGTERMed, an agent restarts, the API server
//! drops watches, answers 503s and compacts its history, one HAProxy process restarts, and one
//! HAProxy pod is removed the way Kubernetes removes it (drained).
//!
//! Prints `soak requests=N failed=M …`, where M counts failed requests in every phase HAProxy
//! can make seamless, then one line per phase (requests, failures, convergence time: from the
//! change to both pods serving it). A request counts in the phase during which it completes.
//! The HAProxy process restart must cost requests on its pod (nothing listens for a moment, and
//! connections in flight die with the process) until the restarted process first answers:
//! those are reported on their own (`failed_in_restart_phase`), outside M; a failure on the
//! other pod in that window, and any failure after it, counts in M.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use haptic::kube::client::ResourceRef;
use serde_json::json;
use support::cluster::{http_get, pods_resource, Backend, Cluster, NS};

/// The phases, in order, and whether HAProxy can keep them free of failed requests.
const PHASES: [(&str, bool); 10] = [
    ("steady", true),
    ("endpoint-roll", true),
    ("routes", true),
    ("leader-kill", true),
    ("leader-sigterm", true),
    ("agent-restart", true),
    ("apiserver-faults", true),
    // From the kill to the restarted pod's first good answer: requests on it must fail.
    ("haproxy-restart", false),
    // From that answer on: it must serve like before, with the latest endpoints.
    ("haproxy-restarted", true),
    ("pod-drain", true),
];

/// How long a terminating endpoint keeps serving before its backend stops.
const GRACE: Duration = Duration::from_secs(2);
/// The pod's preStop delay, and when the stand-in Service stops sending it new connections.
const PRE_STOP: Duration = Duration::from_secs(3);
const ENDPOINTS_WITHDRAWN: Duration = Duration::from_secs(1);
const LONG_MS: u64 = 1500;

/// Requests of one phase: counted in the phase during which they completed (an event that
/// breaks requests breaks those in flight when it happens).
#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    failed: AtomicU64,
    /// Failures on pod 1, the pod whose HAProxy the costly phase restarts.
    failed_on_pod1: AtomicU64,
    examples: Mutex<Vec<String>>,
}

/// The load: each worker sends requests to the pods the stand-in Service lists, round robin.
struct Load {
    started: Instant,
    stop: Arc<AtomicBool>,
    phase: Arc<AtomicUsize>,
    tallies: Arc<Vec<Tally>>,
    /// Pod indices receiving new connections (a Service's ready endpoints).
    routing: Arc<RwLock<Vec<usize>>>,
    /// Long requests in flight, per pod.
    in_flight: Arc<Vec<AtomicUsize>>,
    workers: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(ips: Vec<String>, port: u16, short: usize, long: usize) -> Load {
        let load = Load {
            started: Instant::now(),
            stop: Arc::default(),
            phase: Arc::default(),
            tallies: Arc::new(PHASES.iter().map(|_| Tally::default()).collect()),
            routing: Arc::new(RwLock::new((0..ips.len()).collect())),
            in_flight: Arc::new(ips.iter().map(|_| AtomicUsize::new(0)).collect()),
            workers: Vec::new(),
        };
        let mut workers = Vec::new();
        for w in 0..short + long {
            let (stop, phase, tallies) =
                (load.stop.clone(), load.phase.clone(), load.tallies.clone());
            let (routing, in_flight, ips) =
                (load.routing.clone(), load.in_flight.clone(), ips.clone());
            let is_long = w >= short;
            let t0 = load.started;
            workers.push(std::thread::spawn(move || {
                let mut turn = w;
                while !stop.load(Ordering::Relaxed) {
                    let pods = routing.read().unwrap().clone();
                    if pods.is_empty() {
                        std::thread::sleep(Duration::from_millis(10));
                        continue;
                    }
                    let pod = pods[turn % pods.len()];
                    turn += 1;
                    let path = if is_long {
                        format!("/slow/{LONG_MS}")
                    } else {
                        "/".to_string()
                    };
                    if is_long {
                        in_flight[pod].fetch_add(1, Ordering::SeqCst);
                    }
                    let sent = t0.elapsed();
                    let result = http_get(&ips[pod], port, "web.example.com", &path);
                    if is_long {
                        in_flight[pod].fetch_sub(1, Ordering::SeqCst);
                    }
                    let tally = &tallies[phase.load(Ordering::SeqCst)];
                    tally.requests.fetch_add(1, Ordering::Relaxed);
                    let ok = matches!(&result, Some((200, body)) if body.starts_with("web-"));
                    if !ok {
                        tally.failed.fetch_add(1, Ordering::Relaxed);
                        if pod == 1 {
                            tally.failed_on_pod1.fetch_add(1, Ordering::Relaxed);
                        }
                        let mut examples = tally.examples.lock().unwrap();
                        if examples.len() < 5 {
                            examples.push(format!(
                                "t={:.3}s pod {pod} {path}: {result:?}",
                                sent.as_secs_f64()
                            ));
                        }
                    }
                    if !is_long {
                        // Leave the two cores some room for the system under test.
                        std::thread::sleep(Duration::from_millis(3));
                    }
                }
            }));
        }
        Load { workers, ..load }
    }

    fn enter(&self, name: &str) {
        let i = PHASES.iter().position(|(n, _)| *n == name).unwrap();
        self.phase.store(i, Ordering::SeqCst);
        eprintln!(
            "soak: t={:.3}s phase {name}",
            self.started.elapsed().as_secs_f64()
        );
    }

    /// Counts one request made outside the workers (the drain's extra long requests).
    fn record(&self, what: &str, ok: bool) {
        let tally = &self.tallies[self.phase.load(Ordering::SeqCst)];
        tally.requests.fetch_add(1, Ordering::Relaxed);
        if !ok {
            tally.failed.fetch_add(1, Ordering::Relaxed);
            tally.failed_on_pod1.fetch_add(1, Ordering::Relaxed);
            tally.examples.lock().unwrap().push(what.to_string());
        }
    }

    fn stop(mut self) -> Arc<Vec<Tally>> {
        self.stop.store(true, Ordering::SeqCst);
        for w in self.workers.drain(..) {
            w.join().unwrap();
        }
        self.tallies.clone()
    }
}

fn slices() -> ResourceRef {
    ResourceRef::new("discovery.k8s.io/v1", "endpointslices", true)
}

/// Retries an API write: during the API-server fault phase, writes may get injected 503s.
fn retry<T, E: std::fmt::Debug>(what: &str, mut f: impl FnMut() -> Result<T, E>) -> T {
    let mut last = None;
    for _ in 0..100 {
        match f() {
            Ok(v) => return v,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{what}: {last:?}");
}

fn slice(
    name: &str,
    service: &str,
    backend: &Backend,
    conditions: serde_json::Value,
) -> serde_json::Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": backend.port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": conditions}]})
}

/// Polls until every pod in `pods` satisfies `check` for host `host`; the time it took.
fn converge(
    c: &Cluster,
    pods: &[usize],
    host: &str,
    check: impl Fn(u16, &str) -> bool,
) -> Duration {
    let started = Instant::now();
    for &n in pods {
        loop {
            if c.request(n, host, "/").is_some_and(|(s, b)| check(s, &b)) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "pod {n}: {host} never converged"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    started.elapsed()
}

/// The Service `web`'s endpoints, one slice per backend, oldest first.
struct Web {
    live: Vec<(Backend, String)>,
    next: usize,
}

/// An endpoint added to `web` whose convergence is still to be awaited.
struct Added {
    backend: Backend,
    slice_name: String,
    started: Instant,
}

impl Web {
    /// Adds a new ready endpoint (in a slice of its own).
    fn add(&mut self, c: &Cluster) -> Added {
        let name = format!("web-{}", self.next);
        let slice_name = format!("web-slice-{}", self.next);
        self.next += 1;
        let backend = Backend::start(&name);
        let started = Instant::now();
        let object = slice(&slice_name, "web", &backend, json!({"ready": true}));
        retry("create slice", || {
            c.client.create(&slices(), Some(NS), &object)
        });
        Added {
            backend,
            slice_name,
            started,
        }
    }

    /// Waits until `pods` answer from the added endpoint; then takes the oldest endpoint through
    /// terminating (still serving) and deletion, and stops its backend after the grace period.
    /// Returns the time from the write to both pods serving the new endpoint.
    fn complete(&mut self, c: &Cluster, pods: &[usize], added: Added) -> Duration {
        let wanted = format!("{}\n", added.backend.name);
        // Round robin over the live servers: the new one answers within a few requests.
        converge(c, pods, "web.example.com", |s, b| s == 200 && b == wanted);
        let converged = added.started.elapsed();
        self.live.push((added.backend, added.slice_name));
        let (old, old_slice) = self.live.remove(0);
        let terminating = slice(
            &old_slice,
            "web",
            &old,
            json!({"ready": false, "serving": true, "terminating": true}),
        );
        retry("terminate endpoint", || {
            c.client
                .update(&slices(), Some(NS), &old_slice, &terminating)
        });
        std::thread::sleep(GRACE);
        retry("delete slice", || {
            c.client.delete(&slices(), Some(NS), &old_slice)
        });
        std::thread::sleep(Duration::from_millis(500));
        drop(old);
        converged
    }

    fn roll(&mut self, c: &Cluster, pods: &[usize]) -> Duration {
        let added = self.add(c);
        self.complete(c, pods, added)
    }
}

fn main() {
    let mut c = Cluster::start(&[]);
    c.apply_config(&c.config_object(""));
    c.add_pod();
    c.add_pod();
    c.start_controller("ctrl-0");
    c.start_controller("ctrl-1");
    let services = ResourceRef::new("v1", "services", true);
    let ingresses = ResourceRef::new("networking.k8s.io/v1", "ingresses", true);
    let service = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    };
    let ingress = |name: &str, host: &str, svc: &str| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name, "namespace": NS},
            "spec": {"ingressClassName": "haproxy", "rules": [{"host": host, "http": {"paths": [{"path": "/", "pathType": "Prefix",
                "backend": {"service": {"name": svc, "port": {"number": 80}}}}]}}]}})
    };
    c.client
        .create(&services, Some(NS), &service("web"))
        .unwrap();
    let mut web = Web {
        live: Vec::new(),
        next: 0,
    };
    for _ in 0..2 {
        let name = format!("web-{}", web.next);
        let slice_name = format!("web-slice-{}", web.next);
        web.next += 1;
        let backend = Backend::start(&name);
        let object = slice(&slice_name, "web", &backend, json!({"ready": true}));
        c.client.create(&slices(), Some(NS), &object).unwrap();
        web.live.push((backend, slice_name));
    }
    c.client
        .create(
            &ingresses,
            Some(NS),
            &ingress("web", "web.example.com", "web"),
        )
        .unwrap();
    c.wait_route("web.example.com", "/", 200, "web-", Duration::from_secs(60));
    let both = [0, 1];
    let ips: Vec<String> = c.pods.iter().map(|p| p.ip.clone()).collect();
    let load = Load::start(ips, c.http_port, 8, 2);
    let mut converge_ms: Vec<Vec<f64>> = PHASES.iter().map(|_| Vec::new()).collect();
    // Pods whose HAProxy worker changed (a reload or restart) during each phase.
    let mut reloads = vec![0usize; PHASES.len()];
    let mut pids: Vec<Option<u32>> = c.pods.iter().map(|p| p.worker_pid()).collect();
    let mut current = 0usize;
    let mut enter = |load: &Load, c: &Cluster, name: &str| {
        let now: Vec<Option<u32>> = c.pods.iter().map(|p| p.worker_pid()).collect();
        reloads[current] += now.iter().zip(&pids).filter(|(a, b)| a != b).count();
        pids = now;
        current = PHASES.iter().position(|(n, _)| *n == name).unwrap();
        load.enter(name);
    };
    let mut note = |phase: &str, d: Duration| {
        let i = PHASES.iter().position(|(n, _)| *n == phase).unwrap();
        converge_ms[i].push(d.as_secs_f64() * 1000.0);
    };

    enter(&load, &c, "steady");
    std::thread::sleep(Duration::from_secs(3));

    enter(&load, &c, "endpoint-roll");
    for _ in 0..3 {
        let d = web.roll(&c, &both);
        note("endpoint-roll", d);
    }

    enter(&load, &c, "routes");
    let route_backends: Vec<Backend> = (0..3).map(|i| Backend::start(&format!("r{i}"))).collect();
    for (i, b) in route_backends.iter().enumerate() {
        let name = format!("r{i}");
        c.client
            .create(&services, Some(NS), &service(&name))
            .unwrap();
        let object = slice(&format!("{name}-slice"), &name, b, json!({"ready": true}));
        c.client.create(&slices(), Some(NS), &object).unwrap();
        let started = Instant::now();
        let host = format!("{name}.example.com");
        c.client
            .create(&ingresses, Some(NS), &ingress(&name, &host, &name))
            .unwrap();
        let wanted = format!("{name}\n");
        converge(&c, &both, &host, |s, body| s == 200 && body == wanted);
        note("routes", started.elapsed());
    }
    for i in 0..3 {
        let name = format!("r{i}");
        let started = Instant::now();
        c.client.delete(&ingresses, Some(NS), &name).unwrap();
        converge(&c, &both, &format!("{name}.example.com"), |s, _| s == 404);
        note("routes", started.elapsed());
    }

    enter(&load, &c, "leader-kill");
    let leader = c.leader_index().expect("a leader");
    c.controllers[leader].kill();
    let d = web.roll(&c, &both);
    note("leader-kill", d);
    c.start_controller("ctrl-2");

    enter(&load, &c, "leader-sigterm");
    std::thread::sleep(Duration::from_secs(2));
    let leader = c.leader_index().expect("a leader");
    let (took, clean) = c.controllers[leader].terminate();
    eprintln!("soak: leader SIGTERM exit {took:?} clean={clean}");
    let d = web.roll(&c, &both);
    note("leader-sigterm", d);
    c.start_controller("ctrl-3");

    enter(&load, &c, "agent-restart");
    c.pods[0].stop_agent();
    // The change lands while the agent is down; it starts again one second later.
    let added = web.add(&c);
    std::thread::sleep(Duration::from_secs(1));
    c.pods[0].start_agent();
    let d = web.complete(&c, &both, added);
    note("agent-restart", d);

    enter(&load, &c, "apiserver-faults");
    c.api.faults(
        &json!({"closeWatches": "abrupt", "compact": true, "failNext": {"count": 20, "code": 503}}),
    );
    let d = web.roll(&c, &both);
    note("apiserver-faults", d);
    c.api
        .faults(&json!({"closeWatches": true, "compact": true}));
    let d = web.roll(&c, &both);
    note("apiserver-faults", d);

    enter(&load, &c, "haproxy-restart");
    let started = Instant::now();
    c.pods[1].stop_haproxy();
    c.pods[1].spawn_haproxy();
    let wanted = format!("{}\n", web.live.last().unwrap().0.name);
    // The restarted process reads the configuration on disk: the one last applied.
    converge(&c, &[1], "web.example.com", |s, b| {
        s == 200 && b.starts_with("web-")
    });
    note("haproxy-restart", started.elapsed());
    enter(&load, &c, "haproxy-restarted");
    // The latest endpoint set is in it (the agent keeps the files current with runtime changes).
    let d = converge(&c, &[1], "web.example.com", |s, b| s == 200 && b == wanted);
    note("haproxy-restarted", d);
    std::thread::sleep(Duration::from_secs(2));

    enter(&load, &c, "pod-drain");
    // Kubernetes deletes the pod: its agent (no preStop) stops at once, the HAProxy container
    // runs its preStop delay, the Service stops sending it new connections shortly after, and
    // then HAProxy gets its STOPSIGNAL (SIGUSR1: finish what is in flight, then exit).
    let started = Instant::now();
    c.client
        .delete(&pods_resource(), Some(NS), &c.pods[1].name)
        .unwrap();
    c.pods[1].stop_agent();
    // Long requests that start just before the endpoints are withdrawn are still running when
    // HAProxy gets its stop signal; they must complete.
    std::thread::sleep(ENDPOINTS_WITHDRAWN - Duration::from_millis(100));
    let (ip, port) = (c.pods[1].ip.clone(), c.http_port);
    let draining: Vec<_> = (0..4)
        .map(|_| {
            let ip = ip.clone();
            std::thread::spawn(move || http_get(&ip, port, "web.example.com", "/slow/4000"))
        })
        .collect();
    std::thread::sleep(ENDPOINTS_WITHDRAWN.saturating_sub(started.elapsed()));
    load.routing.write().unwrap().retain(|&p| p != 1);
    std::thread::sleep(PRE_STOP.saturating_sub(started.elapsed()));
    let long_in_flight = load.in_flight[1].load(Ordering::SeqCst) + draining.len();
    // SOAK_STOP_SIGNAL=TERM shows what the drain prevents (HAProxy's hard stop).
    let signal = std::env::var("SOAK_STOP_SIGNAL").unwrap_or_else(|_| "USR1".into());
    let (exit, clean) = c.pods[1].signal_haproxy(&signal, Duration::from_secs(30));
    for t in draining {
        let result = t.join().unwrap();
        let ok = matches!(&result, Some((200, b)) if b.starts_with("web-"));
        load.record(&format!("pod 1 /slow/4000 across the stop: {result:?}"), ok);
    }
    eprintln!("soak: pod-drain HAProxy exited after {exit:?} (clean={clean}) with {long_in_flight} long requests in flight");
    note("pod-drain", started.elapsed());
    let d = web.roll(&c, &[0]);
    note("pod-drain", d);
    std::thread::sleep(Duration::from_secs(2));

    enter(&load, &c, "pod-drain");
    let tallies = load.stop();
    // SOAK_LOGS=DIR keeps the controllers' logs for a closer look.
    if let Some(dir) = std::env::var_os("SOAK_LOGS") {
        std::fs::create_dir_all(&dir).unwrap();
        for ctrl in &c.controllers {
            std::fs::write(
                std::path::Path::new(&dir).join(format!("{}.log", ctrl.name)),
                c.controller_log(&ctrl.name),
            )
            .unwrap();
        }
    }
    let (mut requests, mut failed, mut costly) = (0, 0, 0);
    for (i, (_, seamless)) in PHASES.iter().enumerate() {
        let t = &tallies[i];
        requests += t.requests.load(Ordering::Relaxed);
        let (all, on_pod1) = (
            t.failed.load(Ordering::Relaxed),
            t.failed_on_pod1.load(Ordering::Relaxed),
        );
        if *seamless {
            failed += all;
        } else {
            // Only the restarted pod may fail requests; failures elsewhere count in M.
            costly += on_pod1;
            failed += all - on_pod1;
        }
    }
    println!(
        "soak requests={requests} failed={failed} phases={} pods=2 controllers=2 failed_in_restart_phase={costly} drain_signal={signal} drain_exit_ms={:.0} drain_long_in_flight={long_in_flight} drain_clean={clean}",
        PHASES.len(),
        exit.as_secs_f64() * 1000.0
    );
    for (i, (name, seamless)) in PHASES.iter().enumerate() {
        let t = &tallies[i];
        let ms = &converge_ms[i];
        let max = ms.iter().copied().fold(f64::NAN, f64::max);
        println!(
            "soak-phase {name} seamless={seamless} requests={} failed={} reloaded_pods={} converge_ms={:?} converge_max_ms={max:.0}",
            t.requests.load(Ordering::Relaxed),
            t.failed.load(Ordering::Relaxed),
            reloads[i],
            ms.iter().map(|m| m.round() as u64).collect::<Vec<_>>(),
        );
        for e in t.examples.lock().unwrap().iter() {
            println!("soak-failure {name} {e}");
        }
    }
}
