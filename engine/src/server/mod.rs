//! `engine serve`: the OpenAI-compatible HTTP API (and llama.cpp's native endpoints) over
//! one model, one generation at a time from a bounded queue.
//!
//! Handlers only translate: a request becomes token ids and [`worker::Params`], the
//! generation thread ([`worker`]) produces text events, and the handler shapes them into a
//! JSON body or server-sent events ([`stream`]). Every refusal is an [`error::ApiError`].
//! Anything bound beyond loopback needs an API key ([`auth`]).

mod answer;
pub mod auth;
pub mod error;
mod generation;
mod infill;
pub mod metrics;
mod native;
mod openai;
pub mod request;
mod responses;
mod stream;
mod tokenizing;
pub mod worker;

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::chat::{ChatTemplate, Message};
use crate::tokenizer::Tokenizer;
pub use auth::{CONTROL_HEADER, CorsOrigins, is_loopback, key_hash};
use error::ApiError;
use request::Defaults;
use worker::Worker;

/// What the handlers need once the model is loaded.
pub struct Ready {
    /// The generation thread.
    pub worker: Worker,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Its chat template (ChatML when it has none).
    pub template: ChatTemplate,
    /// Context per conversation.
    pub context: usize,
    /// A system prompt put first in chats that bring none.
    pub system_prompt: Option<String>,
    /// What requests that leave a field out get.
    pub defaults: Defaults,
    /// Where drafts come from.
    pub speculation: crate::speculate::Source,
    /// The tokens that end a generation (banned by `ignore_eos`).
    pub end_ids: Vec<u32>,
}

/// `--alias` or `--tags` as names: separated by commas, trimmed, each once, in alphabetical
/// order.
fn names(text: Option<&str>) -> Vec<String> {
    let names: std::collections::BTreeSet<String> = text
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(str::to_string)
        .collect();
    names.into_iter().collect()
}

/// Shared handler state.
#[derive(Clone)]
pub struct AppState {
    /// Set once loading finishes; until then generation endpoints answer 503.
    pub ready: Arc<OnceLock<Ready>>,
    /// The id `/v1/models` reports.
    pub model_id: Arc<str>,
    /// Every `--alias` the model answers to, in order (the first is `model_id`).
    pub aliases: Arc<[String]>,
    /// The model file (for `/props`).
    pub model_path: Arc<std::path::Path>,
    /// OpenAI's `system_fingerprint`: this engine's version with this model and context.
    pub fingerprint: Arc<str>,
    /// SHA-256 of the API key, when one is required.
    pub api_key_sha256: Option<[u8; 32]>,
    /// SHA-256 of the control key, when the engine has one (its supervisor's requests).
    pub control_key_sha256: Option<[u8; 32]>,
    /// The counters and histograms `/metrics` reports.
    pub metrics: Arc<metrics::Metrics>,
    /// The budget of text tokenized at once, shared by every route that tokenizes.
    pub tokenizing: tokenizing::Gate,
    /// Whether `GET /slots` is served.
    pub slots: bool,
    /// The model's `--tags`, listed in `/v1/models`.
    pub tags: Arc<[String]>,
    /// Whether every whole answer carries `__verbose` (`--verbose`).
    pub verbose: bool,
}

/// The router of every endpoint. OpenAI's routes are served with and without `/v1`, as
/// llama.cpp serves them (clients differ in which they call).
pub fn router(state: AppState, cors: &CorsOrigins) -> Router {
    let mut api = Router::new();
    for prefix in ["", "/v1"] {
        api = api
            .route(&format!("{prefix}/models"), get(openai::models))
            .route(
                &format!("{prefix}/chat/completions"),
                post(openai::chat_completions),
            )
            .route(&format!("{prefix}/completions"), post(openai::completions))
            .route(&format!("{prefix}/responses"), post(responses::responses))
            .route(
                &format!("{prefix}/chat/completions/input_tokens"),
                post(openai::chat_input_tokens),
            )
            .route(
                &format!("{prefix}/responses/input_tokens"),
                post(responses::input_tokens),
            );
    }
    api.route("/completion", post(native::completion))
        .route("/completions/native", post(native::completion))
        .route("/infill", post(native::infill))
        .route("/tokenize", post(native::tokenize))
        .route("/detokenize", post(native::detokenize))
        .route("/apply-template", post(native::apply_template))
        .route("/props", get(native::props))
        .route("/slots", get(native::slots))
        .route("/metrics", get(metrics::serve))
        // The key is checked before a body is read.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_key,
        ))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        // Outermost: a browser's preflight is answered before any key is asked for.
        .layer(cors.layer())
        .with_state(state)
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::method_not_allowed(method.as_str(), uri.path())
}

