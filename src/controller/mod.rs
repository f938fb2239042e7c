//! `haptic run`: wiring of the controller's threads and channels (DESIGN §2).
//!
//! ```text
//! config watcher ──Config──► reconciler ──Bundle──► deployer ──mTLS──► agents
//! reflectors ──Changed──────────┘   │                  ▲
//!                                   └──► status writer  └── lease (leadership)
//! ```
//! Every replica watches, renders and validates; only the leader deploys and writes status.

pub mod reconcile;
pub mod state;
pub mod status;
pub mod watchers;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use serde_json::Value;

use crate::config::ConfigDocument;
use crate::deploy::agent_client::{AgentClient, AgentTls, Transport};
use crate::deploy::{DeployMsg, Deployer, DeployerConfig};
use crate::kube::client::{Client, ListParams};
use crate::kube::config::KubeConfig;
use crate::kube::lease::{Elector, LeaderEvent, Leadership, LeaseConfig};
use crate::kube::reflector::{snapshot, Reflector, ReflectorEvent, SharedStore};
use crate::metrics::Registry;
use crate::render::Engine;
use crate::store::{ObjectFilter, Store};
use reconcile::{ControlMsg, Reconciler};
use state::{lock, ActiveConfig, Shared};
use status::{StatusMsg, StatusWriter};
use watchers::Watchers;

/// Everything `haptic run` is told.
#[derive(Debug, Clone)]
pub struct Options {
    pub config_name: String,
    pub namespace: Option<String>,
    pub pod_name: String,
    pub kubeconfig: Option<PathBuf>,
    pub health_addr: String,
    pub metrics_addr: String,
    pub webhook_addr: Option<String>,
    pub haproxy_bin: String,
    pub agent_cert_dir: PathBuf,
    pub agent_server_name: String,
    /// Plain HTTP with basic auth from these files (`username`, `password`) instead of mTLS.
    pub agent_credentials_dir: Option<PathBuf>,
    pub webhook_cert_dir: PathBuf,
}

/// How often resources the API server did not serve are looked up again.
const DISCOVERY_RETRY: Duration = Duration::from_secs(15);

/// Set by SIGTERM/SIGINT.
pub static SHUTDOWN: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    SHUTDOWN.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
}

/// Validates a config object completely: typed spec, structure, templates compile, and a
/// smoke render against empty stores (minijinja checks names only at render time).
pub fn validate_config_object(object: &Value, source: &str) -> Result<ActiveConfig, String> {
    let doc = ConfigDocument {
        metadata: object.get("metadata").cloned(),
        spec: object.get("spec").cloned().unwrap_or(Value::Null),
    };
    let spec = doc.valid_spec(source).map_err(|e| e.to_string())?;
    let engine = Engine::new(&spec).map_err(|e| e.to_string())?;
    Ok(ActiveConfig {
        spec,
        engine,
        generation: object
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0),
        resource_version: object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        raw: object.clone(),
    })
}

/// The threads that start once the first valid config is known (the lease name, ports and
/// intervals come from it).
struct Runtime {
    elector: Option<std::thread::JoinHandle<()>>,
    deployer: std::thread::JoinHandle<()>,
    reconciler: std::thread::JoinHandle<()>,
    status: std::thread::JoinHandle<()>,
}

struct Channels {
    leader_tx: Sender<LeaderEvent>,
    control_tx: Sender<ControlMsg>,
    control_rx: Receiver<ControlMsg>,
    deploy_tx: Sender<DeployMsg>,
    deploy_rx: Receiver<DeployMsg>,
    status_tx: Sender<StatusMsg>,
    status_rx: Receiver<StatusMsg>,
    store_rx: Receiver<ReflectorEvent>,
}

fn spawn(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, String> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| format!("start thread {name}: {e}"))
}

