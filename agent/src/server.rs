//! The agent's listeners: the API (mutual TLS, or the explicit legacy plain-HTTP mode with basic
//! auth) and the plain probe port. One thread per connection, bounded overall and per peer
//! address ([`ConnectionGate`], shared with the controller's webhook); one request per connection; a short deadline for the TLS
//! handshake (peers without a certificate cannot hold connections open), read and write
//! timeouts on the socket and a deadline for the whole request.

use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::{ServerConnection, StreamOwned};

use crate::accept::{complete_handshake, ConnectionGate};
use crate::apply::{Agent, ApplyRequest};
use crate::http::{self, Deadline, Head, Limits, OverTcp, ReadError, Response};
use crate::protocol::{api, Bundle, WireBundle};
use crate::reload::Reloading;
use crate::tls::ReloadingTls;

/// Username and password of the legacy plain-HTTP mode.
#[derive(Clone)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

/// Credentials that follow their files: a mounted Secret (a directory with `username` and
/// `password`) or a `username:password` file, re-read when it changes, as the controller
/// re-reads its own copy; a change that cannot be read keeps the previous credentials.
pub struct CredentialFiles {
    path: PathBuf,
    current: Reloading<Arc<Credentials>>,
}

impl CredentialFiles {
    pub fn new(path: PathBuf) -> Result<CredentialFiles, String> {
        let paths = if path.is_dir() {
            vec![path.join("username"), path.join("password")]
        } else {
            vec![path.clone()]
        };
        let files = CredentialFiles {
            current: Reloading::new(paths),
            path,
        };
        files.current.get(|_| read_credentials(&files.path))?;
        Ok(files)
    }

    pub fn current(&self) -> Arc<Credentials> {
        self.current
            .get(|_| {
                let creds = read_credentials(&self.path)?;
                log::info!("reloaded credentials from {}", self.path.display());
                Ok(creds)
            })
            .expect("CredentialFiles::new read them once")
    }
}

fn read_credentials(path: &Path) -> Result<Arc<Credentials>, String> {
    let read =
        |p: PathBuf| std::fs::read_to_string(&p).map_err(|e| format!("read {}: {e}", p.display()));
    let (username, password) = if path.is_dir() {
        // A mounted Secret: one file per key.
        (
            read(path.join("username"))?.trim().to_string(),
            read(path.join("password"))?.trim().to_string(),
        )
    } else {
        let text = read(path.to_path_buf())?;
        let (u, p) = text
            .trim()
            .split_once(':')
            .ok_or_else(|| format!("{}: expected username:password", path.display()))?;
        (u.to_string(), p.to_string())
    };
    if username.is_empty() || password.is_empty() {
        return Err(format!("{}: empty username or password", path.display()));
    }
    Ok(Arc::new(Credentials { username, password }))
}

/// How API clients prove who they are.
#[derive(Clone)]
pub enum Transport {
    /// HTTPS; the client certificate must chain to the configured CA.
    MutualTls(Arc<ReloadingTls>),
    /// Plain HTTP with `Authorization: Basic` (only when explicitly enabled).
    InsecureBasicAuth(Arc<CredentialFiles>),
}

/// Connection handling limits.
#[derive(Debug, Clone, Copy)]
pub struct ServerLimits {
    pub http: Limits,
    /// Per socket read/write.
    pub io_timeout: Duration,
    /// For reading a whole request.
    pub request_timeout: Duration,
    /// For completing the TLS handshake (until then the peer is unauthenticated).
    pub handshake_timeout: Duration,
    pub max_connections: usize,
    /// Connections open at once from one peer address.
    pub max_per_peer: usize,
}

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            http: Limits::default(),
            io_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(3),
            max_connections: 128,
            max_per_peer: 8,
        }
    }
}

/// Accepts API connections forever (run it on its own thread).
pub fn serve_api(
    agent: Arc<Agent>,
    listener: TcpListener,
    transport: Transport,
    limits: ServerLimits,
) {
    serve(listener, limits, move |stream| match &transport {
        Transport::MutualTls(tls) => serve_tls(&agent, stream, tls, &limits),
        Transport::InsecureBasicAuth(creds) => {
            let mut reader = BufReader::new(within_request_timeout(stream, &limits));
            // The credentials are checked on the head: the body of a caller that has none is
            // never read (up to --max-body-bytes per connection, for anyone who can connect).
            let admit = |head: &Head| {
                (!authorized(head, &creds.current())).then(|| {
                    Response::error(401, "unauthorized", "basic credentials missing or wrong")
                        .with_header("WWW-Authenticate", "Basic realm=\"haptic-agent\"")
                })
            };
            handle(&mut reader, &limits, admit, |head, body| {
                route_api(&agent, head, body)
            })
        }
    });
}

