//! aarch64 kernels (the Pi 5's Cortex-A76): NEON with the dot-product extension, chosen at run
//! time. `sdot` goes through `asm!` because its intrinsic is not stable. Each 32-bit lane of an
//! `sdot` sums four consecutive byte products, exactly as the scalar reference's lanes do, the
//! eight f32 lanes live in two registers and accumulate with fused multiply-adds, and they fold
//! in the reference's order, so every result is bit-identical to `scalar`.
//!
//! Covered: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K and Q6_K rows (all of SmolLM2's and Gemma 3's
//! weights; K-quant batches with rows in lanes, `arm/k_lanes.rs`), the f16 helpers of attention and the KV cache (conversions through `fcvtl` /
//! `fcvtn`, also through `asm!`), activation quantization, SiLU and GELU. Other types run the
//! scalar reference here.
// Intrinsics are safe inside `#[target_feature]` functions on newer compilers; the explicit
// `unsafe` blocks keep the code building with our minimum supported Rust.
#![allow(unused_unsafe)]

use std::arch::aarch64::*;
use std::arch::asm;

pub(super) mod delta;
mod k_lanes;

use super::RowDot;
use super::activations::{self, BlockQ8_0, BlockQ8_1, BlockQ8K};
use super::scalar;
use crate::quant::TensorType;

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
        "Q4_K" => RowDot::Q8K(q4_k),
        "Q6_K" => RowDot::Q8K(q6_k),
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
/// `$offset` adds Q4_1's `m·s` term. A row's block is unpacked once for up to eight columns
/// (a batch's tokens); every (row, column) is one accumulation in the reference's order.
macro_rules! legacy {
    ($name:ident, $inner:ident, $act:ty, $bytes:expr, |$b:ident| $values:expr, $offset:expr) => {
        fn $name(w: &[u8], row_bytes: usize, x: &[$act], columns: usize, out: &mut [f32]) {
            // SAFETY: only reachable through `row_dot`, which checks `supported()` first.
            unsafe { $inner(w, row_bytes, x, columns, out) }
        }

        #[target_feature(enable = "neon,dotprod")]
        unsafe fn $inner(w: &[u8], row_bytes: usize, x: &[$act], columns: usize, out: &mut [f32]) {
            /// Columns `c..c + N` of one row.
            #[inline]
            #[target_feature(enable = "neon,dotprod")]
            unsafe fn tile<const N: usize>(
                row: &[u8],
                x: &[$act],
                blocks: usize,
                c: usize,
            ) -> [f32; N] {
                // SAFETY: the caller guarantees the CPU features; loads are bounds-checked.
                unsafe {
                    let mut lo = [vdupq_n_f32(0.0); N];
                    let mut hi = [vdupq_n_f32(0.0); N];
                    let mut summs = [0f32; N];
                    for (i, $b) in row.chunks_exact($bytes).enumerate() {
                        let (vlo, vhi): (int8x16_t, int8x16_t) = $values;
                        let dm = f16_pair($b);
                        let dw = vgetq_lane_f32::<0>(dm);
                        for j in 0..N {
                            let y = &x[(c + j) * blocks + i];
                            let zero = vdupq_n_s32(0);
                            let ylo = vld1q_s8(y.qs.as_ptr());
                            let yhi = vld1q_s8(y.qs.as_ptr().add(16));
                            let d = vdupq_n_f32(dw * y.d);
                            lo[j] = vfmaq_f32(lo[j], d, vcvtq_f32_s32(sdot(zero, vlo, ylo)));
                            hi[j] = vfmaq_f32(hi[j], d, vcvtq_f32_s32(sdot(zero, vhi, yhi)));
                            let offset: Option<fn(&[u8], &$act) -> f32> = $offset;
                            if let Some(term) = offset {
                                let m = vgetq_lane_f32::<1>(dm);
                                summs[j] = m.mul_add(term($b, y), summs[j]);
                            }
                        }
                    }
                    std::array::from_fn(|j| hsum8(lo[j], hi[j]) + summs[j])
                }
            }

            let n_rows = w.len() / row_bytes.max(1);
            let blocks = x.len() / columns.max(1);
            if n_rows == 0 || x.len() < columns * blocks || out.len() < columns * n_rows {
                return;
            }
            let mut c = 0;
            // SAFETY: the caller guarantees the CPU features.
            unsafe {
                while c + 8 <= columns {
                    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                        let sums = tile::<8>(row, x, blocks, c);
                        for (j, sum) in sums.into_iter().enumerate() {
                            out[(c + j) * n_rows + r] = sum;
                        }
                    }
                    c += 8;
                }
                while c + 4 <= columns {
                    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                        let sums = tile::<4>(row, x, blocks, c);
                        for (j, sum) in sums.into_iter().enumerate() {
                            out[(c + j) * n_rows + r] = sum;
                        }
                    }
                    c += 4;
                }
                while c < columns {
                    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                        out[c * n_rows + r] = tile::<1>(row, x, blocks, c)[0];
                    }
                    c += 1;
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

/// Every (column, row) of a K-quant kernel: `$block` adds one weight block against its
/// activation block to the row's two sums (`scalar::k_step`) exactly as the scalar reference
/// does; the result is the first sum minus the second.
macro_rules! k_quant {
    (
        $name:ident, $inner:ident, $lanes:path, $bytes:expr,
        block: |$b:ident, $y:ident, $acc:ident| $block:expr $(,)?
    ) => {
        fn $name(w: &[u8], row_bytes: usize, x: &[BlockQ8K], columns: usize, out: &mut [f32]) {
            // SAFETY: only reachable through `row_dot`, which checks `supported()` first.
            unsafe {
                if columns >= k_lanes::LANES_FROM {
                    $lanes(w, row_bytes, x, columns, out)
                } else {
                    $inner(w, row_bytes, x, columns, out)
                }
            }
        }

        #[target_feature(enable = "neon,dotprod")]
        unsafe fn $inner(
            w: &[u8],
            row_bytes: usize,
            x: &[BlockQ8K],
            columns: usize,
            out: &mut [f32],
        ) {
            let n_rows = w.len() / row_bytes.max(1);
            let blocks = x.len() / columns.max(1);
            for (c, outs) in out
                .chunks_exact_mut(n_rows.max(1))
                .take(columns)
                .enumerate()
            {
                let column = &x[c * blocks..(c + 1) * blocks];
                for (o, row) in outs.iter_mut().zip(w.chunks_exact(row_bytes)) {
                    let mut $acc = [0f32; 2];
                    for ($b, $y) in row.chunks_exact($bytes).zip(column) {
                        // SAFETY: the caller guarantees the CPU features; loads are
                        // bounds-checked.
                        unsafe { $block };
                    }
                    *o = $acc[0] - $acc[1];
                }
            }
        }
    };
}

/// 16 bytes of `bytes` from `at`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load16(bytes: &[u8], at: usize) -> uint8x16_t {
    assert!(bytes.len() >= at + 16);
    // SAFETY: the assertion keeps the load in bounds.
    unsafe { vld1q_u8(bytes.as_ptr().add(at)) }
}

/// 16 activations from `at`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_y(qs: &[i8; 256], at: usize) -> int8x16_t {
    assert!(at + 16 <= qs.len());
    // SAFETY: the assertion keeps the load in bounds.
    unsafe { vld1q_s8(qs.as_ptr().add(at)) }
}

