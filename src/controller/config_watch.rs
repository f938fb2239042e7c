//! The config watcher: follows the controller's `HAProxyTemplateConfig`, validates every new
//! generation, and applies a valid one everywhere it takes effect (watchers, log level,
//! deployer settings, the reconciler through [`super::run`]); an invalid one is reported in the
//! object's status and the running config stays.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::Sender;
use serde_json::Value;

use crate::config::{ConfigDocument, Spec};
use crate::deploy::DeployerConfig;
use crate::kube::client::{Client, ListParams};
use crate::kube::lease::LiveTimings;
use crate::kube::reflector::{snapshot, Reflector, ReflectorEvent, SharedStore};
use crate::render::Engine;
use crate::store::{ObjectFilter, Store};

use super::state::{lock, ActiveConfig, Shared};
use super::status::{self, StatusMsg};
use super::watchers::{self, Watchers};

/// Validates a config object completely: typed spec, structure, and templates that compile.
pub(crate) fn validate_config_object(object: &Value, source: &str) -> Result<ActiveConfig, String> {
    let doc = ConfigDocument {
        metadata: object.get("metadata").cloned(),
        spec: object.get("spec").cloned().unwrap_or(Value::Null),
    };
    let spec = doc.runtime_spec(source).map_err(|e| e.to_string())?;
    let engine = Engine::new(&spec).map_err(|e| e.to_string())?;
    Ok(ActiveConfig {
        spec,
        engine,
        generation: object
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0),
        raw: None,
        spec_hash: super::state::spec_hash(object),
    })
}

pub(super) struct ConfigWatcher {
    /// `HAProxyTemplateConfig namespace/name`, for messages.
    pub source: String,
    namespace: String,
    store: SharedStore,
    shared: Arc<Shared>,
    watchers: Arc<Mutex<Watchers>>,
    deployer_config: Arc<Mutex<DeployerConfig>>,
    lease_timings: LiveTimings,
    status: Sender<StatusMsg>,
    /// The config in effect.
    active: Option<Arc<ActiveConfig>>,
    /// The start-up-only settings as the runtime started with them.
    startup: Option<Vec<(&'static str, String)>>,
    seen_version: String,
}

/// What the config watcher needs besides the object it follows.
pub(super) struct ConfigWatcherDeps {
    pub shared: Arc<Shared>,
    pub watchers: Arc<Mutex<Watchers>>,
    pub deployer_config: Arc<Mutex<DeployerConfig>>,
    /// The elector's durations, followed while it runs.
    pub lease_timings: LiveTimings,
    pub status: Sender<StatusMsg>,
}

impl ConfigWatcher {
    /// Starts the reflector of the config object `namespace/name`; it sends `events` on changes
    /// and stops with `stop`.
    pub(super) fn start(
        client: &Client,
        namespace: &str,
        name: &str,
        events: Sender<ReflectorEvent>,
        stop: Arc<AtomicBool>,
        deps: ConfigWatcherDeps,
    ) -> ConfigWatcher {
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
        if let Err(e) = super::spawn("watch-config", move || reflector.run()) {
            log::error!("{e}");
        }
        let source = format!("HAProxyTemplateConfig {namespace}/{name}");
        deps.shared.set_phase(format!("waiting for {source}"));
        ConfigWatcher {
            source,
            namespace: namespace.to_string(),
            store,
            shared: deps.shared,
            watchers: deps.watchers,
            deployer_config: deps.deployer_config,
            lease_timings: deps.lease_timings,
            status: deps.status,
            active: None,
            startup: None,
            seen_version: String::new(),
        }
    }

    /// Looks at the object: returns the config to run when a new valid generation arrived.
    pub(super) fn poll(&mut self) -> Option<Arc<ActiveConfig>> {
        // The one config object, as a plain value for the config loader.
        let doc = Arc::clone(snapshot(&self.store).list().next()?);
        let object = doc.to_value();
        let version = object
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if version == self.seen_version {
            return None;
        }
        self.seen_version = version;
        // Our own status writes change the object but not its spec.
        if self
            .active
            .as_ref()
            .is_some_and(|a| a.spec_hash == super::state::spec_hash(&object))
        {
            return None;
        }
        let generation = object
            .pointer("/metadata/generation")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        let candidate = validate_config_object(&object, &self.source).map(|mut c| {
            c.raw = Some(doc);
            let defs = watchers::definitions(&c.spec, &self.namespace);
            let changed = lock(&self.watchers).apply(&defs);
            (c, changed)
        });
        let (config, changed) = match candidate {
            Ok(x) => x,
            Err(e) => {
                self.refuse(generation, e);
                return None;
            }
        };
        let config = Arc::new(config);
        self.apply(&config, &changed);
        self.active = Some(config.clone());
        Some(config)
    }

    fn refuse(&self, generation: i64, error: String) {
        let source = &self.source;
        log::error!(
            "{source} generation {generation} is invalid; keeping the running config: {error}"
        );
        self.shared
            .record(format!("config generation {generation} invalid: {error}"));
        self.shared
            .metrics
            .inc(&crate::metrics::CONFIG_ERRORS_TOTAL, []);
        if self.active.is_none() {
            self.shared
                .set_phase(format!("{source} is invalid: see its status"));
        }
        let _ = self.status.send(StatusMsg::ConfigValidation {
            generation,
            error: Some(error),
        });
    }

    /// Everything a valid generation changes besides the reconciler's render.
    fn apply(&mut self, config: &Arc<ActiveConfig>, restarted_watchers: &[String]) {
        if let Some(level) = config
            .spec
            .log_level()
            .and_then(|l| crate::logger::parse_level(&l))
        {
            crate::logger::set_level(level);
        }
        let restarted = if restarted_watchers.is_empty() {
            "none".to_string()
        } else {
            restarted_watchers.join(", ")
        };
        log::info!(
            "config generation={} applied; watchers (re)started: {restarted}",
            config.generation
        );
        self.shared
            .record(format!("config generation {} applied", config.generation));
        {
            let mut d = lock(&self.deployer_config);
            d.min_deployment_interval = config.spec.min_deployment_interval();
            d.drift_prevention_interval = config.spec.drift_prevention_interval();
            d.agent_port = config.spec.dataplane_port();
            d.agent_timeout = config.spec.deployment_timeout();
            d.max_parallel = config.spec.max_parallel();
        }
        *lock(&self.lease_timings) = (
            config.spec.lease_duration(),
            config.spec.renew_deadline(),
            config.spec.retry_period(),
        );
        *lock(&self.shared.config) = Some(config.clone());
        let _ = self.status.send(StatusMsg::ConfigValidation {
            generation: config.generation,
            error: None,
        });
        // Settings read once when the runtime starts (which lease, and whether to elect at
        // all: switching either while replicas run could leave two leaders for a moment): a
        // change is reported, not ignored.
        match &self.startup {
            None => self.startup = Some(startup_settings(&config.spec)),
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
                let _ = self.status.send(StatusMsg::RestartRequired(needs_restart));
            }
        }
    }
}

/// The settings the controller reads once, when its runtime starts (the elector), with their
/// values: field path and value. Every other setting applies live.
fn startup_settings(spec: &Spec) -> Vec<(&'static str, String)> {
    vec![
        (
            "controller.leaderElection.enabled",
            spec.leader_election_enabled().to_string(),
        ),
        ("controller.leaderElection.leaseName", spec.lease_name()),
    ]
}
