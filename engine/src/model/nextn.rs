//! Qwen 3.5's built-in multi-token-prediction layer (`nextn`, stored after the trunk in the
//! model's own file), as llama.cpp 11434 runs it (`src/models/qwen35.cpp` `graph_mtp`,
//! `common/speculative.cpp` draft-mtp): a draft source with a key-value cache of its own.
//!
//! A step at position `p` takes the token there and the target's final-normed hidden state at
//! `p − 1`: `eh_proj · [RMSNorm(embed(token); enorm); RMSNorm(h; hnorm)]`, then one block shaped
//! as a trunk attention layer (gated attention over its own keys and values, then the FFN),
//! then the head's norm (`shared_head_norm`, else the model's) and the logits (`shared_head_head`,
//! else the model's output). Drafting chains that normed state into the next step.
//!
//! Its cache must hold an entry for every position the target holds, so every target pass is
//! mirrored through the layer with the hidden states shifted by one (the cache's slot after the
//! trunk's layers; [`KvCache::mirror_draft_layer`] turns it on). The entry at a pass's first
//! position takes the previous pass's state of the position before it, where the cache still
//! has it; else (a cache resumed from a checkpoint) a zero state, which only weakens the drafts
//! there: drafts never change what is generated.

use super::head::{Draft, DraftWork};
use super::{KvCache, Layer, Model, layers};
use crate::kernels::{self, Matrix};
use crate::model_file::Tensor;
use crate::quant;

/// The layer and what surrounds it.
pub struct Nextn<'a> {
    /// The block (the model's hyperparameters hold its shape after the trunk's).
    pub(super) layer: Layer<'a>,
    /// `[embedding; hidden state]` (twice the width) to the width.
    pub(super) eh_proj: Matrix<'a>,
    pub(super) enorm: Vec<f32>,
    pub(super) hnorm: Vec<f32>,
    /// `shared_head_norm`, else the model's final norm is used.
    pub(super) head_norm: Option<Vec<f32>>,
    /// `shared_head_head`, else the model's output.
    pub(super) head: Option<Matrix<'a>>,
    /// `embed_tokens`, else the model's token embeddings.
    pub(super) embed: Option<Tensor<'a>>,
}

/// What a cache keeps for the layer: whether passes are mirrored, and the last pass's
/// final-normed hidden states (by row) with the position of its first row.
#[derive(Clone, Default)]
pub(super) struct Mirror {
    pub(super) on: bool,
    first: usize,
    rows: Vec<f32>,
    /// The layer's input rows of a pass (token × width), then its output; the rows' states
    /// shifted by one; the joined rows before the projection.
    input: Vec<f32>,
    shifted: Vec<f32>,
    joined: Vec<f32>,
}

