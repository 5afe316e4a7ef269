//! `engine serve`: the OpenAI-compatible HTTP API (and llama.cpp's native `/completion`) over
//! one model, one generation at a time from a bounded queue.
//!
//! Handlers only translate: a request becomes token ids and sampler settings, the generation
//! thread ([`worker`]) produces text events, and the handler shapes them into a JSON body or
//! server-sent events. Anything bound beyond loopback needs an API key.

pub mod api;
pub mod worker;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::chat::{ChatTemplate, Message, PromptError};
use crate::tokenizer::{Budget, Stopped, Tokenizer};
use api::{ApiError, ChatRequest, CompletionRequest, Knobs};
use worker::{Event, Finish, Job, Lane, Summary, Worker};

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
}

/// Shared handler state.
#[derive(Clone)]
pub struct AppState {
    /// Set once loading finishes; until then generation endpoints answer 503.
    pub ready: Arc<OnceLock<Ready>>,
    /// The id `/v1/models` reports.
    pub model_id: Arc<str>,
    /// SHA-256 of the API key, when one is required.
    pub api_key_sha256: Option<[u8; 32]>,
    /// SHA-256 of the control key, when the engine has one (its supervisor's requests).
    pub control_key_sha256: Option<[u8; 32]>,
}

/// The header that carries the control key.
pub const CONTROL_HEADER: &str = "x-engine-control";

/// Default `max_tokens` when a request gives none.
const DEFAULT_MAX_TOKENS: usize = 512;

/// The router of every endpoint.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/completion", post(native_completion))
        // The key is checked before a body is read.
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_key,
        ))
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Largest request body: a full context of text with room to spare.
const MAX_BODY_BYTES: usize = 1 << 20;

/// Checks the key and decides the request's lane once, before its body is read; handlers
/// read the lane from the request's extensions.
async fn require_key(
    State(state): State<AppState>,
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let lane = lane(&state, request.headers());
    match authorize(&state, request.headers(), lane) {
        Ok(()) => {
            request.extensions_mut().insert(lane);
            next.run(request).await
        }
        Err(e) => e.into_response(),
    }
}

/// Whether `addr` is loopback (the only place an unauthenticated server may listen).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// SHA-256 of an API key (only the hash is kept in memory).
pub fn key_hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The lane of a request: the control lane when it carries the control key.
fn lane(state: &AppState, headers: &HeaderMap) -> Lane {
    let given = headers
        .get(CONTROL_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|k| key_hash(k.trim()));
    match (state.control_key_sha256, given) {
        (Some(expected), Some(given)) if given == expected => Lane::Control,
        _ => Lane::User,
    }
}

fn authorize(state: &AppState, headers: &HeaderMap, lane: Lane) -> Result<(), ApiError> {
    let Some(expected) = state.api_key_sha256 else {
        return Ok(());
    };
    // The control key is a secret of the same strength, given only to the supervisor.
    if lane == Lane::Control {
        return Ok(());
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|k| key_hash(k.trim()));
    // Comparing hashes keeps the comparison's timing independent of the key.
    match given {
        Some(h) if h == expected => Ok(()),
        _ => Err(ApiError::unauthorized()),
    }
}

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
            }))
            .into_response()
        }
        None => ApiError::unavailable("Loading model").into_response(),
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn models(State(state): State<AppState>) -> Result<Response, ApiError> {
    Ok(axum::Json(json!({
        "object": "list",
        "data": [{ "id": &*state.model_id, "object": "model", "created": now(), "owned_by": "appliance" }],
    }))
    .into_response())
}

/// A queued generation: its events and the prompt's length.
struct Started {
    events: UnboundedReceiver<Event>,
    prompt_tokens: usize,
}

