//! The deployer's decisions, without I/O: from the pods' states, the latest bundle, the
//! leadership and the clock, which pods to probe (`GET /v1/state`) and which to push to, and
//! when; then what each answer means for the pod (admission, drift, fencing, backoff, rate
//! limits). [`super::Deployer`] performs the calls and reports the answers back; every rule
//! lives here, where the unit tests below drive it with a fake clock.
//!
//! Every pod goes at its own pace: a call to one pod's agent is handed out with a ticket and
//! the pod is busy until that ticket is answered, while the other pods are probed and pushed
//! to as they come free. A pod whose agent hangs until `deploymentTimeout` holds back no one
//! else's updates.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::kube::reflector::Backoff;

use super::pods::PodTarget;
use super::{NotAdmitted, PodStatus, Published};

/// How long the deployer sleeps when nothing is due.
pub(crate) const IDLE: Duration = Duration::from_millis(500);
/// The sleep after a round that left work behind (a stale base, a pod that appeared).
pub(crate) const MIN_WAKE: Duration = Duration::from_millis(20);

/// What `GET /v1/state` told about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentView {
    /// The applied bundle; `None` in bootstrap mode.
    pub bundle: Option<String>,
    pub version: String,
}

/// What a push (`PUT /v1/bundle`) came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Applied {
        result: String,
    },
    /// The agent runs something else than we thought: learn it and retry at once.
    Stale {
        current: Option<String>,
    },
    Failed(String),
    /// A newer leader exists: stop pushing to this pod for a while.
    Fenced(String),
    /// The agent is busy (another apply, a reload still loading): nothing changed, and nothing
    /// is wrong; asked again after the backoff.
    Busy(String),
}

/// What the thin layer should log or count after a probe or a push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Note {
    /// Nothing worth a line.
    Quiet,
    /// The pod was not admitted before and is now.
    Admitted {
        version: String,
        bundle: Option<String>,
    },
    /// A periodic check found the pod running another bundle than it had accepted (the leader
    /// re-pushes).
    Drift {
        expected: Option<String>,
        runs: Option<String>,
    },
    /// Not admitted, with a reason other than last time's.
    Refused(String),
    Applied {
        result: String,
    },
    Stale {
        current: Option<String>,
    },
    Fenced(String),
    Failed(String),
    Busy(String),
}

/// One call to a pod's agent, handed out by the planner: its answer is recorded with the
/// same `ticket` ([`Planner::probed`], [`Planner::pushed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub key: String,
    pub target: PodTarget,
    pub ticket: u64,
}

/// The pushes due now, when any.
#[derive(Debug)]
pub(crate) enum PushPlan {
    /// Nothing to push (no bundle, not the leader, or every pod has it, is busy, or waits for
    /// a retry or the reload rate limit).
    Nothing,
    /// Push the bundle to these pods, each with the bundle it is believed to run (`If-Match`).
    Push {
        published: Arc<Published>,
        epoch: u64,
        pods: Vec<(Call, Option<String>)>,
    },
}

/// A call under way to a pod's agent.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    ticket: u64,
    since: Instant,
    /// [`Planner::reload_gen`] when it was handed out: a push applied brings the pod that far.
    gen: u64,
    /// Its answer no longer counts (a new term began, or the container restarted, while it
    /// ran): the pod stays busy until it comes, and is then asked again.
    void: bool,
}

#[derive(Debug)]
pub(crate) struct PodState {
    pub status: PodStatus,
    /// What the agent reported or accepted; `None` = unknown (push with `*`) or bootstrap.
    pub applied: Option<String>,
    /// Whether `applied` was learnt in this term (else the pod is probed before any push).
    pub known: bool,
    backoff: Backoff,
    pub next_attempt: Instant,
    /// [`PodTarget::incarnation`] as last seen.
    incarnation: String,
    /// The call under way to this pod's agent: no other is made until it is answered.
    in_flight: Option<InFlight>,
    /// The periodic drift check is due for this pod (it is probed when free).
    drift_due: bool,
    /// The [`Planner::reload_gen`] the pod is known to have caught up with (`None`: new,
    /// restarted, on its bootstrap configuration, or unknown): below the planner's, its next
    /// push reloads whatever the bundle is against its predecessor.
    synced_gen: Option<u64>,
    /// When the last push that reloads this pod went out (`minDeploymentInterval`).
    last_reload_push: Option<Instant>,
    /// When the last call to this pod was handed out: with `dataplane.maxParallel`, the pods
    /// waiting longest go first.
    last_call: Option<Instant>,
}

/// What is kept of a pod that left the targets (its agent stopped answering its readiness
/// probe, a rollout): a call still under way to it, and its last reload push, so that a pod
/// that comes back under the same IP is not called twice at once nor reloaded sooner than
/// `minDeploymentInterval` allows.
#[derive(Debug)]
struct Departed {
    ip: String,
    incarnation: String,
    in_flight: Option<InFlight>,
    applied: Option<String>,
    synced_gen: Option<u64>,
    last_reload_push: Option<Instant>,
    since: Instant,
}

/// How long a departed pod's last reload push is remembered: the longest
/// `minDeploymentInterval`.
const DEPARTED_MEMORY: Duration = Duration::from_secs(600);

impl PodState {
    fn new(target: &PodTarget, now: Instant) -> PodState {
        PodState {
            status: PodStatus {
                namespace: target.namespace.clone(),
                name: target.name.clone(),
                ip: target.ip.clone(),
                ..Default::default()
            },
            applied: None,
            known: false,
            backoff: Backoff::default(),
            next_attempt: now,
            incarnation: target.incarnation.clone(),
            in_flight: None,
            drift_due: false,
            synced_gen: None,
            last_reload_push: None,
            last_call: None,
        }
    }

    /// Whether a call to this pod's agent is under way.
    pub(super) fn busy(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Ends the call of `ticket`: the call, when its answer counts.
    fn answered(&mut self, ticket: u64) -> Option<InFlight> {
        match self.in_flight {
            Some(f) if f.ticket == ticket => {
                self.in_flight = None;
                (!f.void).then_some(f)
            }
            // A call to the pod this one replaced (another IP under the same name).
            _ => None,
        }
    }

    /// What a call under way will tell is no longer to be trusted.
    fn void_call(&mut self) {
        if let Some(f) = &mut self.in_flight {
            f.void = true;
        }
    }

    pub(super) fn target(&self) -> PodTarget {
        PodTarget {
            namespace: self.status.namespace.clone(),
            name: self.status.name.clone(),
            ip: self.status.ip.clone(),
            incarnation: self.incarnation.clone(),
        }
    }

    fn retry_later(&mut self, now: Instant) {
        self.next_attempt = now + self.backoff.delay();
    }
}

/// The pods, the latest bundle and the deployer's timers.
#[derive(Debug)]
pub(crate) struct Planner {
    pub pods: BTreeMap<String, PodState>,
    pub current: Option<Arc<Published>>,
    /// The last ticket handed out.
    tickets: u64,
    /// How many reload-class bundles came (a pod that has not caught up with the latest one
    /// reloads at its next push).
    reload_gen: u64,
    departed: BTreeMap<String, Departed>,
    /// The earliest time a pod held back by the reload rate limit may be pushed to.
    rate_limited_until: Option<Instant>,
    /// The last bundle seen on every admitted pod: its change-to-deployed latency counts once.
    deployed: Option<String>,
    next_drift: Instant,
    /// The leader epoch the deployer saw last (`None`: a standby).
    seen_epoch: Option<u64>,
    /// The leadership term `seen_epoch` belongs to.
    seen_term: u64,
    /// A term just begun, whose pushes wait until the reconciler has taken the server slots
    /// the previous leader published ([`Planner::release`]), or until the deadline.
    hold: Option<(u64, Instant)>,
    /// The last epoch the reconciler released.
    released: Option<u64>,
}

/// The longest a new term's pushes wait for the reconciler (a slow API server or render).
pub(crate) const TAKEOVER_HOLD: Duration = Duration::from_secs(15);

/// The part of a pod's incarnation that is HAProxy's: the pod's uid and the restart counts of
/// its containers other than the agent's (whose restarts leave HAProxy running).
fn haproxy_incarnation(incarnation: &str) -> String {
    let (uid, restarts) = incarnation.split_once(' ').unwrap_or((incarnation, ""));
    let agent = format!("{}=", super::pods::AGENT_CONTAINER);
    let others: Vec<&str> = restarts
        .split(',')
        .filter(|c| !c.starts_with(&agent))
        .collect();
    format!("{uid} {}", others.join(","))
}

fn key_of(target: &PodTarget) -> String {
    format!("{}/{}", target.namespace, target.name)
}

impl Planner {
    pub(super) fn new(now: Instant) -> Planner {
        Planner {
            pods: BTreeMap::new(),
            current: None,
            tickets: 0,
            reload_gen: 0,
            departed: BTreeMap::new(),
            rate_limited_until: None,
            deployed: None,
            next_drift: now,
            seen_epoch: None,
            seen_term: 0,
            hold: None,
            released: None,
        }
    }

