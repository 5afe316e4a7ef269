//! Lossless speculative decoding. Drafts come from n-grams (the sequence's own recent tokens
//! are looked up in what it already holds, the prompt and the answer so far, and the tokens
//! that followed the earlier occurrence that agrees with the longest suffix are proposed) or
//! from a model's draft head ([`DraftHead`]: Gemma 4's MTP head, or Qwen 3.5's nextn layer);
//! one batched pass checks them all. Each row of that pass is sampled exactly as a single step
//! would be (same logits bit for bit, same draws in the same order), a drafted token is kept
//! only when it is the token chosen, and the first mismatch ends the run with the target's
//! own token, so the output is the same with and without speculation.
//!
//! How far to draft is chosen per step from the cost of a pass of `m` tokens against a pass of
//! one ([`Costs`]: timed up front by `engine bench`, learned from the passes requests run by
//! `engine serve`, [`LearnedCosts`]) and the acceptance seen
//! so far in the request, kept apart by how long the match is: a match of 2 tokens in prose
//! ("of the") rarely predicts the next ones, a match of 16 (a sentence being quoted, a loop)
//! nearly always does. Novel text, whose drafts miss, stops drafting. A draft head's depth is
//! chosen the same way from its own record, each of its steps costing what it was timed at.

use std::time::Instant;

use crate::model::{DraftHead, DraftWork, KvCache, Logits, Model};

/// Where a server's or a generation's drafts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Plain decoding.
    None,
    /// N-grams of the sequence itself.
    Ngram,
    /// The model's draft head (multi-token prediction).
    Mtp,
}

impl Source {
    /// The source a run drafts from: the one `asked` for, else the model's draft head where
    /// it `has_head` (a head file given, or a nextn layer in its own file), else n-grams.
    pub fn chosen(asked: Option<Source>, has_head: bool) -> Source {
        asked.unwrap_or(if has_head { Source::Mtp } else { Source::Ngram })
    }
}

/// Shortest match that proposes a draft (one token matches too often to predict anything).
const NGRAM_MIN: usize = 2;

/// Longest match measured: beyond this a quotation or a loop is as certain as it gets.
const MATCH_MAX: usize = 64;

/// Match lengths from which each acceptance record counts (index: record).
const BUCKETS: [usize; 5] = [2, 3, 4, 8, 16];

/// The record drafts after a match of `matched` tokens count in.
fn bucket(matched: usize) -> usize {
    BUCKETS.iter().rposition(|&b| matched >= b).unwrap_or(0)
}

/// The record a draft head's drafts count in (after the n-gram ones).
const HEAD: usize = BUCKETS.len();

/// A draft head's step before it is timed, in target steps (a head is a few layers as narrow
/// as a fraction of the target's: E2B's costs about 4 % of a step; dearer here so a head
/// whose steps are not timed yet drafts only where it is accepted).
const HEAD_STEP_PRIOR: f64 = 0.1;

/// How far back the lookup searches (tokens): beyond a context this is the whole sequence.
const LOOKBACK: usize = 8192;

/// Most tokens drafted per pass.
pub const MAX_DRAFT: usize = 16;

/// A proposal: the tokens that followed an earlier occurrence of the sequence's last
/// `matched` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draft<'h> {
    /// The proposed tokens.
    pub tokens: &'h [u32],
    /// How many of the sequence's last tokens the earlier occurrence agrees with (2 to
    /// [`MATCH_MAX`]).
    pub matched: usize,
}

