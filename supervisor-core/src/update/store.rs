//! The update record on the data partition ([`crate::state_file`]).

use super::record::{Record, VERSION};
use crate::board::Board;
use crate::config::Config;
use crate::state_file::{StateFile, Versioned};

const FILE: StateFile = StateFile {
    file: "update.json",
    lock: "update.lock",
    what: "update record",
};

impl Versioned for Record {
    const VERSION: u32 = VERSION;
    fn layout_version(&self) -> u32 {
        self.version
    }
}

/// The record (a fresh one when no update ever ran).
pub fn load(board: &Board, config: &Config) -> Result<Record, String> {
    Ok(FILE.load(board, config)?.unwrap_or_default())
}

/// Held while the record is read, changed and written.
pub fn lock(board: &Board, config: &Config) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    FILE.lock(board, config)
}

/// Writes the record atomically.
pub fn save(board: &Board, config: &Config, record: &Record) -> Result<(), String> {
    FILE.save(board, config, record)
}
