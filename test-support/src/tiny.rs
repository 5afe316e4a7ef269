//! Tiny models with random weights for every architecture the engine loads, in the quant types
//! real models ship in, written as GGUF files that are byte for byte the same on every run:
//! llama.cpp read these very files to record the goldens they are compared against
//! (`tests/tiny_vs_llama.rs`, `goldens/record.py --tiny`), so a misreading shared by our code and
//! our own transcription of an architecture cannot hide.
//!
//! Quantized weights are random blocks, not quantized floats: every byte pattern of a block is
//! a valid weight, and only the scale fields are set, so the values stay in a sane range.

use gguf::testfile::Builder;

/// The shape and make-up of one tiny model.
#[derive(Clone, Copy, Debug)]
pub struct Tiny {
    /// File stem, also the golden's name.
    pub name: &'static str,
    /// `general.architecture`.
    pub arch: &'static str,
    /// Embedding width.
    pub embd: usize,
    /// Query heads.
    pub heads: usize,
    /// Key-value heads.
    pub kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// FFN width (of one expert).
    pub ff: usize,
    /// Layers.
    pub layers: usize,
    /// RoPE base.
    pub rope_base: f32,
    /// Llama 3's per-frequency rope divisors (`rope_freqs.weight`).
    pub rope_freqs: bool,
    /// Gemma 3's local attention window.
    pub sliding_window: Option<u32>,
    /// Routed experts per layer and experts per token (Qwen 3 MoE), instead of a dense FFN.
    pub experts: Option<(usize, usize)>,
    /// The type of each matrix.
    pub mix: Mix,
    /// Gemma 4's make-up (`head_dim` and `ff` above are then its full layers').
    pub gemma4: Option<Gemma4Tiny>,
    /// Vocabulary size ([`VOCAB`] for the goldens' models).
    pub vocab: usize,
    /// Qwen 3.5's make-up (`heads`, `kv_heads`, `head_dim` above are its attention layers').
    pub qwen35: Option<Qwen35Tiny>,
}

/// What a tiny Qwen 3.5 has beyond the fields every model has.
#[derive(Clone, Copy, Debug)]
pub struct Qwen35Tiny {
    /// Every this-many-th layer attends; the others are Gated DeltaNet layers.
    pub attention_interval: usize,
    /// Rotated dimensions of an attention head.
    pub n_rot: usize,
    /// Taps of the convolution.
    pub conv_kernel: usize,
    /// Width of a key (and value) head of the recurrent layers.
    pub state: usize,
    /// Key heads of the recurrent layers.
    pub k_heads: usize,
    /// Value heads of the recurrent layers.
    pub v_heads: usize,
    /// The training context (`context_length`), the most `engine serve -c` accepts.
    pub context: u32,
}

/// What a tiny Gemma 4 has beyond the fields every model has.
#[derive(Clone, Copy, Debug)]
pub struct Gemma4Tiny {
    /// Sliding-window layers (the rest attend over everything).
    pub swa: &'static [bool],
    /// Head width of the sliding-window layers.
    pub head_dim_swa: usize,
    /// FFN width per layer.
    pub ff: &'static [usize],
    /// The last layers that read an earlier layer's keys and values.
    pub shared_kv: usize,
    /// Width of each layer's per-layer input.
    pub per_layer: usize,
    /// Full-attention layers with no value projection (the keys serve).
    pub values_from_keys: bool,
    /// Logit soft cap.
    pub softcap: f32,
}

/// Which matrix of the model a type is chosen for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Token embeddings.
    Embeddings,
    /// The output matrix.
    Output,
    /// Query projection.
    Query,
    /// Key projection.
    Key,
    /// Value projection.
    Value,
    /// Attention output projection.
    AttnOutput,
    /// FFN gate.
    Gate,
    /// FFN up projection.
    Up,
    /// FFN down projection.
    Down,
    /// Gemma 4's per-layer inputs: the table, the embedding's projection, each layer's gate
    /// and projection.
    PerLayer,
}

/// Types per matrix, as llama.cpp's quantizer mixes them.
#[derive(Clone, Copy, Debug)]
pub enum Mix {
    /// One type for every matrix; the output in Q6_K, as llama-quantize writes Q4_0 and Q4_1
    /// files (Q8_0, F16 and BF16 files keep their own type there).
    Uniform(&'static str),
    /// Q4_K_M: Q4_K, with Q6_K for the first layer's value and down matrices and the output.
    Q4KM,
    /// Q5_K_M: the same with Q5_K.
    Q5KM,
    /// What Qwen 2.5 files hold where rows do not divide into K-quant blocks: Q5_0, Q5_1,
    /// IQ4_NL and Q8_0 side by side.
    LegacyMixed,
}

impl Mix {
    fn type_of(self, role: Role, layer: usize) -> &'static str {
        // Rows of Gemma 4's per-layer parts are narrow (a layer's slice): Q8_0 blocks fit them.
        if role == Role::PerLayer {
            return "Q8_0";
        }
        let first_layer_wide = layer == 0 && matches!(role, Role::Value | Role::Down);
        match self {
            Mix::Uniform(ty) if role == Role::Output && ty != "F16" && ty != "BF16" => {
                if ty == "Q8_0" { "Q8_0" } else { "Q6_K" }
            }
            Mix::Uniform(ty) => ty,
            Mix::Q4KM if role == Role::Output || first_layer_wide => "Q6_K",
            Mix::Q4KM => "Q4_K",
            Mix::Q5KM if role == Role::Output || first_layer_wide => "Q6_K",
            Mix::Q5KM => "Q5_K",
            Mix::LegacyMixed => match role {
                Role::Embeddings => "Q8_0",
                Role::Output => "Q8_0",
                Role::Query | Role::Key => "Q5_0",
                Role::Value | Role::AttnOutput => "Q5_1",
                Role::Gate | Role::Up => "IQ4_NL",
                Role::Down | Role::PerLayer => "Q8_0",
            },
        }
    }
}

/// Vocabulary: unknown, BOS, EOS, the ASCII byte tokens, then word pieces.
pub const VOCAB: usize = 320;

