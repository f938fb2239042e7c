//! The bundle: everything HAProxy needs (haproxy.cfg plus auxiliary files), its canonical hash,
//! and the JSON wire types the controller and the agent exchange (`PUT /v1/bundle` body and
//! reply, `GET /v1/state`, error bodies).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// What an auxiliary file is for; decides where it lives and how it can be updated at runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FileKind {
    Map,
    Cert,
    CrtList,
    General,
    Ca,
    Crl,
}

impl FileKind {
    pub const ALL: [FileKind; 6] = [
        FileKind::Map,
        FileKind::Cert,
        FileKind::CrtList,
        FileKind::General,
        FileKind::Ca,
        FileKind::Crl,
    ];

    /// The name used on the wire and in templates (`map`, `cert`, `crt-list`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::Map => "map",
            FileKind::Cert => "cert",
            FileKind::CrtList => "crt-list",
            FileKind::General => "general",
            FileKind::Ca => "ca",
            FileKind::Crl => "crl",
        }
    }

    pub fn parse(name: &str) -> Option<FileKind> {
        FileKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

impl fmt::Display for FileKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One auxiliary file of a bundle. `path` is relative to the HAProxy configuration directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleFile {
    pub kind: FileKind,
    pub path: String,
    pub content: Vec<u8>,
}

/// A sha256 over the canonical encoding of a bundle, as lower-case hex.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BundleHash(String);

impl BundleHash {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Accepts 64 lower-case hex digits only.
    pub fn parse(text: &str) -> Option<BundleHash> {
        let ok = text.len() == 64
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| BundleHash(text.to_string()))
    }
}

impl fmt::Display for BundleHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// haproxy.cfg plus every auxiliary file. Files are kept sorted by path so that equal bundles
/// compare and hash equal whatever order the renderer produced them in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bundle {
    /// Shared (the controller's render keeps the same text for its next change).
    pub haproxy_cfg: Arc<String>,
    pub files: Vec<BundleFile>,
}

impl Bundle {
    pub fn new(haproxy_cfg: impl Into<Arc<String>>, mut files: Vec<BundleFile>) -> Bundle {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Bundle {
            haproxy_cfg: haproxy_cfg.into(),
            files,
        }
    }

    /// sha256 over a length-framed encoding: a version tag, the config, then per file (sorted by
    /// path) its kind, path and content. Framing makes `("ab","c")` and `("a","bc")` differ.
    pub fn hash(&self) -> BundleHash {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        let mut frame = |bytes: &[u8]| {
            ctx.update(&(bytes.len() as u64).to_be_bytes());
            ctx.update(bytes);
        };
        frame(b"haptic-bundle-v1");
        frame(self.haproxy_cfg.as_bytes());
        let mut files: Vec<&BundleFile> = self.files.iter().collect();
        files.sort_by(|a, b| a.path.cmp(&b.path));
        for file in files {
            frame(file.kind.as_str().as_bytes());
            frame(file.path.as_bytes());
            frame(&file.content);
        }
        BundleHash(hex(ctx.finish().as_ref()))
    }
}

/// sha256 of arbitrary bytes as lower-case hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, bytes).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0xf) as usize] as char);
    }
    out
}

/// Why a wire bundle was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    UnknownKind {
        path: String,
        kind: String,
    },
    UnknownEncoding {
        path: String,
        encoding: String,
    },
    Base64 {
        path: String,
        error: crate::base64::DecodeError,
    },
    DuplicatePath(String),
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::UnknownKind { path, kind } => {
                write!(f, "file {path}: unknown kind {kind:?} (expected one of map, cert, crt-list, general, ca, crl)")
            }
            ProtocolError::UnknownEncoding { path, encoding } => {
                write!(
                    f,
                    "file {path}: unknown encoding {encoding:?} (expected \"base64\" or none)"
                )
            }
            ProtocolError::Base64 { path, error } => write!(f, "file {path}: {error}"),
            ProtocolError::DuplicatePath(path) => {
                write!(f, "file {path} appears twice in the bundle")
            }
        }
    }
}

impl std::error::Error for ProtocolError {}

/// `PUT /v1/bundle` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireBundle {
    pub haproxy_cfg: String,
    #[serde(default)]
    pub files: Vec<WireFile>,
}

/// One file on the wire. `content` is text unless `encoding` is `"base64"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireFile {
    pub kind: String,
    pub path: String,
    pub content: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<String>,
}

