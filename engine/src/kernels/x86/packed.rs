//! Batched legacy-quant products on AVX-512 VNNI: the same sums as the row kernels in
//! `x86.rs`, in about half the instructions per block, for passes of two or more tokens.
//!
//! Two things cost the row kernels most per (row, column) block: the sign trick that lets
//! `vpdpbusd` (unsigned × signed) take signed weights, and the addressing of eight columns that
//! sit a whole row of blocks apart. Here the weights are biased to unsigned once per row block
//! (Q8_0: +128, Q4_0: +8, Q5_0: +16; Q4_1's nibbles already are), and the bias times each lane's
//! four activations is subtracted exactly by starting the lane sums from a precomputed
//! correction. The activations of up to eight columns are first repacked, block by block, into
//! one [`PackedBlock`], so a single pointer with fixed displacements reaches all of them, and a
//! block's step is one load (of the correction; Q4_1, unbiased, copies a register instead), one
//! `vpdpbusd` and three float operations (the lane sums to float, the scale product with the
//! activation scale broadcast from memory, the accumulation). From five columns on the scale
//! products of all columns are one multiply per block, made in a walk of their own, and the
//! step has two float operations (see [`tile!`]). Q4_1's offset terms of the eight columns sit
//! side by side too, so one vector FMA updates all eight.
//!
//! The lane sums become floats without a conversion: they start from [`MAGIC`] (folded into
//! the correction), and one subtraction leaves each sum as a float. On the Xeon this was
//! measured on (Emerald Rapids) `vcvtdq2ps` shares the two ports that `vpdpbusd` and the FMA
//! keep busy, while an add or subtract can also go to a third: 8 columns of Q4_1 22.8 → 19.0
//! time units per block, Q8_0 21.5 → 17.8 (a timing loop not kept; whole passes in
//! BENCHMARKS.md).
//!
//! Every (row, column) still sums the scalar reference's lanes in its order: integer sums are
//! exact whatever the route, and the float steps are the reference's, one for one.

use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::Cell;
use std::mem::offset_of;

use super::super::activations::{BlockQ8_0, BlockQ8_1};
use super::{f16_pair, hsum8, load32, nibbles, prefetch_rows, second};

/// Columns one walk along a row serves (one accumulator register each).
const GROUP: usize = 8;

/// One activation block of up to [`GROUP`] columns.
#[derive(Clone, Copy, Default)]
#[repr(C, align(32))]
struct PackedBlock {
    /// Per column, where its eight lane sums start: [`MAGIC`] − bias × the sum of each lane's
    /// four activations, so the biased weights' sums come out as the signed weights' sums,
    /// ready to be taken to float (unused for Q4_1).
    correction: [[i32; 8]; GROUP],
    /// Per column, the 32 quants.
    qs: [[i8; 32]; GROUP],
    /// Per column, the scale.
    d: [f32; GROUP],
    /// Per column, Q8_1's `d·Σq` (zero for Q8_0).
    s: [f32; GROUP],
    /// Per column, `dw·d` for the weight block of the row being walked (see [`tile!`]):
    /// rewritten for every row, read only by that row's steps.
    products: [f32; GROUP],
}

const CORRECTION: usize = offset_of!(PackedBlock, correction);
const QS: usize = offset_of!(PackedBlock, qs);
const D: usize = offset_of!(PackedBlock, d);
const PRODUCTS: usize = offset_of!(PackedBlock, products);

/// Columns from which a row is walked twice (see [`tile!`]). Timing the kernel alone on a
/// 1536 × 576 Q4_1 matrix (Zen 4, cycles per block of a row, a timing loop not kept), always
/// walking twice: 8 columns 15.9 → 14.2, 6 columns 12.4 → 11.7, 4 columns 9.5 → 9.4, 2 columns
/// 6.8 → 7.5. Below five the second walk costs what the multiplies did. Whole passes:
/// BENCHMARKS.md (`engine bench --batch`).
const SCALED_FROM: usize = 5;

thread_local! {
    /// Each pool thread's packed activations, kept between calls so the token loop does not
    /// allocate once the widest matrix has been seen.
    static PACKED: Cell<Vec<PackedBlock>> = const { Cell::new(Vec::new()) };
}

