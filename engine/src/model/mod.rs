//! Transformer forward passes over a [`ModelFile`]: the hyperparameters from GGUF metadata, the
//! per-layer weights as zero-copy views (plus the widened Q5_0 copies batches read), an f16 KV
//! cache sized to the configured context, and one token step that returns the logits. Matrix products go through [`crate::kernels`], whose
//! rows do not depend on the thread count, so neither does the output.

mod attention;
mod delta;
mod head;
mod hparams;
mod layers;
mod moe;
mod nextn;

pub use head::{Draft, DraftHead, DraftWork};
pub use hparams::{Arch, DeltaShape, Hparams, LayerShape};

use crate::kernels::{self, Exec, Isa, Matrix};
use crate::model_file::{LoadError, ModelFile, Tensor};
use crate::pool::{Pool, Schedule};
use crate::quant;

struct Layer<'a> {
    attn_norm: Vec<f32>,
    /// What mixes the tokens: attention, or a recurrence (Qwen 3.5's Gated DeltaNet).
    mixer: Mixer<'a>,
    /// Gemma 3 normalises the attention and FFN outputs too.
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    post_ffn_norm: Option<Vec<f32>>,
    ffn: Ffn<'a>,
    /// Gemma 4: the per-layer token embedding's input to this layer.
    ple: Option<LayerPle<'a>>,
    /// Gemma 4: the layer's output is scaled by this.
    out_scale: Option<f32>,
}

/// A layer's token mixer.
enum Mixer<'a> {
    Attention(Attention<'a>),
    DeltaNet(delta::DeltaNet<'a>),
}

/// An attention layer's weights.
struct Attention<'a> {
    wq: Matrix<'a>,
    /// Keys: none on a Gemma 4 layer that reads an earlier layer's.
    wk: Option<Matrix<'a>>,
    /// Values: none where the keys serve as values too (Gemma 4) or the layer has no keys.
    wv: Option<Matrix<'a>>,
    wo: Matrix<'a>,
    /// Qwen 2 adds biases to the query, key and value projections.
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    /// Gemma 3 and Qwen 3 normalise each query and key head.
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    /// Gemma 4: values normalised per head without a weight.
    v_norm: bool,
    /// Qwen 3.5: each query head is followed by an output gate of the same width in `wq`'s
    /// rows; the attention's output is multiplied by its sigmoid.
    gated: bool,
}

impl Attention<'_> {
    fn matrices(&self) -> impl Iterator<Item = &Matrix<'_>> {
        [
            Some(&self.wq),
            self.wk.as_ref(),
            self.wv.as_ref(),
            Some(&self.wo),
        ]
        .into_iter()
        .flatten()
    }
}

impl Mixer<'_> {
    fn matrices(&self) -> Vec<&Matrix<'_>> {
        match self {
            Mixer::Attention(a) => a.matrices().collect(),
            Mixer::DeltaNet(d) => vec![&d.qkv, &d.gate, &d.beta, &d.alpha, &d.out],
        }
    }
}

/// A Gemma 4 layer's use of its slice of the per-layer inputs:
/// `x += rms_norm(proj · (gelu(inp_gate · x) ⊙ input); post_norm)`.
struct LayerPle<'a> {
    inp_gate: Matrix<'a>,
    proj: Matrix<'a>,
    post_norm: Vec<f32>,
}

/// Gemma 4's per-layer token embeddings: one row per token, read through the map (the table
/// is most of the file and is never made resident), and the projection of the embedding
/// that joins it.
struct Ple<'a> {
    table: Tensor<'a>,
    model_proj: Matrix<'a>,
    proj_norm: Vec<f32>,
}

/// A layer's feed-forward part.
enum Ffn<'a> {
    /// One gated FFN for every token.
    Dense {
        gate: Matrix<'a>,
        up: Matrix<'a>,
        down: Matrix<'a>,
    },
    /// Routed experts (Qwen 3 MoE).
    Experts(moe::Experts<'a>),
}

/// A model ready to run, borrowing its weights from the mapped file.
pub struct Model<'a> {
    /// Hyperparameters.
    pub hparams: Hparams,
    embeddings: Tensor<'a>,
    output: Matrix<'a>,
    output_norm: Vec<f32>,
    /// Llama 3's rope frequency divisors (Gemma 4's, on its full-attention layers).
    rope_freqs: Option<Vec<f32>>,
    layers: Vec<Layer<'a>>,
    ple: Option<Ple<'a>>,
    /// Qwen 3.5's multi-token-prediction layer, where the file holds it.
    nextn: Option<nextn::Nextn<'a>>,
}

