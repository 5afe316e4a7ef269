//! One transformer block, token by token: norms, rotary embeddings, attention over the cache,
//! and the gated feed-forward network (dense, or routed experts in `moe`). Element-wise steps follow ggml's arithmetic (f64 norm
//! sums, iterated rope angles, GELU through f16) so results track llama.cpp's closely.

use super::attention::{self, MAX_HEAD_DIM, Query, Scales};
use super::{Arch, Attention, Ffn, Hparams, KvCache, Layer, LayerShape, Mixer, Work, delta, moe};
use crate::kernels::{self, Exec, Isa, KvRows, Matrix, Product};
use crate::pool::Schedule;

/// `x ← x / sqrt(mean(x²) + eps) · w`, the sum of squares in f64 as ggml keeps it.
pub fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let scale = rms_scale(x, eps);
    for (v, g) in x.iter_mut().zip(w) {
        *v = *v * scale * g;
    }
}

/// σ(x) as ggml's sigmoid op computes it (libm's exponential).
pub(super) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `out ← rms_norm(x)`, leaving `x` as it is (the residual stream).
fn rms_norm_into(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let scale = rms_scale(x, eps);
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = *v * scale * g;
    }
}

/// `x ← x / sqrt(mean(x²) + eps)`: Gemma 4's norm of values, without a weight.
fn rms_norm_unweighted(x: &mut [f32], eps: f32) {
    let scale = rms_scale(x, eps);
    x.iter_mut().for_each(|v| *v *= scale);
}

pub(super) fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|v| f64::from(v * v)).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// Rotary position embedding of one head.
pub(super) struct Rope<'a> {
    pub n_rot: usize,
    pub base: f32,
    /// NEOX pairs (i, i + n_rot/2) — Gemma, Qwen — instead of adjacent pairs (2i, 2i+1).
    pub neox: bool,
    /// Llama 3's per-frequency divisors (`rope_freqs.weight`).
    pub freq_factors: Option<&'a [f32]>,
}

/// The (sine, cosine) pairs of one position's rotation, shared by all its heads.
pub(super) struct Angles {
    pairs: [(f32, f32); MAX_HEAD_DIM / 2],
    len: usize,
}

/// Layer `il`'s rotation.
pub(super) fn rope_of<'a>(h: &Hparams, il: usize, rope_freqs: Option<&'a [f32]>) -> Rope<'a> {
    let shape = &h.layers[il];
    Rope {
        n_rot: shape.n_rot,
        base: shape.rope_base,
        neox: h.arch != Arch::Llama,
        // Gemma 4's factors make its full layers' rotation proportional; its sliding ones
        // rotate every pair.
        freq_factors: rope_freqs.filter(|_| !h.arch.is_gemma4() || !shape.swa),
    }
}

impl Angles {
    /// The opposite rotation (a rotation by −pos): the sines negated.
    pub fn inverse(mut self) -> Angles {
        self.pairs[..self.len]
            .iter_mut()
            .for_each(|(sin, _)| *sin = -*sin);
        self
    }
}

impl Rope<'_> {
    /// The angle of pair i at position `pos` is pos·base^(−2i/n_rot), built by repeated
    /// multiplication as ggml does.
    pub fn angles(&self, pos: usize) -> Angles {
        let half = (self.n_rot / 2).min(MAX_HEAD_DIM / 2);
        let theta_scale = self.base.powf(-2.0 / self.n_rot as f32);
        let mut theta = pos as f32;
        let mut angles = Angles {
            pairs: [(0.0, 0.0); MAX_HEAD_DIM / 2],
            len: half,
        };
        for (i, pair) in angles.pairs[..half].iter_mut().enumerate() {
            let factor = self.freq_factors.and_then(|f| f.get(i)).copied();
            let angle = theta / factor.unwrap_or(1.0);
            *pair = (angle.sin(), angle.cos());
            theta *= theta_scale;
        }
        angles
    }

    /// Rotates the first `n_rot` dimensions of `head` by `angles`, on `isa`.
    pub fn apply(&self, head: &mut [f32], angles: &Angles, isa: Isa) {
        kernels::rotate_pairs(head, &angles.pairs[..angles.len], self.neox, isa);
    }
}

