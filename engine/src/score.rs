//! Teacher-forced scoring: run a token sequence through the model and report, for every position
//! from `from` on, the top-K log-probabilities of the distribution that predicts that position.

use serde::Serialize;

use crate::model::{KvCache, Model, log_softmax};

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
    for (pos, &token) in ids[..ids.len() - 1].iter().enumerate() {
        let logits = model.step(token, pos, &mut cache)?;
        if pos + 1 < from {
            continue;
        }
        let lp = log_softmax(logits);
        let mut order: Vec<u32> = (0..lp.len() as u32).collect();
        let k = top.min(order.len());
        order.select_nth_unstable_by(k.saturating_sub(1), |a, b| {
            lp[*b as usize].total_cmp(&lp[*a as usize])
        });
        let mut best: Vec<(u32, f32)> = order[..k].iter().map(|&i| (i, lp[i as usize])).collect();
        best.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        out.push(Position {
            pos: pos + 1,
            top: best,
        });
    }
    Ok(out)
}
