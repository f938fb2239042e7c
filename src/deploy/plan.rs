//! The deployer's decisions, without I/O: from the pods' states, the latest bundle, the
//! leadership and the clock, which pods to probe (`GET /v1/state`) and which to push to, and
//! when; then what each answer means for the pod (admission, drift, fencing, backoff, rate
//! limits). [`super::Deployer`] performs the calls and reports the answers back; every rule
//! lives here, where the unit tests below drive it with a fake clock.

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

/// The next push round, when one is due.
#[derive(Debug)]
pub(crate) enum PushPlan {
    /// Nothing to push (no bundle, not the leader, or every pod has it or waits for a retry).
    Nothing,
    /// A reload-class bundle is due but the last reload push was less than the minimum
    /// deployment interval ago.
    RateLimited { until: Instant },
    /// Push the bundle to these pods, each with the bundle it is believed to run (`If-Match`).
    Push {
        published: Arc<Published>,
        epoch: u64,
        pods: Vec<(String, PodTarget, Option<String>)>,
    },
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
}

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
    last_reload_push: Option<Instant>,
    /// The last bundle seen on every admitted pod: its change-to-deployed latency counts once.
    deployed: Option<String>,
    /// A reload-class bundle arrived and no reload push has gone out since: a later bundle
    /// that is runtime-only against it is still a reload for pods that run what came before.
    reload_pending: bool,
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

fn key_of(target: &PodTarget) -> String {
    format!("{}/{}", target.namespace, target.name)
}

