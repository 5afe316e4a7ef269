//! x86-64 kernels on AVX2, FMA and F16C. Each keeps the lane layout and the order of float
//! operations of its scalar twin in `scalar.rs`, so the two give bit-identical results (the
//! tests compare them exactly); integer sums are exact, so only the float steps need care.
//!
//! Where the CPU also has AVX-512 VNNI (with VL, on 256-bit registers), a second set of the row
//! kernels is compiled from the same code with the int8 multiply-adds fused into `vpdpbusd` /
//! `vpdpwssd`: the same lanes summed exactly, so the same results, in fewer instructions. Its
//! legacy-quant batches (two or more tokens) run the packed kernels of `x86/packed.rs`, its
//! K-quant batches the 512-bit kernels of `x86/k_wide.rs` (rows in lanes from six columns on).
//! K-quants for one to five columns (a token, a draft's check) take `x86/k_quads.rs` on both
//! sets: four rows folded together, their float steps in one register.
//!
//! The `*_avx2` and `*_vnni` functions require those CPU features: the row kernels are only
//! handed out by [`row_dot`], which checks [`supported`] / [`vnni_supported`] first, and the f16
//! helpers check it on every call.

// The `unsafe` blocks around intrinsic calls predate target-feature-safe intrinsics; newer
// compilers see some of them as redundant.
#![allow(unused_unsafe)]

use std::arch::x86_64::*;

pub(super) mod delta;
mod k_quads;
mod k_wide;
mod lane_rows;
mod legacy_lanes;
mod packed;

use super::RowDot;
use super::activations::{self, BlockQ8_0, BlockQ8_1, BlockQ8K};
use super::scalar;
use crate::quant::TensorType;

/// Whether this CPU has AVX2, FMA and F16C.
pub fn supported() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

/// Whether this CPU also has AVX-512's VNNI (`vpdpbusd`, `vpdpwssd`) and byte and word
/// operations (`vpmaddubsw` on 512-bit registers: `k_wide.rs`).
pub fn vnni_supported() -> bool {
    supported()
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512vl")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
}

/// The kernel for `ty`, where there is one: with `vnni` the set that fuses the int8 dot
/// products (same lanes, same results), else the AVX2 one; none when the CPU lacks the set.
pub fn row_dot(ty: &TensorType, vnni: bool) -> Option<RowDot> {
    let usable = if vnni { vnni_supported() } else { supported() };
    if !usable {
        return None;
    }
    Some(match ty.name {
        "Q4_0" => RowDot::Q8_0(if vnni { q4_0_v } else { q4_0 }),
        "Q4_1" => RowDot::Q8_1(if vnni { q4_1_v } else { q4_1 }),
        "Q5_0" => RowDot::Q8_0(if vnni { q5_0_v } else { q5_0 }),
        "Q8_0" => RowDot::Q8_0(if vnni { q8_0_v } else { q8_0 }),
        "Q4_K" => RowDot::Q8K(if vnni { q4_k_v } else { q4_k }),
        "Q6_K" => RowDot::Q8K(if vnni { q6_k_v } else { q6_k }),
        _ => return None,
    })
}

/// The kernel over a Q4_K or Q6_K copy with sixteen rows side by side (`row_lanes`), any
/// number of columns: with `vnni` sixteen rows a register, else eight; none when the CPU lacks
/// the set.
pub fn lanes_dot(kind: super::row_lanes::LaneKind, vnni: bool) -> Option<RowDot> {
    use super::row_lanes::LaneKind;
    let usable = if vnni { vnni_supported() } else { supported() };
    if !usable {
        return None;
    }
    Some(RowDot::Q8K(match (kind, vnni) {
        (LaneKind::Q4K, false) => lanes_q4_k,
        (LaneKind::Q6K, false) => lanes_q6_k,
        (LaneKind::Q4K, true) => lanes_q4_k_v,
        (LaneKind::Q6K, true) => lanes_q6_k_v,
    }))
}

macro_rules! safe_wrapper {
    ($name:ident, $inner:path, $act:ty) => {
        fn $name(w: &[u8], row_bytes: usize, x: &[$act], columns: usize, out: &mut [f32]) {
            // SAFETY: only reachable through `row_dot` or `lanes_dot`, which hand out a kernel
            // only after
            // checking the CPU features it is compiled for (`supported()`, `vnni_supported()`).
            unsafe { $inner(w, row_bytes, x, columns, out) }
        }
    };
}

safe_wrapper!(lanes_q4_k, lane_rows::q4_k_avx2, BlockQ8K);
safe_wrapper!(lanes_q6_k, lane_rows::q6_k_avx2, BlockQ8K);
safe_wrapper!(lanes_q4_k_v, lane_rows::q4_k_vnni, BlockQ8K);
safe_wrapper!(lanes_q6_k_v, lane_rows::q6_k_vnni, BlockQ8K);

/// [`safe_wrapper!`] for the VNNI legacy kernels: a single token streams its rows through the
/// row kernel, a batch goes through the packed kernel of the same sums (`packed.rs`).
macro_rules! batched_wrapper {
    ($name:ident, $single:ident, $batch:path, $act:ty) => {
        fn $name(w: &[u8], row_bytes: usize, x: &[$act], columns: usize, out: &mut [f32]) {
            // SAFETY: only reachable through `row_dot`, which hands out these kernels only after
            // checking `vnni_supported()`.
            unsafe {
                if columns == 1 {
                    $single(w, row_bytes, x, columns, out)
                } else {
                    $batch(w, row_bytes, x, columns, out)
                }
            }
        }
    };
}

safe_wrapper!(q4_0, q4_0_avx2, BlockQ8_0);
safe_wrapper!(q4_1, q4_1_avx2, BlockQ8_1);
safe_wrapper!(q5_0, q5_0_avx2, BlockQ8_0);
safe_wrapper!(q8_0, q8_0_avx2, BlockQ8_0);
batched_wrapper!(q4_0_v, q4_0_vnni, legacy_lanes::q4_0_rows, BlockQ8_0);
batched_wrapper!(q4_1_v, q4_1_vnni, legacy_lanes::q4_1_rows, BlockQ8_1);
batched_wrapper!(q5_0_v, q5_0_vnni, legacy_lanes::q5_0_rows, BlockQ8_0);
batched_wrapper!(q8_0_v, q8_0_vnni, legacy_lanes::q8_0_rows, BlockQ8_0);

/// A K-quant's kernels: up to `k_quads::MAX_COLUMNS` columns four rows at a time, more through
/// `$batch`.
macro_rules! k_wrapper {
    ($name:ident, $few:path, $batch:path) => {
        fn $name(w: &[u8], row_bytes: usize, x: &[BlockQ8K], columns: usize, out: &mut [f32]) {
            // SAFETY: only reachable through `row_dot`, which hands out a kernel only after
            // checking the CPU features both paths are compiled for.
            unsafe {
                if columns <= k_quads::MAX_COLUMNS {
                    $few(w, row_bytes, x, columns, out)
                } else {
                    $batch(w, row_bytes, x, columns, out)
                }
            }
        }
    };
}

k_wrapper!(q4_k, k_quads::q4_k_avx2, q4_k_rows_avx2);
k_wrapper!(q6_k, k_quads::q6_k_avx2, q6_k_rows_avx2);
k_wrapper!(q4_k_v, k_quads::q4_k_vnni, k_wide::q4_k_rows);
k_wrapper!(q6_k_v, k_quads::q6_k_vnni, k_wide::q6_k_rows);

