//! The deployer: on the leader, brings every admitted HAProxy pod to the latest validated
//! bundle through its agent, in parallel, with per-pod retries, fencing (`If-Match`, leader
//! epoch), rate-limited reloads and a periodic drift check.

pub(crate) mod agent_client;
mod plan;
pub(crate) mod pods;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
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
    /// How long the call under way to its agent (a state check or a push) has run, in whole
    /// seconds: an agent that hangs shows here, while the other pods go on.
    pub call_running_seconds: Option<u64>,
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

/// What the calls to the agents need: each runs on a thread of its own.
#[derive(Clone)]
struct Agents {
    client: Arc<AgentClient>,
    leadership: Arc<Leadership>,
}

/// A bundle's JSON body, or why it could not be encoded; shared by all its pushes.
type Wire = Arc<Result<Vec<u8>, String>>;

/// One call to an agent, as it goes to its thread.
enum Job {
    Probe {
        target: PodTarget,
        drift: bool,
        /// `major.minor` the pod must run.
        required: Option<String>,
    },
    Push {
        target: PodTarget,
        base: Option<String>,
        published: Arc<Published>,
        /// The bundle's JSON body, encoded once for all its pods (a copy per pod pushed to at
        /// once would take the bundle's size times the pods).
        wire: Wire,
        epoch: u64,
    },
}

/// An agent's answer to a [`Job`], back on the deployer's thread.
enum Answer {
    Probe {
        drift: bool,
        answer: Result<AgentView, NotAdmitted>,
    },
    Push {
        published: Arc<Published>,
        epoch: u64,
        outcome: Outcome,
    },
}

struct Done {
    key: String,
    ticket: u64,
    answer: Answer,
}

impl Job {
    /// The answer of a call that could not be made or ended in a panic.
    fn failed(&self, detail: String) -> Answer {
        match self {
            Job::Probe { drift, .. } => Answer::Probe {
                drift: *drift,
                answer: Err(NotAdmitted::AgentUnavailable { detail }),
            },
            Job::Push {
                published, epoch, ..
            } => Answer::Push {
                published: published.clone(),
                epoch: *epoch,
                outcome: Outcome::Failed(detail),
            },
        }
    }

    fn run(self, agents: &Agents) -> Answer {
        match self {
            Job::Probe {
                target,
                drift,
                required,
            } => Answer::Probe {
                drift,
                answer: agents.admit(&target, required.as_deref()),
            },
            Job::Push {
                target,
                base,
                published,
                wire,
                epoch,
            } => {
                let outcome = match &*wire {
                    Ok(wire) => agents.push(&target, base.as_deref(), &published, wire, epoch),
                    Err(e) => Outcome::Failed(e.clone()),
                };
                Answer::Push {
                    published,
                    epoch,
                    outcome,
                }
            }
        }
    }
}

impl Agents {
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
}

/// The deployer thread's own bookkeeping of the calls under way.
#[derive(Default)]
struct Calls {
    running: usize,
    /// Per bundle pushed: when its first push of this wave went out, and its pushes under way
    /// (`haptic_deployment_duration_seconds` is observed when the last one answers).
    waves: std::collections::BTreeMap<String, (Instant, usize)>,
    /// The encoded body of the bundle whose pushes are under way.
    wire: Option<(String, Wire)>,
}

impl Deployer {
    pub(crate) fn run(self) {
        let agents = Agents {
            client: self.client.clone(),
            leadership: self.leadership.clone(),
        };
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<Done>();
        let mut plan = Planner::new(Instant::now());
        let mut calls = Calls::default();
        let mut wait = Duration::from_millis(100);
        loop {
            let mut msgs = Vec::new();
            let mut answers = Vec::new();
            crossbeam_channel::select! {
                recv(self.inbox) -> msg => match msg {
                    Ok(msg) => msgs.push(msg),
                    Err(_) => return,
                },
                recv(done_rx) -> done => answers.extend(done.ok()),
                default(wait) => {}
            }
            // Take everything queued: only the latest bundle matters.
            msgs.extend(std::iter::from_fn(|| self.inbox.try_recv().ok()));
            answers.extend(std::iter::from_fn(|| done_rx.try_recv().ok()));
            // Answers first: they belong to calls handed out before these messages (a new
            // term voids the answers still to come, not those already here).
            for done in answers {
                self.finish(done, &mut plan, &mut calls);
            }
            for msg in msgs {
                let now = Instant::now();
                match msg {
                    DeployMsg::Bundle(b) => plan.set_bundle(b),
                    DeployMsg::Pods(targets) => plan.set_pods(targets, now),
                    DeployMsg::Leadership => plan.new_term(now),
                    DeployMsg::Release(epoch) => plan.release(epoch),
                    // Calls under way end on their own threads (within `deploymentTimeout`);
                    // their answers are no longer wanted.
                    DeployMsg::Shutdown => return,
                }
            }
            wait = self.turn(&mut plan, &mut calls, &agents, &done_tx);
            *crate::lock(&self.status) = plan.statuses(Instant::now());
        }
    }

