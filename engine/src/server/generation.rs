//! What every generation endpoint shares: a request's prompt made into token ids off the
//! async threads, its job queued on the generation thread, and its answer gathered.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::answer::Calling;
use super::error::{ApiError, parse};
use super::request::{self, ChatRequest, Dialect, PromptPiece};
use super::worker::choose::TokenProbs;
use super::worker::{self, Event, Job, Lane, Params, Place, Prompt, Summary};
use super::{AppState, Ready};
use crate::chat::{Message, PromptError};
use crate::tokenizer::{Budget, Stopped};

/// A generation request's body parsed and checked: the request, the loaded model, and the
/// parameters it generates with.
pub fn checked<'s, R: request::Generating>(
    state: &'s AppState,
    body: &[u8],
    dialect: Dialect,
) -> Result<(R, &'s Ready, Params), ApiError> {
    let request: R = parse_naming_the_field(body)?;
    let ready = super::ready(state)?;
    let params = request
        .knobs()
        .params(dialect, &ready.defaults, &ready.tokenizer)?;
    Ok((request, ready, params))
}

/// A request body parsed; when a field has the wrong type, the 400 names it (serde cannot
/// through the flattened knobs).
fn parse_naming_the_field<R: request::Generating>(body: &[u8]) -> Result<R, ApiError> {
    let value: Value = parse(body)?;
    serde_json::from_value(value.clone()).map_err(|e| {
        let wrong = value.as_object().and_then(|fields| {
            fields.iter().find_map(|(name, v)| {
                serde_json::from_value::<request::Knobs>(json!({ name: v }))
                    .err()
                    .map(|e| format!("`{name}`: {e}"))
            })
        });
        ApiError::bad_request(format!(
            "invalid request body: {}",
            wrong.unwrap_or_else(|| e.to_string())
        ))
    })
}

/// A queued generation: its events, the prompt's length and how many choices will come.
pub struct Started {
    /// Events from the generation thread.
    pub events: UnboundedReceiver<Event>,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Choices asked for.
    pub choices: usize,
}

/// A place in the request's queue, taken before its prompt is tokenized: a request the queue
/// would refuse is refused before it costs any work.
pub fn reserve(ready: &Ready, lane: Lane) -> Result<Place, ApiError> {
    ready.worker.reserve(lane).map_err(refusal)
}

fn refusal(refused: worker::Refused) -> ApiError {
    match refused {
        worker::Refused::Full => ApiError::unavailable("the request queue is full; retry shortly"),
        worker::Refused::Stopped => ApiError::unavailable(SHUTTING_DOWN),
    }
}

/// Queues `prompt` with `params` in its `place`; a prompt that leaves no room to answer gets
/// llama.cpp's context-size error.
pub fn start(
    ready: &Ready,
    prompt: Prompt,
    params: Params,
    place: Place,
    arrived: Instant,
) -> Result<Started, ApiError> {
    let Prompt {
        ids: prompt,
        turn_end,
    } = prompt;
    if prompt.len() >= ready.context {
        return Err(ApiError::exceeds_context(prompt.len(), ready.context));
    }
    let (events, receiver) = unbounded_channel();
    let prompt_tokens = prompt.len();
    let choices = params.choices;
    let lane = place.lane();
    ready
        .worker
        .submit(
            place,
            Job {
                prompt,
                turn_end,
                params,
                lane,
                arrived,
                events,
            },
        )
        .map_err(refusal)?;
    Ok(Started {
        events: receiver,
        prompt_tokens,
        choices,
    })
}

/// One finished choice.
pub struct Answer {
    /// Its text.
    pub text: String,
    /// Its tokens' probabilities, when asked for.
    pub probs: Vec<TokenProbs>,
    /// How it went.
    pub summary: Summary,
}

/// Waits for every choice, in order.
pub async fn collect(started: &mut Started) -> Result<Vec<Answer>, ApiError> {
    let mut answers: Vec<Answer> = Vec::new();
    let mut current = (String::new(), Vec::new());
    while let Some(event) = started.events.recv().await {
        match event {
            Event::Text { text, probs, .. } => {
                current.0.push_str(&text);
                current.1.extend(probs);
            }
            Event::Done { summary, .. } => {
                let (text, probs) = std::mem::take(&mut current);
                answers.push(Answer {
                    text,
                    probs,
                    summary,
                });
                if answers.len() == started.choices {
                    return Ok(answers);
                }
            }
            Event::Progress(_) => {}
            Event::Failed(failure) => return Err(failed(failure)),
            Event::ShuttingDown => return Err(ApiError::unavailable(SHUTTING_DOWN)),
        }
    }
    Err(ApiError::internal("the generation thread stopped"))
}

