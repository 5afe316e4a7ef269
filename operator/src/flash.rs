//! Writing an image to an SD card or NVMe drive, read back and checked.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const CHUNK: usize = 4 << 20;

/// Refuses a device that must not be overwritten: a partition rather than a whole disk, a disk
/// with a mounted partition (the system disk always has one), or one another driver holds
/// (RAID, LVM, swap). A regular file is an image being written, and is allowed.
pub fn check_target(device: &Path) -> Result<(), String> {
    let meta = fs::metadata(device).map_err(|e| format!("{}: {e}", device.display()))?;
    if meta.file_type().is_file() {
        return Ok(());
    }
    if !meta.file_type().is_block_device() {
        return Err(format!(
            "{} is neither a disk nor a file; name the card's device (e.g. /dev/sdb or /dev/mmcblk0)",
            device.display()
        ));
    }
    let rdev = meta.rdev();
    let id = format!(
        "{}:{}",
        nix::sys::stat::major(rdev),
        nix::sys::stat::minor(rdev)
    );
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let swaps = fs::read_to_string("/proc/swaps").unwrap_or_default();
    in_use(device, &id, Path::new("/sys/dev/block"), &mountinfo, &swaps)
}

/// Whether the disk `id` (`major:minor`) or one of its partitions is mounted, swapped on or
/// held, given the kernel's `/sys/dev/block`, `/proc/self/mountinfo` and `/proc/swaps`.
pub fn in_use(
    device: &Path,
    id: &str,
    sys_dev_block: &Path,
    mountinfo: &str,
    swaps: &str,
) -> Result<(), String> {
    let disk = fs::canonicalize(sys_dev_block.join(id))
        .map_err(|e| format!("{}: no such disk in sysfs ({e})", device.display()))?;
    if disk.join("partition").exists() {
        return Err(format!(
            "{} is a partition; name the whole disk it is on",
            device.display()
        ));
    }
    let on_disk = |path: &Path| path == disk || path.parent() == Some(disk.as_path());
    for line in mountinfo.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(dev), Some(point)) = (fields.get(2), fields.get(4)) else {
            continue;
        };
        if fs::canonicalize(sys_dev_block.join(dev)).is_ok_and(|p| on_disk(&p)) {
            return Err(format!(
                "{} is in use: a partition of it is mounted at {point} (the system disk, or unmount it first)",
                device.display()
            ));
        }
    }
    let mut parts: Vec<PathBuf> = vec![disk.clone()];
    if let Ok(entries) = fs::read_dir(&disk) {
        parts.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.join("partition").exists()),
        );
    }
    for part in &parts {
        let name = part
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let held = fs::read_dir(part.join("holders")).is_ok_and(|mut h| h.next().is_some());
        let swapped = swaps
            .lines()
            .skip(1)
            .any(|l| l.split_whitespace().next() == Some(&format!("/dev/{name}")));
        if held || swapped {
            return Err(format!(
                "{} is in use: {name} is {} ",
                device.display(),
                if swapped {
                    "used as swap"
                } else {
                    "held by another device (RAID, LVM, crypt)"
                }
            ));
        }
    }
    Ok(())
}

