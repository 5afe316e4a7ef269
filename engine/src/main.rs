//! `engine`: the inference engine's command line. Parsing only; each command is one function in
//! [`commands`].

mod commands;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use commands::available_cpus;
use engine::speculate::Source;

/// The Appliance inference engine.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Speculative decoding modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Spec {
    /// Drafts from the model's draft head (`--model-draft`), or its own nextn layer (Qwen
    /// 3.5's, chosen by default where the file holds one).
    Mtp,
    /// Drafts from n-grams of the sequence itself.
    Ngram,
    /// Plain decoding.
    None,
}

impl Spec {
    /// The source asked for: `--spec`, else `mtp` with a head file; `None` leaves it to the
    /// model (its own nextn layer drafts, else n-grams: [`Source::chosen`]).
    fn asked(spec: Option<Spec>, draft: Option<&Path>) -> Option<Source> {
        match (spec, draft) {
            (Some(Spec::Mtp), _) | (None, Some(_)) => Some(Source::Mtp),
            (Some(Spec::Ngram), _) => Some(Source::Ngram),
            (Some(Spec::None), _) => Some(Source::None),
            (None, None) => None,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of PROMPT.
    Generate(GenerateArgs),
    /// Print the token ids of TEXT.
    Tokenize(TokenizeArgs),
    /// Serve the OpenAI-compatible API (and llama.cpp's /completion).
    Serve(ServeArgs),
    /// Prompt-processing and generation speed, as llama-bench measures them.
    Bench(BenchArgs),
    /// Teacher-forced scoring: top-K log-probabilities at every position from N on.
    Score(ScoreArgs),
    /// Whether a model's files load, and the context that fits boards of each memory size
    /// (JSON).
    Fit(FitArgs),
}

/// `engine generate`'s arguments.
#[derive(clap::Args)]
struct GenerateArgs {
    /// The GGUF model.
    #[arg(short = 'm', long, required_unless_present = "installed")]
    model: Option<PathBuf>,
    /// The model the supervisor installed in the data directory instead of -m: the one
    /// installed there, or model ID (not verified: `supervisor weights verify --installed`).
    #[arg(long, value_name = "ID", conflicts_with = "model")]
    installed: Option<Option<String>>,
    /// The data directory --installed looks in (the supervisor's `[model] data_dir`).
    #[arg(
        long,
        value_name = "DIR",
        requires = "installed",
        default_value = engine::installed::DEFAULT_DATA_DIR
    )]
    data: PathBuf,
    /// The prompt text (special tokens written in it are recognised).
    #[arg(short = 'p', long)]
    prompt: String,
    /// Tokens to generate at most.
    #[arg(short = 'n', long, default_value_t = 64)]
    n_predict: usize,
    /// Temperature (0 = greedy).
    #[arg(long, default_value_t = 0.8)]
    temp: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Send the prompt as a user message through the model's chat template (ChatML if it has none).
    #[arg(long)]
    chat: bool,
    /// Speculative decoding (the same tokens either way): `mtp` checks the draft head's
    /// drafts (the default with --model-draft), `ngram` drafts looked up in the sequence
    /// itself (the default without; faster where the answer repeats its input).
    #[arg(long, value_enum)]
    spec: Option<Spec>,
    /// The model's draft head (Gemma 4's `gemma4-assistant` GGUF).
    #[arg(long, value_name = "FILE")]
    model_draft: Option<PathBuf>,
    /// Threads (default: the CPUs this process may use).
    #[arg(short = 't', long, value_parser = thread_count)]
    threads: Option<usize>,
    /// Context length in tokens.
    #[arg(short = 'c', long, default_value_t = 4096)]
    ctx_size: usize,
    /// JSON output: {"prompt_tokens":[…],"tokens":[…],"text":"…","stop":"eos|limit"}.
    #[arg(long)]
    json: bool,
    /// Memory the model and its context must fit, in MiB (default: this process's cgroup
    /// `memory.max` or the machine's RAM; 0: not checked).
    #[arg(long)]
    memory_limit: Option<u64>,
}

