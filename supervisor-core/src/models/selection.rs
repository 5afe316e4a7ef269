//! Which installed model the engine runs: `DATA/model-selection.json`, replaced whole on
//! every change. `active` changes in one write, when a switch commits, so a power cut at any
//! point leaves the old model selected or the new one committed. A switch under way when the
//! box went down is rolled back at the next start (its model never proved itself).

use serde::{Deserialize, Serialize};
use wire::models::{Switch, SwitchRequest};

use crate::board::Board;
use crate::config::Config;

/// The file, in the data directory.
const FILE: &str = "model-selection.json";
/// Switches remembered.
const HISTORY: usize = 20;

/// What the box selected.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Selection {
    /// The model the engine runs; `None`: the configuration's `[model] id`.
    pub active: Option<String>,
    /// The model active before the last committed switch: kept installed, and a failed
    /// switch's way back.
    pub fallback: Option<String>,
    /// The last request's number.
    #[serde(default)]
    pub last_request: u64,
    /// A switch asked for, not yet started.
    pub requested: Option<SwitchRequest>,
    /// The switch under way, and the model it replaces.
    pub switching: Option<Switching>,
    /// Past switches, newest last.
    #[serde(default)]
    pub history: Vec<Switch>,
}

/// A switch under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Switching {
    /// The request.
    pub request: SwitchRequest,
    /// The model it replaces.
    pub from: String,
}

fn path(config: &Config) -> String {
    format!("{}/{FILE}", config.model.data_dir.trim_end_matches('/'))
}

/// The selection (the default one when the box never switched).
pub fn read(board: &Board, config: &Config) -> Result<Selection, String> {
    match board
        .read_optional(&path(config))
        .map_err(|e| e.to_string())?
    {
        None => Ok(Selection::default()),
        // Written whole by an atomic replace: one that does not parse was damaged on disk.
        Some(text) => serde_json::from_str(&text).map_err(|e| {
            format!(
                "{} is damaged ({e}); remove it to go back to the configured model",
                path(config)
            )
        }),
    }
}

/// Changes the selection under its lock: `change` sees the current one and may refuse. The
/// file is written only when `change` changed something. What must not change the models
/// while a switch is decided (installing over a model, removing one) runs inside `change` too.
pub fn update<T, E: From<String>>(
    board: &Board,
    config: &Config,
    change: impl FnOnce(&mut Selection) -> Result<T, E>,
) -> Result<T, E> {
    board
        .create_dir_all(&config.model.data_dir)
        .map_err(|e| E::from(e.to_string()))?;
    let _lock = board
        .lock(&format!("{}.lock", path(config)))
        .map_err(|e| E::from(e.to_string()))?;
    let before = read(board, config)?;
    let mut selection = before.clone();
    let answer = change(&mut selection)?;
    let extra = selection.history.len().saturating_sub(HISTORY);
    selection.history.drain(..extra);
    if selection == before {
        return Ok(answer);
    }
    let text = serde_json::to_vec_pretty(&selection).map_err(|e| E::from(e.to_string()))?;
    board
        .replace_file(&path(config), &text)
        .map_err(|e| E::from(e.to_string()))?;
    Ok(answer)
}

/// The configuration a board runs with: its files' ([`Config::from_board_files`]), with the
/// model the box committed a switch to (`supervisor model use`, a fleet's `use`) over their
/// `[model] id`.
pub fn config_for_board(
    board: &Board,
    explicit: Option<&std::path::Path>,
) -> Result<Config, crate::config::ConfigError> {
    let mut config = Config::from_board_files(board, explicit)?;
    // A damaged selection must not keep the box from starting (and from its dashboard, where
    // it is fixed): the configured model runs, and the listing says what is wrong.
    match read(board, &config) {
        Ok(selection) => {
            if let Some(active) = selection.active {
                config.model.id = active;
            }
        }
        Err(e) => tracing::warn!("{e}; running the configured model {}", config.model.id),
    }
    Ok(config)
}

impl Selection {
    /// Asks for a switch to `id` at `now`; the request's number. Refused while another
    /// switch is asked for or under way.
    pub fn ask(&mut self, id: &str, now: u64) -> Result<u64, String> {
        if let Some(busy) = self
            .switching
            .as_ref()
            .map(|s| &s.request)
            .or(self.requested.as_ref())
        {
            return Err(format!(
                "a switch to {} is already under way (request {}); wait for its outcome",
                busy.to, busy.request
            ));
        }
        self.last_request += 1;
        self.requested = Some(SwitchRequest {
            request: self.last_request,
            to: id.to_string(),
            asked_unix: now,
        });
        Ok(self.last_request)
    }

    /// The model the engine runs, given the configured one.
    pub fn active_or<'a>(&'a self, configured: &'a str) -> &'a str {
        self.active.as_deref().unwrap_or(configured)
    }

    /// Records how switch `switching` ended; a commit makes its model the active one.
    pub fn finish(&mut self, switching: &Switching, result: &str, reason: String, now: u64) {
        if result == COMMITTED {
            self.active = Some(switching.request.to.clone());
            if switching.from != switching.request.to {
                self.fallback = Some(switching.from.clone());
            }
        }
        if self.switching.as_ref() == Some(switching) {
            self.switching = None;
        }
        self.history.push(Switch {
            request: switching.request.request,
            to: switching.request.to.clone(),
            from: Some(switching.from.clone()),
            result: result.to_string(),
            reason,
            ended_unix: now,
        });
    }
}

