//! Matrix products over stored weights: one interface, a plain scalar reference and per-ISA
//! implementations chosen at run time.
//!
//! Activations are quantized once per product to the weight type's dot type (Q8_0, Q8_1 or
//! Q8_K, as ggml does) and reused for every row; each row's dot product is then integer
//! arithmetic per block. Rows are independent and always computed the same way, so the result
//! does not depend on how rows are split across threads.

pub mod activations;
#[cfg(target_arch = "aarch64")]
#[allow(unsafe_code)]
mod arm;
mod expf;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod k_tile;
mod matrix;
mod row_lanes;
mod scalar;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86;

use std::cell::RefCell;
use std::ops::Range;
use std::sync::Arc;

use activations::{BlockQ8_0, BlockQ8_1, BlockQ8K};
pub use matrix::{Matrix, WIDEN_BUDGET};

use crate::pool::{Pool, Schedule};
use crate::quant::{QuantError, TensorType};

/// The instruction set the kernels run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// The portable reference.
    Scalar,
    /// x86-64 with AVX2, FMA and F16C.
    Avx2,
    /// [`Isa::Avx2`] plus AVX-512 VNNI and VL: the int8 dot products fused (`vpdpbusd`).
    Avx512Vnni,
    /// aarch64 NEON with the dot-product extension.
    Neon,
}

impl Isa {
    /// The best instruction set this CPU supports (checked at run time), or the one named by
    /// `ENGINE_ISA` (`Scalar`, `Avx2`, ...) when this CPU has it: benchmarks compare the paths
    /// with it, and a user can step down from a path that misbehaves on their CPU.
    pub fn detect() -> Isa {
        let available = Isa::available();
        let named = std::env::var("ENGINE_ISA").ok();
        named
            .and_then(|name| available.iter().find(|i| format!("{i:?}") == name).copied())
            .or_else(|| available.last().copied())
            .unwrap_or(Isa::Scalar)
    }

    /// Every instruction set this CPU can run, the scalar reference first.
    pub fn available() -> Vec<Isa> {
        #[allow(unused_mut)]
        let mut isas = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        if x86::supported() {
            isas.push(Isa::Avx2);
        }
        #[cfg(target_arch = "x86_64")]
        if x86::vnni_supported() {
            isas.push(Isa::Avx512Vnni);
        }
        #[cfg(target_arch = "aarch64")]
        if arm::supported() {
            isas.push(Isa::Neon);
        }
        isas
    }
}

/// Dots of every row of `w` (consecutive rows of `row_bytes`) with each of `columns`
/// activation vectors (`x`, one after another, each quantized to the rows' dot type); the
/// result for row r and column c goes to `out[c · rows + r]`.
pub type RowsFn<B> = fn(&[u8], usize, &[B], usize, &mut [f32]);

/// Weight rows · activations quantized to the row type's dot type.
#[derive(Clone, Copy)]
pub enum RowDot {
    /// Legacy 32-element quants paired with Q8_0.
    Q8_0(RowsFn<BlockQ8_0>),
    /// Quants with an offset, paired with Q8_1.
    Q8_1(RowsFn<BlockQ8_1>),
    /// K-quants, paired with Q8_K.
    Q8K(RowsFn<BlockQ8K>),
    /// Float types (F32, F16, BF16) over f32 activations, on this instruction set.
    Float(TensorType, Isa),
}

/// The row kernel for weights of type `ty` on `isa`.
pub fn row_dot(ty: &TensorType, isa: Isa) -> Result<RowDot, QuantError> {
    #[cfg(target_arch = "x86_64")]
    if let Isa::Avx2 | Isa::Avx512Vnni = isa
        && let Some(dot) = x86::row_dot(ty, isa == Isa::Avx512Vnni)
    {
        return Ok(dot);
    }
    #[cfg(target_arch = "aarch64")]
    if isa == Isa::Neon
        && let Some(dot) = arm::row_dot(ty)
    {
        return Ok(dot);
    }
    let _ = isa;
    Ok(match ty.name {
        "Q4_0" => RowDot::Q8_0(scalar::rows::q4_0),
        "Q4_1" => RowDot::Q8_1(scalar::rows::q4_1),
        "Q5_0" => RowDot::Q8_0(scalar::rows::q5_0),
        "Q5_1" => RowDot::Q8_1(scalar::rows::q5_1),
        "Q8_0" => RowDot::Q8_0(scalar::rows::q8_0),
        "IQ4_NL" => RowDot::Q8_0(scalar::rows::iq4_nl),
        "Q4_K" => RowDot::Q8K(scalar::rows::q4_k),
        "Q5_K" => RowDot::Q8K(scalar::rows::q5_k),
        "Q6_K" => RowDot::Q8K(scalar::rows::q6_k),
        "F32" | "F16" | "BF16" => RowDot::Float(*ty, isa),
        other => {
            return Err(QuantError(format!(
                "no kernel for {other} tensors (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, \
                 Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K, Q6_K)"
            )));
        }
    })
}

/// The cached keys and values (f16) of one key-value head: rows of `stride` values, the
/// head's values starting at `offset` in every row.
#[derive(Debug, Clone, Copy)]
pub struct KvRows<'a> {
    /// Every cached position's keys, `stride` apart.
    pub keys: &'a [u16],
    /// Every cached position's values, laid out as the keys.
    pub values: &'a [u16],
    /// Values per cached position (all key-value heads).
    pub stride: usize,
    /// Where this head's values start within a position.
    pub offset: usize,
}

/// Query heads that attend to the same key-value head: their f16 queries one after another,
/// `width` values each, the rows each head sees, and the factor applied to every query·key
/// product. Heads of several tokens of one pass go together (each sees its own rows).
#[derive(Debug, Clone, Copy)]
pub struct Queries<'a> {
    /// The heads' queries, f16.
    pub q: &'a [u16],
    /// Values per head.
    pub width: usize,
    /// Per head, the cached positions it attends to, in order.
    pub spans: &'a [Range<usize>],
    /// Applied to each query·key product.
    pub post_scale: f32,
}

/// Attention of `queries` over `rows` as llama.cpp's CPU flash attention runs it per head,
/// on `isa`. `acc` holds the heads' f16 accumulators one after another; per head, over
/// its span's rows in order: the score `q·k · post_scale`; a new maximum rescales the head's
/// accumulator; then `acc ← f16(acc + e^(score−max)·v)`. `sums` receives each head's sum of
/// weights. Every ISA gives the scalar reference's bits, whichever heads go together.
pub fn attend_f16(
    queries: Queries<'_>,
    rows: KvRows<'_>,
    acc: &mut [u16],
    sums: &mut [f32],
    isa: Isa,
) {
    let fused = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::attend_f16(queries, rows, acc, sums),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::attend_f16(queries, rows, acc, sums),
        _ => false,
    };
    if fused {
        return;
    }
    let Queries {
        q,
        width,
        spans,
        post_scale,
    } = queries;
    for (((q, acc), sum), span) in q
        .chunks_exact(width)
        .zip(acc.chunks_exact_mut(width))
        .zip(sums)
        .zip(spans)
    {
        *sum = online_softmax(
            rows,
            span.clone(),
            post_scale,
            acc,
            |k| dot_f16(k, q, isa),
            |a, s| scale_f16(a, s, isa),
            |a, v, w| mad_f16(a, v, w, isa),
        );
    }
}

