//! The object store: every object of every type under one global resourceVersion counter, with
//! enough history to serve lists at an older version, continue tokens and watches that resume
//! from a version, and a compaction point below which the history is gone (`410`).
//!
//! Keys are `(group-resource, namespace, name)`; each key keeps its versions (a deletion is a
//! tombstone) back to the compaction point. Watchers register here and receive every committed
//! event of their type through a channel, sent while the store lock is held so that the initial
//! state a watch starts from and the live events that follow can never overlap or leave a gap.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_channel::{unbounded, Receiver, Sender};
use serde_json::Value;

use crate::registry::Registry;
use crate::status::ApiError;

/// Group-resource, namespace (`""` when cluster-scoped), name.
pub type Key = (String, String, String);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub group_resource: String,
    pub namespace: String,
    pub kind: EventType,
    /// The new object, or for a deletion the last state stamped with the deletion's version.
    pub object: Arc<Value>,
    /// The state before the change (for selector transitions in watches).
    pub old: Option<Arc<Value>>,
}

/// What a watcher's channel carries.
pub enum WatchMsg {
    Event(Arc<Event>),
    /// End the watch: cleanly (terminating chunk) or abruptly (socket shut down).
    Close {
        abrupt: bool,
    },
}

struct Watcher {
    id: u64,
    group_resource: String,
    namespace: Option<String>,
    tx: Sender<WatchMsg>,
}

struct Version {
    rv: u64,
    obj: Option<Arc<Value>>,
}

/// The precondition for a write.
pub enum Expect {
    /// Create: the key must not exist.
    Absent,
    /// The stored object must have exactly this resourceVersion.
    Version(u64),
}

/// Why a write was refused.
#[derive(Debug, PartialEq)]
pub enum CommitError {
    AlreadyExists,
    NotFound,
    Conflict,
}

struct Inner {
    rv: u64,
    registry: Registry,
    objects: BTreeMap<Key, Vec<Version>>,
    history: VecDeque<Arc<Event>>,
    compacted: u64,
    watchers: Vec<Watcher>,
    next_watcher: u64,
}

/// The shared store.
pub struct Store {
    inner: Mutex<Inner>,
    history_limit: usize,
}

/// Where a new watch starts.
pub enum WatchStart {
    /// Synthetic `ADDED` events for the current state, then live events.
    Current,
    /// Every event after this version, then live events.
    After(u64),
}

/// A registered watch: its channel, the events to send first, and its id for unregistering.
pub struct Registration {
    pub id: u64,
    pub rx: Receiver<WatchMsg>,
    pub initial: Vec<Arc<Event>>,
    pub start_rv: u64,
    /// Live events at or below this version are not for this watch (a start version newer
    /// than the store's current one).
    pub skip_through: u64,
}

pub const CRD_RESOURCE: &str = "customresourcedefinitions.apiextensions.k8s.io";

