//! The status writer (acts only on the leader): `HAProxyTemplateConfig.status` (conditions
//! Valid/Rendered/Deployed), the published `HAProxyCfg`, statuses templates declare through
//! `status.set`, and Kubernetes Events for failures and recoveries. Everything is written only
//! when it changed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use serde_json::{json, Value};

use super::state::{lock, Shared};
use super::watched::{uid_of, Seen, WatchedTypes};
use crate::deploy::{NotAdmitted, Published};
use crate::kinds::plural_of;
use crate::kube::client::{Client, ResourceRef};
use crate::kube::lease::rfc3339;
use crate::render::context::StatusUpdate;

/// Templates have no clock (and must render deterministically), so condition times are filled
/// in here: `lastTransitionTime` is kept from the previous write while a condition's status is
/// unchanged, and set to `now` when it changes or is new. Conditions are matched by `type`
/// within the same place: list elements are matched by `name`, `parentRef`, `ancestorRef`
/// (policy statuses) or position.
pub(crate) fn stamp_conditions(status: &mut Value, previous: Option<&Value>, now: &str) {
    match status {
        Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                let old = previous.and_then(|p| p.get(key));
                if key == "conditions" {
                    if let Value::Array(conditions) = value {
                        for c in conditions.iter_mut() {
                            if c.get("lastTransitionTime").is_some_and(|t| !t.is_null()) {
                                continue;
                            }
                            let same = old.and_then(Value::as_array).and_then(|list| {
                                list.iter().find(|o| o.get("type") == c.get("type"))
                            });
                            let time = match same {
                                Some(o) if o.get("status") == c.get("status") => o
                                    .get("lastTransitionTime")
                                    .cloned()
                                    .unwrap_or_else(|| json!(now)),
                                _ => json!(now),
                            };
                            // A condition that is no object (a template's mistake, or another
                            // controller's entry copied over) is left as it is.
                            if let Some(fields) = c.as_object_mut() {
                                fields.insert("lastTransitionTime".into(), time);
                            }
                        }
                    }
                } else {
                    stamp_conditions(value, old, now);
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                let old_list = previous.and_then(Value::as_array);
                let identity = ["name", "parentRef", "ancestorRef"]
                    .into_iter()
                    .find_map(|k| item.get(k).map(|v| (k, v.clone())));
                let matched = old_list.and_then(|list| match &identity {
                    Some((k, v)) => list.iter().find(|o| o.get(*k) == Some(v)),
                    None => list.get(i),
                });
                stamp_conditions(item, matched, now);
            }
        }
        _ => {}
    }
}

/// Whether a JSON merge patch (RFC 7386) of `patch` leaves `target` as it is.
fn merge_leaves(target: &Value, patch: &Value) -> bool {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => p.iter().all(|(k, v)| match (t.get(k), v) {
            (None, Value::Null) => true,
            (Some(old), v) if !v.is_null() => merge_leaves(old, v),
            _ => false,
        }),
        (_, Value::Object(_)) => false,
        _ => target == patch,
    }
}

pub(crate) enum StatusMsg {
    ConfigValidation {
        generation: i64,
        error: Option<String>,
    },
    Reconciled {
        error: Option<(String, String)>,
    },
    Published(Arc<Published>),
    TemplateStatuses(Arc<Vec<StatusUpdate>>),
    /// The objects the last render left out (refused values, failed checks).
    Dropped(Vec<crate::render::Dropped>),
    /// Settings of the running config that differ from those the controller started with
    /// and take effect only after a restart (`field (new value)`); empty when none.
    RestartRequired(Vec<String>),
    Shutdown,
}

pub(crate) fn config_resource() -> ResourceRef {
    ResourceRef::new(
        crate::config::model::API_VERSION,
        "haproxytemplateconfigs",
        true,
    )
}

pub(crate) fn haproxycfg_resource() -> ResourceRef {
    ResourceRef::new(crate::config::model::API_VERSION, "haproxycfgs", true)
}

/// Every condition the controller sets on the HAProxyTemplateConfig.
const CONDITION_KINDS: [&str; 3] = ["Valid", "Rendered", "Deployed"];

#[derive(Clone, PartialEq)]
struct Condition {
    kind: &'static str,
    ok: bool,
    reason: String,
    message: String,
}

pub(crate) struct StatusWriter {
    pub client: Client,
    pub shared: Arc<Shared>,
    pub namespace: String,
    pub config_name: String,
    pub inbox: Receiver<StatusMsg>,
    /// Whose stores tell the objects' own statuses and uids.
    pub watchers: Arc<std::sync::Mutex<super::watchers::Watchers>>,
}

/// How often the leader reads the HAProxyCfg back. Debug builds (the tests) take
/// `HAPTIC_PUBLISH_CHECK_SECONDS`; release builds have no such knob.
fn publish_check_interval() -> Duration {
    #[cfg(debug_assertions)]
    if let Some(secs) = std::env::var("HAPTIC_PUBLISH_CHECK_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return Duration::from_secs(secs);
    }
    Duration::from_secs(60)
}

/// How many recent bundles the leader's status writer keeps to find the one the pods run
/// (each holds its configuration: 4.4 MB at 10,000 Ingresses).
const RECENT_BUNDLES: usize = 4;

