//! `engine bench`: prompt processing and generation speed measured the way llama-bench measures
//! them, so the two tools' rows compare directly: random tokens, a fresh cache per repetition, a
//! warm-up run first, tokens per second as mean ± sample standard deviation over repetitions.
//! With a speculation plan it also decodes greedily from a real prompt, plain and with n-gram
//! speculation in alternating repetitions, so the two rows compare on the same machine state.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::Serialize;

use crate::model::{DraftHead, DraftWork, KvCache, Logits, Model};
use crate::sampler::{Sampler, Sampling};
use crate::speculate::{self, LearnedCosts, Sink, Speculation};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Prompt lengths to prefill (llama-bench `-p`); 0 skips.
    pub prompts: Vec<usize>,
    /// Tokens to generate one at a time (llama-bench `-n`); 0 skips.
    pub generate: usize,
    /// Positions already in the cache before each prompt and generation run, untimed
    /// (llama-bench `-d`): what attention over a long document costs.
    pub depths: Vec<usize>,
    /// Thread counts.
    pub threads: Vec<usize>,
    /// Repetitions per row.
    pub repetitions: usize,
    /// Widths of single passes to time (several tokens checked at once, every token's logits
    /// computed, as speculative decoding does) after each depth, at least 64 positions; empty
    /// skips.
    pub batches: Vec<usize>,
    /// Greedy decoding of `generate` tokens after this prompt, plain and with n-gram
    /// speculation; `None` skips.
    pub speculation: Option<Vec<u32>>,
}

/// One result row, with llama-bench's JSON field names.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Prompt tokens processed per repetition (0 for generation rows).
    pub n_prompt: usize,
    /// Tokens generated per repetition (0 for prompt rows).
    pub n_gen: usize,
    /// Positions in the cache before the timed tokens (prompt and generation rows).
    pub n_depth: usize,
    /// Threads.
    pub n_threads: usize,
    /// Tokens per pass, for single-pass rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_batch: Option<usize>,
    /// Mean milliseconds per pass, for single-pass rows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub avg_ms: Option<f64>,
    /// Mean tokens per second.
    pub avg_ts: f64,
    /// Sample standard deviation of tokens per second.
    pub stddev_ts: f64,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    /// For draft head rows (`head`): true. Such a row times one step of the head, chained as
    /// decoding chains them, after at least 64 positions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<bool>,
    /// For greedy decoding rows: whether n-gram speculation was on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<bool>,
    /// For speculative rows: tokens drafted and drafted tokens accepted, over all repetitions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drafts: Option<(usize, usize)>,
    /// For greedy decoding rows: the passes run, by width, over all repetitions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passes: Option<Vec<LoopPasses>>,
}

/// The passes of one width in greedy decoding runs, timed in the loop: each with the drafting
/// before it and the choice of a token from each of its rows. A pass timed alone (`--batch`)
/// leaves out what the loop does to it; comparing the one-token passes of the plain and the
/// speculative row shows that.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoopPasses {
    /// Tokens per pass (the pending token and the drafted ones).
    pub tokens: usize,
    /// Passes of this width.
    pub count: usize,
    /// Mean milliseconds per pass.
    pub avg_ms: f64,
}

/// The `ms/pass` cell of a greedy row: one-token passes, and the wider ones together as
/// "ms (mean tokens per pass)".
pub fn loop_summary(passes: &[LoopPasses]) -> String {
    let mut parts = Vec::new();
    for wide in [false, true] {
        let (count, tokens, ms) =
            passes
                .iter()
                .filter(|p| (p.tokens > 1) == wide)
                .fold((0, 0, 0.0), |(c, t, m), p| {
                    (
                        c + p.count,
                        t + p.count * p.tokens,
                        m + p.count as f64 * p.avg_ms,
                    )
                });
        if count > 0 {
            let c = count as f64;
            parts.push(format!("{:.2} ({:.1})", ms / c, tokens as f64 / c));
        }
    }
    parts.join(" · ")
}

