//! Mutual TLS for the agent API with rustls 0.23 (ring): the agent's certificate and key, and the
//! CA that client (controller) certificates must chain to.
//!
//! The three files are re-read when any of them changes (checked on every new connection: three
//! `stat` calls). Kubernetes updates mounted Secrets by swapping a symlink, which shows up as a
//! new inode or mtime on the resolved file. A broken update keeps the previous configuration and
//! logs why, so a bad rotation cannot take the agent off the air.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::reload::Reloading;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};

/// The certificate files of the TLS listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// A rustls server configuration that follows its files.
pub struct ReloadingTls {
    files: TlsFiles,
    current: Reloading<Arc<ServerConfig>>,
}

impl ReloadingTls {
    /// Loads the files; fails if they do not make a working configuration.
    pub fn new(files: TlsFiles) -> Result<ReloadingTls, String> {
        let paths = vec![
            files.cert.clone(),
            files.key.clone(),
            files.client_ca.clone(),
        ];
        let current = Reloading::new(paths);
        current.get(|_| build(&files))?;
        Ok(ReloadingTls { files, current })
    }

    /// The configuration for a new connection, reloaded first if a file changed.
    pub fn config(&self) -> Arc<ServerConfig> {
        let files = &self.files;
        // The first build succeeded in `new`, so there is always a value to fall back to.
        self.current
            .get(|_| {
                let config = build(files)?;
                log::info!("reloaded TLS certificate cert={}", files.cert.display());
                Ok(config)
            })
            .expect("ReloadingTls::new built a configuration")
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("read certificates from {}: {e}", path.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("parse certificates in {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(certs)
}

/// Builds a server configuration that requires a client certificate issued by the client CA.
pub fn build(files: &TlsFiles) -> Result<Arc<ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| format!("read private key from {}: {e}", files.key.display()))?;
    let mut roots = RootCertStore::empty();
    for ca in read_certs(&files.client_ca)? {
        roots
            .add(ca)
            .map_err(|e| format!("client CA {}: {e}", files.client_ca.display()))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("client certificate verifier: {e}"))?;
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "certificate {} and key {}: {e}",
                files.cert.display(),
                files.key.display()
            )
        })?;
    Ok(Arc::new(config))
}