impl Planner {
    pub(super) fn new(now: Instant) -> Planner {
        Planner {
            pods: BTreeMap::new(),
            current: None,
            last_reload_push: None,
            deployed: None,
            reload_pending: false,
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
        self.reload_pending |= published.reload;
        self.current = Some(published);
    }

    /// The pods that may receive configuration now; others are forgotten, and a pod whose IP
    /// changed under the same name is a new pod.
    pub(super) fn set_pods(&mut self, targets: Vec<PodTarget>, now: Instant) {
        let keys: std::collections::BTreeSet<String> = targets.iter().map(key_of).collect();
        self.pods.retain(|k, _| keys.contains(k));
        for target in targets {
            let entry = self
                .pods
                .entry(key_of(&target))
                .or_insert_with(|| PodState::new(&target, now));
            if entry.status.ip != target.ip {
                *entry = PodState::new(&target, now);
            } else if entry.incarnation != target.incarnation {
                // A container restarted (or the pod was recreated under its name and IP):
                // what it runs is asked again now.
                entry.incarnation = target.incarnation.clone();
                entry.known = false;
                entry.next_attempt = now;
            }
        }
    }

    /// A new leadership term: learn what every pod runs before pushing.
    pub(super) fn new_term(&mut self, now: Instant) {
        for pod in self.pods.values_mut() {
            pod.known = false;
            pod.next_attempt = now;
        }
    }

    /// The pods to probe now: those not known in this term, and all of them when the drift
    /// check is due, except those waiting for a retry. Returns whether this is a drift round
    /// (its timer restarts).
    pub(super) fn probes(
        &mut self,
        now: Instant,
        drift_interval: Duration,
    ) -> (Vec<(String, PodTarget)>, bool) {
        let drift_due = now >= self.next_drift;
        if drift_due {
            self.next_drift = now + drift_interval;
        }
        let list = self
            .pods
            .iter()
            .filter(|(_, p)| (!p.known || drift_due) && p.next_attempt <= now)
            .map(|(k, p)| (k.clone(), p.target()))
            .collect();
        (list, drift_due)
    }

    /// Records a probe's answer. `leader`: whether this replica pushes (only then is drift
    /// reported); `drift_round`: the round was a periodic check.
    pub(super) fn probed(
        &mut self,
        key: &str,
        answer: Result<AgentView, NotAdmitted>,
        leader: bool,
        drift_round: bool,
        now: Instant,
    ) -> Note {
        let Some(pod) = self.pods.get_mut(key) else {
            return Note::Quiet;
        };
        match answer {
            Ok(AgentView { bundle, version }) => {
                let note = if leader && pod.known && drift_round && bundle != pod.applied {
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

    /// The next push round. `epoch`: the leader's epoch, `None` on a standby (which never
    /// pushes). A reload-class bundle waits for `min_interval` since the last reload push; the
    /// wait starts only when a push happens.
    pub(super) fn pushes(
        &mut self,
        epoch: Option<u64>,
        min_interval: Duration,
        now: Instant,
    ) -> PushPlan {
        let (Some(published), Some(epoch)) = (self.current.clone(), epoch) else {
            return PushPlan::Nothing;
        };
        if self.held_until(epoch, now).is_some() {
            return PushPlan::Nothing;
        }
        let hash = published.hash.as_str();
        let pods: Vec<(String, PodTarget, Option<String>)> = self
            .pods
            .iter()
            .filter(|(_, p)| {
                p.status.admitted
                    && p.known
                    && p.applied.as_deref() != Some(hash)
                    && p.next_attempt <= now
            })
            .map(|(k, p)| (k.clone(), p.target(), p.applied.clone()))
            .collect();
        if pods.is_empty() {
            return PushPlan::Nothing;
        }
        if published.reload || self.reload_pending {
            if let Some(last) = self.last_reload_push {
                let until = last + min_interval;
                if now < until {
                    return PushPlan::RateLimited { until };
                }
            }
            self.last_reload_push = Some(now);
            self.reload_pending = false;
        }
        PushPlan::Push {
            published,
            epoch,
            pods,
        }
    }

    /// Records a push's outcome for `hash` (the bundle that was pushed).
    pub(super) fn pushed(
        &mut self,
        key: &str,
        hash: &str,
        outcome: Outcome,
        now: Instant,
        at: &str,
    ) -> Note {
        let Some(pod) = self.pods.get_mut(key) else {
            return Note::Quiet;
        };
        match outcome {
            Outcome::Applied { result } => {
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

    /// Whether every admitted pod runs `hash`.
    pub(super) fn everywhere(&self, hash: &str) -> bool {
        self.pods
            .values()
            .filter(|p| p.status.admitted)
            .all(|p| p.applied.as_deref() == Some(hash))
    }

    /// How long to sleep: until the earliest retry, at most `max` (a `max` below [`MIN_WAKE`]
    /// counts as `MIN_WAKE`).
    pub(super) fn next_wake(&self, max: Duration, now: Instant) -> Duration {
        self.pods
            .values()
            .map(|p| p.next_attempt.saturating_duration_since(now))
            .filter(|d| !d.is_zero())
            .min()
            .unwrap_or(max)
            .min(max.max(MIN_WAKE))
    }

    /// The pods' statuses for `/debug/pods` and the status writer.
    pub(super) fn statuses(&self) -> Vec<PodStatus> {
        self.pods
            .values()
            .map(|p| {
                let mut s = p.status.clone();
                s.applied_bundle = p.applied.clone();
                s
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_agent::protocol::Bundle;

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

    /// A planner with pods a and b probed (bootstrap) and admitted, at `t0`.
    fn admitted(t0: Instant) -> Planner {
        let mut p = Planner::new(t0);
        p.set_pods(vec![target("a", "10.0.0.1"), target("b", "10.0.0.2")], t0);
        let (probes, drift) = p.probes(t0, Duration::from_secs(60));
        assert_eq!(probes.len(), 2);
        for (key, _) in probes {
            assert!(matches!(
                p.probed(&key, view(None), true, drift, t0),
                Note::Admitted { .. }
            ));
        }
        p
    }

    fn push_keys(plan: &PushPlan) -> Vec<String> {
        match plan {
            PushPlan::Push { pods, .. } => pods.iter().map(|(k, _, _)| k.clone()).collect(),
            other => panic!("expected a push, got {other:?}"),
        }
    }

    fn hash(p: &Arc<Published>) -> String {
        p.hash.as_str().to_string()
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
        for (key, _) in p.probes(t0, Duration::from_secs(60)).0 {
            p.probed(&key, view(None), true, false, t0);
        }
        assert!(matches!(
            p.pushes(Some(3), Duration::ZERO, t0),
            PushPlan::Nothing
        ));
        // A release of another epoch changes nothing; the right one lets the pushes go.
        p.release(2);
        assert!(matches!(
            p.pushes(Some(3), Duration::ZERO, t0),
            PushPlan::Nothing
        ));
        p.release(3);
        assert_eq!(
            push_keys(&p.pushes(Some(3), Duration::ZERO, t0)),
            ["ing/a", "ing/b"]
        );
        // A later term is held again; without a release it goes at the deadline.
        assert!(!p.saw_epoch(None, 1, t0), "losing the lead holds nothing");
        assert!(p.saw_epoch(Some(5), 2, t0));
        for (key, _) in p.probes(t0, Duration::from_secs(60)).0 {
            p.probed(&key, view(None), true, false, t0);
        }
        let almost = t0 + TAKEOVER_HOLD - Duration::from_millis(1);
        assert!(matches!(
            p.pushes(Some(5), Duration::ZERO, almost),
            PushPlan::Nothing
        ));
        assert!(p.held_until(5, almost).is_some());
        let after = t0 + TAKEOVER_HOLD;
        assert!(p.held_until(5, after).is_none());
        assert_eq!(
            push_keys(&p.pushes(Some(5), Duration::ZERO, after)).len(),
            2
        );
        // A release that comes before the deployer saw the epoch counts all the same.
        p.release(6);
        assert!(p.saw_epoch(Some(6), 3, after));
        assert!(p.held_until(6, after).is_none());
        // A late release of an older term does not hold the current one again.
        p.release(4);
        assert!(p.held_until(6, after).is_none());
        // The same term renumbered (the Lease started over below the agents' epoch): no new
        // term, nothing held, what the pods run is still known.
        for (key, _) in p.probes(after, Duration::from_secs(60)).0 {
            p.probed(&key, view(None), true, false, after);
        }
        assert!(!p.saw_epoch(Some(9), 3, after));
        assert!(p.held_until(9, after).is_none());
        assert!(p.probes(after, Duration::from_secs(60)).0.is_empty());
    }

    /// A container that restarts (HAProxy back on its bootstrap configuration) changes the
    /// pod's incarnation under the same name and IP: it is asked again at once, not at the
    /// next drift check.
    #[test]
    fn a_restarted_container_is_probed_again_at_once() {
        let t0 = Instant::now();
        let mut p = Planner::new(t0);
        p.set_pods(vec![target("a", "10.0.0.1")], t0);
        for (key, _) in p.probes(t0, Duration::from_secs(60)).0 {
            p.probed(&key, view(Some("b1")), true, false, t0);
        }
        let later = t0 + Duration::from_secs(5);
        assert!(p.probes(later, Duration::from_secs(60)).0.is_empty());
        p.set_pods(vec![target("a", "10.0.0.1")], later);
        assert!(
            p.probes(later, Duration::from_secs(60)).0.is_empty(),
            "nothing changed"
        );
        let mut restarted = target("a", "10.0.0.1");
        restarted.incarnation = "uid haproxy=1,haptic-agent=0".into();
        p.set_pods(vec![restarted.clone()], later);
        assert_eq!(
            p.probes(later, Duration::from_secs(60)).0,
            vec![("ing/a".to_string(), restarted)]
        );
    }

    #[test]
    fn new_pods_are_probed_then_pushed_with_what_they_run_as_base() {
        let t0 = Instant::now();
        let mut p = Planner::new(t0);
        p.set_pods(vec![target("a", "10.0.0.1")], t0);
        let b1 = bundle("one", true, t0);
        p.set_bundle(b1.clone());
        // Unknown pods are never pushed to before a probe.
        assert!(matches!(
            p.pushes(Some(1), Duration::ZERO, t0),
            PushPlan::Nothing
        ));
        let (probes, _) = p.probes(t0, Duration::from_secs(60));
        assert_eq!(probes, vec![("ing/a".to_string(), target("a", "10.0.0.1"))]);
        p.probed("ing/a", view(Some("old")), true, false, t0);
        match p.pushes(Some(7), Duration::ZERO, t0) {
            PushPlan::Push { epoch, pods, .. } => {
                assert_eq!(epoch, 7);
                assert_eq!(
                    pods,
                    vec![("ing/a".into(), target("a", "10.0.0.1"), Some("old".into()))]
                );
            }
            other => panic!("{other:?}"),
        }
        let note = p.pushed(
            "ing/a",
            &hash(&b1),
            Outcome::Applied {
                result: "reload".into(),
            },
            t0,
            "now",
        );
        assert_eq!(
            note,
            Note::Applied {
                result: "reload".into()
            }
        );
        assert!(p.everywhere(&hash(&b1)));
        assert!(matches!(
            p.pushes(Some(7), Duration::ZERO, t0),
            PushPlan::Nothing
        ));
        assert_eq!(
            p.statuses()[0].applied_bundle.as_deref(),
            Some(hash(&b1).as_str())
        );
    }

    #[test]
    fn standbys_probe_but_never_push() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        p.set_bundle(bundle("one", false, t0));
        assert!(matches!(
            p.pushes(None, Duration::ZERO, t0),
            PushPlan::Nothing
        ));
        assert_eq!(p.admitted(), 2);
    }

    #[test]
    fn reloads_are_rate_limited_runtime_changes_are_not() {
        let t0 = Instant::now();
        let min = Duration::from_secs(5);
        let mut p = admitted(t0);
        let b1 = bundle("one", true, t0);
        p.set_bundle(b1.clone());
        assert_eq!(push_keys(&p.pushes(Some(1), min, t0)), ["ing/a", "ing/b"]);
        for k in ["ing/a", "ing/b"] {
            p.pushed(
                k,
                &hash(&b1),
                Outcome::Applied {
                    result: "reload".into(),
                },
                t0,
                "t0",
            );
        }
        // A runtime-only bundle is not held back by the reload limit.
        let t1 = t0 + Duration::from_secs(1);
        let b3 = bundle("three", false, t1);
        p.set_bundle(b3.clone());
        assert_eq!(push_keys(&p.pushes(Some(1), min, t1)), ["ing/a", "ing/b"]);
        for k in ["ing/a", "ing/b"] {
            p.pushed(
                k,
                &hash(&b3),
                Outcome::Applied {
                    result: "runtime".into(),
                },
                t1,
                "t1",
            );
        }
        // A second reload one second later waits until five seconds after the first.
        let b2 = bundle("two", true, t1);
        p.set_bundle(b2.clone());
        match p.pushes(Some(1), min, t1) {
            PushPlan::RateLimited { until } => assert_eq!(until, t0 + min),
            other => panic!("{other:?}"),
        }
        // A bundle runtime-only against the held one is a reload for the pods (they run what
        // came before it): it waits too, and is not a way around the limit.
        let b4 = bundle("four", false, t1);
        p.set_bundle(b4);
        assert!(matches!(
            p.pushes(Some(1), min, t1),
            PushPlan::RateLimited { .. }
        ));
        assert_eq!(
            push_keys(&p.pushes(Some(1), min, t0 + min)),
            ["ing/a", "ing/b"]
        );
    }

    /// A busy agent (423, or 503 reload_in_progress) is asked again after the backoff, and
    /// counts as no failure: the pod's status keeps no error.
    #[test]
    fn a_busy_agent_is_asked_again_without_a_failure() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        push_keys(&p.pushes(Some(1), Duration::ZERO, t0));
        let note = p.pushed(
            "ing/a",
            &hash(&b1),
            Outcome::Busy("423 busy".into()),
            t0,
            "t0",
        );
        assert_eq!(note, Note::Busy("423 busy".into()));
        let a = p.statuses().into_iter().find(|s| s.name == "a").unwrap();
        assert_eq!((a.last_error, a.consecutive_failures), (None, 0));
        // Not pushed again before its backoff, and probed first.
        assert_eq!(push_keys(&p.pushes(Some(1), Duration::ZERO, t0)), ["ing/b"]);
        let later = t0 + Duration::from_secs(1);
        let (probes, _) = p.probes(later, Duration::from_secs(60));
        assert_eq!(probes.len(), 1, "{probes:?}");
    }

    /// A bundle's change-to-deployed latency counts once: when it first reaches every pod.
    #[test]
    fn a_bundle_is_newly_everywhere_once() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        push_keys(&p.pushes(Some(1), Duration::ZERO, t0));
        let applied = || Outcome::Applied {
            result: "runtime".into(),
        };
        p.pushed("ing/a", &hash(&b1), applied(), t0, "t0");
        assert!(!p.newly_everywhere(&hash(&b1)), "one pod of two");
        p.pushed("ing/b", &hash(&b1), applied(), t0, "t0");
        assert!(p.newly_everywhere(&hash(&b1)));
        assert!(!p.newly_everywhere(&hash(&b1)), "counted already");
    }

    #[test]
    fn a_failed_push_backs_off_and_reprobes_before_the_next_push() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        push_keys(&p.pushes(Some(1), Duration::ZERO, t0));
        let note = p.pushed("ing/a", &hash(&b1), Outcome::Failed("502".into()), t0, "t0");
        assert_eq!(note, Note::Failed("502".into()));
        p.pushed(
            "ing/b",
            &hash(&b1),
            Outcome::Applied {
                result: "runtime".into(),
            },
            t0,
            "t0",
        );
        let a = &p.pods["ing/a"];
        assert!(a.next_attempt > t0, "backoff");
        assert_eq!((a.status.consecutive_failures, a.known), (1, false));
        assert_eq!(a.status.last_error.as_deref(), Some("502"));
        let retry = a.next_attempt;
        // Nothing before the retry time: no probe, no push; the deployer sleeps until then.
        assert!(p.probes(t0, Duration::from_secs(60)).0.is_empty());
        assert!(matches!(
            p.pushes(Some(1), Duration::ZERO, t0),
            PushPlan::Nothing
        ));
        assert_eq!(p.next_wake(IDLE, t0), (retry - t0).min(IDLE));
        // Then probed again (what it runs is unknown), then pushed.
        let (probes, _) = p.probes(retry, Duration::from_secs(60));
        assert_eq!(
            probes.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["ing/a"]
        );
        p.probed("ing/a", view(None), true, false, retry);
        assert_eq!(
            push_keys(&p.pushes(Some(1), Duration::ZERO, retry)),
            ["ing/a"]
        );
        // Backoff grows with consecutive failures, and a success resets the count.
        p.pushed(
            "ing/a",
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
        p.probed("ing/a", view(None), true, false, later);
        p.pushes(Some(1), Duration::ZERO, later);
        p.pushed(
            "ing/a",
            &hash(&b1),
            Outcome::Applied {
                result: "runtime".into(),
            },
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
        p.pushes(Some(1), Duration::ZERO, t0);
        let note = p.pushed(
            "ing/a",
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
        assert!(!push_keys(&p.pushes(Some(1), Duration::ZERO, t0)).contains(&"ing/a".to_string()));
    }

    #[test]
    fn a_stale_base_is_learnt_and_retried_at_once() {
        let t0 = Instant::now();
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        p.pushes(Some(1), Duration::ZERO, t0);
        p.pushed(
            "ing/a",
            &hash(&b1),
            Outcome::Stale {
                current: Some("theirs".into()),
            },
            t0,
            "t0",
        );
        match p.pushes(Some(1), Duration::ZERO, t0) {
            PushPlan::Push { pods, .. } => {
                let a = pods
                    .iter()
                    .find(|(k, _, _)| k == "ing/a")
                    .expect("retried at once");
                assert_eq!(
                    a.2.as_deref(),
                    Some("theirs"),
                    "with the agent's bundle as If-Match"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn drift_is_found_by_the_periodic_check_and_repushed_by_the_leader_only() {
        let t0 = Instant::now();
        let interval = Duration::from_secs(60);
        let mut p = admitted(t0);
        let b1 = bundle("one", false, t0);
        p.set_bundle(b1.clone());
        p.pushes(Some(1), Duration::ZERO, t0);
        for k in ["ing/a", "ing/b"] {
            p.pushed(
                k,
                &hash(&b1),
                Outcome::Applied {
                    result: "runtime".into(),
                },
                t0,
                "t0",
            );
        }
        // Known pods are not probed again until the drift check is due.
        assert!(p.probes(t0 + Duration::from_secs(1), interval).0.is_empty());
        let t1 = t0 + interval;
        let (probes, drift_round) = p.probes(t1, interval);
        assert!(drift_round);
        assert_eq!(probes.len(), 2);
        // Pod a restarted HAProxy and lost its bundle; b still runs it.
        let note = p.probed("ing/a", view(None), true, drift_round, t1);
        assert_eq!(
            note,
            Note::Drift {
                expected: Some(hash(&b1)),
                runs: None
            }
        );
        assert_eq!(
            p.probed("ing/b", view(Some(&hash(&b1))), true, drift_round, t1),
            Note::Quiet
        );
        assert_eq!(push_keys(&p.pushes(Some(1), Duration::ZERO, t1)), ["ing/a"]);
        // The timer restarted: the next check is one interval later.
        assert!(!p.probes(t1 + interval / 2, interval).1);
        p.pushed(
            "ing/a",
            &hash(&b1),
            Outcome::Applied {
                result: "reload".into(),
            },
            t1,
            "t1",
        );
        // A known pod whose agent stops answering is probed again after its backoff, not only
        // at the next drift check.
        let (probes, drift) = p.probes(t1 + interval, interval);
        assert!(drift);
        assert_eq!(probes.len(), 2);
        let down = Err(NotAdmitted::AgentUnavailable {
            detail: "connection refused".into(),
        });
        p.probed("ing/b", down, true, drift, t1 + interval);
        p.probed("ing/a", view(Some(&hash(&b1))), true, drift, t1 + interval);
        let retry = p.pods["ing/b"].next_attempt;
        let (probes, drift) = p.probes(retry, interval);
        assert!(!drift);
        assert_eq!(
            probes.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["ing/b"]
        );
        let back = p.probed("ing/b", view(Some(&hash(&b1))), true, drift, retry);
        assert!(matches!(back, Note::Admitted { .. }), "{back:?}");
        // A standby learns the same, without reporting drift.
        let mut s = admitted(t0);
        s.pods.get_mut("ing/a").unwrap().applied = Some(hash(&b1));
        let (_, drift) = s.probes(t0 + interval, interval);
        assert_eq!(
            s.probed("ing/a", view(None), false, drift, t0 + interval),
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
        let mismatch = || {
            Err(NotAdmitted::VersionMismatch {
                runs: "3.0.1".into(),
                required: "2.6".into(),
            })
        };
        let note = p.probed("ing/a", mismatch(), true, false, t0);
        assert!(
            matches!(note, Note::Refused(ref why) if why.contains("runs HAProxy 3.0.1")),
            "{note:?}"
        );
        assert!(matches!(
            p.pushes(Some(1), Duration::ZERO, t0),
            PushPlan::Nothing
        ));
        assert_eq!(p.admitted(), 0);
        assert!(matches!(
            p.statuses()[0].not_admitted,
            Some(NotAdmitted::VersionMismatch { .. })
        ));
        let retry = p.pods["ing/a"].next_attempt;
        assert!(retry > t0);
        assert_eq!(
            p.probed("ing/a", mismatch(), true, false, retry),
            Note::Quiet,
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
        q.pushed("ing/a", "h", Outcome::Failed("x".into()), t0, "t0");
        q.new_term(t0);
        let (probes, _) = q.probes(t0 + Duration::from_millis(1), Duration::from_secs(3600));
        assert_eq!(probes.len(), 2);
    }
}
