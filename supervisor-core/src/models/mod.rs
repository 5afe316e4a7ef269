//! The models on a box beyond the one it was built with: pushed a chunk at a time and
//! installed ([`incoming`]), listed and removed ([`catalog`]), and switched to through a health
//! gate that rolls back by itself ([`selection`] records it, [`switch`] runs it in the daemon);
//! a USB stick may carry one ([`stick`]).
//!
//! ```text
//! DATA/models/<id>/…            installed models (the `weights` crate's layout)
//! DATA/incoming/<id>/…          pushes under way
//! DATA/model-selection.json     the active and fallback model, the switch asked for or under
//!                               way, past switches
//! ```

pub mod catalog;
pub mod incoming;
pub mod selection;
pub mod stick;
pub mod switch;

/// Why a push, a removal or a switch request was refused: each kind is one HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushError {
    /// The request is malformed (a bad manifest, a chunk of the wrong size).
    BadRequest(String),
    /// The manifest is not signed by a key the box trusts.
    Signature(String),
    /// No such model, push or part.
    NotFound(String),
    /// Not in the box's present state (the chunk is not the next one, the model is in use).
    Conflict(String),
    /// A chunk's bytes are not the manifest's.
    Mismatch(String),
    /// The data partition has no room for it.
    NoSpace(String),
    /// Something on the box failed.
    Internal(String),
}

impl From<String> for PushError {
    fn from(message: String) -> PushError {
        PushError::Internal(message)
    }
}

impl std::fmt::Display for PushError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PushError::BadRequest(m)
            | PushError::Signature(m)
            | PushError::NotFound(m)
            | PushError::Conflict(m)
            | PushError::Mismatch(m)
            | PushError::NoSpace(m)
            | PushError::Internal(m) => f.write_str(m),
        }
    }
}

/// At the daemon's start: a switch cut off by a crash or power cut is rolled back
/// ([`selection::recover`]), and what an interrupted removal or push start left behind goes;
/// what was done, if anything.
pub fn on_start(
    board: &crate::board::Board,
    config: &crate::config::Config,
) -> Result<Option<String>, String> {
    let data = crate::model::data_dir(board, config);
    let leftovers = [data.clone(), data.join("incoming")]
        .into_iter()
        .flat_map(|dir| {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    name.starts_with(".removing-") || name.starts_with(".new-")
                })
                .map(|e| e.path())
        });
    for leftover in leftovers.collect::<Vec<_>>() {
        if let Err(e) = std::fs::remove_dir_all(&leftover) {
            tracing::warn!("removing {}: {e}", leftover.display());
        }
    }
    selection::recover(board, config)
}