/// Byte tokens in the vocabulary (`<0x00>` to `<0x7F>`).
const ASCII_BYTES: usize = 128;

/// Llama with grouped-query attention and Llama 3's rope factors, in Q4_K_M.
const LLAMA: Tiny = Tiny {
    name: "tiny-llama-q4_k_m",
    arch: "llama",
    embd: 256,
    heads: 8,
    kv_heads: 2,
    head_dim: 32,
    ff: 512,
    layers: 2,
    rope_base: 500_000.0,
    rope_freqs: true,
    sliding_window: None,
    experts: None,
    mix: Mix::Q4KM,
    gemma4: None,
    vocab: VOCAB,
    qwen35: None,
};

/// Qwen 3 with heads wider than the embedding (4 × 128 = 512), in Q5_K_M.
const QWEN3: Tiny = Tiny {
    name: "tiny-qwen3-q5_k_m",
    arch: "qwen3",
    heads: 4,
    kv_heads: 2,
    head_dim: 128,
    rope_base: 1_000_000.0,
    rope_freqs: false,
    mix: Mix::Q5KM,
    ..LLAMA
};

/// Qwen 3.5 scaled down: six layers of which the third and sixth attend (every third; the
/// real model every fourth), twice as many value heads as key heads in the recurrent layers
/// (4B's 32 and 16), a quarter of each attention head rotated, and a multi-token-prediction
/// layer after the trunk; Q4_K_M as llama-quantize mixes it.
pub const QWEN35: Tiny = Tiny {
    name: "tiny-qwen35-q4_k_m",
    arch: "qwen35",
    heads: 4,
    kv_heads: 2,
    head_dim: 64,
    ff: 512,
    layers: 6,
    rope_base: 10_000_000.0,
    rope_freqs: false,
    qwen35: Some(Qwen35Tiny {
        attention_interval: 3,
        n_rot: 16,
        conv_kernel: 4,
        state: 32,
        k_heads: 4,
        v_heads: 8,
        context: 1024,
    }),
    ..LLAMA
};

/// The models the goldens cover.
pub const MODELS: [Tiny; 12] = [
    LLAMA,
    Tiny {
        name: "tiny-llama-q8_0",
        mix: Mix::Uniform("Q8_0"),
        ..LLAMA
    },
    Tiny {
        name: "tiny-llama-q4_0",
        rope_freqs: false,
        rope_base: 10_000.0,
        mix: Mix::Uniform("Q4_0"),
        ..LLAMA
    },
    Tiny {
        name: "tiny-llama-q4_1",
        rope_freqs: false,
        rope_base: 100_000.0,
        mix: Mix::Uniform("Q4_1"),
        ..LLAMA
    },
    Tiny {
        name: "tiny-qwen2-legacy-mixed",
        arch: "qwen2",
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        rope_base: 1_000_000.0,
        rope_freqs: false,
        mix: Mix::LegacyMixed,
        ..LLAMA
    },
    QWEN3,
    Tiny {
        name: "tiny-qwen3-f16",
        mix: Mix::Uniform("F16"),
        ..QWEN3
    },
    Tiny {
        name: "tiny-gemma3-q4_k_m",
        arch: "gemma3",
        heads: 4,
        kv_heads: 1,
        head_dim: 64,
        // Six layers: Gemma 3's sixth layer is its first global one.
        layers: 6,
        rope_base: 1_000_000.0,
        rope_freqs: false,
        sliding_window: Some(8),
        mix: Mix::Q4KM,
        ..LLAMA
    },
    Tiny {
        name: "tiny-gemma4-q4_k_m",
        arch: "gemma4",
        heads: 4,
        kv_heads: 1,
        // E2B's make-up scaled down: full layers' heads twice the sliding ones' width, a 4:1
        // pattern whose last full and sliding layers before the shared ones are 3 and 2, the
        // shared layers' FFN twice as wide, values from the keys on full layers, a logit cap.
        head_dim: 128,
        ff: 512,
        layers: 7,
        rope_base: 1_000_000.0,
        rope_freqs: true,
        sliding_window: Some(8),
        mix: Mix::Q4KM,
        gemma4: Some(Gemma4Tiny {
            swa: &[true, true, true, false, true, true, false],
            head_dim_swa: 64,
            ff: &[512, 512, 512, 512, 1024, 1024, 1024],
            shared_kv: 3,
            per_layer: 32,
            values_from_keys: true,
            softcap: 30.0,
        }),
        ..LLAMA
    },
    Tiny {
        name: "tiny-qwen3moe-q4_k_m",
        arch: "qwen3moe",
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        ff: 256,
        // Qwen3-30B-A3B routes each token to 8 of 128 experts; here 2 of 8.
        experts: Some((8, 2)),
        rope_base: 1_000_000.0,
        rope_freqs: false,
        ..LLAMA
    },
    QWEN35,
    Tiny {
        name: "tiny-qwen35moe-q4_k_m",
        arch: "qwen35moe",
        // 8 routed experts of which 2 per token (35B-A3B routes 8 of 256), a shared one.
        experts: Some((8, 2)),
        ..QWEN35
    },
];

/// For speed, not goldens (`bench/engine-vs-llama.sh --moe`): Qwen3-30B-A3B's make-up scaled
/// down: 2 KV heads of 128 under 16 query heads, 64 experts of which 4 per token (its 8 of 128),
/// in Q4_K_M; about 450 MB.
pub const MOE_BENCH: Tiny = Tiny {
    name: "moe-bench-q4_k_m",
    arch: "qwen3moe",
    embd: 1024,
    heads: 16,
    kv_heads: 2,
    head_dim: 128,
    ff: 512,
    layers: 8,
    experts: Some((64, 4)),
    rope_base: 1_000_000.0,
    rope_freqs: false,
    ..LLAMA
};

