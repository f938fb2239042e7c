//! A tiny validating admission webhook over TLS for the tests: it denies objects whose name
//! starts with `deny`, allows everything else, and counts the reviews it received.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::{json, Value};

pub const DENIAL: &str = "names starting with deny are not allowed here";
/// The first of the warnings names starting with `warn` get (the second is 300 characters).
pub const WARNING: &str = "names starting with \"warn\" are frowned upon";

pub struct Webhook {
    pub url: String,
    pub ca_pem: String,
    pub reviews: Arc<AtomicUsize>,
}

impl Webhook {
    pub fn start() -> Webhook {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::default();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "test webhook CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = ca_params.self_signed(&ca_key).expect("CA cert");
        let key = KeyPair::generate().expect("webhook key");
        let params = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("SANs");
        let cert = params.signed_by(&key, &ca, &ca_key).expect("webhook cert");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .expect("webhook TLS config");
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind webhook");
        let url = format!("https://{}/validate", listener.local_addr().expect("addr"));
        let reviews = Arc::new(AtomicUsize::new(0));
        let counter = reviews.clone();
        thread::spawn(move || {
            for sock in listener.incoming().map_while(Result::ok) {
                let config = config.clone();
                let counter = counter.clone();
                thread::spawn(move || {
                    let Ok(conn) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut tls = rustls::StreamOwned::new(conn, sock);
                    if let Some(review) = read_request(&mut tls) {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let body = answer(&review).to_string();
                        let _ = write!(
                            tls,
                            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        );
                        let _ = tls.flush();
                        tls.conn.send_close_notify();
                        let _ = tls.flush();
                    }
                });
            }
        });
        Webhook {
            url,
            ca_pem: ca.pem(),
            reviews,
        }
    }
}

fn read_request(stream: &mut impl Read) -> Option<Value> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            while buf.len() < end + 4 + len {
                let n = stream.read(&mut chunk).ok()?;
                if n == 0 {
                    return None;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return serde_json::from_slice(&buf[end + 4..end + 4 + len]).ok();
        }
    }
}

fn answer(review: &Value) -> Value {
    let req = &review["request"];
    let name = req["name"].as_str().unwrap_or("");
    let allowed = !name.starts_with("deny");
    let mut response = json!({"uid": req["uid"], "allowed": allowed});
    if !allowed {
        response["status"] = json!({"code": 403, "message": DENIAL});
    }
    if name.starts_with("warn") {
        response["warnings"] = json!([WARNING, "w".repeat(300)]);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}