    /// Hands out the calls due now: probes of the pods the planner names, then pushes where it
    /// says, each on a thread of its own, at most `dataplane.maxParallel` under way. Every
    /// replica probes (a standby is warm: it knows which pods are admitted and what they run
    /// when it takes over); only the leader pushes. Returns how long to sleep at most (an
    /// answer wakes the deployer sooner).
    fn turn(
        &self,
        plan: &mut Planner,
        calls: &mut Calls,
        agents: &Agents,
        done: &Sender<Done>,
    ) -> Duration {
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
        let room = |calls: &Calls| match limit {
            0 => usize::MAX,
            n => n.saturating_sub(calls.running),
        };

        for (call, drift) in plan.probes(Instant::now(), drift_interval, room(calls)) {
            let job = Job::Probe {
                target: call.target,
                drift,
                required: required.clone(),
            };
            calls.start(call.key, call.ticket, job, agents, done);
        }
        self.metrics
            .set(&crate::metrics::ADMITTED_PODS, [], plan.admitted() as f64);

        if let PushPlan::Push {
            published,
            epoch,
            pods,
        } = plan.pushes(epoch, min_interval, Instant::now(), room(calls))
        {
            let hash = published.hash.as_str();
            let wire = calls.wire_of(&published);
            let now = Instant::now();
            let wave = calls.waves.entry(hash.to_string()).or_insert((now, 0));
            wave.1 += pods.len();
            for (call, base) in pods {
                let job = Job::Push {
                    target: call.target,
                    base,
                    published: published.clone(),
                    wire: wire.clone(),
                    epoch,
                };
                calls.start(call.key, call.ticket, job, agents, done);
            }
        }
        plan.next_wake(plan::IDLE, Instant::now())
    }

    /// Records an agent's answer.
    fn finish(&self, done: Done, plan: &mut Planner, calls: &mut Calls) {
        calls.running = calls.running.saturating_sub(1);
        let now = Instant::now();
        match done.answer {
            Answer::Probe { drift, answer } => {
                let leader = self.leadership.epoch().is_some();
                let note = plan.probed(&done.key, done.ticket, answer, leader, drift, now);
                self.report(&done.key, note, None);
            }
            Answer::Push {
                published,
                epoch,
                outcome,
            } => {
                let hash = published.hash.as_str();
                let pushing_since = calls.waves.get(hash).map(|w| w.0);
                if let Some(wave) = calls.waves.get_mut(hash) {
                    wave.1 = wave.1.saturating_sub(1);
                    if wave.1 == 0 {
                        self.metrics.observe(
                            &crate::metrics::DEPLOYMENT_DURATION_SECONDS,
                            [],
                            wave.0.elapsed().as_secs_f64(),
                        );
                        calls.waves.remove(hash);
                        // The body is not kept between waves (it is the bundle's size again).
                        if calls.wire.as_ref().is_some_and(|(h, _)| h == hash) {
                            calls.wire = None;
                        }
                    }
                }
                let note = plan.pushed(&done.key, done.ticket, hash, outcome, now, &now_rfc3339());
                let applied = matches!(note, Note::Applied { .. });
                self.report(&done.key, note, Some(epoch));
                // Once per bundle: a pod that joins, or is repaired, hours later is not a
                // change that took hours to deploy.
                if applied && plan.newly_everywhere(hash) {
                    let latency = published.first_change.elapsed();
                    self.metrics.observe(
                        &crate::metrics::CHANGE_TO_DEPLOYED_SECONDS,
                        [],
                        latency.as_secs_f64(),
                    );
                    let admitted = plan.admitted();
                    log::info!(
                        "bundle={} applied to {admitted}/{admitted} pods in {} ms (change to deployed {} ms)",
                        &hash[..12.min(hash.len())],
                        pushing_since.map_or(0, |s| s.elapsed().as_millis()),
                        latency.as_millis()
                    );
                }
            }
        }
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

impl Calls {
    /// Starts `job` on a thread of its own; its answer comes back on `done`.
    fn start(&mut self, key: String, ticket: u64, job: Job, agents: &Agents, done: &Sender<Done>) {
        self.running += 1;
        // Built before the job moves to its thread, for a thread that cannot be started.
        let refused = job.failed("the deployer could not start a thread for this call".into());
        let (tx, agents, k) = (done.clone(), agents.clone(), key.clone());
        let spawned = std::thread::Builder::new()
            .name("deploy-call".into())
            .spawn(move || {
                let fallback = job.failed("the call panicked".into());
                // A panic is the one call's: the pod answers a failure, the others go on.
                let answer =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job.run(&agents)))
                        .unwrap_or(fallback);
                // The deployer may have stopped meanwhile: nobody to tell.
                let _ = tx.send(Done {
                    key: k,
                    ticket,
                    answer,
                });
            });
        if let Err(e) = spawned {
            log::warn!("pod={key}: cannot start a call: {e}");
            let _ = done.send(Done {
                key,
                ticket,
                answer: refused,
            });
        }
    }

    /// The bundle's body, encoded once per bundle.
    fn wire_of(&mut self, published: &Published) -> Wire {
        let hash = published.hash.as_str();
        match &self.wire {
            Some((h, wire)) if h == hash => wire.clone(),
            _ => {
                let wire = Arc::new(
                    serde_json::to_vec(&published.bundle.to_wire())
                        .map_err(|e| format!("encode bundle: {e}")),
                );
                self.wire = Some((hash.to_string(), wire.clone()));
                wire
            }
        }
    }
}
