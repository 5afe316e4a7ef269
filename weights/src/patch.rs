//! Applying one patch to exact bytes. The caller has already checked the input's SHA-256 and
//! checks the output's; here the patch's own preconditions are checked (the GGUF parses and
//! the edits apply; the replaced bytes are the expected ones).

use std::io::Write;

use gguf::rewrite::{self, Edit};
use gguf::{Header, Value};

use crate::hash::{sha256, to_hex};
use crate::manifest::{EditOp, MetadataEdit};
use crate::{Error, ErrorKind, Patch};

fn patch_error(message: String) -> Error {
    Error::new(ErrorKind::Patch, message)
}

/// Writes `input` with `patch` applied to `out`.
pub fn apply(input: &[u8], patch: &Patch, out: &mut dyn Write) -> Result<(), Error> {
    let write = |out: &mut dyn Write, bytes: &[u8]| {
        out.write_all(bytes)
            .map_err(|e| Error::io("writing the patched file", e))
    };
    match patch {
        Patch::GgufMetadata { edits, .. } => {
            let header = Header::parse(input)
                .map_err(|e| patch_error(format!("the input is not a valid GGUF file: {e}")))?;
            let edits = edits
                .iter()
                .map(to_gguf_edit)
                .collect::<Result<Vec<_>, _>>()?;
            let new_header =
                rewrite::with_edits(input, &header, &edits).map_err(|e| patch_error(e.message))?;
            write(out, &new_header)?;
            write(out, &input[header.data_start..])
        }
        Patch::Bytes {
            offset,
            old_sha256,
            new_hex,
            ..
        } => {
            let new = hex::decode(new_hex).map_err(|e| patch_error(format!("new_hex: {e}")))?;
            let start = usize::try_from(*offset).ok().filter(|&s| s <= input.len());
            let end = start
                .and_then(|s| s.checked_add(new.len()))
                .filter(|&e| e <= input.len());
            let (Some(start), Some(end)) = (start, end) else {
                return Err(patch_error(format!(
                    "bytes {offset}..{offset}+{} lie outside the {}-byte file",
                    new.len(),
                    input.len()
                )));
            };
            let old = to_hex(&sha256(&input[start..end]));
            if old != *old_sha256 {
                return Err(patch_error(format!(
                    "bytes {start}..{end} hash to {old}, not the {old_sha256} the patch was written for"
                )));
            }
            write(out, &input[..start])?;
            write(out, &new)?;
            write(out, &input[end..])
        }
    }
}

fn to_gguf_edit(edit: &MetadataEdit) -> Result<Edit, Error> {
    let key = edit.key.clone();
    if edit.op == EditOp::Remove {
        if edit.value.is_some() || edit.value_type.is_some() {
            return Err(patch_error(format!("remove {key}: takes no type or value")));
        }
        return Ok(Edit::Remove(key));
    }
    let (Some(ty), Some(value)) = (&edit.value_type, &edit.value) else {
        return Err(patch_error(format!(
            "{key}: set and replace need both type and value"
        )));
    };
    let value = typed_value(&key, ty, value)?;
    Ok(match edit.op {
        EditOp::Replace => Edit::Replace(key, value),
        _ => Edit::Set(key, value),
    })
}

fn typed_value(key: &str, ty: &str, value: &toml::Value) -> Result<Value, Error> {
    let wrong = || patch_error(format!("{key}: {value} is not a valid {ty}"));
    let int = || value.as_integer().ok_or_else(wrong);
    Ok(match ty {
        "u8" => Value::U8(u8::try_from(int()?).map_err(|_| wrong())?),
        "i8" => Value::I8(i8::try_from(int()?).map_err(|_| wrong())?),
        "u16" => Value::U16(u16::try_from(int()?).map_err(|_| wrong())?),
        "i16" => Value::I16(i16::try_from(int()?).map_err(|_| wrong())?),
        "u32" => Value::U32(u32::try_from(int()?).map_err(|_| wrong())?),
        "i32" => Value::I32(i32::try_from(int()?).map_err(|_| wrong())?),
        "u64" => Value::U64(u64::try_from(int()?).map_err(|_| wrong())?),
        "i64" => Value::I64(int()?),
        "f32" => Value::F32(value.as_float().ok_or_else(wrong)? as f32),
        "f64" => Value::F64(value.as_float().ok_or_else(wrong)?),
        "bool" => Value::Bool(value.as_bool().ok_or_else(wrong)?),
        "string" => Value::String(value.as_str().ok_or_else(wrong)?.to_string()),
        other => {
            return Err(patch_error(format!(
                "{key}: unknown type {other:?}; use u8, i8, u16, i16, u32, i32, u64, i64, f32, f64, bool or string"
            )));
        }
    })
}
