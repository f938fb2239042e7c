//! The objects the status writer gives a status, as the watch stores hold them. A new leader
//! starts from each object's status there instead of reading every object from the API server
//! (10,000 reads after a failover at 10,000 routes), and an object deleted and created again
//! under its name is told apart by its uid, however quickly that happened.
//!
//! The stores are read under their locks, never snapshotted: a snapshot alive while its
//! reflector writes would make that write copy the store's index.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::Value;

use super::watchers::Watchers;
use crate::kinds::plural_of;
use crate::kube::reflector::SharedStore;
use crate::render::context::StatusKey;
use crate::store::{Doc, ObjectKey, Store};

/// One watched object as its store holds it.
pub(crate) struct Seen {
    pub uid: Option<Arc<str>>,
    /// Its `status` (`Null` when it has none); `None` when the store strips it
    /// (`watchedResourcesIgnoreFields`), so it must be read from the API server.
    pub status: Option<Value>,
}

/// A store of one type that status keys name.
pub(crate) struct TypeStore {
    pub name: String,
    pub store: SharedStore,
    pub keeps_status: bool,
}

/// The stores of every type given a status, by (apiVersion, kind).
pub(crate) struct WatchedTypes {
    types: BTreeMap<(String, String), Vec<TypeStore>>,
}

fn read(store: &SharedStore) -> std::sync::RwLockReadGuard<'_, Arc<Store>> {
    store.read().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn uid_of(object: &Doc) -> Option<Arc<str>> {
    object
        .root()
        .pointer(&["metadata", "uid"])
        .and_then(|n| n.as_str())
        .map(Arc::from)
}