/// Runs `f(first, rows)` on the token rows of `buf` (`width` values each; `first` is the index
/// of the first row given): split across the pool for a batch, in place for one token (a
/// region would cost more than the work). Each row gets the same arithmetic either way.
fn per_token(exec: &Exec, buf: &mut [f32], width: usize, f: &(dyn Fn(usize, &mut [f32]) + Sync)) {
    if buf.len() <= width {
        return f(0, buf);
    }
    exec.pool
        .for_each_share(&mut [buf], 1, width, Schedule::Even, &|_, mut share| {
            let first = share.start / width;
            f(first, share.column(0));
        });
}

/// `x ← x + a` per token, with `a` normed first where the layer has `norm` (Gemma 3).
fn add_residual(exec: &Exec, x: &mut [f32], a: &[f32], norm: Option<&[f32]>, h: &Hparams) {
    let e = h.n_embd;
    per_token(exec, x, e, &|first, rows| {
        for (xr, ar) in rows.chunks_exact_mut(e).zip(a[first * e..].chunks_exact(e)) {
            match norm {
                Some(g) => {
                    let scale = rms_scale(ar, h.rms_eps);
                    for ((xi, v), g) in xr.iter_mut().zip(ar).zip(g) {
                        *xi += *v * scale * g;
                    }
                }
                None => xr.iter_mut().zip(ar).for_each(|(xi, v)| *xi += v),
            }
        }
    });
}

/// `out ← rms_norm(x)` per token (the input of a layer's products).
fn norm_into(exec: &Exec, x: &[f32], norm: &[f32], out: &mut [f32], h: &Hparams) {
    let e = h.n_embd;
    per_token(exec, out, e, &|first, rows| {
        for (o, row) in rows.chunks_exact_mut(e).zip(x[first * e..].chunks_exact(e)) {
            rms_norm_into(row, norm, h.rms_eps, o);
        }
    });
}

fn add_bias(x: &mut [f32], bias: Option<&Vec<f32>>) {
    if let Some(b) = bias {
        x.iter_mut().zip(b).for_each(|(v, b)| *v += b);
    }
}

/// Runs layer `il` on the residual streams `x` of `n` consecutive tokens at positions
/// `first..first + n`: an attention layer puts each token's keys and values into the cache,
/// and each token attends to every cached position up to its own; a recurrent layer continues
/// its state (recording its inputs in the cache's journal with `record`).
#[allow(clippy::too_many_arguments)]
pub(super) fn block(
    h: &Hparams,
    il: usize,
    layer: &Layer<'_>,
    rope_freqs: Option<&[f32]>,
    x: &mut [f32],
    n: usize,
    first: usize,
    record: bool,
    cache: &mut KvCache,
) -> Result<(), String> {
    let gemma = h.arch.is_gemma();
    let shape: &LayerShape = &h.layers[il];
    let KvCache {
        exec,
        keys,
        values,
        recurrent,
        journal,
        work: w,
        ..
    } = cache;
    w.shape_layer(shape, n);

    norm_into(exec, x, &layer.attn_norm, &mut w.cur, h);
    match &layer.mixer {
        Mixer::Attention(a) => {
            let kv = (&mut keys[..], &mut values[..]);
            attend_layer(h, il, a, rope_freqs, kv, n, first, exec, w)?;
        }
        Mixer::DeltaNet(net) => {
            let d = h.delta.ok_or("a recurrent layer without its shape")?;
            let record = record.then(|| journal.layer(il));
            delta::mix(h, &d, net, &mut recurrent[il], record, exec, w, n)?;
        }
    }
    add_residual(exec, x, &w.proj, layer.post_attn_norm.as_deref(), h);

    norm_into(exec, x, &layer.ffn_norm, &mut w.cur, h);
    match &layer.ffn {
        Ffn::Dense { gate, up, down } => {
            dense_ffn(shape.n_ff, (gate, up, down), exec, w, n, gemma)?;
        }
        Ffn::Experts(experts) => moe::ffn(h, experts, exec, w, n)?,
    }
    add_residual(exec, x, &w.proj, layer.post_ffn_norm.as_deref(), h);
    if let Some(ple) = &layer.ple {
        per_layer_input(h, il, ple, exec, w, x, n)?;
    }
    if let Some(scale) = layer.out_scale {
        x.iter_mut().for_each(|v| *v *= scale);
    }
    Ok(())
}

