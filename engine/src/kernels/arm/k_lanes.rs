//! Batched Q4_K and Q6_K products on NEON with rows in lanes: the design of the x86 batches
//! (`x86/k_wide.rs`) on 128-bit registers, for passes of [`LANES_FROM`] tokens or more.
//!
//! A register holds one 4-value group of four rows, one row per 32-bit lane (a tile, repacked
//! once per call), and `sdot` by element multiplies it with one 4-value group of a column's
//! activations taken from a lane of a register that holds four of them: 16 multiply-adds per
//! instruction with no unpacking per column, each sub-block's scales one multiply-add per four
//! rows, the float steps once per four rows. The row kernels in `arm.rs` unpack every block and
//! its scales again for each column and scale every `sdot`. A block's integer sums are exact
//! in any order, and the float steps are `scalar::k_step`'s, so the results are the reference's
//! bits.

use std::arch::aarch64::*;
use std::arch::asm;
use std::cell::Cell;

use super::super::activations::BlockQ8K;
use super::super::k_tile::KTile;

/// Rows of a tile: one per 32-bit lane of a 128-bit register.
const TILE: usize = 4;

/// Columns from which the rows-in-lanes kernel runs (fewer: the row kernels of `arm.rs`).
pub(super) const LANES_FROM: usize = 4;

/// One weight block of a tile's rows.
type TileBlock = KTile<TILE>;

thread_local! {
    /// Each pool thread's repacked tile, kept between calls.
    static TILE_BLOCKS: Cell<Vec<TileBlock>> = const { Cell::new(Vec::new()) };
}

/// `acc + Σ w·x` per 32-bit lane over four bytes, `x`'s four bytes in its lane `L` for every
/// lane of `w` (`sdot` by element).
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot_lane<const L: i32>(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `sdot` reads and writes only these registers; the caller guarantees dotprod.
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[{lane}]",
            acc = inout(vreg) acc,
            w = in(vreg) w,
            x = in(vreg) x,
            lane = const L,
            options(pure, nomem, nostack),
        );
    }
    acc
}

/// A K-quant format as the rows-in-lanes kernel takes it.
trait Format {
    /// Bytes per block.
    const BYTES: usize;
    /// Sub-blocks per block, and 4-value groups per sub-block.
    const SUBS: usize;
    const GROUPS: usize;
    /// Puts row `r`'s block `b` into lane `r` of `tile`.
    fn repack(tile: &mut TileBlock, r: usize, b: &[u8]);
    /// The block's second integer sum (Q4_K: Σ min · sums of 32; Q6_K: 32 · Σ scale · sums
    /// of 16, taken off the first) for one column, one lane per row.
    ///
    /// # Safety
    /// The CPU must have NEON.
    unsafe fn offsets(tile: &TileBlock, y: &BlockQ8K) -> int32x4_t;
    /// Adds the block's sums to the column's two float sums (`scalar::k_step`).
    ///
    /// # Safety
    /// The CPU must have NEON.
    unsafe fn step(
        tile: &TileBlock,
        y: &BlockQ8K,
        sumi: int32x4_t,
        offsets: int32x4_t,
        acc: &mut [float32x4_t; 2],
    );
}

/// Q4_K in a tile.
struct Q4K;

impl Format for Q4K {
    const BYTES: usize = 144;
    const SUBS: usize = 8;
    const GROUPS: usize = 8;

    fn repack(tile: &mut TileBlock, r: usize, b: &[u8]) {
        tile.put_q4_k(r, b);
    }

    #[inline]
    unsafe fn offsets(tile: &TileBlock, y: &BlockQ8K) -> int32x4_t {
        // SAFETY: the caller guarantees NEON; loads are of `tile`'s fields.
        unsafe {
            let mut summ = vdupq_n_s32(0);
            for (j, mins) in tile.mins.iter().enumerate() {
                let s32 = i32::from(y.bsums[2 * j]) + i32::from(y.bsums[2 * j + 1]);
                summ = vmlaq_n_s32(summ, vld1q_s32(mins.as_ptr()), s32);
            }
            summ
        }
    }

    #[inline]
    unsafe fn step(
        tile: &TileBlock,
        y: &BlockQ8K,
        sumi: int32x4_t,
        summ: int32x4_t,
        acc: &mut [float32x4_t; 2],
    ) {
        // SAFETY: the caller guarantees NEON; loads are of `tile`'s fields.
        unsafe {
            let d = vmulq_f32(vdupq_n_f32(y.d), vld1q_f32(tile.d.as_ptr()));
            let dmin = vmulq_f32(vdupq_n_f32(y.d), vld1q_f32(tile.dmin.as_ptr()));
            acc[0] = vfmaq_f32(acc[0], vcvtq_f32_s32(sumi), d);
            acc[1] = vfmaq_f32(acc[1], vcvtq_f32_s32(summ), dmin);
        }
    }
}

