//! Hyperparameters from GGUF metadata (`{arch}.…` keys), checked for consistency.

use gguf::{Header, KeyValue, Value};

/// Most routed experts per layer (Qwen 3's MoE models have 128).
pub const MAX_EXPERTS: usize = 512;

/// Supported architectures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `llama` (SmolLM2, Llama 3.x): NORM rope, SiLU FFN.
    Llama,
    /// `gemma3`: embedding scale, pre/post norms, GELU-tanh, sliding-window layers.
    Gemma3,
    /// `qwen2`: NEOX rope, biases on the query/key/value projections.
    Qwen2,
    /// `qwen3`: NEOX rope, per-head query/key norms, head width from `key_length`.
    Qwen3,
    /// `qwen3moe`: Qwen 3's attention, and an FFN of routed experts (softmax gate, top-k,
    /// the chosen weights renormalised to sum to one).
    Qwen3Moe,
    /// `gemma4`: Gemma 3's block with per-layer shapes (head width by layer type, FFN width
    /// and key-value heads per layer), the last layers reading earlier layers' keys and values,
    /// per-layer token embeddings, an unweighted norm on values, attention scale 1 and a
    /// soft-capped output.
    Gemma4,
    /// `gemma4-assistant`: Gemma 4's multi-token-prediction draft head. Its layers have
    /// queries only and attend over the target's keys and values; it reads the target's
    /// embeddings and last hidden state, and gives logits and the next hidden state.
    Gemma4Assistant,
    /// `qwen35`: Qwen 3.5's hybrid of Gated DeltaNet layers (a recurrent state per sequence
    /// instead of keys and values) and gated attention layers (an output gate beside each
    /// query head, rope over part of the head), with a multi-token-prediction layer after
    /// the trunk.
    Qwen35,
    /// `qwen35moe`: Qwen 3.5's hybrid with routed experts (as `qwen3moe`) and a shared expert
    /// whose output is gated per token by a sigmoid.
    Qwen35Moe,
}

impl Arch {
    /// Gemma's block: embeddings scaled by √width, norms after attention and FFN, GELU.
    pub fn is_gemma(self) -> bool {
        matches!(self, Arch::Gemma3 | Arch::Gemma4 | Arch::Gemma4Assistant)
    }

    /// Gemma 4's attention: rope factors on full layers only, attention scale 1.
    pub fn is_gemma4(self) -> bool {
        matches!(self, Arch::Gemma4 | Arch::Gemma4Assistant)
    }

    /// Qwen 3.5's hybrid (dense or with experts): Gated DeltaNet and gated attention layers,
    /// the pre-FFN norm named `post_attention_norm`.
    pub fn is_qwen35(self) -> bool {
        matches!(self, Arch::Qwen35 | Arch::Qwen35Moe)
    }
}

/// One layer's shape and attention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// FFN width.
    pub n_ff: usize,
    /// Attends over a sliding window.
    pub swa: bool,
    /// The layer whose keys and values it attends over (itself, or an earlier layer of the
    /// same kind for Gemma 4's shared ones, which write none).
    pub kv_from: usize,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// RoPE base.
    pub rope_base: f32,
    /// A Gated DeltaNet layer (Qwen 3.5): a recurrent state, no keys and values.
    pub recurrent: bool,
}

/// The shape of Qwen 3.5's Gated DeltaNet layers (`{arch}.ssm.*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeltaShape {
    /// Taps of the causal depthwise convolution (`ssm.conv_kernel`).
    pub conv_kernel: usize,
    /// Width of a key head, and of a value head (`ssm.state_size`).
    pub head_width: usize,
    /// Key (and query) heads (`ssm.group_count`).
    pub k_heads: usize,
    /// Value heads, each with its own state (`ssm.time_step_rank`).
    pub v_heads: usize,
}

impl DeltaShape {
    /// Width of the queries, and of the keys.
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head_width
    }

    /// Width of the values (and of the layer's output before its projection).
    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head_width
    }

    /// Channels of the convolution: queries, keys and values side by side.
    pub fn channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// Floats of one layer's delta-rule state (a `head_width`² matrix per value head).
    pub fn state_floats(&self) -> usize {
        self.v_heads * self.head_width * self.head_width
    }

    /// Floats of one layer's convolution state (the last `conv_kernel − 1` input rows).
    pub fn conv_floats(&self) -> usize {
        (self.conv_kernel - 1) * self.channels()
    }
}

