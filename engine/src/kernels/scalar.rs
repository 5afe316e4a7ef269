//! The plain reference for every row dot product: integer sums per block, then the block's
//! scales, in the order ggml's generic kernels use. Every SIMD kernel is tested against these.
//!
//! Each function takes one weight row (whole blocks) and the activations quantized to the
//! weight type's dot type; a row with fewer blocks than activations (or more) only pairs up
//! what both hold, so a mismatch cannot read out of bounds (the caller checks lengths).

use super::activations::{BlockQ8_0, BlockQ8_1, BlockQ8K};
use crate::quant::{IQ4_NL_LEVELS, f16_at, f16_to_f32, f32_to_f16, scale_min};

/// Unpacks the 32 low/high-nibble values of a Q4-style block (elements 0–15 low, 16–31 high).
fn nibbles(qs: &[u8]) -> [i32; 32] {
    let mut v = [0i32; 32];
    for (j, &q) in qs.iter().take(16).enumerate() {
        v[j] = i32::from(q & 0x0f);
        v[j + 16] = i32::from(q >> 4);
    }
    v
}

/// Adds the fifth bit from `qh` to each nibble value.
fn with_fifth_bits(mut v: [i32; 32], qh: &[u8]) -> [i32; 32] {
    let qh = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    for (j, x) in v.iter_mut().enumerate() {
        *x |= (((qh >> j) & 1) << 4) as i32;
    }
    v
}

/// Sums of 4 consecutive products, as one 256-bit vector of i32 lanes holds them.
fn lane_sums(v: &[i32; 32], qs: &[i8; 32]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (k, lane) in lanes.iter_mut().enumerate() {
        *lane = (4 * k..4 * k + 4).map(|j| v[j] * i32::from(qs[j])).sum();
    }
    lanes
}

/// Eight f32 accumulators folded the way the AVX2 kernels fold them, so that this reference
/// and the SIMD code give bit-identical results.
pub(super) fn hsum8(l: [f32; 8]) -> f32 {
    let r = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// Float weights · f32 activations: value i goes to lane i mod 8 by a fused multiply-add, and
/// the lanes fold as [`hsum8`] folds them (the order the SIMD paths keep).
pub fn float_dot(kind: super::FloatKind, row: &[u8], x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for (i, &v) in x.iter().enumerate() {
        acc[i % 8] = float_at(kind, row, i).mul_add(v, acc[i % 8]);
    }
    hsum8(acc)
}

/// Value `i` of a float row (conversions exact, as F16C's and the shift's are).
pub(super) fn float_at(kind: super::FloatKind, row: &[u8], i: usize) -> f32 {
    use super::FloatKind;
    match kind {
        FloatKind::F32 => {
            f32::from_le_bytes([row[4 * i], row[4 * i + 1], row[4 * i + 2], row[4 * i + 3]])
        }
        FloatKind::F16 => f16_at(row, 2 * i),
        FloatKind::BF16 => {
            f32::from_bits(u32::from(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])) << 16)
        }
    }
}

/// A 32-element format: block size, the unpacked values, and the offset term (Q4_1/Q5_1's
/// `m·s`, none for the symmetric formats).
fn legacy<Y: Copy>(
    row: &[u8],
    x: &[Y],
    block_bytes: usize,
    values: impl Fn(&[u8]) -> [i32; 32],
    act: impl Fn(&Y) -> (f32, &[i8; 32], f32),
    offset: bool,
) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (b, y) in row.chunks_exact(block_bytes).zip(x) {
        let (dy, qs, sy) = act(y);
        let d = f16_at(b, 0) * dy;
        for (a, lane) in acc.iter_mut().zip(lane_sums(&values(b), qs)) {
            *a = d.mul_add(lane as f32, *a);
        }
        if offset {
            summs = f16_at(b, 2).mul_add(sy, summs);
        }
    }
    hsum8(acc) + summs
}

fn q8_0_act(y: &BlockQ8_0) -> (f32, &[i8; 32], f32) {
    (y.d, &y.qs, 0.0)
}

fn q8_1_act(y: &BlockQ8_1) -> (f32, &[i8; 32], f32) {
    (y.d, &y.qs, y.s)
}

