//! The deployer: on the leader, brings every admitted HAProxy pod to the latest validated
//! bundle through its agent, in parallel, with per-pod retries, fencing (`If-Match`, leader
//! epoch), rate-limited reloads and a periodic drift check.

pub(crate) mod agent_client;
mod plan;
pub(crate) mod pods;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use haptic_agent::protocol::{api, AgentState, ApplyResponse, Bundle, BundleHash, ErrorBody, Mode};
use serde::Serialize;

use crate::kube::lease::Leadership;
use crate::metrics::Registry;
use agent_client::AgentClient;
use plan::{AgentView, Note, Outcome, Planner, PushPlan};
use pods::PodTarget;

/// A validated bundle ready for the pods.
#[derive(Debug)]
pub(crate) struct Published {
    pub bundle: Bundle,
    pub hash: BundleHash,
    /// The bundle needs a reload compared with the previous one (reloads are rate-limited).
    pub reload: bool,
    /// The HAProxy release whose `haproxy -c` accepted this bundle here (`None`: not checked,
    /// for example a runtime-only change); agents running that release skip their own check.
    pub checked_with: Option<String>,
    /// When the first change that led to this bundle was seen (event-to-deploy latency).
    pub first_change: Instant,
}

/// What the deployer reacts to.
#[derive(Debug)]
pub(crate) enum DeployMsg {
    Bundle(Arc<Published>),
    Pods(Vec<PodTarget>),
    /// Leadership changed (the view itself is polled before every push).
    Leadership,
    /// The reconciler is ready for the leader term of this epoch: pushes of a new term wait
    /// for it (up to `plan::TAKEOVER_HOLD`), so that the first push keeps the server slots
    /// the pods run.
    Release(u64),
    Shutdown,
}

/// Why a pod is not admitted for deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub(crate) enum NotAdmitted {
    /// The pod runs another HAProxy major.minor than the controller validates with: nothing is
    /// deployed to it until one of them changes.
    VersionMismatch { runs: String, required: String },
    /// Its agent could not be asked (unreachable, an error answer): retried with backoff.
    AgentUnavailable { detail: String },
}

impl std::fmt::Display for NotAdmitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotAdmitted::VersionMismatch { runs, required } => write!(
                f,
                "runs HAProxy {runs}, but the controller validates with {required}; refusing to deploy"
            ),
            NotAdmitted::AgentUnavailable { detail } => f.write_str(detail),
        }
    }
}

#[derive(Debug, Clone, Serialize, Default)]
pub(crate) struct PodStatus {
    pub namespace: String,
    pub name: String,
    pub ip: String,
    pub admitted: bool,
    /// Why it is not admitted (`None` while admitted or not yet asked).
    pub not_admitted: Option<NotAdmitted>,
    pub haproxy_version: Option<String>,
    pub applied_bundle: Option<String>,
    pub last_result: Option<String>,
    pub last_error: Option<String>,
    pub consecutive_failures: u32,
    pub last_deployed_at: Option<String>,
}

pub(crate) struct DeployerConfig {
    pub min_deployment_interval: Duration,
    pub drift_prevention_interval: Duration,
    /// `major.minor` of the controller's haproxy; pods running another version are refused.
    pub haproxy_version: Option<String>,
    /// `dataplane.port` and `dataplane.deploymentTimeout`: where agents listen, and how long
    /// one call to an agent may take.
    pub agent_port: u16,
    pub agent_timeout: Duration,
    /// `dataplane.maxParallel`: at most this many agents are called at once (probes and
    /// pushes); 0, all of them.
    pub max_parallel: usize,
}

pub(crate) struct Deployer {
    pub client: Arc<AgentClient>,
    pub leadership: Arc<Leadership>,
    pub config: Arc<Mutex<DeployerConfig>>,
    pub metrics: Registry,
    pub inbox: Receiver<DeployMsg>,
    /// Per-pod status, shared with `/debug/pods` and the status writer.
    pub status: Arc<Mutex<Vec<PodStatus>>>,
}

fn now_rfc3339() -> String {
    haptic_agent::time::now_rfc3339()
}