/// For speed, not goldens (`bench/engine-vs-llama.sh --qwen35`): Qwen 3.5 4B's real shapes
/// with random weights in Q4_K_M — 32 layers 2560 wide of which every fourth attends (16
/// query heads over 4 key-value heads 256 wide, 64 dimensions rotated), the others Gated
/// DeltaNet layers (16 key heads and 32 value heads of 128, a 4-tap convolution), FFN 9216,
/// 248,320 tokens, and its nextn layer; about 2.9 GB.
pub const QWEN35_4B_BENCH: Tiny = Tiny {
    name: "qwen35-4b-shape-q4_k_m",
    arch: "qwen35",
    embd: 2560,
    heads: 16,
    kv_heads: 4,
    head_dim: 256,
    ff: 9216,
    layers: 32,
    rope_base: 10_000_000.0,
    rope_freqs: false,
    sliding_window: None,
    experts: None,
    mix: Mix::Q4KM,
    gemma4: None,
    vocab: 248_320,
    qwen35: Some(Qwen35Tiny {
        attention_interval: 4,
        n_rot: 64,
        conv_kernel: 4,
        state: 128,
        k_heads: 16,
        v_heads: 32,
        // Qwen 3.5 4B's, so benchmarks can ask for any context a user would.
        context: 262_144,
    }),
};

/// The token ids every golden's prompt holds: word pieces and bytes, no control tokens.
pub fn prompt() -> Vec<u32> {
    let mut r = Random(0x0123_4567_89ab_cdef);
    (0..24)
        .map(|_| 3 + (r.next() % (VOCAB as u64 - 3)) as u32)
        .collect()
}

/// A longer prompt (300 tokens, several passes) for a model with a recurrent state, so the
/// state carries across passes and long enough for every head's memory to fill and decay.
pub fn long_prompt() -> Vec<u32> {
    let mut r = Random(0x005e_ed0f_7e57_1e55);
    (0..300)
        .map(|_| 3 + (r.next() % (VOCAB as u64 - 3)) as u32)
        .collect()
}

/// A small deterministic generator (xorshift).
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn signed(&mut self) -> f32 {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
    }

    /// Uniform in [lo, hi).
    fn between(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (self.signed() + 1.0) / 2.0 * (hi - lo)
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next() >> 24) as u8).collect()
    }
}

/// Largest weight magnitude aimed at.
const AMPLITUDE: f32 = 0.15;

