//! aarch64 kernels (the Pi 5's Cortex-A76): NEON with the dot-product extension, chosen at run
//! time. `sdot` goes through `asm!` because its intrinsic is not stable. Each 32-bit lane of an
//! `sdot` sums four consecutive byte products, exactly as the scalar reference's lanes do, the
//! eight f32 lanes live in two registers and accumulate with fused multiply-adds, and they fold
//! in the reference's order, so every result is bit-identical to `scalar`.
//!
//! Covered: Q4_0, Q4_1, Q5_0 and Q8_0 rows (SmolLM2's and most of Gemma 3's weights). Other
//! types, the f16 attention helpers and SiLU run the scalar reference here.
// Intrinsics are safe inside `#[target_feature]` functions on newer compilers; the explicit
// `unsafe` blocks keep the code building with our minimum supported Rust.
#![allow(unused_unsafe)]

use std::arch::aarch64::*;
use std::arch::asm;

use super::RowDot;
use super::activations::{BlockQ8_0, BlockQ8_1};
use crate::quant::{TensorType, f16_at};

/// Whether this CPU has NEON and the dot-product instructions.
pub fn supported() -> bool {
    std::arch::is_aarch64_feature_detected!("neon")
        && std::arch::is_aarch64_feature_detected!("dotprod")
}

/// The NEON kernel for `ty`, where there is one.
pub fn row_dot(ty: &TensorType) -> Option<RowDot> {
    if !supported() {
        return None;
    }
    Some(match ty.name {
        "Q4_0" => RowDot::Q8_0(q4_0),
        "Q4_1" => RowDot::Q8_1(q4_1),
        "Q5_0" => RowDot::Q8_0(q5_0),
        "Q8_0" => RowDot::Q8_0(q8_0),
        _ => return None,
    })
}

/// `acc + Σ a·b` per 32-bit lane over four consecutive bytes.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` reads and writes only these registers; the caller guarantees dotprod.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack),
        );
    }
    acc
}

/// Eight lanes (`lo` = 0–3, `hi` = 4–7) folded as `scalar::hsum8` folds them.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn hsum8(lo: float32x4_t, hi: float32x4_t) -> f32 {
    // SAFETY: plain register arithmetic; the caller guarantees NEON.
    unsafe {
        let r = vaddq_f32(lo, hi);
        (vgetq_lane_f32::<0>(r) + vgetq_lane_f32::<2>(r))
            + (vgetq_lane_f32::<1>(r) + vgetq_lane_f32::<3>(r))
    }
}

/// The 32 nibble values of a Q4-style block: low nibbles (elements 0–15), then high.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn nibbles(qs: &[u8]) -> (uint8x16_t, uint8x16_t) {
    assert!(qs.len() >= 16);
    // SAFETY: the assertion keeps the 16-byte load in bounds.
    unsafe {
        let packed = vld1q_u8(qs.as_ptr());
        (vandq_u8(packed, vdupq_n_u8(0x0f)), vshrq_n_u8::<4>(packed))
    }
}

/// 0x10 in byte j where bit j of `qh` is set (the fifth bit of Q5 values), for j in 0–15 (lo)
/// and 16–31 (hi).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn fifth_bits(qh: u32) -> (uint8x16_t, uint8x16_t) {
    const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: the constant holds 16 bytes; the rest is register arithmetic.
    unsafe {
        let bits = vld1q_u8(BITS.as_ptr());
        let spread = |a: u8, b: u8| vcombine_u8(vdup_n_u8(a), vdup_n_u8(b));
        let [b0, b1, b2, b3] = qh.to_le_bytes();
        let fifth = vdupq_n_u8(0x10);
        (
            vandq_u8(vtstq_u8(spread(b0, b1), bits), fifth),
            vandq_u8(vtstq_u8(spread(b2, b3), bits), fifth),
        )
    }
}

/// A legacy-quant kernel: `$values` gives a block's 32 signed values as two `int8x16_t`;
/// `$offset` adds Q4_1's `m·s` term. Every (row, column) is one accumulation in the
/// reference's order.
macro_rules! legacy {
    ($name:ident, $inner:ident, $act:ty, $bytes:expr, |$b:ident| $values:expr, $offset:expr) => {
        fn $name(w: &[u8], row_bytes: usize, x: &[$act], columns: usize, out: &mut [f32]) {
            // SAFETY: only reachable through `row_dot`, which checks `supported()` first.
            unsafe { $inner(w, row_bytes, x, columns, out) }
        }

        #[target_feature(enable = "neon,dotprod")]
        unsafe fn $inner(w: &[u8], row_bytes: usize, x: &[$act], columns: usize, out: &mut [f32]) {
            let n_rows = w.len() / row_bytes.max(1);
            let blocks = x.len() / columns.max(1);
            for (c, outs) in out
                .chunks_exact_mut(n_rows.max(1))
                .take(columns)
                .enumerate()
            {
                let column = &x[c * blocks..(c + 1) * blocks];
                for (o, row) in outs.iter_mut().zip(w.chunks_exact(row_bytes)) {
                    // SAFETY: the caller guarantees the CPU features; loads are bounds-checked.
                    unsafe {
                        let (mut lo, mut hi) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
                        let mut summs = 0f32;
                        for ($b, y) in row.chunks_exact($bytes).zip(column) {
                            let (vlo, vhi): (int8x16_t, int8x16_t) = $values;
                            let zero = vdupq_n_s32(0);
                            let ylo = vld1q_s8(y.qs.as_ptr());
                            let yhi = vld1q_s8(y.qs.as_ptr().add(16));
                            let d = vdupq_n_f32(f16_at($b, 0) * y.d);
                            lo = vfmaq_f32(lo, d, vcvtq_f32_s32(sdot(zero, vlo, ylo)));
                            hi = vfmaq_f32(hi, d, vcvtq_f32_s32(sdot(zero, vhi, yhi)));
                            let offset: Option<fn(&[u8], &$act) -> f32> = $offset;
                            if let Some(term) = offset {
                                summs = f16_at($b, 2).mul_add(term($b, y), summs);
                            }
                        }
                        *o = hsum8(lo, hi) + summs;
                    }
                }
            }
        }
    };
}

legacy!(
    q4_0,
    q4_0_neon,
    BlockQ8_0,
    18,
    |b| {
        let (l, h) = nibbles(&b[2..]);
        let eight = vdupq_n_s8(8);
        (
            vsubq_s8(vreinterpretq_s8_u8(l), eight),
            vsubq_s8(vreinterpretq_s8_u8(h), eight),
        )
    },
    None
);

legacy!(
    q4_1,
    q4_1_neon,
    BlockQ8_1,
    20,
    |b| {
        let (l, h) = nibbles(&b[4..]);
        (vreinterpretq_s8_u8(l), vreinterpretq_s8_u8(h))
    },
    Some(|_, y: &BlockQ8_1| y.s)
);

legacy!(
    q5_0,
    q5_0_neon,
    BlockQ8_0,
    22,
    |b| {
        let (l, h) = nibbles(&b[6..]);
        let (fl, fh) = fifth_bits(u32::from_le_bytes([b[2], b[3], b[4], b[5]]));
        let sixteen = vdupq_n_s8(16);
        (
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(l, fl)), sixteen),
            vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(h, fh)), sixteen),
        )
    },
    None
);

legacy!(
    q8_0,
    q8_0_neon,
    BlockQ8_0,
    34,
    |b| {
        assert!(b.len() >= 34);
        (
            vld1q_s8(b.as_ptr().add(2).cast()),
            vld1q_s8(b.as_ptr().add(18).cast()),
        )
    },
    None
);