thread_local! {
    /// The fused loop's f32 buffers (queries, accumulators, a block's keys and values), kept
    /// per thread: clearing 100 kB on the stack at every call cost more than a block's work.
    static FUSED_BUFFERS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// One ISA's steps of [`fused_attention`]. Accumulators are f32 holding f16 values (each step
/// rounds through f16, as the reference's f16 accumulator does), so a head's accumulator can
/// stay in registers across rows.
struct FusedSteps<W, D, Ds, E, S, M, P> {
    /// f16 → f32, eight values at a time (whole eights only).
    widen: W,
    /// `k · q` as the ISA's `dot_f16(k, q)` computes it, the whole 32-value steps of both
    /// already widened (`k32`, `q32`) and any tail read from the f16 `k` and `q`.
    dot: D,
    /// `dot` for consecutive rows of a head as wide as its whole 32-value steps (no tail):
    /// `out[r] = k32[r·width..][..width] · q32`, several rows' sums folded together.
    dots: Ds,
    /// `x ← e^x` for each value, as [`expf::expf`].
    exps: E,
    /// `acc ← f16(acc·s)` over whole eights, as the ISA's `scale_f16`.
    scale: S,
    /// For each weight `w[r]` in order, `acc ← f16(acc + v[r]·w[r])` over whole eights, row
    /// `r` of `v` starting at `r·stride`: the ISA's `mad_f16` row after row.
    mad_rows: M,
    /// Asks for one head's keys or values of a later row to come into the cache.
    prefetch: P,
}

/// Query heads the fused loop keeps state for; [`attend_f16`] takes more (the reference
/// runs them), and the model hands it at most this many at a time.
pub const ATTEND_HEADS: usize = 32;

/// Most query values (heads × width) the fused loop takes at once.
pub const ATTEND_VALUES: usize = 8192;

/// Widest head the fused loop takes.
const FUSED_WIDTH: usize = 512;

/// Keys (and values) of the rows the fused loop widens at a time: a block every head goes
/// through before the next, so a pass's tokens read each cached row from memory once.
const BLOCK_VALUES: usize = 4096;

/// Most rows in a block.
const BLOCK_ROWS: usize = 32;

// A block's rescaling rows are bits of a `u32`.
const _: () = assert!(BLOCK_ROWS <= u32::BITS as usize);

/// How many rows ahead the fused loop asks for keys and values.
const PREFETCH_ROWS: usize = 16;

/// Offsets from its start of the cache lines `len` bytes span, for a prefetch: every 64 bytes,
/// and the last byte too, whose line follows when the start is not on a line boundary.
fn cache_lines(len: usize) -> impl Iterator<Item = usize> {
    (0..len).step_by(64).chain(len.checked_sub(1))
}

/// [`attend_f16`] as a SIMD path runs it. Rows go in blocks: each block's keys and values are
/// widened to f32 once for every head (a pass's tokens included, each over its own rows). Per
/// block, in stages each run for every head: the scores (they depend on nothing but the
/// key); the softmax steps in the reference's order (weights, rescale factors); the sums of
/// weights; then the weighted values row after row with the accumulator in registers, broken
/// only where a new maximum rescales it. Each head sees the reference's operations in the
/// reference's order (widening is exact), so the bits are the reference's. False (nothing
/// done) when the heads do not fit its buffers.
#[inline(always)]
fn fused_attention<W, D, Ds, E, S, M, P>(
    queries: Queries<'_>,
    rows: KvRows<'_>,
    acc: &mut [u16],
    sums: &mut [f32],
    steps: &FusedSteps<W, D, Ds, E, S, M, P>,
) -> bool
where
    W: Fn(&[u16], &mut [f32]),
    D: Fn(&[f32], &[f32], &[u16], &[u16]) -> f32,
    Ds: Fn(&[f32], usize, &[f32], &mut [f32]),
    E: Fn(&mut [f32]),
    S: Fn(&mut [f32], f32),
    M: Fn(&mut [f32], &[f32], usize, &[f32]),
    P: Fn(&[u16]),
{
    let Queries {
        q,
        width,
        spans,
        post_scale,
    } = queries;
    let heads = sums.len();
    if width == 0
        || width > FUSED_WIDTH
        || heads > ATTEND_HEADS
        || heads * width > ATTEND_VALUES
        || spans.len() != heads
        || q.len() != heads * width
        || acc.len() != heads * width
    {
        return false;
    }
    let (whole, eights) = (width / 32 * 32, width / 8 * 8);
    FUSED_BUFFERS.with_borrow_mut(|buffers| {
        let block = (BLOCK_VALUES / width).clamp(1, BLOCK_ROWS);
        let (values, rows_values) = (heads * width, block * width);
        buffers.resize(buffers.len().max(2 * values + 2 * rows_values), 0.0);
        let (q32, rest) = buffers.split_at_mut(values);
        let (acc32, rest) = rest.split_at_mut(values);
        let (k32, rest) = rest.split_at_mut(rows_values);
        let v32 = &mut rest[..rows_values];
        for (h, f) in acc.iter().zip(acc32.iter_mut()) {
            *f = crate::quant::f16_to_f32(*h);
        }
        for (q, q32) in q.chunks_exact(width).zip(q32.chunks_exact_mut(width)) {
            (steps.widen)(&q[..whole], &mut q32[..whole]);
        }
        // Per head and row of the block: its score, then its weight; the factor rescaling the
        // head's accumulator before the row (1 where none does); and which rows rescale.
        let mut weights = [0f32; ATTEND_HEADS * BLOCK_ROWS];
        let mut factors = [1f32; ATTEND_HEADS * BLOCK_ROWS];
        let mut rescales = [0u32; ATTEND_HEADS];
        let mut max = [f32::NEG_INFINITY; ATTEND_HEADS];
        sums.fill(0.0);
        let first = spans.iter().map(|s| s.start).min().unwrap_or(0);
        let end = spans.iter().map(|s| s.end).max().unwrap_or(0);
        let mut b0 = first;
        while b0 < end {
            let b1 = (b0 + block).min(end);
            for p in b0..b1 {
                let at = p * rows.stride + rows.offset;
                if p + PREFETCH_ROWS < end {
                    // A head's slice of a row is a few cache lines a whole row apart, and a long
                    // context's cache is far from the core: after 900 positions, waiting on those
                    // loads was the largest part of attention.
                    let ahead = at + PREFETCH_ROWS * rows.stride;
                    (steps.prefetch)(&rows.keys[ahead..ahead + width]);
                    (steps.prefetch)(&rows.values[ahead..ahead + width]);
                }
                let r = (p - b0) * width;
                (steps.widen)(&rows.keys[at..at + whole], &mut k32[r..r + whole]);
                (steps.widen)(&rows.values[at..at + eights], &mut v32[r..r + eights]);
            }
            let clip = |h: usize| spans[h].start.max(b0)..spans[h].end.min(b1);
            // Each stage runs for every head before the next, so the CPU overlaps the heads'
            // independent chains; within a head, the order is the reference's.
            for h in 0..heads {
                let head = h * width..(h + 1) * width;
                let q32 = &q32[h * width..h * width + whole];
                let span = clip(h);
                if span.is_empty() {
                    continue;
                }
                let (r0, r1) = (span.start - b0, span.end - b0);
                let scores = &mut weights[h * BLOCK_ROWS..][r0..r1];
                if whole == width {
                    (steps.dots)(&k32[r0 * width..r1 * width], width, q32, scores);
                } else {
                    for (p, score) in span.zip(scores.iter_mut()) {
                        let (r, at) = (p - b0, p * rows.stride + rows.offset);
                        let k = &rows.keys[at..at + width];
                        *score = (steps.dot)(
                            &k32[r * width..r * width + whole],
                            q32,
                            k,
                            &q[head.clone()],
                        );
                    }
                }
                for score in scores {
                    *score *= post_scale;
                }
            }
            // The running maximum row by row (a new one rescales by e^(old − new) and weighs
            // its row 1, any other row weighs e^(score − max)), the exponentials then all at
            // once: they depend on nothing but their argument.
            for (h, (max, rescales)) in max.iter_mut().zip(&mut rescales).take(heads).enumerate() {
                *rescales = 0;
                let span = clip(h);
                if span.is_empty() {
                    continue;
                }
                for p in span.clone() {
                    let (r, i) = (p - b0, h * BLOCK_ROWS + p - b0);
                    let s = weights[i];
                    if s > *max {
                        weights[i] = *max - s;
                        *max = s;
                        *rescales |= 1 << r;
                    } else {
                        weights[i] = s - *max;
                    }
                }
                let cells = h * BLOCK_ROWS + span.start - b0..h * BLOCK_ROWS + span.end - b0;
                (steps.exps)(&mut weights[cells.clone()]);
                // By index on purpose: the same loop over zipped `iter_mut`s with
                // `(*f, *w) = (*w, 1.0)` is miscompiled by rustc 1.95 (LLVM's loop vectorizer
                // under AVX2, codegen-units 1 or 4, so release builds only): rescaling rows got
                // factor 1. `scripts/test` runs these kernels' tests in the release profile too.
                for r in span.start - b0..span.end - b0 {
                    let i = h * BLOCK_ROWS + r;
                    if *rescales >> r & 1 == 1 {
                        factors[i] = weights[i];
                        weights[i] = 1.0;
                    } else {
                        factors[i] = 1.0;
                    }
                }
            }
            for (h, sum) in sums.iter_mut().enumerate() {
                let span = clip(h);
                if span.is_empty() {
                    continue;
                }
                let cells = h * BLOCK_ROWS + span.start - b0..h * BLOCK_ROWS + span.end - b0;
                // A local, not `*sum`, carries the chain: through memory each step would wait on
                // the previous store.
                let mut total = *sum;
                for (f, w) in factors[cells.clone()].iter().zip(&weights[cells]) {
                    total = total.mul_add(*f, *w);
                }
                *sum = total;
            }
            for h in 0..heads {
                let span = clip(h);
                let acc = &mut acc32[h * width..(h + 1) * width];
                let (weights, factors) = (&weights[h * BLOCK_ROWS..], &factors[h * BLOCK_ROWS..]);
                // Multiply-adds go in sweeps between the rows where a new maximum rescales.
                let mut run = span.start;
                let mut marks = rescales[h];
                while marks != 0 {
                    let p = b0 + marks.trailing_zeros() as usize;
                    marks &= marks - 1;
                    add_weighted_rows(steps, acc, v32, &rows, (b0, run..p), weights);
                    let f = factors[p - b0];
                    (steps.scale)(&mut acc[..eights], f);
                    for a in &mut acc[eights..] {
                        *a = activations::round_f16(*a * f);
                    }
                    run = p;
                }
                add_weighted_rows(steps, acc, v32, &rows, (b0, run..span.end), weights);
            }
            b0 = b1;
        }
        for (h, f) in acc.iter_mut().zip(&*acc32) {
            *h = crate::quant::f32_to_f16(*f);
        }
    });
    true
}

/// `acc ← f16(acc + v_p·w_p)` for rows `p` of `run` in order (`w_p` at `weights[p − b0]` and
/// `v_p` widened in `v32`, both from row `b0` on; the tail past the whole eights read as f16).
#[inline(always)]
fn add_weighted_rows<W, D, Ds, E, S, M, P>(
    steps: &FusedSteps<W, D, Ds, E, S, M, P>,
    acc: &mut [f32],
    v32: &[f32],
    rows: &KvRows<'_>,
    (b0, run): (usize, Range<usize>),
    weights: &[f32],
) where
    M: Fn(&mut [f32], &[f32], usize, &[f32]),
{
    if run.is_empty() {
        return;
    }
    let width = acc.len();
    let eights = width / 8 * 8;
    let ws = &weights[run.start - b0..run.end - b0];
    let (r0, r1) = ((run.start - b0) * width, (run.end - b0) * width);
    (steps.mad_rows)(&mut acc[..eights], &v32[r0..r1], width, ws);
    if eights < width {
        for (p, w) in run.zip(ws) {
            let at = p * rows.stride + rows.offset;
            let tail = &rows.values[at + eights..at + width];
            for (a, &v) in acc[eights..].iter_mut().zip(tail) {
                *a = activations::round_f16(crate::quant::f16_to_f32(v).mul_add(*w, *a));
            }
        }
    }
}

/// An accumulator of `len` lanes (whole eights) in pieces of 8, 4, 2 or 1 eights, `(first
/// lane, eights)`: the widest piece a SIMD path keeps in registers goes first.
fn register_chunks(len: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut lane = 0;
    std::iter::from_fn(move || {
        let eights = match (len.saturating_sub(lane)) / 8 {
            0 => return None,
            8.. => 8,
            4..=7 => 4,
            2 | 3 => 2,
            _ => 1,
        };
        let piece = (lane, eights);
        lane += 8 * eights;
        Some(piece)
    })
}

/// One head's row loop of [`attend_f16`], around an ISA's dot product, rescale and
/// multiply-add.
fn online_softmax(
    rows: KvRows<'_>,
    span: Range<usize>,
    post_scale: f32,
    acc: &mut [u16],
    mut dot: impl FnMut(&[u16]) -> f32,
    mut scale: impl FnMut(&mut [u16], f32),
    mut mad: impl FnMut(&mut [u16], &[u16], f32),
) -> f32 {
    let width = acc.len();
    let mut sum = 0f32;
    let mut max = f32::NEG_INFINITY;
    for p in span {
        let at = p * rows.stride + rows.offset;
        let (k, v) = (&rows.keys[at..at + width], &rows.values[at..at + width]);
        let s = dot(k) * post_scale;
        let (old_scale, weight) = if s > max {
            let rescale = expf::expf(max - s);
            max = s;
            scale(acc, rescale);
            (rescale, 1.0)
        } else {
            (1.0, expf::expf(s - max))
        };
        mad(acc, v, weight);
        sum = sum.mul_add(old_scale, weight);
    }
    sum
}

/// `a · b` over f16 vectors (keys and queries in attention), on `isa`.
pub fn dot_f16(a: &[u16], b: &[u16], isa: Isa) -> f32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::dot_f16(a, b),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::dot_f16(a, b),
        _ => scalar::dot_f16(a, b),
    }
}

