//! Batched Q4_K and Q6_K products on AVX-512 (BW and VNNI), for passes of two or more tokens
//! (prefill, checking drafts): rows in lanes.
//!
//! A block adds two exact integer sums to a row's two float sums (`scalar::k_step`);
//! integers add up the same in any order, so a kernel is free in how it gathers them. The row kernels (`x86.rs`) keep one row's 32-bit lanes per register and fold
//! them per block, which costs a fold and a scale multiply per (row, column, block) and leaves
//! the integer units a quarter idle on multiply-add chains. Here a register holds one 4-value
//! group of 16 rows, one row per 32-bit lane (a tile), and each column's four activations of that
//! group are broadcast from memory into `vpdpbusd`: 64 multiply-adds per instruction, the
//! sub-block's scales one `vpmulld` per 16 rows, the float steps once per 16 rows. The tile is
//! repacked from the rows once per call and serves every column; four columns share each load
//! of it. Fewer columns (a token's step, a draft's check) do not pay back the repacking: they
//! take `x86/k_quads.rs`, which the dispatcher (`x86.rs`) picks up to its `MAX_COLUMNS`.

use std::arch::x86_64::*;
use std::cell::{Cell, RefCell};

use super::super::activations::BlockQ8K;
use super::super::k_tile::KTile;

/// Rows of a tile: one per 32-bit lane of a 512-bit register.
const TILE: usize = 16;

/// Columns one walk along a tile serves, sharing each load of its groups.
const COLUMNS: usize = 4;

/// One weight block of a tile's rows, each row in its own 32-bit lane, with the offset terms'
/// weights as `vpdpwssd` takes them: two i16 per lane, Q4_K's mins (2i, 2i + 1) against the
/// activations' sums of 32, Q6_K's scales (2i, 2i + 1) against its sums of 16.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct TileBlock {
    k: KTile<TILE>,
    pairs: [[u32; TILE]; 8],
}

thread_local! {
    /// Each pool thread's repacked tile, kept between calls.
    static TILE_BLOCKS: Cell<Vec<TileBlock>> = const { Cell::new(Vec::new()) };
    /// The activations' sums of 32 as i16 pairs (2i, 2i + 1), per block, for Q4_K's mins.
    static SUMS32: RefCell<Vec<[u32; 4]>> = const { RefCell::new(Vec::new()) };
}

/// Two i16 in one 32-bit lane (`lo` first in memory).
fn pair(lo: i32, hi: i32) -> u32 {
    u32::from(lo as i16 as u16) | (u32::from(hi as i16 as u16) << 16)
}

/// A K-quant format as the rows-in-lanes kernel takes it.
trait Format {
    /// Bytes per block.
    const BYTES: usize;
    /// Puts row `r`'s block `b` into lane `r` of `tile`.
    fn repack(tile: &mut TileBlock, r: usize, b: &[u8]);
    /// Adds one block against `N` columns (`ys`, `extra`: their activation blocks and
    /// per-block sums) to their two sums `acc` (`scalar::k_step`), one lane per row of `tile`.
    ///
    /// # Safety
    /// The CPU must have AVX-512 F, BW and VNNI.
    unsafe fn block<const N: usize>(
        tile: &TileBlock,
        ys: [&BlockQ8K; N],
        extra: [&[u32; 4]; N],
        acc: &mut [[__m512; 2]; N],
    );
}

/// A 32-bit word of `bytes` at `at`, as a broadcast operand.
#[inline]
fn word(bytes: &[i8], at: usize) -> i32 {
    i32::from_le_bytes([
        bytes[at] as u8,
        bytes[at + 1] as u8,
        bytes[at + 2] as u8,
        bytes[at + 3] as u8,
    ])
}

