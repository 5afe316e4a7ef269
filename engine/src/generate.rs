//! Generation: prefill the prompt into the cache, then sample token by token until an end-of-
//! generation token or the limit.

use serde::Serialize;

use crate::model::{DraftHead, KvCache, Logits, Model};
use crate::sampler::Sampler;
use crate::speculate::{Sink, Speculation, decode};

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
/// and `on_token` sees each generated token as soon as it is sampled. With `speculation`,
/// drafts (from `head` where given, n-grams otherwise) are checked in batched passes; the
/// tokens are the same either way.
#[allow(clippy::too_many_arguments)]
pub fn generate(
    model: &Model<'_>,
    prompt: &[u32],
    budget: Budget,
    sampler: &mut Sampler,
    end: &[u32],
    speculation: Option<&mut Speculation>,
    head: Option<&DraftHead<'_>>,
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
    if let Some(head) = head {
        head.prepare(&mut cache);
    }
    model.forward(prompt, 0, &mut cache, Logits::Last)?;
    let mut history = prompt.to_vec();
    let mut sink = Sampling {
        sampler,
        end,
        on_token,
        eos: false,
    };
    decode(
        model,
        &mut cache,
        &mut history,
        limit,
        context,
        speculation,
        head,
        &mut sink,
    )?;
    let stop = if sink.eos { Stop::Eos } else { Stop::Limit };
    Ok((history[prompt.len()..].to_vec(), stop))
}

/// The plain sampler as a decoding sink.
struct Sampling<'a> {
    sampler: &'a mut Sampler,
    end: &'a [u32],
    on_token: &'a mut dyn FnMut(u32),
    eos: bool,
}

impl Sink for Sampling<'_> {
    fn choose(&mut self, logits: &[f32], history: &[u32]) -> Result<Option<u32>, String> {
        let token = self.sampler.next(logits, history);
        self.eos = self.end.contains(&token);
        Ok((!self.eos).then_some(token))
    }

    fn emit(&mut self, token: u32, _history: &[u32]) -> Result<bool, String> {
        (self.on_token)(token);
        Ok(true)
    }
}