/// `row · x` for float weights as `scalar::float_dot` computes it: lane i mod 8, fused
/// multiply-adds, the tail in the same lanes, then `hsum8`.
pub fn float_dot(kind: super::FloatKind, row: &[u8], x: &[f32]) -> f32 {
    // SAFETY: only reachable with `Isa::Avx2`, which `supported()` established.
    unsafe { float_dot_avx2(kind, row, x) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_dot_avx2(kind: super::FloatKind, row: &[u8], x: &[f32]) -> f32 {
    use super::FloatKind;
    let n = x.len();
    assert!(
        row.len() >= n * kind.bytes(),
        "a float row shorter than its activations"
    );
    let whole = n / 8 * 8;
    // SAFETY: the caller guarantees the CPU features; every load reads inside `row` (checked
    // above) and `x`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in (0..whole).step_by(8) {
            let w = match kind {
                FloatKind::F32 => _mm256_loadu_ps(row.as_ptr().add(4 * i).cast()),
                FloatKind::F16 => _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(2 * i).cast())),
                FloatKind::BF16 => {
                    let h = _mm_loadu_si128(row.as_ptr().add(2 * i).cast());
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                }
            };
            acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(x.as_ptr().add(i)), acc);
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        for i in whole..n {
            lanes[i % 8] = super::scalar::float_at(kind, row, i).mul_add(x[i], lanes[i % 8]);
        }
        super::scalar::hsum8(lanes)
    }
}

/// Eight lanes folded as `scalar::hsum8` folds them.
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum8(v: __m256) -> f32 {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        let r = _mm_add_ss(r, _mm_movehdup_ps(r));
        _mm_cvtss_f32(r)
    }
}

/// Asks for the `rows` rows of `w` that start at row `first` (rows `row_bytes` long) to come
/// into the cache: memory streams ahead of the math. Rows past the end are not read (a prefetch
/// never faults), so the caller may look ahead of its last row.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn prefetch_rows(w: &[u8], row_bytes: usize, first: usize, rows: usize) {
    // SAFETY: the caller guarantees the CPU features.
    unsafe { prefetch_bytes(w.as_ptr().wrapping_add(first * row_bytes), rows * row_bytes) }
}

/// Asks for the cache lines of `len` bytes from `start` (the last one included when they
/// straddle one more line). Nothing is read: a prefetch never faults.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn prefetch_bytes(start: *const u8, len: usize) {
    for line in super::cache_lines(len) {
        // SAFETY: the caller guarantees the CPU features; a prefetch reads nothing.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(line).cast()) };
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn load32(bytes: &[u8]) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        assert!(bytes.len() >= 32);
        _mm256_loadu_si256(bytes.as_ptr().cast())
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn load_qs(qs: &[i8; 32]) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { _mm256_loadu_si256(qs.as_ptr().cast()) }
}

/// 16 bytes of nibbles → 32 bytes: low nibbles (elements 0–15), then high (16–31).
#[target_feature(enable = "avx2,fma")]
unsafe fn nibbles(qs: &[u8]) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        assert!(qs.len() >= 16);
        let packed = _mm_loadu_si128(qs.as_ptr().cast());
        let both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
        _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
    }
}

/// 0xFF in byte j where bit j of the 32-bit `qh` is set.
#[target_feature(enable = "avx2,fma")]
unsafe fn bits_to_bytes(qh: u32) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let spread = _mm256_shuffle_epi8(
            _mm256_set1_epi32(qh as i32),
            _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            ),
        );
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit)
    }
}

/// Sums of four consecutive u8·i8 products, as f32 lanes.
#[target_feature(enable = "avx2,fma")]
unsafe fn unsigned_lanes(x: __m256i, y: __m256i) -> __m256 {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let pairs = _mm256_maddubs_epi16(x, y);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), pairs))
    }
}

/// [`unsigned_lanes`] in one instruction: `vpdpbusd` sums the four products into each i32 lane
/// exactly, as `maddubs` (which cannot saturate on these values) then `madd` do.
///
/// Written as `asm!` because the intrinsic and the `avx512*` target features need Rust 1.89,
/// newer than our MSRV. The EVEX form (AVX-512 VNNI + VL) is named explicitly: CPUs such as
/// Zen 4 have it without the VEX form (AVX-VNNI).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn unsigned_lanes_vnni(x: __m256i, y: __m256i) -> __m256 {
    // SAFETY: only reached through kernels `row_dot` hands out after `vnni_supported()`; the
    // instruction reads and writes registers only.
    unsafe {
        let mut acc = _mm256_setzero_si256();
        std::arch::asm!(
            "{{evex}} vpdpbusd {acc}, {x}, {y}",
            acc = inout(ymm_reg) acc,
            x = in(ymm_reg) x,
            y = in(ymm_reg) y,
            options(pure, nomem, nostack, preserves_flags),
        );
        _mm256_cvtepi32_ps(acc)
    }
}

/// `acc + madd(s, p)`: a chunk's pair sums weighted by its 16-bit scales, added in.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn madd_add(acc: __m256i, s: __m256i, p: __m256i) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(s, p)) }
}

/// [`madd_add`] in one instruction (`vpdpwssd`, EVEX form, `asm!` as in
/// [`unsigned_lanes_vnni`]), the same exact integers.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn madd_add_vnni(acc: __m256i, s: __m256i, p: __m256i) -> __m256i {
    // SAFETY: as for `unsigned_lanes_vnni`.
    unsafe {
        let mut acc = acc;
        std::arch::asm!(
            "{{evex}} vpdpwssd {acc}, {s}, {p}",
            acc = inout(ymm_reg) acc,
            s = in(ymm_reg) s,
            p = in(ymm_reg) p,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    }
}

/// The two f16 at the start of a block (a legacy block's scale, and Q4_1's min after it) in
/// lanes 0 and 1: one 4-byte load and one conversion, exact like `f16_to_f32`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_pair(block: &[u8]) -> __m128 {
    let bits = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)) }
}

/// Lane 1 of `v` (Q4_1's min, Q4_K's `dmin`, after [`f16_pair`]).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn second(v: __m128) -> f32 {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { _mm_cvtss_f32(_mm_movehdup_ps(v)) }
}

/// The f16 at byte `at` of `bytes`, converted by the F16C unit (exact, like `f16_to_f32`).
#[inline]
#[target_feature(enable = "f16c")]
unsafe fn f16c_at(bytes: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    // SAFETY: the caller guarantees F16C.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits)))) }
}