/// The tokens (at most `n`) that followed the earlier occurrence agreeing with the longest
/// suffix of `history` (at least 2 tokens, measured up to [`MATCH_MAX`]); among equal matches
/// the one followed by more tokens (in a loop, an occurrence a few periods back drafts `n`
/// tokens where the last period would draft one), then the most recent. Where other
/// occurrences of that same match went on differently, the draft stops before the first token
/// they disagree on: the sequence has been seen to go either way there ("5 mg once daily" and
/// "5 mg twice daily" in one document), so the pass would stake its width on a coin toss.
/// Empty when nothing matches.
pub fn draft(history: &[u32], n: usize) -> Draft<'_> {
    let mut best = Draft {
        tokens: &[],
        matched: 0,
    };
    let len = history.len();
    if n == 0 || len <= NGRAM_MIN {
        return best;
    }
    let from = len.saturating_sub(LOOKBACK);
    let last = history[len - 1];
    // The first token at which an occurrence with `best`'s match length goes on differently
    // from `best` (none yet: MAX). It carries over when `best` changes among equal matches:
    // the old one parted from the new one there at the latest.
    let mut agreed = usize::MAX;
    // Each earlier position holding the last token, followed by at least one token, is a
    // candidate; its match runs back while it agrees with the suffix.
    for end in (from..len - 1).rev() {
        if history[end] != last {
            continue;
        }
        let matched = (0..MATCH_MAX.min(end + 1 - from))
            .take_while(|&i| history[end - i] == history[len - 1 - i])
            .count();
        if matched < NGRAM_MIN || matched < best.matched {
            continue;
        }
        let tokens = &history[end + 1..(end + 1 + n).min(len)];
        let parted = tokens
            .iter()
            .zip(best.tokens)
            .position(|(a, b)| a != b)
            .unwrap_or(usize::MAX);
        agreed = if matched > best.matched {
            usize::MAX
        } else {
            agreed.min(parted)
        };
        if (matched, tokens.len()) > (best.matched, best.tokens.len()) {
            best = Draft { tokens, matched };
            if matched == MATCH_MAX && tokens.len() == n {
                break;
            }
        }
    }
    Draft {
        tokens: &best.tokens[..agreed.min(best.tokens.len())],
        matched: best.matched,
    }
}

/// Time of a pass of `m` tokens relative to a pass of one, for m = 1..=[`MAX_DRAFT`] + 1.
#[derive(Debug, Clone)]
pub struct Costs {
    relative: Vec<f64>,
}

impl Costs {
    /// What passes cost before any is timed: each token past the first adds [`PRIOR_EXTRA`]
    /// of a step. Dearer than most machines measure (0.1 on a Pi 5 with a larger model, 0.35
    /// on a shared two-core VM with SmolLM2), so a server that has not timed a pass yet drafts
    /// only where acceptance is high, and the passes it runs correct the rest.
    pub fn prior() -> Costs {
        Costs::from_seconds(
            &(0..=MAX_DRAFT)
                .map(|extra| 1.0 + PRIOR_EXTRA * extra as f64)
                .collect::<Vec<_>>(),
        )
    }

    /// The relative cost of passes of 1, 2, … tokens (for reports).
    pub fn relative(&self) -> &[f64] {
        &self.relative
    }

    /// Costs from measured seconds per pass of 1, 2, … tokens (never below the one-token
    /// pass: a larger pass is never cheaper).
    pub fn from_seconds(seconds: &[f64]) -> Costs {
        let one = seconds.first().copied().filter(|s| *s > 0.0).unwrap_or(1.0);
        let mut relative: Vec<f64> = seconds.iter().map(|s| (s / one).max(1.0)).collect();
        for i in 1..relative.len() {
            relative[i] = relative[i].max(relative[i - 1]);
        }
        Costs { relative }
    }

    /// Cost of a pass of `m` tokens (one pending token plus `m - 1` drafted).
    pub(crate) fn of(&self, m: usize) -> f64 {
        let last = self.relative.last().copied().unwrap_or(1.0);
        self.relative
            .get(m.saturating_sub(1))
            .copied()
            .unwrap_or(last)
    }
}

/// The depth in `depths` at which a draft head makes the most tokens per unit of cost, when
/// each drafted token is accepted with chance `rate` (given the one before it was), a pass of
/// `m` tokens costs `pass_cost(m)` steps and a head step `head_step` steps; 0 when one plain
/// step does better.
pub fn head_depth(
    rate: f64,
    pass_cost: impl Fn(usize) -> f64,
    head_step: f64,
    depths: std::ops::RangeInclusive<usize>,
) -> usize {
    let value = |k: usize| {
        // Tokens a pass of k drafts yields: the accepted run plus the target's own token.
        let tokens: f64 = (0..=k).map(|i| rate.powi(i as i32)).sum();
        tokens / (pass_cost(k + 1) + k as f64 * head_step)
    };
    let best = depths
        .filter(|&k| k >= 1)
        .max_by(|&a, &b| value(a).total_cmp(&value(b)))
        .unwrap_or(0);
    if best > 0 && value(best) > value(0) {
        best
    } else {
        0
    }
}

/// Drafts after matches of one range of lengths: tokens drafted, checked and accepted.
///
/// A drafted token counts as checked only up to the first miss: the tokens after it were
/// never put to the test, so a draft of 16 missed at its first token is one miss, not
/// sixteen (counting them would make long drafts look far worse than they are).
#[derive(Debug, Clone, Copy, Default)]
struct Record {
    drafted: usize,
    checked: usize,
    accepted: usize,
}

