//! Transformer forward passes over a [`ModelFile`]: the hyperparameters from GGUF metadata, the
//! per-layer weights as zero-copy views (plus the widened Q5_0 copies batches read), an f16 KV
//! cache sized to the configured context, and one token step that returns the logits. Matrix products go through [`crate::kernels`], whose
//! rows do not depend on the thread count, so neither does the output.

mod attention;
mod hparams;
mod layers;
mod moe;

pub use hparams::{Arch, Hparams};

use crate::kernels::{self, Exec, Isa, Matrix};
use crate::model_file::{LoadError, ModelFile, Tensor};
use crate::pool::Pool;
use crate::quant;

struct Layer<'a> {
    attn_norm: Vec<f32>,
    wq: Matrix<'a>,
    wk: Matrix<'a>,
    wv: Matrix<'a>,
    wo: Matrix<'a>,
    /// Qwen 2 adds biases to the query, key and value projections.
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    /// Gemma 3 and Qwen 3 normalise each query and key head.
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    /// Gemma 3 normalises the attention and FFN outputs too.
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    post_ffn_norm: Option<Vec<f32>>,
    ffn: Ffn<'a>,
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
    /// Llama 3's rope frequency divisors.
    rope_freqs: Option<Vec<f32>>,
    layers: Vec<Layer<'a>>,
}

