//! How a model fits boards of each memory size: what `engine fit` prints (its [`Report`]),
//! and the part of it a manifest keeps ([`BoardFit`], its `[[fits]]` rows), so a box can refuse
//! a switch to a model its memory cannot hold before it stops the one that runs.

use serde::{Deserialize, Serialize};

/// `engine fit`'s answer: the files load, and what they need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The model's architecture, as the engine names it.
    pub architecture: String,
    /// Bytes of the model's files.
    pub file_bytes: u64,
    /// The context the model was trained for.
    pub trained_context: u64,
    /// The context checked.
    pub context: u64,
    /// What serving it takes at that context, in bytes.
    pub need_bytes: u64,
    /// One row per board size.
    pub boards: Vec<Board>,
}

/// One board size in a [`Report`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Board {
    /// The board's memory in GiB.
    pub memory_gib: u64,
    /// What the engine may use on it (its memory less the system's reserve).
    pub limit_bytes: u64,
    /// Whether the checked context fits.
    pub fits: bool,
    /// The longest context that fits (0: the model alone does not).
    pub max_context: u64,
}

/// A manifest's record of one board size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoardFit {
    /// The board's memory in GiB.
    pub memory_gib: u64,
    /// The longest context that fits it (0: the model does not fit).
    pub max_context: u64,
}

impl Report {
    /// The rows a manifest keeps.
    pub fn fits(&self) -> Vec<BoardFit> {
        self.boards
            .iter()
            .map(|b| BoardFit {
                memory_gib: b.memory_gib,
                max_context: b.max_context,
            })
            .collect()
    }
}

/// The row for a board with `memory_bytes` of memory: the largest size not above it (a board
/// reports a little less than its nominal size, so within 10% of it counts as that size).
pub fn for_board(fits: &[BoardFit], memory_bytes: u64) -> Option<BoardFit> {
    fits.iter()
        .filter(|f| f.memory_gib.saturating_mul(9 << 30) / 10 <= memory_bytes)
        .max_by_key(|f| f.memory_gib)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_board_takes_the_row_of_its_nominal_size() {
        let fits = [
            BoardFit {
                memory_gib: 4,
                max_context: 0,
            },
            BoardFit {
                memory_gib: 8,
                max_context: 50_000,
            },
        ];
        // An 8 GB Pi 5 reports about 7.9 GiB in MemTotal.
        assert_eq!(
            for_board(&fits, 8_250_000_000).map(|f| f.memory_gib),
            Some(8)
        );
        assert_eq!(
            for_board(&fits, 4_100_000_000).map(|f| f.memory_gib),
            Some(4)
        );
        assert_eq!(for_board(&fits, 2 << 30), None);
    }
}
