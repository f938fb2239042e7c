//! A reflector keeps one [`Store`] equal to the API server's view of one resource type:
//! list, then watch from the list's resourceVersion; on `410 Gone`, an ERROR event or a broken
//! stream it re-lists and reconciles the store (adds, updates and deletes), so no change is lost
//! and no stale object survives. Errors back off exponentially with jitter, capped at 30 s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crossbeam_channel::Sender;

use super::client::{Client, KubeError, ListParams, ResourceRef};
use crate::store::{doc_key, NodeRef, ObjectFilter, ObjectKey, Parsed, Shape, Store};

/// A store shared between its reflector (the only writer) and readers. Readers take cheap
/// snapshots (`Arc<Store>`); a write while a snapshot is alive copies the index (pointers only).
pub type SharedStore = Arc<RwLock<Arc<Store>>>;

pub fn snapshot(store: &SharedStore) -> Arc<Store> {
    store.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The sync barrier: rendering waits until every watched type has completed its first list.
#[derive(Debug, Clone, Default)]
pub struct SyncBarrier {
    flags: Vec<(String, Arc<AtomicBool>)>,
}

impl SyncBarrier {
    pub fn add(&mut self, name: &str, flag: Arc<AtomicBool>) {
        self.flags.push((name.to_string(), flag));
    }

    pub fn is_synced(&self) -> bool {
        self.flags.iter().all(|(_, f)| f.load(Ordering::SeqCst))
    }

    /// The types still waiting for their first list (for health output and logs).
    pub fn pending(&self) -> Vec<&str> {
        self.flags
            .iter()
            .filter(|(_, f)| !f.load(Ordering::SeqCst))
            .map(|(n, _)| n.as_str())
            .collect()
    }
}

/// What a reflector tells the rest of the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReflectorEvent {
    /// The store of `name` changed (after the initial list: also when it became synced).
    Changed { name: String },
    /// The reflector re-listed (after 410, an ERROR event or a broken watch).
    Relisted { name: String, reason: String },
}

/// Everything one reflector needs.
pub struct Reflector {
    pub name: String,
    pub client: Client,
    pub resource: ResourceRef,
    pub namespace: Option<String>,
    pub params: ListParams,
    pub filter: ObjectFilter,
    pub store: SharedStore,
    pub synced: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
    pub events: Sender<ReflectorEvent>,
    /// How long the server keeps one watch open.
    pub watch_timeout: Duration,
}

/// Exponential backoff with jitter: 200 ms doubling to 30 s.
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
    seed: u64,
}

impl Default for Backoff {
    fn default() -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        Backoff {
            next: Duration::from_millis(200),
            seed,
        }
    }
}

impl Backoff {
    pub const MAX: Duration = Duration::from_secs(30);

    /// The delay to wait now: the current step with ±25 % jitter; the step then doubles.
    pub fn delay(&mut self) -> Duration {
        // xorshift: jitter needs no cryptographic randomness.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        let factor = 0.75 + (self.seed % 1000) as f64 / 2000.0;
        let delay = self.next.mul_f64(factor).min(Self::MAX);
        self.next = (self.next * 2).min(Self::MAX);
        delay
    }

    pub fn reset(&mut self) {
        self.next = Duration::from_millis(200);
    }
}

enum WatchEnd {
    /// The server closed the watch normally: continue from the last resourceVersion.
    Expired,
    /// The version is gone or the stream broke: re-list.
    Relist(String),
    Stopped,
}