#[derive(Default)]
struct Desired {
    generation: i64,
    validation: Option<Option<String>>,
    reconcile: Option<Option<(String, String)>>,
    published: Option<Arc<Published>>,
    /// The last [`RECENT_BUNDLES`] bundles, oldest first: the HAProxyCfg holds the newest one a
    /// pod runs, which during a burst of changes is seldom the latest.
    recent: std::collections::VecDeque<Arc<Published>>,
    templates: BTreeMap<(String, String, String, String), Arc<Value>>,
    /// The (apiVersion, kind) of every object in `templates`.
    kinds: std::collections::BTreeSet<(String, String)>,
    /// The list `templates` was built from (a render that changed no status sends the same).
    templates_from: Option<Arc<Vec<StatusUpdate>>>,
    dropped: Vec<crate::render::Dropped>,
    restart_required: Vec<String>,
}

impl Written {
    /// Backs off an object's status: 2 s after the first failure, doubling to 5 minutes.
    fn retry_later(&mut self, key: &crate::render::context::StatusKey) {
        let failures = self.retry.get(key).map_or(0, |(n, _)| *n) + 1;
        let wait = Duration::from_secs(2 << (failures - 1).min(8)).min(Duration::from_secs(300));
        self.retry
            .insert(key.clone(), (failures, Instant::now() + wait));
    }
}

/// A status written to one object.
struct WrittenStatus {
    desired: Arc<Value>,
    /// As written, with its condition times: the same `Arc` as `desired` when no condition was
    /// stamped, so that equal statuses of thousands of objects stay one value.
    stamped: Arc<Value>,
    /// The object written to; `None` when unknown (its uid is stripped or was not answered).
    uid: Option<Arc<str>>,
    /// Not written: a watch store showed it already (the store may have been behind, so a
    /// change of the object there that shows another status makes it due again).
    seeded: bool,
}

impl WrittenStatus {
    /// The object as its store now holds it is another one (another uid), or the status the
    /// store vouched for is not what it shows now.
    fn stale(&self, object: &crate::store::Doc) -> bool {
        let recreated =
            self.uid.is_some() && uid_of(object).is_some_and(|now| Some(now) != self.uid);
        let unconfirmed = self.seeded
            && !object
                .root()
                .get("status")
                .is_some_and(|status| merge_leaves(&status.to_value(), &self.stamped));
        recreated || unconfirmed
    }
}

#[derive(Default)]
struct Written {
    /// Objects a Warning event was written for, with the message.
    dropped: BTreeMap<crate::render::Owner, String>,
    /// The restart-required settings a Warning event was written for.
    restart_required: Vec<String>,
    conditions: Vec<Condition>,
    transition_times: BTreeMap<&'static str, (bool, String)>,
    /// The HAProxyTemplateConfig's conditions when this leader's term began (read once).
    config_conditions: Option<Vec<Value>>,
    /// Objects whose status could not be read or written: failures so far, and when to try
    /// again (a status the API server keeps refusing is not asked for on every pass).
    retry: BTreeMap<crate::render::context::StatusKey, (u32, Instant)>,
    generation: i64,
    /// ((bundle, compression threshold), pods as JSON) last published.
    haproxycfg: Option<((String, i64), String)>,
    /// (bundle, compression threshold) of the spec last written.
    haproxycfg_spec: Option<(String, i64)>,
    /// When the object was last read to see that it still holds that spec.
    haproxycfg_checked: Option<std::time::Instant>,
    /// The `spec.checksum` written (or found when seeding): an edit that recomputes or drops
    /// it shows too.
    haproxycfg_checksum: Option<String>,
    /// The spec of the object already there was taken as this leader's starting point.
    haproxycfg_seeded: bool,
    /// Per object: the status the templates asked for, what was written, and to which object.
    templates: BTreeMap<crate::render::context::StatusKey, WrittenStatus>,
    /// The version of each watch store when last looked at for objects created again.
    store_versions: BTreeMap<String, u64>,
    last_error_event: Option<String>,
    refused_pods: std::collections::BTreeSet<String>,
    haproxycfg_unavailable: bool,
    /// (bundle, compression threshold) the API server refused as too large.
    haproxycfg_too_large: Option<(String, i64)>,
}

impl StatusWriter {
    pub(crate) fn run(self) {
        let mut desired = Desired::default();
        let mut written = Written::default();
        loop {
            match self.inbox.recv_timeout(Duration::from_secs(1)) {
                Ok(StatusMsg::Shutdown) | Err(RecvTimeoutError::Disconnected) => return,
                Ok(msg) => self.absorb(&mut desired, msg),
                Err(RecvTimeoutError::Timeout) => {}
            }
            while let Ok(msg) = self.inbox.try_recv() {
                if matches!(msg, StatusMsg::Shutdown) {
                    return;
                }
                self.absorb(&mut desired, msg);
            }
            if self.shared.leadership().is_leader() {
                self.write(&desired, &mut written);
            } else {
                // A new leader must write everything again.
                written = Written::default();
            }
        }
    }

