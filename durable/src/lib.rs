//! Crash-safe file replacement: every write of state, config or boot files goes through here.
//!
//! The new contents go to a temporary file in the same directory, which is flushed to disk and then
//! renamed over the target; the directory is flushed last so the rename itself survives a power
//! cut. A reader therefore sees either the old file or the new one, never a mix.
//!
//! [`read_bounded`] is the other side: every read of a small state, manifest or pointer file
//! that someone else could have replaced (a FIFO, a device, a gigabyte of text) goes through it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Replaces `path` with `contents` atomically, keeping the old file's permissions when it had one.
pub fn replace(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mode = fs::metadata(path)
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()))
        .unwrap_or(0o644);
    replace_with_mode(path, contents, mode)
}

/// Replaces `path` atomically with a file only its owner can read or write (keys, secrets):
/// the contents are never readable by others, not even in the temporary file.
pub fn replace_private(path: &Path, contents: &[u8]) -> io::Result<()> {
    replace_with_mode(path, contents, 0o600)
}

/// Creates `path` with `contents`, owner-only, only if nothing is there yet: `Ok(true)` when
/// this call made it, `Ok(false)` when it already existed (then it is left as it is). The
/// contents are written whole to a temporary file first and then hard-linked into place, which
/// fails if the name is taken: of two callers at once exactly one creates it, and a reader or
/// a crash never sees a partial file. For secrets made once (a fleet's secret, a device key).
pub fn create_private(path: &Path, contents: &[u8]) -> io::Result<bool> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let (dir, tmp) = beside(
        path,
        &format!(
            ".new-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ),
    )?;
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(contents)?;
        file.sync_all()?;
        drop(file);
        let created = match fs::hard_link(&tmp, path) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(e),
        };
        fs::remove_file(&tmp)?;
        sync_dir(dir)?;
        Ok(created)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// `path`'s directory, and the hidden temporary name `.NAME{suffix}` in it (beside the file,
/// so a rename or link into place stays on one filesystem).
fn beside<'p>(path: &'p Path, suffix: &str) -> io::Result<(&'p Path, std::path::PathBuf)> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(suffix);
    Ok((dir, dir.join(tmp_name)))
}

/// Replaces `path` atomically with everything `source` yields (large files: a kernel, an
/// initramfs), streamed rather than held in memory.
pub fn replace_from(path: &Path, source: &mut impl Read) -> io::Result<()> {
    replace_streaming(path, 0o644, |file| io::copy(source, file).map(|_| ()))
}

fn replace_with_mode(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    replace_streaming(path, mode, |file| file.write_all(contents))
}

fn replace_streaming(
    path: &Path,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> io::Result<()> {
    let (dir, tmp) = beside(path, &format!(".tmp-{}", std::process::id()))?;

    // A stale temporary file from a crash would keep its old mode through `open`.
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode & 0o7777)
            .open(&tmp)?;
        fill(&mut file)?;
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)?;
        sync_dir(dir)
    })();
    if result.is_err() {
        // Leave nothing half-written behind; the old file is untouched.
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Whether [`read_bounded`] opens a symbolic link's target or refuses the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Links {
    /// Follow it (a path an operator typed).
    Follow,
    /// Refuse it (files we wrote ourselves, where a link means someone else put it there).
    Refuse,
}

/// Reads the whole regular file at `path`, refusing anything that could hang or exhaust the
/// reader: a FIFO or device (opened non-blocking, so opening a FIFO without a writer does not
/// wait, then refused by `fstat` of the opened descriptor, so it cannot be swapped after a
/// check), a directory, a symbolic link when `links` is [`Links::Refuse`], and more than `max`
/// bytes (at most `max + 1` are ever read, so a huge file costs no huge allocation).
///
/// Errors carry the path and say what was found: `InvalidInput` for a file that is not a
/// regular file, `InvalidData` for one that is too large.
pub fn read_bounded(path: &Path, max: u64, links: Links) -> io::Result<Vec<u8>> {
    let mut flags = nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC;
    if links == Links::Refuse {
        flags |= nix::libc::O_NOFOLLOW;
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| {
            if links == Links::Refuse && e.raw_os_error() == Some(nix::libc::ELOOP) {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} is a symbolic link, not a regular file (replace it with the file itself)",
                        path.display()
                    ),
                )
            } else {
                io::Error::new(e.kind(), format!("{}: {e}", path.display()))
            }
        })?;
    let meta = file
        .metadata()
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} is {}, not a regular file",
                path.display(),
                file_kind(&meta.file_type())
            ),
        ));
    }
    let too_large = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{} is larger than {max} bytes, more than such a file can be",
                path.display()
            ),
        )
    };
    if meta.len() > max {
        return Err(too_large());
    }
    // The size can still grow between fstat and read: the bound is on what is read.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    if bytes.len() as u64 > max {
        return Err(too_large());
    }
    Ok(bytes)
}

