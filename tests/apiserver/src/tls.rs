//! The server's own small PKI and its rustls configuration.
//!
//! A CA is generated on first start and kept in the certificate directory (`ca.crt`, `ca.key`);
//! a later start with the same directory reuses the CA key, so clients holding an older
//! kubeconfig keep trusting a restarted server. The server certificate (for `localhost`,
//! `127.0.0.1` and the listen host) and a client certificate for kubeconfig-with-certificates
//! tests are issued from it. Clients may present any certificate signed by this CA instead of a
//! bearer token.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

const CA_NAME: &str = "haptic-dev-apiserver-ca";
/// Common name of the client certificate written for kubeconfig-with-certificates tests.
pub const CLIENT_CN: &str = "haptic-dev-admin";

/// The CA and the certificates issued from it.
pub struct Pki {
    pub ca_pem: String,
    ca_der: CertificateDer<'static>,
    server_chain: Vec<CertificateDer<'static>>,
    server_key: PrivatePkcs8KeyDer<'static>,
    pub client_cert_pem: String,
    pub client_key_pem: String,
    pub dir: PathBuf,
}

impl Pki {
    /// Loads the CA from `dir` or creates it there, then issues fresh server and client
    /// certificates and writes `client.crt` and `client.key` next to it.
    pub fn load_or_create(dir: &Path, hosts: &[String]) -> Result<Pki, String> {
        fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let ca_crt_path = dir.join("ca.crt");
        let ca_key_path = dir.join("ca.key");
        let (ca_key, ca_pem_on_disk) = if ca_crt_path.exists() && ca_key_path.exists() {
            let key_pem = read(&ca_key_path)?;
            let key = KeyPair::from_pem(&key_pem)
                .map_err(|e| format!("parse {}: {e}", ca_key_path.display()))?;
            (key, Some(read(&ca_crt_path)?))
        } else {
            (
                KeyPair::generate().map_err(|e| format!("generate CA key: {e}"))?,
                None,
            )
        };
        // Re-signing the same name and key yields a certificate that verifies exactly what the
        // original one did, so the CA on disk (if any) stays the one clients trust.
        let ca_cert = ca_params()
            .self_signed(&ca_key)
            .map_err(|e| format!("self-sign CA: {e}"))?;
        let ca_pem = match ca_pem_on_disk {
            Some(pem) => pem,
            None => {
                write(&ca_key_path, &ca_key.serialize_pem())?;
                write(&ca_crt_path, &ca_cert.pem())?;
                ca_cert.pem()
            }
        };
        let ca_der = first_cert(&ca_pem)
            .ok_or_else(|| format!("{} holds no certificate", ca_crt_path.display()))?;

        let mut sans: Vec<String> = vec!["localhost".into(), "127.0.0.1".into(), "::1".into()];
        for h in hosts {
            if !sans.contains(h) {
                sans.push(h.clone());
            }
        }
        let (server_cert, server_key) = issue(
            &ca_cert,
            &ca_key,
            sans,
            "haptic-dev-apiserver",
            &[],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (client_cert, client_key) = issue(
            &ca_cert,
            &ca_key,
            vec![],
            CLIENT_CN,
            &["system:masters"],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        write(&dir.join("client.crt"), &client_cert.pem())?;
        write(&dir.join("client.key"), &client_key.serialize_pem())?;
        Ok(Pki {
            ca_pem,
            ca_der,
            server_chain: vec![server_cert.der().clone()],
            server_key: PrivatePkcs8KeyDer::from(server_key.serialize_der()),
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
            dir: dir.to_path_buf(),
        })
    }

    /// rustls server configuration: our server certificate, HTTP/1.1 only, and optional client
    /// certificates verified against our CA.
    pub fn server_config(&self) -> Result<Arc<ServerConfig>, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        roots
            .add(self.ca_der.clone())
            .map_err(|e| format!("add CA to client root store: {e}"))?;
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .allow_unauthenticated()
                .build()
                .map_err(|e| format!("client certificate verifier: {e}"))?;
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS versions: {e}"))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                self.server_chain.clone(),
                PrivateKeyDer::Pkcs8(self.server_key.clone_key()),
            )
            .map_err(|e| format!("server certificate: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn issue(
    ca_cert: &Certificate,
    ca_key: &KeyPair,
    sans: Vec<String>,
    common_name: &str,
    organizations: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> Result<(Certificate, KeyPair), String> {
    let mut params = CertificateParams::new(sans).map_err(|e| format!("certificate names: {e}"))?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    for o in organizations {
        dn.push(DnType::OrganizationName, *o);
    }
    params.distinguished_name = dn;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let key = KeyPair::generate().map_err(|e| format!("generate key: {e}"))?;
    let cert = params
        .signed_by(&key, ca_cert, ca_key)
        .map_err(|e| format!("sign {common_name} certificate: {e}"))?;
    Ok((cert, key))
}

/// The first certificate in a PEM text.
fn first_cert(pem: &str) -> Option<CertificateDer<'static>> {
    use rustls_pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .and_then(Result::ok)
}

fn read(path: &Path) -> Result<String, String> {
    fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))
}

fn write(path: &Path, content: &str) -> Result<(), String> {
    fs::write(path, content).map_err(|e| format!("write {}: {e}", path.display()))
}
