//! A bounds-checked little-endian cursor over the file's bytes.

use crate::GgufError;

pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Reader<'a> {
        Reader { bytes, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::at(
                self.pos,
                format!(
                    "{what}: needs {n} bytes, the file has {} left",
                    self.remaining()
                ),
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    pub(crate) fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let raw = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(raw);
        Ok(out)
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must fit in memory and in what is left of the file at `min_size` bytes each.
    pub(crate) fn count(&mut self, min_size: usize, what: &str) -> Result<usize, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits = usize::try_from(n).ok().filter(|&n| {
            n.checked_mul(min_size.max(1))
                .is_some_and(|b| b <= self.remaining())
        });
        fits.ok_or_else(|| {
            GgufError::at(
                at,
                format!(
                    "{what} is {n}, more than the {} bytes left can hold",
                    self.remaining()
                ),
            )
        })
    }

    /// A GGUF string: u64 length, then UTF-8 bytes.
    pub(crate) fn string(&mut self, what: &str) -> Result<&'a str, GgufError> {
        let len = self.count(1, &format!("{what} length"))?;
        let at = self.pos;
        let raw = self.take(len, what)?;
        std::str::from_utf8(raw)
            .map_err(|_| GgufError::at(at, format!("{what} is not valid UTF-8")))
    }
}