/// `engine tokenize`'s arguments.
#[derive(clap::Args)]
struct TokenizeArgs {
    /// The GGUF model.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Recognise special tokens written in the text.
    #[arg(long)]
    special: bool,
    /// The text.
    text: String,
    /// JSON output (the only format).
    #[arg(long)]
    json: bool,
}

/// `engine serve`'s arguments.
#[derive(clap::Args)]
struct ServeArgs {
    /// The GGUF model.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Address to listen on (beyond loopback an API key is required).
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// Port.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Threads (default: the CPUs this process may use).
    #[arg(short = 't', long, value_parser = thread_count)]
    threads: Option<usize>,
    /// Context per conversation, in tokens.
    #[arg(short = 'c', long, default_value_t = 4096)]
    ctx_size: usize,
    /// Requests that may wait behind the running one; more get 503 with Retry-After.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    queue: u16,
    /// Require `Authorization: Bearer KEY` (also from ENGINE_API_KEY).
    #[arg(long, env = "ENGINE_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Requests with `X-Engine-Control: KEY` skip the users' queue (for the supervisor's
    /// health probe and its own requests); only from the environment, never argv.
    #[arg(skip = std::env::var("ENGINE_CONTROL_KEY").ok())]
    control_key: Option<String>,
    /// Also serve the API on this Unix socket (made owner-only): a path for the
    /// supervisor's probe and chat that clients of the TCP port cannot fill.
    #[arg(long)]
    control_socket: Option<PathBuf>,
    /// A file holding the system prompt for chats that bring none (prefilled at start).
    #[arg(long)]
    system_prompt: Option<PathBuf>,
    /// Names the model answers to, separated by commas; `/v1/models` lists them all, its id
    /// is the first in alphabetical order (default: the file name).
    #[arg(long)]
    alias: Option<String>,
    /// Memory for the caches of recent conversations, in MiB (at least one is kept), so a
    /// follow-up message only prefills what is new; 0 turns the prefix cache off.
    #[arg(long, default_value_t = 512)]
    cache_mib: usize,
    /// Tokens a request generates at most when it does not say (−1: until an end token
    /// or the context is full).
    #[arg(short = 'n', long, default_value_t = 512, allow_negative_numbers = true, value_parser = n_predict)]
    n_predict: i64,
    /// Temperature for requests that do not say (0 = greedy).
    #[arg(long, default_value_t = 0.8, value_parser = temperature)]
    temp: f32,
    /// Nucleus sampling for requests that do not say (1 = off; llama.cpp's default).
    #[arg(long, default_value_t = 0.95, value_parser = probability)]
    top_p: f32,
    /// Top-k sampling for requests that do not say (0 = off; llama.cpp's default).
    #[arg(long, default_value_t = 40)]
    top_k: usize,
    /// Min-p sampling for requests that do not say (0 = off; llama.cpp's default 0.05).
    #[arg(long, default_value_t = 0.05, value_parser = probability)]
    min_p: f32,
    /// Seed for requests that do not give one (−1: a fresh seed per request).
    #[arg(short = 's', long, default_value_t = -1, allow_negative_numbers = true)]
    seed: i64,
    /// A Jinja chat template to use instead of the model's.
    #[arg(long)]
    chat_template_file: Option<PathBuf>,
    /// Whether chats think when a request does not say (`enable_thinking`): on, off, or auto
    /// (the template's own default). Off by default: on a Pi a thinking block costs more time
    /// than most answers.
    #[arg(long, default_value = "off")]
    reasoning: engine::reasoning::ThinkingDefault,
    /// Where a thinking model's reasoning goes, for requests that do not say: none (left in
    /// the content), auto or deepseek (`reasoning_content`), deepseek-legacy (both).
    #[arg(long, default_value = "auto")]
    reasoning_format: engine::reasoning::Format,
    /// Thinking tokens at most, then the block is closed and the answer follows (−1: no bound;
    /// 0: no thinking).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    reasoning_budget: i64,
    /// Speculative decoding for requests (`speculative.n_max` per request; 0 turns it off),
    /// the same tokens either way: `mtp` checks the draft head's drafts (the default with
    /// --model-draft), `ngram` drafts looked up in the sequence itself (the default without).
    #[arg(long, value_enum)]
    spec: Option<Spec>,
    /// The model's draft head (Gemma 4's `gemma4-assistant` GGUF), verified to fit the model.
    #[arg(long, value_name = "FILE")]
    model_draft: Option<PathBuf>,
    /// Browser origins allowed to call the API (CORS): `*`, or origins such as
    /// `http://192.168.1.20:3000` separated by commas. Default: none.
    #[arg(long, default_value = "", value_parser = cors_origins)]
    cors_origins: engine::server::CorsOrigins,
    /// Serve `GET /slots` (the generation slot's state, behind the API key), as llama-server's
    /// `--slots`; without it `/slots` answers 501.
    #[arg(long)]
    slots: bool,
    /// Tags `/v1/models` lists for the model, separated by commas (llama-server's `--tags`).
    #[arg(long)]
    tags: Option<String>,
    /// Add `__verbose` (the prompt as rendered) to whole chat, `/completion` and `/infill`
    /// answers, as llama-server's `--verbose` does; a request alone asks for it with
    /// `"verbose": true`.
    #[arg(long)]
    verbose: bool,
    /// When an answer fills the context, drop the older half of it (after the request's
    /// `n_keep` tokens) and go on, as llama-server's `--context-shift`; the answer reports
    /// `truncated`. Off: the answer ends there (`finish_reason` length). Models with a
    /// recurrent state (Qwen 3.5) and drafts from a draft head never shift.
    #[arg(long)]
    context_shift: bool,
    /// Memory the model, its context and the kept conversations must fit, in MiB (default:
    /// this process's cgroup `memory.max` or the machine's RAM; 0: not checked).
    #[arg(long)]
    memory_limit: Option<u64>,
}

