//! Q4_K and Q6_K products for one to [`MAX_COLUMNS`] columns (a token's step, a draft's
//! check): four rows at a time in the row layout.
//!
//! A block adds exact integer sums to each row's float sums (`scalar::k_step`). Taken one row
//! at a time, every (row, column, block) ended in two horizontal folds of eight lanes and scalar
//! float steps, and generation on E2B's shapes spent 91 % of its time in that kernel, short of
//! the memory's speed (perf, `engine bench -p 0 -n 32 -t 1`). Here four rows' lane sums fold
//! together (a transposing fold: eight sums in nine instructions), and their float steps are one
//! 256-bit fused multiply-add, `[sumi · 4 | summ · 4]` against `[dy·d · 4 | dy·dmin · 4]`. Each
//! lane makes the reference's float step of its row, so every result has the reference's bits.

use std::arch::x86_64::*;

use super::super::activations::BlockQ8K;
use super::{Q4K, Q6K, load32, madd_add, madd_add_vnni, q4_k_unpack, q6_k_unpack};

/// Most columns this layout serves; more go to the batched kernels.
pub(super) const MAX_COLUMNS: usize = 5;

/// Rows folded together.
const ROWS: usize = 4;

/// `acc + s ⊙ p` summed in pairs into 32-bit lanes: fused into `vpdpwssd` with `VNNI`.
#[inline(always)]
unsafe fn weighted<const VNNI: bool>(acc: __m256i, s: __m256i, p: __m256i) -> __m256i {
    // SAFETY: the caller guarantees the CPU features (AVX-512 VNNI and VL with `VNNI`).
    unsafe {
        if VNNI {
            madd_add_vnni(acc, s, p)
        } else {
            madd_add(acc, s, p)
        }
    }
}

/// Σ scale · value · activation over a block's eight chunks against each column, two
/// accumulators a column so the multiply-add chains are half as long.
#[inline(always)]
unsafe fn chunk_sums<const VNNI: bool, const N: usize>(
    values: &[__m256i; 8],
    scales: &[__m256i; 8],
    ys: &[&BlockQ8K; N],
) -> [__m256i; N] {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let mut even = [_mm256_setzero_si256(); N];
        let mut odd = [_mm256_setzero_si256(); N];
        for k in 0..8 {
            for (c, y) in ys.iter().enumerate() {
                let q8 = load32(super::cast_i8(&y.qs[32 * k..32 * k + 32]));
                let p = _mm256_maddubs_epi16(values[k], q8);
                let acc = if k % 2 == 0 {
                    &mut even[c]
                } else {
                    &mut odd[c]
                };
                *acc = weighted::<VNNI>(*acc, scales[k], p);
            }
        }
        for (e, o) in even.iter_mut().zip(odd) {
            *e = _mm256_add_epi32(*e, o);
        }
        even
    }
}

/// The four rows' sums of `a`, then of `b`, each over its eight lanes.
#[inline(always)]
unsafe fn fold_rows(a: [__m256i; ROWS], b: [__m256i; ROWS]) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        // Per 128-bit half: [Σ of the half of rows 0, 1, 2, 3].
        let a = _mm256_hadd_epi32(_mm256_hadd_epi32(a[0], a[1]), _mm256_hadd_epi32(a[2], a[3]));
        let b = _mm256_hadd_epi32(_mm256_hadd_epi32(b[0], b[1]), _mm256_hadd_epi32(b[2], b[3]));
        _mm256_add_epi32(
            _mm256_permute2x128_si256::<0x20>(a, b),
            _mm256_permute2x128_si256::<0x31>(a, b),
        )
    }
}

/// The f16 pairs at the start of the four rows' blocks as `[first · 4 | second · 4]`.
#[inline(always)]
unsafe fn block_scales(blocks: &[&[u8]; ROWS]) -> __m256 {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        // SAFETY (the reads): every block is at least four bytes long.
        let pair = |r: usize| {
            assert!(blocks[r].len() >= 4);
            std::ptr::read_unaligned(blocks[r].as_ptr().cast::<i32>())
        };
        let halves = _mm_setr_epi32(pair(0), pair(1), pair(2), pair(3));
        let interleaved = _mm256_cvtph_ps(halves);
        _mm256_permutevar8x32_ps(interleaved, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7))
    }
}

