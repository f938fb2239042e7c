//! Leader election with a `coordination.k8s.io/v1` Lease.
//!
//! Expiry is judged from the LOCAL time at which the current holder's renewal was last observed
//! (a changed `renewTime` or holder), never from timestamps in the object, because clocks differ
//! between nodes. Writes carry the observed `resourceVersion`, so of two candidates racing for
//! an expired lease exactly one wins (the other gets 409). A leader that cannot renew within
//! `renew_deadline` steps down before its lease can expire elsewhere; on shutdown it clears the
//! holder so a standby takes over within one retry period.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::Sender;
use serde_json::{json, Value};

use super::client::{Client, KubeError, ResourceRef};

#[derive(Debug, Clone)]
pub struct LeaseConfig {
    pub namespace: String,
    pub name: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

/// The three durations of an election, which a config change may update while the elector
/// runs: `(lease_duration, renew_deadline, retry_period)`. Every replica waits on the duration
/// the Lease itself carries, so a change takes effect with the leader's next renewal.
pub type LiveTimings = Arc<Mutex<(Duration, Duration, Duration)>>;

/// Leadership changes, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderEvent {
    /// This replica leads. `epoch` is the Lease's `leaseTransitions` after acquiring: it grows
    /// with every change of leader, so agents can refuse a stale leader's pushes.
    Started {
        epoch: u64,
    },
    Stopped,
}

/// Whether this replica may act as leader right now. Leadership is valid until
/// `renew_deadline` after the start of the last successful renewal, so a leader whose API
/// server stops answering stops acting on time even while a request hangs.
#[derive(Debug, Default)]
pub struct Leadership {
    state: std::sync::Mutex<Option<(Instant, u64)>>,
    /// The highest epoch an agent says it has accepted (from this leader or any before). Agents
    /// refuse a lower one for good, so a Lease that starts over (deleted, renamed) must not
    /// start below it: the elector numbers its terms above it.
    agents_epoch: AtomicU64,
    /// Without election (one replica, the only writer): the epoch is the agents' own.
    follows_agents: bool,
    /// Terms gained: an epoch that changes within one term is a renumbering, not a new leader.
    term: AtomicU64,
}

impl Leadership {
    /// Leadership without election (single replica): always leading, at the highest epoch
    /// the agents have accepted (0 at first).
    pub fn always() -> Leadership {
        Leadership {
            state: std::sync::Mutex::new(Some((
                Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600),
                0,
            ))),
            follows_agents: true,
            ..Leadership::default()
        }
    }

    pub fn is_leader(&self) -> bool {
        self.epoch().is_some()
    }

    /// The epoch while leading.
    pub fn epoch(&self) -> Option<u64> {
        let state = crate::lock(&self.state);
        let agents = self.follows_agents.then(|| self.agents_epoch());
        state.and_then(|(until, epoch)| {
            (Instant::now() < until).then_some(epoch.max(agents.unwrap_or(0)))
        })
    }

    /// The term this replica leads in (it grows each time leadership is gained).
    pub fn term(&self) -> u64 {
        self.term.load(Ordering::SeqCst)
    }

    /// An agent has accepted `epoch` (from its state, or a refusal naming it).
    pub fn observe_agent_epoch(&self, epoch: u64) {
        self.agents_epoch.fetch_max(epoch, Ordering::SeqCst);
    }

    pub fn agents_epoch(&self) -> u64 {
        self.agents_epoch.load(Ordering::SeqCst)
    }

    fn set(&self, value: Option<(Instant, u64)>) {
        *crate::lock(&self.state) = value;
    }
}

pub fn lease_resource() -> ResourceRef {
    ResourceRef::new("coordination.k8s.io/v1", "leases", true)
}

/// RFC 3339 in seconds (`Time`), in UTC.
pub fn rfc3339(t: SystemTime) -> String {
    haptic_agent::time::rfc3339(
        t.duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs(),
    )
}

