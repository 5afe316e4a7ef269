//! Attention of query heads over cached keys and values stored as f16, computed the way
//! llama.cpp's CPU flash attention does for a single token: the query rounded to f16, f32 dot
//! products with the keys, an online softmax, and the weighted values accumulated in f16.
//! Matching its roundings (not only its maths) is what keeps our log-probabilities within the
//! goldens' tolerance. The query heads that share a key-value head go through the cached rows
//! together, those of several tokens of a pass too (each row read once for all of them); each
//! head's result is the same as alone.

use std::cell::RefCell;
use std::ops::Range;

use crate::kernels::{self, Isa, KvRows};

/// One token's query heads that share a key-value head.
pub struct Query<'a> {
    /// The heads' queries one after another (already normed and rotated).
    pub q: &'a [f32],
    /// The cached positions the token attends to.
    pub rows: Range<usize>,
}

/// Where the attention's scale goes: Gemma 3 scales queries before attention (`pre`, before
/// they are rounded to f16); llama scales the products after (`post`).
#[derive(Clone, Copy)]
pub struct Scales {
    /// Multiplies each query before rounding.
    pub pre: f32,
    /// Multiplies each query·key product.
    pub post: f32,
}

/// The widest head [`attend`] takes; models with wider heads are refused when they load.
pub const MAX_HEAD_DIM: usize = 512;

/// Query heads `width` wide that [`attend`] takes through the cached rows together (more go
/// in turns, each reading the rows again).
pub fn heads_at_once(width: usize) -> usize {
    (kernels::ATTEND_VALUES / width.max(1)).clamp(1, kernels::ATTEND_HEADS)
}

/// Computes `out = softmax(q·K) · V` for every head of every query over its cached rows of
/// `cache`, rows in order; `out` holds the heads' results one after another (the queries'
/// order), each as wide as a cached row's head (at most [`MAX_HEAD_DIM`]).
pub fn attend<'q>(
    queries: impl IntoIterator<Item = Query<'q>>,
    scales: Scales,
    width: usize,
    cache: KvRows<'_>,
    isa: Isa,
    out: &mut [f32],
) {
    let width = width.clamp(1, MAX_HEAD_DIM);
    let at_once = heads_at_once(width);
    let mut heads = queries.into_iter().flat_map(|query| {
        let rows = query.rows;
        query.q.chunks_exact(width).map(move |q| (q, rows.clone()))
    });
    let mut outs = out.chunks_exact_mut(width);
    let mut spans: [Range<usize>; kernels::ATTEND_HEADS] = std::array::from_fn(|_| 0..0);
    let mut sums = [0f32; kernels::ATTEND_HEADS];
    HALVES.with_borrow_mut(|halves| {
        halves.resize(halves.len().max(2 * at_once * width), 0);
        let (q16, acc16) = halves.split_at_mut(at_once * width);
        loop {
            let mut n = 0;
            for ((q, rows), (q16, span)) in heads
                .by_ref()
                .take(at_once)
                .zip(q16.chunks_exact_mut(width).zip(spans.iter_mut()))
            {
                kernels::to_f16(q, scales.pre, q16, isa);
                *span = rows;
                n += 1;
            }
            if n == 0 {
                return;
            }
            let acc = &mut acc16[..n * width];
            acc.fill(0);
            let batch = kernels::Queries {
                q: &q16[..n * width],
                width,
                spans: &spans[..n],
                post_scale: scales.post,
            };
            kernels::attend_f16(batch, cache, acc, &mut sums[..n], isa);
            for ((acc, sum), out) in acc.chunks_exact(width).zip(&sums).zip(outs.by_ref()) {
                let inv = if *sum == 0.0 { 0.0 } else { 1.0 / *sum };
                kernels::from_f16(acc, inv, out, isa);
            }
        }
    });
}

thread_local! {
    /// [`attend`]'s f16 queries and accumulators, kept per thread rather than cleared on the
    /// stack at every call.
    static HALVES: RefCell<Vec<u16>> = const { RefCell::new(Vec::new()) };
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
            rows: 0..keys.len(),
        };
        let scales = Scales {
            pre: 1.0,
            post: 0.5,
        };
        let mut out = vec![0.0; dim];
        let (flat_keys, flat_values) = (keys.concat(), values.concat());
        let rows = KvRows {
            keys: &flat_keys,
            values: &flat_values,
            stride: dim,
            offset: 0,
        };
        attend([query], scales, dim, rows, Isa::Scalar, &mut out);
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
