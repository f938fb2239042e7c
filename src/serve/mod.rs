//! The controller's HTTP surfaces: health and debug (8080), metrics (9090), and the admission
//! webhook (9443, [`webhook`]). Debug endpoints answer loopback clients only (port-forward).

mod turns;
pub(crate) mod webhook;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tiny_http::{Header, Request, Response, Server};

use crate::controller::state::{lock, Shared};
use crate::metrics::Registry;

fn header(name: &str, value: &str) -> Header {
    // Both are ASCII literals chosen here, so the conversion cannot fail.
    Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("ASCII header")
}

fn reply(request: Request, status: u16, content_type: &str, body: String) {
    let response = Response::from_string(body)
        .with_status_code(status)
        .with_header(header("Content-Type", content_type));
    if let Err(e) = request.respond(response) {
        log::debug!("http response failed: {e}");
    }
}

fn serve(
    addr: &str,
    name: &str,
    stop: Arc<AtomicBool>,
    handle: impl Fn(Request) + Send + 'static,
) -> Result<(), String> {
    let (listener, addr) =
        haptic_agent::net::listen(addr).map_err(|e| format!("{name}: listen on {addr}: {e}"))?;
    let server = Server::from_listener(listener, None)
        .map_err(|e| format!("{name}: listen on {addr}: {e}"))?;
    log::info!("{name} listening on {addr}");
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match server.recv_timeout(Duration::from_millis(200)) {
                    Ok(Some(request)) => handle(request),
                    Ok(None) => {}
                    Err(e) => log::warn!("{e}"),
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn is_loopback(request: &Request) -> bool {
    request.remote_addr().is_some_and(from_loopback)
}

/// IPv4 clients of a dual-stack listener arrive as IPv4-mapped addresses (::ffff:127.0.0.1).
fn from_loopback(peer: &std::net::SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// `/healthz`, `/readyz` and `/debug/*`.
pub(crate) fn start_health(
    addr: &str,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    serve(addr, "health", stop, move |request| {
        let path = request
            .url()
            .split('?')
            .next()
            .unwrap_or_default()
            .to_string();
        match path.as_str() {
            "/healthz" => reply(request, 200, "text/plain", "ok\n".into()),
            "/readyz" => {
                let ready = shared.synced.load(Ordering::SeqCst) && lock(&shared.config).is_some();
                let phase = lock(&shared.phase).clone();
                if ready {
                    reply(request, 200, "text/plain", format!("ready: {phase}\n"));
                } else {
                    reply(request, 503, "text/plain", format!("not ready: {phase}\n"));
                }
            }
            p if p.starts_with("/debug/") && !is_loopback(&request) => reply(
                request,
                403,
                "text/plain",
                "debug endpoints answer loopback clients only (use kubectl port-forward)\n".into(),
            ),
            "/debug/config" => {
                let raw = lock(&shared.config)
                    .as_ref()
                    .and_then(|c| c.raw.clone())
                    .map(|d| d.to_value());
                reply(request, 200, "application/json", json(&raw))
            }
            "/debug/rendered" => {
                let cfg = lock(&shared.render).haproxy_cfg.clone().unwrap_or_default();
                reply(request, 200, "text/plain", cfg.to_string())
            }
            "/debug/pods" => {
                let pods = lock(&shared.pods).clone();
                reply(request, 200, "application/json", json(&pods))
            }
            "/debug/resources" => {
                let counts: std::collections::BTreeMap<String, usize> =
                    lock(&shared.store_counts).iter().cloned().collect();
                reply(request, 200, "application/json", json(&counts))
            }
            "/debug/errors" => {
                let render = lock(&shared.render).clone();
                reply(request, 200, "application/json", json(&render.last_error))
            }
            "/debug/events" => reply(
                request,
                200,
                "application/json",
                json(&shared.recent_events()),
            ),
            _ => reply(request, 404, "text/plain", "not found\n".into()),
        }
    })
}

/// `/metrics` in the Prometheus text format.
pub(crate) fn start_metrics(
    addr: &str,
    metrics: Registry,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    serve(addr, "metrics", stop, move |request| {
        if request.url().split('?').next() == Some("/metrics") {
            reply(
                request,
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                metrics.encode(),
            );
        } else {
            reply(request, 404, "text/plain", "not found\n".into());
        }
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_clients_of_either_family_are_loopback() {
        for (peer, loopback) in [
            ("127.0.0.1:1", true),
            ("[::1]:1", true),
            ("[::ffff:127.0.0.1]:1", true),
            ("[::ffff:10.0.0.1]:1", false),
            ("10.0.0.1:1", false),
            ("[fd00::1]:1", false),
        ] {
            assert_eq!(
                super::from_loopback(&peer.parse().unwrap()),
                loopback,
                "{peer}"
            );
        }
    }
}
