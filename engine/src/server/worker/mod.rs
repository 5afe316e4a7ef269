//! The one generation thread: it owns the model's caches and runs one request at a time from a
//! bounded queue, streaming text back as it is produced. A request whose receiver is gone (the
//! client disconnected) stops at the next token.
//!
//! A request's `n` choices run one after another, each from the prompt's cache (prefilled
//! once); see [`cache`] for the caches kept between requests, [`choose`] for how each token
//! is picked.

mod cache;
pub mod choose;
mod stop;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;

use super::metrics::Metrics;
use crate::grammar::{Grammar, Matcher};
use crate::model::{DraftHead, KvCache, Logits, Model};
use crate::reasoning::ThoughtSplitter;
use crate::sampler::{Sampler, Sampling};
use crate::speculate::{End, LearnedCosts, Sink, Speculation, decode};
use crate::tokenizer::{TextStream, Tokenizer};
use cache::{Cached, Caches, common_prefix};
use choose::{Choice, Chooser, GrammarTrigger, ThinkingBudget, TokenProbs, Vocab};
use stop::StopFilter;

/// How a request generates: checked from its body by the handler.
#[derive(Debug, Clone)]
pub struct Params {
    /// Sampler settings (choice `i` draws with `seed + i`).
    pub sampling: Sampling,
    /// Tokens to generate at most, per choice.
    pub max_tokens: usize,
    /// Strings that end generation (not included in the text).
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens (llama.cpp's `ignore_eos`).
    pub ignore_eos: bool,
    /// Start from the kept cache that shares the longest prefix with the prompt (llama.cpp's
    /// `cache_prompt`); off, the whole prompt is prefilled once for the request (what a
    /// benchmark of prefill, or of decoding right after it, needs).
    pub reuse_prompt: bool,
    /// How many answers (OpenAI's `n`).
    pub choices: usize,
    /// Alternatives to report per token (`None`: no probabilities).
    pub logprobs: Option<usize>,
    /// Report the sampler's probabilities, after its chain, instead of the model's.
    pub post_sampling_probs: bool,
    /// Added to logits before sampling.
    pub logit_bias: Vec<(u32, f32)>,
    /// The grammar the output follows.
    pub grammar: Option<Arc<Grammar>>,
    /// The thinking block a chat's answer may open with (its syntax, and whether the prompt
    /// left one open): a lazily applied grammar's trigger counts only after it.
    pub thinking_block: Option<(crate::reasoning::Thinking, bool)>,
    /// The bound on a chat's thinking (`--reasoning-budget`), if any.
    pub thinking_budget: Option<crate::reasoning::Budget>,
    /// Where the grammar starts: at the output's first byte (`None`), or where the output
    /// first holds this text (a tool call's opener; the output before it is free).
    pub grammar_trigger: Option<String>,
    /// The trigger counts only where it opens the output (a Llama 3 call is the whole answer).
    pub grammar_anchored: bool,
    /// Speculation: tokens drafted per pass at most (0: off; llama.cpp's `speculative.n_max`).
    pub draft_max: usize,
    /// Fewest drafted tokens worth a check (`speculative.n_min`).
    pub draft_min: usize,
    /// Send prefill progress events (`return_progress`).
    pub report_progress: bool,
    /// Put the timings so far on every text event (`timings_per_token`).
    pub timings_per_token: bool,
    /// Prompt tokens a context shift keeps (`n_keep`; BOS is kept besides).
    pub keep: usize,
}

/// A request's prompt.
pub struct Prompt {
    /// Its token ids (BOS included where the model wants it).
    pub ids: Vec<u32>,
    /// Where a chat's last turn ends and the answer's cue begins: a later turn of the same
    /// chat shares the prompt up to there.
    pub turn_end: Option<usize>,
}

impl Prompt {
    /// Token ids with nothing known about what a later request shares.
    pub fn new(ids: Vec<u32>) -> Prompt {
        Prompt {
            ids,
            turn_end: None,
        }
    }
}

/// One generation request.
pub struct Job {
    /// Prompt token ids (BOS included where the model wants it).
    pub prompt: Vec<u32>,
    /// Where a chat's last turn ends (see [`Prompt::turn_end`]).
    pub turn_end: Option<usize>,
    /// How to generate.
    pub params: Params,
    /// Which queue it waits in.
    pub lane: Lane,
    /// When the request arrived (time to first token is counted from here).
    pub arrived: Instant,
    /// Where the text and the end go.
    pub events: UnboundedSender<Event>,
}

/// The two queues: the users' (bounded by `--queue`) and the box's own (the supervisor's
/// health probe and its dashboard chat), which is served first and never
/// refused because users filled theirs: a full queue must not look like a dead engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// A user's request.
    User,
    /// A request carrying the control key.
    Control,
}