fn start(ready: &Ready, prompt: Vec<u32>, knobs: &Knobs, lane: Lane) -> Result<Started, ApiError> {
    if prompt.len() >= ready.context {
        return Err(ApiError::bad_request(format!(
            "the prompt is {} tokens long; the context holds {} (shorten it or start a new chat)",
            prompt.len(),
            ready.context
        )));
    }
    let (events, receiver) = unbounded_channel();
    let prompt_tokens = prompt.len();
    ready
        .worker
        .submit(Job {
            prompt,
            sampling: knobs.sampling()?,
            max_tokens: knobs.limit(DEFAULT_MAX_TOKENS)?,
            stop: knobs.stops()?,
            ignore_eos: knobs.ignore_eos,
            lane,
            events,
        })
        .map_err(|refused| match refused {
            worker::Refused::Full => {
                ApiError::unavailable("the request queue is full; retry shortly")
            }
            worker::Refused::Stopped => ApiError::unavailable(SHUTTING_DOWN),
        })?;
    Ok(Started {
        events: receiver,
        prompt_tokens,
    })
}

/// Waits for the whole text.
async fn collect(started: &mut Started) -> Result<(String, Summary), ApiError> {
    let mut text = String::new();
    while let Some(event) = started.events.recv().await {
        match event {
            Event::Text(t) => text.push_str(&t),
            Event::Done(summary) => return Ok((text, summary)),
            Event::Failed(e) => return Err(ApiError::internal(e)),
            Event::ShuttingDown => return Err(ApiError::unavailable(SHUTTING_DOWN)),
        }
    }
    Err(ApiError::internal("the generation thread stopped"))
}

/// What a request cut off by the engine's shutdown is told.
const SHUTTING_DOWN: &str = "the engine is shutting down; the answer was cut off (retry shortly)";

fn usage(prompt_tokens: usize, summary: &Summary) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": summary.predicted_n,
        "total_tokens": prompt_tokens + summary.predicted_n,
    })
}

fn id(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{prefix}-{:x}{n:x}", now())
}

/// Bytes of prompt text accepted per token of context: text beyond that cannot fit, and is
/// refused before the tokenizer spends time on it.
const BYTES_PER_TOKEN_BOUND: usize = 16;

fn check_text_size(ready: &Ready, bytes: usize) -> Result<(), ApiError> {
    let bound = ready.context.saturating_mul(BYTES_PER_TOKEN_BOUND);
    if bytes > bound {
        return Err(ApiError::bad_request(format!(
            "the prompt is {bytes} bytes; it cannot fit the context of {} tokens (shorten it)",
            ready.context
        )));
    }
    Ok(())
}

