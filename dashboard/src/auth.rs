//! Who may see and change the dashboard: the password (Argon2), in-memory sessions, CSRF tokens,
//! API tokens, and the login rate limit.
//!
//! Session ids are 256 random bits; only their SHA-256 is kept, so a memory dump does not hand
//! out live sessions. Every session carries its own CSRF token, checked on every POST.

use std::collections::{HashMap, VecDeque};
use std::io::Read;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use argon2::password_hash::PasswordVerifier;
use sha2::{Digest, Sha256};

pub use provision::secrets::hash_password;
use provision::secrets::random_256;
use supervisor_core::config::TokenDigest;

/// How long a session lives after login, renewed by nothing: a clinic logs in again each day.
pub const SESSION_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Sessions kept at most; the oldest goes first, so a flood of logins cannot fill memory.
const MAX_SESSIONS: usize = 64;
/// Failed logins allowed per client address in [`WINDOW`] before 429.
pub const FAILURES_PER_CLIENT: usize = 5;
/// Failed logins from all clients together in [`WINDOW`] past which a client that has failed
/// itself gets no further try, so guessing from many addresses is slowed as well. A client that
/// has not failed is never refused by it: strangers' guesses must not lock the owner out.
pub const FAILURES_GLOBAL: usize = 30;
/// The rate limit's sliding window.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Failures remembered at most (the oldest are forgotten first): bounds the limiter's memory
/// while still counting far more guesses than Argon2 lets a window hold.
const MAX_REMEMBERED_FAILURES: usize = 4096;

/// Lowercase hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Equality whose time does not depend on where the inputs differ (only on their lengths,
/// which are public: hex digests and tokens of fixed size).
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether `password` matches the PHC string (which config loading already checked).
pub fn verify_password(phc: &str, password: &str) -> bool {
    match argon2::password_hash::PasswordHash::new(phc) {
        Ok(hash) => argon2::Argon2::default()
            .verify_password(password.as_bytes(), &hash)
            .is_ok(),
        Err(_) => false,
    }
}

/// The configured entry a presented bearer token's SHA-256 is listed under, if any. Every
/// digest is compared, so the time does not say which one nearly matched.
pub fn token_scopes<'a>(token: &str, allowed: &'a [TokenDigest]) -> Option<&'a TokenDigest> {
    let digest = sha256_hex(token.as_bytes());
    allowed.iter().fold(None, |found, d| {
        let same = constant_time_eq(digest.as_bytes(), d.digest().as_bytes());
        found.or(same.then_some(d))
    })
}

/// What the server knows about one logged-in browser.
#[derive(Debug, Clone)]
pub struct Session {
    /// The token its forms and scripts must send with every POST.
    pub csrf: String,
    created: Instant,
}

/// Logged-in sessions, by the SHA-256 of their id.
#[derive(Debug, Default)]
pub struct Sessions {
    by_digest: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// Starts a session; returns the id for the cookie (never stored) and the session.
    pub fn create(&self) -> Result<(String, Session), String> {
        let id = hex::encode(random_256()?);
        let session = Session {
            csrf: hex::encode(random_256()?),
            created: Instant::now(),
        };
        let mut map = self.by_digest.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, s| s.created.elapsed() < SESSION_LIFETIME);
        while map.len() >= MAX_SESSIONS {
            let oldest = map
                .iter()
                .min_by_key(|(_, s)| s.created)
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => map.remove(&k),
                None => break,
            };
        }
        map.insert(sha256_hex(id.as_bytes()), session.clone());
        Ok((id, session))
    }

    /// The live session for a cookie value.
    pub fn get(&self, id: &str) -> Option<Session> {
        let digest = sha256_hex(id.as_bytes());
        let mut map = self.by_digest.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(&digest) {
            Some(s) if s.created.elapsed() < SESSION_LIFETIME => Some(s.clone()),
            Some(_) => {
                map.remove(&digest);
                None
            }
            None => None,
        }
    }

    /// Ends a session.
    pub fn remove(&self, id: &str) {
        let digest = sha256_hex(id.as_bytes());
        self.by_digest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&digest);
    }
}

/// Failed login attempts in the last [`WINDOW`], per client and overall. An attempt counts as
/// failed from the moment its password check begins until it succeeds, so checks running at
/// once cannot together take more tries than the limit allows.
#[derive(Debug, Default)]
pub struct LoginLimiter {
    failures: Mutex<VecDeque<Failure>>,
    next_id: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Clone, Copy)]
struct Failure {
    client: IpAddr,
    at: Instant,
    id: u64,
}

/// A password check under way, counted as failed unless [`Attempt::succeeded`] is called.
pub struct Attempt<'a> {
    limiter: &'a LoginLimiter,
    id: u64,
}