#[allow(clippy::too_many_arguments)]
fn start_runtime(
    opts: &Options,
    namespace: &str,
    config: &ActiveConfig,
    client: &Client,
    shared: &Arc<Shared>,
    watchers: &Arc<Mutex<Watchers>>,
    deployer_config: &Arc<Mutex<DeployerConfig>>,
    ch: &Channels,
    elector_stop: &Arc<AtomicBool>,
    stop: &Arc<AtomicBool>,
) -> Result<Runtime, String> {
    let spec = &config.spec;
    let (leadership, elector) = if spec.leader_election_enabled() {
        let elector = Elector::new(
            client.clone(),
            LeaseConfig {
                namespace: namespace.to_string(),
                name: spec.lease_name(),
                identity: opts.pod_name.clone(),
                lease_duration: spec.lease_duration(),
                renew_deadline: spec.renew_deadline(),
                retry_period: spec.retry_period(),
            },
            ch.leader_tx.clone(),
            elector_stop.clone(),
        );
        let leadership = elector.leadership();
        (leadership, Some(spawn("lease", move || elector.run())?))
    } else {
        log::info!("leader election disabled: this replica deploys");
        let _ = ch.leader_tx.send(LeaderEvent::Started { epoch: 0 });
        (Arc::new(Leadership::always()), None)
    };
    shared.set_leadership(leadership.clone());
    // The previous leader's published config keeps server slots stable across leaders.
    if let Ok(cfg) = client.get(
        &status::haproxycfg_resource(),
        Some(namespace),
        &format!("{}-haproxycfg", opts.config_name),
    ) {
        if let Some(content) = cfg.pointer("/spec/content").and_then(Value::as_str) {
            let _ = ch
                .control_tx
                .send(ControlMsg::CurrentConfig(content.to_string()));
        }
    }
    let transport = match &opts.agent_credentials_dir {
        Some(dir) => {
            log::warn!("talking to agents over plain HTTP with basic auth ({}): use only where the network is trusted", dir.display());
            Transport::BasicAuth { dir: dir.clone() }
        }
        None => Transport::Tls(AgentTls {
            dir: opts.agent_cert_dir.clone(),
            server_name: opts.agent_server_name.clone(),
        }),
    };
    let deployer = Deployer {
        client: Arc::new(AgentClient::new(
            transport,
            spec.dataplane_port(),
            spec.deployment_timeout(),
        )),
        leadership,
        config: deployer_config.clone(),
        metrics: shared.metrics.clone(),
        inbox: ch.deploy_rx.clone(),
        status: shared.pods.clone(),
    };
    let reconciler = Reconciler {
        shared: shared.clone(),
        watchers: watchers.clone(),
        store_events: ch.store_rx.clone(),
        control: ch.control_rx.clone(),
        deployer: ch.deploy_tx.clone(),
        status: ch.status_tx.clone(),
        haproxy_bin: opts.haproxy_bin.clone(),
    };
    let writer = StatusWriter {
        client: client.clone(),
        shared: shared.clone(),
        namespace: namespace.to_string(),
        config_name: opts.config_name.clone(),
        inbox: ch.status_rx.clone(),
    };
    if let Some(addr) = &opts.webhook_addr {
        crate::serve::webhook::start(
            addr,
            &opts.webhook_cert_dir,
            shared.clone(),
            watchers.clone(),
            opts.haproxy_bin.clone(),
            stop.clone(),
        )?;
    }
    Ok(Runtime {
        elector,
        deployer: spawn("deployer", move || deployer.run())?,
        reconciler: spawn("reconciler", move || reconciler.run())?,
        status: spawn("status", move || writer.run())?,
    })
}

