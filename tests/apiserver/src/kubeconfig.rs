//! Writing the kubeconfig clients use to reach this server: server URL, the CA (inline), and
//! either a bearer token, a token file, or the client certificate issued by our CA.

use std::fs;
use std::path::{Path, PathBuf};

use crate::tls::Pki;
use crate::util::base64_encode;

/// How the kubeconfig's user authenticates.
pub enum Credential {
    Token(String),
    TokenFile(PathBuf),
    ClientCert,
}

/// Writes a single-context kubeconfig (`haptic-dev`, namespace `default`).
pub fn write(path: &Path, url: &str, pki: Option<&Pki>, cred: &Credential) -> Result<(), String> {
    let mut cluster = format!("    server: {url}\n");
    if let Some(pki) = pki {
        cluster.push_str(&format!(
            "    certificate-authority-data: {}\n",
            base64_encode(pki.ca_pem.as_bytes())
        ));
    }
    let user = match (cred, pki) {
        (Credential::Token(t), _) => format!("    token: {t}\n"),
        (Credential::TokenFile(f), _) => format!("    tokenFile: {}\n", f.display()),
        (Credential::ClientCert, Some(pki)) => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            base64_encode(pki.client_cert_pem.as_bytes()),
            base64_encode(pki.client_key_pem.as_bytes())
        ),
        (Credential::ClientCert, None) => return Err("client certificates need TLS".into()),
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: haptic-dev\n  cluster:\n{cluster}\
         users:\n- name: haptic-dev\n  user:\n{user}\
         contexts:\n- name: haptic-dev\n  context:\n    cluster: haptic-dev\n    user: haptic-dev\n    namespace: default\n\
         current-context: haptic-dev\npreferences: {{}}\n"
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    }
    fs::write(path, text).map_err(|e| format!("write kubeconfig {}: {e}", path.display()))
}