/// A legacy-quant kernel. Per block, `prep` unpacks the weights once (their f16 scale in lane 0
/// of a vector, and a register form), `dot` gives the eight lane sums against one activation
/// block, and `offset` (Q4_1) updates the scalar `m·s` sum from that vector. Work goes in tiles:
/// one row × eight columns (a row's block unpacked once for eight tokens), two rows × four, two
/// × two, and two rows × one column for single tokens (two independent chains, the activation
/// block loaded once). Every (row, column) sums in the scalar reference's order.
macro_rules! legacy_rows {
    (
        $rows:ident, $act:ty, $bytes:expr,
        prep: |$b:ident| $prep:expr,
        dot: |$w:ident, $y:ident| $dot:expr,
        offset: |$ob:ident, $oy:ident, $summs:ident| $offset:expr $(,)?
    ) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $rows(w: &[u8], row_bytes: usize, x: &[$act], columns: usize, out: &mut [f32]) {
            // SAFETY: the caller guarantees the CPU features this function is compiled for.
            unsafe {
                let n_rows = w.len() / row_bytes;
                let blocks = row_bytes / $bytes;
                if n_rows == 0 || blocks == 0 || x.len() < columns * blocks {
                    return;
                }
                macro_rules! row {
                    ($r:expr) => {
                        &w[$r * row_bytes..($r + 1) * row_bytes]
                    };
                }
                macro_rules! column {
                    ($c:expr) => {
                        &x[$c * blocks..($c + 1) * blocks]
                    };
                }
                // One (row, column) pair's block, with the row's block already unpacked.
                macro_rules! step {
                    ($acc:expr, $sum:expr, $prepared:expr, $yy:expr) => {{
                        let (dw, $w, dm) = $prepared;
                        let $y: &$act = $yy;
                        let lanes = $dot;
                        // dw·dy in every lane: a load-port broadcast and one multiply.
                        let scale = _mm256_mul_ps(dw, _mm256_broadcast_ss(&$y.d));
                        $acc = _mm256_fmadd_ps(scale, lanes, $acc);
                        let ($ob, $oy, $summs): (__m128, &$act, &mut f32) = (dm, $yy, $sum);
                        $offset;
                    }};
                }
                macro_rules! prepare {
                    ($bb:expr) => {{
                        let $b: &[u8] = $bb;
                        let (dm, w): (__m128, _) = $prep;
                        (_mm256_broadcastss_ps(dm), w, dm)
                    }};
                }
                let zero = _mm256_setzero_ps();
                macro_rules! two_by_two {
                    ($r:expr, $c:expr) => {{
                        let (r, c) = ($r, $c);
                        let (mut a00, mut a01, mut a10, mut a11) = (zero, zero, zero, zero);
                        let mut s = [0f32; 4];
                        let rows = row!(r)
                            .chunks_exact($bytes)
                            .zip(row!(r + 1).chunks_exact($bytes));
                        for ((b0, b1), (y0, y1)) in rows.zip(column!(c).iter().zip(column!(c + 1)))
                        {
                            let (p0, p1) = (prepare!(b0), prepare!(b1));
                            let [s00, s01, s10, s11] = &mut s;
                            step!(a00, s00, p0, y0);
                            step!(a01, s01, p0, y1);
                            step!(a10, s10, p1, y0);
                            step!(a11, s11, p1, y1);
                        }
                        out[c * n_rows + r] = hsum8(a00) + s[0];
                        out[(c + 1) * n_rows + r] = hsum8(a01) + s[1];
                        out[c * n_rows + r + 1] = hsum8(a10) + s[2];
                        out[(c + 1) * n_rows + r + 1] = hsum8(a11) + s[3];
                    }};
                }
                macro_rules! two_by_four {
                    ($r:expr, $c:expr) => {{
                        let (r, c) = ($r, $c);
                        // Separate locals, not an array, so the eight chains stay in registers.
                        let (mut a00, mut a01, mut a02, mut a03) = (zero, zero, zero, zero);
                        let (mut a10, mut a11, mut a12, mut a13) = (zero, zero, zero, zero);
                        let mut s = [0f32; 8];
                        let rows = row!(r)
                            .chunks_exact($bytes)
                            .zip(row!(r + 1).chunks_exact($bytes));
                        let columns = column!(c)
                            .iter()
                            .zip(column!(c + 1))
                            .zip(column!(c + 2).iter().zip(column!(c + 3)));
                        for ((b0, b1), ((y0, y1), (y2, y3))) in rows.zip(columns) {
                            let (p0, p1) = (prepare!(b0), prepare!(b1));
                            let [s00, s01, s02, s03, s10, s11, s12, s13] = &mut s;
                            step!(a00, s00, p0, y0);
                            step!(a01, s01, p0, y1);
                            step!(a02, s02, p0, y2);
                            step!(a03, s03, p0, y3);
                            step!(a10, s10, p1, y0);
                            step!(a11, s11, p1, y1);
                            step!(a12, s12, p1, y2);
                            step!(a13, s13, p1, y3);
                        }
                        let lanes = [[a00, a01, a02, a03], [a10, a11, a12, a13]];
                        for (i, (acc, sums)) in lanes.iter().zip(s.chunks_exact(4)).enumerate() {
                            for (j, (lanes, sum)) in acc.iter().zip(sums).enumerate() {
                                out[(c + j) * n_rows + r + i] = hsum8(*lanes) + sum;
                            }
                        }
                    }};
                }
                macro_rules! one_by_eight {
                    ($r:expr, $c:expr) => {{
                        let (r, c) = ($r, $c);
                        // One row's block unpacked once for eight columns: the unpacking is
                        // what costs most in Q5_0, so it is spread over more columns.
                        let (mut a0, mut a1, mut a2, mut a3) = (zero, zero, zero, zero);
                        let (mut a4, mut a5, mut a6, mut a7) = (zero, zero, zero, zero);
                        let mut s = [0f32; 8];
                        // Checked once here, so the loop keeps its registers for the math
                        // rather than for eight bounds checks.
                        assert!((c + 8) * blocks <= x.len());
                        let y = x.as_ptr().add(c * blocks);
                        for (i, b0) in row!(r).chunks_exact($bytes).enumerate() {
                            let p0 = prepare!(b0);
                            let [s0, s1, s2, s3, s4, s5, s6, s7] = &mut s;
                            let y = y.add(i);
                            step!(a0, s0, p0, &*y);
                            step!(a1, s1, p0, &*y.add(blocks));
                            step!(a2, s2, p0, &*y.add(2 * blocks));
                            step!(a3, s3, p0, &*y.add(3 * blocks));
                            step!(a4, s4, p0, &*y.add(4 * blocks));
                            step!(a5, s5, p0, &*y.add(5 * blocks));
                            step!(a6, s6, p0, &*y.add(6 * blocks));
                            step!(a7, s7, p0, &*y.add(7 * blocks));
                        }
                        let lanes = [a0, a1, a2, a3, a4, a5, a6, a7];
                        for (j, (acc, sum)) in lanes.iter().zip(s).enumerate() {
                            out[(c + j) * n_rows + r] = hsum8(*acc) + sum;
                        }
                    }};
                }
                macro_rules! two_by_one {
                    ($r:expr, $c:expr) => {{
                        let (r, c) = ($r, $c);
                        let (mut a0, mut a1) = (zero, zero);
                        let mut s = [0f32; 2];
                        let rows = row!(r)
                            .chunks_exact($bytes)
                            .zip(row!(r + 1).chunks_exact($bytes));
                        for ((b0, b1), y) in rows.zip(column!(c)) {
                            let (p0, p1) = (prepare!(b0), prepare!(b1));
                            let [s0, s1] = &mut s;
                            step!(a0, s0, p0, y);
                            step!(a1, s1, p1, y);
                        }
                        out[c * n_rows + r] = hsum8(a0) + s[0];
                        out[c * n_rows + r + 1] = hsum8(a1) + s[1];
                    }};
                }
                macro_rules! one_by_one {
                    ($r:expr, $c:expr) => {{
                        let (r, c) = ($r, $c);
                        let mut a = zero;
                        let mut s = 0f32;
                        for (b0, y) in row!(r).chunks_exact($bytes).zip(column!(c)) {
                            let p0 = prepare!(b0);
                            step!(a, &mut s, p0, y);
                        }
                        out[c * n_rows + r] = hsum8(a) + s;
                    }};
                }
                let mut r = 0;
                while r + 2 <= n_rows {
                    prefetch_rows(w, row_bytes, r + 2, 2);
                    let mut c = 0;
                    while c + 8 <= columns {
                        one_by_eight!(r, c);
                        one_by_eight!(r + 1, c);
                        c += 8;
                    }
                    while c + 4 <= columns {
                        two_by_four!(r, c);
                        c += 4;
                    }
                    while c + 2 <= columns {
                        two_by_two!(r, c);
                        c += 2;
                    }
                    if c < columns {
                        two_by_one!(r, c);
                    }
                    r += 2;
                }
                if r < n_rows {
                    for c in 0..columns {
                        one_by_one!(r, c);
                    }
                }
            }
        }
    };
}

/// Signed weights `x` as `(|x|, x)`: every column needs |x|, and x for the sign of its
/// activations.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn signed_weights(x: __m256i) -> (__m256i, __m256i) {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { (_mm256_sign_epi8(x, x), x) }
}

