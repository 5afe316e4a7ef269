//! The boot partition's firmware configuration: `config.txt` is only ever the assembly of the
//! fragments in `config.txt.d/`, and `tryboot.txt` the assembly with some fragments changed for
//! one boot. Two owners change fragments: the overclock ladder (`50-overclock.txt`) and A/B
//! updates (`15-slot.txt`, which slot's kernel and root the firmware boots). Every file is
//! replaced atomically and only when its contents change.

use config_txt::{FRAGMENT_DIR, Fragment};

use crate::board::Board;

/// A fragment's new contents: `Some(text)`, or `None` to remove it.
pub type Change<'a> = (&'a str, Option<String>);

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

/// `fragments` with `changes` made.
fn changed(mut fragments: Vec<Fragment>, changes: &[Change]) -> Vec<Fragment> {
    for (name, text) in changes {
        fragments.retain(|f| f.name != *name);
        if let Some(text) = text {
            fragments.push(Fragment {
                name: (*name).into(),
                text: text.clone(),
            });
        }
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

/// Makes fragment `name` say `text` (removed for `None`) and `config.txt` equal the assembly of
/// the fragments. The fragment is written first, so a power cut in between leaves a
/// `config.txt` that is still the old, complete version, and the next call finishes the job.
/// Returns whether `config.txt` changed.
pub fn promote(board: &Board, name: &str, text: Option<String>) -> Result<bool, String> {
    let boot = boot_dir(board)?;
    let fragment = format!("{boot}/{FRAGMENT_DIR}/{name}");
    let current = fragments(board)?;
    match &text {
        Some(text) => {
            replace_if_changed(board, &fragment, text)?;
        }
        None => board.remove_file(&fragment).map_err(|e| e.to_string())?,
    }
    let config = config_txt::assemble(
        &changed(current, &[(name, text)]),
        &format!("{boot}/{FRAGMENT_DIR}"),
    )?;
    replace_if_changed(board, &format!("{boot}/config.txt"), &config)
}

/// Writes `tryboot.txt`: the current fragments with `changes` made.
pub fn write_tryboot(board: &Board, changes: &[Change]) -> Result<(), String> {
    let boot = boot_dir(board)?;
    let text = config_txt::assemble(
        &changed(fragments(board)?, changes),
        &format!("{boot}/{FRAGMENT_DIR}"),
    )?;
    replace_if_changed(board, &format!("{boot}/tryboot.txt"), &text).map(|_| ())
}

/// Makes an existing `tryboot.txt` equal to `config.txt`, so a tryboot reboot nobody armed
/// boots the normal config. (It is rewritten rather than removed: the firmware's behaviour
/// when the tryboot flag is set and the file is missing is not documented, and a Pi 5 has been
/// seen stuck in the bootloader that way.)
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

/// The boot partition's `config.txt`.
pub fn config_txt(board: &Board) -> Result<String, String> {
    let boot = boot_dir(board)?;
    board
        .read(&format!("{boot}/config.txt"))
        .map_err(|e| e.to_string())
}