pub fn q4_0(row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let values = |b: &[u8]| nibbles(&b[2..18]).map(|q| q - 8);
    legacy(row, x, 18, values, q8_0_act, false)
}

pub fn q4_1(row: &[u8], x: &[BlockQ8_1]) -> f32 {
    legacy(row, x, 20, |b| nibbles(&b[4..20]), q8_1_act, true)
}

pub fn q5_0(row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let values = |b: &[u8]| with_fifth_bits(nibbles(&b[6..22]), &b[2..6]).map(|q| q - 16);
    legacy(row, x, 22, values, q8_0_act, false)
}

pub fn q5_1(row: &[u8], x: &[BlockQ8_1]) -> f32 {
    let values = |b: &[u8]| with_fifth_bits(nibbles(&b[8..24]), &b[4..8]);
    legacy(row, x, 24, values, q8_1_act, true)
}

pub fn q8_0(row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let values = |b: &[u8]| {
        let mut v = [0i32; 32];
        for (o, &q) in v.iter_mut().zip(&b[2..34]) {
            *o = i32::from(q as i8);
        }
        v
    };
    legacy(row, x, 34, values, q8_0_act, false)
}

pub fn iq4_nl(row: &[u8], x: &[BlockQ8_0]) -> f32 {
    let values = |b: &[u8]| nibbles(&b[2..18]).map(|q| i32::from(IQ4_NL_LEVELS[q as usize]));
    legacy(row, x, 18, values, q8_0_act, false)
}

/// Q4_K / Q5_K share everything but the unpacking of the 256 values: a block's two exact
/// integer sums, Σ scale·value·activation and Σ min·activations over its eight sub-blocks of
/// 32. Integers add up the same in any order, so a kernel may gather them in any lane layout
/// (per row or per column) and still give these sums; only the float steps are fixed.
fn k_sums(b: &[u8], y: &BlockQ8K, values: &[i32; 256]) -> (i32, i32) {
    let packed = &b[4..16];
    let (mut sumi, mut summ) = (0i32, 0i32);
    for j in 0..8 {
        let (sc, m) = scale_min(j, packed);
        let (sc, m) = (i32::from(sc), i32::from(m));
        let sub: i32 = values[32 * j..32 * j + 32]
            .iter()
            .zip(&y.qs[32 * j..32 * j + 32])
            .map(|(a, &q)| a * i32::from(q))
            .sum();
        sumi += sc * sub;
        summ += m * (i32::from(y.bsums[2 * j]) + i32::from(y.bsums[2 * j + 1]));
    }
    (sumi, summ)
}

/// A Q4_K block's eight 6-bit scales and mins, unpacked.
pub(super) fn q4_k_scales(b: &[u8]) -> ([i16; 8], [i32; 8]) {
    let (mut sc, mut m) = ([0i16; 8], [0i32; 8]);
    for j in 0..8 {
        let (s, n) = scale_min(j, &b[4..16]);
        (sc[j], m[j]) = (i16::from(s), i32::from(n));
    }
    (sc, m)
}

/// Q4_K: block by block, `sumi · (dy·d)` into one sum and `summ · (dy·dmin)` into another
/// (fused multiply-adds), their difference at the end: the float steps of ggml's repacked Q4_K
/// products, which llama.cpp runs for prompts on x86.
pub fn q4_k(row: &[u8], x: &[BlockQ8K]) -> f32 {
    let mut acc = [0f32; 2];
    for (b, y) in row.chunks_exact(144).zip(x) {
        let mut values = [0i32; 256];
        for (j, qs) in b[16..144].chunks_exact(32).enumerate() {
            for (l, &q) in qs.iter().enumerate() {
                values[64 * j + l] = i32::from(q & 0x0f);
                values[64 * j + 32 + l] = i32::from(q >> 4);
            }
        }
        let (sumi, summ) = k_sums(b, y, &values);
        k_step(&mut acc, sumi, y.d * f16_at(b, 0), summ, y.d * f16_at(b, 2));
    }
    acc[0] - acc[1]
}

/// One K-quant block into a row's two sums: `sumi · d` into the first, `summ · dmin` into the
/// second, each by a fused multiply-add (`d` and `dmin` already times the activations' scale).
/// The row's result is the first minus the second.
pub(super) fn k_step(acc: &mut [f32; 2], sumi: i32, d: f32, summ: i32, dmin: f32) {
    acc[0] = (sumi as f32).mul_add(d, acc[0]);
    acc[1] = (summ as f32).mul_add(dmin, acc[1]);
}

