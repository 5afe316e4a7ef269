//! OpenAI's endpoints (`/v1/models`, `/v1/chat/completions`, `/v1/completions`, also served
//! without `/v1`): a request checked into token ids and [`Params`](super::worker::Params),
//! the answer shaped as OpenAI's clients read it.

use std::time::Instant;

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::answer::{self, Calling, Shape};
use super::error::{ApiError, Body};
use super::generation::{self, Answer, Started, collect, id, now, start, usage};
use super::request::{ChatRequest, CompletionRequest, Dialect};
use super::stream::{Format, Piece, stream};
use super::worker::Lane;
use super::worker::choose::TokenProbs;
use crate::tokenizer::Tokenizer;

/// `GET /v1/models`.
pub async fn models(State(state): State<AppState>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": &*state.model_id, "object": "model", "created": now(), "owned_by": "appliance",
            "aliases": &*state.aliases, "tags": &*state.tags,
            "meta": state.ready.get().map(|r| json!({ "n_ctx": r.context, "n_vocab": r.tokenizer.vocab_size() })),
        }],
    }))
    .into_response()
}

fn include_usage(request_knobs: &super::request::Knobs) -> Format {
    Format::OpenAi {
        include_usage: request_knobs
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage),
    }
}

/// The fields every answer and chunk of one response shares.
struct Envelope {
    id: String,
    created: u64,
    model: String,
    fingerprint: String,
}

impl Envelope {
    fn new(state: &AppState, prefix: &str) -> Envelope {
        Envelope {
            id: id(prefix),
            created: now(),
            model: state.model_id.to_string(),
            fingerprint: state.fingerprint.to_string(),
        }
    }

    fn body(&self, object: &str, choices: Value) -> Value {
        json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "system_fingerprint": self.fingerprint, "choices": choices,
        })
    }

    /// A whole (not streamed) answer with its usage and llama.cpp's timings.
    fn whole(
        &self,
        object: &str,
        choices: Vec<Value>,
        started: &Started,
        answers: &[Answer],
    ) -> Value {
        let mut body = self.body(object, json!(choices));
        body["usage"] = usage(started.prompt_tokens, answers.iter().map(|a| &a.summary));
        body["timings"] = json!(answers.first().map(|a| &a.summary));
        body
    }

    /// A stream's chunks for a choice's end (its finish reason and timings) and the final
    /// usage; `ended` is the dialect's choice object for a finish reason.
    fn closing(&self, object: &str, piece: Piece, ended: fn(usize, &str) -> Value) -> Vec<Value> {
        match piece {
            Piece::End { choice, summary } => {
                let mut last = self.body(object, json!([ended(choice, summary.finish.openai())]));
                last["timings"] = json!(summary);
                vec![last]
            }
            Piece::Usage { usage, timings } => {
                let mut last = self.body(object, json!([]));
                last["usage"] = usage;
                last["timings"] = json!(timings);
                vec![last]
            }
            Piece::Text { .. } | Piece::Failed(_) | Piece::Progress => Vec::new(),
        }
    }
}

/// A chat request checked and queued: what the chat and the Responses dialects both shape.
pub struct ChatRun<'s> {
    /// The request.
    pub request: ChatRequest,
    /// The loaded model.
    pub ready: &'s super::Ready,
    /// Its generation.
    pub started: Started,
    /// How its answer is split (reasoning, calls).
    pub shape: Shape,
    /// Whether token probabilities were asked for.
    pub with_probs: bool,
    /// The prompt as rendered, when the answer is to carry it ([`generation::verbose`]).
    pub verbose: Option<String>,
}

/// Checks a chat request's `body`, renders and tokenizes its prompt, and queues it.
pub async fn start_chat<'s>(
    state: &'s AppState,
    lane: Lane,
    body: &[u8],
    arrived: Instant,
) -> Result<ChatRun<'s>, ApiError> {
    let (request, ready, mut params) =
        generation::checked::<ChatRequest>(state, body, Dialect::Chat)?;
    let (calling, vars) = tool_calling(ready, &request, &mut params)?;
    let messages = generation::chat_messages(ready, &request, calling.as_ref())?;
    let cue = generation::Cue::of(&request, &messages)?;
    let shape = reasoning_shape(
        ready,
        &request,
        (&messages, cue),
        &vars,
        &mut params,
        calling,
    )?;
    let place = generation::reserve(ready, lane)?;
    let prompt = generation::chat_prompt(state, messages, vars, cue, lane).await?;
    let with_probs = params.logprobs.is_some();
    let verbose = generation::verbose(state, ready, &request.knobs, &prompt);
    let started = start(ready, prompt, params, place, arrived)?;
    Ok(ChatRun {
        request,
        ready,
        started,
        shape,
        with_probs,
        verbose,
    })
}

