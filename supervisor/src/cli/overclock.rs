//! `supervisor overclock …`.

use std::path::Path;
use std::process::ExitCode;

use supervisor::report;

use super::{EXIT_FAILED, bad_input, load};

/// `supervisor overclock status [--json]`.
pub fn status(root: &Path, config: Option<&Path>, json: bool) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let status = supervisor::overclock::status(&board, &config);
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

fn outcome(result: Result<supervisor::overclock::Outcome, String>) -> ExitCode {
    match result {
        Ok(supervisor::overclock::Outcome::Continue(message)) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Ok(supervisor::overclock::Outcome::Rebooting(message)) => {
            println!("{message}");
            ExitCode::SUCCESS
        }
        Ok(supervisor::overclock::Outcome::Stopped(message)) => {
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
        Ok((board, config)) => outcome(supervisor::overclock::start(&board, &config)),
        Err(code) => code,
    }
}

/// `supervisor overclock boot`.
pub fn boot(root: &Path, config: Option<&Path>) -> ExitCode {
    match load(root, config) {
        Ok((board, config)) => outcome(supervisor::overclock::on_boot(&board, &config)),
        Err(code) => code,
    }
}

/// `supervisor overclock abort`.
pub fn abort(root: &Path, config: Option<&Path>) -> ExitCode {
    let (board, config) = match load(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    match supervisor::overclock::abort(&board, &config) {
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