/// Control requests waiting at most (the supervisor sends one or two at a time).
const CONTROL_QUEUE: usize = 8;

/// What a request hears back, in order: per choice, text deltas then `Done`; or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// The next piece of a choice's text (whole UTF-8 characters, never part of a stop
    /// string), with the probabilities of the tokens it completes when they were asked for.
    Text {
        /// Which choice (0-based).
        choice: usize,
        /// The text.
        text: String,
        /// One entry per token the text finishes.
        probs: Vec<TokenProbs>,
        /// The tokens the text finishes (llama.cpp's streamed `tokens`).
        tokens: Vec<u32>,
        /// The timings so far, when asked for (`timings_per_token`).
        timings: Option<Timings>,
    },
    /// How far the prompt's prefill is, when asked for (`return_progress`): once before the
    /// first pass, then after each.
    Progress(PromptProgress),
    /// A choice ended.
    Done {
        /// Which choice.
        choice: usize,
        /// How it went.
        summary: Summary,
    },
    /// Generation could not run.
    Failed(Failure),
    /// The engine is shutting down: the answer was cut off (or never started).
    ShuttingDown,
}

/// Why a choice could not be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The request asks for what cannot be followed (a grammar past the matcher's bounds): the
    /// client's to change (400).
    Request(String),
    /// The engine failed (500).
    Engine(String),
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::Engine(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::Engine(message.to_string())
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An end-of-generation token.
    Stop,
    /// A stop string.
    Word,
    /// `max_tokens` or the end of the context.
    Length,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn openai(self) -> &'static str {
        match self {
            Finish::Stop | Finish::Word => "stop",
            Finish::Length => "length",
        }
    }
}

/// How a generation ended: llama.cpp's `timings` object, plus the finish reason.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Why it ended.
    #[serde(skip)]
    pub finish: Finish,
    /// Its timings, serialized flat as llama.cpp's `timings` object.
    #[serde(flatten)]
    pub timings: Timings,
    /// The stop string that ended generation, if one did.
    #[serde(skip)]
    pub stopping_word: String,
    /// Whether it ended because the context was full (llama.cpp's `truncated`).
    #[serde(skip)]
    pub context_full: bool,
    /// The generated token ids.
    #[serde(skip)]
    pub tokens: Vec<u32>,
    /// Tokens drafted by speculation (llama.cpp's name).
    pub draft_n: usize,
    /// Drafted tokens accepted.
    pub draft_n_accepted: usize,
    /// Tokens generated inside the answer's thinking block (OpenAI's `reasoning_tokens`).
    #[serde(skip)]
    pub reasoning_n: usize,
}

/// llama.cpp's `timings`: at the end of a generation, or while it runs (`timings_per_token`).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timings {
    /// Prompt tokens evaluated (not taken from the prefix cache).
    pub prompt_n: usize,
    /// Milliseconds spent on them.
    pub prompt_ms: f64,
    /// Their rate.
    pub prompt_per_second: f64,
    /// Tokens generated (so far).
    pub predicted_n: usize,
    /// Milliseconds spent generating (so far).
    pub predicted_ms: f64,
    /// Their rate.
    pub predicted_per_second: f64,
    /// Prompt tokens reused from the prefix cache.
    pub cache_n: usize,
}

impl Timings {
    /// The timings of `prompt_n` tokens evaluated in `prompt_ms` beside `cache_n` reused, and
    /// `predicted_n` generated in `predicted_ms`; the rates follow.
    fn new(
        (prompt_n, prompt_ms, cache_n): (usize, f64, usize),
        predicted_n: usize,
        predicted_ms: f64,
    ) -> Timings {
        Timings {
            prompt_n,
            prompt_ms,
            prompt_per_second: per_second(prompt_n, prompt_ms),
            predicted_n,
            predicted_ms,
            predicted_per_second: per_second(predicted_n, predicted_ms),
            cache_n,
        }
    }
}

