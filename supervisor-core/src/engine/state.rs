//! The engine's state as the daemon publishes it (one JSON file, replaced atomically on every
//! change) and as `supervisor status` reads it back.

use crate::pid::alive;
use serde::{Deserialize, Serialize};

use super::local::Access;
use crate::board::Board;

/// Where the running daemon publishes the engine's state (a tmpfs on the box).
pub const STATE_FILE: &str = "/run/appliance/engine.json";

/// What the engine is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Not running: the supervisor is not running or is shutting down.
    Stopped,
    /// Not launched: the model did not pass verification.
    Blocked,
    /// Launched, waiting for `/health`.
    Starting,
    /// Serving; the last health probe passed.
    Ready,
    /// Exited or failed its probe; restarting after a pause.
    BackingOff,
    /// Failed more times in a row than allowed; no more restarts until the supervisor restarts.
    Failing,
}

/// The `engine` section of `status --json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineStatus {
    /// What it is doing.
    pub state: Phase,
    /// Why, in words ("engine failing: ...", "model refused: ...").
    pub reason: String,
    /// Process id while one runs.
    pub pid: Option<u32>,
    /// The model it serves.
    pub model_id: String,
    /// SHA-256 of the verified weights it was given.
    pub model_sha256: Option<String>,
    /// Where it listens (loopback only).
    pub url: Option<String>,
    /// Seconds since the running process became ready.
    pub uptime_s: Option<u64>,
    /// When it became ready (Unix seconds); `uptime_s` is computed from it when read.
    pub ready_unix: Option<u64>,
    /// Restarts since the supervisor started.
    pub restarts: u32,
    /// How the last process ended, e.g. "killed by signal 9" or "exit status 1".
    pub last_exit: Option<String>,
    /// Recent prompt-processing speed, from the engine's own timings.
    pub prefill_tokens_per_second: Option<f64>,
    /// Recent generation speed, from the engine's own timings.
    pub decode_tokens_per_second: Option<f64>,
    /// Tool calls since the running engine started, once it has answered a probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<wire::status::ToolCalls>,
    /// As a cluster's head: which layers each member holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<crate::cluster::split::Split>,
    /// The engine's last output lines.
    pub recent_log: Vec<String>,
    /// The daemon that published this.
    pub supervisor_pid: Option<u32>,
    /// The way in to the running server (its control socket and key, or its loopback port),
    /// for the supervisor's and the dashboard's requests to it: in memory only, never in the
    /// published file or `status --json`.
    #[serde(skip)]
    pub access: Option<Access>,
}

impl EngineStatus {
    /// The state before anything happened.
    pub fn new(model_id: &str) -> EngineStatus {
        EngineStatus {
            state: Phase::Stopped,
            reason: "not started".into(),
            pid: None,
            model_id: model_id.into(),
            model_sha256: None,
            url: None,
            uptime_s: None,
            ready_unix: None,
            restarts: 0,
            last_exit: None,
            prefill_tokens_per_second: None,
            decode_tokens_per_second: None,
            tool_calls: None,
            split: None,
            recent_log: Vec::new(),
            supervisor_pid: Some(std::process::id()),
            access: None,
        }
    }

    /// Writes it to [`STATE_FILE`] atomically.
    pub fn publish(&self, board: &Board) -> Result<(), String> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        board
            .create_dir_all("/run/appliance")
            .and_then(|()| board.replace_file(STATE_FILE, &text))
            .map_err(|e| e.to_string())
    }
}

/// The engine's state as the daemon last published it; `stopped` when no daemon is running.
pub fn read_status(board: &Board, model_id: &str) -> EngineStatus {
    let stopped = |reason: String| EngineStatus {
        state: Phase::Stopped,
        reason,
        supervisor_pid: None,
        ..EngineStatus::new(model_id)
    };
    let text = match board.read_optional(STATE_FILE) {
        Ok(Some(text)) => text,
        Ok(None) => return stopped("the supervisor daemon is not running".into()),
        Err(e) => return stopped(format!("cannot read the engine state: {e}")),
    };
    let mut status: EngineStatus = match serde_json::from_str(&text) {
        Ok(status) => status,
        Err(e) => return stopped(format!("cannot parse {STATE_FILE}: {e}")),
    };
    if !status.supervisor_pid.is_some_and(alive) {
        return EngineStatus {
            last_exit: status.last_exit.take(),
            restarts: status.restarts,
            recent_log: std::mem::take(&mut status.recent_log),
            ..stopped("the supervisor daemon is not running".into())
        };
    }
    status.uptime_s = status
        .ready_unix
        .map(|t| weights::install::now_unix().saturating_sub(t));
    status
}