impl Store {
    /// An empty store that keeps at least `history_limit` events before compacting.
    pub fn new(history_limit: usize) -> Store {
        Store {
            inner: Mutex::new(Inner {
                rv: 1,
                registry: Registry::builtin(),
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                compacted: 1,
                watchers: Vec::new(),
                next_watcher: 1,
            }),
            history_limit: history_limit.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves consistent data (every mutation is applied in one
        // step), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn registry(&self) -> Registry {
        self.lock().registry.clone()
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub fn compacted_rv(&self) -> u64 {
        self.lock().compacted
    }

    /// The current state of one object.
    pub fn get(&self, group_resource: &str, namespace: &str, name: &str) -> Option<Arc<Value>> {
        let inner = self.lock();
        let key = (
            group_resource.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        inner
            .objects
            .get(&key)
            .and_then(|v| v.last())
            .and_then(|v| v.obj.clone())
    }

    /// Objects of a type (in one namespace or all), ordered by namespace then name, as they were
    /// at version `at` (current when `None`). Returns the version the list represents.
    pub fn list(
        &self,
        group_resource: &str,
        namespace: Option<&str>,
        at: Option<u64>,
    ) -> Result<(u64, Vec<Arc<Value>>), ApiError> {
        let inner = self.lock();
        let at = at.unwrap_or(inner.rv);
        if at < inner.compacted {
            return Err(ApiError::expired(format!(
                "too old resource version: {at} ({})",
                inner.compacted
            )));
        }
        let start = (
            group_resource.to_string(),
            namespace.unwrap_or("").to_string(),
            String::new(),
        );
        let mut items = Vec::new();
        for ((gr, ns, _), versions) in inner.objects.range(start..) {
            if gr != group_resource || namespace.is_some_and(|n| n != ns) {
                break;
            }
            if let Some(obj) = versions
                .iter()
                .rev()
                .find(|v| v.rv <= at)
                .and_then(|v| v.obj.clone())
            {
                items.push(obj);
            }
        }
        Ok((at.min(inner.rv), items))
    }

    /// Applies one write. The new object gets the next resourceVersion; a deletion (`new` is
    /// `None`) stamps the last state with it. Deleting a namespace also deletes what it held;
    /// writing a CRD updates the registry, deleting one removes its objects.
    pub fn commit(
        &self,
        group_resource: &str,
        namespace: &str,
        name: &str,
        expect: Expect,
        new: Option<Value>,
    ) -> Result<Arc<Value>, CommitError> {
        let mut inner = self.lock();
        let key = (
            group_resource.to_string(),
            namespace.to_string(),
            name.to_string(),
        );
        let current = inner
            .objects
            .get(&key)
            .and_then(|v| v.last())
            .and_then(|v| v.obj.clone());
        match (&expect, &current) {
            (Expect::Absent, Some(_)) => return Err(CommitError::AlreadyExists),
            (Expect::Version(_), None) => return Err(CommitError::NotFound),
            (Expect::Version(v), Some(cur)) if object_rv(cur) != *v => {
                return Err(CommitError::Conflict)
            }
            _ => {}
        }
        if group_resource == CRD_RESOURCE {
            if let Some(crd) = &new {
                // Validated by the caller before commit; a failure here leaves the registry alone.
                let _ = inner.registry.apply_crd(crd);
            }
        }
        // What a namespace or CRD held goes first, so watchers never see orphans.
        if new.is_none() && current.is_some() {
            if group_resource == "namespaces" {
                inner.delete_where(|k| k.1 == name && k.0 != "namespaces", self.history_limit);
            }
            if group_resource == CRD_RESOURCE {
                if let Some(t) = inner.registry.find_group_resource(name) {
                    let gr = t.group_resource();
                    inner.delete_where(|k| k.0 == gr, self.history_limit);
                }
                inner.registry.remove_crd(name);
            }
        }
        let result = inner.write(&key, current, new, self.history_limit);
        Ok(result.0)
    }

    /// Registers a watch on a type (optionally one namespace).
    pub fn watch(
        &self,
        group_resource: &str,
        namespace: Option<&str>,
        start: WatchStart,
    ) -> Result<Registration, ApiError> {
        let mut inner = self.lock();
        let skip_through = match start {
            WatchStart::After(rv) => rv,
            WatchStart::Current => 0,
        };
        let initial: Vec<Arc<Event>> = match start {
            WatchStart::Current => {
                let start_key = (
                    group_resource.to_string(),
                    namespace.unwrap_or("").to_string(),
                    String::new(),
                );
                inner
                    .objects
                    .range(start_key..)
                    .take_while(|((gr, ns, _), _)| {
                        gr == group_resource && namespace.is_none_or(|n| n == ns)
                    })
                    .filter_map(|((gr, ns, _), v)| {
                        let obj = v.last()?.obj.clone()?;
                        Some(Arc::new(Event {
                            rv: object_rv(&obj),
                            group_resource: gr.clone(),
                            namespace: ns.clone(),
                            kind: EventType::Added,
                            object: obj,
                            old: None,
                        }))
                    })
                    .collect()
            }
            WatchStart::After(rv) => {
                if rv < inner.compacted {
                    return Err(ApiError::new(
                        410,
                        "Expired",
                        format!("too old resource version: {rv} ({})", inner.compacted),
                    ));
                }
                inner
                    .history
                    .iter()
                    .filter(|e| {
                        e.rv > rv
                            && e.group_resource == group_resource
                            && namespace.is_none_or(|n| n == e.namespace)
                    })
                    .cloned()
                    .collect()
            }
        };
        let (tx, rx) = unbounded();
        let id = inner.next_watcher;
        inner.next_watcher += 1;
        inner.watchers.push(Watcher {
            id,
            group_resource: group_resource.to_string(),
            namespace: namespace.map(str::to_string),
            tx,
        });
        Ok(Registration {
            id,
            rx,
            initial,
            start_rv: inner.rv,
            skip_through,
        })
    }

    pub fn unwatch(&self, id: u64) {
        self.lock().watchers.retain(|w| w.id != id);
    }

    /// Number of open watches (for tests and the control endpoint).
    pub fn watch_count(&self) -> usize {
        self.lock().watchers.len()
    }

    /// Ends every open watch.
    pub fn close_watches(&self, abrupt: bool) -> usize {
        let mut inner = self.lock();
        let n = inner.watchers.len();
        for w in inner.watchers.drain(..) {
            let _ = w.tx.send(WatchMsg::Close { abrupt });
        }
        n
    }

    /// Forgets all history: every version older than the current one now answers `410`.
    pub fn compact(&self) -> u64 {
        let mut inner = self.lock();
        inner.compacted = inner.rv;
        inner.history.clear();
        inner.prune_all();
        inner.compacted
    }
}

impl Inner {
    fn write(
        &mut self,
        key: &Key,
        current: Option<Arc<Value>>,
        new: Option<Value>,
        history_limit: usize,
    ) -> (Arc<Value>, EventType) {
        self.rv += 1;
        let rv = self.rv;
        let (kind, mut obj) = match (new, &current) {
            (Some(n), None) => (EventType::Added, n),
            (Some(n), Some(_)) => (EventType::Modified, n),
            (None, Some(c)) => (EventType::Deleted, (**c).clone()),
            // Callers check existence first; deleting nothing records nothing.
            (None, None) => return (Arc::new(Value::Null), EventType::Deleted),
        };
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
        }
        let obj = Arc::new(obj);
        let stored = if kind == EventType::Deleted {
            None
        } else {
            Some(obj.clone())
        };
        let versions = self.objects.entry(key.clone()).or_default();
        versions.push(Version { rv, obj: stored });
        prune_versions(versions, self.compacted);
        let event = Arc::new(Event {
            rv,
            group_resource: key.0.clone(),
            namespace: key.1.clone(),
            kind,
            object: obj.clone(),
            old: current,
        });
        self.watchers.retain(|w| {
            if w.group_resource != event.group_resource
                || w.namespace.as_ref().is_some_and(|n| *n != event.namespace)
            {
                return true;
            }
            w.tx.send(WatchMsg::Event(event.clone())).is_ok()
        });
        self.history.push_back(event);
        if self.history.len() > history_limit + history_limit / 10 {
            while self.history.len() > history_limit {
                if let Some(e) = self.history.pop_front() {
                    self.compacted = e.rv;
                }
            }
            self.prune_all();
        }
        (obj, kind)
    }

    fn delete_where(&mut self, pred: impl Fn(&Key) -> bool, history_limit: usize) {
        let doomed: Vec<(Key, Arc<Value>)> = self
            .objects
            .iter()
            .filter(|(k, _)| pred(k))
            .filter_map(|(k, v)| Some((k.clone(), v.last()?.obj.clone()?)))
            .collect();
        for (k, obj) in doomed {
            self.write(&k, Some(obj), None, history_limit);
        }
    }

    fn prune_all(&mut self) {
        let compacted = self.compacted;
        self.objects.retain(|_, versions| {
            prune_versions(versions, compacted);
            !versions.is_empty()
        });
    }
}

/// Drops versions no list can ask for any more: all but the newest at or below the compaction
/// point, and that one too when it is a tombstone.
fn prune_versions(versions: &mut Vec<Version>, compacted: u64) {
    let old = versions.iter().take_while(|v| v.rv <= compacted).count();
    if old > 1 {
        versions.drain(..old - 1);
    }
    if versions
        .first()
        .is_some_and(|v| v.rv <= compacted && v.obj.is_none())
    {
        versions.remove(0);
    }
}

/// The numeric `metadata.resourceVersion` of a stored object.
pub fn object_rv(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(name: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default"}})
    }

    #[test]
    fn versions_lists_and_compaction() {
        let s = Store::new(100);
        let a = s
            .commit("services", "default", "a", Expect::Absent, Some(obj("a")))
            .unwrap();
        let rv_a = object_rv(&a);
        s.commit("services", "default", "b", Expect::Absent, Some(obj("b")))
            .unwrap();
        assert_eq!(
            s.commit("services", "default", "a", Expect::Absent, Some(obj("a"))),
            Err(CommitError::AlreadyExists)
        );
        assert_eq!(
            s.commit(
                "services",
                "default",
                "a",
                Expect::Version(rv_a + 7),
                Some(obj("a"))
            ),
            Err(CommitError::Conflict)
        );
        s.commit("services", "default", "a", Expect::Version(rv_a), None)
            .unwrap();
        let (_, now) = s.list("services", None, None).unwrap();
        assert_eq!(now.len(), 1);
        let (_, then) = s.list("services", Some("default"), Some(rv_a + 1)).unwrap();
        assert_eq!(then.len(), 2);
        s.compact();
        assert_eq!(s.list("services", None, Some(rv_a)).unwrap_err().code, 410);
        assert!(s.watch("services", None, WatchStart::After(rv_a)).is_err());
    }

    #[test]
    fn watchers_get_events_after_their_start() {
        let s = Store::new(100);
        s.commit("services", "default", "a", Expect::Absent, Some(obj("a")))
            .unwrap();
        let reg = s.watch("services", None, WatchStart::Current).unwrap();
        assert_eq!(reg.initial.len(), 1);
        s.commit("services", "default", "b", Expect::Absent, Some(obj("b")))
            .unwrap();
        match reg.rx.try_recv() {
            Ok(WatchMsg::Event(e)) => assert_eq!(e.kind, EventType::Added),
            _ => panic!("expected an event"),
        }
        let replay = s
            .watch(
                "services",
                None,
                WatchStart::After(object_rv(&reg.initial[0].object)),
            )
            .unwrap();
        assert_eq!(replay.initial.len(), 1);
    }

    #[test]
    fn history_limit_moves_the_compaction_point() {
        let s = Store::new(10);
        for i in 0..30 {
            s.commit(
                "configmaps",
                "default",
                &format!("c{i}"),
                Expect::Absent,
                Some(obj("x")),
            )
            .unwrap();
        }
        assert!(s.compacted_rv() > 1);
        assert!(s.watch("configmaps", None, WatchStart::After(1)).is_err());
    }
}
