//! Harness for the real-traffic tests of the template libraries: echo backends, free ports,
//! `haptic render` of fixture manifests, a real `haproxy -db` killed on drop, test
//! certificates made with `openssl`, and requests sent with `curl`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use crate::support::libraries::LIBRARIES;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub use crate::support::TempDir;

pub use crate::support::{unique_loopback, Tied};

/// An HTTP server answering every request with what it received: its own name, the method,
/// the request target, and every header (`header:<lower-case name>=<value>`). It also keeps
/// what it received ([`Echo::received`]).
pub struct Echo {
    pub name: String,
    pub port: u16,
    stop: Arc<AtomicBool>,
    received: Arc<Mutex<Vec<String>>>,
}

impl Echo {
    pub fn start(name: &str) -> Echo {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind echo backend");
        let port = listener.local_addr().expect("echo address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(Mutex::new(Vec::new()));
        let (thread_stop, thread_name) = (stop.clone(), name.to_string());
        let thread_received = received.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if thread_stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(conn) = conn {
                    let (name, received) = (thread_name.clone(), thread_received.clone());
                    std::thread::spawn(move || echo_connection(conn, &name, &received));
                }
            }
        });
        Echo {
            name: name.to_string(),
            port,
            stop,
            received,
        }
    }

    /// Every request received so far, in arrival order: the text it answered with (backend,
    /// method, path, headers), then `body=<the request body>`.
    pub fn received(&self) -> Vec<String> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so the thread sees the flag and ends.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn echo_connection(conn: TcpStream, name: &str, received: &Mutex<Vec<String>>) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let mut reader = BufReader::new(match conn.try_clone() {
        Ok(c) => c,
        Err(_) => return,
    });
    let mut writer = conn;
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = request_line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let mut body = format!("backend={name}\nmethod={method}\npath={target}\n");
        let mut content_length = 0usize;
        // `X-Echo-Delay-Ms: N` makes the backend answer N ms late (at most 5 s): a slow backend.
        let mut delay_ms = 0u64;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
                if k == "content-length" {
                    content_length = v.parse().unwrap_or(0);
                }
                if k == "x-echo-delay-ms" {
                    delay_ms = v.parse::<u64>().unwrap_or(0).min(5000);
                }
                if k == "host" {
                    body.push_str(&format!("host={v}\n"));
                }
                body.push_str(&format!("header:{k}={v}\n"));
            }
        }
        let mut request_body = vec![0u8; content_length.min(1 << 20)];
        let _ = reader.read_exact(&mut request_body);
        if let Ok(mut r) = received.lock() {
            r.push(format!(
                "{body}body={}\n",
                String::from_utf8_lossy(&request_body)
            ));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Echo-Backend: {name}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// YAML for a Service with one named port and an EndpointSlice pointing at an echo backend.
pub fn service_yaml(ns: &str, name: &str, echo: &Echo) -> String {
    service_yaml_port(ns, name, echo.port)
}

/// [`service_yaml`] for a backend listening on 127.0.0.1:`port`.
pub fn service_yaml_port(ns: &str, name: &str, port: u16) -> String {
    service_yaml_ports(ns, name, &[port])
}

/// A Service with one endpoint per port of `ports` (all on 127.0.0.1; one EndpointSlice each,
/// as their ports differ): several pods of one Service.
pub fn service_yaml_ports(ns: &str, name: &str, ports: &[u16]) -> String {
    let mut out = format!(
        r#"---
apiVersion: v1
kind: Service
metadata: {{name: {name}, namespace: {ns}}}
spec:
  ports: [{{name: http, port: 80, targetPort: 8080}}]
"#
    );
    for (i, port) in ports.iter().enumerate() {
        let slice = if i == 0 {
            format!("{name}-slice")
        } else {
            format!("{name}-slice-{i}")
        };
        out.push_str(&format!(
            r#"---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: {slice}
  namespace: {ns}
  labels: {{kubernetes.io/service-name: {name}}}
ports: [{{name: http, port: {port}}}]
endpoints:
  - addresses: ["127.0.0.1"]
    conditions: {{ready: true}}
"#
        ));
    }
    out
}

/// Where a rendered HAProxy listens: fixed ports on an address of the test's own.
pub struct Ports {
    pub ip: String,
    pub http: u16,
    pub https: u16,
    pub status: u16,
}

impl Ports {
    pub fn pick() -> Ports {
        Ports {
            ip: unique_loopback(),
            http: 8080,
            https: 8443,
            status: 8404,
        }
    }

    /// On the IPv6 loopback `[::1]`, which every test shares: ports the kernel picked (bound
    /// together, released just before HAProxy binds them), or `None` when this machine has
    /// no IPv6 loopback.
    pub fn ipv6_loopback() -> Option<Ports> {
        let bind = || std::net::TcpListener::bind("[::1]:0").ok();
        let (a, b, c) = (bind()?, bind()?, bind()?);
        let port = |l: &std::net::TcpListener| l.local_addr().map(|a| a.port()).ok();
        Some(Ports {
            ip: "[::1]".to_string(),
            http: port(&a)?,
            https: port(&b)?,
            status: port(&c)?,
        })
    }
}

/// Runs `haptic render` of the six libraries on the fixtures; returns its stdout (which lists
/// the statuses templates set) and stderr (objects left out).
pub fn render(
    fixtures: &Path,
    out: &Path,
    ports: &Ports,
    extra: &[(&str, &str)],
) -> Result<String, String> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_haptic"));
    cmd.current_dir(root()).arg("render");
    for lib in LIBRARIES {
        cmd.arg("-f").arg(lib);
    }
    cmd.arg("--fixtures")
        .arg(fixtures)
        .arg("-o")
        .arg(out)
        .arg("--validate");
    let mut context = vec![
        ("http_port".to_string(), ports.http.to_string()),
        ("https_port".to_string(), ports.https.to_string()),
        ("status_port".to_string(), ports.status.to_string()),
        // quoted: a YAML scalar `[::1]` would be a list
        ("bind_address".to_string(), format!("'{}'", ports.ip)),
    ];
    context.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    for (k, v) in context {
        cmd.arg("--extra-context").arg(format!("{k}={v}"));
    }
    let output = cmd.output().map_err(|e| format!("run haptic: {e}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return Err(format!(
            "haptic render failed:\n{stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    // Warnings (objects left out of the configuration) are on stderr.
    Ok(stdout + &String::from_utf8_lossy(&output.stderr))
}

/// A running `haproxy -db`, killed on drop.
pub struct HAProxy {
    child: Child,
    pub ports: Ports,
}

impl HAProxy {
    /// Starts HAProxy on a rendered directory and waits until its status port answers.
    pub fn start(dir: &Path, ports: Ports) -> HAProxy {
        // In its own directory: relative UNIX sockets (the TLS-passthrough loopback) are
        // created there, as in the pod's working directory, never shared with another test.
        let child = Command::new("haproxy")
            .current_dir(dir)
            .arg("-db")
            .arg("-f")
            .arg(dir.join("haproxy.cfg"))
            .stdin(Stdio::null())
            .stdout(log_file(dir))
            .stderr(log_file(dir))
            .tied()
            .spawn()
            .expect("start haproxy (is it installed?)");
        let mut proxy = HAProxy { child, ports };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = proxy.child.try_wait() {
                let log = std::fs::read_to_string(dir.join("haproxy.log")).unwrap_or_default();
                panic!("haproxy exited at start: {status}\n{log}");
            }
            let url = format!("http://{}:{}/healthz", proxy.ports.ip, proxy.ports.status);
            if get(&url, &[]).status == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "haproxy did not come up in 10s");
            std::thread::sleep(Duration::from_millis(20));
        }
        proxy
    }

    pub fn http(&self, host: &str, path: &str) -> Response {
        self.http_with(host, path, &[])
    }

    pub fn http_with(&self, host: &str, path: &str, args: &[&str]) -> Response {
        let url = format!("http://{}:{}{path}", self.ports.ip, self.ports.http);
        let host_header = format!("Host: {host}");
        let mut all = vec!["-H", host_header.as_str()];
        all.extend_from_slice(args);
        get(&url, &all)
    }

    /// An HTTPS request with SNI `host`, verifying the server certificate against `ca`.
    pub fn https(&self, host: &str, path: &str, ca: &Path, args: &[&str]) -> Response {
        let url = format!("https://{host}:{}{path}", self.ports.https);
        let resolve = format!("{host}:{}:{}", self.ports.https, self.ports.ip);
        let ca = ca.display().to_string();
        let mut all = vec!["--resolve", resolve.as_str(), "--cacert", ca.as_str()];
        all.extend_from_slice(args);
        get(&url, &all)
    }
}