/// Extra cost of each drafted token in [`Costs::prior`], in steps.
const PRIOR_EXTRA: f64 = 0.4;

/// Pass costs learned from the passes requests ran, starting from [`Costs::prior`]: a server
/// is ready at once rather than after timing passes at start (seconds on a Pi with a larger
/// model, all of them before the first answer), and the costs it learns are those of real
/// contexts on the machine as it is now.
#[derive(Debug, Clone)]
pub struct LearnedCosts {
    /// Each width's recent costs (index: width − 1; width 1 is the unit and stays empty).
    by_width: Vec<Recent>,
}

impl Default for LearnedCosts {
    fn default() -> LearnedCosts {
        LearnedCosts {
            by_width: vec![Recent::empty(); MAX_DRAFT + 1],
        }
    }
}

impl LearnedCosts {
    /// Takes in what a request's wider passes cost (the median per width it ran).
    pub fn learn(&mut self, speculation: &Speculation) {
        for (learned, seen) in self.by_width.iter_mut().zip(&speculation.by_width) {
            if let Some(cost) = seen.median() {
                learned.push(cost);
            }
        }
    }

    /// Widths whose cost has been timed.
    pub fn timed(&self) -> usize {
        self.by_width.iter().filter(|r| r.filled > 0).count()
    }

    /// Costs now: a timed width's median; between timed widths, a straight line; past the
    /// widest timed one, the prior's extra cost scaled as that width's was.
    pub fn costs(&self) -> Costs {
        let prior = Costs::prior();
        let timed: Vec<(usize, f64)> = std::iter::once((1, 1.0))
            .chain(
                self.by_width
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| Some((i + 1, r.median()?))),
            )
            .collect();
        let (last, last_cost) = timed[timed.len() - 1];
        let beyond = if last > 1 {
            (last_cost - 1.0) / (prior.of(last) - 1.0)
        } else {
            1.0
        };
        let seconds: Vec<f64> = (1..=MAX_DRAFT + 1)
            .map(|m| {
                let Some(after) = timed.iter().position(|&(w, _)| w >= m) else {
                    return 1.0 + (prior.of(m) - 1.0) * beyond;
                };
                let (m1, c1) = timed[after];
                match after.checked_sub(1).map(|i| timed[i]) {
                    Some((m0, c0)) if m1 > m0 => {
                        c0 + (c1 - c0) * (m - m0) as f64 / (m1 - m0) as f64
                    }
                    _ => c1,
                }
            })
            .collect();
        Costs::from_seconds(&seconds)
    }
}

/// A request's speculation: its limits and what its drafts have achieved so far.
#[derive(Debug, Clone)]
pub struct Speculation {
    /// Tokens drafted per pass at most (0: off).
    pub n_max: usize,
    /// Fewest tokens worth drafting; shorter drafts are not checked.
    pub n_min: usize,
    costs: Costs,
    /// Drafts by the length of the match (index: [`bucket`]), then a draft head's ([`HEAD`]):
    /// a long match predicts far better than a 2-token one in prose, about as well in a
    /// quotation, and the request's own record tells which it is in.
    by_match: [Record; BUCKETS.len() + 1],
    /// Which record the draft being checked counts in.
    checking: usize,
    /// Steps since the last draft (a pause in drafting is lifted now and then, so a request
    /// that turns to quoting is noticed).
    idle: usize,
    /// Seconds of this request's last one-token passes.
    step_seconds: Recent,
    /// How much more (or less) than calibrated this request's last wider passes cost over one
    /// step (starting as calibrated); the calibrated extra cost is scaled by their median. The
    /// calibration cannot see the request's context length, nor a machine that has since
    /// slowed or got busier.
    extra_scales: Recent,
    /// This request's wider passes in steps (index: width − 1), for [`LearnedCosts`].
    by_width: Vec<Recent>,
    /// Seconds of this request's last draft head steps.
    head_seconds: Recent,
}

/// Timings a request remembers of each kind (odd: the median is one of them).
const RECENT: usize = 5;

/// A request's last [`RECENT`] timings of one kind, read through their median: one pass that
/// the machine stalled (another process, a burst of page faults) counts for nothing, where a
/// running mean stopped the drafting of whole requests that had been accepting nearly every
/// token (Gemma 3's open questions at one thread: 11–20 tokens drafted of 128, against 110–120).
#[derive(Debug, Clone, Copy)]
struct Recent {
    values: [f64; RECENT],
    filled: usize,
    next: usize,
}

impl Recent {
    /// Nothing timed yet.
    fn empty() -> Recent {
        Recent {
            values: [0.0; RECENT],
            filled: 0,
            next: 0,
        }
    }