fn f16(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// One random block of type `ty` (its scale fields set so values stay within about
/// ±[`AMPLITUDE`] with a mean near zero).
fn block(ty: &str, r: &mut Random) -> Vec<u8> {
    let a = AMPLITUDE;
    let d = |r: &mut Random, max_code: f32| f16(a / max_code * r.between(0.5, 1.5));
    match ty {
        "Q8_0" => [d(r, 127.0).to_vec(), r.bytes(32)].concat(),
        "Q4_0" => [d(r, 8.0).to_vec(), r.bytes(16)].concat(),
        "Q4_1" => [d(r, 7.5).to_vec(), f16(-a).to_vec(), r.bytes(16)].concat(),
        "Q5_0" => [d(r, 16.0).to_vec(), r.bytes(20)].concat(),
        "Q5_1" => [d(r, 15.5).to_vec(), f16(-a).to_vec(), r.bytes(20)].concat(),
        "IQ4_NL" => [d(r, 127.0).to_vec(), r.bytes(16)].concat(),
        "Q4_K" | "Q5_K" => {
            // value = d·scale·q − dmin·min, scale and min 6-bit: dmin = d·(mean q) centres it.
            let levels = if ty == "Q4_K" { 15.0 } else { 31.0 };
            let dv = a / (63.0 * levels) * 2.0 * r.between(0.5, 1.5);
            let body = if ty == "Q4_K" { 140 } else { 172 };
            [
                f16(dv).to_vec(),
                f16(dv * levels / 2.0).to_vec(),
                r.bytes(body),
            ]
            .concat()
        }
        "Q6_K" => [r.bytes(208), d(r, 127.0 * 32.0).to_vec()].concat(),
        other => panic!("no random blocks for {other}"),
    }
}

/// A `rows` × `cols` matrix of type `ty`, as its bytes.
fn matrix(ty: &str, rows: usize, cols: usize, r: &mut Random) -> (u32, Vec<u8>) {
    let info = (0..64)
        .filter_map(gguf::TensorType::from_id)
        .find(|t| t.name == ty)
        .unwrap_or_else(|| panic!("type {ty}"));
    let bytes = match ty {
        "F16" => (0..rows * cols)
            .flat_map(|_| f16(AMPLITUDE * r.signed()))
            .collect(),
        "BF16" => (0..rows * cols)
            .flat_map(|_| {
                let bits = (AMPLITUDE * r.signed()).to_bits();
                ((bits >> 16) as u16).to_le_bytes()
            })
            .collect(),
        _ => {
            assert_eq!(
                cols % info.block_elements as usize,
                0,
                "{ty} rows of {cols}"
            );
            (0..rows * cols / info.block_elements as usize)
                .flat_map(|_| block(ty, r))
                .collect()
        }
    };
    (info.id, bytes)
}

/// A function adding a random `rows` × `cols` matrix to a file, of the type `mix` gives a role
/// in a layer.
fn adder(mix: Mix) -> impl Fn(Builder, &mut Random, &str, Role, usize, usize, usize) -> Builder {
    move |b, r, name, role, layer, rows, cols| {
        let (ty, bytes) = matrix(mix.type_of(role, layer), rows, cols, r);
        b.raw_tensor(name, &[cols as u64, rows as u64], ty, bytes)
    }
}

/// The GGUF file of `t`.
pub fn gguf_bytes(t: &Tiny) -> Vec<u8> {
    // Each model its own weights: the seed is the name's FNV-1a hash.
    let seed = t.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut r = Random(seed);
    if let Some(g) = t.gemma4 {
        return gemma4_bytes(t, &g, &mut r);
    }
    if let Some(q) = t.qwen35 {
        return qwen35_bytes(t, &q, &mut r);
    }
    let (q_dim, kv_dim) = (t.heads * t.head_dim, t.kv_heads * t.head_dim);
    let key = |k: &str| format!("{}.{k}", t.arch);
    let mut b = with_vocabulary(
        Builder::new()
            .string("general.architecture", t.arch)
            .string("general.name", t.name)
            .u32(&key("context_length"), 512)
            .u32(&key("embedding_length"), t.embd as u32)
            .u32(&key("block_count"), t.layers as u32)
            .u32(&key("feed_forward_length"), t.ff as u32)
            .u32(&key("attention.head_count"), t.heads as u32)
            .u32(&key("attention.head_count_kv"), t.kv_heads as u32)
            .u32(&key("attention.key_length"), t.head_dim as u32)
            .u32(&key("attention.value_length"), t.head_dim as u32)
            .u32(&key("rope.dimension_count"), t.head_dim as u32)
            .f32(&key("rope.freq_base"), t.rope_base)
            .f32(&key("attention.layer_norm_rms_epsilon"), 1e-6),
        t.vocab,
    );
    if let Some(window) = t.sliding_window {
        b = b.u32(&key("attention.sliding_window"), window);
    }
    if let Some((count, used)) = t.experts {
        b = b
            .u32(&key("expert_count"), count as u32)
            .u32(&key("expert_used_count"), used as u32)
            .u32(&key("expert_feed_forward_length"), t.ff as u32);
    }
    let norm =
        |r: &mut Random, n: usize| -> Vec<f32> { (0..n).map(|_| 1.0 + 0.2 * r.signed()).collect() };
    let add = adder(t.mix);
    b = add(
        b,
        &mut r,
        "token_embd.weight",
        Role::Embeddings,
        0,
        t.vocab,
        t.embd,
    );
    if t.arch != "gemma3" {
        b = add(b, &mut r, "output.weight", Role::Output, 0, t.vocab, t.embd);
    }
    for i in 0..t.layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        b = add(b, &mut r, &n("attn_q"), Role::Query, i, q_dim, t.embd);
        b = add(b, &mut r, &n("attn_k"), Role::Key, i, kv_dim, t.embd);
        b = add(b, &mut r, &n("attn_v"), Role::Value, i, kv_dim, t.embd);
        b = add(
            b,
            &mut r,
            &n("attn_output"),
            Role::AttnOutput,
            i,
            t.embd,
            q_dim,
        );
        match t.experts {
            None => {
                b = add(b, &mut r, &n("ffn_gate"), Role::Gate, i, t.ff, t.embd);
                b = add(b, &mut r, &n("ffn_up"), Role::Up, i, t.ff, t.embd);
                b = add(b, &mut r, &n("ffn_down"), Role::Down, i, t.embd, t.ff);
            }
            Some((count, _)) => {
                // The router in F32, as converted models keep it; each expert tensor 3-D.
                let router: Vec<f32> = (0..count * t.embd)
                    .map(|_| AMPLITUDE * r.signed())
                    .collect();
                b = b.f32_matrix(&n("ffn_gate_inp"), t.embd, count, &router);
                for (s, role, rows, cols) in [
                    ("ffn_gate_exps", Role::Gate, t.ff, t.embd),
                    ("ffn_up_exps", Role::Up, t.ff, t.embd),
                    ("ffn_down_exps", Role::Down, t.embd, t.ff),
                ] {
                    let (ty, bytes) = matrix(t.mix.type_of(role, i), rows * count, cols, &mut r);
                    let dims = [cols as u64, rows as u64, count as u64];
                    b = b.raw_tensor(&n(s), &dims, ty, bytes);
                }
            }
        }
    }
    let mut r = Random(0x2545_f491_4f6c_dd1d);
    b = b.f32_tensor("output_norm.weight", &norm(&mut r, t.embd));
    if t.rope_freqs {
        // Llama 3.1's factors: 1 for high frequencies, up to 8 for the lowest.
        let half = t.head_dim / 2;
        let factors: Vec<f32> = (0..half)
            .map(|i| 1.0 + 7.0 * (i as f32 / (half - 1) as f32).powi(2))
            .collect();
        b = b.f32_tensor("rope_freqs.weight", &factors);
    }
    for i in 0..t.layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        b = b
            .f32_tensor(&n("attn_norm"), &norm(&mut r, t.embd))
            .f32_tensor(&n("ffn_norm"), &norm(&mut r, t.embd));
        if t.arch == "qwen2" {
            let bias = |r: &mut Random, n: usize| -> Vec<f32> {
                (0..n).map(|_| 0.5 * r.signed()).collect()
            };
            b = b
                .f32_tensor(&format!("blk.{i}.attn_q.bias"), &bias(&mut r, q_dim))
                .f32_tensor(&format!("blk.{i}.attn_k.bias"), &bias(&mut r, kv_dim))
                .f32_tensor(&format!("blk.{i}.attn_v.bias"), &bias(&mut r, kv_dim));
        }
        if matches!(t.arch, "qwen3" | "qwen3moe" | "gemma3") {
            b = b
                .f32_tensor(&n("attn_q_norm"), &norm(&mut r, t.head_dim))
                .f32_tensor(&n("attn_k_norm"), &norm(&mut r, t.head_dim));
        }
        if t.arch == "gemma3" {
            b = b
                .f32_tensor(&n("post_attention_norm"), &norm(&mut r, t.embd))
                .f32_tensor(&n("post_ffw_norm"), &norm(&mut r, t.embd));
        }
    }
    b.build()
}

/// `b` with the tiny vocabulary: unknown, BOS, EOS, the ASCII byte tokens, then word pieces.
fn with_vocabulary(b: Builder, vocab: usize) -> Builder {
    // Only the ASCII byte tokens: llama-server holds back a token that ends in the middle of a
    // UTF-8 character and reports no probabilities for it, which would shift the golden.
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    tokens.extend((0..ASCII_BYTES).map(|b| format!("<0x{b:02X}>")));
    let pieces = "abcdefghijklmnopqrstuvwxyz".chars();
    tokens.extend(pieces.clone().map(|c| format!("\u{2581}{c}")));
    tokens.extend(pieces.clone().map(|c| c.to_string()));
    tokens.extend((0..vocab - tokens.len()).map(|i| format!("\u{2581}w{i}")));
    let token_refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let types: Vec<i32> = (0..vocab)
        .map(|i| match i {
            0 => 2,
            1 | 2 => 3,
            i if i < 3 + ASCII_BYTES => 6,
            _ => 1,
        })
        .collect();
    let scores: Vec<f32> = (0..vocab).map(|i| -(i as f32)).collect();
    b.string("tokenizer.ggml.model", "llama")
        .strings("tokenizer.ggml.tokens", &token_refs)
        .f32s("tokenizer.ggml.scores", &scores)
        .i32s("tokenizer.ggml.token_type", &types)
        .u32("tokenizer.ggml.unknown_token_id", 0)
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2)
}