/// `bias ×` the sum of each four consecutive quants, negated, plus [`MAGIC`]: where a biased
/// step's lane sums start.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn correction(qs: &[i8; 32], bias: u8) -> __m256i {
    // SAFETY: the packed kernels are only handed out after `vnni_supported()`; the asm reads
    // the 32 bytes of `qs`.
    unsafe {
        let mut sums = _mm256_setzero_si256();
        asm!(
            "{{evex}} vpdpbusd {sums}, {bias}, ymmword ptr [{qs}]",
            sums = inout(ymm_reg) sums,
            bias = in(ymm_reg) _mm256_set1_epi8(bias as i8),
            qs = in(reg) qs.as_ptr(),
            options(pure, readonly, nostack, preserves_flags),
        );
        _mm256_sub_epi32(_mm256_set1_epi32(MAGIC), sums)
    }
}

/// The bits of 1.5·2²³, to which a lane sum `s` is added as an integer: for |s| < 2²² the bits
/// are those of the float 1.5·2²³ + s (its unit in the last place is 1), and subtracting
/// [`magic`] leaves `s`, the float `vcvtdq2ps` gives, +0 for 0 included. A lane here sums four
/// products of at most 128 · 128 (65,536), far inside that range; the kernel test
/// `largest_lane_sums_match_the_scalar_reference_on_every_isa` fills blocks with the extremes.
pub(super) const MAGIC: i32 = 0x4B40_0000;

/// [`MAGIC`] as eight f32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn magic() -> __m256 {
    // SAFETY: the caller guarantees the CPU features.
    unsafe { _mm256_castsi256_ps(_mm256_set1_epi32(MAGIC)) }
}

/// One (row block, column `$j`) step: the lane sums from the column's correction, the biased
/// weights `$w` against its quants, then `acc += (dw·dy) · lanes` as the reference does it.
/// `dw·dy` is, by `$kind`, multiplied here from `dw` in the register `$dw` (`multiply`), or
/// broadcast from the block's `products` (`scaled`, which takes no `$dw`).
macro_rules! step {
    ($kind:ident, $acc:ident, $j:literal, $p:ident, $w:ident $(, $dw:ident)?) => {
        step_from!($kind, "vmovdqu {t}, ymmword ptr [{p} + {k}]", $acc, $j, $p, $w $(, $dw)?;
            k = const CORRECTION + 32 * $j,)
    };
}

/// [`step!`] for weights that need no bias (Q4_1's nibbles): the lane sums start from
/// [`MAGIC`] copied from a register, where loading the column's correction (just [`MAGIC`])
/// costs a load per step.
macro_rules! step_unbiased {
    ($kind:ident, $acc:ident, $j:literal, $p:ident, $w:ident $(, $dw:ident)?) => {
        step_from!($kind, "vmovaps {t}, {magic}", $acc, $j, $p, $w $(, $dw)?;)
    };
}

/// The step after `$start` has set the lane sums `t`; `$operands` are what `$start` reads.
macro_rules! step_from {
    (multiply, $start:literal, $acc:ident, $j:literal, $p:ident, $w:ident, $dw:ident;
     $($operands:tt)*) => {
        asm!(
            $start,
            "{{evex}} vpdpbusd {t}, {w}, ymmword ptr [{p} + {q}]",
            "vsubps {t}, {t}, {magic}",
            "vmulps {s}, {dw}, dword ptr [{p} + {d}]{{1to8}}",
            "vfmadd231ps {acc}, {s}, {t}",
            p = in(reg) $p,
            magic = in(ymm_reg) magic(),
            w = in(ymm_reg) $w,
            dw = in(ymm_reg) $dw,
            acc = inout(ymm_reg) $acc,
            t = out(ymm_reg) _,
            s = out(ymm_reg) _,
            q = const QS + 32 * $j,
            d = const D + 4 * $j,
            $($operands)*
            options(pure, readonly, nostack, preserves_flags),
        )
    };
    (scaled, $start:literal, $acc:ident, $j:literal, $p:ident, $w:ident;
     $($operands:tt)*) => {
        asm!(
            $start,
            "{{evex}} vpdpbusd {t}, {w}, ymmword ptr [{p} + {q}]",
            "vsubps {t}, {t}, {magic}",
            "vfmadd231ps {acc}, {t}, dword ptr [{p} + {d}]{{1to8}}",
            p = in(reg) $p,
            magic = in(ymm_reg) magic(),
            w = in(ymm_reg) $w,
            acc = inout(ymm_reg) $acc,
            t = out(ymm_reg) _,
            q = const QS + 32 * $j,
            d = const PRODUCTS + 4 * $j,
            $($operands)*
            options(pure, readonly, nostack, preserves_flags),
        )
    };
}

