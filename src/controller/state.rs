//! State shared between the controller's threads and its HTTP surfaces (health, debug,
//! metrics). Readers take short locks. Most fields have one writer; `phase` has two: the
//! config watcher (waiting for a config, invalid config, shutting down) and the reconciler
//! (waiting for the initial lists, running), whose phases follow the config watcher's.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::config::Spec;
use crate::deploy::PodStatus;
use crate::kube::lease::Leadership;
use crate::metrics::Registry;
use crate::render::Engine;

pub(crate) use crate::lock;

/// The config the controller runs with.
pub(crate) struct ActiveConfig {
    pub spec: Spec,
    pub engine: Engine,
    pub generation: i64,
    /// The object as the config watcher's store holds it (shared, not a copy), for
    /// `/debug/config`; `None` for a candidate checked by the webhook.
    pub raw: Option<Arc<crate::store::Doc>>,
    /// A hash of its spec's JSON: a new version with the same spec (our own status writes)
    /// changes nothing.
    pub spec_hash: u64,
}

/// A hash of a config object's `spec` as JSON (serde_json writes a given value one way),
/// streamed: the spec of the six libraries is about 1 MB of text.
pub(crate) fn spec_hash(object: &serde_json::Value) -> u64 {
    use std::hash::Hasher;
    struct HashWriter(std::collections::hash_map::DefaultHasher);
    impl std::io::Write for HashWriter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.write(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut w = HashWriter(std::collections::hash_map::DefaultHasher::new());
    let spec = object.get("spec").unwrap_or(&serde_json::Value::Null);
    let _ = serde_json::to_writer(&mut w, spec);
    w.0.finish()
}

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct RenderState {
    pub bundle: Option<String>,
    /// Shared with the published bundle.
    #[serde(skip)]
    pub haproxy_cfg: Option<std::sync::Arc<String>>,
    pub last_error: Option<String>,
    pub last_success_at: Option<String>,
    pub renders: u64,
}

pub(crate) struct Shared {
    pub metrics: Registry,
    leadership: Mutex<Arc<Leadership>>,
    /// What the controller is doing, for `/healthz` and `/readyz` explanations.
    pub phase: Mutex<String>,
    pub synced: AtomicBool,
    pub config: Mutex<Option<Arc<ActiveConfig>>>,
    pub render: Mutex<RenderState>,
    pub pods: Arc<Mutex<Vec<PodStatus>>>,
    pub store_counts: Mutex<Vec<(String, usize)>>,
    events: Mutex<VecDeque<String>>,
}

impl Shared {
    pub(crate) fn new(metrics: Registry, leadership: Arc<Leadership>) -> Shared {
        Shared {
            metrics,
            leadership: Mutex::new(leadership),
            phase: Mutex::new("starting".into()),
            synced: AtomicBool::new(false),
            config: Mutex::new(None),
            render: Mutex::new(RenderState::default()),
            pods: Arc::new(Mutex::new(Vec::new())),
            store_counts: Mutex::new(Vec::new()),
            events: Mutex::new(VecDeque::new()),
        }
    }

    pub(crate) fn leadership(&self) -> Arc<Leadership> {
        lock(&self.leadership).clone()
    }

    pub(crate) fn set_leadership(&self, leadership: Arc<Leadership>) {
        *lock(&self.leadership) = leadership;
    }

    pub(crate) fn set_phase(&self, phase: impl Into<String>) {
        *lock(&self.phase) = phase.into();
    }

    /// Remembers a notable event for `/debug/events` (the last 200).
    pub(crate) fn record(&self, event: impl Into<String>) {
        let mut events = lock(&self.events);
        if events.len() >= 200 {
            events.pop_front();
        }
        events.push_back(format!(
            "{} {}",
            crate::kube::lease::rfc3339(std::time::SystemTime::now()),
            event.into()
        ));
    }

    pub(crate) fn recent_events(&self) -> Vec<String> {
        lock(&self.events).iter().cloned().collect()
    }
}
