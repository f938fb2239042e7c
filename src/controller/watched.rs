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

use super::state::lock;
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
    pub(crate) fn find<'a>(
        watchers: &Mutex<Watchers>,
        kinds: impl Iterator<Item = &'a (String, String)>,
    ) -> WatchedTypes {
        let watchers = lock(watchers);
        let types = kinds
            .map(|(api_version, kind)| {
                let stores = watchers.stores_of(api_version, &plural_of(kind));
                ((api_version.clone(), kind.clone()), stores)
            })
            .filter(|(_, stores)| !stores.is_empty())
            .collect();
        WatchedTypes { types }
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

    /// The objects of `written` (status keys, each with the uid its status was written for)
    /// that their stores now hold under another uid: deleted and created again since. `versions`
    /// holds each store's version as of the last call; only what changed since is looked at
    /// where the store's change log tells (stores indexed by namespace and name).
    pub(crate) fn recreated<W>(
        &self,
        written: &BTreeMap<StatusKey, W>,
        uid: impl Fn(&W) -> Option<&Arc<str>>,
        versions: &mut BTreeMap<String, u64>,
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
                let changed: Option<Vec<StatusKey>> = last
                    .filter(|_| store.indexed_by_object_key())
                    .and_then(|last| store.changes_since(last))
                    .map(|keys| {
                        keys.filter_map(|k| match k {
                            [namespace, name] => Some((
                                api_version.clone(),
                                kind.clone(),
                                namespace.clone(),
                                name.clone(),
                            )),
                            _ => None,
                        })
                        .collect()
                    });
                let keys = changed.unwrap_or_else(|| {
                    written
                        .keys()
                        .filter(|k| k.0 == *api_version && k.1 == *kind)
                        .cloned()
                        .collect()
                });
                for key in keys {
                    let Some(was) = written.get(&key).and_then(&uid) else {
                        continue;
                    };
                    let object_key: ObjectKey = (key.2.clone(), key.3.clone());
                    let now = store.get_by_key(&object_key).and_then(|o| uid_of(o));
                    if now.is_some_and(|now| now != *was) {
                        found.push(key);
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
                let found = watched.recreated(written, |u| u.as_ref(), &mut versions);
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