impl LayerShape {
    /// Width of its queries.
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Width of its keys (and of its values).
    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// Whether its numbers make a layer the kernels can run (bounded, so no product of them
    /// overflows).
    fn is_sane(&self) -> bool {
        self.n_head > 0
            && self.n_head <= 1024
            && self.n_head_kv > 0
            && self.n_head.is_multiple_of(self.n_head_kv)
            && self.head_dim > 0
            && self.head_dim.is_multiple_of(2)
            && self.head_dim <= super::attention::MAX_HEAD_DIM
            && self.n_rot <= self.head_dim
            && self.n_rot.is_multiple_of(2)
            && self.n_ff > 0
            && self.n_ff <= 1 << 20
    }
}

/// Vocabulary size: the rows of the token embedding matrix.
fn vocab_of(header: &Header) -> Result<usize, String> {
    header
        .tensors
        .iter()
        .find(|t| t.name == "token_embd.weight")
        .and_then(|t| t.dims.get(1).copied())
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| "token_embd.weight is missing".to_string())
}

/// What the forward pass needs to know about a model.
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    /// Architecture.
    pub arch: Arch,
    /// Vocabulary size (rows of the embedding matrix).
    pub vocab: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Layers.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// FFN width (of one expert, for a mixture of experts).
    pub n_ff: usize,
    /// Routed experts per layer (0: a dense FFN).
    pub n_expert: usize,
    /// FFN width of a shared expert beside the routed ones (Qwen 3.5 MoE; 0: none).
    pub n_ff_shared: usize,
    /// Experts each token is routed to.
    pub n_expert_used: usize,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// RoPE base (global layers).
    pub rope_base: f32,
    /// RoPE base of sliding-window layers.
    pub rope_base_swa: f32,
    /// Rotated dimensions per head.
    pub n_rot: usize,
    /// Sliding window (Gemma 3), if any.
    pub sliding_window: Option<usize>,
    /// Scale applied to queries.
    pub attn_scale: f32,
    /// Context the model was trained for.
    pub train_context: usize,
    /// Each layer's shape (the scalar fields above are the widest, for buffers).
    pub layers: Vec<LayerShape>,
    /// Width of each layer's slice of the per-layer token embeddings (Gemma 4; 0: none).
    pub n_embd_per_layer: usize,
    /// Logits become `cap · tanh(logit / cap)` (Gemma 4; 0: not capped).
    pub logit_softcap: f32,
    /// A draft head's target width: the hidden state it takes and gives (0: not a head).
    pub n_embd_out: usize,
    /// Qwen 3.5's Gated DeltaNet shape (None: every layer attends).
    pub delta: Option<DeltaShape>,
    /// Multi-token-prediction layers stored after the trunk's `n_layer` (Qwen 3.5's nextn
    /// layer), which the trunk does not run.
    pub n_nextn: usize,
}

fn get_u(header: &Header, key: &str) -> Result<Option<usize>, String> {
    match header.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| format!("{key} must be a non-negative integer, not {v:?}")),
    }
}

fn get_f(header: &Header, key: &str) -> Result<Option<f32>, String> {
    match header.get(key) {
        None => Ok(None),
        Some(Value::F32(f)) => Ok(Some(*f)),
        Some(Value::F64(f)) => Ok(Some(*f as f32)),
        Some(v) => Err(format!("{key} must be a float, not {v:?}")),
    }
}

impl Hparams {
    /// Refuses a context the model cannot hold (positions past the training context are not
    /// supported).
    pub fn check_context(&self, context: usize) -> Result<(), String> {
        if context == 0 || context > self.train_context {
            return Err(format!(
                "a context of {context} tokens is not possible: the model was trained for 1 to {}",
                self.train_context
            ));
        }
        Ok(())
    }

    /// Keys and values of one position, in bytes (f16 each), over the layers that keep them.
    pub fn kv_bytes_per_position(&self) -> usize {
        self.layers
            .iter()
            .enumerate()
            .filter(|(il, l)| l.kv_from == *il && !l.recurrent)
            .map(|(_, l)| 2 * 2 * l.kv_dim())
            .sum()
    }

