//! Connection handling and request routing: TLS handshake (with optional client certificate),
//! keep-alive request loop, authentication, fault injection, and dispatch to discovery, resource
//! handlers and the `/_dev/` control endpoints.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use serde_json::{json, Value};

use crate::api;
use crate::auth::{Auth, User};
use crate::discovery;
use crate::faults::{FaultRequest, Faults};
use crate::http::{Conn, Request};
use crate::status::ApiError;
use crate::storage::{Registration, Store};
use crate::watch::{self, Ended, WatchOptions};

/// Settings that shape behaviour rather than data.
pub struct Config {
    pub bookmark_interval: Duration,
    /// Watch duration when the client sends no `timeoutSeconds`.
    pub watch_timeout: Duration,
    /// `host:port` reported in `/api`'s serverAddressByClientCIDRs.
    pub address: String,
    /// How long a deleted namespace stays Terminating before it and its content go away.
    pub namespace_deletion_delay: Duration,
    /// Requests are authorized by the stored RBAC objects (`rbac`).
    pub rbac: bool,
}

/// Everything a request handler may use.
pub struct Ctx {
    pub store: Store,
    pub auth: Auth,
    pub faults: Faults,
    pub config: Config,
    /// Namespaces marked Terminating, to be removed (with their content) by the reaper thread.
    pub namespace_reaper: crossbeam_channel::Sender<String>,
}

/// What a handler answers.
pub enum Reply {
    Json(u16, Value),
    Watch(Box<WatchOptions>, Result<Registration, ApiError>),
}

/// How long an idle keep-alive connection is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts connections forever, one thread each.
pub fn serve(listener: TcpListener, ctx: Arc<Ctx>, tls: Option<Arc<rustls::ServerConfig>>) {
    for incoming in listener.incoming() {
        let socket = match incoming {
            Ok(s) => s,
            Err(e) => {
                log::debug!("accept failed: {e}");
                continue;
            }
        };
        let ctx = ctx.clone();
        let tls = tls.clone();
        let spawned = thread::Builder::new().name("conn".into()).spawn(move || {
            if let Err(e) = connection(socket, &ctx, tls) {
                log::debug!("connection ended: {e}");
            }
        });
        if let Err(e) = spawned {
            log::warn!("cannot spawn connection thread: {e}");
        }
    }
}

fn connection(
    socket: TcpStream,
    ctx: &Ctx,
    tls: Option<Arc<rustls::ServerConfig>>,
) -> io::Result<()> {
    let _ = socket.set_nodelay(true);
    let control = socket.try_clone()?;
    let (mut conn, client_cert) = match tls {
        None => (Conn::new(Box::new(socket), control), false),
        Some(cfg) => {
            let mut tls_conn = rustls::ServerConnection::new(cfg).map_err(io::Error::other)?;
            let mut sock = socket;
            sock.set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
            while tls_conn.is_handshaking() {
                tls_conn.complete_io(&mut sock)?;
            }
            let has_cert = tls_conn.peer_certificates().is_some_and(|c| !c.is_empty());
            (
                Conn::new(Box::new(rustls::StreamOwned::new(tls_conn, sock)), control),
                has_cert,
            )
        }
    };
    conn.socket().set_read_timeout(Some(IDLE_TIMEOUT))?;
    while let Some(req) = conn.read_request()? {
        let close = req.wants_close();
        if !respond(&mut conn, ctx, &req, client_cert)? || close {
            break;
        }
    }
    Ok(())
}

/// The API server's limit on a request body (`3 * 1024 * 1024`, twice etcd's object limit,
/// because JSON is larger than the protobuf stored).
const MAX_REQUEST_BODY: usize = 3 << 20;

fn write_json(conn: &mut Conn, code: u16, body: &Value) -> io::Result<()> {
    let bytes = serde_json::to_vec(body).map_err(io::Error::other)?;
    let warnings = crate::admission::take_warning_headers();
    let headers: Vec<(&str, String)> = warnings.iter().map(|(k, v)| (*k, v.clone())).collect();
    conn.write_response(code, "application/json", &headers, &bytes)
}

fn write_error(conn: &mut Conn, err: &ApiError) -> io::Result<()> {
    write_json(conn, err.code, &err.to_status())
}