/// Writes `image` to `device` from its first byte, calling `progress(done, total)` as it goes,
/// then reads it back from the device (not the page cache) and compares SHA-256. Returns the
/// image's SHA-256 in hex.
pub fn write_and_verify(
    image: &Path,
    device: &Path,
    mut progress: impl FnMut(&str, u64, u64),
) -> Result<String, String> {
    check_target(device)?;
    fn at(p: &Path) -> impl Fn(io::Error) -> String + '_ {
        move |e| format!("{}: {e}", p.display())
    }
    let mut source = File::open(image).map_err(at(image))?;
    let total = source.metadata().map_err(at(image))?.len();
    let mut target = OpenOptions::new()
        .read(true)
        .write(true)
        .open(device)
        .map_err(at(device))?;
    let meta = target.metadata().map_err(at(device))?;
    if meta.file_type().is_block_device() {
        let capacity = crate::disk::disk_len(&mut target).map_err(at(device))?;
        if capacity < total {
            return Err(format!(
                "{} holds {capacity} bytes; the image needs {total}",
                device.display()
            ));
        }
        target.seek(SeekFrom::Start(0)).map_err(at(device))?;
    } else {
        target.set_len(0).map_err(at(device))?;
    }

    let mut buf = vec![0u8; CHUNK];
    let mut written = Sha256::new();
    let mut done = 0u64;
    loop {
        let n = fill(&mut source, &mut buf).map_err(at(image))?;
        if n == 0 {
            break;
        }
        written.update(&buf[..n]);
        target.write_all(&buf[..n]).map_err(at(device))?;
        done += n as u64;
        progress("writing", done, total);
    }
    target.sync_all().map_err(at(device))?;
    let expected = hex(&written.finalize());

    // Read back what the device holds, not what the kernel still caches.
    let _ = nix::fcntl::posix_fadvise(
        &target,
        0,
        0,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
    target.seek(SeekFrom::Start(0)).map_err(at(device))?;
    let mut read = Sha256::new();
    let mut left = total;
    while left > 0 {
        let want = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
        target.read_exact(&mut buf[..want]).map_err(at(device))?;
        read.update(&buf[..want]);
        left -= want as u64;
        progress("checking", total - left, total);
    }
    let actual = hex(&read.finalize());
    if actual != expected {
        return Err(format!(
            "{} reads back different bytes (SHA-256 {actual}, wrote {expected}): the card is failing or fake; use another",
            device.display()
        ));
    }
    Ok(expected)
}

fn fill(source: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match source.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake `/sys`: `sda` with partitions `sda1`, `sda2`; `sdb` with `sdb1`.
    fn sysfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let devices = dir.path().join("devices");
        let block = dir.path().join("dev/block");
        fs::create_dir_all(&block).expect("mkdir");
        for (disk, major_minor, parts) in [("sda", "8:0", 2), ("sdb", "8:16", 1)] {
            let d = devices.join(disk);
            fs::create_dir_all(d.join("holders")).expect("mkdir");
            std::os::unix::fs::symlink(&d, block.join(major_minor)).expect("link");
            for i in 1..=parts {
                let p = d.join(format!("{disk}{i}"));
                fs::create_dir_all(p.join("holders")).expect("mkdir");
                fs::write(p.join("partition"), format!("{i}\n")).expect("write");
                let base: u32 = major_minor[2..].parse().expect("minor");
                std::os::unix::fs::symlink(&p, block.join(format!("8:{}", base + i)))
                    .expect("link");
            }
        }
        dir
    }

    const MOUNTINFO: &str = "22 1 8:2 / / rw,relatime - ext4 /dev/sda2 rw\n\
                             23 22 8:1 / /boot rw - vfat /dev/sda1 rw\n\
                             24 22 0:5 / /proc rw - proc proc rw\n";
    const SWAPS: &str = "Filename Type Size Used Priority\n";

    #[test]
    fn the_system_disk_and_its_partitions_are_refused_a_free_disk_is_not() {
        let sys = sysfs();
        let block = sys.path().join("dev/block");
        let dev = Path::new("/dev/x");
        let err = in_use(dev, "8:0", &block, MOUNTINFO, SWAPS).expect_err("system disk");
        assert!(err.contains("mounted at /"), "{err}");
        let err = in_use(dev, "8:17", &block, "", SWAPS).expect_err("a partition");
        assert!(err.contains("partition"), "{err}");
        in_use(dev, "8:16", &block, MOUNTINFO, SWAPS).expect("sdb is free");
        let swaps = format!("{SWAPS}/dev/sdb1 partition 1024 0 -2\n");
        let err = in_use(dev, "8:16", &block, MOUNTINFO, &swaps).expect_err("swap");
        assert!(err.contains("swap"), "{err}");
        fs::write(sys.path().join("devices/sdb/sdb1/holders/dm-0"), "").expect("holder");
        let err = in_use(dev, "8:16", &block, MOUNTINFO, SWAPS).expect_err("held");
        assert!(err.contains("held"), "{err}");
    }
}