    /// Bytes of a rollback mark's record of `tokens` tokens: each recurrent layer's inputs.
    pub fn rollback_record_bytes(&self, tokens: usize) -> usize {
        self.delta.map_or(0, |d| {
            let layers = self.layers.iter().filter(|l| l.recurrent).count();
            layers * tokens * 4 * (2 * d.channels() + 2 * d.v_heads)
        })
    }

    /// Bytes of one sequence's recurrent state (f32), the same at any length (0 for a model
    /// of attention layers only).
    pub fn recurrent_bytes(&self) -> usize {
        self.delta.map_or(0, |d| {
            let layers = self.layers.iter().filter(|l| l.recurrent).count();
            layers * 4 * (d.state_floats() + d.conv_floats())
        })
    }

    /// Every layer the same shape (every architecture before Gemma 4), with Gemma 3's sliding
    /// window on five layers of every six.
    pub fn uniform_layers(&self) -> Vec<LayerShape> {
        (0..self.n_layer)
            .map(|il| {
                let swa = self.sliding_window.is_some() && il % 6 < 5;
                LayerShape {
                    n_head: self.n_head,
                    n_head_kv: self.n_head_kv,
                    head_dim: self.head_dim,
                    n_ff: self.n_ff,
                    swa,
                    kv_from: il,
                    n_rot: self.n_rot,
                    rope_base: if swa {
                        self.rope_base_swa
                    } else {
                        self.rope_base
                    },
                    recurrent: false,
                }
            })
            .collect()
    }

    /// Reads and checks the hyperparameters; `file` is what the header was parsed from (arrays
    /// are read from it).
    pub fn from_header(header: &Header, file: &[u8]) -> Result<Hparams, String> {
        let arch_name = match header.get("general.architecture") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err("general.architecture is missing".into()),
        };
        let arch = match arch_name.as_str() {
            "llama" => Arch::Llama,
            "gemma3" => Arch::Gemma3,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            "gemma4" => Arch::Gemma4,
            "gemma4-assistant" => Arch::Gemma4Assistant,
            "qwen35" => Arch::Qwen35,
            "qwen35moe" => Arch::Qwen35Moe,
            other => {
                return Err(format!(
                    "architecture {other} is not supported (llama, qwen2, qwen3, qwen3moe, \
                     qwen35, qwen35moe, gemma3, gemma4, gemma4-assistant)"
                ));
            }
        };
        if arch.is_gemma4() {
            return gemma4(arch, header, file);
        }
        let key = |k: &str| format!("{arch_name}.{k}");
        let need =
            |k: &str| get_u(header, &key(k))?.ok_or_else(|| format!("{} is missing", key(k)));
        let n_embd = need("embedding_length")?;
        let n_head = need("attention.head_count")?;
        let n_head_kv = get_u(header, &key("attention.head_count_kv"))?.unwrap_or(n_head);
        let head_dim = match get_u(header, &key("attention.key_length"))? {
            Some(d) => d,
            None if n_head > 0 => n_embd / n_head,
            None => 0,
        };
        let vocab = vocab_of(header)?;
        let moe = matches!(arch, Arch::Qwen3Moe | Arch::Qwen35Moe);
        let (n_ff, n_expert, n_expert_used) = if moe {
            (
                need("expert_feed_forward_length")?,
                need("expert_count")?,
                need("expert_used_count")?,
            )
        } else {
            (need("feed_forward_length")?, 0, 0)
        };
        let mut h = Hparams {
            arch,
            vocab,
            n_embd,
            n_layer: need("block_count")?
                .saturating_sub(get_u(header, &key("nextn_predict_layers"))?.unwrap_or(0)),
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_expert,
            n_ff_shared: if arch == Arch::Qwen35Moe {
                match get_u(header, &key("expert_shared_feed_forward_length"))? {
                    Some(width) => width,
                    None => need("feed_forward_length")?,
                }
            } else {
                0
            },
            n_expert_used,
            rms_eps: get_f(header, &key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
            rope_base: get_f(header, &key("rope.freq_base"))?.unwrap_or(10_000.0),
            rope_base_swa: 10_000.0,
            n_rot: get_u(header, &key("rope.dimension_count"))?.unwrap_or(head_dim),
            sliding_window: if arch == Arch::Gemma3 {
                get_u(header, &key("attention.sliding_window"))?
            } else {
                None
            },
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            train_context: get_u(header, &key("context_length"))?.unwrap_or(2048),
            layers: Vec::new(),
            n_embd_per_layer: 0,
            logit_softcap: 0.0,
            n_embd_out: 0,
            delta: None,
            n_nextn: 0,
        };
        h.layers = h.uniform_layers();
        if arch.is_qwen35() {
            qwen35(&mut h, &arch_name, header, file)?;
        }
        let sane = h.n_embd > 0
            && h.layers.iter().all(LayerShape::is_sane)
            && h.n_layer > 0
            && h.n_layer <= 1024
            && (!moe || (h.n_expert_used > 0 && h.n_expert_used <= h.n_expert))
            && h.n_ff_shared <= 1 << 20
            && h.n_expert <= MAX_EXPERTS;
        if !sane {
            return Err(format!("inconsistent hyperparameters: {h:?}"));
        }
        Ok(h)
    }
}

