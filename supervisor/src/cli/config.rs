//! `supervisor config check`.

use std::path::Path;
use std::process::ExitCode;

use supervisor_core::config::Config;

use super::bad_input;

/// `supervisor config check FILE`.
pub fn check(file: &Path) -> ExitCode {
    match Config::from_file(file) {
        Ok(_) => {
            println!("{}: ok", file.display());
            ExitCode::SUCCESS
        }
        Err(e) => bad_input(e),
    }
}
