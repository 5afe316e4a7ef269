//! The card's two system slots, A and B: their names, root partitions and boot folders, and the
//! `config.txt` fragment that picks one. Each slot is a root partition and, on the boot
//! partition, a folder of what the firmware loads for it (kernel, initramfs, device trees,
//! `cmdline.txt`); the fragment `config.txt.d/15-slot.txt` names the folder as `os_prefix`.
//! Which slot runs, and how updates move between them, is the supervisor's business.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Board, BoardResult};

/// The fragment that chooses the slot.
pub const FRAGMENT_NAME: &str = "15-slot.txt";

/// What a slot's boot folder must hold before the firmware is pointed at it.
pub const BOOT_FILES: [&str; 3] = ["vmlinuz", "initrd.img", "cmdline.txt"];

/// One of the two slots, by RAUC's boot name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Slot {
    /// Root partition 2, boot folder `slot-a/`.
    A,
    /// Root partition 3, boot folder `slot-b/`.
    B,
}

impl fmt::Display for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.bootname())
    }
}

impl Slot {
    /// Both slots.
    pub const ALL: [Slot; 2] = [Slot::A, Slot::B];

    /// RAUC's boot name (`bootname=` in `system.conf`, `rauc.slot=` on the kernel command line).
    pub fn bootname(self) -> &'static str {
        match self {
            Slot::A => "A",
            Slot::B => "B",
        }
    }

    /// The slot a boot name names.
    pub fn from_bootname(name: &str) -> Result<Slot, String> {
        match name {
            "A" => Ok(Slot::A),
            "B" => Ok(Slot::B),
            other => Err(format!(
                "unknown slot `{other}`: this box has the slots A and B"
            )),
        }
    }

    /// The other slot.
    pub fn other(self) -> Slot {
        match self {
            Slot::A => Slot::B,
            Slot::B => Slot::A,
        }
    }

    /// Its folder on the boot partition (the `os_prefix` without the slash).
    pub fn folder(self) -> &'static str {
        match self {
            Slot::A => "slot-a",
            Slot::B => "slot-b",
        }
    }

    /// Its root partition's number on the card.
    pub fn partition(self) -> u32 {
        match self {
            Slot::A => 2,
            Slot::B => 3,
        }
    }

    /// The slot an `os_prefix` value names.
    pub fn from_prefix(prefix: &str) -> Option<Slot> {
        Slot::ALL
            .into_iter()
            .find(|s| prefix.trim_end_matches('/') == s.folder())
    }

    /// The text of [`FRAGMENT_NAME`] that boots this slot.
    pub fn fragment_text(self) -> String {
        format!(
            "# Which system slot the firmware boots: written by the supervisor when an update commits.\n[all]\nos_prefix={}/\n",
            self.folder()
        )
    }
}

/// The slot the running system was booted from (`rauc.slot=` on the kernel command line, which
/// each slot's `cmdline.txt` carries); `None` on a box without A/B slots.
pub fn booted(board: &Board) -> BoardResult<Option<Slot>> {
    Ok(board
        .kernel_cmdline()?
        .iter()
        .rev()
        .find_map(|arg| arg.strip_prefix("rauc.slot="))
        .and_then(|name| Slot::from_bootname(name).ok()))
}

/// The `cmdline.txt` the firmware gave this boot: the booted slot's, or the boot partition's
/// own on a box without slots.
pub fn cmdline_txt(board: &Board) -> BoardResult<String> {
    let boot = board.boot_dir()?;
    if let Some(slot) = booted(board)? {
        let path = format!("{boot}/{}/cmdline.txt", slot.folder());
        if board.exists(&path) {
            return Ok(path);
        }
    }
    Ok(format!("{boot}/cmdline.txt"))
}