/// The four legacy kernels with `$lanes` summing four consecutive
/// u8·i8 products per lane. Signed weights go in as |x| against y with x's sign (the products
/// need an unsigned side), the absolute values unpacked once per block.
macro_rules! legacy_kernels {
    ($lanes:ident: $q4_0:ident, $q4_1:ident, $q5_0:ident, $q8_0:ident) => {
        legacy_rows!($q4_0, BlockQ8_0, 18,
            prep: |b| {
                let values = _mm256_sub_epi8(nibbles(&b[2..]), _mm256_set1_epi8(8));
                (f16_pair(b), signed_weights(values))
            },
            dot: |w, y| $lanes(w.0, _mm256_sign_epi8(load_qs(&y.qs), w.1)),
            offset: |_b, _y, _summs| (),
        );

        legacy_rows!($q4_1, BlockQ8_1, 20,
            prep: |b| (f16_pair(b), nibbles(&b[4..])),
            dot: |w, y| $lanes(w, load_qs(&y.qs)),
            offset: |dm, y, summs| *summs = second(dm).mul_add(y.s, *summs),
        );

        legacy_rows!($q5_0, BlockQ8_0, 22,
            prep: |b| {
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                // value − 16: without the fifth bit the byte becomes nibble | 0xF0 = nibble − 16.
                let high = _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8(0xf0u8 as i8));
                (f16_pair(b), signed_weights(_mm256_or_si256(nibbles(&b[6..]), high)))
            },
            dot: |w, y| $lanes(w.0, _mm256_sign_epi8(load_qs(&y.qs), w.1)),
            offset: |_b, _y, _summs| (),
        );

        legacy_rows!($q8_0, BlockQ8_0, 34,
            prep: |b| (f16_pair(b), signed_weights(load32(&b[2..]))),
            dot: |w, y| $lanes(w.0, _mm256_sign_epi8(load_qs(&y.qs), w.1)),
            offset: |_b, _y, _summs| (),
        );
    };
}

legacy_kernels!(unsigned_lanes: q4_0_avx2, q4_1_avx2, q5_0_avx2, q8_0_avx2);
legacy_kernels!(unsigned_lanes_vnni: q4_0_vnni, q4_1_vnni, q5_0_vnni, q8_0_vnni);

/// Columns a K-quant kernel keeps accumulators for at once.
const K_COLUMNS: usize = 32;

/// A K-quant kernel over rows × columns: each weight block is unpacked once (values and
/// scales) and applied to every column before the next block, the columns' two sums
/// (`scalar::k_step`) kept in an array; every (row, column) sums exactly as the scalar
/// reference does.
macro_rules! k_quant_rows {
    (
        $rows:ident, $bytes:expr,
        unpack: |$b:ident| $unpack:expr,
        column: |$u:ident, $y:ident, $acc:ident| $column:expr $(,)?
    ) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $rows(
            w: &[u8],
            row_bytes: usize,
            x: &[BlockQ8K],
            columns: usize,
            out: &mut [f32],
        ) {
            // SAFETY: the caller guarantees the CPU features this function is compiled for.
            unsafe {
                let n_rows = w.len() / row_bytes.max(1);
                let blocks = x.len() / columns.max(1);
                if blocks == 0 {
                    return;
                }
                for c0 in (0..columns).step_by(K_COLUMNS) {
                    let n = (columns - c0).min(K_COLUMNS);
                    let ys = &x[c0 * blocks..(c0 + n) * blocks];
                    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                        prefetch_rows(w, row_bytes, r + 2, 1);
                        let mut acc = [[0f32; 2]; K_COLUMNS];
                        for (i, $b) in row.chunks_exact($bytes).enumerate() {
                            let $u = $unpack;
                            let columns = ys.iter().skip(i).step_by(blocks);
                            for ($y, $acc) in columns.zip(&mut acc[..n]) {
                                $column;
                            }
                        }
                        for (j, sums) in acc[..n].iter().enumerate() {
                            out[(c0 + j) * n_rows + r] = sums[0] - sums[1];
                        }
                    }
                }
            }
        }
    };
}

/// A Q4_K block unpacked: its scales, its 4-bit values in eight 32-byte chunks, and the mins.
struct Q4K {
    dw: f32,
    dmin: f32,
    values: [__m256i; 8],
    /// Chunk k's scale in every 16-bit lane.
    scales: [__m256i; 8],
    /// The eight mins as i16, each twice: `vpmaddwd` against the activations' sums of 16 gives
    /// min · (sum of 32) per 32-bit lane.
    mins: __m256i,
}

/// A Q4_K block's twelve bytes of 6-bit scales and mins as sixteen bytes: the eight scales,
/// then the eight mins (`scalar::q4_k_scales`' values), unpacked in the lanes of one register:
/// as 32-bit words w0, w1, w2 of those bytes, scales and mins 0–3 are the low six bits of w0
/// and w1; 4–7 take their low four bits from w2 (low and high nibbles) and their top two from
/// the top bits of w0 and w1.
#[inline(always)]
unsafe fn q4_k_scales_and_mins(b: &[u8]) -> __m128i {
    const LOW6: i32 = 0x3f3f_3f3f;
    const LOW4: i32 = 0x0f0f_0f0f;
    const TOP2: i32 = 0x0303_0303;
    // SAFETY: the caller guarantees AVX2; bytes 4..20 lie inside the 144-byte block.
    unsafe {
        assert!(b.len() >= 20);
        let w = _mm_loadu_si128(b[4..].as_ptr().cast());
        // [w0, w2, w1, w2]: the words each lane's low bits come from.
        let low_words = _mm_shuffle_epi32::<0b10_01_10_00>(w);
        let low = _mm_and_si128(
            _mm_srlv_epi32(low_words, _mm_setr_epi32(0, 0, 0, 4)),
            _mm_setr_epi32(LOW6, LOW4, LOW6, LOW4),
        );
        // [w0, w0, w1, w1]: the top two bits of lanes 1 and 3.
        let top_words = _mm_shuffle_epi32::<0b01_01_00_00>(w);
        let top = _mm_slli_epi32(
            _mm_and_si128(_mm_srli_epi32(top_words, 6), _mm_set1_epi32(TOP2)),
            4,
        );
        _mm_or_si128(low, _mm_and_si128(top, _mm_setr_epi32(0, -1, 0, -1)))
    }
}

/// The `vpshufb` selector that puts byte `k` of each 128-bit half in every 16-bit lane, zero
/// extended.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn word_of_byte(k: u16) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { _mm256_set1_epi16((0x8000 | k) as i16) }
}

#[inline(always)]
unsafe fn q4_k_unpack(b: &[u8]) -> Q4K {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let packed = q4_k_scales_and_mins(b);
        let both = _mm256_broadcastsi128_si256(packed);
        let mins_twice = _mm_setr_epi8(8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15);
        let mut values = [_mm256_setzero_si256(); 8];
        for j in 0..4 {
            let bits = load32(&b[16 + 32 * j..]);
            values[2 * j] = _mm256_and_si256(bits, low);
            values[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(bits, 4), low);
        }
        // Loops, not `array::from_fn`: a closure's intrinsics are not inlined here.
        let mut scales = [_mm256_setzero_si256(); 8];
        for (k, s) in scales.iter_mut().enumerate() {
            *s = _mm256_shuffle_epi8(both, word_of_byte(k as u16));
        }
        let scale_and_min = f16_pair(b);
        Q4K {
            dw: _mm_cvtss_f32(scale_and_min),
            dmin: second(scale_and_min),
            values,
            scales,
            mins: _mm256_cvtepu8_epi16(_mm_shuffle_epi8(packed, mins_twice)),
        }
    }
}

/// A Q6_K block unpacked: its 6-bit values (unsigned) in eight 32-byte chunks and its scales.
struct Q6K {
    dw: f32,
    values: [__m256i; 8],
    scales: [__m256i; 8],
    scales16: __m256i,
}