/// A per-layer count: an array of one value per layer, or one value for all of them.
fn per_layer(
    header: &Header,
    file: &[u8],
    key: &str,
    n_layer: usize,
) -> Result<Option<Vec<usize>>, String> {
    let Some(entry) = header.entry(key) else {
        return Ok(None);
    };
    let values = match &entry.value {
        Value::Array { .. } => array_counts(file, entry)?,
        one => {
            vec![
                one.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| format!("{key} must be a non-negative integer, not {one:?}"))?;
                n_layer
            ]
        }
    };
    if values.len() != n_layer {
        return Err(format!(
            "{key} holds {} values for {n_layer} layers",
            values.len()
        ));
    }
    Ok(Some(values))
}

fn array_counts(file: &[u8], entry: &KeyValue) -> Result<Vec<usize>, String> {
    gguf::arrays::counts(file, entry)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|n| usize::try_from(n).map_err(|_| format!("{}: {n} is too large", entry.key)))
        .collect()
}

/// Gemma 4's hyperparameters, as llama.cpp 11434 reads them (`src/models/gemma4.cpp`,
/// `src/llama-model.cpp`): per-layer arrays, the layer types from a bool array, head widths
/// by layer type, and the shared key-value layers' sources. Its draft head
/// (`gemma4-assistant.cpp`) has the same keys, its target's width, and no per-layer inputs,
/// shared layers or soft cap; which target layers it reads is set when it is paired.
fn gemma4(arch: Arch, header: &Header, file: &[u8]) -> Result<Hparams, String> {
    let head = arch == Arch::Gemma4Assistant;
    let prefix = if head { "gemma4-assistant" } else { "gemma4" };
    let key = |k: &str| format!("{prefix}.{k}");
    let need = |k: &str| get_u(header, &key(k))?.ok_or_else(|| format!("{} is missing", key(k)));
    if get_u(header, &key("expert_count"))?.unwrap_or(0) > 0 {
        return Err(
            "Gemma 4 with routed experts (26B-A4B) is not supported; E2B and E4B are".into(),
        );
    }
    let n_embd = need("embedding_length")?;
    let n_layer = need("block_count")?;
    if n_layer == 0 || n_layer > 1024 {
        return Err(format!(
            "{} of {n_layer} is out of range",
            key("block_count")
        ));
    }
    let layers_of = |k: &str| per_layer(header, file, &key(k), n_layer);
    let n_ff = layers_of("feed_forward_length")?
        .ok_or_else(|| format!("{} is missing", key("feed_forward_length")))?;
    let n_head = layers_of("attention.head_count")?
        .ok_or_else(|| format!("{} is missing", key("attention.head_count")))?;
    let n_head_kv = layers_of("attention.head_count_kv")?.unwrap_or_else(|| n_head.clone());
    let pattern_key = key("attention.sliding_window_pattern");
    let swa = match header.entry(&pattern_key) {
        Some(entry) => gguf::arrays::bools(file, entry).map_err(|e| e.to_string())?,
        None => return Err(format!("{pattern_key} is missing (one bool per layer)")),
    };
    if swa.len() != n_layer {
        return Err(format!(
            "{pattern_key} holds {} values for {n_layer} layers",
            swa.len()
        ));
    }
    let equal = |k: &str, v: &str| -> Result<Option<usize>, String> {
        let (k_len, v_len) = (get_u(header, &key(k))?, get_u(header, &key(v))?);
        match (k_len, v_len) {
            (Some(a), Some(b)) if a != b => Err(format!(
                "{} ({a}) and {} ({b}) differ; Gemma 4 needs them equal",
                key(k),
                key(v)
            )),
            (a, b) => Ok(a.or(b)),
        }
    };
    let head_full = equal("attention.key_length", "attention.value_length")?
        .unwrap_or_else(|| n_embd / n_head[0].max(1));
    let head_swa = equal("attention.key_length_swa", "attention.value_length_swa")?
        .ok_or_else(|| format!("{} is missing", key("attention.key_length_swa")))?;
    let n_rot_full = get_u(header, &key("rope.dimension_count"))?.unwrap_or(head_full);
    let n_rot_swa = get_u(header, &key("rope.dimension_count_swa"))?.unwrap_or(n_rot_full);
    let rope_base = get_f(header, &key("rope.freq_base"))?.unwrap_or(10_000.0);
    let rope_base_swa = get_f(header, &key("rope.freq_base_swa"))?.unwrap_or(10_000.0);
    // A head reads its target's keys and values and keeps none: nothing of its own is shared.
    let shared = if head {
        0
    } else {
        get_u(header, &key("attention.shared_kv_layers"))?.unwrap_or(0)
    };
    let kv_start = n_layer
        .checked_sub(shared)
        .filter(|&start| shared == 0 || start >= 2)
        .ok_or_else(|| {
            format!(
                "{} ({shared}) leaves fewer than 2 of {n_layer} layers their own keys and values",
                key("attention.shared_kv_layers")
            )
        })?;
    let mut layers = Vec::with_capacity(n_layer);
    for il in 0..n_layer {
        let kv_from = if il < kv_start {
            il
        } else {
            kv_start - if swa[il] { 2 } else { 1 }
        };
        layers.push(LayerShape {
            n_head: n_head[il],
            n_head_kv: n_head_kv[il],
            head_dim: if swa[il] { head_swa } else { head_full },
            n_ff: n_ff[il],
            swa: swa[il],
            kv_from,
            n_rot: if swa[il] { n_rot_swa } else { n_rot_full },
            rope_base: if swa[il] { rope_base_swa } else { rope_base },
            recurrent: false,
        });
    }
    for (il, l) in layers.iter().enumerate() {
        let source = layers[l.kv_from];
        if !l.is_sane() {
            return Err(format!(
                "layer {il} has inconsistent hyperparameters: {l:?}"
            ));
        }
        if source.swa != l.swa || source.kv_dim() != l.kv_dim() || source.head_dim != l.head_dim {
            return Err(format!(
                "layer {il} would read layer {}'s keys and values, which are of another kind or shape",
                l.kv_from
            ));
        }
    }
    let max = |f: fn(&LayerShape) -> usize| layers.iter().map(f).max().unwrap_or(0);
    let vocab = vocab_of(header)?;
    let h = Hparams {
        arch,
        vocab,
        n_embd,
        n_layer,
        n_head: max(|l| l.n_head),
        n_head_kv: max(|l| l.n_head_kv),
        head_dim: max(|l| l.head_dim),
        n_ff: max(|l| l.n_ff),
        n_expert: 0,
        n_ff_shared: 0,
        n_expert_used: 0,
        rms_eps: get_f(header, &key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| format!("{} is missing", key("attention.layer_norm_rms_epsilon")))?,
        rope_base,
        rope_base_swa,
        n_rot: n_rot_full,
        sliding_window: Some(
            get_u(header, &key("attention.sliding_window"))?
                .ok_or_else(|| format!("{} is missing", key("attention.sliding_window")))?,
        ),
        attn_scale: 1.0,
        train_context: get_u(header, &key("context_length"))?.unwrap_or(2048),
        layers,
        n_embd_per_layer: if head {
            0
        } else {
            get_u(header, &key("embedding_length_per_layer_input"))?
                .ok_or_else(|| format!("{} is missing", key("embedding_length_per_layer_input")))?
        },
        // llama.cpp caps the target's logits only; a head's draft is its argmax either way.
        logit_softcap: if head {
            0.0
        } else {
            get_f(header, &key("final_logit_softcapping"))?.unwrap_or(0.0)
        },
        n_embd_out: if head {
            get_u(header, &key("embedding_length_out"))?.ok_or_else(|| {
                format!(
                    "{} is missing (the target model's width)",
                    key("embedding_length_out")
                )
            })?
        } else {
            0
        },
        delta: None,
        n_nextn: 0,
    };
    if h.n_embd == 0
        || h.n_embd > 1 << 16
        || h.n_embd_out > 1 << 16
        || (head && (h.n_embd_out == 0 || h.n_embd_out == h.n_embd))
        || h.n_embd_per_layer > 1 << 16
        || !(h.logit_softcap >= 0.0 && h.logit_softcap.is_finite())
    {
        return Err(format!("inconsistent hyperparameters: {h:?}"));
    }
    Ok(h)
}

