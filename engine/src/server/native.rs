//! llama.cpp's own endpoints: `/completion` (with `tokens`, `truncated`,
//! `generation_settings`, `completion_probabilities`), `/tokenize`, `/detokenize`, `/props`
//! and `/apply-template`, in the shapes llama.cpp's clients read.

use std::time::Instant;

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::error::{ApiError, Body, parse};
use super::generation::{self, collect, start};
use super::infill::{self, Gap, InfillRequest};
use super::request::{ChatRequest, CompletionRequest, Dialect, Knobs};
use super::stream::{Format, Piece, stream};
use super::worker::choose::TokenProbs;
use super::worker::{Finish, Lane, Params, Place, Prompt};
use super::{AppState, ready};
use crate::tokenizer::Tokenizer;

/// `POST /completion`.
pub async fn completion(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let (request, ready, params) =
        generation::checked::<CompletionRequest>(&state, &body, Dialect::Native)?;
    answers_once(&params, &request.knobs)?;
    let prompts = super::request::prompts(&request.prompt);
    if let [one] = prompts.as_slice() {
        let place = generation::reserve(ready, lane)?;
        let prompt = generation::completion_prompt(&state, ready, one, lane).await?;
        return answer(
            &state,
            ready,
            &request.knobs,
            params,
            place,
            prompt,
            arrived,
        )
        .await;
    }
    // Several prompts: each answered in turn, the answers as a list (llama-server's shape).
    if request.knobs.stream {
        return Err(ApiError::unsupported(
            "prompt",
            "several prompts are answered whole, not streamed (send one request each)",
        ));
    }
    if prompts.len() > super::request::MAX_PROMPTS {
        return Err(ApiError::bad_request(format!(
            "prompt holds {} prompts; at most {} are answered per request",
            prompts.len(),
            super::request::MAX_PROMPTS
        )));
    }
    let mut bodies = Vec::with_capacity(prompts.len());
    for (index, one) in prompts.into_iter().enumerate() {
        let place = generation::reserve(ready, lane)?;
        let prompt = generation::completion_prompt(&state, ready, one, lane).await?;
        let started = start(ready, prompt, params.clone(), place, arrived)?;
        let mut body = whole(&state, ready, &request.knobs, &params, started, None).await?;
        body["index"] = json!(index);
        bodies.push(body);
    }
    Ok(axum::Json(bodies).into_response())
}

/// `POST /infill`: a fill-in-the-middle prompt ([`super::infill`]) answered as `/completion`.
pub async fn infill(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let (request, ready, params) =
        generation::checked::<InfillRequest>(&state, &body, Dialect::Infill)?;
    answers_once(&params, &request.knobs)?;
    let fim = ready.tokenizer.fim().ok_or_else(infill::unsupported)?;
    let gap = Gap::of(&request)?;
    let place = generation::reserve(ready, lane)?;
    let prompt =
        generation::infill_prompt(&state, ready, fim, gap, params.max_tokens, lane).await?;
    answer(
        &state,
        ready,
        &request.knobs,
        params,
        place,
        prompt,
        arrived,
    )
    .await
}

/// Most `response_fields` one request may name.
const MAX_RESPONSE_FIELDS: usize = 64;

/// `response_fields`, each once, checked: `None` for the whole answer.
fn response_fields(knobs: &Knobs) -> Result<Option<Vec<String>>, ApiError> {
    let fields = match knobs.extra.get("response_fields") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(fields)) if fields.is_empty() => return Ok(None),
        Some(Value::Array(fields)) if fields.len() <= MAX_RESPONSE_FIELDS => fields,
        Some(_) => {
            return Err(ApiError::bad_request(format!(
                "response_fields must be a list of at most {MAX_RESPONSE_FIELDS} paths such as \
                 \"generation_settings/n_predict\""
            )));
        }
    };
    let mut paths: Vec<String> = Vec::with_capacity(fields.len());
    for field in fields {
        let path = field
            .as_str()
            .ok_or_else(|| ApiError::bad_request("response_fields must hold strings"))?;
        if !paths.iter().any(|p| p == path) {
            paths.push(path.to_string());
        }
    }
    Ok(Some(paths))
}

/// llama.cpp's own endpoints give one answer per request (and `response_fields` are checked
/// before any work).
fn answers_once(params: &Params, knobs: &Knobs) -> Result<(), ApiError> {
    response_fields(knobs)?;
    if params.choices > 1 {
        return Err(ApiError::unsupported(
            "n",
            "this endpoint answers once (use /v1/completions for several choices)",
        ));
    }
    Ok(())
}

