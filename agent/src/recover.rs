//! Bringing the agent's memory in line with reality: reading the applied bundle back from disk,
//! finishing or undoing an apply a crash interrupted, noticing a restarted HAProxy, and comparing
//! disk with the manifest (drift).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::apply::{Agent, Inner};
use crate::files::{hash_file, CONFIG_FILE};
use crate::haproxy::{ProcInfo, SOCKET_PATIENCE};
use crate::protocol::{ApplyRecord, Bundle, BundleFile, Drift, FileKind};
use crate::state::{now_rfc3339, Persisted, Phase};

impl Agent {
    /// Reads the applied bundle back from disk; `None` if anything differs from the manifest.
    pub(crate) fn load_applied(&self, p: &Persisted) -> Option<Arc<Bundle>> {
        let expected = p.bundle.as_deref()?;
        let cfg = std::fs::read_to_string(self.root.join(CONFIG_FILE)).ok()?;
        let mut files = Vec::new();
        for (path, entry) in &p.files {
            let content = std::fs::read(self.root.join(path)).ok()?;
            files.push(BundleFile {
                kind: FileKind::parse(&entry.kind)?,
                path: path.clone(),
                content,
            });
        }
        let bundle = Bundle::new(cfg, files);
        if bundle.hash().as_str() == expected {
            Some(Arc::new(bundle))
        } else {
            log::warn!("disk no longer holds the applied bundle bundle={expected}; the next apply will reload");
            None
        }
    }

    /// Finishes (phase committed) or undoes (phase staged) an apply that a crash interrupted.
    pub(crate) fn recover(&self, inner: &mut Inner) -> Result<(), String> {
        let Some(journal) = self.state_dir.load_journal()? else {
            return Ok(());
        };
        // Finished only while haproxy.cfg is the one the apply committed: anything else wrote
        // it since, and a reload would load that under the bundle's name. Then the agent knows
        // neither bundle to be on disk: it starts in bootstrap mode (the controller pushes in
        // full), leaving haproxy.cfg as it is, and the files of both manifests for the next
        // apply to replace or delete.
        if journal.phase == Phase::Committed
            && hash_file(&self.root.join(CONFIG_FILE))?.as_deref()
                != Some(journal.config_sha256.as_str())
        {
            log::warn!(
                "haproxy.cfg changed since an interrupted apply committed it bundle={}; mode=bootstrap",
                journal.bundle
            );
            let p = &mut inner.persisted;
            for (path, entry) in &journal.manifest {
                p.files.entry(path.clone()).or_insert_with(|| entry.clone());
            }
            p.forget_bundle();
            inner.applied = None;
            self.state_dir.save_state(p)?;
            self.state_dir.clear_journal()?;
            return self.disk.clean_work_areas();
        }
        let finished = journal.phase == Phase::Committed && {
            match self.haproxy.reload() {
                Ok(outcome) => {
                    log::info!(
                        "finished an interrupted apply bundle={} worker_pid={:?}",
                        journal.bundle,
                        outcome.worker_pid_after
                    );
                    true
                }
                // HAProxy may be reading the committed files (it does not answer, or loads
                // a reload of its own): they stay, as after an apply.
                Err(e) if !e.refused => {
                    let answer = self.keep_new_files(inner, &journal, &e, false);
                    inner.persisted.last_apply = Some(ApplyRecord {
                        at: now_rfc3339(),
                        result: "failed".into(),
                        bundle: Some(journal.bundle.clone()),
                        status: answer.status,
                        error: Some(format!("{}: {}", answer.body.error, answer.body.detail)),
                        timings_ms: BTreeMap::new(),
                    });
                    return self.state_dir.save_state(&inner.persisted);
                }
                Err(e) => {
                    log::error!(
                        "could not finish an interrupted apply bundle={}: {e}; rolling back",
                        journal.bundle
                    );
                    false
                }
            }
        };
        let result = if finished {
            self.delete_stale(&inner.persisted.files, &journal.manifest);
            let master_pid = self
                .haproxy
                .show_proc(SOCKET_PATIENCE)
                .ok()
                .map(|i| i.master_pid);
            inner.persisted.settle(
                journal.bundle.clone(),
                journal.config_sha256.clone(),
                journal.manifest.clone(),
                master_pid,
            );
            "reload"
        } else {
            self.disk.restore(&journal.replaced, &journal.created)?;
            log::warn!("rolled back an interrupted apply bundle={}", journal.bundle);
            "failed"
        };
        inner.persisted.last_apply = Some(ApplyRecord {
            at: now_rfc3339(),
            result: result.into(),
            bundle: Some(journal.bundle.clone()),
            status: if finished { 200 } else { 500 },
            error: (!finished).then(|| {
                "the agent stopped during this apply; it was rolled back at restart".to_string()
            }),
            timings_ms: BTreeMap::new(),
        });
        self.state_dir.save_state(&inner.persisted)?;
        self.state_dir.clear_journal()?;
        self.disk.clean_work_areas()
    }

