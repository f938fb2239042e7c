//! The validating admission webhook: an AdmissionReview v1 over TLS is answered by rendering
//! the config with the object applied to a copy of the stores and checking the result with
//! `haproxy -c`. HAProxyTemplateConfig objects are checked as far as compiling their templates:
//! never rendered, never given to `haproxy -c` (see `decide`). The certificate is re-read when
//! its files change.

use std::io::BufReader;
use std::net::{IpAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use haptic_agent::reload::Reloading;

use haptic_agent::accept::{complete_handshake, Admitted, ConnectionGate};
use haptic_agent::http::{self, Limits, Response};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ServerConfig, ServerConnection, StreamOwned};
use serde_json::{json, Value};

use crate::controller::state::{lock, Shared};
use crate::controller::watchers::Watchers;
use crate::render::{RenderCache, RenderInputs};
use crate::store::{object_key, ObjectFilter};
use crate::validate::haproxy::check_bundle;
use crate::validate::isolate::{render_validated, Failure};
use haptic_agent::classify::classify;
use haptic_agent::protocol::Bundle;
use std::collections::BTreeSet;

/// The webhook's serving certificate, and the CA of the client certificate it requires when
/// one is given, re-read when their files change.
struct Tls {
    current: Reloading<Arc<ServerConfig>>,
}

impl Tls {
    fn config(&self) -> Result<Arc<ServerConfig>, String> {
        self.current
            .get(|paths| build(&paths[0], &paths[1], paths.get(2).map(PathBuf::as_path)))
    }
}