#[inline(always)]
unsafe fn q6_k_unpack(b: &[u8]) -> Q6K {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let two = _mm256_set1_epi8(3);
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b[192..208].as_ptr().cast()));
        // Chunk k holds groups 2k (its low 16 values) and 2k + 1 (its high 16): from the
        // scales of groups 0–7 (or 8–15) in both halves, the low half takes word 2k mod 8 and
        // the high half word 2k + 1 mod 8.
        let groups_low = _mm256_permute2x128_si256::<0x00>(scales16, scales16);
        let groups_high = _mm256_permute2x128_si256::<0x11>(scales16, scales16);
        let mut scales = [_mm256_setzero_si256(); 8];
        for (k, s) in scales.iter_mut().enumerate() {
            let word = |w: usize| (((2 * w + 1) << 8) | (2 * w)) as i16;
            let pick = _mm256_setr_m128i(
                _mm_set1_epi16(word(2 * k % 8)),
                _mm_set1_epi16(word((2 * k + 1) % 8)),
            );
            *s = _mm256_shuffle_epi8(if k < 4 { groups_low } else { groups_high }, pick);
        }
        let mut values = [_mm256_setzero_si256(); 8];
        for half in 0..2 {
            let ql0 = load32(&b[64 * half..]);
            let ql1 = load32(&b[64 * half + 32..]);
            let qh = load32(&b[128 + 32 * half..]);
            let high = |shift: i32| {
                let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift));
                _mm256_slli_epi16(_mm256_and_si256(v, two), 4)
            };
            values[4 * half] = _mm256_or_si256(_mm256_and_si256(ql0, low), high(0));
            values[4 * half + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low), high(2));
            values[4 * half + 2] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), high(4));
            values[4 * half + 3] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low), high(6));
        }
        Q6K {
            dw: f16c_at(b, 208),
            values,
            scales,
            scales16,
        }
    }
}

/// Adds a Q4_K block against one column to its two sums (the AVX2 batches).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_column(u: &Q4K, y: &BlockQ8K, acc: &mut [f32; 2]) {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        // Σ min · the activations' sums of 32, an exact integer.
        let bsums = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        let summ = hsum_i32(_mm256_madd_epi16(bsums, u.mins));
        let mut sumi = _mm256_setzero_si256();
        for (k, (v, s)) in u.values.iter().zip(&u.scales).enumerate() {
            let q8 = load32(cast_i8(&y.qs[32 * k..32 * k + 32]));
            sumi = madd_add(sumi, *s, _mm256_maddubs_epi16(*v, q8));
        }
        scalar::k_step(acc, hsum_i32(sumi), y.d * u.dw, summ, y.d * u.dmin);
    }
}

/// Adds a Q6_K block against one column to its sum (the AVX2 batches).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_column(u: &Q6K, y: &BlockQ8K, acc: &mut [f32; 2]) {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let mut sumi = _mm256_setzero_si256();
        for (k, (v, s)) in u.values.iter().zip(&u.scales).enumerate() {
            let q8 = load32(cast_i8(&y.qs[32 * k..32 * k + 32]));
            sumi = madd_add(sumi, *s, _mm256_maddubs_epi16(*v, q8));
        }
        // The −32 offset of every value, through the activations' sums of 16.
        let bsums = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        let offsets = _mm256_slli_epi32(_mm256_madd_epi16(bsums, u.scales16), 5);
        let sumi = hsum_i32(_mm256_sub_epi32(sumi, offsets));
        acc[0] = (sumi as f32).mul_add(y.d * u.dw, acc[0]);
    }
}

k_quant_rows!(q4_k_rows_avx2, 144,
    unpack: |b| q4_k_unpack(b),
    column: |u, y, acc| q4_k_column(&u, y, acc),
);

k_quant_rows!(q6_k_rows_avx2, 210,
    unpack: |b| q6_k_unpack(b),
    column: |u, y, acc| q6_k_column(&u, y, acc),
);

fn cast_i8(v: &[i8]) -> &[u8] {
    // SAFETY: i8 and u8 have the same size and alignment, and every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) }
}

/// f16 · f16 as `scalar::dot_f16` computes it.
pub fn dot_f16(a: &[u16], b: &[u16]) -> f32 {
    if !supported() {
        return scalar::dot_f16(a, b);
    }
    // SAFETY: the CPU features were checked just above.
    unsafe { dot_f16_avx2(a, b) }
}

/// Attention over cached f16 rows as `super::attend_f16` defines it (`super::fused_attention`
/// with this ISA's steps), false (nothing done) when this CPU lacks the features or the
/// heads do not fit the fused loop.
pub fn attend_f16(
    queries: super::Queries<'_>,
    rows: super::KvRows<'_>,
    acc: &mut [u16],
    sums: &mut [f32],
) -> bool {
    // SAFETY: the CPU features are checked first.
    supported() && unsafe { attend_f16_avx2(queries, rows, acc, sums) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn attend_f16_avx2(
    queries: super::Queries<'_>,
    rows: super::KvRows<'_>,
    acc: &mut [u16],
    sums: &mut [f32],
) -> bool {
    // SAFETY (every closure): this function's features, which its closures share; loads and
    // stores are of 8-value subslices (`load_f16` asserts).
    let steps = super::FusedSteps {
        widen: |h: &[u16], f: &mut [f32]| unsafe {
            for (h, f) in h.chunks_exact(8).zip(f.chunks_exact_mut(8)) {
                _mm256_storeu_ps(f.as_mut_ptr(), load_f16(h));
            }
        },
        dot: |k32: &[f32], q32: &[f32], k: &[u16], q: &[u16]| unsafe {
            dot_f16_prepared(k32, q32, k, q)
        },
        dots: |k32: &[f32], width: usize, q32: &[f32], out: &mut [f32]| unsafe {
            dots_f16_prepared(k32, width, q32, out)
        },
        exps: |xs: &mut [f32]| unsafe { expf_all_avx2(xs) },
        scale: |a: &mut [f32], s: f32| unsafe {
            let s = _mm256_set1_ps(s);
            for a in a.chunks_exact_mut(8) {
                let x = _mm256_mul_ps(_mm256_loadu_ps(a.as_ptr()), s);
                _mm256_storeu_ps(a.as_mut_ptr(), round_f16x8(x));
            }
        },
        mad_rows: |acc: &mut [f32], v: &[f32], stride: usize, weights: &[f32]| unsafe {
            for (lane, eights) in super::register_chunks(acc.len()) {
                let (acc, v) = (&mut acc[lane..lane + 8 * eights], &v[lane..]);
                match eights {
                    8 => mad_rows_avx2::<8>(acc, v, stride, weights),
                    4 => mad_rows_avx2::<4>(acc, v, stride, weights),
                    2 => mad_rows_avx2::<2>(acc, v, stride, weights),
                    _ => mad_rows_avx2::<1>(acc, v, stride, weights),
                }
            }
        },
        prefetch: |h: &[u16]| unsafe { prefetch_bytes(h.as_ptr().cast(), 2 * h.len()) },
    };
    super::fused_attention(queries, rows, acc, sums, &steps)
}

/// Eight f32 rounded to the nearest f16 (ties to even), back in f32: the reference's f16
/// accumulator, kept in a register.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_f16x8(x: __m256) -> __m256 {
    // SAFETY: register-only conversions; the caller guarantees the CPU features.
    unsafe { _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x)) }
}

