//! The table of open connections and the admission policy: who is let in when the server is
//! full, and whose connection makes room.
//!
//! A connection is *idle* while no request of its is in flight: waiting for its first request
//! (a TLS handshake or headers still arriving, however slowly) or between keep-alive requests.
//! Only idle connections are ever evicted, longest idle first, so an attacker's half-open
//! connections make room for a real request even from the same address, and an answer being
//! computed or streamed (server-sent events) is never cut.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::Notify;

/// What one connection is doing, shared by its task (which counts requests in and out) and
/// the registry (which reads it to choose whom to evict).
#[derive(Debug)]
pub(crate) struct Activity {
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    in_flight: usize,
    idle_since: Instant,
}

impl Activity {
    fn new(now: Instant) -> Activity {
        Activity {
            state: Mutex::new(State {
                in_flight: 0,
                idle_since: now,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is two plain values, consistent after any panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Since when the connection has had no request in flight; `None` while it has one.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        let state = self.lock();
        (state.in_flight == 0).then_some(state.idle_since)
    }

    /// A request begins; it counts as in flight until the guard is dropped, which the server
    /// does once the response body has been sent (or the request abandoned).
    pub(crate) fn begin(self: &Arc<Self>) -> InFlight {
        self.lock().in_flight += 1;
        InFlight(Arc::clone(self))
    }
}

/// One request in flight on a connection.
#[derive(Debug)]
pub(crate) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if state.in_flight == 0 {
            state.idle_since = Instant::now();
        }
    }
}

struct Entry {
    client: IpAddr,
    activity: Arc<Activity>,
    evict: Arc<Notify>,
}

/// A connection let in: its id (to leave the table), its activity, and the signal that it has
/// been evicted and must close.
pub(crate) struct Admitted {
    pub(crate) id: u64,
    pub(crate) activity: Arc<Activity>,
    pub(crate) evicted: Arc<Notify>,
}

/// The open connections.
pub(crate) struct Registry {
    max_connections: usize,
    per_client: usize,
    next_id: u64,
    open: HashMap<u64, Entry>,
}

impl Registry {
    pub(crate) fn new(max_connections: usize, per_client: usize) -> Registry {
        Registry {
            max_connections: max_connections.max(1),
            per_client: per_client.max(1),
            next_id: 0,
            open: HashMap::new(),
        }
    }

    /// Lets a new connection from `client` in, evicting an idle one when a cap is reached:
    /// at the client's own cap that client's longest-idle connection, at the global cap the
    /// longest-idle of all. `None` (close the new one) when the cap is reached and every
    /// connection counted against it has a request in flight.
    pub(crate) fn admit(&mut self, client: IpAddr, now: Instant) -> Option<Admitted> {
        let client = client.to_canonical();
        let of_client = self.open.values().filter(|e| e.client == client).count();
        if of_client >= self.per_client {
            let victim = self.longest_idle(|e| e.client == client)?;
            self.evict(victim);
        }
        if self.open.len() >= self.max_connections {
            let victim = self.longest_idle(|_| true)?;
            self.evict(victim);
        }
        let id = self.next_id;
        self.next_id += 1;
        let activity = Arc::new(Activity::new(now));
        let evicted = Arc::new(Notify::new());
        self.open.insert(
            id,
            Entry {
                client,
                activity: Arc::clone(&activity),
                evict: Arc::clone(&evicted),
            },
        );
        Some(Admitted {
            id,
            activity,
            evicted,
        })
    }

    /// A connection has closed.
    pub(crate) fn remove(&mut self, id: u64) {
        self.open.remove(&id);
    }

    fn longest_idle(&self, counts: impl Fn(&Entry) -> bool) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, e)| counts(e))
            .filter_map(|(id, e)| e.activity.idle_since().map(|since| (since, *id)))
            .min()
            .map(|(_, id)| id)
    }

    fn evict(&mut self, id: u64) {
        if let Some(entry) = self.open.remove(&id) {
            // A stored permit: the task sees it even if it is not waiting yet.
            entry.evict.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_client_at_its_cap_loses_its_own_longest_idle_connection() {
        let t0 = Instant::now();
        let mut r = Registry::new(10, 2);
        let other = r.admit(ip(2), t0).expect("room");
        let first = r.admit(ip(1), t0 + Duration::from_secs(1)).expect("room");
        let second = r.admit(ip(1), t0 + Duration::from_secs(2)).expect("room");
        let third = r.admit(ip(1), t0 + Duration::from_secs(3)).expect("room");
        assert_eq!(r.open.len(), 3);
        assert!(
            r.open.contains_key(&other.id),
            "another client's connection kept"
        );
        assert!(
            !r.open.contains_key(&first.id),
            "the client's longest idle evicted"
        );
        assert!(r.open.contains_key(&second.id) && r.open.contains_key(&third.id));
    }

    #[test]
    fn connections_with_a_request_in_flight_are_never_evicted() {
        let t0 = Instant::now();
        let mut r = Registry::new(10, 2);
        let a = r.admit(ip(1), t0).expect("room");
        let b = r.admit(ip(1), t0).expect("room");
        let _busy = (a.activity.begin(), b.activity.begin());
        assert!(r.admit(ip(1), t0).is_none(), "the new one is refused");
        assert!(r.admit(ip(3), t0).is_some(), "another client still gets in");
    }

    #[test]
    fn at_the_global_cap_the_longest_idle_of_anyone_makes_room() {
        let t0 = Instant::now();
        let mut r = Registry::new(2, 5);
        let a = r.admit(ip(1), t0).expect("room");
        let b = r.admit(ip(2), t0 + Duration::from_secs(1)).expect("room");
        let busy = b.activity.begin();
        let c = r.admit(ip(3), t0 + Duration::from_secs(2)).expect("room");
        assert!(!r.open.contains_key(&a.id) && r.open.contains_key(&b.id));
        let _c_busy = c.activity.begin();
        assert!(r.admit(ip(4), t0).is_none(), "everyone busy: refused");
        drop(busy);
        assert!(r.admit(ip(4), t0).is_some(), "b idle again: it makes room");
        assert!(!r.open.contains_key(&b.id));
    }
}
