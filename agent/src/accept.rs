//! Bounded accepting for TLS listeners, shared by the agent's API and the controller's
//! admission webhook: a [`ConnectionGate`] caps connections overall and per peer address, and
//! [`complete_handshake`] gives an unauthenticated peer a short deadline.

use std::collections::HashMap;
use std::net::{IpAddr, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rustls::ServerConnection;

/// Admits connections: at most `max` open at once, and at most `per_peer` from one address,
/// so that one peer (an idle flood, a slow client) cannot take every slot from the others.
/// Slots may also be weighted (bytes of request bodies held, for example) and waited for.
#[derive(Debug)]
pub struct ConnectionGate {
    max: usize,
    per_peer: usize,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
    freed: Condvar,
}

/// An admitted connection; its slot is given back when this is dropped.
#[derive(Debug)]
pub struct Admitted {
    gate: Arc<ConnectionGate>,
    peer: IpAddr,
    weight: usize,
}

impl ConnectionGate {
    pub fn new(max: usize, per_peer: usize) -> Arc<ConnectionGate> {
        Arc::new(ConnectionGate {
            max,
            per_peer,
            open: Mutex::new((0, HashMap::new())),
            freed: Condvar::new(),
        })
    }

    /// A slot for a connection from `peer`, or why there is none.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Admitted, &'static str> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        self.take(&mut open, peer, 1)
    }

    /// Room of `weight` for `peer`, waiting for slots given back until `deadline` at most.
    pub fn wait(
        self: &Arc<Self>,
        peer: IpAddr,
        weight: usize,
        deadline: Instant,
    ) -> Option<Admitted> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Ok(admitted) = self.take(&mut open, peer, weight) {
                return Some(admitted);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            open = self
                .freed
                .wait_timeout(open, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    fn take(
        self: &Arc<Self>,
        open: &mut (usize, HashMap<IpAddr, usize>),
        peer: IpAddr,
        weight: usize,
    ) -> Result<Admitted, &'static str> {
        if open.0 + weight > self.max {
            return Err("too many connections");
        }
        let from_peer = open.1.get(&peer).copied().unwrap_or(0);
        if from_peer + weight > self.per_peer {
            return Err("too many connections from this address");
        }
        open.1.insert(peer, from_peer + weight);
        open.0 += weight;
        Ok(Admitted {
            gate: self.clone(),
            peer,
            weight,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.gate.open.lock().unwrap_or_else(|e| e.into_inner());
        open.0 -= self.weight;
        if let Some(n) = open.1.get_mut(&self.peer) {
            *n -= self.weight;
            if *n == 0 {
                open.1.remove(&self.peer);
            }
        }
        drop(open);
        self.gate.freed.notify_all();
    }
}

/// Completes a server-side TLS handshake by `deadline` (a peer that sends nothing, or too
/// slowly, is dropped); leaves the socket's read timeout at `io_timeout`.
pub fn complete_handshake(
    conn: &mut ServerConnection,
    sock: &mut TcpStream,
    deadline: Instant,
    io_timeout: Duration,
) -> Result<(), String> {
    while conn.is_handshaking() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("handshake not completed in time".into());
        }
        let _ = sock.set_read_timeout(Some(left));
        if let Err(e) = conn.complete_io(sock) {
            // Send the alert (e.g. a refused certificate) before closing.
            let _ = conn.write_tls(sock);
            return Err(e.to_string());
        }
    }
    let _ = sock.set_read_timeout(Some(io_timeout));
    Ok(())
}