impl Row {
    /// llama-bench's name for the test: `pp128`, `tg64`; `pass4` for a 4-token pass.
    pub fn test_name(&self) -> String {
        if self.head == Some(true) {
            match self.n_depth {
                PASS_CONTEXT => "head step".to_string(),
                depth => format!("head step @ d{depth}"),
            }
        } else if let Some(b) = self.n_batch {
            match self.n_depth {
                PASS_CONTEXT => format!("pass{b}"),
                depth => format!("pass{b} @ d{depth}"),
            }
        } else if let Some(spec) = self.speculative {
            format!("greedy{}{}", self.n_gen, if spec { "+ngram" } else { "" })
        } else {
            let test = if self.n_gen == 0 {
                format!("pp{}", self.n_prompt)
            } else {
                format!("tg{}", self.n_gen)
            };
            match self.n_depth {
                0 => test,
                depth => format!("{test} @ d{depth}"),
            }
        }
    }
}

/// Deterministic token ids in the vocabulary (llama-bench also measures on random tokens).
fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut state = seed | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % vocab as u64) as u32
        })
        .collect()
}

/// How the tokens go in: as a prompt (batched passes, last logits only), generated one by one,
/// or as one pass with every token's logits after at least a short context.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Prompt,
    Generation,
    Pass,
}

/// Context already in the cache before a timed single pass, at least.
const PASS_CONTEXT: usize = 64;

/// Passes of one width run back to back before the timed ones (see [`timed_run`]).
const PASS_WARM: usize = 3;

/// Passes of one width timed back to back; a repetition's time is their mean.
const PASS_TIMED: usize = 8;

