//! Values built from files that are rebuilt when a file changes (certificates mounted from
//! Secrets rotate in place). A change that does not build keeps the previous value, so a
//! half-written rotation never breaks a working listener or client.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

/// Modification time, size and inode of each file (Secret volumes swap a symlink, which changes
/// the inode even when time and size do not).
pub type Fingerprint = Vec<(SystemTime, u64, u64)>;

pub fn fingerprint<P: AsRef<Path>>(paths: &[P]) -> Fingerprint {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .map(|p| match std::fs::metadata(p) {
            Ok(m) => (
                m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                m.len(),
                m.ino(),
            ),
            Err(_) => (SystemTime::UNIX_EPOCH, 0, 0),
        })
        .collect()
}

pub struct Reloading<T> {
    paths: Vec<PathBuf>,
    current: Mutex<Option<(Fingerprint, T)>>,
}

impl<T: Clone> Reloading<T> {
    pub fn new(paths: Vec<PathBuf>) -> Reloading<T> {
        Reloading {
            paths,
            current: Mutex::new(None),
        }
    }

    pub fn paths(&self) -> &[PathBuf] {
        &self.paths
    }

    /// The current value, rebuilt with `build` when a file changed since the last build.
    /// Fails only when no value could ever be built.
    pub fn get(&self, build: impl FnOnce(&[PathBuf]) -> Result<T, String>) -> Result<T, String> {
        let print = fingerprint(&self.paths);
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((old, value)) = current.as_mut() {
            if *old == print {
                return Ok(value.clone());
            }
            match build(&self.paths) {
                Ok(new) => *value = new,
                Err(e) => log::warn!(
                    "{} changed but cannot be used, keeping the previous version: {e}",
                    self.paths[0].display()
                ),
            }
            // Remember the state either way, so a broken rotation is reported once.
            *old = print;
            return Ok(value.clone());
        }
        let value = build(&self.paths)?;
        *current = Some((print, value.clone()));
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebuilds_on_change_and_keeps_the_last_good_value() {
        let dir = std::env::temp_dir().join(format!("haptic-reload-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("value");
        std::fs::write(&file, "1").unwrap();
        let r: Reloading<String> = Reloading::new(vec![file.clone()]);
        let read = |p: &[PathBuf]| {
            let text = std::fs::read_to_string(&p[0]).map_err(|e| e.to_string())?;
            if text == "bad" {
                Err("bad".to_string())
            } else {
                Ok(text)
            }
        };
        assert_eq!(r.get(read).unwrap(), "1");
        std::fs::write(&file, "22").unwrap();
        assert_eq!(r.get(read).unwrap(), "22");
        std::fs::write(&file, "bad").unwrap();
        assert_eq!(
            r.get(read).unwrap(),
            "22",
            "a broken change keeps the previous value"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
