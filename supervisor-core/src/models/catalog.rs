//! The models installed on a box, as `GET /api/models` and `supervisor model list` show them,
//! and their removal (never of the model that runs or the one a failed switch goes back to).

use weights::install::{self, RECORD, Record};
use weights::sign::Signed;
use wire::models::{Installed, Models};

use super::{PushError, incoming, selection};
use crate::board::Board;
use crate::config::Config;

/// Everything about the box's models: installed, active, fallback, switches, pushes.
pub fn list(board: &Board, config: &Config) -> Result<Models, String> {
    let data = crate::model::data_dir(board, config);
    let selection = selection::read(board, config)?;
    let trust = crate::model::trust(config).map_err(|e| e.to_string())?;
    let ids = install::installed_ids(&data).map_err(|e| e.to_string())?;
    let installed = ids
        .iter()
        .map(|id| match install::installed(&data, id, &trust) {
            Ok((approval, path)) => {
                let m = &approval.manifest;
                let record = Record::read(&path.with_file_name(RECORD)).ok();
                Installed {
                    id: id.clone(),
                    name: m.name.clone(),
                    size: m.size + m.draft.as_ref().map_or(0, |d| d.size),
                    sha256: m.sha256.clone(),
                    signed_by: match approval.signed {
                        Signed::By(key) => key,
                        Signed::Unsigned => "unsigned".into(),
                    },
                    draft: m.draft.is_some(),
                    verified_unix: record.map(|r| r.last_full_verify),
                    problem: None,
                }
            }
            Err(e) => Installed {
                id: id.clone(),
                name: String::new(),
                size: 0,
                sha256: String::new(),
                signed_by: String::new(),
                draft: false,
                verified_unix: None,
                problem: Some(e.message),
            },
        })
        .collect();
    Ok(Models {
        active: Some(selection.active_or(&config.model.id).to_string()),
        fallback: selection.fallback.clone(),
        requested: selection.requested.clone(),
        switching: selection.switching.as_ref().map(|s| s.request.clone()),
        installed,
        incoming: incoming::list(board, config),
        history: selection.history,
        free_bytes: board.free_bytes(&config.model.data_dir).ok(),
    })
}

/// Removes model `id` (or drops its push under way), unless the box runs it, would go back
/// to it, or a switch names it.
pub fn remove(board: &Board, config: &Config, id: &str) -> Result<String, PushError> {
    if !incoming::is_plain_id(id) {
        return Err(PushError::BadRequest(format!(
            "{id:?} is not a model id (1-64 characters of a-z, 0-9, '.', '_' or '-')"
        )));
    }
    // Decided and done under the selection's lock: no switch to it is asked for meanwhile.
    selection::update(board, config, |selection| {
        let active = selection.active_or(&config.model.id);
        let why = if id == active {
            Some("it is the active model")
        } else if selection.fallback.as_deref() == Some(id) {
            Some("it is the fallback model (the one a failed switch goes back to)")
        } else if selection.requested.as_ref().is_some_and(|r| r.to == id)
            || selection
                .switching
                .as_ref()
                .is_some_and(|s| s.request.to == id)
        {
            Some("a switch to it is under way")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(PushError::Conflict(format!(
                "model {id} is not removed: {why}; switch to another model first (`use`)"
            )));
        }
        let cancelled = incoming::cancel(board, config, id)?;
        let data = crate::model::data_dir(board, config);
        match install::remove(&data, id) {
            Ok(()) => Ok(format!("model {id} removed")),
            Err(e) if e.kind == weights::ErrorKind::NotInstalled && cancelled => {
                Ok(format!("the push of model {id} was dropped"))
            }
            Err(e) if e.kind == weights::ErrorKind::NotInstalled => {
                Err(PushError::NotFound(e.message))
            }
            Err(e) => Err(PushError::Internal(e.message)),
        }
    })
}

/// What asking for a switch came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// The daemon takes the request up; its number.
    Queued(u64),
    /// The model already runs: nothing to do.
    AlreadyActive,
}

/// Asks for a switch to the installed model `id`.
pub fn ask_switch(board: &Board, config: &Config, id: &str) -> Result<Asked, PushError> {
    let now = board.now_unix();
    // Checked and asked under the selection's lock: the model cannot be removed meanwhile.
    selection::update(board, config, |selection| {
        let data = crate::model::data_dir(board, config);
        let ids = install::installed_ids(&data).map_err(|e| PushError::Internal(e.message))?;
        if !ids.iter().any(|i| i == id) {
            return Err(PushError::NotFound(format!(
                "model {id:?} is not installed on this box (installed: {}); push it first",
                ids.join(", ")
            )));
        }
        check_fit(board, config, id)?;
        if selection.active_or(&config.model.id) == id
            && selection.switching.is_none()
            && selection.requested.is_none()
        {
            return Ok(Asked::AlreadyActive);
        }
        selection
            .ask(id, now)
            .map(Asked::Queued)
            .map_err(PushError::Conflict)
    })
}

/// Refuses a switch to a model whose manifest says it does not fit this board's memory at the
/// context it would run with (a manifest without fits was never checked: it goes to the gate).
fn check_fit(board: &Board, config: &Config, id: &str) -> Result<(), PushError> {
    let data = crate::model::data_dir(board, config);
    let trust = crate::model::trust(config).map_err(|e| PushError::Internal(e.message))?;
    let (approval, _) = install::installed(&data, id, &trust)
        .map_err(|e| PushError::Conflict(format!("model {id} cannot be switched to: {e}")))?;
    let manifest = &approval.manifest;
    let Some(memory) = board.meminfo_kib("MemTotal").ok().map(|k| k * 1024) else {
        return Ok(());
    };
    if manifest.fits.is_empty() {
        return Ok(());
    }
    let allowed = u64::from(manifest.engine.context);
    let context = match config.engine.context.get() as u64 {
        0 => allowed,
        n if n > allowed => {
            // The launch would refuse it: refused now, before anything stops.
            return Err(PushError::Conflict(format!(
                "[engine] context = {n} is more than the {allowed} tokens model {id}'s manifest \
                 allows; lower it, or set 0 to take the manifest's, then switch again"
            )));
        }
        n => n,
    };
    let most = weights::fit::for_board(&manifest.fits, memory).map_or(0, |f| f.max_context);
    if most >= context {
        return Ok(());
    }
    let sizes: Vec<String> = manifest
        .fits
        .iter()
        .filter(|f| f.max_context > 0)
        .map(|f| format!("{} GB", f.memory_gib))
        .collect();
    let sizes = if sizes.is_empty() {
        "no size checked".to_string()
    } else {
        sizes.join(", ")
    };
    Err(PushError::Conflict(if most == 0 {
        format!(
            "model {id} does not fit this box's {} MiB of memory (it fits boards of {sizes}); \
             it was not switched to",
            memory >> 20
        )
    } else {
        format!(
            "model {id} fits this box's {} MiB of memory with a context of at most {most} \
             tokens, not {context}; set [engine] context = {most} and switch again",
            memory >> 20
        )
    }))
}