    /// As if `value` had been timed every time.
    fn all(value: f64) -> Recent {
        Recent {
            values: [value; RECENT],
            filled: RECENT,
            next: 0,
        }
    }

    fn push(&mut self, value: f64) {
        self.values[self.next] = value;
        self.next = (self.next + 1) % RECENT;
        self.filled = (self.filled + 1).min(RECENT);
    }

    fn median(&self) -> Option<f64> {
        let mut values = self.values;
        let values = &mut values[..self.filled];
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied()
    }
}

/// Steps without drafting after which a one-token draft is tried again (on a match of
/// [`RETRY_MATCH`] tokens or more).
const RETRY_AFTER: usize = 32;

/// Shortest match a retry is made on.
const RETRY_MATCH: usize = 3;

/// Prior hits and tries per record ([`BUCKETS`]), worth a few drafted tokens of the request's
/// own record: a 2-token match (in prose often "of the") is trusted one time in three, 3
/// tokens one in two, 4–7 four in five, 8–15 eight in nine and 16 or more sixteen in
/// seventeen. Measured on both shipped models' greedy answers (quoting and open questions),
/// the longer the match, the longer the run of drafted tokens the model then chooses. A draft
/// head's tokens are trusted two times in three (E2B's head at depth 2 makes ~1.45 tokens a
/// pass of ~1.1 steps, which needs about that).
const PRIOR: [(f64, f64); BUCKETS.len() + 1] = [
    (1.0, 3.0),
    (2.0, 4.0),
    (4.0, 5.0),
    (8.0, 9.0),
    (16.0, 17.0),
    (2.0, 3.0),
];

impl Speculation {
    /// Speculation with these limits and costs.
    pub fn new(n_max: usize, n_min: usize, costs: Costs) -> Speculation {
        Speculation {
            n_max: n_max.min(MAX_DRAFT),
            n_min,
            costs,
            by_match: [Record::default(); BUCKETS.len() + 1],
            checking: 0,
            idle: 0,
            step_seconds: Recent::empty(),
            extra_scales: Recent::all(1.0),
            by_width: vec![Recent::empty(); MAX_DRAFT + 1],
            head_seconds: Recent::empty(),
        }
    }

    /// How many tokens a draft head should draft for the next pass, at most `room`: the depth
    /// whose expected tokens per unit of cost (the pass and the head's steps) is best, given
    /// the head's acceptance so far; 0 when one plain step is best. What it returns counts as
    /// drafted.
    pub fn depth(&mut self, room: usize) -> usize {
        let Some(step) = self.step_seconds.median() else {
            return 0;
        };
        let (hits, tries) = PRIOR[HEAD];
        let own = self.by_match[HEAD];
        let rate = (own.accepted as f64 + hits) / (own.checked as f64 + tries);
        let scale = self.extra_scales.median().unwrap_or(1.0);
        let head_step = self
            .head_seconds
            .median()
            .map_or(HEAD_STEP_PRIOR, |s| s / step);
        let most = self.n_max.min(room);
        let best = head_depth(rate, |m| self.cost(m, scale), head_step, self.n_min..=most);
        let chosen = if best > 0 {
            self.idle = 0;
            best
        } else {
            self.idle += 1;
            // Now and then one token, so a head that starts being accepted is noticed.
            if self.idle >= RETRY_AFTER && self.n_min <= 1 && most >= 1 {
                self.idle = 0;
                1
            } else {
                0
            }
        };
        self.checking = HEAD;
        self.by_match[HEAD].drafted += chosen;
        chosen
    }

    /// A draft head's step took `seconds`.
    pub fn head_timed(&mut self, seconds: f64) {
        if seconds.is_finite() && seconds > 0.0 {
            self.head_seconds.push(seconds);
        }
    }

    /// Chance that a drafted token is accepted, given the one before it was, after a match of
    /// `matched` tokens: the request's record for that length with the prior's weight, or,
    /// with no record yet there, its record over all lengths.
    fn rate(&self, matched: usize) -> f64 {
        let at = bucket(matched);
        let (hits, tries) = PRIOR[at];
        let own = self.by_match[at];
        let record = if own.checked > 0 { own } else { self.total() };
        (record.accepted as f64 + hits) / (record.checked as f64 + tries)
    }

