//! The deployer: on the leader, brings every admitted HAProxy pod to the latest validated
//! bundle through its agent, in parallel, with per-pod retries, fencing (`If-Match`, leader
//! epoch), rate-limited reloads and a periodic drift check.

pub mod agent_client;
pub mod pods;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use haptic_agent::protocol::{api, AgentState, ApplyResponse, Bundle, BundleHash, ErrorBody, Mode};
use serde::Serialize;

use crate::kube::lease::Leadership;
use crate::kube::reflector::Backoff;
use crate::metrics::{Registry, DURATION_BUCKETS};
use agent_client::AgentClient;
use pods::PodTarget;

/// A validated bundle ready for the pods.
#[derive(Debug)]
pub struct Published {
    pub bundle: Bundle,
    pub hash: BundleHash,
    /// The bundle needs a reload compared with the previous one (reloads are rate-limited).
    pub reload: bool,
    /// When the first change that led to this bundle was seen (event-to-deploy latency).
    pub first_change: Instant,
}

/// What the deployer reacts to.
#[derive(Debug)]
pub enum DeployMsg {
    Bundle(Arc<Published>),
    Pods(Vec<PodTarget>),
    /// Leadership changed (the view itself is polled before every push).
    Leadership,
    Shutdown,
}

/// Why a pod is not admitted for deployment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub enum NotAdmitted {
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
pub struct PodStatus {
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

struct PodState {
    status: PodStatus,
    /// What the agent reported or accepted; `None` = unknown (push with `*`) or bootstrap.
    applied: Option<String>,
    known: bool,
    backoff: Backoff,
    next_attempt: Instant,
}

pub struct DeployerConfig {
    pub min_deployment_interval: Duration,
    pub drift_prevention_interval: Duration,
    /// `major.minor` of the controller's haproxy; pods running another version are refused.
    pub haproxy_version: Option<String>,
}

pub struct Deployer {
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

/// What `GET /v1/state` told about a pod.
struct AgentView {
    /// The applied bundle; `None` in bootstrap mode.
    bundle: Option<String>,
    version: String,
}

enum Outcome {
    Applied {
        result: String,
    },
    /// The agent runs something else than we thought: learn it and retry at once.
    Stale {
        current: Option<String>,
    },
    Failed(String),
    /// A newer leader exists: stop pushing.
    Fenced(String),
}

impl Deployer {
    fn push(
        &self,
        pod: &PodTarget,
        applied: Option<&str>,
        published: &Published,
        epoch: u64,
    ) -> Outcome {
        let wire = match serde_json::to_vec(&published.bundle.to_wire()) {
            Ok(w) => w,
            Err(e) => return Outcome::Failed(format!("encode bundle: {e}")),
        };
        let headers = [
            (api::IF_MATCH, applied.unwrap_or("*").to_string()),
            (api::EPOCH, epoch.to_string()),
        ];
        let reply = match self
            .client
            .request(&pod.ip, "PUT", api::BUNDLE, &headers, Some(&wire))
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
            412 => Outcome::Fenced(detail),
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
        let bundle = match state.mode {
            Mode::Bootstrap => None,
            Mode::Applied => state.bundle,
        };
        Ok(AgentView { bundle, version })
    }

    /// Handles one message; false on shutdown.
    fn handle(
        &self,
        msg: DeployMsg,
        pods: &mut BTreeMap<String, PodState>,
        current: &mut Option<Arc<Published>>,
    ) -> bool {
        match msg {
            DeployMsg::Bundle(b) => *current = Some(b),
            DeployMsg::Pods(targets) => {
                let names: Vec<String> = targets
                    .iter()
                    .map(|t| format!("{}/{}", t.namespace, t.name))
                    .collect();
                pods.retain(|k, _| names.contains(k));
                for t in targets {
                    let key = format!("{}/{}", t.namespace, t.name);
                    let fresh = |t: &PodTarget| PodState {
                        status: PodStatus {
                            namespace: t.namespace.clone(),
                            name: t.name.clone(),
                            ip: t.ip.clone(),
                            ..Default::default()
                        },
                        applied: None,
                        known: false,
                        backoff: Backoff::default(),
                        next_attempt: Instant::now(),
                    };
                    let entry = pods.entry(key).or_insert_with(|| fresh(&t));
                    if entry.status.ip != t.ip {
                        // A new pod under an old name: start over.
                        *entry = fresh(&t);
                    }
                }
            }
            DeployMsg::Leadership => {
                // A new term: learn what every pod runs before pushing.
                for pod in pods.values_mut() {
                    pod.known = false;
                    pod.next_attempt = Instant::now();
                }
            }
            DeployMsg::Shutdown => return false,
        }
        true
    }