/// `acc ← f16(acc + v_r·w_r)` for each weight in order, as `mad_f16_avx2` row after row, over
/// `8·N` accumulators held in registers; row `r` of `v` starts at `r·stride`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_rows_avx2<const N: usize>(
    acc: &mut [f32],
    v: &[f32],
    stride: usize,
    weights: &[f32],
) {
    // SAFETY: the caller guarantees the CPU features; loads and stores are of 8-value
    // subslices of bounds-checked slices.
    unsafe {
        let mut a: [__m256; N] =
            std::array::from_fn(|j| _mm256_loadu_ps(acc[8 * j..][..8].as_ptr()));
        for (r, &w) in weights.iter().enumerate() {
            let (w, row) = (_mm256_set1_ps(w), &v[r * stride..r * stride + 8 * N]);
            for (j, a) in a.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(row[8 * j..8 * j + 8].as_ptr());
                *a = round_f16x8(_mm256_fmadd_ps(x, w, *a));
            }
        }
        for (j, a) in a.iter().enumerate() {
            _mm256_storeu_ps(acc[8 * j..8 * j + 8].as_mut_ptr(), *a);
        }
    }
}

/// `k · q` as `dot_f16_avx2(k, q)` computes it, with both whole 32-element steps already in
/// f32 (`k32`, `q32`; exact: every f16 is an f32) and only the tail read from the f16 rows.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_prepared(k32: &[f32], q32: &[f32], k: &[u16], q: &[u16]) -> f32 {
    // SAFETY: the caller guarantees the CPU features; loads are of 8-value subslices.
    unsafe {
        let whole = k32.len().min(q32.len()) / 32 * 32;
        let mut acc = [_mm256_setzero_ps(); 4];
        for (ck, cq) in k32[..whole].chunks_exact(32).zip(q32.chunks_exact(32)) {
            for (j, s) in acc.iter_mut().enumerate() {
                let kj = _mm256_loadu_ps(ck[8 * j..8 * j + 8].as_ptr());
                let qj = _mm256_loadu_ps(cq[8 * j..8 * j + 8].as_ptr());
                *s = _mm256_fmadd_ps(kj, qj, *s);
            }
        }
        scalar::with_f16_tail(fold_f16_sums(acc), &k[whole..], &q[whole..])
    }
}

/// `k · q` for consecutive rows of `k32` (`width` apart, whole 32-value steps only) as
/// [`dot_f16_prepared`] computes each: eight rows' sums are folded together, every lane in
/// `scalar::dot_f16`'s order, where one row's fold alone is a chain of dependent shuffles.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_f16_prepared(k32: &[f32], width: usize, q32: &[f32], out: &mut [f32]) {
    // SAFETY: the caller guarantees the CPU features; loads and stores are of 8-value
    // subslices of bounds-checked slices.
    unsafe {
        let row_sums = |r: usize| {
            let row = &k32[r * width..(r + 1) * width];
            let mut acc = [_mm256_setzero_ps(); 4];
            for (ck, cq) in row.chunks_exact(32).zip(q32.chunks_exact(32)) {
                for (j, s) in acc.iter_mut().enumerate() {
                    let kj = _mm256_loadu_ps(ck[8 * j..8 * j + 8].as_ptr());
                    let qj = _mm256_loadu_ps(cq[8 * j..8 * j + 8].as_ptr());
                    *s = _mm256_fmadd_ps(kj, qj, *s);
                }
            }
            _mm256_add_ps(_mm256_add_ps(acc[0], acc[2]), _mm256_add_ps(acc[1], acc[3]))
        };
        let done = out.len() / 8 * 8;
        let mut eights = out.chunks_exact_mut(8);
        for (g, out) in eights.by_ref().enumerate() {
            let x: [__m256; 8] = std::array::from_fn(|i| row_sums(8 * g + i));
            // Rows i and i + 4 share a register: the low half of each row's lanes plus the high.
            let y: [__m256; 4] = std::array::from_fn(|i| {
                _mm256_add_ps(
                    _mm256_permute2f128_ps::<0x20>(x[i], x[i + 4]),
                    _mm256_permute2f128_ps::<0x31>(x[i], x[i + 4]),
                )
            });
            let folded = _mm256_hadd_ps(_mm256_hadd_ps(y[0], y[1]), _mm256_hadd_ps(y[2], y[3]));
            // `with_f16_tail` adds +0 to a sum without a tail (−0 becomes +0).
            let sums = _mm256_add_ps(folded, _mm256_setzero_ps());
            _mm256_storeu_ps(out.as_mut_ptr(), sums);
        }
        for (r, out) in eights.into_remainder().iter_mut().enumerate() {
            // `with_f16_tail` adds +0 to a sum without a tail.
            *out = fold_lanes(row_sums(done + r)) + 0.0;
        }
    }
}

/// The four 8-lane sums of an f16 dot product folded in `scalar::dot_f16`'s order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fold_f16_sums(acc: [__m256; 4]) -> f32 {
    // SAFETY: register-only arithmetic; the caller guarantees the CPU features.
    unsafe {
        fold_lanes(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[2]),
            _mm256_add_ps(acc[1], acc[3]),
        ))
    }
}

/// The eight lanes of a dot product's folded sums added in `scalar::dot_f16`'s order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fold_lanes(x: __m256) -> f32 {
    // SAFETY: register-only arithmetic; the caller guarantees the CPU features.
    unsafe {
        let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16(v: &[u16]) -> __m256 {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        assert!(v.len() >= 8);
        _mm256_cvtph_ps(_mm_loadu_si128(v.as_ptr().cast()))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2(a: &[u16], b: &[u16]) -> f32 {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let whole = a.len().min(b.len()) / 32 * 32;
        let mut acc = [_mm256_setzero_ps(); 4];
        for (ca, cb) in a[..whole].chunks_exact(32).zip(b[..whole].chunks_exact(32)) {
            for (j, s) in acc.iter_mut().enumerate() {
                *s = _mm256_fmadd_ps(load_f16(&ca[8 * j..]), load_f16(&cb[8 * j..]), *s);
            }
        }
        scalar::with_f16_tail(fold_f16_sums(acc), &a[whole..], &b[whole..])
    }
}

/// `acc ← f16(acc + v·w)` element-wise, as `scalar::mad_f16`.
pub fn mad_f16(acc: &mut [u16], v: &[u16], w: f32) {
    if !supported() {
        return scalar::mad_f16(acc, v, w);
    }
    // SAFETY: the CPU features were checked just above.
    unsafe { mad_f16_avx2(acc, v, w) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mad_f16_avx2(acc: &mut [u16], v: &[u16], w: f32) {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let n = acc.len().min(v.len()) / 8 * 8;
        let weight = _mm256_set1_ps(w);
        for (a, x) in acc[..n].chunks_exact_mut(8).zip(v[..n].chunks_exact(8)) {
            let sum = _mm256_fmadd_ps(load_f16(x), weight, load_f16(a));
            let packed = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(sum);
            _mm_storeu_si128(a.as_mut_ptr().cast(), packed);
        }
        scalar::mad_f16(&mut acc[n..], &v[n..], w);
    }
}

/// `acc ← f16(acc·s)` element-wise, as `scalar::scale_f16`.
pub fn scale_f16(acc: &mut [u16], s: f32) {
    if !supported() {
        return scalar::scale_f16(acc, s);
    }
    // SAFETY: the CPU features were checked just above.
    unsafe { scale_f16_avx2(acc, s) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_f16_avx2(acc: &mut [u16], s: f32) {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let n = acc.len() / 8 * 8;
        let scale = _mm256_set1_ps(s);
        for a in acc[..n].chunks_exact_mut(8) {
            let packed =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_mul_ps(load_f16(a), scale));
            _mm_storeu_si128(a.as_mut_ptr().cast(), packed);
        }
        scalar::scale_f16(&mut acc[n..], s);
    }
}

/// `scalar::rotate_pairs` with FMA instructions: without the feature in the build each
/// `mul_add` is a library call, two per pair, thousands per token on the one thread that
/// rotates while the others wait.
pub fn rotate_pairs(head: &mut [f32], pairs: &[(f32, f32)], neox: bool) {
    if !supported() {
        return scalar::rotate_pairs(head, pairs, neox);
    }
    // SAFETY: the CPU features were checked just above.
    unsafe { rotate_pairs_fma(head, pairs, neox) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn rotate_pairs_fma(head: &mut [f32], pairs: &[(f32, f32)], neox: bool) {
    scalar::rotate_pairs(head, pairs, neox);
}

/// Activations quantized as `activations::quantize_q8_0` does (finite inputs), 32 lanes at once.
pub fn quantize_q8_0(x: &[f32], out: &mut Vec<BlockQ8_0>) {
    if !supported() {
        return activations::quantize_q8_0(x, out);
    }
    // SAFETY: the CPU features were checked just above.
    out.extend(x.chunks_exact(32).map(|c| unsafe {
        let (d, qs, _) = q8_block_avx2(c);
        BlockQ8_0 {
            d: round_f16_f16c(d),
            qs,
        }
    }));
}

/// Activations quantized as `activations::quantize_q8_1` does (finite inputs).
pub fn quantize_q8_1(x: &[f32], out: &mut Vec<BlockQ8_1>) {
    if !supported() {
        return activations::quantize_q8_1(x, out);
    }
    // SAFETY: the CPU features were checked just above.
    out.extend(x.chunks_exact(32).map(|c| unsafe {
        let (d, qs, sum) = q8_block_avx2(c);
        BlockQ8_1 {
            d: round_f16_f16c(d),
            s: round_f16_f16c(d * sum as f32),
            qs,
        }
    }));
}

/// `activations::round_f16` through the F16C unit, which rounds the same way (to nearest, ties
/// to even, subnormals and overflow as IEEE says): a conversion each way where the bit-by-bit
/// rounding took most of a block's quantization. Not-a-numbers take the reference's route, so
/// their bits stay its.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_f16_f16c(x: f32) -> f32 {
    if x.is_nan() {
        return activations::round_f16(x);
    }
    // SAFETY: register-only conversions; the caller guarantees the CPU features.
    unsafe {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(
            _mm_set_ss(x),
        )))
    }
}

/// Activations quantized as `activations::quantize_q8_k` does (finite inputs).
pub fn quantize_q8_k(x: &[f32], out: &mut Vec<BlockQ8K>) {
    if !supported() {
        return activations::quantize_q8_k(x, out);
    }
    // SAFETY: the CPU features were checked just above.
    out.extend(x.chunks_exact(256).map(|c| unsafe { q8_k_block_avx2(c) }));
}

/// `|v|` of eight lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn abs_ps(v: __m256) -> __m256 {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), v) }
}

