//! The set of running reflectors, one per watched resource plus the HAProxy pods. A config
//! change restarts only the reflectors whose definition changed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crossbeam_channel::Sender;

use crate::config::model::HAPROXY_PODS;
use crate::config::Spec;
use crate::kube::client::{Client, ListParams, ResourceRef};
use crate::kube::reflector::{snapshot, Reflector, ReflectorEvent, SharedStore, SyncBarrier};
use crate::store::selector::LabelSelector;
use crate::store::{ObjectFilter, Store};

/// Everything that defines one reflector; a change of any part restarts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchDef {
    pub api_version: String,
    pub resources: String,
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
    pub index_by: Vec<String>,
    pub ignore_fields: Vec<String>,
}

impl WatchDef {
    /// Objects keep their `status` in the store (no ignored field removes it).
    pub fn keeps_status(&self) -> bool {
        !self.ignore_fields.iter().any(|f| {
            crate::store::path::PathExpr::parse(f).is_ok_and(|p| {
                p.steps().first() == Some(&crate::store::path::Step::Key("status".into()))
            })
        })
    }
}

struct Running {
    def: WatchDef,
    store: SharedStore,
    synced: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// Discovery has not found the resource yet (not served, or the API server did not
    /// answer); the store stays empty and discovery is retried.
    undiscovered: Option<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

pub struct Watchers {
    client: Client,
    events: Sender<ReflectorEvent>,
    running: BTreeMap<String, Running>,
}

/// The definitions a spec asks for, including the auto-injected HAProxy pods watcher.
pub fn definitions(spec: &Spec, controller_namespace: &str) -> BTreeMap<String, WatchDef> {
    let mut defs: BTreeMap<String, WatchDef> = spec
        .watched_resources
        .iter()
        .map(|(name, r)| {
            let def = WatchDef {
                api_version: r.api_version.clone(),
                resources: r.resources.clone(),
                namespace: r.namespace.clone().filter(|n| !n.is_empty()),
                label_selector: r.label_selector.clone().filter(|s| !s.is_empty()),
                field_selector: r.field_selector.clone().filter(|s| !s.is_empty()),
                index_by: r.index_by.clone(),
                ignore_fields: spec.watched_resources_ignore_fields.clone(),
            };
            (name.clone(), def)
        })
        .collect();
    let pods = LabelSelector::from_match_labels(&spec.pod_selector.match_labels);
    defs.insert(
        HAPROXY_PODS.into(),
        WatchDef {
            api_version: "v1".into(),
            resources: "pods".into(),
            namespace: Some(controller_namespace.into()),
            label_selector: Some(pods.as_query().to_string()),
            field_selector: None,
            index_by: vec!["metadata.namespace".into(), "metadata.name".into()],
            ignore_fields: vec!["metadata.managedFields".into()],
        },
    );
    defs
}

impl Watchers {
    pub fn new(client: Client, events: Sender<ReflectorEvent>) -> Watchers {
        Watchers {
            client,
            events,
            running: BTreeMap::new(),
        }
    }

    /// Starts, restarts and stops reflectors so they match `defs`; returns the names whose
    /// reflector (re)started. A resource the API server does not serve (a Gateway API CRD not
    /// installed, say) does not block the config: its store stays empty, it counts as synced,
    /// and discovery is retried by [`Watchers::retry_discovery`]. When discovery itself fails
    /// (API server unreachable), the store is not synced, so nothing renders from a guess.
    pub fn apply(&mut self, defs: &BTreeMap<String, WatchDef>) -> Vec<String> {
        let mut changed: Vec<String> = self
            .running
            .keys()
            .filter(|k| !defs.contains_key(*k))
            .cloned()
            .collect();
        self.running.retain(|k, _| defs.contains_key(k));
        for (name, def) in defs {
            if self.running.get(name).is_some_and(|r| r.def == *def) {
                continue;
            }
            self.running.remove(name);
            self.discover_and_start(name, def.clone());
            changed.push(name.clone());
        }
        changed
    }

    /// Retries discovery of resources not found yet; returns those now watched.
    pub fn retry_discovery(&mut self) -> Vec<String> {
        let pending: Vec<(String, WatchDef)> = self
            .running
            .iter()
            .filter(|(_, r)| r.undiscovered.is_some())
            .map(|(n, r)| (n.clone(), r.def.clone()))
            .collect();
        let mut started = Vec::new();
        for (name, def) in pending {
            if self
                .client
                .is_namespaced(&def.api_version, &def.resources)
                .is_ok()
            {
                self.running.remove(&name);
                self.discover_and_start(&name, def);
                started.push(name);
            }
        }
        started
    }