k_quant!(q4_k, q4_k_neon, k_lanes::q4_k_rows, 144,
    block: |b, y, acc| {
        let (sc, mins) = scalar::q4_k_scales(b);
        let summ: i32 = (0..8)
            .map(|j| mins[j] * (i32::from(y.bsums[2 * j]) + i32::from(y.bsums[2 * j + 1])))
            .sum();
        let zero = vdupq_n_s32(0);
        let (mut lanes_lo, mut lanes_hi) = (zero, zero);
        let mask = vdupq_n_u8(0x0f);
        for j in 0..4 {
            let (qa, qb) = (load16(b, 16 + 32 * j), load16(b, 32 + 32 * j));
            let lo_a = vreinterpretq_s8_u8(vandq_u8(qa, mask));
            let lo_b = vreinterpretq_s8_u8(vandq_u8(qb, mask));
            let hi_a = vreinterpretq_s8_u8(vshrq_n_u8::<4>(qa));
            let hi_b = vreinterpretq_s8_u8(vshrq_n_u8::<4>(qb));
            let (s_lo, s_hi) = (i32::from(sc[2 * j]), i32::from(sc[2 * j + 1]));
            let at = 64 * j;
            lanes_lo = vmlaq_n_s32(lanes_lo, sdot(zero, lo_a, load_y(&y.qs, at)), s_lo);
            lanes_hi = vmlaq_n_s32(lanes_hi, sdot(zero, lo_b, load_y(&y.qs, at + 16)), s_lo);
            lanes_lo = vmlaq_n_s32(lanes_lo, sdot(zero, hi_a, load_y(&y.qs, at + 32)), s_hi);
            lanes_hi = vmlaq_n_s32(lanes_hi, sdot(zero, hi_b, load_y(&y.qs, at + 48)), s_hi);
        }
        let sumi = vaddvq_s32(vaddq_s32(lanes_lo, lanes_hi));
        let dm = f16_pair(b);
        scalar::k_step(
            &mut acc,
            sumi,
            y.d * vgetq_lane_f32::<0>(dm),
            summ,
            y.d * vgetq_lane_f32::<1>(dm),
        );
    },
);

