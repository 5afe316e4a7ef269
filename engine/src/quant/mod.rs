//! Tensor storage formats and their plain scalar reference: block-by-block dequantization and a
//! row dot product built on it. This is the oracle every SIMD kernel is tested against, so it
//! favours being obviously right over being fast, and follows ggml's arithmetic order.

mod half;
mod kquants;
mod legacy;

use std::fmt;

pub use gguf::TensorType;
pub use half::{bf16_to_f32, f16_to_f32, f32_to_f16};
pub(crate) use kquants::scale_min;
pub(crate) use legacy::IQ4_NL_LEVELS;

/// A buffer that does not hold whole blocks of its type, or a type without a reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantError(pub String);

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for QuantError {}

/// Dequantizes one block of `ty` into `out` (exactly `ty.block_elements` values).
type BlockFn = fn(&[u8], &mut [f32]);

fn block_fn(ty: &TensorType) -> Result<BlockFn, QuantError> {
    Ok(match ty.name {
        "F32" => legacy::f32_block,
        "F16" => legacy::f16_block,
        "BF16" => legacy::bf16_block,
        "Q4_0" => legacy::q4_0,
        "Q4_1" => legacy::q4_1,
        "Q5_0" => legacy::q5_0,
        "Q5_1" => legacy::q5_1,
        "Q8_0" => legacy::q8_0,
        "IQ4_NL" => legacy::iq4_nl,
        "Q4_K" => kquants::q4_k,
        "Q5_K" => kquants::q5_k,
        "Q6_K" => kquants::q6_k,
        other => {
            return Err(QuantError(format!(
                "no reference implementation for {other} tensors"
            )));
        }
    })
}

fn blocks<'a>(
    ty: &TensorType,
    bytes: &'a [u8],
    elements: usize,
) -> Result<std::slice::ChunksExact<'a, u8>, QuantError> {
    let block_bytes = ty.block_bytes as usize;
    let block_elements = ty.block_elements as usize;
    if !bytes.len().is_multiple_of(block_bytes)
        || bytes.len() / block_bytes * block_elements != elements
    {
        return Err(QuantError(format!(
            "{} bytes of {} do not hold exactly {elements} values ({block_elements} per {block_bytes}-byte block)",
            bytes.len(),
            ty.name
        )));
    }
    Ok(bytes.chunks_exact(block_bytes))
}

/// Dequantizes `bytes` (whole blocks of `ty`) into `out`, one value per element.
pub fn dequantize(ty: &TensorType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    let block = block_fn(ty)?;
    let per_block = ty.block_elements as usize;
    for (raw, values) in blocks(ty, bytes, out.len())?.zip(out.chunks_exact_mut(per_block)) {
        block(raw, values);
    }
    Ok(())
}

/// The dot product of one stored row with `x`, accumulated block by block in order.
pub fn dot(ty: &TensorType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let block = block_fn(ty)?;
    let per_block = ty.block_elements as usize;
    let mut scratch = [0f32; 256];
    let mut sum = 0f32;
    for (raw, xs) in blocks(ty, row, x.len())?.zip(x.chunks_exact(per_block)) {
        let values = &mut scratch[..per_block];
        block(raw, values);
        sum += values.iter().zip(xs).map(|(w, v)| w * v).sum::<f32>();
    }
    Ok(sum)
}

/// Reads a little-endian f16 at `at`.
pub(crate) fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}
