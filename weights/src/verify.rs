//! Checking a file against its manifest: size first, then every chunk's SHA-256 in parallel over
//! a read-only memory map. The error names the first chunk that differs, as a byte range.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;
use rayon::prelude::*;

use crate::hash::{sha256, to_hex};
use crate::{Error, ErrorKind, Manifest};

/// A read-only map of a whole file (an empty file maps to no bytes).
pub struct Mapped {
    map: Option<Mmap>,
}

impl Mapped {
    /// Maps the regular file `path` read-only. It is opened non-blocking and checked on the
    /// opened descriptor, so a FIFO in its place is refused at once instead of hanging here.
    pub fn open(path: &Path) -> Result<Mapped, Error> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(path)
            .map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        if !meta.is_file() {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{} is not a regular file (give the model file itself)",
                    path.display()
                ),
            ));
        }
        let len = meta.len();
        if len == 0 {
            return Ok(Mapped { map: None });
        }
        map(&file)
            .map(|m| Mapped { map: Some(m) })
            .map_err(|e| Error::io(format!("mapping {}", path.display()), e))
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

#[allow(unsafe_code)]
fn map(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: the map is read-only and only read. Files verified here are either the operator's
    // input or installed files, which the supervisor never changes in place (installs write new
    // files and rename them); a concurrent truncation by someone else could fault the read, which
    // ends this process rather than reading wrong bytes.
    unsafe { Mmap::map(file) }
}

/// Checks `path` against the manifest's size and chunk hashes.
pub fn verify_file(path: &Path, manifest: &Manifest) -> Result<(), Error> {
    let len = std::fs::metadata(path)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))?
        .len();
    check_size(path, len, manifest)?;
    let mapped = Mapped::open(path)?;
    verify_bytes(mapped.bytes(), manifest).map_err(|mut e| {
        e.message = format!("{}: {}", path.display(), e.message);
        e
    })
}

fn check_size(path: &Path, len: u64, manifest: &Manifest) -> Result<(), Error> {
    if len == manifest.size {
        return Ok(());
    }
    let hint = match &manifest.source {
        Some(s) if s.size == len && !manifest.patches.is_empty() => {
            " (that is the size of the unpatched source: install it with `supervisor weights install`)"
        }
        _ if len < manifest.size => " (truncated download or copy?)",
        _ => "",
    };
    Err(Error::new(
        ErrorKind::Mismatch,
        format!(
            "{}: {len} bytes, but manifest {} expects {}{hint}",
            path.display(),
            manifest.id,
            manifest.size
        ),
    ))
}

/// Checks bytes against the manifest's size and chunk hashes.
pub fn verify_bytes(bytes: &[u8], manifest: &Manifest) -> Result<(), Error> {
    check_chunks(bytes, manifest.size, &manifest.chunks, manifest, "")
}

/// Checks the model's draft head at `path` against the manifest's `[draft]` (every chunk: a
/// head is a small file).
pub fn verify_draft(path: &Path, manifest: &Manifest) -> Result<(), Error> {
    let Some(draft) = &manifest.draft else {
        return Err(Error::new(
            ErrorKind::BadManifest,
            format!("manifest {} has no draft head", manifest.id),
        ));
    };
    let mapped = Mapped::open(path)?;
    check_chunks(
        mapped.bytes(),
        draft.size,
        &draft.chunks,
        manifest,
        "draft head ",
    )
    .map_err(|mut e| {
        e.message = format!("{}: {}", path.display(), e.message);
        e
    })
}

/// Checks `bytes` against a part's size and chunk hashes (in `manifest`'s chunk size; `what`
/// names the part in messages).
fn check_chunks(
    bytes: &[u8],
    size: u64,
    chunks: &[String],
    manifest: &Manifest,
    what: &str,
) -> Result<(), Error> {
    if bytes.len() as u64 != size {
        return Err(Error::new(
            ErrorKind::Mismatch,
            format!(
                "{} bytes, but manifest {} expects {size} for its {what}file",
                bytes.len(),
                manifest.id,
            ),
        ));
    }
    let chunk = usize::try_from(manifest.chunk_size).unwrap_or(usize::MAX);
    let bad = bytes
        .par_chunks(chunk.max(1))
        .zip(chunks.par_iter())
        .enumerate()
        .find_first(|(_, (piece, expected))| to_hex(&sha256(piece)) != **expected);
    match bad {
        None => Ok(()),
        Some((index, (piece, _))) => {
            let start = index as u64 * manifest.chunk_size;
            let end = start + piece.len() as u64;
            Err(Error {
                kind: ErrorKind::Mismatch,
                message: format!(
                    "{what}chunk {index} (bytes {start}..{end}) does not match manifest {}: the file is corrupt or not the approved one",
                    manifest.id
                ),
                bad_chunk: Some((index, start, end)),
            })
        }
    }
}