k_quant!(q6_k, q6_k_neon, k_lanes::q6_k_rows, 210,
    block: |b, y, acc| {
        let sc: [i32; 16] = std::array::from_fn(|g| i32::from(b[192 + g] as i8));
        let zero = vdupq_n_s32(0);
        let (mut lanes_lo, mut lanes_hi) = (zero, zero);
        let (low4, two) = (vdupq_n_u8(0x0f), vdupq_n_u8(0x03));
        // The 6-bit value: four bits from ql, two from qh shifted into bits 4–5.
        let value = |ql: uint8x16_t, qh: uint8x16_t| {
            vreinterpretq_s8_u8(vorrq_u8(ql, vshlq_n_u8::<4>(vandq_u8(qh, two))))
        };
        for half in 0..2 {
            let (ql, qh) = (64 * half, 128 + 32 * half);
            let ql_ = [load16(b, ql), load16(b, ql + 16), load16(b, ql + 32), load16(b, ql + 48)];
            let qh_ = [load16(b, qh), load16(b, qh + 16)];
            for sub in 0..4 {
                // Chunk 4·half + sub: ql's low or high nibbles (of the first or second 32
                // bytes) with qh's bit pair 2·sub.
                let nibble = |v: uint8x16_t| {
                    if sub < 2 { vandq_u8(v, low4) } else { vshrq_n_u8::<4>(v) }
                };
                let base = if sub % 2 == 0 { 0 } else { 2 };
                let shifted = |v: uint8x16_t| match sub {
                    0 => v,
                    1 => vshrq_n_u8::<2>(v),
                    2 => vshrq_n_u8::<4>(v),
                    _ => vshrq_n_u8::<6>(v),
                };
                let v0 = value(nibble(ql_[base]), shifted(qh_[0]));
                let v1 = value(nibble(ql_[base + 1]), shifted(qh_[1]));
                let chunk = 4 * half + sub;
                let at = 32 * chunk;
                let (y0, y1) = (load_y(&y.qs, at), load_y(&y.qs, at + 16));
                lanes_lo = vmlaq_n_s32(lanes_lo, sdot(zero, v0, y0), sc[2 * chunk]);
                lanes_hi = vmlaq_n_s32(lanes_hi, sdot(zero, v1, y1), sc[2 * chunk + 1]);
            }
        }
        // The −32 offset of every value, through the activation block sums.
        let offset: [i32; 8] = std::array::from_fn(|k| {
            let bsum = |g: usize| i32::from(y.bsums[g]) * sc[g];
            32 * (bsum(2 * k) + bsum(2 * k + 1))
        });
        let lanes_lo = vsubq_s32(lanes_lo, vld1q_s32(offset.as_ptr()));
        let lanes_hi = vsubq_s32(lanes_hi, vld1q_s32(offset.as_ptr().add(4)));
        let sumi = vaddvq_s32(vaddq_s32(lanes_lo, lanes_hi));
        acc[0] = (sumi as f32).mul_add(y.d * f16_single(b, 208), acc[0]);
    },
);

/// Four f16 (as bits) widened to f32, exactly (`fcvtl`; the f16 vector types are not stable
/// in Rust, the instruction is base NEON).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn widen(h: uint16x4_t) -> float32x4_t {
    let out: float32x4_t;
    // SAFETY: register-only conversion; the caller guarantees NEON.
    unsafe {
        asm!(
            "fcvtl {out:v}.4s, {h:v}.4h",
            out = lateout(vreg) out,
            h = in(vreg) h,
            options(pure, nomem, nostack),
        );
    }
    out
}

/// Four f32 narrowed to f16 bits, rounding to nearest even (`fcvtn` under the default FPCR).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn narrow(x: float32x4_t) -> uint16x4_t {
    let out: uint16x4_t;
    // SAFETY: register-only conversion; the caller guarantees NEON.
    unsafe {
        asm!(
            "fcvtn {out:v}.4h, {x:v}.4s",
            out = lateout(vreg) out,
            x = in(vreg) x,
            options(pure, nomem, nostack),
        );
    }
    out
}

/// The two f16 at the start of a block (its scale, and Q4_1's min after it)
/// in lanes 0 and 1: one load and one exact `fcvtl`, where a software conversion branches.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn f16_pair(block: &[u8]) -> float32x4_t {
    let bits = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
    // SAFETY: register-only arithmetic; the caller guarantees NEON.
    unsafe { widen(vreinterpret_u16_u32(vdup_n_u32(bits))) }
}

/// The f16 at byte `at` of `block`, converted by `fcvtl`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn f16_single(block: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([block[at], block[at + 1]]);
    // SAFETY: register-only arithmetic; the caller guarantees NEON.
    unsafe { vgetq_lane_f32::<0>(widen(vdup_n_u16(bits))) }
}

/// Eight f16 from `at` as two f32 vectors.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn load_f16x8(h: &[u16], at: usize) -> (float32x4_t, float32x4_t) {
    assert!(at + 8 <= h.len());
    // SAFETY: the assertion keeps the load in bounds.
    unsafe {
        let v = vld1q_u16(h.as_ptr().add(at));
        (widen(vget_low_u16(v)), widen(vget_high_u16(v)))
    }
}

/// Stores eight f32 as f16 at `at`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn store_f16x8(h: &mut [u16], at: usize, lo: float32x4_t, hi: float32x4_t) {
    assert!(at + 8 <= h.len());
    // SAFETY: the assertion keeps the store in bounds.
    unsafe { vst1q_u16(h.as_mut_ptr().add(at), vcombine_u16(narrow(lo), narrow(hi))) }
}

/// f16 · f16 as `scalar::dot_f16` computes it: four 8-lane accumulators over 32-element steps,
/// folded in its order, the tail in f64 by the same code.
pub fn dot_f16(a: &[u16], b: &[u16]) -> f32 {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    unsafe { dot_f16_neon(a, b) }
}