/// The largest of eight lanes (exact, so the folding order does not matter).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hmax(v: __m256) -> f32 {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let r = _mm_max_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)))
    }
}

/// `v·scale` rounded to the nearest integer, ties to even (what `round_small` gives for the
/// values quantization produces, |v·scale| ≤ 127).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn rounded(v: __m256, scale: __m256) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v, scale),
        );
        _mm256_cvtps_epi32(r)
    }
}

/// Four vectors of eight i32 as 32 bytes in order, saturated to i8 (the scalar clamp).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn packed_i8(i: [__m256i; 4]) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let bytes = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        // The packs interleave 128-bit halves; put the 4-byte groups back in order.
        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
    }
}

/// Sum of eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let r = _mm_add_epi32(r, _mm_shuffle_epi32::<0b01_00_11_10>(r));
        _mm_cvtsi128_si32(_mm_add_epi32(r, _mm_shuffle_epi32::<0b10_11_00_01>(r)))
    }
}

/// `activations::q8_block` on 32 values: the scale, the quants and their sum.
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_block_avx2(x: &[f32]) -> (f32, [i8; 32], i32) {
    assert!(x.len() >= 32);
    // SAFETY: the assertion keeps the four 8-lane loads in bounds; the caller guarantees the
    // CPU features.
    unsafe {
        let v: [__m256; 4] = std::array::from_fn(|k| _mm256_loadu_ps(x.as_ptr().add(8 * k)));
        let m = _mm256_max_ps(
            _mm256_max_ps(abs_ps(v[0]), abs_ps(v[1])),
            _mm256_max_ps(abs_ps(v[2]), abs_ps(v[3])),
        );
        let amax = hmax(m);
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        if !id.is_finite() {
            // Magnitudes so small that 127/amax overflows: the products are ±∞ or NaN, which
            // the reference's clamp and cast settle and `cvtps` would not.
            return activations::q8_block(x);
        }
        let id = _mm256_set1_ps(id);
        let ints = v.map(|v| rounded(v, id));
        let mut qs = [0i8; 32];
        _mm256_storeu_si256(qs.as_mut_ptr().cast(), packed_i8(ints));
        let total = _mm256_add_epi32(
            _mm256_add_epi32(ints[0], ints[1]),
            _mm256_add_epi32(ints[2], ints[3]),
        );
        (amax / 127.0, qs, hsum_i32(total))
    }
}

/// `activations::quantize_q8_k` on one block of 256 values.
#[target_feature(enable = "avx2,fma")]
unsafe fn q8_k_block_avx2(x: &[f32]) -> BlockQ8K {
    assert!(x.len() >= 256);
    // SAFETY: the assertion keeps every 8-lane load in bounds; the caller guarantees the CPU
    // features.
    unsafe {
        let load = |k: usize| _mm256_loadu_ps(x.as_ptr().add(8 * k));
        let mut m = _mm256_setzero_ps();
        for k in 0..32 {
            m = _mm256_max_ps(abs_ps(load(k)), m);
        }
        let amax = hmax(m);
        let mut block = BlockQ8K::default();
        if amax == 0.0 {
            return block;
        }
        // The scalar scan keeps the first value of largest magnitude, with its sign.
        let target = _mm256_set1_ps(amax);
        let first = (0..32).find_map(|k| {
            let hits = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(abs_ps(load(k)), target));
            (hits != 0).then(|| 8 * k + hits.trailing_zeros() as usize)
        });
        let max = x[first.unwrap_or(0)];
        let iscale = -127.0 / max;
        if !iscale.is_finite() {
            return activations::q8_k_block(x);
        }
        let scale = _mm256_set1_ps(iscale);
        for (group, (qs, sums)) in block
            .qs
            .chunks_exact_mut(32)
            .zip(block.bsums.chunks_exact_mut(2))
            .enumerate()
        {
            let ints: [__m256i; 4] = std::array::from_fn(|k| rounded(load(4 * group + k), scale));
            _mm256_storeu_si256(qs.as_mut_ptr().cast(), packed_i8(ints));
            sums[0] = hsum_i32(_mm256_add_epi32(ints[0], ints[1])) as i16;
            sums[1] = hsum_i32(_mm256_add_epi32(ints[2], ints[3])) as i16;
        }
        block.d = 1.0 / iscale;
        block
    }
}

/// `dst ← f16(src·scale)`, eight lanes at a time through F16C.
pub fn to_f16(src: &[f32], scale: f32, dst: &mut [u16]) {
    if !supported() {
        return scalar::to_f16(src, scale, dst);
    }
    // SAFETY: the CPU features were checked just above.
    unsafe { to_f16_avx2(src, scale, dst) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn to_f16_avx2(src: &[f32], scale: f32, dst: &mut [u16]) {
    let n = src.len().min(dst.len());
    let whole = n / 8 * 8;
    let s = _mm256_set1_ps(scale);
    for (d, x) in dst[..whole]
        .chunks_exact_mut(8)
        .zip(src[..whole].chunks_exact(8))
    {
        // SAFETY: eight lanes each side; the CPU features are the caller's guarantee.
        unsafe {
            let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr()), s);
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm_storeu_si128(d.as_mut_ptr().cast(), h);
        }
    }
    scalar::to_f16(&src[whole..n], scale, &mut dst[whole..n]);
}

