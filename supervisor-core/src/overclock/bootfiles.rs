//! The ladder's side of the boot files: its fragment `50-overclock.txt`, promoted into
//! `config.txt` or tried once through `tryboot.txt` ([`crate::bootfiles`] does the writing).

use super::config::Candidate;
use super::record::fragment_text;
use crate::board::Board;
use crate::bootfiles;

pub use crate::bootfiles::neutralize_tryboot;

/// The fragment the ladder owns.
pub const FRAGMENT_NAME: &str = "50-overclock.txt";

/// A fragment other than the ladder's that sets `arm_freq` (in any section): the ladder must
/// not fight it, so it is named as `(file name, value)`.
pub fn foreign_arm_freq(board: &Board) -> Result<Option<(String, String)>, String> {
    Ok(bootfiles::fragments(board)?
        .into_iter()
        .filter(|f| f.name != FRAGMENT_NAME)
        .find_map(|f| {
            let value = config_txt::values(&f.text, "arm_freq").first()?.to_string();
            Some((f.name, value))
        }))
}

/// Makes the ladder's fragment say `candidate` (removed for `None`) and `config.txt` the
/// assembly. Returns whether `config.txt` changed.
pub fn promote(board: &Board, candidate: Option<Candidate>) -> Result<bool, String> {
    bootfiles::promote(board, FRAGMENT_NAME, candidate.map(fragment_text))
}

/// Writes `tryboot.txt`: the current fragments with the ladder's one set to `candidate`.
pub fn write_tryboot(board: &Board, candidate: Candidate) -> Result<(), String> {
    bootfiles::write_tryboot(board, &[(FRAGMENT_NAME, Some(fragment_text(candidate)))])
}