    fn absorb(&self, desired: &mut Desired, msg: StatusMsg) {
        match msg {
            StatusMsg::ConfigValidation { generation, error } => {
                desired.generation = generation;
                desired.validation = Some(error);
            }
            StatusMsg::Reconciled { error } => desired.reconcile = Some(error),
            StatusMsg::Published(p) => {
                // The bundles a pod may run while newer ones are on their way; only the leader
                // publishes, so a standby keeps none but the latest.
                if !self.shared.leadership().is_leader() {
                    desired.recent.clear();
                }
                desired.recent.push_back(p.clone());
                if desired.recent.len() > RECENT_BUNDLES {
                    desired.recent.pop_front();
                }
                desired.published = Some(p);
            }
            StatusMsg::TemplateStatuses(list) => {
                if desired
                    .templates_from
                    .as_ref()
                    .is_some_and(|from| Arc::ptr_eq(from, &list))
                {
                    return;
                }
                desired.templates = list
                    .iter()
                    .map(|u| {
                        let key = (u.api_version.clone(), u.kind.clone());
                        (
                            (key.0, key.1, u.namespace.clone(), u.name.clone()),
                            u.status.clone(),
                        )
                    })
                    .collect();
                desired.kinds = list
                    .iter()
                    .map(|u| (u.api_version.clone(), u.kind.clone()))
                    .collect();
                desired.templates_from = Some(list);
            }
            StatusMsg::Dropped(list) => desired.dropped = list,
            StatusMsg::RestartRequired(fields) => desired.restart_required = fields,
            StatusMsg::Shutdown => {}
        }
    }

    /// A Warning event on every object newly left out of the configuration (or left out for a
    /// new reason), and a Normal event when it is back in.
    fn dropped_events(&self, desired: &Desired, written: &mut Written) {
        let now: BTreeMap<crate::render::Owner, String> = desired
            .dropped
            .iter()
            .map(|d| (d.owner.clone(), d.message.clone()))
            .collect();
        for (owner, message) in &now {
            if written.dropped.get(owner) == Some(message) || owner.kind.is_empty() {
                continue;
            }
            self.emit_on(
                owner,
                "Warning",
                "LeftOutOfConfiguration",
                &format!("left out of the HAProxy configuration: {message}"),
            );
        }
        for owner in written.dropped.keys() {
            if !now.contains_key(owner) && !owner.kind.is_empty() {
                self.emit_on(
                    owner,
                    "Normal",
                    "BackInConfiguration",
                    "the object is part of the HAProxy configuration again",
                );
            }
        }
        written.dropped = now;
    }

    fn emit_on(&self, owner: &crate::render::Owner, event_type: &str, reason: &str, message: &str) {
        let involved = json!({"apiVersion": owner.api_version, "kind": owner.kind,
            "name": owner.name, "namespace": owner.namespace});
        self.emit_in(&owner.namespace, involved, event_type, reason, message);
    }

    fn conditions(&self, desired: &Desired) -> Vec<Condition> {
        let mut out = Vec::new();
        if let Some(v) = &desired.validation {
            out.push(match v {
                None => Condition {
                    kind: "Valid",
                    ok: true,
                    reason: "Valid".into(),
                    message: "the configuration passed validation".into(),
                },
                Some(e) => Condition {
                    kind: "Valid",
                    ok: false,
                    reason: "Invalid".into(),
                    message: e.clone(),
                },
            });
        }
        if let Some(r) = &desired.reconcile {
            out.push(match r {
                None => Condition {
                    kind: "Rendered",
                    ok: true,
                    reason: "Rendered".into(),
                    message: "rendered and validated".into(),
                },
                Some((stage, e)) => Condition {
                    kind: "Rendered",
                    ok: false,
                    reason: if stage == "render" {
                        "RenderFailed".into()
                    } else {
                        "ValidationFailed".into()
                    },
                    message: e.clone(),
                },
            });
        }
        if let Some(p) = &desired.published {
            let pods = lock(&self.shared.pods).clone();
            let admitted: Vec<_> = pods.iter().filter(|p| p.admitted).collect();
            // Pods not admitted: refused (the controller will not deploy to them until something
            // changes), or whose agent does not answer. The latter are behind too (they serve
            // whatever they ran last), not left out of the count: "applied to 2/2 pods" with a
            // third one stale hid it.
            let (mut refused, mut unreachable) = (Vec::new(), Vec::new());
            for pod in &pods {
                match &pod.not_admitted {
                    Some(why @ NotAdmitted::VersionMismatch { .. }) => {
                        refused.push(format!("{}: {why}", pod.name))
                    }
                    Some(why @ NotAdmitted::AgentUnavailable { .. }) => {
                        unreachable.push(format!("{}: {why}", pod.name))
                    }
                    None => {}
                }
            }
            let mut behind: Vec<String> = admitted
                .iter()
                .filter(|pod| pod.applied_bundle.as_deref() != Some(p.hash.as_str()))
                .map(|pod| match &pod.last_error {
                    Some(e) => format!("{}: {e}", pod.name),
                    None => format!("{}: pending", pod.name),
                })
                .collect();
            let targets = admitted.len() + unreachable.len();
            let applied = admitted.len() - behind.len();
            behind.extend(unreachable);
            out.push(if !refused.is_empty() {
                let mut message = refused.join("; ");
                if targets > 0 {
                    message =
                        format!("{message}; applied to {applied}/{targets} of the other pods");
                }
                Condition {
                    kind: "Deployed",
                    ok: false,
                    reason: "PodsRefused".into(),
                    message,
                }
            } else if targets == 0 {
                Condition {
                    kind: "Deployed",
                    ok: false,
                    reason: "NoPods".into(),
                    message: "no HAProxy pod is admitted yet".into(),
                }
            } else if behind.is_empty() {
                Condition {
                    kind: "Deployed",
                    ok: true,
                    reason: "Deployed".into(),
                    message: format!("applied to {applied}/{targets} pods"),
                }
            } else {
                Condition {
                    kind: "Deployed",
                    ok: false,
                    reason: "Pending".into(),
                    message: format!("applied to {applied}/{targets} pods; {}", behind.join("; ")),
                }
            });
        }
        out
    }