/// Σ over `subs` sub-blocks of `groups` 4-value groups each: scale × (values · activations),
/// for `N` columns, every row in its lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn scaled_sums<const N: usize>(
    tile: &TileBlock,
    ys: [&BlockQ8K; N],
    subs: usize,
    groups: usize,
) -> [__m512i; N] {
    // SAFETY: the caller guarantees the CPU features; every load is of a field of `tile`.
    unsafe {
        let mut sums = [_mm512_setzero_si512(); N];
        for s in 0..subs {
            let mut chunk = [_mm512_setzero_si512(); N];
            for g in 0..groups {
                let k = s * groups + g;
                let w = _mm512_load_si512(tile.k.groups[k].as_ptr().cast());
                for (c, y) in ys.iter().enumerate() {
                    let x = _mm512_set1_epi32(word(&y.qs, 4 * k));
                    chunk[c] = _mm512_dpbusd_epi32(chunk[c], w, x);
                }
            }
            let scale = _mm512_load_si512(tile.k.scales[s].as_ptr().cast());
            for c in 0..N {
                sums[c] = _mm512_add_epi32(sums[c], _mm512_mullo_epi32(chunk[c], scale));
            }
        }
        sums
    }
}

/// Σ over `n` lanes' i16 pairs of `tile.pairs` times the columns' pairs `x(c, i)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn pair_sums<const N: usize>(
    tile: &TileBlock,
    n: usize,
    x: impl Fn(usize, usize) -> u32,
) -> [__m512i; N] {
    // SAFETY: the caller guarantees the CPU features; every load is of a field of `tile`.
    unsafe {
        let mut sums = [_mm512_setzero_si512(); N];
        for i in 0..n {
            let p = _mm512_load_si512(tile.pairs[i].as_ptr().cast());
            for (c, sum) in sums.iter_mut().enumerate() {
                *sum = _mm512_dpwssd_epi32(*sum, p, _mm512_set1_epi32(x(c, i) as i32));
            }
        }
        sums
    }
}

/// Q4_K in a tile.
struct Q4K;

impl Format for Q4K {
    const BYTES: usize = 144;

    fn repack(tile: &mut TileBlock, r: usize, b: &[u8]) {
        tile.k.put_q4_k(r, b);
        for (i, pairs) in tile.pairs[..4].iter_mut().enumerate() {
            pairs[r] = pair(tile.k.mins[2 * i][r], tile.k.mins[2 * i + 1][r]);
        }
    }

    #[inline]
    unsafe fn block<const N: usize>(
        tile: &TileBlock,
        ys: [&BlockQ8K; N],
        extra: [&[u32; 4]; N],
        acc: &mut [[__m512; 2]; N],
    ) {
        // SAFETY: the caller guarantees the CPU features; loads are of `tile`'s fields.
        unsafe {
            let sumi = scaled_sums::<N>(tile, ys, 8, 8);
            let summ = pair_sums::<N>(tile, 4, |c, i| extra[c][i]);
            let (d, dmin) = (
                _mm512_load_ps(tile.k.d.as_ptr()),
                _mm512_load_ps(tile.k.dmin.as_ptr()),
            );
            for c in 0..N {
                let dy = _mm512_set1_ps(ys[c].d);
                let [a, m] = &mut acc[c];
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[c]), _mm512_mul_ps(dy, d), *a);
                *m = _mm512_fmadd_ps(_mm512_cvtepi32_ps(summ[c]), _mm512_mul_ps(dy, dmin), *m);
            }
        }
    }
}

/// Q6_K in a tile.
struct Q6K;

impl Format for Q6K {
    const BYTES: usize = 210;

    fn repack(tile: &mut TileBlock, r: usize, b: &[u8]) {
        tile.k.put_q6_k(r, b);
        for (i, pairs) in tile.pairs.iter_mut().enumerate() {
            pairs[r] = pair(tile.k.scales[2 * i][r], tile.k.scales[2 * i + 1][r]);
        }
    }

    #[inline]
    unsafe fn block<const N: usize>(
        tile: &TileBlock,
        ys: [&BlockQ8K; N],
        _extra: [&[u32; 4]; N],
        acc: &mut [[__m512; 2]; N],
    ) {
        // SAFETY: the caller guarantees the CPU features; loads are of `tile`'s fields.
        unsafe {
            let sumi = scaled_sums::<N>(tile, ys, 16, 4);
            // The −32 offset of every value, through the activations' sums of 16.
            let offsets = pair_sums::<N>(tile, 8, |c, i| {
                pair(
                    i32::from(ys[c].bsums[2 * i]),
                    i32::from(ys[c].bsums[2 * i + 1]),
                )
            });
            let d = _mm512_load_ps(tile.k.d.as_ptr());
            for c in 0..N {
                let sumi = _mm512_sub_epi32(sumi[c], _mm512_slli_epi32(offsets[c], 5));
                let dd = _mm512_mul_ps(_mm512_set1_ps(ys[c].d), d);
                acc[c][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi), dd, acc[c][0]);
            }
        }
    }
}

