//! `supervisor overclock …`.

use std::path::Path;
use std::process::ExitCode;

use supervisor_core::report;

use super::{EXIT_FAILED, bad_input, load};

/// `supervisor overclock status [--json]`.
pub fn status(root: &Path, config: Option<&Path>, json: bool) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let status = supervisor_core::overclock::status(&board, &config);
    if json {
        return match serde_json::to_string_pretty(&status) {
            Ok(text) => {
                println!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => bad_input(format!("cannot encode status: {e}")),
        };
    }
    print!("{}", report::overclock_text(&status));
    if status.error.is_some() {
        ExitCode::from(EXIT_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

fn outcome(result: Result<supervisor_core::overclock::Outcome, String>) -> ExitCode {
    match result {
        Ok(supervisor_core::overclock::Outcome::Continue(message)) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Ok(supervisor_core::overclock::Outcome::Rebooting(message)) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Ok(supervisor_core::overclock::Outcome::Stopped(message)) => {
            eprintln!("error: {message}");
            ExitCode::from(EXIT_FAILED)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

/// `supervisor overclock start`.
pub fn start(root: &Path, config: Option<&Path>) -> ExitCode {
    match load(root, config) {
        Ok((board, config)) => outcome(supervisor_core::overclock::start(&board, &config)),
        Err(code) => code,
    }
}

/// `supervisor overclock boot`.
pub fn boot(root: &Path, config: Option<&Path>) -> ExitCode {
    match load(root, config) {
        Ok((board, config)) => outcome(supervisor_core::overclock::on_boot(&board, &config)),
        Err(code) => code,
    }
}

/// `supervisor overclock abort`.
pub fn abort(root: &Path, config: Option<&Path>) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    match supervisor_core::overclock::abort(&board, &config) {
        Ok(message) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