/// `prompt` answered in llama.cpp's `/completion` shape, whole or streamed.
async fn answer(
    state: &AppState,
    ready: &super::Ready,
    knobs: &Knobs,
    params: Params,
    place: Place,
    prompt: Prompt,
    arrived: Instant,
) -> Result<Response, ApiError> {
    let verbose = generation::verbose(state, ready, knobs, &prompt);
    let started = start(ready, prompt, params.clone(), place, arrived)?;
    if !knobs.stream {
        let body = whole(state, ready, knobs, &params, started, verbose).await?;
        return Ok(axum::Json(body).into_response());
    }
    let settings = generation_settings(&params, ready);
    let with_probs = params.logprobs.is_some();
    let tokenizer = std::sync::Arc::clone(&ready.tokenizer);
    let model = state.model_id.to_string();
    let prompt_tokens = started.prompt_tokens;
    // No empty first chunk: as llama-server, every chunk before the last carries text
    // and its tokens.
    Ok(stream(
        started,
        Vec::new(),
        Format::Native,
        move |piece| match piece {
            Piece::Text {
                text,
                probs,
                tokens,
                ..
            } => {
                let mut chunk = json!({
                    "content": text, "tokens": tokens, "stop": false, "index": 0,
                });
                if with_probs {
                    chunk["completion_probabilities"] = json!(probabilities(&tokenizer, &probs));
                }
                vec![chunk]
            }
            Piece::End { summary, .. } => vec![json!({
                "content": "", "stop": true, "index": 0,
                "stop_type": stop_type(summary.finish),
                "stopping_word": summary.stopping_word,
                "tokens": summary.tokens,
                "tokens_evaluated": prompt_tokens,
                "tokens_predicted": summary.timings.predicted_n,
                "tokens_cached": summary.timings.cache_n,
                "truncated": summary.context_full,
                "model": model,
                "generation_settings": settings,
                "timings": summary,
            })],
            Piece::Progress => {
                vec![json!({ "content": "", "tokens": [], "stop": false, "index": 0 })]
            }
            Piece::Usage { .. } | Piece::Failed(_) => Vec::new(),
        },
    ))
}

/// A generation's whole answer in `/completion`'s shape (only `response_fields` when given,
/// each a path such as `generation_settings/n_predict`).
async fn whole(
    state: &AppState,
    ready: &super::Ready,
    knobs: &Knobs,
    params: &Params,
    mut started: generation::Started,
    verbose: Option<String>,
) -> Result<Value, ApiError> {
    let settings = generation_settings(params, ready);
    let prompt_tokens = started.prompt_tokens;
    let model = state.model_id.to_string();
    let answer = collect(&mut started)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::internal("the generation ended without an answer"))?;
    let summary = &answer.summary;
    let mut body = json!({
        "index": 0,
        "content": answer.text,
        "tokens": summary.tokens,
        "id_slot": 0,
        "stop": true,
        "model": model,
        "tokens_predicted": summary.timings.predicted_n,
        "tokens_evaluated": prompt_tokens,
        "tokens_cached": summary.timings.cache_n,
        "generation_settings": settings,
        "has_new_line": answer.text.contains('\n'),
        "truncated": summary.context_full,
        "stop_type": stop_type(summary.finish),
        "stopping_word": summary.stopping_word,
        "timings": summary,
    });
    if params.logprobs.is_some() {
        body["completion_probabilities"] = json!(probabilities(&ready.tokenizer, &answer.probs));
    }
    if let Some(prompt) = verbose {
        body["__verbose"] = json!({ "prompt": prompt });
    }
    Ok(match response_fields(knobs)? {
        Some(fields) => fields
            .into_iter()
            .map(|path| {
                let found = path.split('/').try_fold(&body, |v, key| v.get(key));
                (path, found.cloned().unwrap_or(Value::Null))
            })
            .collect::<serde_json::Map<String, Value>>()
            .into(),
        None => body,
    })
}

fn stop_type(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "eos",
        Finish::Word => "word",
        Finish::Length => "limit",
    }
}

