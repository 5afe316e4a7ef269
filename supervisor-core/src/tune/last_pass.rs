//! The running daemon's last tuning pass (at start or a re-verification), published so that
//! `supervisor status` reports the steps in the same words as the dashboard at the same moment.
//!
//! Both re-observe the board and then take the daemon's word for what it did ([`super::status_after`]):
//! without this file `status` only knows the board as it is now, and would call `in-place` what
//! the daemon (and its dashboard) calls `applied`.

use serde::{Deserialize, Serialize};

use super::StepReport;
use crate::board::Board;

/// Where the running daemon publishes its last pass (a tmpfs on the box, cleared at boot).
pub const LAST_PASS_FILE: &str = "/run/appliance/tuning.json";

#[derive(Debug, Serialize, Deserialize)]
struct LastPass {
    /// The daemon that made the pass: a file left by one that is gone says nothing about now.
    supervisor_pid: u32,
    steps: Vec<StepReport>,
}

/// Writes this daemon's pass to [`LAST_PASS_FILE`] atomically.
pub fn publish(board: &Board, steps: &[StepReport]) -> Result<(), String> {
    let pass = LastPass {
        supervisor_pid: std::process::id(),
        steps: steps.to_vec(),
    };
    let text = serde_json::to_vec_pretty(&pass).map_err(|e| e.to_string())?;
    board
        .create_dir_all("/run/appliance")
        .and_then(|()| board.replace_file(LAST_PASS_FILE, &text))
        .map_err(|e| e.to_string())
}

/// The running daemon's last pass; `None` when no daemon is running or its file cannot be read
/// (then `status` reports the board as observed, which is still true, only less informed).
pub fn read(board: &Board) -> Option<Vec<StepReport>> {
    let text = match board.read_optional(LAST_PASS_FILE) {
        Ok(text) => text?,
        Err(e) => {
            tracing::debug!("cannot read the daemon's last tuning pass: {e}");
            return None;
        }
    };
    let pass: LastPass = match serde_json::from_str(&text) {
        Ok(pass) => pass,
        Err(e) => {
            tracing::debug!("cannot parse {LAST_PASS_FILE}: {e}");
            return None;
        }
    };
    crate::pid::alive(pass.supervisor_pid).then_some(pass.steps)
}