impl Deployer {
    /// `wire`: the bundle's JSON body, encoded once per round for all its pods (a copy per
    /// pod pushed to at once would take the bundle's size times the pods).
    fn push(
        &self,
        pod: &PodTarget,
        applied: Option<&str>,
        published: &Published,
        wire: &[u8],
        epoch: u64,
    ) -> Outcome {
        let mut headers = vec![
            (api::IF_MATCH, applied.unwrap_or("*").to_string()),
            (api::EPOCH, epoch.to_string()),
        ];
        if let Some(release) = &published.checked_with {
            headers.push((api::CHECKED_WITH, release.clone()));
        }
        let reply = match self
            .client
            .request(&pod.ip, "PUT", api::BUNDLE, &headers, Some(wire))
        {
            Ok(r) => r,
            Err(e) => return Outcome::Failed(e),
        };
        if reply.status == 200 {
            return match serde_json::from_slice::<ApplyResponse>(&reply.body) {
                Ok(applied) => Outcome::Applied {
                    result: applied.result,
                },
                Err(e) => Outcome::Failed(format!("unreadable apply reply: {e}")),
            };
        }
        // Error replies carry an ErrorBody; anything else (a proxy's page) is shown as text.
        let error = serde_json::from_slice::<ErrorBody>(&reply.body).unwrap_or_else(|_| {
            ErrorBody::new(
                "unexpected_reply",
                reply.text().chars().take(300).collect::<String>(),
            )
        });
        let detail = format!("{} {}: {}", reply.status, error.error, error.detail);
        match reply.status {
            409 => Outcome::Stale {
                current: error.current_bundle,
            },
            412 => {
                if let Some(e) = error.highest_epoch {
                    self.leadership.observe_agent_epoch(e);
                }
                Outcome::Fenced(detail)
            }
            // Another apply runs, or HAProxy still loads a reload the agent waits for: not a
            // failure (no error counted), asked again after the backoff.
            423 => Outcome::Busy(detail),
            503 if error.error == "reload_in_progress" => Outcome::Busy(detail),
            _ => Outcome::Failed(detail),
        }
    }

    /// `GET /v1/state`: the applied bundle and HAProxy version, or why the agent is unusable.
    fn admit(&self, pod: &PodTarget, required: Option<&str>) -> Result<AgentView, NotAdmitted> {
        let unavailable = |detail: String| NotAdmitted::AgentUnavailable { detail };
        let reply = self
            .client
            .request(&pod.ip, "GET", api::STATE, &[], None)
            .map_err(unavailable)?;
        if reply.status != 200 {
            return Err(unavailable(format!(
                "GET {}: {} {}",
                api::STATE,
                reply.status,
                reply.text()
            )));
        }
        let state: AgentState = serde_json::from_slice(&reply.body)
            .map_err(|e| unavailable(format!("GET {}: unreadable reply: {e}", api::STATE)))?;
        // HAProxy does not answer its agent (starting, or a container restart): what it runs
        // is unknown, so it is asked again after the backoff rather than taken from the
        // agent's last state.
        if let Some(e) = &state.haproxy.error {
            return Err(unavailable(format!(
                "HAProxy does not answer its agent: {e}"
            )));
        }
        let version = state.haproxy.version.clone().unwrap_or_default();
        if let Some(required) = required {
            let pod_mm: String = version.split('.').take(2).collect::<Vec<_>>().join(".");
            if !version.is_empty() && pod_mm != required {
                return Err(NotAdmitted::VersionMismatch {
                    runs: version,
                    required: required.to_string(),
                });
            }
        }
        // Leaders number their terms above the epochs agents hold (a Lease that starts over
        // would otherwise be refused by every pod for good).
        if let Some(e) = state.leader_epoch {
            self.leadership.observe_agent_epoch(e);
        }
        let drifted = !state.drift.config_ok || !state.drift.files_ok;
        let bundle = match state.mode {
            Mode::Bootstrap => None,
            // Files on disk no longer hold the applied bundle (edited, or lost): the next
            // reload would load them. Counted as running nothing, so the bundle is pushed
            // again (the agent re-applies a bundle equal to its own when disk has drifted).
            Mode::Applied if drifted => {
                log::warn!(
                    "pod {}: files on disk differ from the applied bundle {}: {}",
                    pod.name,
                    state.bundle.as_deref().unwrap_or("?"),
                    state.drift.mismatches.join(", ")
                );
                None
            }
            Mode::Applied => state.bundle,
        };
        Ok(AgentView { bundle, version })
    }

    pub(crate) fn run(self) {
        let mut plan = Planner::new(Instant::now());
        let mut wait = Duration::from_millis(100);
        loop {
            let first = match self.inbox.recv_timeout(wait) {
                Ok(msg) => Some(msg),
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => None,
            };
            // Take everything queued first: only the latest bundle matters.
            for msg in first
                .into_iter()
                .chain(std::iter::from_fn(|| self.inbox.try_recv().ok()))
            {
                let now = Instant::now();
                match msg {
                    DeployMsg::Bundle(b) => plan.set_bundle(b),
                    DeployMsg::Pods(targets) => plan.set_pods(targets, now),
                    DeployMsg::Leadership => plan.new_term(now),
                    DeployMsg::Release(epoch) => plan.release(epoch),
                    DeployMsg::Shutdown => return,
                }
            }
            wait = self.turn(&mut plan);
            *crate::lock(&self.status) = plan.statuses();
        }
    }