    /// Reads `show proc`; notices a restarted HAProxy master. If the new master runs a
    /// configuration other than the applied one (the container copied its bootstrap config), the
    /// agent forgets the applied bundle and reports `bootstrap` until the next apply.
    /// With `settle` (only under the apply lock: settling deletes stale files) it also tells
    /// how an unconfirmed reload ended.
    pub(crate) fn refresh(&self, inner: &mut Inner, settle: bool) -> Result<ProcInfo, String> {
        let proc = self
            .haproxy
            .show_proc(SOCKET_PATIENCE)
            .map_err(|e| e.to_string())?;
        if settle {
            self.settle_pending_reload(inner, &proc)?;
        }
        let p = &mut inner.persisted;
        // A master restarted while a reload is pending is the settling's to judge.
        if p.master_pid != Some(proc.master_pid) && p.pending_reload.is_none() {
            let on_disk = hash_file(&self.root.join(CONFIG_FILE))?;
            if p.bundle.is_some() && on_disk != p.config_sha256 {
                log::warn!(
                    "HAProxy master restarted master_pid={} with a configuration the agent did not apply; mode=bootstrap",
                    proc.master_pid
                );
                p.forget_bundle();
                inner.applied = None;
            } else if p.unsettled {
                // It loaded whatever is on disk; which bundle that is, the next apply says.
                log::warn!(
                    "HAProxy master restarted master_pid={} while the applied bundle was unknown; mode=bootstrap",
                    proc.master_pid
                );
                p.forget_bundle();
            } else if p.bundle.is_some() {
                log::info!(
                    "HAProxy master restarted master_pid={} with the applied configuration",
                    proc.master_pid
                );
            }
            p.master_pid = Some(proc.master_pid);
            self.state_dir.save_state(p)?;
        }
        Ok(proc)
    }

    /// Tells how an unconfirmed reload ([`Agent::await_reload`]) ended, once `show proc` does:
    /// a new worker (or a new master, started while haproxy.cfg is the pending one) loaded
    /// the pending bundle, which becomes the applied one; a failed reload leaves bootstrap mode.
    /// Until then nothing changes.
    fn settle_pending_reload(&self, inner: &mut Inner, proc: &ProcInfo) -> Result<(), String> {
        let Some(pending) = inner.persisted.pending_reload.clone() else {
            return Ok(());
        };
        let restarted = proc.master_pid != pending.master_pid;
        let reloaded = proc.reloads > pending.reloads;
        // HAProxy 3.1 and later list a new worker while it still reads its configuration, and
        // the previous worker answers `@1` until then: the new one has loaded when it answers.
        let new_worker = proc
            .worker_pid()
            .filter(|pid| Some(*pid) != pending.worker_pid)
            .is_some_and(|pid| self.haproxy.worker_answers(pid));
        let loaded = (restarted || reloaded) && new_worker;
        let refused = reloaded && proc.failed > pending.failed;
        if !(loaded || restarted || refused) {
            return Ok(());
        }
        let p = &mut inner.persisted;
        p.pending_reload = None;
        let on_disk = hash_file(&self.root.join(CONFIG_FILE))?;
        if loaded && on_disk.as_deref() == Some(pending.config_sha256.as_str()) {
            log::info!(
                "HAProxy confirmed the reload of bundle={} worker_pid={:?}",
                pending.bundle,
                proc.worker_pid()
            );
            self.delete_stale(&p.files, &pending.manifest);
            p.settle(
                pending.bundle,
                pending.config_sha256,
                pending.manifest,
                Some(proc.master_pid),
            );
            inner.applied = self.load_applied(&inner.persisted);
        } else {
            if restarted || !pending.was_serving {
                p.forget_bundle();
            }
            if pending.checked_by_controller && !restarted {
                // Pushed again, it is checked here: a 422 rather than another failing reload.
                inner.failed_unchecked = Some(pending.bundle.clone());
            }
            log::warn!(
                "the unconfirmed reload of bundle={} did not load it (master reloads={} failed={} worker_pid={:?}); mode=bootstrap until the next apply",
                pending.bundle,
                proc.reloads,
                proc.failed,
                proc.worker_pid()
            );
        }
        self.state_dir.save_state(&inner.persisted)
    }

    /// Compares disk with the manifest of the applied bundle.
    pub(crate) fn drift(&self, p: &Persisted) -> Drift {
        let mut drift = Drift::default();
        if p.bundle.is_none() {
            return drift;
        }
        if hash_file(&self.root.join(CONFIG_FILE)).ok().flatten() != p.config_sha256 {
            drift.config_ok = false;
            drift.mismatches.push(CONFIG_FILE.into());
        }
        for (path, entry) in &p.files {
            if hash_file(&self.root.join(path)).ok().flatten().as_deref()
                != Some(entry.sha256.as_str())
            {
                drift.files_ok = false;
                drift.mismatches.push(path.clone());
            }
        }
        drift
    }
}
