//! Metadata values.

use crate::GgufError;
use crate::reader::Reader;

/// GGUF metadata value types (the u32 tag before each value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueType {
    /// 0
    U8,
    /// 1
    I8,
    /// 2
    U16,
    /// 3
    I16,
    /// 4
    U32,
    /// 5
    I32,
    /// 6
    F32,
    /// 7
    Bool,
    /// 8
    String,
    /// 9
    Array,
    /// 10
    U64,
    /// 11
    I64,
    /// 12
    F64,
}

impl ValueType {
    /// The type for a tag.
    pub fn from_tag(tag: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match tag {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The tag written to the file.
    pub fn tag(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Fixed size in bytes, or the smallest encoding for strings (8) and arrays (12).
    fn min_size(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

/// A decoded metadata value. Arrays keep only their element type and length; their bytes stay
/// in the file (token lists run to hundreds of thousands of entries).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// u8
    U8(u8),
    /// i8
    I8(i8),
    /// u16
    U16(u16),
    /// i16
    I16(i16),
    /// u32
    U32(u32),
    /// i32
    I32(i32),
    /// f32
    F32(f32),
    /// bool
    Bool(bool),
    /// UTF-8 string
    String(String),
    /// u64
    U64(u64),
    /// i64
    I64(i64),
    /// f64
    F64(f64),
    /// An array of `len` elements of `element`.
    Array {
        /// Element type.
        element: ValueType,
        /// Number of elements.
        len: u64,
    },
}

/// Nested arrays deeper than this are refused (real files nest at most once).
const MAX_ARRAY_DEPTH: usize = 4;

impl Value {
    /// The value's type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
            Value::Array { .. } => ValueType::Array,
        }
    }

    /// The value as an unsigned integer, whichever integer type the writer chose.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub(crate) fn read(r: &mut Reader<'_>, ty: ValueType, what: &str) -> Result<Value, GgufError> {
        Self::read_nested(r, ty, what, 0)
    }

    fn read_nested(
        r: &mut Reader<'_>,
        ty: ValueType,
        what: &str,
        depth: usize,
    ) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(r.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(r.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(r.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(r.array(what)?)),
            ValueType::U32 => Value::U32(r.u32(what)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(r.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(r.array(what)?)),
            ValueType::U64 => Value::U64(r.u64(what)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(r.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(r.array(what)?)),
            ValueType::Bool => {
                let at = r.pos;
                match r.array::<1>(what)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => {
                        return Err(GgufError::at(
                            at,
                            format!("{what}: bool byte is {b}, not 0 or 1"),
                        ));
                    }
                }
            }
            ValueType::String => Value::String(r.string(what)?.to_string()),
            ValueType::Array => {
                let at = r.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::at(
                        at,
                        format!("{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}"),
                    ));
                }
                let tag = r.u32(&format!("{what} element type"))?;
                let element = ValueType::from_tag(tag).ok_or_else(|| {
                    GgufError::at(at, format!("{what}: unknown array element type {tag}"))
                })?;
                let len = r.count(element.min_size(), &format!("{what} element count"))?;
                match element {
                    // Fixed-size elements: `count` checked they fit, so skip them in one step.
                    ValueType::String | ValueType::Array => {
                        for _ in 0..len {
                            Self::read_nested(r, element, what, depth + 1)?;
                        }
                    }
                    _ => {
                        r.take(len * element.min_size(), what)?;
                    }
                }
                Value::Array {
                    element,
                    len: len as u64,
                }
            }
        })
    }

    /// Encodes a scalar or string value (arrays are only ever copied verbatim).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) -> Result<(), String> {
        match self {
            Value::U8(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Bool(v) => out.push(u8::from(*v)),
            Value::String(s) => {
                out.extend_from_slice(&(s.len() as u64).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
            }
            Value::Array { .. } => return Err("array values cannot be written by an edit".into()),
        }
        Ok(())
    }
}