    /// One round: probe the pods the planner names, then push where it says. Every replica
    /// probes (a standby is warm: it knows which pods are admitted and what they run when it
    /// takes over); only the leader pushes. Returns how long to sleep.
    fn turn(&self, plan: &mut Planner) -> Duration {
        let epoch = self.leadership.epoch();
        if plan.saw_epoch(epoch, self.leadership.term(), Instant::now()) {
            log::info!("leading (epoch {epoch:?}): probing every pod; pushes wait until the reconciler has taken the published server slots");
        }
        let config = crate::lock(&self.config);
        let (min_interval, drift_interval, required) = (
            config.min_deployment_interval,
            config.drift_prevention_interval,
            config.haproxy_version.clone(),
        );
        let (port, timeout, limit) = (config.agent_port, config.agent_timeout, config.max_parallel);
        drop(config);
        if self.client.set_endpoint(port, timeout) {
            // The agents moved: learn what each one runs at its new address before pushing.
            log::info!("agents are now reached on port {port}");
            plan.new_term(Instant::now());
        }

        let (probes, drift_round) = plan.probes(Instant::now(), drift_interval);
        let answers = parallel(
            probes,
            limit,
            |target| self.admit(target, required.as_deref()),
            || {
                Err(NotAdmitted::AgentUnavailable {
                    detail: "state check panicked".into(),
                })
            },
        );
        for (key, answer) in answers {
            let note = plan.probed(&key, answer, epoch.is_some(), drift_round, Instant::now());
            self.report(&key, note, epoch);
        }
        self.metrics
            .set(&crate::metrics::ADMITTED_PODS, [], plan.admitted() as f64);

        let (published, epoch, due) = match plan.pushes(epoch, min_interval, Instant::now()) {
            // A held term ends with a message (which wakes the deployer) or, at its deadline,
            // within an idle wake.
            PushPlan::Nothing => return plan.next_wake(plan::IDLE, Instant::now()),
            PushPlan::RateLimited { until } => {
                return until
                    .saturating_duration_since(Instant::now())
                    .max(plan::MIN_WAKE)
            }
            PushPlan::Push {
                published,
                epoch,
                pods,
            } => (published, epoch, pods),
        };
        let hash = published.hash.as_str();
        let started = Instant::now();
        let wire = serde_json::to_vec(&published.bundle.to_wire())
            .map_err(|e| format!("encode bundle: {e}"));
        let pushes: Vec<(String, (PodTarget, Option<String>))> = due
            .into_iter()
            .map(|(key, target, applied)| (key, (target, applied)))
            .collect();
        let outcomes = parallel(
            pushes,
            limit,
            |(target, applied)| match &wire {
                Ok(wire) => self.push(target, applied.as_deref(), &published, wire, epoch),
                Err(e) => Outcome::Failed(e.clone()),
            },
            || Outcome::Failed("push panicked".into()),
        );
        let mut ok = 0;
        for (key, outcome) in outcomes {
            let note = plan.pushed(&key, hash, outcome, Instant::now(), &now_rfc3339());
            if matches!(note, Note::Applied { .. }) {
                ok += 1;
            }
            self.report(&key, note, Some(epoch));
        }
        let elapsed = started.elapsed();
        self.metrics.observe(
            &crate::metrics::DEPLOYMENT_DURATION_SECONDS,
            [],
            elapsed.as_secs_f64(),
        );
        let everywhere = plan.everywhere(hash);
        if everywhere && ok > 0 {
            let latency = published.first_change.elapsed();
            // Once per bundle: a pod that joins, or is repaired, hours later is not a change
            // that took hours to deploy.
            if plan.newly_everywhere(hash) {
                self.metrics.observe(
                    &crate::metrics::CHANGE_TO_DEPLOYED_SECONDS,
                    [],
                    latency.as_secs_f64(),
                );
            }
            log::info!(
                "bundle={} applied to {ok}/{} pods in {} ms (change to deployed {} ms)",
                &hash[..12],
                plan.pods.len(),
                elapsed.as_millis(),
                latency.as_millis()
            );
        }
        // Not everywhere yet (a stale base, a pod that appeared): come back soon.
        let max = if everywhere {
            plan::IDLE
        } else {
            plan::MIN_WAKE
        };
        plan.next_wake(max, Instant::now())
    }

