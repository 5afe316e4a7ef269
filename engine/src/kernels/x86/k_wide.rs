//! Batched Q4_K and Q6_K products on AVX-512 (BW and VNNI): the row kernels' sums in half the
//! integer steps, for passes of two or more tokens (prefill, checking drafts).
//!
//! A K-quant block is eight 32-value chunks, each weighted by its own scale. The row kernels
//! (`x86.rs`) take one chunk per 256-bit step: `vpmaddubsw` (weights × activations into pair
//! sums), then `vpdpwssd` (pair sums × the chunk's scale into eight lane sums). Here a 512-bit
//! step takes two chunks side by side, the chunks' scales in their halves, and the two halves
//! of the lane sums are added at the end of the block: integer sums are exact, so each lane
//! holds the same integer as the row kernel's and every (row, column) ends bit for bit as the
//! scalar reference does. Q4_K's min terms (ggml pairs them four ways) are one `vpmaddwd` of the
//! block's mins against the activations' sums of 32, which depend on the column only and are
//! made once per call.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::super::activations::BlockQ8K;
use super::super::scalar;
use super::{f16_pair, f16c_at, hsum8, load32, prefetch_rows, second};

/// Columns whose accumulators one walk along a row keeps.
const COLUMNS: usize = 32;

thread_local! {
    /// The activations' sums of 32 (eight i16 per block), for Q4_K's min terms: per call, not
    /// per row.
    static SUMS32: RefCell<Vec<__m128i>> = const { RefCell::new(Vec::new()) };
}

/// A Q4_K block unpacked for 512-bit steps.
struct Q4K {
    dw: f32,
    dmin: f32,
    /// Chunks 2j and 2j + 1 side by side.
    values: [__m512i; 4],
    /// Their scales, each in its half.
    scales: [__m512i; 4],
    /// The eight mins as i16.
    mins: __m128i,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q4_k_unpack(b: &[u8]) -> Q4K {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let (sc, mins) = scalar::q4_k_scales(b);
        let mut values = [_mm512_setzero_si512(); 4];
        let mut scales = [_mm512_setzero_si512(); 4];
        for j in 0..4 {
            let bits = load32(&b[16 + 32 * j..]);
            let (lo, hi) = (
                _mm256_and_si256(bits, low),
                _mm256_and_si256(_mm256_srli_epi16(bits, 4), low),
            );
            values[j] = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            scales[j] = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_set1_epi16(sc[2 * j])),
                _mm256_set1_epi16(sc[2 * j + 1]),
                1,
            );
        }
        let scale_and_min = f16_pair(b);
        Q4K {
            dw: _mm_cvtss_f32(scale_and_min),
            dmin: second(scale_and_min),
            values,
            scales,
            mins: _mm256_cvtepi32_epi16(_mm256_loadu_si256(mins.as_ptr().cast())),
        }
    }
}

/// A Q6_K block unpacked for 512-bit steps: its 6-bit values (unsigned), two chunks a register,
/// each 16 values' scale in its quarter.
struct Q6K {
    dw: f32,
    values: [__m512i; 4],
    scales: [__m512i; 4],
    scales16: __m256i,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_k_unpack(b: &[u8]) -> Q6K {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let low = _mm256_set1_epi8(0x0f);
        let two = _mm256_set1_epi8(3);
        let scales16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b[192..208].as_ptr().cast()));
        let sc: [i16; 16] = std::mem::transmute(scales16);
        // Chunk k holds groups 2k (its low 16 values) and 2k + 1 (its high 16).
        let chunk_scales =
            |k: usize| _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
        let mut chunks = [_mm256_setzero_si256(); 8];
        for half in 0..2 {
            let ql0 = load32(&b[64 * half..]);
            let ql1 = load32(&b[64 * half + 32..]);
            let qh = load32(&b[128 + 32 * half..]);
            let high = |shift: i32| {
                let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(shift));
                _mm256_slli_epi16(_mm256_and_si256(v, two), 4)
            };
            chunks[4 * half] = _mm256_or_si256(_mm256_and_si256(ql0, low), high(0));
            chunks[4 * half + 1] = _mm256_or_si256(_mm256_and_si256(ql1, low), high(2));
            chunks[4 * half + 2] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), high(4));
            chunks[4 * half + 3] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low), high(6));
        }
        let pair = |a: __m256i, b: __m256i| _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
        Q6K {
            dw: f16c_at(b, 208),
            values: std::array::from_fn(|j| pair(chunks[2 * j], chunks[2 * j + 1])),
            scales: std::array::from_fn(|j| pair(chunk_scales(2 * j), chunk_scales(2 * j + 1))),
            scales16,
        }
    }
}