/// `acc ← acc + v·w` over f16 vectors (the attention's weighted values), on `isa`.
pub fn mad_f16(acc: &mut [u16], v: &[u16], w: f32, isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::mad_f16(acc, v, w),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::mad_f16(acc, v, w),
        _ => scalar::mad_f16(acc, v, w),
    }
}

/// `gate ← silu(gate)·up` with ggml's vectorised exponential, on `isa`.
pub fn silu_mul(gate: &mut [f32], up: &[f32], isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::silu_mul(gate, up),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::silu_mul(gate, up),
        _ => scalar::silu_mul(gate, up),
    }
}

/// One token's step of one value head of a Gated DeltaNet state (see `scalar::delta_step`):
/// `s` its rows, `(q, k, v)` the token's query, key and value, `(decay, beta, scale)`, the
/// read scaled into `out`; the same bits on every `isa`.
pub fn delta_step(
    s: &mut [f32],
    qkv: (&[f32], &[f32], &[f32]),
    gates: (f32, f32, f32),
    out: &mut [f32],
    isa: Isa,
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni if x86::supported() => {
            x86::delta::delta_step(s, qkv, gates, out)
        }
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::delta::delta_step(s, qkv, gates, out),
        _ => scalar::delta_step(s, qkv, gates, out),
    }
}

/// `gate ← gelu(gate)·up` with ggml's f16 GELU table, on `isa`.
pub fn gelu_mul(gate: &mut [f32], up: &[f32], isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::gelu_mul(gate, up),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::gelu_mul(gate, up),
        _ => scalar::gelu_mul(gate, up),
    }
}

