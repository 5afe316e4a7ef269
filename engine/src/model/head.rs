//! Gemma 4's multi-token-prediction draft head (`gemma4-assistant`), as llama.cpp 11434 runs it
//! (`src/models/gemma4-assistant.cpp`, `common/speculative.cpp`): a small model with no cache
//! of its own. One draft step takes a token and a hidden state of the target's width:
//! the token's *target* embedding (×√target width) beside the hidden state, projected down to
//! the head's width; then Gemma 4 blocks whose queries attend over the target's keys and
//! values (its last sliding and last full layer's), all at the target's next free position;
//! then the final norm, the logits (the tied embeddings) and the next hidden state (projected
//! back up). The draft is the logits' argmax; the next step takes it with that hidden state.
//! The first step takes the target's own last hidden state (the final-normed row behind the
//! logits its last token was chosen from).
//!
//! [`DraftHead`] is also how Qwen 3.5's nextn layer (`nextn.rs`, in the target's own file) is
//! drafted from: the speculation loop sees one kind of draft source.

use super::layers;
use super::{
    Arch, Attention, Ffn, Hparams, KvCache, Layer, LoadError, Mixer, Model, ModelFile, load_err,
    matrix, optional_vector, vector,
};
use crate::kernels::{self, Matrix};
use crate::quant;

/// A draft source paired with its target model: Gemma 4's assistant (a file of its own) or
/// Qwen 3.5's nextn layer (in the target's file, `nextn.rs`).
pub struct DraftHead<'a> {
    kind: Kind<'a>,
}

enum Kind<'a> {
    Assistant(Box<Assistant<'a>>),
    /// The target's own nextn layer.
    Nextn,
}

/// Gemma 4's assistant.
struct Assistant<'a> {
    /// Its hyperparameters; each layer's `kv_from` is the target layer whose keys and values
    /// it reads.
    hparams: Hparams,
    output: Matrix<'a>,
    output_norm: Vec<f32>,
    /// `[token embedding; hidden state]` (twice the target's width) to the head's width.
    pre_projection: Matrix<'a>,
    /// The head's width back to the target's: the next step's hidden state.
    post_projection: Matrix<'a>,
    rope_freqs: Option<Vec<f32>>,
    layers: Vec<Layer<'a>>,
}

/// The buffers of a draft step, kept across steps so drafting does not allocate.
#[derive(Default)]
pub struct DraftWork {
    pub(super) input: Vec<f32>,
    pub(super) x: Vec<f32>,
    pub(super) logits: Vec<f32>,
    pub(super) hidden: Vec<f32>,
}

impl DraftWork {
    /// The logits of the last step.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// The hidden state the last step gave (the next step's input).
    pub fn hidden(&self) -> &[f32] {
        &self.hidden
    }
}

/// One drafted token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draft {
    /// The head's choice (its logits' argmax, the lowest id among equals).
    pub token: u32,
}

impl<'a> DraftHead<'a> {
    /// Loads the head in `file` for `target`: refused unless it is a Gemma 4 draft head of the
    /// target's width and vocabulary whose layers' head widths and key-value heads are those
    /// of the target layers they read.
    pub fn load(file: &'a ModelFile, target: &Model<'_>) -> Result<DraftHead<'a>, LoadError> {
        Ok(DraftHead {
            kind: Kind::Assistant(Box::new(Assistant::load(file, target)?)),
        })
    }

    /// The target's own nextn layer as its draft source, if its file holds one.
    pub fn nextn(target: &Model<'_>) -> Option<DraftHead<'static>> {
        target
            .nextn
            .as_ref()
            .map(|_| DraftHead { kind: Kind::Nextn })
    }

    /// Readies a cache of the target's for drafting from it: the nextn layer needs every
    /// pass mirrored into its own keys and values ([`KvCache::mirror_draft_layer`]). Call it
    /// on a new cache, before its first pass.
    pub fn prepare(&self, cache: &mut KvCache) {
        if let Kind::Nextn = self.kind {
            cache.mirror_draft_layer();
        }
    }

    /// Drafts the token after `token`, step `step` of a chain that started at position `pos`
    /// of `cache` (the target's, holding positions `..pos`; `token` the target's last choice
    /// on step 0, the previous step's draft after), from `hidden`: the target's hidden state
    /// behind that choice's logits on step 0, [`DraftWork::hidden`] after. Leaves its logits
    /// and the next hidden state in `work`. Gemma 4's assistant drafts every step at `pos`;
    /// the nextn layer at `pos + step`, where its draft stands.
    pub fn draft(
        &self,
        target: &Model<'_>,
        cache: &mut KvCache,
        token: u32,
        hidden: &[f32],
        (pos, step): (usize, usize),
        work: &mut DraftWork,
    ) -> Result<Draft, String> {
        match &self.kind {
            Kind::Assistant(a) => a.draft(target, cache, token, hidden, pos, work),
            Kind::Nextn => target
                .nextn
                .as_ref()
                .ok_or("this model has no nextn layer to draft with")?
                .draft(target, cache, token, hidden, pos + step, work),
        }
    }
}

