//! The one generation thread: it owns the model's caches and runs one request at a time from a
//! bounded queue, streaming text back as it is produced. A request whose receiver is gone (the
//! client disconnected) stops at the next token.
//!
//! Prefix cache: the cache of the last conversation is kept with its tokens; a request that
//! starts with them only prefills the rest (reported as `cache_n`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::Serialize;
use tokio::sync::mpsc::UnboundedSender;

use crate::model::{KvCache, Logits, Model};
use crate::sampler::{Sampler, Sampling};
use crate::tokenizer::{TextStream, Tokenizer};

/// One generation request.
pub struct Job {
    /// Prompt token ids (BOS included where the model wants it).
    pub prompt: Vec<u32>,
    /// Sampler settings.
    pub sampling: Sampling,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Strings that end generation (not included in the text).
    pub stop: Vec<String>,
    /// Keep generating past end-of-generation tokens (llama.cpp's `ignore_eos`).
    pub ignore_eos: bool,
    /// Which queue it waits in.
    pub lane: Lane,
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

/// What a request hears back, in order: text deltas, then `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    /// The next piece of text (whole UTF-8 characters, never part of a stop string).
    Text(String),
    /// Generation ended.
    Done(Summary),
    /// Generation could not run.
    Failed(String),
    /// The engine is shutting down: the answer was cut off (or never started).
    ShuttingDown,
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

/// llama.cpp's `timings` object, plus the finish reason.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Why it ended.
    #[serde(skip)]
    pub finish: Finish,
    /// Prompt tokens evaluated (not taken from the prefix cache).
    pub prompt_n: usize,
    /// Milliseconds spent on them.
    pub prompt_ms: f64,
    /// Their rate.
    pub prompt_per_second: f64,
    /// Tokens generated.
    pub predicted_n: usize,
    /// Milliseconds spent generating.
    pub predicted_ms: f64,
    /// Their rate.
    pub predicted_per_second: f64,
    /// Prompt tokens reused from the prefix cache.
    pub cache_n: usize,
    /// The stop string that ended generation, if one did.
    #[serde(skip)]
    pub stopping_word: String,
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
        if summary.prompt_n >= Self::MIN_TOKENS {
            self.prefill_tokens_per_second = Some(summary.prompt_per_second);
        }
        if summary.predicted_n >= Self::MIN_TOKENS {
            self.decode_tokens_per_second = Some(summary.predicted_per_second);
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
}

impl Worker {
    /// Starts the generation thread for `model`.
    pub fn start(
        model: Arc<Model<'static>>,
        tokenizer: Arc<Tokenizer>,
        end_ids: Vec<u32>,
        settings: &Settings,
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
        std::thread::Builder::new()
            .name("engine-generation".into())
            .spawn(move || {
                let mut caches = Caches::new(cache_bytes);
                if let Err(e) = caches.warm(&model, &warm, context, threads) {
                    eprintln!("warning: the system prompt was not prefilled: {e}");
                }
                let runner = Runner {
                    model: &model,
                    tokenizer: &tokenizer,
                    end_ids: &end_ids,
                    context,
                    threads,
                    progress: &reported,
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

    /// The recent speeds.
    pub fn speeds(&self) -> Speeds {
        *self.speeds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job`, or says why not.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        if self.progress.stopping() {
            return Err(Refused::Stopped);
        }
        let lane = job.lane;
        if !self.waiting.enter(lane) {
            return Err(Refused::Full);
        }
        self.queue.send(job).map_err(|_| {
            self.waiting.leave(lane);
            Refused::Stopped
        })
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

/// A conversation's cache and the tokens it holds.
#[derive(Clone)]
struct Cached {
    cache: KvCache,
    tokens: Vec<u32>,
}

/// Kept conversation caches, least recently used first, within a memory budget; the warm
/// system-prompt cache is pinned and only ever copied.
struct Caches {
    budget: usize,
    kept: Vec<Cached>,
    pinned: Option<Cached>,
}

impl Caches {
    fn new(budget: usize) -> Caches {
        Caches {
            budget,
            kept: Vec::new(),
            pinned: None,
        }
    }

    fn warm(
        &mut self,
        model: &Model<'static>,
        tokens: &[u32],
        context: usize,
        threads: usize,
    ) -> Result<(), String> {
        if self.budget == 0 || tokens.is_empty() || tokens.len() >= context {
            return Ok(());
        }
        let mut cache = KvCache::on_threads(&model.hparams, context, threads)?;
        model.forward(tokens, 0, &mut cache, Logits::None)?;
        self.pinned = Some(Cached {
            cache,
            tokens: tokens.to_vec(),
        });
        Ok(())
    }

    /// The kept cache sharing the longest prefix with `prompt`, if any shares at least one
    /// token: taken out when the prompt continues it, else copied (always for the pinned one).
    fn best_for(&mut self, prompt: &[u32]) -> Option<Cached> {
        let (at, shared) = self
            .kept
            .iter()
            .enumerate()
            .map(|(i, c)| (i, common_prefix(&c.tokens, prompt)))
            .max_by_key(|&(i, n)| (n, i))
            .unwrap_or((0, 0));
        let pinned = self
            .pinned
            .as_ref()
            .map_or(0, |p| common_prefix(&p.tokens, prompt));
        if pinned >= shared {
            return self.pinned.clone().filter(|_| pinned > 0);
        }
        if shared == 0 {
            return None;
        }
        // A request that continues the conversation takes its cache; one that branches off
        // gets a copy, so the other conversation can still be picked up where it was.
        if shared == self.kept[at].tokens.len() {
            Some(self.kept.remove(at))
        } else {
            Some(self.kept[at].clone())
        }
    }

    /// Keeps `cached` as the most recent, evicting the oldest beyond the budget (one always
    /// stays, unless the budget is zero: no prefix cache).
    fn keep(&mut self, cached: Cached) {
        if self.budget == 0 {
            return;
        }
        self.kept.push(cached);
        let pinned = self.pinned.as_ref().map_or(0, |p| p.cache.bytes());
        while self.kept.len() > 1
            && pinned + self.kept.iter().map(|c| c.cache.bytes()).sum::<usize>() > self.budget
        {
            self.kept.remove(0);
        }
    }

    /// The oldest kept cache to recycle for a new conversation (its memory is reused).
    fn recycle(&mut self) -> Option<Cached> {
        let total: usize = self.kept.iter().map(|c| c.cache.bytes()).sum();
        let one = self.kept.first().map_or(0, |c| c.cache.bytes());
        (total + one > self.budget && !self.kept.is_empty()).then(|| self.kept.remove(0))
    }
}

/// Length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// What the generation thread generates with.
struct Runner<'a> {
    model: &'a Model<'static>,
    tokenizer: &'a Tokenizer,
    end_ids: &'a [u32],
    context: usize,
    threads: usize,
    progress: &'a Progress,
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
            let reused = match caches.best_for(&job.prompt) {
                Some(c) => Some(c),
                // No shared prefix: recycle the oldest cache's memory (its tokens do not matter).
                None => caches.recycle().map(|mut c| {
                    c.tokens.clear();
                    c
                }),
            };
            // A bug in one request must not take the box's only generation thread with it.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.generate(&job, reused)
            }))
            .unwrap_or_else(|_| Err("generation failed unexpectedly (see the engine log)".into()));
            match result {
                Ok((summary, kept)) => {
                    caches.keep(kept);
                    speeds
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .record(&summary);
                    let _ = job.events.send(Event::Done(summary));
                }
                Err(_) if self.progress.stopping() => {
                    let _ = job.events.send(Event::ShuttingDown);
                }
                Err(message) => {
                    let _ = job.events.send(Event::Failed(message));
                }
            }
            self.progress.busy.store(false, Ordering::Relaxed);
        }
    }

    fn generate(&self, job: &Job, reused: Option<Cached>) -> Result<(Summary, Cached), String> {
        let Runner {
            model,
            tokenizer,
            end_ids,
            context,
            threads,
            progress,
        } = *self;
        let prompt = &job.prompt;
        if prompt.is_empty() || prompt.len() >= context {
            return Err(format!(
                "the prompt has {} tokens; the context holds {context}",
                prompt.len()
            ));
        }
        // At least the last prompt token runs, so there are logits to sample from.
        let (mut cache, cache_n) = match reused {
            Some(c) => {
                let n = common_prefix(&c.tokens, prompt).min(prompt.len() - 1);
                (c.cache, n)
            }
            None => (KvCache::on_threads(&model.hparams, context, threads)?, 0),
        };
        let started = Instant::now();
        // One pass at a time (the same passes `forward` would make of the whole prompt), so a
        // client that leaves during a long prompt frees the engine soon and the progress the
        // health probe reads grows at least every pass.
        let slice = crate::model::MAX_BATCH;
        let mut at = cache_n;
        while at < prompt.len() {
            if job.events.is_closed() {
                return Err("the client went away".into());
            }
            if progress.stopping() {
                return Err("shutting down".into());
            }
            let end = (at + slice).min(prompt.len());
            let logits = if end == prompt.len() {
                Logits::Last
            } else {
                Logits::None
            };
            model.forward(&prompt[at..end], at, &mut cache, logits)?;
            progress.advance(end - at);
            at = end;
        }
        let prompt_ms = started.elapsed().as_secs_f64() * 1e3;

        let generating = Instant::now();
        let mut sampler = Sampler::new(job.sampling.clone());
        let mut history = prompt.clone();
        let mut in_cache = prompt.len();
        let mut stream = TextStream::new();
        let mut text = StopFilter::new(&job.stop);
        let mut generated = 0;
        let mut stopping_word = String::new();
        let finish = loop {
            if generated >= job.max_tokens || history.len() >= context {
                break Finish::Length;
            }
            if job.events.is_closed() {
                break Finish::Stop;
            }
            if progress.stopping() {
                return Err("shutting down".into());
            }
            let token = sampler.next(cache.logits(), &history);
            if !job.ignore_eos && end_ids.contains(&token) {
                break Finish::Stop;
            }
            generated += 1;
            history.push(token);
            let piece = stream.push(&tokenizer.token_bytes(token));
            let (ready, stopped) = text.push(&piece);
            if !ready.is_empty() {
                let _ = job.events.send(Event::Text(ready));
            }
            if let Some(word) = stopped {
                stopping_word = word;
                break Finish::Word;
            }
            if generated < job.max_tokens && history.len() < context {
                model.step(token, history.len() - 1, &mut cache)?;
                progress.advance(1);
                in_cache = history.len();
            }
        };
        if finish != Finish::Word {
            stream.finish();
            let rest = text.flush();
            if !rest.is_empty() {
                let _ = job.events.send(Event::Text(rest));
            }
        }
        let predicted_ms = generating.elapsed().as_secs_f64() * 1e3;
        let per_second = |n: usize, ms: f64| if ms > 0.0 { n as f64 * 1e3 / ms } else { 0.0 };
        let prompt_n = prompt.len() - cache_n;
        history.truncate(in_cache);
        Ok((
            Summary {
                finish,
                prompt_n,
                prompt_ms,
                prompt_per_second: per_second(prompt_n, prompt_ms),
                predicted_n: generated,
                predicted_ms,
                predicted_per_second: per_second(generated, predicted_ms),
                cache_n,
                stopping_word,
            },
            Cached {
                cache,
                tokens: history,
            },
        ))
    }
}

/// Holds back text that might be the start of a stop string, and cuts at the first stop string.
struct StopFilter<'a> {
    stops: &'a [String],
    pending: String,
}

impl<'a> StopFilter<'a> {
    fn new(stops: &'a [String]) -> StopFilter<'a> {
        StopFilter {
            stops,
            pending: String::new(),
        }
    }

    /// Adds `piece`; returns the text now safe to send and the stop string reached, if any.
    fn push(&mut self, piece: &str) -> (String, Option<String>) {
        self.pending.push_str(piece);
        let first_stop = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, word)) = first_stop {
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, Some(word.clone()));
        }
        // Keep the longest tail that is a prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len().min(self.pending.len() + 1))
                    .rev()
                    .filter(|&n| s.is_char_boundary(n))
                    .find(|&n| self.pending.ends_with(&s[..n]))
            })
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, None)
    }

    /// Whatever is held back, at the end.
    fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_cut_the_text_even_across_pieces() {
        let stops = vec!["END".to_string(), "\n\n".to_string()];
        let mut f = StopFilter::new(&stops);
        assert_eq!(f.push("Hello E"), ("Hello ".to_string(), None));
        assert_eq!(f.push("N"), (String::new(), None));
        assert_eq!(f.push("Dx"), (String::new(), Some("END".to_string())));
        let mut f = StopFilter::new(&stops);
        assert_eq!(f.push("a\n"), ("a".to_string(), None));
        assert_eq!(f.push("b"), ("\nb".to_string(), None));
        assert_eq!(
            f.push("\n\nrest"),
            (String::new(), Some("\n\n".to_string()))
        );
        let mut f = StopFilter::new(&[]);
        assert_eq!(f.push("free"), ("free".to_string(), None));
        assert_eq!(f.flush(), "");
    }

    #[test]
    fn held_back_text_is_released_at_the_end() {
        let stops = vec!["STOP".to_string()];
        let mut f = StopFilter::new(&stops);
        assert_eq!(f.push("ab ST"), ("ab ".to_string(), None));
        assert_eq!(f.flush(), "ST");
    }

    #[test]
    fn caches_pick_the_longest_shared_prefix() {
        let mut caches = Caches::new(usize::MAX);
        let empty = |tokens: Vec<u32>| Cached {
            cache: dummy_cache(),
            tokens,
        };
        caches.keep(empty(vec![1, 2, 3]));
        caches.keep(empty(vec![1, 2, 9, 9]));
        caches.keep(empty(vec![7]));
        // Branching off a conversation copies it; continuing one takes it.
        let best = caches.best_for(&[1, 2, 9, 5]).expect("shared");
        assert_eq!(best.tokens, vec![1, 2, 9, 9]);
        assert_eq!(caches.kept.len(), 3);
        let best = caches.best_for(&[1, 2, 9, 9, 4]).expect("continued");
        assert_eq!(best.tokens, vec![1, 2, 9, 9]);
        assert_eq!(caches.kept.len(), 2);
        assert!(caches.best_for(&[5, 5]).is_none());
        caches.pinned = Some(empty(vec![7, 8, 9]));
        assert_eq!(
            caches.best_for(&[7, 8, 1]).map(|c| c.tokens),
            Some(vec![7, 8, 9])
        );
        assert!(
            caches.pinned.is_some(),
            "the pinned cache is copied, never taken"
        );
    }

    fn dummy_cache() -> KvCache {
        let h = crate::model::Hparams {
            arch: crate::model::Arch::Llama,
            vocab: 4,
            n_embd: 8,
            n_layer: 1,
            n_head: 1,
            n_head_kv: 1,
            head_dim: 8,
            n_ff: 8,
            rms_eps: 1e-5,
            rope_base: 10_000.0,
            rope_base_swa: 10_000.0,
            n_rot: 8,
            sliding_window: None,
            attn_scale: 1.0,
            train_context: 16,
        };
        KvCache::new(&h, 4).expect("cache")
    }

    #[test]
    fn common_prefixes() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
    }
}
