//! The managed files on disk: path confinement, staging, backups, and undo.
//!
//! Bundle paths come from the network, so they are checked before anything touches the disk:
//! relative, no `..`, no hidden components (which keeps `.haptic/` private), no whitespace or
//! control characters (they would break runtime commands), and no symlinks on the way (a symlink
//! could point HAProxy's or our writes outside the configuration directory).
//!
//! New content is written to `.haptic/stage/` (outside every directory HAProxy loads as a whole,
//! same filesystem) and renamed into place; the previous content is hard-linked into
//! `.haptic/prev/` first so it can be restored by rename.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::protocol::sha256_hex;

/// The main configuration file, relative to the configuration directory.
pub const CONFIG_FILE: &str = "haproxy.cfg";
/// Where a new configuration is checked before it replaces `haproxy.cfg`.
pub const NEXT_CONFIG_FILE: &str = "haproxy.cfg.next";

/// Checks a bundle path's shape (no disk access).
pub fn check_path_shape(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty file path".into());
    }
    if path.len() > 1024 {
        let shown: String = path.chars().take(64).collect();
        return Err(format!("file path longer than 1024 bytes: {shown}…"));
    }
    if path.starts_with('/') {
        return Err(format!(
            "file path {path:?} is absolute; paths are relative to the configuration directory"
        ));
    }
    if let Some(c) = path
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || *c == '\\')
    {
        return Err(format!("file path {path:?} contains the character {c:?}"));
    }
    for part in path.split('/') {
        if part.is_empty() {
            return Err(format!("file path {path:?} has an empty component"));
        }
        if part == ".." || part == "." {
            return Err(format!("file path {path:?} contains {part:?}; it must stay inside the configuration directory"));
        }
        if part.starts_with('.') {
            return Err(format!(
                "file path {path:?} has a hidden component {part:?}"
            ));
        }
    }
    if path == CONFIG_FILE || path == NEXT_CONFIG_FILE {
        return Err(format!(
            "file path {path:?} is reserved for the main configuration"
        ));
    }
    Ok(())
}

/// Checks that no existing component of `root/rel` is a symlink and that the file, if present,
/// is a regular file.
pub fn check_no_symlinks(root: &Path, rel: &str) -> Result<(), String> {
    let mut current = root.to_path_buf();
    let parts: Vec<&str> = rel.split('/').collect();
    for (i, part) in parts.iter().enumerate() {
        current.push(part);
        let meta = match std::fs::symlink_metadata(&current) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(format!("inspect {}: {e}", current.display())),
        };
        let last = i + 1 == parts.len();
        if meta.file_type().is_symlink() {
            return Err(format!(
                "file path {rel:?}: {} is a symlink",
                current.display()
            ));
        }
        if !last && !meta.is_dir() {
            return Err(format!(
                "file path {rel:?}: {} is not a directory",
                current.display()
            ));
        }
        if last && !meta.is_file() {
            return Err(format!(
                "file path {rel:?}: {} exists and is not a regular file",
                current.display()
            ));
        }
    }
    Ok(())
}

/// sha256 of a file on disk, `None` when it does not exist.
pub fn hash_file(path: &Path) -> Result<Option<String>, String> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(sha256_hex(&bytes))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("read {}: {e}", path.display())),
    }
}

/// Writes `bytes` to `path` (creating parents) and fsyncs it.
pub fn write_synced(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("create {}: {e}", parent.display()))?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("create {}: {e}", path.display()))?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(|e| format!("write {}: {e}", path.display()))
}

/// Removes a directory tree if it exists.
pub fn remove_tree(path: &Path) -> Result<(), String> {
    match std::fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("remove {}: {e}", path.display())),
    }
}

/// Removes a file if it exists.
pub fn remove_file(path: &Path) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("remove {}: {e}", path.display())),
    }
}

/// The configuration directory with its staging and backup areas.
#[derive(Debug, Clone)]
pub struct Disk {
    pub root: PathBuf,
    pub stage: PathBuf,
    pub prev: PathBuf,
}

impl Disk {
    pub fn target(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }

    /// Writes new content into the staging area. Private keys may live in any file, so every
    /// managed file is readable by owner and group only (HAProxy reads through the pod's fsGroup).
    pub fn stage(&self, rel: &str, bytes: &[u8]) -> Result<(), String> {
        write_synced(&self.stage.join(rel), bytes, 0o640)
    }

    /// Keeps the current content of `rel` in `prev/` (hard link: cheap, and the original stays in
    /// place until the rename replaces it).
    pub fn back_up(&self, rel: &str) -> Result<(), String> {
        let backup = self.prev.join(rel);
        if let Some(parent) = backup.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("create {}: {e}", parent.display()))?;
        }
        remove_file(&backup)?;
        std::fs::hard_link(self.target(rel), &backup).map_err(|e| format!("back up {rel}: {e}"))
    }

    /// Moves a staged file into place (atomic per file).
    pub fn install(&self, rel: &str) -> Result<(), String> {
        let target = self.target(rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("create {}: {e}", parent.display()))?;
        }
        std::fs::rename(self.stage.join(rel), &target).map_err(|e| format!("install {rel}: {e}"))
    }

    /// Undoes an apply: previous content back for `replaced`, `created` removed. Continues past
    /// errors and reports them all, so as much as possible is restored.
    pub fn restore(&self, replaced: &[String], created: &[String]) -> Result<(), String> {
        let mut errors = Vec::new();
        for rel in replaced {
            let backup = self.prev.join(rel);
            if backup.exists() {
                if let Err(e) = std::fs::rename(&backup, self.target(rel)) {
                    errors.push(format!("restore {rel}: {e}"));
                }
            }
        }
        for rel in created {
            if let Err(e) = remove_file(&self.target(rel)) {
                errors.push(e);
            }
        }
        if let Err(e) = remove_file(&self.target(NEXT_CONFIG_FILE)) {
            errors.push(e);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.join("; "))
        }
    }

    /// Empties the staging and backup areas.
    pub fn clean_work_areas(&self) -> Result<(), String> {
        remove_tree(&self.stage)?;
        remove_tree(&self.prev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_shapes() {
        assert!(check_path_shape("maps/host.map").is_ok());
        assert!(check_path_shape("ssl/example.com.pem").is_ok());
        for bad in [
            "",
            "/etc/passwd",
            "maps/../../etc/passwd",
            "..",
            "./x",
            "maps//x",
            ".haptic/state.json",
            "a b",
            "haproxy.cfg",
            "x\n",
        ] {
            assert!(check_path_shape(bad).is_err(), "{bad:?} accepted");
        }
        assert!(check_path_shape("../x")
            .unwrap_err()
            .contains("must stay inside"));
        // A long path is refused with its start shown, also when a character straddles the cut.
        let long = format!("{}é{}", "a".repeat(63), "b".repeat(1000));
        let err = check_path_shape(&long).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "file path longer than 1024 bytes: {}é…",
                "a".repeat(63)
            )),
            "{err}"
        );
    }

    #[test]
    fn symlinks_on_the_way_are_refused() {
        let root = std::env::temp_dir().join(format!("haptic-files-test-{}", std::process::id()));
        std::fs::create_dir_all(root.join("maps")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("evil")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("maps/link.map")).unwrap();
        assert!(check_no_symlinks(&root, "maps/new.map").is_ok());
        assert!(check_no_symlinks(&root, "evil/passwd")
            .unwrap_err()
            .contains("is a symlink"));
        assert!(check_no_symlinks(&root, "maps/link.map")
            .unwrap_err()
            .contains("is a symlink"));
        std::fs::remove_dir_all(&root).unwrap();
    }
}