    pub fn run(self) {
        let mut pods: BTreeMap<String, PodState> = BTreeMap::new();
        let mut current: Option<Arc<Published>> = None;
        let mut last_reload_push: Option<Instant> = None;
        let mut next_drift = Instant::now();
        let mut wait = Duration::from_millis(100);
        loop {
            match self.inbox.recv_timeout(wait) {
                Ok(msg) => {
                    if !self.handle(msg, &mut pods, &mut current) {
                        return;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
            // Take everything queued first: only the latest bundle matters.
            while let Ok(msg) = self.inbox.try_recv() {
                if !self.handle(msg, &mut pods, &mut current) {
                    return;
                }
            }
            wait = self.turn(
                &mut pods,
                current.as_ref(),
                &mut last_reload_push,
                &mut next_drift,
            );
            self.publish_status(&pods);
        }
    }

    /// One round: admit, drift-check and push where needed. Returns how long to sleep.
    fn turn(
        &self,
        pods: &mut BTreeMap<String, PodState>,
        current: Option<&Arc<Published>>,
        last_reload_push: &mut Option<Instant>,
        next_drift: &mut Instant,
    ) -> Duration {
        let idle = Duration::from_millis(500);
        // Every replica learns the pods' state (a standby is warm: it knows which pods are
        // admitted and what they run when it takes over); only the leader pushes.
        let epoch = self.leadership.epoch();
        let config = crate::lock(&self.config);
        let (min_interval, drift_interval, required) = (
            config.min_deployment_interval,
            config.drift_prevention_interval,
            config.haproxy_version.clone(),
        );
        drop(config);
        let now = Instant::now();
        let drift_due = now >= *next_drift;
        if drift_due {
            *next_drift = now + drift_interval;
        }

        // Learn the state of pods we do not know yet (and of all pods when drift is due).
        let to_check: Vec<String> = pods
            .iter()
            .filter(|(_, p)| (!p.known || drift_due) && p.next_attempt <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let checks: Vec<(String, Result<AgentView, NotAdmitted>)> = std::thread::scope(|scope| {
            let handles: Vec<_> = to_check
                .iter()
                .map(|key| {
                    let target = target_of(&pods[key]);
                    let required = required.as_deref();
                    (
                        key.clone(),
                        scope.spawn(move || self.admit(&target, required)),
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|(k, h)| {
                    (
                        k,
                        h.join().unwrap_or_else(|_| {
                            Err(NotAdmitted::AgentUnavailable {
                                detail: "state check panicked".into(),
                            })
                        }),
                    )
                })
                .collect()
        });
        for (key, result) in checks {
            let pod = pods.get_mut(&key).expect("checked pods exist");
            match result {
                Ok(AgentView {
                    bundle: applied,
                    version,
                }) => {
                    if epoch.is_some() && pod.known && drift_due && applied != pod.applied {
                        log::warn!(
                            "pod={key} drift: runs {applied:?}, expected {:?}; re-pushing",
                            pod.applied
                        );
                        self.metrics.inc(&crate::metrics::DRIFT_DETECTED_TOTAL, &[]);
                    }
                    if !pod.status.admitted {
                        log::info!("pod={key} admitted haproxy={version} bundle={applied:?}");
                    }
                    pod.applied = applied;
                    pod.known = true;
                    pod.status.admitted = true;
                    pod.status.not_admitted = None;
                    pod.status.haproxy_version = Some(version);
                }
                Err(why) => {
                    let e = why.to_string();
                    if pod.status.last_error.as_deref() != Some(e.as_str()) {
                        log::warn!("pod={key} not admitted: {e}");
                    }
                    pod.status.admitted = false;
                    pod.status.not_admitted = Some(why);
                    pod.status.last_error = Some(e);
                    pod.next_attempt = Instant::now() + pod.backoff.delay();
                }
            }
        }
        let admitted = pods.values().filter(|p| p.status.admitted).count();
        self.metrics
            .set(&crate::metrics::ADMITTED_PODS, &[], admitted as f64);

        let (Some(published), Some(epoch)) = (current, epoch) else {
            return idle;
        };
        let hash = published.hash.as_str();
        let due: Vec<String> = pods
            .iter()
            .filter(|(_, p)| {
                p.status.admitted
                    && p.known
                    && p.applied.as_deref() != Some(hash)
                    && p.next_attempt <= Instant::now()
            })
            .map(|(k, _)| k.clone())
            .collect();
        if due.is_empty() {
            return next_wake(pods, idle);
        }
        if published.reload {
            if let Some(last) = *last_reload_push {
                let ready_at = last + min_interval;
                if Instant::now() < ready_at {
                    return ready_at - Instant::now();
                }
            }
            *last_reload_push = Some(Instant::now());
        }
        let started = Instant::now();
        let outcomes: Vec<(String, Outcome)> = std::thread::scope(|scope| {
            let handles: Vec<_> = due
                .iter()
                .map(|key| {
                    let pod = &pods[key];
                    let target = target_of(pod);
                    let applied = pod.applied.clone();
                    (
                        key.clone(),
                        scope.spawn(move || {
                            self.push(&target, applied.as_deref(), published, epoch)
                        }),
                    )
                })
                .collect();
            handles
                .into_iter()
                .map(|(k, h)| {
                    (
                        k,
                        h.join()
                            .unwrap_or_else(|_| Outcome::Failed("push panicked".into())),
                    )
                })
                .collect()
        });
        let mut ok = 0;
        for (key, outcome) in outcomes {
            let pod = pods.get_mut(&key).expect("pushed pods exist");
            match outcome {
                Outcome::Applied { result } => {
                    ok += 1;
                    pod.applied = Some(hash.to_string());
                    pod.status.applied_bundle = Some(hash.to_string());
                    pod.status.last_result = Some(result.clone());
                    pod.status.last_error = None;
                    pod.status.consecutive_failures = 0;
                    pod.status.last_deployed_at = Some(now_rfc3339());
                    pod.backoff.reset();
                    self.metrics
                        .inc(&crate::metrics::DEPLOYMENT_TOTAL, &[("result", &result)]);
                }
                Outcome::Stale { current } => {
                    log::info!("pod={key} runs {current:?}, not the bundle we assumed; retrying with it as base");
                    pod.applied = current;
                }
                Outcome::Fenced(detail) => {
                    log::warn!("pod={key} refused our epoch {epoch} ({detail}); a newer leader is deploying");
                    pod.next_attempt = Instant::now() + pod.backoff.delay();
                }
                Outcome::Failed(e) => {
                    log::warn!("pod={key} deploy failed: {e}");
                    pod.status.last_error = Some(e);
                    pod.status.consecutive_failures += 1;
                    pod.next_attempt = Instant::now() + pod.backoff.delay();
                    pod.known = false;
                    self.metrics
                        .inc(&crate::metrics::DEPLOYMENT_ERRORS_TOTAL, &[]);
                    self.metrics
                        .inc(&crate::metrics::DEPLOYMENT_TOTAL, &[("result", "error")]);
                }
            }
        }
        let elapsed = started.elapsed();
        self.metrics.observe(
            &crate::metrics::DEPLOYMENT_DURATION_SECONDS,
            DURATION_BUCKETS,
            &[],
            elapsed.as_secs_f64(),
        );
        let everywhere = pods
            .values()
            .filter(|p| p.status.admitted)
            .all(|p| p.applied.as_deref() == Some(hash));
        if everywhere && ok > 0 {
            let latency = published.first_change.elapsed();
            self.metrics.observe(
                &crate::metrics::CHANGE_TO_DEPLOYED_SECONDS,
                DURATION_BUCKETS,
                &[],
                latency.as_secs_f64(),
            );
            log::info!(
                "bundle={} applied to {ok}/{} pods in {} ms (change to deployed {} ms)",
                &hash[..12],
                pods.len(),
                elapsed.as_millis(),
                latency.as_millis()
            );
        }
        next_wake(
            pods,
            Duration::ZERO.max(Duration::from_millis(if everywhere { 500 } else { 20 })),
        )
    }

    fn publish_status(&self, pods: &BTreeMap<String, PodState>) {
        let list = pods.values().map(|p| {
            let mut s = p.status.clone();
            s.applied_bundle = p.applied.clone();
            s
        });
        *crate::lock(&self.status) = list.collect();
    }
}

fn target_of(pod: &PodState) -> PodTarget {
    PodTarget {
        namespace: pod.status.namespace.clone(),
        name: pod.status.name.clone(),
        ip: pod.status.ip.clone(),
    }
}

/// Sleep until the earliest retry, but never longer than `max`.
fn next_wake(pods: &BTreeMap<String, PodState>, max: Duration) -> Duration {
    let now = Instant::now();
    pods.values()
        .map(|p| p.next_attempt.saturating_duration_since(now))
        .filter(|d| !d.is_zero())
        .min()
        .unwrap_or(max)
        .min(max.max(Duration::from_millis(20)))
}