/// RFC 3339 with microseconds (`MicroTime`), in UTC.
pub fn micro_time(t: SystemTime) -> String {
    let seconds = rfc3339(t);
    let micros = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_micros();
    format!("{}.{micros:06}Z", seconds.trim_end_matches('Z'))
}

/// What was last seen of the Lease, and when (local clock).
struct Observation {
    holder: String,
    renew_time: String,
    seen_at: Instant,
}

pub struct Elector {
    /// The client without the per-call timeout (rebuilt when `retry_period` changes).
    base_client: Client,
    client: Client,
    timings: Option<LiveTimings>,
    leadership: Arc<Leadership>,
    config: LeaseConfig,
    events: Sender<LeaderEvent>,
    stop: Arc<AtomicBool>,
    observed: Option<Observation>,
    leading: bool,
    last_renew: Instant,
    /// Leadership changes this replica took part in (for metrics).
    pub transitions: u64,
    /// The highest `leaseTransitions` this replica has seen on the Lease (or written): a Lease
    /// created again numbers its first term above it, even before any agent has been asked.
    seen_epoch: Option<u64>,
    /// Whether this term was renumbered already: once is what a reset Lease needs; more would
    /// be two leaders on two Leases outbidding each other, which is reported instead.
    renumbered: bool,
}

enum Attempt {
    Leading { epoch: u64 },
    Following,
}

impl Elector {
    pub fn new(
        client: Client,
        config: LeaseConfig,
        events: Sender<LeaderEvent>,
        stop: Arc<AtomicBool>,
    ) -> Elector {
        Elector {
            client: Self::bounded(&client, config.retry_period),
            base_client: client,
            timings: None,
            leadership: Arc::default(),
            config,
            events,
            stop,
            observed: None,
            seen_epoch: None,
            renumbered: false,
            leading: false,
            last_renew: Instant::now(),
            transitions: 0,
        }
    }

    /// The view other threads consult before acting as leader.
    pub fn leadership(&self) -> Arc<Leadership> {
        self.leadership.clone()
    }

    fn spec(&self, now: SystemTime, acquire: Option<SystemTime>, transitions: u64) -> Value {
        let mut spec = json!({
            "holderIdentity": self.config.identity,
            // Whole seconds, rounded up: a shorter lease than configured could expire while
            // this leader still acts within its renew deadline.
            "leaseDurationSeconds": self.config.lease_duration.as_secs_f64().ceil().max(1.0) as u64,
            "renewTime": micro_time(now),
            "leaseTransitions": transitions,
        });
        if let Some(t) = acquire {
            spec["acquireTime"] = json!(micro_time(t));
        }
        spec
    }

