//! `haptic run`: wiring of the controller's threads and channels (DESIGN §2).
//!
//! ```text
//! config watcher ──Config──► reconciler ──Bundle──► deployer ──mTLS──► agents
//! reflectors ──Changed──────────┘   │                  ▲
//!                                   └──► status writer  └── lease (leadership)
//! ```
//! Every replica watches, renders and validates; only the leader deploys and writes status.

mod config_watch;
pub mod hpcfg;
pub(crate) mod reconcile;
pub(crate) mod state;
pub(crate) mod status;
pub(crate) mod watched;
pub mod watchers;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};

use crate::deploy::agent_client::{AgentClient, AgentTls, Transport};
use crate::deploy::{DeployMsg, Deployer, DeployerConfig};
use crate::kube::client::Client;
use crate::kube::config::KubeConfig;
use crate::kube::lease::{Elector, LeaderEvent, Leadership, LeaseConfig, LiveTimings};
use crate::kube::reflector::ReflectorEvent;
use crate::metrics::Registry;
use config_watch::{ConfigWatcher, ConfigWatcherDeps};
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
    /// The CA whose client certificates the webhook requires (the API server's); none: the
    /// webhook answers any peer.
    pub webhook_client_ca: Option<PathBuf>,
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

pub(crate) use config_watch::validate_config_object;

/// The threads that start once the first valid config is known (the lease name, ports and
/// intervals come from it).
struct Runtime {
    elector: Option<std::thread::JoinHandle<()>>,
    deployer: std::thread::JoinHandle<()>,
    reconciler: std::thread::JoinHandle<()>,
    status: std::thread::JoinHandle<()>,
}

impl Runtime {
    /// Stops the threads in order: the deployer first (no push after this), then the elector
    /// (which releases the lease for a fast handover), then the reconciler and status writer.
    /// Each gets until `deadline`.
    fn shutdown(self, ch: &Channels, elector_stop: &AtomicBool, deadline: Instant) {
        let _ = ch.deploy_tx.send(DeployMsg::Shutdown);
        join_until(self.deployer, deadline);
        elector_stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.elector {
            join_until(h, deadline);
        }
        let _ = ch.control_tx.send(ControlMsg::Shutdown);
        let _ = ch.status_tx.send(StatusMsg::Shutdown);
        join_until(self.reconciler, deadline);
        join_until(self.status, deadline);
    }
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

/// What the runtime's threads are built from, besides the config.
struct Wiring<'a> {
    opts: &'a Options,
    /// The release of `opts.haproxy_bin`.
    haproxy_release: &'a str,
    namespace: &'a str,
    client: &'a Client,
    shared: &'a Arc<Shared>,
    watchers: &'a Arc<Mutex<Watchers>>,
    deployer_config: &'a Arc<Mutex<DeployerConfig>>,
    lease_timings: &'a LiveTimings,
    ch: &'a Channels,
    elector_stop: &'a Arc<AtomicBool>,
    stop: &'a Arc<AtomicBool>,
}

