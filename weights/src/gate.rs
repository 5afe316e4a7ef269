//! The launch gate: the engine is started only with a model that passed verification, and is
//! given the verified path. At boot, `full` verifies every chunk; `fast` trusts an unchanged
//! size, inode and modification time, and still verifies every chunk once the last full check
//! is older than the configured interval.

use std::fs;
use std::path::{Path, PathBuf};

use crate::install::{RECORD, Record, installed};
use crate::sign::{Signed, Trust};
use crate::verify::{verify_draft, verify_file};
use crate::{Error, Manifest};

/// How thoroughly the gate checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reverify {
    /// Every chunk, every time.
    Full,
    /// Size, inode and mtime; every chunk when the last full check is older than this many seconds.
    Fast {
        /// Seconds between full checks.
        full_every_s: u64,
    },
}

/// A model that passed.
#[derive(Debug, Clone)]
pub struct Approved {
    /// The verified weights: what the engine is given.
    pub path: PathBuf,
    /// The model's verified draft head, when it has one (verified in full every time: a head
    /// is a small file).
    pub draft: Option<PathBuf>,
    /// Its manifest.
    pub manifest: Manifest,
    /// Its signature status.
    pub signed: Signed,
    /// What was checked, in words.
    pub checked: String,
}

/// Checks the installed model `id` in `data_dir`.
pub fn check(
    data_dir: &Path,
    id: &str,
    reverify: Reverify,
    trust: &Trust,
    now: u64,
) -> Result<Approved, Error> {
    let (approval, path) = installed(data_dir, id, trust)?;
    let manifest = approval.manifest;
    let draft = match &manifest.draft {
        Some(d) => {
            let head = path.with_file_name(&d.file);
            verify_draft(&head, &manifest)?;
            Some(head)
        }
        None => None,
    };
    let record_path = path.with_file_name(RECORD);
    let record = Record::read(&record_path)?;
    let meta =
        fs::metadata(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;

    if let Reverify::Fast { full_every_s } = reverify {
        // A clock behind the last full check (no RTC, no network time yet) makes it due too.
        let due = now < record.last_full_verify || now - record.last_full_verify >= full_every_s;
        if record.still_describes(&meta, &manifest) && !due {
            return Ok(Approved {
                path,
                draft,
                manifest,
                signed: approval.signed,
                checked: format!(
                    "fast: size, inode, mtime and ctime unchanged since the full check at {}",
                    record.last_full_verify
                ),
            });
        }
    }
    verify_file(&path, &manifest)?;
    // The model is good whether or not the record can be refreshed (a full data partition must
    // not stop the engine); the next check then simply verifies in full again.
    let refreshed =
        Record::of(&path, &manifest, record.installed_at, now).and_then(|r| r.write(&record_path));
    let checked = match refreshed {
        Ok(()) => "full: every chunk verified".to_string(),
        Err(e) => format!("full: every chunk verified (the install record was not updated: {e})"),
    };
    Ok(Approved {
        path,
        draft,
        manifest,
        signed: approval.signed,
        checked,
    })
}
