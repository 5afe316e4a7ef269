//! The header: version, metadata and tensor directory, validated against the file.

use std::collections::HashSet;
use std::ops::Range;

use crate::reader::Reader;
use crate::value::{Value, ValueType};
use crate::{DEFAULT_ALIGNMENT, GgufError, MAGIC, TensorType};

/// One metadata entry.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyValue {
    /// The key, e.g. `tokenizer.chat_template`.
    pub key: String,
    /// Its value.
    pub value: Value,
    /// Where the whole entry (key, type tag and value) sits in the file.
    pub span: Range<usize>,
}

/// One tensor's directory entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions, innermost first.
    pub dims: Vec<u64>,
    /// Storage type.
    pub tensor_type: TensorType,
    /// Offset of its data from the start of the data section.
    pub offset: u64,
    /// Size of its data in bytes.
    pub size: u64,
    /// Where the entry sits in the file.
    pub span: Range<usize>,
}

/// A parsed and validated GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata in file order.
    pub metadata: Vec<KeyValue>,
    /// Tensor directory in file order.
    pub tensors: Vec<TensorInfo>,
    /// Alignment of the data section and of every tensor in it.
    pub alignment: u64,
    /// Where the tensor directory ends.
    pub directory_end: usize,
    /// Where the data section starts (the directory end rounded up to the alignment).
    pub data_start: usize,
}

const MAX_DIMS: u32 = 4;
/// The most entries reserved up front from a count in the file.
const RESERVE_LIMIT: usize = 4096;