/// Accepts probe connections forever: `/healthz` and `/readyz` over plain HTTP.
pub fn serve_probes(agent: Arc<Agent>, listener: TcpListener, limits: ServerLimits) {
    let probe_limits = ServerLimits {
        http: Limits {
            max_body_bytes: 0,
            ..limits.http
        },
        ..limits
    };
    serve(listener, probe_limits, move |stream| {
        let mut reader = BufReader::new(within_request_timeout(stream, &probe_limits));
        handle(
            &mut reader,
            &probe_limits,
            |_| None,
            |head, _| match (head.method.as_str(), head.path.as_str()) {
                ("GET", "/healthz") => Response::text(200, "ok\n"),
                ("GET", "/readyz") => match agent.ready() {
                    Ok(()) => Response::text(200, "ready\n"),
                    Err(e) => Response::text(503, format!("not ready: {e}\n")),
                },
                _ => Response::error(
                    404,
                    "not_found",
                    format!("no {} {}", head.method, head.path),
                ),
            },
        )
    });
}

fn serve(
    listener: TcpListener,
    limits: ServerLimits,
    handler: impl Fn(TcpStream) + Send + Sync + 'static,
) {
    let handler = Arc::new(handler);
    let gate = ConnectionGate::new(limits.max_connections, limits.max_per_peer);
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                log::warn!("accept failed: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        let Ok(peer) = stream.peer_addr() else {
            continue;
        };
        // IPv4 peers of a dual-stack listener arrive IPv4-mapped: one address per peer.
        let admitted = match gate.admit(peer.ip().to_canonical()) {
            Ok(a) => a,
            Err(why) => {
                log::debug!("refusing connection peer={peer}: {why}");
                continue;
            }
        };
        let _ = stream.set_read_timeout(Some(limits.io_timeout));
        let _ = stream.set_write_timeout(Some(limits.io_timeout));
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let spawned = std::thread::Builder::new()
            .name("agent-conn".into())
            .spawn(move || {
                handler(stream);
                drop(admitted);
            });
        if let Err(e) = spawned {
            log::error!("cannot start a connection thread: {e}");
        }
    }
}

fn serve_tls(agent: &Arc<Agent>, stream: TcpStream, tls: &ReloadingTls, limits: &ServerLimits) {
    let peer = stream.peer_addr().ok();
    let conn = match ServerConnection::new(tls.config()) {
        Ok(c) => c,
        Err(e) => {
            log::error!("TLS session setup failed: {e}");
            return;
        }
    };
    let mut tls_stream = StreamOwned::new(conn, stream);
    // Finish the handshake first so refused clients are logged as such (and get their alert).
    let deadline = Instant::now() + limits.handshake_timeout;
    if let Err(e) = complete_handshake(
        &mut tls_stream.conn,
        &mut tls_stream.sock,
        deadline,
        limits.io_timeout,
    ) {
        log::info!("TLS handshake refused peer={peer:?}: {e}");
        return;
    }
    let mut reader = BufReader::new(within_request_timeout(tls_stream, limits));
    handle(
        &mut reader,
        limits,
        |_| None,
        |head, body| route_api(agent, head, body),
    );
    let stream = &mut reader.get_mut().inner;
    stream.conn.send_close_notify();
    let _ = stream.conn.complete_io(&mut stream.sock);
}

/// The whole request (head and body) is read within `request_timeout`, however it trickles in.
fn within_request_timeout<S: OverTcp>(stream: S, limits: &ServerLimits) -> Deadline<S> {
    Deadline::new(
        stream,
        Instant::now() + limits.request_timeout,
        limits.io_timeout,
    )
}

/// Reads one request, answers it with `route`, and closes. `refuse` sees the head first: a
/// response from it is sent without reading the body.
fn handle<S: Read + Write>(
    reader: &mut BufReader<S>,
    limits: &ServerLimits,
    refuse: impl FnOnce(&Head) -> Option<Response>,
    route: impl FnOnce(&Head, Vec<u8>) -> Response,
) {
    let deadline = Instant::now() + limits.request_timeout;
    let response = match read_request(reader, limits, deadline, refuse) {
        Ok(Ok((head, body))) => route(&head, body),
        Ok(Err((refused, announced))) => {
            let _ = http::write_response(reader.get_mut(), &refused);
            // Drop a little of what the client may still be sending, so that it reads the
            // answer rather than a reset connection; not more (it is not authenticated).
            let _ = std::io::copy(
                &mut reader.take(announced.min(1 << 20) as u64),
                &mut std::io::sink(),
            );
            return;
        }
        Err(ReadError::Closed) => return,
        Err(ReadError::Io(e)) => {
            log::debug!("reading request failed: {e}");
            return;
        }
        Err(ReadError::Malformed(m)) => Response::error(400, "bad_request", m),
        Err(ReadError::HeadTooLarge) => Response::error(
            431,
            "head_too_large",
            format!(
                "request line and headers exceed {} bytes or {} headers",
                limits.http.max_head_bytes, limits.http.max_headers
            ),
        ),
        Err(ReadError::LengthRequired) => Response::error(
            411,
            "length_required",
            "send the body with Content-Length (chunked uploads are not accepted)",
        ),
        Err(ReadError::BodyTooLarge(n)) => {
            let resp = Response::error(
                413,
                "body_too_large",
                format!(
                    "body of {n} bytes exceeds the limit of {} bytes",
                    limits.http.max_body_bytes
                ),
            );
            let _ = http::write_response(reader.get_mut(), &resp);
            // Read (and drop) a bounded amount of what the client is still sending, so it sees
            // the answer instead of a reset connection.
            let _ = std::io::copy(
                &mut reader
                    .take(n.min(limits.http.max_body_bytes.saturating_mul(2).max(1 << 20)) as u64),
                &mut std::io::sink(),
            );
            return;
        }
    };
    if let Err(e) = http::write_response(reader.get_mut(), &response) {
        log::debug!("writing response failed: {e}");
    }
}