/// The four rows of a group (the missing ones repeating the last), `live` of them real.
#[inline]
fn group(w: &[u8], row_bytes: usize, first: usize, live: usize) -> [&[u8]; ROWS] {
    let row = |r: usize| {
        let at = (first + r.min(live - 1)) * row_bytes;
        &w[at..at + row_bytes]
    };
    [row(0), row(1), row(2), row(3)]
}

/// Stores each column's results of a group: lanes 0–3 hold the rows' first sums, 4–7 their
/// second, and the result is their difference, as the reference's.
#[inline(always)]
unsafe fn store_group(
    sums: &[__m256],
    live: usize,
    out: &mut [f32],
    (n_rows, first): (usize, usize),
) {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        for (c, s) in sums.iter().enumerate() {
            let mut results = [0f32; ROWS];
            let difference = _mm_sub_ps(_mm256_castps256_ps128(*s), _mm256_extractf128_ps(*s, 1));
            _mm_storeu_ps(results.as_mut_ptr(), difference);
            let at = c * n_rows + first;
            out[at..at + live].copy_from_slice(&results[..live]);
        }
    }
}

/// `rows × N` products of a K-quant of `$bytes`-byte blocks: `w`'s rows in groups of four,
/// `$step` adding block `$i` of the group's `$blocks` against the columns `$ys` to `$sums`.
/// A macro, not a function taking a closure: a closure's intrinsics are not inlined.
macro_rules! row_groups {
    (
        $name:ident, $bytes:expr,
        |$blocks:ident, $ys:ident, $sums:ident| $step:block
    ) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name<const VNNI: bool, const N: usize>(
            w: &[u8],
            row_bytes: usize,
            x: &[BlockQ8K],
            out: &mut [f32],
        ) {
            // SAFETY: the caller guarantees the CPU features this function is compiled for.
            unsafe {
                let n_rows = w.len() / row_bytes.max(1);
                let blocks = x.len() / N;
                if n_rows == 0 || blocks == 0 {
                    return;
                }
                for first in (0..n_rows).step_by(ROWS) {
                    let live = (n_rows - first).min(ROWS);
                    let rows = group(w, row_bytes, first, live);
                    // The next group's rows come into the cache a share per block: the
                    // hardware prefetcher does not follow four interleaved streams, and asking
                    // for them all at once stalls on the misses in flight.
                    let next = w.as_ptr().wrapping_add((first + ROWS) * row_bytes);
                    let share = (ROWS * row_bytes).div_ceil(blocks).next_multiple_of(64);
                    let mut $sums = [_mm256_setzero_ps(); N];
                    for i in 0..blocks {
                        let at = $bytes * i;
                        for line in (0..share).step_by(64) {
                            // A prefetch reads nothing and never faults, past the end included.
                            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(i * share + line).cast());
                        }
                        let $blocks: [&[u8]; ROWS] = [
                            &rows[0][at..at + $bytes],
                            &rows[1][at..at + $bytes],
                            &rows[2][at..at + $bytes],
                            &rows[3][at..at + $bytes],
                        ];
                        let mut $ys = [&x[i]; N];
                        for (c, y) in $ys.iter_mut().enumerate() {
                            *y = &x[c * blocks + i];
                        }
                        $step
                    }
                    store_group(&$sums, live, out, (n_rows, first));
                }
            }
        }
    };
}

// `rows × N` Q4_K products, each as `scalar::q4_k` sums it.
row_groups!(q4_k, 144, |blocks, ys, sums| {
    let mut sumi = [[_mm256_setzero_si256(); ROWS]; N];
    let mut summ = [[_mm256_setzero_si256(); ROWS]; N];
    for (r, b) in blocks.iter().enumerate() {
        let u: Q4K = q4_k_unpack(b);
        let row = chunk_sums::<VNNI, N>(&u.values, &u.scales, &ys);
        for (c, y) in ys.iter().enumerate() {
            sumi[c][r] = row[c];
            let bsums = _mm256_loadu_si256(y.bsums.as_ptr().cast());
            summ[c][r] = _mm256_madd_epi16(bsums, u.mins);
        }
    }
    let d = block_scales(&blocks);
    for (c, y) in ys.iter().enumerate() {
        let integers = _mm256_cvtepi32_ps(fold_rows(sumi[c], summ[c]));
        let scales = _mm256_mul_ps(_mm256_set1_ps(y.d), d);
        sums[c] = _mm256_fmadd_ps(integers, scales, sums[c]);
    }
});