    fn write(&self, desired: &Desired, written: &mut Written) {
        let ns = Some(self.namespace.as_str());
        let conditions = self.conditions(desired);
        // A new leader (or a restart) starts from the conditions the object already has: their
        // times are kept while their status is, those it has no answer for yet (before its
        // first render) stay as they are, and nothing is written when all are as they should be.
        let current = if written.config_conditions.is_none() {
            match self.client.get(&config_resource(), ns, &self.config_name) {
                Ok(object) => {
                    let status = object.get("status").cloned().unwrap_or(Value::Null);
                    let found = status["conditions"].as_array().cloned().unwrap_or_default();
                    for c in &found {
                        let Some(kind) = CONDITION_KINDS.iter().find(|k| c["type"] == **k) else {
                            continue;
                        };
                        if let Some(time) = c["lastTransitionTime"].as_str() {
                            let ok = c["status"] == "True";
                            written
                                .transition_times
                                .insert(kind, (ok, time.to_string()));
                        }
                    }
                    written.config_conditions = Some(found);
                    Some(status)
                }
                Err(e) => {
                    log::warn!("read HAProxyTemplateConfig before its status: {e}");
                    None
                }
            }
        } else {
            None
        };
        if conditions != written.conditions || desired.generation != written.generation {
            let now = rfc3339(SystemTime::now());
            let mut list: Vec<Value> = conditions
                .iter()
                .map(|c| {
                    let time = match written.transition_times.get(c.kind) {
                        Some((ok, t)) if *ok == c.ok => t.clone(),
                        _ => now.clone(),
                    };
                    written.transition_times.insert(c.kind, (c.ok, time.clone()));
                    json!({"type": c.kind, "status": if c.ok { "True" } else { "False" }, "reason": c.reason, "message": c.message,
                        "lastTransitionTime": time, "observedGeneration": desired.generation})
                })
                .collect();
            let unanswered = written.config_conditions.iter().flatten().filter(|found| {
                // Ours only: the list is replaced by each write, as it always was.
                CONDITION_KINDS.iter().any(|k| found["type"] == *k)
                    && !conditions.iter().any(|c| found["type"] == c.kind)
            });
            list.extend(unanswered.cloned());
            let last_error = conditions
                .iter()
                .find(|c| !c.ok && c.kind != "Deployed")
                .map(|c| c.message.clone());
            let patch = json!({"status": {"observedGeneration": desired.generation, "conditions": list, "lastError": last_error}});
            let result = if current.is_some_and(|c| merge_leaves(&c, &patch["status"])) {
                Ok(Value::Null)
            } else {
                self.client
                    .merge_patch_status(&config_resource(), ns, &self.config_name, &patch)
            };
            match result {
                Ok(_) => {
                    written.conditions = conditions.clone();
                    written.generation = desired.generation;
                }
                Err(e) => log::warn!("write HAProxyTemplateConfig status: {e}"),
            }
            self.events(&conditions, written);
        }
        if desired.published.is_some() {
            self.publish(&desired.recent, written);
        }
        self.pod_events(written);
        if written.restart_required != desired.restart_required {
            if !desired.restart_required.is_empty() {
                let involved = json!({"apiVersion": crate::config::model::API_VERSION, "kind": crate::config::model::KIND, "name": self.config_name, "namespace": self.namespace});
                self.emit(
                    involved,
                    "Warning",
                    "RestartRequired",
                    &format!(
                        "these settings take effect after the controller restarts: {}",
                        desired.restart_required.join(", ")
                    ),
                );
            }
            written.restart_required = desired.restart_required.clone();
        }
        self.dropped_events(desired, written);
        self.write_object_statuses(desired, written);
    }