/// llama.cpp's `prompt_progress`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct PromptProgress {
    /// The prompt's tokens.
    pub total: usize,
    /// Those taken from the prefix cache.
    pub cache: usize,
    /// Those in the cache now (taken or evaluated).
    pub processed: usize,
    /// Milliseconds since the prefill began.
    pub time_ms: u64,
}

/// Tokens per second.
fn per_second(n: usize, ms: f64) -> f64 {
    if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 }
}

/// The engine's recent speeds, from its own timings: the last request with at least
/// [`Speeds::MIN_TOKENS`] prompt tokens evaluated (prefill) or generated (decode), so a
/// health probe's one-token answer does not stand for the box's speed.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Speeds {
    /// Prompt tokens per second.
    pub prefill_tokens_per_second: Option<f64>,
    /// Generated tokens per second.
    pub decode_tokens_per_second: Option<f64>,
}

impl Speeds {
    /// Fewest tokens a request must have evaluated (or generated) to count.
    pub const MIN_TOKENS: usize = 16;

    fn record(&mut self, summary: &Summary) {
        let t = &summary.timings;
        if t.prompt_n >= Self::MIN_TOKENS {
            self.prefill_tokens_per_second = Some(t.prompt_per_second);
        }
        if t.predicted_n >= Self::MIN_TOKENS {
            self.decode_tokens_per_second = Some(t.predicted_per_second);
        }
    }
}

/// What the generation thread is doing, readable without waiting for it: a health check
/// must not queue behind a long answer, and a busy engine that makes progress is healthy.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Activity {
    /// A request is being generated right now.
    pub busy: bool,
    /// Tokens evaluated or generated since start (prompt and output): grows while work is done.
    pub tokens_processed: u64,
    /// Users' requests waiting behind the running one.
    pub queued: usize,
}

/// The counters behind [`Activity`], shared with the generation thread.
#[derive(Default)]
struct Progress {
    busy: AtomicBool,
    tokens: AtomicU64,
    stopping: AtomicBool,
}

impl Progress {
    fn advance(&self, tokens: usize) {
        self.tokens.fetch_add(tokens as u64, Ordering::Relaxed);
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Relaxed)
    }
}

/// Why a request was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue is full: try again shortly.
    Full,
    /// The generation thread is gone.
    Stopped,
}

/// The handle requests are submitted through.
#[derive(Clone)]
pub struct Worker {
    queue: Sender<Job>,
    waiting: Arc<Waiting>,
    speeds: Arc<Mutex<Speeds>>,
    progress: Arc<Progress>,
    /// Pass costs as the generation thread learns them, when speculation is on.
    learned: Option<Arc<Mutex<LearnedCosts>>>,
}

/// Jobs submitted and not yet started, per lane, against each lane's bound.
struct Waiting {
    user: AtomicUsize,
    user_bound: usize,
    control: AtomicUsize,
}

impl Waiting {
    fn count(&self, lane: Lane) -> (&AtomicUsize, usize) {
        match lane {
            Lane::User => (&self.user, self.user_bound),
            Lane::Control => (&self.control, CONTROL_QUEUE),
        }
    }

