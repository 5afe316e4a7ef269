//! SHA-256 helpers: hex, whole-buffer, parallel chunks, and a hashing writer.

use std::io::{self, Write};

use rayon::prelude::*;
use sha2::{Digest, Sha256};

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
