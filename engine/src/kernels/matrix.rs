//! A weight matrix as the products read it: the stored rows (all of a tensor's, or one expert's
//! share of a 3-D expert tensor), and for Q5_0 the same rows widened once to Q8_0 for batches.
//!
//! On x86, Q4_K and Q6_K matrices are instead copied once with sixteen rows side by side
//! (`row_lanes`), the copy read by every product and the mapped rows given back.
//!
//! Unpacking a Q5_0 block (nibbles plus a fifth bit per value) costs about as much as the
//! products of one block with eight tokens, so a batch re-doing it for every group of columns
//! spends a fifth of its time there. Q5_0 values (−16…15) with their f16 scale are exactly a Q8_0
//! block, and the Q8_0 kernel sums the same integers with the same scale product in the same
//! order: a widened row gives the stored row's results bit for bit. Single tokens keep reading
//! the smaller stored rows, whose speed depends on memory.

use std::ops::Range;

use super::row_lanes::{self, LaneKind};
use super::{Isa, RowDot, row_dot};
use crate::model_file::{ModelFile, Tensor};
use crate::quant::TensorType;

/// Bytes a model may spend on widened copies; matrices past it stay as stored (slower batches,
/// the same results), so a large Q5_0 model cannot run a small board out of memory.
pub const WIDEN_BUDGET: usize = 256 << 20;

const Q5_0_BYTES: usize = 22;
const Q8_0_BYTES: usize = 34;
const Q8_0_ID: u32 = 8;

/// Stored weights, and a Q8_0 copy for batches where that copy exists.
pub struct Matrix<'a> {
    /// The stored weights.
    pub tensor: Tensor<'a>,
    wide: Option<Box<[u8]>>,
    /// The rows sixteen side by side, read instead of the stored ones where the ISA has kernels
    /// for them.
    lanes: Option<(LaneKind, memmap2::MmapMut)>,
    /// The tensor's rows this matrix is (all of them but for an expert's share).
    window: Range<usize>,
}