fn build(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Arc<ServerConfig>, String> {
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("read {}: {e}", p.display()));
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert)?)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&read(key)?)
        .map_err(|e| format!("{}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        // Only a peer with a certificate from this CA (the API server's, configured with its
        // AdmissionConfiguration) gets past the handshake.
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&read(ca)?) {
                let cert = cert.map_err(|e| format!("{}: {e}", ca.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("{}: {e}", ca.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("{}: no certificate", ca.display()));
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| format!("webhook client CA {}: {e}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("webhook certificate: {e}"))?;
    Ok(Arc::new(config))
}

struct Webhook {
    shared: Arc<Shared>,
    watchers: Arc<Mutex<Watchers>>,
    haproxy_bin: String,
    /// Render units memoized across admission requests: admitting one object costs that
    /// object's units plus the check, not a render of the whole cluster.
    cache: Mutex<RenderCache>,
    /// Reviews of watched objects render one at a time, peers in rotation.
    turns: super::turns::Turns,
    /// Bytes of request bodies held at once, overall and by peer.
    budget: Arc<ConnectionGate>,
}

/// Connections served at once, and from one peer address.
const MAX_CONNECTIONS: usize = 64;
const MAX_PER_PEER: usize = 16;
/// A peer must finish the TLS handshake within this (the API server does in milliseconds).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
const IO_TIMEOUT: Duration = Duration::from_secs(15);
/// The longest the request's head, and then its body, may take to arrive.
const REQUEST_PART_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest an API server waits for a webhook (`timeoutSeconds` is at most 30); it sends
/// its own wait as `?timeout=10s`.
const MAX_WAIT_FOR_TURN: Duration = Duration::from_secs(30);

pub(crate) fn start(
    addr: &str,
    cert_dir: &Path,
    client_ca: Option<&Path>,
    shared: Arc<Shared>,
    watchers: Arc<Mutex<Watchers>>,
    haproxy_bin: String,
    stop: Arc<AtomicBool>,
) -> Result<(), String> {
    let mut files = vec![cert_dir.join("tls.crt"), cert_dir.join("tls.key")];
    files.extend(client_ca.map(Path::to_path_buf));
    let tls = Arc::new(Tls {
        current: Reloading::new(files),
    });
    if let Err(e) = tls.config() {
        log::warn!("webhook certificate not available yet ({e}); the webhook answers once it is");
    }
    let (listener, addr) =
        haptic_agent::net::listen(addr).map_err(|e| format!("webhook: listen on {addr}: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    log::info!("webhook listening on {addr}");
    let webhook = Arc::new(Webhook {
        shared,
        watchers,
        haproxy_bin,
        cache: Mutex::new(RenderCache::new()),
        turns: Default::default(),
        budget: ConnectionGate::new(BODY_BUDGET, MAX_BODY),
    });
    // Bounded overall and per peer address: in-cluster peers without a certificate the API
    // server trusts can reach this port, and must not be able to take its threads.
    let gate = ConnectionGate::new(MAX_CONNECTIONS, MAX_PER_PEER);
    std::thread::Builder::new()
        .name("webhook".into())
        .spawn(move || {
            let mut waiting = Waiting::new();
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, peer)) => waiting.push(stream, peer.ip().to_canonical()),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        // Sooner while connections wait for a slot.
                        let pause = if waiting.is_empty() { 50 } else { 5 };
                        std::thread::sleep(Duration::from_millis(pause))
                    }
                    Err(e) => {
                        // Out of descriptors, say: not a reason to spin.
                        log::warn!("webhook accept: {e}");
                        std::thread::sleep(Duration::from_millis(50))
                    }
                }
                for (stream, accepted, admitted) in waiting.admit(&gate, Instant::now()) {
                    let (tls, webhook) = (tls.clone(), webhook.clone());
                    let _ = std::thread::Builder::new()
                        .name("webhook-conn".into())
                        .spawn(move || {
                            serve_conn(stream, accepted, &tls, &webhook);
                            drop(admitted);
                        });
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Connections beyond their peer's share of the gate wait for a slot, oldest first, instead of
/// being closed: the API server opens one connection per review it sends at once (more than
/// `MAX_PER_PEER` when many objects are written together), and a closed one is a failed call,
/// which `failurePolicy: Fail` turns into a refused write. Bounded per peer and overall, so a
/// flooding peer neither holds more than its share nor keeps others' connections out.
struct Waiting {
    /// Each connection with its peer, when it came, and its waiting place.
    queue: std::collections::VecDeque<(TcpStream, IpAddr, Instant, Admitted)>,
    places: Arc<ConnectionGate>,
}

/// Connections waiting for a slot: overall, and from one address.
const MAX_WAITING: usize = 256;
const MAX_WAITING_PER_PEER: usize = 64;
/// The longest a connection waits for a slot (the API server's default timeout is 10 s).
const MAX_WAIT_FOR_SLOT: Duration = Duration::from_secs(10);

impl Waiting {
    fn new() -> Waiting {
        Waiting {
            queue: Default::default(),
            places: ConnectionGate::new(MAX_WAITING, MAX_WAITING_PER_PEER),
        }
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn push(&mut self, stream: TcpStream, peer: IpAddr) {
        match self.places.admit(peer) {
            Ok(place) => self.queue.push_back((stream, peer, Instant::now(), place)),
            Err(why) => log::debug!("webhook: refusing connection peer={peer}: {why} waiting"),
        }
    }

    /// The connections that got a slot now; those that waited too long are closed.
    fn admit(
        &mut self,
        gate: &Arc<ConnectionGate>,
        now: Instant,
    ) -> Vec<(TcpStream, Instant, Admitted)> {
        let mut admitted = Vec::new();
        let mut kept = std::collections::VecDeque::with_capacity(self.queue.len());
        // A connection leaving the queue gives its waiting place back.
        while let Some((stream, peer, since, place)) = self.queue.pop_front() {
            match gate.admit(peer) {
                Ok(slot) => admitted.push((stream, since, slot)),
                Err(why) if now.duration_since(since) >= MAX_WAIT_FOR_SLOT => {
                    log::debug!("webhook: closing connection peer={peer}: {why} for too long");
                }
                Err(_) => kept.push_back((stream, peer, since, place)),
            }
        }
        self.queue = kept;
        admitted
    }
}

/// Bytes of request bodies held at once by the reviews, and the largest body. A review's JSON
/// grows many times when parsed (a list of small numbers, 16 times): unbounded, peers that
/// reach the port (open to the cluster) could exhaust the controller's memory with concurrent
/// large bodies. A body waits for room, then holds it until its answer is written. One peer
/// holds at most `MAX_BODY` of it, so a peer that announces large bodies and sends nothing
/// never keeps the others out.
const BODY_BUDGET: usize = 12 << 20;
/// An object and its old version, each at most the 3 MiB the API server accepts.
const MAX_BODY: usize = 6 << 20;
/// The longest a body waits for room.
const MAX_WAIT_FOR_ROOM: Duration = Duration::from_secs(10);

/// Serves one connection accepted at `accepted` (its caller's patience counts from then).
fn serve_conn(stream: TcpStream, accepted: Instant, tls: &Tls, webhook: &Webhook) {
    let Ok(peer) = stream.peer_addr().map(|a| a.ip().to_canonical()) else {
        return;
    };
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let config = match tls.config() {
        Ok(c) => c,
        Err(e) => {
            log::warn!("webhook: no certificate: {e}");
            return;
        }
    };
    let Ok(mut conn) = ServerConnection::new(config) else {
        return;
    };
    let mut stream = stream;
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    if let Err(e) = complete_handshake(&mut conn, &mut stream, deadline, IO_TIMEOUT) {
        log::debug!("webhook: TLS handshake failed: {e}");
        return;
    }
    // The head within REQUEST_PART_TIMEOUT of the handshake, however it trickles in (a
    // connection holds one of the peer's slots meanwhile), and the body as long again from
    // when room for it is given.
    let mut reader = BufReader::new(http::Deadline::new(
        StreamOwned::new(conn, stream),
        Instant::now() + REQUEST_PART_TIMEOUT,
        IO_TIMEOUT,
    ));
    let limits = Limits {
        max_body_bytes: MAX_BODY,
        ..Limits::default()
    };
    // Held until the answer is written (the parsed review lives as long).
    let mut _room = None;
    let mut no_room = false;
    let response = match http::read_head(&mut reader, &limits) {
        Ok(head) => match http::body_length(&head, &limits).and_then(|n| {
            _room = webhook
                .budget
                .wait(peer, n, Instant::now() + MAX_WAIT_FOR_ROOM);
            no_room = _room.is_none();
            match _room {
                Some(_) => {
                    let deadline = Instant::now() + REQUEST_PART_TIMEOUT;
                    reader.get_mut().set_deadline(deadline);
                    http::read_body(&mut reader, n, deadline)
                }
                None => Err(http::ReadError::Io(std::io::Error::other(
                    "too many request bodies at once",
                ))),
            }
        }) {
            Ok(body) if head.method == "POST" && head.path == "/validate" => {
                // kube-apiserver says how long it waits (`?timeout=10s`, timeoutSeconds).
                let patience = head
                    .query_param("timeout")
                    .and_then(|t| t.strip_suffix('s'))
                    .and_then(|t| t.parse::<u64>().ok())
                    .map(Duration::from_secs)
                    .map_or(MAX_WAIT_FOR_TURN, |t| t.min(MAX_WAIT_FOR_TURN));
                webhook.review(&body, peer, accepted + patience)
            }
            Ok(_) => Response::error(404, "not_found", "POST /validate"),
            Err(_) if no_room => Response::error(503, "busy", "too many request bodies at once"),
            Err(e) => Response::error(400, "bad_request", format!("{e:?}")),
        },
        Err(_) => return,
    };
    let stream = &mut reader.get_mut().inner;
    let _ = http::write_response(stream, &response);
    stream.conn.send_close_notify();
    let _ = stream.conn.complete_io(&mut stream.sock);
}

impl Webhook {
    /// Answers a review whose caller gives up at `given_up`.
    fn review(&self, body: &[u8], peer: IpAddr, given_up: Instant) -> Response {
        let mut review: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return Response::error(400, "bad_request", format!("not an AdmissionReview: {e}"))
            }
        };
        let request = review
            .get_mut("request")
            .map(Value::take)
            .unwrap_or_default();
        let uid = request.get("uid").cloned().unwrap_or(Value::Null);
        let field = |pointer: &str| text_at(&request, pointer).to_string();
        let (kind, namespace, name) = (field("/kind/kind"), field("/namespace"), field("/name"));
        let started = Instant::now();
        let verdict = self.decide(request, peer, given_up);
        // Only a configuration that would really be invalid is denied; when the controller
        // cannot decide (no config yet, haproxy missing) it admits with a warning rather than
        // blocking every write to the watched kinds.
        let (result, allowed, message, mut warnings) = match verdict {
            Ok(warnings) => ("allowed", true, String::new(), warnings),
            Err(Denial::Invalid(m)) => ("denied", false, m, Vec::new()),
            Err(Denial::Error(m)) => ("error", true, m, Vec::new()),
        };
        self.shared
            .metrics
            .inc(&crate::metrics::WEBHOOK_REQUESTS_TOTAL, [result]);
        log::info!(
            "webhook {} {namespace}/{name} {result} in {} ms",
            if kind.is_empty() { "?" } else { kind.as_str() },
            started.elapsed().as_millis()
        );
        let mut response = json!({"uid": uid, "allowed": allowed});
        if !allowed {
            response["status"] = json!({"code": 403, "reason": "Forbidden", "message": message});
        } else if !message.is_empty() {
            warnings.push(format!("haptic could not validate this change: {message}"));
        }
        if !warnings.is_empty() {
            response["warnings"] = json!(warnings);
        }
        Response::json(
            200,
            &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}),
        )
    }

    /// Admits (with warnings for the user) or denies one review.
    fn decide(
        &self,
        mut request: Value,
        peer: IpAddr,
        given_up: Instant,
    ) -> Result<Vec<String>, Denial> {
        let text = |pointer: &str| text_at(&request, pointer).to_string();
        let reviewed = (text("/kind/kind"), text("/namespace"), text("/name"));
        let (group, version) = (text("/resource/group"), text("/resource/version"));
        let (resource, operation) = (text("/resource/resource"), text("/operation"));
        let (group, version, resource, operation) = (&*group, &*version, &*resource, &*operation);
        // Taken, not copied: a review holds one copy of its object at most.
        let object = request
            .get_mut("object")
            .map(Value::take)
            .unwrap_or_default();
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        let active = lock(&self.shared.config)
            .clone()
            .ok_or_else(|| Denial::Error("the controller has no valid configuration yet".into()))?;

        if group == crate::config::model::GROUP && resource == "haproxytemplateconfigs" {
            if operation == "DELETE" {
                return Ok(Vec::new());
            }
            // Checked as far as its structure and the compilation of its templates, and no
            // further. This endpoint cannot tell the API server from any other peer (its port
            // is open to the cluster: the API server's address is not known), so a config sent
            // to it may be anyone's, with templates of their choosing. Rendered against the
            // watched objects, those could print every namespace's Secrets into the denial
            // (`fail()`), or leak them a bit at a time through allow and deny; rendered at all,
            // they run code of the caller's choosing in the controller; given to `haproxy -c`,
            // the config would run its `lua-load` code and have HAProxy quote lines of any file
            // it names. The controller renders and checks a config when it applies it, and
            // applies only the config it reads from the API server.
            crate::controller::validate_config_object(&object, "HAProxyTemplateConfig")
                .map_err(Denial::Invalid)?;
            return Ok(Vec::new());
        }
        // Every watch of the type (a config may watch one type twice, with other selectors).
        let watches: Vec<_> = active
            .spec
            .watched_resources
            .iter()
            .filter(|(_, w)| w.api_version == api_version && w.resources == resource)
            .collect();
        if !watches.iter().any(|(_, w)| w.enable_validation_webhook) {
            return Ok(Vec::new());
        }
        // Only what this controller watches of the type is in its configuration: an object
        // its label selectors or namespaces leave out (another instance's, when a class is
        // sharded by labels) is not its to judge, unless the change takes it out of the set,
        // which the render below sees as its removal.
        let selects = |w: &crate::config::model::WatchedResource, o: &Value| {
            let labels = w
                .label_selector
                .as_deref()
                .filter(|s| !s.is_empty())
                .and_then(|s| crate::store::selector::LabelSelector::parse(s).ok());
            !o.is_null()
                && labels.is_none_or(|l| l.matches(o))
                && w.namespace
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .is_none_or(|ns| {
                        o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
                    })
        };
        let old = request.get("oldObject").unwrap_or(&Value::Null);
        let selected: Vec<_> = watches
            .iter()
            .map(|(name, w)| {
                let new = operation != "DELETE" && selects(w, &object);
                (*name, *w, selects(w, old), new)
            })
            .filter(|(_, _, old, new)| *old || *new)
            .collect();
        if selected.is_empty() {
            return Ok(Vec::new());
        }
        // Waits for this peer's turn: a peer flooding the port delays another's review by at
        // most one render of its own, not by all it has queued.
        let asked = Instant::now();
        let _turn = self.turns.take(peer);
        if asked.elapsed() > Duration::from_secs(1) {
            // Reviews of the API server take a second each at most (a render and a check); a
            // long wait is other peers' queued reviews: a flood, or a cluster too large for
            // one webhook replica.
            log::warn!(
                "webhook: a review from {peer} waited {} ms for its turn",
                asked.elapsed().as_millis()
            );
        }
        // A review whose caller has given up (its `?timeout=`, 30 s at most) has no one to
        // answer, and rendering it would only delay the others.
        if Instant::now() >= given_up {
            return Err(Denial::Error(
                "waited for its turn past its caller's timeout".into(),
            ));
        }
        let without = lock(&self.watchers).snapshot();
        let mut stores = without.clone();
        let old_key = request.get("oldObject").and_then(object_key);
        for (name, watched, _, new_watched) in selected {
            let mut store = stores
                .get(name)
                .map(|s| (**s).clone())
                .unwrap_or_else(|| crate::store::Store::for_resource(watched));
            let filter = ObjectFilter::for_resource(&active.spec, watched);
            match filter
                .prepare(object.clone())
                .filter(|_| new_watched && operation != "DELETE")
            {
                // An object the store cannot index is not rendered in production either.
                Some(object) => {
                    let _ = store.upsert_value(&object);
                }
                // Deleted, or out of this watch's set (labels, namespace, field selector):
                // gone from the store, as the reflector removes it.
                None => {
                    if let Some(key) = &old_key {
                        store.delete(key);
                    }
                }
            }
            stores.insert(name.clone(), Arc::new(store));
        }
        let still_out = |owner: &crate::render::Owner| {
            operation != "DELETE"
                && (&owner.kind, &owner.namespace, &owner.name)
                    == (&reviewed.0, &reviewed.1, &reviewed.2)
        };
        self.render_and_check(
            &active.engine,
            &active.spec,
            stores,
            Some(without),
            still_out,
        )
    }

    /// Renders the stores with the change (and, for a watched object, without it) and checks
    /// the result. Denies only what the change itself introduces: an object left out with it
    /// but not without it (a refused value, lines haproxy -c rejects), or a configuration that
    /// fails with it and not without it. An object `reviewed` names that stays left out is
    /// admitted with a warning naming why: its author sees that the write changed nothing.
    fn render_and_check(
        &self,
        engine: &crate::render::Engine,
        spec: &crate::config::Spec,
        stores: std::collections::BTreeMap<String, Arc<crate::store::Store>>,
        without: Option<std::collections::BTreeMap<String, Arc<crate::store::Store>>>,
        reviewed: impl Fn(&crate::render::Owner) -> bool,
    ) -> Result<Vec<String>, Denial> {
        let inputs = |stores| RenderInputs {
            stores,
            extra_context: spec.templating_settings.extra_context.clone(),
            current_config: None,
            base_dir: None,
        };
        let mut cache = lock(&self.cache);
        let haproxy_bin = self.haproxy_bin.clone();
        let mut check = |b: &Bundle| check_bundle(&haproxy_bin, b);
        // Without the change, first rendered only: what the change's own render then leaves
        // out, or fails on, is checked against this render with haproxy -c below.
        let before = without.clone().map(|stores| {
            render_validated(
                engine,
                &inputs(stores),
                &mut cache,
                &mut |_| false,
                &mut check,
            )
        });
        let dropped_owners = |v: &crate::validate::isolate::Validated| {
            v.rendered
                .dropped
                .iter()
                .map(|d| d.owner.clone())
                .collect::<BTreeSet<_>>()
        };
        let (before_dropped, before_bundle) = match &before {
            Some(Ok(v)) => (dropped_owners(v), Some(v.bundle.clone())),
            _ => (BTreeSet::new(), None),
        };
        let mut needs_check = |b: &Bundle| match &before_bundle {
            // A runtime-only difference without certificates changes nothing haproxy -c would
            // refuse.
            Some(old) => classify(old, b).needs_check(),
            None => true,
        };
        // Exclusions (owners whose lines haproxy -c refused) as they are without the change:
        // the render with it may add some, which must not carry over to the check below.
        let exclusions = cache.exclusions();
        let after = render_validated(
            engine,
            &inputs(stores),
            &mut cache,
            &mut needs_check,
            &mut check,
        );
        // The configuration without the change, checked: objects haproxy -c rejects were left
        // out of it too (a Secret of another tenant's, which no admission request shows, can
        // break its own Ingress's lines at any time), and are not this change's doing.
        let checked_before = |cache: &mut crate::render::RenderCache| {
            cache.restore_exclusions(exclusions);
            without.map(|stores| {
                render_validated(engine, &inputs(stores), cache, &mut |_| true, &mut check)
            })
        };
        match after {
            Ok(v) => {
                let introduced =
                    |before: &BTreeSet<crate::render::Owner>| -> Vec<&crate::render::Dropped> {
                        v.rendered
                            .dropped
                            .iter()
                            .filter(|d| !before.contains(&d.owner))
                            .collect()
                    };
                let mut found = introduced(&before_dropped);
                // Left out by haproxy -c (the others were refused by the templates, which the
                // render without the change already ran): compared with a checked render.
                let by_check = found
                    .iter()
                    .any(|d| cache.excluded().any(|(owner, _)| *owner == d.owner));
                if by_check {
                    match checked_before(&mut cache) {
                        Some(Ok(b)) => found = introduced(&dropped_owners(&b)),
                        Some(Err(_)) => {
                            return Err(Denial::Error(
                                "the configuration fails without this change too".into(),
                            ))
                        }
                        None => {}
                    }
                }
                if found.is_empty() {
                    Ok(v.rendered
                        .dropped
                        .iter()
                        .filter(|d| reviewed(&d.owner))
                        .map(|d| {
                            warning(&format!(
                                "{} stays out of the HAProxy configuration: {}",
                                d.owner, d.message
                            ))
                        })
                        .collect())
                } else {
                    let reasons: Vec<String> = found
                        .iter()
                        .map(|d| format!("{}: {}", d.owner, d.message))
                        .collect();
                    Err(Denial::Invalid(reasons.join("; ")))
                }
            }
            Err(_) if matches!(before, Some(Err(_))) => Err(Denial::Error(
                "the configuration fails without this change too".into(),
            )),
            Err(Failure::Render(e)) => Err(Denial::Invalid(if e.from_fail {
                e.message.clone()
            } else {
                e.to_string()
            })),
            Err(Failure::Check(crate::validate::haproxy::CheckError::Rejected { message })) => {
                match checked_before(&mut cache) {
                    Some(Err(_)) => Err(Denial::Error(
                        "the configuration fails without this change too".into(),
                    )),
                    _ => Err(Denial::Invalid(format!(
                        "HAProxy would reject the configuration: {}",
                        crate::validate::isolate::alert(&message)
                    ))),
                }
            }
            Err(Failure::Check(crate::validate::haproxy::CheckError::CouldNotRun(m))) => {
                Err(Denial::Error(m))
            }
        }
    }
}

/// A warning as kubectl shows it: one line, within the 256 characters the API server keeps.
fn warning(text: &str) -> String {
    const KEPT: usize = 256;
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.chars().count() <= KEPT {
        return line;
    }
    let mut cut: String = line.chars().take(KEPT - 1).collect();
    cut.push('…');
    cut
}

/// The string at `pointer` in `value`, or "".
fn text_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

enum Denial {
    Invalid(String),
    Error(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warnings_are_one_line_within_what_the_api_server_keeps() {
        assert_eq!(
            warning("Ingress a/b:\n  bad\tvalue "),
            "Ingress a/b: bad value"
        );
        let long = warning(&"é".repeat(300));
        assert_eq!(long.chars().count(), 256);
        assert!(long.ends_with('…'));
        assert_eq!(warning(&"x".repeat(256)), "x".repeat(256));
    }

    /// Room is taken up to the capacity; a body that does not fit waits until room is given
    /// back, or until its deadline.
    #[test]
    fn bodies_wait_for_room_in_the_budget() {
        let budget = ConnectionGate::new(12, 8);
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = (
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.3".parse().unwrap(),
        );
        let soon = || Instant::now() + Duration::from_millis(50);
        let first = budget.wait(a, 8, soon()).expect("room");
        assert!(
            budget.wait(b, 8, soon()).is_none(),
            "no room until given back"
        );
        assert!(
            budget.wait(a, 2, soon()).is_none(),
            "a peer holds its share at most"
        );
        let small = budget.wait(b, 4, soon()).expect("what fits goes in");
        drop(small);
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| {
                budget
                    .wait(c, 8, Instant::now() + Duration::from_secs(10))
                    .is_some()
            });
            // The waiter is woken by the room given back, long before its deadline.
            std::thread::sleep(Duration::from_millis(20));
            drop(first);
            assert!(waiter.join().unwrap());
        });
        // All given back: the whole budget is free.
        let _x = budget.wait(a, 8, soon()).expect("room");
        let _y = budget.wait(b, 4, soon()).expect("room");
    }

    /// Connections beyond their peer's share wait, oldest first, and get a slot when one is
    /// given back; those that waited too long are closed; a peer cannot queue more than its
    /// share of waiting places.
    #[test]
    fn connections_wait_for_a_slot_of_their_peer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let connect = || {
            let _client = TcpStream::connect(addr).unwrap();
            let (server, _) = listener.accept().unwrap();
            (server, _client)
        };
        let gate = ConnectionGate::new(64, 1);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let mut waiting = Waiting::new();
        let mut clients = Vec::new();
        for peer in [a, a, a, b] {
            let (server, client) = connect();
            clients.push(client);
            waiting.push(server, peer);
        }
        let t0 = Instant::now();
        let first = waiting.admit(&gate, t0);
        assert_eq!(first.len(), 2, "one of a's, and b's");
        assert_eq!(waiting.queue.len(), 2);
        assert!(waiting.admit(&gate, t0).is_empty(), "a's slot is taken");
        drop(first);
        let second = waiting.admit(&gate, t0);
        assert_eq!(second.len(), 1, "a slot given back");
        assert_eq!(waiting.queue.len(), 1);
        assert!(waiting.admit(&gate, t0 + MAX_WAIT_FOR_SLOT).is_empty());
        assert!(waiting.is_empty(), "waited too long: closed");
        drop(second);
        for _ in 0..MAX_WAITING_PER_PEER + 3 {
            let (server, client) = connect();
            clients.push(client);
            waiting.push(server, a);
        }
        assert_eq!(waiting.queue.len(), MAX_WAITING_PER_PEER);
    }
}