/// The GGUF file of a tiny Gemma 4 (`t.gemma4` is `g`), with llama.cpp 11434's keys: per-layer
/// arrays, the pattern as bools, head widths by layer type, shared key-value layers, per-layer
/// token embeddings, proportional rope factors on the full layers and a logit cap.
fn gemma4_bytes(t: &Tiny, g: &Gemma4Tiny, r: &mut Random) -> Vec<u8> {
    let key = |k: &str| format!("gemma4.{k}");
    let layers = t.layers;
    let kv_start = layers - g.shared_kv;
    let head = |il: usize| {
        if g.swa[il] {
            g.head_dim_swa
        } else {
            t.head_dim
        }
    };
    let mut b = with_vocabulary(
        Builder::new()
            .string("general.architecture", "gemma4")
            .string("general.name", t.name)
            .u32(&key("context_length"), 512)
            .u32(&key("embedding_length"), t.embd as u32)
            .u32(&key("block_count"), layers as u32)
            .u32s(
                &key("feed_forward_length"),
                &g.ff.iter().map(|&f| f as u32).collect::<Vec<_>>(),
            )
            .u32(&key("attention.head_count"), t.heads as u32)
            .u32(&key("attention.head_count_kv"), t.kv_heads as u32)
            .u32(&key("attention.key_length"), t.head_dim as u32)
            .u32(&key("attention.value_length"), t.head_dim as u32)
            .u32(&key("attention.key_length_swa"), g.head_dim_swa as u32)
            .u32(&key("attention.value_length_swa"), g.head_dim_swa as u32)
            .u32(
                &key("attention.sliding_window"),
                t.sliding_window.unwrap_or(512),
            )
            .bools(&key("attention.sliding_window_pattern"), g.swa)
            .u32(&key("attention.shared_kv_layers"), g.shared_kv as u32)
            .u32(&key("embedding_length_per_layer_input"), g.per_layer as u32)
            .u32(&key("rope.dimension_count"), t.head_dim as u32)
            .u32(&key("rope.dimension_count_swa"), g.head_dim_swa as u32)
            .f32(&key("rope.freq_base"), t.rope_base)
            .f32(&key("rope.freq_base_swa"), 10_000.0)
            .f32(&key("attention.layer_norm_rms_epsilon"), 1e-6)
            .f32(&key("final_logit_softcapping"), g.softcap),
        t.vocab,
    );
    let add = adder(t.mix);
    let all = g.per_layer * layers;
    b = add(
        b,
        r,
        "token_embd.weight",
        Role::Embeddings,
        0,
        t.vocab,
        t.embd,
    );
    b = add(
        b,
        r,
        "per_layer_token_embd.weight",
        Role::PerLayer,
        0,
        t.vocab,
        all,
    );
    b = add(
        b,
        r,
        "per_layer_model_proj.weight",
        Role::PerLayer,
        0,
        all,
        t.embd,
    );
    for i in 0..layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let (q_dim, kv_dim) = (t.heads * head(i), t.kv_heads * head(i));
        b = add(b, r, &n("attn_q"), Role::Query, i, q_dim, t.embd);
        if i < kv_start {
            b = add(b, r, &n("attn_k"), Role::Key, i, kv_dim, t.embd);
            if g.swa[i] || !g.values_from_keys {
                b = add(b, r, &n("attn_v"), Role::Value, i, kv_dim, t.embd);
            }
        }
        b = add(b, r, &n("attn_output"), Role::AttnOutput, i, t.embd, q_dim);
        b = add(b, r, &n("ffn_gate"), Role::Gate, i, g.ff[i], t.embd);
        b = add(b, r, &n("ffn_up"), Role::Up, i, g.ff[i], t.embd);
        b = add(b, r, &n("ffn_down"), Role::Down, i, t.embd, g.ff[i]);
        b = add(b, r, &n("inp_gate"), Role::PerLayer, i, g.per_layer, t.embd);
        b = add(b, r, &n("proj"), Role::PerLayer, i, t.embd, g.per_layer);
    }
    let mut r = Random(0x2545_f491_4f6c_dd1d);
    let norm =
        |r: &mut Random, n: usize| -> Vec<f32> { (0..n).map(|_| 1.0 + 0.2 * r.signed()).collect() };
    b = b
        .f32_tensor("output_norm.weight", &norm(&mut r, t.embd))
        .f32_tensor("per_layer_proj_norm.weight", &norm(&mut r, g.per_layer));
    // Proportional rope on the full layers: a quarter of the pairs turn, the rest are frozen
    // by a huge divisor (as the converter writes E2B's).
    let half = t.head_dim / 2;
    let factors: Vec<f32> = (0..half)
        .map(|i| if i < half / 4 { 1.0 } else { 1e30 })
        .collect();
    b = b.f32_tensor("rope_freqs.weight", &factors);
    // Attention scores are q·k with scale 1: query and key norms near 0.4 keep them within a
    // few units, as trained weights do (norms near 1 make every softmax a near-argmax, and the
    // model then amplifies rounding noise into nats).
    let qk_norm = |r: &mut Random, n: usize| -> Vec<f32> {
        (0..n).map(|_| 0.4 + 0.08 * r.signed()).collect()
    };
    for i in 0..layers {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        b = b
            .f32_tensor(&n("attn_norm"), &norm(&mut r, t.embd))
            .f32_tensor(&n("attn_q_norm"), &qk_norm(&mut r, head(i)))
            .f32_tensor(&n("post_attention_norm"), &norm(&mut r, t.embd))
            .f32_tensor(&n("ffn_norm"), &norm(&mut r, t.embd))
            .f32_tensor(&n("post_ffw_norm"), &norm(&mut r, t.embd))
            .f32_tensor(&n("post_norm"), &norm(&mut r, t.embd))
            .f32_tensor(
                &n("layer_output_scale"),
                &[0.5 + 0.5 * (r.signed() + 1.0) / 2.0],
            );
        if i < kv_start {
            b = b.f32_tensor(&n("attn_k_norm"), &qk_norm(&mut r, head(i)));
        }
    }
    b.build()
}