/// Q5_K: per block `dy·d·sumi − dy·dmin·summ`, added to the row's sum.
pub fn q5_k(row: &[u8], x: &[BlockQ8K]) -> f32 {
    row.chunks_exact(176).zip(x).fold(0.0, |sum, (b, y)| {
        let qh = &b[16..48];
        let mut values = [0i32; 256];
        for (pair, qs) in b[48..176].chunks_exact(32).enumerate() {
            for (l, &q) in qs.iter().enumerate() {
                let hi = |bit: usize| i32::from((qh[l] >> bit) & 1) << 4;
                values[64 * pair + l] = i32::from(q & 0x0f) | hi(2 * pair);
                values[64 * pair + 32 + l] = i32::from(q >> 4) | hi(2 * pair + 1);
            }
        }
        let (sumi, summ) = k_sums(b, y, &values);
        sum + (y.d * f16_at(b, 0) * sumi as f32 - y.d * f16_at(b, 2) * summ as f32)
    })
}

/// Q6_K: per block the exact integer Σ scale·(value − 32)·activation over its 16 groups of 16
/// (the −32 through the activations' sums of 16), then `sumi · (dy·d)` into the row's sum by a
/// fused multiply-add.
pub fn q6_k(row: &[u8], x: &[BlockQ8K]) -> f32 {
    row.chunks_exact(210).zip(x).fold(0.0, |sum, (b, y)| {
        // The unsigned 6-bit values.
        let mut values = [0i32; 256];
        for half in 0..2 {
            let ql = &b[64 * half..64 * half + 64];
            let qh = &b[128 + 32 * half..128 + 32 * half + 32];
            let out = &mut values[128 * half..128 * half + 128];
            for l in 0..32 {
                out[l] = i32::from((ql[l] & 0x0f) | ((qh[l] & 3) << 4));
                out[l + 32] = i32::from((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4));
                out[l + 64] = i32::from((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
                out[l + 96] = i32::from((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
            }
        }
        let sumi: i32 = (0..16)
            .map(|g| {
                let part: i32 = (16 * g..16 * g + 16)
                    .map(|e| values[e] * i32::from(y.qs[e]))
                    .sum();
                i32::from(b[192 + g] as i8) * (part - 32 * i32::from(y.bsums[g]))
            })
            .sum();
        (sumi as f32).mul_add(y.d * f16_at(b, 208), sum)
    })
}

/// f16 · f16 in f32: four 8-lane accumulators over 32-element steps with fused multiply-adds,
/// folded as ggml's AVX2 `ggml_vec_dot_f16` folds them; a tail shorter than 32 is added in f64.
pub fn dot_f16(a: &[u16], b: &[u16]) -> f32 {
    let table = f16_table();
    let whole = a.len().min(b.len()) / 32 * 32;
    let mut acc = [[0f32; 8]; 4];
    for (ca, cb) in a[..whole].chunks_exact(32).zip(b[..whole].chunks_exact(32)) {
        for (j, acc) in acc.iter_mut().enumerate() {
            for (l, lane) in acc.iter_mut().enumerate() {
                let (x, y) = (
                    table[usize::from(ca[8 * j + l])],
                    table[usize::from(cb[8 * j + l])],
                );
                *lane = x.mul_add(y, *lane);
            }
        }
    }
    let x: [f32; 8] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let folded = ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
    with_f16_tail(folded, &a[whole..], &b[whole..])
}

/// Adds the products of a tail shorter than one 32-element step in f64, as ggml does.
#[inline]
pub(super) fn with_f16_tail(folded: f32, a: &[u16], b: &[u16]) -> f32 {
    if a.is_empty() || b.is_empty() {
        // What the f64 sum of nothing gives, −0 included (it comes out +0).
        return folded + 0.0;
    }
    let table = f16_table();
    let tail: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(table[usize::from(x)] * table[usize::from(y)]))
        .sum();
    (f64::from(folded) + tail) as f32
}

/// Every f16 bit pattern as f32 (256 KiB, built once): the scalar attention converts each key
/// and value element, and a lookup is far cheaper than decoding the bits each time.
pub fn f16_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(f16_to_f32).collect())
}

/// Rotary embedding: each pair of `head`'s dimensions turned by its `(sin, cos)` in `pairs`:
/// dimensions `i` and `i + pairs.len()` with `neox`, else `2i` and `2i + 1`. The fused
/// multiply-adds are those of ggml's compiled rotation (GCC contracts the scalar NEOX loop and
/// vectorizes the adjacent-pair one with fmaddsub), so the rounding is alike.
#[inline(always)]
pub fn rotate_pairs(head: &mut [f32], pairs: &[(f32, f32)], neox: bool) {
    let half = pairs.len();
    for (i, &(sin, cos)) in pairs.iter().enumerate() {
        let (a, b) = if neox {
            (i, i + half)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0.mul_add(cos, -(x1 * sin));
        head[b] = if neox {
            x0.mul_add(sin, x1 * cos)
        } else {
            x1.mul_add(cos, x0 * sin)
        };
    }
}

/// `dst ← f16(src·scale)` element-wise.
pub fn to_f16(src: &[f32], scale: f32, dst: &mut [u16]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f32_to_f16(x * scale);
    }
}

/// `dst ← src·scale` element-wise, `src` in f16.
pub fn from_f16(src: &[u16], scale: f32, dst: &mut [f32]) {
    let table = f16_table();
    for (d, &h) in dst.iter_mut().zip(src) {
        *d = table[usize::from(h)] * scale;
    }
}

/// GELU (tanh form) of every f16 value, rounded to f16 (ggml's `table_gelu_f16`, built once).
pub fn gelu_table() -> &'static [u16] {
    static TABLE: std::sync::OnceLock<Vec<u16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        const COEF_A: f32 = 0.044_715;
        (0..=u16::MAX)
            .map(|h| {
                let x = f16_to_f32(h);
                let y = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh());
                f32_to_f16(y)
            })
            .collect()
    })
}

