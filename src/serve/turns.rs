//! Turns at one expensive resource, taken in rotation between peers.
//!
//! The webhook renders and checks one review at a time. Its port cannot tell the API server
//! from any other pod, so a lock that wakes an arbitrary waiter lets one peer with many
//! connections keep the API server waiting past its timeout (at 10,000 Ingresses a review that
//! adds a route costs a render and a `haproxy -c`, most of a second). Here each peer's waiters
//! line up behind each other, and the peers take turns: a review waits for at most one turn of
//! every other peer that is waiting, however many requests those peers have queued.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct State {
    /// Whose turn it is: a ticket, granted and not yet returned.
    granted: Option<u64>,
    next_ticket: u64,
    /// Each waiting peer's tickets, oldest first.
    queues: HashMap<IpAddr, VecDeque<u64>>,
    /// Peers with waiters, in the order they get their next turn.
    rotation: VecDeque<IpAddr>,
}

impl State {
    /// Hands the resource to the next peer in rotation, if any waits.
    fn grant_next(&mut self) {
        self.granted = None;
        while let Some(peer) = self.rotation.pop_front() {
            let Some(queue) = self.queues.get_mut(&peer) else {
                continue;
            };
            let Some(ticket) = queue.pop_front() else {
                self.queues.remove(&peer);
                continue;
            };
            if queue.is_empty() {
                self.queues.remove(&peer);
            } else {
                self.rotation.push_back(peer);
            }
            self.granted = Some(ticket);
            return;
        }
    }
}

#[derive(Default)]
pub(crate) struct Turns {
    state: Mutex<State>,
    changed: Condvar,
}

/// Holding a turn; the next one is granted when this is dropped.
pub(crate) struct Turn<'a> {
    turns: &'a Turns,
}

impl Turns {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for `peer`'s turn.
    pub(crate) fn take(&self, peer: IpAddr) -> Turn<'_> {
        let mut state = self.lock();
        let ticket = state.next_ticket;
        state.next_ticket += 1;
        let queue = state.queues.entry(peer).or_default();
        queue.push_back(ticket);
        if queue.len() == 1 {
            state.rotation.push_back(peer);
        }
        if state.granted.is_none() {
            state.grant_next();
        }
        while state.granted != Some(ticket) {
            state = self.changed.wait(state).unwrap_or_else(|p| p.into_inner());
        }
        Turn { turns: self }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.turns.lock().grant_next();
        self.turns.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    /// Waits until `n` tickets wait in `turns` (their threads are lined up).
    fn until_waiting(turns: &Turns, n: usize) {
        for _ in 0..10_000 {
            if turns
                .lock()
                .queues
                .values()
                .map(VecDeque::len)
                .sum::<usize>()
                == n
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("{n} waiters never lined up");
    }

    #[test]
    fn a_flooding_peer_gets_one_turn_before_another_peer_gets_its_own() {
        let turns = Arc::new(Turns::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        // The flood holds the resource and has ten more requests waiting.
        let first = turns.take(ip(66));
        let mut threads = Vec::new();
        let mut spawn = |peer: IpAddr, label: String| {
            let (turns, order) = (turns.clone(), order.clone());
            threads.push(std::thread::spawn(move || {
                let _turn = turns.take(peer);
                order.lock().unwrap().push(label);
            }));
        };
        for i in 0..10 {
            spawn(ip(66), format!("flood {i}"));
            until_waiting(&turns, i + 1);
        }
        // Then the API server asks, and a second flooding peer.
        spawn(ip(1), "api server".into());
        until_waiting(&turns, 11);
        spawn(ip(67), "other".into());
        until_waiting(&turns, 12);
        drop(first);
        for t in threads {
            t.join().unwrap();
        }
        let order = order.lock().unwrap().clone();
        assert_eq!(order.len(), 12);
        // After the holder: one of the flood's queue, then the API server, then the other
        // peer; the flood's own requests keep their order.
        assert_eq!(&order[..3], ["flood 0", "api server", "other"], "{order:?}");
        let flood: Vec<&String> = order.iter().filter(|l| l.starts_with("flood")).collect();
        let expected: Vec<String> = (0..10).map(|i| format!("flood {i}")).collect();
        assert_eq!(flood, expected.iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_lone_peer_takes_turns_in_order_and_the_resource_is_free_after() {
        let turns = Turns::default();
        for _ in 0..3 {
            drop(turns.take(ip(1)));
        }
        let state = turns.lock();
        assert!(state.granted.is_none() && state.queues.is_empty() && state.rotation.is_empty());
    }
}
