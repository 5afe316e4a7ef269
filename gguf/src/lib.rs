//! GGUF model files, read defensively and rewritten safely.
//!
//! [`Header::parse`] reads the header of an untrusted file (usually a memory map): every count,
//! length, type, shape and offset is checked against the bytes actually there before it is used,
//! so a malformed or hostile file is an error naming the field, never a panic, an out-of-bounds
//! read or a huge allocation. [`rewrite::with_edits`] produces a new header with metadata keys
//! set, replaced or removed; the tensor data that follows is reused byte for byte, at the same
//! alignment.
//!
//! The supervisor uses this to patch published models; the engine's loader builds on the same
//! reader.

pub mod arrays;
mod error;
mod header;
mod reader;
pub mod rewrite;
mod types;
mod value;

pub use error::GgufError;
pub use header::{Header, KeyValue, TensorInfo};
pub use types::TensorType;
pub use value::{Value, ValueType};

/// The four bytes every GGUF file starts with.
pub const MAGIC: &[u8; 4] = b"GGUF";
/// Alignment of the tensor data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

#[cfg(any(test, feature = "testing"))]
pub mod testfile;
#[cfg(test)]
mod tests;
