//! The forward pass of each architecture against a plain f64 transcription of its definition, on
//! tiny random models written as GGUF files: this is what checks qwen2 (QKV biases), qwen3
//! (per-head q/k norms, head width from key_length) and grouped-query llama where no small real
//! model is at hand. Our f16 cache and rounding make the match close, not exact.

use engine::model::{KvCache, Model};
use engine::model_file::ModelFile;
use gguf::testfile::Builder;

/// A small deterministic generator (xorshift), values uniform in [-scale, scale].
struct Random(u64);

impl Random {
    fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 ^= self.0 << 13;
                self.0 ^= self.0 >> 7;
                self.0 ^= self.0 << 17;
                ((self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale
            })
            .collect()
    }
}

#[derive(Clone, Copy)]
struct Shape {
    arch: &'static str,
    vocab: usize,
    embd: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    ff: usize,
    layers: usize,
    rope_base: f32,
}

/// The weights of one block, as plain row-major matrices (rows × cols).
struct Block {
    attn_norm: Vec<f32>,
    wq: Vec<f32>,
    wk: Vec<f32>,
    wv: Vec<f32>,
    wo: Vec<f32>,
    biases: Option<[Vec<f32>; 3]>,
    qk_norms: Option<[Vec<f32>; 2]>,
    ffn_norm: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

struct Weights {
    shape: Shape,
    embd: Vec<f32>,
    blocks: Vec<Block>,
    output_norm: Vec<f32>,
    output: Vec<f32>,
}

fn weights(shape: Shape, seed: u64) -> Weights {
    let mut r = Random(seed);
    let s = shape;
    let (q_dim, kv_dim) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let norm = |r: &mut Random, n: usize| r.values(n, 0.2).iter().map(|v| 1.0 + v).collect();
    let blocks = (0..s.layers)
        .map(|_| Block {
            attn_norm: norm(&mut r, s.embd),
            wq: r.values(q_dim * s.embd, 0.3),
            wk: r.values(kv_dim * s.embd, 0.3),
            wv: r.values(kv_dim * s.embd, 0.3),
            wo: r.values(s.embd * q_dim, 0.3),
            biases: (s.arch == "qwen2").then(|| {
                [
                    r.values(q_dim, 0.5),
                    r.values(kv_dim, 0.5),
                    r.values(kv_dim, 0.5),
                ]
            }),
            qk_norms: (s.arch == "qwen3")
                .then(|| [norm(&mut r, s.head_dim), norm(&mut r, s.head_dim)]),
            ffn_norm: norm(&mut r, s.embd),
            gate: r.values(s.ff * s.embd, 0.3),
            up: r.values(s.ff * s.embd, 0.3),
            down: r.values(s.embd * s.ff, 0.3),
        })
        .collect();
    Weights {
        shape: s,
        embd: r.values(s.vocab * s.embd, 1.0),
        blocks,
        output_norm: norm(&mut r, s.embd),
        output: r.values(s.vocab * s.embd, 0.3),
    }
}

fn gguf_bytes(w: &Weights) -> Vec<u8> {
    let s = w.shape;
    let (q_dim, kv_dim) = (s.heads * s.head_dim, s.kv_heads * s.head_dim);
    let key = |k: &str| format!("{}.{k}", s.arch);
    let mut b = Builder::new()
        .string("general.architecture", s.arch)
        .u32(&key("embedding_length"), s.embd as u32)
        .u32(&key("block_count"), s.layers as u32)
        .u32(&key("feed_forward_length"), s.ff as u32)
        .u32(&key("attention.head_count"), s.heads as u32)
        .u32(&key("attention.head_count_kv"), s.kv_heads as u32)
        .u32(&key("attention.key_length"), s.head_dim as u32)
        .u32(&key("attention.value_length"), s.head_dim as u32)
        .u32(&key("context_length"), 256)
        .f32(&key("rope.freq_base"), s.rope_base)
        .f32(&key("attention.layer_norm_rms_epsilon"), 1e-6)
        .f32_matrix("token_embd.weight", s.embd, s.vocab, &w.embd)
        .f32_tensor("output_norm.weight", &w.output_norm)
        .f32_matrix("output.weight", s.embd, s.vocab, &w.output);
    for (i, l) in w.blocks.iter().enumerate() {
        let n = |t: &str| format!("blk.{i}.{t}.weight");
        b = b
            .f32_tensor(&n("attn_norm"), &l.attn_norm)
            .f32_matrix(&n("attn_q"), s.embd, q_dim, &l.wq)
            .f32_matrix(&n("attn_k"), s.embd, kv_dim, &l.wk)
            .f32_matrix(&n("attn_v"), s.embd, kv_dim, &l.wv)
            .f32_matrix(&n("attn_output"), q_dim, s.embd, &l.wo)
            .f32_tensor(&n("ffn_norm"), &l.ffn_norm)
            .f32_matrix(&n("ffn_gate"), s.embd, s.ff, &l.gate)
            .f32_matrix(&n("ffn_up"), s.embd, s.ff, &l.up)
            .f32_matrix(&n("ffn_down"), s.ff, s.embd, &l.down);
        if let Some([bq, bk, bv]) = &l.biases {
            b = b
                .f32_tensor(&format!("blk.{i}.attn_q.bias"), bq)
                .f32_tensor(&format!("blk.{i}.attn_k.bias"), bk)
                .f32_tensor(&format!("blk.{i}.attn_v.bias"), bv);
        }
        if let Some([qn, kn]) = &l.qk_norms {
            b = b
                .f32_tensor(&n("attn_q_norm"), qn)
                .f32_tensor(&n("attn_k_norm"), kn);
        }
    }
    b.build()
}

fn matvec(m: &[f32], x: &[f64]) -> Vec<f64> {
    m.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(&w, &v)| f64::from(w) * v).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f32]) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let scale = 1.0 / (ms + 1e-6).sqrt();
    x.iter()
        .zip(w)
        .map(|(v, &g)| v * scale * f64::from(g))
        .collect()
}

