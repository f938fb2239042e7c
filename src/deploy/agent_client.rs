//! The controller's client for `haptic-agent`: HTTPS with mutual TLS to a pod IP, verifying the
//! agent's certificate for a fixed DNS name (default `haptic-agent`). The client certificate
//! and CA are re-read when their files change (Secret rotation).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use haptic_agent::reload::Reloading;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

/// Largest agent response read.
const MAX_RESPONSE: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone)]
pub(crate) struct AgentTls {
    pub dir: PathBuf,
    pub server_name: String,
}

/// How the controller reaches agents.
#[derive(Debug, Clone)]
pub(crate) enum Transport {
    /// HTTPS with mutual TLS (the default).
    Tls(AgentTls),
    /// Plain HTTP with the credentials Secret's `username` and `password` (files in `dir`);
    /// only for the agents' explicit `--insecure-http-with-basic-auth` mode.
    BasicAuth { dir: PathBuf },
}

pub(crate) struct AgentClient {
    transport: Transport,
    /// The agents' port and the per-call timeout (config settings that change live).
    endpoint: Mutex<(u16, Duration)>,
    /// The TLS client configuration, rebuilt when the mounted files change.
    cached: Reloading<Arc<ClientConfig>>,
}

/// An agent's answer.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Reply {
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl AgentClient {
    pub(crate) fn new(transport: Transport, port: u16, timeout: Duration) -> AgentClient {
        AgentClient {
            endpoint: Mutex::new((port, timeout)),
            cached: Reloading::new(match &transport {
                Transport::Tls(tls) => ["tls.crt", "tls.key", "ca.crt"]
                    .map(|f| tls.dir.join(f))
                    .to_vec(),
                Transport::BasicAuth { .. } => Vec::new(),
            }),
            transport,
        }
    }

    /// Sets the agents' port and the per-call timeout; whether the port changed.
    pub(crate) fn set_endpoint(&self, port: u16, timeout: Duration) -> bool {
        let mut endpoint = crate::lock(&self.endpoint);
        let moved = endpoint.0 != port;
        *endpoint = (port, timeout);
        moved
    }

    fn config(&self, tls: &AgentTls) -> Result<Arc<ClientConfig>, String> {
        self.cached.get(|_| Self::build(tls).map(Arc::new))
    }

    fn build(tls: &AgentTls) -> Result<ClientConfig, String> {
        let [cert, key, ca] = ["tls.crt", "tls.key", "ca.crt"].map(|f| tls.dir.join(f));
        let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("read {}: {e}", p.display()));
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(&read(&ca)?) {
            roots
                .add(c.map_err(|e| format!("{}: {e}", ca.display()))?)
                .map_err(|e| format!("{}: {e}", ca.display()))?;
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(&cert)?)
            .collect::<Result<_, _>>()
            .map_err(|e| format!("{}: {e}", cert.display()))?;
        let key = PrivateKeyDer::from_pem_slice(&read(&key)?)
            .map_err(|e| format!("{}: {e}", key.display()))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| format!("client certificate: {e}"))
    }

    /// One request to the agent at `ip`; `headers` are extra request headers.
    pub(crate) fn request(
        &self,
        ip: &str,
        method: &str,
        path: &str,
        headers: &[(&str, String)],
        body: Option<&[u8]>,
    ) -> Result<Reply, String> {
        let ip: std::net::IpAddr = ip.parse().map_err(|_| format!("bad pod IP {ip:?}"))?;
        let (port, timeout) = *crate::lock(&self.endpoint);
        let addr = SocketAddr::new(ip, port);
        let tcp = TcpStream::connect_timeout(&addr, timeout.min(Duration::from_secs(5)))
            .map_err(|e| format!("connect {addr}: {e}"))?;
        // The head and the body go out as separate writes (TLS records): without this,
        // Nagle's algorithm could hold the body for the agent's delayed ACK.
        tcp.set_nodelay(true).map_err(|e| e.to_string())?;
        let timed = Timed::new(tcp, timeout);
        let context = |e: String| format!("{method} {path} to {addr}: {e}");
        match &self.transport {
            Transport::Tls(tls) => {
                let config = self.config(tls)?;
                let name = ServerName::try_from(tls.server_name.clone())
                    .map_err(|e| format!("server name {}: {e}", tls.server_name))?;
                let conn = ClientConnection::new(config, name).map_err(|e| e.to_string())?;
                // Under TLS: every socket read and write of a record or the handshake counts.
                let mut stream = StreamOwned::new(conn, timed);
                exchange(&mut stream, &tls.server_name, method, path, headers, body)
                    .map_err(context)
            }
            Transport::BasicAuth { dir } => {
                let read = |f: &str| {
                    std::fs::read_to_string(dir.join(f))
                        .map(|s| s.trim().to_string())
                        .map_err(|e| format!("read {}: {e}", dir.join(f).display()))
                };
                let credentials = haptic_agent::base64::encode(
                    format!("{}:{}", read("username")?, read("password")?).as_bytes(),
                );
                let mut all: Vec<(&str, String)> = headers.to_vec();
                all.push(("Authorization", format!("Basic {credentials}")));
                let mut stream = timed;
                // An IPv6 pod address is bracketed in Host (RFC 9110, as in a URL).
                let host = match ip {
                    std::net::IpAddr::V6(v6) => format!("[{v6}]"),
                    v4 => v4.to_string(),
                };
                exchange(&mut stream, &host, method, path, &all, body).map_err(context)
            }
        }
    }
}