fn file_kind(kind: &fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else if kind.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Flushes a directory's entries (renames, creations) to disk.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    let handle = File::open(dir)?;
    let synced = match handle.sync_all() {
        // Some filesystems refuse fsync on directories; FAT is handled below either way.
        Err(e) if e.kind() == io::ErrorKind::InvalidInput => Ok(()),
        other => other,
    };
    // On FAT (the boot partition) a directory fsync does not write the directory entry and
    // the allocation table together: a power cut soon after can leave the new clusters
    // allocated and the old entry pointing at freed ones. Flushing the whole (small)
    // filesystem writes both.
    let on_fat = nix::sys::statfs::fstatfs(&handle)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::MSDOS_SUPER_MAGIC);
    if on_fat {
        nix::unistd::syncfs(&handle).map_err(io::Error::from)?;
    }
    synced
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn of_creators_at_once_exactly_one_creates_and_its_contents_stay() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("secret");
        let creators: Vec<_> = (0..16u8)
            .map(|i| {
                let path = path.clone();
                std::thread::spawn(move || (i, create_private(&path, &[i; 32]).expect("create")))
            })
            .collect();
        let winners: Vec<u8> = creators
            .into_iter()
            .map(|c| c.join().expect("creator"))
            .filter_map(|(i, created)| created.then_some(i))
            .collect();
        assert_eq!(winners.len(), 1, "{winners:?}");
        assert_eq!(fs::read(&path).expect("read"), vec![winners[0]; 32]);
        let mode = fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(!create_private(&path, b"other").expect("exists"));
        assert_eq!(fs::read(&path).expect("read"), vec![winners[0]; 32]);
        let names = fs::read_dir(dir.path()).expect("list").count();
        assert_eq!(names, 1, "no temporary file left");
    }

    #[test]
    fn replaces_contents_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("config.txt");
        fs::write(&target, "old").expect("seed");
        replace(&target, b"new").expect("replace");
        assert_eq!(fs::read_to_string(&target).expect("read"), "new");
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("config.txt")]);
    }

    #[test]
    fn keeps_permissions_of_the_old_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("secret");
        fs::write(&target, "old").expect("seed");
        fs::set_permissions(&target, fs::Permissions::from_mode(0o600)).expect("chmod");
        replace(&target, b"new").expect("replace");
        let mode = fs::metadata(&target).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn private_files_are_owner_only_from_the_start() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("key");
        fs::write(&target, "old").expect("seed");
        replace_private(&target, b"secret").expect("replace");
        let mode = fs::metadata(&target).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(fs::read_to_string(&target).expect("read"), "secret");
    }

    /// Runs `f` on another thread and fails the test instead of hanging when it blocks.
    fn within_5s<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(std::time::Duration::from_secs(5))
            .expect("read_bounded blocked")
    }

    #[test]
    fn bounded_read_refuses_a_fifo_without_waiting_for_a_writer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("manifest.toml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let e = within_5s(move || read_bounded(&fifo, 1024, Links::Follow)).expect_err("fifo");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    #[test]
    fn bounded_read_refuses_directories_links_when_asked_and_large_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = read_bounded(dir.path(), 1024, Links::Follow).expect_err("dir");
        assert!(e.to_string().contains("a directory"), "{e}");

        let big = dir.path().join("current");
        fs::write(&big, vec![b'a'; 4097]).expect("seed");
        let e = read_bounded(&big, 4096, Links::Follow).expect_err("large");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("larger than 4096 bytes"), "{e}");

        let small = dir.path().join("small");
        fs::write(&small, b"v1\n").expect("seed");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&small, &link).expect("symlink");
        assert_eq!(
            read_bounded(&link, 4096, Links::Follow).expect("followed"),
            b"v1\n"
        );
        let e = read_bounded(&link, 4096, Links::Refuse).expect_err("link");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(
            read_bounded(&small, 3, Links::Refuse).expect("exact"),
            b"v1\n"
        );
    }

    #[test]
    fn failure_keeps_the_old_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        // The target is a directory, so the rename must fail; nothing else may change.
        let target = dir.path().join("occupied");
        fs::create_dir(&target).expect("mkdir");
        fs::write(target.join("inside"), "keep").expect("seed");
        assert!(replace(&target, b"new").is_err());
        assert_eq!(
            fs::read_to_string(target.join("inside")).expect("read"),
            "keep"
        );
        assert_eq!(fs::read_dir(dir.path()).expect("list").count(), 1);
    }
}
