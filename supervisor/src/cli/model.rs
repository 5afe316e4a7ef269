//! The `supervisor model` subcommands: the box's models, a switch through the health gate,
//! a removal.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use supervisor_core::board::Board;
use supervisor_core::config::Config;
use supervisor_core::models::PushError;
use supervisor_core::models::catalog::{self, Asked};
use supervisor_core::models::selection::{self, COMMITTED};
use wire::models::Models;

use super::{EXIT_BAD_INPUT, EXIT_FAILED, load};

/// `supervisor model list [--json]`.
pub fn list(root: &Path, config: Option<&Path>, json: bool) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let models = match catalog::list(&board, &config) {
        Ok(models) => models,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    if json {
        match serde_json::to_string_pretty(&models) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("error: cannot encode: {e}");
                return ExitCode::from(EXIT_FAILED);
            }
        }
    } else {
        print!("{}", table(&models));
    }
    ExitCode::SUCCESS
}

/// The models as lines a person reads.
pub fn table(models: &Models) -> String {
    let mut out = format!(
        "{:2} {:32} {:>10} {:10} {}\n",
        "", "MODEL", "MIB", "DRAFT", "VERIFIED / PROBLEM"
    );
    for m in &models.installed {
        let mark = models.mark(&m.id);
        let state = match (&m.problem, m.verified_unix) {
            (Some(p), _) => p.clone(),
            (None, Some(t)) => format!("every chunk at {t} (unix)"),
            (None, None) => "not yet".into(),
        };
        out.push_str(&format!(
            "{mark:2} {:32} {:>10} {:10} {state}\n",
            m.id,
            m.size >> 20,
            if m.draft { "yes" } else { "no" }
        ));
    }
    for push in &models.incoming {
        let (got, all) = push.chunk_counts();
        out.push_str(&format!(
            "   {:32} {:>10} {:10} push under way: {got} of {all} chunks\n",
            push.id,
            push.parts.iter().map(|p| p.size).sum::<u64>() >> 20,
            ""
        ));
    }
    if let Some(s) = models.switching.as_ref().or(models.requested.as_ref()) {
        out.push_str(&format!("switching to {} (request {})\n", s.to, s.request));
    }
    if let Some(last) = models.history.last() {
        out.push_str(&format!(
            "last switch: {} → {} {}: {}\n",
            last.from.as_deref().unwrap_or("?"),
            last.to,
            last.result,
            last.reason
        ));
    }
    if let Some(free) = models.free_bytes {
        out.push_str(&format!("free on the data partition: {} MiB\n", free >> 20));
    }
    out
}

/// `supervisor model use ID`: asks the daemon to switch, then waits for the outcome (exit 0
/// committed, 1 rolled back or refused).
pub fn switch(root: &Path, config: Option<&Path>, id: &str) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let request = match catalog::ask_switch(&board, &config, id) {
        Ok(Asked::AlreadyActive) => {
            println!("{id} is already the active model");
            return ExitCode::SUCCESS;
        }
        Ok(Asked::Queued(request)) => request,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(EXIT_BAD_INPUT);
        }
    };
    let engine = supervisor_core::engine::read_status(&board, &config.model.id);
    if engine.supervisor_pid.is_none() {
        println!(
            "asked for {id} (request {request}); the daemon is not running: it switches when it starts"
        );
        return ExitCode::SUCCESS;
    }
    eprintln!("switching to {id} (request {request}); waiting for it to prove healthy");
    let e = &config.engine;
    let deadline = Instant::now()
        + 2 * Duration::from_secs(e.start_timeout_s.get())
        + 2 * Duration::from_millis(e.health_timeout_ms.get())
        + Duration::from_secs(60);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        let Ok(selection) = selection::read(&board, &config) else {
            continue;
        };
        if let Some(outcome) = selection.history.iter().find(|s| s.request == request) {
            println!("{}: {}", outcome.result, outcome.reason);
            return if outcome.result == COMMITTED {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(EXIT_FAILED)
            };
        }
    }
    eprintln!("error: no outcome of request {request} in time; see `supervisor model list`");
    ExitCode::from(EXIT_FAILED)
}

/// `supervisor model rm ID`.
pub fn remove(root: &Path, config: Option<&Path>, id: &str) -> ExitCode {
    on_board(root, config, |board, config| {
        catalog::remove(board, config, id)
    })
}

/// `supervisor model install-stick DIR`.
pub fn install_stick(root: &Path, config: Option<&Path>, dir: &str) -> ExitCode {
    on_board(root, config, |board, config| {
        supervisor_core::models::stick::from_stick(board, config, dir)
    })
}

/// Runs `work` on the board and its configuration: what it said printed (exit 0), or why it
/// refused (exit 1).
fn on_board(
    root: &Path,
    config: Option<&Path>,
    work: impl FnOnce(&Board, &Config) -> Result<String, PushError>,
) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    match work(&board, &config) {
        Ok(said) => {
            println!("{said}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