/// `dst ← f16(src·scale)` (round to nearest even), on `isa`.
pub fn to_f16(src: &[f32], scale: f32, dst: &mut [u16], isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::to_f16(src, scale, dst),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::to_f16(src, scale, dst),
        _ => scalar::to_f16(src, scale, dst),
    }
}

/// Rotary embedding of one head on `isa`: each pair of dimensions turned by its `(sin, cos)`
/// in `pairs`, dimensions `i` and `i + pairs.len()` with `neox`, else `2i` and `2i + 1`.
pub fn rotate_pairs(head: &mut [f32], pairs: &[(f32, f32)], neox: bool, isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::rotate_pairs(head, pairs, neox),
        _ => scalar::rotate_pairs(head, pairs, neox),
    }
}

/// `dst ← src·scale`, `src` in f16, on `isa`.
pub fn from_f16(src: &[u16], scale: f32, dst: &mut [f32], isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::from_f16(src, scale, dst),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::from_f16(src, scale, dst),
        _ => scalar::from_f16(src, scale, dst),
    }
}

/// `acc ← acc·s` over an f16 vector, on `isa`.
pub fn scale_f16(acc: &mut [u16], s: f32, isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::scale_f16(acc, s),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::scale_f16(acc, s),
        _ => scalar::scale_f16(acc, s),
    }
}

/// `x` quantized to Q8_0 blocks appended to `out`, on `isa` (as `activations::quantize_q8_0`).
pub fn quantize_q8_0(x: &[f32], out: &mut Vec<BlockQ8_0>, isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::quantize_q8_0(x, out),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::quantize_q8_0(x, out),
        _ => activations::quantize_q8_0(x, out),
    }
}

/// `x` quantized to Q8_1 blocks appended to `out`, on `isa`.
pub fn quantize_q8_1(x: &[f32], out: &mut Vec<BlockQ8_1>, isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::quantize_q8_1(x, out),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::quantize_q8_1(x, out),
        _ => activations::quantize_q8_1(x, out),
    }
}

/// `x` quantized to Q8_K blocks appended to `out`, on `isa`.
pub fn quantize_q8_k(x: &[f32], out: &mut Vec<BlockQ8K>, isa: Isa) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => x86::quantize_q8_k(x, out),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => arm::quantize_q8_k(x, out),
        _ => activations::quantize_q8_k(x, out),
    }
}

/// Reusable buffers for quantized activations, so the token loop does not allocate.
#[derive(Default, Clone)]
pub struct Scratch {
    q8_0: Vec<BlockQ8_0>,
    q8_1: Vec<BlockQ8_1>,
    q8k: Vec<BlockQ8K>,
}

/// Where products run: the instruction set and the threads.
#[derive(Debug, Clone)]
pub struct Exec {
    /// Instruction set of the kernels.
    pub isa: Isa,
    /// Threads that share each product's rows.
    pub pool: Arc<Pool>,
}

impl Exec {
    /// The best detected instruction set on the shared pool of `threads` threads.
    pub fn new(threads: usize) -> Exec {
        Exec {
            isa: Isa::detect(),
            pool: Pool::shared(threads),
        }
    }
}

/// One product of a fused region: `out = W · x` for each of the input columns.
pub struct Product<'t, 'o> {
    /// The weights.
    pub w: &'t Matrix<'t>,
    /// One output per row of `w` for each input column, column after column.
    pub out: &'o mut [f32],
}

/// Products one region takes at most (query, key and value are three; a token's experts, two
/// for each chosen expert: Qwen 3 MoE's 8 are 16).
pub const MAX_PRODUCTS: usize = 16;

/// Kernels pair rows up, so thread boundaries fall on even rows.
const ROW_ALIGN: usize = 2;

/// Rows a thread takes through every input column before moving on: a few KiB of weights that
/// stay in its L1 cache while they meet each column.
const ROWS_PER_CHUNK: usize = 64;

/// Columns per kernel call in a batch (the results tile lives on the stack).
const MAX_TILE_COLUMNS: usize = 64;

/// Float weights: the dot of each row with `x` on `isa`.
fn float_rows(
    (ty, isa): (TensorType, Isa),
    rows: &[u8],
    rb: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), String> {
    let kind = FloatKind::of(&ty).ok_or_else(|| format!("{} is not a float type", ty.name))?;
    if rb < x.len() * kind.bytes() {
        return Err(format!(
            "{} rows of {rb} bytes cannot take {} values",
            ty.name,
            x.len()
        ));
    }
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb)) {
        *o = float_dot(kind, row, x, isa);
    }
    Ok(())
}

/// How a float weight is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatKind {
    /// 4-byte IEEE single.
    F32,
    /// 2-byte IEEE half.
    F16,
    /// 2-byte bfloat16 (an f32's upper half).
    BF16,
}

impl FloatKind {
    /// The kind of `ty`, if it is a float type.
    pub fn of(ty: &TensorType) -> Option<FloatKind> {
        match ty.name {
            "F32" => Some(FloatKind::F32),
            "F16" => Some(FloatKind::F16),
            "BF16" => Some(FloatKind::BF16),
            _ => None,
        }
    }

    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            FloatKind::F32 => 4,
            FloatKind::F16 | FloatKind::BF16 => 2,
        }
    }
}

/// `row · x` for float weights (`row` holds at least `x.len()` values), on `isa`: eight lanes
/// of fused multiply-adds over consecutive values, folded as `hsum8` folds them, on every path.
pub fn float_dot(kind: FloatKind, row: &[u8], x: &[f32], isa: Isa) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if let Isa::Avx2 | Isa::Avx512Vnni = isa {
        return x86::float_dot(kind, row, x);
    }
    let _ = isa;
    scalar::float_dot(kind, row, x)
}

/// `out = W · x` for every row of `w`, rows split across the pool's threads.
pub fn matvec(
    w: &Matrix<'_>,
    x: &[f32],
    out: &mut [f32],
    exec: &Exec,
    scratch: &mut Scratch,
) -> Result<(), String> {
    matmul(&mut [Product { w, out }], x, 1, exec, scratch)
}