/// Seconds to run `tokens` through the model on a fresh cache after `depth` positions (a
/// pass after at least [`PASS_CONTEXT`]), which are filled first and not timed.
///
/// A pass is timed as decoding runs it, after passes like it: [`PASS_WARM`] untimed, then the
/// mean of [`PASS_TIMED`], all at the same positions (each overwrites the last one's cache
/// rows, as a rejected draft's are). Timed alone after the fill, a one-token pass cost 7–8 ms
/// on SmolLM2 at two threads where a run of them took 5.4 ms each, and an 8-token pass about
/// the same either way, so wide passes looked 30 % cheaper against a decoding step than they
/// are (`bench/spec-bound.py`, BENCHMARKS.md).
fn timed_run(
    model: &Model<'_>,
    tokens: &[u32],
    depth: usize,
    mode: Mode,
    threads: usize,
) -> Result<f64, String> {
    let depth = if mode == Mode::Pass {
        depth.max(PASS_CONTEXT)
    } else {
        depth
    };
    let context = tokens.len() + depth;
    let mut cache = KvCache::on_threads(&model.hparams, context.max(1), threads)?;
    if depth > 0 {
        let before = random_tokens(depth, model.hparams.vocab, 0xc0de);
        model.forward(&before, 0, &mut cache, Logits::None)?;
    }
    // A pass that checks drafts as decoding runs it: from the same position each time, after
    // a rollback mark (a recurrent state is copied aside first, and put back before the next).
    let checking = |cache: &mut KvCache| -> Result<(), String> {
        cache.resume(depth);
        cache.mark();
        model.forward(tokens, depth, cache, Logits::All).map(|_| ())
    };
    if mode == Mode::Pass {
        for _ in 0..PASS_WARM {
            checking(&mut cache)?;
        }
    }
    let start = Instant::now();
    match mode {
        Mode::Pass => {
            for _ in 0..PASS_TIMED {
                checking(&mut cache)?;
            }
            return Ok(start.elapsed().as_secs_f64() / PASS_TIMED as f64);
        }
        Mode::Prompt => {
            model.forward(tokens, depth, &mut cache, Logits::Last)?;
        }
        Mode::Generation => {
            for (i, &t) in tokens.iter().enumerate() {
                model.step(t, depth + i, &mut cache)?;
            }
        }
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Draft head steps run back to back before the timed ones.
const HEAD_WARM: usize = 3;

/// Draft head steps timed back to back; a repetition's time is their mean.
const HEAD_TIMED: usize = 8;

/// Seconds of one step of `head` after `depth` positions (at least [`PASS_CONTEXT`]), filled
/// first and not timed: [`HEAD_WARM`] untimed, then the mean of [`HEAD_TIMED`], each step
/// drafting from the last one's token and hidden state as decoding does.
fn timed_head(
    model: &Model<'_>,
    head: &DraftHead<'_>,
    depth: usize,
    threads: usize,
) -> Result<f64, String> {
    let depth = depth.max(PASS_CONTEXT);
    let mut cache = KvCache::on_threads(&model.hparams, depth + 1, threads)?;
    head.prepare(&mut cache);
    let before = random_tokens(depth, model.hparams.vocab, 0xc0de);
    model.forward(&before, 0, &mut cache, Logits::Last)?;
    let mut hidden = cache
        .hidden(0, model.hparams.n_embd)
        .ok_or("the prompt's pass kept no hidden state to draft from")?
        .to_vec();
    let mut work = DraftWork::default();
    let mut token = random_tokens(1, model.hparams.vocab, 0xd7af)[0];
    let mut step = |token: &mut u32, hidden: &mut Vec<f32>| -> Result<(), String> {
        *token = head
            .draft(model, &mut cache, *token, hidden, (depth, 0), &mut work)?
            .token;
        hidden.clear();
        hidden.extend_from_slice(work.hidden());
        Ok(())
    };
    for _ in 0..HEAD_WARM {
        step(&mut token, &mut hidden)?;
    }
    let start = Instant::now();
    for _ in 0..HEAD_TIMED {
        step(&mut token, &mut hidden)?;
    }
    Ok(start.elapsed().as_secs_f64() / HEAD_TIMED as f64)
}

/// The depth the planner picks for a draft head at each acceptance rate in `rates`, from the
/// one-token and wider passes and the head step timed on `threads` threads in `rows` (after
/// the fewest positions timed); `None` without a head row and a one-token pass row.
pub fn planner_depths(rows: &[Row], threads: usize, rates: &[f64]) -> Option<Vec<usize>> {
    let at = |row: &&Row| row.n_threads == threads && row.n_depth == PASS_CONTEXT;
    let head_ms = rows
        .iter()
        .filter(at)
        .find(|r| r.head == Some(true))?
        .avg_ms?;
    let mut passes: Vec<(usize, f64)> = rows
        .iter()
        .filter(at)
        .filter_map(|r| Some((r.n_batch?, r.avg_ms?)))
        .collect();
    passes.sort_by_key(|p| p.0);
    let step_ms = passes.iter().find(|p| p.0 == 1)?.1;
    // Widths not timed cost what the next narrower timed one did (cheaper than they are),
    // so the table only claims depths the rows back.
    let widest = passes.last()?.0;
    let seconds: Vec<f64> = (1..=widest)
        .map(|w| {
            passes
                .iter()
                .rev()
                .find(|p| p.0 <= w)
                .map_or(step_ms, |p| p.1)
        })
        .collect();
    let costs = speculate::Costs::from_seconds(&seconds);
    Some(
        rates
            .iter()
            .map(|&rate| {
                speculate::head_depth(rate, |m| costs.of(m), head_ms / step_ms, 1..=widest - 1)
            })
            .collect(),
    )
}

/// Tokens per second: mean and sample standard deviation.
fn spread(samples: &[f64]) -> (f64, f64) {
    let mean = samples.iter().sum::<f64>() / samples.len().max(1) as f64;
    let var = if samples.len() > 1 {
        samples.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (samples.len() - 1) as f64
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn measure(
    model: &Model<'_>,
    tokens: &[u32],
    depth: usize,
    mode: Mode,
    threads: usize,
    repetitions: usize,
) -> Result<(f64, f64, Vec<f64>), String> {
    // Warm-up: page in the weights, size the buffers.
    timed_run(model, tokens, depth, mode, threads)?;
    let samples = (0..repetitions.max(1))
        .map(|_| timed_run(model, tokens, depth, mode, threads).map(|s| tokens.len() as f64 / s))
        .collect::<Result<Vec<f64>, String>>()?;
    let (mean, sd) = spread(&samples);
    Ok((mean, sd, samples))
}

/// Greedy choices for every one of the wanted tokens (an end-of-generation token does not end
/// a timed run, as llama-bench's generation does not stop either), and what each pass costs the
/// loop: the drafting before it, the pass, and the choice of a token from each of its rows.
struct Greedy<'p> {
    sampler: Sampler,
    /// When the loop's last piece of work that has been counted ended.
    since: Instant,
    /// Tokens of the pass whose rows are being chosen from (0: the prompt's, not counted).
    rows_of: usize,
    /// By tokens per pass: passes and their seconds.
    passes: &'p mut BTreeMap<usize, (usize, f64)>,
}

impl Greedy<'_> {
    /// Adds the time since the last count to the passes of `tokens` tokens (as one more
    /// pass with `new`).
    fn count(&mut self, tokens: usize, new: bool) {
        let now = Instant::now();
        if tokens > 0 {
            let width = self.passes.entry(tokens).or_insert((0, 0.0));
            width.0 += usize::from(new);
            width.1 += now.duration_since(self.since).as_secs_f64();
        }
        self.since = now;
    }
}

impl Sink for Greedy<'_> {
    fn choose(&mut self, logits: &[f32], history: &[u32]) -> Result<Option<u32>, String> {
        self.since = Instant::now();
        let token = self.sampler.next(logits, history);
        self.count(self.rows_of, false);
        Ok(Some(token))
    }

    fn emit(&mut self, _token: u32, _history: &[u32]) -> Result<bool, String> {
        self.since = Instant::now();
        Ok(true)
    }

    fn passed(&mut self, tokens: usize, _len: usize) {
        self.count(tokens, true);
        self.rows_of = tokens;
    }
}

/// Seconds to decode `n` tokens greedily after `prompt` (its prefill not timed) and the
/// tokens; with `speculation` what it drafted. Each pass is added to `passes` by width.
fn timed_decode(
    model: &Model<'_>,
    prompt: &[u32],
    n: usize,
    threads: usize,
    speculation: Option<&mut Speculation>,
    passes: &mut BTreeMap<usize, (usize, f64)>,
) -> Result<(f64, Vec<u32>), String> {
    let context = prompt.len() + n;
    let mut cache = KvCache::on_threads(&model.hparams, context, threads)?;
    model.forward(prompt, 0, &mut cache, Logits::Last)?;
    let mut history = prompt.to_vec();
    let start = Instant::now();
    let mut sink = Greedy {
        sampler: Sampler::new(Sampling {
            temperature: 0.0,
            ..Sampling::default()
        }),
        since: start,
        rows_of: 0,
        passes,
    };
    speculate::decode(
        model,
        &mut cache,
        &mut history,
        n,
        context,
        speculation,
        None,
        &mut sink,
    )?;
    let seconds = start.elapsed().as_secs_f64();
    Ok((seconds, history.split_off(prompt.len())))
}

/// The plain and the speculative greedy rows on `threads` threads, repetitions alternating;
/// fails if the two ever decode different tokens (speculation must not change the output).
fn greedy_rows(
    model: &Model<'_>,
    prompt: &[u32],
    n: usize,
    threads: usize,
    repetitions: usize,
) -> Result<[Row; 2], String> {
    if prompt.is_empty() || n == 0 {
        return Err("greedy decoding needs a prompt and tokens to generate".into());
    }
    // Pass costs as `engine serve` has them: a prior, then what the repetitions' passes cost.
    let mut learned = LearnedCosts::default();
    let (_, expected) = timed_decode(model, prompt, n, threads, None, &mut BTreeMap::new())?; // warm-up
    let (mut plain, mut spec) = (Vec::new(), Vec::new());
    let (mut plain_passes, mut spec_passes) = (BTreeMap::new(), BTreeMap::new());
    let mut drafts = (0, 0);
    for _ in 0..repetitions.max(1) {
        let (seconds, _) = timed_decode(model, prompt, n, threads, None, &mut plain_passes)?;
        plain.push(n as f64 / seconds);
        let mut speculation = Speculation::new(speculate::MAX_DRAFT, 0, learned.costs());
        let (seconds, tokens) = timed_decode(
            model,
            prompt,
            n,
            threads,
            Some(&mut speculation),
            &mut spec_passes,
        )?;
        if tokens != expected {
            return Err(format!(
                "speculative decoding chose different tokens than plain decoding on {threads} \
                 threads: a bug in the engine, please report it"
            ));
        }
        spec.push(n as f64 / seconds);
        learned.learn(&speculation);
        let (drafted, accepted) = speculation.drafts();
        drafts = (drafts.0 + drafted, drafts.1 + accepted);
    }
    let row = |samples_ts: Vec<f64>, speculative: bool, passes: BTreeMap<usize, (usize, f64)>| {
        let (avg_ts, stddev_ts) = spread(&samples_ts);
        let passes = passes
            .into_iter()
            .map(|(tokens, (count, seconds))| LoopPasses {
                tokens,
                count,
                avg_ms: seconds * 1e3 / count.max(1) as f64,
            })
            .collect();
        Row {
            n_prompt: prompt.len(),
            n_gen: n,
            n_depth: 0,
            n_threads: threads,
            n_batch: None,
            avg_ms: None,
            avg_ts,
            stddev_ts,
            samples_ts,
            head: None,
            speculative: Some(speculative),
            drafts: speculative.then_some(drafts),
            passes: Some(passes),
        }
    };
    Ok([
        row(plain, false, plain_passes),
        row(spec, true, spec_passes),
    ])
}

/// Runs the plan: for each thread count and depth, the prompt row then the generation row,
/// then the single passes and the steps of `head` where given.
pub fn run(
    model: &Model<'_>,
    head: Option<&DraftHead<'_>>,
    plan: &Plan,
) -> Result<Vec<Row>, String> {
    let vocab = model.hparams.vocab;
    let mut rows = Vec::new();
    let depths = if plan.depths.is_empty() {
        &[0][..]
    } else {
        &plan.depths[..]
    };
    for &threads in &plan.threads {
        for (&n_depth, (n_prompt, n_gen, mode)) in depths.iter().flat_map(|d| {
            plan.prompts
                .iter()
                .map(move |&p| (d, (p, 0, Mode::Prompt)))
                .chain([(d, (0, plan.generate, Mode::Generation))])
        }) {
            let n = n_prompt + n_gen;
            if n == 0 {
                continue;
            }
            let tokens = random_tokens(n, vocab, 0x5eed + n as u64);
            let (avg_ts, stddev_ts, samples_ts) =
                measure(model, &tokens, n_depth, mode, threads, plan.repetitions)?;
            rows.push(Row {
                n_prompt,
                n_gen,
                n_depth,
                n_threads: threads,
                n_batch: None,
                avg_ms: None,
                avg_ts,
                stddev_ts,
                samples_ts,
                head: None,
                speculative: None,
                drafts: None,
                passes: None,
            });
        }
        let mut pass_depths: Vec<usize> = Vec::new();
        for depth in depths.iter().map(|d| (*d).max(PASS_CONTEXT)) {
            if !pass_depths.contains(&depth) {
                pass_depths.push(depth);
            }
        }
        for (&n_depth, &width) in pass_depths
            .iter()
            .flat_map(|d| plan.batches.iter().map(move |w| (d, w)))
        {
            let tokens = random_tokens(width.max(1), vocab, 0xba7c + width as u64);
            let (avg_ts, stddev_ts, samples_ts) = measure(
                model,
                &tokens,
                n_depth,
                Mode::Pass,
                threads,
                plan.repetitions,
            )?;
            let ms = samples_ts
                .iter()
                .map(|ts| tokens.len() as f64 / ts * 1e3)
                .sum::<f64>()
                / samples_ts.len() as f64;
            rows.push(Row {
                n_prompt: 0,
                n_gen: tokens.len(),
                n_depth,
                n_threads: threads,
                n_batch: Some(tokens.len()),
                avg_ms: Some(ms),
                avg_ts,
                stddev_ts,
                samples_ts,
                head: None,
                speculative: None,
                drafts: None,
                passes: None,
            });
        }
        if let Some(head) = head {
            for &n_depth in &pass_depths {
                timed_head(model, head, n_depth, threads)?; // warm-up
                let samples: Vec<f64> = (0..plan.repetitions.max(1))
                    .map(|_| timed_head(model, head, n_depth, threads).map(|s| 1.0 / s))
                    .collect::<Result<_, String>>()?;
                let (avg_ts, stddev_ts) = spread(&samples);
                let ms = samples.iter().map(|ts| 1e3 / ts).sum::<f64>() / samples.len() as f64;
                rows.push(Row {
                    n_prompt: 0,
                    n_gen: 1,
                    n_depth,
                    n_threads: threads,
                    n_batch: None,
                    avg_ms: Some(ms),
                    avg_ts,
                    stddev_ts,
                    samples_ts: samples,
                    head: Some(true),
                    speculative: None,
                    drafts: None,
                    passes: None,
                });
            }
        }
        if let Some(prompt) = &plan.speculation {
            rows.extend(greedy_rows(
                model,
                prompt,
                plan.generate,
                threads,
                plan.repetitions,
            )?);
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_stay_in_the_vocabulary_and_repeat_per_seed() {
        let a = random_tokens(1000, 37, 7);
        assert!(a.iter().all(|&t| t < 37));
        assert_eq!(a, random_tokens(1000, 37, 7));
        assert_ne!(a, random_tokens(1000, 37, 8));
    }

    /// A single-pass or head row at the least context, as `run` makes them.
    fn pass_row(threads: usize, batch: Option<usize>, ms: f64) -> Row {
        Row {
            n_prompt: 0,
            n_gen: batch.unwrap_or(1),
            n_depth: PASS_CONTEXT,
            n_threads: threads,
            n_batch: batch,
            avg_ms: Some(ms),
            avg_ts: 0.0,
            stddev_ts: 0.0,
            samples_ts: Vec::new(),
            head: batch.is_none().then_some(true),
            speculative: None,
            drafts: None,
            passes: None,
        }
    }

    #[test]
    fn planner_depths_follow_acceptance_and_pass_costs() {
        // One thread: wider passes nearly free, a cheap head; two threads: every drafted
        // token costs half a step.
        let rows = vec![
            pass_row(1, Some(1), 100.0),
            pass_row(1, Some(2), 104.0),
            pass_row(1, Some(3), 108.0),
            pass_row(1, Some(4), 112.0),
            pass_row(1, None, 4.0),
            pass_row(2, Some(1), 60.0),
            pass_row(2, Some(2), 90.0),
            pass_row(2, Some(3), 120.0),
            pass_row(2, None, 3.0),
        ];
        let rates = [0.05, 0.5, 0.9];
        let cheap = planner_depths(&rows, 1, &rates).expect("rows at 1 thread");
        assert_eq!(cheap[0], 0, "a head that is never right is not used");
        assert!(cheap[1] >= 1 && cheap[1] <= cheap[2]);
        assert_eq!(cheap[2], 3, "the widest timed pass bounds the depth");
        let dear = planner_depths(&rows, 2, &rates).expect("rows at 2 threads");
        assert_eq!(
            dear[..2],
            [0, 0],
            "half a step per token needs high acceptance"
        );
        assert!(dear[2] >= 1);
        assert_eq!(
            planner_depths(&rows, 4, &rates),
            None,
            "no rows at 4 threads"
        );
        assert_eq!(pass_row(1, None, 4.0).test_name(), "head step");
    }

    #[test]
    fn test_names_follow_llama_bench() {
        let row = |n_prompt, n_gen| Row {
            n_prompt,
            n_gen,
            n_depth: 0,
            n_threads: 1,
            n_batch: None,
            avg_ms: None,
            avg_ts: 0.0,
            stddev_ts: 0.0,
            samples_ts: Vec::new(),
            head: None,
            speculative: None,
            drafts: None,
            passes: None,
        };
        assert_eq!(row(128, 0).test_name(), "pp128");
        assert_eq!(row(0, 64).test_name(), "tg64");
        let deep = Row {
            n_depth: 1024,
            ..row(0, 64)
        };
        assert_eq!(deep.test_name(), "tg64 @ d1024");
        let greedy = |speculative| Row {
            head: None,
            speculative: Some(speculative),
            ..row(40, 64)
        };
        assert_eq!(greedy(false).test_name(), "greedy64");
        assert_eq!(greedy(true).test_name(), "greedy64+ngram");
        let pass = |n_depth| Row {
            n_batch: Some(8),
            n_depth,
            ..row(0, 8)
        };
        assert_eq!(pass(PASS_CONTEXT).test_name(), "pass8");
        assert_eq!(pass(300).test_name(), "pass8 @ d300");
    }

    #[test]
    fn loop_summary_separates_one_token_passes_from_wider_ones() {
        let passes = |widths: &[(usize, usize, f64)]| {
            widths
                .iter()
                .map(|&(tokens, count, avg_ms)| LoopPasses {
                    tokens,
                    count,
                    avg_ms,
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(loop_summary(&passes(&[(1, 31, 6.0)])), "6.00 (1.0)");
        // Wider passes: their mean time and width weighted by count (3×2 tokens at 9 ms and
        // 1×6 tokens at 17 ms: 4 passes of 3 tokens on average, 11 ms).
        assert_eq!(
            loop_summary(&passes(&[(1, 10, 7.0), (2, 3, 9.0), (6, 1, 17.0)])),
            "7.00 (1.0) · 11.00 (3.0)"
        );
        assert_eq!(loop_summary(&passes(&[(8, 2, 20.0)])), "20.00 (8.0)");
        assert_eq!(loop_summary(&[]), "");
    }
}
