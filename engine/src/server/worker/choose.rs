//! One token chosen for one request: its logit bias, the grammar its output must follow
//! (checked on the sampled token first, as llama.cpp does, and only when that token is
//! refused the whole vocabulary masked and the draw repeated), the sampler, and the
//! log-probabilities it asked for, taken from the model's own distribution.

use std::borrow::Cow;
use std::sync::Arc;

use crate::grammar::{Grammar, Matcher, VocabTrie};
use crate::reasoning::{Budget, Part, Thinking, ThoughtSplitter};
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;

/// A token's log-probability and its most likely alternatives: in the model's distribution
/// (before bias, penalties or sampling), or in the one the sampler drew from.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenProbs {
    /// The chosen token.
    pub id: u32,
    /// Its natural-log probability.
    pub logprob: f64,
    /// The most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f64)>,
    /// Whether the distribution is the sampler's, after its filters and temperature
    /// (llama.cpp's `post_sampling_probs`, shown as probabilities).
    pub after_sampling: bool,
}

impl TokenProbs {
    /// The names of a token's value and of its alternatives' list, as llama.cpp reports them:
    /// probabilities after sampling, log-probabilities before.
    pub fn names(&self) -> (&'static str, &'static str) {
        if self.after_sampling {
            ("prob", "top_probs")
        } else {
            ("logprob", "top_logprobs")
        }
    }

    /// One of its log-probabilities as reported: a probability after sampling.
    pub fn shown(&self, logprob: f64) -> f64 {
        if self.after_sampling {
            logprob.exp()
        } else {
            logprob
        }
    }
}

/// The vocabulary as a grammar sees it: text tokens by their bytes; control and end tokens
/// are no text (an end token is allowed only where the grammar is complete). Built once per
/// model, on the first request with a grammar.
pub struct Vocab {
    /// The text tokens' bytes, arranged for masking.
    pub trie: VocabTrie,
    /// Per id: whether it is a text token.
    pub text: Vec<bool>,
}

impl Vocab {
    /// The vocabulary of `tokenizer`, without its control tokens.
    pub fn new(tokenizer: &Tokenizer) -> Vocab {
        let mut text = vec![true; tokenizer.vocab_size()];
        for id in tokenizer.control_ids() {
            if let Some(t) = text.get_mut(id as usize) {
                *t = false;
            }
        }
        let bytes: Vec<Vec<u8>> = (0..tokenizer.vocab_size())
            .map(|id| {
                if text[id] {
                    tokenizer.token_bytes(id as u32)
                } else {
                    Vec::new()
                }
            })
            .collect();
        Vocab {
            trie: VocabTrie::new(&bytes),
            text,
        }
    }
}

/// What comes next.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// A token, with its probabilities when the request asked for them.
    Token(u32, Option<TokenProbs>),
    /// The grammar is complete and nothing may follow: the answer ends here.
    End,
    /// The request cannot be followed any further (its grammar outgrew the matcher's bounds,
    /// or its logit bias banned every token the grammar allows): why, for the client.
    Unfollowable(String),
}

/// A grammar waiting for its trigger (a tool call's opener) to appear in the output.
pub struct GrammarTrigger {
    grammar: Arc<Grammar>,
    trigger: Vec<u8>,
    /// The trigger counts only at the output's start (after whitespace).
    anchored: bool,
    /// Where the answer's thinking block stands, when it may have one: a trigger inside it is
    /// the model thinking about a call, not making one.
    thought: Option<ThoughtSplitter>,
    /// The output's last bytes, enough to find a trigger split across tokens.
    tail: Vec<u8>,
}

impl GrammarTrigger {
    /// `grammar`, applying from where the output first holds `trigger` (`anchored`: only
    /// where it opens the output).
    pub fn new(
        grammar: Arc<Grammar>,
        trigger: &str,
        anchored: bool,
        thinking: Option<(Thinking, bool)>,
    ) -> GrammarTrigger {
        GrammarTrigger {
            grammar,
            trigger: trigger.as_bytes().to_vec(),
            anchored,
            thought: thinking.map(|(t, open)| ThoughtSplitter::new(t, open)),
            tail: Vec::new(),
        }
    }

