//! A GGUF model file mapped into memory, with its header validated and zero-copy views of its
//! tensors. Nothing is copied at load: a tensor is a slice of the map.

use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use gguf::{Header, TensorInfo};
use memmap2::Mmap;

/// Why a model file cannot be used: the file and what is wrong with it.
#[derive(Debug)]
pub struct LoadError {
    /// The model file.
    pub path: PathBuf,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.message)
    }
}

impl std::error::Error for LoadError {}

/// An open model file.
pub struct ModelFile {
    path: PathBuf,
    map: Mmap,
    header: Header,
}

/// A tensor: its directory entry and its bytes inside the map.
#[derive(Debug, Clone, Copy)]
pub struct Tensor<'a> {
    /// Name, shape, type and offset.
    pub info: &'a TensorInfo,
    /// The stored data.
    pub bytes: &'a [u8],
}

impl Tensor<'_> {
    /// Elements per row (the innermost dimension).
    pub fn row_len(&self) -> usize {
        self.info.dims[0] as usize
    }

    /// Number of rows (the product of the outer dimensions).
    pub fn rows(&self) -> usize {
        self.info.dims[1..].iter().product::<u64>() as usize
    }

    /// Stored bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.bytes.len() / self.rows().max(1)
    }

    /// The stored bytes of row `i`.
    pub fn row(&self, i: usize) -> &[u8] {
        let n = self.row_bytes();
        &self.bytes[i * n..(i + 1) * n]
    }
}

#[allow(unsafe_code)]
fn map(file: &File) -> std::io::Result<Mmap> {
    // SAFETY: read-only map of a model file the supervisor verified and never modifies in place
    // (installs rename new files over old ones); all reads are bounds-checked against the
    // validated header first.
    unsafe { Mmap::map(file) }
}

impl ModelFile {
    /// Gives back the pages of `bytes` (a part of this file's map, such as a tensor copied
    /// elsewhere at load) so they no longer count as this process's memory; a later read pages
    /// them in again from the file. Only whole pages inside `bytes` are given back.
    #[allow(unsafe_code)]
    pub fn release(&self, bytes: &[u8]) {
        // The largest page of the boards served (the Pi 5's kernel uses 16 KiB pages): its
        // multiples are whole pages on every one.
        const PAGE: usize = 16 << 10;
        let base = self.map.as_ptr() as usize;
        let start = (bytes.as_ptr() as usize).wrapping_sub(base);
        let Some(end) = start.checked_add(bytes.len()) else {
            return;
        };
        if end > self.map.len() {
            return;
        }
        let (first, last) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
        if first < last {
            // SAFETY: a read-only, file-backed map: pages dropped here are read again from the
            // file on the next access, so every reference into the map stays valid and keeps
            // its bytes (the file is never modified in place, see `map`).
            let _ = unsafe {
                self.map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    first,
                    last - first,
                )
            };
        }
    }

    /// Opens and validates `path`.
    pub fn open(path: &Path) -> Result<ModelFile, LoadError> {
        let fail = |message: String| LoadError {
            path: path.to_path_buf(),
            message,
        };
        let file = File::open(path).map_err(|e| fail(format!("cannot open: {e}")))?;
        let len = file
            .metadata()
            .map_err(|e| fail(format!("cannot read: {e}")))?
            .len();
        if len < 24 {
            return Err(fail(format!("{len} bytes is too short for a GGUF file")));
        }
        let map = map(&file).map_err(|e| fail(format!("cannot map: {e}")))?;
        let header = Header::parse(&map).map_err(|e| fail(e.to_string()))?;
        Ok(ModelFile {
            path: path.to_path_buf(),
            map,
            header,
        })
    }

    /// The validated header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The whole file (array metadata is read from it on demand, see `gguf::arrays`).
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A tensor by name; an error names the missing tensor.
    pub fn tensor(&self, name: &str) -> Result<Tensor<'_>, LoadError> {
        let info = self
            .header
            .tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| LoadError {
                path: self.path.clone(),
                message: format!("the model has no tensor {name}"),
            })?;
        // Header::parse checked offset + size against the data section.
        let start = self.header.data_start + info.offset as usize;
        Ok(Tensor {
            info,
            bytes: &self.map[start..start + info.size as usize],
        })
    }
}