/// Runs tokenization on a blocking thread, so a long prompt never stalls other connections,
/// within a budget of the context's tokens. When the client goes away (the handler's future
/// is dropped), the work stops at its next piece instead of running to the end for nobody.
async fn tokenize_off_thread(
    state: &AppState,
    work: impl FnOnce(&Ready, &Budget<'_>) -> Result<Vec<u32>, PromptError> + Send + 'static,
) -> Result<Vec<u32>, ApiError> {
    let ready = Arc::clone(&state.ready);
    let gone = CancelOnDrop(Arc::new(AtomicBool::new(false)));
    let cancelled = Arc::clone(&gone.0);
    let tokenized = tokio::task::spawn_blocking(move || {
        let Some(r) = ready.get() else {
            return Err(ApiError::unavailable(
                "the model is loading; try again shortly",
            ));
        };
        // The prompt must leave room for at least one generated token.
        let budget = Budget {
            max_tokens: r.context.saturating_sub(1),
            cancelled: &|| cancelled.load(Ordering::Relaxed),
        };
        work(r, &budget).map_err(|e| match e {
            PromptError::Template(e) => ApiError::bad_request(e),
            PromptError::Stopped(Stopped::TooLong { .. }) => too_long(r.context),
            // Nobody reads this answer.
            PromptError::Stopped(Stopped::Cancelled) => {
                ApiError::bad_request("the client went away")
            }
        })
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing: {e}")))?;
    drop(gone);
    tokenized
}

/// Sets its flag when dropped: the request it belongs to is over.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn too_long(context: usize) -> ApiError {
    ApiError::bad_request(format!(
        "the prompt is longer than the context of {context} tokens (shorten it or start a new chat)"
    ))
}

fn chat_messages(ready: &Ready, request: &ChatRequest) -> Result<Vec<Message>, ApiError> {
    let mut messages = api::messages(&request.messages)?;
    if let Some(system) = &ready.system_prompt {
        if messages.first().is_none_or(|m| m.role != "system") {
            messages.insert(0, Message::new("system", system));
        }
    }
    Ok(messages)
}

async fn chat_completions(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: ChatRequest = api::parse(&body)?;
    let ready = ready(&state)?;
    let messages = chat_messages(ready, &request)?;
    check_text_size(
        ready,
        messages
            .iter()
            .map(|m| m.content.len() + m.role.len())
            .sum(),
    )?;
    let prompt = tokenize_off_thread(&state, move |r, budget| {
        r.template.ids_within(&r.tokenizer, &messages, true, budget)
    })
    .await?;
    let mut started = start(ready, prompt, &request.knobs, lane)?;
    let (id, created, model) = (id("chatcmpl"), now(), state.model_id.to_string());
    if !request.knobs.stream {
        let (text, summary) = collect(&mut started).await?;
        return Ok(axum::Json(json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{
                "index": 0,
                "message": { "role": "assistant", "content": text },
                "finish_reason": summary.finish.openai(),
            }],
            "usage": usage(started.prompt_tokens, &summary),
            "timings": summary,
        }))
        .into_response());
    }
    let format = Format::openai(&request.knobs);
    let chunk = move |delta: Value, finish: Option<Finish>| {
        json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{ "index": 0, "delta": delta, "finish_reason": finish.map(Finish::openai) }],
        })
    };
    let first = chunk(json!({ "role": "assistant", "content": "" }), None);
    Ok(stream(started, first, format, move |event| match event {
        Piece::Text(t) => vec![chunk(json!({ "content": t }), None)],
        Piece::End(finish, usage, summary) => {
            let mut last = chunk(json!({}), Some(finish));
            last["timings"] = json!(summary);
            let mut out = vec![last];
            if let Some(u) = usage {
                let mut usage_chunk = chunk(json!({}), None);
                usage_chunk["choices"] = json!([]);
                usage_chunk["usage"] = u;
                out.push(usage_chunk);
            }
            out
        }
    }))
}

/// A raw prompt's tokens (special tokens recognised, BOS added where the model wants it).
async fn completion_prompt(
    state: &AppState,
    ready: &Ready,
    request: &CompletionRequest,
) -> Result<Vec<u32>, ApiError> {
    if request.prompt.is_empty() {
        return Err(ApiError::bad_request("prompt must not be empty"));
    }
    check_text_size(ready, request.prompt.len())?;
    let text = request.prompt.clone();
    tokenize_off_thread(state, move |r, budget| {
        r.tokenizer
            .encode_within(&text, true, budget)
            .map_err(PromptError::Stopped)
    })
    .await
}

async fn completions(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: CompletionRequest = api::parse(&body)?;
    let ready = ready(&state)?;
    let prompt = completion_prompt(&state, ready, &request).await?;
    let mut started = start(ready, prompt, &request.knobs, lane)?;
    let (id, created, model) = (id("cmpl"), now(), state.model_id.to_string());
    if !request.knobs.stream {
        let (text, summary) = collect(&mut started).await?;
        return Ok(axum::Json(json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{ "index": 0, "text": text, "finish_reason": summary.finish.openai(), "logprobs": null }],
            "usage": usage(started.prompt_tokens, &summary),
            "timings": summary,
        }))
        .into_response());
    }
    let format = Format::openai(&request.knobs);
    let chunk = move |text: &str, finish: Option<Finish>| {
        json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{ "index": 0, "text": text, "finish_reason": finish.map(Finish::openai), "logprobs": null }],
        })
    };
    let first = chunk("", None);
    Ok(stream(started, first, format, move |event| match event {
        Piece::Text(t) => vec![chunk(&t, None)],
        Piece::End(finish, usage, summary) => {
            let mut last = chunk("", Some(finish));
            last["timings"] = json!(summary);
            if let Some(u) = usage {
                last["usage"] = u;
            }
            vec![last]
        }
    }))
}