    /// Takes a place in `lane`, unless it is full.
    fn enter(&self, lane: Lane) -> bool {
        let (count, bound) = self.count(lane);
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < bound).then_some(n + 1)
            })
            .is_ok()
    }

    fn leave(&self, lane: Lane) {
        self.count(lane).0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Settings of the generation thread.
pub struct Settings {
    /// Context per conversation, in tokens.
    pub context: usize,
    /// Threads per pass.
    pub threads: usize,
    /// Requests waiting at most (beyond the one running).
    pub queue: usize,
    /// Memory for kept conversation caches (at least one is always kept).
    pub cache_bytes: usize,
    /// Tokens to prefill at start and keep (a configured system prompt), so a new chat that
    /// begins with them starts from there.
    pub warm: Vec<u32>,
    /// Whether requests may speculate.
    pub speculation: bool,
    /// The model's draft head: speculation drafts from it rather than from n-grams.
    pub head: Option<Arc<DraftHead<'static>>>,
    /// Whether a generation that fills the context drops half of it and goes on.
    pub context_shift: bool,
}

impl Worker {
    /// Starts the generation thread for `model`.
    pub fn start(
        model: Arc<Model<'static>>,
        tokenizer: Arc<Tokenizer>,
        end_ids: Vec<u32>,
        settings: &Settings,
        metrics: Arc<Metrics>,
    ) -> Worker {
        let (queue, jobs) = std::sync::mpsc::channel();
        let waiting = Arc::new(Waiting {
            user: AtomicUsize::new(0),
            user_bound: settings.queue.max(1),
            control: AtomicUsize::new(0),
        });
        let started = Arc::clone(&waiting);
        let (context, threads) = (settings.context, settings.threads);
        let (cache_bytes, warm) = (settings.cache_bytes, settings.warm.clone());
        let speeds = Arc::new(Mutex::new(Speeds::default()));
        let recorded = Arc::clone(&speeds);
        let progress = Arc::new(Progress::default());
        let reported = Arc::clone(&progress);
        // Learned from the passes requests run, so readiness waits for no timing.
        let learned = settings
            .speculation
            .then(|| Arc::new(Mutex::new(LearnedCosts::default())));
        let learning = learned.clone();
        let head = settings.head.clone();
        let context_shift = settings.context_shift;
        std::thread::Builder::new()
            .name("engine-generation".into())
            .spawn(move || {
                let mut caches = Caches::new(cache_bytes);
                if let Err(e) = caches.warm((&model, head.as_deref()), &warm, context, threads) {
                    eprintln!("warning: the system prompt was not prefilled: {e}");
                }
                let runner = Runner {
                    model: &model,
                    head: head.as_deref(),
                    tokenizer: &tokenizer,
                    end_ids: &end_ids,
                    context,
                    threads,
                    progress: &reported,
                    vocab: std::sync::OnceLock::new(),
                    metrics: &metrics,
                    learned: learning.as_deref(),
                    context_shift,
                };
                let mut queues = Queues {
                    jobs,
                    waiting: started,
                    user: VecDeque::new(),
                    control: VecDeque::new(),
                };
                runner.run(&mut queues, &mut caches, &recorded)
            })
            .map(|_| ())
            .unwrap_or_else(|e| eprintln!("error: cannot start the generation thread: {e}"));
        Worker {
            queue,
            waiting,
            speeds,
            progress,
            learned,
        }
    }

    /// What the generation thread is doing now.
    pub fn activity(&self) -> Activity {
        Activity {
            busy: self.progress.busy.load(Ordering::Relaxed),
            tokens_processed: self.progress.tokens.load(Ordering::Relaxed),
            queued: self.waiting.user.load(Ordering::Relaxed),
        }
    }

    /// Ends the running request and every queued one with [`Event::Failed`] (at the next
    /// token or prompt slice), and refuses new ones: the process is about to exit.
    pub fn shut_down(&self) {
        self.progress.stopping.store(true, Ordering::Relaxed);
    }

    /// What passes of 1, 2, … tokens cost in steps as learned so far, and how many widths
    /// have been timed (`None`: speculation is off).
    pub fn pass_costs(&self) -> Option<(Vec<f64>, usize)> {
        let learned = lock(self.learned.as_deref()?);
        Some((learned.costs().relative().to_vec(), learned.timed()))
    }

    /// The recent speeds.
    pub fn speeds(&self) -> Speeds {
        *lock(&self.speeds)
    }

    /// Takes a place in `lane`'s queue, or says why not: taken before a request's prompt is
    /// tokenized, so a request that would be refused costs no tokenizing.
    pub fn reserve(&self, lane: Lane) -> Result<Place, Refused> {
        if self.progress.stopping() {
            return Err(Refused::Stopped);
        }
        if !self.waiting.enter(lane) {
            return Err(Refused::Full);
        }
        Ok(Place {
            waiting: Arc::clone(&self.waiting),
            lane,
            taken: true,
        })
    }

    /// Queues `job` in the place taken for it.
    pub fn submit(&self, mut place: Place, job: Job) -> Result<(), Refused> {
        let lane = place.lane;
        if self.progress.stopping() {
            return Err(Refused::Stopped);
        }
        // The queue's count now follows the job; a send that fails gives the place back.
        place.taken = false;
        self.queue.send(Job { lane, ..job }).map_err(|_| {
            self.waiting.leave(lane);
            Refused::Stopped
        })
    }
}

/// A place in a lane's queue, held while the request's prompt is tokenized; given back when
/// dropped unless its job was submitted.
pub struct Place {
    waiting: Arc<Waiting>,
    lane: Lane,
    taken: bool,
}

impl Place {
    /// The lane the place is in.
    pub fn lane(&self) -> Lane {
        self.lane
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.taken {
            self.waiting.leave(self.lane);
        }
    }
}

/// The generation thread's side of the queue: the control lane first, then the users' in
/// the order they came.
struct Queues {
    jobs: Receiver<Job>,
    waiting: Arc<Waiting>,
    user: VecDeque<Job>,
    control: VecDeque<Job>,
}

impl Queues {
    /// The next job to run, waiting for one; `None` once every [`Worker`] is gone.
    fn next(&mut self) -> Option<Job> {
        if self.user.is_empty() && self.control.is_empty() {
            let job = self.jobs.recv().ok()?;
            self.sort(job);
        }
        while let Ok(job) = self.jobs.try_recv() {
            self.sort(job);
        }
        let job = self.control.pop_front().or_else(|| self.user.pop_front())?;
        self.waiting.leave(job.lane);
        Some(job)
    }

    fn sort(&mut self, job: Job) {
        match job.lane {
            Lane::User => self.user.push_back(job),
            Lane::Control => self.control.push_back(job),
        }
    }
}

/// `mutex`'s value, even if a thread panicked holding it (what it guards stays consistent
/// between statements: records and tables replaced whole).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the generation thread generates with.
struct Runner<'a> {
    model: &'a Model<'static>,
    /// The model's draft head, when drafts come from it.
    head: Option<&'a DraftHead<'static>>,
    tokenizer: &'a Tokenizer,
    end_ids: &'a [u32],
    context: usize,
    threads: usize,
    progress: &'a Progress,
    /// The vocabulary for grammars, built on the first request that has one.
    vocab: std::sync::OnceLock<Vocab>,
    metrics: &'a Metrics,
    /// Pass costs on this machine as learned so far, when speculation is on.
    learned: Option<&'a Mutex<LearnedCosts>>,
    /// Whether a full context is shifted (`--context-shift`).
    context_shift: bool,
}