    /// After `bytes` of output: the grammar's matcher, advanced over the output from the
    /// trigger on, once the trigger has appeared. `Err(())` when what followed the trigger
    /// already breaks the grammar (the output stays free then).
    fn after(&mut self, bytes: &[u8]) -> Option<Result<Matcher, ()>> {
        match &mut self.thought {
            // Only the answer's text after its thinking block is looked at.
            Some(thought) => {
                for part in thought.push(&String::from_utf8_lossy(bytes)) {
                    if let Part::Text(text) = part {
                        self.tail.extend_from_slice(text.as_bytes());
                    }
                }
            }
            None => self.tail.extend_from_slice(bytes),
        }
        if self.anchored {
            // The whole output so far, its leading whitespace aside, must be the trigger's start.
            let start = self.tail.iter().position(|b| !b.is_ascii_whitespace())?;
            let seen = &self.tail[start..];
            let n = seen.len().min(self.trigger.len());
            if seen[..n] != self.trigger[..n] {
                return Some(Err(()));
            }
            if seen.len() < self.trigger.len() {
                return None;
            }
            let mut m = Matcher::new(Arc::clone(&self.grammar));
            return Some(if m.advance(seen) { Ok(m) } else { Err(()) });
        }
        let n = self.trigger.len();
        match self
            .tail
            .windows(n)
            .position(|w| w == self.trigger.as_slice())
        {
            Some(at) => {
                let mut m = Matcher::new(Arc::clone(&self.grammar));
                Some(if m.advance(&self.tail[at..]) {
                    Ok(m)
                } else {
                    Err(())
                })
            }
            None => {
                let keep = self.tail.len().min(n.saturating_sub(1));
                self.tail.drain(..self.tail.len() - keep);
                None
            }
        }
    }
}

/// Thinking under a budget: counts the tokens spent inside the block, then closes it.
pub struct ThinkingBudget {
    thought: ThoughtSplitter,
    left: usize,
    closer: Vec<u32>,
    forced: std::collections::VecDeque<u32>,
    closed: bool,
}

impl ThinkingBudget {
    /// The state of `budget` at the answer's start.
    pub fn new(budget: &Budget) -> ThinkingBudget {
        ThinkingBudget {
            thought: ThoughtSplitter::new(budget.thinking, budget.open),
            left: budget.tokens,
            closer: budget.closer.clone(),
            forced: std::collections::VecDeque::new(),
            closed: false,
        }
    }

    /// After a token of `bytes`: once the budget is spent inside the block, its closer is due.
    fn after(&mut self, bytes: &[u8]) {
        self.thought.push(&String::from_utf8_lossy(bytes));
        if self.closed || !self.thought.thinking() {
            return;
        }
        if self.left == 0 {
            self.forced.extend(&self.closer);
            self.closed = true;
        } else {
            self.left -= 1;
        }
    }
}

/// Everything a request's choices are made with.
pub struct Chooser<'a> {
    /// The request's seeded sampler.
    pub sampler: Sampler,
    /// Added to logits before sampling.
    pub bias: &'a [(u32, f32)],
    /// Where the output stands in its grammar, if it must follow one.
    pub grammar: Option<Matcher>,
    /// A grammar that applies once the output holds its trigger.
    pub waiting: Option<GrammarTrigger>,
    /// The bound on the answer's thinking, if any.
    pub budget: Option<ThinkingBudget>,
    /// The vocabulary for masking (present whenever `grammar` is).
    pub vocab: Option<&'a Vocab>,
    /// For a token's bytes.
    pub tokenizer: &'a Tokenizer,
    /// End-of-generation ids.
    pub end_ids: &'a [u32],
    /// End ids are never chosen (llama.cpp's `ignore_eos`).
    pub ignore_eos: bool,
    /// Alternatives to report per token (`None`: no probabilities).
    pub logprobs: Option<usize>,
    /// Report them from the distribution the sampler drew from, not the model's.
    pub post_sampling: bool,
}

