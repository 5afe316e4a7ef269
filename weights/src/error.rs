use std::fmt;

/// What kind of problem stopped an operation; the supervisor maps kinds to exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The manifest (or a key, signature or patch in it) is malformed.
    BadManifest,
    /// The file is not the one the manifest describes.
    Mismatch,
    /// A signature is missing, wrong or from a key the box does not trust.
    Signature,
    /// A patch cannot apply to these bytes.
    Patch,
    /// Reading or writing failed (disk full, permissions, missing file).
    Io,
    /// Fetching the published source failed.
    Fetch,
    /// No model with this id is installed.
    NotInstalled,
}

/// An error with its kind, a message that says what, where and how to fix it, and for a hash
/// mismatch the first bad byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The kind.
    pub kind: ErrorKind,
    /// What went wrong.
    pub message: String,
    /// For a chunk mismatch: chunk index and byte range `[start, end)`.
    pub bad_chunk: Option<(usize, u64, u64)>,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            message: message.into(),
            bad_chunk: None,
        }
    }

    pub(crate) fn io(what: impl fmt::Display, e: std::io::Error) -> Error {
        Error::new(ErrorKind::Io, format!("{what}: {e}"))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}