#[target_feature(enable = "neon")]
unsafe fn dot_f16_neon(a: &[u16], b: &[u16]) -> f32 {
    let whole = a.len().min(b.len()) / 32 * 32;
    // SAFETY: loads are bounds-checked; the caller guarantees NEON.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 8];
        for step in (0..whole).step_by(32) {
            for j in 0..4 {
                let (alo, ahi) = load_f16x8(a, step + 8 * j);
                let (blo, bhi) = load_f16x8(b, step + 8 * j);
                acc[2 * j] = vfmaq_f32(acc[2 * j], alo, blo);
                acc[2 * j + 1] = vfmaq_f32(acc[2 * j + 1], ahi, bhi);
            }
        }
        scalar::with_f16_tail(fold_f16_sums(acc), &a[whole..], &b[whole..])
    }
}

/// Attention over cached f16 rows as `super::attend_f16` defines it (`super::fused_attention`
/// with NEON's steps), false (nothing done) when the heads do not fit the fused loop.
pub fn attend_f16(
    queries: super::Queries<'_>,
    rows: super::KvRows<'_>,
    acc: &mut [u16],
    sums: &mut [f32],
) -> bool {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    unsafe { attend_f16_neon(queries, rows, acc, sums) }
}

#[target_feature(enable = "neon")]
unsafe fn attend_f16_neon(
    queries: super::Queries<'_>,
    rows: super::KvRows<'_>,
    acc: &mut [u16],
    sums: &mut [f32],
) -> bool {
    // SAFETY (every closure): NEON, which this function has; loads and stores are of
    // bounds-checked subslices (`load_f16x8` and `store_f16x8` assert).
    let steps = super::FusedSteps {
        widen: |h: &[u16], f: &mut [f32]| unsafe {
            for (at, f) in (0..h.len()).step_by(8).zip(f.chunks_exact_mut(8)) {
                let (lo, hi) = load_f16x8(h, at);
                vst1q_f32(f.as_mut_ptr(), lo);
                vst1q_f32(f[4..].as_mut_ptr(), hi);
            }
        },
        dot: |k32: &[f32], q32: &[f32], k: &[u16], q: &[u16]| unsafe {
            dot_f16_prepared(k32, q32, k, q)
        },
        dots: |k32: &[f32], width: usize, q32: &[f32], out: &mut [f32]| unsafe {
            dots_f16_prepared(k32, width, q32, out)
        },
        exps: |xs: &mut [f32]| unsafe { expf_all_neon(xs) },
        scale: |a: &mut [f32], s: f32| unsafe {
            let s = vdupq_n_f32(s);
            for a in a.chunks_exact_mut(4) {
                let x = vmulq_f32(vld1q_f32(a.as_ptr()), s);
                vst1q_f32(a.as_mut_ptr(), round_f16x4(x));
            }
        },
        mad_rows: |acc: &mut [f32], v: &[f32], stride: usize, weights: &[f32]| unsafe {
            for (lane, eights) in super::register_chunks(acc.len()) {
                let (acc, v) = (&mut acc[lane..lane + 8 * eights], &v[lane..]);
                match eights {
                    8 => mad_rows_neon::<16>(acc, v, stride, weights),
                    4 => mad_rows_neon::<8>(acc, v, stride, weights),
                    2 => mad_rows_neon::<4>(acc, v, stride, weights),
                    _ => mad_rows_neon::<2>(acc, v, stride, weights),
                }
            }
        },
        prefetch: |h: &[u16]| prefetch_bytes(h.as_ptr().cast(), 2 * h.len()),
    };
    super::fused_attention(queries, rows, acc, sums, &steps)
}

/// Four f32 rounded to the nearest f16 (ties to even), back in f32: the reference's f16
/// accumulator, kept in a register.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn round_f16x4(x: float32x4_t) -> float32x4_t {
    // SAFETY: register-only conversions; the caller guarantees NEON.
    unsafe { widen(narrow(x)) }
}

/// `acc ← f16(acc + v_r·w_r)` for each weight in order, as `mad_f16_neon` row after row, over
/// `4·N` accumulators held in registers; row `r` of `v` starts at `r·stride`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn mad_rows_neon<const N: usize>(
    acc: &mut [f32],
    v: &[f32],
    stride: usize,
    weights: &[f32],
) {
    // SAFETY: the caller guarantees NEON; loads and stores are of 4-value subslices of
    // bounds-checked slices.
    unsafe {
        let mut a: [float32x4_t; N] =
            std::array::from_fn(|j| vld1q_f32(acc[4 * j..][..4].as_ptr()));
        for (r, &w) in weights.iter().enumerate() {
            let (w, row) = (vdupq_n_f32(w), &v[r * stride..r * stride + 4 * N]);
            for (j, a) in a.iter_mut().enumerate() {
                let x = vld1q_f32(row[4 * j..4 * j + 4].as_ptr());
                *a = round_f16x4(vfmaq_f32(*a, x, w));
            }
        }
        for (j, a) in a.iter().enumerate() {
            vst1q_f32(acc[4 * j..4 * j + 4].as_mut_ptr(), *a);
        }
    }
}

/// Asks for the cache lines of `len` bytes from `start` (`prfm`, as x86's `prefetch_bytes`).
#[inline]
fn prefetch_bytes(start: *const u8, len: usize) {
    for line in super::cache_lines(len) {
        // SAFETY: a prefetch hint reads nothing and never faults.
        unsafe {
            std::arch::asm!(
                "prfm pldl1keep, [{p}]",
                p = in(reg) start.wrapping_add(line),
                options(nostack, preserves_flags, readonly),
            )
        };
    }
}