/// `engine fit`'s arguments.
#[derive(clap::Args)]
struct FitArgs {
    /// The GGUF model.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Its draft head (Gemma 4's MTP assistant), loaded against the model.
    #[arg(long, value_name = "FILE")]
    model_draft: Option<PathBuf>,
    /// Context per conversation to check (default: the model's trained context, at most
    /// 8192).
    #[arg(short = 'c', long)]
    ctx_size: Option<usize>,
    /// MiB for kept conversations, as `engine serve --cache-mib`.
    #[arg(long, default_value_t = 512)]
    cache_mib: usize,
    /// Board memory sizes in GiB, comma-separated.
    #[arg(long = "boards", value_delimiter = ',', default_value = "4,8,16")]
    boards_gib: Vec<u64>,
    /// MiB of a board's memory the system and the supervisor keep.
    #[arg(long, default_value_t = 768)]
    reserve_mib: u64,
}

/// `engine bench`'s arguments.
#[derive(clap::Args)]
struct BenchArgs {
    /// The GGUF model.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// Prompt tokens per prompt-processing run, comma-separated as llama-bench's `-p`
    /// (0 skips; 1 to 5 time the passes that check drafts).
    #[arg(short = 'p', long, value_delimiter = ',', default_value = "128")]
    prompt: Vec<usize>,
    /// Tokens per generation run (0 skips).
    #[arg(short = 'n', long, default_value_t = 64)]
    generate: usize,
    /// Positions filled (untimed) before each prompt and generation run, comma-separated,
    /// as llama-bench's `-d`: speed after a long document.
    #[arg(
        short = 'd',
        long = "depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    depths: Vec<usize>,
    /// Thread counts, comma-separated (default: the CPUs this process may use).
    #[arg(short = 't', long, value_delimiter = ',', value_parser = thread_count)]
    threads: Vec<usize>,
    /// Repetitions per row.
    #[arg(short = 'r', long, default_value_t = 5)]
    repetitions: usize,
    /// Also time single passes of these widths (comma-separated), every token's logits
    /// computed, after each `-d` depth (at least 64 positions): what checking a draft costs
    /// after a long document. Each is timed back to back with passes like it, as decoding
    /// runs them (the mean of 8, after 3 untimed).
    #[arg(long, value_delimiter = ',')]
    batch: Vec<usize>,
    /// A JSON list of rows with llama-bench's field names instead of the table.
    #[arg(long)]
    json: bool,
    /// `ngram` adds greedy decoding rows after a real chat prompt, plain (`greedyN`) and
    /// with n-gram speculation (`greedyN+ngram`), repetitions alternating, with the time of
    /// their passes in the decoding loop by width. `mtp` with `--batch` times the model's
    /// own nextn layer (Qwen 3.5) as `--model-draft` times a head file.
    #[arg(long, value_enum, default_value_t = Spec::None)]
    spec: Spec,
    /// The user message of that chat (default: quote the treatment and follow-up of a
    /// built-in discharge summary, which answers mostly by quoting).
    #[arg(long, requires = "spec")]
    spec_prompt: Option<PathBuf>,
    /// A draft head (Gemma 4's `gemma4-assistant` GGUF): adds a row timing its step after
    /// each depth's passes and, with passes of 1 and more tokens (`--batch 1,2,3`), the
    /// depth the planner picks for it at acceptance rates from 0.5 to 0.9.
    #[arg(long, value_name = "FILE")]
    model_draft: Option<PathBuf>,
}

