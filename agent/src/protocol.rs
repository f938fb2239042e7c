//! The bundle: everything HAProxy needs (haproxy.cfg plus auxiliary files), its canonical hash,
//! and the wire types the controller and the agent exchange.

use std::fmt;

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
        let ok = text.len() == 64 && text.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
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
    pub haproxy_cfg: String,
    pub files: Vec<BundleFile>,
}

impl Bundle {
    pub fn new(haproxy_cfg: String, mut files: Vec<BundleFile>) -> Bundle {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Bundle { haproxy_cfg, files }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, content: &str) -> BundleFile {
        BundleFile { kind: FileKind::Map, path: path.into(), content: content.into() }
    }

    #[test]
    fn hash_ignores_file_order_but_not_framing() {
        let a = Bundle::new("cfg".into(), vec![file("maps/a", "1"), file("maps/b", "2")]);
        let b = Bundle::new("cfg".into(), vec![file("maps/b", "2"), file("maps/a", "1")]);
        assert_eq!(a.hash(), b.hash());
        let c = Bundle::new("cfg".into(), vec![file("maps/a", "1maps/b"), file("", "2")]);
        assert_ne!(a.hash(), c.hash());
        assert!(BundleHash::parse(a.hash().as_str()).is_some());
    }
}
