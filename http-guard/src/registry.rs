//! The table of open connections and the admission policy: who is let in when the server is
//! full, and whose connection makes room.
//!
//! A connection is *busy* while the server owes its client work the client is waiting for: a
//! request whose body has arrived (or that has none) is being handled, or its response is being
//! sent and the client reads it. Everything else is *evictable*, in this order:
//!
//! 1. idle: waiting for its first request (a TLS handshake or headers still arriving, however
//!    slowly) or between keep-alive requests; longest idle first;
//! 2. a response the client has stopped reading: no byte written for [`WRITE_STALL_GRACE`];
//!    longest stalled first;
//! 3. a request body still arriving after [`BODY_GRACE`]: slowest (fewest bytes per second)
//!    first, so a trickled body makes room before a real upload does.
//!
//! So an attacker's half-open, half-sent or unread connections make room for a real request
//! even from the same address, and an answer being computed or streamed to a reading client
//! (server-sent events) is never cut.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How long a request body may take before a connection that is still receiving it counts as
/// evictable: a real client sends its body right after its headers.
pub(crate) const BODY_GRACE: Duration = Duration::from_secs(2);

/// How long a response may go without a byte reaching the socket before its connection counts
/// as evictable: a client that reads never leaves the kernel's send buffer full for this long.
pub(crate) const WRITE_STALL_GRACE: Duration = Duration::from_secs(5);