impl Nextn<'_> {
    /// `out ← eh_proj · [RMSNorm(embed(token)); RMSNorm(hidden)]` for each row.
    fn inputs(
        &self,
        model: &Model<'_>,
        tokens: &[u32],
        hidden: &[f32],
        cache: &mut KvCache,
        (joined, out): (&mut Vec<f32>, &mut Vec<f32>),
    ) -> Result<(), String> {
        let h = &model.hparams;
        let e = h.n_embd;
        let table = self.embed.as_ref().unwrap_or(&model.embeddings);
        joined.resize(2 * e * tokens.len(), 0.0);
        for ((row, &token), state) in joined
            .chunks_exact_mut(2 * e)
            .zip(tokens)
            .zip(hidden.chunks_exact(e))
        {
            let (embedded, normed) = row.split_at_mut(e);
            quant::dequantize(&table.info.tensor_type, table.row(token as usize), embedded)
                .map_err(|err| err.to_string())?;
            layers::rms_norm(embedded, &self.enorm, h.rms_eps);
            normed.copy_from_slice(state);
            layers::rms_norm(normed, &self.hnorm, h.rms_eps);
        }
        out.resize(e * tokens.len(), 0.0);
        kernels::matmul(
            &mut [kernels::Product {
                w: &self.eh_proj,
                out: &mut out[..],
            }],
            joined,
            tokens.len(),
            &cache.exec,
            &mut cache.work.scratch,
        )
    }

    /// The layer over `tokens` from position `first`, each with its state in `hidden`: the
    /// inputs into `x` (through `joined`), then the block, its keys and values written.
    fn run(
        &self,
        model: &Model<'_>,
        (tokens, hidden): (&[u32], &[f32]),
        first: usize,
        cache: &mut KvCache,
        (joined, x): (&mut Vec<f32>, &mut Vec<f32>),
    ) -> Result<(), String> {
        let h = &model.hparams;
        self.inputs(model, tokens, hidden, cache, (joined, x))?;
        cache.work.shape(h, tokens.len());
        let rope_freqs = model.rope_freqs.as_deref();
        let n = tokens.len();
        layers::block(
            h,
            h.n_layer,
            &self.layer,
            rope_freqs,
            x,
            n,
            first,
            false,
            cache,
        )
    }

    /// Mirrors a target pass of `tokens` from `first` into the layer's cache: `normed` holds
    /// the pass's final-normed hidden states, every row.
    pub(super) fn mirror(
        &self,
        model: &Model<'_>,
        tokens: &[u32],
        first: usize,
        normed: &[f32],
        cache: &mut KvCache,
    ) -> Result<(), String> {
        let h = &model.hparams;
        let (e, n) = (h.n_embd, tokens.len());
        // Each row's state is the one of the position before it.
        let mut shifted = std::mem::take(&mut cache.mirror.shifted);
        shifted.clear();
        shifted.resize(n * e, 0.0);
        let previous = &cache.mirror;
        if first > 0
            && first > previous.first
            && let Some(row) = previous
                .rows
                .get((first - 1 - previous.first) * e..(first - previous.first) * e)
        {
            shifted[..e].copy_from_slice(row);
        }
        shifted[e..].copy_from_slice(&normed[..(n - 1) * e]);
        let mut x = std::mem::take(&mut cache.mirror.input);
        let mut joined = std::mem::take(&mut cache.mirror.joined);
        let ran = self.run(
            model,
            (tokens, &shifted),
            first,
            cache,
            (&mut joined, &mut x),
        );
        cache.mirror.input = x;
        cache.mirror.shifted = shifted;
        cache.mirror.joined = joined;
        cache.mirror.first = first;
        cache.mirror.rows.clear();
        cache.mirror.rows.extend_from_slice(normed);
        ran
    }

    /// Drafts the token after `token`, which stands at position `pos` (the target's cache
    /// holds `..pos`), from `hidden`: the target's final-normed state behind `token`'s logits
    /// on a first step, [`DraftWork::hidden`] after one.
    pub(super) fn draft(
        &self,
        model: &Model<'_>,
        cache: &mut KvCache,
        token: u32,
        hidden: &[f32],
        pos: usize,
        work: &mut DraftWork,
    ) -> Result<Draft, String> {
        let h = &model.hparams;
        let e = h.n_embd;
        if hidden.len() != e || token as usize >= h.vocab || pos == 0 || pos >= cache.context {
            return Err(format!(
                "a draft step needs a token below {}, a hidden state of {e} and a position \
                 within 1..{} (got {token}, {}, {pos})",
                h.vocab,
                cache.context,
                hidden.len()
            ));
        }
        let mut x = std::mem::take(&mut work.x);
        let mut joined = std::mem::take(&mut work.input);
        let ran = self.run(model, (&[token], hidden), pos, cache, (&mut joined, &mut x));
        work.x = x;
        work.input = joined;
        ran?;
        let norm = self.head_norm.as_deref().unwrap_or(&model.output_norm);
        layers::rms_norm(&mut work.x, norm, h.rms_eps);
        work.logits.resize(h.vocab, 0.0);
        let head = self.head.as_ref().unwrap_or(&model.output);
        super::head::project(head, &work.x, &mut work.logits, cache)?;
        work.hidden.clear();
        work.hidden.extend_from_slice(&work.x);
        Ok(Draft {
            token: super::head::argmax(&work.logits),
        })
    }
}