/// `k · q` as `dot_f16_neon(k, q)` computes it, the whole 32-value steps of both already in
/// f32 (`k32`, `q32`; exact: every f16 is an f32) and only the tail read from the f16 rows.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot_f16_prepared(k32: &[f32], q32: &[f32], k: &[u16], q: &[u16]) -> f32 {
    let whole = k32.len().min(q32.len()) / 32 * 32;
    // SAFETY: loads are of bounds-checked 4-value subslices; the caller guarantees NEON.
    unsafe {
        let mut acc = [vdupq_n_f32(0.0); 8];
        for (ck, cq) in k32[..whole].chunks_exact(32).zip(q32.chunks_exact(32)) {
            for j in 0..4 {
                let (klo, khi) = (&ck[8 * j..8 * j + 4], &ck[8 * j + 4..8 * j + 8]);
                let (qlo, qhi) = (&cq[8 * j..8 * j + 4], &cq[8 * j + 4..8 * j + 8]);
                acc[2 * j] =
                    vfmaq_f32(acc[2 * j], vld1q_f32(klo.as_ptr()), vld1q_f32(qlo.as_ptr()));
                acc[2 * j + 1] = vfmaq_f32(
                    acc[2 * j + 1],
                    vld1q_f32(khi.as_ptr()),
                    vld1q_f32(qhi.as_ptr()),
                );
            }
        }
        scalar::with_f16_tail(fold_f16_sums(acc), &k[whole..], &q[whole..])
    }
}

/// The eight 4-lane sums of an f16 dot product folded in `scalar::dot_f16`'s order.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn fold_f16_sums(acc: [float32x4_t; 8]) -> f32 {
    // SAFETY: register-only arithmetic; the caller guarantees NEON.
    unsafe {
        let r = fold_to_lanes(acc);
        (vgetq_lane_f32::<0>(r) + vgetq_lane_f32::<1>(r))
            + (vgetq_lane_f32::<2>(r) + vgetq_lane_f32::<3>(r))
    }
}

/// The eight 4-lane sums of an f16 dot product folded to four lanes in `scalar::dot_f16`'s
/// order (what is left is `(r0 + r1) + (r2 + r3)`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn fold_to_lanes(acc: [float32x4_t; 8]) -> float32x4_t {
    // SAFETY: register-only arithmetic; the caller guarantees NEON.
    unsafe {
        let lo = vaddq_f32(vaddq_f32(acc[0], acc[4]), vaddq_f32(acc[2], acc[6]));
        let hi = vaddq_f32(vaddq_f32(acc[1], acc[5]), vaddq_f32(acc[3], acc[7]));
        vaddq_f32(lo, hi)
    }
}

/// `k · q` for consecutive rows of `k32` (`width` apart, whole 32-value steps only) as
/// [`dot_f16_prepared`] computes each: four rows' last steps are pairwise adds together.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dots_f16_prepared(k32: &[f32], width: usize, q32: &[f32], out: &mut [f32]) {
    // SAFETY: the caller guarantees NEON; loads and stores are of 4-value subslices of
    // bounds-checked slices.
    unsafe {
        let row_lanes = |r: usize| {
            let row = &k32[r * width..(r + 1) * width];
            let mut acc = [vdupq_n_f32(0.0); 8];
            for (ck, cq) in row.chunks_exact(32).zip(q32.chunks_exact(32)) {
                for (j, (k, q)) in ck.chunks_exact(4).zip(cq.chunks_exact(4)).enumerate() {
                    acc[j] = vfmaq_f32(acc[j], vld1q_f32(k.as_ptr()), vld1q_f32(q.as_ptr()));
                }
            }
            fold_to_lanes(acc)
        };
        let done = out.len() / 4 * 4;
        let mut fours = out.chunks_exact_mut(4);
        for (g, out) in fours.by_ref().enumerate() {
            let r: [float32x4_t; 4] = std::array::from_fn(|i| row_lanes(4 * g + i));
            let sums = vpaddq_f32(vpaddq_f32(r[0], r[1]), vpaddq_f32(r[2], r[3]));
            // `with_f16_tail` adds +0 to a sum without a tail (−0 becomes +0).
            vst1q_f32(out.as_mut_ptr(), vaddq_f32(sums, vdupq_n_f32(0.0)));
        }
        for (i, out) in fours.into_remainder().iter_mut().enumerate() {
            let r = row_lanes(done + i);
            *out = (vgetq_lane_f32::<0>(r) + vgetq_lane_f32::<1>(r))
                + (vgetq_lane_f32::<2>(r) + vgetq_lane_f32::<3>(r))
                + 0.0;
        }
    }
}

/// `acc ← f16(acc + v·w)` as `scalar::mad_f16` computes it.
pub fn mad_f16(acc: &mut [u16], v: &[u16], w: f32) {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    unsafe { mad_f16_neon(acc, v, w) }
}