    /// The draft for the next pass after `history`, at most `room` tokens: the length whose
    /// expected tokens per unit of cost is best, given the acceptance so far; empty when one
    /// plain step is best. What it returns counts as drafted.
    ///
    /// The request's first pass is a plain step: wider passes are timed against its steps, and
    /// a request whose every pass drafted would teach [`LearnedCosts`] nothing.
    pub fn next<'h>(&mut self, history: &'h [u32], room: usize) -> &'h [u32] {
        if self.step_seconds.filled == 0 {
            return &[];
        }
        let found = draft(history, self.n_max.min(room));
        let chosen = self.length(found);
        let tokens = &found.tokens[..chosen];
        self.checking = bucket(found.matched);
        self.by_match[self.checking].drafted += chosen;
        tokens
    }

    /// Counts one drafted token as accepted or not (called up to the draft's first miss).
    pub fn checked(&mut self, accepted: bool) {
        let record = &mut self.by_match[self.checking];
        record.checked += 1;
        record.accepted += usize::from(accepted);
    }

    /// Tokens drafted so far, and how many of them were accepted.
    pub fn drafts(&self) -> (usize, usize) {
        let total = self.total();
        (total.drafted, total.accepted)
    }

    /// The records of every match length together.
    fn total(&self) -> Record {
        self.by_match.iter().fold(Record::default(), |t, r| Record {
            drafted: t.drafted + r.drafted,
            checked: t.checked + r.checked,
            accepted: t.accepted + r.accepted,
        })
    }

    /// A pass of `tokens` took `seconds`: one-token passes give this request's step time, wider
    /// ones how their cost compares with the calibrated one.
    pub fn timed(&mut self, tokens: usize, seconds: f64) {
        if !(seconds.is_finite() && seconds > 0.0) || tokens == 0 {
            return;
        }
        if tokens == 1 {
            self.step_seconds.push(seconds);
            return;
        }
        let calibrated = self.costs.of(tokens) - 1.0;
        let Some(step) = self.step_seconds.median() else {
            return;
        };
        let observed = (seconds / step - 1.0).max(0.0);
        if let Some(width) = self.by_width.get_mut(tokens - 1) {
            width.push(1.0 + observed);
        }
        if calibrated > 1e-3 {
            self.extra_scales
                .push((observed / calibrated).clamp(0.25, 8.0));
        }
    }

    /// Cost of a pass of `m` tokens in steps, as calibrated with its extra cost scaled by
    /// `scale` (the median of this request's own timings, read once per step by the caller).
    fn cost(&self, m: usize, scale: f64) -> f64 {
        1.0 + (self.costs.of(m) - 1.0) * scale
    }

    /// How many of `found`'s tokens to draft.
    fn length(&mut self, found: Draft<'_>) -> usize {
        if found.tokens.is_empty() || found.tokens.len() < self.n_min.max(1) {
            return 0;
        }
        let rate = self.rate(found.matched);
        let scale = self.extra_scales.median().unwrap_or(1.0);
        let value = |k: usize| {
            // Tokens a pass of k drafts yields: the accepted run plus the target's own token.
            let tokens: f64 = (0..=k).map(|i| rate.powi(i as i32)).sum();
            tokens / self.cost(k + 1, scale)
        };
        let best = (1..=found.tokens.len())
            .filter(|&k| k >= self.n_min)
            .max_by(|&a, &b| value(a).total_cmp(&value(b)))
            .unwrap_or(0);
        if best > 0 && value(best) > value(0) {
            self.idle = 0;
            return best;
        }
        self.idle += 1;
        // Only a long match is worth a retry: in prose, short ones come back every few tokens
        // and miss, and each retry costs a wider pass.
        if self.idle >= RETRY_AFTER && self.n_min <= 1 && found.matched >= RETRY_MATCH {
            self.idle = 0;
            return 1;
        }
        0
    }
}

/// What the decoding loop asks of its caller.
pub trait Sink {
    /// The next token given `logits` and everything so far, or `None` to end (an
    /// end-of-generation token, a grammar's end, a client gone).
    fn choose(&mut self, logits: &[f32], history: &[u32]) -> Result<Option<u32>, String>;
    /// `token` was chosen (it is last in `history`); `false` ends generation (a stop string).
    fn emit(&mut self, token: u32, history: &[u32]) -> Result<bool, String>;
    /// A pass of `tokens` tokens ran; the sequence holds `len` positions.
    fn passed(&mut self, _tokens: usize, _len: usize) {}
}

/// Why decoding ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The sink said so ([`Sink::choose`] gave `None` or [`Sink::emit`] `false`).
    Sink,
    /// `limit` tokens were generated or the context is full.
    Length,
}

