//! The two system slots. Each slot is a root partition and, on the boot partition, a folder of
//! what the firmware loads for it (kernel, initramfs, device trees, `cmdline.txt`); the
//! fragment `config.txt.d/15-slot.txt` names the folder as `os_prefix`, so `config.txt` boots
//! the committed slot and a `tryboot.txt` with the other folder tries the other one once.
//! The slots themselves ([`Slot`]) are the card's layout, [`crate::board::slot`]; here is what
//! the running system reads of them.

use crate::board::{Board, BoardResult, paths};

pub use crate::board::slot::{BOOT_FILES, FRAGMENT_NAME, Slot, booted, cmdline_txt};

/// The slot a firmware configuration text boots (its `os_prefix`), if it names one.
pub fn booted_by(config_text: &str) -> Option<Slot> {
    config_txt::setting(config_text, "os_prefix").and_then(Slot::from_prefix)
}

/// A slot's boot folder as a box path.
pub fn boot_folder(board: &Board, slot: Slot) -> BoardResult<String> {
    Ok(format!("{}/{}", board.boot_dir()?, slot.folder()))
}

/// Why a slot's boot folder cannot be booted, if it cannot.
pub fn missing_boot_files(board: &Board, slot: Slot) -> Result<Option<String>, String> {
    let folder = boot_folder(board, slot).map_err(|e| e.to_string())?;
    let missing: Vec<&str> = BOOT_FILES
        .into_iter()
        .filter(|f| !board.exists(&format!("{folder}/{f}")))
        .collect();
    Ok((!missing.is_empty()).then(|| format!("{folder} lacks {}", missing.join(", "))))
}

/// The version of the system in the booted slot (written by the image build).
pub fn running_version(board: &Board) -> Option<String> {
    board
        .read(paths::SYSTEM_VERSION)
        .ok()
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fragment_names_the_slot_it_boots() {
        for slot in Slot::ALL {
            assert_eq!(booted_by(&slot.fragment_text()), Some(slot));
            assert_eq!(Slot::from_bootname(slot.bootname()), Ok(slot));
            assert_ne!(slot.other(), slot);
        }
        assert_eq!(booted_by("[all]\nkernel=vmlinuz\n"), None);
        assert_eq!(booted_by("[all]\nos_prefix=elsewhere/\n"), None);
        assert!(Slot::from_bootname("C").is_err());
    }
}
