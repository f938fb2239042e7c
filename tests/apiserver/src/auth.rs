//! Authentication: bearer tokens (from `--token`, a `--token-file` that is re-read whenever it
//! changes, or set at run time through `POST /_dev/tokens`) and client certificates signed by the
//! server's CA. These users are in `system:masters`: they may do everything. Tokens of other
//! users (a service account: `system:serviceaccount:NS:NAME`) are added at run time too, and
//! are authorized by RBAC with `--authorization-mode RBAC` (`rbac`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use serde_json::{json, Value};

/// Who made a request (reported to admission webhooks as `userInfo`).
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
}

impl User {
    pub fn to_json(&self) -> Value {
        json!({"username": self.name, "groups": self.groups})
    }
}

#[derive(Default)]
struct FileTokens {
    stamp: Option<(SystemTime, u64)>,
    tokens: BTreeSet<String>,
}

/// The accepted credentials.
pub struct Auth {
    tokens: Mutex<BTreeSet<String>>,
    /// Tokens of other users than the administrator.
    users: Mutex<BTreeMap<String, User>>,
    token_file: Option<PathBuf>,
    file: Mutex<FileTokens>,
}

impl Auth {
    pub fn new(tokens: Vec<String>, token_file: Option<PathBuf>) -> Auth {
        Auth {
            tokens: Mutex::new(tokens.into_iter().collect()),
            users: Mutex::new(BTreeMap::new()),
            token_file,
            file: Mutex::new(FileTokens::default()),
        }
    }

    /// Authenticates a request from its `Authorization` header and whether the TLS client
    /// presented a certificate our CA signed.
    pub fn authenticate(&self, authorization: Option<&str>, client_cert: bool) -> Option<User> {
        if let Some(token) = authorization.and_then(|h| {
            h.strip_prefix("Bearer ")
                .or_else(|| h.strip_prefix("bearer "))
                .map(str::trim)
        }) {
            if let Some(user) = lock(&self.users).get(token) {
                return Some(user.clone());
            }
            if self.token_valid(token) {
                return Some(User {
                    name: "haptic-dev-token-user".into(),
                    groups: vec!["system:masters".into(), "system:authenticated".into()],
                });
            }
            // A wrong token is refused even when a certificate was presented, as in Kubernetes.
            return None;
        }
        client_cert.then(|| User {
            name: crate::tls::CLIENT_CN.into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        })
    }

    fn token_valid(&self, token: &str) -> bool {
        if token.is_empty() {
            return false;
        }
        if lock(&self.tokens).contains(token) {
            return true;
        }
        self.file_tokens().contains(token)
    }

    /// The tokens in `--token-file`, re-read when its modification time or size changed.
    fn file_tokens(&self) -> BTreeSet<String> {
        let Some(path) = &self.token_file else {
            return BTreeSet::new();
        };
        let mut cache = lock(&self.file);
        let stamp = fs::metadata(path)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        if stamp != cache.stamp || stamp.is_none() {
            cache.tokens = fs::read_to_string(path)
                .map(|text| {
                    text.lines()
                        .map(str::trim)
                        .filter(|l| !l.is_empty())
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            cache.stamp = stamp;
            log::info!(
                "token file read path={} tokens={}",
                path.display(),
                cache.tokens.len()
            );
        }
        cache.tokens.clone()
    }

    /// `POST /_dev/tokens`: `{"tokens": [...]}` replaces the accepted static tokens,
    /// `{"add": [...]}` and `{"remove": [...]}` edit them; `{"users": {TOKEN: {"username": …,
    /// "groups": [...]}}}` adds tokens of other users (`system:authenticated` is added to their
    /// groups). Returns how many static tokens are accepted now.
    pub fn control(&self, body: &Value) -> Result<Value, String> {
        let strings = |v: &Value| -> Result<Vec<String>, String> {
            v.as_array()
                .ok_or("expected an array of strings")?
                .iter()
                .map(|t| {
                    t.as_str()
                        .map(str::to_string)
                        .ok_or_else(|| "token must be a string".to_string())
                })
                .collect()
        };
        if let Some(users) = body.get("users").and_then(Value::as_object) {
            let mut known = lock(&self.users);
            for (token, u) in users {
                let name = u["username"]
                    .as_str()
                    .ok_or("users: username must be a string")?;
                let mut groups = match u.get("groups") {
                    Some(g) => strings(g)?,
                    None => Vec::new(),
                };
                groups.push("system:authenticated".into());
                let user = User {
                    name: name.to_string(),
                    groups,
                };
                known.insert(token.clone(), user);
            }
        }
        let mut tokens = lock(&self.tokens);
        if let Some(set) = body.get("tokens") {
            *tokens = strings(set)?.into_iter().collect();
        }
        if let Some(add) = body.get("add") {
            tokens.extend(strings(add)?);
        }
        if let Some(remove) = body.get("remove") {
            for t in strings(remove)? {
                tokens.remove(&t);
            }
        }
        Ok(json!({"staticTokens": tokens.len()}))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_rotation_through_file() {
        let dir = std::env::temp_dir().join(format!("haptic-auth-{}", crate::util::random_hex(6)));
        fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        fs::write(&file, "first\n").unwrap();
        let auth = Auth::new(vec!["static".into()], Some(file.clone()));
        assert!(auth.authenticate(Some("Bearer static"), false).is_some());
        assert!(auth.authenticate(Some("Bearer first"), false).is_some());
        assert!(auth.authenticate(Some("Bearer nope"), true).is_none());
        assert!(auth.authenticate(None, true).is_some());
        assert!(auth.authenticate(None, false).is_none());
        fs::write(&file, "second-token\n").unwrap();
        assert!(auth.authenticate(Some("Bearer first"), false).is_none());
        assert!(auth
            .authenticate(Some("Bearer second-token"), false)
            .is_some());
        auth.control(&json!({"tokens": ["new"]})).unwrap();
        assert!(auth.authenticate(Some("Bearer static"), false).is_none());
        assert!(auth.authenticate(Some("Bearer new"), false).is_some());
        fs::remove_dir_all(dir).unwrap();
    }
}
