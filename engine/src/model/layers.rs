//! One transformer block, token by token: norms, rotary embeddings, attention over the cache,
//! and the gated feed-forward network.

use super::{Arch, Hparams, KvCache, Layer, matvec};

/// `x ← x / sqrt(mean(x²) + eps) · w`.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let mean = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (v, g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// Rotates the first `n_rot` dimensions of one head: NORM pairs (2i, 2i+1) for llama,
/// NEOX pairs (i, i + n_rot/2) for Gemma.
fn rope(head: &mut [f32], pos: usize, n_rot: usize, base: f32, neox: bool) {
    let half = n_rot / 2;
    for i in 0..half {
        let theta = pos as f32 * base.powf(-2.0 * i as f32 / n_rot as f32);
        let (sin, cos) = theta.sin_cos();
        let (a, b) = if neox {
            (i, i + half)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * cos - x1 * sin;
        head[b] = x0 * sin + x1 * cos;
    }
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// Runs layer `il` on the residual stream `x` at position `pos`.
pub(super) fn block(
    h: &Hparams,
    il: usize,
    layer: &Layer<'_>,
    x: &mut [f32],
    pos: usize,
    cache: &mut KvCache,
) -> Result<(), String> {
    let gemma = h.arch == Arch::Gemma3;
    let (hd, q_dim, kv_dim) = (h.head_dim, h.n_head * h.head_dim, h.n_head_kv * h.head_dim);
    // Gemma 3: every sixth layer is global, the others see a sliding window with their own base.
    let window = h.sliding_window.filter(|_| gemma && il % 6 < 5);
    let base = if window.is_some() {
        h.rope_base_swa
    } else {
        h.rope_base
    };

    let mut cur = x.to_vec();
    rms_norm(&mut cur, &layer.attn_norm, h.rms_eps);
    let mut q = vec![0.0; q_dim];
    let mut k = vec![0.0; kv_dim];
    let mut v = vec![0.0; kv_dim];
    matvec(&layer.wq, &cur, &mut q)?;
    matvec(&layer.wk, &cur, &mut k)?;
    matvec(&layer.wv, &cur, &mut v)?;
    for head in q.chunks_exact_mut(hd) {
        if let Some(w) = &layer.q_norm {
            rms_norm(head, w, h.rms_eps);
        }
        rope(head, pos, h.n_rot, base, gemma);
    }
    for head in k.chunks_exact_mut(hd) {
        if let Some(w) = &layer.k_norm {
            rms_norm(head, w, h.rms_eps);
        }
        rope(head, pos, h.n_rot, base, gemma);
    }
    cache.keys[il][pos * kv_dim..(pos + 1) * kv_dim].copy_from_slice(&k);
    cache.values[il][pos * kv_dim..(pos + 1) * kv_dim].copy_from_slice(&v);

    let first = match window {
        // Key p0 is masked for query p1 when p1 - p0 >= window.
        Some(w) => (pos + 1).saturating_sub(w),
        None => 0,
    };
    let group = h.n_head / h.n_head_kv;
    let mut attn = vec![0.0; q_dim];
    let mut scores = vec![0.0f32; pos + 1 - first];
    for (hq, out) in attn.chunks_exact_mut(hd).enumerate() {
        let qh = &q[hq * hd..(hq + 1) * hd];
        let kvh = hq / group;
        for (s, p) in scores.iter_mut().zip(first..=pos) {
            let kp = &cache.keys[il][p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd];
            *s = qh.iter().zip(kp).map(|(a, b)| a * b).sum::<f32>() * h.attn_scale;
        }
        let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0;
        for s in scores.iter_mut() {
            *s = (*s - max).exp();
            sum += *s;
        }
        for (s, p) in scores.iter().zip(first..=pos) {
            let vp = &cache.values[il][p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd];
            let weight = s / sum;
            for (o, val) in out.iter_mut().zip(vp) {
                *o += weight * val;
            }
        }
    }
    let mut attn_out = vec![0.0; h.n_embd];
    matvec(&layer.wo, &attn, &mut attn_out)?;
    if let Some(w) = &layer.post_attn_norm {
        rms_norm(&mut attn_out, w, h.rms_eps);
    }
    for (xi, a) in x.iter_mut().zip(&attn_out) {
        *xi += a;
    }

    let mut cur = x.to_vec();
    rms_norm(&mut cur, &layer.ffn_norm, h.rms_eps);
    let mut gate = vec![0.0; h.n_ff];
    let mut up = vec![0.0; h.n_ff];
    matvec(&layer.gate, &cur, &mut gate)?;
    matvec(&layer.up, &cur, &mut up)?;
    for (g, u) in gate.iter_mut().zip(&up) {
        *g = if gemma { gelu_tanh(*g) } else { silu(*g) } * u;
    }
    let mut ffn = vec![0.0; h.n_embd];
    matvec(&layer.down, &gate, &mut ffn)?;
    if let Some(w) = &layer.post_ffn_norm {
        rms_norm(&mut ffn, w, h.rms_eps);
    }
    for (xi, f) in x.iter_mut().zip(&ffn) {
        *xi += f;
    }
    Ok(())
}