/// Qwen 3.5's additions to the common keys, as llama.cpp 11434 reads them
/// (`src/models/qwen35.cpp`): the Gated DeltaNet shape, which trunk layers are recurrent (the
/// `attention.recurrent_layers` bools, else every `full_attention_interval`-th layer attends),
/// the rope sections (required; with text positions all equal they rotate as NEOX does) and
/// the nextn layers after the trunk.
fn qwen35(h: &mut Hparams, arch: &str, header: &Header, file: &[u8]) -> Result<(), String> {
    let key = |k: &str| format!("{arch}.{k}");
    let need = |k: &str| get_u(header, &key(k))?.ok_or_else(|| format!("{} is missing", key(k)));
    let all = need("block_count")?;
    h.n_nextn = all - h.n_layer;
    let delta = DeltaShape {
        conv_kernel: need("ssm.conv_kernel")?,
        head_width: need("ssm.state_size")?,
        k_heads: need("ssm.group_count")?,
        v_heads: need("ssm.time_step_rank")?,
    };
    let inner = need("ssm.inner_size")?;
    let sane = (2..=16).contains(&delta.conv_kernel)
        && delta.head_width > 0
        && delta.head_width <= 512
        && delta.k_heads > 0
        && delta.v_heads <= 1024
        && delta.v_heads.is_multiple_of(delta.k_heads)
        && inner == delta.value_dim();
    if !sane {
        return Err(format!(
            "inconsistent Gated DeltaNet shape: {delta:?} with ssm.inner_size {inner} (the \
             value heads must be a multiple of the key heads and inner_size their width)"
        ));
    }
    let sections_key = key("rope.dimension_sections");
    match header.entry(&sections_key) {
        Some(entry) if array_counts(file, entry)?.len() == 4 => {}
        Some(_) => return Err(format!("{sections_key} must hold 4 values")),
        None => return Err(format!("{sections_key} is missing")),
    }
    let recurrent = match header.entry(&key("attention.recurrent_layers")) {
        Some(entry) => {
            let flags = gguf::arrays::bools(file, entry).map_err(|e| e.to_string())?;
            if flags.len() != all {
                return Err(format!(
                    "{} holds {} values for {all} layers",
                    key("attention.recurrent_layers"),
                    flags.len()
                ));
            }
            flags
        }
        None => {
            let interval = get_u(header, &key("full_attention_interval"))?.unwrap_or(4);
            if interval == 0 {
                return Err(format!(
                    "{} must be at least 1",
                    key("full_attention_interval")
                ));
            }
            (0..all).map(|il| (il + 1) % interval != 0).collect()
        }
    };
    for (layer, recurrent) in h.layers.iter_mut().zip(recurrent) {
        layer.recurrent = recurrent;
    }
    // One nextn layer (all llama.cpp runs) is an attention block after the trunk with keys and
    // values of its own, whatever the recurrent pattern says of its index: its shape goes
    // last, past `n_layer`.
    if h.n_nextn == 1
        && let Some(&last) = h.layers.last()
    {
        h.layers.push(LayerShape {
            recurrent: false,
            kv_from: h.n_layer,
            ..last
        });
    }
    h.delta = Some(delta);
    Ok(())
}