#[target_feature(enable = "neon")]
unsafe fn mad_f16_neon(acc: &mut [u16], v: &[u16], w: f32) {
    let n = acc.len().min(v.len());
    let whole = n / 8 * 8;
    // SAFETY: loads and stores are bounds-checked; the caller guarantees NEON.
    unsafe {
        let w = vdupq_n_f32(w);
        for at in (0..whole).step_by(8) {
            let (alo, ahi) = load_f16x8(acc, at);
            let (vlo, vhi) = load_f16x8(v, at);
            store_f16x8(acc, at, vfmaq_f32(alo, vlo, w), vfmaq_f32(ahi, vhi, w));
        }
    }
    scalar::mad_f16(&mut acc[whole..n], &v[whole..n], w);
}

/// `acc ← f16(acc·s)`.
pub fn scale_f16(acc: &mut [u16], s: f32) {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    unsafe { scale_f16_neon(acc, s) }
}

#[inline]
#[target_feature(enable = "neon")]
unsafe fn scale_f16_neon(acc: &mut [u16], s: f32) {
    let whole = acc.len() / 8 * 8;
    // SAFETY: loads and stores are bounds-checked; the caller guarantees NEON.
    unsafe {
        for at in (0..whole).step_by(8) {
            let (lo, hi) = load_f16x8(acc, at);
            store_f16x8(acc, at, vmulq_n_f32(lo, s), vmulq_n_f32(hi, s));
        }
    }
    scalar::scale_f16(&mut acc[whole..], s);
}

/// `dst ← f16(src·scale)`.
pub fn to_f16(src: &[f32], scale: f32, dst: &mut [u16]) {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    unsafe { to_f16_neon(src, scale, dst) }
}

#[target_feature(enable = "neon")]
unsafe fn to_f16_neon(src: &[f32], scale: f32, dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let whole = n / 8 * 8;
    // SAFETY: loads and stores are bounds-checked; the caller guarantees NEON.
    unsafe {
        for at in (0..whole).step_by(8) {
            let lo = vmulq_n_f32(vld1q_f32(src[at..at + 4].as_ptr()), scale);
            let hi = vmulq_n_f32(vld1q_f32(src[at + 4..at + 8].as_ptr()), scale);
            store_f16x8(dst, at, lo, hi);
        }
    }
    scalar::to_f16(&src[whole..n], scale, &mut dst[whole..n]);
}

/// `dst ← src·scale`, `src` in f16.
pub fn from_f16(src: &[u16], scale: f32, dst: &mut [f32]) {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    unsafe { from_f16_neon(src, scale, dst) }
}

#[target_feature(enable = "neon")]
unsafe fn from_f16_neon(src: &[u16], scale: f32, dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let whole = n / 8 * 8;
    // SAFETY: loads and stores are bounds-checked; the caller guarantees NEON.
    unsafe {
        for at in (0..whole).step_by(8) {
            let (lo, hi) = load_f16x8(src, at);
            vst1q_f32(dst[at..at + 4].as_mut_ptr(), vmulq_n_f32(lo, scale));
            vst1q_f32(dst[at + 4..at + 8].as_mut_ptr(), vmulq_n_f32(hi, scale));
        }
    }
    scalar::from_f16(&src[whole..n], scale, &mut dst[whole..n]);
}

/// Activations quantized as `activations::quantize_q8_0` does, 32 values at a time.
pub fn quantize_q8_0(x: &[f32], out: &mut Vec<BlockQ8_0>) {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    out.extend(
        x.chunks_exact(32)
            .map(|c| activations::q8_0_block(unsafe { q8_block_neon(c) })),
    );
}

/// Activations quantized as `activations::quantize_q8_1` does.
pub fn quantize_q8_1(x: &[f32], out: &mut Vec<BlockQ8_1>) {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    out.extend(
        x.chunks_exact(32)
            .map(|c| activations::q8_1_block(unsafe { q8_block_neon(c) })),
    );
}

/// Activations quantized as `activations::quantize_q8_k` does.
pub fn quantize_q8_k(x: &[f32], out: &mut Vec<BlockQ8K>) {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    out.extend(x.chunks_exact(256).map(|c| unsafe { q8_k_block_neon(c) }));
}

/// Sixteen i32 (four vectors) saturated to i8 in order (the scalar clamp).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn narrowed_i8(i: &[int32x4_t]) -> int8x16_t {
    // SAFETY: plain register arithmetic; the caller guarantees NEON.
    unsafe {
        let lo = vcombine_s16(vqmovn_s32(i[0]), vqmovn_s32(i[1]));
        let hi = vcombine_s16(vqmovn_s32(i[2]), vqmovn_s32(i[3]));
        vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi))
    }
}