/// The settings a generation ran with, as llama.cpp reports them: the biases as
/// `{"token", "bias"}` with `null` for a ban, the end tokens banned by `ignore_eos` among them.
fn generation_settings(params: &Params, ready: &super::Ready) -> Value {
    let n_ctx = ready.context;
    let bias = |id: u32, b: f32| json!({ "token": id, "bias": if b.is_finite() { json!(b) } else { Value::Null } });
    let mut logit_bias: Vec<Value> = params
        .logit_bias
        .iter()
        .map(|&(id, b)| bias(id, b))
        .collect();
    if params.ignore_eos {
        logit_bias.extend(ready.end_ids.iter().map(|&id| bias(id, f32::NEG_INFINITY)));
    }
    let s = &params.sampling;
    let unlimited = |n: usize| if n == usize::MAX { -1 } else { n as i64 };
    json!({
        "n_ctx": n_ctx,
        "n_predict": unlimited(params.max_tokens),
        "temperature": s.temperature,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "repeat_penalty": s.repeat_penalty,
        "repeat_last_n": unlimited(s.repeat_last_n),
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "seed": s.seed,
        "stop": params.stop,
        "ignore_eos": params.ignore_eos,
        "cache_prompt": params.reuse_prompt,
        "n_probs": params.logprobs.unwrap_or(0),
        "post_sampling_probs": params.post_sampling_probs,
        "logit_bias": logit_bias,
        "grammar": params.grammar.is_some(),
        "speculative.n_max": params.draft_max,
        "speculative.n_min": params.draft_min,
        "samplers": ["penalties", "top_k", "top_p", "min_p", "temperature"],
    })
}

/// llama.cpp's `completion_probabilities`: log-probabilities, or after sampling probabilities
/// (`prob`, `top_probs`), as llama.cpp names them.
fn probabilities(tokenizer: &Tokenizer, probs: &[TokenProbs]) -> Vec<Value> {
    probs
        .iter()
        .map(|p| {
            let (value, top) = p.names();
            let entry = |id: u32, logprob: f64| {
                let bytes = tokenizer.token_bytes(id);
                let mut e = json!({
                    "id": id, "token": String::from_utf8_lossy(&bytes), "bytes": bytes,
                });
                e[value] = json!(p.shown(logprob));
                e
            };
            let mut e = entry(p.id, p.logprob);
            e[top] = p.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
            e
        })
        .collect()
}

/// `POST /tokenize`.
#[derive(Debug, Deserialize)]
struct TokenizeRequest {
    content: String,
    /// Add BOS where the model wants it (llama.cpp's default: no).
    #[serde(default)]
    add_special: bool,
    /// Recognise special-token texts (llama.cpp's default: yes).
    #[serde(default = "yes")]
    parse_special: bool,
    /// Each id with its text.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// Texts a tokenize request may hold: a whole context's worth with room to spare.
const MAX_TOKENIZE_BYTES: usize = 1 << 20;

/// `POST /tokenize`: `{"tokens": [ids]}` or, `with_pieces`, `[{"id", "piece"}]`. It takes
/// its turn at the tokenizing budget, and the answer is written straight to bytes: a JSON
/// value per token would cost several times the text.
pub async fn tokenize(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let request: TokenizeRequest = parse(&body)?;
    drop(body);
    let ready = ready(&state)?;
    if request.content.len() > MAX_TOKENIZE_BYTES {
        return Err(ApiError::bad_request(format!(
            "content is {} bytes; at most {MAX_TOKENIZE_BYTES} are tokenized at once (split it)",
            request.content.len()
        )));
    }
    let turn = state.tokenizing.enter(request.content.len(), lane).await?;
    let tokenizer = std::sync::Arc::clone(&ready.tokenizer);
    let answer = tokio::task::spawn_blocking(move || {
        let mut ids = tokenizer.encode(&request.content, request.parse_special);
        drop(request.content);
        if !request.add_special
            && tokenizer.bos_id().is_some()
            && ids.first() == tokenizer.bos_id().as_ref()
        {
            ids.remove(0);
        }
        if !request.with_pieces {
            return serde_json::to_vec(&TokenizeAnswer { tokens: &ids });
        }
        let pieces: Vec<TokenPiece> = ids
            .iter()
            .map(|&id| TokenPiece {
                id,
                // A piece that splits a character is given as its bytes, as llama.cpp does.
                piece: match String::from_utf8(tokenizer.token_bytes(id)) {
                    Ok(text) => PieceText::Text(text),
                    Err(e) => PieceText::Bytes(e.into_bytes()),
                },
            })
            .collect();
        serde_json::to_vec(&TokenizeAnswer { tokens: &pieces })
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing: {e}")))?
    .map_err(|e| ApiError::internal(format!("writing the tokens: {e}")))?;
    drop(turn);
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        answer,
    )
        .into_response())
}

#[derive(Serialize)]
struct TokenizeAnswer<'a, T: Serialize> {
    tokens: &'a [T],
}

