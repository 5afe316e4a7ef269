//! Attention of query heads over cached keys and values stored as f16, computed the way
//! llama.cpp's CPU flash attention does for a single token: the query rounded to f16, f32 dot
//! products with the keys, an online softmax, and the weighted values accumulated in f16.
//! Matching its roundings (not only its maths) is what keeps our log-probabilities within the
//! goldens' tolerance. The query heads that share a key-value head go through the cached rows
//! together (each row read once for all of them); each head's result is the same as alone.

use crate::kernels::{self, Isa, KvRows};

/// Query heads that share one key-value head.
pub struct Query<'a> {
    /// The heads' queries one after another (already normed and rotated), each multiplied by
    /// `pre_scale` before rounding.
    pub q: &'a [f32],
    /// Gemma 3 scales queries before attention; llama scales the products after.
    pub pre_scale: f32,
    /// Applied to each query·key product.
    pub post_scale: f32,
}

/// The widest head [`attend`] takes (its f16 buffers live on the stack); models with wider
/// heads are refused when they load.
pub const MAX_HEAD_DIM: usize = 512;

/// Heads that go through the rows together (more are taken in turns).
const HEADS_AT_ONCE: usize = kernels::ATTEND_HEADS;

/// Computes `out = softmax(q·K) · V` for every head of `query` over the cached `rows`, rows in
/// order; `out` holds the heads' results one after another, each as wide as a cached row's
/// head (at most [`MAX_HEAD_DIM`]).
pub fn attend(query: &Query<'_>, width: usize, rows: KvRows<'_>, isa: Isa, out: &mut [f32]) {
    let width = width.clamp(1, MAX_HEAD_DIM);
    for (qs, outs) in query
        .q
        .chunks(HEADS_AT_ONCE * width)
        .zip(out.chunks_mut(HEADS_AT_ONCE * width))
    {
        let heads = qs.len() / width;
        let mut q_buf = [0u16; HEADS_AT_ONCE * MAX_HEAD_DIM];
        let mut acc_buf = [0u16; HEADS_AT_ONCE * MAX_HEAD_DIM];
        let (q16, acc16) = (&mut q_buf[..heads * width], &mut acc_buf[..heads * width]);
        kernels::to_f16(&qs[..heads * width], query.pre_scale, q16, isa);
        let mut sums = [0f32; HEADS_AT_ONCE];
        let sums = &mut sums[..heads];
        let queries = kernels::Queries {
            q: q16,
            width,
            post_scale: query.post_scale,
        };
        kernels::attend_f16(queries, rows, acc16, sums, isa);
        for ((acc, sum), out) in acc16
            .chunks_exact(width)
            .zip(sums)
            .zip(outs.chunks_exact_mut(width))
        {
            let inv = if *sum == 0.0 { 0.0 } else { 1.0 / *sum };
            kernels::from_f16(acc, inv, out, isa);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{f16_to_f32, f32_to_f16};

    /// The f16 accumulation stays close to an exact f64 softmax-weighted sum.
    #[test]
    fn matches_exact_attention_within_f16_precision() {
        let dim = 8;
        let q: Vec<f32> = (0..dim).map(|i| (i as f32 - 3.5) / 4.0).collect();
        let keys: Vec<Vec<u16>> = (0..20)
            .map(|p| {
                (0..dim)
                    .map(|i| f32_to_f16(((p * 7 + i * 3) % 11) as f32 / 5.0 - 1.0))
                    .collect()
            })
            .collect();
        let values: Vec<Vec<u16>> = (0..20)
            .map(|p| {
                (0..dim)
                    .map(|i| f32_to_f16(((p * 5 + i) % 13) as f32 / 3.0 - 2.0))
                    .collect()
            })
            .collect();
        let query = Query {
            q: &q,
            pre_scale: 1.0,
            post_scale: 0.5,
        };
        let mut out = vec![0.0; dim];
        let (flat_keys, flat_values) = (keys.concat(), values.concat());
        let rows = KvRows {
            keys: &flat_keys,
            values: &flat_values,
            stride: dim,
            offset: 0,
            first: 0,
            end: keys.len(),
        };
        attend(&query, dim, rows, Isa::Scalar, &mut out);
        let scores: Vec<f64> = keys
            .iter()
            .map(|k| {
                k.iter()
                    .zip(&q)
                    .map(|(&a, &b)| f64::from(f16_to_f32(a)) * f64::from(f16_to_f32(f32_to_f16(b))))
                    .sum::<f64>()
                    * 0.5
            })
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f64 = weights.iter().sum();
        for (d, o) in out.iter().enumerate() {
            let exact: f64 = weights
                .iter()
                .zip(&values)
                .map(|(w, v)| w * f64::from(f16_to_f32(v[d])))
                .sum::<f64>()
                / total;
            assert!(
                (f64::from(*o) - exact).abs() < 2e-2,
                "dim {d}: {o} vs {exact}"
            );
        }
    }
}