/// Largest request body: a full context of text with room to spare.
const MAX_BODY_BYTES: usize = 1 << 20;

fn ready(state: &AppState) -> Result<&Ready, ApiError> {
    state
        .ready
        .get()
        .ok_or_else(|| ApiError::unavailable("the model is loading; try again shortly"))
}

async fn health(State(state): State<AppState>) -> Response {
    match state.ready.get() {
        Some(ready) => {
            let activity = ready.worker.activity();
            axum::Json(json!({
                "status": "ok",
                "busy": activity.busy,
                "tokens_processed": activity.tokens_processed,
                "queued": activity.queued,
                "speeds": ready.worker.speeds(),
                "tool_calls": state.metrics.tool_calls(),
                "speculation": ready.speculation,
                "pass_costs": ready.worker.pass_costs().map(|(relative, timed)| json!({
                    "relative": relative,
                    "widths_timed": timed,
                })),
            }))
            .into_response()
        }
        None => ApiError::unavailable("Loading model").into_response(),
    }
}

/// `b`, the engine's version, `-` and 12 hex digits of SHA-256 over that version, the model
/// file's name and size, and the context: what changes outputs for the same request and seed.
/// llama-server's are `b<build>-<commit>`, and clients written against it check the `b`.
fn fingerprint(model: &std::path::Path, context: usize) -> String {
    let size = std::fs::metadata(model).map(|m| m.len()).unwrap_or(0);
    let digest = Sha256::digest(
        format!(
            "{}\0{}\0{size}\0{context}",
            env!("CARGO_PKG_VERSION"),
            model
                .file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        )
        .as_bytes(),
    );
    let hex: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("b{}-{hex}", env!("CARGO_PKG_VERSION"))
}

/// How `engine serve` runs.
pub struct ServeConfig {
    /// The GGUF model.
    pub model: std::path::PathBuf,
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Threads per pass.
    pub threads: usize,
    /// Context per conversation.
    pub context: usize,
    /// Requests waiting at most.
    pub queue: usize,
    /// Required bearer key (mandatory beyond loopback).
    pub api_key: Option<String>,
    /// The key whose requests skip the users' queue (given by the supervisor).
    pub control_key: Option<String>,
    /// A Unix socket serving the same API (owner-only), for the supervisor.
    pub control_socket: Option<std::path::PathBuf>,
    /// System prompt for chats that bring none.
    pub system_prompt: Option<String>,
    /// The names clients see in `/v1/models` (`--alias`, separated by commas): the id is the
    /// first in alphabetical order, as llama-server reports it.
    pub model_id: Option<String>,
    /// Memory for kept conversation caches, in MiB.
    pub cache_mib: usize,
    /// Whether `GET /slots` is served (`--slots`).
    pub slots: bool,
    /// Tags listed in `/v1/models` (`--tags`, separated by commas).
    pub tags: Option<String>,
    /// Whether every whole answer carries `__verbose` (`--verbose`).
    pub verbose: bool,
    /// Whether a generation that fills the context drops half of it and goes on
    /// (`--context-shift`).
    pub context_shift: bool,
    /// What requests that leave a field out get (`--n-predict`, `--temp`, `--seed`).
    pub defaults: Defaults,
    /// A Jinja chat template used instead of the model's (`--chat-template-file`).
    pub chat_template: Option<String>,
    /// Browser origins allowed to call the API (`--cors-origins`).
    pub cors: CorsOrigins,
    /// Where requests' drafts come from (`--spec`; each request may turn it off); `None`
    /// leaves it to the model ([`crate::speculate::Source::chosen`]).
    pub speculation: Option<crate::speculate::Source>,
    /// The model's draft head (`--model-draft`), needed by [`crate::speculate::Source::Mtp`].
    pub model_draft: Option<std::path::PathBuf>,
    /// The memory the model, its context and caches must fit (`None`: not checked).
    pub memory_limit: Option<crate::memory::Limit>,
}