/// Rotary embedding: adjacent pairs for llama, halves (NEOX) for qwen.
fn rope(head: &mut [f64], pos: usize, base: f64, neox: bool) {
    let d = head.len();
    for i in 0..d / 2 {
        let angle = pos as f64 * base.powf(-2.0 * i as f64 / d as f64);
        let (a, b) = if neox {
            (i, i + d / 2)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (head[a], head[b]);
        head[a] = x0 * angle.cos() - x1 * angle.sin();
        head[b] = x0 * angle.sin() + x1 * angle.cos();
    }
}

/// Logits after each token of `tokens`, straight from the architecture's definition.
fn reference(w: &Weights, tokens: &[u32]) -> Vec<Vec<f64>> {
    let s = w.shape;
    let hd = s.head_dim;
    let neox = s.arch != "llama";
    let mut keys: Vec<Vec<Vec<f64>>> = vec![Vec::new(); s.layers];
    let mut values: Vec<Vec<Vec<f64>>> = vec![Vec::new(); s.layers];
    let mut out = Vec::new();
    for (pos, &t) in tokens.iter().enumerate() {
        let at = t as usize * s.embd;
        let mut x: Vec<f64> = w.embd[at..at + s.embd]
            .iter()
            .map(|&v| f64::from(v))
            .collect();
        for (il, l) in w.blocks.iter().enumerate() {
            let xn = rms_norm(&x, &l.attn_norm);
            let (mut q, mut k, mut v) =
                (matvec(&l.wq, &xn), matvec(&l.wk, &xn), matvec(&l.wv, &xn));
            if let Some(biases) = &l.biases {
                for (vec, bias) in [&mut q, &mut k, &mut v].into_iter().zip(biases) {
                    vec.iter_mut()
                        .zip(bias)
                        .for_each(|(a, &b)| *a += f64::from(b));
                }
            }
            for (vec, norm) in [(&mut q, 0), (&mut k, 1)] {
                for head in vec.chunks_exact_mut(hd) {
                    if let Some(norms) = &l.qk_norms {
                        let normed = rms_norm(head, &norms[norm]);
                        head.copy_from_slice(&normed);
                    }
                    rope(head, pos, f64::from(s.rope_base), neox);
                }
            }
            keys[il].push(k);
            values[il].push(v);
            let mut attn = vec![0.0; s.heads * hd];
            for h in 0..s.heads {
                let kv = h / (s.heads / s.kv_heads) * hd;
                let qh = &q[h * hd..(h + 1) * hd];
                let scores: Vec<f64> = keys[il]
                    .iter()
                    .map(|k| {
                        qh.iter()
                            .zip(&k[kv..kv + hd])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = weights.iter().sum();
                for (p, wgt) in weights.iter().enumerate() {
                    for d in 0..hd {
                        attn[h * hd + d] += wgt / total * values[il][p][kv + d];
                    }
                }
            }
            x.iter_mut()
                .zip(matvec(&l.wo, &attn))
                .for_each(|(a, b)| *a += b);
            let xn = rms_norm(&x, &l.ffn_norm);
            let hidden: Vec<f64> = matvec(&l.gate, &xn)
                .iter()
                .zip(matvec(&l.up, &xn))
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            x.iter_mut()
                .zip(matvec(&l.down, &hidden))
                .for_each(|(a, b)| *a += b);
        }
        out.push(matvec(&w.output, &rms_norm(&x, &w.output_norm)));
    }
    out
}

fn check(shape: Shape) {
    let w = weights(shape, 0x9e37_79b9_7f4a_7c15);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(format!("{}.gguf", shape.arch));
    std::fs::write(&path, gguf_bytes(&w)).expect("write");
    let file = ModelFile::open(&path).expect("open");
    let model = Model::load(&file).expect("load");
    let tokens = [3u32, 17, 5, 30, 11, 3, 22, 9];
    let expected = reference(&w, &tokens);
    let mut cache = KvCache::new(&model.hparams, 16).expect("cache");
    for (pos, (&t, want)) in tokens.iter().zip(&expected).enumerate() {
        let got = model.step(t, pos, &mut cache).expect("step");
        let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(want)
            .map(|(&g, &e)| (f64::from(g) - e).abs())
            .fold(0f64, f64::max);
        // The f16 cache and f16 attention accumulation round at about 2e-4 relative here; a wrong
        // rope layout, bias or norm shows up at 2e-2 or more.
        assert!(
            worst <= 5e-3 * scale.max(1.0),
            "{} position {pos}: logits differ by {worst} (largest {scale})",
            shape.arch
        );
    }
}

const BASE: Shape = Shape {
    arch: "llama",
    vocab: 40,
    embd: 32,
    heads: 4,
    kv_heads: 2,
    head_dim: 8,
    ff: 48,
    layers: 2,
    rope_base: 10_000.0,
};

#[test]
fn llama_with_grouped_query_attention_matches_the_definition() {
    check(BASE);
}

#[test]
fn qwen2_with_qkv_biases_matches_the_definition() {
    check(Shape {
        arch: "qwen2",
        rope_base: 1_000_000.0,
        ..BASE
    });
}

#[test]
fn qwen3_with_qk_norms_and_wide_heads_matches_the_definition() {
    // Head width from key_length (16 × 4 heads = 64 ≠ embedding 32), as Qwen 3 models have.
    check(Shape {
        arch: "qwen3",
        head_dim: 16,
        rope_base: 1_000_000.0,
        ..BASE
    });
}