/// Keys and values (f16, as llama.cpp keeps them) of every position seen so far, per layer,
/// and the working buffers of one sequence so the token loop does not allocate.
///
/// A hybrid model's recurrent layers (Qwen 3.5) keep a state instead, which cannot be cut back
/// to an earlier position: the cache keeps [`KvCache::checkpoint`]s of it, and the first pass
/// after a checkpoint records its tokens' recurrence inputs, so [`KvCache::resume`] can go back
/// to any position from the checkpoint to the end of that pass by re-running only the
/// recurrence (a rejected draft costs no model pass).
#[derive(Clone)]
pub struct KvCache {
    context: usize,
    exec: Exec,
    keys: Vec<Vec<u16>>,
    values: Vec<Vec<u16>>,
    /// The recurrent layers' shape (None: attention layers only).
    delta: Option<DeltaShape>,
    /// Each recurrent layer's state (empty for attention layers).
    recurrent: Vec<delta::Recurrent>,
    /// Positions the cache holds: the next pass starts here (or, without recurrent layers,
    /// anywhere before).
    held: usize,
    /// Recurrent states kept to resume from, oldest first.
    checkpoints: Vec<delta::Checkpoint>,
    /// The recurrence inputs of the pass that followed the newest checkpoint.
    journal: delta::Journal,
    /// The nextn layer's mirror of the passes (Qwen 3.5's draft source; off unless drafting).
    mirror: nextn::Mirror,
    work: Work,
}

/// Intermediate vectors of a pass over up to [`MAX_BATCH`] tokens (one row per token), grown
/// to the widest pass seen and then reused, so the token loop does not allocate.
#[derive(Clone)]
struct Work {
    scratch: kernels::Scratch,
    x: Vec<f32>,
    cur: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    /// The attention's outputs as the threads fill them: by key-value head, then token.
    attn_by_head: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    logits: Vec<f32>,
    /// The final-normed hidden state of each token whose logits are in `logits`, in the same
    /// order (the input of the output matrix; a draft head drafts from it).
    hidden: Vec<f32>,
    /// Gemma 4's per-layer inputs of the pass's tokens (token × layer × width).
    ple: Vec<f32>,
    /// Every row's final-normed state, for the nextn layer's mirror.
    normed: Vec<f32>,
    /// A Gated DeltaNet layer's convolution window (kept rows, then the pass's inputs), its
    /// output (queries, keys, values), output gate, write strengths, decays, and outputs by
    /// value head.
    mixed: Vec<f32>,
    conv_out: Vec<f32>,
    z: Vec<f32>,
    beta: Vec<f32>,
    decay: Vec<f32>,
    by_head: Vec<f32>,
    /// Qwen 3.5's attention output gates (token × query width).
    out_gate: Vec<f32>,
    /// Router logits, then probabilities, of a mixture of experts (token × expert).
    route: Vec<f32>,
    /// The experts each token is routed to and their weights (token × slot).
    chosen: Vec<(u32, f32)>,
    /// One expert's tokens gathered, its down projection, and every (token, slot)'s output.
    moe_in: Vec<f32>,
    /// One token's chosen experts' gate and up outputs, side by side.
    moe_gate: Vec<f32>,
    moe_up: Vec<f32>,
    moe_down: Vec<f32>,
    moe_out: Vec<f32>,
}

impl Work {
    fn new() -> Work {
        Work {
            scratch: kernels::Scratch::default(),
            x: Vec::new(),
            cur: Vec::new(),
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            attn: Vec::new(),
            attn_by_head: Vec::new(),
            proj: Vec::new(),
            gate: Vec::new(),
            up: Vec::new(),
            logits: Vec::new(),
            hidden: Vec::new(),
            ple: Vec::new(),
            normed: Vec::new(),
            mixed: Vec::new(),
            conv_out: Vec::new(),
            z: Vec::new(),
            beta: Vec::new(),
            decay: Vec::new(),
            by_head: Vec::new(),
            out_gate: Vec::new(),
            route: Vec::new(),
            chosen: Vec::new(),
            moe_in: Vec::new(),
            moe_gate: Vec::new(),
            moe_up: Vec::new(),
            moe_down: Vec::new(),
            moe_out: Vec::new(),
        }
    }

    /// Sizes the pass-wide buffers for a pass of `n` tokens.
    fn shape(&mut self, h: &Hparams, n: usize) {
        for (buffer, width) in [
            (&mut self.x, h.n_embd),
            (&mut self.cur, h.n_embd),
            (&mut self.proj, h.n_embd),
        ] {
            buffer.resize(n * width, 0.0);
        }
    }

    /// Sizes the per-layer buffers for layer `l` over `n` tokens (the products take them at
    /// their exact size; capacity stays from the widest layer, so nothing is allocated again).
    fn shape_layer(&mut self, l: &LayerShape, n: usize) {
        for (buffer, width) in [
            (&mut self.q, l.q_dim()),
            (&mut self.k, l.kv_dim()),
            (&mut self.v, l.kv_dim()),
            (&mut self.attn, l.q_dim()),
            (&mut self.attn_by_head, l.q_dim()),
            (&mut self.gate, l.n_ff),
            (&mut self.up, l.n_ff),
        ] {
            buffer.resize(n * width, 0.0);
        }
    }
}

/// Which logits a pass computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits {
    /// None: the pass only fills the cache (a prefix nobody samples from).
    None,
    /// Only the last token's (prefill, generation).
    Last,
    /// Every token's, one row of `vocab` each (scoring, checking drafted tokens).
    All,
}