fn log_file(dir: &Path) -> Stdio {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("haproxy.log"))
        .map(Stdio::from)
        .unwrap_or_else(|_| Stdio::null())
}

impl Drop for HAProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
pub struct Response {
    /// 0 when the request failed (connection, TLS verification).
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// curl's error text; shown in assertion messages through `Debug`.
    #[allow(dead_code)]
    pub error: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The echo backend that answered, if any.
    pub fn backend(&self) -> Option<&str> {
        self.header("x-echo-backend")
    }

    /// A line `key=value` the echo backend reported.
    pub fn echoed(&self, key: &str) -> Option<&str> {
        let prefix = format!("{key}=");
        self.body.lines().find_map(|l| l.strip_prefix(&prefix))
    }
}

/// One request with curl (never following redirects), bounded to 5 seconds.
pub fn get(url: &str, args: &[&str]) -> Response {
    let output = Command::new("curl")
        .args(["-s", "-S", "-i", "--max-time", "5", "--http1.1"])
        .args(args)
        .arg(url)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let error = String::from_utf8_lossy(&output.stderr).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Response {
        status,
        headers,
        body: body.to_string(),
        error,
    }
}

/// A test CA and leaf certificates it signs, made with `openssl` (EC keys: fast).
pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        openssl(
            dir,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=haptic test CA",
            ],
        );
        Pki {
            dir: dir.to_path_buf(),
            ca: dir.join("ca.pem"),
        }
    }

    /// A certificate for `names` (the first is the CN): (cert PEM, key PEM).
    pub fn leaf(&self, id: &str, names: &[&str]) -> (String, String) {
        let san = names
            .iter()
            .map(|n| format!("DNS:{n}"))
            .collect::<Vec<_>>()
            .join(",");
        std::fs::write(
            self.dir.join(format!("{id}.ext")),
            format!("subjectAltName={san}\n"),
        )
        .expect("write ext file");
        let (key, csr, crt) = (
            format!("{id}.key"),
            format!("{id}.csr"),
            format!("{id}.crt"),
        );
        let subj = format!("/CN={}", names[0]);
        openssl(
            &self.dir,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &subj,
            ],
        );
        let ext = format!("{id}.ext");
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ],
        );
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).expect("read pem");
        (read(&crt), read(&key))
    }

    /// A kubernetes.io/tls Secret manifest holding a leaf certificate for `names`.
    pub fn secret_yaml(&self, ns: &str, name: &str, names: &[&str]) -> String {
        let (crt, key) = self.leaf(&format!("{ns}-{name}"), names);
        format!(
            "---\napiVersion: v1\nkind: Secret\ntype: kubernetes.io/tls\nmetadata: {{name: {name}, namespace: {ns}}}\ndata:\n  tls.crt: {}\n  tls.key: {}\n",
            base64(crt.as_bytes()),
            base64(key.as_bytes())
        )
    }
}