    fn try_acquire_or_renew(&mut self) -> Result<Attempt, KubeError> {
        let res = lease_resource();
        let ns = Some(self.config.namespace.as_str());
        let now = SystemTime::now();
        let lease = match self.client.get(&res, ns, &self.config.name) {
            Ok(lease) => lease,
            Err(e) if e.is_not_found() => {
                self.renumbered = false;
                let epoch = self.first_epoch(0);
                let object = json!({
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.config.name, "namespace": self.config.namespace},
                    "spec": self.spec(now, Some(now), epoch),
                });
                return match self.client.create(&res, ns, &object) {
                    Ok(_) => Ok(Attempt::Leading { epoch }),
                    Err(e) if e.is_conflict() => Ok(Attempt::Following),
                    Err(e) => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        let spec = lease.get("spec").cloned().unwrap_or(Value::Null);
        let holder = spec
            .get("holderIdentity")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let renew_time = spec
            .get("renewTime")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let duration = spec
            .get("leaseDurationSeconds")
            .and_then(Value::as_u64)
            .map(Duration::from_secs)
            .unwrap_or(self.config.lease_duration);
        let transitions = spec
            .get("leaseTransitions")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        self.seen_epoch = Some(self.seen_epoch.map_or(transitions, |s| s.max(transitions)));
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|o| o.holder != holder || o.renew_time != renew_time);
        if changed {
            self.observed = Some(Observation {
                holder: holder.clone(),
                renew_time,
                seen_at: Instant::now(),
            });
        }
        let seen_at = self
            .observed
            .as_ref()
            .map(|o| o.seen_at)
            .unwrap_or_else(Instant::now);
        let mine = holder == self.config.identity;
        if !mine && !holder.is_empty() && seen_at.elapsed() < duration {
            return Ok(Attempt::Following);
        }
        let (transitions, acquire) = if mine {
            // Agents hold a higher epoch than the Lease (it was created again before this
            // leader had asked them): renumber above it once, or every pod refuses this
            // leader for good.
            let renumbered = self.renewed_epoch(transitions);
            if renumbered != transitions && !self.renumbered {
                log::warn!(
                    "lease={}: agents have accepted epoch {}, above this Lease's {transitions} (the Lease was recreated or reset): leading on as epoch {renumbered}",
                    self.config.name,
                    self.leadership.agents_epoch()
                );
                self.renumbered = true;
                (renumbered, None)
            } else {
                if renumbered != transitions {
                    log::error!(
                        "lease={}: agents keep accepting a higher epoch ({}) than this leader's {transitions}: another controller leads on another Lease (leaseName differs?); this one's pushes are refused",
                        self.config.name,
                        self.leadership.agents_epoch()
                    );
                }
                (transitions, None)
            }
        } else {
            self.renumbered = false;
            (self.first_epoch(transitions + 1), Some(now))
        };
        let mut updated = lease.clone();
        let mut new_spec = self.spec(now, acquire, transitions);
        if mine {
            if let Some(t) = spec.get("acquireTime") {
                new_spec["acquireTime"] = t.clone();
            }
        }
        updated["spec"] = new_spec;
        match self.client.update(&res, ns, &self.config.name, &updated) {
            Ok(_) => Ok(Attempt::Leading { epoch: transitions }),
            Err(e) if e.is_conflict() => Ok(Attempt::Following),
            Err(e) => Err(e),
        }
    }

    /// The epoch of a new term: `candidate`, unless agents have accepted it or more already,
    /// or this replica saw the Lease at it or above (another leader used it, and the Lease was
    /// created again since): then the one above the highest of them.
    fn first_epoch(&self, candidate: u64) -> u64 {
        let agents = self.leadership.agents_epoch();
        let used = match self.seen_epoch {
            Some(seen) => Some(seen.max(agents)),
            None => (agents > 0).then_some(agents),
        };
        match used {
            Some(used) if used >= candidate => used + 1,
            _ => candidate,
        }
    }

    /// The epoch of the term this replica holds at `epoch`: the same, unless agents hold a
    /// higher one (the Lease started over under it).
    fn renewed_epoch(&self, epoch: u64) -> u64 {
        let agents = self.leadership.agents_epoch();
        if agents > epoch {
            agents + 1
        } else {
            epoch
        }
    }

    fn set_leading(&mut self, leading: bool, epoch: u64) {
        if leading == self.leading {
            return;
        }
        self.leading = leading;
        self.transitions += 1;
        let event = if leading {
            LeaderEvent::Started { epoch }
        } else {
            LeaderEvent::Stopped
        };
        log::info!(
            "lease={} identity={} {}",
            self.config.name,
            self.config.identity,
            if leading {
                "leader gained"
            } else {
                "leader lost"
            }
        );
        let _ = self.events.send(event);
    }

    /// Clears the holder so a standby can take over at once (graceful shutdown).
    fn release(&mut self) {
        let res = lease_resource();
        let ns = Some(self.config.namespace.as_str());
        if let Ok(mut lease) = self.client.get(&res, ns, &self.config.name) {
            if lease
                .pointer("/spec/holderIdentity")
                .and_then(Value::as_str)
                == Some(self.config.identity.as_str())
            {
                lease["spec"]["holderIdentity"] = json!("");
                lease["spec"]["leaseDurationSeconds"] = json!(1);
                match self.client.update(&res, ns, &self.config.name, &lease) {
                    Ok(_) => log::info!("lease={} released", self.config.name),
                    Err(e) => log::warn!("lease={} release failed: {e}", self.config.name),
                }
            }
        }
    }

    /// Each lease call is bounded so one attempt (get + update) fits in the renew deadline.
    fn bounded(client: &Client, retry_period: Duration) -> Client {
        client.with_timeout(retry_period.clamp(Duration::from_millis(500), Duration::from_secs(5)))
    }

    /// Takes later changes of the three durations from `timings` at the start of every round.
    pub fn follow_timings(mut self, timings: LiveTimings) -> Elector {
        self.timings = Some(timings);
        self
    }

    fn refresh_timings(&mut self) {
        let Some(timings) = &self.timings else {
            return;
        };
        let (lease, renew, retry) = *timings.lock().unwrap_or_else(|p| p.into_inner());
        let c = &mut self.config;
        if (c.lease_duration, c.renew_deadline, c.retry_period) == (lease, renew, retry) {
            return;
        }
        log::info!(
            "lease={} timings now leaseDuration={lease:?} renewDeadline={renew:?} retryPeriod={retry:?}",
            c.name
        );
        (c.lease_duration, c.renew_deadline, c.retry_period) = (lease, renew, retry);
        self.client = Self::bounded(&self.base_client, retry);
    }

    /// Campaigns and renews until `stop` is set; then steps down and releases the Lease.
    pub fn run(mut self) {
        while !self.stop.load(Ordering::Relaxed) {
            self.refresh_timings();
            let started = Instant::now();
            match self.try_acquire_or_renew() {
                Ok(Attempt::Leading { epoch }) => {
                    self.last_renew = started;
                    if !self.leading {
                        // A new term, counted before its epoch shows: a reader never sees the
                        // new epoch with the old term (and takes it for a renumbering).
                        self.leadership.term.fetch_add(1, Ordering::SeqCst);
                    }
                    self.leadership
                        .set(Some((started + self.config.renew_deadline, epoch)));
                    self.set_leading(true, epoch);
                }
                Ok(Attempt::Following) => {
                    self.leadership.set(None);
                    self.set_leading(false, 0);
                }
                Err(e) => log::warn!("lease={} {e}", self.config.name),
            }
            // A leader that has not renewed within the deadline must stop acting: its lease
            // may be taken by another replica once it expires.
            if self.leading && self.last_renew.elapsed() >= self.config.renew_deadline {
                log::warn!(
                    "lease={} could not renew within {:?}; stepping down",
                    self.config.name,
                    self.config.renew_deadline
                );
                self.leadership.set(None);
                self.set_leading(false, 0);
            }
            let wait = self.config.retry_period.saturating_sub(started.elapsed());
            let deadline = Instant::now() + wait;
            while !self.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if self.leading {
            self.leadership.set(None);
            self.set_leading(false, 0);
            self.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{micro_time, Leadership};
    use std::time::{Duration, SystemTime};

    /// Without election the one replica leads at the agents' epoch: one left at a higher
    /// epoch by an earlier leader-elected run is not refused for good.
    #[test]
    fn without_election_the_epoch_follows_the_agents() {
        let l = Leadership::always();
        assert_eq!(l.epoch(), Some(0));
        l.observe_agent_epoch(4);
        l.observe_agent_epoch(2);
        assert_eq!(l.epoch(), Some(4));
        let elected = Leadership::default();
        elected.observe_agent_epoch(4);
        assert_eq!(
            elected.epoch(),
            None,
            "an elected replica leads only by its Lease"
        );
    }

    #[test]
    fn formats_micro_time() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456);
        assert_eq!(micro_time(t), "2023-11-14T22:13:20.123456Z");
        assert_eq!(
            micro_time(SystemTime::UNIX_EPOCH),
            "1970-01-01T00:00:00.000000Z"
        );
    }
}