/// One row against the packed columns `$j…` (their accumulators `$acc…`): the eight results,
/// the reference's `hsum8(lanes) + offset sum` for the listed columns (the others stay 0).
///
/// From [`SCALED_FROM`] columns on, two walks along the row: the first takes each block's
/// `dw·dy` for all its columns in one multiply into the packed block (and Q4_1's offsets), the
/// second does the dot products, and each column's step broadcasts its product from there, a load
/// rather than a multiply of its own (the same products, so the same sums). The multiply per
/// (block, column) shared the FMA pipes with the dot product and the accumulation. Stored a
/// whole row ahead, the products are read from L1; broadcast right after their store they
/// stalled on store forwarding (slower than the multiplies), as they did one block ahead.
macro_rules! tile {
    ($row:ident, $packed:ident, $bytes:expr, $bias:expr, $unpack:ident, $offset:expr;
     $($acc:ident $j:literal),+) => {{
        let scaled = [$($j),+].len() >= SCALED_FROM;
        let mut offsets = _mm256_setzero_ps();
        // Q4_1: every column's `m·s` sum in its own lane, in the reference's order.
        let offset = |offsets: __m256, dm: __m128, p: &PackedBlock| {
            _mm256_fmadd_ps(_mm256_set1_ps(second(dm)), _mm256_load_ps(p.s.as_ptr()), offsets)
        };
        if scaled {
            for (block, p) in $row.chunks_exact($bytes).zip($packed.iter_mut()) {
                let dm = f16_pair(block);
                let products =
                    _mm256_mul_ps(_mm256_broadcastss_ps(dm), _mm256_load_ps(p.d.as_ptr()));
                _mm256_store_ps(p.products.as_mut_ptr(), products);
                if $offset {
                    offsets = offset(offsets, dm, p);
                }
            }
        }
        $( let mut $acc = _mm256_setzero_ps(); )+
        for (block, p) in $row.chunks_exact($bytes).zip($packed.iter()) {
            let w = $unpack(block);
            let pointer: *const PackedBlock = p;
            if scaled {
                if $bias == 0 {
                    $( step_unbiased!(scaled, $acc, $j, pointer, w); )+
                } else {
                    $( step!(scaled, $acc, $j, pointer, w); )+
                }
            } else {
                let dm = f16_pair(block);
                let dw = _mm256_broadcastss_ps(dm);
                if $bias == 0 {
                    $( step_unbiased!(multiply, $acc, $j, pointer, w, dw); )+
                } else {
                    $( step!(multiply, $acc, $j, pointer, w, dw); )+
                }
                if $offset {
                    offsets = offset(offsets, dm, p);
                }
            }
        }
        let mut sums = [0f32; GROUP];
        _mm256_storeu_ps(sums.as_mut_ptr(), offsets);
        let mut results = [0f32; GROUP];
        $( results[$j] = hsum8($acc) + sums[$j]; )+
        results
    }};
}

