//! RAUC's post-install handler (`[handlers] post-install`): RAUC has written the new root
//! filesystem into the target slot and made it primary; this copies what the firmware loads
//! for that slot out of it onto the boot partition, writes the slot's `cmdline.txt`, and only
//! then points `tryboot.txt` at the slot. A half-copied folder is never booted: nothing names it
//! until the last step.

use std::collections::BTreeMap;

use super::slot::{self, Slot};
use crate::board::Board;
use crate::config::Config;

/// Where a new system keeps the files of its boot folder (the image build puts them there).
pub use crate::board::paths::SLOT_BOOT_DIR;
/// Where the target slot is mounted while its boot files are copied.
const MOUNT_POINT: &str = "/run/appliance/update-slot";

/// The target slot and its device, from RAUC's environment.
fn target(env: &BTreeMap<String, String>) -> Result<(Slot, String), String> {
    let get = |key: &str| env.get(key).map(String::as_str).unwrap_or("");
    let mut found = None;
    for n in get("RAUC_TARGET_SLOTS").split_whitespace() {
        let bootname = get(&format!("RAUC_SLOT_BOOTNAME_{n}"));
        if bootname.is_empty() {
            continue;
        }
        if found.is_some() {
            return Err(
                "RAUC names two target slots with a boot name; this box updates one".into(),
            );
        }
        let device = get(&format!("RAUC_SLOT_DEVICE_{n}"));
        if device.is_empty() {
            return Err(format!(
                "RAUC gave no RAUC_SLOT_DEVICE_{n} for slot {bootname}"
            ));
        }
        found = Some((Slot::from_bootname(bootname)?, device.to_string()));
    }
    found.ok_or_else(|| {
        "RAUC_TARGET_SLOTS names no slot with a boot name: run this only as RAUC's post-install handler".into()
    })
}

/// The booted slot's `cmdline.txt` turned into the target's: its root partition and slot name.
fn cmdline_for(current: &str, target: Slot) -> Result<String, String> {
    let line = current.lines().next().unwrap_or("").trim();
    let mut disk = None;
    let mut words: Vec<String> = Vec::new();
    for word in line.split_whitespace() {
        if let Some(rest) = word.strip_prefix("root=PARTUUID=") {
            disk = rest.rsplit_once('-').map(|(d, _)| d.to_string());
            continue;
        }
        if word.starts_with("rauc.slot=") {
            continue;
        }
        words.push(word.to_string());
    }
    let disk = disk.ok_or(
        "the running cmdline.txt has no root=PARTUUID=<disk>-<partition>, so the new slot's root cannot be named",
    )?;
    words.insert(0, format!("root=PARTUUID={disk}-{:02}", target.partition()));
    words.push(format!("rauc.slot={target}"));
    Ok(format!("{}\n", words.join(" ")))
}

/// Runs the handler with RAUC's environment.
pub fn post_install(
    board: &Board,
    config: &Config,
    env: &BTreeMap<String, String>,
) -> Result<String, String> {
    let (target, device) = target(env)?;
    let running = slot::booted(board)
        .map_err(|e| e.to_string())?
        .ok_or("this boot names no slot (no rauc.slot= on the kernel command line)")?;
    if target == running {
        return Err(format!(
            "RAUC wrote slot {target}, which is the running one"
        ));
    }
    let folder = slot::boot_folder(board, target).map_err(|e| e.to_string())?;
    let cmdline = cmdline_for(
        &board
            .read(&slot::cmdline_txt(board).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?,
        target,
    )?;
    let mounted = board
        .mount_read_only(&device, MOUNT_POINT)
        .map_err(|e| e.to_string())?;
    let source = mounted.dir().join(SLOT_BOOT_DIR);
    let mut names: Vec<String> = std::fs::read_dir(&source)
        .map_err(|e| {
            format!(
                "the new system has no {SLOT_BOOT_DIR} ({}: {e}): was the bundle built by appliance-image?",
                source.display()
            )
        })?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    names.sort();
    for needed in ["vmlinuz", "initrd.img"] {
        if !names.iter().any(|n| n == needed) {
            return Err(format!(
                "the new system's {SLOT_BOOT_DIR} lacks {needed}; the slot would not boot"
            ));
        }
    }
    board.create_dir_all(&folder).map_err(|e| e.to_string())?;
    for name in board.list(&folder).map_err(|e| e.to_string())? {
        if name != "cmdline.txt" && !names.contains(&name) {
            board
                .remove_file(&format!("{folder}/{name}"))
                .map_err(|e| e.to_string())?;
        }
    }
    for name in &names {
        board
            .copy_file_in(&source.join(name), &format!("{folder}/{name}"))
            .map_err(|e| e.to_string())?;
    }
    board
        .replace_file(&format!("{folder}/cmdline.txt"), cmdline.as_bytes())
        .map_err(|e| e.to_string())?;
    drop(mounted);
    super::prepare(board, config, target)?;
    Ok(format!(
        "slot {target}: {} boot files copied; tryboot.txt points at it",
        names.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_new_slots_cmdline_names_its_own_root() {
        let current = "console=serial0,115200 root=PARTUUID=a9911a0c-02 rootfstype=ext4 ro rootwait cgroup_enable=memory rauc.slot=A\n";
        assert_eq!(
            cmdline_for(current, Slot::B).expect("converted"),
            "root=PARTUUID=a9911a0c-03 console=serial0,115200 rootfstype=ext4 ro rootwait cgroup_enable=memory rauc.slot=B\n"
        );
        assert!(cmdline_for("console=tty1 root=/dev/mmcblk0p2\n", Slot::B).is_err());
    }

    #[test]
    fn the_target_comes_from_raucs_environment() {
        let env: BTreeMap<String, String> = [
            ("RAUC_TARGET_SLOTS", "2"),
            ("RAUC_SLOT_BOOTNAME_2", "B"),
            ("RAUC_SLOT_DEVICE_2", "/dev/mmcblk0p3"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(target(&env), Ok((Slot::B, "/dev/mmcblk0p3".into())));
        assert!(target(&BTreeMap::new()).is_err());
    }
}
