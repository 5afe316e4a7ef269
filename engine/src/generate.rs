//! Generation: prefill the prompt into the cache, then sample token by token until an end-of-
//! generation token or the limit.

use serde::Serialize;

use crate::model::{KvCache, Logits, Model};
use crate::sampler::Sampler;

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stop {
    /// An end-of-generation token.
    Eos,
    /// The token limit or the end of the context.
    Limit,
}

/// How much a generation may produce and where it runs.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// Tokens to generate at most.
    pub limit: usize,
    /// Context (prompt plus generated tokens) in tokens.
    pub context: usize,
    /// Threads per pass.
    pub threads: usize,
}

/// Generates up to `budget.limit` tokens after `prompt`; `end` holds the end-of-generation ids,
/// and `on_token` sees each generated token as soon as it is sampled.
pub fn generate(
    model: &Model<'_>,
    prompt: &[u32],
    budget: Budget,
    sampler: &mut Sampler,
    end: &[u32],
    on_token: &mut dyn FnMut(u32),
) -> Result<(Vec<u32>, Stop), String> {
    let Budget {
        limit,
        context,
        threads,
    } = budget;
    if prompt.is_empty() {
        return Err("the prompt has no tokens".into());
    }
    if prompt.len() >= context {
        return Err(format!(
            "the prompt's {} tokens do not fit the context of {context}",
            prompt.len()
        ));
    }
    let mut cache = KvCache::on_threads(&model.hparams, context, threads)?;
    model.forward(prompt, 0, &mut cache, Logits::Last)?;
    let mut history = prompt.to_vec();
    let mut out = Vec::new();
    while out.len() < limit {
        let token = sampler.next(cache.logits(), &history);
        if end.contains(&token) {
            return Ok((out, Stop::Eos));
        }
        on_token(token);
        out.push(token);
        history.push(token);
        if history.len() >= context {
            break;
        }
        model.step(token, history.len() - 1, &mut cache)?;
    }
    Ok((out, Stop::Limit))
}