/// The make-up of a Gemma 4 draft head.
#[derive(Clone, Copy, Debug)]
pub struct HeadShape {
    /// Its width.
    pub embd: usize,
    /// Query heads.
    pub heads: usize,
    /// FFN width.
    pub ff: usize,
    /// Its layers: sliding-window or full.
    pub swa: &'static [bool],
}

/// The goldens' head: narrower than the tiny target (64), a sliding then a full layer.
pub const TINY_HEAD: HeadShape = HeadShape {
    embd: 64,
    heads: 2,
    ff: 128,
    swa: &[true, false],
};

/// E2B's head (published configurations: width 256, three sliding layers and a full one, 4
/// heads, FFN 2048), for speed.
pub const E2B_HEAD: HeadShape = HeadShape {
    embd: 256,
    heads: 4,
    ff: 2048,
    swa: &[true, true, true, false],
};

/// For speed, not goldens (`bench/engine-vs-llama.sh --e2b`): Gemma 4 E2B's real shapes with
/// random weights in Q4_K_M — 35 layers 1536 wide, 8 query heads over one key-value head 256
/// wide (512 on the full layers, every fifth), the last 20 layers reading the 14th and 15th's
/// keys and values with FFNs twice as wide, per-layer inputs 256 wide, 262,144 tokens; about
/// 3.5 GB (the per-layer table in Q8_0 is most of it, read a row per token).
pub const E2B_BENCH: Tiny = Tiny {
    name: "gemma4-e2b-shape-q4_k_m",
    arch: "gemma4",
    embd: 1536,
    heads: 8,
    kv_heads: 1,
    head_dim: 512,
    ff: 6144,
    layers: 35,
    rope_base: 1_000_000.0,
    rope_freqs: true,
    sliding_window: Some(512),
    experts: None,
    mix: Mix::Q4KM,
    gemma4: Some(Gemma4Tiny {
        swa: &[
            true, true, true, true, false, true, true, true, true, false, true, true, true, true,
            false, true, true, true, true, false, true, true, true, true, false, true, true, true,
            true, false, true, true, true, true, false,
        ],
        head_dim_swa: 256,
        ff: &[
            6144, 6144, 6144, 6144, 6144, 6144, 6144, 6144, 6144, 6144, 6144, 6144, 6144, 6144,
            6144, 12288, 12288, 12288, 12288, 12288, 12288, 12288, 12288, 12288, 12288, 12288,
            12288, 12288, 12288, 12288, 12288, 12288, 12288, 12288, 12288,
        ],
        shared_kv: 20,
        per_layer: 256,
        values_from_keys: true,
        softcap: 30.0,
    }),
    vocab: 262_144,
    qwen35: None,
};

/// A Gemma 4 draft head (`gemma4-assistant`) of `shape` for the Gemma 4 `target`: layers whose
/// head widths and key-value heads are those of the target layers they read, in the types
/// published heads mix (Q8_0, F16).
pub fn gemma4_head_bytes(target: &Tiny, shape: &HeadShape) -> Vec<u8> {
    let g = target.gemma4.expect("a Gemma 4 target");
    let key = |k: &str| format!("gemma4-assistant.{k}");
    let (embd, heads, ff) = (shape.embd, shape.heads, shape.ff);
    let swa = shape.swa;
    let head = |il: usize| {
        if swa[il] {
            g.head_dim_swa
        } else {
            target.head_dim
        }
    };
    let mut r = Random(0x9e37_79b9_7f4a_7c15);
    let mut b = with_vocabulary(
        Builder::new()
            .string("general.architecture", "gemma4-assistant")
            .string("general.name", "tiny-gemma4-head")
            .u32(&key("context_length"), 512)
            .u32(&key("embedding_length"), embd as u32)
            .u32(&key("embedding_length_out"), target.embd as u32)
            .u32(&key("block_count"), swa.len() as u32)
            .u32(&key("nextn_predict_layers"), swa.len() as u32)
            .u32s(&key("feed_forward_length"), &vec![ff as u32; swa.len()])
            .u32(&key("attention.head_count"), heads as u32)
            .u32(&key("attention.head_count_kv"), target.kv_heads as u32)
            .u32(&key("attention.key_length"), target.head_dim as u32)
            .u32(&key("attention.value_length"), target.head_dim as u32)
            .u32(&key("attention.key_length_swa"), g.head_dim_swa as u32)
            .u32(&key("attention.value_length_swa"), g.head_dim_swa as u32)
            .u32(
                &key("attention.sliding_window"),
                target.sliding_window.unwrap_or(512),
            )
            .bools(&key("attention.sliding_window_pattern"), swa)
            .u32(&key("rope.dimension_count"), target.head_dim as u32)
            .u32(&key("rope.dimension_count_swa"), g.head_dim_swa as u32)
            .f32(&key("rope.freq_base"), target.rope_base)
            .f32(&key("rope.freq_base_swa"), 10_000.0)
            .f32(&key("attention.layer_norm_rms_epsilon"), 1e-6),
        target.vocab,
    );
    let add = |b: Builder, r: &mut Random, name: &str, ty: &str, rows: usize, cols: usize| {
        let (id, bytes) = matrix(ty, rows, cols, r);
        b.raw_tensor(name, &[cols as u64, rows as u64], id, bytes)
    };
    b = add(b, &mut r, "token_embd.weight", "Q8_0", target.vocab, embd);
    b = add(
        b,
        &mut r,
        "nextn.pre_projection.weight",
        "F16",
        embd,
        2 * target.embd,
    );
    b = add(
        b,
        &mut r,
        "nextn.post_projection.weight",
        "Q8_0",
        target.embd,
        embd,
    );
    for (i, _) in swa.iter().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let q_dim = heads * head(i);
        b = add(b, &mut r, &n("attn_q"), "Q8_0", q_dim, embd);
        b = add(b, &mut r, &n("attn_output"), "Q8_0", embd, q_dim);
        b = add(b, &mut r, &n("ffn_gate"), "Q8_0", ff, embd);
        b = add(b, &mut r, &n("ffn_up"), "Q8_0", ff, embd);
        b = add(b, &mut r, &n("ffn_down"), "F16", embd, ff);
    }
    let norm =
        |r: &mut Random, n: usize| -> Vec<f32> { (0..n).map(|_| 1.0 + 0.2 * r.signed()).collect() };
    b = b.f32_tensor("output_norm.weight", &norm(&mut r, embd));
    let half = target.head_dim / 2;
    let factors: Vec<f32> = (0..half)
        .map(|i| if i < half / 4 { 1.0 } else { 1e30 })
        .collect();
    b = b.f32_tensor("rope_freqs.weight", &factors);
    for (i, _) in swa.iter().enumerate() {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        let q_norm: Vec<f32> = (0..head(i)).map(|_| 0.4 + 0.08 * r.signed()).collect();
        b = b
            .f32_tensor(&n("attn_norm"), &norm(&mut r, embd))
            .f32_tensor(&n("attn_q_norm"), &q_norm)
            .f32_tensor(&n("post_attention_norm"), &norm(&mut r, embd))
            .f32_tensor(&n("ffn_norm"), &norm(&mut r, embd))
            .f32_tensor(&n("post_ffw_norm"), &norm(&mut r, embd))
            .f32_tensor(
                &n("layer_output_scale"),
                &[0.5 + 0.5 * (r.signed() + 1.0) / 2.0],
            );
    }
    b.build()
}

