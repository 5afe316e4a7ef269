//! `supervisor sim …` (feature `sim`): simulated boards for tests and local runs.

use std::path::Path;
use std::process::ExitCode;

use super::{EXIT_FAILED, bad_input};

/// `supervisor sim init DIR [--variant NAME]` (feature `sim`).
pub fn init(dir: &Path, variant: &str) -> ExitCode {
    let Some(v) = board_sim::Variant::from_name(variant) else {
        let names: Vec<&str> = board_sim::Variant::ALL.iter().map(|(n, _)| *n).collect();
        return bad_input(format!(
            "unknown board variant \"{variant}\"; choose one of: {}",
            names.join(", ")
        ));
    };
    match board_sim::init(dir, v) {
        Ok(()) => {
            println!("simulated {} board written to {}", v.name(), dir.display());
            ExitCode::SUCCESS
        }
        Err(e) => bad_input(format!(
            "cannot write a simulated board to {}: {e}",
            dir.display()
        )),
    }
}

/// `supervisor sim write-slot DIR SLOT VERSION` (feature `sim`).
pub fn write_slot(dir: &Path, slot: &str, version: &str) -> ExitCode {
    if !dir.join(board_sim::MARKER).is_file() {
        return bad_input(format!("{} is not a simulated board", dir.display()));
    }
    match board_sim::write_slot(dir, slot, version) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => bad_input(format!("writing slot {slot} of {}: {e}", dir.display())),
    }
}

/// `supervisor sim boot DIR` (feature `sim`).
pub fn boot(dir: &Path) -> ExitCode {
    if !dir.join(board_sim::MARKER).is_file() {
        return bad_input(format!("{} is not a simulated board", dir.display()));
    }
    match board_sim::firmware::boot(dir) {
        Ok(story) => {
            println!("{story}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: booting {}: {e}", dir.display());
            ExitCode::from(EXIT_FAILED)
        }
    }
}