impl Runner<'_> {
    fn run(&self, queues: &mut Queues, caches: &mut Caches, speeds: &Mutex<Speeds>) {
        while let Some(job) = queues.next() {
            if job.events.is_closed() {
                continue;
            }
            if self.progress.stopping() {
                let _ = job.events.send(Event::ShuttingDown);
                continue;
            }
            self.progress.busy.store(true, Ordering::Relaxed);
            for choice in 0..job.params.choices.max(1) {
                if !self.run_choice(&job, choice, caches, speeds) {
                    break;
                }
            }
            // Already idle unless a client left between choices.
            self.progress.busy.store(false, Ordering::Relaxed);
        }
    }

    /// One choice of `job`; false when the request ended (failed, gone, shutting down).
    fn run_choice(
        &self,
        job: &Job,
        choice: usize,
        caches: &mut Caches,
        speeds: &Mutex<Speeds>,
    ) -> bool {
        // Without `cache_prompt` only the request's own first choice prefills: the others
        // still start from its prompt.
        let kept = if job.params.reuse_prompt || choice > 0 {
            caches.best_for(&job.prompt)
        } else {
            None
        };
        let reused = match kept {
            Some(c) => Some(c),
            // No shared prefix: recycle the oldest cache's memory (its tokens do not matter).
            None => caches.recycle().map(|mut c| {
                c.tokens.clear();
                c
            }),
        };
        // A bug in one request must not take the box's only generation thread with it.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.generate(job, choice, reused)
        }))
        .unwrap_or_else(|_| Err("generation failed unexpectedly (see the engine log)".into()));
        match result {
            Ok((summary, kept)) => {
                caches.keep(kept);
                self.metrics
                    .finished(&summary, caches.kept_bytes(), caches.kept_count());
                lock(speeds).record(&summary);
                // Idle before the last answer leaves: a client that reads `/metrics` as soon as
                // it has its answer must not see its own request still processing.
                if choice + 1 >= job.params.choices.max(1) {
                    self.progress.busy.store(false, Ordering::Relaxed);
                }
                job.events.send(Event::Done { choice, summary }).is_ok()
            }
            Err(_) if self.progress.stopping() => {
                self.progress.busy.store(false, Ordering::Relaxed);
                let _ = job.events.send(Event::ShuttingDown);
                false
            }
            Err(message) => {
                self.metrics.failed();
                self.progress.busy.store(false, Ordering::Relaxed);
                let _ = job.events.send(Event::Failed(message));
                false
            }
        }
    }

    fn generate(
        &self,
        job: &Job,
        choice: usize,
        reused: Option<Cached>,
    ) -> Result<(Summary, Cached), Failure> {
        let Runner {
            model,
            tokenizer,
            end_ids,
            context,
            threads,
            progress,
            ..
        } = *self;
        let (prompt, params) = (&job.prompt, &job.params);
        if prompt.is_empty() || prompt.len() >= context {
            return Err(Failure::Engine(format!(
                "the prompt has {} tokens; the context holds {context}",
                prompt.len()
            )));
        }
        // At least the last prompt token runs, so there are logits to sample from.
        let (mut cache, cache_n) = match reused {
            Some(mut c) => {
                // A recurrent state resumes only where it can be rebuilt (a checkpoint, a
                // mark's record): maybe before the shared prefix ends.
                let n = common_prefix(&c.tokens, prompt).min(prompt.len() - 1);
                let n = c.cache.resume(n);
                (c.cache, n)
            }
            None => {
                let mut cache = KvCache::on_threads(&model.hparams, context, threads)?;
                if let Some(head) = self.head {
                    head.prepare(&mut cache);
                }
                (cache, 0)
            }
        };
        let started = Instant::now();
        let progressed = |processed: usize| {
            if params.report_progress {
                let _ = job.events.send(Event::Progress(PromptProgress {
                    total: prompt.len(),
                    cache: cache_n,
                    processed,
                    time_ms: started.elapsed().as_millis() as u64,
                }));
            }
        };
        progressed(cache_n);
        // One pass at a time (the same passes `forward` would make of the whole prompt), so a
        // client that leaves during a long prompt frees the engine soon and the progress the
        // health probe reads grows at least every pass.
        let slice = crate::model::MAX_BATCH;
        let mut at = cache_n;
        // A recurrent state is kept where a later request resumes: the end of a chat's last
        // turn (before the answer's cue, which a template may write differently once it is
        // history), else just before the prompt's last token (the same prompt again).
        let checkpoint_at = Some(job.turn_end.unwrap_or(prompt.len() - 1))
            .filter(|&p| cache.is_recurrent() && p > at && p < prompt.len());
        while at < prompt.len() {
            if job.events.is_closed() {
                return Err("the client went away".into());
            }
            if progress.stopping() {
                return Err("shutting down".into());
            }
            let mut end = (at + slice).min(prompt.len());
            if let Some(p) = checkpoint_at.filter(|&p| at < p && p < end) {
                end = p;
            }
            let logits = if end == prompt.len() {
                Logits::Last
            } else {
                Logits::None
            };
            model.forward(&prompt[at..end], at, &mut cache, logits)?;
            self.metrics.pass(end);
            progress.advance(end - at);
            at = end;
            progressed(at);
            if checkpoint_at == Some(at) {
                cache.checkpoint();
            }
        }
        let prompt_ms = started.elapsed().as_secs_f64() * 1e3;

        let generating = Instant::now();
        let chooser = Chooser {
            sampler: Sampler::new(Sampling {
                seed: params.sampling.seed.wrapping_add(choice as u64),
                ..params.sampling.clone()
            }),
            bias: &params.logit_bias,
            grammar: params
                .grammar
                .clone()
                .filter(|_| params.grammar_trigger.is_none())
                .map(Matcher::new),
            // A grammar from the first byte leaves no room for a block to be closed.
            budget: params
                .thinking_budget
                .as_ref()
                .filter(|_| params.grammar.is_none() || params.grammar_trigger.is_some())
                .map(ThinkingBudget::new),
            waiting: match (&params.grammar, &params.grammar_trigger) {
                (Some(g), Some(trigger)) => Some(GrammarTrigger::new(
                    Arc::clone(g),
                    trigger,
                    params.grammar_anchored,
                    params.thinking_block,
                )),
                _ => None,
            },
            vocab: params
                .grammar
                .as_ref()
                .map(|_| self.vocab.get_or_init(|| Vocab::new(tokenizer))),
            tokenizer,
            end_ids,
            ignore_eos: params.ignore_eos,
            logprobs: params.logprobs,
            post_sampling: params.post_sampling_probs,
        };
        let mut speculation = match (self.learned, params.draft_max) {
            (Some(learned), n_max) if n_max > 0 => {
                let costs = lock(learned).costs();
                Some(Speculation::new(n_max, params.draft_min, costs))
            }
            _ => None,
        };
        let mut sink = Answering {
            chooser,
            job,
            choice,
            progress,
            metrics: self.metrics,
            end_ids,
            tokenizer,
            stream: TextStream::new(),
            text: StopFilter::new(&params.stop),
            probs: Vec::new(),
            tokens: Vec::new(),
            chosen_probs: None,
            last_token: Instant::now(),
            finish: None,
            stopping_word: String::new(),
            unfollowable: None,
            prefill: (prompt.len() - cache_n, prompt_ms, cache_n),
            generating,
            emitted: 0,
            thought: params
                .thinking_block
                .map(|(thinking, open)| ThoughtSplitter::new(thinking, open)),
            reasoning_n: 0,
            undecided_n: 0,
        };
        let mut history = prompt.clone();
        // The generated tokens (the history may lose positions to a context shift).
        let mut produced: Vec<u32> = Vec::new();
        let mut shifted = false;
        let (end, in_cache) = loop {
            let before = history.len();
            let (end, in_cache) = decode(
                model,
                &mut cache,
                &mut history,
                params.max_tokens - produced.len(),
                context,
                speculation.as_mut(),
                self.head,
                &mut sink,
            )?;
            produced.extend_from_slice(&history[before..]);
            let full = end == End::Length && history.len() >= context;
            // An answer with no limit of its own stops after a few contexts' worth: shifting
            // would let it hold the generation thread for ever.
            let bound = params.max_tokens.min(SHIFTED_ANSWER_CONTEXTS * context);
            if !(full && produced.len() < bound && self.shifts(&cache)) {
                break (end, in_cache);
            }
            let keep = params.keep.min(prompt.len());
            match self.shift(&mut cache, &mut history, in_cache, keep)? {
                true => shifted = true,
                false => break (end, in_cache),
            }
        };
        if let (Some(learned), Some(s)) = (self.learned, &speculation) {
            lock(learned).learn(s);
        }
        if let Some(why) = sink.unfollowable.take() {
            return Err(Failure::Request(why));
        }
        let finish = match end {
            End::Length => Finish::Length,
            End::Sink => sink.finish.unwrap_or(Finish::Stop),
        };
        let context_full = shifted
            || (end == End::Length
                && history.len() >= context
                && produced.len() < params.max_tokens);
        if finish != Finish::Word {
            sink.stream.finish();
            let rest = sink.text.flush();
            if !rest.is_empty() || !sink.probs.is_empty() {
                sink.send(rest);
            }
        }
        let stopping_word = std::mem::take(&mut sink.stopping_word);
        let (draft_n, draft_n_accepted) = speculation.map_or((0, 0), |s| s.drafts());
        self.metrics.drafts(draft_n, draft_n_accepted);
        let generated = produced.len();
        let predicted_ms = generating.elapsed().as_secs_f64() * 1e3;
        let prompt_n = prompt.len() - cache_n;
        let tokens = produced;
        // After a shift the kept positions were computed beside the dropped ones: only the
        // kept head is a prefix a later request may reuse.
        let reusable = if shifted {
            params.keep.min(prompt.len())
        } else {
            in_cache
        };
        history.truncate(reusable.min(in_cache));
        Ok((
            Summary {
                finish,
                timings: Timings::new((prompt_n, prompt_ms, cache_n), generated, predicted_ms),
                stopping_word,
                context_full,
                tokens,
                draft_n,
                draft_n_accepted,
                reasoning_n: sink.reasoning_n,
            },
            Cached {
                cache,
                tokens: history,
            },
        ))
    }
}

