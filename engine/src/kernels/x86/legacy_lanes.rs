//! Batched legacy-quant products on AVX-512 VNNI with rows in lanes, for passes of
//! [`LANES_FROM`] tokens or more (fewer take the packed kernels of `packed.rs`).
//!
//! The scalar reference keeps eight float lanes per (row, column), lane `g` summing the 4-value
//! group `g` of every block scaled by that block's `dw·dy`: eight float multiply-adds per
//! block, which bound the packed kernels. Here a 512-bit register holds group `g` of 16 rows,
//! one row per 32-bit lane (a tile, repacked once per call), so one `vpdpbusd` against the
//! column's four activations broadcast from memory makes the lane sums of 16 rows, and each float
//! step (the sums to float, the multiply-add into lane `g`'s accumulator) serves 16 rows. The
//! same sums in the same order as the reference: the weights biased to unsigned as in
//! `packed.rs`, each lane sum starting from the column's correction for that group (the bias
//! times its activations, taken off exactly), taken to float through [`MAGIC`], and the eight
//! accumulators folded as `hsum8` folds them.

use std::arch::x86_64::*;
use std::cell::Cell;

use super::super::activations::{BlockQ8_0, BlockQ8_1};
use super::packed::{self, MAGIC};
use super::{f16_pair, second};

/// Rows of a tile: one per 32-bit lane of a 512-bit register.
const TILE: usize = 16;

/// Columns from which the rows-in-lanes kernels run: below, the packed kernels (see
/// BENCHMARKS.md, `engine bench --batch`).
const LANES_FROM: usize = 8;

/// Columns one walk along a tile serves (eight accumulators each, in registers).
const COLUMNS: usize = 2;

/// One block of a tile's rows, row `r` in lane `r` (rows past the matrix's end all zero).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct TileBlock {
    /// The biased weights' 4-value groups.
    groups: [[u32; TILE]; 8],
    /// Each row's scale `dw`.
    d: [f32; TILE],
    /// Each row's offset scale `m` (Q4_1; zero otherwise).
    m: [f32; TILE],
}

impl Default for TileBlock {
    fn default() -> Self {
        TileBlock {
            groups: [[0; TILE]; 8],
            d: [0.0; TILE],
            m: [0.0; TILE],
        }
    }
}

/// A column's activation block as the kernel reads it.
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct Column {
    /// Per group, where its lane sum starts ([`MAGIC`] − bias × its four activations).
    start: [i32; 8],
    /// The 32 quants.
    qs: [i8; 32],
    /// Scale.
    d: f32,
    /// Q8_1's `d·Σq` (zero for Q8_0).
    s: f32,
}

thread_local! {
    /// Each pool thread's repacked tile and prepared columns, kept between calls.
    static TILES: Cell<Vec<TileBlock>> = const { Cell::new(Vec::new()) };
    static COLUMN_BLOCKS: Cell<Vec<Column>> = const { Cell::new(Vec::new()) };
}

/// The eight lane sums' float steps for `N` columns against one tile block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn block<const N: usize, const OFFSET: bool>(
    t: &TileBlock,
    ys: [&Column; N],
    acc: &mut [[__m512; 8]; N],
    summs: &mut [__m512; N],
) {
    // SAFETY: the caller guarantees the CPU features; loads are of `t`'s and `ys`' fields.
    unsafe {
        let magic = _mm512_set1_ps(f32::from_bits(MAGIC as u32));
        let dw = _mm512_load_ps(t.d.as_ptr());
        let scales: [__m512; N] =
            std::array::from_fn(|c| _mm512_mul_ps(dw, _mm512_set1_ps(ys[c].d)));
        for (g, group) in t.groups.iter().enumerate() {
            let w = _mm512_load_si512(group.as_ptr().cast());
            for (c, y) in ys.iter().enumerate() {
                let x = i32::from_le_bytes([
                    y.qs[4 * g] as u8,
                    y.qs[4 * g + 1] as u8,
                    y.qs[4 * g + 2] as u8,
                    y.qs[4 * g + 3] as u8,
                ]);
                let sums =
                    _mm512_dpbusd_epi32(_mm512_set1_epi32(y.start[g]), w, _mm512_set1_epi32(x));
                let lanes = _mm512_sub_ps(_mm512_castsi512_ps(sums), magic);
                acc[c][g] = _mm512_fmadd_ps(scales[c], lanes, acc[c][g]);
            }
        }
        if OFFSET {
            let m = _mm512_load_ps(t.m.as_ptr());
            for c in 0..N {
                summs[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(ys[c].s), summs[c]);
            }
        }
    }
}

