//! Test harness: a real HAProxy 2.6 in master-worker mode, the real `haptic-agent` binary with
//! mutual TLS, tiny HTTP backends, and helpers to talk to all of them.
//!
//! Every process is owned by a guard that kills it on drop (also when a test panics). Ports are
//! fresh ones the kernel hands out on 127.0.0.1 (a port that another HAProxy holds with
//! SO_REUSEPORT cannot be bound without that option, so it is never handed out). Waiting is
//! always polling for a condition with a deadline.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use haptic_agent::haproxy::Haproxy;
use haptic_agent::protocol::{Bundle, BundleFile, FileKind};
use serde_json::Value;

mod os;
#[allow(unused_imports)] // each test crate uses some of them
pub use os::{agent_loopback, agent_loopback_sans, connect_from, unique_loopback, Tied};

/// The HAProxy the tests run: Debian's, or `HAPTIC_TEST_HAPROXY` (scripts/test.sh runs the
/// agent and end-to-end tests once more with HAProxy 3.2, the release the chart's pods run).
pub fn haproxy_bin() -> String {
    std::env::var("HAPTIC_TEST_HAPROXY")
        .ok()
        .filter(|p| !p.is_empty())
        .unwrap_or_else(|| "/usr/sbin/haproxy".into())
}

/// Polls `f` until it returns `Some`, panicking with `what` after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("agent/ has a parent")
        .to_path_buf()
}

/// A fresh private directory under the system temp dir.
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "haptic-agent-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// Certificates from scripts/gen-certs.sh: the real CA and, for negative tests, a foreign one.
pub struct Certs {
    pub dir: PathBuf,
    pub other: PathBuf,
}

pub fn certs() -> &'static Certs {
    static CERTS: OnceLock<Certs> = OnceLock::new();
    CERTS.get_or_init(|| {
        // Generated per test process in the target's scratch directory (no /tmp leftovers);
        // directories of processes that are gone are removed.
        let scratch = Path::new(env!("CARGO_TARGET_TMPDIR"));
        for entry in std::fs::read_dir(scratch).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(pid) = name.strip_prefix("agent-certs-") {
                if !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        let dir = scratch.join(format!("agent-certs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let gen = |out: &Path, extra: &[&str]| {
            let status = Command::new(repo_root().join("scripts/gen-certs.sh"))
                .arg(out)
                .args(extra)
                .env(
                    "AGENT_SANS",
                    format!("DNS:haptic-agent,IP:127.0.0.1,{}", agent_loopback_sans()),
                )
                .stdout(Stdio::null())
                .status()
                .expect("run scripts/gen-certs.sh");
            assert!(status.success(), "scripts/gen-certs.sh failed");
        };
        gen(&dir.join("main"), &["--expired-client"]);
        gen(&dir.join("other"), &[]);
        Certs {
            dir: dir.join("main"),
            other: dir.join("other"),
        }
    })
}

/// A self-signed certificate and key for HAProxy to serve, as one PEM.
pub fn server_pem(cn: &str) -> String {
    let dir = temp_dir("pem");
    let status = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "30",
        ])
        .arg("-subj")
        .arg(format!("/CN={cn}"))
        .arg("-keyout")
        .arg(dir.join("k.pem"))
        .arg("-out")
        .arg(dir.join("c.pem"))
        .stderr(Stdio::null())
        .status()
        .expect("run openssl");
    assert!(status.success());
    let pem = std::fs::read_to_string(dir.join("c.pem")).unwrap()
        + &std::fs::read_to_string(dir.join("k.pem")).unwrap();
    let _ = std::fs::remove_dir_all(dir);
    pem
}