    /// The resources still waiting for discovery, with the reason (for status and logs).
    pub fn undiscovered(&self) -> Vec<String> {
        self.running
            .iter()
            .filter_map(|(n, r)| r.undiscovered.as_ref().map(|why| format!("{n}: {why}")))
            .collect()
    }

    fn discover_and_start(&mut self, name: &str, def: WatchDef) {
        match self.client.is_namespaced(&def.api_version, &def.resources) {
            Ok(namespaced) => self.start(name, def, namespaced),
            Err(e) => {
                let served_elsewhere = e.code().is_some_and(|c| c == 404);
                if served_elsewhere {
                    log::warn!("resource={name} {} {} is not served by the API server; its store stays empty until it is", def.api_version, def.resources);
                } else {
                    log::warn!("resource={name} discovery failed, will retry: {e}");
                }
                let store = Store::indexed_by(&def.index_by);
                self.running.insert(
                    name.to_string(),
                    Running {
                        def,
                        store: Arc::new(RwLock::new(Arc::new(store))),
                        synced: Arc::new(AtomicBool::new(served_elsewhere)),
                        stop: Arc::new(AtomicBool::new(false)),
                        undiscovered: Some(e.to_string()),
                    },
                );
            }
        }
    }

    fn start(&mut self, name: &str, def: WatchDef, namespaced: bool) {
        let store: SharedStore = Arc::new(RwLock::new(Arc::new(Store::indexed_by(&def.index_by))));
        let synced = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let filter = ObjectFilter::new(&def.ignore_fields, def.field_selector.as_deref());
        let reflector = Reflector {
            name: name.to_string(),
            client: self.client.clone(),
            resource: ResourceRef::new(&def.api_version, &def.resources, namespaced),
            namespace: def.namespace.clone(),
            params: ListParams {
                label_selector: def.label_selector.clone(),
                // Sent to the API server, so that objects it leaves out are never transferred
                // or held (a Secret watch without Helm's release Secrets); a field the type
                // cannot be selected by there is selected here (`filter`) alone. Sent as it is
                // read here (trimmed, values escaped).
                field_selector: filter.field_selector.as_ref().map(|f| f.to_query()),
                limit: Some(500),
            },
            filter,
            store: store.clone(),
            synced: synced.clone(),
            stop: stop.clone(),
            events: self.events.clone(),
            watch_timeout: Duration::from_secs(290),
        };
        let thread_name = format!("watch-{name}");
        if let Err(e) = std::thread::Builder::new()
            .name(thread_name)
            .spawn(move || reflector.run())
        {
            log::error!("resource={name} cannot start its watcher thread: {e}");
        }
        log::info!(
            "resource={name} watching {} {}",
            def.api_version,
            def.resources
        );
        self.running.insert(
            name.to_string(),
            Running {
                def,
                store,
                synced,
                stop,
                undiscovered: None,
            },
        );
    }

    pub fn barrier(&self) -> SyncBarrier {
        let mut barrier = SyncBarrier::default();
        for (name, r) in &self.running {
            barrier.add(name, r.synced.clone());
        }
        barrier
    }

    /// Cheap snapshots of every store, for one render.
    pub fn snapshot(&self) -> BTreeMap<String, Arc<Store>> {
        self.running
            .iter()
            .map(|(name, r)| (name.clone(), snapshot(&r.store)))
            .collect()
    }

    pub fn store(&self, name: &str) -> Option<Arc<Store>> {
        self.running.get(name).map(|r| snapshot(&r.store))
    }

    /// The stores watching `resources` of `api_version` (shared, not snapshots).
    pub(crate) fn stores_of(
        &self,
        api_version: &str,
        resources: &str,
    ) -> Vec<super::watched::TypeStore> {
        self.running
            .iter()
            .filter(|(_, r)| r.def.api_version == api_version && r.def.resources == resources)
            .map(|(name, r)| super::watched::TypeStore {
                name: name.clone(),
                store: r.store.clone(),
                keeps_status: r.def.keeps_status(),
            })
            .collect()
    }

    pub fn stop_all(&mut self) {
        self.running.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::WatchDef;

    #[test]
    fn a_store_keeps_status_unless_an_ignored_field_strips_it() {
        let def = |ignore: &[&str]| WatchDef {
            api_version: "v1".into(),
            resources: "services".into(),
            namespace: None,
            label_selector: None,
            field_selector: None,
            index_by: vec![],
            ignore_fields: ignore.iter().map(|s| s.to_string()).collect(),
        };
        assert!(def(&[]).keeps_status());
        assert!(def(&["metadata.managedFields", "spec.status", "statuses"]).keeps_status());
        for strips in [
            "status",
            ".status.loadBalancer",
            "{status.conditions}",
            "['status']",
        ] {
            assert!(!def(&[strips]).keeps_status(), "{strips}");
        }
    }
}