/// GELU as ggml evaluates it: 0 at or below −10, the identity at or above 10, and between
/// them the table entry of the input rounded to f16.
pub fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16_to_f32(gelu_table()[usize::from(f32_to_f16(x))])
    }
}

/// `gate ← gelu(gate)·up` element-wise.
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = gelu(*g) * u;
    }
}

/// `acc ← f16(acc + v·w)` element-wise, with a fused multiply-add (ggml's `ggml_vec_mad_f16`).
pub fn mad_f16(acc: &mut [u16], v: &[u16], w: f32) {
    let table = f16_table();
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = f32_to_f16(table[usize::from(x)].mul_add(w, table[usize::from(*a)]));
    }
}

/// `acc ← f16(acc·s)` element-wise.
pub fn scale_f16(acc: &mut [u16], s: f32) {
    let table = f16_table();
    for a in acc.iter_mut() {
        *a = f32_to_f16(table[usize::from(*a)] * s);
    }
}

/// SiLU as ggml's vector code computes it: x / (1 + e^−x) with [`expf_poly`].
fn silu(x: f32) -> f32 {
    x / (1.0 + expf_poly(-x))
}

/// e^x by range reduction to 2^n·e^b (|b| ≤ ln2/2) and a degree-5 polynomial: the routine from
/// Arm's optimized-routines that ggml's SIMD SiLU uses on x86 and Arm alike (max error about
/// 1.5 ulp). Evaluated with the same fused multiply-adds, so it rounds exactly as ggml does.
fn expf_poly(x: f32) -> f32 {
    let shift = f32::from_bits(0x4b40_0000); // 1.5·2^23: adding it rounds to an integer
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), shift); // x·log2(e) + shift
    let n = z - shift;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),                  // ln2, low part
        (-n).mul_add(f32::from_bits(0x3f31_7200), x), // ln2, high part
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6) * b);
    if n.abs() <= 126.0 {
        return j.mul_add(k, k);
    }
    // Past the normal exponent range: scale in two steps, or saturate to 0 / infinity.
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// `gate ← silu(gate)·up`, element by element (the SwiGLU of llama-style FFNs).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// The interface every ISA implements (see `RowsFn`), here over the one-row references.
pub mod rows {
    use super::super::activations::{BlockQ8_0, BlockQ8_1, BlockQ8K};