/// How many tokens a chat request's prompt is, rendered as it would be answered.
pub async fn chat_prompt_tokens(
    state: &AppState,
    lane: Lane,
    body: &[u8],
) -> Result<usize, ApiError> {
    let (request, ready, mut params) =
        generation::checked::<ChatRequest>(state, body, Dialect::Chat)?;
    let (calling, vars) = tool_calling(ready, &request, &mut params)?;
    let messages = generation::chat_messages(ready, &request, calling.as_ref())?;
    let cue = generation::Cue::of(&request, &messages)?;
    let prompt = generation::chat_prompt(state, messages, vars, cue, lane).await?;
    Ok(prompt.ids.len())
}

/// `POST /v1/chat/completions/input_tokens`: the prompt's length, with nothing generated.
pub async fn chat_input_tokens(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let tokens = chat_prompt_tokens(&state, lane, &body).await?;
    Ok(
        axum::Json(json!({ "object": "response.input_tokens", "input_tokens": tokens }))
            .into_response(),
    )
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let ChatRun {
        request,
        ready,
        mut started,
        shape,
        with_probs,
        verbose,
    } = start_chat(&state, lane, &body, Instant::now()).await?;
    let envelope = Envelope::new(&state, "chatcmpl");
    let tokenizer = std::sync::Arc::clone(&ready.tokenizer);
    let logprobs = move |probs: &[TokenProbs]| {
        with_probs.then(|| json!({ "content": chat_logprobs(&tokenizer, probs), "refusal": null }))
    };
    if !request.knobs.stream {
        let answers = collect(&mut started).await?;
        let choices: Vec<Value> = answers
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let (message, finish, tally) = shape.message(&a.text, a.summary.finish.openai());
                if let Some(t) = tally {
                    state.metrics.tool_answer(t.calls, t.broken);
                }
                json!({
                    "index": i, "message": message, "finish_reason": finish,
                    "logprobs": logprobs(&a.probs),
                })
            })
            .collect();
        let mut body = envelope.whole("chat.completion", choices, &started, &answers);
        if let Some(prompt) = verbose {
            body["__verbose"] = json!({ "prompt": prompt });
        }
        return Ok(axum::Json(body).into_response());
    }
    const CHUNK: &str = "chat.completion.chunk";
    let first = (0..started.choices)
        .map(|i| {
            envelope.body(CHUNK, json!([{
                "index": i, "delta": { "role": "assistant", "content": null }, "finish_reason": null,
            }]))
        })
        .collect();
    let format = include_usage(&request.knobs);
    let streaming = (!shape.is_plain()).then(|| shape.streaming(started.choices));
    let metrics = std::sync::Arc::clone(&state.metrics);
    let chunk = move |choice: usize, delta: Value, finish: Option<&str>, probs: Option<Value>| {
        envelope.body(
            CHUNK,
            json!([{ "index": choice, "delta": delta, "finish_reason": finish, "logprobs": probs }]),
        )
    };
    Ok(stream(started, first, format, move |piece| match piece {
        Piece::Text {
            choice,
            text,
            probs,
            ..
        } => match &streaming {
            None => vec![chunk(
                choice,
                json!({ "content": text }),
                None,
                logprobs(&probs),
            )],
            Some(s) => {
                let mut deltas = s.text(choice, &text);
                if deltas.is_empty() && with_probs {
                    // The text is held back (it may open a call); its probabilities are not.
                    deltas.push(json!({}));
                }
                let mut probs = logprobs(&probs);
                deltas
                    .into_iter()
                    .map(|d| chunk(choice, d, None, probs.take()))
                    .collect()
            }
        },
        Piece::End { choice, summary } => {
            let (mut out, finish) = match &streaming {
                None => (Vec::new(), summary.finish.openai()),
                Some(s) => {
                    let (deltas, finish, tally) = s.end(choice, summary.finish.openai());
                    if let Some(t) = tally {
                        metrics.tool_answer(t.calls, t.broken);
                    }
                    let out = deltas
                        .into_iter()
                        .map(|d| chunk(choice, d, None, None))
                        .collect();
                    (out, finish)
                }
            };
            let mut last = chunk(choice, json!({}), Some(finish), None);
            last["timings"] = json!(summary);
            out.push(last);
            out
        }
        Piece::Failed(_) => Vec::new(),
        Piece::Progress => vec![chunk(0, json!({}), None, None)],
        Piece::Usage { usage, timings } => {
            let mut last = chunk(0, json!({}), None, None);
            last["choices"] = json!([]);
            last["usage"] = usage;
            last["timings"] = json!(timings);
            vec![last]
        }
    }))
}