    /// The leader epoch as the deployer sees it before a round. Becoming leader (or a new
    /// epoch) begins a term: every pod is probed again, and pushes wait for [`Planner::release`].
    /// Returns whether a term began.
    pub(super) fn saw_epoch(&mut self, epoch: Option<u64>, term: u64, now: Instant) -> bool {
        if epoch == self.seen_epoch {
            return false;
        }
        // The same term under a new number (the Lease started over below what agents hold):
        // what the pods run is still known, and a released term stays released.
        if let (Some(old), Some(new)) = (self.seen_epoch, epoch) {
            if term == self.seen_term {
                self.seen_epoch = epoch;
                if self.released >= Some(old) {
                    self.released = Some(new);
                }
                if let Some((e, until)) = self.hold {
                    if e == old {
                        self.hold = Some((new, until));
                    }
                }
                return false;
            }
        }
        self.seen_term = term;
        self.seen_epoch = epoch;
        self.new_term(now);
        match epoch {
            Some(e) => {
                self.hold = Some((e, now + TAKEOVER_HOLD));
                true
            }
            None => false,
        }
    }

    /// The reconciler is ready for the term of `epoch` (it took the published server slots,
    /// or there were none to take).
    pub(super) fn release(&mut self, epoch: u64) {
        // Epochs only grow: a late release of an older term changes nothing.
        self.released = self.released.max(Some(epoch));
    }

    /// Whether the term of `epoch` still waits for the reconciler; `None` when it does not.
    pub(super) fn held_until(&self, epoch: u64, now: Instant) -> Option<Instant> {
        match self.hold {
            Some((e, until)) if e == epoch && self.released < Some(e) && now < until => Some(until),
            _ => None,
        }
    }

    /// A newer validated bundle (only the latest matters).
    pub(super) fn set_bundle(&mut self, published: Arc<Published>) {
        if published.reload {
            self.reload_gen += 1;
        }
        self.current = Some(published);
    }

    /// Whether the next push to `pod` reloads it.
    fn reloads(&self, pod: &PodState) -> bool {
        pod.synced_gen.is_none_or(|g| g < self.reload_gen)
    }

    /// What a pod runs, as a probe or a stale push told: the current bundle means it caught
    /// up with every reload; bootstrap, that its next push reloads.
    fn learn_runs(&mut self, key: &str, bundle: Option<&str>) {
        let current = self.current.as_ref().map(|c| c.hash.as_str());
        let gen = self.reload_gen;
        if let Some(pod) = self.pods.get_mut(key) {
            match bundle {
                None => pod.synced_gen = None,
                Some(b) if Some(b) == current => pod.synced_gen = Some(gen),
                // What we pushed last: as far as it got.
                Some(b) if Some(b) == pod.applied.as_deref() => {}
                // A bundle someone else pushed (another leader, a hand): unknown.
                Some(_) => pod.synced_gen = None,
            }
        }
    }

    /// Ends the call of `ticket` to `key`, of a pod still a target or one that departed: the
    /// call, when its answer counts.
    fn settle(&mut self, key: &str, ticket: u64) -> Option<InFlight> {
        if let Some(d) = self.departed.get_mut(key) {
            if d.in_flight.is_some_and(|f| f.ticket == ticket) {
                d.in_flight = None;
                return None;
            }
        }
        self.pods.get_mut(key)?.answered(ticket)
    }

    /// Marks the pod busy with a new call.
    fn hand_out(&mut self, key: &str, now: Instant) -> Option<Call> {
        self.tickets += 1;
        let ticket = self.tickets;
        let gen = self.reload_gen;
        let pod = self.pods.get_mut(key)?;
        pod.in_flight = Some(InFlight {
            ticket,
            since: now,
            gen,
            void: false,
        });
        pod.last_call = Some(now);
        Some(Call {
            key: key.to_string(),
            target: pod.target(),
            ticket,
        })
    }

    /// The pods that may receive configuration now; others are forgotten, and a pod whose IP
    /// changed under the same name is a new pod.
    pub(super) fn set_pods(&mut self, targets: Vec<PodTarget>, now: Instant) {
        let keys: std::collections::BTreeSet<String> = targets.iter().map(key_of).collect();
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|k| !keys.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(pod) = self.pods.remove(&key) {
                // Gone twice before an earlier call ended: that call is still the one under
                // way to this address.
                let earlier = self
                    .departed
                    .remove(&key)
                    .filter(|d| d.ip == pod.status.ip)
                    .and_then(|d| d.in_flight);
                self.departed.insert(
                    key,
                    Departed {
                        ip: pod.status.ip,
                        incarnation: pod.incarnation,
                        in_flight: pod.in_flight.or(earlier),
                        applied: pod.applied,
                        synced_gen: pod.synced_gen,
                        last_reload_push: pod.last_reload_push,
                        since: now,
                    },
                );
            }
        }
        self.departed.retain(|_, d| {
            d.in_flight.is_some() || now.saturating_duration_since(d.since) < DEPARTED_MEMORY
        });
        for target in targets {
            let key = key_of(&target);
            let entry = self
                .pods
                .entry(key.clone())
                .or_insert_with(|| PodState::new(&target, now));
            if entry.status.ip != target.ip {
                *entry = PodState::new(&target, now);
            } else if entry.incarnation != target.incarnation {
                // A container restarted (or the pod was recreated under its name and IP):
                // what it runs is asked again now (once a call under way has ended). A new
                // HAProxy has no older workers for the reload rate limit to spare; the agent
                // alone restarting leaves HAProxy and its workers as they were.
                if haproxy_incarnation(&entry.incarnation)
                    != haproxy_incarnation(&target.incarnation)
                {
                    entry.synced_gen = None;
                    entry.last_reload_push = None;
                }
                entry.incarnation = target.incarnation.clone();
                entry.known = false;
                entry.next_attempt = now;
                entry.void_call();
            }
            // Back under the same IP: the call still under way stays its one call (its answer
            // no longer counts), and, the same containers, its last reload push still counts.
            if let Some(d) = self.departed.remove(&key) {
                if d.ip == entry.status.ip && entry.in_flight.is_none() {
                    entry.in_flight = d.in_flight.map(|f| InFlight { void: true, ..f });
                    // The same HAProxy: what it was pushed, and when it last reloaded.
                    if haproxy_incarnation(&d.incarnation)
                        == haproxy_incarnation(&entry.incarnation)
                        && entry.last_reload_push.is_none()
                    {
                        entry.applied = d.applied;
                        entry.synced_gen = d.synced_gen;
                        entry.last_reload_push = d.last_reload_push;
                    }
                } else if d.in_flight.is_some() {
                    self.departed.insert(key, d);
                }
            }
        }
    }

    /// A new leadership term: learn what every pod runs before pushing.
    pub(super) fn new_term(&mut self, now: Instant) {
        for pod in self.pods.values_mut() {
            pod.known = false;
            pod.next_attempt = now;
            pod.void_call();
        }
    }