    macro_rules! rows {
        ($($name:ident: $act:ty),* $(,)?) => {
            $(
                pub fn $name(
                    w: &[u8],
                    row_bytes: usize,
                    x: &[$act],
                    columns: usize,
                    out: &mut [f32],
                ) {
                    let n_rows = w.len() / row_bytes;
                    let blocks = x.len() / columns.max(1);
                    for (c, outs) in out.chunks_exact_mut(n_rows.max(1)).take(columns).enumerate() {
                        let column = &x[c * blocks..(c + 1) * blocks];
                        for (o, row) in outs.iter_mut().zip(w.chunks_exact(row_bytes)) {
                            *o = super::$name(row, column);
                        }
                    }
                }
            )*
        };
    }

    rows!(
        q4_0: BlockQ8_0,
        q4_1: BlockQ8_1,
        q5_0: BlockQ8_0,
        q5_1: BlockQ8_1,
        q8_0: BlockQ8_0,
        iq4_nl: BlockQ8_0,
        q4_k: BlockQ8K,
        q5_k: BlockQ8K,
        q6_k: BlockQ8K,
    );
}

/// The sum of eight lanes as every ISA adds them: lanes `l` and `l + 4`, then the even and
/// odd pairs, then the two.
pub fn reduce8(lanes: [f32; 8]) -> f32 {
    let quads = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    (quads[0] + quads[2]) + (quads[1] + quads[3])
}

/// One token's step of one value head of a Gated DeltaNet state `s` (a row per value
/// dimension, over the key dimensions): each row decayed by `decay`, read against the key,
/// written with the delta rule (`δ = (v − row·k)·beta`, `row += δ·k`), read against the query
/// and scaled into `out`. Every product is summed in eight lanes of fused multiply-adds (a
/// lane takes every eighth element), the lanes as [`reduce8`] adds them, then the tail: the
/// SIMD paths give these bits.
pub fn delta_step(
    s: &mut [f32],
    (q, k, v): (&[f32], &[f32], &[f32]),
    (decay, beta, scale): (f32, f32, f32),
    out: &mut [f32],
) {
    let width = k.len();
    let body = width / 8 * 8;
    for ((row, &v), o) in s.chunks_exact_mut(width).zip(v).zip(out) {
        let mut lanes = [0f32; 8];
        for (x, k) in row[..body].chunks_exact_mut(8).zip(k.chunks_exact(8)) {
            for l in 0..8 {
                x[l] *= decay;
                lanes[l] = x[l].mul_add(k[l], lanes[l]);
            }
        }
        let mut read = reduce8(lanes);
        for (x, k) in row[body..].iter_mut().zip(&k[body..]) {
            *x *= decay;
            read = x.mul_add(*k, read);
        }
        let delta = (v - read) * beta;
        let mut lanes = [0f32; 8];
        for ((x, k), q) in row[..body]
            .chunks_exact_mut(8)
            .zip(k.chunks_exact(8))
            .zip(q.chunks_exact(8))
        {
            for l in 0..8 {
                x[l] = k[l].mul_add(delta, x[l]);
                lanes[l] = x[l].mul_add(q[l], lanes[l]);
            }
        }
        let mut read = reduce8(lanes);
        for ((x, k), q) in row[body..].iter_mut().zip(&k[body..]).zip(&q[body..]) {
            *x = k.mul_add(delta, *x);
            read = x.mul_add(*q, read);
        }
        *o = read * scale;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_exponential_is_within_two_ulp_and_saturates() {
        for i in -10_000..10_000 {
            let x = i as f32 / 100.0;
            let (got, want) = (super::expf_poly(x), f64::from(x).exp());
            if want > f64::from(f32::MAX) {
                assert!(got.is_infinite(), "{x}");
            } else if want >= f64::from(f32::MIN_POSITIVE) {
                let ulp = f64::from(f32::EPSILON) * want;
                assert!(
                    (f64::from(got) - want).abs() <= 2.0 * ulp,
                    "{x}: {got} vs {want}"
                );
            }
        }
        assert_eq!(super::expf_poly(-200.0), 0.0);
        assert!(super::expf_poly(200.0).is_infinite());
    }
}