/// Attention layer `il` over the normed inputs `w.cur`, its keys and values into `keys` and
/// `values` (per layer); the projected output goes to `w.proj`.
#[allow(clippy::too_many_arguments)]
fn attend_layer(
    h: &Hparams,
    il: usize,
    layer: &Attention<'_>,
    rope_freqs: Option<&[f32]>,
    (keys, values): (&mut [Vec<u16>], &mut [Vec<u16>]),
    n: usize,
    first: usize,
    exec: &Exec,
    w: &mut Work,
) -> Result<(), String> {
    let gemma = h.arch.is_gemma();
    let shape: &LayerShape = &h.layers[il];
    let (hd, kv_dim, q_dim) = (shape.head_dim, shape.kv_dim(), shape.q_dim());
    let window = h.sliding_window.filter(|_| shape.swa);
    let rope = rope_of(h, il, rope_freqs);
    let isa = exec.isa;
    // Qwen 3.5: each head's query, then its output gate; the product goes to `w.z` and is
    // dealt out to the queries and the gates.
    if layer.gated {
        w.z.resize(n * 2 * q_dim, 0.0);
    }
    let q = Product {
        w: &layer.wq,
        out: if layer.gated { &mut w.z } else { &mut w.q },
    };
    match (&layer.wk, &layer.wv) {
        (Some(wk), Some(wv)) => kernels::matmul(
            &mut [
                q,
                Product {
                    w: wk,
                    out: &mut w.k,
                },
                Product {
                    w: wv,
                    out: &mut w.v,
                },
            ],
            &w.cur,
            n,
            exec,
            &mut w.scratch,
        )?,
        (Some(wk), None) => {
            kernels::matmul(
                &mut [
                    q,
                    Product {
                        w: wk,
                        out: &mut w.k,
                    },
                ],
                &w.cur,
                n,
                exec,
                &mut w.scratch,
            )?;
            // Gemma 4 without values: the keys' projection is the values' too.
            w.v.copy_from_slice(&w.k);
        }
        (None, _) => kernels::matmul(&mut [q], &w.cur, n, exec, &mut w.scratch)?,
    }
    if layer.gated {
        w.out_gate.resize(n * q_dim, 0.0);
        let pairs = w.z.chunks_exact(2 * hd);
        for ((both, q), gate) in pairs
            .zip(w.q.chunks_exact_mut(hd))
            .zip(w.out_gate.chunks_exact_mut(hd))
        {
            q.copy_from_slice(&both[..hd]);
            gate.copy_from_slice(&both[hd..]);
        }
    }
    let owns_kv = layer.wk.is_some();
    for (t, q) in w.q.chunks_exact_mut(q_dim).enumerate() {
        let pos = first + t;
        add_bias(q, layer.bq.as_ref());
        let angles = rope.angles(pos);
        for head in q.chunks_exact_mut(hd) {
            if let Some(norm) = &layer.q_norm {
                rms_norm(head, norm, h.rms_eps);
            }
            rope.apply(head, &angles, isa);
        }
        if !owns_kv {
            continue;
        }
        let k = &mut w.k[t * kv_dim..(t + 1) * kv_dim];
        let v = &mut w.v[t * kv_dim..(t + 1) * kv_dim];
        add_bias(k, layer.bk.as_ref());
        add_bias(v, layer.bv.as_ref());
        for head in k.chunks_exact_mut(hd) {
            if let Some(norm) = &layer.k_norm {
                rms_norm(head, norm, h.rms_eps);
            }
            rope.apply(head, &angles, isa);
        }
        if layer.v_norm {
            for head in v.chunks_exact_mut(hd) {
                rms_norm_unweighted(head, h.rms_eps);
            }
        }
        let row = pos * kv_dim..(pos + 1) * kv_dim;
        kernels::to_f16(k, 1.0, &mut keys[il][row.clone()], isa);
        kernels::to_f16(v, 1.0, &mut values[il][row], isa);
    }

    let scales = if gemma {
        Scales {
            pre: h.attn_scale,
            post: 1.0,
        }
    } else {
        Scales {
            pre: 1.0,
            post: h.attn_scale,
        }
    };
    let group = shape.n_head / shape.n_head_kv;
    let span = group * hd;
    let chunk = attention_chunk(n, shape.n_head_kv, group, hd, exec.pool.threads());
    let (keys, values) = (&keys[shape.kv_from], &values[shape.kv_from]);
    let queries = &w.q;
    // Each key-value head's query heads, for a chunk of the pass's tokens, go through the
    // cached rows together: a row is read once for all of them. The threads claim (head,
    // chunk) pairs, later tokens seeing more rows. The results land by head, then token.
    let mut outs: Vec<&mut [f32]> = w.attn_by_head.chunks_exact_mut(n * span).collect();
    exec.pool.for_each_share(
        &mut outs,
        1,
        chunk * span,
        Schedule::Claimed,
        &|kv_head, mut share| {
            let tokens = share.start / span..share.end / span;
            let cache = KvRows {
                keys,
                values,
                stride: kv_dim,
                offset: kv_head * hd,
            };
            let chunk_queries = tokens.map(|t| {
                let pos = first + t;
                let from = match window {
                    // Key p0 is masked for query p1 when p1 - p0 >= window.
                    Some(size) => (pos + 1).saturating_sub(size),
                    None => 0,
                };
                // A draft head's query stands at the target's next free position, which holds
                // nothing yet (or a rejected draft's keys): it sees the positions before.
                let to = if h.arch == Arch::Gemma4Assistant {
                    pos
                } else {
                    pos + 1
                };
                let at = t * q_dim + kv_head * span;
                Query {
                    q: &queries[at..at + span],
                    rows: from..to,
                }
            });
            attention::attend(chunk_queries, scales, hd, cache, isa, share.column(0));
        },
    );
    for (kv_head, by_token) in w.attn_by_head.chunks_exact(n * span).enumerate() {
        for (t, heads) in by_token.chunks_exact(span).enumerate() {
            let at = t * q_dim + kv_head * span;
            w.attn[at..at + span].copy_from_slice(heads);
        }
    }
    if layer.gated {
        // As ggml: the attention's output times σ(gate), σ by libm's exponential.
        for (o, g) in w.attn.iter_mut().zip(&w.out_gate) {
            *o *= sigmoid(*g);
        }
    }
    kernels::matmul(
        &mut [Product {
            w: &layer.wo,
            out: &mut w.proj,
        }],
        &w.attn,
        n,
        exec,
        &mut w.scratch,
    )
}

