//! The record on the data partition, read and written through the board (atomically: a power
//! cut leaves the old or the new record, never a torn one).

use super::record::{Record, VERSION};
use crate::board::Board;
use crate::config::Config;

/// File name of the record in the data directory.
pub const FILE_NAME: &str = "overclock.json";

/// The record's box path.
pub fn path(config: &Config) -> String {
    format!(
        "{}/{FILE_NAME}",
        config.model.data_dir.trim_end_matches('/')
    )
}

/// The record, or `None` when no ladder was ever started. A record that cannot be read is an
/// error naming the file and is left as it is.
pub fn load(board: &Board, config: &Config) -> Result<Option<Record>, String> {
    let path = path(config);
    let Some(text) = board.read_optional(&path).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let record: Record = serde_json::from_str(&text).map_err(|e| {
        format!("{path} is not a valid overclock record ({e}); move it aside to start over")
    })?;
    if record.version != VERSION {
        return Err(format!(
            "{path} has layout version {}, this supervisor reads {VERSION}",
            record.version
        ));
    }
    Ok(Some(record))
}

/// Held while the record is read, changed and written, so `overclock abort` and the daemon
/// never overwrite each other's changes. Never held across a stability check.
pub fn lock(board: &Board, config: &Config) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    board
        .create_dir_all(&config.model.data_dir)
        .map_err(|e| e.to_string())?;
    board
        .lock(&format!(
            "{}/overclock.lock",
            config.model.data_dir.trim_end_matches('/')
        ))
        .map_err(|e| e.to_string())
}

/// Writes the record atomically.
pub fn save(board: &Board, config: &Config, record: &Record) -> Result<(), String> {
    board
        .create_dir_all(&config.model.data_dir)
        .map_err(|e| e.to_string())?;
    let mut text = serde_json::to_string_pretty(record)
        .map_err(|e| format!("cannot encode the overclock record: {e}"))?;
    text.push('\n');
    board
        .replace_file(&path(config), text.as_bytes())
        .map_err(|e| e.to_string())
}
