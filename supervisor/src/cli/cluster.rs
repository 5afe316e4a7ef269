//! The `supervisor cluster` subcommands.

use std::path::Path;
use std::process::ExitCode;

use super::{EXIT_FAILED, open_board};

/// `supervisor cluster key`: this box's WireGuard public key (made the first time), for the
/// other members' `[[cluster.peers]]`.
pub fn key(root: &Path) -> ExitCode {
    let board = match open_board(root) {
        Ok(board) => board,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(super::EXIT_BAD_INPUT);
        }
    };
    match supervisor_core::cluster::keys::public_key(&board) {
        Ok(key) => {
            println!("{key}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: this box's WireGuard key: {e}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}