impl Attempt<'_> {
    /// The password was right: the attempt no longer counts against the client.
    pub fn succeeded(self) {
        self.limiter.lock().retain(|f| f.id != self.id);
    }
}

/// The address a client is counted under: an IPv6 client by its /64 (one subscriber's share,
/// where every address is the same client), an IPv4-mapped one as IPv4.
fn client_key(client: IpAddr) -> IpAddr {
    match client {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(v6) & !((1u128 << 64) - 1),
            )),
        },
    }
}

impl LoginLimiter {
    /// `Some(seconds to wait)` when `client` may not try now.
    pub fn check(&self, client: IpAddr) -> Option<u64> {
        self.check_at(client, Instant::now())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Failure>> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_at(&self, client: IpAddr, now: Instant) -> Option<u64> {
        Self::wait_in(&mut self.lock(), client_key(client), now)
    }

    fn wait_in(failures: &mut VecDeque<Failure>, client: IpAddr, now: Instant) -> Option<u64> {
        failures.retain(|f| now.duration_since(f.at) < WINDOW);
        let mine: Vec<Instant> = failures
            .iter()
            .filter(|f| f.client == client)
            .map(|f| f.at)
            .collect();
        if mine.is_empty() {
            return None;
        }
        let wait_for = |times: &[Instant], limit: usize| -> Option<u64> {
            if times.len() < limit {
                return None;
            }
            // Allowed again once the oldest failure counted against the limit leaves the window.
            let oldest = times[times.len() - limit];
            let left = WINDOW.saturating_sub(now.duration_since(oldest));
            Some(left.as_secs().max(1))
        };
        let all: Vec<Instant> = failures.iter().map(|f| f.at).collect();
        match (
            wait_for(&mine, FAILURES_PER_CLIENT),
            wait_for(&all, FAILURES_GLOBAL),
        ) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether `client` has failed within the window (and so is held to the global limit and
    /// gets no queued password check).
    pub fn has_failed(&self, client: IpAddr) -> bool {
        let client = client_key(client);
        let now = Instant::now();
        self.lock()
            .iter()
            .any(|f| f.client == client && now.duration_since(f.at) < WINDOW)
    }

    /// A password check for `client` begins, counted as failed until it succeeds; `Err(seconds
    /// to wait)` when the client may not try now. Checking and counting are one step, so
    /// attempts running at once never exceed the limit.
    pub fn attempt(&self, client: IpAddr) -> Result<Attempt<'_>, u64> {
        self.attempt_at(client, Instant::now())
    }

    fn attempt_at(&self, client: IpAddr, now: Instant) -> Result<Attempt<'_>, u64> {
        let client = client_key(client);
        let mut failures = self.lock();
        if let Some(wait) = Self::wait_in(&mut failures, client, now) {
            return Err(wait);
        }
        if failures.len() >= MAX_REMEMBERED_FAILURES {
            failures.pop_front();
        }
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        failures.push_back(Failure {
            client,
            at: now,
            id,
        });
        Ok(Attempt { limiter: self, id })
    }
}

/// Longest password read from stdin; anything longer is a mistake (a file piped in).
pub const MAX_PASSWORD: usize = 1024;

/// The password typed for `supervisor dashboard hash-password`, read from `input` (stdin)
/// without its final line break: not empty, at most [`MAX_PASSWORD`] bytes of UTF-8.
pub fn password_from(mut input: impl Read) -> Result<String, String> {
    let mut bytes = Vec::new();
    input
        .by_ref()
        .take(MAX_PASSWORD as u64 + 3)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the password from stdin: {e}"))?;
    let mut text =
        String::from_utf8(bytes).map_err(|_| "the password is not valid UTF-8".to_string())?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    if text.is_empty() {
        return Err("empty password: type it on stdin, e.g. `read -rs PW; printf '%s' \"$PW\" | supervisor dashboard hash-password`".into());
    }
    if text.len() > MAX_PASSWORD {
        return Err(format!("the password is longer than {MAX_PASSWORD} bytes"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashed_passwords_verify_and_wrong_ones_do_not() {
        let phc = hash_password("correct horse").expect("hash");
        assert!(phc.starts_with("$argon2id$v=19$"), "{phc}");
        assert!(verify_password(&phc, "correct horse"));
        assert!(!verify_password(&phc, "correct hors"));
        assert!(!verify_password("not a hash", "correct horse"));
        assert_ne!(phc, hash_password("correct horse").expect("hash"), "salted");
    }

    #[test]
    fn tokens_match_only_their_digest() {
        let digest = TokenDigest::try_from(sha256_hex(b"secret-token")).expect("digest");
        let other = TokenDigest::try_from("0".repeat(64)).expect("digest");
        assert_eq!(
            token_scopes("secret-token", &[other.clone(), digest.clone()]),
            Some(&digest)
        );
        assert!(token_scopes("secret-tokeN", &[other, digest]).is_none());
        assert!(token_scopes("secret-token", &[]).is_none());
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn sessions_are_found_by_id_only_and_end_on_logout() {
        let sessions = Sessions::default();
        let (id, session) = sessions.create().expect("session");
        assert_eq!(id.len(), 64);
        assert_eq!(sessions.get(&id).expect("live").csrf, session.csrf);
        assert!(sessions.get(&session.csrf).is_none());
        let map = sessions.by_digest.lock().expect("lock");
        assert!(!map.contains_key(&id), "the id itself is never stored");
        drop(map);
        sessions.remove(&id);
        assert!(sessions.get(&id).is_none());
        for _ in 0..MAX_SESSIONS + 5 {
            sessions.create().expect("session");
        }
        assert!(sessions.by_digest.lock().expect("lock").len() <= MAX_SESSIONS);
    }

    #[test]
    fn logins_are_limited_per_client_and_overall_and_recover() {
        let limiter = LoginLimiter::default();
        let a: IpAddr = [192, 168, 1, 10].into();
        let b: IpAddr = [192, 168, 1, 11].into();
        let t0 = Instant::now();
        for _ in 0..FAILURES_PER_CLIENT {
            assert_eq!(limiter.check_at(a, t0), None);
            limiter.attempt_at(a, t0).expect("allowed");
        }
        assert!(limiter.attempt_at(a, t0).is_err(), "the sixth is refused");
        let wait = limiter.check_at(a, t0).expect("limited");
        assert!((1..=60).contains(&wait), "{wait}");
        assert_eq!(
            limiter.check_at(b, t0),
            None,
            "another client is not blocked"
        );
        assert_eq!(limiter.check_at(a, t0 + WINDOW), None, "the window passes");

        let limiter = LoginLimiter::default();
        for i in 0..FAILURES_GLOBAL {
            let ip: IpAddr = [10, 0, (i / 200) as u8, (i % 200) as u8].into();
            limiter.attempt_at(ip, t0).expect("allowed");
        }
        assert_eq!(
            limiter.check_at(b, t0),
            None,
            "a client that has not failed is never locked out by others"
        );
        limiter.attempt_at(b, t0).expect("allowed");
        assert!(
            limiter.check_at(b, t0).is_some(),
            "one that has failed is held to the global limit"
        );
        assert!(limiter.has_failed(b) && !limiter.has_failed(a));
    }

    #[test]
    fn an_ipv6_client_is_counted_by_its_64() {
        let limiter = LoginLimiter::default();
        let t0 = Instant::now();
        for i in 0..FAILURES_PER_CLIENT as u16 {
            let ip: IpAddr = [0x2001, 0xdb8, 0, 1, 0, 0, 0, i + 1].into();
            limiter.attempt_at(ip, t0).expect("allowed");
        }
        let same_64: IpAddr = [0x2001, 0xdb8, 0, 1, 0xffff, 0, 0, 9].into();
        let other_64: IpAddr = [0x2001, 0xdb8, 0, 2, 0, 0, 0, 1].into();
        assert!(limiter.check_at(same_64, t0).is_some());
        assert_eq!(limiter.check_at(other_64, t0), None);
        let mapped: IpAddr = std::net::Ipv4Addr::new(192, 168, 1, 10)
            .to_ipv6_mapped()
            .into();
        limiter
            .attempt_at([192, 168, 1, 10].into(), t0)
            .expect("allowed");
        assert!(limiter.has_failed(mapped));
    }

    #[test]
    fn checks_running_at_once_take_no_more_tries_than_the_limit() {
        let limiter = LoginLimiter::default();
        let a: IpAddr = [192, 168, 1, 10].into();
        let t0 = Instant::now();
        // Every check begun before any ends: the limit still holds.
        let running: Vec<Attempt<'_>> = (0..3 * FAILURES_PER_CLIENT)
            .filter_map(|_| limiter.attempt_at(a, t0).ok())
            .collect();
        assert_eq!(running.len(), FAILURES_PER_CLIENT);
        // A right password gives its try back.
        let mut running = running.into_iter();
        running.next().expect("one").succeeded();
        assert!(limiter.attempt_at(a, t0).is_ok());
        assert!(limiter.attempt_at(a, t0).is_err());
    }

    #[test]
    fn the_final_line_break_is_not_part_of_the_password_and_empty_is_refused() {
        assert_eq!(password_from(&b"s3cret\n"[..]).expect("ok"), "s3cret");
        assert_eq!(password_from(&b"s3cret\r\n"[..]).expect("ok"), "s3cret");
        assert_eq!(
            password_from(&b" two words "[..]).expect("ok"),
            " two words "
        );
        assert!(password_from(&b"\n"[..]).is_err());
        assert!(password_from(&b""[..]).is_err());
        assert!(password_from(&[b'x'; 2000][..]).is_err());
    }
}