/// Answers one request. Returns whether the connection may serve another.
fn respond(conn: &mut Conn, ctx: &Ctx, req: &Request, client_cert: bool) -> io::Result<bool> {
    let path = req.path.as_str();
    log::debug!("request method={} path={path}", req.method);
    // Warnings belong to one request: none are left from the connection's last one.
    crate::admission::take_warning_headers();
    if let Some(control) = path.strip_prefix("/_dev/") {
        return match control_endpoint(ctx, req, control) {
            Ok(v) => write_json(conn, 200, &v).map(|_| true),
            Err(e) => write_error(conn, &e).map(|_| true),
        };
    }
    match path {
        "/healthz" | "/livez" | "/readyz" => {
            return conn
                .write_response(200, "text/plain", &[], b"ok")
                .map(|_| true)
        }
        "/version" => return write_json(conn, 200, &version()).map(|_| true),
        _ => {}
    }
    let Some(user) = ctx
        .auth
        .authenticate(req.header("authorization"), client_cert)
    else {
        return write_error(conn, &ApiError::unauthorized()).map(|_| true);
    };
    if let Some(err) = ctx.faults.before_request(path) {
        return write_error(conn, &err).map(|_| true);
    }
    if path.starts_with("/openapi/") {
        // Not served; kubectl works with --validate=false and falls back to built-in types.
        return conn
            .write_response(404, "text/plain", &[], b"404 page not found\n")
            .map(|_| true);
    }
    if let Some(doc) = discovery::document(&ctx.store.registry(), path, &ctx.config.address) {
        return write_json(conn, 200, &doc).map(|_| true);
    }
    if path == "/" {
        return write_json(
            conn,
            200,
            &json!({"paths": ["/api", "/api/v1", "/apis", "/healthz", "/version"]}),
        )
        .map(|_| true);
    }
    if !(path.starts_with("/api/") || path.starts_with("/apis/")) {
        return conn
            .write_response(404, "text/plain", &[], b"404 page not found\n")
            .map(|_| true);
    }
    if req.body.len() > MAX_REQUEST_BODY {
        let e = ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {MAX_REQUEST_BODY}"),
        );
        return write_error(conn, &e).map(|_| true);
    }
    match api::handle(ctx, req, &user) {
        Ok(Reply::Json(code, body)) => write_json(conn, code, &body).map(|_| true),
        Ok(Reply::Watch(_, Err(e))) if e.code == 410 => watch::send_error(conn, &e).map(|_| true),
        Ok(Reply::Watch(_, Err(e))) => write_error(conn, &e).map(|_| true),
        Ok(Reply::Watch(mut opts, Ok(reg))) => {
            watch::serve(conn, ctx, &mut opts, reg).map(|ended| matches!(ended, Ended::Clean))
        }
        Err(e) => {
            if e.code >= 500 {
                log::info!("request failed method={} path={path} error={e}", req.method);
            }
            write_error(conn, &e).map(|_| true)
        }
    }
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "31", "gitVersion": "v1.31.0-haptic-dev",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.22.0", "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/_dev/faults`, `/_dev/tokens`, `/_dev/state`.
fn control_endpoint(ctx: &Ctx, req: &Request, which: &str) -> Result<Value, ApiError> {
    let body = || -> Result<Value, ApiError> {
        if req.body.is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(&req.body)
            .map_err(|e| ApiError::bad_request(format!("control request: {e}")))
    };
    match (req.method.as_str(), which) {
        ("GET", "state") => Ok(state(ctx)),
        ("GET", "faults") => Ok(ctx.faults.describe()),
        ("DELETE", "faults") => {
            ctx.faults
                .apply(&FaultRequest {
                    reset: true,
                    ..Default::default()
                })
                .map_err(ApiError::bad_request)?;
            Ok(ctx.faults.describe())
        }
        ("POST", "faults") => {
            let fr: FaultRequest = serde_json::from_value(body()?)
                .map_err(|e| ApiError::bad_request(format!("fault request: {e}")))?;
            ctx.faults.apply(&fr).map_err(ApiError::bad_request)?;
            let mut out = ctx.faults.describe();
            if fr.compact {
                out["compactedResourceVersion"] = json!(ctx.store.compact().to_string());
            }
            let close = match &fr.close_watches {
                None | Some(Value::Bool(false)) => None,
                Some(Value::Bool(true)) => Some(false),
                Some(Value::String(s)) if s == "clean" => Some(false),
                Some(Value::String(s)) if s == "abrupt" => Some(true),
                Some(other) => {
                    return Err(ApiError::bad_request(format!(
                        "closeWatches must be true, \"clean\" or \"abrupt\", not {other}"
                    )))
                }
            };
            if let Some(abrupt) = close {
                out["closedWatches"] = json!(ctx.store.close_watches(abrupt));
            }
            log::info!("faults applied {}", String::from_utf8_lossy(&req.body));
            Ok(out)
        }
        ("POST", "tokens") => ctx.auth.control(&body()?).map_err(ApiError::bad_request),
        _ => Err(ApiError::new(
            404,
            "NotFound",
            format!("no control endpoint {} /_dev/{which}", req.method),
        )),
    }
}

fn state(ctx: &Ctx) -> Value {
    json!({
        "resourceVersion": ctx.store.current_rv().to_string(),
        "compactedResourceVersion": ctx.store.compacted_rv().to_string(),
        "watches": ctx.store.watch_count(),
    })
}

/// Removes namespaces once their deletion delay has passed, like Kubernetes' namespace
/// controller does asynchronously: until then the namespace is `Terminating`, its objects can
/// still be read and deleted, and new ones are refused.
pub fn reap_namespaces(ctx: Arc<Ctx>, names: crossbeam_channel::Receiver<String>) {
    for name in names {
        // The delay models the namespace controller's asynchronous work; it is not a
        // synchronisation device.
        thread::sleep(ctx.config.namespace_deletion_delay);
        while let Some(ns) = ctx.store.get("namespaces", "", &name) {
            if ns["metadata"]["deletionTimestamp"].is_null() {
                break;
            }
            let rv = crate::storage::object_rv(&ns);
            match ctx.store.commit(
                "namespaces",
                "",
                &name,
                crate::storage::Expect::Version(rv),
                None,
            ) {
                Err(crate::storage::CommitError::Conflict) => continue,
                _ => {
                    log::info!("namespace removed name={name}");
                    break;
                }
            }
        }
    }
}

/// The user the `--load` seeding runs as.
pub fn system_user() -> User {
    User {
        name: "system:haptic-dev-apiserver".into(),
        groups: vec!["system:masters".into()],
    }
}
