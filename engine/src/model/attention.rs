//! Attention of one query head over cached keys and values stored as f16, computed the way
//! llama.cpp's CPU flash attention does for a single token: the query rounded to f16, f32 dot
//! products with the keys, an online softmax, and the weighted values accumulated in f16.
//! Matching its roundings (not only its maths) is what keeps our log-probabilities within the
//! goldens' tolerance.

use crate::kernels::{self, Isa};

/// One query head against the cache.
pub struct Query<'a> {
    /// The query (already normed and rotated), multiplied by `pre_scale` before rounding.
    pub q: &'a [f32],
    /// Gemma 3 scales queries before attention; llama scales the products after.
    pub pre_scale: f32,
    /// Applied to each query·key product.
    pub post_scale: f32,
}

/// The widest head [`attend`] takes (its f16 buffers live on the stack); models with wider
/// heads are refused when they load.
pub const MAX_HEAD_DIM: usize = 512;

/// Computes `out = softmax(q·K) · V` over the cached rows `keys`/`values` (each `out.len()`
/// wide, at most [`MAX_HEAD_DIM`], f16 bits), rows in order.
pub fn attend<'c>(
    query: &Query<'_>,
    rows: impl Iterator<Item = (&'c [u16], &'c [u16])>,
    isa: Isa,
    out: &mut [f32],
) {
    let width = out.len().min(MAX_HEAD_DIM);
    let (mut q_buf, mut acc_buf) = ([0u16; MAX_HEAD_DIM], [0u16; MAX_HEAD_DIM]);
    let (q16, acc16) = (&mut q_buf[..width], &mut acc_buf[..width]);
    kernels::to_f16(query.q, query.pre_scale, q16, isa);
    let mut sum = 0f32;
    let mut max = f32::NEG_INFINITY;
    for (k, v) in rows {
        let s = kernels::dot_f16(k, q16, isa) * query.post_scale;
        let (old_scale, weight) = if s > max {
            let rescale = (max - s).exp();
            max = s;
            kernels::scale_f16(acc16, rescale, isa);
            (rescale, 1.0)
        } else {
            (1.0, (s - max).exp())
        };
        kernels::mad_f16(acc16, v, weight, isa);
        sum = sum.mul_add(old_scale, weight);
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    kernels::from_f16(acc16, inv, out, isa);
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
        attend(
            &query,
            keys.iter()
                .map(Vec::as_slice)
                .zip(values.iter().map(Vec::as_slice)),
            Isa::Scalar,
            &mut out,
        );
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