impl<'a> Matrix<'a> {
    /// Only the stored weights.
    pub fn stored(tensor: Tensor<'a>) -> Matrix<'a> {
        let window = 0..tensor.rows();
        Matrix {
            tensor,
            wide: None,
            lanes: None,
            window,
        }
    }

    /// The same matrix read through a copy with sixteen rows side by side where its type has
    /// that layout and `isa` kernels for it (x86's), its mapped pages given back to `file`.
    pub fn with_lanes(mut self, isa: Isa, file: &ModelFile) -> Matrix<'a> {
        if !matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) || self.window != (0..self.tensor.rows()) {
            return self;
        }
        let Some(kind) = LaneKind::of(self.tensor.info.tensor_type.name) else {
            return self;
        };
        if let Some(copy) = row_lanes::interleave(kind, self.tensor.bytes, self.tensor.row_bytes())
        {
            file.release(self.tensor.bytes);
            self.lanes = Some((kind, copy));
        }
        self
    }

    /// Rows `rows` of `tensor` (one expert of a 3-D expert tensor), as stored: the other
    /// experts' rows are never read, so the mapping pages in only the experts used.
    pub fn rows_of(tensor: Tensor<'a>, rows: Range<usize>) -> Option<Matrix<'a>> {
        (rows.start <= rows.end && rows.end <= tensor.rows()).then_some(Matrix {
            tensor,
            wide: None,
            lanes: None,
            window: rows,
        })
    }

    /// Bytes of its stored rows.
    pub fn stored_bytes(&self) -> usize {
        self.window.len() * self.tensor.row_bytes()
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.window.len()
    }

    /// Elements per row.
    pub fn row_len(&self) -> usize {
        self.tensor.row_len()
    }

    /// The kernel for `columns` columns on `isa`, the bytes it reads and their bytes per row,
    /// and the rows a thread's share must be a multiple of.
    pub(super) fn rows_for(
        &self,
        columns: usize,
        isa: Isa,
    ) -> Result<(RowDot, &[u8], usize, usize), String> {
        #[cfg(target_arch = "x86_64")]
        if let Some((kind, copy)) = &self.lanes
            && let Isa::Avx2 | Isa::Avx512Vnni = isa
            && let Some(dot) = super::x86::lanes_dot(*kind, isa == Isa::Avx512Vnni)
        {
            let rb = self.tensor.row_bytes();
            return Ok((dot, copy, rb, row_lanes::ROWS));
        }
        let (ty, bytes, rb) = if columns == 1 {
            self.stored_rows()
        } else {
            self.batch_rows()
        };
        Ok((row_dot(&ty, isa).map_err(|e| e.to_string())?, bytes, rb, 1))
    }

    /// The rows a single token reads: their type, bytes and bytes per row.
    fn stored_rows(&self) -> (TensorType, &[u8], usize) {
        let rb = self.tensor.row_bytes();
        let bytes = &self.tensor.bytes[self.window.start * rb..self.window.end * rb];
        (self.tensor.info.tensor_type, bytes, rb)
    }

    /// The stored weights, and a Q8_0 copy for batches if `tensor` is Q5_0 and the copy fits in
    /// what is left of `budget` (which it then takes from).
    pub fn widened(tensor: Tensor<'a>, budget: &mut usize) -> Matrix<'a> {
        let size = tensor.bytes.len() / Q5_0_BYTES * Q8_0_BYTES;
        if tensor.info.tensor_type.name != "Q5_0" || size > *budget {
            return Matrix::stored(tensor);
        }
        *budget -= size;
        let window = 0..tensor.rows();
        let mut wide = vec![0u8; size].into_boxed_slice();
        for (from, to) in tensor
            .bytes
            .chunks_exact(Q5_0_BYTES)
            .zip(wide.chunks_exact_mut(Q8_0_BYTES))
        {
            q5_0_to_q8_0(from, to);
        }
        Matrix {
            tensor,
            wide: Some(wide),
            lanes: None,
            window,
        }
    }

    /// The rows a batch reads: their type, bytes and bytes per row.
    fn batch_rows(&self) -> (TensorType, &[u8], usize) {
        match (&self.wide, TensorType::from_id(Q8_0_ID)) {
            (Some(wide), Some(q8_0)) => {
                let rb = wide.len() / self.tensor.rows().max(1);
                let bytes = &wide[self.window.start * rb..self.window.end * rb];
                (q8_0, bytes, rb)
            }
            _ => self.stored_rows(),
        }
    }

    /// Bytes held beside the mapped file: the widened copy and the lanes copy.
    pub fn copied_bytes(&self) -> usize {
        self.wide.as_ref().map_or(0, |w| w.len()) + self.lanes.as_ref().map_or(0, |l| l.1.len())
    }

    /// Stored bytes never read because the lanes copy stands in for them.
    pub fn replaced_bytes(&self) -> usize {
        self.lanes.as_ref().map_or(0, |_| self.stored_bytes())
    }
}

/// One Q5_0 block (f16 scale, 32 fifth bits, 16 bytes of nibbles) as a Q8_0 block (the same
/// scale, 32 signed values).
fn q5_0_to_q8_0(from: &[u8], to: &mut [u8]) {
    to[..2].copy_from_slice(&from[..2]);
    let qh = u32::from_le_bytes([from[2], from[3], from[4], from[5]]);
    let value = |nibble: u8, bit: usize| ((nibble | (((qh >> bit) & 1) << 4) as u8) as i8) - 16;
    for (j, &q) in from[6..22].iter().enumerate() {
        to[2 + j] = value(q & 0x0f, j) as u8;
        to[18 + j] = value(q >> 4, j + 16) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant;

    #[test]
    fn a_widened_block_holds_the_same_values() {
        let mut block = [0u8; Q5_0_BYTES];
        for (i, b) in block.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(73).wrapping_add(11);
        }
        block[..2].copy_from_slice(&quant::f32_to_f16(0.0123).to_le_bytes());
        let mut wide = [0u8; Q8_0_BYTES];
        q5_0_to_q8_0(&block, &mut wide);
        let q5_0 = TensorType::from_id(6).expect("Q5_0");
        let q8_0 = TensorType::from_id(Q8_0_ID).expect("Q8_0");
        let (mut a, mut b) = ([0f32; 32], [0f32; 32]);
        quant::dequantize(&q5_0, &block, &mut a).expect("Q5_0");
        quant::dequantize(&q8_0, &wide, &mut b).expect("Q8_0");
        assert_eq!(a, b);
    }
}
