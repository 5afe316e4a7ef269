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

/// The values of a bool array (each byte 0 or 1).
pub fn bools(file: &[u8], kv: &KeyValue) -> Result<Vec<bool>, GgufError> {
    let (mut r, len) = elements(file, kv, ValueType::Bool)?;
    (0..len)
        .map(|_| match r.array::<1>(&kv.key)? {
            [0] => Ok(false),
            [1] => Ok(true),
            [b] => Err(GgufError::at(
                kv.span.start,
                format!("{}: a bool byte is {b}, not 0 or 1", kv.key),
            )),
        })
        .collect()
}

/// The values of an array of any integer type, each non-negative (per-layer counts and widths,
/// which converters write as u32 or i32).
pub fn counts(file: &[u8], kv: &KeyValue) -> Result<Vec<u64>, GgufError> {
    let Value::Array { element, .. } = kv.value else {
        return Err(GgufError::at(
            kv.span.start,
            format!("{} is not an array", kv.key),
        ));
    };
    let (mut r, len) = elements(file, kv, element)?;
    let negative = || GgufError::at(kv.span.start, format!("{} holds a negative value", kv.key));
    (0..len)
        .map(|_| match element {
            ValueType::U8 => r.array::<1>(&kv.key).map(|b| u64::from(b[0])),
            ValueType::U16 => r
                .array::<2>(&kv.key)
                .map(|b| u64::from(u16::from_le_bytes(b))),
            ValueType::U32 => r
                .array::<4>(&kv.key)
                .map(|b| u64::from(u32::from_le_bytes(b))),
            ValueType::U64 => r.array::<8>(&kv.key).map(u64::from_le_bytes),
            ValueType::I8 => r
                .array::<1>(&kv.key)
                .and_then(|b| u64::try_from(b[0] as i8).map_err(|_| negative())),
            ValueType::I16 => r
                .array::<2>(&kv.key)
                .and_then(|b| u64::try_from(i16::from_le_bytes(b)).map_err(|_| negative())),
            ValueType::I32 => r
                .array::<4>(&kv.key)
                .and_then(|b| u64::try_from(i32::from_le_bytes(b)).map_err(|_| negative())),
            ValueType::I64 => r
                .array::<8>(&kv.key)
                .and_then(|b| u64::try_from(i64::from_le_bytes(b)).map_err(|_| negative())),
            other => Err(GgufError::at(
                kv.span.start,
                format!("{} holds {other:?} elements, not integers", kv.key),
            )),
        })
        .collect()
}
