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

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig,
    SignatureScheme,
};

/// The certificate files of the TLS listener.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
    /// The name a client certificate must carry (`--client-name`), besides chaining to the
    /// client CA: one CA often issues the agents' own certificates too, which must not pass
    /// for the controller's.
    pub client_name: Option<String>,
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
    let mut verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| format!("client certificate verifier: {e}"))?;
    if let Some(name) = &files.client_name {
        verifier = Arc::new(NamedClient {
            inner: verifier,
            name: name.clone(),
        });
    }
    let mut config = ServerConfig::builder_with_provider(provider)
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
    // No resumption: a resumed session skips the client certificate's checks (its expiry and
    // name), and the controller makes one request per connection anyway.
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// A client verifier that also requires the client certificate to name one client: a DNS
/// name of its subjectAltName equal to `name`, or, for a certificate without subjectAltName (as
/// the chart issued before it added one), a subject common name equal to `name`.
#[derive(Debug)]
struct NamedClient {
    inner: Arc<dyn ClientCertVerifier>,
    name: String,
}

impl ClientCertVerifier for NamedClient {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // The chain first: only a certificate our CA signed is worth reading.
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if names(end_entity, &self.name) {
            Ok(verified)
        } else {
            log::warn!(
                "refused a client certificate of the client CA that does not name {}",
                self.name
            );
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Whether a DER certificate names `name` (ASCII case aside): see [`NamedClient`]. Anything it cannot
/// read names nobody.
fn names(cert: &[u8], name: &str) -> bool {
    let Some(fields) = der::tbs_fields(cert) else {
        return false;
    };
    match fields.san_dns {
        Some(dns) => dns.iter().any(|d| d.eq_ignore_ascii_case(name.as_bytes())),
        // Exactly one common name: with several, issuers and readers disagree on which counts.
        None => match fields.subject_cns[..] {
            [cn] if cn.eq_ignore_ascii_case(name.as_bytes()) => {
                log::warn!(
                    "accepted a client certificate by its common name {name} (it has no subjectAltName); reissue it with the subjectAltName DNS:{name}"
                );
                true
            }
            _ => false,
        },
    }
}

/// Just enough DER to read a certificate's subject common names and subjectAltName DNS names
/// (RFC 5280 §4.1). Only certificates the client CA signed reach it. Strict: single-byte tags,
/// minimal definite lengths, no trailing bytes where a structure ends; anything else is refused,
/// so that no malformed field yields a name another parser would not see.
mod der {
    const SEQUENCE: u8 = 0x30;
    const SET: u8 = 0x31;
    const OID: u8 = 0x06;
    const OCTET_STRING: u8 = 0x04;
    const BOOLEAN: u8 = 0x01;
    const UTF8_STRING: u8 = 0x0c;
    const PRINTABLE_STRING: u8 = 0x13;
    const VERSION: u8 = 0xa0;
    const EXTENSIONS: u8 = 0xa3;
    const DNS_NAME: u8 = 0x82;
    const OID_CN: &[u8] = &[0x55, 0x04, 0x03];
    const OID_SAN: &[u8] = &[0x55, 0x1d, 0x11];

    /// One element: (tag, content, what follows).
    fn next(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
        let (&tag, rest) = input.split_first()?;
        if tag & 0x1f == 0x1f {
            return None; // a multi-byte tag
        }
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (first as usize, rest)
        } else {
            let n = (first & 0x7f) as usize;
            if n == 0 || n > 4 || rest.len() < n || rest[0] == 0 {
                return None; // indefinite, too long or not minimal
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, &b| acc << 8 | b as usize);
            if len < 0x80 {
                return None;
            }
            (len, &rest[n..])
        };
        (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
    }

    /// The content of the one element `input` holds, which must have `tag`.
    fn only(input: &[u8], tag: u8) -> Option<&[u8]> {
        let (t, content, rest) = next(input)?;
        (t == tag && rest.is_empty()).then_some(content)
    }

    /// The elements of a constructed content; `None` unless all of it is elements.
    fn items(mut input: &[u8]) -> Option<Vec<(u8, &[u8])>> {
        let mut out = Vec::new();
        while !input.is_empty() {
            let (tag, content, rest) = next(input)?;
            out.push((tag, content));
            input = rest;
        }
        Some(out)
    }

    pub(super) struct Fields<'a> {
        /// Every common name of the subject, in order.
        pub subject_cns: Vec<&'a [u8]>,
        /// `None` without a subjectAltName extension.
        pub san_dns: Option<Vec<&'a [u8]>>,
    }

    pub(super) fn tbs_fields(cert: &[u8]) -> Option<Fields<'_>> {
        let certificate = items(only(cert, SEQUENCE)?)?;
        let (tag, tbs) = *certificate.first()?;
        if tag != SEQUENCE {
            return None;
        }
        let fields = items(tbs)?;
        // [0] version, serialNumber, signature, issuer, validity, subject.
        let at = if fields.first()?.0 == VERSION { 5 } else { 4 };
        let (tag, subject) = *fields.get(at)?;
        if tag != SEQUENCE {
            return None;
        }
        let mut subject_cns = Vec::new();
        for (tag, rdn) in items(subject)? {
            if tag != SET {
                return None;
            }
            for (tag, atv) in items(rdn)? {
                if tag != SEQUENCE {
                    return None;
                }
                let (oid_tag, oid, value) = next(atv)?;
                if oid_tag != OID {
                    return None;
                }
                if oid == OID_CN {
                    let (kind, text, rest) = next(value)?;
                    if !rest.is_empty() || !matches!(kind, UTF8_STRING | PRINTABLE_STRING) {
                        return None;
                    }
                    subject_cns.push(text);
                }
            }
        }
        let mut san_dns = None;
        for &(tag, content) in &fields[at + 1..] {
            if tag != EXTENSIONS {
                continue;
            }
            for (tag, ext) in items(only(content, SEQUENCE)?)? {
                if tag != SEQUENCE {
                    return None;
                }
                let ext = items(ext)?;
                let (oid, value) = match ext[..] {
                    [(OID, oid), (OCTET_STRING, value)] => (oid, value),
                    [(OID, oid), (BOOLEAN, _), (OCTET_STRING, value)] => (oid, value),
                    _ => return None,
                };
                if oid != OID_SAN {
                    continue;
                }
                if san_dns.is_some() {
                    return None; // two subjectAltName extensions
                }
                san_dns = Some(
                    items(only(value, SEQUENCE)?)?
                        .into_iter()
                        .filter(|(tag, _)| *tag == DNS_NAME)
                        .map(|(_, name)| name)
                        .collect(),
                );
            }
        }
        Some(Fields {
            subject_cns,
            san_dns,
        })
    }
}