/// Gemma 4: `x += rms_norm(proj · (gelu(inp_gate · x) ⊙ input); post_norm)`, where input is
/// the token's per-layer input for layer `il` (in `w.ple`).
fn per_layer_input(
    h: &Hparams,
    il: usize,
    ple: &super::LayerPle<'_>,
    exec: &Exec,
    w: &mut Work,
    x: &mut [f32],
    n: usize,
) -> Result<(), String> {
    let width = h.n_embd_per_layer;
    let all = width * h.n_layer;
    w.gate.resize(n * width, 0.0);
    kernels::matmul(
        &mut [Product {
            w: &ple.inp_gate,
            out: &mut w.gate,
        }],
        x,
        n,
        exec,
        &mut w.scratch,
    )?;
    for (t, gate) in w.gate.chunks_exact_mut(width).enumerate() {
        let at = t * all + il * width;
        kernels::gelu_mul(gate, &w.ple[at..at + width], exec.isa);
    }
    kernels::matmul(
        &mut [Product {
            w: &ple.proj,
            out: &mut w.proj,
        }],
        &w.gate,
        n,
        exec,
        &mut w.scratch,
    )?;
    add_residual(exec, x, &w.proj, Some(&ple.post_norm), h);
    Ok(())
}

/// Tokens of a pass of `n` whose heads (`group` per key-value head, `width` wide) go through
/// the cached rows together: as many as [`attention::attend`] takes at once (a row then costs
/// one read for all of them), in the fewest chunks that give every thread as many (key-value
/// head, chunk) pairs as the others where the heads alone do not (SmolLM2's 3 at two threads:
/// 2 pairs for one thread, 1 for the other).
fn attention_chunk(n: usize, kv_heads: usize, group: usize, width: usize, threads: usize) -> usize {
    let held = (attention::heads_at_once(width) / group.max(1)).max(1);
    let (n, kv_heads, threads) = (n.max(1), kv_heads.max(1), threads.max(1));
    let least = n.div_ceil(held);
    (least..=n)
        .map(|chunks| n.div_ceil(chunks))
        .find(|&chunk| kv_heads * n.div_ceil(chunk) % threads == 0)
        .unwrap_or(n.div_ceil(least))
}

