//! Talking to the engine over its control socket: readiness (`/health`) and the health probe.
//! Blocking calls, run off the async runtime. The socket is the supervisor's alone, so users
//! who hold every connection of the engine's TCP port (slow bodies, unread answers, many
//! streams) cannot make a healthy engine look dead.
//!
//! A busy engine is a healthy engine: while it generates, the probe's own completion would wait
//! behind the user's answer, so then progress (`tokens_processed` growing) is the proof of life;
//! only an idle engine is asked for a one-token completion. Progress is judged over time, not
//! from one probe to the next: the engine counts a long prompt's tokens a slice (128 tokens) at
//! a time, and on a loaded board one slice can take longer than a probe interval.

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::local::{self, Access};

/// The largest answer of `/health` or the probe's completion read.
const MAX_ANSWER: usize = 64 << 10;

/// The engine's answer to `/health`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Health {
    /// A request is being generated right now.
    #[serde(default)]
    pub busy: bool,
    /// Tokens evaluated or generated since the engine started: grows while it works.
    #[serde(default)]
    pub tokens_processed: u64,
    /// Its recent speeds.
    #[serde(default)]
    pub speeds: Speeds,
    /// Its tool-call counters since it started.
    #[serde(default)]
    pub tool_calls: wire::status::ToolCalls,
}

/// The engine's recent speeds (`/health` → `speeds`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct Speeds {
    /// Prompt tokens per second.
    pub prefill_tokens_per_second: Option<f64>,
    /// Generated tokens per second.
    pub decode_tokens_per_second: Option<f64>,
}

/// `GET /health`: `Ok` once the model is loaded (200), `Err` with why not otherwise.
pub fn health(access: &Access, timeout: Duration) -> Result<Health, String> {
    let answer = local::request(access, "GET", "/health", &[], None, timeout, MAX_ANSWER)?;
    if answer.status != 200 {
        return Err(format!("/health answered {}", answer.status));
    }
    serde_json::from_str(&answer.body).map_err(|e| format!("/health: unexpected answer: {e}"))
}

/// How the engine answered the probe's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// It generated the token.
    Generated,
    /// 503: its request queue is full. It is alive and answering; only too busy to take more.
    QueueFull,
}

/// A one-token greedy completion: the engine is healthy only if it can still generate. It
/// carries the launch's control key, so an engine that knows it serves it ahead of users.
pub fn complete_one_token(access: &Access, timeout: Duration) -> Result<Completion, String> {
    let body = r#"{"prompt":"Hello","n_predict":1,"temperature":0}"#;
    let answer = local::request(
        access,
        "POST",
        "/completion",
        &[],
        Some(body),
        timeout,
        MAX_ANSWER,
    )?;
    let (status, text) = (answer.status, answer.body);
    // A full queue is an engine answering; any other 503 (shutting down, its generation
    // thread gone) is an engine that cannot generate.
    if status == 503 && text.contains("queue is full") {
        return Ok(Completion::QueueFull);
    }
    if status != 200 {
        return Err(format!("/completion answered {status}: {}", text.trim()));
    }
    let answer: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("/completion: unexpected answer: {e}"))?;
    match answer.get("tokens_predicted").and_then(|n| n.as_u64()) {
        Some(_) => Ok(Completion::Generated),
        None => Err("/completion: no tokens_predicted in the answer".into()),
    }
}

/// The shortest time a busy engine may go without counting a token before it is taken for
/// wedged: well above the slowest slice of a long prompt seen on a loaded board (seconds).
pub const MIN_STALL: Duration = Duration::from_secs(30);

/// When a busy engine's token count last moved, across probes.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    tokens: u64,
    moved_at: Instant,
}

impl Progress {
    /// What a probe at `now` saw.
    pub fn new(health: &Health, now: Instant) -> Progress {
        Progress {
            tokens: health.tokens_processed,
            moved_at: now,
        }
    }

    /// The progress after a probe at `now` saw `health`, or why the engine counts as wedged: busy
    /// with no token counted for `stall_limit` or longer. An idle engine has nothing to count.
    pub fn update(
        self,
        health: &Health,
        now: Instant,
        stall_limit: Duration,
    ) -> Result<Progress, String> {
        if !health.busy || health.tokens_processed != self.tokens {
            return Ok(Progress::new(health, now));
        }
        let still = now.saturating_duration_since(self.moved_at);
        if still >= stall_limit {
            return Err(format!(
                "busy, but no token processed for {} s ({} in all)",
                still.as_secs(),
                health.tokens_processed
            ));
        }
        Ok(self)
    }
}