/// What one connection is doing, shared by its task (which counts requests in and out, body
/// bytes and stalled writes) and the registry (which reads it to choose whom to evict).
#[derive(Debug)]
pub(crate) struct Activity {
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
struct State {
    in_flight: usize,
    idle_since: Instant,
    /// The current request's body, while it is still arriving.
    receiving: Option<Receiving>,
    /// Since when the socket has refused the bytes of a response.
    write_stalled_since: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Receiving {
    since: Instant,
    bytes: u64,
}

/// Why a connection may make room, and its rank within that reason (smaller goes first).
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub(crate) enum Evictable {
    /// No request in flight since this instant.
    Idle(Instant),
    /// Its response has not been read since this instant.
    Unread(Instant),
    /// Its request body arrives at this many bytes per second.
    SlowBody(f64),
}

impl Activity {
    fn new(now: Instant) -> Activity {
        Activity {
            state: Mutex::new(State {
                in_flight: 0,
                idle_since: now,
                receiving: None,
                write_stalled_since: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain values, consistent after any panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Since when the connection has had no request in flight; `None` while it has one.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        let state = self.lock();
        (state.in_flight == 0).then_some(state.idle_since)
    }

    /// Whether the connection may be closed to make room at `now`, and its rank.
    pub(crate) fn evictable(&self, now: Instant) -> Option<Evictable> {
        let state = self.lock();
        if state.in_flight == 0 {
            return Some(Evictable::Idle(state.idle_since));
        }
        if let Some(since) = state.write_stalled_since
            && now.saturating_duration_since(since) >= WRITE_STALL_GRACE
        {
            return Some(Evictable::Unread(since));
        }
        let receiving = state.receiving?;
        let took = now.saturating_duration_since(receiving.since);
        (took >= BODY_GRACE)
            .then(|| Evictable::SlowBody(receiving.bytes as f64 / took.as_secs_f64()))
    }

    /// A request begins (its head has arrived; `with_body` when a body is to follow); it counts
    /// as in flight until the guard is dropped, which the server does once the response body
    /// has been sent (or the request abandoned).
    pub(crate) fn begin(self: &Arc<Self>, with_body: bool, now: Instant) -> InFlight {
        let mut state = self.lock();
        state.in_flight += 1;
        state.receiving = with_body.then_some(Receiving {
            since: now,
            bytes: 0,
        });
        InFlight(Arc::clone(self))
    }

    /// Bytes of the current request's body arrived.
    pub(crate) fn body_received(&self, bytes: u64) {
        if let Some(receiving) = &mut self.lock().receiving {
            receiving.bytes = receiving.bytes.saturating_add(bytes);
        }
    }

    /// The current request's body has all arrived, or the app answered without it: the
    /// connection is no longer waiting on its client's body.
    pub(crate) fn body_done(&self) {
        self.lock().receiving = None;
    }

    /// A write found the socket full (`true`) or went through (`false`).
    pub(crate) fn write_stalled(&self, stalled: bool, now: Instant) {
        let mut state = self.lock();
        match (stalled, state.write_stalled_since) {
            (true, None) => state.write_stalled_since = Some(now),
            (false, Some(_)) => state.write_stalled_since = None,
            _ => {}
        }
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
            state.receiving = None;
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

/// Whom a connection is counted against: its IPv4 address, or its IPv6 /64 (one household or
/// one host's privacy addresses; a single client can take any address of its /64).
pub(crate) fn client_of(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(prefix.into())
        }
        v4 => v4,
    }
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

    /// Lets a new connection from `address` in, evicting one when a cap is reached: at the
    /// client's own cap that client's most evictable connection, at the global cap the most
    /// evictable of all. `None` (close the new one) when the cap is reached and every
    /// connection counted against it is busy.
    pub(crate) fn admit(&mut self, address: IpAddr, now: Instant) -> Option<Admitted> {
        let client = client_of(address);
        let of_client = self.open.values().filter(|e| e.client == client).count();
        if of_client >= self.per_client {
            let victim = self.most_evictable(now, |e| e.client == client)?;
            self.evict(victim);
        }
        if self.open.len() >= self.max_connections {
            let victim = self.most_evictable(now, |_| true)?;
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

    fn most_evictable(&self, now: Instant, counts: impl Fn(&Entry) -> bool) -> Option<u64> {
        self.open
            .iter()
            .filter(|(_, e)| counts(e))
            .filter_map(|(id, e)| e.activity.evictable(now).map(|why| (why, *id)))
            .min_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal))
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
        let _busy = (a.activity.begin(false, t0), b.activity.begin(false, t0));
        let later = t0 + Duration::from_secs(600);
        assert!(r.admit(ip(1), later).is_none(), "the new one is refused");
        assert!(
            r.admit(ip(3), later).is_some(),
            "another client still gets in"
        );
    }

    #[test]
    fn at_the_global_cap_the_longest_idle_of_anyone_makes_room() {
        let t0 = Instant::now();
        let mut r = Registry::new(2, 5);
        let a = r.admit(ip(1), t0).expect("room");
        let b = r.admit(ip(2), t0 + Duration::from_secs(1)).expect("room");
        let busy = b.activity.begin(false, t0);
        let c = r.admit(ip(3), t0 + Duration::from_secs(2)).expect("room");
        assert!(!r.open.contains_key(&a.id) && r.open.contains_key(&b.id));
        let _c_busy = c.activity.begin(false, t0);
        assert!(r.admit(ip(4), t0).is_none(), "everyone busy: refused");
        drop(busy);
        assert!(r.admit(ip(4), t0).is_some(), "b idle again: it makes room");
        assert!(!r.open.contains_key(&b.id));
    }

    #[test]
    fn a_trickled_body_makes_room_after_its_grace_slowest_first() {
        let t0 = Instant::now();
        let mut r = Registry::new(10, 2);
        let trickle = r.admit(ip(1), t0).expect("room");
        let upload = r.admit(ip(1), t0).expect("room");
        let _t = trickle.activity.begin(true, t0);
        let _u = upload.activity.begin(true, t0);
        trickle.activity.body_received(10);
        upload.activity.body_received(10 << 20);
        // Within the grace a body still arriving is busy: a real client's is on its way.
        assert!(r.admit(ip(1), t0 + BODY_GRACE / 2).is_none());
        let later = t0 + BODY_GRACE * 2;
        let newcomer = r.admit(ip(1), later).expect("a slow body made room");
        let _n = newcomer.activity.begin(false, later);
        assert!(!r.open.contains_key(&trickle.id), "the slowest went");
        assert!(r.open.contains_key(&upload.id), "the fast upload stays");
        // Once its body is in, a request is busy however long it takes.
        upload.activity.body_done();
        assert!(r.admit(ip(1), later + Duration::from_secs(600)).is_none());
    }

    #[test]
    fn a_response_nobody_reads_makes_room_after_its_grace() {
        let t0 = Instant::now();
        let mut r = Registry::new(10, 1);
        let unread = r.admit(ip(1), t0).expect("room");
        let _busy = unread.activity.begin(false, t0);
        unread.activity.write_stalled(true, t0);
        assert!(r.admit(ip(1), t0 + WRITE_STALL_GRACE / 2).is_none());
        // A write that went through starts the grace over.
        unread
            .activity
            .write_stalled(false, t0 + WRITE_STALL_GRACE / 2);
        assert!(r.admit(ip(1), t0 + WRITE_STALL_GRACE).is_none());
        unread.activity.write_stalled(true, t0 + WRITE_STALL_GRACE);
        assert!(r.admit(ip(1), t0 + WRITE_STALL_GRACE * 2).is_some());
        assert!(!r.open.contains_key(&unread.id));
    }

    #[test]
    fn idle_goes_before_unread_before_slow_bodies() {
        let t0 = Instant::now();
        let mut r = Registry::new(3, 3);
        let slow = r.admit(ip(1), t0).expect("room");
        let _s = slow.activity.begin(true, t0);
        let unread = r.admit(ip(1), t0).expect("room");
        let _u = unread.activity.begin(false, t0);
        unread.activity.write_stalled(true, t0);
        let idle = r.admit(ip(1), t0 + Duration::from_secs(9)).expect("room");
        let later = t0 + Duration::from_secs(10);
        let mut busy = Vec::new();
        for (gone, what) in [
            (idle.id, "idle first"),
            (unread.id, "then unread"),
            (slow.id, "then the slow body"),
        ] {
            let newcomer = r.admit(ip(2), later).expect("room");
            busy.push(newcomer.activity.begin(false, later));
            assert!(!r.open.contains_key(&gone), "{what}");
        }
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_slash_64() {
        let t0 = Instant::now();
        let mut r = Registry::new(10, 2);
        let address = |last: u16| IpAddr::from([0x2001, 0xdb8, 0, 1, 0, 0, 0, last]);
        let first = r.admit(address(1), t0).expect("room");
        let _busy = first.activity.begin(false, t0);
        let second = r.admit(address(2), t0).expect("room");
        let _busy2 = second.activity.begin(false, t0);
        assert!(
            r.admit(address(3), t0).is_none(),
            "a third address of the same /64 is the same client"
        );
        let elsewhere = IpAddr::from([0x2001, 0xdb8, 0, 2, 0, 0, 0, 1]);
        assert!(r.admit(elsewhere, t0).is_some());
        assert_eq!(client_of(IpAddr::from([127, 0, 0, 1])), ip(1));
    }
}