    /// The pods to probe now, at most `room` of them: those not known in this term, and each
    /// pod once per drift interval, except those busy or waiting for a retry. Each comes with
    /// whether it is its drift check.
    pub(super) fn probes(
        &mut self,
        now: Instant,
        drift_interval: Duration,
        room: usize,
    ) -> Vec<(Call, bool)> {
        if now >= self.next_drift {
            self.next_drift = now + drift_interval;
            for pod in self.pods.values_mut() {
                pod.drift_due = true;
            }
        }
        let mut due: Vec<(Option<Instant>, String)> = self
            .pods
            .iter()
            .filter(|(_, p)| !p.busy() && (!p.known || p.drift_due) && p.next_attempt <= now)
            .map(|(k, p)| (p.last_call, k.clone()))
            .collect();
        // The pods waiting longest first (never called: first of all).
        due.sort();
        let due: Vec<String> = due.into_iter().take(room).map(|(_, k)| k).collect();
        due.into_iter()
            .filter_map(|key| {
                let pod = self.pods.get_mut(&key)?;
                let drift = std::mem::take(&mut pod.drift_due);
                Some((self.hand_out(&key, now)?, drift))
            })
            .collect()
    }

    /// Records the answer to the probe of `ticket`. `leader`: whether this replica pushes
    /// (only then is drift reported); `drift_check`: the probe was the pod's periodic check.
    pub(super) fn probed(
        &mut self,
        key: &str,
        ticket: u64,
        answer: Result<AgentView, NotAdmitted>,
        leader: bool,
        drift_check: bool,
        now: Instant,
    ) -> Note {
        if self.settle(key, ticket).is_none() {
            return Note::Quiet;
        }
        if let Ok(view) = &answer {
            self.learn_runs(key, view.bundle.as_deref());
        }
        let Some(pod) = self.pods.get_mut(key) else {
            return Note::Quiet;
        };
        match answer {
            Ok(AgentView { bundle, version }) => {
                let note = if leader && pod.known && drift_check && bundle != pod.applied {
                    Note::Drift {
                        expected: pod.applied.clone(),
                        runs: bundle.clone(),
                    }
                } else if !pod.status.admitted {
                    Note::Admitted {
                        version: version.clone(),
                        bundle: bundle.clone(),
                    }
                } else {
                    Note::Quiet
                };
                pod.applied = bundle;
                pod.known = true;
                pod.status.admitted = true;
                pod.status.not_admitted = None;
                pod.status.haproxy_version = Some(version);
                note
            }
            Err(why) => {
                let text = why.to_string();
                let changed = pod.status.last_error.as_deref() != Some(text.as_str());
                pod.status.admitted = false;
                pod.status.not_admitted = Some(why);
                pod.status.last_error = Some(text.clone());
                // What it runs is unknown until a probe answers again (after the backoff).
                pod.known = false;
                pod.retry_later(now);
                if changed {
                    Note::Refused(text)
                } else {
                    Note::Quiet
                }
            }
        }
    }

    pub(super) fn admitted(&self) -> usize {
        self.pods.values().filter(|p| p.status.admitted).count()
    }

    /// The pushes due now, at most `room` of them. `epoch`: the leader's epoch, `None` on a
    /// standby (which never pushes). A push that reloads the pod waits for `min_interval`
    /// since that pod's last reload push.
    pub(super) fn pushes(
        &mut self,
        epoch: Option<u64>,
        min_interval: Duration,
        now: Instant,
        room: usize,
    ) -> PushPlan {
        self.rate_limited_until = None;
        let (Some(published), Some(epoch)) = (self.current.clone(), epoch) else {
            return PushPlan::Nothing;
        };
        if self.held_until(epoch, now).is_some() {
            return PushPlan::Nothing;
        }
        let hash = published.hash.as_str();
        let mut due = Vec::new();
        for (key, p) in &self.pods {
            if p.busy()
                || !p.status.admitted
                || !p.known
                || p.applied.as_deref() == Some(hash)
                || p.next_attempt > now
            {
                continue;
            }
            let reloads = self.reloads(p);
            if let (true, Some(last)) = (reloads, p.last_reload_push) {
                let until = last + min_interval;
                if now < until {
                    self.rate_limited_until =
                        Some(self.rate_limited_until.map_or(until, |u| u.min(until)));
                    continue;
                }
            }
            due.push((p.last_call, key.clone(), reloads));
        }
        // The pods waiting longest first (never called: first of all).
        due.sort();
        due.truncate(room);
        if due.is_empty() {
            return PushPlan::Nothing;
        }
        let mut pods = Vec::with_capacity(due.len());
        for (_, key, reloads) in due {
            let Some(pod) = self.pods.get_mut(&key) else {
                continue;
            };
            if reloads {
                pod.last_reload_push = Some(now);
            }
            let base = pod.applied.clone();
            pods.extend(self.hand_out(&key, now).map(|call| (call, base)));
        }
        PushPlan::Push {
            published,
            epoch,
            pods,
        }
    }

    /// Records the outcome of the push of `ticket`, for `hash` (the bundle that was pushed).
    pub(super) fn pushed(
        &mut self,
        key: &str,
        ticket: u64,
        hash: &str,
        outcome: Outcome,
        now: Instant,
        at: &str,
    ) -> Note {
        let Some(call) = self.settle(key, ticket) else {
            return Note::Quiet;
        };
        if let Outcome::Stale { current } = &outcome {
            self.learn_runs(key, current.as_deref());
        }
        let Some(pod) = self.pods.get_mut(key) else {
            return Note::Quiet;
        };
        match outcome {
            Outcome::Applied { result } => {
                // It caught up with the reloads that came before this push was handed out.
                pod.synced_gen = Some(call.gen);
                pod.applied = Some(hash.to_string());
                pod.status.applied_bundle = Some(hash.to_string());
                pod.status.last_result = Some(result.clone());
                pod.status.last_error = None;
                pod.status.consecutive_failures = 0;
                pod.status.last_deployed_at = Some(at.to_string());
                pod.backoff.reset();
                Note::Applied { result }
            }
            Outcome::Stale { current } => {
                // Retried at once, with what the agent runs as the base.
                pod.applied = current.clone();
                Note::Stale { current }
            }
            Outcome::Fenced(detail) => {
                pod.retry_later(now);
                Note::Fenced(detail)
            }
            Outcome::Busy(detail) => {
                pod.retry_later(now);
                // What it runs when the agent is done is asked before the next push.
                pod.known = false;
                Note::Busy(detail)
            }
            Outcome::Failed(error) => {
                pod.status.last_error = Some(error.clone());
                pod.status.consecutive_failures += 1;
                pod.retry_later(now);
                // What it runs after a failure is unknown: probe before the next push.
                pod.known = false;
                Note::Failed(error)
            }
        }
    }

    /// Whether `hash` reached every admitted pod for the first time now (a pod that joins or
    /// is repaired later does not make it count again).
    pub(super) fn newly_everywhere(&mut self, hash: &str) -> bool {
        if !self.everywhere(hash) || self.deployed.as_deref() == Some(hash) {
            return false;
        }
        self.deployed = Some(hash.to_string());
        true
    }

    /// Whether every admitted pod runs `hash`, as learnt in this term.
    pub(super) fn everywhere(&self, hash: &str) -> bool {
        self.pods
            .values()
            .filter(|p| p.status.admitted)
            .all(|p| p.known && p.applied.as_deref() == Some(hash))
    }

    /// How long to sleep: until the earliest retry or the end of a reload rate limit, at most
    /// `max` (a `max` below [`MIN_WAKE`] counts as `MIN_WAKE`). Busy pods wake the deployer
    /// with their answer.
    pub(super) fn next_wake(&self, max: Duration, now: Instant) -> Duration {
        self.pods
            .values()
            .filter(|p| !p.busy())
            .map(|p| p.next_attempt)
            .chain(self.rate_limited_until)
            .map(|at| at.saturating_duration_since(now))
            .filter(|d| !d.is_zero())
            .min()
            .unwrap_or(max)
            .min(max.max(MIN_WAKE))
    }