impl Bundle {
    /// The wire form: UTF-8 content as text, anything else base64.
    pub fn to_wire(&self) -> WireBundle {
        let files = self
            .files
            .iter()
            .map(|f| match std::str::from_utf8(&f.content) {
                Ok(text) => WireFile {
                    kind: f.kind.as_str().into(),
                    path: f.path.clone(),
                    content: text.into(),
                    encoding: None,
                },
                Err(_) => WireFile {
                    kind: f.kind.as_str().into(),
                    path: f.path.clone(),
                    content: crate::base64::encode(&f.content),
                    encoding: Some("base64".into()),
                },
            })
            .collect();
        WireBundle {
            haproxy_cfg: self.haproxy_cfg.to_string(),
            files,
        }
    }

    /// Checks kinds, encodings and duplicate paths. Path safety is the agent's business (it
    /// knows the directory the paths are relative to).
    pub fn from_wire(wire: WireBundle) -> Result<Bundle, ProtocolError> {
        let mut files = Vec::with_capacity(wire.files.len());
        for f in wire.files {
            let kind = FileKind::parse(&f.kind).ok_or_else(|| ProtocolError::UnknownKind {
                path: f.path.clone(),
                kind: f.kind.clone(),
            })?;
            let content = match f.encoding.as_deref() {
                None => f.content.into_bytes(),
                Some("base64") => {
                    crate::base64::decode(&f.content).map_err(|error| ProtocolError::Base64 {
                        path: f.path.clone(),
                        error,
                    })?
                }
                Some(other) => {
                    return Err(ProtocolError::UnknownEncoding {
                        path: f.path,
                        encoding: other.into(),
                    })
                }
            };
            files.push(BundleFile {
                kind,
                path: f.path,
                content,
            });
        }
        let bundle = Bundle::new(wire.haproxy_cfg, files);
        if let Some(w) = bundle.files.windows(2).find(|w| w[0].path == w[1].path) {
            return Err(ProtocolError::DuplicatePath(w[0].path.clone()));
        }
        Ok(bundle)
    }
}

/// Paths and headers of the agent's API, shared by the agent and the controller.
pub mod api {
    pub const STATE: &str = "/v1/state";
    pub const BUNDLE: &str = "/v1/bundle";
    pub const CONFIG: &str = "/v1/config";
    pub const RELOAD: &str = "/v1/reload";
    /// The bundle hash the push was computed against (`*`: any).
    pub const IF_MATCH: &str = "If-Match";
    /// The pushing leader's epoch; an agent refuses epochs below the highest it accepted.
    pub const EPOCH: &str = "X-Haptic-Epoch";
    /// The HAProxy version (`haproxy -v`, e.g. `2.6.12-1+deb12u4`) whose `haproxy -c` accepted
    /// this bundle in the controller. An agent whose running HAProxy is that exact version does
    /// not check the bundle again before a reload: the reload parses it anyway, and a failed
    /// reload is rolled back (docs/architecture.md, "Who runs haproxy -c").
    pub const CHECKED_WITH: &str = "X-Haptic-Checked-With";
}

/// The 200 reply of `PUT /v1/bundle` and `POST /v1/reload`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyResponse {
    /// `no_change`, `runtime` or `reload`.
    pub result: String,
    /// Who ran `haproxy -c` on the bundle before it was installed: `agent`, or `controller`
    /// when the push carried [`api::CHECKED_WITH`] naming the running HAProxy's version.
    /// Absent when no check was needed (runtime-only changes, no change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checked_by: Option<String>,
    /// The applied (or, for a dry run, the planned) bundle hash.
    pub bundle: String,
    #[serde(default)]
    pub dry_run: bool,
    /// Runtime commands sent (payloads summarised), in order.
    #[serde(default)]
    pub commands: Vec<String>,
    /// Why a reload was needed.
    #[serde(default)]
    pub reasons: Vec<String>,
    pub worker_pid_before: Option<u32>,
    pub worker_pid_after: Option<u32>,
    /// Phase durations: `validate`, `write`, `runtime`, `reload`, `total`.
    #[serde(default)]
    pub timings_ms: BTreeMap<String, u64>,
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// The body of every error reply: what failed and the details a human needs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub detail: String,
    /// 409: the bundle the agent has applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_bundle: Option<String>,
    /// 412: the highest leader epoch the agent has accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest_epoch: Option<u64>,
    /// 502: whether the previous files were restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rolled_back: Option<bool>,
    /// 422/502: output of `haproxy -c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_output: Option<String>,
}

impl ErrorBody {
    pub fn new(error: impl Into<String>, detail: impl Into<String>) -> ErrorBody {
        ErrorBody {
            error: error.into(),
            detail: detail.into(),
            ..ErrorBody::default()
        }
    }
}

/// Whether HAProxy runs a bundle the agent applied or a configuration it did not write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Bootstrap,
    Applied,
}