/// Q6_K in a tile.
struct Q6K;

impl Format for Q6K {
    const BYTES: usize = 210;
    const SUBS: usize = 16;
    const GROUPS: usize = 4;

    fn repack(tile: &mut TileBlock, r: usize, b: &[u8]) {
        tile.put_q6_k(r, b);
    }

    #[inline]
    unsafe fn offsets(tile: &TileBlock, y: &BlockQ8K) -> int32x4_t {
        // SAFETY: the caller guarantees NEON; loads are of `tile`'s fields.
        unsafe {
            let mut sum = vdupq_n_s32(0);
            for (g, scales) in tile.scales.iter().enumerate() {
                sum = vmlaq_n_s32(sum, vld1q_s32(scales.as_ptr()), i32::from(y.bsums[g]));
            }
            vshlq_n_s32::<5>(sum)
        }
    }

    #[inline]
    unsafe fn step(
        tile: &TileBlock,
        y: &BlockQ8K,
        sumi: int32x4_t,
        offsets: int32x4_t,
        acc: &mut [float32x4_t; 2],
    ) {
        // SAFETY: the caller guarantees NEON; loads are of `tile`'s fields.
        unsafe {
            let d = vmulq_f32(vdupq_n_f32(y.d), vld1q_f32(tile.d.as_ptr()));
            acc[0] = vfmaq_f32(acc[0], vcvtq_f32_s32(vsubq_s32(sumi, offsets)), d);
        }
    }
}

/// One block's Σ scale · values · activations for one column, a lane per row.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn scaled_sums<F: Format>(tile: &TileBlock, y: &BlockQ8K) -> int32x4_t {
    // SAFETY: the caller guarantees the CPU features; loads are of `tile` and `y` (in bounds:
    // SUBS · GROUPS · 4 = 256 values).
    unsafe {
        let w = |k: usize| vreinterpretq_s8_u32(vld1q_u32(tile.groups[k].as_ptr()));
        let mut sumi = vdupq_n_s32(0);
        for s in 0..F::SUBS {
            let first = s * F::GROUPS;
            let mut chunk = vdupq_n_s32(0);
            // Four groups a register of activations, one group per lane.
            for quad in 0..F::GROUPS / 4 {
                let k = first + 4 * quad;
                let x = vld1q_s8(y.qs.as_ptr().add(4 * k));
                chunk = sdot_lane::<0>(chunk, w(k), x);
                chunk = sdot_lane::<1>(chunk, w(k + 1), x);
                chunk = sdot_lane::<2>(chunk, w(k + 2), x);
                chunk = sdot_lane::<3>(chunk, w(k + 3), x);
            }
            sumi = vmlaq_s32(sumi, chunk, vld1q_s32(tile.scales[s].as_ptr()));
        }
        sumi
    }
}

/// `rows × columns` products of format `F` (`x` by column, then block), rows in lanes.
#[target_feature(enable = "neon,dotprod")]
unsafe fn rows_in_lanes<F: Format>(
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
            for (i, t) in tile.iter_mut().enumerate() {
                for r in 0..rows {
                    let at = (r0 + r) * row_bytes + i * F::BYTES;
                    F::repack(t, r, &w[at..at + F::BYTES]);
                }
            }
            for c in 0..columns {
                let mut acc = [vdupq_n_f32(0.0); 2];
                for (t, y) in tile.iter().zip(&x[c * blocks..(c + 1) * blocks]) {
                    let sumi = scaled_sums::<F>(t, y);
                    F::step(t, y, sumi, F::offsets(t, y), &mut acc);
                }
                let mut sums = [0f32; TILE];
                vst1q_f32(sums.as_mut_ptr(), vsubq_f32(acc[0], acc[1]));
                let at = c * n_rows + r0;
                out[at..at + rows].copy_from_slice(&sums[..rows]);
            }
        }
        TILE_BLOCKS.set(tile);
    }
}

/// Batched Q4_K products, each as `scalar::q4_k` sums it.
///
/// # Safety
/// The CPU must have NEON and the dot-product instructions.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn q4_k_rows(
    w: &[u8],
    row_bytes: usize,
    x: &[BlockQ8K],
    columns: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller guarantees the CPU features.
    unsafe { rows_in_lanes::<Q4K>(w, row_bytes, x, columns, out) }
}

/// Batched Q6_K products, each as `scalar::q6_k` sums it.
///
/// # Safety
/// The CPU must have NEON and the dot-product instructions.
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn q6_k_rows(
    w: &[u8],
    row_bytes: usize,
    x: &[BlockQ8K],
    columns: usize,
    out: &mut [f32],
) {
    // SAFETY: the caller guarantees the CPU features.
    unsafe { rows_in_lanes::<Q6K>(w, row_bytes, x, columns, out) }
}
