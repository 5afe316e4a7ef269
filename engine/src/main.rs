//! `engine`: the inference engine's command line. Parsing only; each command is one library call.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use std::io::Write as _;

use clap::{Parser, Subcommand};
use engine::chat::{ChatTemplate, Message};
use engine::model::{DraftHead, Model};
use engine::model_file::ModelFile;
use engine::sampler::{Sampler, Sampling};
use engine::speculate::Source;
use engine::tokenizer::{TextStream, Tokenizer};

/// The Appliance inference engine.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// What `engine generate` produced.
struct Generated {
    ids: Vec<u32>,
    tokens: Vec<u32>,
    stop: engine::generate::Stop,
    text: String,
    /// Tokens drafted and accepted, when speculating.
    drafts: Option<(usize, usize)>,
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
    Generate {
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
    },
    /// Print the token ids of TEXT.
    Tokenize {
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
    },
    /// Serve the OpenAI-compatible API (and llama.cpp's /completion).
    Serve {
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
        /// Model id reported to clients (default: the file name).
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
        /// Memory the model, its context and the kept conversations must fit, in MiB (default:
        /// this process's cgroup `memory.max` or the machine's RAM; 0: not checked).
        #[arg(long)]
        memory_limit: Option<u64>,
    },
    /// Prompt-processing and generation speed, as llama-bench measures them.
    Bench {
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
    },
    /// Teacher-forced scoring: top-K log-probabilities at every position from N on.
    Score {
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
    },
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

fn open(path: &std::path::Path) -> Result<ModelFile, ExitCode> {
    ModelFile::open(path).map_err(fail)
}

fn main() -> ExitCode {
    match Cli::parse().command {
        Command::Tokenize {
            model,
            special,
            text,
            json: _,
        } => {
            let file = match open(&model) {
                Ok(f) => f,
                Err(code) => return code,
            };
            match Tokenizer::load(&file) {
                Ok(tok) => {
                    println!("{}", serde_json::json!(tok.encode(&text, special)));
                    ExitCode::SUCCESS
                }
                Err(e) => fail(format!("{}: {e}", model.display())),
            }
        }
        Command::Generate {
            model,
            installed,
            data,
            prompt,
            n_predict,
            temp,
            seed,
            chat,
            spec,
            model_draft,
            threads,
            ctx_size,
            json,
            memory_limit,
        } => {
            let asked = Spec::asked(spec, model_draft.as_deref());
            let head_file = match model_draft
                .as_deref()
                .filter(|_| asked == Some(Source::Mtp))
            {
                Some(path) => match open(path) {
                    Ok(f) => Some(f),
                    Err(code) => return code,
                },
                None => None,
            };
            let model = match (model, installed) {
                (Some(model), _) => model,
                (None, id) => match engine::installed::resolve(&data, id.flatten().as_deref()) {
                    Ok(model) => model,
                    Err(e) => return fail(e),
                },
            };
            let file = match open(&model) {
                Ok(f) => f,
                Err(code) => return code,
            };
            let threads = threads.unwrap_or_else(available_cpus);
            let run = || -> Result<Generated, String> {
                let tok =
                    Tokenizer::load(&file).map_err(|e| format!("{}: {e}", model.display()))?;
                let m = Model::load(&file).map_err(|e| e.to_string())?;
                if let Some(limit) = memory_limit_of(memory_limit) {
                    engine::memory::Need::of(&m, file.bytes().len() as u64, ctx_size, 0)?
                        .fits(&limit)?;
                }
                let ids = if chat {
                    ChatTemplate::from_model(&file, &tok)?
                        .prompt_ids(&tok, &[Message::new("user", &prompt)])?
                } else {
                    tok.encode(&prompt, true)
                };
                let mut sampler = Sampler::new(Sampling {
                    temperature: temp,
                    seed,
                    ..Sampling::default()
                });
                let mut stream = TextStream::new();
                let mut text = String::new();
                let mut stdout = std::io::stdout();
                let mut show = |token: u32| {
                    let piece = stream.push(&tok.token_bytes(token));
                    if !json {
                        let _ = write!(stdout, "{piece}");
                        let _ = stdout.flush();
                    }
                    text.push_str(&piece);
                };
                let own = DraftHead::nextn(&m);
                let source = Source::chosen(asked, head_file.is_some() || own.is_some());
                let head = match (&head_file, source) {
                    (Some(f), _) => Some(DraftHead::load(f, &m).map_err(|e| e.to_string())?),
                    (None, Source::Mtp) => Some(own.ok_or(engine::server::NO_DRAFT_SOURCE)?),
                    (None, _) => None,
                };
                let mut speculation = (source != Source::None).then(|| {
                    engine::speculate::Speculation::new(
                        engine::speculate::MAX_DRAFT,
                        0,
                        engine::speculate::Costs::prior(),
                    )
                });
                let (tokens, stop) = engine::generate::generate(
                    &m,
                    &ids,
                    engine::generate::Budget {
                        limit: n_predict,
                        context: ctx_size,
                        threads,
                    },
                    &mut sampler,
                    &tok.end_ids(&file),
                    speculation.as_mut(),
                    head.as_ref(),
                    &mut show,
                )?;
                // A character the limit cut in half is not text: it is dropped, not shown as U+FFFD.
                stream.finish();
                if !json {
                    println!();
                }
                let drafts = speculation.map(|s| s.drafts());
                Ok(Generated {
                    ids,
                    tokens,
                    stop,
                    text,
                    drafts,
                })
            };
            match run() {
                Ok(Generated {
                    ids,
                    tokens,
                    stop,
                    text,
                    drafts,
                }) => {
                    if json {
                        println!(
                            "{}",
                            serde_json::json!({
                                "prompt_tokens": ids, "tokens": tokens, "text": text, "stop": stop,
                                "draft_n": drafts.map(|d| d.0), "draft_n_accepted": drafts.map(|d| d.1),
                            })
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
        Command::Serve {
            model,
            host,
            port,
            threads,
            ctx_size,
            queue,
            api_key,
            control_key,
            control_socket,
            system_prompt,
            alias,
            cache_mib,
            n_predict,
            temp,
            top_p,
            top_k,
            min_p,
            seed,
            chat_template_file,
            cors_origins,
            spec,
            model_draft,
            memory_limit,
        } => {
            let asked = Spec::asked(spec, model_draft.as_deref());
            let chat_template = match chat_template_file.map(|p| {
                std::fs::read_to_string(&p)
                    .map_err(|e| format!("--chat-template-file {}: {e}", p.display()))
            }) {
                Some(Err(e)) => return fail(e),
                Some(Ok(text)) => Some(text),
                None => None,
            };
            let system_prompt = match system_prompt.map(|p| {
                std::fs::read_to_string(&p)
                    .map(|t| t.trim_end().to_string())
                    .map_err(|e| format!("--system-prompt {}: {e}", p.display()))
            }) {
                Some(Err(e)) => return fail(e),
                Some(Ok(text)) => Some(text).filter(|t| !t.is_empty()),
                None => None,
            };
            match engine::server::serve(engine::server::ServeConfig {
                model,
                listen: std::net::SocketAddr::new(host, port),
                threads: threads.unwrap_or_else(available_cpus),
                context: ctx_size,
                queue: usize::from(queue),
                api_key: api_key.filter(|k| !k.is_empty()),
                control_key: control_key.filter(|k| !k.is_empty()),
                control_socket,
                system_prompt,
                model_id: alias,
                cache_mib,
                defaults: engine::server::request::Defaults {
                    max_tokens: usize::try_from(n_predict).ok(),
                    temperature: temp,
                    top_p,
                    top_k,
                    min_p,
                    seed: u64::try_from(seed).ok(),
                },
                chat_template,
                cors: cors_origins,
                speculation: asked,
                model_draft,
                memory_limit: memory_limit_of(memory_limit),
            }) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(e),
            }
        }
        Command::Bench {
            model,
            prompt,
            generate,
            depths,
            threads,
            repetitions,
            batch,
            json,
            spec,
            spec_prompt,
            model_draft,
        } => {
            let file = match open(&model) {
                Ok(f) => f,
                Err(code) => return code,
            };
            let loaded = match Model::load(&file) {
                Ok(m) => m,
                Err(e) => return fail(e),
            };
            let head_file = match model_draft.as_deref().map(open).transpose() {
                Ok(f) => f,
                Err(code) => return code,
            };
            let head = match head_file
                .as_ref()
                .map(|f| DraftHead::load(f, &loaded))
                .transpose()
            {
                Ok(head) => head,
                Err(e) => return fail(e),
            };
            // Without a head file, `--spec mtp` times the model's own nextn layer.
            let head = match (head, spec) {
                (None, Spec::Mtp) => match DraftHead::nextn(&loaded) {
                    Some(head) => Some(head),
                    None => return fail(engine::server::NO_DRAFT_SOURCE),
                },
                (head, _) => head,
            };
            let speculation = match spec {
                Spec::None => None,
                Spec::Mtp if batch.is_empty() => {
                    return fail(
                        "engine bench times n-gram speculation (--spec ngram); a draft \
                         source's steps and the depth the planner picks for it are timed with \
                         --batch 1,2,3,4,5 (and --model-draft FILE, or --spec mtp for a model's \
                         own nextn layer)",
                    );
                }
                Spec::Mtp => None,
                Spec::Ngram => match bench_chat(&file, &model, spec_prompt.as_deref()) {
                    Ok(ids) => Some(ids),
                    Err(e) => return fail(e),
                },
            };
            let threads = if threads.is_empty() {
                vec![available_cpus()]
            } else {
                threads
            };
            let plan = engine::bench::Plan {
                prompts: prompt,
                generate,
                depths,
                threads,
                repetitions,
                batches: batch,
                speculation,
            };
            let rows = match engine::bench::run(&loaded, head.as_ref(), &plan) {
                Ok(rows) => rows,
                Err(e) => return fail(e),
            };
            let peak = engine::memory::peak_rss()
                .map(|b| format!("peak RSS: {:.1} MiB", b as f64 / f64::from(1 << 20)));
            if json {
                println!("{}", serde_json::json!(rows));
                if let Some(peak) = &peak {
                    eprintln!("{peak}");
                }
            } else {
                let name = model
                    .file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default();
                println!(
                    "| model | threads | test | t/s | ms/pass | accepted / drafted |\n\
                     | --- | ---: | ---: | ---: | ---: | ---: |"
                );
                for row in &rows {
                    let ms = match (&row.avg_ms, &row.passes) {
                        (Some(m), _) => format!("{m:.2}"),
                        (None, Some(passes)) => engine::bench::loop_summary(passes),
                        (None, None) => String::new(),
                    };
                    let drafts = row
                        .drafts
                        .map(|(drafted, accepted)| format!("{accepted} / {drafted}"))
                        .unwrap_or_default();
                    println!(
                        "| {name} | {} | {} | {:.2} ± {:.2} | {ms} | {drafts} |",
                        row.n_threads,
                        row.test_name(),
                        row.avg_ts,
                        row.stddev_ts
                    );
                }
                print_planner_depths(&rows, &plan.threads);
                if let Some(peak) = &peak {
                    println!("\n{peak}");
                }
            }
            ExitCode::SUCCESS
        }
        Command::Score {
            model,
            ids,
            from,
            top,
            json: _,
        } => {
            let file = match ModelFile::open(&model) {
                Ok(f) => f,
                Err(e) => return fail(e),
            };
            let model = match Model::load(&file) {
                Ok(m) => m,
                Err(e) => return fail(e),
            };
            let ids: Vec<u32> = match std::fs::read_to_string(&ids)
                .map_err(|e| format!("{}: {e}", ids.display()))
                .and_then(|t| {
                    serde_json::from_str(&t).map_err(|e| {
                        format!("{}: not a JSON array of token ids: {e}", ids.display())
                    })
                }) {
                Ok(ids) => ids,
                Err(e) => return fail(e),
            };
            match engine::score::score(&model, &ids, from, top) {
                Ok(positions) => {
                    println!("{}", serde_json::json!({ "positions": positions }));
                    ExitCode::SUCCESS
                }
                Err(e) => fail(e),
            }
        }
    }
}

/// The depth the planner picks for a draft head from the rows' timed passes and head steps,
/// per thread count, at acceptance rates 0.5 to 0.9 (nothing without a head row).
fn print_planner_depths(rows: &[engine::bench::Row], threads: &[usize]) {
    const RATES: [f64; 5] = [0.5, 0.6, 0.7, 0.8, 0.9];
    let table: Vec<(usize, Vec<usize>)> = threads
        .iter()
        .filter_map(|&t| Some((t, engine::bench::planner_depths(rows, t, &RATES)?)))
        .collect();
    if table.is_empty() {
        return;
    }
    let header: Vec<String> = RATES.iter().map(|r| format!("{r:.1}")).collect();
    println!(
        "\nDraft depth the planner picks, by acceptance rate:\n\n| threads | {} |\n| ---: |{}",
        header.join(" | "),
        " ---: |".repeat(RATES.len())
    );
    for (t, depths) in table {
        let cells: Vec<String> = depths.iter().map(ToString::to_string).collect();
        println!("| {t} | {} |", cells.join(" | "));
    }
}

/// The CPUs this process may run on (affinity and cgroup quota included), at least 1.
fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
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

/// What `engine bench --spec` asks when no prompt is given: an answer that is mostly quoted.
const QUOTING_PROMPT: &str = "Discharge summary. Patient: Maria Keller, born 1958-04-17, admitted \
2026-11-20 with community-acquired pneumonia of the right lower lobe. Treatment: \
amoxicillin-clavulanate 875/125 mg twice daily for seven days, oxygen by nasal cannula for the \
first two days. Course: fever settled on day three; CRP fell from 148 to 22 mg/L. Discharged \
2026-11-26 in good condition. Follow-up: chest X-ray in six weeks at the Lindenstrasse practice; \
see the GP within one week.\n\nQuote the treatment and the follow-up sentences of this summary \
word for word.";

/// The token ids of a one-message chat for `engine bench --spec`: the text of `prompt` (or
/// the built-in quoting request) rendered with the model's chat template.
fn bench_chat(file: &ModelFile, model: &Path, prompt: Option<&Path>) -> Result<Vec<u32>, String> {
    let text = match prompt {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("--spec-prompt {}: {e}", path.display()))?,
        None => QUOTING_PROMPT.to_string(),
    };
    let tok = Tokenizer::load(file).map_err(|e| format!("{}: {e}", model.display()))?;
    ChatTemplate::from_model(file, &tok)?.prompt_ids(&tok, &[Message::new("user", &text)])
}

/// The memory limit to check against: `--memory-limit` in MiB (0: none), else what this
/// process's cgroup and the machine allow.
fn memory_limit_of(mib: Option<u64>) -> Option<engine::memory::Limit> {
    match mib {
        Some(0) => None,
        Some(mib) => Some(engine::memory::Limit::given(mib)),
        None => engine::memory::Limit::detect(Path::new("/")),
    }
}