    /// The pods' statuses for `/debug/pods` and the status writer.
    pub(super) fn statuses(&self, now: Instant) -> Vec<PodStatus> {
        self.pods
            .values()
            .map(|p| {
                let mut s = p.status.clone();
                s.applied_bundle = p.applied.clone();
                s.call_running_seconds = p
                    .in_flight
                    .map(|f| now.saturating_duration_since(f.since).as_secs());
                s
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_agent::protocol::Bundle;

    /// No limit on the calls under way.
    const ALL: usize = usize::MAX;
    const MINUTE: Duration = Duration::from_secs(60);

    fn target(name: &str, ip: &str) -> PodTarget {
        PodTarget {
            namespace: "ing".into(),
            name: name.into(),
            ip: ip.into(),
            incarnation: "uid haproxy=0,haptic-agent=0".into(),
        }
    }

    fn bundle(text: &str, reload: bool, now: Instant) -> Arc<Published> {
        let bundle = Bundle::new(text.to_string(), Vec::new());
        Arc::new(Published {
            hash: bundle.hash(),
            bundle,
            reload,
            checked_with: None,
            first_change: now,
        })
    }

    fn view(bundle: Option<&str>) -> Result<AgentView, NotAdmitted> {
        Ok(AgentView {
            bundle: bundle.map(str::to_string),
            version: "2.6.12".into(),
        })
    }

    fn applied(result: &str) -> Outcome {
        Outcome::Applied {
            result: result.into(),
        }
    }

    fn hash(p: &Arc<Published>) -> String {
        p.hash.as_str().to_string()
    }

    impl Planner {
        /// Probes every pod due (no limit), and answers each with `answer` as the leader.
        fn probe_all(
            &mut self,
            now: Instant,
            answer: impl Fn(&str) -> Result<AgentView, NotAdmitted>,
        ) -> Vec<(String, Note)> {
            self.probes(now, MINUTE, ALL)
                .into_iter()
                .map(|(call, drift)| {
                    let note =
                        self.probed(&call.key, call.ticket, answer(&call.key), true, drift, now);
                    (call.key, note)
                })
                .collect()
        }

        /// The pushes due now (no limit), as key → (ticket, base).
        fn due(
            &mut self,
            epoch: Option<u64>,
            min: Duration,
            now: Instant,
        ) -> BTreeMap<String, (u64, Option<String>)> {
            match self.pushes(epoch, min, now, ALL) {
                PushPlan::Push { pods, .. } => pods
                    .into_iter()
                    .map(|(call, base)| (call.key, (call.ticket, base)))
                    .collect(),
                PushPlan::Nothing => BTreeMap::new(),
            }
        }

        /// Pushes `b` to every pod due and answers each with `outcome`.
        fn push_all(&mut self, b: &Arc<Published>, now: Instant, outcome: Outcome) -> Vec<String> {
            let due = self.due(Some(1), Duration::ZERO, now);
            for (key, (ticket, _)) in &due {
                self.pushed(key, *ticket, &hash(b), outcome.clone(), now, "now");
            }
            due.into_keys().collect()
        }
    }

    /// A planner with pods a and b probed (bootstrap) and admitted, at `t0`.
    fn admitted(t0: Instant) -> Planner {
        let mut p = Planner::new(t0);
        p.set_pods(vec![target("a", "10.0.0.1"), target("b", "10.0.0.2")], t0);
        let notes = p.probe_all(t0, |_| view(None));
        assert_eq!(notes.len(), 2);
        assert!(notes
            .iter()
            .all(|(_, n)| matches!(n, Note::Admitted { .. })));
        p
    }

    fn keys(due: &BTreeMap<String, (u64, Option<String>)>) -> Vec<&str> {
        due.keys().map(String::as_str).collect()
    }

    #[test]
    fn a_new_term_waits_for_the_reconciler_or_the_deadline() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        p.set_bundle(bundle("one", false, t0));
        // Becoming leader: probe again, and no push until the reconciler releases the term.
        assert!(p.saw_epoch(Some(3), 1, t0));
        assert!(
            !p.saw_epoch(Some(3), 1, t0),
            "the same epoch begins no term"
        );
        assert_eq!(p.probe_all(t0, |_| view(None)).len(), 2);
        assert!(p.due(Some(3), Duration::ZERO, t0).is_empty());
        // A release of another epoch changes nothing; the right one lets the pushes go.
        p.release(2);
        assert!(p.due(Some(3), Duration::ZERO, t0).is_empty());
        p.release(3);
        let due = p.due(Some(3), Duration::ZERO, t0);
        assert_eq!(keys(&due), ["ing/a", "ing/b"]);
        // A later term is held again (the pushes under way no longer count); without a
        // release it goes at the deadline.
        assert!(!p.saw_epoch(None, 1, t0), "losing the lead holds nothing");
        assert!(p.saw_epoch(Some(5), 2, t0));
        for (key, (ticket, _)) in due {
            assert_eq!(
                p.pushed(&key, ticket, "h", applied("runtime"), t0, "t0"),
                Note::Quiet,
                "a push of the last term answers into this one"
            );
        }
        assert_eq!(p.probe_all(t0, |_| view(None)).len(), 2);
        let almost = t0 + TAKEOVER_HOLD - Duration::from_millis(1);
        assert!(p.due(Some(5), Duration::ZERO, almost).is_empty());
        assert!(p.held_until(5, almost).is_some());
        let after = t0 + TAKEOVER_HOLD;
        assert!(p.held_until(5, after).is_none());
        let due5 = p.due(Some(5), Duration::ZERO, after);
        assert_eq!(due5.len(), 2);
        // A release that comes before the deployer saw the epoch counts all the same.
        p.release(6);
        assert!(p.saw_epoch(Some(6), 3, after));
        assert!(p.held_until(6, after).is_none());
        // A late release of an older term does not hold the current one again.
        p.release(4);
        assert!(p.held_until(6, after).is_none());
        // The same term renumbered (the Lease started over below the agents' epoch): no new
        // term, nothing held, what the pods run is still known. (Term 6 voided the pushes of
        // term 5: the pods stay busy until they answer, and are probed then.)
        assert!(p.probes(after, MINUTE, ALL).is_empty());
        for (key, (ticket, _)) in due5 {
            assert_eq!(
                p.pushed(&key, ticket, "h", applied("runtime"), after, "a"),
                Note::Quiet
            );
        }
        assert_eq!(p.probe_all(after, |_| view(None)).len(), 2);
        assert!(!p.saw_epoch(Some(9), 3, after));
        assert!(p.held_until(9, after).is_none());
        assert!(p.probes(after, MINUTE, ALL).is_empty());
    }

    /// A container that restarts (HAProxy back on its bootstrap configuration) changes the
    /// pod's incarnation under the same name and IP: it is asked again at once, not at the
    /// next drift check.
    #[test]
    fn a_restarted_container_is_probed_again_at_once() {
        let t0 = Instant::now();
        let mut p = Planner::new(t0);
        p.set_pods(vec![target("a", "10.0.0.1")], t0);
        p.probe_all(t0, |_| view(Some("b1")));
        let later = t0 + Duration::from_secs(5);
        assert!(p.probes(later, MINUTE, ALL).is_empty());
        p.set_pods(vec![target("a", "10.0.0.1")], later);
        assert!(p.probes(later, MINUTE, ALL).is_empty(), "nothing changed");
        let mut restarted = target("a", "10.0.0.1");
        restarted.incarnation = "uid haproxy=1,haptic-agent=0".into();
        p.set_pods(vec![restarted.clone()], later);
        let probes = p.probes(later, MINUTE, ALL);
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].0.target, restarted);
        // A restart while a call is under way: its answer (from before the restart) does not
        // count, and the pod is asked again once it is free.
        let ticket = probes[0].0.ticket;
        let mut again = restarted.clone();
        again.incarnation = "uid haproxy=2,haptic-agent=0".into();
        p.set_pods(vec![again], later);
        assert!(
            p.probes(later, MINUTE, ALL).is_empty(),
            "busy until answered"
        );
        let stale = p.probed("ing/a", ticket, view(Some("b1")), true, false, later);
        assert_eq!(stale, Note::Quiet);
        assert!(!p.pods["ing/a"].known);
        assert_eq!(p.probes(later, MINUTE, ALL).len(), 1);
    }

