//! Shared harness for the root crate's integration tests: the dev API server, a cuttable TCP
//! proxy (network partitions), and waiting for conditions with deadlines.

#![allow(dead_code)]

pub mod cluster;
pub mod libraries;

use std::io::{BufRead, BufReader};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// Loopback addresses, parent-death signals and bound sockets, shared with the agent's tests.
#[path = "../../agent/tests/support/os.rs"]
mod os;
#[allow(unused_imports)] // each test crate uses some of them
pub use os::{connect_from, unique_loopback, Tied};

/// Polls `condition` until it holds or `timeout` passes; panics with `what` on timeout.
pub fn wait_for(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !condition() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn path(&self) -> &std::path::Path {
        &self.0
    }

    pub fn new(name: &str) -> TempDir {
        use std::sync::atomic::AtomicU64;
        static N: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "haptic-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The dev API server binary (`HAPTIC_DEV_APISERVER` overrides).
pub fn apiserver_binary() -> PathBuf {
    if let Ok(path) = std::env::var("HAPTIC_DEV_APISERVER") {
        return PathBuf::from(path);
    }
    cluster::workspace_binary("haptic-dev-apiserver", "haptic-dev-apiserver")
}

/// A running dev API server, killed on drop.
pub struct DevApiServer {
    child: Child,
    pub url: String,
    pub dir: TempDir,
}

impl DevApiServer {
    pub fn start(extra: &[&str]) -> DevApiServer {
        let dir = TempDir::new("apiserver");
        let kubeconfig = dir.0.join("kubeconfig");
        let mut child = Command::new(apiserver_binary())
            .args([
                "--listen",
                "127.0.0.1:0",
                "--kubeconfig-out",
                kubeconfig.to_str().unwrap(),
                "--log-level",
                "warn",
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .tied()
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("ready ") {
                    let _ = tx.send(url.to_string());
                }
            }
        });
        let url = match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(url) => url,
            Err(_) => {
                let _ = child.kill();
                panic!("haptic-dev-apiserver did not print `ready` within 20s");
            }
        };
        DevApiServer { child, url, dir }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.0.join("kubeconfig")
    }

    /// `POST /_dev/faults` with a JSON body.
    pub fn faults(&self, body: &serde_json::Value) {
        let ca = std::fs::read(self.dir.0.join("ca.crt")).unwrap();
        https_agent(&ca)
            .post(format!("{}/_dev/faults", self.url))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("POST /_dev/faults {body}: {e}"));
    }
}

/// An HTTPS client that trusts the certificates in `ca_pem` only.
pub fn https_agent(ca_pem: &[u8]) -> ureq::Agent {
    https_agent_as(ca_pem, None)
}

/// An HTTPS client trusting `ca_pem`, presenting `client` (PEM certificate, PEM key) when given.
pub fn https_agent_as(ca_pem: &[u8], client: Option<(&[u8], &[u8])>) -> ureq::Agent {
    let certs = |pem: &[u8]| -> Vec<ureq::tls::Certificate<'static>> {
        ureq::tls::parse_pem(pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c.to_owned()),
                _ => None,
            })
            .collect()
    };
    let mut tls = ureq::tls::TlsConfig::builder()
        .root_certs(ureq::tls::RootCerts::new_with_certs(&certs(ca_pem)));
    if let Some((cert, key)) = client {
        let key = ureq::tls::PrivateKey::from_pem(key)
            .expect("client key")
            .to_owned();
        tls = tls.client_cert(Some(ureq::tls::ClientCert::new_with_certs(
            &certs(cert),
            key,
        )));
    }
    ureq::Agent::config_builder()
        .tls_config(tls.build())
        .build()
        .into()
}

impl Drop for DevApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy to `upstream` that can be cut (every connection closed, new ones refused) and
/// restored: a network partition between one client and the API server.
pub struct Proxy {
    pub port: u16,
    cut: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    pub fn start(upstream: std::net::SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (c, cs, st) = (cut.clone(), conns.clone(), stop.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                if st.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(client) = client else { continue };
                if c.load(Ordering::Relaxed) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream) else {
                    continue;
                };
                let mut list = cs.lock().unwrap();
                list.push(client.try_clone().unwrap());
                list.push(server.try_clone().unwrap());
                drop(list);
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Proxy {
            port,
            cut,
            conns,
            stop,
        }
    }

    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
        if cut {
            for conn in self.conns.lock().unwrap().drain(..) {
                let _ = conn.shutdown(Shutdown::Both);
            }
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.set_cut(true);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