pub use haptic_agent::base64::encode as base64;

/// Renders `manifests` and starts HAProxy on the result. Keeps the directories alive.
pub struct Scenario {
    pub proxy: HAProxy,
    pub render_output: String,
    pub out: TempDir,
    _fixtures: TempDir,
}

impl Scenario {
    pub fn start(name: &str, manifests: &str, extra: &[(&str, &str)]) -> Scenario {
        Scenario::start_on(name, manifests, extra, Ports::pick())
    }

    /// [`Scenario::start`] on the given address and ports.
    pub fn start_on(name: &str, manifests: &str, extra: &[(&str, &str)], ports: Ports) -> Scenario {
        let fixtures = TempDir::new(&format!("{name}-fixtures"));
        std::fs::write(fixtures.path().join("manifests.yaml"), manifests).expect("write fixtures");
        let out = TempDir::new(&format!("{name}-out"));
        let render_output = render(fixtures.path(), out.path(), &ports, extra)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let proxy = HAProxy::start(out.path(), ports);
        Scenario {
            proxy,
            render_output,
            out,
            _fixtures: fixtures,
        }
    }
}

/// `openssl s_server -www` on an address of its own: a TLS backend that answers every request
/// with openssl's status page (its body names `s_server`). Killed on drop.
pub struct TlsServer(Child);

