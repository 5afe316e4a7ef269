//! A model from a USB stick labelled `APPLIANCE`: `DIR/models/` holds one signed manifest
//! (`NAME.toml` and `NAME.toml.sig`) and the files it names. The model is verified and
//! installed (copied, every chunk checked), then the daemon switches to it through the same
//! health gate as a push. A stick left plugged in changes nothing more: a model the box runs is
//! not installed again, and one whose switch rolled back is not retried.

use std::path::PathBuf;

use weights::install::{self, Approval};

use super::catalog::{self, Asked};
use super::selection::{self, ROLLED_BACK};
use super::{PushError, incoming};
use crate::board::Board;
use crate::config::Config;

/// The folder of a stick that holds its model.
pub const FOLDER: &str = "models";

/// `supervisor model install-stick DIR`: what was done, in words.
pub fn from_stick(board: &Board, config: &Config, dir: &str) -> Result<String, PushError> {
    let folder = board.path(&format!("{}/{FOLDER}", dir.trim_end_matches('/')));
    let manifests = manifests_in(&folder)?;
    let manifest = match manifests.as_slice() {
        [] => {
            return Ok(format!(
                "no model on the stick ({} holds no *.toml)",
                folder.display()
            ));
        }
        [one] => one,
        more => {
            return Err(PushError::BadRequest(format!(
                "{} holds {} manifests; a stick carries one model",
                folder.display(),
                more.len()
            )));
        }
    };
    let approval = Approval::load(manifest, &incoming::trust(config)?)
        .map_err(|e| PushError::Signature(format!("the stick's model is refused: {e}")))?;
    let m = &approval.manifest;
    let data = crate::model::data_dir(board, config);
    let selection = selection::read(board, config).map_err(PushError::Internal)?;
    let installed = install::installed(&data, &m.id, &incoming::trust(config)?)
        .ok()
        .map(|(a, _)| a.text);
    let same = installed.as_deref() == Some(approval.text.as_str());
    if same && selection.active_or(&config.model.id) == m.id {
        return Ok(format!("model {} from the stick is already running", m.id));
    }
    let last = selection.history.iter().rev().find(|s| s.to == m.id);
    if same && last.is_some_and(|s| s.result == ROLLED_BACK) {
        return Ok(format!(
            "a switch to model {} was rolled back on this box; not trying it again from the stick",
            m.id
        ));
    }
    if !same {
        let size = m.size + m.draft.as_ref().map_or(0, |d| d.size);
        incoming::check_room(board, config, &m.id, size)?;
        let weights = folder.join(&m.file);
        let draft = m.draft.as_ref().map(|d| folder.join(&d.file));
        // Never over the model that runs or its fallback, and no switch decided meanwhile.
        selection::update(board, config, |current| {
            incoming::check_replaceable(board, config, m, &approval.text, current)?;
            install::install_model(&weights, draft.as_deref(), &approval, &data)
                .map(|_| ())
                .map_err(|e| PushError::BadRequest(format!("the stick's model: {e}")))
        })?;
    }
    Ok(match catalog::ask_switch(board, config, &m.id)? {
        Asked::AlreadyActive => format!("model {} installed; it is the active model", m.id),
        Asked::Queued(request) => format!(
            "model {} installed; the daemon switches to it (request {request}) and keeps it only \
             if it proves healthy",
            m.id
        ),
    })
}

/// The manifests in `folder`, sorted (none when there is no folder).
fn manifests_in(folder: &std::path::Path) -> Result<Vec<PathBuf>, PushError> {
    let entries = match std::fs::read_dir(folder) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(PushError::Internal(format!(
                "listing {}: {e}",
                folder.display()
            )));
        }
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.ends_with(".toml") && !n.starts_with('.'))
        })
        .collect();
    found.sort();
    Ok(found)
}