/// Tokens per pass: a batch's activations stay in the caches while each weight chunk is read
/// once for all of them. Longer inputs run as several passes.
pub const MAX_BATCH: usize = 64;

/// Logits a thread's share of the soft cap is a multiple of (whole cache lines).
const SOFTCAP_ALIGN: usize = 1024;

/// Tokens after a rollback mark whose recurrence inputs are recorded (a draft's verify pass
/// is far fewer; a prompt's pass is not worth keeping).
pub const ROLLBACK_TOKENS: usize = 16;

/// Recurrent-state checkpoints a cache keeps (each is a whole state: about 50 MiB for Qwen 3.5
/// 4B).
pub const MAX_CHECKPOINTS: usize = 3;

impl KvCache {
    /// A cache for `context` positions (the configured context, not the model's maximum, which
    /// also bounds it: positions past the training context are not supported), running its
    /// passes on as many threads as the machine has cores.
    pub fn new(hparams: &Hparams, context: usize) -> Result<KvCache, String> {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        KvCache::on_threads(hparams, context, cores)
    }

    /// [`KvCache::new`] running its passes on `threads` threads.
    pub fn on_threads(
        hparams: &Hparams,
        context: usize,
        threads: usize,
    ) -> Result<KvCache, String> {
        hparams.check_context(context)?;
        // Only the layers that keep keys and values get room (Gemma 4 shares the last ones';
        // Qwen 3.5's recurrent layers keep a state instead).
        let rows = |(il, l): (usize, &LayerShape)| -> Vec<u16> {
            if l.kv_from == il && !l.recurrent {
                vec![0; context * l.kv_dim()]
            } else {
                Vec::new()
            }
        };
        let recurrent = hparams
            .layers
            .iter()
            .map(|l| match hparams.delta {
                Some(d) if l.recurrent => delta::Recurrent::new(&d),
                _ => delta::Recurrent::default(),
            })
            .collect();
        Ok(KvCache {
            context,
            exec: Exec::new(threads),
            keys: hparams.layers.iter().enumerate().map(rows).collect(),
            values: hparams.layers.iter().enumerate().map(rows).collect(),
            delta: hparams.delta,
            recurrent,
            held: 0,
            checkpoints: Vec::new(),
            journal: delta::Journal::default(),
            mirror: nextn::Mirror::default(),
            work: Work::new(),
        })
    }

    /// Mirrors every pass from here on into the model's nextn layer (Qwen 3.5's built-in draft
    /// source, [`DraftHead::nextn`]), whose keys and values must cover every position a draft
    /// attends to. A model without that layer ignores it.
    pub fn mirror_draft_layer(&mut self) {
        self.mirror.on = true;
    }

    /// Whether some layer keeps a recurrent state (which positions cannot simply be cut from).
    pub fn is_recurrent(&self) -> bool {
        self.delta.is_some()
    }

    /// Positions it holds.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Keeps the recurrent state at [`KvCache::held`] to resume from later, beside the
    /// others (nothing to keep for a model of attention layers only); at most
    /// [`MAX_CHECKPOINTS`], the oldest goes first. A prompt's end is one: a follow-up
    /// request resumes there.
    pub fn checkpoint(&mut self) {
        if !self.is_recurrent() || self.checkpoints.last().is_some_and(|c| c.at == self.held) {
            return;
        }
        if self.checkpoints.len() >= MAX_CHECKPOINTS {
            self.checkpoints.remove(0);
        }
        self.checkpoints
            .push(delta::Checkpoint::of(self.held, &self.recurrent));
    }

    /// Marks a rollback point at [`KvCache::held`] (before a pass that checks drafts): the
    /// passes that follow, up to a few tokens, record their recurrence inputs, so
    /// [`KvCache::resume`] can go back to any position among them without a model pass. It
    /// replaces the previous mark.
    pub fn mark(&mut self) {
        if self.is_recurrent() {
            self.journal.start(self.held, &self.recurrent);
        }
    }

    /// Goes back to the latest position at or before `wanted` that it can hold exactly, and
    /// returns it: `wanted` itself (or what it holds, if less) for a model of attention
    /// layers only; for a recurrent one, where it is, a position the mark's record reaches,
    /// a checkpoint, or else 0 (a fresh state). The tokens from there to `wanted` must run
    /// again.
    pub fn resume(&mut self, wanted: usize) -> usize {
        let wanted = wanted.min(self.held);
        if !self.is_recurrent() || wanted == self.held {
            self.held = wanted;
            return wanted;
        }
        self.checkpoints.retain(|c| c.at <= wanted);
        let kept = self.checkpoints.last().map_or(0, |c| c.at);
        let reached = match self.journal.reaches(wanted) {
            Some(reached) if reached >= kept => {
                let isa = self.exec.isa;
                self.journal
                    .replay(reached, self.delta, &mut self.recurrent, isa);
                reached
            }
            _ => {
                match self.checkpoints.last() {
                    Some(c) => c.restore(&mut self.recurrent),
                    None => self.recurrent.iter_mut().for_each(delta::Recurrent::clear),
                }
                kept
            }
        };
        self.journal.stop();
        self.held = reached;
        reached
    }

