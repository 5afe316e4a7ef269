//! Writing an image to an SD card or NVMe drive, read back and checked.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

const CHUNK: usize = 4 << 20;

/// Opens the target to write, and refuses it unless it may be overwritten: a partition
/// rather than a whole disk, a disk with a mounted partition (the system disk always has one),
/// or one another driver holds (RAID, LVM, swap); a regular file (an image being written) only
/// if it is not `source` itself. A disk is opened with `O_EXCL`, which the kernel refuses while
/// anything has it mounted or claimed and which keeps it ours from the check to the last
/// write; the checks read the opened descriptor, never the path again. When the kernel's
/// tables cannot be read, the disk is refused: not knowing is not "free".
pub fn open_target(device: &Path, source: &File) -> Result<File, String> {
    let at = |e: io::Error| format!("{}: {e}", device.display());
    let meta = fs::metadata(device).map_err(at)?;
    let file = if meta.file_type().is_block_device() {
        OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(nix::libc::O_EXCL)
            .open(device)
            .map_err(|e| {
                if e.raw_os_error() == Some(nix::libc::EBUSY) {
                    format!(
                        "{} is in use (mounted, or held by another program); unmount it first",
                        device.display()
                    )
                } else {
                    at(e)
                }
            })?
    } else if meta.file_type().is_file() {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(device)
            .map_err(at)?
    } else {
        return Err(format!(
            "{} is neither a disk nor a file; name the card's device (e.g. /dev/sdb or /dev/mmcblk0)",
            device.display()
        ));
    };
    let opened = file.metadata().map_err(at)?;
    let image = source.metadata().map_err(at)?;
    if opened.dev() == image.dev() && opened.ino() == image.ino() {
        return Err(format!(
            "{} is the image being written; name the card's device",
            device.display()
        ));
    }
    if opened.file_type().is_block_device() {
        let rdev = opened.rdev();
        let id = format!(
            "{}:{}",
            nix::sys::stat::major(rdev),
            nix::sys::stat::minor(rdev)
        );
        let read = |path: &str| {
            fs::read_to_string(path).map_err(|e| {
                format!(
                    "cannot tell whether {} is in use ({path}: {e}); not written",
                    device.display()
                )
            })
        };
        let (mountinfo, swaps) = (read("/proc/self/mountinfo")?, read("/proc/swaps")?);
        in_use(device, &id, Path::new("/sys/dev/block"), &mountinfo, &swaps)?;
    }
    Ok(file)
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
    fn at(p: &Path) -> impl Fn(io::Error) -> String + '_ {
        move |e| format!("{}: {e}", p.display())
    }
    let mut source = File::open(image).map_err(at(image))?;
    let total = source.metadata().map_err(at(image))?.len();
    let mut target = open_target(device, &source)?;
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
    fn the_image_itself_is_never_the_target_even_by_another_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("appliance.img");
        fs::write(&image, vec![7u8; 4096]).expect("image");
        let alias = dir.path().join("alias.img");
        std::os::unix::fs::symlink(&image, &alias).expect("link");
        for target in [&image, &alias] {
            let e = write_and_verify(&image, target, |_, _, _| {}).expect_err("the source");
            assert!(e.contains("is the image being written"), "{e}");
        }
        assert_eq!(
            fs::read(&image).expect("read"),
            vec![7u8; 4096],
            "untouched"
        );
        let copy = dir.path().join("copy.img");
        fs::write(&copy, b"old").expect("copy");
        write_and_verify(&image, &copy, |_, _, _| {}).expect("another file is written");
        assert_eq!(fs::read(&copy).expect("read"), vec![7u8; 4096]);
    }

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