/// A socket whose reads and writes end by a deadline: `deploymentTimeout` to send the request
/// (the TLS handshake included), then `deploymentTimeout` for the answer (the agent checks and
/// reloads meanwhile). A socket timeout per read or write alone would let an agent that
/// trickles its bytes keep the call, and its pod, busy for as long as it likes.
struct Timed {
    sock: TcpStream,
    deadline: Instant,
    timeout: Duration,
    answering: bool,
}

impl Timed {
    fn new(sock: TcpStream, timeout: Duration) -> Timed {
        Timed {
            sock,
            deadline: Instant::now() + timeout,
            timeout,
            answering: false,
        }
    }

    /// Gives the next socket operation the time left.
    fn arm(&self) -> std::io::Result<()> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(self.late());
        }
        self.sock.set_read_timeout(Some(left))?;
        self.sock.set_write_timeout(Some(left))
    }

    fn late(&self) -> std::io::Error {
        let what = if self.answering {
            "no complete answer"
        } else {
            "the request was not sent"
        };
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "{what} within deploymentTimeout ({} s)",
                self.timeout.as_secs_f64()
            ),
        )
    }

    /// A socket timeout (WouldBlock on Linux) is the deadline.
    fn checked<T>(&self, r: std::io::Result<T>) -> std::io::Result<T> {
        r.map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => self.late(),
            _ => e,
        })
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.arm()?;
        let r = self.sock.read(buf);
        self.checked(r)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.arm()?;
        let r = self.sock.write(buf);
        self.checked(r)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.sock.flush()
    }
}

/// A stream whose answer gets a deadline of its own once the request is sent.
trait Answering {
    fn await_answer(&mut self);
}

impl Answering for Timed {
    fn await_answer(&mut self) {
        self.deadline = Instant::now() + self.timeout;
        self.answering = true;
    }
}

impl Answering for StreamOwned<ClientConnection, Timed> {
    fn await_answer(&mut self) {
        self.sock.await_answer();
    }
}

/// Writes one request and reads the whole response (the agent closes after answering).
fn exchange<S: Read + Write + Answering>(
    stream: &mut S,
    host: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: Option<&[u8]>,
) -> Result<Reply, String> {
    let body = body.unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        head.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.write_all(body))
        .and_then(|_| stream.flush())
        .map_err(|e| e.to_string())?;
    stream.await_answer();
    let mut raw = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match stream.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                raw.extend_from_slice(&chunk[..n]);
                if raw.len() > MAX_RESPONSE {
                    return Err(format!("response over {MAX_RESPONSE} bytes"));
                }
                if response_complete(&raw) {
                    break;
                }
            }
            // A peer that closes without close_notify after a complete response is fine.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && response_complete(&raw) => {
                break
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    parse_response(&raw).ok_or_else(|| "malformed HTTP response".to_string())
}

fn split_head(raw: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    Some((&raw[..end], &raw[end + 4..]))
}

fn content_length(head: &[u8]) -> Option<usize> {
    String::from_utf8_lossy(head).lines().find_map(|l| {
        l.split_once(':')
            .filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.trim().parse().ok())
    })
}

fn response_complete(raw: &[u8]) -> bool {
    match split_head(raw) {
        Some((head, body)) => content_length(head).is_some_and(|n| body.len() >= n),
        None => false,
    }
}