// `rows × N` Q6_K products, each as `scalar::q6_k` sums it: one float sum a row, so the second
// half of each column's lanes stays zero.
row_groups!(q6_k, 210, |blocks, ys, sums| {
    let mut sumi = [[_mm256_setzero_si256(); ROWS]; N];
    let mut dw = [0i32; ROWS];
    for (r, b) in blocks.iter().enumerate() {
        let u: Q6K = q6_k_unpack(b);
        let row = chunk_sums::<VNNI, N>(&u.values, &u.scales, &ys);
        for (c, y) in ys.iter().enumerate() {
            // The −32 offset of every value, through the activations' sums of 16.
            let bsums = _mm256_loadu_si256(y.bsums.as_ptr().cast());
            let offsets = _mm256_slli_epi32(_mm256_madd_epi16(bsums, u.scales16), 5);
            sumi[c][r] = _mm256_sub_epi32(row[c], offsets);
        }
        dw[r] = i32::from(u16::from_le_bytes([b[208], b[209]]));
    }
    // [d · 4 | 0 · 4]
    let d = _mm256_cvtph_ps(_mm_setr_epi32(dw[0], dw[1], dw[2], dw[3]));
    let d = _mm256_permutevar8x32_ps(d, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    let zero = [_mm256_setzero_si256(); ROWS];
    for (c, y) in ys.iter().enumerate() {
        let integers = _mm256_cvtepi32_ps(fold_rows(sumi[c], zero));
        let scales = _mm256_mul_ps(_mm256_set1_ps(y.d), d);
        sums[c] = _mm256_fmadd_ps(integers, scales, sums[c]);
    }
});

/// The kernel for `columns` (1 to [`MAX_COLUMNS`]) of Q4_K or Q6_K: `$kernel::<VNNI, N>`.
macro_rules! by_columns {
    ($kernel:ident, $vnni:expr, $w:expr, $rb:expr, $x:expr, $columns:expr, $out:expr) => {
        match $columns {
            1 => $kernel::<$vnni, 1>($w, $rb, $x, $out),
            2 => $kernel::<$vnni, 2>($w, $rb, $x, $out),
            3 => $kernel::<$vnni, 3>($w, $rb, $x, $out),
            4 => $kernel::<$vnni, 4>($w, $rb, $x, $out),
            _ => $kernel::<$vnni, MAX_COLUMNS>($w, $rb, $x, $out),
        }
    };
}

/// `rows × columns` Q4_K products for 1 to [`MAX_COLUMNS`] columns on AVX2 (`x` by column,
/// then block; `out` by column, then row).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_avx2(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    columns: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { by_columns!(q4_k, false, w, rb, x, columns, out) }
}

/// [`q4_k_avx2`] with the multiply-adds fused (AVX-512 VNNI and VL).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_k_vnni(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    columns: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller guarantees the CPU features, AVX-512 VNNI and VL included.
    unsafe { by_columns!(q4_k, true, w, rb, x, columns, out) }
}

/// `rows × columns` Q6_K products for 1 to [`MAX_COLUMNS`] columns on AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_avx2(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    columns: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { by_columns!(q6_k, false, w, rb, x, columns, out) }
}

/// [`q6_k_avx2`] with the multiply-adds fused (AVX-512 VNNI and VL).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_vnni(
    w: &[u8],
    rb: usize,
    x: &[BlockQ8K],
    columns: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller guarantees the CPU features, AVX-512 VNNI and VL included.
    unsafe { by_columns!(q6_k, true, w, rb, x, columns, out) }
}