/// `w.proj = down · act(gate · w.cur) ⊙ (up · w.cur)` for the `n` tokens of a pass (GELU for
/// Gemma, SiLU otherwise).
fn dense_ffn(
    n_ff: usize,
    (gate, up, down): (&Matrix<'_>, &Matrix<'_>, &Matrix<'_>),
    exec: &Exec,
    w: &mut Work,
    n: usize,
    gemma: bool,
) -> Result<(), String> {
    let isa = exec.isa;
    kernels::matmul(
        &mut [
            Product {
                w: gate,
                out: &mut w.gate,
            },
            Product {
                w: up,
                out: &mut w.up,
            },
        ],
        &w.cur,
        n,
        exec,
        &mut w.scratch,
    )?;
    let up = &w.up;
    per_token(exec, &mut w.gate, n_ff, &|first, gate| {
        let up = &up[first * n_ff..first * n_ff + gate.len()];
        if gemma {
            kernels::gelu_mul(gate, up, isa);
        } else {
            kernels::silu_mul(gate, up, isa);
        }
    });
    kernels::matmul(
        &mut [Product {
            w: down,
            out: &mut w.proj,
        }],
        &w.gate,
        n,
        exec,
        &mut w.scratch,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A chunk's heads fit what attention takes at once, and a pass of 2 to 17 tokens (a
    /// draft's) gives both threads as many (key-value head, chunk) pairs, as do 8, 12 and 16
    /// tokens four threads: SmolLM2 (3 key-value heads of 3, 64 wide), Gemma 3 270M (1 of 4,
    /// 256 wide) and 8 of 2. Heads 512 wide fit too (1 of 8: two tokens a chunk).
    #[test]
    fn attention_chunks_fit_and_share_evenly() {
        for (kv_heads, group, width, even) in [
            (3, 3, 64, true),
            (1, 4, 256, true),
            (8, 2, 128, true),
            (1, 8, 512, false),
        ] {
            let held = attention::heads_at_once(width);
            for n in 1..=40 {
                for threads in 1..=4 {
                    let chunk = attention_chunk(n, kv_heads, group, width, threads);
                    assert!(
                        chunk >= 1 && chunk * group <= held,
                        "{n} tokens, {width} wide"
                    );
                    let pairs = kv_heads * n.div_ceil(chunk);
                    let shared = match threads {
                        2 => (2..=17).contains(&n),
                        4 => [8, 12, 16].contains(&n),
                        _ => false,
                    };
                    if even && shared {
                        assert_eq!(
                            pairs % threads,
                            0,
                            "{n} tokens, {kv_heads}×{group} heads {width} wide, {threads} threads"
                        );
                    }
                }
            }
        }
    }
}