    /// The statuses templates asked for (`status.set`), each written when it changed.
    fn write_object_statuses(&self, desired: &Desired, written: &mut Written) {
        // Objects no render asks a status for any more (deleted, or no longer ours): forgotten,
        // so that an object created again under the same name gets its status written.
        written
            .templates
            .retain(|key, _| desired.templates.contains_key(key));
        written
            .retry
            .retain(|key, _| desired.templates.contains_key(key));
        // The writer never waits for the watchers (a config change or a discovery retry holds
        // them during requests): busy, the object statuses wait for the next pass.
        let Some(watched) = WatchedTypes::find(&self.watchers, desired.kinds.iter()) else {
            return;
        };
        // Objects deleted and created again under their name (another uid), even within one
        // render's window, and objects whose status the store vouched for and now shows
        // otherwise (it was behind: a previous leader's last writes): written to as new.
        let stale = watched.stale(
            &written.templates,
            &mut written.store_versions,
            WrittenStatus::stale,
        );
        for key in stale {
            log::info!(
                "status for {} {}/{}: the object was created again, or its status changed; writing it again",
                key.1,
                key.2,
                key.3
            );
            written.templates.remove(&key);
            written.retry.remove(&key);
        }
        let due: Vec<_> = desired
            .templates
            .iter()
            .filter(|(key, status)| {
                let done = written.templates.get(*key).map(|w| &w.desired) == Some(*status);
                let waiting = written
                    .retry
                    .get(*key)
                    .is_some_and(|(_, at)| Instant::now() < *at);
                !done && !waiting
            })
            .collect();
        let now = rfc3339(SystemTime::now());
        let (mut patched, mut kept) = (0usize, 0usize);
        for (key, status) in due {
            let previous = written.templates.get(key);
            // The object as watched (read one at a time: after a failover that is every object).
            let seen = match previous {
                Some(_) => None,
                None => watched.seen(key),
            };
            let (api_version, kind, namespace, name) = key;
            let res = ResourceRef::new(api_version, &plural_of(kind), !namespace.is_empty());
            let ns = (!namespace.is_empty()).then_some(namespace.as_str());
            // The first status this writer gives an object (after a restart or a leader change,
            // or to an object created again) starts from the object's own: its condition times
            // are kept, and a status it already has is not written again (each write is
            // watched, and rendered, by every replica: thousands of them after every restart).
            // It comes from the watch store, or, where the store does not hold it (its status
            // stripped, a type or object not watched), from the API server.
            // (status found, uid, found in a watch store)
            let (found, uid, from_store) = match (previous, seen) {
                (Some(w), _) => (None, w.uid.clone(), false),
                (
                    None,
                    Some(Seen {
                        uid,
                        status: Some(status),
                    }),
                ) => (Some(status), uid, true),
                (None, _) => match self.client.get(&res, ns, name) {
                    Ok(object) => (
                        Some(object.get("status").cloned().unwrap_or(Value::Null)),
                        object["metadata"]["uid"].as_str().map(Arc::from),
                        false,
                    ),
                    Err(e) => {
                        // Gone since the render (the next one leaves it out, or it is back
                        // under the same name), or unreadable: tried again later, never
                        // written blind.
                        match e.is_not_found() {
                            true => {
                                log::debug!("status for {kind} {namespace}/{name}: object gone")
                            }
                            false => {
                                log::warn!("read {kind} {namespace}/{name} before its status: {e}")
                            }
                        }
                        written.retry_later(key);
                        continue;
                    }
                },
            };
            let mut stamped = (**status).clone();
            stamp_conditions(
                &mut stamped,
                previous.map(|w| &*w.stamped).or(found.as_ref()),
                &now,
            );
            let stamped = if stamped == **status {
                status.clone()
            } else {
                Arc::new(stamped)
            };
            // (the object's uid, the status taken from a store rather than written)
            let done = if found.is_some_and(|current| merge_leaves(&current, &stamped)) {
                kept += 1;
                Some((uid, from_store))
            } else {
                patched += 1;
                match self
                    .client
                    .merge_patch_status(&res, ns, name, &json!({"status": &*stamped}))
                {
                    Ok(object) => {
                        written.retry.remove(key);
                        // The object written to (created again since it was seen, it is that one).
                        let uid = object["metadata"]["uid"].as_str().map(Arc::from).or(uid);
                        Some((uid, false))
                    }
                    Err(e) => {
                        match e.is_not_found() {
                            true => {
                                log::debug!("status for {kind} {namespace}/{name}: object gone")
                            }
                            false => log::warn!("status for {kind} {namespace}/{name}: {e}"),
                        }
                        written.retry_later(key);
                        None
                    }
                }
            };
            if let Some((uid, seeded)) = done {
                written.templates.insert(
                    key.clone(),
                    WrittenStatus {
                        desired: status.clone(),
                        stamped,
                        uid,
                        seeded,
                    },
                );
            }
        }
        if kept > 0 {
            // After a restart or a leader change: how many statuses were already right.
            log::info!("object statuses: {kept} already as desired, {patched} written");
        }
    }

