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

/// A loopback address (127.128.0.0/9) that no other test uses: the process id picks the
/// block, a counter the address. HAProxy binds with SO_REUSEPORT, so two tests that picked the
/// same port on one address would silently share a listener; distinct addresses cannot.
#[allow(dead_code)]
pub fn unique_loopback() -> String {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    assert!(
        n < 4 * 254,
        "more loopback addresses than a test process may use"
    );
    let pid = std::process::id();
    format!(
        "127.{}.{}.{}",
        128 | (pid & 0x7f),
        (((pid >> 7) & 0x3f) << 2) | (n / 254),
        n % 254 + 1
    )
}

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
        let certs: Vec<_> = ureq::tls::parse_pem(&ca)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder().tls_config(tls).build().into();
        agent
            .post(format!("{}/_dev/faults", self.url))
            .header("Content-Type", "application/json")
            .send(body.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("POST /_dev/faults {body}: {e}"));
    }
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

/// Children die with the test thread that started them (SIGKILL through the parent-death
/// signal), also when the test process is killed: a stopped run leaves no HAProxy, agent,
/// controller or API server behind.
pub trait Tied {
    fn tied(&mut self) -> &mut Self;
}

impl Tied for std::process::Command {
    fn tied(&mut self) -> &mut Self {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl and getppid are async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            self.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // The parent may have died before the signal was armed.
                if libc::getppid() == 1 {
                    return Err(std::io::Error::other("parent exited"));
                }
                Ok(())
            })
        }
    }
}

/// A TCP connection to `127.0.0.1:port` from another loopback address (another peer, as far
/// as per-address connection limits go).
#[allow(dead_code)]
pub fn connect_from(source: [u8; 4], port: u16) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::FromRawFd;
    let addr = |ip: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: plain socket calls on a descriptor this function owns until it is wrapped.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = std::net::TcpStream::from_raw_fd(fd);
        let local = addr(source, 0);
        if libc::bind(fd, &local as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = addr([127, 0, 0, 1], port);
        if libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}
