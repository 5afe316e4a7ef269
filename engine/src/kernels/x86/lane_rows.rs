//! Q4_K and Q6_K products over the sixteen-rows-side-by-side copy (`kernels::row_lanes`), for
//! any number of columns: one register lane per row, so a block's four values of sixteen rows
//! meet a column's four broadcast activations in one instruction, and each row's scales are
//! multiplied in its own lane. AVX-512 VNNI takes the sixteen rows in one register
//! (`vpdpbusd`); AVX2 takes them as two halves of eight (`vpmaddubsw` then `vpmaddwd`).
//!
//! The integer sums are exact and each lane makes its row's float steps in the reference's
//! order (`scalar::q4_k`, `scalar::q6_k`), so every result has the reference's bits.

use std::arch::x86_64::*;

use super::super::activations::BlockQ8K;
use super::super::row_lanes::ROWS;

/// A register of rows side by side: the operations the two kernels need.
trait Lanes {
    /// Rows per register.
    const LANES: usize;
    type I: Copy;
    type F: Copy;
    /// `LANES` 32-bit words.
    unsafe fn load(p: *const u8) -> Self::I;
    /// `LANES` signed bytes, widened.
    unsafe fn bytes(p: *const u8) -> Self::I;
    /// `LANES` f16 values, widened.
    unsafe fn halves(p: *const u8) -> Self::F;
    unsafe fn splat(v: i32) -> Self::I;
    /// `acc` plus, in each lane, the four products of its unsigned bytes in `v` with the
    /// signed bytes of `y`.
    unsafe fn dot4(acc: Self::I, v: Self::I, y: i32) -> Self::I;
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn sub(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn mul(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn shr2(a: Self::I) -> Self::I;
    unsafe fn shr4(a: Self::I) -> Self::I;
    unsafe fn shr8(a: Self::I) -> Self::I;
    unsafe fn shl2(a: Self::I) -> Self::I;
    unsafe fn shl4(a: Self::I) -> Self::I;
    unsafe fn float(a: Self::I) -> Self::F;
    unsafe fn fsplat(v: f32) -> Self::F;
    unsafe fn fmul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn fma(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    unsafe fn fsub(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn store(a: Self::F, out: &mut [f32]);
}

/// Sixteen rows in a 512-bit register, products fused (AVX-512 VNNI).
struct Zmm;

/// Eight rows in a 256-bit register (AVX2).
struct Ymm;

// SAFETY (every method of both): callers run only where the features of the kernels below are
// enabled; every pointer read stays inside the lanes copy (the kernels check the sizes).
impl Lanes for Zmm {
    const LANES: usize = 16;
    type I = __m512i;
    type F = __m512;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m512i {
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[inline(always)]
    unsafe fn bytes(p: *const u8) -> __m512i {
        unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> __m512 {
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
    #[inline(always)]
    unsafe fn splat(v: i32) -> __m512i {
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn dot4(acc: __m512i, v: __m512i, y: i32) -> __m512i {
        unsafe { _mm512_dpbusd_epi32(acc, v, _mm512_set1_epi32(y)) }
    }
    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_and_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_or_si512(a, b) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn shr2(a: __m512i) -> __m512i {
        unsafe { _mm512_srli_epi32::<2>(a) }
    }
    #[inline(always)]
    unsafe fn shr4(a: __m512i) -> __m512i {
        unsafe { _mm512_srli_epi32::<4>(a) }
    }
    #[inline(always)]
    unsafe fn shr8(a: __m512i) -> __m512i {
        unsafe { _mm512_srli_epi32::<8>(a) }
    }
    #[inline(always)]
    unsafe fn shl2(a: __m512i) -> __m512i {
        unsafe { _mm512_slli_epi32::<2>(a) }
    }
    #[inline(always)]
    unsafe fn shl4(a: __m512i) -> __m512i {
        unsafe { _mm512_slli_epi32::<4>(a) }
    }
    #[inline(always)]
    unsafe fn float(a: __m512i) -> __m512 {
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn fsplat(v: f32) -> __m512 {
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn fmul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fsub(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn store(a: __m512, out: &mut [f32]) {
        assert!(out.len() >= 16);
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), a) }
    }
}

impl Lanes for Ymm {
    const LANES: usize = 8;
    type I = __m256i;
    type F = __m256;
    #[inline(always)]
    unsafe fn load(p: *const u8) -> __m256i {
        unsafe { _mm256_loadu_si256(p.cast()) }
    }
    #[inline(always)]
    unsafe fn bytes(p: *const u8) -> __m256i {
        unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.cast())) }
    }
    #[inline(always)]
    unsafe fn halves(p: *const u8) -> __m256 {
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[inline(always)]
    unsafe fn splat(v: i32) -> __m256i {
        unsafe { _mm256_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, v: __m256i, y: i32) -> __m256i {
        // Pairs of products stay within i16: at most 2 · 63 · 128.
        unsafe {
            let pairs = _mm256_maddubs_epi16(v, _mm256_set1_epi32(y));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_and_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_or_si256(a, b) }
    }
    #[inline(always)]
    unsafe fn add(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_sub_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_mullo_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn shr2(a: __m256i) -> __m256i {
        unsafe { _mm256_srli_epi32::<2>(a) }
    }
    #[inline(always)]
    unsafe fn shr4(a: __m256i) -> __m256i {
        unsafe { _mm256_srli_epi32::<4>(a) }
    }
    #[inline(always)]
    unsafe fn shr8(a: __m256i) -> __m256i {
        unsafe { _mm256_srli_epi32::<8>(a) }
    }
    #[inline(always)]
    unsafe fn shl2(a: __m256i) -> __m256i {
        unsafe { _mm256_slli_epi32::<2>(a) }
    }
    #[inline(always)]
    unsafe fn shl4(a: __m256i) -> __m256i {
        unsafe { _mm256_slli_epi32::<4>(a) }
    }
    #[inline(always)]
    unsafe fn float(a: __m256i) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn fsplat(v: f32) -> __m256 {
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn fmul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fsub(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn store(a: __m256, out: &mut [f32]) {
        assert!(out.len() >= 8);
        unsafe { _mm256_storeu_ps(out.as_mut_ptr(), a) }
    }
}

/// Columns taken together in one walk over a group's blocks.
const COLUMNS: usize = 4;

/// How far ahead of each load a kernel asks for the copy's bytes. One core's hardware
/// prefetchers alone left generation at two thirds of the memory's speed (Qwen 3.5 4B's
/// shapes, one thread: 3.8 tokens/s without, 5.2 with; 1 to 3 KiB all measured alike).
const PREFETCH_AHEAD: usize = 2048;

/// Asks for the cache line `PREFETCH_AHEAD` bytes past `p`; never faults, even past the copy.
#[inline(always)]
unsafe fn prefetch(p: *const u8) {
    // SAFETY: a prefetch is a hint: it reads nothing the program sees and never faults.
    unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_AHEAD).cast()) }
}

/// Activation word `t` (values `4t..4t + 4`) of a block.
#[inline(always)]
fn word(y: &BlockQ8K, t: usize) -> i32 {
    let q = &y.qs[4 * t..4 * t + 4];
    i32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8])
}

/// Sixteen rows' Q4_K block at `p` (half `h` of the lanes) against `N` columns: each column's
/// `(sumi, summ)` as `scalar::k_sums` makes them.
#[inline(always)]
unsafe fn q4_k_block<L: Lanes, const N: usize>(
    p: *const u8,
    h: usize,
    ys: &[&BlockQ8K; N],
) -> ([L::I; N], [L::I; N]) {
    // SAFETY: see the trait's implementations; `p` starts a whole block of the copy.
    unsafe {
        let words = 4 * L::LANES * h;
        let (mut a, mut b, mut c) = (
            L::load(p.add(64 + words)),
            L::load(p.add(128 + words)),
            L::load(p.add(192 + words)),
        );
        // The 6-bit scales and mins of the eight sub-blocks, one byte of each word at a time.
        let (m63, m15, m48) = (L::splat(63), L::splat(15), L::splat(0x30));
        let mut sc = [L::splat(0); 8];
        let mut mn = [L::splat(0); 8];
        for t in 0..4 {
            sc[t] = L::and(a, m63);
            mn[t] = L::and(b, m63);
            sc[4 + t] = L::or(L::and(c, m15), L::and(L::shr2(a), m48));
            mn[4 + t] = L::or(L::and(L::shr4(c), m15), L::and(L::shr2(b), m48));
            (a, b, c) = (L::shr8(a), L::shr8(b), L::shr8(c));
        }
        let nibbles = L::splat(0x0f0f_0f0f);
        let mut sumi = [L::splat(0); N];
        for j in 0..4 {
            let mut lo = [L::splat(0); N];
            let mut hi = [L::splat(0); N];
            for k in 0..8 {
                let q = L::load(p.add(256 + 64 * (8 * j + k) + words));
                prefetch(p.add(256 + 64 * (8 * j + k) + words));
                let (vlo, vhi) = (L::and(q, nibbles), L::and(L::shr4(q), nibbles));
                for (col, y) in ys.iter().enumerate() {
                    lo[col] = L::dot4(lo[col], vlo, word(y, 16 * j + k));
                    hi[col] = L::dot4(hi[col], vhi, word(y, 16 * j + 8 + k));
                }
            }
            for col in 0..N {
                let scaled = L::add(L::mul(lo[col], sc[2 * j]), L::mul(hi[col], sc[2 * j + 1]));
                sumi[col] = L::add(sumi[col], scaled);
            }
        }
        let mut summ = [L::splat(0); N];
        for (col, y) in ys.iter().enumerate() {
            for (j, m) in mn.iter().enumerate() {
                let pair = i32::from(y.bsums[2 * j]) + i32::from(y.bsums[2 * j + 1]);
                summ[col] = L::add(summ[col], L::mul(*m, L::splat(pair)));
            }
        }
        (sumi, summ)
    }
}

/// Sixteen rows' Q6_K block at `p` (half `h` of the lanes) against `N` columns: each
/// column's Σ scale · (value − 32) · activation, as `scalar::q6_k` makes it. The copy holds
/// the words in the order read here, three at a time (`row_lanes`).
#[inline(always)]
unsafe fn q6_k_block<L: Lanes, const N: usize>(
    p: *const u8,
    h: usize,
    ys: &[&BlockQ8K; N],
) -> [L::I; N] {
    // SAFETY: see the trait's implementations; `p` starts a whole block of the copy.
    unsafe {
        let words = 4 * L::LANES * h;
        let (low, high) = (L::splat(0x0f0f_0f0f), L::splat(0x3030_3030));
        let mut sumi = [L::splat(0); N];
        for half in 0..2 {
            for quarter in 0..2 {
                // Parts of the four groups of 16 values these words feed.
                let mut part = [[L::splat(0); 4]; N];
                for k in 4 * quarter..4 * quarter + 4 {
                    let triple = p.add(192 * (8 * half + k) + words);
                    for line in 0..3 {
                        prefetch(triple.add(64 * line));
                    }
                    let (qa, qb, qh) = (
                        L::load(triple),
                        L::load(triple.add(64)),
                        L::load(triple.add(128)),
                    );
                    let v = [
                        L::or(L::and(qa, low), L::and(L::shl4(qh), high)),
                        L::or(L::and(qb, low), L::and(L::shl2(qh), high)),
                        L::or(L::and(L::shr4(qa), low), L::and(qh, high)),
                        L::or(L::and(L::shr4(qb), low), L::and(L::shr2(qh), high)),
                    ];
                    for (col, y) in ys.iter().enumerate() {
                        for (e, v) in v.iter().enumerate() {
                            let t = 32 * half + 8 * e + k;
                            part[col][e] = L::dot4(part[col][e], *v, word(y, t));
                        }
                    }
                }
                for e in 0..4 {
                    let group = 8 * half + 2 * e + quarter;
                    let scale = L::bytes(p.add(3072 + 16 * group + L::LANES * h));
                    for (col, (y, part)) in ys.iter().zip(&part).enumerate() {
                        let offset = L::splat(32 * i32::from(y.bsums[group]));
                        let scaled = L::mul(L::sub(part[e], offset), scale);
                        sumi[col] = L::add(sumi[col], scaled);
                    }
                }
            }
        }
        sumi
    }
}

/// What a kernel walks: the copy's groups of sixteen rows against `columns` columns of `x`
/// (by column, then block), results into `out` (by column, then row).
struct Walk<'a> {
    w: &'a [u8],
    row_bytes: usize,
    x: &'a [BlockQ8K],
    columns: usize,
}

impl Walk<'_> {
    /// Rows, and blocks per row (the sizes every read relies on, checked).
    fn shape(&self, block: usize, out: &[f32]) -> (usize, usize) {
        let n_rows = self.w.len() / self.row_bytes.max(1);
        let blocks = self.row_bytes / block;
        assert!(
            self.row_bytes.is_multiple_of(block)
                && n_rows.is_multiple_of(ROWS)
                && self.w.len() == n_rows * self.row_bytes
                && self.x.len() >= blocks * self.columns
                && out.len() >= n_rows * self.columns,
            "a lanes product's sizes do not match"
        );
        (n_rows, blocks)
    }
}

/// Rows of lanes registers per group: two for eight-lane registers.
const MAX_HALVES: usize = 2;

/// `N` columns from `c0` of a Q4_K lanes copy.
#[inline(always)]
unsafe fn q4_k<L: Lanes, const N: usize>(walk: &Walk<'_>, c0: usize, out: &mut [f32]) {
    let (n_rows, blocks) = walk.shape(144, out);
    let halves = ROWS / L::LANES;
    // SAFETY: sizes checked by `shape`; the features by the caller.
    unsafe {
        for g in 0..n_rows / ROWS {
            let base = walk.w.as_ptr().add(g * ROWS * walk.row_bytes);
            let mut first = [[L::fsplat(0.0); N]; MAX_HALVES];
            let mut second = [[L::fsplat(0.0); N]; MAX_HALVES];
            for i in 0..blocks {
                let p = base.add(i * ROWS * 144);
                let ys: [&BlockQ8K; N] = std::array::from_fn(|c| &walk.x[(c0 + c) * blocks + i]);
                for h in 0..halves {
                    let (sumi, summ) = q4_k_block::<L, N>(p, h, &ys);
                    let d = L::halves(p.add(2 * L::LANES * h));
                    let dmin = L::halves(p.add(32 + 2 * L::LANES * h));
                    for (c, y) in ys.iter().enumerate() {
                        let dy = L::fsplat(y.d);
                        first[h][c] = L::fma(L::float(sumi[c]), L::fmul(dy, d), first[h][c]);
                        second[h][c] = L::fma(L::float(summ[c]), L::fmul(dy, dmin), second[h][c]);
                    }
                }
            }
            for h in 0..halves {
                for c in 0..N {
                    let at = (c0 + c) * n_rows + g * ROWS + h * L::LANES;
                    L::store(L::fsub(first[h][c], second[h][c]), &mut out[at..]);
                }
            }
        }
    }
}

/// `N` columns from `c0` of a Q6_K lanes copy.
#[inline(always)]
unsafe fn q6_k<L: Lanes, const N: usize>(walk: &Walk<'_>, c0: usize, out: &mut [f32]) {
    let (n_rows, blocks) = walk.shape(210, out);
    let halves = ROWS / L::LANES;
    // SAFETY: sizes checked by `shape`; the features by the caller.
    unsafe {
        for g in 0..n_rows / ROWS {
            let base = walk.w.as_ptr().add(g * ROWS * walk.row_bytes);
            let mut sums = [[L::fsplat(0.0); N]; MAX_HALVES];
            for i in 0..blocks {
                let p = base.add(i * ROWS * 210);
                let ys: [&BlockQ8K; N] = std::array::from_fn(|c| &walk.x[(c0 + c) * blocks + i]);
                for (h, sums) in sums.iter_mut().enumerate().take(halves) {
                    let sumi = q6_k_block::<L, N>(p, h, &ys);
                    let d = L::halves(p.add(3328 + 2 * L::LANES * h));
                    for ((sum, y), sumi) in sums.iter_mut().zip(&ys).zip(sumi) {
                        let scale = L::fmul(L::fsplat(y.d), d);
                        *sum = L::fma(L::float(sumi), scale, *sum);
                    }
                }
            }
            for (h, sums) in sums.iter().enumerate().take(halves) {
                for (c, sum) in sums.iter().enumerate() {
                    let at = (c0 + c) * n_rows + g * ROWS + h * L::LANES;
                    L::store(*sum, &mut out[at..]);
                }
            }
        }
    }
}

/// Every column of `$walk` through `$kernel::<$lanes, N>`, [`COLUMNS`] at a time.
macro_rules! in_column_chunks {
    ($kernel:ident, $lanes:ty, $walk:expr, $out:expr) => {{
        let walk = $walk;
        for c0 in (0..walk.columns).step_by(COLUMNS) {
            match walk.columns - c0 {
                1 => $kernel::<$lanes, 1>(&walk, c0, $out),
                2 => $kernel::<$lanes, 2>(&walk, c0, $out),
                3 => $kernel::<$lanes, 3>(&walk, c0, $out),
                _ => $kernel::<$lanes, COLUMNS>(&walk, c0, $out),
            }
        }
    }};
}

/// The four entry points: `rows × columns` products of a lanes copy (`w`, whole groups of
/// sixteen rows of `row_bytes` stored bytes each), `x` by column then block, `out` by column
/// then row.
macro_rules! entry {
    ($name:ident, $kernel:ident, $lanes:ty, $features:literal) => {
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name(
            w: &[u8],
            row_bytes: usize,
            x: &[BlockQ8K],
            columns: usize,
            out: &mut [f32],
        ) {
            let walk = Walk {
                w,
                row_bytes,
                x,
                columns,
            };
            // SAFETY: the caller guarantees the CPU features this function is compiled for.
            unsafe { in_column_chunks!($kernel, $lanes, walk, out) }
        }
    };
}

entry!(q4_k_avx2, q4_k, Ymm, "avx2,fma,f16c");
entry!(q6_k_avx2, q6_k, Ymm, "avx2,fma,f16c");
entry!(
    q4_k_vnni,
    q4_k,
    Zmm,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);
entry!(
    q6_k_vnni,
    q6_k,
    Zmm,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);