    /// The HAProxyCfg: the deployed configuration (the newest bundle a pod runs; until one
    /// does, the spec stays as it is and only the pods' status changes), and the pods.
    fn publish(&self, recent: &std::collections::VecDeque<Arc<Published>>, written: &mut Written) {
        if written.haproxycfg_unavailable {
            return;
        }
        let threshold = lock(&self.shared.config)
            .as_ref()
            .map_or(1_048_576, |c| c.spec.compression_threshold());
        self.verify_published(written);
        // Without how long a call under way has run (`/debug/pods` only): it changes with
        // every call, and each change would be one more write.
        let pods: Vec<crate::deploy::PodStatus> = lock(&self.shared.pods)
            .iter()
            .map(|p| crate::deploy::PodStatus {
                call_running_seconds: None,
                ..p.clone()
            })
            .collect();
        let runs = |p: &Published| {
            pods.iter()
                .any(|pod| pod.applied_bundle.as_deref() == Some(p.hash.as_str()))
        };
        let deployed = recent.iter().rev().find(|p| runs(p));
        if deployed.is_none() && written.haproxycfg_spec.is_none() && !written.haproxycfg_seeded {
            // A new leader (or one whose pods run none of its bundles yet): the object there
            // stays, and its status follows the pods.
            written.haproxycfg_seeded = true;
            if let Some((spec, checksum)) = self.published_spec(threshold) {
                written.haproxycfg_spec = Some(spec);
                written.haproxycfg_checksum = checksum;
            }
        }
        let (spec, p) = match (deployed, &written.haproxycfg_spec) {
            (Some(p), _) => ((p.hash.to_string(), threshold), p.as_ref()),
            (None, Some(spec)) => match recent.back() {
                Some(latest) => (spec.clone(), latest.as_ref()),
                None => return,
            },
            (None, None) => return,
        };
        if written.haproxycfg_too_large.as_ref() == Some(&spec) {
            return;
        }
        let key = (
            spec.clone(),
            serde_json::to_string(&pods).unwrap_or_default(),
        );
        if written.haproxycfg.as_ref() == Some(&key) {
            return;
        }
        // Only the status when the spec is already there: pods report several times per
        // configuration, and a large one costs its compression and upload.
        let spec_written = written.haproxycfg_spec.as_ref() == Some(&spec);
        match self.publish_haproxycfg(p, threshold, spec_written, &spec.0, &pods) {
            // The object holds another bundle than the status describes (someone replaced its
            // spec since): written again next round.
            Ok((false, _)) => {
                written.haproxycfg_spec = None;
                written.haproxycfg = None;
            }
            Ok((true, checksum)) => {
                written.haproxycfg = Some(key);
                written.haproxycfg_spec = Some(spec);
                written.haproxycfg_too_large = None;
                if checksum.is_some() {
                    written.haproxycfg_checksum = checksum;
                }
            }
            Err(e) if e.is_unserved_resource() => {
                log::warn!("HAProxyCfg is not served by the API server (CRD missing?); not publishing: {e}");
                written.haproxycfg_unavailable = true;
            }
            Err(e) if e.is_too_large() => {
                // Not retried until the configuration or the threshold changes: the same
                // object would be refused again. The previous spec no longer describes what the
                // pods run: it is emptied, so that no controller takes its slots.
                log::error!(
                    "HAProxyCfg not published: the API server refuses it as too large \
                     (haproxy.cfg is {} bytes; spec.controller.configPublishing.compressionThreshold \
                     is {threshold}, 0 never compresses). The pods are deployed all the same, \
                     but a controller that starts or takes over renders its server slots afresh: {e}",
                    p.bundle.haproxy_cfg.len()
                );
                let stub = json!({"content": "", "bundle": "", "compressed": false,
                    "notPublished": format!("bundle {} is too large for the API server", p.hash.as_str())});
                if let Err(e) = self.write_spec(stub) {
                    log::warn!("empty the stale HAProxyCfg: {e}");
                }
                written.haproxycfg_spec = None;
                written.haproxycfg = None;
                written.haproxycfg_too_large = Some(spec);
            }
            Err(e) => {
                if e.is_not_found() {
                    // Deleted by someone: written again in full.
                    written.haproxycfg_spec = None;
                }
                log::warn!("publish HAProxyCfg: {e}")
            }
        }
    }

    /// The HAProxyCfg as it is.
    fn get_published(&self) -> Result<Value, crate::kube::client::KubeError> {
        self.client.get(
            &haproxycfg_resource(),
            Some(&self.namespace),
            &super::hpcfg::name(&self.config_name),
        )
    }

    /// The (bundle, threshold) and checksum of the object as it is, when it holds a readable
    /// configuration.
    fn published_spec(&self, threshold: i64) -> Option<((String, i64), Option<String>)> {
        let stored = super::hpcfg::read(&self.get_published().ok()?).ok()?;
        (!stored.bundle.is_empty()).then_some(((stored.bundle, threshold), stored.checksum))
    }

    /// Every minute, whether the object still holds the spec last written (it can be deleted,
    /// edited or restored from a backup); when not, the next round writes it again.
    fn verify_published(&self, written: &mut Written) {
        let Some((bundle, _)) = &written.haproxycfg_spec else {
            return;
        };
        if written
            .haproxycfg_checked
            .is_some_and(|t| t.elapsed() < publish_check_interval())
        {
            return;
        }
        written.haproxycfg_checked = Some(std::time::Instant::now());
        let found = match self.get_published() {
            // The same bundle and checksum, and a content that matches it (an edit to any shows).
            Ok(object) => super::hpcfg::read(&object).is_ok_and(|stored| {
                stored.bundle == *bundle && stored.checksum == written.haproxycfg_checksum
            }),
            Err(e) if e.is_not_found() => false,
            Err(e) => {
                log::debug!("check HAProxyCfg: {e}");
                return;
            }
        };
        if !found {
            log::warn!(
                "HAProxyCfg {}/{} no longer holds bundle {bundle}: writing it again",
                self.namespace,
                super::hpcfg::name(&self.config_name)
            );
            written.haproxycfg_spec = None;
            written.haproxycfg = None;
        }
    }

    fn publish_haproxycfg(
        &self,
        p: &Published,
        threshold: i64,
        spec_written: bool,
        spec_bundle: &str,
        pods: &[crate::deploy::PodStatus],
    ) -> Result<(bool, Option<String>), crate::kube::client::KubeError> {
        let res = haproxycfg_resource();
        let ns = Some(self.namespace.as_str());
        let name = super::hpcfg::name(&self.config_name);
        let status = json!({"deployedToPods": pods.iter().filter(|pod| pod.applied_bundle.as_deref() == Some(spec_bundle)).map(|pod| json!({
            "podName": pod.name, "deployedAt": pod.last_deployed_at, "checksum": spec_bundle, "lastResult": pod.last_result})).collect::<Vec<_>>(),
            "pods": pods});
        let mut checksum = None;
        if !spec_written {
            let spec = super::hpcfg::spec(&p.bundle.haproxy_cfg, threshold, p.hash.as_str());
            checksum = spec["checksum"].as_str().map(str::to_string);
            self.write_spec(spec)?;
        }
        let object = self
            .client
            .merge_patch_status(&res, ns, &name, &json!({"status": status}))?;
        Ok((
            object.pointer("/spec/bundle").and_then(Value::as_str) == Some(spec_bundle),
            checksum,
        ))
    }