/// The GGUF file of a tiny Qwen 3.5 (`t.qwen35` is `q`), with llama.cpp 11434's keys and the
/// tensors its loader creates: Gated DeltaNet layers (`attn_qkv`, `attn_gate`, `ssm_*`),
/// gated attention layers (queries and their gates in `attn_q`), the pre-FFN norm named
/// `post_attention_norm`, and a nextn layer after the trunk (which llama.cpp loads and only a
/// draft context runs).
fn qwen35_bytes(t: &Tiny, q: &Qwen35Tiny, r: &mut Random) -> Vec<u8> {
    let key = |k: &str| format!("{}.{k}", t.arch);
    let blocks = t.layers + 1;
    let (key_dim, value_dim) = (q.k_heads * q.state, q.v_heads * q.state);
    let channels = 2 * key_dim + value_dim;
    let attends = |il: usize| il >= t.layers || (il + 1).is_multiple_of(q.attention_interval);
    // IMROPE's sections (temporal, height, width, extra) share the rotated pairs.
    let pairs = (q.n_rot / 2) as u32;
    let mut b = with_vocabulary(
        Builder::new()
            .string("general.architecture", t.arch)
            .string("general.name", t.name)
            .u32(&key("context_length"), q.context)
            .u32(&key("embedding_length"), t.embd as u32)
            .u32(&key("block_count"), blocks as u32)
            .u32(&key("nextn_predict_layers"), 1)
            .u32(&key("feed_forward_length"), t.ff as u32)
            .u32(&key("attention.head_count"), t.heads as u32)
            .u32(&key("attention.head_count_kv"), t.kv_heads as u32)
            .u32(&key("attention.key_length"), t.head_dim as u32)
            .u32(&key("attention.value_length"), t.head_dim as u32)
            .u32(&key("rope.dimension_count"), q.n_rot as u32)
            .u32s(
                &key("rope.dimension_sections"),
                &[pairs - pairs / 2, pairs / 2, 0, 0],
            )
            .f32(&key("rope.freq_base"), t.rope_base)
            .f32(&key("attention.layer_norm_rms_epsilon"), 1e-6)
            .u32(&key("full_attention_interval"), q.attention_interval as u32)
            .u32(&key("ssm.conv_kernel"), q.conv_kernel as u32)
            .u32(&key("ssm.state_size"), q.state as u32)
            .u32(&key("ssm.group_count"), q.k_heads as u32)
            .u32(&key("ssm.time_step_rank"), q.v_heads as u32)
            .u32(&key("ssm.inner_size"), value_dim as u32),
        t.vocab,
    );
    if let Some((count, used)) = t.experts {
        // Routed experts half as wide as the shared one, as Qwen3.5-35B-A3B's are.
        b = b
            .u32(&key("expert_count"), count as u32)
            .u32(&key("expert_used_count"), used as u32)
            .u32(&key("expert_feed_forward_length"), (t.ff / 2) as u32)
            .u32(&key("expert_shared_feed_forward_length"), t.ff as u32);
    }
    let add = adder(t.mix);
    let (q_dim, kv_dim, e) = (t.heads * t.head_dim, t.kv_heads * t.head_dim, t.embd);
    let mut b = add(b, r, "token_embd.weight", Role::Embeddings, 0, t.vocab, e);
    b = add(b, r, "output.weight", Role::Output, 0, t.vocab, e);
    for i in 0..blocks {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        if attends(i) {
            b = add(b, r, &n("attn_q"), Role::Query, i, 2 * q_dim, e);
            b = add(b, r, &n("attn_k"), Role::Key, i, kv_dim, e);
            b = add(b, r, &n("attn_v"), Role::Value, i, kv_dim, e);
            b = add(b, r, &n("attn_output"), Role::AttnOutput, i, e, q_dim);
        } else {
            b = add(b, r, &n("attn_qkv"), Role::Value, i, channels, e);
            b = add(b, r, &n("attn_gate"), Role::Query, i, value_dim, e);
            b = add(b, r, &n("ssm_alpha"), Role::Key, i, q.v_heads, e);
            b = add(b, r, &n("ssm_beta"), Role::Key, i, q.v_heads, e);
            b = add(b, r, &n("ssm_out"), Role::AttnOutput, i, e, value_dim);
        }
        match t.experts {
            None => {
                b = add(b, r, &n("ffn_gate"), Role::Gate, i, t.ff, e);
                b = add(b, r, &n("ffn_up"), Role::Up, i, t.ff, e);
                b = add(b, r, &n("ffn_down"), Role::Down, i, e, t.ff);
            }
            Some((count, _)) => {
                // A decisive router, as trained ones are: near-ties between experts flip with
                // any rounding and would measure chaos rather than the arithmetic.
                let router: Vec<f32> = (0..count * e)
                    .map(|_| 8.0 * AMPLITUDE * r.signed())
                    .collect();
                let shared_gate: Vec<f32> = (0..e).map(|_| AMPLITUDE * r.signed()).collect();
                b = b
                    .f32_matrix(&n("ffn_gate_inp"), e, count, &router)
                    .f32_tensor(&n("ffn_gate_inp_shexp"), &shared_gate);
                let ff = t.ff / 2;
                for (s, role, rows, cols) in [
                    ("ffn_gate_exps", Role::Gate, ff, e),
                    ("ffn_up_exps", Role::Up, ff, e),
                    ("ffn_down_exps", Role::Down, e, ff),
                ] {
                    let (ty, bytes) = matrix(t.mix.type_of(role, i), rows * count, cols, r);
                    let dims = [cols as u64, rows as u64, count as u64];
                    b = b.raw_tensor(&n(s), &dims, ty, bytes);
                }
                b = add(b, r, &n("ffn_gate_shexp"), Role::Gate, i, t.ff, e);
                b = add(b, r, &n("ffn_up_shexp"), Role::Up, i, t.ff, e);
                b = add(b, r, &n("ffn_down_shexp"), Role::Down, i, e, t.ff);
            }
        }
    }
    b = add(
        b,
        r,
        &format!("blk.{}.nextn.eh_proj.weight", t.layers),
        Role::AttnOutput,
        t.layers,
        e,
        2 * e,
    );
    let mut r = Random(0x2545_f491_4f6c_dd1d);
    let norm =
        |r: &mut Random, n: usize| -> Vec<f32> { (0..n).map(|_| 1.0 + 0.2 * r.signed()).collect() };
    b = b.f32_tensor("output_norm.weight", &norm(&mut r, e));
    for i in 0..blocks {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        b = b
            .f32_tensor(&n("attn_norm"), &norm(&mut r, e))
            .f32_tensor(&n("post_attention_norm"), &norm(&mut r, e));
        if attends(i) {
            b = b
                .f32_tensor(&n("attn_q_norm"), &norm(&mut r, t.head_dim))
                .f32_tensor(&n("attn_k_norm"), &norm(&mut r, t.head_dim));
        } else {
            // Taps of a few tenths; a decay rate −exp(A_log) and a bias that keep each head's
            // memory between a few and some tens of tokens; write strengths around one half.
            let taps: Vec<f32> = (0..channels * q.conv_kernel)
                .map(|_| 0.5 * r.signed())
                .collect();
            let a: Vec<f32> = (0..q.v_heads).map(|_| -r.between(0.05, 1.5)).collect();
            let dt: Vec<f32> = (0..q.v_heads).map(|_| r.between(-2.0, 0.5)).collect();
            b = b
                .f32_matrix(&n("ssm_conv1d"), q.conv_kernel, channels, &taps)
                .f32_tensor(&format!("blk.{i}.ssm_a"), &a)
                .f32_tensor(&format!("blk.{i}.ssm_dt.bias"), &dt)
                .f32_tensor(&n("ssm_norm"), &norm(&mut r, q.state));
        }
    }
    let last = t.layers;
    b.f32_tensor(&format!("blk.{last}.nextn.enorm.weight"), &norm(&mut r, e))
        .f32_tensor(&format!("blk.{last}.nextn.hnorm.weight"), &norm(&mut r, e))
        .build()
}

