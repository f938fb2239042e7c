//! Applying bundles: fencing, planning, staging, `haproxy -c`, disk-first install, runtime
//! commands or a confirmed reload, rollback, stale-file cleanup, and recovery of an apply that a
//! crash interrupted.
//!
//! One apply runs at a time (a second one gets 423). `GET /v1/state` never waits for an apply: it
//! reports the last known state with `busy: true`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::time::Instant;

use crate::classify::{classify, Classification};
use crate::files::{
    self, check_no_symlinks, check_path_shape, hash_file, Disk, CONFIG_FILE, NEXT_CONFIG_FILE,
};
use crate::haproxy::{Haproxy, ProcInfo, SOCKET_PATIENCE};
use crate::protocol::{sha256_hex, ApplyRecord, ApplyResponse, Bundle, Drift, ErrorBody};
use crate::runtime;
use crate::state::{
    now_rfc3339, Journal, Manifest, ManifestEntry, PendingReload, Persisted, Phase, StateDir,
};

/// Holds the apply lock and clears the busy flag when dropped.
struct BusyGuard<'a> {
    _lock: MutexGuard<'a, ()>,
    flag: &'a AtomicBool,
}

impl Drop for BusyGuard<'_> {
    fn drop(&mut self) {
        self.flag.store(false, Ordering::SeqCst);
    }
}

/// A refused or failed apply: the HTTP status and the JSON body.
#[derive(Debug)]
pub struct ApplyError {
    pub status: u16,
    pub body: Box<ErrorBody>,
}

impl ApplyError {
    fn new(status: u16, error: &str, detail: impl Into<String>) -> ApplyError {
        ApplyError {
            status,
            body: Box::new(ErrorBody::new(error, detail)),
        }
    }

    fn internal(detail: impl Into<String>) -> ApplyError {
        ApplyError::new(500, "internal", detail)
    }
}