    #[test]
    fn new_pods_are_probed_then_pushed_with_what_they_run_as_base() {
        let t0 = Instant::now();
        let mut p = Planner::new(t0);
        p.set_pods(vec![target("a", "10.0.0.1")], t0);
        let b1 = bundle("one", true, t0);
        p.set_bundle(b1.clone());
        // Unknown pods are never pushed to before a probe.
        assert!(p.due(Some(1), Duration::ZERO, t0).is_empty());
        let probes = p.probes(t0, MINUTE, ALL);
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].0.target, target("a", "10.0.0.1"));
        // Busy while the probe is under way: no second call.
        assert!(p.probes(t0, MINUTE, ALL).is_empty());
        p.probed(
            "ing/a",
            probes[0].0.ticket,
            view(Some("old")),
            true,
            false,
            t0,
        );
        let (ticket, base) = match p.pushes(Some(7), Duration::ZERO, t0, ALL) {
            PushPlan::Push { epoch, pods, .. } => {
                assert_eq!(epoch, 7);
                assert_eq!(pods.len(), 1);
                assert_eq!(pods[0].0.key, "ing/a");
                (pods[0].0.ticket, pods[0].1.clone())
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(base.as_deref(), Some("old"));
        let note = p.pushed("ing/a", ticket, &hash(&b1), applied("reload"), t0, "now");
        assert_eq!(
            note,
            Note::Applied {
                result: "reload".into()
            }
        );
        assert!(p.everywhere(&hash(&b1)));
        assert!(p.due(Some(7), Duration::ZERO, t0).is_empty());
        // What a pod runs counts as learnt in this term only.
        p.new_term(t0);
        assert!(!p.everywhere(&hash(&b1)));
        assert_eq!(
            p.statuses(t0)[0].applied_bundle.as_deref(),
            Some(hash(&b1).as_str())
        );
    }

    #[test]
    fn standbys_probe_but_never_push() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        p.set_bundle(bundle("one", false, t0));
        assert!(p.due(None, Duration::ZERO, t0).is_empty());
        assert_eq!(p.admitted(), 2);
    }

    #[test]
    fn reloads_are_rate_limited_runtime_changes_are_not() {
        let t0 = Instant::now();
        let min = Duration::from_secs(5);
        let mut p = admitted(t0);
        let b1 = bundle("one", true, t0);
        p.set_bundle(b1.clone());
        assert_eq!(p.push_all(&b1, t0, applied("reload")), ["ing/a", "ing/b"]);
        // A runtime-only bundle is not held back by the reload limit.
        let t1 = t0 + Duration::from_secs(1);
        let b3 = bundle("three", false, t1);
        p.set_bundle(b3.clone());
        assert_eq!(p.push_all(&b3, t1, applied("runtime")), ["ing/a", "ing/b"]);
        // A second reload one second later waits until five seconds after the first, and
        // the deployer sleeps until then.
        let b2 = bundle("two", true, t1);
        p.set_bundle(b2.clone());
        assert!(p.due(Some(1), min, t1).is_empty());
        assert_eq!(p.next_wake(IDLE * 100, t1), (t0 + min) - t1);
        // A bundle runtime-only against the held one is a reload for the pods (they run what
        // came before it): it waits too, and is not a way around the limit.
        let b4 = bundle("four", false, t1);
        p.set_bundle(b4.clone());
        assert!(p.due(Some(1), min, t1).is_empty());
        let due = p.due(Some(1), min, t0 + min);
        assert_eq!(keys(&due), ["ing/a", "ing/b"]);
        for (key, (ticket, _)) in due {
            p.pushed(&key, ticket, &hash(&b4), applied("reload"), t0 + min, "t");
        }
        // Once applied, nothing is owed: a runtime-only bundle goes at once again.
        let b5 = bundle("five", false, t0 + min);
        p.set_bundle(b5);
        assert_eq!(p.due(Some(1), min, t0 + min).len(), 2);
    }

    /// A runtime-only bundle that comes while a reload push is under way goes at once after
    /// it: the pod caught up with that reload (not counted as a reload, nor held back).
    #[test]
    fn a_runtime_change_during_a_reload_push_is_not_held_back() {
        let t0 = Instant::now();
        let min = Duration::from_secs(5);
        let mut p = admitted(t0);
        let r = bundle("reload", true, t0);
        p.set_bundle(r.clone());
        let due = p.due(Some(1), min, t0);
        assert_eq!(due.len(), 2);
        let s1 = bundle("runtime", false, t0);
        p.set_bundle(s1.clone());
        let t1 = t0 + Duration::from_millis(300);
        for (key, (ticket, _)) in &due {
            p.pushed(key, *ticket, &hash(&r), applied("reload"), t1, "t1");
        }
        assert_eq!(keys(&p.due(Some(1), min, t1)), ["ing/a", "ing/b"]);
        // The same when a probe (a new term) finds the pod already runs the latest bundle.
        let s2 = bundle("runtime-2", false, t1);
        let r2 = bundle("reload-2", true, t1);
        let mut q = admitted(t0);
        q.set_bundle(r2.clone());
        q.push_all(&r2, t0, applied("reload"));
        q.set_bundle(bundle("reload-3", true, t1));
        q.new_term(t1);
        let current = hash(q.current.as_ref().unwrap());
        q.probe_all(t1, |_| view(Some(&current)));
        q.set_bundle(s2);
        assert_eq!(q.due(Some(1), min, t1).len(), 2);
    }

    /// A reload-class bundle that arrives while a push is under way is still owed after that
    /// push is applied (the pod caught up with the reloads before the push, not this one), and
    /// so is everything after a push answered by a bundle we did not push (409).
    #[test]
    fn reloads_that_came_during_a_push_or_from_elsewhere_are_still_owed() {
        let t0 = Instant::now();
        let min = Duration::from_secs(5);
        let mut p = admitted(t0);
        let r0 = bundle("r0", true, t0);
        p.set_bundle(r0.clone());
        p.push_all(&r0, t0, applied("reload"));
        let t1 = t0 + Duration::from_secs(1);
        let x = bundle("x", false, t1);
        p.set_bundle(x.clone());
        let due = p.due(Some(1), min, t1);
        assert_eq!(due.len(), 2, "runtime-only: not held");
        p.set_bundle(bundle("r1", true, t1));
        for (key, (ticket, _)) in &due {
            p.pushed(key, *ticket, &hash(&x), applied("runtime"), t1, "t1");
        }
        assert!(p.due(Some(1), min, t1).is_empty(), "r1 waits for t0 + 5 s");
        assert_eq!(p.due(Some(1), min, t0 + min).len(), 2);
        // A 409 naming a bundle someone else pushed: what it takes to reach ours is unknown.
        let mut q = admitted(t0);
        q.set_bundle(r0.clone());
        q.push_all(&r0, t0, applied("reload"));
        q.set_bundle(x.clone());
        let due = q.due(Some(1), min, t1);
        let stale = Outcome::Stale {
            current: Some("theirs".into()),
        };
        q.pushed("ing/a", due["ing/a"].0, &hash(&x), stale, t1, "t1");
        q.pushed(
            "ing/b",
            due["ing/b"].0,
            &hash(&x),
            applied("runtime"),
            t1,
            "t1",
        );
        assert!(
            q.due(Some(1), min, t1).is_empty(),
            "a's retry reloads: held"
        );
        assert_eq!(keys(&q.due(Some(1), min, t0 + min)), ["ing/a"]);
    }

    /// An answer that comes while its pod is away frees it: back, it is probed at once.
    #[test]
    fn an_answer_while_a_pod_is_away_frees_it() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        let due = p.due(Some(1), Duration::ZERO, t0);
        p.set_pods(vec![target("b", "10.0.0.2")], t0);
        let note = p.pushed(
            "ing/a",
            due["ing/a"].0,
            &hash(&b1),
            applied("runtime"),
            t0,
            "t0",
        );
        assert_eq!(note, Note::Quiet);
        p.set_pods(vec![target("a", "10.0.0.1"), target("b", "10.0.0.2")], t0);
        let probes = p.probes(t0, MINUTE, ALL);
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].0.key, "ing/a");
    }

    /// A pod that leaves the targets while a call to it is under way (its agent stopped
    /// answering its readiness probe) and comes back under the same IP is not called twice at
    /// once, and its last reload push still counts; a restarted container is not held back.
    #[test]
    fn a_pod_that_leaves_and_returns_keeps_its_call_and_its_reload_limit() {
        let t0 = Instant::now();
        let min = Duration::from_secs(5);
        let mut p = admitted(t0);
        let b1 = bundle("one", true, t0);
        p.set_bundle(b1.clone());
        let due = p.due(Some(1), min, t0);
        let a_call = due["ing/a"].0;
        p.pushed(
            "ing/b",
            due["ing/b"].0,
            &hash(&b1),
            applied("reload"),
            t0,
            "t0",
        );
        // a leaves, and comes back a second later: still busy with the same call.
        p.set_pods(vec![target("b", "10.0.0.2")], t0);
        let t1 = t0 + Duration::from_secs(1);
        p.set_pods(vec![target("a", "10.0.0.1"), target("b", "10.0.0.2")], t1);
        assert!(p.probes(t1, MINUTE, ALL).is_empty(), "a is still busy");
        assert_eq!(
            p.pushed("ing/a", a_call, &hash(&b1), applied("reload"), t1, "t1"),
            Note::Quiet
        );
        p.probe_all(t1, |_| view(Some("older")));
        // Its last reload push (t0) still holds the next reload back until t0 + 5 s.
        let b2 = bundle("two", true, t1);
        p.set_bundle(b2);
        assert!(p.due(Some(1), min, t1).is_empty());
        // The agent's container alone restarting leaves HAProxy and its reload as they were.
        let mut agent_restarted = target("a", "10.0.0.1");
        agent_restarted.incarnation = "uid haproxy=0,haptic-agent=1".into();
        let t2 = t0 + min;
        let r3 = bundle("three", true, t2);
        let due = p.due(Some(1), min, t2);
        assert_eq!(keys(&due), ["ing/a", "ing/b"]);
        for (key, (ticket, _)) in due {
            let b2 = hash(p.current.as_ref().unwrap());
            p.pushed(&key, ticket, &b2, applied("reload"), t2, "t2");
        }
        p.set_pods(vec![agent_restarted, target("b", "10.0.0.2")], t2);
        p.set_bundle(r3);
        assert_eq!(p.probe_all(t2, |_| view(Some("unknown"))).len(), 1);
        assert!(p.due(Some(1), min, t2 + Duration::from_secs(1)).is_empty());
        assert_eq!(p.due(Some(1), min, t2 + min).len(), 2);
        // A restarted container (HAProxy on its bootstrap configuration) is not held back.
        let mut q = admitted(t0);
        let b1 = bundle("one", true, t0);
        q.set_bundle(b1.clone());
        q.push_all(&b1, t0, applied("reload"));
        let mut restarted = target("a", "10.0.0.1");
        restarted.incarnation = "uid haproxy=1,haptic-agent=0".into();
        q.set_pods(vec![restarted, target("b", "10.0.0.2")], t1);
        q.probe_all(t1, |_| view(None));
        assert_eq!(keys(&q.due(Some(1), min, t1)), ["ing/a"]);
    }

    /// With `dataplane.maxParallel`, the pods waiting longest are called first: when bundles
    /// come faster than a push completes, no pod is left behind for good.
    #[test]
    fn the_pods_waiting_longest_go_first() {
        let t0 = Instant::now();
        let mut p = Planner::new(t0);
        let pods: Vec<PodTarget> = (1..=3)
            .map(|i| target(&format!("p{i}"), &format!("10.0.0.{i}")))
            .collect();
        p.set_pods(pods, t0);
        p.probe_all(t0, |_| view(None));
        let mut served = Vec::new();
        for i in 0..6u64 {
            let now = t0 + Duration::from_secs(i + 1);
            let b = bundle(&format!("b{i}"), false, now);
            p.set_bundle(b.clone());
            let PushPlan::Push { pods, .. } = p.pushes(Some(1), Duration::ZERO, now, 1) else {
                panic!("a push is due");
            };
            let (call, _) = &pods[0];
            served.push(call.key.clone());
            p.pushed(
                &call.key,
                call.ticket,
                &hash(&b),
                applied("runtime"),
                now,
                "n",
            );
        }
        assert_eq!(
            served,
            ["ing/p1", "ing/p2", "ing/p3", "ing/p1", "ing/p2", "ing/p3"]
        );
    }

    /// The rate limit counts per pod: a pod that joins later gets the current bundle at once,
    /// and the wait of one pod is not another's.
    #[test]
    fn the_reload_rate_limit_is_per_pod() {
        let t0 = Instant::now();
        let min = Duration::from_secs(5);
        let mut p = admitted(t0);
        let b1 = bundle("one", true, t0);
        p.set_bundle(b1.clone());
        p.push_all(&b1, t0, applied("reload"));
        let t1 = t0 + Duration::from_secs(1);
        let b2 = bundle("two", true, t1);
        p.set_bundle(b2.clone());
        p.set_pods(
            vec![
                target("a", "10.0.0.1"),
                target("b", "10.0.0.2"),
                target("c", "10.0.0.3"),
            ],
            t1,
        );
        p.probe_all(t1, |_| view(None));
        assert_eq!(keys(&p.due(Some(1), min, t1)), ["ing/c"]);
        // a reloaded at t0, b (which joined later) at t0 + 3 s: a may reload again at
        // t0 + 5 s, b at t0 + 8 s.
        let mut q = Planner::new(t0);
        q.set_pods(vec![target("a", "10.0.0.1")], t0);
        q.probe_all(t0, |_| view(None));
        let r1 = bundle("r1", true, t0);
        q.set_bundle(r1.clone());
        q.push_all(&r1, t0, applied("reload"));
        let t3 = t0 + Duration::from_secs(3);
        q.set_pods(vec![target("a", "10.0.0.1"), target("b", "10.0.0.2")], t3);
        q.probe_all(t3, |_| view(None));
        let due = q.due(Some(1), min, t3);
        assert_eq!(keys(&due), ["ing/b"]);
        q.pushed(
            "ing/b",
            due["ing/b"].0,
            &hash(&r1),
            applied("reload"),
            t3,
            "t3",
        );
        let r2 = bundle("r2", true, t3);
        q.set_bundle(r2);
        assert!(q.due(Some(1), min, t3).is_empty());
        let t5 = t0 + min;
        let due = q.due(Some(1), min, t5);
        assert_eq!(keys(&due), ["ing/a"]);
        assert_eq!(q.next_wake(IDLE * 100, t5), Duration::from_secs(3));
    }

    /// A pod whose agent is slow to answer (a hung node, a reload that takes long) holds back
    /// no other pod: the others get every newer bundle meanwhile, and the slow one the latest
    /// once it answers.
    #[test]
    fn a_busy_pod_holds_back_no_other() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        let first = p.due(Some(1), Duration::ZERO, t0);
        let (slow, _) = first["ing/a"].clone();
        p.pushed(
            "ing/b",
            first["ing/b"].0,
            &hash(&b1),
            applied("runtime"),
            t0,
            "t0",
        );
        // Two newer bundles: b gets each; a, still busy with the first push, gets none.
        let mut latest = b1.clone();
        for text in ["two", "three"] {
            latest = bundle(text, false, t0);
            p.set_bundle(latest.clone());
            assert_eq!(p.push_all(&latest, t0, applied("runtime")), ["ing/b"]);
        }
        // The drift check goes to b alone; a's waits until a is free.
        let t1 = t0 + MINUTE;
        let probes = p.probes(t1, MINUTE, ALL);
        assert_eq!(probes.len(), 1);
        let (b, drift) = &probes[0];
        assert_eq!((b.key.as_str(), *drift), ("ing/b", true));
        let runs = view(Some(&hash(&latest)));
        assert_eq!(
            p.probed("ing/b", b.ticket, runs, true, true, t1),
            Note::Quiet
        );
        // /debug/pods shows how long a's call has run.
        let running: Vec<_> = p
            .statuses(t1)
            .into_iter()
            .map(|s| (s.name, s.call_running_seconds))
            .collect();
        assert!(
            matches!(&running[..], [(a, Some(secs)), (b, None)] if a == "a" && b == "b" && *secs == 60),
            "{running:?}"
        );
        // a answers its first push at last, and is pushed the latest, with the first as base.
        let note = p.pushed("ing/a", slow, &hash(&b1), applied("runtime"), t1, "late");
        assert_eq!(
            note,
            Note::Applied {
                result: "runtime".into()
            }
        );
        let due = p.due(Some(1), Duration::ZERO, t1);
        assert_eq!(keys(&due), ["ing/a"]);
        assert_eq!(due["ing/a"].1, Some(hash(&b1)));
        p.pushed(
            "ing/a",
            due["ing/a"].0,
            &hash(&latest),
            applied("runtime"),
            t1,
            "t1",
        );
        assert!(p.everywhere(&hash(&latest)));
        let probes = p.probes(t1, MINUTE, ALL);
        assert_eq!(probes.len(), 1);
        assert_eq!((probes[0].0.key.as_str(), probes[0].1), ("ing/a", true));
    }

    /// `dataplane.maxParallel`: never more calls handed out than there is room for; the rest
    /// stay due and go as calls end.
    #[test]
    fn calls_are_handed_out_within_the_room_left() {
        let t0 = Instant::now();
        let mut p = Planner::new(t0);
        let pods: Vec<PodTarget> = (1..=5)
            .map(|i| target(&format!("p{i}"), &format!("10.0.0.{i}")))
            .collect();
        p.set_pods(pods, t0);
        let first = p.probes(t0, MINUTE, 2);
        assert_eq!(first.len(), 2);
        let second = p.probes(t0, MINUTE, 2);
        assert_eq!(
            second.len(),
            2,
            "the first two are busy, three are still due"
        );
        assert!(p.probes(t0, MINUTE, 0).is_empty());
        for (call, drift) in first.into_iter().chain(second) {
            p.probed(&call.key, call.ticket, view(None), true, drift, t0);
        }
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1);
        match p.pushes(Some(1), Duration::ZERO, t0, 3) {
            PushPlan::Push { pods, .. } => assert_eq!(pods.len(), 3),
            other => panic!("{other:?}"),
        }
        // One left to probe, one admitted pod left to push to.
        assert_eq!(p.probes(t0, MINUTE, ALL).len(), 1);
        assert_eq!(p.due(Some(1), Duration::ZERO, t0).len(), 1);
    }

    /// A busy agent (423, or 503 reload_in_progress) is asked again after the backoff, and
    /// counts as no failure: the pod's status keeps no error.
    #[test]
    fn a_busy_agent_is_asked_again_without_a_failure() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        let due = p.due(Some(1), Duration::ZERO, t0);
        let note = p.pushed(
            "ing/a",
            due["ing/a"].0,
            &hash(&b1),
            Outcome::Busy("423 busy".into()),
            t0,
            "t0",
        );
        assert_eq!(note, Note::Busy("423 busy".into()));
        p.pushed(
            "ing/b",
            due["ing/b"].0,
            &hash(&b1),
            Outcome::Failed("x".into()),
            t0,
            "t0",
        );
        let a = p.statuses(t0).into_iter().find(|s| s.name == "a").unwrap();
        assert_eq!((a.last_error, a.consecutive_failures), (None, 0));
        // Not pushed again before its backoff, and probed first.
        assert!(p.due(Some(1), Duration::ZERO, t0).is_empty());
        let later = t0 + Duration::from_secs(1);
        let probes = p.probes(later, MINUTE, ALL);
        assert_eq!(probes.len(), 2, "{probes:?}");
    }

    /// A bundle's change-to-deployed latency counts once: when it first reaches every pod.
    #[test]
    fn a_bundle_is_newly_everywhere_once() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        let due = p.due(Some(1), Duration::ZERO, t0);
        p.pushed(
            "ing/a",
            due["ing/a"].0,
            &hash(&b1),
            applied("runtime"),
            t0,
            "t0",
        );
        assert!(!p.newly_everywhere(&hash(&b1)), "one pod of two");
        p.pushed(
            "ing/b",
            due["ing/b"].0,
            &hash(&b1),
            applied("runtime"),
            t0,
            "t0",
        );
        assert!(p.newly_everywhere(&hash(&b1)));
        assert!(!p.newly_everywhere(&hash(&b1)), "counted already");
    }

    #[test]
    fn a_failed_push_backs_off_and_reprobes_before_the_next_push() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        let due = p.due(Some(1), Duration::ZERO, t0);
        let note = p.pushed(
            "ing/a",
            due["ing/a"].0,
            &hash(&b1),
            Outcome::Failed("502".into()),
            t0,
            "t0",
        );
        assert_eq!(note, Note::Failed("502".into()));
        p.pushed(
            "ing/b",
            due["ing/b"].0,
            &hash(&b1),
            applied("runtime"),
            t0,
            "t0",
        );
        let a = &p.pods["ing/a"];
        assert!(a.next_attempt > t0, "backoff");
        assert_eq!((a.status.consecutive_failures, a.known), (1, false));
        assert_eq!(a.status.last_error.as_deref(), Some("502"));
        let retry = a.next_attempt;
        // Nothing before the retry time: no probe, no push; the deployer sleeps until then.
        assert!(p.probes(t0, MINUTE, ALL).is_empty());
        assert!(p.due(Some(1), Duration::ZERO, t0).is_empty());
        assert_eq!(p.next_wake(IDLE, t0), (retry - t0).min(IDLE));
        // Then probed again (what it runs is unknown), then pushed.
        let notes = p.probe_all(retry, |_| view(None));
        assert_eq!(
            notes.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["ing/a"]
        );
        let due = p.due(Some(1), Duration::ZERO, retry);
        assert_eq!(keys(&due), ["ing/a"]);
        // Backoff grows with consecutive failures, and a success resets the count.
        p.pushed(
            "ing/a",
            due["ing/a"].0,
            &hash(&b1),
            Outcome::Failed("502".into()),
            retry,
            "r",
        );
        assert_eq!(p.pods["ing/a"].status.consecutive_failures, 2);
        assert!(
            p.pods["ing/a"].next_attempt - retry > retry - t0,
            "the step doubles (±25 %)"
        );
        let later = p.pods["ing/a"].next_attempt;
        p.probe_all(later, |_| view(None));
        let due = p.due(Some(1), Duration::ZERO, later);
        p.pushed(
            "ing/a",
            due["ing/a"].0,
            &hash(&b1),
            applied("runtime"),
            later,
            "l",
        );
        assert_eq!(p.pods["ing/a"].status.consecutive_failures, 0);
        assert_eq!(p.pods["ing/a"].status.last_error, None);
    }

    #[test]
    fn fenced_pods_wait_and_keep_their_status() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        let due = p.due(Some(1), Duration::ZERO, t0);
        let note = p.pushed(
            "ing/a",
            due["ing/a"].0,
            &hash(&b1),
            Outcome::Fenced("412 epoch 2 > 1".into()),
            t0,
            "t0",
        );
        assert_eq!(note, Note::Fenced("412 epoch 2 > 1".into()));
        let a = &p.pods["ing/a"];
        assert!(a.next_attempt > t0);
        assert!(a.known, "a fenced push leaves what the pod runs known");
        assert_eq!(
            (a.status.last_error.clone(), a.status.consecutive_failures),
            (None, 0)
        );
        assert!(p.due(Some(1), Duration::ZERO, t0).is_empty());
    }

    #[test]
    fn a_stale_base_is_learnt_and_retried_at_once() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        let due = p.due(Some(1), Duration::ZERO, t0);
        p.pushed(
            "ing/a",
            due["ing/a"].0,
            &hash(&b1),
            Outcome::Stale {
                current: Some("theirs".into()),
            },
            t0,
            "t0",
        );
        let again = p.due(Some(1), Duration::ZERO, t0);
        assert_eq!(
            again.get("ing/a").and_then(|(_, base)| base.as_deref()),
            Some("theirs"),
            "retried at once, with the agent's bundle as If-Match"
        );
    }

    /// A ticket answers only its own call: an answer for a pod that was replaced (another IP
    /// under the same name), or a repeated answer, changes nothing.
    #[test]
    fn answers_count_only_for_their_own_call() {
        let t0 = Instant::now();
        let mut p = Planner::new(t0);
        p.set_pods(vec![target("a", "10.0.0.1")], t0);
        let old = p.probes(t0, MINUTE, ALL).remove(0).0;
        p.set_pods(vec![target("a", "10.0.0.9")], t0);
        let new = p.probes(t0, MINUTE, ALL).remove(0).0;
        assert_eq!(new.target.ip, "10.0.0.9");
        assert_eq!(
            p.probed("ing/a", old.ticket, view(Some("x")), true, false, t0),
            Note::Quiet
        );
        assert!(!p.pods["ing/a"].known && p.pods["ing/a"].busy());
        assert!(matches!(
            p.probed("ing/a", new.ticket, view(Some("y")), true, false, t0),
            Note::Admitted { .. }
        ));
        assert_eq!(
            p.probed("ing/a", new.ticket, view(Some("z")), true, false, t0),
            Note::Quiet
        );
        assert_eq!(p.pods["ing/a"].applied.as_deref(), Some("y"));
    }

    #[test]
    fn drift_is_found_by_the_periodic_check_and_repushed_by_the_leader_only() {
        let t0 = Instant::now();
        let interval = MINUTE;
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        p.push_all(&b1, t0, applied("runtime"));
        // Known pods are not probed again until the drift check is due.
        assert!(p
            .probes(t0 + Duration::from_secs(1), interval, ALL)
            .is_empty());
        let t1 = t0 + interval;
        let probes = p.probes(t1, interval, ALL);
        assert_eq!(probes.len(), 2);
        assert!(probes.iter().all(|(_, drift)| *drift));
        // Pod a restarted HAProxy and lost its bundle; b still runs it.
        let (a, b) = (&probes[0].0, &probes[1].0);
        let note = p.probed("ing/a", a.ticket, view(None), true, true, t1);
        assert_eq!(
            note,
            Note::Drift {
                expected: Some(hash(&b1)),
                runs: None
            }
        );
        assert_eq!(
            p.probed("ing/b", b.ticket, view(Some(&hash(&b1))), true, true, t1),
            Note::Quiet
        );
        let due = p.due(Some(1), Duration::ZERO, t1);
        assert_eq!(keys(&due), ["ing/a"]);
        // The timer restarted: the next check is one interval later.
        assert!(p.probes(t1 + interval / 2, interval, ALL).is_empty());
        p.pushed(
            "ing/a",
            due["ing/a"].0,
            &hash(&b1),
            applied("reload"),
            t1,
            "t1",
        );
        // A known pod whose agent stops answering is probed again after its backoff, not only
        // at the next drift check.
        let probes = p.probes(t1 + interval, interval, ALL);
        assert_eq!(probes.len(), 2);
        let down = Err(NotAdmitted::AgentUnavailable {
            detail: "connection refused".into(),
        });
        let (a, b) = (&probes[0].0, &probes[1].0);
        p.probed("ing/b", b.ticket, down, true, true, t1 + interval);
        p.probed(
            "ing/a",
            a.ticket,
            view(Some(&hash(&b1))),
            true,
            true,
            t1 + interval,
        );
        let retry = p.pods["ing/b"].next_attempt;
        let probes = p.probes(retry, interval, ALL);
        assert_eq!(probes.len(), 1);
        assert_eq!((probes[0].0.key.as_str(), probes[0].1), ("ing/b", false));
        let back = p.probed(
            "ing/b",
            probes[0].0.ticket,
            view(Some(&hash(&b1))),
            true,
            false,
            retry,
        );
        assert!(matches!(back, Note::Admitted { .. }), "{back:?}");
        // A standby learns the same, without reporting drift.
        let mut s = admitted(t0);
        s.pods.get_mut("ing/a").unwrap().applied = Some(hash(&b1));
        let probes = s.probes(t0 + interval, interval, ALL);
        let a = &probes[0].0;
        assert_eq!(
            s.probed("ing/a", a.ticket, view(None), false, true, t0 + interval),
            Note::Quiet
        );
        assert_eq!(s.pods["ing/a"].applied, None);
    }

    #[test]
    fn refused_pods_are_never_pushed_and_their_reason_is_noted_once() {
        let t0 = Instant::now();
        let mut p = Planner::new(t0);
        p.set_pods(vec![target("a", "10.0.0.1")], t0);
        p.set_bundle(bundle("one", false, t0));
        let mismatch = |_: &str| {
            Err(NotAdmitted::VersionMismatch {
                runs: "3.0.1".into(),
                required: "2.6".into(),
            })
        };
        let notes = p.probe_all(t0, mismatch);
        assert!(
            matches!(&notes[0].1, Note::Refused(why) if why.contains("runs HAProxy 3.0.1")),
            "{notes:?}"
        );
        assert!(p.due(Some(1), Duration::ZERO, t0).is_empty());
        assert_eq!(p.admitted(), 0);
        assert!(matches!(
            p.statuses(t0)[0].not_admitted,
            Some(NotAdmitted::VersionMismatch { .. })
        ));
        let retry = p.pods["ing/a"].next_attempt;
        assert!(retry > t0);
        assert_eq!(
            p.probe_all(retry, mismatch),
            [("ing/a".to_string(), Note::Quiet)],
            "same reason: no new line"
        );
    }

    #[test]
    fn pod_changes_and_new_terms() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        p.pods.get_mut("ing/a").unwrap().applied = Some("x".into());
        // b is gone; a keeps its state; c is new and unknown.
        p.set_pods(vec![target("a", "10.0.0.1"), target("c", "10.0.0.3")], t0);
        assert_eq!(p.pods.keys().collect::<Vec<_>>(), ["ing/a", "ing/c"]);
        assert!(p.pods["ing/a"].known && !p.pods["ing/c"].known);
        // The same name with another IP is another pod.
        p.set_pods(vec![target("a", "10.0.0.9"), target("c", "10.0.0.3")], t0);
        assert!(!p.pods["ing/a"].known);
        assert_eq!(p.pods["ing/a"].applied, None);
        // A new term probes every pod again before any push, even those waiting for a retry.
        let mut q = admitted(t0);
        q.set_bundle(bundle("one", false, t0));
        let due = q.due(Some(1), Duration::ZERO, t0);
        q.pushed(
            "ing/a",
            due["ing/a"].0,
            "h",
            Outcome::Failed("x".into()),
            t0,
            "t0",
        );
        q.pushed("ing/b", due["ing/b"].0, "h", applied("runtime"), t0, "t0");
        q.new_term(t0);
        let probes = q.probes(
            t0 + Duration::from_millis(1),
            Duration::from_secs(3600),
            ALL,
        );
        assert_eq!(probes.len(), 2);
    }
}
