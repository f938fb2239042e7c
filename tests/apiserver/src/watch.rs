//! Streaming a watch to one client: `{"type":…,"object":…}` lines in a chunked response, selector
//! transitions (an object that starts or stops matching arrives as ADDED or DELETED), periodic
//! BOOKMARK events, `timeoutSeconds`, pausing by fault injection, and the ERROR event with a
//! `410 Expired` Status for a start version older than the compaction point.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::RecvTimeoutError;
use serde_json::{json, Value};

use crate::http::Conn;
use crate::registry::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::server::Ctx;
use crate::status::ApiError;
use crate::storage::{Event, EventType, Registration, WatchMsg};

/// How one watch should behave.
pub struct WatchOptions {
    pub rtype: Arc<ResourceType>,
    pub version: String,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub bookmarks: bool,
    pub timeout: Duration,
    /// `sendInitialEvents=true`: mark the end of the initial state with an annotated bookmark.
    pub initial_events_end: bool,
    /// Events at or below this version are not sent (set from the registration).
    pub skip_through: u64,
}

/// How the watch ended, which decides whether the connection can serve another request.
pub enum Ended {
    Clean,
    Aborted,
}

/// Sends a single ERROR event (used when the start version has been compacted away).
pub fn send_error(conn: &mut Conn, err: &ApiError) -> io::Result<()> {
    conn.start_chunked(200, "application/json")?;
    let line = json!({"type": "ERROR", "object": err.to_status()});
    conn.write_chunk(format!("{line}\n").as_bytes())?;
    conn.finish_chunked()
}

/// Streams a registered watch until it times out, is closed, or the client goes away.
pub fn serve(
    conn: &mut Conn,
    ctx: &Ctx,
    opts: &mut WatchOptions,
    reg: Registration,
) -> io::Result<Ended> {
    opts.skip_through = reg.skip_through;
    let opts = &*opts;
    struct Unregister<'a>(&'a Ctx, u64);
    impl Drop for Unregister<'_> {
        fn drop(&mut self) {
            self.0.store.unwatch(self.1);
        }
    }
    let _guard = Unregister(ctx, reg.id);
    let group_resource = opts.rtype.group_resource();
    let deadline = Instant::now() + opts.timeout;
    let interval = ctx.config.bookmark_interval;
    let mut next_bookmark = Instant::now() + interval;
    // Idle watches look for a vanished client this often, so their channels do not pile up.
    let probe_every = interval.min(Duration::from_secs(5));
    let mut next_probe = Instant::now() + probe_every;
    let mut held: Vec<Arc<Event>> = Vec::new();

    conn.start_chunked(200, "application/json")?;
    for event in &reg.initial {
        send_event(conn, opts, event)?;
    }
    if opts.initial_events_end && opts.bookmarks {
        send_bookmark(conn, opts, reg.start_rv, true)?;
    }
    loop {
        let now = Instant::now();
        if now >= deadline {
            conn.finish_chunked()?;
            return Ok(Ended::Clean);
        }
        let paused = ctx.faults.is_paused(&group_resource);
        if !paused && !held.is_empty() {
            for event in held.drain(..) {
                send_event(conn, opts, &event)?;
            }
        }
        let mut wait = deadline
            .min(next_bookmark)
            .min(next_probe)
            .saturating_duration_since(now);
        if paused {
            // Re-check the pause at a short interval so a resume takes effect quickly.
            wait = wait.min(Duration::from_millis(50));
        }
        match reg.rx.recv_timeout(wait) {
            Ok(WatchMsg::Event(event)) => {
                // The pause may have changed while waiting.
                if ctx.faults.is_paused(&group_resource) {
                    held.push(event);
                } else {
                    for e in held.drain(..) {
                        send_event(conn, opts, &e)?;
                    }
                    send_event(conn, opts, &event)?;
                }
            }
            Ok(WatchMsg::Close { abrupt: true }) => {
                conn.abort();
                return Ok(Ended::Aborted);
            }
            Ok(WatchMsg::Close { abrupt: false }) => {
                conn.finish_chunked()?;
                return Ok(Ended::Clean);
            }
            Err(RecvTimeoutError::Timeout) => {
                if Instant::now() >= next_probe {
                    next_probe = Instant::now() + probe_every;
                    if conn.peer_closed() {
                        return Ok(Ended::Aborted);
                    }
                }
                if Instant::now() >= next_bookmark {
                    next_bookmark = Instant::now() + interval;
                    if opts.bookmarks && !paused && held.is_empty() {
                        // Everything up to `rv` has been sent to the channel under the store
                        // lock, so draining it first makes the bookmark truthful.
                        let rv = ctx.store.current_rv();
                        while let Ok(msg) = reg.rx.try_recv() {
                            match msg {
                                WatchMsg::Event(e) => send_event(conn, opts, &e)?,
                                WatchMsg::Close { abrupt } => {
                                    if abrupt {
                                        conn.abort();
                                        return Ok(Ended::Aborted);
                                    }
                                    conn.finish_chunked()?;
                                    return Ok(Ended::Clean);
                                }
                            }
                        }
                        send_bookmark(conn, opts, rv, false)?;
                    }
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                conn.finish_chunked()?;
                return Ok(Ended::Clean);
            }
        }
    }
}

/// The event type this watcher sees for a change, given its selectors (None: not visible).
fn visible_type(opts: &WatchOptions, event: &Event) -> Option<EventType> {
    let matches = |o: &Value| opts.labels.matches(o) && opts.fields.matches(o);
    match event.kind {
        EventType::Added | EventType::Deleted => matches(&event.object).then_some(event.kind),
        EventType::Modified => {
            let now = matches(&event.object);
            let before = event.old.as_deref().is_some_and(matches);
            match (before, now) {
                (true, true) => Some(EventType::Modified),
                (false, true) => Some(EventType::Added),
                (true, false) => Some(EventType::Deleted),
                (false, false) => None,
            }
        }
    }
}

fn send_event(conn: &mut Conn, opts: &WatchOptions, event: &Event) -> io::Result<()> {
    if event.rv <= opts.skip_through {
        return Ok(());
    }
    let Some(kind) = visible_type(opts, event) else {
        return Ok(());
    };
    let api_version = opts.rtype.api_version(&opts.version);
    let body = if event.object["apiVersion"].as_str() == Some(api_version.as_str()) {
        serde_json::to_vec(&*event.object)
    } else {
        let mut obj = (*event.object).clone();
        obj["apiVersion"] = Value::String(api_version);
        serde_json::to_vec(&obj)
    }
    .map_err(io::Error::other)?;
    let mut line = Vec::with_capacity(body.len() + 40);
    line.extend_from_slice(format!("{{\"type\":\"{}\",\"object\":", kind.as_str()).as_bytes());
    line.extend_from_slice(&body);
    line.extend_from_slice(b"}\n");
    conn.write_chunk(&line)
}

fn send_bookmark(
    conn: &mut Conn,
    opts: &WatchOptions,
    rv: u64,
    initial_end: bool,
) -> io::Result<()> {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let line = json!({"type": "BOOKMARK", "object": {
        "kind": opts.rtype.kind,
        "apiVersion": opts.rtype.api_version(&opts.version),
        "metadata": metadata,
    }});
    conn.write_chunk(format!("{line}\n").as_bytes())
}