/// The tiny Gemma 4 of [`MODELS`] and its draft head ([`TINY_HEAD`]) written into `dir` as
/// `e2b.gguf` and `mtp-e2b.gguf`: a model of two files, for the tests that install, push or
/// serve one; their paths.
///
/// # Panics
/// When the files cannot be written.
pub fn write_gemma4_pair(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let target = MODELS
        .iter()
        .find(|t| t.gemma4.is_some())
        .expect("a tiny Gemma 4");
    let (model, head) = (dir.join("e2b.gguf"), dir.join("mtp-e2b.gguf"));
    std::fs::write(&model, gguf_bytes(target)).expect("write the model");
    std::fs::write(&head, gemma4_head_bytes(target, &TINY_HEAD)).expect("write the head");
    (model, head)
}

/// `model` (a GGUF file) with the tokenizer of `vocabulary` (another, such as llama.cpp's
/// `models/ggml-vocab-qwen2.gguf`): every `tokenizer.*` entry of the model replaced by the
/// vocabulary file's, copied whole. The model's vocabulary size must be the other's.
///
/// # Panics
/// When either file does not parse, or the vocabularies differ in size.
pub fn with_vocabulary_of(model: &[u8], vocabulary: &[u8]) -> Vec<u8> {
    use gguf::rewrite::{Edit, with_edits};
    let own = gguf::Header::parse(model).expect("the model parses");
    let theirs = gguf::Header::parse(vocabulary).expect("the vocabulary file parses");
    let size = |h: &gguf::Header| match h.get("tokenizer.ggml.tokens") {
        Some(gguf::Value::Array { len, .. }) => *len,
        _ => panic!("no tokenizer.ggml.tokens"),
    };
    assert_eq!(size(&own), size(&theirs), "the vocabularies differ in size");
    let tokenizer = |key: &str| key.starts_with("tokenizer.");
    let mut edits: Vec<Edit> = own
        .metadata
        .iter()
        .filter(|kv| tokenizer(&kv.key))
        .map(|kv| Edit::Remove(kv.key.clone()))
        .collect();
    edits.extend(
        theirs
            .metadata
            .iter()
            .filter(|kv| tokenizer(&kv.key))
            .map(|kv| Edit::Copy(kv.key.clone(), vocabulary[kv.span.clone()].to_vec())),
    );
    let mut out = with_edits(model, &own, &edits).expect("the header rewritten");
    out.extend_from_slice(&model[own.data_start..]);
    out
}