/// The eight lane sums of a block's chunks (`values`, weighted by `scales`) against the
/// activations `y`: the two halves of the 512-bit sums added.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lane_sums(values: &[__m512i; 4], scales: &[__m512i; 4], y: &BlockQ8K) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let mut sums = _mm512_setzero_si512();
        for (j, (v, s)) in values.iter().zip(scales).enumerate() {
            let q8 = _mm512_loadu_si512(y.qs[64 * j..].as_ptr().cast());
            sums = _mm512_dpwssd_epi32(sums, *s, _mm512_maddubs_epi16(*v, q8));
        }
        _mm256_add_epi32(
            _mm512_castsi512_si256(sums),
            _mm512_extracti64x4_epi64(sums, 1),
        )
    }
}

/// `rows × columns` Q4_K products (`x` by column, then block), each as `scalar::q4_k` sums it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4_k_rows(
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
        SUMS32.with_borrow_mut(|sums32| {
            // The activations' sums of 32 values, from Q8_K's sums of 16: exact in i16
            // (at most 32 · 127).
            sums32.clear();
            sums32.extend(x.iter().map(|y| {
                let pairs = _mm256_madd_epi16(
                    _mm256_loadu_si256(y.bsums.as_ptr().cast()),
                    _mm256_set1_epi16(1),
                );
                _mm256_cvtepi32_epi16(pairs)
            }));
            for c0 in (0..columns).step_by(COLUMNS) {
                let n = (columns - c0).min(COLUMNS);
                let ys = &x[c0 * blocks..(c0 + n) * blocks];
                let ss = &sums32[c0 * blocks..(c0 + n) * blocks];
                for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                    prefetch_rows(w, row_bytes, r + 2, 1);
                    let mut acc = [_mm256_setzero_ps(); COLUMNS];
                    let mut acc_m = [_mm_setzero_ps(); COLUMNS];
                    for (i, b) in row.chunks_exact(144).enumerate() {
                        let u = q4_k_unpack(b);
                        for j in 0..n {
                            let (y, s32) = (&ys[j * blocks + i], &ss[j * blocks + i]);
                            let (acc, acc_m) = (&mut acc[j], &mut acc_m[j]);
                            // The min terms: ggml's four sums, each an exact integer.
                            let mins = _mm_madd_epi16(*s32, u.mins);
                            *acc_m = _mm_fmadd_ps(
                                _mm_set1_ps(-y.d * u.dmin),
                                _mm_cvtepi32_ps(mins),
                                *acc_m,
                            );
                            let sums = lane_sums(&u.values, &u.scales, y);
                            *acc = _mm256_fmadd_ps(
                                _mm256_set1_ps(y.d * u.dw),
                                _mm256_cvtepi32_ps(sums),
                                *acc,
                            );
                        }
                    }
                    for (j, (lanes, m)) in acc.iter().zip(&acc_m).take(n).enumerate() {
                        let m: [f32; 4] = std::mem::transmute(*m);
                        out[(c0 + j) * n_rows + r] =
                            hsum8(*lanes) + ((m[0] + m[2]) + (m[1] + m[3]));
                    }
                }
            }
        });
    }
}

/// `rows × columns` Q6_K products, each as `scalar::q6_k` sums it.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q6_k_rows(
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
        for c0 in (0..columns).step_by(COLUMNS) {
            let n = (columns - c0).min(COLUMNS);
            let ys = &x[c0 * blocks..(c0 + n) * blocks];
            for (r, row) in w.chunks_exact(row_bytes).enumerate() {
                prefetch_rows(w, row_bytes, r + 2, 1);
                let mut acc = [_mm256_setzero_ps(); COLUMNS];
                for (i, b) in row.chunks_exact(210).enumerate() {
                    let u = q6_k_unpack(b);
                    for (j, acc) in acc.iter_mut().take(n).enumerate() {
                        let y = &ys[j * blocks + i];
                        // The −32 offset of every value, through the activations' sums of 16.
                        let bsums = _mm256_loadu_si256(y.bsums.as_ptr().cast());
                        let offsets = _mm256_slli_epi32(_mm256_madd_epi16(bsums, u.scales16), 5);
                        let sums = _mm256_sub_epi32(lane_sums(&u.values, &u.scales, y), offsets);
                        *acc = _mm256_fmadd_ps(
                            _mm256_set1_ps(y.d * u.dw),
                            _mm256_cvtepi32_ps(sums),
                            *acc,
                        );
                    }
                }
                for (j, lanes) in acc.iter().take(n).enumerate() {
                    out[(c0 + j) * n_rows + r] = hsum8(*lanes);
                }
            }
        }
    }
}