    /// A copy holding this cache's first `positions` positions, or fewer where a recurrent
    /// state cannot be cut there (see [`KvCache::resume`]; [`KvCache::held`] tells), the rest
    /// zero as in a fresh cache. A conversation branching off a kept one needs only the
    /// shared prefix; cloning the whole context wrote (and first faulted in) every page of
    /// it, about 94 MB per request for SmolLM2 at a 4096 context, before the first token.
    pub fn copy_prefix(&self, positions: usize) -> KvCache {
        let mut recurrent = KvCache {
            context: self.context,
            exec: self.exec.clone(),
            keys: Vec::new(),
            values: Vec::new(),
            delta: self.delta,
            recurrent: self.recurrent.clone(),
            held: self.held,
            checkpoints: self.checkpoints.clone(),
            journal: self.journal.clone(),
            mirror: self.mirror.clone(),
            work: Work::new(),
        };
        let kept = recurrent.resume(positions.min(self.context));
        let copy = |layers: &[Vec<u16>]| -> Vec<Vec<u16>> {
            layers
                .iter()
                .map(|layer| {
                    let used = layer.len() / self.context.max(1) * kept;
                    // Zeroed allocations come from the system as untouched pages: only the
                    // positions written later cost memory.
                    let mut fresh = vec![0; layer.len()];
                    fresh[..used].copy_from_slice(&layer[..used]);
                    fresh
                })
                .collect()
        };
        KvCache {
            keys: copy(&self.keys),
            values: copy(&self.values),
            work: self.work.clone(),
            ..recurrent
        }
    }

    /// The logits of the last pass ([`Model::step`] or [`Model::forward`]).
    pub fn logits(&self) -> &[f32] {
        &self.work.logits
    }

    /// The final-normed hidden state behind row `row` of [`KvCache::logits`] (`width`: the
    /// model's embedding width).
    pub fn hidden(&self, row: usize, width: usize) -> Option<&[f32]> {
        self.work.hidden.get(row * width..(row + 1) * width)
    }

    /// Bytes its keys and values, recurrent states and checkpoints take.
    pub fn bytes(&self) -> usize {
        let kv: usize = self
            .keys
            .iter()
            .chain(&self.values)
            .map(|v| v.len() * 2)
            .sum();
        let states: usize = self.recurrent.iter().map(delta::Recurrent::bytes).sum();
        let kept: usize = self.checkpoints.iter().map(delta::Checkpoint::bytes).sum();
        kv + states + kept + self.journal.bytes()
    }

    /// Positions it can hold.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Runs the kernels on `isa` instead of the best one detected (tests compare them).
    pub fn with_isa(mut self, isa: Isa) -> KvCache {
        self.exec.isa = isa;
        self
    }

    /// Runs on `threads` threads instead.
    pub fn with_threads(mut self, threads: usize) -> KvCache {
        self.exec.pool = Pool::shared(threads);
        self
    }
}

fn load_err(file: &ModelFile, message: String) -> LoadError {
    LoadError {
        path: file.path().to_path_buf(),
        message,
    }
}

fn vector(file: &ModelFile, name: &str, len: usize) -> Result<Vec<f32>, LoadError> {
    let t = file.tensor(name)?;
    if t.info.dims.iter().product::<u64>() != len as u64 {
        return Err(load_err(
            file,
            format!("{name} has shape {:?}, expected {len} values", t.info.dims),
        ));
    }
    let mut out = vec![0.0; len];
    quant::dequantize(&t.info.tensor_type, t.bytes, &mut out)
        .map_err(|e| load_err(file, format!("{name}: {e}")))?;
    Ok(out)
}

fn optional_vector(
    file: &ModelFile,
    name: &str,
    len: usize,
) -> Result<Option<Vec<f32>>, LoadError> {
    if file.header().tensors.iter().any(|t| t.name == name) {
        vector(file, name, len).map(Some)
    } else {
        Ok(None)
    }
}

fn matrix<'a>(
    file: &'a ModelFile,
    name: &str,
    cols: usize,
    rows: usize,
) -> Result<Tensor<'a>, LoadError> {
    let t = file.tensor(name)?;
    if t.info.dims.len() != 2 || t.row_len() != cols || t.rows() != rows {
        return Err(load_err(
            file,
            format!(
                "{name} has shape {:?}, expected [{cols}, {rows}]",
                t.info.dims
            ),
        ));
    }
    Ok(t)
}

/// The `n` experts of a 3-D expert tensor `[cols, rows, n]`, each its own `rows` × `cols`
/// matrix over the mapped file.
fn experts<'a>(
    file: &'a ModelFile,
    name: &str,
    cols: usize,
    rows: usize,
    n: usize,
) -> Result<Vec<Matrix<'a>>, LoadError> {
    let t = file.tensor(name)?;
    if t.info.dims != [cols as u64, rows as u64, n as u64] {
        return Err(load_err(
            file,
            format!(
                "{name} has shape {:?}, expected [{cols}, {rows}, {n}]",
                t.info.dims
            ),
        ));
    }
    (0..n)
        .map(|e| {
            Matrix::rows_of(t, e * rows..(e + 1) * rows)
                .ok_or_else(|| load_err(file, format!("{name}: expert {e} is out of range")))
        })
        .collect()
}