/// `GET /v1/state`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentState {
    /// The applied bundle hash; `null` in bootstrap mode.
    pub bundle: Option<String>,
    pub applied_at: Option<String>,
    pub mode: Mode,
    /// sha256 of the applied haproxy.cfg.
    pub config_sha256: Option<String>,
    /// path -> sha256 of every managed file.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Applies that changed something since the state was created.
    #[serde(default)]
    pub generation: u64,
    /// The highest `X-Haptic-Epoch` accepted.
    pub leader_epoch: Option<u64>,
    pub haproxy: HaproxyStatus,
    pub last_apply: Option<ApplyRecord>,
    pub drift: Drift,
    /// Another apply is running.
    #[serde(default)]
    pub busy: bool,
    /// A bundle whose reload HAProxy has not confirmed: its files are on disk, and HAProxy
    /// serves it or the bundle before it (mode is `bootstrap` until the agent knows which).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reload: Option<String>,
}

/// What the master socket says about HAProxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaproxyStatus {
    pub version: Option<String>,
    pub master_pid: Option<u32>,
    pub worker_pid: Option<u32>,
    pub reloads: Option<u64>,
    pub failed_reloads: Option<u64>,
    /// Set when the master socket did not answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The outcome of the last `PUT /v1/bundle` or `POST /v1/reload`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyRecord {
    pub at: String,
    /// `no_change`, `runtime`, `reload`, or `failed`.
    pub result: String,
    pub bundle: Option<String>,
    pub status: u16,
    pub error: Option<String>,
    #[serde(default)]
    pub timings_ms: BTreeMap<String, u64>,
}

/// Whether disk still holds what the agent applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drift {
    pub config_ok: bool,
    pub files_ok: bool,
    #[serde(default)]
    pub mismatches: Vec<String>,
}

impl Default for Drift {
    fn default() -> Drift {
        Drift {
            config_ok: true,
            files_ok: true,
            mismatches: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash is a wire contract between controller and agent versions: pinned to a value
    /// computed independently (Python's hashlib over the documented framing).
    #[test]
    fn bundle_hash_known_answer() {
        let bundle = Bundle::new(
            "global\n".to_string(),
            vec![
                BundleFile {
                    kind: FileKind::Map,
                    path: "maps/b.map".into(),
                    content: b"k v\n".to_vec(),
                },
                BundleFile {
                    kind: FileKind::Cert,
                    path: "certs/a.pem".into(),
                    content: b"X".to_vec(),
                },
            ],
        );
        assert_eq!(
            bundle.hash().to_string(),
            "6a24a4b2b83e645ad61e2716b6a1254bc5e52d14dacf940060067bbbff6588cb"
        );
    }

    #[test]
    fn wire_round_trip_keeps_binary_files_and_refuses_bad_input() {
        let bundle = Bundle::new(
            "global\n".to_string(),
            vec![
                file("maps/a", "k v\n"),
                BundleFile {
                    kind: FileKind::Cert,
                    path: "ssl/x.der".into(),
                    content: vec![0, 159, 255],
                },
            ],
        );
        let wire = bundle.to_wire();
        assert_eq!(wire.files[1].encoding.as_deref(), Some("base64"));
        let json = serde_json::to_string(&wire).unwrap();
        let back: WireBundle = serde_json::from_str(&json).unwrap();
        assert_eq!(Bundle::from_wire(back).unwrap().hash(), bundle.hash());

        let mut bad = bundle.to_wire();
        bad.files[0].kind = "mapz".into();
        assert!(Bundle::from_wire(bad)
            .unwrap_err()
            .to_string()
            .contains("unknown kind \"mapz\""));
        let mut dup = bundle.to_wire();
        dup.files[1] = dup.files[0].clone();
        assert_eq!(
            Bundle::from_wire(dup),
            Err(ProtocolError::DuplicatePath("maps/a".into()))
        );
        let mut b64 = bundle.to_wire();
        b64.files[1].content = "AA".into();
        assert!(Bundle::from_wire(b64)
            .unwrap_err()
            .to_string()
            .starts_with("file ssl/x.der: invalid base64"));
    }

    fn file(path: &str, content: &str) -> BundleFile {
        BundleFile {
            kind: FileKind::Map,
            path: path.into(),
            content: content.into(),
        }
    }

    #[test]
    fn hash_ignores_file_order_but_not_framing() {
        let a = Bundle::new(
            "cfg".to_string(),
            vec![file("maps/a", "1"), file("maps/b", "2")],
        );
        let b = Bundle::new(
            "cfg".to_string(),
            vec![file("maps/b", "2"), file("maps/a", "1")],
        );
        assert_eq!(a.hash(), b.hash());
        let c = Bundle::new(
            "cfg".to_string(),
            vec![file("maps/a", "1maps/b"), file("", "2")],
        );
        assert_ne!(a.hash(), c.hash());
        assert!(BundleHash::parse(a.hash().as_str()).is_some());
    }
}