/// Listens at once (`/health` answers 503 while the model loads), loads the model, serves until
/// SIGINT or SIGTERM.
pub fn serve(config: ServeConfig) -> Result<(), String> {
    if config.api_key.is_none() && !is_loopback(&config.listen) {
        return Err(format!(
            "refusing to listen on {} without an API key: pass --api-key (or ENGINE_API_KEY), or \
             listen on 127.0.0.1",
            config.listen
        ));
    }
    let aliases = names(config.model_id.as_deref());
    let model_id: Arc<str> = aliases
        .first()
        .cloned()
        .or_else(|| {
            config
                .model
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "model".into())
        .into();
    let metrics = Arc::new(metrics::Metrics::default());
    let state = AppState {
        ready: Arc::new(OnceLock::new()),
        model_id,
        aliases: aliases.into(),
        tags: names(config.tags.as_deref()).into(),
        verbose: config.verbose,
        slots: config.slots,
        model_path: Arc::from(config.model.as_path()),
        fingerprint: fingerprint(&config.model, config.context).into(),
        metrics: Arc::clone(&metrics),
        tokenizing: tokenizing::Gate::default(),
        api_key_sha256: config.api_key.as_deref().map(|k| key_hash(k.trim())),
        control_key_sha256: config
            .control_key
            .as_deref()
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(key_hash),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        eprintln!("engine: listening on http://{}", config.listen);
        let control = match &config.control_socket {
            Some(path) => Some(bind_control_socket(path)?),
            None => None,
        };
        let (failed, load_failure) = tokio::sync::oneshot::channel::<String>();
        let ready = Arc::clone(&state.ready);
        let cors = config.cors.clone();
        tokio::task::spawn_blocking(move || match load(&config, metrics) {
            Ok(loaded) => {
                if ready.set(loaded).is_ok() {
                    eprintln!("engine: model loaded");
                }
            }
            Err(e) => {
                let _ = failed.send(e);
            }
        });
        let failure = Arc::new(std::sync::Mutex::new(None));
        let (stopping, stopped) = tokio::sync::watch::channel(false);
        let stop = {
            let failure = Arc::clone(&failure);
            let ready = Arc::clone(&state.ready);
            async move {
                tokio::select! {
                    () = shutdown() => {
                        // In-flight answers end now with an error event, not when they are
                        // done: a supervisor's SIGTERM is followed by SIGKILL.
                        if let Some(ready) = ready.get() {
                            ready.worker.shut_down();
                        }
                        exit_after(SHUTDOWN_DEADLINE);
                    }
                    Ok(e) = load_failure => {
                        *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    }
                }
                let _ = stopping.send(true);
            }
        };
        let until_stopped = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        let app = router(state, &cors);
        let served = http_guard::Server::new(connection_limits(), |peer| peer, guard_error).serve(
            listener,
            app.clone(),
            until_stopped(stopped.clone()),
        );
        let control = async move {
            if let Some(socket) = control {
                // Handlers see the socket's one client as loopback.
                let local = SocketAddr::from(([127, 0, 0, 1], 0));
                http_guard::Server::new(control_limits(), |peer| peer, guard_error)
                    .serve_unix(socket, local, app, until_stopped(stopped))
                    .await;
            }
        };
        tokio::join!(stop, served, control);
        let failed = failure.lock().unwrap_or_else(|p| p.into_inner()).take();
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    })
}

/// What clients may hold of the server. Under the supervisor it serves loopback, where the
/// probe and the dashboard's chat share one address with anyone else on the box; with
/// `--api-key` it serves the LAN. Generation is one request at a time behind a short queue, so
/// more connections than these could only wait: the cap bounds descriptors and memory, and idle
/// ones (slowloris, forgotten keep-alives) are evicted for new clients, never a running answer.
fn connection_limits() -> http_guard::Limits {
    http_guard::Limits {
        max_connections: 128,
        per_client: 32,
        max_body: MAX_BODY_BYTES as u64,
        ..http_guard::Limits::default()
    }
}

/// The control socket's limits: its one client (the supervisor) needs a probe, a readiness
/// check and a chat at once; every other limit is the TCP port's.
fn control_limits() -> http_guard::Limits {
    http_guard::Limits {
        max_connections: 8,
        per_client: 8,
        ..connection_limits()
    }
}

/// Binds the control socket at `path`, replacing a socket left by an earlier engine (never a
/// file of another kind), owner-only: who may connect is who may read the supervisor's run
/// directory and is this user.
fn bind_control_socket(path: &std::path::Path) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let shown = path.display();
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path)
            .map_err(|e| format!("--control-socket {shown}: cannot remove the old socket: {e}"))?,
        Ok(_) => {
            return Err(format!(
                "--control-socket {shown}: exists and is not a socket (remove it, or give \
                 another path)"
            ));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("--control-socket {shown}: {e}")),
    }
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(|e| format!("--control-socket {shown}: cannot listen: {e}"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("--control-socket {shown}: {e}"))?;
    eprintln!("engine: control socket at {shown}");
    Ok(listener)
}

