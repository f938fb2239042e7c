//! What the agent remembers across restarts: `.haptic/state.json` (the applied bundle's manifest,
//! the highest leader epoch, the master pid it applied to) and `.haptic/journal.json`, which exists
//! only while an apply is in flight so a restart can finish or undo it.
//!
//! Both are written atomically (temporary file, fsync, rename) in the shared volume.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::protocol::ApplyRecord;

/// One managed file: its kind (wire name) and content hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub kind: String,
    pub sha256: String,
}

/// path (relative to the configuration directory) -> entry.
pub type Manifest = BTreeMap<String, ManifestEntry>;

/// `.haptic/state.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Persisted {
    /// The applied bundle; `None` while HAProxy runs a configuration the agent did not write.
    pub bundle: Option<String>,
    pub config_sha256: Option<String>,
    /// Files the agent wrote. Kept in bootstrap mode too, so stale ones are still cleaned up.
    #[serde(default)]
    pub files: Manifest,
    #[serde(default)]
    pub generation: u64,
    pub leader_epoch: Option<u64>,
    pub applied_at: Option<String>,
    /// The master that was running when the bundle was applied; another master means HAProxy
    /// restarted and may run a different configuration.
    pub master_pid: Option<u32>,
    pub last_apply: Option<ApplyRecord>,
    /// A reload HAProxy was asked for and did not confirm in time: its files stay on disk, and
    /// the agent reports bootstrap mode until `show proc` tells how the reload ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reload: Option<PendingReload>,
    /// HAProxy serves bundles the agent applied, but which one (or which mix of two) is not
    /// known: after an unconfirmed reload, or runtime commands of a bundle that was rolled
    /// back. Pushes see bootstrap mode (the next apply reloads); readiness stays, as HAProxy
    /// serves checked configurations, not the bootstrap one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsettled: bool,
}

impl Persisted {
    /// HAProxy runs a configuration the agent did not write.
    pub fn forget_bundle(&mut self) {
        self.bundle = None;
        self.config_sha256 = None;
        self.pending_reload = None;
        self.unsettled = false;
    }

    /// HAProxy runs what the agent applied, but the agent no longer knows which bundle.
    pub fn unsettle(&mut self) {
        self.bundle = None;
        self.config_sha256 = None;
        self.unsettled = true;
    }

    /// HAProxy runs `bundle`, whose haproxy.cfg has `config_sha256` and whose files are
    /// `manifest`, from master `master_pid`.
    pub fn settle(
        &mut self,
        bundle: String,
        config_sha256: String,
        manifest: Manifest,
        master_pid: Option<u32>,
    ) {
        self.bundle = Some(bundle);
        self.config_sha256 = Some(config_sha256);
        self.files = manifest;
        self.generation += 1;
        self.applied_at = Some(now_rfc3339());
        self.master_pid = master_pid;
        self.pending_reload = None;
        self.unsettled = false;
    }
}

/// The bundle an unconfirmed reload may load, and HAProxy as it was before that reload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReload {
    pub bundle: String,
    pub config_sha256: String,
    pub manifest: Manifest,
    pub master_pid: u32,
    pub reloads: u64,
    pub failed: u64,
    pub worker_pid: Option<u32>,
    /// HAProxy served a bundle the agent applied before (not the bootstrap configuration).
    #[serde(default)]
    pub was_serving: bool,
    /// The bundle was taken on the controller's `haproxy -c`: refused, it is checked here
    /// when pushed again.
    #[serde(default)]
    pub checked_by_controller: bool,
}

/// Where an interrupted apply stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Files may be (partly) in place; HAProxy has not been told. Undo from `prev/`.
    Staged,
    /// haproxy.cfg and every file are the new bundle; runtime commands or a reload were under
    /// way. Finish by reloading.
    Committed,
}

/// `.haptic/journal.json`: enough to finish or undo an apply after a crash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Journal {
    pub phase: Phase,
    pub bundle: String,
    pub config_sha256: String,
    pub manifest: Manifest,
    /// Paths that did not exist before (undo = delete).
    pub created: Vec<String>,
    /// Paths whose previous content sits in `prev/` (undo = move back). Includes haproxy.cfg.
    pub replaced: Vec<String>,
}

/// The agent's private directory inside the configuration directory.
#[derive(Debug, Clone)]
pub struct StateDir {
    pub root: PathBuf,
}

impl StateDir {
    pub fn new(config_dir: &Path) -> StateDir {
        StateDir {
            root: config_dir.join(".haptic"),
        }
    }

    pub fn state_file(&self) -> PathBuf {
        self.root.join("state.json")
    }
    pub fn journal_file(&self) -> PathBuf {
        self.root.join("journal.json")
    }
    pub fn stage(&self) -> PathBuf {
        self.root.join("stage")
    }
    pub fn prev(&self) -> PathBuf {
        self.root.join("prev")
    }
    pub fn check_log(&self) -> PathBuf {
        self.root.join("check.log")
    }

    pub fn load_state(&self) -> Result<Persisted, String> {
        Ok(read_json(&self.state_file())?.unwrap_or_default())
    }

    pub fn save_state(&self, state: &Persisted) -> Result<(), String> {
        write_json(&self.state_file(), state)
    }

    pub fn load_journal(&self) -> Result<Option<Journal>, String> {
        read_json(&self.journal_file())
    }

    pub fn save_journal(&self, journal: &Journal) -> Result<(), String> {
        write_json(&self.journal_file(), journal)
    }

    pub fn clear_journal(&self) -> Result<(), String> {
        match std::fs::remove_file(self.journal_file()) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("remove {}: {e}", self.journal_file().display())),
        }
    }
}

fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, String> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("parse {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("read {}: {e}", path.display())),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), String> {
    let bytes =
        serde_json::to_vec_pretty(value).map_err(|e| format!("encode {}: {e}", path.display()))?;
    write_atomic(path, &bytes)
}

/// Writes through a temporary sibling, fsyncs, renames.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let parent = path
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", path.display()))?;
    std::fs::create_dir_all(parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
    let tmp = parent.join(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    let mut f =
        std::fs::File::create(&tmp).map_err(|e| format!("create {}: {e}", tmp.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .map_err(|e| format!("rename {} -> {}: {e}", tmp.display(), path.display()))
}

pub use crate::time::{now_rfc3339, rfc3339};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips_atomically() {
        let dir = std::env::temp_dir().join(format!("haptic-state-test-{}", std::process::id()));
        let sd = StateDir::new(&dir);
        assert_eq!(sd.load_state().unwrap(), Persisted::default());
        let st = Persisted {
            bundle: Some("ab".into()),
            leader_epoch: Some(3),
            ..Persisted::default()
        };
        sd.save_state(&st).unwrap();
        assert_eq!(sd.load_state().unwrap(), st);
        assert!(sd.load_journal().unwrap().is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
