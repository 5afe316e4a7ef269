//! Records the supervisor keeps on the data partition (the overclock ladder's, the updates'),
//! read and written through the board: atomically, so a power cut leaves the old or the new
//! record, never a torn one, and under a lock, so the daemon and a command never overwrite
//! each other's changes.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::board::Board;
use crate::config::Config;

/// A record with a layout version.
pub trait Versioned: Serialize + DeserializeOwned {
    /// The layout this supervisor reads and writes.
    const VERSION: u32;
    /// The layout the record says it has.
    fn layout_version(&self) -> u32;
}

/// One record file in the data directory.
pub struct StateFile {
    /// File name, e.g. `overclock.json`.
    pub file: &'static str,
    /// The lock's file name beside it.
    pub lock: &'static str,
    /// What it is, in words, for errors.
    pub what: &'static str,
}

impl StateFile {
    /// The record's box path.
    pub fn path(&self, config: &Config) -> String {
        format!(
            "{}/{}",
            config.model.data_dir.trim_end_matches('/'),
            self.file
        )
    }

    /// The record, or `None` when there is none yet. A record that cannot be read is an error
    /// naming the file and is left as it is.
    pub fn load<T: Versioned>(&self, board: &Board, config: &Config) -> Result<Option<T>, String> {
        let path = self.path(config);
        let Some(text) = board.read_optional(&path).map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let record: T = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{path} is not a valid {} ({e}); move it aside to start over",
                self.what
            )
        })?;
        if record.layout_version() != T::VERSION {
            return Err(format!(
                "{path} has layout version {}, this supervisor reads {}",
                record.layout_version(),
                T::VERSION
            ));
        }
        Ok(Some(record))
    }

    /// Held while the record is read, changed and written.
    pub fn lock(
        &self,
        board: &Board,
        config: &Config,
    ) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
        board
            .create_dir_all(&config.model.data_dir)
            .map_err(|e| e.to_string())?;
        board
            .lock(&format!(
                "{}/{}",
                config.model.data_dir.trim_end_matches('/'),
                self.lock
            ))
            .map_err(|e| e.to_string())
    }

    /// Writes the record atomically.
    pub fn save<T: Versioned>(
        &self,
        board: &Board,
        config: &Config,
        record: &T,
    ) -> Result<(), String> {
        board
            .create_dir_all(&config.model.data_dir)
            .map_err(|e| e.to_string())?;
        let mut text = serde_json::to_string_pretty(record)
            .map_err(|e| format!("cannot encode the {}: {e}", self.what))?;
        text.push('\n');
        board
            .replace_file(&self.path(config), text.as_bytes())
            .map_err(|e| e.to_string())
    }
}
