//! `supervisor run`: the daemon in the foreground.

use std::path::Path;
use std::process::ExitCode;

use super::{EXIT_FAILED, load_with_runtime};

/// `supervisor --root DIR [--config FILE] run`.
pub fn run(root: &Path, config: Option<&Path>) -> ExitCode {
    let (board, config, rt) = match load_with_runtime(root, config) {
        Ok(loaded) => loaded,
        Err(code) => return code,
    };
    let result = rt.block_on(supervisor::daemon::run(&board, &config));
    // A re-verification stopped at shutdown may leave one board call or a model hash running on
    // a blocking thread: a write gets a moment to finish, a long hash is not waited for.
    rt.shutdown_timeout(std::time::Duration::from_secs(5));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