impl WatchedTypes {
    /// The stores of `kinds`; `None` while the watchers are busy (a config change or a
    /// discovery retry holds them during requests to the API server): the caller tries again
    /// on its next pass instead of waiting.
    pub(crate) fn find<'a>(
        watchers: &Mutex<Watchers>,
        kinds: impl Iterator<Item = &'a (String, String)>,
    ) -> Option<WatchedTypes> {
        let watchers = match watchers.try_lock() {
            Ok(w) => w,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        let types = kinds
            .map(|(api_version, kind)| {
                let stores = watchers.stores_of(api_version, &plural_of(kind));
                ((api_version.clone(), kind.clone()), stores)
            })
            .filter(|(_, stores)| !stores.is_empty())
            .collect();
        Some(WatchedTypes { types })
    }

    /// The object a status key names, from the first store of its type that holds it.
    pub(crate) fn seen(&self, key: &StatusKey) -> Option<Seen> {
        let (api_version, kind, namespace, name) = key;
        let stores = self.types.get(&(api_version.clone(), kind.clone()))?;
        let object_key = (namespace.clone(), name.clone());
        stores.iter().find_map(|s| {
            let store = read(&s.store);
            let object = store.get_by_key(&object_key)?;
            Some(Seen {
                uid: uid_of(object),
                status: s.keeps_status.then(|| {
                    object
                        .root()
                        .get("status")
                        .map_or(Value::Null, |n| n.to_value())
                }),
            })
        })
    }

    /// The objects of `written` (status keys, each with what was written to it) that changed
    /// in their stores since the last call and that `stale` judges so: deleted and created
    /// again (another uid), or holding another status than the store vouched for. `versions`
    /// holds each store's version as of the last call; only what changed since is looked at
    /// where the store's change log tells (stores indexed by namespace and name), else every
    /// written object of the type.
    pub(crate) fn stale<W>(
        &self,
        written: &BTreeMap<StatusKey, W>,
        versions: &mut BTreeMap<String, u64>,
        stale: impl Fn(&W, &Doc) -> bool,
    ) -> Vec<StatusKey> {
        let mut found = Vec::new();
        for ((api_version, kind), stores) in &self.types {
            for s in stores {
                let store = read(&s.store);
                let version = store.version();
                let last = versions.insert(s.name.clone(), version);
                if last == Some(version) {
                    continue;
                }
                let mut check = |key: &StatusKey, w: &W| {
                    let object_key: ObjectKey = (key.2.clone(), key.3.clone());
                    if store.get_by_key(&object_key).is_some_and(|o| stale(w, o)) {
                        found.push(key.clone());
                    }
                };
                let changed = last
                    .filter(|_| store.indexed_by_object_key())
                    .and_then(|last| store.changes_since(last));
                match changed {
                    Some(keys) => {
                        for k in keys {
                            if let [namespace, name] = k {
                                let key = (
                                    api_version.clone(),
                                    kind.clone(),
                                    namespace.clone(),
                                    name.clone(),
                                );
                                if let Some(w) = written.get(&key) {
                                    check(&key, w);
                                }
                            }
                        }
                    }
                    None => {
                        for (key, w) in written {
                            if key.0 == *api_version && key.1 == *kind {
                                check(key, w);
                            }
                        }
                    }
                }
            }
        }
        // A store's log names an object once per change.
        found.sort();
        found.dedup();
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::RwLock;

    fn ingress(name: &str, uid: &str) -> Value {
        json!({"metadata": {"namespace": "ns", "name": name, "uid": uid}, "status": {"loadBalancer": {}}})
    }

    fn key(name: &str) -> StatusKey {
        (
            "networking.k8s.io/v1".into(),
            "Ingress".into(),
            "ns".into(),
            name.into(),
        )
    }

    fn watched(index_by: &[&str], keeps_status: bool) -> (WatchedTypes, SharedStore) {
        let index_by: Vec<String> = index_by.iter().map(|s| s.to_string()).collect();
        let store: SharedStore = Arc::new(RwLock::new(Arc::new(Store::indexed_by(&index_by))));
        let types = BTreeMap::from([(
            ("networking.k8s.io/v1".to_string(), "Ingress".to_string()),
            vec![TypeStore {
                name: "ingresses".into(),
                store: store.clone(),
                keeps_status,
            }],
        )]);
        (WatchedTypes { types }, store)
    }

    fn upsert(store: &SharedStore, object: Value) {
        let mut guard = store.write().unwrap();
        Arc::make_mut(&mut guard).upsert_value(&object).unwrap();
    }

    /// An object deleted and created again is told by its uid, whether the store's change log
    /// names it (indexed by namespace and name) or every written object is looked at.
    #[test]
    fn objects_created_again_are_told_by_their_uid() {
        for index_by in [
            &["metadata.namespace", "metadata.name"][..],
            &["metadata.name"],
        ] {
            let (watched, store) = watched(index_by, true);
            for name in ["a", "b", "c"] {
                upsert(&store, ingress(name, &format!("{name}-1")));
            }
            let mut written: BTreeMap<StatusKey, Option<Arc<str>>> = ["a", "b"]
                .iter()
                .map(|n| (key(n), Some(Arc::from(format!("{n}-1")))))
                .collect();
            let mut versions = BTreeMap::new();
            let mut recreated = |written: &mut BTreeMap<StatusKey, Option<Arc<str>>>| {
                let found = watched.stale(written, &mut versions, |was, object| {
                    was.is_some() && uid_of(object).is_some_and(|now| Some(now) != *was)
                });
                // As the status writer does: written again, to the new object.
                for key in &found {
                    written.remove(key);
                }
                found
            };
            assert!(recreated(&mut written).is_empty());
            // Replaced in one step (a re-list), changed in place, and one not written to.
            upsert(&store, ingress("b", "b-2"));
            upsert(&store, ingress("a", "a-1"));
            upsert(&store, ingress("c", "c-2"));
            upsert(&store, ingress("b", "b-2"));
            assert_eq!(recreated(&mut written), vec![key("b")], "{index_by:?}");
            written.insert(key("b"), Some(Arc::from("b-2")));
            assert!(recreated(&mut written).is_empty(), "nothing changed since");
            // Gone from the store: not created again (the next render leaves it out).
            let mut guard = store.write().unwrap();
            Arc::make_mut(&mut guard).delete(&("ns".into(), "a".into()));
            drop(guard);
            assert!(recreated(&mut written).is_empty());
            upsert(&store, ingress("a", "a-3"));
            assert_eq!(recreated(&mut written), vec![key("a")], "{index_by:?}");
        }
    }

    /// The status as watched, unless the store strips it; objects not watched are not seen.
    #[test]
    fn the_status_as_watched_unless_stripped() {
        for keeps_status in [true, false] {
            let (watched, store) = watched(&["metadata.namespace", "metadata.name"], keeps_status);
            upsert(&store, ingress("a", "a-1"));
            let seen = watched.seen(&key("a")).unwrap();
            assert_eq!(seen.uid.as_deref(), Some("a-1"));
            assert_eq!(
                seen.status,
                keeps_status.then(|| json!({"loadBalancer": {}}))
            );
            assert!(watched.seen(&key("missing")).is_none());
            let mut other = key("a");
            other.1 = "Gateway".into();
            assert!(watched.seen(&other).is_none());
        }
    }
}