/// `engine score`'s arguments.
#[derive(clap::Args)]
struct ScoreArgs {
    /// The GGUF model.
    #[arg(short = 'm', long)]
    model: PathBuf,
    /// A JSON array of token ids.
    #[arg(long)]
    ids: PathBuf,
    /// First position to report (the distribution that predicts ids[N]).
    #[arg(long)]
    from: usize,
    /// Candidates per position.
    #[arg(long, default_value_t = 5)]
    top: usize,
    /// JSON output (the only format).
    #[arg(long)]
    json: bool,
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Generate(args) => commands::generate::run(args),
        Command::Tokenize(args) => commands::tokenize::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Score(args) => commands::score::run(args),
        Command::Fit(args) => commands::fit::run(args),
    }
}

/// Most threads accepted: far beyond any board this runs on, and small enough that per-thread
/// buffers can never overflow an allocation.
const MAX_THREADS: usize = 256;

/// `-t`: a thread count from 1 to [`MAX_THREADS`].
fn thread_count(arg: &str) -> Result<usize, String> {
    match arg.parse::<usize>() {
        Ok(n) if (1..=MAX_THREADS).contains(&n) => Ok(n),
        _ => Err(format!(
            "`{arg}` is not a thread count: give a whole number from 1 to {MAX_THREADS} (this \
             machine has {} CPUs available)",
            available_cpus()
        )),
    }
}

fn n_predict(text: &str) -> Result<i64, String> {
    match text.parse::<i64>() {
        Ok(n) if n == -1 || n >= 1 => Ok(n),
        _ => Err(format!(
            "{text} is not a token count (at least 1, or -1 for no limit)"
        )),
    }
}

fn probability(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("{text} is not a probability (0 to 1)")),
    }
}

fn temperature(text: &str) -> Result<f32, String> {
    match text.parse::<f32>() {
        Ok(t) if (0.0..=100.0).contains(&t) => Ok(t),
        _ => Err(format!("{text} is not a temperature (0 to 100)")),
    }
}

fn cors_origins(text: &str) -> Result<engine::server::CorsOrigins, String> {
    engine::server::CorsOrigins::parse(text)
}
