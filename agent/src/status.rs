//! Read-only views of the agent for `GET /v1/state`, `GET /v1/config` and `/readyz`.

use crate::apply::{lock, Agent};
use crate::files::CONFIG_FILE;
use crate::haproxy::SOCKET_PATIENCE;
use crate::protocol::{AgentState, HaproxyStatus, Mode};

impl Agent {
    /// The state report. While an apply runs it answers at once from the last known state with
    /// `busy: true`; otherwise it re-reads HAProxy and re-hashes disk.
    pub fn state(&self) -> AgentState {
        let busy = self.is_busy();
        let mut inner = lock(&self.inner);
        let proc = if busy {
            self.haproxy
                .show_proc(SOCKET_PATIENCE)
                .map_err(|e| e.to_string())
        } else {
            let proc = self.refresh(&mut inner, false);
            inner.drift = self.drift(&inner.persisted);
            proc
        };
        let haproxy = match proc {
            Ok(p) => HaproxyStatus {
                version: Some(p.version.clone()),
                master_pid: Some(p.master_pid),
                worker_pid: p.worker_pid(),
                reloads: Some(p.reloads),
                failed_reloads: Some(p.failed),
                error: None,
            },
            Err(e) => HaproxyStatus {
                error: Some(e),
                ..HaproxyStatus::default()
            },
        };
        let p = &inner.persisted;
        AgentState {
            bundle: p.bundle.clone(),
            applied_at: p.bundle.as_ref().and(p.applied_at.clone()),
            mode: if p.bundle.is_some() {
                Mode::Applied
            } else {
                Mode::Bootstrap
            },
            config_sha256: p.config_sha256.clone(),
            files: p
                .files
                .iter()
                .map(|(k, v)| (k.clone(), v.sha256.clone()))
                .collect(),
            generation: p.generation,
            leader_epoch: p.leader_epoch,
            haproxy,
            last_apply: p.last_apply.clone(),
            drift: inner.drift.clone(),
            busy,
            pending_reload: p.pending_reload.as_ref().map(|r| r.bundle.clone()),
        }
    }

    /// Readiness: HAProxy answers on the master socket and runs a bundle the agent applied.
    pub fn ready(&self) -> Result<(), String> {
        self.haproxy
            .show_proc(SOCKET_PATIENCE)
            .map_err(|e| format!("HAProxy does not answer: {e}"))?;
        let inner = lock(&self.inner);
        if inner.persisted.bundle.is_none() && !inner.persisted.unsettled {
            return Err("no bundle applied yet (bootstrap configuration)".into());
        }
        Ok(())
    }

    /// The haproxy.cfg on disk and the applied bundle hash (`None` in bootstrap mode).
    pub fn applied_config(&self) -> Result<(String, Option<String>), String> {
        let text = std::fs::read_to_string(self.root.join(CONFIG_FILE))
            .map_err(|e| format!("read {CONFIG_FILE}: {e}"))?;
        Ok((text, lock(&self.inner).persisted.bundle.clone()))
    }
}
