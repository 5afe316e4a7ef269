//! SHA-256 helpers: hex, whole-buffer, parallel chunks, and a hashing writer.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use rayon::prelude::*;
use sha2::{Digest, Sha256};

use crate::Error;

/// A SHA-256 digest.
pub type Sha256Digest = [u8; 32];

/// The digest of `bytes`.
pub fn sha256(bytes: &[u8]) -> Sha256Digest {
    Sha256::digest(bytes).into()
}

/// Lowercase hex.
pub fn to_hex(digest: &Sha256Digest) -> String {
    hex::encode(digest)
}

/// The digest of every `chunk_size` piece of `bytes`, computed in parallel.
pub fn chunk_digests(bytes: &[u8], chunk_size: usize) -> Vec<Sha256Digest> {
    bytes.par_chunks(chunk_size.max(1)).map(sha256).collect()
}

/// A writer that hashes and counts what passes through it.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    /// Wraps `inner`.
    pub fn new(inner: W) -> HashingWriter<W> {
        HashingWriter {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The digest of everything written, and the inner writer.
    pub fn finish(self) -> (Sha256Digest, W) {
        (self.hasher.finalize().into(), self.inner)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Creates `path`, lets `fill` write it through a hashing writer, and syncs it to disk; returns
/// the SHA-256 (hex) and length of what was written.
pub fn write_synced(
    path: &Path,
    fill: impl FnOnce(&mut dyn Write) -> Result<(), Error>,
) -> Result<(String, u64), Error> {
    let fail = |what: &str, e: io::Error| Error::io(format!("{what} {}", path.display()), e);
    let file = File::create(path).map_err(|e| fail("creating", e))?;
    let mut out = HashingWriter::new(BufWriter::with_capacity(1 << 20, file));
    fill(&mut out)?;
    out.flush().map_err(|e| fail("writing", e))?;
    let len = out.written();
    let (digest, buffered) = out.finish();
    let file = buffered
        .into_inner()
        .map_err(|e| fail("writing", e.into_error()))?;
    file.sync_all().map_err(|e| fail("syncing", e))?;
    Ok((to_hex(&digest), len))
}
