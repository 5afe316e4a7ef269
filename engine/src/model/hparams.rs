//! Hyperparameters from GGUF metadata (`{arch}.…` keys), checked for consistency.

use gguf::{Header, Value};

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

    /// Reads and checks the hyperparameters.
    pub fn from_header(header: &Header) -> Result<Hparams, String> {
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
            other => {
                return Err(format!(
                    "architecture {other} is not supported (llama, qwen2, qwen3, qwen3moe, \
                     gemma3)"
                ));
            }
        };
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
        let vocab = header
            .tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or("token_embd.weight is missing")? as usize;
        let moe = arch == Arch::Qwen3Moe;
        let (n_ff, n_expert, n_expert_used) = if moe {
            (
                need("expert_feed_forward_length")?,
                need("expert_count")?,
                need("expert_used_count")?,
            )
        } else {
            (need("feed_forward_length")?, 0, 0)
        };
        let h = Hparams {
            arch,
            vocab,
            n_embd,
            n_layer: need("block_count")?,
            n_head,
            n_head_kv,
            head_dim,
            n_ff,
            n_expert,
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
        };
        let sane = h.n_embd > 0
            && h.n_head > 0
            && h.n_head_kv > 0
            && h.n_head % h.n_head_kv == 0
            && h.head_dim > 0
            && h.head_dim % 2 == 0
            && h.head_dim <= super::attention::MAX_HEAD_DIM
            && h.n_rot <= h.head_dim
            && h.n_rot % 2 == 0
            && h.n_layer > 0
            && h.n_layer <= 1024
            && h.n_ff > 0
            && (!moe || (h.n_expert_used > 0 && h.n_expert_used <= h.n_expert))
            && h.n_expert <= MAX_EXPERTS;
        if !sane {
            return Err(format!("inconsistent hyperparameters: {h:?}"));
        }
        Ok(h)
    }
}