/// Keys and values (f16, as llama.cpp keeps them) of every position seen so far, per layer,
/// and the working buffers of one sequence so the token loop does not allocate.
#[derive(Clone)]
pub struct KvCache {
    context: usize,
    exec: Exec,
    keys: Vec<Vec<u16>>,
    values: Vec<Vec<u16>>,
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
            route: Vec::new(),
            chosen: Vec::new(),
            moe_in: Vec::new(),
            moe_gate: Vec::new(),
            moe_up: Vec::new(),
            moe_down: Vec::new(),
            moe_out: Vec::new(),
        }
    }

    /// Sizes every buffer for a pass of `n` tokens.
    fn shape(&mut self, h: &Hparams, n: usize) {
        let (q_dim, kv_dim) = (h.n_head * h.head_dim, h.n_head_kv * h.head_dim);
        for (buffer, width) in [
            (&mut self.x, h.n_embd),
            (&mut self.cur, h.n_embd),
            (&mut self.q, q_dim),
            (&mut self.k, kv_dim),
            (&mut self.v, kv_dim),
            (&mut self.attn, q_dim),
            (&mut self.attn_by_head, q_dim),
            (&mut self.proj, h.n_embd),
            (&mut self.gate, h.n_ff),
            (&mut self.up, h.n_ff),
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
pub const MAX_BATCH: usize = 32;

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
        let width = hparams.n_head_kv * hparams.head_dim;
        Ok(KvCache {
            context,
            exec: Exec::new(threads),
            keys: vec![vec![0; context * width]; hparams.n_layer],
            values: vec![vec![0; context * width]; hparams.n_layer],
            work: Work::new(),
        })
    }

    /// A copy holding this cache's first `positions` positions, the rest zero as in a fresh
    /// cache. A conversation branching off a kept one needs only the shared prefix; cloning
    /// the whole context wrote (and first faulted in) every page of it, about 94 MB per
    /// request for SmolLM2 at a 4096 context, before the first token.
    pub fn copy_prefix(&self, positions: usize) -> KvCache {
        let kept = positions.min(self.context);
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
            context: self.context,
            exec: self.exec.clone(),
            keys: copy(&self.keys),
            values: copy(&self.values),
            work: self.work.clone(),
        }
    }

    /// The logits of the last pass ([`Model::step`] or [`Model::forward`]).
    pub fn logits(&self) -> &[f32] {
        &self.work.logits
    }

    /// Bytes its keys and values take.
    pub fn bytes(&self) -> usize {
        self.keys
            .iter()
            .chain(&self.values)
            .map(|v| v.len() * 2)
            .sum()
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
        let h = Hparams::from_header(file.header()).map_err(|e| load_err(file, e))?;
        let (e, q_dim, kv_dim) = (h.n_embd, h.n_head * h.head_dim, h.n_head_kv * h.head_dim);
        let embeddings = matrix(file, "token_embd.weight", e, h.vocab)?;
        let output = if file
            .header()
            .tensors
            .iter()
            .any(|t| t.name == "output.weight")
        {
            matrix(file, "output.weight", e, h.vocab)?
        } else {
            embeddings
        };
        let output = Matrix::stored(output);
        // Batches read Q5_0 weights widened to Q8_0 (see `kernels::Matrix`), up to a budget.
        let mut budget = kernels::WIDEN_BUDGET;
        let mut weights = |name: &str, cols: usize, rows: usize| {
            matrix(file, name, cols, rows).map(|t| Matrix::widened(t, &mut budget))
        };
        let gemma = h.arch == Arch::Gemma3;
        let mut layers = Vec::with_capacity(h.n_layer);
        for i in 0..h.n_layer {
            let name = |n: &str| format!("blk.{i}.{n}.weight");
            let optional = |n: &str, len: usize| optional_vector(file, &name(n), len);
            let optional_bias =
                |n: &str, len: usize| optional_vector(file, &format!("blk.{i}.{n}.bias"), len);
            layers.push(Layer {
                attn_norm: vector(file, &name("attn_norm"), e)?,
                wq: weights(&name("attn_q"), e, q_dim)?,
                wk: weights(&name("attn_k"), e, kv_dim)?,
                wv: weights(&name("attn_v"), e, kv_dim)?,
                wo: weights(&name("attn_output"), q_dim, e)?,
                bq: optional_bias("attn_q", q_dim)?,
                bk: optional_bias("attn_k", kv_dim)?,
                bv: optional_bias("attn_v", kv_dim)?,
                q_norm: optional("attn_q_norm", h.head_dim)?,
                k_norm: optional("attn_k_norm", h.head_dim)?,
                post_attn_norm: if gemma {
                    Some(vector(file, &name("post_attention_norm"), e)?)
                } else {
                    None
                },
                ffn_norm: vector(file, &name("ffn_norm"), e)?,
                post_ffn_norm: if gemma {
                    Some(vector(file, &name("post_ffw_norm"), e)?)
                } else {
                    None
                },
                ffn: if h.n_expert > 0 {
                    Ffn::Experts(moe::Experts {
                        router: Matrix::stored(matrix(file, &name("ffn_gate_inp"), e, h.n_expert)?),
                        gate: experts(file, &name("ffn_gate_exps"), e, h.n_ff, h.n_expert)?,
                        up: experts(file, &name("ffn_up_exps"), e, h.n_ff, h.n_expert)?,
                        down: experts(file, &name("ffn_down_exps"), h.n_ff, e, h.n_expert)?,
                    })
                } else {
                    Ffn::Dense {
                        gate: weights(&name("ffn_gate"), e, h.n_ff)?,
                        up: weights(&name("ffn_up"), e, h.n_ff)?,
                        down: weights(&name("ffn_down"), h.n_ff, e)?,
                    }
                },
            });
        }
        Ok(Model {
            output_norm: vector(file, "output_norm.weight", e)?,
            rope_freqs: optional_vector(file, "rope_freqs.weight", h.n_rot / 2)?,
            embeddings,
            output,
            layers,
            hparams: h,
        })
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

    /// Memory held beside the mapped file by weights widened for batches.
    pub fn widened_bytes(&self) -> usize {
        let layer = |l: &Layer<'_>| {
            let ffn = match &l.ffn {
                Ffn::Dense { gate, up, down } => [gate, up, down]
                    .iter()
                    .map(|m| m.widened_bytes())
                    .sum::<usize>(),
                Ffn::Experts(_) => 0,
            };
            ffn + [&l.wq, &l.wk, &l.wv, &l.wo]
                .iter()
                .map(|m| m.widened_bytes())
                .sum::<usize>()
        };
        self.layers.iter().map(layer).sum()
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
        let rows = match logits {
            Logits::None => 0,
            Logits::Last => 1,
            Logits::All => tokens.len(),
        };
        cache.work.logits.resize(rows * h.vocab, 0.0);
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
            if h.arch == Arch::Gemma3 {
                let scale = (e as f32).sqrt();
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
        let rope_freqs = self.rope_freqs.as_deref();
        let ran = self.layers.iter().enumerate().try_for_each(|(il, layer)| {
            layers::block(h, il, layer, rope_freqs, &mut x, n, first, cache)
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
            let out = &mut work.logits[at * h.vocab..(at + columns) * h.vocab];
            kernels::matmul(
                &mut [kernels::Product {
                    w: &self.output,
                    out,
                }],
                wanted,
                columns,
                &cache.exec,
                &mut work.scratch,
            )
        });
        cache.work.x = x;
        projected
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