impl<'a> Model<'a> {
    /// Loads the architecture `file` declares.
    pub fn load(file: &'a ModelFile) -> Result<Model<'a>, LoadError> {
        let h = Hparams::from_header(file.header(), file.bytes()).map_err(|e| load_err(file, e))?;
        if h.arch == Arch::Gemma4Assistant {
            return Err(load_err(
                file,
                "this is a draft head (gemma4-assistant), not a model: give it as the draft \
                 (--model-draft) beside its Gemma 4 target"
                    .into(),
            ));
        }
        let e = h.n_embd;
        let has = |name: &str| file.header().tensors.iter().any(|t| t.name == name);
        let embeddings = matrix(file, "token_embd.weight", e, h.vocab)?;
        let output = if has("output.weight") {
            matrix(file, "output.weight", e, h.vocab)?
        } else {
            embeddings
        };
        // On x86, K-quant matrices are read through a copy with rows side by side; batches
        // read Q5_0 weights widened to Q8_0, up to a budget (see `kernels::Matrix`).
        let isa = Isa::detect();
        let output = Matrix::stored(output).with_lanes(isa, file);
        let mut budget = kernels::WIDEN_BUDGET;
        let mut weights = |name: &str, cols: usize, rows: usize| {
            matrix(file, name, cols, rows)
                .map(|t| Matrix::widened(t, &mut budget).with_lanes(isa, file))
        };
        let gemma = h.arch.is_gemma();
        let gemma4 = h.arch == Arch::Gemma4;
        let ple_width = h.n_embd_per_layer;
        let mut layers = Vec::with_capacity(h.n_layer);
        for (i, shape) in h.layers.iter().enumerate() {
            let name = |n: &str| format!("blk.{i}.{n}.weight");
            let optional = |n: &str, len: usize| optional_vector(file, &name(n), len);
            let optional_bias =
                |n: &str, len: usize| optional_vector(file, &format!("blk.{i}.{n}.bias"), len);
            let (q_dim, kv_dim, n_ff) = (shape.q_dim(), shape.kv_dim(), shape.n_ff);
            let owns_kv = shape.kv_from == i;
            let mixer = if shape.recurrent {
                let d = h
                    .delta
                    .ok_or_else(|| load_err(file, "a recurrent layer without ssm.* keys".into()))?;
                let heads = d.v_heads;
                Mixer::DeltaNet(delta::DeltaNet {
                    qkv: weights(&name("attn_qkv"), e, d.channels())?,
                    gate: weights(&name("attn_gate"), e, d.value_dim())?,
                    beta: weights(&name("ssm_beta"), e, heads)?,
                    alpha: weights(&name("ssm_alpha"), e, heads)?,
                    conv: vector(file, &name("ssm_conv1d"), d.conv_kernel * d.channels())?,
                    dt_bias: vector(file, &format!("blk.{i}.ssm_dt.bias"), heads)?,
                    a: vector(file, &format!("blk.{i}.ssm_a"), heads)?,
                    norm: vector(file, &name("ssm_norm"), d.head_width)?,
                    out: weights(&name("ssm_out"), d.value_dim(), e)?,
                })
            } else {
                let wk = if owns_kv {
                    Some(weights(&name("attn_k"), e, kv_dim)?)
                } else {
                    None
                };
                // Gemma 4 may leave out the values: the keys serve as values then.
                let wv = if owns_kv && (!gemma4 || has(&name("attn_v"))) {
                    Some(weights(&name("attn_v"), e, kv_dim)?)
                } else {
                    None
                };
                // Qwen 3.5's queries carry their output gates beside them.
                let gated = h.arch.is_qwen35();
                Mixer::Attention(Attention {
                    wq: weights(&name("attn_q"), e, if gated { 2 * q_dim } else { q_dim })?,
                    wk,
                    wv,
                    wo: weights(&name("attn_output"), q_dim, e)?,
                    bq: optional_bias("attn_q", q_dim)?,
                    bk: optional_bias("attn_k", kv_dim)?,
                    bv: optional_bias("attn_v", kv_dim)?,
                    q_norm: optional("attn_q_norm", shape.head_dim)?,
                    k_norm: if owns_kv {
                        optional("attn_k_norm", shape.head_dim)?
                    } else {
                        None
                    },
                    v_norm: gemma4,
                    gated,
                })
            };
            let ple = if gemma4 && ple_width > 0 {
                Some(LayerPle {
                    inp_gate: weights(&name("inp_gate"), e, ple_width)?,
                    proj: weights(&name("proj"), ple_width, e)?,
                    post_norm: vector(file, &name("post_norm"), e)?,
                })
            } else {
                None
            };
            let out_scale = if gemma4 {
                optional("layer_output_scale", 1)?.map(|v| v[0])
            } else {
                None
            };
            // Qwen 3.5 names its pre-FFN norm after the attention.
            let ffn_norm = if h.arch.is_qwen35() {
                "post_attention_norm"
            } else {
                "ffn_norm"
            };
            layers.push(Layer {
                attn_norm: vector(file, &name("attn_norm"), e)?,
                mixer,
                post_attn_norm: if gemma {
                    Some(vector(file, &name("post_attention_norm"), e)?)
                } else {
                    None
                },
                ffn_norm: vector(file, &name(ffn_norm), e)?,
                post_ffn_norm: if gemma {
                    Some(vector(file, &name("post_ffw_norm"), e)?)
                } else {
                    None
                },
                ffn: if h.n_expert > 0 {
                    Ffn::Experts(moe::Experts {
                        router: Matrix::stored(matrix(file, &name("ffn_gate_inp"), e, h.n_expert)?),
                        gate: experts(file, &name("ffn_gate_exps"), e, n_ff, h.n_expert)?,
                        up: experts(file, &name("ffn_up_exps"), e, n_ff, h.n_expert)?,
                        down: experts(file, &name("ffn_down_exps"), n_ff, e, h.n_expert)?,
                        shared: if h.n_ff_shared > 0 {
                            let ff = h.n_ff_shared;
                            Some(moe::Shared {
                                gate_inp: vector(file, &name("ffn_gate_inp_shexp"), e)?,
                                gate: weights(&name("ffn_gate_shexp"), e, ff)?,
                                up: weights(&name("ffn_up_shexp"), e, ff)?,
                                down: weights(&name("ffn_down_shexp"), ff, e)?,
                            })
                        } else {
                            None
                        },
                    })
                } else {
                    Ffn::Dense {
                        gate: weights(&name("ffn_gate"), e, n_ff)?,
                        up: weights(&name("ffn_up"), e, n_ff)?,
                        down: weights(&name("ffn_down"), n_ff, e)?,
                    }
                },
                ple,
                out_scale,
            });
        }
        let ple = if gemma4 && ple_width > 0 {
            let all = ple_width * h.n_layer;
            Some(Ple {
                table: matrix(file, "per_layer_token_embd.weight", all, h.vocab)?,
                model_proj: Matrix::stored(matrix(file, "per_layer_model_proj.weight", e, all)?),
                proj_norm: vector(file, "per_layer_proj_norm.weight", ple_width)?,
            })
        } else {
            None
        };
        // The layer after the trunk's (its shape last in the hyperparameters) is the nextn
        // layer's block.
        let nextn = match layers.len() > h.n_layer {
            true => {
                let il = h.n_layer;
                let block = layers
                    .pop()
                    .ok_or_else(|| load_err(file, "no nextn layer".into()))?;
                let name = |n: &str| format!("blk.{il}.nextn.{n}.weight");
                Some(nextn::Nextn {
                    layer: block,
                    eh_proj: weights(&name("eh_proj"), 2 * e, e)?,
                    enorm: vector(file, &name("enorm"), e)?,
                    hnorm: vector(file, &name("hnorm"), e)?,
                    head_norm: optional_vector(file, &name("shared_head_norm"), e)?,
                    head: match has(&name("shared_head_head")) {
                        true => Some(weights(&name("shared_head_head"), e, h.vocab)?),
                        false => None,
                    },
                    embed: match has(&name("embed_tokens")) {
                        true => Some(matrix(file, &name("embed_tokens"), e, h.vocab)?),
                        false => None,
                    },
                })
            }
            false => None,
        };
        Ok(Model {
            output_norm: vector(file, "output_norm.weight", e)?,
            rope_freqs: optional_vector(file, "rope_freqs.weight", h.n_rot / 2)?,
            embeddings,
            output,
            layers,
            ple,
            nextn,
            hparams: h,
        })
    }

    /// Bytes of the mapped file read a row per token and never needed whole (Gemma 4's
    /// per-layer token embeddings).
    pub fn row_read_bytes(&self) -> usize {
        self.ple.as_ref().map_or(0, |p| p.table.bytes.len())
    }

    /// Bytes of the mapped file that hold routed experts (0 for a dense model).
    pub fn expert_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match &l.ffn {
                Ffn::Dense { .. } => 0,
                Ffn::Experts(x) => [&x.gate, &x.up, &x.down]
                    .iter()
                    .flat_map(|m| m.iter())
                    .map(|m| m.stored_bytes())
                    .sum(),
            })
            .sum()
    }

    /// Memory held beside the mapped file by copies of weights: widened for batches, or with
    /// rows side by side.
    pub fn copied_bytes(&self) -> usize {
        self.sum_over_matrices(|m| m.copied_bytes())
    }

    /// Bytes of the mapped file a copy stands in for (never read, so never resident).
    pub fn replaced_bytes(&self) -> usize {
        self.sum_over_matrices(|m| m.replaced_bytes())
    }

    /// `f` summed over the output and every layer's dense matrices (the routed experts are
    /// always read as stored).
    fn sum_over_matrices(&self, f: impl Fn(&Matrix<'_>) -> usize) -> usize {
        let layer = |l: &Layer<'_>| {
            let ffn = match &l.ffn {
                Ffn::Dense { gate, up, down } => [gate, up, down].iter().map(|m| f(m)).sum(),
                Ffn::Experts(x) => x
                    .shared
                    .as_ref()
                    .map_or(0, |s| [&s.gate, &s.up, &s.down].iter().map(|m| f(m)).sum()),
            };
            let ple = l.ple.as_ref().map_or(0, |p| f(&p.inp_gate) + f(&p.proj));
            ffn + ple + l.mixer.matrices().iter().map(|m| f(m)).sum::<usize>()
        };
        f(&self.output) + self.layers.iter().map(layer).sum::<usize>()
    }

    /// Runs token `token` at position `pos` (all earlier positions must be in `cache`) and
    /// returns the logits over the vocabulary (kept in the cache until the next step).
    pub fn step<'c>(
        &self,
        token: u32,
        pos: usize,
        cache: &'c mut KvCache,
    ) -> Result<&'c [f32], String> {
        self.forward(&[token], pos, cache, Logits::Last)
    }

    /// Context shift: drops positions `keep..keep + discard` from `cache` and moves the later
    /// ones down by `discard`, their keys rotated back by as many positions (rotations
    /// compose), as llama.cpp shifts its cache. A recurrent state cannot forget positions, so
    /// a model with one is refused.
    pub fn shift(&self, cache: &mut KvCache, keep: usize, discard: usize) -> Result<(), String> {
        if cache.is_recurrent() {
            return Err("a recurrent model's state cannot drop positions".into());
        }
        let held = cache.held;
        if discard == 0 || keep.saturating_add(discard) > held {
            return Err(format!(
                "cannot drop {discard} positions after {keep} of the {held} held"
            ));
        }
        let h = &self.hparams;
        let isa = cache.exec.isa;
        let mut row = Vec::new();
        for (il, shape) in h.layers.iter().enumerate() {
            if cache.keys[il].is_empty() {
                continue;
            }
            let kv_dim = shape.kv_dim();
            let rope = layers::rope_of(h, il, self.rope_freqs.as_deref());
            let back = rope.angles(discard).inverse();
            row.resize(kv_dim, 0.0);
            for pos in keep + discard..held {
                let (from, to) = (pos * kv_dim, (pos - discard) * kv_dim);
                kernels::from_f16(&cache.keys[il][from..from + kv_dim], 1.0, &mut row, isa);
                for head in row.chunks_exact_mut(shape.head_dim) {
                    rope.apply(head, &back, isa);
                }
                kernels::to_f16(&row, 1.0, &mut cache.keys[il][to..to + kv_dim], isa);
                cache.values[il].copy_within(from..from + kv_dim, to);
            }
        }
        cache.held = held - discard;
        Ok(())
    }

    /// Runs `tokens` at positions `start..` (all earlier positions must be in `cache`), in
    /// passes of up to [`MAX_BATCH`] tokens, and returns the last token's logits or every
    /// token's (`vocab` each, in order). The result equals stepping token by token, bit for bit.
    pub fn forward<'c>(
        &self,
        tokens: &[u32],
        start: usize,
        cache: &'c mut KvCache,
        logits: Logits,
    ) -> Result<&'c [f32], String> {
        let h = &self.hparams;
        if tokens.is_empty() {
            return Err("a pass needs at least one token".into());
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= h.vocab) {
            return Err(format!(
                "token {bad} is outside the vocabulary of {}",
                h.vocab
            ));
        }
        let end = start.saturating_add(tokens.len());
        if end > cache.context {
            return Err(format!(
                "positions {start}..{end} do not fit the context of {}",
                cache.context
            ));
        }
        // A recurrent state holds exactly the positions it took in: a pass continues it.
        if cache.is_recurrent() && start != cache.held {
            return Err(format!(
                "the cache's recurrent state is at position {}, not {start}: resume it first \
                 (KvCache::resume) and run the tokens from where it stands",
                cache.held
            ));
        }
        let rows = match logits {
            Logits::None => 0,
            Logits::Last => 1,
            Logits::All => tokens.len(),
        };
        cache.work.logits.resize(rows * h.vocab, 0.0);
        cache.work.hidden.resize(rows * h.n_embd, 0.0);
        let batches = tokens.len().div_ceil(MAX_BATCH);
        for (b, batch) in tokens.chunks(MAX_BATCH).enumerate() {
            let first = start + b * MAX_BATCH;
            let out_rows = match logits {
                Logits::All => Some(b * MAX_BATCH),
                Logits::Last if b + 1 == batches => Some(0),
                Logits::Last | Logits::None => None,
            };
            self.pass(batch, first, cache, logits, out_rows)?;
        }
        Ok(&cache.work.logits)
    }

    /// One pass of `tokens` (at most [`MAX_BATCH`]) from position `first`; with `out_row`, its
    /// logits (the last token's, or all of them) go to the logits buffer from that row on.
    fn pass(
        &self,
        tokens: &[u32],
        first: usize,
        cache: &mut KvCache,
        logits: Logits,
        out_row: Option<usize>,
    ) -> Result<(), String> {
        let h = &self.hparams;
        let (n, e) = (tokens.len(), h.n_embd);
        cache.work.shape(h, n);
        let mut x = std::mem::take(&mut cache.work.x);
        let embd = &self.embeddings;
        for (row, &token) in x.chunks_exact_mut(e).zip(tokens) {
            quant::dequantize(&embd.info.tensor_type, embd.row(token as usize), row)
                .map_err(|err| err.to_string())?;
            if h.arch.is_gemma() {
                let scale = (e as f32).sqrt();
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        if let Some(ple) = &self.ple {
            self.per_layer_inputs(ple, tokens, &x, cache)?;
        }
        let rope_freqs = self.rope_freqs.as_deref();
        let record = cache.is_recurrent() && cache.journal.takes(first, n);
        let ran = self.layers.iter().enumerate().try_for_each(|(il, layer)| {
            layers::block(h, il, layer, rope_freqs, &mut x, n, first, record, cache)
        });
        cache.held = first + n;
        if record {
            cache.journal.recorded(n);
        }
        let ran = ran.and_then(|()| match &self.nextn {
            Some(nextn) if cache.mirror.on => {
                let mut normed = std::mem::take(&mut cache.work.normed);
                normed.clear();
                normed.extend_from_slice(&x[..n * e]);
                for row in normed.chunks_exact_mut(e) {
                    layers::rms_norm(row, &self.output_norm, h.rms_eps);
                }
                let mirrored = nextn.mirror(self, tokens, first, &normed, cache);
                cache.work.normed = normed;
                mirrored
            }
            _ => Ok(()),
        });
        let projected = ran.and_then(|()| {
            let Some(at) = out_row else {
                return Ok(());
            };
            let wanted = match logits {
                Logits::None => return Ok(()),
                Logits::Last => &mut x[(n - 1) * e..],
                Logits::All => &mut x[..],
            };
            for row in wanted.chunks_exact_mut(e) {
                layers::rms_norm(row, &self.output_norm, h.rms_eps);
            }
            let columns = wanted.len() / e;
            let work = &mut cache.work;
            work.hidden[at * e..(at + columns) * e].copy_from_slice(wanted);
            let out = &mut work.logits[at * h.vocab..(at + columns) * h.vocab];
            kernels::matmul(
                &mut [kernels::Product {
                    w: &self.output,
                    out: &mut *out,
                }],
                wanted,
                columns,
                &cache.exec,
                &mut work.scratch,
            )?;
            if h.logit_softcap > 0.0 {
                // As llama.cpp: scale by 1/cap, tanh, scale by cap (three rounded steps), the
                // vocabulary split over the threads (a quarter million `tanh`s a token).
                let (cap, inverse) = (h.logit_softcap, 1.0 / h.logit_softcap);
                cache.exec.pool.for_each_share(
                    &mut [&mut *out],
                    1,
                    SOFTCAP_ALIGN,
                    Schedule::Even,
                    &|_, mut share| {
                        share
                            .column(0)
                            .iter_mut()
                            .for_each(|l| *l = (*l * inverse).tanh() * cap);
                    },
                );
            }
            Ok(())
        });
        cache.work.x = x;
        projected
    }

    /// Gemma 4's per-layer inputs of the pass's tokens into `cache.work.ple` (token × layer ×
    /// width), as llama.cpp builds them: the token's row of the table scaled by √width, plus
    /// the embedding projected (scaled by 1/√n_embd, then RMS-normed per layer slice), the sum
    /// scaled by 1/√2.
    fn per_layer_inputs(
        &self,
        ple: &Ple<'_>,
        tokens: &[u32],
        x: &[f32],
        cache: &mut KvCache,
    ) -> Result<(), String> {
        let h = &self.hparams;
        let (width, n) = (h.n_embd_per_layer, tokens.len());
        let all = width * h.n_layer;
        let work = &mut cache.work;
        work.ple.resize(n * all, 0.0);
        kernels::matmul(
            &mut [kernels::Product {
                w: &ple.model_proj,
                out: &mut work.ple,
            }],
            x,
            n,
            &cache.exec,
            &mut work.scratch,
        )?;
        let (projection_scale, table_scale, input_scale) = (
            1.0 / (h.n_embd as f32).sqrt(),
            (width as f32).sqrt(),
            1.0 / 2f32.sqrt(),
        );
        let mut row = vec![0.0f32; all];
        for (inputs, &token) in work.ple.chunks_exact_mut(all).zip(tokens) {
            quant::dequantize(
                &ple.table.info.tensor_type,
                ple.table.row(token as usize),
                &mut row,
            )
            .map_err(|err| err.to_string())?;
            for (slice, table) in inputs.chunks_exact_mut(width).zip(row.chunks_exact(width)) {
                slice.iter_mut().for_each(|v| *v *= projection_scale);
                layers::rms_norm(slice, &ple.proj_norm, h.rms_eps);
                for (v, t) in slice.iter_mut().zip(table) {
                    *v = (*v + *t * table_scale) * input_scale;
                }
            }
        }
        Ok(())
    }
}

/// Log-softmax of logits, in f64 for a stable reference.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_sum = sum.ln();
    logits
        .iter()
        .map(|&l| (f64::from(l - max) - log_sum) as f32)
        .collect()
}