/// llama.cpp's native endpoint: `content`, `stop`, `timings`, …
async fn native_completion(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let request: CompletionRequest = api::parse(&body)?;
    let ready = ready(&state)?;
    let prompt = completion_prompt(&state, ready, &request).await?;
    let mut started = start(ready, prompt, &request.knobs, lane)?;
    if request.knobs.stream {
        let first = json!({ "content": "", "stop": false });
        return Ok(stream(
            started,
            first,
            Format::Native,
            |event| match event {
                Piece::Text(t) => vec![json!({ "content": t, "stop": false })],
                Piece::End(finish, _, summary) => vec![json!({
                    "content": "", "stop": true, "stop_type": stop_type(finish),
                    "stopping_word": summary.stopping_word, "timings": summary,
                })],
            },
        ));
    }
    let (text, summary) = collect(&mut started).await?;
    Ok(axum::Json(json!({
        "content": text,
        "stop": true,
        "stop_type": stop_type(summary.finish),
        "stopping_word": summary.stopping_word,
        "tokens_evaluated": started.prompt_tokens,
        "tokens_predicted": summary.predicted_n,
        "model": &*state.model_id,
        "timings": summary,
    }))
    .into_response())
}

fn stop_type(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "eos",
        Finish::Word => "word",
        Finish::Length => "limit",
    }
}

/// Which stream dialect: OpenAI's ends with `data: [DONE]` and may add a usage chunk;
/// llama.cpp's native one ends with its final JSON object.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    OpenAi { include_usage: bool },
    Native,
}

impl Format {
    /// The OpenAI dialect, with a usage chunk when the request asks for one.
    fn openai(knobs: &Knobs) -> Format {
        Format::OpenAi {
            include_usage: knobs
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
        }
    }
}

/// What a stream's shaper sees.
enum Piece {
    Text(String),
    End(Finish, Option<Value>, Summary),
}