    /// Creates the object with `spec`, or replaces the spec of the one there. A spec above
    /// etcd's limit is not sent: a real API server stops reading a body above 3 MiB and may
    /// close the connection before it answers 413.
    fn write_spec(&self, spec: Value) -> Result<(), crate::kube::client::KubeError> {
        let res = haproxycfg_resource();
        let ns = Some(self.namespace.as_str());
        let name = super::hpcfg::name(&self.config_name);
        let size = serde_json::to_vec(&spec).map_or(0, |b| b.len());
        if size > super::hpcfg::MAX_OBJECT {
            return Err(crate::kube::client::KubeError::Api {
                verb: "PUT",
                path: format!("{}/{name}", res.collection_path(ns)),
                code: 413,
                reason: "RequestEntityTooLarge".into(),
                message: format!(
                    "not sent: the spec is {size} bytes, above etcd's limit of {} bytes",
                    super::hpcfg::MAX_OBJECT
                ),
                object: None,
            });
        }
        match self.client.get(&res, ns, &name) {
            Ok(mut existing) => {
                existing["spec"] = spec;
                self.client.update(&res, ns, &name, &existing)?;
            }
            Err(e) if e.is_missing_object(&name) => {
                let object = json!({"apiVersion": crate::config::model::API_VERSION, "kind": "HAProxyCfg",
                    "metadata": {"name": name, "namespace": self.namespace, "labels": {"app.kubernetes.io/managed-by": "haptic"}}, "spec": spec});
                self.client.create(&res, ns, &object)?;
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    /// One Warning event per new failure, one Normal event on recovery.
    fn events(&self, conditions: &[Condition], written: &mut Written) {
        let failure = conditions.iter().find(|c| !c.ok && c.kind != "Deployed");
        let (event_type, reason, message) = match (failure, &written.last_error_event) {
            (Some(c), last) if last.as_deref() != Some(c.message.as_str()) => {
                ("Warning", c.reason.clone(), c.message.clone())
            }
            (None, Some(_)) => (
                "Normal",
                "Recovered".to_string(),
                "rendering and validation succeed again".to_string(),
            ),
            _ => return,
        };
        written.last_error_event = failure.map(|c| c.message.clone());
        let involved = json!({"apiVersion": crate::config::model::API_VERSION, "kind": crate::config::model::KIND, "name": self.config_name, "namespace": self.namespace});
        self.emit(involved, event_type, &reason, &message);
    }

    /// One Warning event on the Pod when the controller refuses to deploy to it (another
    /// HAProxy major.minor than the one it validates with).
    fn pod_events(&self, written: &mut Written) {
        let pods = lock(&self.shared.pods).clone();
        for pod in pods {
            let key = format!("{}/{}", pod.namespace, pod.name);
            match pod
                .not_admitted
                .as_ref()
                .filter(|why| matches!(why, NotAdmitted::VersionMismatch { .. }))
            {
                Some(why) if written.refused_pods.insert(key.clone()) => {
                    let involved = json!({"apiVersion": "v1", "kind": "Pod", "name": pod.name, "namespace": pod.namespace});
                    self.emit(
                        involved,
                        "Warning",
                        "HAProxyVersionMismatch",
                        &why.to_string(),
                    );
                }
                Some(_) => {}
                None => {
                    written.refused_pods.remove(&key);
                }
            }
        }
    }

    fn emit(&self, involved: Value, event_type: &str, reason: &str, message: &str) {
        self.emit_in(&self.namespace, involved, event_type, reason, message);
    }

    /// Events live in the namespace of the object they are about.
    fn emit_in(
        &self,
        namespace: &str,
        involved: Value,
        event_type: &str,
        reason: &str,
        message: &str,
    ) {
        let namespace = if namespace.is_empty() {
            self.namespace.as_str()
        } else {
            namespace
        };
        let now = rfc3339(SystemTime::now());
        let event = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": format!("{}.", self.config_name), "namespace": namespace},
            "involvedObject": involved,
            "type": event_type, "reason": reason, "message": message.chars().take(1000).collect::<String>(),
            "source": {"component": "haptic"}, "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        });
        if let Err(e) = self.client.create(
            &ResourceRef::new("v1", "events", true),
            Some(namespace),
            &event,
        ) {
            log::warn!("create event: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{merge_leaves, stamp_conditions};
    use serde_json::{json, Value};

    /// A merge patch (RFC 7386) is a no-op when every field it sets holds that value already
    /// (objects merged, lists and scalars compared whole) and every field it removes is absent.
    #[test]
    fn merge_leaves_tells_a_patch_that_changes_nothing() {
        let target = json!({"a": {"b": 1, "c": [1, 2]}, "d": "x", "other": true});
        assert!(merge_leaves(&target, &json!({})));
        assert!(merge_leaves(&target, &json!({"a": {"b": 1}, "d": "x"})));
        assert!(merge_leaves(
            &target,
            &json!({"a": {"c": [1, 2]}, "gone": null})
        ));
        assert!(!merge_leaves(&target, &json!({"a": {"c": [1]}})));
        assert!(!merge_leaves(&target, &json!({"a": {"b": 2}})));
        assert!(!merge_leaves(&target, &json!({"d": null})));
        assert!(!merge_leaves(&target, &json!({"new": 1})));
        assert!(!merge_leaves(&target, &json!({"d": {"x": 1}})));
        assert!(!merge_leaves(&Value::Null, &json!({"a": 1})));
        assert!(!merge_leaves(&Value::Null, &json!({})));
    }

    #[test]
    fn condition_times_are_kept_while_unchanged() {
        let mut first = json!({"parents": [{"parentRef": {"name": "gw"}, "conditions": [{"type": "Accepted", "status": "True"}]}],
            "conditions": [{"type": "Programmed", "status": "False"}]});
        stamp_conditions(&mut first, None, "T1");
        assert_eq!(
            first["parents"][0]["conditions"][0]["lastTransitionTime"],
            "T1"
        );
        let mut second = json!({"parents": [{"parentRef": {"name": "other"}, "conditions": [{"type": "Accepted", "status": "True"}]},
            {"parentRef": {"name": "gw"}, "conditions": [{"type": "Accepted", "status": "True"}]}],
            "conditions": [{"type": "Programmed", "status": "True"}]});
        stamp_conditions(&mut second, Some(&first), "T2");
        assert_eq!(
            second["parents"][1]["conditions"][0]["lastTransitionTime"], "T1",
            "unchanged, matched by parentRef"
        );
        assert_eq!(
            second["parents"][0]["conditions"][0]["lastTransitionTime"], "T2",
            "new parent"
        );
        assert_eq!(
            second["conditions"][0]["lastTransitionTime"], "T2",
            "status changed"
        );
    }

    #[test]
    fn policy_ancestors_are_matched_by_ancestor_ref() {
        let mut first = json!({"ancestors": [{"ancestorRef": {"name": "gw"}, "conditions": [{"type": "Accepted", "status": "True"}]}]});
        stamp_conditions(&mut first, None, "T1");
        let mut second = json!({"ancestors": [{"ancestorRef": {"name": "new"}, "conditions": [{"type": "Accepted", "status": "True"}]},
            {"ancestorRef": {"name": "gw"}, "conditions": [{"type": "Accepted", "status": "True"}]}]});
        stamp_conditions(&mut second, Some(&first), "T2");
        assert_eq!(
            second["ancestors"][1]["conditions"][0]["lastTransitionTime"],
            "T1"
        );
        assert_eq!(
            second["ancestors"][0]["conditions"][0]["lastTransitionTime"],
            "T2"
        );
    }

    /// An entry is stale when its object was created again (another uid), or when the store
    /// vouched for its status and now shows another; a status written by this writer is not
    /// second-guessed by a store that may still be behind it.
    #[test]
    fn written_statuses_are_stale_when_recreated_or_unconfirmed() {
        let object = |uid: &str, status: Value| {
            crate::store::Doc::from_value(
                &json!({"metadata": {"name": "a", "uid": uid}, "status": status}),
            )
            .unwrap()
        };
        let lb = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}});
        let written = |uid: Option<&str>, seeded: bool| super::WrittenStatus {
            desired: std::sync::Arc::new(lb.clone()),
            stamped: std::sync::Arc::new(lb.clone()),
            uid: uid.map(std::sync::Arc::from),
            seeded,
        };
        for seeded in [false, true] {
            let w = written(Some("u1"), seeded);
            assert!(!w.stale(&object("u1", lb.clone())), "{seeded}");
            assert!(w.stale(&object("u2", lb.clone())), "created again");
            assert_eq!(w.stale(&object("u1", json!({}))), seeded, "{seeded}");
            assert_eq!(w.stale(&object("u1", Value::Null)), seeded, "{seeded}");
        }
        // No uid recorded: never taken for another object.
        assert!(!written(None, false).stale(&object("u2", lb.clone())));
    }

    /// Conditions that are no objects (a template's or another controller's values, of any
    /// JSON kind) are left as they are, and the others stamped: no panic (which would stop the
    /// status writer, and with `panic = abort` the controller).
    #[test]
    fn conditions_that_are_no_objects_are_left_alone() {
        let odd = json!(["x", 1, 2.5, true, null, [1, {"type": "A"}]]);
        let mut status = json!({"conditions": odd.as_array().unwrap().iter().cloned()
            .chain([json!({"type": "Ready", "status": "True"})]).collect::<Vec<_>>(),
            "parents": [{"conditions": ["y", {"type": "Accepted", "status": "False"}]}]});
        stamp_conditions(&mut status, None, "T1");
        let conditions = status["conditions"].as_array().unwrap();
        assert_eq!(conditions[..6], odd.as_array().unwrap()[..]);
        assert_eq!(conditions[6]["lastTransitionTime"], "T1");
        assert_eq!(status["parents"][0]["conditions"][0], "y");
        assert_eq!(
            status["parents"][0]["conditions"][1]["lastTransitionTime"],
            "T1"
        );
    }
}
