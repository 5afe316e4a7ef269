//! Crash-safe file replacement: every write of state, config or boot files goes through here.
//!
//! The new contents go to a temporary file in the same directory, which is flushed to disk and then
//! renamed over the target; the directory is flushed last so the rename itself survives a power
//! cut. A reader therefore sees either the old file or the new one, never a mix.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
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

fn replace_with_mode(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    let tmp = dir.join(tmp_name);

    // A stale temporary file from a crash would keep its old mode through `open`.
    let _ = fs::remove_file(&tmp);
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode & 0o7777)
            .open(&tmp)?;
        file.write_all(contents)?;
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