/// The subject of the certificate a TLS server at `addr` (`ip:port`) presents for `sni`.
pub fn served_subject(addr: &str, sni: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!("openssl s_client -connect {addr} -servername {sni} </dev/null 2>/dev/null | openssl x509 -noout -subject"))
        .output()
        .expect("run openssl s_client");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A child process killed on drop. HAProxy runs in its own process group so its workers (and a
/// master that re-executed itself) are killed with it.
pub struct Proc {
    pub child: Child,
    pub name: &'static str,
    pub group: bool,
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGTERM, wait up to 5 s, then SIGKILL (to the whole group for HAProxy).
    pub fn stop(&mut self) {
        let target = if self.group { -self.pid() } else { self.pid() };
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: plain kill(2) on a pid (or our own child's process group).
            unsafe { libc::kill(target, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && self.child.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if self.group {
            // Stragglers (workers still draining) go too; ESRCH when none are left.
            // SAFETY: as above.
            unsafe { libc::kill(target, libc::SIGKILL) };
        }
    }

    /// Waits for the process to exit on its own (for fault-injected agents).
    pub fn wait_exit(&mut self, timeout: Duration) -> i32 {
        wait_for(&format!("{} to exit", self.name), timeout, || {
            self.child.try_wait().ok().flatten()
        })
        .code()
        .unwrap_or(-1)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A tiny HTTP server answering every request with its name (runs until the test process ends).
pub fn backend(name: &str) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind backend");
    let port = listener.local_addr().unwrap().port();
    let name = name.to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let name = name.clone();
            std::thread::spawn(move || {
                let mut stream = stream;
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let body = format!("{name}\n");
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

/// One plain HTTP request through HAProxy; returns the body or an error description.
pub fn http_get(addr: &str, host: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .map_err(|e| format!("read: {e}"))?;
    let (head, body) = out
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no response head in {out:?}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("status: {}", head.lines().next().unwrap_or("")));
    }
    Ok(body.trim().to_string())
}

/// Which agent client credentials to use.
pub enum ClientCert {
    Valid,
    None,
    Foreign,
    Expired,
    /// The certificate set of the second CA, trusting that CA as the server's issuer too.
    OtherSet,
}

pub fn client(cert: ClientCert) -> ureq::Agent {
    use ureq::tls::{Certificate, ClientCert as UreqCert, PrivateKey, RootCerts, TlsConfig};
    let c = certs();
    let read =
        |p: PathBuf| std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    let ca_dir = if matches!(cert, ClientCert::OtherSet) {
        &c.other
    } else {
        &c.dir
    };
    let ca = Certificate::from_pem(&read(ca_dir.join("ca.crt"))).unwrap();
    let pair = |dir: &Path, crt: &str| {
        let cert = Certificate::from_pem(&read(dir.join(crt))).unwrap();
        let key = PrivateKey::from_pem(&read(dir.join("controller.key"))).unwrap();
        Some(UreqCert::new_with_certs(&[cert], key))
    };
    let client_cert = match cert {
        ClientCert::Valid => pair(&c.dir, "controller.crt"),
        ClientCert::None => None,
        ClientCert::Foreign => pair(&c.other, "controller.crt"),
        ClientCert::Expired => pair(&c.dir, "controller-expired.crt"),
        ClientCert::OtherSet => pair(&c.other, "controller.crt"),
    };
    let tls = TlsConfig::builder()
        .root_certs(RootCerts::new_with_certs(&[ca]))
        .client_cert(client_cert)
        .build();
    ureq::Agent::config_builder()
        .tls_config(tls)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(60)))
        .build()
        .into()
}

/// Options for [`Env::start`].
#[derive(Default, Clone)]
pub struct Options {
    /// Give HAProxy a worker stats socket and the agent `--worker-socket`.
    pub worker_socket: bool,
    pub agent_args: Vec<String>,
}

/// HAProxy + agent in a private directory.
pub struct Env {
    pub root: PathBuf,
    pub cfg_dir: PathBuf,
    pub master: PathBuf,
    pub worker_sock: Option<PathBuf>,
    /// HAProxy's frontend: a fixed port on an address of this test's own.
    pub fe: String,
    /// The agent's own loopback address; its API listens on `api_port`, probes on `probe_port`.
    pub ip: String,
    pub api_port: u16,
    pub probe_port: u16,
    pub opts: Options,
    pub haproxy: Option<Proc>,
    pub agent: Option<Proc>,
    pub client: ureq::Agent,
}

impl Env {
    pub fn start(opts: Options) -> Env {
        assert!(
            Path::new(&haproxy_bin()).exists(),
            "{} is missing: install Debian's haproxy package (scripts/test.sh does)",
            haproxy_bin()
        );
        let root = temp_dir("env");
        let cfg_dir = root.join("cfg");
        std::fs::create_dir_all(&cfg_dir).unwrap();
        let worker_sock = opts.worker_socket.then(|| root.join("worker.sock"));
        let mut env = Env {
            master: root.join("master.sock"),
            root,
            cfg_dir,
            worker_sock,
            fe: format!("{}:8080", unique_loopback()),
            ip: agent_loopback(),
            api_port: 5555,
            probe_port: 5556,
            opts,
            haproxy: None,
            agent: None,
            client: client(ClientCert::Valid),
        };
        std::fs::write(env.cfg_dir.join("bootstrap.cfg"), env.bootstrap_cfg()).unwrap();
        std::fs::copy(
            env.cfg_dir.join("bootstrap.cfg"),
            env.cfg_dir.join("haproxy.cfg"),
        )
        .unwrap();
        env.start_haproxy();
        env.start_agent(&[]);
        env
    }

    /// The `global` section every test configuration starts with.
    pub fn global(&self) -> String {
        let mut g = String::from("global\n    stats timeout 10s\n    hard-stop-after 10s\n");
        if let Some(ws) = &self.worker_sock {
            g.push_str(&format!(
                "    stats socket {} mode 600 level admin\n",
                ws.display()
            ));
        }
        g.push_str("defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n");
        g
    }

    pub fn bootstrap_cfg(&self) -> String {
        format!(
            "{}frontend fe\n    bind {}\n    http-request return status 200 content-type text/plain string bootstrap\n",
            self.global(),
            self.fe
        )
    }

    pub fn start_haproxy(&mut self) {
        let log = std::fs::File::create(self.root.join("haproxy.log")).unwrap();
        let child = Command::new(haproxy_bin())
            .arg("-W")
            .arg("-db")
            .arg("-S")
            .arg(&self.master)
            .arg("-f")
            .arg(self.cfg_dir.join("haproxy.cfg"))
            .current_dir(&self.cfg_dir)
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .tied()
            .spawn()
            .expect("start haproxy");
        self.haproxy = Some(Proc {
            child,
            name: "haproxy",
            group: true,
        });
        wait_for(
            "HAProxy master socket with a worker",
            Duration::from_secs(10),
            || {
                let info = self.haproxy_api().show_proc(Duration::ZERO).ok()?;
                info.worker_pid()
            },
        );
        // HAProxy 3.1 and later list the worker as soon as it is forked, before it has read
        // its configuration and bound its listeners: wait until it answers.
        wait_for(
            "the HAProxy worker answers",
            Duration::from_secs(10),
            || {
                let info = self.haproxy_api().runtime("show info", None).ok()?;
                info.contains("Pid:").then_some(())
            },
        );
    }

    pub fn stop_haproxy(&mut self) {
        if let Some(mut p) = self.haproxy.take() {
            p.stop();
        }
    }

    pub fn agent_command(&self) -> Command {
        let c = &certs().dir;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_haptic-agent"));
        cmd.arg("serve")
            .arg("--config-dir")
            .arg(&self.cfg_dir)
            .arg("--master-socket")
            .arg(&self.master)
            .args(["--haproxy-bin", &haproxy_bin()])
            .args(["--listen", &format!("{}:{}", self.ip, self.api_port)])
            .args([
                "--probe-listen",
                &format!("{}:{}", self.ip, self.probe_port),
            ])
            .arg("--tls-cert")
            .arg(c.join("agent.crt"))
            .arg("--tls-key")
            .arg(c.join("agent.key"))
            .arg("--client-ca")
            .arg(c.join("ca.crt"))
            .args(["--log-level", "debug"])
            .args(&self.opts.agent_args);
        if let Some(ws) = &self.worker_sock {
            cmd.arg("--worker-socket").arg(ws);
        }
        cmd
    }

    /// Starts the agent (with extra environment, e.g. fault injection) and waits for /healthz.
    pub fn start_agent(&mut self, env: &[(&str, &str)]) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.join("agent.log"))
            .unwrap();
        let mut cmd = self.agent_command();
        cmd.envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        self.agent = Some(Proc {
            child: cmd.tied().spawn().expect("start haptic-agent"),
            name: "haptic-agent",
            group: false,
        });
        let (ip, port) = (self.ip.clone(), self.probe_port);
        wait_for("agent /healthz", Duration::from_secs(10), || {
            probe(&ip, port, "/healthz").ok().filter(|(s, _)| *s == 200)
        });
    }

    pub fn stop_agent(&mut self) {
        if let Some(mut p) = self.agent.take() {
            p.stop();
        }
    }

    pub fn haproxy_api(&self) -> Haproxy {
        Haproxy {
            master_socket: self.master.clone(),
            worker_socket: None,
            binary: haproxy_bin().into(),
            command_timeout: Duration::from_secs(5),
            reload_timeout: Duration::from_secs(15),
        }
    }

    /// A runtime command for the current worker (through the master).
    pub fn runtime(&self, cmd: &str) -> String {
        self.haproxy_api()
            .runtime(cmd, None)
            .expect("runtime command")
    }

    pub fn worker_pid(&self) -> u32 {
        self.haproxy_api()
            .show_proc(Duration::from_secs(5))
            .expect("show proc")
            .worker_pid()
            .expect("a worker")
    }

    pub fn url(&self, path: &str) -> String {
        format!("https://{}:{}{path}", self.ip, self.api_port)
    }

    /// `PUT /v1/bundle` with extra headers; returns status and JSON body.
    pub fn put_with(&self, bundle: &Bundle, query: &str, headers: &[(&str, &str)]) -> (u16, Value) {
        let body = serde_json::to_vec(&bundle.to_wire()).unwrap();
        let mut req = self.client.put(&self.url(&format!("/v1/bundle{query}")));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut resp = req.send(&body[..]).expect("PUT /v1/bundle");
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().expect("read body");
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}")),
        )
    }

    pub fn put(&self, bundle: &Bundle) -> (u16, Value) {
        self.put_with(bundle, "", &[])
    }

    /// PUT that must succeed with `result`.
    pub fn apply(&self, bundle: &Bundle, result: &str) -> Value {
        let (status, body) = self.put(bundle);
        assert_eq!(
            status,
            200,
            "apply failed: {body:#}\nagent log:\n{}",
            self.agent_log()
        );
        assert_eq!(body["result"], result, "unexpected result: {body:#}");
        body
    }

    pub fn state(&self) -> Value {
        let mut resp = self
            .client
            .get(&self.url("/v1/state"))
            .call()
            .expect("GET /v1/state");
        assert_eq!(resp.status().as_u16(), 200);
        serde_json::from_str(&resp.body_mut().read_to_string().unwrap()).unwrap()
    }

    pub fn agent_log(&self) -> String {
        std::fs::read_to_string(self.root.join("agent.log")).unwrap_or_default()
    }

    pub fn disk(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.cfg_dir.join(rel)).ok()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.stop_agent();
        self.stop_haproxy();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        } else {
            eprintln!("test files kept in {}", self.root.display());
        }
    }
}

/// A plain HTTP GET on the probe port at `ip`: (status, body).
pub fn probe(ip: &str, port: u16, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect((ip, port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out).map_err(|e| e.to_string())?;
    let status = out
        .get(9..12)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad response {out:?}"))?;
    Ok((
        status,
        out.split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default(),
    ))
}

pub fn file(kind: FileKind, path: &str, content: &str) -> BundleFile {
    BundleFile {
        kind,
        path: path.into(),
        content: content.as_bytes().to_vec(),
    }
}