/// A batched kernel over rows × columns (the `RowsFn` contract), for a legacy quant whose
/// blocks are `$bytes` long and start with an f16 pair (with `$offset`, Q4_1's d and m), whose
/// weights `$unpack` gives as unsigned values (value + `$bias`), with activations `$act` read
/// by `$parts` as (d, s, qs).
macro_rules! packed_rows {
    ($name:ident, $act:ty, $bytes:expr, $bias:expr, $offset:expr, $unpack:ident, $parts:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $name(
            w: &[u8],
            row_bytes: usize,
            x: &[$act],
            columns: usize,
            out: &mut [f32],
        ) {
            // SAFETY: the caller guarantees the CPU features this function is compiled for
            // (AVX2, FMA, F16C and AVX-512 VNNI + VL); the asm reads inside one PackedBlock.
            unsafe {
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
                let mut buffer = PACKED.take();
                if buffer.len() < blocks {
                    buffer.resize(blocks, PackedBlock::default());
                }
                for c0 in (0..columns).step_by(GROUP) {
                    let group = (columns - c0).min(GROUP);
                    for (i, p) in buffer[..blocks].iter_mut().enumerate() {
                        for j in 0..group {
                            let (d, s, qs) = parts(&x[(c0 + j) * blocks + i]);
                            p.d[j] = d;
                            p.s[j] = s;
                            p.qs[j] = *qs;
                            if $bias != 0 {
                                _mm256_store_si256(
                                    p.correction[j].as_mut_ptr().cast(),
                                    correction(qs, $bias),
                                );
                            }
                        }
                    }
                    let packed = &mut buffer[..blocks];
                    for r in 0..n_rows {
                        let row = &w[r * row_bytes..(r + 1) * row_bytes];
                        // Rows are short (hundreds of bytes): without asking ahead, each one
                        // waited on memory (a 2-token pass cost 1.7 single ones, 1.2 with).
                        prefetch_rows(w, row_bytes, r + 2, 1);
                        let results = match group {
                            1 => tile!(row, packed, $bytes, $bias, $unpack, $offset; a0 0),
                            2 => tile!(row, packed, $bytes, $bias, $unpack, $offset; a0 0, a1 1),
                            3 => tile!(row, packed, $bytes, $bias, $unpack, $offset; a0 0, a1 1, a2 2),
                            4 => tile!(row, packed, $bytes, $bias, $unpack, $offset; a0 0, a1 1, a2 2, a3 3),
                            5 => tile!(row, packed, $bytes, $bias, $unpack, $offset;
                                a0 0, a1 1, a2 2, a3 3, a4 4),
                            6 => tile!(row, packed, $bytes, $bias, $unpack, $offset;
                                a0 0, a1 1, a2 2, a3 3, a4 4, a5 5),
                            7 => tile!(row, packed, $bytes, $bias, $unpack, $offset;
                                a0 0, a1 1, a2 2, a3 3, a4 4, a5 5, a6 6),
                            _ => tile!(row, packed, $bytes, $bias, $unpack, $offset;
                                a0 0, a1 1, a2 2, a3 3, a4 4, a5 5, a6 6, a7 7),
                        };
                        for (j, result) in results[..group].iter().enumerate() {
                            out[(c0 + j) * n_rows + r] = *result;
                        }
                    }
                }
                PACKED.set(buffer);
            }
        }
    };
}

/// Q4_0: nibbles are value + 8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_unsigned(b: &[u8]) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { nibbles(&b[2..]) }
}

/// Q4_1: the nibbles themselves (the f16 pair before them is d and m).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_1_unsigned(b: &[u8]) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { nibbles(&b[4..]) }
}

/// Q5_0: nibble | fifth bit << 4 is value + 16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q5_0_unsigned(b: &[u8]) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let high = _mm256_and_si256(super::bits_to_bytes(qh), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles(&b[6..]), high)
    }
}

/// Q8_0: flipping the sign bit is value + 128.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q8_0_unsigned(b: &[u8]) -> __m256i {
    // SAFETY: the caller guarantees the CPU features this function is compiled for.
    unsafe { _mm256_xor_si256(load32(&b[2..]), _mm256_set1_epi8(0x80u8 as i8)) }
}

pub(super) fn q8_0_parts(y: &BlockQ8_0) -> (f32, f32, &[i8; 32]) {
    (y.d, 0.0, &y.qs)
}

pub(super) fn q8_1_parts(y: &BlockQ8_1) -> (f32, f32, &[i8; 32]) {
    (y.d, y.s, &y.qs)
}

packed_rows!(
    q4_0_rows,
    BlockQ8_0,
    18,
    8,
    false,
    q4_0_unsigned,
    q8_0_parts
);
packed_rows!(q4_1_rows, BlockQ8_1, 20, 0, true, q4_1_unsigned, q8_1_parts);
packed_rows!(
    q5_0_rows,
    BlockQ8_0,
    22,
    16,
    false,
    q5_0_unsigned,
    q8_0_parts
);
packed_rows!(
    q8_0_rows,
    BlockQ8_0,
    34,
    128,
    false,
    q8_0_unsigned,
    q8_0_parts
);