/// `activations::q8_block` on 32 values: the scale, the quants (`fcvtns`: nearest, ties to
/// even, NaN to 0 as the scalar cast does) and their sum.
#[target_feature(enable = "neon")]
unsafe fn q8_block_neon(x: &[f32]) -> (f32, [i8; 32], i32) {
    assert!(x.len() >= 32);
    // SAFETY: the assertion keeps the eight 4-lane loads in bounds; the caller guarantees NEON.
    unsafe {
        let v: [float32x4_t; 8] = std::array::from_fn(|k| vld1q_f32(x.as_ptr().add(4 * k)));
        // `fmaxnm` ignores a NaN as `f32::max` does.
        let m = v
            .iter()
            .fold(vdupq_n_f32(0.0), |m, &lane| vmaxnmq_f32(m, vabsq_f32(lane)));
        let amax = vmaxnmvq_f32(m);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        if !id.is_finite() {
            // Magnitudes so small that 127/amax overflows: the reference's clamp settles the
            // infinite products, whose saturated sums would wrap here.
            return activations::q8_block(x);
        }
        let id = vdupq_n_f32(id);
        let ints = v.map(|lane| vcvtnq_s32_f32(vmulq_f32(lane, id)));
        let mut qs = [0i8; 32];
        vst1q_s8(qs.as_mut_ptr(), narrowed_i8(&ints[..4]));
        vst1q_s8(qs.as_mut_ptr().add(16), narrowed_i8(&ints[4..]));
        let total = ints.iter().fold(vdupq_n_s32(0), |t, &i| vaddq_s32(t, i));
        (amax / 127.0, qs, vaddvq_s32(total))
    }
}

/// `activations::quantize_q8_k` on one block of 256 values.
#[target_feature(enable = "neon")]
unsafe fn q8_k_block_neon(x: &[f32]) -> BlockQ8K {
    assert!(x.len() >= 256);
    // SAFETY: the assertion keeps every 4-lane load in bounds; the caller guarantees NEON.
    unsafe {
        let load = |k: usize| vld1q_f32(x.as_ptr().add(4 * k));
        let m = (0..64).fold(vdupq_n_f32(0.0), |m, k| vmaxnmq_f32(m, vabsq_f32(load(k))));
        let amax = vmaxnmvq_f32(m);
        let mut block = BlockQ8K::default();
        if amax == 0.0 {
            return block;
        }
        // The scalar scan keeps the first value of largest magnitude, with its sign.
        let first = x[..256].iter().position(|v| v.abs() == amax);
        let max = x[first.unwrap_or(0)];
        let iscale = -127.0 / max;
        if !iscale.is_finite() {
            return activations::q8_k_block(x);
        }
        let scale = vdupq_n_f32(iscale);
        for (group, (qs, sum)) in block
            .qs
            .chunks_exact_mut(16)
            .zip(block.bsums.iter_mut())
            .enumerate()
        {
            let ints: [int32x4_t; 4] =
                std::array::from_fn(|k| vcvtnq_s32_f32(vmulq_f32(load(4 * group + k), scale)));
            vst1q_s8(qs.as_mut_ptr(), narrowed_i8(&ints));
            let total = vaddq_s32(vaddq_s32(ints[0], ints[1]), vaddq_s32(ints[2], ints[3]));
            *sum = vaddvq_s32(total) as i16;
        }
        block.d = 1.0 / iscale;
        block
    }
}

/// `gate ← silu(gate)·up` as `scalar::silu_mul` computes it, four lanes at a time.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    unsafe { silu_mul_neon(gate, up) }
}

#[target_feature(enable = "neon")]
unsafe fn silu_mul_neon(gate: &mut [f32], up: &[f32]) {
    let n = gate.len().min(up.len());
    let (gate, up) = (&mut gate[..n], &up[..n]);
    let mut g4 = gate.chunks_exact_mut(4);
    let mut u4 = up.chunks_exact(4);
    for (g, u) in g4.by_ref().zip(u4.by_ref()) {
        // SAFETY: four lanes each side; the caller guarantees NEON.
        unsafe {
            let x = vld1q_f32(g.as_ptr());
            let Some(e) = expf_neon(vnegq_f32(x)) else {
                // A lane outside the normal exponent range: the scalar routine handles it.
                scalar::silu_mul(g, u);
                continue;
            };
            let silu = vdivq_f32(x, vaddq_f32(vdupq_n_f32(1.0), e));
            vst1q_f32(g.as_mut_ptr(), vmulq_f32(silu, vld1q_f32(u.as_ptr())));
        }
    }
    scalar::silu_mul(g4.into_remainder(), u4.remainder());
}

/// `scalar::expf_poly` on four lanes when every lane is in the normal range (|n| ≤ 126), with
/// the same fused multiply-adds (`vfmaq_f32(a, b, c)` is `b.mul_add(c, a)`).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn expf_neon(x: float32x4_t) -> Option<float32x4_t> {
    // SAFETY: plain register arithmetic; the caller guarantees NEON.
    unsafe {
        let c = |bits: u32| vdupq_n_f32(f32::from_bits(bits));
        let shift = c(0x4b40_0000);
        let z = vfmaq_f32(shift, x, c(0x3fb8_aa3b));
        let n = vsubq_f32(z, shift);
        let b = vfmsq_f32(vfmsq_f32(x, n, c(0x3f31_7200)), n, c(0x35bf_be8e));
        let e = vshlq_n_u32::<23>(vreinterpretq_u32_f32(z));
        let k = vreinterpretq_f32_u32(vaddq_u32(e, vdupq_n_u32(0x3f80_0000)));
        if vmaxvq_u32(vcgtq_f32(vabsq_f32(n), c(0x42fc_0000))) != 0 {
            return None;
        }
        let u = vmulq_f32(b, b);
        let j = vfmaq_f32(
            vmulq_f32(c(0x3f7f_fff6), b),
            vfmaq_f32(
                vfmaq_f32(c(0x3eff_fedb), c(0x3e2a_af33), b),
                vfmaq_f32(c(0x3d2b_9f17), c(0x3c07_2010), b),
                u,
            ),
            u,
        );
        Some(vfmaq_f32(k, j, k))
    }
}