#[derive(Serialize)]
struct TokenPiece {
    id: u32,
    piece: PieceText,
}

#[derive(Serialize)]
#[serde(untagged)]
enum PieceText {
    Text(String),
    Bytes(Vec<u8>),
}

/// `POST /detokenize`.
#[derive(Debug, Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<i64>,
}

/// `POST /detokenize`: `{"content": text}`.
pub async fn detokenize(
    State(state): State<AppState>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let request: DetokenizeRequest = parse(&body)?;
    let ready = ready(&state)?;
    let vocab = ready.tokenizer.vocab_size();
    let ids = request
        .tokens
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            u32::try_from(t)
                .ok()
                .filter(|&id| (id as usize) < vocab)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "tokens[{i}] = {t} is not a token id (0 to {})",
                        vocab.saturating_sub(1)
                    ))
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    Ok(axum::Json(json!({ "content": ready.tokenizer.decode(&ids) })).into_response())
}

/// `POST /apply-template`: the prompt text a chat renders to, ending as the request's cue says
/// (cut after a final assistant message, which would be continued).
pub async fn apply_template(
    State(state): State<AppState>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let request: ChatRequest = parse(&body)?;
    let ready = ready(&state)?;
    let (calling, vars) = super::answer::for_chat(&ready.template, &request, &ready.defaults)?;
    let messages = generation::chat_messages(ready, &request, calling.as_ref())?;
    let prompt = match generation::Cue::of(&request, &messages)? {
        generation::Cue::Continue => ready.template.render_continuation(&messages, &vars),
        generation::Cue::Nothing => ready.template.render(&messages, false, &vars),
        generation::Cue::Answer => ready.template.render(&messages, true, &vars),
    }
    .map_err(ApiError::bad_request)?;
    Ok(axum::Json(json!({ "prompt": prompt })).into_response())
}

/// `GET /slots` (with `--slots`): the one generation slot, as llama-server lists its slots.
/// The engine generates one request at a time, so there is one; its context is the whole.
pub async fn slots(State(state): State<AppState>) -> Result<Response, ApiError> {
    if !state.slots {
        return Err(ApiError::not_supported(
            "This server does not support slots endpoint. Start it with `--slots`",
        ));
    }
    let ready = state
        .ready
        .get()
        .ok_or_else(|| ApiError::unavailable("Loading model"))?;
    let activity = ready.worker.activity();
    Ok(axum::Json(json!([{
        "id": 0,
        "n_ctx": ready.context,
        "is_processing": activity.busy,
    }]))
    .into_response())
}

/// `GET /props`: the server's settings and the model's template.
pub async fn props(State(state): State<AppState>) -> Result<Response, ApiError> {
    let ready = ready(&state)?;
    let d = &ready.defaults;
    let defaults = Params {
        sampling: crate::sampler::Sampling {
            temperature: d.temperature,
            seed: d.seed.unwrap_or(u64::MAX),
            ..crate::sampler::Sampling::default()
        },
        max_tokens: d.max_tokens.unwrap_or(usize::MAX),
        stop: Vec::new(),
        ignore_eos: false,
        reuse_prompt: true,
        choices: 1,
        logprobs: None,
        post_sampling_probs: false,
        logit_bias: Vec::new(),
        grammar: None,
        draft_max: crate::speculate::MAX_DRAFT,
        draft_min: 0,
        report_progress: false,
        timings_per_token: false,
        keep: 0,
        grammar_trigger: None,
        grammar_anchored: false,
        thinking_budget: None,
        thinking_block: None,
    };
    let mut params = generation_settings(&defaults, ready);
    if d.seed.is_none() {
        params["seed"] = json!(-1);
    }
    let (bos, eos) = ready.template.bos_eos();
    Ok(axum::Json(json!({
        "default_generation_settings": {
            "id": 0,
            "n_ctx": ready.context,
            "params": params,
            "is_processing": ready.worker.activity().busy,
        },
        "total_slots": 1,
        "model_path": state.model_path.display().to_string(),
        "model_alias": &*state.model_id,
        "chat_template": ready.template.source,
        "bos_token": bos,
        "eos_token": eos,
        "build_info": concat!("appliance-engine ", env!("CARGO_PKG_VERSION")),
        "modalities": { "vision": false, "audio": false },
        "n_ctx": ready.context,
    }))
    .into_response())
}