impl Chooser<'_> {
    /// The next token after `history`, given the model's `logits`.
    pub fn next(&mut self, logits: &[f32], history: &[u32]) -> Result<Choice, String> {
        if let Some(budget) = &mut self.budget
            && let Some(token) = budget.forced.pop_front()
        {
            // The thinking budget is spent: its closer is written, whatever the model wanted.
            let bytes = self.tokenizer.token_bytes(token);
            budget.after(&bytes);
            // The trigger sees the block close too (it cannot have fired inside the block).
            if let Some(waiting) = &mut self.waiting
                && let Some(triggered) = waiting.after(&bytes)
            {
                self.grammar = triggered.ok();
                self.waiting = None;
            }
            // Written, not drawn: to the sampler it was certain.
            let probs = self.reported(logits, &[(token, 1.0)], token);
            return Ok(Choice::Token(token, probs));
        }
        if let Some(m) = &self.grammar
            && !m.can_continue()
        {
            if m.is_complete() {
                return Ok(Choice::End);
            }
            return Ok(Choice::Unfollowable(format!(
                "the grammar allows nothing more here and is not complete: it is too \
                     ambiguous to follow (more than {} alternatives alive at once, or more \
                     than {} expansion steps for one byte); make its alternatives differ sooner",
                crate::grammar::MAX_STACKS,
                crate::grammar::MAX_STEPS,
            )));
        }
        let mut adjusted = Cow::Borrowed(logits);
        if !self.bias.is_empty() || self.ignore_eos {
            let owned = adjusted.to_mut();
            for &(id, bias) in self.bias {
                if let Some(l) = owned.get_mut(id as usize) {
                    *l += bias;
                }
            }
            if self.ignore_eos {
                for &id in self.end_ids {
                    if let Some(l) = owned.get_mut(id as usize) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
        let mut candidates = self.sampler.candidates(&adjusted, history);
        let mut token = self.sampler.draw(&candidates);
        if let Some(m) = &self.grammar
            && !self.fits(m, token)
        {
            let Some(masked) = self.masked(m, adjusted.into_owned())? else {
                return Ok(Choice::Unfollowable(
                    "no token of the vocabulary can continue the grammar here (does \
                         logit_bias ban every token it allows?)"
                        .into(),
                ));
            };
            candidates = self.sampler.candidates(&masked, history);
            token = self.sampler.draw(&candidates);
        }
        if !self.end_ids.contains(&token)
            && let Some(m) = &mut self.grammar
            && !m.advance(&self.tokenizer.token_bytes(token))
        {
            return Err(format!(
                "token {token} does not follow the grammar (an engine bug)"
            ));
        }
        if let Some(budget) = &mut self.budget {
            budget.after(&self.tokenizer.token_bytes(token));
        }
        if !self.end_ids.contains(&token)
            && self.grammar.is_none()
            && let Some(waiting) = &mut self.waiting
            && let Some(triggered) = waiting.after(&self.tokenizer.token_bytes(token))
        {
            self.grammar = triggered.ok();
            self.waiting = None;
        }
        let probs = self.reported(logits, &candidates, token);
        Ok(Choice::Token(token, probs))
    }

    /// The probabilities reported for `token`, when asked for: in the model's distribution
    /// (`logits`), or among the `candidates` the sampler chose it from.
    fn reported(
        &self,
        logits: &[f32],
        candidates: &[(u32, f64)],
        token: u32,
    ) -> Option<TokenProbs> {
        self.logprobs.map(|n| {
            if self.post_sampling {
                sampled_probabilities(candidates, token, n)
            } else {
                probabilities(logits, token, n)
            }
        })
    }

    fn end_allowed(&self, m: &Matcher) -> bool {
        !self.ignore_eos && m.is_complete()
    }

    fn fits(&self, m: &Matcher, token: u32) -> bool {
        if self.end_ids.contains(&token) {
            return self.end_allowed(m);
        }
        let bytes = self.tokenizer.token_bytes(token);
        !bytes.is_empty()
            && self
                .vocab
                .is_some_and(|v| v.text.get(token as usize) == Some(&true))
            && m.accepts(&bytes)
    }

    /// `logits` with every token the grammar refuses at −∞; `None` when that is every token.
    fn masked(&self, m: &Matcher, logits: Vec<f32>) -> Result<Option<Vec<f32>>, String> {
        let vocab = self
            .vocab
            .ok_or("a grammar without its vocabulary (an engine bug)")?;
        let mut allowed = vec![false; logits.len()];
        vocab.trie.allowed(m, |id| {
            if let Some(a) = allowed.get_mut(id as usize) {
                *a = true;
            }
        });
        let end = self.end_allowed(m);
        for &id in self.end_ids {
            if let Some(a) = allowed.get_mut(id as usize) {
                *a = end;
            }
        }
        let mut any = false;
        let masked = logits
            .into_iter()
            .zip(&allowed)
            .map(|(l, &ok)| {
                any |= ok && l > f32::NEG_INFINITY;
                if ok { l } else { f32::NEG_INFINITY }
            })
            .collect();
        Ok(any.then_some(masked))
    }
}

/// The log-softmax of `logits` at `chosen`, and the `n` most likely tokens (ties: lower id).
pub fn probabilities(logits: &[f32], chosen: u32, n: usize) -> TokenProbs {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let norm = f64::from(max) + sum.ln();
    let logprob = |l: f32| f64::from(l) - norm;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n > 0 {
        for (id, &l) in logits.iter().enumerate() {
            if top.len() == n && top.last().is_some_and(|&(_, worst)| l <= worst) {
                continue;
            }
            let at = top.partition_point(|&(_, better)| better >= l);
            top.insert(at, (id as u32, l));
            top.truncate(n);
        }
    }
    TokenProbs {
        id: chosen,
        logprob: logits
            .get(chosen as usize)
            .map_or(f64::NEG_INFINITY, |&l| logprob(l)),
        top: top.into_iter().map(|(id, l)| (id, logprob(l))).collect(),
        after_sampling: false,
    }
}

/// The chosen token's log-probability among the `candidates` the sampler drew from (as
/// [`crate::sampler::Sampler::candidates`] gives them, most likely first), and the first `n`
/// of them; a candidate of probability 0 is no alternative (llama.cpp leaves those out too).
pub fn sampled_probabilities(candidates: &[(u32, f64)], chosen: u32, n: usize) -> TokenProbs {
    TokenProbs {
        id: chosen,
        logprob: candidates
            .iter()
            .find(|c| c.0 == chosen)
            .map_or(f64::NEG_INFINITY, |c| c.1.ln()),
        top: candidates
            .iter()
            .take(n)
            .take_while(|c| c.1 > 0.0)
            .map(|&(id, p)| (id, p.ln()))
            .collect(),
        after_sampling: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probabilities_after_sampling_come_from_the_candidates_and_skip_impossible_ones() {
        let candidates = [(7, 0.75), (2, 0.25), (5, 0.0)];
        let p = sampled_probabilities(&candidates, 2, 10);
        assert!(p.after_sampling);
        assert_eq!(p.names(), ("prob", "top_probs"));
        assert!((p.shown(p.logprob) - 0.25).abs() < 1e-15);
        assert_eq!(p.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![7, 2]);
        assert_eq!(sampled_probabilities(&candidates, 7, 1).top.len(), 1);
    }

    #[test]
    fn probabilities_are_the_log_softmax_and_the_top_is_sorted() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let p = probabilities(&logits, 2, 3);
        let z: f64 = logits.iter().map(|&l| f64::from(l).exp()).sum();
        assert!((p.logprob - (2.0 - z.ln())).abs() < 1e-5);
        assert_eq!(
            p.top.iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![1, 3, 2],
            "most likely first, ties by the lower id"
        );
        let total: f64 = logits
            .iter()
            .enumerate()
            .map(|(i, _)| probabilities(&logits, i as u32, 0).logprob.exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-5);
    }
}