/// `gate ← gelu(gate)·up` as `scalar::gelu_mul` computes it: the f16 rounding and back by
/// `fcvtn`/`fcvtl`, the table lookup itself scalar (NEON has no 16-bit gather).
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    // SAFETY: only called on `Isa::Neon`, detected at run time.
    unsafe { gelu_mul_neon(gate, up) }
}

#[target_feature(enable = "neon")]
unsafe fn gelu_mul_neon(gate: &mut [f32], up: &[f32]) {
    let table = scalar::gelu_table();
    let n = gate.len().min(up.len());
    let whole = n / 4 * 4;
    for (g, u) in gate[..whole]
        .chunks_exact_mut(4)
        .zip(up[..whole].chunks_exact(4))
    {
        // SAFETY: four lanes each side; the caller guarantees NEON.
        unsafe {
            let x = vld1q_f32(g.as_ptr());
            let mut index = [0u16; 4];
            vst1_u16(index.as_mut_ptr(), narrow(x));
            let looked = index.map(|i| table[usize::from(i)]);
            let y = widen(vld1_u16(looked.as_ptr()));
            let high = vcgeq_f32(x, vdupq_n_f32(10.0));
            let low = vcleq_f32(x, vdupq_n_f32(-10.0));
            let y = vbslq_f32(high, x, y);
            let y = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), low));
            vst1q_f32(g.as_mut_ptr(), vmulq_f32(y, vld1q_f32(u.as_ptr())));
        }
    }
    scalar::gelu_mul(&mut gate[whole..n], &up[whole..n]);
}

/// `x ← e^x` for each value, as `expf::expf` rounds it (four at a time in f64 pairs of two).
#[target_feature(enable = "neon")]
unsafe fn expf_all_neon(xs: &mut [f32]) {
    use super::expf::{C, HIGHEST, INV_LN2_32, LOWEST, SHIFT, TABLE};
    // SAFETY: NEON, which the caller guarantees; loads and stores are of 4-value chunks, and
    // TABLE is read at indices masked to 0..32.
    unsafe {
        let two = |xd: float64x2_t| {
            let (inv, shift) = (vdupq_n_f64(INV_LN2_32), vdupq_n_f64(SHIFT));
            let shifted = vfmaq_f64(shift, xd, inv);
            let k = vreinterpretq_u64_f64(shifted);
            let r = vfmaq_f64(vnegq_f64(vsubq_f64(shifted, shift)), xd, inv);
            let t = |lane: u64| TABLE[(lane % 32) as usize];
            let table = vcombine_u64(
                vcreate_u64(t(vgetq_lane_u64::<0>(k))),
                vcreate_u64(t(vgetq_lane_u64::<1>(k))),
            );
            let s = vreinterpretq_f64_u64(vaddq_u64(table, vshlq_n_u64::<47>(k)));
            let high = vfmaq_f64(vdupq_n_f64(C[1]), vdupq_n_f64(C[0]), r);
            let low = vfmaq_f64(vdupq_n_f64(1.0), vdupq_n_f64(C[2]), r);
            vmulq_f64(vfmaq_f64(low, high, vmulq_f64(r, r)), s)
        };
        let mut fours = xs.chunks_exact_mut(4);
        for x4 in fours.by_ref() {
            let x = vld1q_f32(x4.as_ptr());
            // NaN or above HIGHEST in any lane: the scalar routine; below LOWEST: 0.
            if vminvq_u32(vcleq_f32(x, vdupq_n_f32(HIGHEST))) == 0 {
                super::expf::expf_all(x4);
                continue;
            }
            let low = vcvt_f32_f64(two(vcvt_f64_f32(vget_low_f32(x))));
            let y = vcvt_high_f32_f64(low, two(vcvt_high_f64_f32(x)));
            let kept = vcgeq_f32(x, vdupq_n_f32(LOWEST));
            vst1q_f32(
                x4.as_mut_ptr(),
                vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(y), kept)),
            );
        }
        super::expf::expf_all(fours.into_remainder());
    }
}

#[cfg(test)]
mod tests {
    /// Four lanes at a time, every lane as the scalar routine, across the ranges attention
    /// sees (down to −inf) and past both ends, NaN included, in every lane position.
    #[test]
    fn neon_exponential_equals_the_scalar_one() {
        if !super::supported() {
            return;
        }
        // SAFETY: `supported()` checked NEON.
        crate::kernels::expf::assert_lanes_equal_the_scalar_routine(4, |xs| unsafe {
            super::expf_all_neon(xs)
        });
    }

    #[test]
    fn every_listed_type_has_a_neon_kernel_on_this_cpu() {
        if !super::supported() {
            return;
        }
        for name in ["Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"] {
            let ty = (0..64)
                .filter_map(gguf::TensorType::from_id)
                .find(|t| t.name == name)
                .expect("known type");
            assert!(super::row_dot(&ty).is_some(), "{name}");
        }
    }
}