/// The request's tools and template variables ([`answer::for_chat`]), the calls' grammar
/// joining the parameters; a grammar asked for otherwise cannot be combined with tools.
fn tool_calling(
    ready: &super::Ready,
    request: &ChatRequest,
    params: &mut super::worker::Params,
) -> Result<(Option<Calling>, crate::chat::Vars), ApiError> {
    let (calling, vars) = answer::for_chat(&ready.template, request, &ready.defaults)?;
    if let Some(calling) = &calling {
        if params.grammar.is_some() {
            return Err(ApiError::bad_request(
                "tools cannot be combined with response_format, json_schema or grammar: calls \
                 follow their tools' schemas (use tool_choice \"none\" for a constrained answer)",
            ));
        }
        params.grammar = Some(std::sync::Arc::clone(&calling.grammar));
        params.grammar_trigger = calling.trigger();
        params.grammar_anchored = calling.syntax.opens_the_answer();
    }
    Ok((calling, vars))
}

/// How the answer is split: its reasoning (when the template has a thinking syntax and the
/// request's `reasoning_format` asks for it) and its calls; the thinking budget joins the
/// parameters.
fn reasoning_shape(
    ready: &super::Ready,
    request: &ChatRequest,
    (messages, cue): (&[crate::chat::Message], generation::Cue),
    vars: &crate::chat::Vars,
    params: &mut super::worker::Params,
    calling: Option<Calling>,
) -> Result<Shape, ApiError> {
    let format = request.reasoning_format(&ready.defaults)?;
    let thinking = ready.template.thinking();
    // Without the cue nothing the template adds opens a block.
    let open = cue != generation::Cue::Nothing
        && thinking.is_some_and(|t| {
            ready
                .template
                .opens_thinking(messages, vars, t, cue == generation::Cue::Continue)
        });
    if let (Some(t), Some(tokens)) = (thinking, ready.defaults.reasoning_budget) {
        params.thinking_budget = Some(crate::reasoning::Budget {
            thinking: t,
            open,
            tokens,
            // The closer alone: never the BOS a tokenizer puts first.
            closer: ready
                .tokenizer
                .encode(t.cut(), true)
                .into_iter()
                .filter(|&id| Some(id) != ready.tokenizer.bos_id())
                .collect(),
        });
    }
    // An answer held to a grammar from its first byte (a required call, a JSON schema) has
    // no thinking block, whatever the prompt left open.
    let whole_answer_constrained = params.grammar.is_some() && params.grammar_trigger.is_none();
    if !whole_answer_constrained {
        params.thinking_block = thinking.map(|t| (t, open));
    }
    let thinking =
        thinking.filter(|_| format != crate::reasoning::Format::None && !whole_answer_constrained);
    Ok(Shape {
        thinking: thinking.map(|t| (t, open)),
        keep_reasoning_in_content: thinking.is_some()
            && format == crate::reasoning::Format::DeepseekLegacy,
        calling,
    })
}

/// A token's text as OpenAI reports it (its bytes beside, for tokens that split a character).
fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// The chat dialect's `logprobs.content` (with `post_sampling_probs`, llama.cpp's `prob` and
/// `top_probs` in place of `logprob` and `top_logprobs`).
pub fn chat_logprobs(tokenizer: &Tokenizer, probs: &[TokenProbs]) -> Vec<Value> {
    probs
        .iter()
        .map(|p| {
            let (value, top_name) = p.names();
            let entry = |id: u32, logprob: f64| {
                let (token, bytes) = token_text(tokenizer, id);
                let mut e = json!({ "token": token, "bytes": bytes });
                e[value] = json!(p.shown(logprob));
                e
            };
            let mut e = entry(p.id, p.logprob);
            e[top_name] = p.top.iter().map(|&(id, lp)| entry(id, lp)).collect();
            e
        })
        .collect()
}