/// The connection guard's refusals (413, 408) in the API's error shape.
fn guard_error(status: axum::http::StatusCode, message: &str) -> Response {
    ApiError::with_status(status, message).into_response()
}

/// How long connections get to finish after SIGTERM before the process exits regardless (a
/// client that stops reading must not hold the engine up).
/// Why `--spec mtp` cannot run: neither a head file nor a layer of the model's own to draft with.
pub const NO_DRAFT_SOURCE: &str = "--spec mtp needs a draft source: the model's draft head \
    (--model-draft FILE, Gemma 4's assistant) or a model whose file holds a nextn layer \
    (Qwen 3.5 converted with its MTP layer)";

const SHUTDOWN_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

fn exit_after(deadline: std::time::Duration) {
    let spawned = std::thread::Builder::new()
        .name("engine-exit".into())
        .spawn(move || {
            std::thread::sleep(deadline);
            eprintln!(
                "engine: connections still open {} s after the shutdown signal; exiting",
                deadline.as_secs()
            );
            std::process::exit(0);
        });
    if let Err(e) = spawned {
        eprintln!("engine: cannot start the shutdown timer: {e}");
    }
}

fn load(config: &ServeConfig, metrics: Arc<metrics::Metrics>) -> Result<Ready, String> {
    let file = crate::model_file::ModelFile::open(&config.model).map_err(|e| e.to_string())?;
    // The server runs for the life of the process: its mapping can be too.
    let file: &'static crate::model_file::ModelFile = Box::leak(Box::new(file));
    let model = Arc::new(crate::model::Model::load(file).map_err(|e| e.to_string())?);
    use crate::speculate::Source;
    let own = crate::model::DraftHead::nextn(&model);
    let speculation = Source::chosen(
        config.speculation,
        config.model_draft.is_some() || own.is_some(),
    );
    let head = match (speculation, &config.model_draft) {
        (Source::Mtp, Some(path)) => {
            let head_file = crate::model_file::ModelFile::open(path).map_err(|e| e.to_string())?;
            let head_file: &'static crate::model_file::ModelFile = Box::leak(Box::new(head_file));
            let head =
                crate::model::DraftHead::load(head_file, &model).map_err(|e| e.to_string())?;
            Some((Arc::new(head), head_file.bytes().len() as u64))
        }
        (Source::Mtp, None) => match own {
            Some(head) => Some((Arc::new(head), 0)),
            None => return Err(NO_DRAFT_SOURCE.into()),
        },
        _ => None,
    };
    if let Some(limit) = &config.memory_limit {
        let need = crate::memory::Need::of(
            &model,
            file.bytes().len() as u64 + head.as_ref().map_or(0, |(_, bytes)| *bytes),
            config.context,
            config.cache_mib,
        )?;
        need.fits(limit)?;
    }
    let copied = model.copied_bytes();
    if copied > 0 {
        eprintln!(
            "engine: {:.1} MiB of weights copied for the kernels (Q5_0 widened to Q8_0 for \
             batched passes, Q4_K and Q6_K with sixteen rows side by side)",
            copied as f64 / f64::from(1 << 20)
        );
    }
    let tokenizer =
        Arc::new(Tokenizer::load(file).map_err(|e| format!("{}: {e}", config.model.display()))?);
    let template = ChatTemplate::for_model(file, &tokenizer, config.chat_template.clone())?;
    crate::model::KvCache::new(&model.hparams, config.context)?;
    // A configured system prompt is prefilled now, so every new chat starts from it.
    let warm = match &config.system_prompt {
        Some(system) => template.ids(&tokenizer, &[Message::new("system", system)], false)?,
        None => Vec::new(),
    };
    let end_ids = tokenizer.end_ids(file);
    let worker = Worker::start(
        model,
        Arc::clone(&tokenizer),
        end_ids.clone(),
        &worker::Settings {
            context: config.context,
            threads: config.threads,
            queue: config.queue,
            cache_bytes: config.cache_mib.saturating_mul(1 << 20),
            warm,
            speculation: speculation != Source::None,
            head: head.map(|(head, _)| head),
            context_shift: config.context_shift,
        },
        metrics,
    );
    Ok(Ready {
        worker,
        tokenizer,
        template,
        context: config.context,
        system_prompt: config.system_prompt.clone(),
        defaults: config.defaults.clone(),
        speculation,
        end_ids,
    })
}

async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}