impl TlsServer {
    pub fn start(cert: &Path, key: &Path, ip: &str, port: u16) -> TlsServer {
        TlsServer::start_with(cert, key, ip, port, &[])
    }

    /// With more `openssl s_server` arguments (`-Verify 1 -CAfile …` asks for a client
    /// certificate).
    pub fn start_with(cert: &Path, key: &Path, ip: &str, port: u16, extra: &[&str]) -> TlsServer {
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-www", "-accept"])
            .arg(format!("{ip}:{port}"))
            .arg("-cert")
            .arg(cert)
            .arg("-key")
            .arg(key)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .tied()
            .spawn()
            .expect("start openssl s_server");
        let server = TlsServer(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect((ip, port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "openssl s_server did not come up"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Pki {
    /// A leaf certificate for `names` written as the two files `openssl s_server` reads:
    /// (certificate, key).
    pub fn server_files(&self, id: &str, names: &[&str]) -> (PathBuf, PathBuf) {
        let (crt, key) = self.leaf(id, names);
        let (cert_file, key_file) = (
            self.dir.join(format!("{id}-server.pem")),
            self.dir.join(format!("{id}-server.key.pem")),
        );
        std::fs::write(&cert_file, crt).expect("write server certificate");
        std::fs::write(&key_file, key).expect("write server key");
        (cert_file, key_file)
    }
}

/// YAML for a Service `ns/name` with one port `https` (443) and an EndpointSlice pointing at a
/// TLS server on `ip:port`.
pub fn tls_service_yaml_in(ns: &str, name: &str, ip: &str, port: u16) -> String {
    format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{ports: [{{name: https, port: 443}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\nports: [{{name: https, port: {port}}}]\nendpoints: [{{addresses: [\"{ip}\"]}}]\n")
}

/// A raw TCP server on 127.0.0.1: every chunk it reads is written back after `<name>:`, so a
/// client sees which backend carried its bytes. Ends its accept loop on drop.
pub struct TcpEcho {
    pub port: u16,
    stop: Arc<AtomicBool>,
}

impl TcpEcho {
    pub fn start(name: &str) -> TcpEcho {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind TCP echo backend");
        let port = listener.local_addr().expect("TCP echo address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let (thread_stop, prefix) = (stop.clone(), format!("{name}:"));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if thread_stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(mut conn) = conn {
                    let prefix = prefix.clone();
                    std::thread::spawn(move || {
                        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
                        let mut buf = [0u8; 4096];
                        while let Ok(n @ 1..) = conn.read(&mut buf) {
                            let mut out = prefix.as_bytes().to_vec();
                            out.extend_from_slice(&buf[..n]);
                            if conn.write_all(&out).is_err() {
                                return;
                            }
                        }
                    });
                }
            }
        });
        TcpEcho { port, stop }
    }
}

impl Drop for TcpEcho {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Sends `payload` over a new TCP connection to `ip:port` and returns what came back before
/// the peer closed, the answer ended with `payload` (a [`TcpEcho`] answer is complete), at
/// least `expect` bytes arrived, or 5 seconds passed (a connection refused or reset returns
/// what arrived, usually nothing).
pub fn tcp_exchange(ip: &str, port: u16, payload: &[u8], expect: usize) -> Vec<u8> {
    let Ok(mut conn) = TcpStream::connect((ip, port)) else {
        return Vec::new();
    };
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    if conn.write_all(payload).is_err() {
        return Vec::new();
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < expect && !got.ends_with(payload) {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    got
}

/// YAML for a Service `ns/name` with one port `tcp` (`svc_port`) and an EndpointSlice pointing
/// at 127.0.0.1:`port`.
pub fn tcp_service_yaml(ns: &str, name: &str, svc_port: u16, port: u16) -> String {
    format!("---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {{ports: [{{name: tcp, port: {svc_port}}}]}}\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {{name: {name}-1, namespace: {ns}, labels: {{kubernetes.io/service-name: {name}}}}}\nports: [{{name: tcp, port: {port}}}]\nendpoints: [{{addresses: [\"127.0.0.1\"]}}]\n")
}

/// The common name of the certificate HAProxy's HTTPS frontend serves for `sni` (`None`: a
/// client that sends no SNI), as `openssl s_client` sees it.
pub fn served_certificate(p: &HAProxy, sni: Option<&str>) -> String {
    let mut cmd = std::process::Command::new("openssl");
    cmd.arg("s_client")
        .arg("-connect")
        .arg(format!("{}:{}", p.ports.ip, p.ports.https));
    match sni {
        Some(name) => cmd.args(["-servername", name]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("subject="))
        .map(|s| s.replace(' ', "").trim_start_matches("CN=").to_string())
        .unwrap_or_else(|| panic!("no certificate for {sni:?}: {text}"))
}

/// What a TLS client saw: the common name of the server's certificate, and the bytes that came
/// back before the peer closed, `expect` bytes arrived, or 5 seconds passed.
#[derive(Debug, PartialEq)]
pub struct TlsExchange {
    pub common_name: String,
    pub reply: Vec<u8>,
}

/// Opens a TLS connection to `ip:port` with SNI `sni` (Python's `ssl`; the certificate is
/// verified against `ca` for that name unless `ca` is `None`), sends `payload` and reads the
/// answer, as [`tcp_exchange`] does over plain TCP. `Err`: the handshake failed (its error).
pub fn tls_exchange(
    ip: &str,
    port: u16,
    sni: &str,
    ca: Option<&Path>,
    payload: &[u8],
    expect: usize,
) -> Result<TlsExchange, String> {
    const CLIENT: &str = r#"
import socket, ssl, sys
ip, port, sni, ca, payload, expect = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5].encode(), int(sys.argv[6])
if ca:
    ctx = ssl.create_default_context(cafile=ca)
else:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
sock = socket.create_connection((ip, port), timeout=5)
try:
    tls = ctx.wrap_socket(sock, server_hostname=sni)
except Exception as e:
    print("handshake failed:", e, file=sys.stderr)
    sys.exit(2)
der = tls.getpeercert(binary_form=True)
import subprocess
pem = ssl.DER_cert_to_PEM_cert(der)
subject = subprocess.run(["openssl", "x509", "-noout", "-subject", "-nameopt", "multiline"], input=pem, capture_output=True, text=True).stdout
cn = [l.split("=", 1)[1].strip() for l in subject.splitlines() if "commonName" in l]
print(cn[0] if cn else "")
got = b""
try:
    tls.sendall(payload)
    while len(got) < expect:
        data = tls.recv(4096)
        if not data:
            break
        got += data
except (OSError, ssl.SSLError):
    pass
sys.stdout.write(got.hex())
"#;
    let ca = ca.map(|p| p.display().to_string()).unwrap_or_default();
    let payload = String::from_utf8_lossy(payload).into_owned();
    let out = Command::new("python3")
        .args(["-c", CLIENT, ip, &port.to_string(), sni, &ca, &payload])
        .arg(expect.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("run python3");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (cn, hex) = text.split_once('\n').unwrap_or((&text, ""));
    let reply = (0..hex.len() / 2)
        .filter_map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok())
        .collect();
    Ok(TlsExchange {
        common_name: cn.to_string(),
        reply,
    })
}