    /// Logs and counts what the planner noted.
    fn report(&self, key: &str, note: Note, epoch: Option<u64>) {
        match note {
            Note::Quiet => {}
            Note::Admitted { version, bundle } => {
                log::info!("pod={key} admitted haproxy={version} bundle={bundle:?}")
            }
            Note::Drift { expected, runs } => {
                log::warn!("pod={key} drift: runs {runs:?}, expected {expected:?}; re-pushing");
                self.metrics.inc(&crate::metrics::DRIFT_DETECTED_TOTAL, []);
            }
            Note::Refused(why) => log::warn!("pod={key} not admitted: {why}"),
            Note::Applied { result } => {
                self.metrics
                    .inc(&crate::metrics::DEPLOYMENT_TOTAL, [&result]);
            }
            Note::Stale { current } => {
                log::info!("pod={key} runs {current:?}, not the bundle we assumed; retrying with it as base")
            }
            Note::Fenced(detail) => {
                let epoch = epoch.unwrap_or_default();
                log::warn!(
                    "pod={key} refused our epoch {epoch} ({detail}); a newer leader is deploying"
                )
            }
            Note::Busy(detail) => log::info!("pod={key} is busy ({detail}); asking again"),
            Note::Failed(error) => {
                log::warn!("pod={key} deploy failed: {error}");
                self.metrics
                    .inc(&crate::metrics::DEPLOYMENT_ERRORS_TOTAL, []);
                self.metrics
                    .inc(&crate::metrics::DEPLOYMENT_TOTAL, ["error"]);
            }
        }
    }
}

/// Runs `call` for every item, on at most `limit` scoped threads at once (0: one per item), and
/// returns the answers by key in the items' order; a call that panics answers `on_panic()`.
fn parallel<I: Sync, R: Send>(
    items: Vec<(String, I)>,
    limit: usize,
    call: impl Fn(&I) -> R + Sync,
    on_panic: impl Fn() -> R,
) -> Vec<(String, R)> {
    let workers = match limit {
        0 => items.len(),
        n => n.min(items.len()),
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let answers: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let (call, items_ref, answers_ref, next) = (&call, &items, &answers, &next);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some((_, item)) = items_ref.get(i) else {
                    return;
                };
                // A panic is the one call's: the worker goes on with the next item.
                let answer =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(item))).ok();
                *crate::lock(&answers_ref[i]) = answer;
            });
        }
    });
    items
        .into_iter()
        .zip(answers)
        .map(|((key, _), answer)| {
            let answer = answer.into_inner().unwrap_or_else(|e| e.into_inner());
            (key, answer.unwrap_or_else(&on_panic))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::parallel;
    use std::sync::{Condvar, Mutex};
    use std::time::Duration;

    /// Calls under way, the most seen at once, and a way to wait until `n` are under way.
    #[derive(Default)]
    struct Gauge {
        state: Mutex<(usize, usize)>,
        changed: Condvar,
    }

    impl Gauge {
        /// Enters, waits (up to 5 s) until `n` calls are under way, and leaves.
        fn call(&self, n: usize) {
            let mut s = crate::lock(&self.state);
            s.0 += 1;
            s.1 = s.1.max(s.0);
            self.changed.notify_all();
            let (mut s, _) = self
                .changed
                .wait_timeout_while(s, Duration::from_secs(5), |s| s.0 < n)
                .unwrap();
            // The others of this group may still be counting themselves in.
            drop(s);
            std::thread::sleep(Duration::from_millis(20));
            s = crate::lock(&self.state);
            s.0 -= 1;
        }
    }

    /// `dataplane.maxParallel`: never more calls at once than the limit, the limit reached when
    /// there are enough pods, and every pod's answer returned in order; 0 calls all at once.
    #[test]
    fn at_most_max_parallel_agents_are_called_at_once() {
        // Six pods: whole groups of two and three, so that no call waits for peers that never come.
        let items: Vec<(String, usize)> = (0..6).map(|i| (format!("pod-{i}"), i)).collect();
        for (limit, expect) in [(2, 2), (3, 3), (0, 6), (10, 6)] {
            let gauge = Gauge::default();
            let answers = parallel(
                items.clone(),
                limit,
                |i| {
                    gauge.call(expect);
                    i * 10
                },
                || usize::MAX,
            );
            let keys: Vec<_> = answers.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(
                keys,
                items.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()
            );
            assert_eq!(
                answers.iter().map(|(_, a)| *a).collect::<Vec<_>>(),
                (0..6).map(|i| i * 10).collect::<Vec<_>>()
            );
            assert_eq!(crate::lock(&gauge.state).1, expect, "limit {limit}");
        }
    }

    /// A call that panics answers for its own pod; the others are still called (test builds:
    /// release builds abort on a panic).
    #[test]
    fn a_panicking_call_answers_for_its_pod_only() {
        let items: Vec<(String, usize)> = (0..4).map(|i| (format!("pod-{i}"), i)).collect();
        let answers = parallel(
            items,
            1,
            |&i| {
                assert_ne!(i, 1, "pod-1's call fails");
                i
            },
            || 99,
        );
        let answers: Vec<usize> = answers.into_iter().map(|(_, a)| a).collect();
        assert_eq!(answers, [0, 99, 2, 3]);
    }
}
