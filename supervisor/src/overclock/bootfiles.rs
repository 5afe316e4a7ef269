//! The boot partition's side of the ladder: the promoted fragment in `config.txt.d/`,
//! `config.txt` regenerated from the fragments, and `tryboot.txt` for a trial. Every file is
//! replaced atomically and only when its contents change.

use config_txt::{FRAGMENT_DIR, Fragment};

use super::config::Candidate;
use super::record::fragment_text;
use crate::board::Board;

/// The fragment the ladder owns.
pub const FRAGMENT_NAME: &str = "50-overclock.txt";

fn boot_dir(board: &Board) -> Result<&'static str, String> {
    board.boot_dir().map_err(|e| e.to_string())
}

/// The fragments on the boot partition; an error when there are none (the box's `config.txt`
/// is then not ours to regenerate).
pub fn fragments(board: &Board) -> Result<Vec<Fragment>, String> {
    let dir = format!("{}/{FRAGMENT_DIR}", boot_dir(board)?);
    let mut fragments = Vec::new();
    for name in board.list(&dir).map_err(|e| e.to_string())? {
        if config_txt::is_fragment_name(&name) {
            let text = board
                .read(&format!("{dir}/{name}"))
                .map_err(|e| e.to_string())?;
            fragments.push(Fragment { name, text });
        }
    }
    if fragments.is_empty() {
        return Err(format!(
            "{dir} holds no fragments: this boot partition's config.txt was not assembled by the image build, so the supervisor will not rewrite it"
        ));
    }
    Ok(fragments)
}

/// A fragment other than the ladder's that sets `arm_freq` (in any section): the ladder must
/// not fight it, so it is named as `(file name, value)`.
pub fn foreign_arm_freq(board: &Board) -> Result<Option<(String, String)>, String> {
    Ok(fragments(board)?
        .into_iter()
        .filter(|f| f.name != FRAGMENT_NAME)
        .find_map(|f| {
            let value = config_txt::values(&f.text, "arm_freq").first()?.to_string();
            Some((f.name, value))
        }))
}

/// `fragments` with the ladder's fragment set to `candidate` (removed for `None`).
fn with_candidate(mut fragments: Vec<Fragment>, candidate: Option<Candidate>) -> Vec<Fragment> {
    fragments.retain(|f| f.name != FRAGMENT_NAME);
    if let Some(c) = candidate {
        fragments.push(Fragment {
            name: FRAGMENT_NAME.into(),
            text: fragment_text(c),
        });
    }
    fragments
}

fn replace_if_changed(board: &Board, path: &str, text: &str) -> Result<bool, String> {
    if board
        .read_optional(path)
        .map_err(|e| e.to_string())?
        .as_deref()
        == Some(text)
    {
        return Ok(false);
    }
    board
        .replace_file(path, text.as_bytes())
        .map_err(|e| e.to_string())?;
    Ok(true)
}

/// Makes the ladder's fragment say `candidate` and `config.txt` equal the assembly of the
/// fragments. The fragment is written first, so a power cut in between leaves a `config.txt`
/// that is still the old, complete version, and the next call finishes the job. Returns
/// whether `config.txt` changed.
pub fn promote(board: &Board, candidate: Option<Candidate>) -> Result<bool, String> {
    let boot = boot_dir(board)?;
    let fragment = format!("{boot}/{FRAGMENT_DIR}/{FRAGMENT_NAME}");
    let current = fragments(board)?;
    match candidate {
        Some(c) => {
            replace_if_changed(board, &fragment, &fragment_text(c))?;
        }
        None => board.remove_file(&fragment).map_err(|e| e.to_string())?,
    }
    let config = config_txt::assemble(
        &with_candidate(current, candidate),
        &format!("{boot}/{FRAGMENT_DIR}"),
    )?;
    replace_if_changed(board, &format!("{boot}/config.txt"), &config)
}

/// Writes `tryboot.txt`: the current fragments with the ladder's one set to `candidate`.
pub fn write_tryboot(board: &Board, candidate: Candidate) -> Result<(), String> {
    let boot = boot_dir(board)?;
    let text = config_txt::assemble(
        &with_candidate(fragments(board)?, Some(candidate)),
        &format!("{boot}/{FRAGMENT_DIR}"),
    )?;
    replace_if_changed(board, &format!("{boot}/tryboot.txt"), &text).map(|_| ())
}

/// Makes an existing `tryboot.txt` equal to `config.txt`, so a tryboot reboot nobody armed
/// boots the normal config. (It is rewritten rather than removed: the firmware's behaviour
/// when the tryboot flag is set and the file is missing is not documented.)
pub fn neutralize_tryboot(board: &Board) -> Result<(), String> {
    let boot = boot_dir(board)?;
    let tryboot = format!("{boot}/tryboot.txt");
    if board
        .read_optional(&tryboot)
        .map_err(|e| e.to_string())?
        .is_none()
    {
        return Ok(());
    }
    let config = board
        .read(&format!("{boot}/config.txt"))
        .map_err(|e| e.to_string())?;
    replace_if_changed(board, &tryboot, &config).map(|_| ())
}