/// The most contexts' worth of tokens an answer without a limit of its own generates when the
/// context shifts.
const SHIFTED_ANSWER_CONTEXTS: usize = 4;

impl Runner<'_> {
    /// Whether a full context is shifted for `cache`: `--context-shift`, and neither a
    /// recurrent state (which cannot forget positions) nor a draft head (whose own cache
    /// would not follow).
    fn shifts(&self, cache: &KvCache) -> bool {
        self.context_shift && !cache.is_recurrent() && self.head.is_none()
    }

    /// llama.cpp's context shift: the first `keep` tokens (BOS included) stay, half of the
    /// rest go, and the tokens not yet in the cache run at their new positions, so decoding
    /// goes on from their logits. False when there is nothing to drop.
    fn shift(
        &self,
        cache: &mut KvCache,
        history: &mut Vec<u32>,
        in_cache: usize,
        keep: usize,
    ) -> Result<bool, String> {
        // The last token's logits are needed again: it runs once more after the shift.
        let held = cache.resume(in_cache.min(history.len() - 1));
        let keep = keep
            .saturating_add(usize::from(self.tokenizer.adds_bos()))
            .min(held);
        let discard = (held - keep) / 2;
        if discard == 0 {
            return Ok(false);
        }
        self.model.shift(cache, keep, discard)?;
        history.drain(keep..keep + discard);
        let pending = held - discard;
        self.model
            .forward(&history[pending..], pending, cache, Logits::Last)?;
        Ok(true)
    }
}