pub fn run(opts: Options) -> Result<(), String> {
    install_signal_handlers();
    let kube_config = match &opts.kubeconfig {
        Some(path) => KubeConfig::from_kubeconfig(path, None)?,
        None => KubeConfig::in_cluster()?,
    };
    let client = Client::new(&kube_config)?;
    let namespace = opts
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let haproxy_version = crate::validate::haproxy::haproxy_version(&opts.haproxy_bin)
        .map_err(|e| format!("the controller needs haproxy for validation: {e}"))?;
    log::info!(
        "starting haptic {} pod={} namespace={namespace} config={} haproxy={haproxy_version}",
        env!("CARGO_PKG_VERSION"),
        opts.pod_name,
        opts.config_name
    );

    let metrics = Registry::default();
    metrics.set(
        &crate::metrics::BUILD_INFO,
        &[
            ("version", env!("CARGO_PKG_VERSION")),
            ("commit", env!("HAPTIC_GIT_COMMIT")),
        ],
        1.0,
    );
    for metric in [
        &crate::metrics::RECONCILIATION_TOTAL,
        &crate::metrics::RECONCILIATION_ERRORS_TOTAL,
        &crate::metrics::LEADER_ELECTION_TRANSITIONS_TOTAL,
        &crate::metrics::WEBHOOK_REQUESTS_TOTAL,
        &crate::metrics::DEPLOYMENT_TOTAL,
        &crate::metrics::DEPLOYMENT_ERRORS_TOTAL,
        &crate::metrics::CONFIG_ERRORS_TOTAL,
    ] {
        metrics.describe_counter(metric);
    }
    metrics.set(&crate::metrics::LEADER_ELECTION_IS_LEADER, &[], 0.0);
    metrics.set(&crate::metrics::ADMITTED_PODS, &[], 0.0);
    let shared = Arc::new(Shared::new(
        metrics.clone(),
        Arc::new(Leadership::default()),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    crate::serve::start_health(&opts.health_addr, shared.clone(), stop.clone())?;
    crate::serve::start_metrics(&opts.metrics_addr, metrics.clone(), stop.clone())?;

    let reflector_stop = Arc::new(AtomicBool::new(false));
    let (config_events_tx, config_events_rx) = unbounded::<ReflectorEvent>();
    let config_store = start_config_reflector(
        &client,
        &namespace,
        &opts.config_name,
        config_events_tx,
        reflector_stop.clone(),
    );
    let source = format!("HAProxyTemplateConfig {namespace}/{}", opts.config_name);
    shared.set_phase(format!("waiting for {source}"));

    let (store_tx, store_rx) = unbounded();
    let (leader_tx, leader_rx) = unbounded();
    let (control_tx, control_rx) = unbounded();
    let (deploy_tx, deploy_rx) = unbounded();
    let (status_tx, status_rx) = unbounded();
    let ch = Channels {
        leader_tx,
        control_tx,
        control_rx,
        deploy_tx,
        deploy_rx,
        status_tx,
        status_rx,
        store_rx,
    };
    let watchers = Arc::new(Mutex::new(Watchers::new(client.clone(), store_tx)));
    let deployer_config = Arc::new(Mutex::new(DeployerConfig {
        min_deployment_interval: Duration::from_secs(2),
        drift_prevention_interval: Duration::from_secs(60),
        haproxy_version: Some(haproxy_version),
    }));
    let elector_stop = Arc::new(AtomicBool::new(false));
    let mut runtime: Option<Runtime> = None;
    let mut active: Option<Arc<ActiveConfig>> = None;
    let mut startup: Option<Vec<(&'static str, String)>> = None;
    let mut seen_version = String::new();
    let mut last_discovery = Instant::now();

    while !SHUTDOWN.load(Ordering::SeqCst) {
        crossbeam_channel::select! {
            recv(config_events_rx) -> _ => {}
            recv(leader_rx) -> ev => if let Ok(ev) = ev {
                let leading = matches!(ev, LeaderEvent::Started { .. });
                metrics.set(&crate::metrics::LEADER_ELECTION_IS_LEADER, &[], if leading { 1.0 } else { 0.0 });
                metrics.inc(&crate::metrics::LEADER_ELECTION_TRANSITIONS_TOTAL, &[]);
                shared.record(if leading { "leader gained" } else { "leader lost" });
                let _ = ch.deploy_tx.send(DeployMsg::Leadership);
            },
            default(Duration::from_millis(100)) => {}
        }
        while config_events_rx.try_recv().is_ok() {}
        if last_discovery.elapsed() >= DISCOVERY_RETRY {
            last_discovery = Instant::now();
            for name in lock(&watchers).retry_discovery() {
                log::info!("resource={name} is served now; watching it");
                shared.record(format!("resource {name} discovered and watched"));
            }
        }
        let Some(object) = snapshot(&config_store).list().next().cloned() else {
            continue;
        };
        let version = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if version == seen_version {
            continue;
        }
        seen_version = version;
        // Our own status writes change the object but not its spec.
        if active
            .as_ref()
            .is_some_and(|a| a.raw.get("spec") == object.get("spec"))
        {
            continue;
        }
        let generation = object
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let candidate = validate_config_object(&object, &source).map(|c| {
            let defs = watchers::definitions(&c.spec, &namespace);
            let changed = lock(&watchers).apply(&defs);
            (c, changed)
        });
        let (config, changed) = match candidate {
            Ok(x) => x,
            Err(e) => {
                log::error!(
                    "{source} generation {generation} is invalid; keeping the running config: {e}"
                );
                shared.record(format!("config generation {generation} invalid: {e}"));
                metrics.inc(&crate::metrics::CONFIG_ERRORS_TOTAL, &[]);
                let _ = ch.status_tx.send(StatusMsg::ConfigValidation {
                    generation,
                    error: Some(e),
                });
                if active.is_none() {
                    shared.set_phase(format!("{source} is invalid: see its status"));
                }
                continue;
            }
        };
        let config = Arc::new(config);
        if let Some(level) = config
            .spec
            .log_level()
            .and_then(|l| crate::logger::parse_level(&l))
        {
            crate::logger::set_level(level);
        }
        let restarted = if changed.is_empty() {
            "none".to_string()
        } else {
            changed.join(", ")
        };
        log::info!(
            "config generation={} applied; watchers (re)started: {restarted}",
            config.generation
        );
        shared.record(format!("config generation {} applied", config.generation));
        {
            let mut d = lock(&deployer_config);
            d.min_deployment_interval = config.spec.min_deployment_interval();
            d.drift_prevention_interval = config.spec.drift_prevention_interval();
        }
        *lock(&shared.config) = Some(config.clone());
        let _ = ch.status_tx.send(StatusMsg::ConfigValidation {
            generation: config.generation,
            error: None,
        });
        // Settings read once when the runtime starts: a change is reported, not ignored.
        match &startup {
            None => startup = Some(startup_settings(&config.spec)),
            Some(first) => {
                let needs_restart: Vec<String> = startup_settings(&config.spec)
                    .into_iter()
                    .zip(first)
                    .filter(|(now, then)| now != *then)
                    .map(|((field, value), _)| format!("{field} ({value})"))
                    .collect();
                if !needs_restart.is_empty() {
                    log::warn!(
                        "config generation={} changes settings that take effect after a restart of the controller: {}",
                        config.generation,
                        needs_restart.join(", ")
                    );
                }
                let _ = ch.status_tx.send(StatusMsg::RestartRequired(needs_restart));
            }
        }
        if runtime.is_none() {
            runtime = Some(start_runtime(
                &opts,
                &namespace,
                &config,
                &client,
                &shared,
                &watchers,
                &deployer_config,
                &ch,
                &elector_stop,
                &stop,
            )?);
        }
        let _ = ch.control_tx.send(ControlMsg::Config(config.clone()));
        active = Some(config);
    }

    // Graceful shutdown: stop deploying first, then hand the lease over, within 25 s.
    let deadline = Instant::now() + Duration::from_secs(25);
    log::info!("shutting down");
    shared.set_phase("shutting down");
    let _ = ch.deploy_tx.send(DeployMsg::Shutdown);
    if let Some(rt) = runtime {
        join_until(rt.deployer, deadline);
        elector_stop.store(true, Ordering::SeqCst);
        if let Some(h) = rt.elector {
            join_until(h, deadline);
        }
        let _ = ch.control_tx.send(ControlMsg::Shutdown);
        let _ = ch.status_tx.send(StatusMsg::Shutdown);
        join_until(rt.reconciler, deadline);
        join_until(rt.status, deadline);
    }
    reflector_stop.store(true, Ordering::SeqCst);
    lock(&watchers).stop_all();
    stop.store(true, Ordering::SeqCst);
    log::info!("stopped");
    Ok(())
}

fn join_until(handle: std::thread::JoinHandle<()>, deadline: Instant) {
    while !handle.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if handle.is_finished() {
        let _ = handle.join();
    }
}

fn start_config_reflector(
    client: &Client,
    namespace: &str,
    name: &str,
    events: Sender<ReflectorEvent>,
    stop: Arc<AtomicBool>,
) -> SharedStore {
    let store: SharedStore = Arc::new(std::sync::RwLock::new(Arc::new(Store::new(
        crate::render::pod_index(),
    ))));
    let reflector = Reflector {
        name: "haproxytemplateconfig".into(),
        client: client.clone(),
        resource: status::config_resource(),
        namespace: Some(namespace.to_string()),
        params: ListParams {
            field_selector: Some(format!("metadata.name={name}")),
            ..Default::default()
        },
        filter: ObjectFilter::default(),
        store: store.clone(),
        synced: Arc::new(AtomicBool::new(false)),
        stop,
        events,
        watch_timeout: Duration::from_secs(290),
    };
    if let Err(e) = spawn("watch-config", move || reflector.run()) {
        log::error!("{e}");
    }
    store
}

/// The settings the controller reads once, when its runtime starts (the elector, the agent
/// client), with their values: field path and value.
fn startup_settings(spec: &crate::config::Spec) -> Vec<(&'static str, String)> {
    vec![
        (
            "controller.leaderElection.enabled",
            spec.leader_election_enabled().to_string(),
        ),
        ("controller.leaderElection.leaseName", spec.lease_name()),
        (
            "controller.leaderElection.leaseDuration",
            format!("{:?}", spec.lease_duration()),
        ),
        (
            "controller.leaderElection.renewDeadline",
            format!("{:?}", spec.renew_deadline()),
        ),
        (
            "controller.leaderElection.retryPeriod",
            format!("{:?}", spec.retry_period()),
        ),
        ("dataplane.port", spec.dataplane_port().to_string()),
        (
            "dataplane.deploymentTimeout",
            format!("{:?}", spec.deployment_timeout()),
        ),
    ]
}
