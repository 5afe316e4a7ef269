//! Reading array values on demand (token lists, merges, scores), straight from the file bytes
//! the header was parsed from; the header only records their type and length.

use crate::reader::Reader;
use crate::{GgufError, KeyValue, Value, ValueType};

/// Positions the reader at the first element of `kv`'s array, checking its element type.
fn elements<'a>(
    file: &'a [u8],
    kv: &KeyValue,
    want: ValueType,
) -> Result<(Reader<'a>, usize), GgufError> {
    let Value::Array { element, len } = kv.value else {
        return Err(GgufError::at(
            kv.span.start,
            format!("{} is not an array", kv.key),
        ));
    };
    if element != want {
        return Err(GgufError::at(
            kv.span.start,
            format!("{} holds {element:?} elements, not {want:?}", kv.key),
        ));
    }
    let slice = file
        .get(kv.span.clone())
        .ok_or_else(|| GgufError::at(kv.span.start, "the array lies outside the file"))?;
    let mut r = Reader::new(slice);
    r.string("key")?;
    r.take(4 + 4 + 8, "array header")?;
    Ok((r, len as usize))
}

/// The strings of a string array.
pub fn strings<'a>(file: &'a [u8], kv: &KeyValue) -> Result<Vec<&'a str>, GgufError> {
    let (mut r, len) = elements(file, kv, ValueType::String)?;
    (0..len).map(|_| r.string(&kv.key)).collect()
}

/// The values of an f32 array.
pub fn f32s(file: &[u8], kv: &KeyValue) -> Result<Vec<f32>, GgufError> {
    let (mut r, len) = elements(file, kv, ValueType::F32)?;
    (0..len)
        .map(|_| r.array::<4>(&kv.key).map(f32::from_le_bytes))
        .collect()
}

/// The values of an i32 array.
pub fn i32s(file: &[u8], kv: &KeyValue) -> Result<Vec<i32>, GgufError> {
    let (mut r, len) = elements(file, kv, ValueType::I32)?;
    (0..len)
        .map(|_| r.array::<4>(&kv.key).map(i32::from_le_bytes))
        .collect()
}
