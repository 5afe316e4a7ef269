use std::fmt;

/// Why a GGUF file was refused: what was wrong, and at which byte offset of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufError {
    /// Byte offset where the problem was found.
    pub offset: u64,
    /// What is wrong, naming the field.
    pub message: String,
}

impl GgufError {
    pub(crate) fn at(offset: usize, message: impl Into<String>) -> GgufError {
        GgufError {
            offset: offset as u64,
            message: message.into(),
        }
    }
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.offset)
    }
}

impl std::error::Error for GgufError {}
