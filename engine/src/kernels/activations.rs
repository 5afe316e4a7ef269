//! Activations quantized for the integer dot products, in ggml's block layouts and with its x86
//! rounding, so a matrix-vector product sees the same inputs llama.cpp's does.
//!
//! Q8_0: 32 values, one scale (stored as f16). Q8_1: as Q8_0 plus `s = d·Σq` (f16), which the
//! weight's offset multiplies. Q8_K: 256 values, an f32 scale and the sums of each 16 values.

use crate::quant::{f16_to_f32, f32_to_f16};

/// 32 activations: `x ≈ d·q`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BlockQ8_0 {
    /// Scale, already rounded to f16 precision.
    pub d: f32,
    /// Quants.
    pub qs: [i8; 32],
}

/// 32 activations with their scaled sum.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BlockQ8_1 {
    /// Scale, already rounded to f16 precision.
    pub d: f32,
    /// `d·Σqs` (with the unrounded `d`), rounded to f16 precision.
    pub s: f32,
    /// Quants.
    pub qs: [i8; 32],
}

/// 256 activations for the K-quant dots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockQ8K {
    /// Scale.
    pub d: f32,
    /// Quants.
    pub qs: [i8; 256],
    /// Sum of each run of 16 quants.
    pub bsums: [i16; 16],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K {
            d: 0.0,
            qs: [0; 256],
            bsums: [0; 16],
        }
    }
}

/// Round to nearest, ties to even, for |v| ≤ 2²²: adding 1.5·2²³ leaves no fraction bits, so
/// the addition itself rounds (in the default mode, ties to even) — ggml's `nearest_int` trick,
/// and a few instructions where `round_ties_even` is a library call without SSE4.1.
fn round_small(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// `x` rounded to the nearest f16 (ties to even), back in f32.
pub(super) fn round_f16(x: f32) -> f32 {
    f16_to_f32(f32_to_f16(x))
}

/// Max-abs scaling to ±127 with ties to even, as ggml's AVX2 `quantize_row_q8_0/1` do.
pub(super) fn q8_block(x: &[f32]) -> (f32, [i8; 32], i32) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    let mut sum = 0;
    for (q, v) in qs.iter_mut().zip(x) {
        let r = round_small(v * id).clamp(-128.0, 127.0) as i32;
        *q = r as i8;
        sum += r;
    }
    (d, qs, sum)
}

/// The Q8_0 block of max-abs scale `d` and quants `qs` (the scale stored at f16 precision).
pub(super) fn q8_0_block((d, qs, _): (f32, [i8; 32], i32)) -> BlockQ8_0 {
    BlockQ8_0 {
        d: round_f16(d),
        qs,
    }
}

/// The Q8_1 block of max-abs scale `d`, quants `qs` and their sum.
pub(super) fn q8_1_block((d, qs, sum): (f32, [i8; 32], i32)) -> BlockQ8_1 {
    BlockQ8_1 {
        d: round_f16(d),
        s: round_f16(d * sum as f32),
        qs,
    }
}

/// Quantizes `x` (a multiple of 32 long), appending to `out`.
pub fn quantize_q8_0(x: &[f32], out: &mut Vec<BlockQ8_0>) {
    out.extend(x.chunks_exact(32).map(|c| q8_0_block(q8_block(c))));
}

/// Quantizes `x` (a multiple of 32 long), appending to `out`.
pub fn quantize_q8_1(x: &[f32], out: &mut Vec<BlockQ8_1>) {
    out.extend(x.chunks_exact(32).map(|c| q8_1_block(q8_block(c))));
}

/// Quantizes `x` (a multiple of 256 long), appending to `out`: the value of largest magnitude maps to
/// −127, as ggml's `quantize_row_q8_K_ref` does.
pub fn quantize_q8_k(x: &[f32], out: &mut Vec<BlockQ8K>) {
    out.extend(x.chunks_exact(256).map(q8_k_block));
}

/// One Q8_K block of 256 values.
pub(super) fn q8_k_block(c: &[f32]) -> BlockQ8K {
    let mut block = BlockQ8K::default();
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in c {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        return block;
    }
    let iscale = -127.0 / max;
    for (q, v) in block.qs.iter_mut().zip(c) {
        *q = round_small(iscale * v).clamp(-128.0, 127.0) as i8;
    }
    for (sum, run) in block.bsums.iter_mut().zip(block.qs.chunks_exact(16)) {
        *sum = run.iter().map(|&q| i16::from(q)).sum();
    }
    block.d = 1.0 / iscale;
    block
}

#[cfg(test)]
mod tests {
    #[test]
    fn small_rounding_is_ties_to_even() {
        for i in -300_000..300_000 {
            let v = i as f32 / 1024.0;
            assert_eq!(super::round_small(v), v.round_ties_even(), "{v}");
        }
        assert_eq!(super::round_small(2.5), 2.0);
        assert_eq!(super::round_small(-3.5), -4.0);
    }

    use super::*;

    fn ramp(n: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect()
    }

    #[test]
    fn q8_blocks_reconstruct_within_half_a_step() {
        let x = ramp(64);
        let mut q0 = Vec::new();
        quantize_q8_0(&x, &mut q0);
        let mut q1 = Vec::new();
        quantize_q8_1(&x, &mut q1);
        for (b, (c, b1)) in q0.iter().zip(x.chunks_exact(32).zip(&q1)) {
            assert_eq!(b.qs, b1.qs);
            let amax = c.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert!((b.d - amax / 127.0).abs() <= amax / 127.0 / 1024.0);
            for (q, v) in b.qs.iter().zip(c) {
                assert!((f32::from(*q) * amax / 127.0 - v).abs() <= amax / 127.0 / 2.0 + 1e-6);
            }
            let sum: i32 = b.qs.iter().map(|&q| i32::from(q)).sum();
            assert!((b1.s - amax / 127.0 * sum as f32).abs() <= b1.s.abs() / 1000.0 + 1e-6);
        }
    }

    #[test]
    fn q8_k_maps_the_largest_magnitude_to_minus_127() {
        let mut x = ramp(256);
        x[100] = -20.0;
        let mut q = Vec::new();
        quantize_q8_k(&x, &mut q);
        assert_eq!(q[0].qs[100], -127);
        assert!((q[0].d - 20.0 / 127.0).abs() < 1e-6);
        for (j, sum) in q[0].bsums.iter().enumerate() {
            let expected: i16 = q[0].qs[16 * j..16 * j + 16]
                .iter()
                .map(|&v| i16::from(v))
                .sum();
            assert_eq!(*sum, expected);
        }
        let mut zeros = Vec::new();
        quantize_q8_k(&[0.0; 256], &mut zeros);
        assert_eq!(zeros[0], BlockQ8K::default());
    }

    #[test]
    fn ties_round_to_even() {
        // 127 / 127 · 0.5 → 0.5 → 0; 1.5 → 2; 2.5 → 2.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 0.5;
        x[2] = 1.5;
        x[3] = 2.5;
        let mut q = Vec::new();
        quantize_q8_0(&x, &mut q);
        assert_eq!(&q[0].qs[..4], &[127, 0, 2, 2]);
    }
}