impl Header {
    /// Parses and validates the header of `file` (the whole file, usually a memory map).
    pub fn parse(file: &[u8]) -> Result<Header, GgufError> {
        let mut r = Reader::new(file);
        if r.take(4, "magic")? != MAGIC {
            return Err(GgufError::at(
                0,
                "not a GGUF file: the magic bytes are not \"GGUF\"",
            ));
        }
        let version = r.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::at(
                4,
                format!("GGUF version {version} is not supported (2 and 3 are)"),
            ));
        }
        // Each tensor entry needs at least 8+4+8+4+8 bytes, each key-value 8+4+1.
        let tensor_count = r.count(32, "tensor count")?;
        let kv_count = r.count(13, "metadata count")?;

        // Counts come from the file: grow as entries actually parse, never reserve on its word.
        let mut metadata = Vec::with_capacity(kv_count.min(RESERVE_LIMIT));
        let mut keys = HashSet::with_capacity(kv_count.min(RESERVE_LIMIT));
        for i in 0..kv_count {
            let start = r.pos;
            let key = r.string(&format!("metadata key {i}"))?.to_string();
            let tag_at = r.pos;
            let tag = r.u32(&format!("type of {key}"))?;
            let ty = ValueType::from_tag(tag)
                .ok_or_else(|| GgufError::at(tag_at, format!("{key}: unknown value type {tag}")))?;
            let value = Value::read(&mut r, ty, &key)?;
            if !keys.insert(key.clone()) {
                return Err(GgufError::at(
                    start,
                    format!("metadata key {key} appears twice"),
                ));
            }
            metadata.push(KeyValue {
                key,
                value,
                span: start..r.pos,
            });
        }

        let alignment = match metadata.iter().find(|kv| kv.key == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(kv) => match kv.value.as_u64() {
                Some(a) if a.is_power_of_two() && a <= 1 << 20 => a,
                _ => {
                    return Err(GgufError::at(
                        kv.span.start,
                        format!(
                            "general.alignment must be a power of two up to 1 MiB, not {:?}",
                            kv.value
                        ),
                    ));
                }
            },
        };

        let mut tensors = Vec::with_capacity(tensor_count.min(RESERVE_LIMIT));
        for i in 0..tensor_count {
            tensors.push(read_tensor(&mut r, i)?);
        }
        let directory_end = r.pos;
        // A file without tensors (llama.cpp's vocabulary files) may end before the padding.
        let no_tensors = tensors.is_empty();
        let data_start = align_up(directory_end as u64, alignment)
            .and_then(|d| usize::try_from(d).ok())
            .map(|d| if no_tensors { d.min(file.len()) } else { d })
            .filter(|&d| d <= file.len())
            .ok_or_else(|| {
                GgufError::at(
                    directory_end,
                    "the data section starts past the end of the file",
                )
            })?;
        let header = Header {
            version,
            metadata,
            tensors,
            alignment,
            directory_end,
            data_start,
        };
        header.check_tensor_data((file.len() - data_start) as u64)?;
        Ok(header)
    }

    /// A metadata entry by key.
    pub fn entry(&self, key: &str) -> Option<&KeyValue> {
        self.metadata.iter().find(|kv| kv.key == key)
    }

    /// A metadata value by key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata
            .iter()
            .find(|kv| kv.key == key)
            .map(|kv| &kv.value)
    }

    /// Every tensor aligned, inside the data section, and not overlapping another.
    fn check_tensor_data(&self, data_len: u64) -> Result<(), GgufError> {
        let mut names = HashSet::with_capacity(self.tensors.len());
        let mut extents: Vec<(u64, u64, &TensorInfo)> = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let fail = |what: String| {
                Err(GgufError::at(
                    t.span.start,
                    format!("tensor {}: {what}", t.name),
                ))
            };
            if !names.insert(t.name.as_str()) {
                return fail("the name appears twice".into());
            }
            if t.offset % self.alignment != 0 {
                return fail(format!(
                    "offset {} is not a multiple of the alignment {}",
                    t.offset, self.alignment
                ));
            }
            match t.offset.checked_add(t.size) {
                Some(end) if end <= data_len => extents.push((t.offset, end, t)),
                _ => {
                    return fail(format!(
                        "data at {}+{} runs past the data section's {data_len} bytes (truncated file?)",
                        t.offset, t.size
                    ));
                }
            }
        }
        extents.sort_by_key(|e| e.0);
        for pair in extents.windows(2) {
            if pair[1].0 < pair[0].1 {
                return Err(GgufError::at(
                    pair[1].2.span.start,
                    format!(
                        "tensor {} overlaps tensor {}",
                        pair[1].2.name, pair[0].2.name
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn read_tensor(r: &mut Reader<'_>, index: usize) -> Result<TensorInfo, GgufError> {
    let start = r.pos;
    let name = r.string(&format!("tensor {index} name"))?.to_string();
    let fail = |at: usize, what: String| GgufError::at(at, format!("tensor {name}: {what}"));
    let dims_at = r.pos;
    let n_dims = r.u32("dimension count")?;
    if !(1..=MAX_DIMS).contains(&n_dims) {
        return Err(fail(
            dims_at,
            format!("{n_dims} dimensions (1 to {MAX_DIMS} allowed)"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    let mut elements: u64 = 1;
    for _ in 0..n_dims {
        let d = r.u64("dimension")?;
        elements = elements.checked_mul(d).filter(|_| d > 0).ok_or_else(|| {
            fail(
                dims_at,
                format!("dimensions {dims:?}×{d} are zero or overflow"),
            )
        })?;
        dims.push(d);
    }
    let type_at = r.pos;
    let id = r.u32("type")?;
    let tensor_type = TensorType::from_id(id)
        .ok_or_else(|| fail(type_at, format!("tensor type {id} is not supported")))?;
    let size = tensor_type.bytes_for(dims[0], elements).ok_or_else(|| {
        fail(
            type_at,
            format!(
                "{} rows of {} elements do not fill whole {}-element blocks",
                tensor_type.name, dims[0], tensor_type.block_elements
            ),
        )
    })?;
    let offset = r.u64("data offset")?;
    Ok(TensorInfo {
        name,
        dims,
        tensor_type,
        offset,
        size,
        span: start..r.pos,
    })
}

pub(crate) fn align_up(n: u64, alignment: u64) -> Option<u64> {
    n.checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}