fn parse_response(raw: &[u8]) -> Option<Reply> {
    let (head, body) = split_head(raw)?;
    let status_line = String::from_utf8_lossy(head).lines().next()?.to_string();
    let status: u16 = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let body = match content_length(head) {
        Some(n) => body.get(..n)?.to_vec(),
        None => body.to_vec(),
    };
    Some(Reply { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_responses() {
        let raw = b"HTTP/1.1 409 Conflict\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\n{\"a\":1}";
        assert!(response_complete(raw));
        let reply = parse_response(raw).unwrap();
        assert_eq!(reply.status, 409);
        assert_eq!(reply.body, b"{\"a\":");
        assert!(!response_complete(
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"
        ));
        assert!(parse_response(b"garbage").is_none());
    }

    /// Calls a peer on loopback that sends `first`, then `each` every 200 ms (for at most
    /// 30 s, so that a regression fails the test instead of hanging it), through `transport`
    /// with a 1 s `deploymentTimeout`: the call's answer and how long it took.
    fn call_a_trickling_peer(
        transport: Transport,
        first: &'static [u8],
        each: &'static [u8],
    ) -> (Result<Reply, String>, Duration) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let server = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut stream, _) = listener.accept().unwrap();
                let _ = stream.write_all(first);
                for _ in 0..150 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed)
                        || stream.write_all(each).is_err()
                    {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        let client = AgentClient::new(transport, port, Duration::from_secs(1));
        let started = Instant::now();
        let answer = client.request("127.0.0.1", "GET", "/v1/state", &[], None);
        let took = started.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        server.join().unwrap();
        (answer, took)
    }

    /// An agent that trickles its answer (a byte every 200 ms, forever) does not hold the call
    /// past `deploymentTimeout`: each read alone would wait less than the timeout.
    #[test]
    fn a_trickling_agent_does_not_hold_a_call_past_its_timeout() {
        let dir =
            std::env::temp_dir().join(format!("haptic-agent-client-slow-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("username"), "haptic\n").unwrap();
        std::fs::write(dir.join("password"), "pw\n").unwrap();
        let (answer, took) = call_a_trickling_peer(
            Transport::BasicAuth { dir: dir.clone() },
            b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n",
            b"x",
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let error = answer.expect_err("the trickle never completes");
        assert!(
            error.contains("no complete answer within deploymentTimeout (1 s)"),
            "{error}"
        );
        // Without the deadline the call lasts as long as the trickle (30 s).
        assert!(took < Duration::from_secs(15), "{took:?}");
    }

    /// The same over mutual TLS, trickling inside the handshake: the deadline holds for every
    /// socket read under the TLS layer, not once per record.
    #[test]
    fn a_peer_trickling_a_tls_handshake_does_not_hold_a_call_past_its_timeout() {
        let dir =
            std::env::temp_dir().join(format!("haptic-agent-client-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let status = std::process::Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec"])
            .args([
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-days",
                "1",
            ])
            .args(["-subj", "/CN=haptic-controller"])
            .arg("-keyout")
            .arg(dir.join("tls.key"))
            .arg("-out")
            .arg(dir.join("tls.crt"))
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl (scripts/test.sh installs it)");
        assert!(status.success());
        std::fs::copy(dir.join("tls.crt"), dir.join("ca.crt")).unwrap();
        let tls = AgentTls {
            dir: dir.clone(),
            server_name: "haptic-agent".into(),
        };
        // A handshake record header announcing 16 kB, then its bytes one by one.
        let (answer, took) =
            call_a_trickling_peer(Transport::Tls(tls), b"\x16\x03\x03\x40\x00", b"\x00");
        std::fs::remove_dir_all(&dir).unwrap();
        let error = answer.expect_err("the handshake never completes");
        assert!(
            error.contains("the request was not sent within deploymentTimeout (1 s)"),
            "{error}"
        );
        // Without the deadline under TLS the call lasts as long as the trickle (30 s).
        assert!(took < Duration::from_secs(15), "{took:?}");
    }

    /// An agent at an IPv6 pod address (IPv6-only clusters): reached, with a bracketed Host.
    #[test]
    fn reaches_an_agent_at_an_ipv6_address() {
        use std::io::{BufRead, BufReader};
        let dir =
            std::env::temp_dir().join(format!("haptic-agent-client-v6-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("username"), "haptic\n").unwrap();
        std::fs::write(dir.join("password"), "pw\n").unwrap();
        let listener = std::net::TcpListener::bind("[::1]:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = Vec::new();
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if line == "\r\n" || line.is_empty() {
                    break;
                }
                head.push(line.trim_end().to_string());
            }
            let mut stream = stream;
            stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
                .unwrap();
            head
        });
        let client = AgentClient::new(
            Transport::BasicAuth { dir: dir.clone() },
            port,
            Duration::from_secs(5),
        );
        let reply = client
            .request("::1", "GET", "/v1/state", &[], None)
            .unwrap();
        assert_eq!((reply.status, reply.text().as_str()), (200, "{}"));
        let head = server.join().unwrap();
        assert_eq!(head[0], "GET /v1/state HTTP/1.1");
        assert!(head.contains(&"Host: [::1]".to_string()), "{head:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
