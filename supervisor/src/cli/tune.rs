//! `supervisor apply`: the tuned state applied and verified.

use std::path::Path;
use std::process::ExitCode;

use supervisor_core::report;
use supervisor_core::tune;

use super::{EXIT_FAILED, load_with_runtime};

/// `supervisor --root DIR [--config FILE] apply [--dry-run]`.
pub fn apply(root: &Path, config: Option<&Path>, dry_run: bool) -> ExitCode {
    let (board, config, rt) = match load_with_runtime(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let reports = rt.block_on(tune::apply_configured(&board, &config, dry_run));
    print!("{}", report::steps_table(&reports));
    if tune::all_succeeded(&reports) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    }
}
