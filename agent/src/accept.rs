//! Bounded accepting for TLS listeners, shared by the agent's API and the controller's
//! admission webhook: a [`ConnectionGate`] caps connections overall and per peer address, and
//! [`complete_handshake`] gives an unauthenticated peer a short deadline.

use std::collections::HashMap;
use std::net::{IpAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::ServerConnection;

/// Admits connections: at most `max` open at once, and at most `per_peer` from one address,
/// so that one peer (an idle flood, a slow client) cannot take every slot from the others.
#[derive(Debug)]
pub struct ConnectionGate {
    max: usize,
    per_peer: usize,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// An admitted connection; its slot is given back when this is dropped.
#[derive(Debug)]
pub struct Admitted {
    gate: Arc<ConnectionGate>,
    peer: IpAddr,
}

impl ConnectionGate {
    pub fn new(max: usize, per_peer: usize) -> Arc<ConnectionGate> {
        Arc::new(ConnectionGate {
            max,
            per_peer,
            open: Mutex::new((0, HashMap::new())),
        })
    }

    /// A slot for a connection from `peer`, or why there is none.
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Admitted, &'static str> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.0 >= self.max {
            return Err("too many connections");
        }
        let from_peer = open.1.entry(peer).or_insert(0);
        if *from_peer >= self.per_peer {
            return Err("too many connections from this address");
        }
        *from_peer += 1;
        open.0 += 1;
        Ok(Admitted {
            gate: self.clone(),
            peer,
        })
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut open = self.gate.open.lock().unwrap_or_else(|e| e.into_inner());
        open.0 -= 1;
        if let Some(n) = open.1.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.peer);
            }
        }
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