/// One request, or `refuse`'s answer to its head with the body length it announced.
#[allow(clippy::type_complexity)]
fn read_request<S: Read + Write>(
    reader: &mut BufReader<S>,
    limits: &ServerLimits,
    deadline: Instant,
    refuse: impl FnOnce(&Head) -> Option<Response>,
) -> Result<Result<(Head, Vec<u8>), (Response, usize)>, ReadError> {
    let head = http::read_head(reader, &limits.http)?;
    if let Some(refused) = refuse(&head) {
        let announced = http::body_length(&head, &limits.http).unwrap_or(0);
        return Ok(Err((refused, announced)));
    }
    let len = http::body_length(&head, &limits.http)?;
    if len > 0
        && head
            .header("expect")
            .is_some_and(|v| v.eq_ignore_ascii_case("100-continue"))
    {
        http::write_continue(reader.get_mut())?;
    }
    let body = http::read_body(reader, len, deadline)?;
    Ok(Ok((head, body)))
}

fn authorized(head: &Head, creds: &Credentials) -> bool {
    let Some(encoded) = head
        .header("authorization")
        .and_then(|v| v.strip_prefix("Basic "))
    else {
        return false;
    };
    let Ok(decoded) = crate::base64::decode(encoded.trim()) else {
        return false;
    };
    let expected = format!("{}:{}", creds.username, creds.password);
    constant_time_eq(&decoded, expected.as_bytes())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The API routes.
fn route_api(agent: &Agent, head: &Head, body: Vec<u8>) -> Response {
    match (head.method.as_str(), head.path.as_str()) {
        ("GET", api::STATE) => Response::json(200, &agent.state()),
        ("GET", "/v1/config") => match agent.applied_config() {
            Ok((text, bundle)) => {
                let resp = Response::text(200, text);
                match bundle {
                    Some(b) => resp.with_header("X-Haptic-Bundle", b),
                    None => resp,
                }
            }
            Err(e) => Response::error(500, "internal", e),
        },
        ("PUT", api::BUNDLE) => put_bundle(agent, head, body),
        ("POST", "/v1/reload") => match agent.force_reload() {
            Ok(r) => Response::json(200, &r),
            Err(e) => Response::json(e.status, &e.body),
        },
        (_, api::STATE | api::CONFIG | api::BUNDLE | api::RELOAD) => Response::error(
            405,
            "method_not_allowed",
            format!("{} is not allowed on {}", head.method, head.path),
        ),
        _ => Response::error(
            404,
            "not_found",
            format!("no {} {}", head.method, head.path),
        ),
    }
}

fn put_bundle(agent: &Agent, head: &Head, body: Vec<u8>) -> Response {
    let wire: WireBundle = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => return Response::error(400, "bad_bundle", format!("body is not a bundle: {e}")),
    };
    // Not held through the apply: the bundle has its content now.
    drop(body);
    let bundle = match Bundle::from_wire(wire) {
        Ok(b) => b,
        Err(e) => return Response::error(400, "bad_bundle", e.to_string()),
    };
    let epoch = match head.header(api::EPOCH).map(|v| v.trim().parse::<u64>()) {
        None => None,
        Some(Ok(e)) => Some(e),
        Some(Err(_)) => {
            return Response::error(
                400,
                "bad_epoch",
                "X-Haptic-Epoch must be a non-negative integer",
            )
        }
    };
    let dry_run = head
        .query_param("dry_run")
        .is_some_and(|v| matches!(v, "1" | "true" | ""));
    let req = ApplyRequest {
        bundle: Arc::new(bundle),
        if_match: head.header(api::IF_MATCH).map(str::to_string),
        epoch,
        checked_with: head.header(api::CHECKED_WITH).map(|v| v.trim().to_string()),
        dry_run,
    };
    match agent.apply(req) {
        Ok(r) => Response::json(200, &r),
        Err(e) => Response::json(e.status, &e.body),
    }
}