/// One health probe: the engine answers `/health` within `timeout`, and, when idle, completes a
/// token within `timeout` or says its queue is full (503: answering, so alive); when that
/// completion fails but the engine processed tokens meanwhile (a user's request arrived first
/// and the probe's waited behind it), it is busy, not dead. Whether a busy engine progresses is
/// [`Progress`]'s to judge.
pub fn check(access: &Access, timeout: Duration) -> Result<Health, String> {
    let before = health(access, timeout)?;
    if before.busy {
        return Ok(before);
    }
    match complete_one_token(access, timeout) {
        Ok(Completion::Generated | Completion::QueueFull) => health(access, timeout),
        Err(e) => {
            let after = health(access, timeout)?;
            if after.tokens_processed > before.tokens_processed {
                Ok(after)
            } else {
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::sync::{Arc, Mutex};

    /// A stand-in engine on a control socket: `/health` says idle, `/completion` answers
    /// `status`. Returns its socket (in a directory kept while it lives) and the requests it
    /// saw (request line and headers).
    fn stand_in(
        completion_status: u16,
        message: &'static str,
    ) -> (
        (tempfile::TempDir, std::path::PathBuf),
        Arc<Mutex<Vec<String>>>,
    ) {
        let dir = tempfile::tempdir().expect("dir");
        let socket = dir.path().join("control.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut head = String::new();
                let mut length = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                        break;
                    }
                    if let Some(n) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        length = n.trim().parse().unwrap_or(0);
                    }
                    head.push_str(&line);
                }
                let mut body = vec![0u8; length];
                let _ = std::io::Read::read_exact(&mut reader, &mut body);
                let (status, text) = if head.starts_with("GET /health") {
                    (200, r#"{"busy":false,"tokens_processed":7}"#.to_string())
                } else {
                    (
                        completion_status,
                        format!(r#"{{"error":{{"message":"{message}"}}}}"#),
                    )
                };
                log.lock().expect("log").push(head);
                let _ = write!(
                    stream,
                    "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{text}",
                    text.len()
                );
            }
        });
        ((dir, socket), seen)
    }

    #[test]
    fn a_busy_engine_is_wedged_only_after_the_stall_limit_without_a_token() {
        let busy = |tokens| Health {
            busy: true,
            tokens_processed: tokens,
            ..Health::default()
        };
        let t0 = Instant::now();
        let limit = Duration::from_secs(30);
        let progress = Progress::new(&busy(100), t0);
        // A long prompt's slice still running after several probe intervals: not wedged.
        let progress = progress
            .update(&busy(100), t0 + Duration::from_secs(29), limit)
            .expect("still within the limit");
        // A slice done: the clock starts over.
        let progress = progress
            .update(&busy(228), t0 + Duration::from_secs(29), limit)
            .expect("progress");
        let progress = progress
            .update(&busy(228), t0 + Duration::from_secs(58), limit)
            .expect("29 s since the last token");
        let e = progress
            .update(&busy(228), t0 + Duration::from_secs(59), limit)
            .expect_err("30 s without a token");
        assert!(e.contains("no token processed for 30 s"), "{e}");
        // Idle is never stalled.
        let idle = Health::default();
        assert!(
            progress
                .update(&idle, t0 + Duration::from_secs(600), limit)
                .is_ok()
        );
    }

    #[test]
    fn a_full_queue_is_an_engine_answering_not_a_dead_one() {
        let key = super::super::ControlKey::generate().expect("key");
        let through = |socket: &std::path::Path| Access {
            endpoint: local::Endpoint::Socket(socket.to_path_buf()),
            key: Some(key.clone()),
        };
        let ((_dir, socket), seen) = stand_in(503, "the request queue is full; retry shortly");
        let health = check(&through(&socket), Duration::from_secs(5)).expect("alive");
        assert_eq!(health.tokens_processed, 7);
        let requests = seen.lock().expect("log").clone();
        let completion = requests
            .iter()
            .find(|r| r.starts_with("POST /completion"))
            .expect("the probe asked for a token");
        assert!(
            completion
                .to_ascii_lowercase()
                .contains(&format!("x-engine-control: {}", key.as_str())),
            "{completion}"
        );
        // Any other failure still counts, a 503 that is not a full queue too.
        let ((_dir, socket), _) = stand_in(500, "generation failed");
        let e = check(&through(&socket), Duration::from_secs(5)).expect_err("failing");
        assert!(e.contains("answered 500"), "{e}");
        let ((_dir, socket), _) = stand_in(503, "the engine is shutting down");
        let e = check(&through(&socket), Duration::from_secs(5)).expect_err("cannot generate");
        assert!(e.contains("answered 503"), "{e}");
    }
}