/// Server-sent events: `first`, then the shaped pieces, then `data: [DONE]` (OpenAI style).
/// Dropping the stream (a disconnected client) drops the receiver, which stops generation.
fn stream(
    started: Started,
    first: Value,
    format: Format,
    shape: impl Fn(Piece) -> Vec<Value> + Send + 'static,
) -> Response {
    let include_usage = format
        == Format::OpenAi {
            include_usage: true,
        };
    let Started {
        events,
        prompt_tokens,
    } = started;
    let state = (events, Some(first), false, shape);
    let body =
        futures_util::stream::unfold(state, move |(mut events, first, done, shape)| async move {
            if let Some(first) = first {
                let event = SseEvent::default().data(first.to_string());
                return Some((vec![event], (events, None, false, shape)));
            }
            if done {
                return None;
            }
            let batch = match events.recv().await {
                Some(Event::Text(t)) => shape(Piece::Text(t))
                    .into_iter()
                    .map(|v| SseEvent::default().data(v.to_string()))
                    .collect(),
                Some(Event::Done(summary)) => {
                    let u = include_usage.then(|| usage(prompt_tokens, &summary));
                    let mut out: Vec<SseEvent> = shape(Piece::End(summary.finish, u, summary))
                        .into_iter()
                        .map(|v| SseEvent::default().data(v.to_string()))
                        .collect();
                    if format != Format::Native {
                        out.push(SseEvent::default().data("[DONE]"));
                    }
                    return Some((out, (events, None, true, shape)));
                }
                Some(Event::Failed(e)) => {
                    let body =
                        json!({ "error": { "message": e, "type": "server_error", "code": 500 } });
                    return Some((final_error(body, format), (events, None, true, shape)));
                }
                Some(Event::ShuttingDown) => {
                    let body = json!({ "error": {
                        "message": SHUTTING_DOWN, "type": "unavailable_error", "code": 503,
                    } });
                    return Some((final_error(body, format), (events, None, true, shape)));
                }
                None => return None,
            };
            Some((batch, (events, None, false, shape)))
        });
    let flat = futures_util::StreamExt::flat_map(body, |events: Vec<SseEvent>| {
        futures_util::stream::iter(events.into_iter().map(Ok::<_, Infallible>))
    });
    Sse::new(flat)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A stream's last events when it fails: the error, then (OpenAI dialect) `[DONE]`, so a
/// client can tell a cut-off answer from a connection that merely dropped.
fn final_error(body: Value, format: Format) -> Vec<SseEvent> {
    let mut out = vec![SseEvent::default().data(body.to_string())];
    if format != Format::Native {
        out.push(SseEvent::default().data("[DONE]"));
    }
    out
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
    /// System prompt for chats that bring none.
    pub system_prompt: Option<String>,
    /// The id clients see in `/v1/models`.
    pub model_id: Option<String>,
    /// Memory for kept conversation caches, in MiB.
    pub cache_mib: usize,
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
    let model_id: Arc<str> = config
        .model_id
        .clone()
        .or_else(|| {
            config
                .model
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "model".into())
        .into();
    let state = AppState {
        ready: Arc::new(OnceLock::new()),
        model_id,
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
        let (failed, load_failure) = tokio::sync::oneshot::channel::<String>();
        let ready = Arc::clone(&state.ready);
        tokio::task::spawn_blocking(move || match load(&config) {
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
            }
        };
        http_guard::Server::new(connection_limits(), |peer| peer, guard_error)
            .serve(listener, router(state), stop)
            .await;
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

/// The connection guard's refusals (413, 408) in the API's error shape.
fn guard_error(status: axum::http::StatusCode, message: &str) -> Response {
    ApiError::with_status(status, message).into_response()
}

/// How long connections get to finish after SIGTERM before the process exits regardless (a
/// client that stops reading must not hold the engine up).
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

fn load(config: &ServeConfig) -> Result<Ready, String> {
    let file = crate::model_file::ModelFile::open(&config.model).map_err(|e| e.to_string())?;
    // The server runs for the life of the process: its mapping can be too.
    let file: &'static crate::model_file::ModelFile = Box::leak(Box::new(file));
    let model = Arc::new(crate::model::Model::load(file).map_err(|e| e.to_string())?);
    let widened = model.widened_bytes();
    if widened > 0 {
        eprintln!(
            "engine: {:.1} MiB of Q5_0 weights widened to Q8_0 for batched passes",
            widened as f64 / f64::from(1 << 20)
        );
    }
    let tokenizer =
        Arc::new(Tokenizer::load(file).map_err(|e| format!("{}: {e}", config.model.display()))?);
    let template = ChatTemplate::from_model(file, &tokenizer)?;
    crate::model::KvCache::new(&model.hparams, config.context)?;
    // A configured system prompt is prefilled now, so every new chat starts from it.
    let warm = match &config.system_prompt {
        Some(system) => template.ids(&tokenizer, &[Message::new("system", system)], false)?,
        None => Vec::new(),
    };
    let worker = Worker::start(
        model,
        Arc::clone(&tokenizer),
        tokenizer.end_ids(file),
        &worker::Settings {
            context: config.context,
            threads: config.threads,
            queue: config.queue,
            cache_bytes: config.cache_mib.saturating_mul(1 << 20),
            warm,
        },
    );
    Ok(Ready {
        worker,
        tokenizer,
        template,
        context: config.context,
        system_prompt: config.system_prompt.clone(),
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
