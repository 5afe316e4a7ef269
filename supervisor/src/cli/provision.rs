//! `supervisor provision apply`.

use std::path::Path;
use std::process::ExitCode;

use supervisor_core::report;

use super::{EXIT_FAILED, bad_input, open_board};

/// `supervisor provision apply [--from DIR] [--json]`: needs only the board, not the configuration (which
/// provisioning feeds).
pub fn apply(root: &Path, from: Option<&str>, json: bool) -> ExitCode {
    use supervisor_core::provision::Outcome;
    let board = match open_board(root) {
        Ok(board) => board,
        Err(e) => return bad_input(e),
    };
    // Before anything is recorded: the floor keeps the record's times plausible.
    match supervisor_core::clock::raise_to_floor(&board) {
        Ok(Some(changed)) => eprintln!("{changed}"),
        Ok(None) => {}
        Err(e) => eprintln!("warning: the clock floor could not be kept: {e}"),
    }
    let source = match from {
        Some(dir) => supervisor_core::provision::Source::SignedDir(dir.to_string()),
        None => supervisor_core::provision::Source::BootPartition,
    };
    let report = match supervisor_core::provision::apply(&board, &source) {
        Ok(report) => report,
        Err(e) => return bad_input(format!("provisioning: {e}")),
    };
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => return bad_input(format!("cannot encode the report: {e}")),
        }
    } else {
        print!("{}", report::provision_text(&report.record));
    }
    if report.outcome == Outcome::Rejected {
        eprintln!(
            "error: provisioning file refused, nothing applied: {}",
            report.message
        );
        ExitCode::from(EXIT_FAILED)
    } else {
        eprintln!("{}", report.message);
        ExitCode::SUCCESS
    }
}