/// Starts the elector (or leads alone), the deployer, the reconciler, the status writer and
/// the webhook with the settings of the first valid config.
fn start_runtime(w: &Wiring, config: &ActiveConfig) -> Result<Runtime, String> {
    let Wiring {
        opts,
        haproxy_release,
        namespace,
        client,
        shared,
        watchers,
        deployer_config,
        lease_timings,
        ch,
        elector_stop,
        stop,
    } = *w;
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
        )
        .follow_timings(lease_timings.clone());
        let leadership = elector.leadership();
        (leadership, Some(spawn("lease", move || elector.run())?))
    } else {
        log::info!("leader election disabled: this replica deploys");
        let _ = ch.leader_tx.send(LeaderEvent::Started { epoch: 0 });
        (Arc::new(Leadership::always()), None)
    };
    shared.set_leadership(leadership.clone());
    // The previous leader's published config keeps server slots stable across leaders.
    if let Some((content, _)) = read_published(client, namespace, &opts.config_name) {
        let _ = ch.control_tx.send(ControlMsg::CurrentConfig(content));
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
        haproxy_release: haproxy_release.to_string(),
    };
    let writer = StatusWriter {
        client: client.clone(),
        shared: shared.clone(),
        namespace: namespace.to_string(),
        config_name: opts.config_name.clone(),
        inbox: ch.status_rx.clone(),
        watchers: watchers.clone(),
    };
    if let Some(addr) = &opts.webhook_addr {
        crate::serve::webhook::start(
            addr,
            &opts.webhook_cert_dir,
            opts.webhook_client_ca.as_deref(),
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
    let kube_config = KubeConfig::load(opts.kubeconfig.as_deref())?;
    let client = Client::new(&kube_config)?;
    let namespace = opts
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_string());
    let haproxy_release = crate::validate::haproxy::haproxy_release(&opts.haproxy_bin)
        .map_err(|e| format!("the controller needs haproxy for validation: {e}"))?;
    let haproxy_version = crate::validate::haproxy::major_minor(&haproxy_release)?;
    log::info!(
        "starting haptic {} pod={} namespace={namespace} config={} haproxy={haproxy_release}",
        env!("CARGO_PKG_VERSION"),
        opts.pod_name,
        opts.config_name
    );

    let metrics = controller_metrics();
    let shared = Arc::new(Shared::new(
        metrics.clone(),
        Arc::new(Leadership::default()),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    crate::serve::start_health(&opts.health_addr, shared.clone(), stop.clone())?;
    crate::serve::start_metrics(&opts.metrics_addr, metrics.clone(), stop.clone())?;

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
        agent_port: 5555,
        agent_timeout: Duration::from_secs(30),
        max_parallel: 0,
    }));
    // Replaced by the first valid config before the elector starts.
    let lease_timings: LiveTimings = Arc::new(Mutex::new((
        Duration::from_secs(15),
        Duration::from_secs(10),
        Duration::from_secs(2),
    )));
    let reflector_stop = Arc::new(AtomicBool::new(false));
    let (config_events_tx, config_events_rx) = unbounded::<ReflectorEvent>();
    let mut config_watcher = ConfigWatcher::start(
        &client,
        &namespace,
        &opts.config_name,
        config_events_tx,
        reflector_stop.clone(),
        ConfigWatcherDeps {
            shared: shared.clone(),
            watchers: watchers.clone(),
            deployer_config: deployer_config.clone(),
            lease_timings: lease_timings.clone(),
            status: ch.status_tx.clone(),
        },
    );
    let elector_stop = Arc::new(AtomicBool::new(false));
    let wiring = Wiring {
        opts: &opts,
        haproxy_release: &haproxy_release,
        namespace: &namespace,
        client: &client,
        shared: &shared,
        watchers: &watchers,
        deployer_config: &deployer_config,
        lease_timings: &lease_timings,
        ch: &ch,
        elector_stop: &elector_stop,
        stop: &stop,
    };
    let mut runtime: Option<Runtime> = None;
    let mut last_discovery = Instant::now();

    while !SHUTDOWN.load(Ordering::SeqCst) {
        crossbeam_channel::select! {
            recv(config_events_rx) -> _ => {}
            recv(leader_rx) -> ev => if let Ok(ev) = ev {
                leadership_changed(&ev, &shared, &wiring);
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
        let Some(config) = config_watcher.poll() else {
            continue;
        };
        if runtime.is_none() {
            runtime = Some(start_runtime(&wiring, &config)?);
        }
        let _ = ch.control_tx.send(ControlMsg::Config(config));
    }

    // Graceful shutdown: stop deploying first, then hand the lease over, within 25 s.
    let deadline = Instant::now() + Duration::from_secs(25);
    log::info!("shutting down");
    shared.set_phase("shutting down");
    if let Some(rt) = runtime {
        rt.shutdown(&ch, &elector_stop, deadline);
    }
    reflector_stop.store(true, Ordering::SeqCst);
    lock(&watchers).stop_all();
    stop.store(true, Ordering::SeqCst);
    log::info!("stopped");
    Ok(())
}

/// The controller's registry with every metric that must show before its first event.
fn controller_metrics() -> Registry {
    let metrics = Registry::default();
    use crate::metrics::*;
    metrics.set(
        &BUILD_INFO,
        [env!("CARGO_PKG_VERSION"), env!("HAPTIC_GIT_COMMIT")],
        1.0,
    );
    // Counters the chart's alerts take `increase()` of start at 0 with every label value.
    metrics.zero(&RECONCILIATION_TOTAL, []);
    for stage in [Stage::Render, Stage::Validate] {
        metrics.zero(&RECONCILIATION_ERRORS_TOTAL, [stage.as_str()]);
    }
    metrics.zero(&LEADER_ELECTION_TRANSITIONS_TOTAL, []);
    for result in ["allowed", "denied", "error"] {
        metrics.zero(&WEBHOOK_REQUESTS_TOTAL, [result]);
    }
    metrics.describe(&DEPLOYMENT_TOTAL);
    metrics.zero(&DEPLOYMENT_ERRORS_TOTAL, []);
    metrics.zero(&DRIFT_DETECTED_TOTAL, []);
    metrics.zero(&CONFIG_ERRORS_TOTAL, []);
    metrics.set(&crate::metrics::LEADER_ELECTION_IS_LEADER, [], 0.0);
    metrics.set(&crate::metrics::ADMITTED_PODS, [], 0.0);
    metrics.set(
        &crate::metrics::CHECK_SANDBOX,
        [],
        crate::validate::sandbox::active_abi().unwrap_or(0) as f64,
    );
    metrics
}

/// The haproxy.cfg and bundle hash of the published `HAProxyCfg`, when there is a readable one.
fn read_published(client: &Client, namespace: &str, config_name: &str) -> Option<(String, String)> {
    let name = hpcfg::name(config_name);
    let object = match client.get(&status::haproxycfg_resource(), Some(namespace), &name) {
        Ok(object) => object,
        Err(e) if e.is_not_found() => {
            log::info!(
                "no HAProxyCfg {namespace}/{name}: server slots start from this replica's renders"
            );
            return None;
        }
        Err(e) => {
            log::warn!("HAProxyCfg {namespace}/{name} could not be read, so server slots start from this replica's renders: {e}");
            return None;
        }
    };
    match hpcfg::read(&object) {
        Ok(stored) if stored.content.is_empty() => None,
        Ok(stored) => Some((stored.content, stored.bundle)),
        Err(e) => {
            log::warn!(
                "HAProxyCfg {namespace}/{name} is unreadable, so server slots start afresh: {e}"
            );
            None
        }
    }
}

/// Leadership gained or lost: metrics, the event log, and the deployer (which learns every
/// pod's state again before pushing). A gained lead goes to the deployer through the
/// reconciler, which first takes the server slots the previous leader published.
fn leadership_changed(event: &LeaderEvent, shared: &Shared, w: &Wiring) {
    let ch = w.ch;
    let leading = matches!(event, LeaderEvent::Started { .. });
    let metrics = &shared.metrics;
    metrics.set(
        &crate::metrics::LEADER_ELECTION_IS_LEADER,
        [],
        if leading { 1.0 } else { 0.0 },
    );
    metrics.inc(&crate::metrics::LEADER_ELECTION_TRANSITIONS_TOTAL, []);
    shared.record(if leading {
        "leader gained"
    } else {
        "leader lost"
    });
    let _ = ch.deploy_tx.send(DeployMsg::Leadership);
    if let LeaderEvent::Started { epoch } = *event {
        // Read off this thread: an API server slow enough to cost the lead must not also hold
        // up shutdown and config changes. The deployer holds the term's pushes meanwhile.
        let (client, namespace, name) = (
            w.client.clone(),
            w.namespace.to_string(),
            w.opts.config_name.clone(),
        );
        let control = ch.control_tx.clone();
        let spawned = std::thread::Builder::new()
            .name("takeover".into())
            .spawn(move || {
                let published = read_published(&client, &namespace, &name);
                let _ = control.send(ControlMsg::Leading { epoch, published });
            });
        if let Err(e) = spawned {
            log::error!("cannot read the published config: {e}");
            let _ = ch.control_tx.send(ControlMsg::Leading {
                epoch,
                published: None,
            });
        }
    }
}

fn join_until(handle: std::thread::JoinHandle<()>, deadline: Instant) {
    while !handle.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if handle.is_finished() {
        let _ = handle.join();
    }
}
