//! Writing a provisioning file into an image's boot partition without mounting it.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::disk::{PartitionFile, boot_partition, disk_len};
use provision::{FleetFile, PROVISION_FILE};

/// What a box should be stamped with.
pub enum Target<'a> {
    /// One box's entry, the fleet's defaults folded in.
    Box(&'a str),
    /// The whole fleet: each box takes its entry by board serial.
    WholeFleet,
}

/// The provisioning file's text for `target`, each box with its enrolment token derived from
/// the fleet's secret.
pub fn provisioning_text(
    fleet: &FleetFile,
    target: &Target<'_>,
    secret: &[u8],
) -> Result<String, String> {
    let (mut file, whom) = match target {
        Target::Box(name) => (fleet.stamp(name)?, format!("box {name}")),
        Target::WholeFleet => {
            if fleet.boxes.len() > 1
                && let Some(unpaired) = fleet.boxes.iter().find(|b| b.serial.is_none())
            {
                let name = unpaired.name.as_ref().map_or("?", |n| n.as_str());
                return Err(format!(
                    "[[box]] \"{name}\" has no serial: with one file for the whole fleet each box finds its entry by serial (stamp it with --box {name} instead)"
                ));
            }
            (fleet.clone(), "every box".to_string())
        }
    };
    for entry in &mut file.boxes {
        if let Some(name) = &entry.name {
            let token = provision::enroll::derive_token(
                secret,
                fleet.fleet.name.as_str(),
                name.as_str(),
                fleet.fleet.generation,
            );
            entry.enrollment_token = Some(token.parse()?);
        }
    }
    Ok(format!(
        "# Stamped by `appliance stamp` for {whom} of fleet {}, generation {}.\n\
         # The box checks all of it, applies it at its next boot and then removes its secrets\n\
         # from this partition.\n{}",
        fleet.fleet.name,
        fleet.fleet.generation,
        file.to_text()
    ))
}

/// Runs `work` on the FAT filesystem of the boot partition of the disk or image at `disk`
/// (opened for writing when `write`), then closes it and, after writing, syncs the disk.
fn with_boot_fs<T>(
    disk: &Path,
    write: bool,
    work: impl FnOnce(&BootFs<'_>) -> Result<T, String>,
) -> Result<T, String> {
    let at = |e: std::io::Error| format!("{}: {e}", disk.display());
    let mut file = OpenOptions::new()
        .read(true)
        .write(write)
        .open(disk)
        .map_err(at)?;
    let len = disk_len(&mut file).map_err(at)?;
    let part = boot_partition(&mut file, len).map_err(|e| format!("{}: {e}", disk.display()))?;
    let result = {
        let fs =
            fatfs::FileSystem::new(PartitionFile::new(&mut file, part), fatfs::FsOptions::new())
                .map_err(|e| {
                    format!(
                        "{}: the boot partition is not a readable FAT filesystem: {e}",
                        disk.display()
                    )
                })?;
        let result = work(&fs)?;
        fs.unmount()
            .map_err(|e| format!("{}: closing the boot partition: {e}", disk.display()))?;
        result
    };
    if write {
        file.sync_all().map_err(at)?;
    }
    Ok(result)
}

type BootFs<'a> = fatfs::FileSystem<PartitionFile<'a>>;

/// Writes `name` with `contents` into the boot partition of the disk or image at `disk`,
/// replacing a file of that name.
pub fn write_boot_file(disk: &Path, name: &str, contents: &[u8]) -> Result<(), String> {
    with_boot_fs(disk, true, |fs| {
        let mut out = fs.root_dir().create_file(name).map_err(|e| {
            format!(
                "{}: creating {name} on the boot partition: {e}",
                disk.display()
            )
        })?;
        out.truncate()
            .and_then(|()| out.write_all(contents))
            .and_then(|()| out.flush())
            .map_err(|e| {
                format!(
                    "{}: writing {name} on the boot partition (full?): {e}",
                    disk.display()
                )
            })
    })
}

/// The contents of `name` in the boot partition of `disk`, if it is there.
pub fn read_boot_file(disk: &Path, name: &str) -> Result<Option<Vec<u8>>, String> {
    with_boot_fs(disk, false, |fs| {
        let Ok(mut found) = fs.root_dir().open_file(name) else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        found
            .read_to_end(&mut bytes)
            .map_err(|e| format!("{}: reading {name}: {e}", disk.display()))?;
        Ok(Some(bytes))
    })
}

/// `appliance stamp`: `out` becomes a copy of `image` whose boot partition holds `text` as the
/// provisioning file. Made beside `out` and renamed over it, so `out` is never half written.
pub fn stamp_copy(image: &Path, out: &Path, text: &str) -> Result<(), String> {
    if fs::canonicalize(image).ok() == fs::canonicalize(out).ok() {
        return Err(format!(
            "{} is both the image and the output; name another output file",
            out.display()
        ));
    }
    let tmp = temporary_beside(out)?;
    let result = fs::copy(image, &tmp)
        .map_err(|e| format!("copying {} to {}: {e}", image.display(), tmp.display()))
        .and_then(|_| write_boot_file(&tmp, PROVISION_FILE, text.as_bytes()))
        .and_then(|()| {
            fs::rename(&tmp, out).map_err(|e| format!("renaming to {}: {e}", out.display()))
        });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    let dir = out.parent().filter(|d| !d.as_os_str().is_empty());
    durable::sync_dir(dir.unwrap_or(Path::new(".")))
        .map_err(|e| format!("syncing the directory of {}: {e}", out.display()))
}

fn temporary_beside(out: &Path) -> Result<PathBuf, String> {
    let name = out
        .file_name()
        .ok_or_else(|| format!("{} is not a file name", out.display()))?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".tmp-{}", std::process::id()));
    Ok(out.with_file_name(tmp))
}
