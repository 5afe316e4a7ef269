//! The binary's commands: one module per group of subcommands, each function one subcommand;
//! `main.rs` only parses arguments and calls these. They call the library, print what it
//! returns and pick the exit status; the library itself never prints or exits.
//!
//! Exit status: 0 success; 1 a tuning step failed (or the daemon stopped on an error);
//! 2 bad input (configuration, board root, arguments).

pub mod cluster;
pub mod config;
pub mod daemon;
pub mod dashboard;
pub mod model;
pub mod overclock;
pub mod provision;
#[cfg(feature = "sim")]
pub mod sim;
pub mod status;
pub mod tune;
pub mod update;
pub mod weights;

use std::path::Path;
use std::process::ExitCode;

use supervisor_core::board::{Board, BoardResult};
use supervisor_core::config::Config;

/// Exit status for bad input.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit status when a step failed.
pub const EXIT_FAILED: u8 = 1;

fn bad_input(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_BAD_INPUT)
}

/// Opens the board at `root`. With the `sim` feature a simulated tree opens through
/// `board-sim`; without it (the production build) only the live board opens, and a simulated
/// tree is refused.
pub fn open_board(root: &Path) -> BoardResult<Board> {
    #[cfg(feature = "sim")]
    return board_sim::open(root);
    #[cfg(not(feature = "sim"))]
    Board::open(root)
}

/// The board and its configuration, or the bad-input exit having said why.
pub fn load(root: &Path, config: Option<&Path>) -> Result<(Board, Config), ExitCode> {
    let board = open_board(root).map_err(bad_input)?;
    let config =
        supervisor_core::models::selection::config_for_board(&board, config).map_err(bad_input)?;
    Ok((board, config))
}

/// [`load`], and the runtime an async command (`apply`, `run`) runs on.
fn load_with_runtime(
    root: &Path,
    config: Option<&Path>,
) -> Result<(Board, Config, tokio::runtime::Runtime), ExitCode> {
    let (board, config) = load(root, config)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| bad_input(format!("cannot start the async runtime: {e}")))?;
    Ok((board, config, rt))
}

/// The trust a `weights` command checks signatures with.
pub fn trust_for(config: &Config) -> Result<::weights::sign::Trust, ExitCode> {
    supervisor_core::model::trust(config).map_err(bad_input)
}