/// `N` columns from `c0` against a repacked tile of `rows` rows starting at `r0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_columns<F: Format, const N: usize>(
    tile: &[TileBlock],
    x: &[BlockQ8K],
    sums32: &[[u32; 4]],
    blocks: usize,
    c0: usize,
    (r0, rows, n_rows): (usize, usize, usize),
    out: &mut [f32],
) {
    // SAFETY: the caller guarantees the CPU features; the store stays inside `out` (checked).
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; N];
        for (i, t) in tile.iter().enumerate() {
            let ys: [&BlockQ8K; N] = std::array::from_fn(|c| &x[(c0 + c) * blocks + i]);
            let extra: [&[u32; 4]; N] =
                std::array::from_fn(|c| sums32.get((c0 + c) * blocks + i).unwrap_or(&[0; 4]));
            F::block::<N>(t, ys, extra, &mut acc);
        }
        let mask: __mmask16 = if rows >= TILE { !0 } else { (1 << rows) - 1 };
        for (c, [a, m]) in acc.iter().enumerate() {
            let at = (c0 + c) * n_rows + r0;
            assert!(at + rows <= out.len());
            _mm512_mask_storeu_ps(out.as_mut_ptr().add(at), mask, _mm512_sub_ps(*a, *m));
        }
    }
}

/// `rows × columns` products of format `F` (`x` by column, then block), rows in lanes.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_in_lanes<F: Format>(
    w: &[u8],
    row_bytes: usize,
    x: &[BlockQ8K],
    columns: usize,
    out: &mut [f32],
    sums32: &[[u32; 4]],
) {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let n_rows = w.len() / row_bytes.max(1);
        let blocks = x.len() / columns.max(1);
        if blocks == 0 || n_rows == 0 || out.len() < columns * n_rows {
            return;
        }
        let mut tile = TILE_BLOCKS.take();
        tile.resize(blocks, TileBlock::default());
        for r0 in (0..n_rows).step_by(TILE) {
            let rows = (n_rows - r0).min(TILE);
            if rows < TILE {
                // The lanes past the matrix's end sum zeros.
                tile.fill(TileBlock::default());
            }
            // Block by block, so the 16 rows write into one block's groups while it is in L1
            // (row by row, a wide matrix's tile left L1 before the next row came back to it).
            for (i, t) in tile.iter_mut().enumerate() {
                for r in 0..rows {
                    let at = (r0 + r) * row_bytes + i * F::BYTES;
                    F::repack(t, r, &w[at..at + F::BYTES]);
                }
            }
            let span = (r0, rows, n_rows);
            for c0 in (0..columns).step_by(COLUMNS) {
                let t = &tile[..];
                match columns - c0 {
                    1 => tile_columns::<F, 1>(t, x, sums32, blocks, c0, span, out),
                    2 => tile_columns::<F, 2>(t, x, sums32, blocks, c0, span, out),
                    3 => tile_columns::<F, 3>(t, x, sums32, blocks, c0, span, out),
                    _ => tile_columns::<F, COLUMNS>(t, x, sums32, blocks, c0, span, out),
                }
            }
        }
        TILE_BLOCKS.set(tile);
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
        SUMS32.with_borrow_mut(|sums32| {
            // The activations' sums of 32 values, from Q8_K's sums of 16: exact in i16 (at
            // most 32 · 127).
            sums32.clear();
            sums32.extend(x.iter().map(|y| {
                let s = |j: usize| i32::from(y.bsums[2 * j]) + i32::from(y.bsums[2 * j + 1]);
                std::array::from_fn(|i| pair(s(2 * i), s(2 * i + 1)))
            }));
            rows_in_lanes::<Q4K>(w, row_bytes, x, columns, out, sums32);
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
        rows_in_lanes::<Q6K>(w, row_bytes, x, columns, out, &[]);
    }
}
