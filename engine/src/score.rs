//! Teacher-forced scoring: run a token sequence through the model and report, for every position
//! from `from` on, the top-K log-probabilities of the distribution that predicts that position.

use serde::Serialize;

use crate::model::{KvCache, Logits, MAX_BATCH, Model, log_softmax};

/// The top candidates at one position.
#[derive(Debug, Clone, Serialize)]
pub struct Position {
    /// Index of the predicted token in the sequence.
    pub pos: usize,
    /// `(token id, log-probability)`, best first.
    pub top: Vec<(u32, f32)>,
}

/// Scores `ids` from position `from` (≥ 1) on, keeping the `top` best tokens at each.
pub fn score(
    model: &Model<'_>,
    ids: &[u32],
    from: usize,
    top: usize,
) -> Result<Vec<Position>, String> {
    if from == 0 || from > ids.len() {
        return Err(format!(
            "--from must be between 1 and the {} ids given",
            ids.len()
        ));
    }
    let mut cache = KvCache::new(&model.hparams, ids.len())?;
    let mut out = Vec::with_capacity(ids.len() - from);
    // Positions before `from − 1` predict nothing asked for: one batched prefill, no logits kept.
    let scored_from = from - 1;
    if scored_from > 0 {
        model.forward(&ids[..scored_from], 0, &mut cache, Logits::None)?;
    }
    let inputs = &ids[scored_from..ids.len() - 1];
    let vocab = model.hparams.vocab;
    for (c, chunk) in inputs.chunks(MAX_BATCH).enumerate() {
        let first = scored_from + c * MAX_BATCH;
        let logits = model.forward(chunk, first, &mut cache, Logits::All)?;
        for (i, row) in logits.chunks_exact(vocab).enumerate() {
            out.push(Position {
                pos: first + i + 1,
                top: best(&log_softmax(row), top),
            });
        }
    }
    Ok(out)
}

/// The `k` most likely tokens, best first (ties by id).
fn best(lp: &[f32], k: usize) -> Vec<(u32, f32)> {
    let mut order: Vec<u32> = (0..lp.len() as u32).collect();
    let k = k.min(order.len());
    if k == 0 {
        return Vec::new();
    }
    order.select_nth_unstable_by(k - 1, |a, b| lp[*b as usize].total_cmp(&lp[*a as usize]));
    let mut top: Vec<(u32, f32)> = order[..k].iter().map(|&i| (i, lp[i as usize])).collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    top
}