/// The legacy completions dialect's `logprobs`, with text offsets counted from `offset`.
fn completion_logprobs(tokenizer: &Tokenizer, probs: &[TokenProbs], offset: &mut usize) -> Value {
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top_logprobs = Vec::new();
    let mut text_offset = Vec::new();
    for p in probs {
        let (token, _) = token_text(tokenizer, p.id);
        text_offset.push(*offset);
        *offset += token.len();
        tokens.push(token);
        token_logprobs.push(p.logprob);
        let top: serde_json::Map<String, Value> = p
            .top
            .iter()
            .map(|&(id, logprob)| (token_text(tokenizer, id).0, json!(logprob)))
            .collect();
        top_logprobs.push(top);
    }
    json!({
        "tokens": tokens, "token_logprobs": token_logprobs,
        "top_logprobs": top_logprobs, "text_offset": text_offset,
    })
}

/// A completion with a `suffix`: the gap between its prompt (one text) and the suffix, for a
/// vocabulary with fill-in-the-middle tokens; `None` without a suffix.
fn fill_in_the_middle(
    ready: &super::Ready,
    request: &CompletionRequest,
) -> Result<Option<(crate::tokenizer::Fim, super::infill::Gap)>, ApiError> {
    let suffix = match request.knobs.extra.get("suffix") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::bad_request("suffix must be a string")),
    };
    let fim = ready.tokenizer.fim().ok_or_else(|| {
        ApiError::bad_request(
            "suffix needs a model whose vocabulary has fill-in-the-middle tokens; this one has \
             none (leave suffix out, or serve a code model)",
        )
    })?;
    let prefix = match &request.prompt {
        Value::String(s) => s.clone(),
        Value::Array(items) if items.len() == 1 && items[0].is_string() => {
            items[0].as_str().unwrap_or_default().to_string()
        }
        _ => {
            return Err(ApiError::bad_request(
                "with a suffix, prompt must be one text (the code before the gap)",
            ));
        }
    };
    Ok(Some((
        fim,
        super::infill::Gap {
            prefix,
            suffix,
            ..super::infill::Gap::default()
        },
    )))
}

/// `POST /v1/completions`.
pub async fn completions(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let (request, ready, params) =
        generation::checked::<CompletionRequest>(&state, &body, Dialect::Completions)?;
    let gap = fill_in_the_middle(ready, &request)?;
    let place = generation::reserve(ready, lane)?;
    let prompt = match gap {
        Some((fim, gap)) => {
            generation::infill_prompt(&state, ready, fim, gap, params.max_tokens, lane).await?
        }
        None => generation::completion_prompt(&state, ready, &request.prompt, lane).await?,
    };
    let with_probs = params.logprobs.is_some();
    let mut started = start(ready, prompt, params, place, arrived)?;
    let envelope = Envelope::new(&state, "cmpl");
    let tokenizer = std::sync::Arc::clone(&ready.tokenizer);
    const OBJECT: &str = "text_completion";
    if !request.knobs.stream {
        let answers = collect(&mut started).await?;
        let choices: Vec<Value> = answers
            .iter()
            .enumerate()
            .map(|(i, a)| {
                let logprobs =
                    with_probs.then(|| completion_logprobs(&tokenizer, &a.probs, &mut 0));
                json!({ "index": i, "text": a.text, "finish_reason": a.summary.finish.openai(), "logprobs": logprobs })
            })
            .collect();
        return Ok(axum::Json(envelope.whole(OBJECT, choices, &started, &answers)).into_response());
    }
    // Text offsets count on from chunk to chunk, per choice.
    let offsets = std::sync::Mutex::new(vec![0usize; started.choices]);
    let first = vec![envelope.body(
        OBJECT,
        json!([{
            "index": 0, "text": "", "finish_reason": null, "logprobs": null,
        }]),
    )];
    let format = include_usage(&request.knobs);
    Ok(stream(started, first, format, move |piece| {
        match piece {
        Piece::Text {
            choice,
            text,
            probs,
            ..
        } => {
            let logprobs = with_probs.then(|| {
                let mut offsets = offsets.lock().unwrap_or_else(|p| p.into_inner());
                let mut none = 0;
                let offset = offsets.get_mut(choice).unwrap_or(&mut none);
                completion_logprobs(&tokenizer, &probs, offset)
            });
            vec![envelope.body(OBJECT, json!([{
                "index": choice, "text": text, "finish_reason": null, "logprobs": logprobs,
            }]))]
        }
        Piece::Progress => vec![envelope.body(OBJECT, json!([{
            "index": 0, "text": "", "finish_reason": null, "logprobs": null,
        }]))],
        other => envelope.closing(OBJECT, other, |choice, finish| {
            json!({ "index": choice, "text": "", "finish_reason": finish, "logprobs": null })
        }),
    }
    }))
}