/// Products of the same `columns` input vectors (`xs`, one after another) in one parallel
/// region. Each input is quantized once per dot type; every thread then takes a contiguous
/// share of each product's rows and, chunk by chunk, applies them to every column, so a batch
/// of tokens reads each weight from memory once. A column's result does not depend on the
/// batch it came in or the thread count: it is the same kernel call on the same data.
pub fn matmul(
    products: &mut [Product<'_, '_>],
    xs: &[f32],
    columns: usize,
    exec: &Exec,
    scratch: &mut Scratch,
) -> Result<(), String> {
    let columns = columns.max(1);
    if products.len() > MAX_PRODUCTS {
        return Err(format!(
            "{} products in one region; at most {MAX_PRODUCTS}",
            products.len()
        ));
    }
    // Fixed-size: the token loop does not allocate.
    let mut dots: [Option<(RowDot, &[u8], usize)>; MAX_PRODUCTS] = [None; MAX_PRODUCTS];
    let (mut need_q8_0, mut need_q8_1, mut need_q8k) = (false, false, false);
    let mut width = 0;
    let mut lanes_align = 1;
    for (slot, p) in dots.iter_mut().zip(products.iter()) {
        let w = p.w;
        if xs.len() != w.row_len() * columns || p.out.len() != w.rows() * columns {
            return Err(format!(
                "{}: a [{}, {}] matrix cannot take {} inputs into {} outputs over {columns} columns",
                w.tensor.info.name,
                w.row_len(),
                w.rows(),
                xs.len(),
                p.out.len()
            ));
        }
        let (dot, bytes, rb, rows_together) = w.rows_for(columns, exec.isa)?;
        lanes_align = lanes_align.max(rows_together);
        match dot {
            RowDot::Q8_0(_) => need_q8_0 = true,
            RowDot::Q8_1(_) => need_q8_1 = true,
            RowDot::Q8K(_) => need_q8k = true,
            RowDot::Float(..) => {}
        }
        *slot = Some((dot, bytes, rb));
        width = w.row_len();
    }
    if width == 0 {
        return Ok(());
    }
    let Scratch { q8_0, q8_1, q8k } = scratch;
    q8_0.clear();
    q8_1.clear();
    q8k.clear();
    for x in xs.chunks_exact(width) {
        if need_q8_0 {
            quantize_q8_0(x, q8_0, exec.isa);
        }
        if need_q8_1 {
            quantize_q8_1(x, q8_1, exec.isa);
        }
        if need_q8k {
            quantize_q8_k(x, q8k, exec.isa);
        }
    }
    let (q8_0, q8_1, q8k) = (&*q8_0, &*q8_1, &*q8k);
    let failure = std::sync::Mutex::new(None);
    let used = products.len();
    let mut outs: [&mut [f32]; MAX_PRODUCTS] = Default::default();
    for (slot, p) in outs.iter_mut().zip(products.iter_mut()) {
        *slot = &mut *p.out;
    }
    // Even shares for batches too: each thread walks one contiguous range, which keeps the
    // hardware prefetcher on its stream. Claimed 16-row ranges made a 2-token pass cost 1.7
    // one-token passes on two threads (against 1.15 with even shares: `engine bench --batch`),
    // the claims' shared counter and the jumps between ranges costing more than any wait.
    let align = if columns == 1 {
        ROW_ALIGN.max(lanes_align)
    } else {
        ROWS_PER_CHUNK.max(lanes_align)
    };
    exec.pool.for_each_share(
        &mut outs[..used],
        columns,
        align,
        Schedule::Even,
        &|which, mut share| {
            let Some((dot, bytes, rb)) = dots[which] else {
                return;
            };
            let (start, end) = (share.start, share.end);
            if columns == 1 {
                // One token: the whole share in one call, rows streaming from memory.
                let rows = &bytes[start * rb..end * rb];
                let out = share.column(0);
                match dot {
                    RowDot::Q8_0(f) => f(rows, rb, q8_0, 1, out),
                    RowDot::Q8_1(f) => f(rows, rb, q8_1, 1, out),
                    RowDot::Q8K(f) => f(rows, rb, q8k, 1, out),
                    RowDot::Float(ty, isa) => {
                        if let Err(e) = float_rows((ty, isa), rows, rb, xs, out) {
                            *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        }
                    }
                }
                return;
            }
            // A batch: a chunk of rows meets every column while it is in cache.
            let mut tile = [0f32; ROWS_PER_CHUNK * MAX_TILE_COLUMNS];
            for chunk in (start..end).step_by(ROWS_PER_CHUNK) {
                let chunk_end = (chunk + ROWS_PER_CHUNK).min(end);
                let n = chunk_end - chunk;
                let rows = &bytes[chunk * rb..chunk_end * rb];
                for c0 in (0..columns).step_by(MAX_TILE_COLUMNS) {
                    let nc = (columns - c0).min(MAX_TILE_COLUMNS);
                    let tile = &mut tile[..n * nc];
                    let span = |len: usize| {
                        let per = len / columns;
                        c0 * per..(c0 + nc) * per
                    };
                    match dot {
                        RowDot::Q8_0(f) => f(rows, rb, &q8_0[span(q8_0.len())], nc, tile),
                        RowDot::Q8_1(f) => f(rows, rb, &q8_1[span(q8_1.len())], nc, tile),
                        RowDot::Q8K(f) => f(rows, rb, &q8k[span(q8k.len())], nc, tile),
                        RowDot::Float(ty, isa) => {
                            for (c, out) in tile.chunks_exact_mut(n).enumerate() {
                                let x = &xs[(c0 + c) * width..(c0 + c + 1) * width];
                                if let Err(e) = float_rows((ty, isa), rows, rb, x, out) {
                                    *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                                    return;
                                }
                            }
                        }
                    }
                    for (c, results) in tile.chunks_exact(n).enumerate() {
                        share.column(c0 + c)[chunk - start..chunk_end - start]
                            .copy_from_slice(results);
                    }
                }
            }
        },
    );
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_file::Tensor;
    use crate::quant::{self, f32_to_f16};

    /// The Gated DeltaNet step on every ISA this CPU has gives the scalar reference's bits:
    /// state rows, reads, over several tokens, at widths with and without a tail.
    #[test]
    fn delta_steps_match_the_reference_bit_for_bit() {
        let mut rng = Bytes(0x5eed);
        for width in [8, 13, 32, 128] {
            let value = |rng: &mut Bytes| (f32::from(rng.next()) - 128.0) / 300.0;
            let start: Vec<f32> = (0..width * width).map(|_| value(&mut rng)).collect();
            let tokens: Vec<Vec<f32>> = (0..4)
                .map(|_| (0..3 * width).map(|_| value(&mut rng)).collect())
                .collect();
            let run = |isa: Isa| {
                let mut s = start.clone();
                let mut reads = Vec::new();
                for (t, qkv) in tokens.iter().enumerate() {
                    let (q, rest) = qkv.split_at(width);
                    let (k, v) = rest.split_at(width);
                    let mut out = vec![0f32; width];
                    let gates = (0.9 - 0.1 * t as f32, 0.3 + 0.1 * t as f32, 0.125);
                    delta_step(&mut s, (q, k, v), gates, &mut out, isa);
                    reads.extend(out);
                }
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                (bits(&s), bits(&reads))
            };
            let reference = run(Isa::Scalar);
            for isa in Isa::available() {
                assert_eq!(run(isa), reference, "{isa:?}, width {width}");
            }
        }
    }

    /// Deterministic bytes (xorshift), so failures reproduce.
    struct Bytes(u64);

    impl Bytes {
        fn next(&mut self) -> u8 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 24) as u8
        }
    }

    fn tensor_type(name: &str) -> TensorType {
        (0..64)
            .filter_map(gguf::TensorType::from_id)
            .find(|t| t.name == name)
            .expect("known type")
    }

    /// A random row of `elements` values of `name`, its f16 scale fields set to sane values.
    fn random_row(name: &str, elements: usize, rng: &mut Bytes) -> Vec<u8> {
        let ty = tensor_type(name);
        let size = ty.block_bytes as usize;
        let blocks = elements / ty.block_elements as usize;
        let scale_fields: &[usize] = match name {
            "Q4_1" | "Q5_1" | "Q4_K" | "Q5_K" => &[0, 2],
            "Q6_K" => &[208],
            _ => &[0],
        };
        let mut row: Vec<u8> = (0..size * blocks).map(|_| rng.next()).collect();
        for block in row.chunks_exact_mut(size) {
            for &at in scale_fields {
                let value = (f32::from(block[at]) - 100.0) / 4000.0;
                block[at..at + 2].copy_from_slice(&f32_to_f16(value).to_le_bytes());
            }
        }
        row
    }

    fn activations(n: usize, rng: &mut Bytes) -> Vec<f32> {
        (0..n)
            .map(|i| (f32::from(rng.next()) - 128.0) / 50.0 * if i % 17 == 0 { 8.0 } else { 1.0 })
            .collect()
    }

    const TYPES: [&str; 9] = [
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q4_K", "Q5_K", "Q6_K",
    ];

    /// The dot of the row with the activations as quantized, from the float references.
    fn expected(ty: &TensorType, row: &[u8], x: &[f32]) -> (f64, f64) {
        let mut w = vec![0f32; x.len()];
        quant::dequantize(ty, row, &mut w).expect("dequantize");
        let dequantized: Vec<f32> = match row_dot(ty, Isa::Scalar).expect("kernel") {
            RowDot::Q8_0(_) => {
                let mut q = Vec::new();
                activations::quantize_q8_0(x, &mut q);
                q.iter()
                    .flat_map(|b| b.qs.map(|v| f32::from(v) * b.d))
                    .collect()
            }
            RowDot::Q8_1(_) => {
                let mut q = Vec::new();
                activations::quantize_q8_1(x, &mut q);
                q.iter()
                    .flat_map(|b| b.qs.map(|v| f32::from(v) * b.d))
                    .collect()
            }
            RowDot::Q8K(_) => {
                let mut q = Vec::new();
                activations::quantize_q8_k(x, &mut q);
                q.iter()
                    .flat_map(|b| b.qs.map(|v| f32::from(v) * b.d))
                    .collect()
            }
            RowDot::Float(..) => x.to_vec(),
        };
        let sum = w
            .iter()
            .zip(&dequantized)
            .map(|(a, b)| f64::from(*a) * f64::from(*b));
        let magnitude = w
            .iter()
            .zip(&dequantized)
            .map(|(a, b)| f64::from((a * b).abs()));
        (sum.sum(), magnitude.sum())
    }

    /// The dots of `rows` consecutive rows in `w` with each column of `xs` (column-major out).
    fn run_rows(dot: RowDot, w: &[u8], rows: usize, xs: &[f32], columns: usize) -> Vec<f32> {
        let mut s = Scratch::default();
        let row_bytes = w.len() / rows;
        let width = xs.len() / columns;
        let mut out = vec![0f32; rows * columns];
        match dot {
            RowDot::Q8_0(f) => {
                xs.chunks_exact(width)
                    .for_each(|x| activations::quantize_q8_0(x, &mut s.q8_0));
                f(w, row_bytes, &s.q8_0, columns, &mut out);
            }
            RowDot::Q8_1(f) => {
                xs.chunks_exact(width)
                    .for_each(|x| activations::quantize_q8_1(x, &mut s.q8_1));
                f(w, row_bytes, &s.q8_1, columns, &mut out);
            }
            RowDot::Q8K(f) => {
                xs.chunks_exact(width)
                    .for_each(|x| activations::quantize_q8_k(x, &mut s.q8k));
                f(w, row_bytes, &s.q8k, columns, &mut out);
            }
            RowDot::Float(ty, isa) => {
                for (outs, x) in out.chunks_exact_mut(rows).zip(xs.chunks_exact(width)) {
                    float_rows((ty, isa), w, row_bytes, x, outs).expect("dot");
                }
            }
        }
        out
    }

    fn run(dot: RowDot, row: &[u8], x: &[f32]) -> f32 {
        run_rows(dot, row, 1, x, 1)[0]
    }

    #[test]
    fn scalar_kernels_compute_the_dot_of_the_dequantized_values() {
        let mut rng = Bytes(0x9e37_79b9_7f4a_7c15);
        for name in TYPES {
            let ty = tensor_type(name);
            for _ in 0..20 {
                let row = random_row(name, 512, &mut rng);
                let x = activations(512, &mut rng);
                let (want, magnitude) = expected(&ty, &row, &x);
                let got = run(row_dot(&ty, Isa::Scalar).expect("kernel"), &row, &x);
                assert!(
                    (f64::from(got) - want).abs() <= 1e-5 * magnitude + 1e-6,
                    "{name}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn every_isa_matches_the_scalar_reference_bit_for_bit() {
        let mut rng = Bytes(0x2545_f491_4f6c_dd1d);
        for isa in Isa::available() {
            for name in TYPES {
                let ty = tensor_type(name);
                for _ in 0..50 {
                    let row = random_row(name, 768, &mut rng);
                    let x = activations(768, &mut rng);
                    let reference = run(row_dot(&ty, Isa::Scalar).expect("scalar"), &row, &x);
                    let got = run(row_dot(&ty, isa).expect("kernel"), &row, &x);
                    assert_eq!(got.to_bits(), reference.to_bits(), "{name} on {isa:?}");
                }
                // Tiles of rows × columns (kernels group both; other counts leave tails): 21
                // rows are a whole tile of 16 in lanes and a part one.
                let rows: Vec<u8> = (0..21)
                    .flat_map(|_| random_row(name, 768, &mut rng))
                    .collect();
                for columns in 1..=9 {
                    let xs = activations(768 * columns, &mut rng);
                    let scalar = row_dot(&ty, Isa::Scalar).expect("scalar");
                    let reference = run_rows(scalar, &rows, 21, &xs, columns);
                    let got = run_rows(row_dot(&ty, isa).expect("kernel"), &rows, 21, &xs, columns);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&got),
                        bits(&reference),
                        "{name} {columns} columns on {isa:?}"
                    );
                }
                // The copy with rows side by side gives each stored row's result: two groups
                // of sixteen, columns in chunks of four and a tail.
                #[cfg(target_arch = "x86_64")]
                if let Some(kind) = row_lanes::LaneKind::of(name)
                    && matches!(isa, Isa::Avx2 | Isa::Avx512Vnni)
                {
                    let dot = x86::lanes_dot(kind, isa == Isa::Avx512Vnni).expect("kernel");
                    let rows: Vec<u8> = (0..32)
                        .flat_map(|_| random_row(name, 768, &mut rng))
                        .collect();
                    let copy = row_lanes::interleave(kind, &rows, rows.len() / 32).expect("copy");
                    for columns in 1..=9 {
                        let xs = activations(768 * columns, &mut rng);
                        let scalar = row_dot(&ty, Isa::Scalar).expect("scalar");
                        let reference = run_rows(scalar, &rows, 32, &xs, columns);
                        let got = run_rows(dot, &copy, 32, &xs, columns);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got),
                            bits(&reference),
                            "{name} side by side, {columns} columns on {isa:?}"
                        );
                    }
                }
            }
            // Activation quantization: ordinary values, a block of zeros, ties, the largest
            // magnitude reached twice with opposite signs (Q8_K keeps the first), and blocks
            // too small for a finite inverse scale.
            let mut xs = activations(4096, &mut rng);
            xs[256..512].fill(0.0);
            xs[512..544].copy_from_slice(&[0.5; 32]);
            xs[512..516].copy_from_slice(&[127.0, 1.5, 2.5, -0.5]);
            for (i, v) in xs[3072..3328].iter_mut().enumerate() {
                *v = [1e-38, -2e-38, 0.0, 3e-39][i % 4];
            }
            (xs[800], xs[900]) = (-30.0, 30.0);
            (xs[1100], xs[1030]) = (25.0, -25.0);
            (xs[1290], xs[1293]) = (40.0, -40.0);
            // Scales (amax / 127) across f16's whole range, which the SIMD paths round to f16
            // precision their own way: subnormal, normal, past the largest f16 (and sums `d·Σq`
            // past it too).
            for (block, chunk) in xs[1536..3072].chunks_exact_mut(32).enumerate() {
                let exponent = block as i32 % 48 - 30;
                let scale = 2f32.powi(exponent) * (1.0 + (block * 37 % 101) as f32 / 101.0);
                for v in chunk.iter_mut() {
                    *v *= scale;
                }
            }
            let (mut a, mut b) = (Vec::new(), Vec::new());
            quantize_q8_0(&xs, &mut a, isa);
            activations::quantize_q8_0(&xs, &mut b);
            assert!(a == b, "quantize_q8_0 on {isa:?}");
            let (mut a, mut b) = (Vec::new(), Vec::new());
            quantize_q8_1(&xs, &mut a, isa);
            activations::quantize_q8_1(&xs, &mut b);
            assert!(a == b, "quantize_q8_1 on {isa:?}");
            let (mut a, mut b) = (Vec::new(), Vec::new());
            quantize_q8_k(&xs, &mut a, isa);
            activations::quantize_q8_k(&xs, &mut b);
            assert!(a == b, "quantize_q8_k on {isa:?}");
            // Conversions and GELU, including the clamps at ±10 and values that round across them.
            let mut values: Vec<f32> = (0..1000)
                .map(|_| (f32::from(rng.next()) - 128.0) / 11.0 * f32::from(rng.next() % 4 + 1))
                .collect();
            values.extend([
                -10.0, 10.0, -9.999, 9.999, -10.001, 1e-7, -0.0, 70000.0, 3e-5,
            ]);
            let up: Vec<f32> = values.iter().map(|v| 1.5 - v / 7.0).collect();
            let (mut got, mut want) = (values.clone(), values.clone());
            gelu_mul(&mut got, &up, isa);
            gelu_mul(&mut want, &up, Isa::Scalar);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "gelu_mul on {isa:?}");
            let (mut h, mut h_want) = (vec![0u16; values.len()], vec![0u16; values.len()]);
            to_f16(&values, 0.3, &mut h, isa);
            to_f16(&values, 0.3, &mut h_want, Isa::Scalar);
            assert_eq!(h, h_want, "to_f16 on {isa:?}");
            from_f16(&h, 1.7, &mut got, isa);
            from_f16(&h, 1.7, &mut want, Isa::Scalar);
            assert_eq!(bits(&got), bits(&want), "from_f16 on {isa:?}");
            for len in [32, 64, 72, 256, 5] {
                let halves = |rng: &mut Bytes| -> Vec<u16> {
                    (0..len)
                        .map(|_| f32_to_f16((f32::from(rng.next()) - 128.0) / 64.0))
                        .collect()
                };
                let (a, b) = (halves(&mut rng), halves(&mut rng));
                assert_eq!(
                    dot_f16(&a, &b, isa).to_bits(),
                    dot_f16(&a, &b, Isa::Scalar).to_bits(),
                    "dot_f16 {len} on {isa:?}"
                );
                let (mut acc, mut reference) = (a.clone(), a.clone());
                mad_f16(&mut acc, &b, 0.37, isa);
                mad_f16(&mut reference, &b, 0.37, Isa::Scalar);
                assert_eq!(acc, reference, "mad_f16 {len} on {isa:?}");
                scale_f16(&mut acc, 0.61, isa);
                scale_f16(&mut reference, 0.61, Isa::Scalar);
                assert_eq!(acc, reference, "scale_f16 {len} on {isa:?}");
            }
            // Fine values, many of them: a fused multiply-add and a separate multiply and add
            // round to a different f16 only now and then, and this many elements show it.
            let fine = |rng: &mut Bytes| -> Vec<u16> {
                (0..1 << 20)
                    .map(|_| {
                        let bits = u16::from(rng.next()) << 8 | u16::from(rng.next());
                        f32_to_f16((f32::from(bits) - 32768.0) / 4096.0)
                    })
                    .collect()
            };
            let (a, b) = (fine(&mut rng), fine(&mut rng));
            let (mut acc, mut reference) = (a.clone(), a);
            mad_f16(&mut acc, &b, 0.3721, isa);
            mad_f16(&mut reference, &b, 0.3721, Isa::Scalar);
            assert!(acc == reference, "mad_f16 on fine values on {isa:?}");
        }
    }

    /// Every weight and activation at its extreme, so each lane sums four of the largest
    /// products a block can hold (Q8_0: −128 · −127): the batched kernels take a lane sum to
    /// float by adding it to 1.5·2²³ (exact below 2²²), and this is the largest they meet.
    #[test]
    fn largest_lane_sums_match_the_scalar_reference_on_every_isa() {
        for isa in Isa::available() {
            for name in ["Q4_0", "Q4_1", "Q5_0", "Q8_0"] {
                let ty = tensor_type(name);
                let scalar = row_dot(&ty, Isa::Scalar).expect("scalar");
                let kernel = row_dot(&ty, isa).expect("kernel");
                for fill in [0x00u8, 0xff, 0x80, 0x7f, 0x0f, 0xf0] {
                    let mut rows = vec![fill; 5 * 24 * ty.block_bytes as usize];
                    for block in rows.chunks_exact_mut(ty.block_bytes as usize) {
                        block[..2].copy_from_slice(&f32_to_f16(0.01).to_le_bytes());
                    }
                    for (columns, sign) in [(1, 1.0), (2, -1.0), (5, -1.0), (8, 1.0), (9, -1.0)] {
                        let xs: Vec<f32> = (0..768 * columns)
                            .map(|i| if i % 64 < 32 { sign * 3.0 } else { -sign * 3.0 })
                            .collect();
                        let reference = run_rows(scalar, &rows, 5, &xs, columns);
                        let got = run_rows(kernel, &rows, 5, &xs, columns);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&got),
                            bits(&reference),
                            "{name} filled with {fill:#x}, {columns} columns on {isa:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn rotations_match_the_scalar_reference_on_every_isa() {
        let mut rng = Bytes(0x0bad_5eed_1234_4321);
        for isa in Isa::available() {
            for neox in [false, true] {
                for half in [1, 16, 32, 64, 128] {
                    let head = activations(2 * half, &mut rng);
                    let pairs: Vec<(f32, f32)> = (0..half)
                        .map(|i| {
                            let angle = (i as f32 + 0.3) * 0.7;
                            (angle.sin(), angle.cos())
                        })
                        .collect();
                    let (mut simd, mut reference) = (head.clone(), head);
                    rotate_pairs(&mut simd, &pairs, neox, isa);
                    scalar::rotate_pairs(&mut reference, &pairs, neox);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(&simd),
                        bits(&reference),
                        "{half} pairs, neox {neox}, {isa:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn silu_matches_the_scalar_reference_on_every_isa() {
        // Ordinary values, the saturating range past ±88 and beyond, zeros and a ragged tail.
        let gate: Vec<f32> = (0..4099)
            .map(|i| match i % 7 {
                0 => (i as f32 - 2000.0) * 0.1,
                1 => 0.0,
                2 => -0.0,
                _ => ((i * 7919) % 2001) as f32 / 100.0 - 10.0,
            })
            .collect();
        let up: Vec<f32> = (0..4099)
            .map(|i| ((i * 31) % 97) as f32 / 13.0 - 3.0)
            .collect();
        for isa in Isa::available() {
            let (mut simd, mut reference) = (gate.clone(), gate.clone());
            silu_mul(&mut simd, &up, isa);
            scalar::silu_mul(&mut reference, &up);
            for (i, (a, b)) in simd.iter().zip(&reference).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{i} on {isa:?}: {a} vs {b}"
                );
            }
        }
    }

    #[test]
    fn float_rows_match_the_scalar_reference_bit_for_bit_and_the_exact_dot_closely() {
        let mut rng = Bytes(0x1234_5678_9abc_def1);
        for (name, kind) in [
            ("F32", FloatKind::F32),
            ("F16", FloatKind::F16),
            ("BF16", FloatKind::BF16),
        ] {
            for n in [1, 7, 8, 9, 64, 333, 2048] {
                let values = activations(n, &mut rng);
                let row: Vec<u8> = match kind {
                    FloatKind::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    FloatKind::F16 => values
                        .iter()
                        .flat_map(|&v| f32_to_f16(v).to_le_bytes())
                        .collect(),
                    FloatKind::BF16 => values
                        .iter()
                        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                        .collect(),
                };
                let x = activations(n, &mut rng);
                let reference = float_dot(kind, &row, &x, Isa::Scalar);
                let mut exact = vec![0f32; n];
                quant::dequantize(&tensor_type(name), &row, &mut exact).expect("dequantize");
                let want: f64 = exact
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let scale: f64 = exact
                    .iter()
                    .zip(&x)
                    .map(|(a, b)| f64::from((a * b).abs()))
                    .sum();
                assert!(
                    (f64::from(reference) - want).abs() <= 1e-5 * scale.max(1.0),
                    "{name} × {n}: {reference} vs {want}"
                );
                for isa in Isa::available() {
                    let got = float_dot(kind, &row, &x, isa);
                    assert_eq!(
                        got.to_bits(),
                        reference.to_bits(),
                        "{name} × {n} on {isa:?}"
                    );
                }
            }
        }
    }

    /// Attention gives the scalar reference's bits on every ISA, for any number of heads going
    /// through the rows together (1 to past the fused path's limit), each with its own rows (a
    /// pass's later tokens see more; a sliding window starts later; none; from a block's first
    /// row) across block boundaries, head widths with and without a tail (of the 32-value dot
    /// steps and of the 8-value ones, down to a head narrower than 8), and a score that keeps
    /// rising (every row rescales) as well as a mixed one.
    #[test]
    fn attention_matches_the_scalar_reference_on_every_isa() {
        let mut rng = Bytes(0x2545_f491_4f6c_dd1d);
        for (width, heads, kv_heads, positions) in [
            (64, 3, 2, 40),
            (72, 1, 1, 9),
            (256, 4, 1, 17),
            (256, 32, 1, 70),
            (8, 9, 3, 5),
            (40, 2, 1, 3),
            (64, 24, 3, 75),
            (512, 16, 1, 12),
            (64, 40, 1, 33),
            (36, 5, 2, 41),
            (4, 3, 1, 9),
        ] {
            let mut halves = |n: usize, spread: f32| -> Vec<u16> {
                (0..n)
                    .map(|_| f32_to_f16((f32::from(rng.next()) - 128.0) / spread))
                    .collect()
            };
            let stride = kv_heads * width;
            let keys = halves(positions * stride, 64.0);
            let values = halves(positions * stride, 32.0);
            let q = halves(heads * width, 16.0);
            let mut rising = keys.clone();
            for (p, row) in rising.chunks_exact_mut(stride).enumerate() {
                row.fill(f32_to_f16(p as f32 / 8.0));
            }
            // Heads in threes share a token: the last token sees every row, each earlier one
            // a row less; every other token's window starts a few rows later.
            let tokens = heads.div_ceil(3);
            let spans: Vec<Range<usize>> = (0..heads)
                .map(|h| {
                    let token = h / 3;
                    let end = positions - (tokens - 1 - token).min(positions - 1);
                    let first = if token % 2 == 1 { (end / 3).max(1) } else { 1 };
                    match h % 7 {
                        // A head that attends to nothing, and one from a block's first row.
                        4 => end / 2..end / 2,
                        6 => BLOCK_ROWS.min(end)..end,
                        _ => first.min(end)..end,
                    }
                })
                .collect();
            for keys in [&keys, &rising] {
                let rows = KvRows {
                    keys,
                    values: &values,
                    stride,
                    offset: (kv_heads - 1) * width,
                };
                let queries = Queries {
                    q: &q,
                    width,
                    spans: &spans,
                    post_scale: 0.125,
                };
                let run = |isa: Isa| {
                    let (mut acc, mut sums) = (vec![0u16; heads * width], vec![0f32; heads]);
                    attend_f16(queries, rows, &mut acc, &mut sums, isa);
                    (acc, sums.iter().map(|s| s.to_bits()).collect::<Vec<_>>())
                };
                let want = run(Isa::Scalar);
                for isa in Isa::available() {
                    assert_eq!(run(isa), want, "attention {width}×{heads} on {isa:?}");
                }
            }
        }
    }

    /// CI names the instruction sets it expects (`ENGINE_REQUIRE_ISA=Neon` under qemu-user,
    /// `Avx2,Avx512Vnni` where the CPU reports VNNI), so a machine without one fails here
    /// instead of comparing the reference with itself.
    #[test]
    fn the_required_isas_are_detected() {
        let found = Isa::available();
        for name in required_isas() {
            assert!(
                found.iter().any(|i| format!("{i:?}") == name),
                "{name} not among {found:?}"
            );
        }
    }

    /// The names in `ENGINE_REQUIRE_ISA` (comma-separated).
    fn required_isas() -> Vec<String> {
        std::env::var("ENGINE_REQUIRE_ISA")
            .unwrap_or_default()
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect()
    }

    /// Batches read Q5_0 weights widened to Q8_0; every result stays what the stored rows give.
    #[test]
    fn widened_q5_0_batches_equal_the_stored_rows_bit_for_bit() {
        let mut rng = Bytes(0x5851_f42d_4c95_7f2d);
        let (width, rows) = (640, 6);
        let bytes: Vec<u8> = (0..rows)
            .flat_map(|_| random_row("Q5_0", width, &mut rng))
            .collect();
        let info = gguf::TensorInfo {
            name: "w".into(),
            dims: vec![width as u64, rows as u64],
            tensor_type: tensor_type("Q5_0"),
            offset: 0,
            size: bytes.len() as u64,
            span: 0..0,
        };
        let tensor = Tensor {
            info: &info,
            bytes: &bytes,
        };
        let mut budget = WIDEN_BUDGET;
        let wide = Matrix::widened(tensor, &mut budget);
        assert_eq!(wide.copied_bytes(), bytes.len() / 22 * 34);
        assert_eq!(budget, WIDEN_BUDGET - wide.copied_bytes());
        let mut none_left = 100;
        assert_eq!(Matrix::widened(tensor, &mut none_left).copied_bytes(), 0);
        let stored = Matrix::stored(tensor);
        let mut scratch = Scratch::default();
        for isa in Isa::available() {
            let exec = Exec {
                isa,
                pool: Pool::shared(2),
            };
            for columns in [1, 2, 5, 8, 13] {
                let xs = activations(width * columns, &mut rng);
                let mut results = [vec![0f32; rows * columns], vec![0f32; rows * columns]];
                for (m, out) in [&wide, &stored].into_iter().zip(&mut results) {
                    matmul(
                        &mut [Product { w: m, out }],
                        &xs,
                        columns,
                        &exec,
                        &mut scratch,
                    )
                    .expect("product");
                }
                let reference = run_rows(
                    row_dot(&info.tensor_type, Isa::Scalar).expect("scalar"),
                    &bytes,
                    rows,
                    &xs,
                    columns,
                );
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&results[0]), bits(&reference), "{columns} on {isa:?}");
                assert_eq!(bits(&results[1]), bits(&reference), "{columns} on {isa:?}");
            }
        }
    }

    #[test]
    fn matvec_refuses_mismatched_shapes() {
        let mut rng = Bytes(7);
        let bytes = random_row("Q8_0", 128, &mut rng);
        let ty = tensor_type("Q8_0");
        let info = gguf::TensorInfo {
            name: "w".into(),
            dims: vec![64, 2],
            tensor_type: ty,
            offset: 0,
            size: bytes.len() as u64,
            span: 0..0,
        };
        let w = Matrix::stored(Tensor {
            info: &info,
            bytes: &bytes,
        });
        let mut out = [0f32; 2];
        let mut scratch = Scratch::default();
        let exec = Exec {
            isa: Isa::Scalar,
            pool: Pool::shared(2),
        };
        assert!(matvec(&w, &[0.0; 32], &mut out, &exec, &mut scratch).is_err());
        assert!(matvec(&w, &[0.0; 64], &mut [0f32; 3], &exec, &mut scratch).is_err());
        matvec(&w, &[1.0; 64], &mut out, &exec, &mut scratch).expect("fits");
    }
}
