//! The changes a plan can ask for, as data, and the one place that carries them out.

use std::fmt;

use crate::board::Board;
use crate::systemd::{PropertyValue, Systemd};

/// A systemd unit property to set.
pub type UnitProperty = (String, PropertyValue);

/// One change to the board.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// Write a kernel attribute (sysfs, cgroupfs).
    WriteAttribute {
        /// Box path.
        path: String,
        /// Value to write.
        value: String,
    },
    /// Replace a regular file atomically (boot partition files).
    ReplaceFile {
        /// Box path.
        path: String,
        /// New contents.
        contents: String,
    },
    /// Create a cgroup directory.
    CreateCgroup {
        /// Box path.
        path: String,
    },
    /// Turn a swap area off.
    SwapOff {
        /// Device or file.
        device: String,
    },
    /// Stage a bootloader update with this configuration, flashed at the next boot.
    StageBootloaderConfig {
        /// The full new bootloader configuration.
        config: String,
    },
    /// Start a systemd unit.
    StartUnit {
        /// Unit name.
        unit: String,
    },
    /// Set systemd unit properties for this boot.
    SetUnitProperties {
        /// Unit name.
        unit: String,
        /// Properties and values.
        properties: Vec<UnitProperty>,
    },
}

impl fmt::Display for Edit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Edit::WriteAttribute { path, value } => write!(f, "write {value} to {path}"),
            Edit::ReplaceFile { path, .. } => write!(f, "rewrite {path}"),
            Edit::CreateCgroup { path } => write!(f, "create cgroup {path}"),
            Edit::SwapOff { device } => write!(f, "turn swap off on {device}"),
            Edit::StageBootloaderConfig { .. } => {
                write!(
                    f,
                    "stage a bootloader update (pieeprom.upd) on the boot partition"
                )
            }
            Edit::StartUnit { unit } => write!(f, "start {unit}"),
            Edit::SetUnitProperties { unit, properties } => {
                let list: Vec<String> = properties
                    .iter()
                    .map(|(name, value)| match value {
                        PropertyValue::U64(n) => format!("{name}={n}"),
                        PropertyValue::Bool(b) => {
                            format!("{name}={}", if *b { "yes" } else { "no" })
                        }
                    })
                    .collect();
                write!(f, "set {} on {unit}", list.join(" "))
            }
        }
    }
}

/// Carries out edits on a board, with systemd when the cgroup backend is systemd.
pub struct Applier<'a> {
    board: &'a Board,
    systemd: Result<Systemd, String>,
}

impl<'a> Applier<'a> {
    /// An applier that writes files only; systemd edits fail with `why`.
    pub fn files_only(board: &'a Board, why: impl Into<String>) -> Applier<'a> {
        Applier {
            board,
            systemd: Err(why.into()),
        }
    }

    /// An applier that also talks to systemd.
    pub fn with_systemd(board: &'a Board, systemd: Systemd) -> Applier<'a> {
        Applier {
            board,
            systemd: Ok(systemd),
        }
    }

    fn systemd(&self) -> Result<&Systemd, String> {
        self.systemd.as_ref().map_err(Clone::clone)
    }

    /// Carries out one edit. The board's edits run on a blocking thread (see [`super::apply`]):
    /// a boot file's fsync, a cgroup write that reclaims memory first, or swapoff, which can
    /// take minutes on a full swap area, must not hold up the runtime (and the watchdog).
    pub async fn apply(&self, edit: &Edit) -> Result<(), String> {
        match edit {
            Edit::StartUnit { unit } => within_deadline(self.systemd()?.start_unit(unit)).await,
            Edit::SetUnitProperties { unit, properties } => {
                within_deadline(self.systemd()?.set_unit_properties(unit, properties)).await
            }
            _ => {
                let (board, edit) = (self.board.clone(), edit.clone());
                tokio::task::spawn_blocking(move || on_board(&board, &edit))
                    .await
                    .map_err(|e| format!("the board task crashed: {e}"))?
            }
        }
    }
}

/// Carries out an edit of the board itself.
fn on_board(board: &Board, edit: &Edit) -> Result<(), String> {
    let done = match edit {
        Edit::WriteAttribute { path, value } => board.write_attribute(path, value),
        Edit::ReplaceFile { path, contents } => board.replace_file(path, contents.as_bytes()),
        Edit::CreateCgroup { path } => board.create_cgroup(path),
        Edit::SwapOff { device } => board.swap_off(device),
        Edit::StageBootloaderConfig { config } => board.stage_bootloader_config(config),
        Edit::StartUnit { .. } | Edit::SetUnitProperties { .. } => {
            return Err(format!("{edit} is systemd's to carry out"));
        }
    };
    done.map_err(|e| e.to_string())
}

/// A systemd call that does not answer within this time fails the step instead of stalling the
/// daemon (and its watchdog pings).
const SYSTEMD_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

async fn within_deadline(
    call: impl std::future::Future<Output = zbus::Result<()>>,
) -> Result<(), String> {
    match tokio::time::timeout(SYSTEMD_DEADLINE, call).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("systemd: {e}")),
        Err(_) => Err(format!(
            "systemd did not answer within {SYSTEMD_DEADLINE:?}"
        )),
    }
}
