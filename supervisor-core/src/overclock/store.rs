//! The ladder's record on the data partition ([`crate::state_file`]).

use super::record::{Record, VERSION};
use crate::board::Board;
use crate::config::Config;
use crate::state_file::{StateFile, Versioned};

/// The record's file.
const FILE: StateFile = StateFile {
    file: "overclock.json",
    lock: "overclock.lock",
    what: "overclock record",
};

impl Versioned for Record {
    const VERSION: u32 = VERSION;
    fn layout_version(&self) -> u32 {
        self.version
    }
}

/// The record, or `None` when no ladder was ever started.
pub fn load(board: &Board, config: &Config) -> Result<Option<Record>, String> {
    FILE.load(board, config)
}

/// Held while the record is read, changed and written. Never held across a stability check.
pub fn lock(board: &Board, config: &Config) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    FILE.lock(board, config)
}

/// Writes the record atomically.
pub fn save(board: &Board, config: &Config, record: &Record) -> Result<(), String> {
    FILE.save(board, config, record)
}