/// `N` columns from `c0` against the tile's `rows` rows, into `out` at row `r0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_columns<const N: usize, const OFFSET: bool>(
    tile: &[TileBlock],
    columns: &[Column],
    blocks: usize,
    c0: usize,
    (rows, n_rows): (usize, usize),
    out: &mut [f32],
) {
    // SAFETY: the caller guarantees the CPU features; the stores stay inside `out` (checked).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 8]; N];
        let mut summs = [_mm512_setzero_ps(); N];
        for (i, t) in tile.iter().enumerate() {
            let ys: [&Column; N] = std::array::from_fn(|c| &columns[(c0 + c) * blocks + i]);
            block::<N, OFFSET>(t, ys, &mut acc, &mut summs);
        }
        let mask: __mmask16 = if rows >= TILE { !0 } else { (1 << rows) - 1 };
        for (c, (l, s)) in acc.iter().zip(&summs).enumerate() {
            // `hsum8`'s fold, lane by lane, then the offset sum.
            let r = [
                _mm512_add_ps(l[0], l[4]),
                _mm512_add_ps(l[1], l[5]),
                _mm512_add_ps(l[2], l[6]),
                _mm512_add_ps(l[3], l[7]),
            ];
            let folded = _mm512_add_ps(_mm512_add_ps(r[0], r[2]), _mm512_add_ps(r[1], r[3]));
            let at = (c0 + c) * n_rows;
            assert!(at + rows <= out.len());
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(at), mask, _mm512_add_ps(folded, *s));
        }
    }
}

/// A batched kernel with rows in lanes (the `RowsFn` contract) for a legacy quant whose blocks
/// are `$bytes` long and start with an f16 pair (with `$offset`, Q4_1's d and m), whose weights
/// `$unpack` gives as unsigned values (value + `$bias`), with activations `$act` read by
/// `$parts` as (d, s, qs); fewer than [`LANES_FROM`] columns go to `$packed`.
macro_rules! lanes_rows {
    ($name:ident, $packed:path, $act:ty, $bytes:expr, $bias:expr, $offset:expr, $unpack:path,
     $parts:expr) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(super) unsafe fn $name(
            w: &[u8],
            row_bytes: usize,
            x: &[$act],
            columns: usize,
            out: &mut [f32],
        ) {
            // SAFETY: the caller guarantees the CPU features this function is compiled for
            // (AVX2, FMA, F16C and AVX-512 F, BW, VL and VNNI).
            unsafe {
                if columns < LANES_FROM {
                    return $packed(w, row_bytes, x, columns, out);
                }
                let n_rows = w.len().checked_div(row_bytes).unwrap_or(0);
                let blocks = row_bytes / $bytes;
                if n_rows == 0
                    || blocks == 0
                    || x.len() < columns * blocks
                    || out.len() < columns * n_rows
                {
                    return;
                }
                let parts: fn(&$act) -> (f32, f32, &[i8; 32]) = $parts;
                let mut prepared = COLUMN_BLOCKS.take();
                prepared.clear();
                prepared.extend(x[..columns * blocks].iter().map(|y| {
                    let (d, s, qs) = parts(y);
                    let mut start = [MAGIC; 8];
                    if $bias != 0 {
                        _mm256_storeu_si256(
                            start.as_mut_ptr().cast(),
                            packed::correction(qs, $bias),
                        );
                    }
                    Column {
                        start,
                        qs: *qs,
                        d,
                        s,
                    }
                }));
                let mut tile = TILES.take();
                tile.resize(blocks, TileBlock::default());
                let mut unpacked = [0u32; 8];
                for r0 in (0..n_rows).step_by(TILE) {
                    let rows = (n_rows - r0).min(TILE);
                    if rows < TILE {
                        // The lanes past the matrix's end sum zeros.
                        tile.fill(TileBlock::default());
                    }
                    for (i, t) in tile.iter_mut().enumerate() {
                        for r in 0..rows {
                            let at = (r0 + r) * row_bytes + i * $bytes;
                            let b = &w[at..at + $bytes];
                            _mm256_storeu_si256(unpacked.as_mut_ptr().cast(), $unpack(b));
                            for (group, word) in t.groups.iter_mut().zip(unpacked) {
                                group[r] = word;
                            }
                            let dm = f16_pair(b);
                            t.d[r] = _mm_cvtss_f32(dm);
                            if $offset {
                                t.m[r] = second(dm);
                            }
                        }
                    }
                    let span = (rows, n_rows);
                    let out = &mut out[r0..];
                    for c0 in (0..columns).step_by(COLUMNS) {
                        if columns - c0 == 1 {
                            tile_columns::<1, $offset>(&tile, &prepared, blocks, c0, span, out);
                        } else {
                            tile_columns::<COLUMNS, $offset>(
                                &tile, &prepared, blocks, c0, span, out,
                            );
                        }
                    }
                }
                TILES.set(tile);
                COLUMN_BLOCKS.set(prepared);
            }
        }
    };
}

lanes_rows!(
    q4_0_rows,
    packed::q4_0_rows,
    BlockQ8_0,
    18,
    8,
    false,
    packed::q4_0_unsigned,
    packed::q8_0_parts
);
lanes_rows!(
    q4_1_rows,
    packed::q4_1_rows,
    BlockQ8_1,
    20,
    0,
    true,
    packed::q4_1_unsigned,
    packed::q8_1_parts
);
lanes_rows!(
    q5_0_rows,
    packed::q5_0_rows,
    BlockQ8_0,
    22,
    16,
    false,
    packed::q5_0_unsigned,
    packed::q8_0_parts
);
lanes_rows!(
    q8_0_rows,
    packed::q8_0_rows,
    BlockQ8_0,
    34,
    128,
    false,
    packed::q8_0_unsigned,
    packed::q8_0_parts
);