/// A failed generation as the client is told: its own request's fault (400) or the engine's.
pub fn failed(failure: worker::Failure) -> ApiError {
    match failure {
        worker::Failure::Request(why) => ApiError::bad_request(why),
        worker::Failure::Engine(why) => ApiError::internal(why),
    }
}

/// What a request cut off by the engine's shutdown is told.
pub const SHUTTING_DOWN: &str =
    "the engine is shutting down; the answer was cut off (retry shortly)";

/// OpenAI's `usage`: the prompt once, the tokens of every choice (those spent thinking among
/// them), and how much of the prompt came from the prefix cache.
pub fn usage<'a>(prompt_tokens: usize, summaries: impl IntoIterator<Item = &'a Summary>) -> Value {
    let mut completion = 0;
    let mut reasoning = 0;
    let mut cached = None;
    for s in summaries {
        completion += s.timings.predicted_n;
        reasoning += s.reasoning_n;
        cached.get_or_insert(s.timings.cache_n);
    }
    json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "prompt_tokens_details": { "cached_tokens": cached.unwrap_or(0) },
        "completion_tokens_details": { "reasoning_tokens": reasoning },
    })
}

/// The prompt as the model reads it (its tokens' text), when the answer is to carry it in
/// `__verbose`: the request asks (`"verbose": true`) or the server always does (`--verbose`).
pub fn verbose(
    state: &AppState,
    ready: &Ready,
    knobs: &request::Knobs,
    prompt: &worker::Prompt,
) -> Option<String> {
    let asked = knobs.extra.get("verbose") == Some(&Value::Bool(true));
    (asked || state.verbose).then(|| ready.tokenizer.decode(&prompt.ids))
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A response id, unique within this process.
pub fn id(prefix: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
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

/// Runs tokenization of `bytes` of text on a blocking thread in its turn at the shared
/// budget ([`super::tokenizing`]), so a long prompt never stalls other connections and many
/// at once cannot exhaust memory. When the client goes away (the handler's future is
/// dropped), the work stops at its next piece instead of running to the end for nobody. The
/// text was bounded by [`check_text_size`], so a prompt over the context is counted whole:
/// the error can say by how much.
async fn tokenize_off_thread<T: Send + 'static>(
    state: &AppState,
    bytes: usize,
    lane: Lane,
    work: impl FnOnce(&Ready, &Budget<'_>) -> Result<T, PromptError> + Send + 'static,
) -> Result<T, ApiError> {
    let turn = state.tokenizing.enter(bytes, lane).await?;
    let ready = Arc::clone(&state.ready);
    let gone = CancelOnDrop(Arc::new(AtomicBool::new(false)));
    let cancelled = Arc::clone(&gone.0);
    let tokenized = tokio::task::spawn_blocking(move || {
        let Some(r) = ready.get() else {
            return Err(ApiError::unavailable(
                "the model is loading; try again shortly",
            ));
        };
        let budget = Budget {
            max_tokens: r.context.saturating_mul(BYTES_PER_TOKEN_BOUND),
            cancelled: &|| cancelled.load(Ordering::Relaxed),
        };
        work(r, &budget).map_err(|e| match e {
            PromptError::Template(e) => ApiError::bad_request(e),
            PromptError::Stopped(Stopped::TooLong { max_tokens }) => {
                ApiError::exceeds_context(max_tokens + 1, r.context)
            }
            // Nobody reads this answer.
            PromptError::Stopped(Stopped::Cancelled) => {
                ApiError::bad_request("the client went away")
            }
        })
    })
    .await
    .map_err(|e| ApiError::internal(format!("tokenizing: {e}")))?;
    drop((gone, turn));
    tokenized
}

/// Sets its flag when dropped: the request it belongs to is over.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A chat's messages, the configured system prompt first when it brings none; for a template
/// that takes no tools, the tools and past calls written as text (the documented fallback).
pub fn chat_messages(
    ready: &Ready,
    request: &ChatRequest,
    calling: Option<&Calling>,
) -> Result<Vec<Message>, ApiError> {
    let mut messages = request::messages(&request.messages)?;
    if let Some(system) = &ready.system_prompt
        && messages.first().is_none_or(|m| m.role != "system")
    {
        messages.insert(0, Message::new("system", system));
    }
    if ready.template.tool_syntax().is_none() {
        messages = crate::tools::describe(messages, calling.map(|c| &*c.request));
    }
    check_text_size(ready, text_bytes(&messages))?;
    Ok(messages)
}

fn text_bytes(messages: &[Message]) -> usize {
    messages
        .iter()
        .map(|m| {
            let calls = m.tool_calls.iter().flatten();
            m.content.len() + m.role.len() + calls.map(|c| c.to_string().len()).sum::<usize>()
        })
        .sum()
}

/// How a chat's prompt ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cue {
    /// With the template's generation cue: the answer is a new turn.
    Answer,
    /// Without it (`add_generation_prompt: false`): the model goes on after the last turn.
    Nothing,
    /// Inside the last message, an assistant's, cut after its text: the answer continues it
    /// (assistant prefill, transformers' `continue_final_message`).
    Continue,
}

impl Cue {
    /// As `request` asks, read as llama.cpp reads `add_generation_prompt` and
    /// `continue_final_message`: a final non-empty assistant message is continued anyway, and
    /// asking to continue needs the cue turned off.
    pub fn of(request: &ChatRequest, messages: &[Message]) -> Result<Cue, ApiError> {
        let asked = match &request.continue_final_message {
            None | Some(Value::Null | Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(Value::String(s)) if s == "content" => true,
            Some(Value::String(s)) if s == "reasoning_content" => {
                return Err(ApiError::bad_request(
                    "continue_final_message \"reasoning_content\" is not supported: past \
                     reasoning is not given to the template (continue the \"content\")",
                ));
            }
            Some(_) => {
                return Err(ApiError::bad_request(
                    "continue_final_message must be true, false or \"content\"",
                ));
            }
        };
        let last = messages.last();
        if asked {
            if request.add_generation_prompt != Some(false) {
                return Err(ApiError::bad_request(
                    "continue_final_message and add_generation_prompt cannot both be true (set \
                     add_generation_prompt to false)",
                ));
            }
            if last.is_none_or(|m| m.role != "assistant") {
                return Err(ApiError::bad_request(
                    "continue_final_message needs the last message to be the assistant's",
                ));
            }
        }
        if asked || continues(messages) {
            if last.is_some_and(|m| m.tool_calls.as_ref().is_some_and(|c| !c.is_empty())) {
                return Err(ApiError::bad_request(
                    "the last message holds tool_calls: an assistant message with calls cannot \
                     be continued (send the calls' results, or drop them)",
                ));
            }
            return Ok(Cue::Continue);
        }
        Ok(match request.add_generation_prompt {
            Some(false) => Cue::Nothing,
            _ => Cue::Answer,
        })
    }
}

/// A chat's prompt ids, ending as `cue` says. With the generation cue, where it begins: a
/// later turn of the same chat shares the prompt up to there (a template may write a past
/// answer differently from the cue it followed), so a recurrent state is checkpointed there.
pub async fn chat_prompt(
    state: &AppState,
    messages: Vec<Message>,
    vars: crate::chat::Vars,
    cue: Cue,
    lane: Lane,
) -> Result<Prompt, ApiError> {
    let bytes = text_bytes(&messages);
    tokenize_off_thread(state, bytes, lane, move |r, budget| {
        match cue {
            Cue::Continue => {
                let ids =
                    r.template
                        .continuation_ids_within(&r.tokenizer, &messages, &vars, budget)?;
                return Ok(Prompt::new(ids));
            }
            Cue::Nothing => {
                let ids = r
                    .template
                    .ids_within(&r.tokenizer, &messages, false, &vars, budget)?;
                return Ok(Prompt::new(ids));
            }
            Cue::Answer => {}
        }
        let ids = r
            .template
            .ids_within(&r.tokenizer, &messages, true, &vars, budget)?;
        let asked = r
            .template
            .ids_within(&r.tokenizer, &messages, false, &vars, budget)?;
        let cue = ids.iter().zip(&asked).take_while(|(a, b)| a == b).count();
        Ok(Prompt {
            turn_end: Some(cue).filter(|&at| at > 0 && at < ids.len()),
            ids,
        })
    })
    .await
}

/// Whether a chat's last message is the beginning of the answer (a non-empty assistant
/// message), to be continued rather than answered.
fn continues(messages: &[Message]) -> bool {
    messages
        .last()
        .is_some_and(|m| m.role == "assistant" && !m.content.trim().is_empty())
}

/// A fill-in-the-middle prompt's tokens ([`super::infill::layout`]).
pub async fn infill_prompt(
    state: &AppState,
    ready: &Ready,
    fim: crate::tokenizer::Fim,
    gap: super::infill::Gap,
    max_tokens: usize,
    lane: Lane,
) -> Result<Prompt, ApiError> {
    let bytes = gap.bytes();
    check_text_size(ready, bytes)?;
    tokenize_off_thread(state, bytes, lane, move |r, budget| {
        super::infill::layout(&r.tokenizer, fim, &gap, r.context, max_tokens, budget)
            .map(Prompt::new)
            .map_err(PromptError::Stopped)
    })
    .await
}

/// A raw prompt's tokens: its text pieces tokenized (special tokens recognised), its ids as
/// given, BOS first where the model wants it.
pub async fn completion_prompt(
    state: &AppState,
    ready: &Ready,
    prompt: &Value,
    lane: Lane,
) -> Result<Prompt, ApiError> {
    let pieces = request::prompt(prompt, ready.tokenizer.vocab_size())?;
    let bytes = pieces
        .iter()
        .map(|p| match p {
            PromptPiece::Text(t) => t.len(),
            PromptPiece::Id(_) => 1,
        })
        .sum();
    check_text_size(ready, bytes)?;
    tokenize_off_thread(state, bytes, lane, move |r, budget| {
        let bos = r.tokenizer.bos_id();
        let mut ids: Vec<u32> = bos.into_iter().collect();
        for piece in &pieces {
            match piece {
                PromptPiece::Id(id) => ids.push(*id),
                PromptPiece::Text(text) => {
                    let encoded = r
                        .tokenizer
                        .encode_within(text, true, budget)
                        .map_err(PromptError::Stopped)?;
                    let skip = usize::from(bos.is_some() && encoded.first() == bos.as_ref());
                    ids.extend_from_slice(&encoded[skip..]);
                }
            }
        }
        // A prompt of ids that starts with BOS already keeps only that one.
        if bos.is_some() && ids.len() > 1 && ids[1] == ids[0] {
            ids.remove(0);
        }
        Ok(Prompt::new(ids))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cue(body: Value, messages: &[Message]) -> Result<Cue, String> {
        let request: ChatRequest = serde_json::from_value(body).expect("request");
        Cue::of(&request, messages).map_err(|e| format!("{e:?}"))
    }

    #[test]
    fn the_cue_is_what_the_request_and_its_last_message_ask_for() {
        let asked = [Message::new("user", "Hi")];
        let begun = [Message::new("user", "Hi"), Message::new("assistant", "Hel")];
        let body = |extra: Value| {
            let mut b = json!({ "messages": [] });
            for (k, v) in extra.as_object().into_iter().flatten() {
                b[k] = v.clone();
            }
            b
        };
        assert_eq!(cue(body(json!({})), &asked), Ok(Cue::Answer));
        assert_eq!(
            cue(body(json!({ "add_generation_prompt": false })), &asked),
            Ok(Cue::Nothing)
        );
        // A begun answer is continued whatever the cue says, as llama.cpp does.
        assert_eq!(cue(body(json!({})), &begun), Ok(Cue::Continue));
        let named = json!({ "continue_final_message": "content", "add_generation_prompt": false });
        assert_eq!(cue(body(named), &begun), Ok(Cue::Continue));
        let both = cue(body(json!({ "continue_final_message": true })), &begun);
        assert!(both.is_err_and(|e| e.contains("add_generation_prompt")));
        let mut called = Message::new("assistant", "Let me look.");
        called.tool_calls = Some(vec![json!({ "id": "c1", "type": "function" })]);
        let refused = cue(body(json!({})), &[Message::new("user", "Hi"), called]);
        assert!(refused.is_err_and(|e| e.contains("tool_calls")));
        let odd = cue(body(json!({ "continue_final_message": 1 })), &begun);
        assert!(odd.is_err_and(|e| e.contains("continue_final_message")));
    }
}