/// A `PUT /v1/bundle`, decoded.
#[derive(Debug, Clone)]
pub struct ApplyRequest {
    /// Shared with the agent's memory of the applied bundle once applied (never copied).
    pub bundle: Arc<Bundle>,
    /// `If-Match`: the bundle the sender believes is applied, or `*`.
    pub if_match: Option<String>,
    /// `X-Haptic-Epoch`: the sender's leader epoch.
    pub epoch: Option<u64>,
    /// `X-Haptic-Checked-With`: the HAProxy version the controller checked the bundle with.
    pub checked_with: Option<String>,
    pub dry_run: bool,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Inner {
    pub persisted: Persisted,
    /// The applied bundle as read back from disk; `None` when unknown (bootstrap, or disk no
    /// longer matches the manifest), which makes the next apply a reload.
    pub applied: Option<Arc<Bundle>>,
    pub drift: Drift,
    /// A bundle whose reload failed after the agent took the controller's check for it: pushed
    /// again, it is checked here (a 422 instead of another failing reload).
    pub failed_unchecked: Option<String>,
}

/// The agent's apply engine and the state it guards.
pub struct Agent {
    pub(crate) root: PathBuf,
    pub(crate) disk: Disk,
    pub(crate) state_dir: StateDir,
    pub(crate) haproxy: Haproxy,
    apply_lock: Mutex<()>,
    /// Set while an apply holds `apply_lock`; readers check it instead of touching the lock, so
    /// a state request can never make a concurrent PUT look busy.
    busy: AtomicBool,
    pub(crate) inner: Mutex<Inner>,
    /// Test-only fault injection (`HAPTIC_AGENT_FAULT`): exit at a named point of an apply.
    fault: Option<String>,
}

/// Whether `haproxy -c` can be skipped: the plan changes only servers (`set server …`: address,
/// port, state, weight), against an applied configuration that passed `haproxy -c`. The
/// classifier has proven the new text differs from that one only in those server lines, which
/// it parsed; HAProxy validates each command as it applies it, and a refused command turns the
/// change into a reload, which is checked. Maps, certificates and any other file still go
/// through `haproxy -c` (their content is parsed only there). docs/architecture.md records
/// this decision.
fn proven_by_base(plan: &Classification) -> bool {
    match plan {
        Classification::Runtime(actions) => {
            !actions.is_empty()
                && actions.iter().all(|a| {
                    matches!(a, crate::classify::RuntimeAction::Command(c) if c.starts_with("set server "))
                })
        }
        _ => false,
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn millis(since: Instant) -> u64 {
    since.elapsed().as_millis() as u64
}

fn manifest_of(bundle: &Bundle) -> Manifest {
    bundle
        .files
        .iter()
        .map(|f| {
            (
                f.path.clone(),
                ManifestEntry {
                    kind: f.kind.as_str().into(),
                    sha256: sha256_hex(&f.content),
                },
            )
        })
        .collect()
}

impl Agent {
    /// Opens the configuration directory: loads the state, finishes or undoes an interrupted
    /// apply, and reads the applied bundle back from disk.
    pub fn open(root: &Path, haproxy: Haproxy, fault: Option<String>) -> Result<Agent, String> {
        let state_dir = StateDir::new(root);
        std::fs::create_dir_all(&state_dir.root)
            .map_err(|e| format!("create {}: {e}", state_dir.root.display()))?;
        let persisted = state_dir.load_state()?;
        let disk = Disk {
            root: root.to_path_buf(),
            stage: state_dir.stage(),
            prev: state_dir.prev(),
        };
        let agent = Agent {
            root: root.to_path_buf(),
            disk,
            state_dir,
            haproxy,
            apply_lock: Mutex::new(()),
            busy: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                persisted,
                applied: None,
                drift: Drift::default(),
                failed_unchecked: None,
            }),
            fault,
        };
        {
            let mut inner = lock(&agent.inner);
            agent.recover(&mut inner)?;
            inner.applied = agent.load_applied(&inner.persisted);
            if agent.haproxy.master_socket.exists() {
                let _ = agent.refresh(&mut inner, true);
            }
            inner.drift = agent.drift(&inner.persisted);
        }
        Ok(agent)
    }

    /// Whether an apply or forced reload is running.
    pub(crate) fn is_busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst)
    }

    /// Takes the single-flight lock or answers 423.
    fn begin(&self) -> Result<BusyGuard<'_>, ApplyError> {
        let lock = match self.apply_lock.try_lock() {
            Ok(g) => g,
            Err(TryLockError::WouldBlock) => {
                return Err(ApplyError::new(
                    423,
                    "busy",
                    "another apply is running; retry when it has finished",
                ))
            }
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        self.busy.store(true, Ordering::SeqCst);
        Ok(BusyGuard {
            _lock: lock,
            flag: &self.busy,
        })
    }

    fn fault_point(&self, name: &str) {
        if self.fault.as_deref() == Some(name) {
            log::error!("fault injection: exiting at {name}");
            std::process::exit(86);
        }
    }

    /// Applies a bundle (or plans it, for a dry run).
    pub fn apply(&self, req: ApplyRequest) -> Result<ApplyResponse, ApplyError> {
        let started = Instant::now();
        let _guard = self.begin()?;
        // Only holders of the apply lock change `inner`, so working on a copy is race-free.
        let mut inner = lock(&self.inner).clone();
        let _ = self.refresh(&mut inner, true);
        let outcome = self.apply_locked(&mut inner, &req, started);
        if !req.dry_run {
            let record = match &outcome {
                Ok(r) => ApplyRecord {
                    at: now_rfc3339(),
                    result: r.result.clone(),
                    bundle: Some(r.bundle.clone()),
                    status: 200,
                    error: None,
                    timings_ms: r.timings_ms.clone(),
                },
                Err(e) => ApplyRecord {
                    at: now_rfc3339(),
                    result: "failed".into(),
                    bundle: Some(req.bundle.hash().to_string()),
                    status: e.status,
                    error: Some(format!("{}: {}", e.body.error, e.body.detail)),
                    timings_ms: BTreeMap::new(),
                },
            };
            inner.persisted.last_apply = Some(record);
            if let Err(e) = self.state_dir.save_state(&inner.persisted) {
                log::error!("saving state failed: {e}");
            }
        }
        inner.drift = self.drift(&inner.persisted);
        *lock(&self.inner) = inner;
        match &outcome {
            Ok(r) => log::info!(
                "apply result={} bundle={} commands={} total_ms={}",
                r.result,
                r.bundle,
                r.commands.len(),
                r.timings_ms.get("total").copied().unwrap_or(0)
            ),
            Err(e) => log::warn!(
                "apply refused status={} error={} detail={}",
                e.status,
                e.body.error,
                e.body.detail
            ),
        }
        outcome
    }

    fn apply_locked(
        &self,
        inner: &mut Inner,
        req: &ApplyRequest,
        started: Instant,
    ) -> Result<ApplyResponse, ApplyError> {
        let hash = req.bundle.hash();
        if let (Some(epoch), Some(highest)) = (req.epoch, inner.persisted.leader_epoch) {
            if epoch < highest {
                let mut e = ApplyError::new(
                    412,
                    "stale_epoch",
                    format!("leader epoch {epoch} is older than {highest}, already accepted"),
                );
                e.body.highest_epoch = Some(highest);
                return Err(e);
            }
        }
        let applied = inner.persisted.bundle.clone();
        let same = applied.as_deref() == Some(hash.as_str());
        if same
            && !req.dry_run
            && inner.applied.is_some()
            && self.drift(&inner.persisted) == Drift::default()
        {
            accept_epoch(inner, req.epoch);
            return Ok(ApplyResponse {
                result: "no_change".into(),
                bundle: hash.to_string(),
                timings_ms: BTreeMap::from([("total".to_string(), millis(started))]),
                ..ApplyResponse::default()
            });
        }
        if let Some(base) = req.if_match.as_deref().map(|m| m.trim().trim_matches('"')) {
            if base != "*" && Some(base) != applied.as_deref() && !same {
                let current = applied.as_deref().unwrap_or("none (bootstrap)");
                let mut e = ApplyError::new(
                    409,
                    "base_mismatch",
                    format!("If-Match {base} does not match the applied bundle {current}"),
                );
                e.body.current_bundle = applied.clone();
                return Err(e);
            }
        }
        for f in &req.bundle.files {
            check_path_shape(&f.path)
                .and_then(|_| check_no_symlinks(&self.root, &f.path))
                .map_err(|detail| ApplyError::new(400, "invalid_path", detail))?;
        }
        let plan = match (&inner.applied, &applied) {
            (Some(old), Some(_)) => classify(old, &req.bundle),
            _ => Classification::Reload(vec![
                "HAProxy runs a configuration the agent did not apply (bootstrap)".into(),
            ]),
        };
        if req.dry_run {
            return Ok(ApplyResponse {
                result: plan.result_name().into(),
                bundle: hash.to_string(),
                dry_run: true,
                commands: plan.commands(),
                reasons: plan.reasons().to_vec(),
                timings_ms: BTreeMap::from([("total".to_string(), millis(started))]),
                ..ApplyResponse::default()
            });
        }
        accept_epoch(inner, req.epoch);
        let before = self
            .haproxy
            .show_proc(SOCKET_PATIENCE)
            .map_err(|e| ApplyError::new(503, "haproxy_unreachable", e.to_string()))?;
        // A reload the agent was waiting for is still loading (3.1 and later list its worker
        // at once; 2.6's master does not answer until it has loaded): staging now would change
        // files under it.
        if let Some(pending) = &inner.persisted.pending_reload {
            let loading = before.reloads > pending.reloads
                && before.worker_pid().is_some_and(|pid| {
                    Some(pid) != pending.worker_pid && !self.haproxy.worker_answers(pid)
                });
            if loading {
                return Err(ApplyError::new(
                    503,
                    "reload_in_progress",
                    format!(
                        "HAProxy is still loading bundle {}; retry when it has",
                        pending.bundle
                    ),
                ));
            }
        }
        // The controller's check stands for this agent's when it ran the very HAProxy version
        // the master runs (the reload parses the same bytes), unless trusting it failed before.
        let checked_by_controller = req
            .checked_with
            .as_deref()
            .is_some_and(|v| !v.is_empty() && v == before.version)
            && inner.failed_unchecked.as_deref() != Some(hash.as_str());
        let mut response = self.execute(
            inner,
            &req.bundle,
            &hash.to_string(),
            plan,
            &before,
            checked_by_controller,
        )?;
        response.timings_ms.insert("total".into(), millis(started));
        Ok(response)
    }

    /// Stage, check, install, then runtime commands or a reload. On any failure after staging the
    /// previous files are restored.
    fn execute(
        &self,
        inner: &mut Inner,
        bundle: &Arc<Bundle>,
        hash: &str,
        plan: Classification,
        before: &ProcInfo,
        checked_by_controller: bool,
    ) -> Result<ApplyResponse, ApplyError> {
        let mut timings = BTreeMap::new();
        let t = Instant::now();
        let journal = self.stage(bundle, hash).map_err(ApplyError::internal)?;
        timings.insert("write".to_string(), millis(t));
        let undo = |status: u16, error: &str, detail: String| -> ApplyError {
            let restored = self.disk.restore(&journal.replaced, &journal.created);
            if let Err(e) = &restored {
                log::error!("restoring the previous files failed: {e}");
            }
            let _ = self.state_dir.clear_journal();
            let _ = self.disk.clean_work_areas();
            let mut e = ApplyError::new(status, error, detail);
            e.body.rolled_back = Some(restored.is_ok());
            e
        };
        let needs_check = plan != Classification::NoChange && !proven_by_base(&plan);
        let checked_by = match (needs_check, checked_by_controller) {
            (false, _) => None,
            (true, true) => Some("controller"),
            (true, false) => Some("agent"),
        };
        if checked_by == Some("agent") {
            let t = Instant::now();
            let checked = self.haproxy.check(
                &self.root,
                Path::new(NEXT_CONFIG_FILE),
                &self.state_dir.check_log(),
            );
            timings.insert("validate".to_string(), millis(t));
            if let Err(e) = checked {
                let mut err = undo(
                    422,
                    "invalid_config",
                    "haproxy -c rejected the configuration; nothing was changed".into(),
                );
                err.body.check_output = Some(e.detail);
                return Err(err);
            }
        }
        self.fault_point("after-stage");
        std::fs::rename(
            self.root.join(NEXT_CONFIG_FILE),
            self.root.join(CONFIG_FILE),
        )
        .map_err(|e| undo(500, "internal", format!("install haproxy.cfg: {e}")))?;
        let committed = Journal {
            phase: Phase::Committed,
            ..journal.clone()
        };
        self.state_dir
            .save_journal(&committed)
            .map_err(|e| undo(500, "internal", e))?;
        self.fault_point("after-commit");

        let mut response = ApplyResponse {
            result: plan.result_name().into(),
            bundle: hash.to_string(),
            checked_by: checked_by.map(str::to_string),
            reasons: plan.reasons().to_vec(),
            worker_pid_before: before.worker_pid(),
            ..ApplyResponse::default()
        };
        let mut needs_reload = matches!(plan, Classification::Reload(_));
        if let Classification::Runtime(actions) = &plan {
            let t = Instant::now();
            match runtime::execute(&self.haproxy, actions, bundle) {
                Ok(sent) => response.commands = sent,
                Err(failure) => {
                    log::warn!(
                        "runtime command failed, reloading with the new files instead: {}",
                        failure.error
                    );
                    response.commands = failure.sent;
                    response
                        .warnings
                        .push(format!("runtime command failed: {}", failure.error));
                    response.reasons.push("runtime_failed".into());
                    response.result = "reload".into();
                    needs_reload = true;
                }
            }
            timings.insert("runtime".to_string(), millis(t));
        }
        if needs_reload {
            let t = Instant::now();
            match self.haproxy.reload() {
                Ok(outcome) => response.worker_pid_after = outcome.worker_pid_after,
                Err(e) if !e.refused => {
                    return Err(self.keep_new_files(
                        inner,
                        &journal,
                        &e,
                        checked_by == Some("controller"),
                    ));
                }
                Err(e) => {
                    if checked_by == Some("controller") {
                        inner.failed_unchecked = Some(hash.to_string());
                    }
                    if !response.commands.is_empty() {
                        // Runtime commands of this bundle went to the worker that keeps
                        // serving: it runs neither bundle, so the next apply must reload.
                        // Saved before the journal goes, so that a restart knows it too.
                        log::warn!("the serving worker took runtime commands of a bundle that was rolled back; mode=bootstrap");
                        unsettle(inner);
                        if let Err(e) = self.state_dir.save_state(&inner.persisted) {
                            log::error!("saving state failed: {e}");
                        }
                    }
                    return Err(undo(
                        502,
                        "reload_failed",
                        format!("{e}; the previous files were restored"),
                    ));
                }
            }
            timings.insert("reload".to_string(), millis(t));
        } else {
            response.worker_pid_after = self
                .haproxy
                .show_proc(SOCKET_PATIENCE)
                .ok()
                .and_then(|p| p.worker_pid());
        }
        self.delete_stale(&inner.persisted.files, &journal.manifest);
        inner.persisted.settle(
            hash.to_string(),
            journal.config_sha256.clone(),
            journal.manifest.clone(),
            Some(before.master_pid),
        );
        inner.applied = Some(Arc::clone(bundle));
        self.state_dir
            .save_state(&inner.persisted)
            .map_err(ApplyError::internal)?;
        let _ = self.state_dir.clear_journal();
        let _ = self.disk.clean_work_areas();
        response.timings_ms = timings;
        Ok(response)
    }

    /// Writes changed files to the staging area, backs up what they replace, records the journal,
    /// moves them into place and writes `haproxy.cfg.next`.
    fn stage(&self, bundle: &Bundle, hash: &str) -> Result<Journal, String> {
        self.disk.clean_work_areas()?;
        let mut created = Vec::new();
        let mut replaced = Vec::new();
        for f in &bundle.files {
            let on_disk = hash_file(&self.disk.target(&f.path))?;
            if on_disk.as_deref() == Some(sha256_hex(&f.content).as_str()) {
                continue;
            }
            self.disk.stage(&f.path, &f.content)?;
            if on_disk.is_some() {
                self.disk.back_up(&f.path)?;
                replaced.push(f.path.clone());
            } else {
                created.push(f.path.clone());
            }
        }
        if self.disk.target(CONFIG_FILE).exists() {
            self.disk.back_up(CONFIG_FILE)?;
            replaced.push(CONFIG_FILE.into());
        }
        let journal = Journal {
            phase: Phase::Staged,
            bundle: hash.to_string(),
            config_sha256: sha256_hex(bundle.haproxy_cfg.as_bytes()),
            manifest: manifest_of(bundle),
            created,
            replaced,
        };
        self.state_dir.save_journal(&journal)?;
        for rel in journal
            .created
            .iter()
            .chain(&journal.replaced)
            .filter(|r| *r != CONFIG_FILE)
        {
            self.disk.install(rel)?;
        }
        files::write_synced(
            &self.root.join(NEXT_CONFIG_FILE),
            bundle.haproxy_cfg.as_bytes(),
            0o644,
        )?;
        Ok(journal)
    }

    /// A reload that did not end in HAProxy's refusal: HAProxy may be reading the new files
    /// (loading them after a reload it did not confirm in time, or another reload's), so they
    /// stay; restoring the previous ones under it could load a mix of both. The agent reports
    /// bootstrap mode (ready when HAProxy served an applied bundle before). When HAProxy was
    /// asked, the agent remembers what the reload may load and settles it from `show proc`
    /// ([`Agent::settle_pending_reload`]); otherwise, and until then, the next apply reloads.
    /// Returns the answer: 504 when asked, 503 when HAProxy did not take the reload.
    pub(crate) fn keep_new_files(
        &self,
        inner: &mut Inner,
        journal: &Journal,
        error: &crate::haproxy::ReloadError,
        checked_by_controller: bool,
    ) -> ApplyError {
        log::warn!(
            "reload not confirmed bundle={}: {error}; its files stay in place, mode=bootstrap",
            journal.bundle
        );
        let p = &mut inner.persisted;
        let was_serving = p.bundle.is_some() || p.unsettled;
        // Both manifests: the next apply deletes whatever of either it does not keep.
        for (path, entry) in &journal.manifest {
            p.files.insert(path.clone(), entry.clone());
        }
        p.pending_reload = error.asked.as_ref().map(|before| PendingReload {
            bundle: journal.bundle.clone(),
            config_sha256: journal.config_sha256.clone(),
            manifest: journal.manifest.clone(),
            master_pid: before.master_pid,
            reloads: before.reloads,
            failed: before.failed,
            worker_pid: before.worker_pid(),
            was_serving,
            checked_by_controller,
        });
        if was_serving {
            p.unsettle();
        } else {
            p.bundle = None;
            p.config_sha256 = None;
        }
        inner.applied = None;
        if let Err(e) = self.state_dir.save_state(&inner.persisted) {
            log::error!("saving state failed: {e}");
        }
        let _ = self.state_dir.clear_journal();
        let _ = self.disk.clean_work_areas();
        let mut e = match error.asked {
            Some(_) => ApplyError::new(
                504,
                "reload_unconfirmed",
                format!("{error}; HAProxy may still be loading this bundle, whose files stay in place; the agent reports bootstrap mode until HAProxy tells how the reload ended"),
            ),
            None => ApplyError::new(
                503,
                "reload_not_taken",
                format!("{error}; HAProxy did not take the reload and may be loading another one; this bundle's files stay in place and the next apply reloads"),
            ),
        };
        e.body.rolled_back = Some(false);
        e
    }

    /// Deletes files the previous bundle had and the new one does not (only files the agent
    /// wrote: the manifest says which).
    pub(crate) fn delete_stale(&self, old: &Manifest, new: &Manifest) {
        for path in old.keys().filter(|p| !new.contains_key(*p)) {
            if check_path_shape(path)
                .and_then(|_| check_no_symlinks(&self.root, path))
                .is_err()
            {
                continue;
            }
            match files::remove_file(&self.disk.target(path)) {
                Ok(()) => log::debug!("deleted stale file path={path}"),
                Err(e) => log::warn!("deleting stale file failed: {e}"),
            }
        }
    }

    /// `POST /v1/reload`: a forced reload of what is on disk.
    pub fn force_reload(&self) -> Result<ApplyResponse, ApplyError> {
        let started = Instant::now();
        let _guard = self.begin()?;
        let outcome = self.haproxy.reload().map_err(|e| {
            let (status, error) = match (e.refused, &e.asked) {
                (true, _) => (502, "reload_failed"),
                (false, Some(_)) => (504, "reload_unconfirmed"),
                (false, None) => (503, "reload_not_taken"),
            };
            ApplyError::new(status, error, e.to_string())
        })?;
        let mut inner = lock(&self.inner);
        let response = ApplyResponse {
            result: "reload".into(),
            bundle: inner.persisted.bundle.clone().unwrap_or_default(),
            reasons: vec!["forced".into()],
            worker_pid_before: outcome.worker_pid_before,
            worker_pid_after: outcome.worker_pid_after,
            timings_ms: BTreeMap::from([
                ("reload".to_string(), outcome.duration.as_millis() as u64),
                ("total".to_string(), millis(started)),
            ]),
            ..ApplyResponse::default()
        };
        log::info!("forced reload worker_pid={:?}", outcome.worker_pid_after);
        inner.persisted.last_apply = Some(ApplyRecord {
            at: now_rfc3339(),
            result: "reload".into(),
            bundle: inner.persisted.bundle.clone(),
            status: 200,
            error: None,
            timings_ms: response.timings_ms.clone(),
        });
        let _ = self.state_dir.save_state(&inner.persisted);
        Ok(response)
    }
}

/// HAProxy serves what the agent applied, but not what the state says: report bootstrap mode
/// (the controller pushes in full, with `If-Match: *`) and reload on the next apply.
fn unsettle(inner: &mut Inner) {
    inner.persisted.unsettle();
    inner.applied = None;
}

fn accept_epoch(inner: &mut Inner, epoch: Option<u64>) {
    if let Some(e) = epoch {
        inner.persisted.leader_epoch = Some(inner.persisted.leader_epoch.map_or(e, |h| h.max(e)));
    }
}