/// Decodes after `history`, whose last token's logits are in `cache` (the prefill's), until
/// the sink ends it, `limit` tokens are generated or `context` positions are used. With
/// `speculation`, drafted tokens (from `head` where given, n-grams otherwise) are checked in
/// batched passes; the tokens chosen are the same either way. Returns why it ended and how
/// many positions of `history` the cache holds.
#[allow(clippy::too_many_arguments)]
pub fn decode(
    model: &Model<'_>,
    cache: &mut KvCache,
    history: &mut Vec<u32>,
    limit: usize,
    context: usize,
    mut speculation: Option<&mut Speculation>,
    head: Option<&DraftHead<'_>>,
    sink: &mut dyn Sink,
) -> Result<(End, usize), String> {
    let vocab = model.hparams.vocab;
    let start = history.len();
    let mut drafts: Vec<u32> = Vec::new();
    let mut in_cache = start;
    let mut head_work = DraftWork::default();
    let mut hidden: Vec<f32> = Vec::new();
    loop {
        // The row of the last pass whose logits chose the last token: its hidden state is
        // where a draft head starts.
        let mut chosen_row = 0;
        // Rows of the last pass: row i predicts what follows its input token i.
        for i in 0..=drafts.len() {
            chosen_row = i;
            if history.len() - start >= limit || history.len() >= context {
                return Ok((End::Length, in_cache));
            }
            let logits = &cache.logits()[i * vocab..(i + 1) * vocab];
            let Some(token) = sink.choose(logits, history)? else {
                return Ok((End::Sink, in_cache));
            };
            history.push(token);
            if !sink.emit(token, history)? {
                return Ok((End::Sink, in_cache));
            }
            let kept = drafts.get(i) == Some(&token);
            if let (Some(s), true) = (speculation.as_deref_mut(), i < drafts.len()) {
                s.checked(kept);
            }
            if !kept {
                break;
            }
        }
        let generated = history.len() - start;
        if generated >= limit || history.len() >= context {
            return Ok((End::Length, in_cache));
        }
        // The last chosen token is not in the cache yet; drafts follow it.
        let room = (limit - generated - 1).min(context - history.len());
        drafts = match (speculation.as_deref_mut(), head) {
            (Some(s), Some(head)) => {
                let depth = s.depth(room);
                let e = model.hparams.n_embd;
                hidden.clear();
                if depth > 0 {
                    let row = cache
                        .hidden(chosen_row, e)
                        .ok_or("the last pass kept no hidden state to draft from")?;
                    hidden.extend_from_slice(row);
                }
                let pos = history.len() - 1;
                let mut drafted = Vec::with_capacity(depth);
                let mut token = history[pos];
                for step in 0..depth {
                    if step > 0 {
                        hidden.clear();
                        hidden.extend_from_slice(head_work.hidden());
                    }
                    let started = Instant::now();
                    token = head
                        .draft(model, cache, token, &hidden, (pos, step), &mut head_work)?
                        .token;
                    s.head_timed(started.elapsed().as_secs_f64());
                    drafted.push(token);
                }
                drafted
            }
            (Some(s), None) => s.next(history, room).to_vec(),
            (None, _) => Vec::new(),
        };
        let pending = history.len() - 1;
        // The cache may hold rejected drafts: a recurrent state goes back to the last kept
        // token from its mark (re-running only the recurrence), or further back from a
        // checkpoint, and what it does not reach runs again.
        let held = cache.resume(pending);
        if held < pending {
            model.forward(&history[held..pending], held, cache, Logits::None)?;
        }
        if !drafts.is_empty() {
            cache.mark();
        }
        let mut input = Vec::with_capacity(drafts.len() + 1);
        input.push(history[pending]);
        input.extend_from_slice(&drafts);
        let rows = if drafts.is_empty() {
            Logits::Last
        } else {
            Logits::All
        };
        let started = Instant::now();
        model.forward(&input, pending, cache, rows)?;
        if let Some(s) = speculation.as_deref_mut() {
            s.timed(input.len(), started.elapsed().as_secs_f64());
        }
        in_cache = history.len();
        sink.passed(input.len(), pending + input.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request's speculation after its first plain step.
    fn stepped(n_max: usize, costs: Costs) -> Speculation {
        let mut s = Speculation::new(n_max, 0, costs);
        s.timed(1, 0.010);
        s
    }

    /// Costs of passes that grow by `per_token` of a pass's base cost per token.
    fn linear_costs(per_token: f64) -> Costs {
        Costs::from_seconds(
            &(0..=MAX_DRAFT as u32)
                .map(|m| 1.0 + per_token * f64::from(m))
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn drafts_follow_the_longest_recent_match() {
        // "1 2 3 4 5 … 1 2 3" → after the suffix "1 2 3" came "4 5".
        let h = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3];
        assert_eq!(draft(&h, 8).tokens, &[4, 5, 9, 9, 1, 2, 3]);
        assert_eq!(draft(&h, 8).matched, 3);
        assert_eq!(draft(&h, 2).tokens, &[4, 5]);
        // Occurrences of the same match that went on differently: the draft stops where they
        // part ("8 1 2" was followed once by "5 6", once by "5 7").
        let h = [8, 1, 2, 5, 6, 8, 1, 2, 5, 7, 8, 1, 2];
        assert_eq!(draft(&h, 8).tokens, &[5]);
        assert_eq!(draft(&h, 8).matched, 3);
        let h = [7, 8, 1, 7, 8, 2, 7, 8];
        assert!(draft(&h, 1).tokens.is_empty(), "parted at the first token");
        // A longer match is not cut by shorter ones that went elsewhere.
        let h = [9, 7, 8, 1, 4, 7, 8, 2, 9, 7, 8];
        assert_eq!(draft(&h, 2).tokens, &[1, 4]);
        // Nothing matches: nothing is drafted; one-token matches do not count.
        assert!(draft(&[1, 2, 3, 4], 4).tokens.is_empty());
        assert!(draft(&[5, 1, 6, 1], 4).tokens.is_empty());
        assert!(draft(&[1, 2, 1, 2], 0).tokens.is_empty());
        // A longer match wins over a more recent shorter one: "10 … 14" was followed by 50,
        // only "11 … 14" by 60.
        let h = [
            10, 11, 12, 13, 14, 50, 99, 11, 12, 13, 14, 60, 10, 11, 12, 13, 14,
        ];
        assert_eq!(
            draft(&h, 2),
            Draft {
                tokens: &[50, 99],
                matched: 5
            }
        );
        // A loop drafts as far as asked, from an occurrence far enough back.
        let h: Vec<u32> = std::iter::once(3).chain([1, 2].repeat(40)).collect();
        assert_eq!(draft(&h, 4).tokens, &[1, 2, 1, 2]);
        assert_eq!(draft(&[7; 200], 16).tokens, &[7; 16]);
        assert_eq!(draft(&[7; 200], 16).matched, MATCH_MAX);
    }

    #[test]
    fn drafting_stops_where_it_does_not_pay() {
        // Passes cost as much per token as steps: drafting can never pay.
        let flat = Costs::from_seconds(&(1..=17).map(f64::from).collect::<Vec<_>>());
        let mut s = stepped(8, flat);
        let h = [1, 2, 3, 4, 5, 1, 2, 3];
        assert!(s.next(&h, 8).is_empty());
        // Nearly free batches and drafts that hit: the whole match is drafted.
        let cheap = linear_costs(0.02);
        let mut s = stepped(8, cheap.clone());
        // A record of drafts after 3-token matches (this history's) that hit.
        s.by_match[bucket(3)] = Record {
            drafted: 100,
            checked: 100,
            accepted: 95,
        };
        assert_eq!(s.next(&h, 8), &[4, 5, 1, 2, 3]);
        // The same costs with drafts that always missed: none.
        let mut s = stepped(8, cheap);
        s.by_match[bucket(3)] = Record {
            drafted: 400,
            checked: 100,
            accepted: 0,
        };
        assert!(s.next(&h, 8).is_empty());
    }

    #[test]
    fn each_match_length_keeps_its_own_record() {
        let cheap = linear_costs(0.1);
        let mut s = stepped(8, cheap);
        // 2-token matches ("… 5 6" after "5 6 7") whose drafts all missed.
        let short = [5, 6, 7, 8, 9, 5, 6];
        assert!(
            !s.next(&short, 8).is_empty(),
            "a fresh 2-token match is tried"
        );
        s.checked(false);
        for _ in 0..20 {
            if s.next(&short, 8).is_empty() {
                break;
            }
            // Decoding checks a draft up to its first miss.
            s.checked(false);
        }
        assert!(s.next(&short, 8).is_empty(), "2-token matches have missed");
        // A 4-token match is still drafted: its own record is empty and its prior is high.
        let long = [1, 2, 3, 4, 7, 7, 1, 2, 3, 4];
        assert_eq!(draft(&long, 8).matched, 4);
        assert!(!s.next(&long, 8).is_empty());
    }

    #[test]
    fn passes_dearer_than_calibrated_draft_less() {
        let cheap = linear_costs(0.1);
        let h = [1, 2, 3, 4, 5, 1, 2, 3];
        let hits = Record {
            drafted: 100,
            checked: 100,
            accepted: 80,
        };
        let mut s = stepped(8, cheap);
        s.by_match[bucket(3)] = hits;
        let before = s.next(&h, 8).len();
        assert!(before >= 4, "cheap passes and good drafts: {before}");
        // This request's passes cost what their tokens would one by one.
        for _ in 0..8 {
            s.timed(1, 0.010);
            s.timed(before + 1, 0.010 * (before + 1) as f64);
        }
        s.by_match[bucket(3)] = hits;
        let after = s.next(&h, 8).len();
        assert!(
            after < before,
            "{after} drafted after dear passes, {before} before"
        );
        // Passes that turn out as cheap as calibrated bring the long drafts back.
        for _ in 0..16 {
            s.timed(1, 0.010);
            s.timed(6, 0.010 * s.costs.of(6));
        }
        s.by_match[bucket(3)] = hits;
        let again = s.next(&h, 8).len();
        assert!(
            again > after,
            "{again} drafted after cheap passes, {after} before"
        );
    }

    #[test]
    fn one_stalled_pass_does_not_stop_drafting() {
        let costs = linear_costs(0.3);
        // A loop: the longest match, nearly every drafted token accepted so far.
        let h: Vec<u32> = (0..20).cycle().take(100).collect();
        let mut s = stepped(16, costs);
        s.by_match[bucket(MATCH_MAX)] = Record {
            drafted: 64,
            checked: 64,
            accepted: 63,
        };
        let before = s.next(&h, 16).len();
        assert!(before >= 8, "a loop drafts far: {before}");
        s.timed(1, 0.010);
        // The machine stalls one wide pass for 30 steps' time.
        s.timed(before + 1, 0.300);
        let after = s.next(&h, 16).len();
        assert_eq!(after, before, "one stalled pass changed the drafting");
        // Passes that keep costing four times what was calibrated do count.
        for _ in 0..3 {
            s.timed(
                before + 1,
                0.010 * (1.0 + 4.0 * (s.costs.of(before + 1) - 1.0)),
            );
        }
        let dearer = s.next(&h, 16).len();
        assert!(
            dearer < before,
            "{dearer} drafted after dearer passes, {before} before"
        );
    }

    #[test]
    fn a_long_draft_missed_at_its_first_token_is_one_miss() {
        let cheap = linear_costs(0.1);
        let mut s = stepped(16, cheap);
        let h: Vec<u32> = (0..40).chain(0..20).collect();
        let first = s.next(&h, 16).len();
        assert!(first > 4, "a 20-token match drafts long: {first}");
        s.checked(false);
        assert_eq!(s.drafts(), (first, 0));
        let again = s.next(&h, 16).len();
        assert!(again > 4, "one miss, not {first}: {again}");
    }

    #[test]
    fn learned_costs_start_from_the_prior_and_follow_the_passes_run() {
        let mut learned = LearnedCosts::default();
        assert_eq!(learned.timed(), 0);
        assert_eq!(learned.costs().relative(), Costs::prior().relative());
        // A request whose 9-token passes took 2 steps and whose 3-token passes took 1.2.
        let mut s = stepped(16, Costs::prior());
        for _ in 0..4 {
            s.timed(1, 0.010);
            s.timed(9, 0.020);
            s.timed(3, 0.012);
        }
        learned.learn(&s);
        assert_eq!(learned.timed(), 2);
        let r = learned.costs().relative().to_vec();
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(r[8], 2.0) && near(r[2], 1.2), "{r:?}");
        // Between timed widths a straight line; from 1 to the first timed one as well.
        assert!(
            near(r[1], 1.1) && near(r[5], 1.2 + 0.8 * 3.0 / 6.0),
            "{r:?}"
        );
        // Past the widest timed width: the prior's extra cost, scaled as width 9's was.
        let scale = 1.0 / (Costs::prior().of(9) - 1.0);
        assert!(
            near(r[16], 1.0 + (Costs::prior().of(17) - 1.0) * scale),
            "{r:?}"
        );
        // Cheaper passes than the prior make drafting pay sooner.
        let h = [1, 2, 3, 4, 5, 1, 2, 3];
        let mut prior = stepped(8, Costs::prior());
        let mut taught = stepped(8, learned.costs());
        assert!(taught.next(&h, 8).len() >= prior.next(&h, 8).len());
    }
}