/// One choice being answered: the chooser, the text stream with its stop strings, and the
/// events sent, as the decoding loop's sink.
struct Answering<'a> {
    chooser: Chooser<'a>,
    job: &'a Job,
    choice: usize,
    progress: &'a Progress,
    metrics: &'a Metrics,
    end_ids: &'a [u32],
    tokenizer: &'a Tokenizer,
    stream: TextStream,
    text: StopFilter<'a>,
    /// Probabilities of tokens whose text is not sent yet.
    probs: Vec<TokenProbs>,
    /// Tokens whose text is not sent yet.
    tokens: Vec<u32>,
    /// Those of the token just chosen.
    chosen_probs: Option<TokenProbs>,
    last_token: Instant,
    finish: Option<Finish>,
    stopping_word: String,
    /// Why the request could not be followed, when it could not.
    unfollowable: Option<String>,
    /// Prompt tokens evaluated, the milliseconds they took, and those taken from the cache.
    prefill: (usize, f64, usize),
    /// When generation began.
    generating: Instant,
    /// Tokens generated so far.
    emitted: usize,
    /// Where the answer stands in its thinking block, when it may have one.
    thought: Option<ThoughtSplitter>,
    /// Tokens generated inside the thinking block, its tags included.
    reasoning_n: usize,
    /// Tokens at the answer's start that may yet prove to be the block's opener.
    undecided_n: usize,
}