/// A switch that took: its model runs now.
pub const COMMITTED: &str = "committed";
/// A switch whose model did not prove healthy: the one before runs again.
pub const ROLLED_BACK: &str = "rolled-back";
/// A switch not tried (its model is not installed or does not verify).
pub const REFUSED: &str = "refused";

/// At the daemon's start: a switch under way when the box went down is rolled back (its
/// model is not the active one, which never changed); what was done, if anything.
pub fn recover(board: &Board, config: &Config) -> Result<Option<String>, String> {
    let now = board.now_unix();
    update(board, config, |selection| {
        let Some(switching) = selection.switching.clone() else {
            return Ok(None);
        };
        let reason = format!(
            "the supervisor restarted during the switch (a power cut or crash); back on {}",
            switching.from
        );
        selection.finish(&switching, ROLLED_BACK, reason.clone(), now);
        Ok(Some(format!(
            "switch {} to {}: {reason}",
            switching.request.request, switching.request.to
        )))
    })
}

/// Takes the waiting request up: it becomes the switch under way, replacing `from`. (The
/// daemon asks every second: without a request this only reads.)
pub fn start(board: &Board, config: &Config, from: &str) -> Result<Option<Switching>, String> {
    if read(board, config)?.requested.is_none() {
        return Ok(None);
    }
    update(board, config, |selection| {
        if selection.switching.is_some() {
            return Ok(None);
        }
        let Some(request) = selection.requested.take() else {
            return Ok(None);
        };
        let switching = Switching {
            request,
            from: from.to_string(),
        };
        selection.switching = Some(switching.clone());
        Ok(Some(switching))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A switch to `id` asked for as the dashboard and the CLI ask (`catalog::ask_switch`).
    fn request(board: &Board, config: &Config, id: &str) -> Result<u64, String> {
        update(board, config, |s| s.ask(id, 1))
    }

    fn board() -> (tempfile::TempDir, Board, Config) {
        let dir = tempfile::tempdir().expect("dir");
        board_sim::init(dir.path(), board_sim::Variant::Pi5_8gb).expect("sim");
        let board = board_sim::open(dir.path()).expect("board");
        (dir, board, Config::default())
    }

    #[test]
    fn only_a_commit_changes_the_active_model_and_a_switch_cut_off_is_rolled_back() {
        let (_dir, board, config) = board();
        assert_eq!(read(&board, &config).expect("read"), Selection::default());
        let first = request(&board, &config, "b").expect("asked");
        let busy = request(&board, &config, "c").expect_err("one at a time");
        assert!(busy.contains("already under way"), "{busy}");
        let switching = start(&board, &config, "a")
            .expect("start")
            .expect("a request");
        assert_eq!(switching.request.request, first);
        assert_eq!(read(&board, &config).expect("read").active, None);
        // The box went down here: the next start rolls it back; `a` still runs.
        let said = recover(&board, &config)
            .expect("recover")
            .expect("something done");
        assert!(said.contains("back on a"), "{said}");
        let s = read(&board, &config).expect("read");
        assert_eq!((s.active.as_deref(), s.switching.as_ref()), (None, None));
        assert_eq!(
            s.history.last().map(|h| h.result.as_str()),
            Some(ROLLED_BACK)
        );
        // A switch that commits makes its model the active one and the one before the fallback.
        let second = request(&board, &config, "b").expect("asked");
        assert!(second > first);
        let switching = start(&board, &config, "a")
            .expect("start")
            .expect("a request");
        update(&board, &config, |s| {
            s.finish(&switching, COMMITTED, "serving".into(), 1);
            Ok::<(), String>(())
        })
        .expect("commit");
        let s = read(&board, &config).expect("read");
        assert_eq!(s.active.as_deref(), Some("b"));
        assert_eq!(s.fallback.as_deref(), Some("a"));
        assert_eq!(recover(&board, &config).expect("recover"), None);
    }

    #[test]
    fn looking_for_a_request_writes_nothing() {
        let (dir, board, config) = board();
        let file = dir.path().join("var/lib/appliance").join(FILE);
        assert_eq!(start(&board, &config, "a").expect("start"), None);
        assert!(!file.exists(), "no request, no file");
        request(&board, &config, "b").expect("asked");
        start(&board, &config, "a")
            .expect("start")
            .expect("taken up");
        let stamp = |f: &std::path::Path| {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(f).expect("file");
            (m.ino(), m.mtime(), m.mtime_nsec())
        };
        let written = stamp(&file);
        // The daemon's look every second, and an update that changes nothing, only read.
        assert_eq!(start(&board, &config, "a").expect("again"), None);
        update(&board, &config, |_| Ok::<(), String>(())).expect("no change");
        assert_eq!(stamp(&file), written);
    }

    #[test]
    fn a_damaged_selection_is_refused_with_how_to_fix_it() {
        let (dir, board, config) = board();
        let file = dir.path().join("var/lib/appliance").join(FILE);
        std::fs::create_dir_all(file.parent().expect("dir")).expect("dir");
        std::fs::write(&file, "{ not json").expect("damage");
        let e = read(&board, &config).expect_err("refused");
        assert!(e.contains("damaged") && e.contains("remove it"), "{e}");
    }
}