pub fn from_f16(src: &[u16], scale: f32, dst: &mut [f32]) {
    if !supported() {
        return scalar::from_f16(src, scale, dst);
    }
    // SAFETY: the CPU features were checked just above.
    unsafe { from_f16_avx2(src, scale, dst) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn from_f16_avx2(src: &[u16], scale: f32, dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let whole = n / 8 * 8;
    let s = _mm256_set1_ps(scale);
    for (d, h) in dst[..whole]
        .chunks_exact_mut(8)
        .zip(src[..whole].chunks_exact(8))
    {
        // SAFETY: eight lanes each side; the CPU features are the caller's guarantee.
        unsafe {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast()));
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_mul_ps(v, s));
        }
    }
    scalar::from_f16(&src[whole..n], scale, &mut dst[whole..n]);
}

pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    if !supported() {
        return scalar::gelu_mul(gate, up);
    }
    // SAFETY: the CPU features were checked just above.
    unsafe { gelu_mul_avx2(gate, up) }
}

/// The table lookup stays scalar (no 16-bit gather); the conversions around it are F16C's.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gelu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    let table = scalar::gelu_table();
    let n = gate.len().min(up.len());
    let whole = n / 8 * 8;
    for (g, u) in gate[..whole]
        .chunks_exact_mut(8)
        .zip(up[..whole].chunks_exact(8))
    {
        // SAFETY: eight lanes each side; the CPU features are the caller's guarantee.
        unsafe {
            let x = _mm256_loadu_ps(g.as_ptr());
            let mut index = [0u16; 8];
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            _mm_storeu_si128(index.as_mut_ptr().cast(), h);
            let looked = index.map(|i| table[usize::from(i)]);
            let y = _mm256_cvtph_ps(_mm_loadu_si128(looked.as_ptr().cast()));
            let high = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(10.0));
            let low = _mm256_cmp_ps::<_CMP_LE_OQ>(x, _mm256_set1_ps(-10.0));
            let y = _mm256_andnot_ps(low, _mm256_blendv_ps(y, x, high));
            _mm256_storeu_ps(
                g.as_mut_ptr(),
                _mm256_mul_ps(y, _mm256_loadu_ps(u.as_ptr())),
            );
        }
    }
    scalar::gelu_mul(&mut gate[whole..n], &up[whole..n]);
}

/// `gate ← silu(gate)·up` as `scalar::silu_mul` computes it, eight lanes at a time.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    if supported() {
        // SAFETY: `supported()` checked the features.
        unsafe { silu_mul_avx2(gate, up) }
    } else {
        scalar::silu_mul(gate, up);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn silu_mul_avx2(gate: &mut [f32], up: &[f32]) {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let n = gate.len().min(up.len());
        let (gate, up) = (&mut gate[..n], &up[..n]);
        let mut g8 = gate.chunks_exact_mut(8);
        let mut u8 = up.chunks_exact(8);
        for (g, u) in g8.by_ref().zip(u8.by_ref()) {
            let x = _mm256_loadu_ps(g.as_ptr());
            let e = match expf_avx2(_mm256_sub_ps(_mm256_setzero_ps(), x)) {
                Some(e) => e,
                // A lane outside the normal exponent range: the scalar routine handles it.
                None => {
                    scalar::silu_mul(g, u);
                    continue;
                }
            };
            let silu = _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0), e));
            _mm256_storeu_ps(
                g.as_mut_ptr(),
                _mm256_mul_ps(silu, _mm256_loadu_ps(u.as_ptr())),
            );
        }
        scalar::silu_mul(g8.into_remainder(), u8.remainder());
    }
}

/// `scalar::expf_poly` on eight lanes when every lane is in the normal range (|n| ≤ 126).
#[target_feature(enable = "avx2,fma")]
unsafe fn expf_avx2(x: __m256) -> Option<__m256> {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
        let shift = c(0x4b40_0000);
        let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), shift);
        let n = _mm256_sub_ps(z, shift);
        let b = _mm256_fnmadd_ps(n, c(0x35bf_be8e), _mm256_fnmadd_ps(n, c(0x3f31_7200), x));
        let e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
        let k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(c(0x3f80_0000))));
        let abs_n = _mm256_andnot_ps(c(0x8000_0000), n);
        if _mm256_movemask_ps(_mm256_cmp_ps(abs_n, c(0x42fc_0000), _CMP_GT_OQ)) != 0 {
            return None;
        }
        let u = _mm256_mul_ps(b, b);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(
                _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
                u,
                _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
            ),
            u,
            _mm256_mul_ps(c(0x3f7f_fff6), b),
        );
        Some(_mm256_fmadd_ps(j, k, k))
    }
}

/// `x ← e^x` for each value, as `expf::expf` rounds it (eight at a time in f64 pairs of four).
#[target_feature(enable = "avx2,fma")]
unsafe fn expf_all_avx2(xs: &mut [f32]) {
    use super::expf::{C, HIGHEST, INV_LN2_32, LOWEST, SHIFT, TABLE};
    // SAFETY: the caller guarantees the CPU features; loads and stores are of 8-value chunks,
    // and the gathers read TABLE at indices masked to 0..32.
    unsafe {
        let four = |x: __m128| {
            let xd = _mm256_cvtps_pd(x);
            let (inv, shift) = (_mm256_set1_pd(INV_LN2_32), _mm256_set1_pd(SHIFT));
            let shifted = _mm256_fmadd_pd(xd, inv, shift);
            let k = _mm256_castpd_si256(shifted);
            let r = _mm256_fmsub_pd(xd, inv, _mm256_sub_pd(shifted, shift));
            let at = _mm256_and_si256(k, _mm256_set1_epi64x(31));
            let t = _mm256_i64gather_epi64::<8>(TABLE.as_ptr().cast(), at);
            let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(k)));
            let high = _mm256_fmadd_pd(_mm256_set1_pd(C[0]), r, _mm256_set1_pd(C[1]));
            let low = _mm256_fmadd_pd(_mm256_set1_pd(C[2]), r, _mm256_set1_pd(1.0));
            let y = _mm256_fmadd_pd(high, _mm256_mul_pd(r, r), low);
            _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
        };
        let mut eights = xs.chunks_exact_mut(8);
        for x8 in eights.by_ref() {
            let x = _mm256_loadu_ps(x8.as_ptr());
            // NaN or above HIGHEST in any lane: the scalar routine; below LOWEST: 0.
            if _mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(HIGHEST), _CMP_LE_OQ)) != 0xff {
                super::expf::expf_all(x8);
                continue;
            }
            let y = _mm256_set_m128(
                four(_mm256_extractf128_ps::<1>(x)),
                four(_mm256_castps256_ps128(x)),
            );
            let kept = _mm256_cmp_ps(x, _mm256_set1_ps(LOWEST), _CMP_GE_OQ);
            _mm256_storeu_ps(x8.as_mut_ptr(), _mm256_and_ps(y, kept));
        }
        super::expf::expf_all(eights.into_remainder());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::f16_to_f32;

    /// Eight lanes at a time, every lane as the scalar routine, across the ranges attention
    /// sees (down to −inf) and past both ends, NaN included, in every lane position.
    #[test]
    fn avx2_exponential_equals_the_scalar_one() {
        if !supported() {
            return;
        }
        // SAFETY: `supported()` checked the features.
        crate::kernels::expf::assert_lanes_equal_the_scalar_routine(8, |xs| unsafe {
            expf_all_avx2(xs)
        });
    }

    #[test]
    fn f16c_conversion_equals_the_reference_for_every_f16() {
        if !supported() {
            return;
        }
        for bits in 0..=u16::MAX {
            let bytes = bits.to_le_bytes();
            // SAFETY: `supported()` checked F16C.
            let hw = unsafe { f16c_at(&bytes, 0) };
            let sw = f16_to_f32(bits);
            assert!(
                hw.to_bits() == sw.to_bits() || (hw.is_nan() && sw.is_nan()),
                "{bits:#06x}: {hw} vs {sw}"
            );
        }
    }
}
