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
    /// seconds: an agent that hangs shows here, while the other pods go on. `/debug/pods`
    /// only: the status writer leaves it out (it changes with every call).
    #[serde(skip_serializing_if = "Option::is_none")]
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
        /// This replica led when the probe was handed out (only a leader reports drift).
        leader: bool,
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
        leader: bool,
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
            Job::Probe { drift, leader, .. } => Answer::Probe {
                drift: *drift,
                leader: *leader,
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
                leader,
                required,
            } => Answer::Probe {
                drift,
                leader,
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
    /// Per bundle pushed: when the first push of this wave went out, and its pushes under way
    /// (`haptic_deployment_duration_seconds` is observed once none is under way after a turn).
    waves: std::collections::BTreeMap<String, (Instant, usize)>,
    /// The encoded body of the bundle whose pushes are under way.
    wire: Option<(String, Wire)>,
    /// The latest bundle pushed, and when its first push went out (the push time in the log
    /// line of a bundle that reached every pod).
    first_push: Option<(String, Instant)>,
}

/// How long a stopping deployer waits for its pushes under way to be answered: the leader
/// releases its Lease after that, and a push cut off midway is one the next leader repeats.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);

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
                    DeployMsg::Shutdown => {
                        self.drain(&done_rx, &mut plan, &mut calls);
                        return;
                    }
                }
            }
            wait = self.turn(&mut plan, &mut calls, &agents, &done_tx);
            self.after_turn(&mut plan, &mut calls);
            *crate::lock(&self.status) = plan.statuses(Instant::now());
        }
    }

    /// On shutdown: no new call, and the pushes under way answered (up to
    /// [`SHUTDOWN_DRAIN`]) before the Lease goes. Probes still under way are left to end on
    /// their threads.
    fn drain(&self, done_rx: &Receiver<Done>, plan: &mut Planner, calls: &mut Calls) {
        let until = Instant::now() + SHUTDOWN_DRAIN;
        while calls.waves.values().any(|w| w.1 > 0) {
            let left = until.saturating_duration_since(Instant::now());
            match done_rx.recv_timeout(left) {
                Ok(done) => self.finish(done, plan, calls),
                Err(_) => {
                    log::warn!("stopping with pushes still under way");
                    break;
                }
            }
        }
        self.after_turn(plan, calls);
        *crate::lock(&self.status) = plan.statuses(Instant::now());
    }

    /// After a turn: push waves that ended, and the current bundle reaching every pod.
    fn after_turn(&self, plan: &mut Planner, calls: &mut Calls) {
        calls.waves.retain(|_, (started, under_way)| {
            if *under_way == 0 {
                self.metrics.observe(
                    &crate::metrics::DEPLOYMENT_DURATION_SECONDS,
                    [],
                    started.elapsed().as_secs_f64(),
                );
            }
            *under_way > 0
        });
        // The body is not kept between waves (it is the bundle's size again).
        if calls
            .wire
            .as_ref()
            .is_some_and(|(h, _)| !calls.waves.contains_key(h))
        {
            calls.wire = None;
        }
        let Some(current) = plan.current.clone() else {
            return;
        };
        let hash = current.hash.as_str();
        // Once per bundle (a pod that joins, or is repaired, hours later is not a change that
        // took hours to deploy), and only a bundle this replica pushed as the leader: one a
        // standby finds everywhere when it takes over, or after a restart, was deployed by
        // another.
        if plan.admitted() == 0 || !plan.newly_everywhere(hash) {
            return;
        }
        let pushed_here = calls.first_push.as_ref().is_some_and(|(h, _)| h == hash);
        if self.leadership.epoch().is_none() || !pushed_here {
            return;
        }
        let latency = current.first_change.elapsed();
        self.metrics.observe(
            &crate::metrics::CHANGE_TO_DEPLOYED_SECONDS,
            [],
            latency.as_secs_f64(),
        );
        let pushing = calls
            .first_push
            .as_ref()
            .map_or(0, |(_, at)| at.elapsed().as_millis());
        log::info!(
            "bundle={} applied to all {} admitted pods in {pushing} ms (change to deployed {} ms)",
            &hash[..12.min(hash.len())],
            plan.admitted(),
            latency.as_millis()
        );
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
                leader: epoch.is_some(),
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
            if calls.first_push.as_ref().is_none_or(|(h, _)| h != hash) {
                calls.first_push = Some((hash.to_string(), now));
            }
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
        debug_assert!(calls.running > 0, "an answer for a call never counted");
        calls.running = calls.running.saturating_sub(1);
        let now = Instant::now();
        match done.answer {
            Answer::Probe {
                drift,
                leader,
                answer,
            } => {
                let note = plan.probed(&done.key, done.ticket, answer, leader, drift, now);
                self.report(&done.key, note, None);
            }
            Answer::Push {
                published,
                epoch,
                outcome,
            } => {
                let hash = published.hash.as_str();
                if let Some(wave) = calls.waves.get_mut(hash) {
                    wave.1 = wave.1.saturating_sub(1);
                }
                let note = plan.pushed(&done.key, done.ticket, hash, outcome, now, &now_rfc3339());
                if let Note::Applied { result } = &note {
                    log::debug!(
                        "pod={} applied bundle={} ({result})",
                        done.key,
                        &hash[..12.min(hash.len())]
                    );
                }
                self.report(&done.key, note, Some(epoch));
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Condvar;

    /// Agents on loopback addresses sharing one port, as plain HTTP with basic auth (the
    /// agents' `--insecure-http-with-basic-auth` mode): they answer state checks and pushes
    /// like an agent, and count the calls under way. A call waits until `together` calls
    /// are under way (at most 5 s), so that calls meant to overlap do.
    struct FakeAgents {
        ips: Vec<String>,
        port: u16,
        dir: PathBuf,
        shared: Arc<FakeShared>,
    }

    #[derive(Default)]
    struct FakeShared {
        /// (under way, most at once)
        calls: Mutex<(usize, usize)>,
        changed: Condvar,
        together: Mutex<usize>,
        /// Per IP: the bundle hash it was pushed (reported by its state checks).
        applied: Mutex<std::collections::BTreeMap<String, String>>,
        /// The hash a push carries (the fakes do not hash bundles).
        pushing: Mutex<String>,
        stop: AtomicBool,
    }

    impl FakeAgents {
        fn start(pods: usize, salt: u8) -> FakeAgents {
            let dir = std::env::temp_dir()
                .join(format!("haptic-deploy-fakes-{}-{salt}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("username"), "haptic\n").unwrap();
            std::fs::write(dir.join("password"), "pw\n").unwrap();
            let shared = Arc::new(FakeShared::default());
            // Addresses of their own (concurrent runs on one machine): retried on a clash.
            for attempt in 0..50u32 {
                let third = (std::process::id() + attempt * 7 + u32::from(salt) * 31) % 250 + 1;
                let ips: Vec<String> = (1..=pods).map(|i| format!("127.78.{third}.{i}")).collect();
                let Ok(first) = TcpListener::bind((ips[0].as_str(), 0)) else {
                    continue;
                };
                let port = first.local_addr().unwrap().port();
                let mut listeners = vec![first];
                for ip in &ips[1..] {
                    match TcpListener::bind((ip.as_str(), port)) {
                        Ok(l) => listeners.push(l),
                        Err(_) => break,
                    }
                }
                if listeners.len() < pods {
                    continue;
                }
                for (listener, ip) in listeners.into_iter().zip(ips.clone()) {
                    let shared = shared.clone();
                    listener.set_nonblocking(true).unwrap();
                    std::thread::spawn(move || loop {
                        if shared.stop.load(Ordering::Relaxed) {
                            return;
                        }
                        match listener.accept() {
                            Ok((stream, _)) => {
                                let (shared, ip) = (shared.clone(), ip.clone());
                                std::thread::spawn(move || serve(stream, &ip, &shared));
                            }
                            Err(_) => std::thread::sleep(Duration::from_millis(5)),
                        }
                    });
                }
                return FakeAgents {
                    ips,
                    port,
                    dir,
                    shared,
                };
            }
            panic!("no free loopback addresses for the fake agents");
        }

        fn targets(&self) -> Vec<PodTarget> {
            self.ips
                .iter()
                .enumerate()
                .map(|(i, ip)| PodTarget {
                    namespace: "ing".into(),
                    name: format!("haproxy-{i}"),
                    ip: ip.clone(),
                    incarnation: "uid haproxy=0,haptic-agent=0".into(),
                })
                .collect()
        }

        fn applied(&self, hash: &str) -> usize {
            crate::lock(&self.shared.applied)
                .values()
                .filter(|h| *h == hash)
                .count()
        }
    }

    impl Drop for FakeAgents {
        fn drop(&mut self) {
            self.shared.stop.store(true, Ordering::Relaxed);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn serve(stream: TcpStream, ip: &str, shared: &FakeShared) {
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut first = String::new();
        let mut length = 0;
        let _ = reader.read_line(&mut first);
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        let _ = reader.read_exact(&mut body);
        {
            let mut c = crate::lock(&shared.calls);
            c.0 += 1;
            c.1 = c.1.max(c.0);
            shared.changed.notify_all();
            let together = *crate::lock(&shared.together);
            let (c, _) = shared
                .changed
                .wait_timeout_while(c, Duration::from_secs(5), |c| c.0 < together)
                .unwrap();
            drop(c);
        }
        std::thread::sleep(Duration::from_millis(20));
        let answer = if first.starts_with("PUT") {
            let hash = crate::lock(&shared.pushing).clone();
            crate::lock(&shared.applied).insert(ip.to_string(), hash.clone());
            serde_json::json!({"result": "reload", "bundle": hash})
        } else {
            let applied = crate::lock(&shared.applied).get(ip).cloned();
            serde_json::json!({
                "bundle": applied, "applied_at": null,
                "mode": if applied.is_some() { "applied" } else { "bootstrap" },
                "config_sha256": null, "leader_epoch": null,
                "haproxy": {"version": "2.6.12", "master_pid": 1, "worker_pid": 2, "reloads": 0, "failed_reloads": 0},
                "last_apply": null,
                "drift": {"config_ok": true, "files_ok": true},
            })
        };
        crate::lock(&shared.calls).0 -= 1;
        let body = answer.to_string();
        let mut stream = stream;
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }

    /// A deployer running on its own thread, and what the tests see of it.
    struct Running {
        tx: crossbeam_channel::Sender<DeployMsg>,
        metrics: Registry,
        status: Arc<Mutex<Vec<PodStatus>>>,
        handle: std::thread::JoinHandle<()>,
    }

    /// A deployer for `fakes`, leading without election, on its own thread.
    fn deployer(fakes: &FakeAgents, max_parallel: usize) -> Running {
        let (tx, rx) = crossbeam_channel::unbounded();
        let metrics = Registry::default();
        let status = Arc::new(Mutex::new(Vec::new()));
        let d = Deployer {
            client: Arc::new(AgentClient::new(
                agent_client::Transport::BasicAuth {
                    dir: fakes.dir.clone(),
                },
                fakes.port,
                Duration::from_secs(10),
            )),
            leadership: Arc::new(Leadership::always()),
            config: Arc::new(Mutex::new(DeployerConfig {
                min_deployment_interval: Duration::ZERO,
                drift_prevention_interval: Duration::from_secs(3600),
                haproxy_version: None,
                agent_port: fakes.port,
                agent_timeout: Duration::from_secs(10),
                max_parallel,
            })),
            metrics: metrics.clone(),
            inbox: rx,
            status: status.clone(),
        };
        let handle = std::thread::spawn(move || d.run());
        tx.send(DeployMsg::Pods(fakes.targets())).unwrap();
        tx.send(DeployMsg::Release(0)).unwrap();
        Running {
            tx,
            metrics,
            status,
            handle,
        }
    }

    fn bundle(text: &str) -> Arc<Published> {
        let bundle = Bundle::new(text.to_string(), Vec::new());
        Arc::new(Published {
            hash: bundle.hash(),
            bundle,
            reload: true,
            checked_with: None,
            first_change: Instant::now(),
        })
    }

    fn series(metrics: &Registry, name: &str) -> f64 {
        metrics
            .encode()
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(30);
        while !ok() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// `dataplane.maxParallel`: never more calls at once than the limit, every pod reached,
    /// and the bundle's pushes one wave (one `haptic_deployment_duration_seconds` sample, one
    /// change-to-deployed sample) however they were spread; 0 calls every pod at once.
    #[test]
    fn at_most_max_parallel_agents_are_called_at_once() {
        for (limit, together, salt) in [(1, 1, 1u8), (2, 2, 2), (0, 5, 3)] {
            let fakes = FakeAgents::start(5, salt);
            *crate::lock(&fakes.shared.together) = together;
            let Running {
                tx,
                metrics,
                handle,
                ..
            } = deployer(&fakes, limit);
            let b = bundle(&format!("global\n# limit {limit}\n"));
            *crate::lock(&fakes.shared.pushing) = b.hash.as_str().to_string();
            tx.send(DeployMsg::Bundle(b.clone())).unwrap();
            wait_until("every pod applied", || fakes.applied(b.hash.as_str()) == 5);
            wait_until("the change counted as deployed", || {
                series(&metrics, "haptic_change_to_deployed_seconds_count") == 1.0
            });
            tx.send(DeployMsg::Shutdown).unwrap();
            handle.join().unwrap();
            let most = crate::lock(&fakes.shared.calls).1;
            assert_eq!(most, together, "limit {limit}");
            assert_eq!(
                series(&metrics, "haptic_deployment_duration_seconds_count"),
                1.0,
                "limit {limit}: one wave"
            );
        }
    }

    /// A leader that finds its bundle already on every pod (a takeover, a restart) pushes
    /// nothing and records no change-to-deployed sample: another replica deployed it, and
    /// the time since this one first saw the change says nothing about that.
    #[test]
    fn a_bundle_found_everywhere_is_not_a_deployment_of_ours() {
        let fakes = FakeAgents::start(3, 4);
        let b = bundle("global\n# deployed by another leader\n");
        for ip in &fakes.ips {
            crate::lock(&fakes.shared.applied).insert(ip.clone(), b.hash.as_str().to_string());
        }
        let Running {
            tx,
            metrics,
            status,
            handle,
        } = deployer(&fakes, 0);
        tx.send(DeployMsg::Bundle(b.clone())).unwrap();
        // The status is written after each turn's checks: once it shows every pod on the
        // bundle, the decision has been made.
        wait_until("every pod known to run the bundle", || {
            let pods = crate::lock(&status);
            pods.len() == 3
                && pods
                    .iter()
                    .all(|p| p.admitted && p.applied_bundle.as_deref() == Some(b.hash.as_str()))
        });
        tx.send(DeployMsg::Shutdown).unwrap();
        handle.join().unwrap();
        assert_eq!(
            series(&metrics, "haptic_change_to_deployed_seconds_count"),
            0.0
        );
        assert_eq!(series(&metrics, "haptic_deployment_total"), 0.0);
    }
}