impl<'a> Assistant<'a> {
    fn load(file: &'a ModelFile, target: &Model<'_>) -> Result<Assistant<'a>, LoadError> {
        let mut h =
            Hparams::from_header(file.header(), file.bytes()).map_err(|e| load_err(file, e))?;
        let t = &target.hparams;
        if h.arch != Arch::Gemma4Assistant {
            return Err(load_err(
                file,
                format!(
                    "a draft head must be a gemma4-assistant file, this one is {:?}",
                    h.arch
                ),
            ));
        }
        if t.arch != Arch::Gemma4 {
            return Err(load_err(
                file,
                format!(
                    "a Gemma 4 draft head drafts for a Gemma 4 model, not {:?}",
                    t.arch
                ),
            ));
        }
        if h.n_embd_out != t.n_embd || h.vocab != t.vocab {
            return Err(load_err(
                file,
                format!(
                    "this draft head is for a model {} wide with {} tokens; the model is {} \
                     wide with {}: give the head published with this model",
                    h.n_embd_out, h.vocab, t.n_embd, t.vocab
                ),
            ));
        }
        // As llama.cpp shares them: sliding layers read the target's second-to-last layer's
        // keys and values, full layers its last one's (each through the target's own sharing).
        let n = t.n_layer;
        for (il, l) in h.layers.iter_mut().enumerate() {
            let reads = if l.swa { n.saturating_sub(2) } else { n - 1 };
            let source = t.layers[reads].kv_from;
            let s = &t.layers[source];
            if s.swa != l.swa || s.head_dim != l.head_dim || s.n_head_kv != l.n_head_kv {
                return Err(load_err(
                    file,
                    format!(
                        "draft head layer {il} ({}, {} key-value heads of {}) cannot read the \
                         model's layer {source} ({}, {} of {}): give the head published with \
                         this model",
                        kind(l.swa),
                        l.n_head_kv,
                        l.head_dim,
                        kind(s.swa),
                        s.n_head_kv,
                        s.head_dim
                    ),
                ));
            }
            l.kv_from = source;
        }
        let e = h.n_embd;
        let mut budget = kernels::WIDEN_BUDGET;
        let isa = kernels::Isa::detect();
        let mut weights = |name: &str, cols: usize, rows: usize| {
            matrix(file, name, cols, rows)
                .map(|t| Matrix::widened(t, &mut budget).with_lanes(isa, file))
        };
        let mut layers = Vec::with_capacity(h.n_layer);
        for (i, shape) in h.layers.iter().enumerate() {
            let name = |n: &str| format!("blk.{i}.{n}.weight");
            let q_dim = shape.q_dim();
            layers.push(Layer {
                attn_norm: vector(file, &name("attn_norm"), e)?,
                mixer: Mixer::Attention(Attention {
                    wq: weights(&name("attn_q"), e, q_dim)?,
                    wk: None,
                    wv: None,
                    wo: weights(&name("attn_output"), q_dim, e)?,
                    bq: None,
                    bk: None,
                    bv: None,
                    q_norm: Some(vector(file, &name("attn_q_norm"), shape.head_dim)?),
                    k_norm: None,
                    v_norm: false,
                    gated: false,
                }),
                post_attn_norm: Some(vector(file, &name("post_attention_norm"), e)?),
                ffn_norm: vector(file, &name("ffn_norm"), e)?,
                post_ffn_norm: Some(vector(file, &name("post_ffw_norm"), e)?),
                ffn: Ffn::Dense {
                    gate: weights(&name("ffn_gate"), e, shape.n_ff)?,
                    up: weights(&name("ffn_up"), e, shape.n_ff)?,
                    down: weights(&name("ffn_down"), shape.n_ff, e)?,
                },
                ple: None,
                out_scale: Some(vector(file, &name("layer_output_scale"), 1)?[0]),
            });
        }
        let out = h.n_embd_out;
        Ok(Assistant {
            output: Matrix::stored(matrix(file, "token_embd.weight", e, h.vocab)?)
                .with_lanes(isa, file),
            output_norm: vector(file, "output_norm.weight", e)?,
            pre_projection: Matrix::stored(matrix(
                file,
                "nextn.pre_projection.weight",
                2 * out,
                e,
            )?),
            post_projection: Matrix::stored(matrix(file, "nextn.post_projection.weight", e, out)?),
            rope_freqs: optional_vector(file, "rope_freqs.weight", h.n_rot / 2)?,
            layers,
            hparams: h,
        })
    }

    fn draft(
        &self,
        target: &Model<'_>,
        cache: &mut KvCache,
        token: u32,
        hidden: &[f32],
        pos: usize,
        work: &mut DraftWork,
    ) -> Result<Draft, String> {
        let h = &self.hparams;
        let (e, out) = (h.n_embd, h.n_embd_out);
        if hidden.len() != out || token as usize >= h.vocab || pos == 0 || pos > cache.context {
            return Err(format!(
                "a draft step needs a token below {}, a hidden state of {out} and a position \
                 within 1..={} (got {token}, {}, {pos})",
                h.vocab,
                cache.context,
                hidden.len()
            ));
        }
        work.input.resize(2 * out, 0.0);
        let (embedded, state) = work.input.split_at_mut(out);
        let table = &target.embeddings;
        quant::dequantize(&table.info.tensor_type, table.row(token as usize), embedded)
            .map_err(|err| err.to_string())?;
        let scale = (out as f32).sqrt();
        embedded.iter_mut().for_each(|v| *v *= scale);
        state.copy_from_slice(hidden);
        work.x.resize(e, 0.0);
        project(&self.pre_projection, &work.input, &mut work.x, cache)?;
        cache.work.shape(h, 1);
        let rope_freqs = self.rope_freqs.as_deref();
        for (il, layer) in self.layers.iter().enumerate() {
            layers::block(h, il, layer, rope_freqs, &mut work.x, 1, pos, false, cache)?;
        }
        layers::rms_norm(&mut work.x, &self.output_norm, h.rms_eps);
        work.logits.resize(h.vocab, 0.0);
        project(&self.output, &work.x, &mut work.logits, cache)?;
        work.hidden.resize(out, 0.0);
        project(&self.post_projection, &work.x, &mut work.hidden, cache)?;
        Ok(Draft {
            token: argmax(&work.logits),
        })
    }
}

/// The draft: the logits' argmax, the lowest id among equals.
pub(super) fn argmax(logits: &[f32]) -> u32 {
    let best = logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &l)| {
            if l > best.1 { (i, l) } else { best }
        });
    best.0 as u32
}

/// `out = w · x` for one token, on the cache's threads.
pub(super) fn project(
    w: &Matrix<'_>,
    x: &[f32],
    out: &mut [f32],
    cache: &mut KvCache,
) -> Result<(), String> {
    kernels::matmul(
        &mut [kernels::Product { w, out }],
        x,
        1,
        &cache.exec,
        &mut cache.work.scratch,
    )
}

fn kind(swa: bool) -> &'static str {
    if swa { "sliding" } else { "full" }
}