impl Answering<'_> {
    fn send(&mut self, text: String) {
        let probs = std::mem::take(&mut self.probs);
        let tokens = std::mem::take(&mut self.tokens);
        let timings = self.job.params.timings_per_token.then(|| {
            let predicted_ms = self.generating.elapsed().as_secs_f64() * 1e3;
            Timings::new(self.prefill, self.emitted, predicted_ms)
        });
        let _ = self.job.events.send(Event::Text {
            choice: self.choice,
            text,
            probs,
            tokens,
            timings,
        });
    }
}

impl Sink for Answering<'_> {
    fn choose(&mut self, logits: &[f32], history: &[u32]) -> Result<Option<u32>, String> {
        if self.job.events.is_closed() {
            self.finish = Some(Finish::Stop);
            return Ok(None);
        }
        if self.progress.stopping() {
            return Err("shutting down".into());
        }
        match self.chooser.next(logits, history)? {
            Choice::End => Ok(None),
            Choice::Unfollowable(why) => {
                self.unfollowable = Some(why);
                Ok(None)
            }
            Choice::Token(token, _) if self.end_ids.contains(&token) => Ok(None),
            Choice::Token(token, probs) => {
                self.chosen_probs = probs;
                Ok(Some(token))
            }
        }
    }

    fn emit(&mut self, token: u32, _history: &[u32]) -> Result<bool, String> {
        let now = Instant::now();
        if self.emitted == 0 {
            self.metrics.first_token(now - self.job.arrived);
        } else {
            self.metrics.next_token(now - self.last_token);
        }
        self.last_token = now;
        self.probs.extend(self.chosen_probs.take());
        self.tokens.push(token);
        self.emitted += 1;
        let piece = self.stream.push(&self.tokenizer.token_bytes(token));
        if let Some(thought) = &mut self.thought {
            let before = thought.thinking();
            thought.push(&piece);
            if thought.undecided() {
                // Perhaps an opener written over several tokens: counted once it opens.
                self.undecided_n += 1;
            } else {
                let undecided = std::mem::take(&mut self.undecided_n);
                if before || thought.thinking() {
                    self.reasoning_n += 1 + undecided;
                }
            }
        }
        let (ready, stopped) = self.text.push(&piece);
        if !ready.is_empty() {
            self.send(ready);
        }
        if let Some(word) = stopped {
            self.stopping_word = word;
            self.finish = Some(Finish::Word);
            return Ok(false);
        }
        Ok(true)
    }

    fn passed(&mut self, tokens: usize, len: usize) {
        self.metrics.pass(len);
        self.progress.advance(tokens);
    }
}
