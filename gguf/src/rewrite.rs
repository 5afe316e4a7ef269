//! Rewriting a GGUF header with metadata edits. Unchanged entries and the whole tensor directory
//! are copied byte for byte; tensor offsets are relative to the data section, so the tensor data
//! stays valid once the new header is padded to the same alignment.

use crate::header::align_up;
use crate::{GgufError, Header, MAGIC, Value};

/// One metadata edit.
#[derive(Debug, Clone, PartialEq)]
pub enum Edit {
    /// Add the key, or overwrite it if present.
    Set(String, Value),
    /// Overwrite a key that must already exist.
    Replace(String, Value),
    /// Delete a key that must exist.
    Remove(String),
    /// Add the key, or overwrite it, with an entry copied whole from another file: the bytes
    /// its [`crate::KeyValue::span`] covers there (key, type tag and value, arrays included).
    Copy(String, Vec<u8>),
}

impl Edit {
    fn key(&self) -> &str {
        match self {
            Edit::Set(k, _) | Edit::Replace(k, _) | Edit::Remove(k) | Edit::Copy(k, _) => k,
        }
    }
}

/// The new header bytes (including the padding up to the data section) for `file` with `edits`
/// applied in order. Write them, then `file[header.data_start..]` unchanged.
pub fn with_edits(file: &[u8], header: &Header, edits: &[Edit]) -> Result<Vec<u8>, GgufError> {
    // Start from the existing entries as (key, Some(original span) | None + new value).
    enum Entry<'a> {
        Original(&'a [u8]),
        New(&'a Value),
    }
    // A copied entry is written as it was, so it must begin with its own key.
    let names_itself = |key: &str, bytes: &[u8]| {
        bytes.len() > 8 + key.len()
            && bytes[..8] == (key.len() as u64).to_le_bytes()
            && &bytes[8..8 + key.len()] == key.as_bytes()
    };
    let mut entries: Vec<(String, Entry<'_>)> = header
        .metadata
        .iter()
        .map(|kv| (kv.key.clone(), Entry::Original(&file[kv.span.clone()])))
        .collect();
    for edit in edits {
        let key = edit.key();
        if key == "general.alignment" {
            return Err(GgufError::at(
                0,
                "general.alignment cannot be edited: tensor data would move",
            ));
        }
        if key.is_empty() {
            return Err(GgufError::at(0, "an edit has an empty key"));
        }
        let existing = entries.iter().position(|(k, _)| k == key);
        match (edit, existing) {
            (Edit::Copy(_, bytes), _) if !names_itself(key, bytes) => {
                return Err(GgufError::at(
                    0,
                    format!("the entry copied as {key} does not begin with that key"),
                ));
            }
            (Edit::Copy(_, bytes), Some(i)) => entries[i].1 = Entry::Original(bytes),
            (Edit::Copy(_, bytes), None) => entries.push((key.to_string(), Entry::Original(bytes))),
            (Edit::Set(_, v), Some(i)) | (Edit::Replace(_, v), Some(i)) => {
                entries[i].1 = Entry::New(v)
            }
            (Edit::Set(_, v), None) => entries.push((key.to_string(), Entry::New(v))),
            (Edit::Replace(..), None) => {
                return Err(GgufError::at(
                    0,
                    format!("cannot replace {key}: the file has no such key"),
                ));
            }
            (Edit::Remove(_), Some(i)) => {
                entries.remove(i);
            }
            (Edit::Remove(_), None) => {
                return Err(GgufError::at(
                    0,
                    format!("cannot remove {key}: the file has no such key"),
                ));
            }
        }
    }

    let mut out = Vec::with_capacity(header.data_start + 4096);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&header.version.to_le_bytes());
    out.extend_from_slice(&(header.tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (key, entry) in &entries {
        match entry {
            Entry::Original(bytes) => out.extend_from_slice(bytes),
            Entry::New(value) => {
                out.extend_from_slice(&(key.len() as u64).to_le_bytes());
                out.extend_from_slice(key.as_bytes());
                out.extend_from_slice(&value.value_type().tag().to_le_bytes());
                value
                    .encode(&mut out)
                    .map_err(|e| GgufError::at(0, format!("{key}: {e}")))?;
            }
        }
    }
    if let (Some(first), Some(last)) = (header.tensors.first(), header.tensors.last()) {
        out.extend_from_slice(&file[first.span.start..last.span.end]);
    }
    let padded = align_up(out.len() as u64, header.alignment)
        .ok_or_else(|| GgufError::at(0, "rewritten header is too large"))?;
    out.resize(padded as usize, 0);
    Ok(out)
}