impl Reflector {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Sleeps in small steps so a stop request is honoured quickly.
    fn pause(&self, delay: Duration) {
        let deadline = std::time::Instant::now() + delay;
        while !self.stopped() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50).min(delay));
        }
    }

    fn write(&self, change: impl FnOnce(&mut Store)) {
        let mut guard = self.store.write().unwrap_or_else(|p| p.into_inner());
        change(Arc::make_mut(&mut guard));
    }

    fn notify(&self) {
        let _ = self.events.send(ReflectorEvent::Changed {
            name: self.name.clone(),
        });
    }

    /// Applies one object (added or modified). An object the field selector rejects is removed.
    fn apply(&self, object: Parsed) {
        let doc = match object.doc {
            Ok(doc) => doc,
            Err(e) => {
                log::warn!("resource={} {e}", self.name);
                return;
            }
        };
        let Some(key) = doc_key(&doc) else {
            return;
        };
        self.write(|s| {
            if !object.selected {
                s.delete(&key);
            } else if let Err(e) = s.upsert(Arc::new(doc)) {
                log::warn!("resource={} {e}", self.name);
            }
        })
    }

    /// Lists everything and makes the store equal to it. Returns the list's resourceVersion.
    fn relist(&self, shape: &Shape) -> Result<String, KubeError> {
        let mut prepared = Vec::new();
        // List items carry no apiVersion/kind; templates name objects by them (render units
        // report refusals against `Kind namespace/name`), so fill them in as watch events have.
        let api_version = self.resource.api_version();
        let kind = crate::kinds::kind_of(&self.resource.resource);
        let defaults = [
            ("apiVersion", api_version.as_str()),
            ("kind", kind.as_str()),
        ];
        // Items are parsed straight into documents, page by page: the list is never held as
        // parsed JSON.
        let rv = self.client.list_docs(
            &self.resource,
            self.namespace.as_deref(),
            &self.params,
            shape,
            &defaults,
            |item| match item.doc {
                Ok(doc) => {
                    if item.selected && doc_key(&doc).is_some() {
                        prepared.push(doc);
                    }
                }
                Err(e) => log::warn!("resource={} {e}", self.name),
            },
        )?;
        self.write(|s| {
            // The listed keys are collected only now and dropped before the store grows: held
            // while the pages were parsed, they were small blocks between the documents, and
            // the holes they left stayed in the heap for as long as the documents did.
            let mut seen: Vec<ObjectKey> = prepared.iter().filter_map(doc_key).collect();
            seen.sort_unstable();
            let stale: Vec<_> = s
                .keys()
                .filter(|k| seen.binary_search(k).is_err())
                .collect();
            drop(seen);
            for key in stale {
                s.delete(&key);
            }
            for doc in prepared {
                if let Err(e) = s.upsert(Arc::new(doc)) {
                    log::warn!("resource={} {e}", self.name);
                }
            }
        });
        Ok(rv)
    }

    fn watch(
        &self,
        shape: &Arc<Shape>,
        resource_version: &mut String,
    ) -> Result<WatchEnd, KubeError> {
        let timeout = self.watch_timeout.as_secs().max(1) as u32;
        let stream = self.client.watch(
            &self.resource,
            self.namespace.as_deref(),
            &self.params,
            resource_version,
            timeout,
        )?;
        for event in stream.shaped(shape.clone()) {
            if self.stopped() {
                return Ok(WatchEnd::Stopped);
            }
            let event = match event {
                Ok(e) => e,
                Err(e) => return Ok(WatchEnd::Relist(format!("watch broke: {e}"))),
            };
            let object = event.object.doc.as_ref().ok().map(|d| d.root());
            let rv = object
                .and_then(|o| o.pointer(&["metadata", "resourceVersion"]))
                .and_then(NodeRef::as_str)
                .map(str::to_string);
            match event.kind.as_str() {
                "ADDED" | "MODIFIED" => {
                    self.apply(event.object);
                    self.notify();
                }
                "DELETED" => {
                    if let Some(key) = event.object.doc.as_ref().ok().and_then(doc_key) {
                        self.write(|s| {
                            s.delete(&key);
                        });
                    }
                    self.notify();
                }
                "BOOKMARK" => {}
                "ERROR" => {
                    let code = object
                        .and_then(|o| o.get("code"))
                        .and_then(NodeRef::as_u64)
                        .unwrap_or(0);
                    let message = object
                        .and_then(|o| o.get("message"))
                        .and_then(NodeRef::as_str)
                        .unwrap_or_default();
                    return Ok(WatchEnd::Relist(format!("watch error {code}: {message}")));
                }
                other => log::debug!("resource={} ignoring watch event type {other:?}", self.name),
            }
            if let Some(rv) = rv {
                *resource_version = rv;
            }
        }
        Ok(WatchEnd::Expired)
    }

    /// Runs until `stop` is set.
    pub fn run(mut self) {
        let shape = Arc::new(Shape::new(self.filter.clone()));
        let mut backoff = Backoff::default();
        let mut resource_version: Option<String> = None;
        let mut relist_reason = "initial list".to_string();
        while !self.stopped() {
            let rv = match resource_version.take() {
                Some(rv) => rv,
                None => match self.relist(&shape) {
                    Ok(rv) => {
                        let first = !self.synced.swap(true, Ordering::SeqCst);
                        if first {
                            log::info!(
                                "resource={} synced objects={}",
                                self.name,
                                snapshot(&self.store).len()
                            );
                        } else {
                            log::info!("resource={} relisted reason={relist_reason:?}", self.name);
                            let _ = self.events.send(ReflectorEvent::Relisted {
                                name: self.name.clone(),
                                reason: relist_reason.clone(),
                            });
                        }
                        self.notify();
                        rv
                    }
                    Err(e) if e.is_bad_request() && self.params.field_selector.take().is_some() => {
                        // The API server selects by a few fields per built-in type (custom
                        // resources by their names only) and refuses others with a 400, in one
                        // of two wordings. Selected here instead (`filter`): every object is
                        // listed and watched.
                        log::info!(
                            "resource={} the API server cannot apply the field selector ({e}); the controller applies it to every object it receives",
                            self.name
                        );
                        continue;
                    }
                    Err(e) => {
                        let delay = backoff.delay();
                        log::warn!(
                            "resource={} list failed, retrying in {delay:?}: {e}",
                            self.name
                        );
                        self.pause(delay);
                        continue;
                    }
                },
            };
            let mut rv = rv;
            match self.watch(&shape, &mut rv) {
                Ok(WatchEnd::Expired) => {
                    backoff.reset();
                    resource_version = Some(rv);
                }
                Ok(WatchEnd::Stopped) => return,
                Ok(WatchEnd::Relist(reason)) => {
                    log::info!("resource={} {reason}; re-listing", self.name);
                    relist_reason = reason;
                }
                Err(e) if e.is_gone() => relist_reason = format!("{e}"),
                Err(e) => {
                    let delay = backoff.delay();
                    log::warn!(
                        "resource={} watch failed, re-listing in {delay:?}: {e}",
                        self.name
                    );
                    relist_reason = e.to_string();
                    self.pause(delay);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Backoff, SyncBarrier};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[test]
    fn barrier_waits_for_every_type() {
        let (a, b) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let mut barrier = SyncBarrier::default();
        barrier.add("ingresses", a.clone());
        barrier.add("services", b.clone());
        assert!(!barrier.is_synced());
        a.store(true, Ordering::SeqCst);
        assert_eq!(barrier.pending(), ["services"]);
        b.store(true, Ordering::SeqCst);
        assert!(barrier.is_synced());
    }
    use std::time::Duration;

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let mut b = Backoff::default();
        let first = b.delay();
        assert!(
            first >= Duration::from_millis(150) && first <= Duration::from_millis(250),
            "{first:?}"
        );
        let mut last = first;
        for _ in 0..20 {
            last = b.delay();
        }
        assert!(
            last <= Backoff::MAX && last >= Backoff::MAX.mul_f64(0.75),
            "{last:?}"
        );
        b.reset();
        assert!(b.delay() <= Duration::from_millis(250));
    }
}
