//! OpenAI's Responses API (`POST /v1/responses`, also without `/v1`): the request is read as
//! the chat it means ([`input`]), answered by the chat path (template, tools, reasoning), and
//! its answer shaped as output items ([`output`]): whole, or streamed as typed events
//! (`response.created` … `response.completed`). Nothing is kept after the answer, so a
//! request that points at an earlier response is refused.

mod input;
mod output;

use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::AppState;
use super::error::{ApiError, Body, parse};
use super::generation::{collect, id, now, usage};
use super::openai::{ChatRun, start_chat};
use super::stream::{Format, Piece, stream};
use super::worker::{Lane, Summary};
use output::Output;

/// Fields of the request a response repeats, as OpenAI's do.
const ECHOED: &[&str] = &[
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "reasoning",
    "metadata",
    "user",
];

/// What every state of one response shares.
struct Head {
    id: String,
    created_at: u64,
    model: String,
    echoed: Map<String, Value>,
}

impl Head {
    fn new(state: &AppState, asked: &Value) -> Head {
        let echoed = ECHOED
            .iter()
            .filter_map(|&f| {
                let v = asked.get(f).filter(|v| !v.is_null())?;
                Some((f.to_string(), v.clone()))
            })
            .collect();
        Head {
            id: id("resp").replacen('-', "_", 1),
            created_at: now(),
            model: state.model_id.to_string(),
            echoed,
        }
    }

    /// The response object: `in_progress` with no output yet, or ended with its items.
    fn response(&self, status: &str, output: &[Value], usage: Option<Value>) -> Value {
        let mut r = json!({
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": status, "model": self.model, "output": output,
            "error": null, "incomplete_details": null, "store": false,
            "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
            "text": { "format": { "type": "text" } }, "metadata": {},
            "usage": usage,
        });
        if status == "incomplete" {
            r["incomplete_details"] = json!({ "reason": "max_output_tokens" });
        }
        for (field, value) in &self.echoed {
            r[field] = value.clone();
        }
        r
    }
}

/// An ended answer's status: cut at the token limit is `incomplete`.
fn status(finish: &str) -> &'static str {
    if finish == "length" {
        "incomplete"
    } else {
        "completed"
    }
}

/// The chat usage in the Responses API's names.
fn response_usage(prompt_tokens: usize, summary: &Summary) -> Value {
    let u = usage(prompt_tokens, std::iter::once(summary));
    json!({
        "input_tokens": u["prompt_tokens"],
        "input_tokens_details": { "cached_tokens": u["prompt_tokens_details"]["cached_tokens"] },
        "output_tokens": u["completion_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": u["completion_tokens_details"]["reasoning_tokens"],
        },
        "total_tokens": u["total_tokens"],
    })
}

/// `POST /v1/responses`.
pub async fn responses(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let asked: Value = parse(&body)?;
    let chat = input::to_chat(&asked)?;
    let chat = serde_json::to_vec(&chat).map_err(|e| ApiError::internal(e.to_string()))?;
    let ChatRun {
        request,
        mut started,
        shape,
        ..
    } = start_chat(&state, lane, &chat, arrived).await?;
    let head = Head::new(&state, &asked);
    let prompt_tokens = started.prompt_tokens;
    if !request.knobs.stream {
        let answer = collect(&mut started)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| ApiError::internal("the generation ended without an answer"))?;
        let (message, finish, tally) = shape.message(&answer.text, answer.summary.finish.openai());
        if let Some(t) = tally {
            state.metrics.tool_answer(t.calls, t.broken);
        }
        let mut out = Output::default();
        out.message(&message);
        let status = status(finish);
        out.finish(status == "incomplete");
        let usage = response_usage(prompt_tokens, &answer.summary);
        let mut body = head.response(status, out.items(), Some(usage));
        body["timings"] = json!(answer.summary);
        return Ok(axum::Json(body).into_response());
    }
    let streaming = (!shape.is_plain()).then(|| shape.streaming(1));
    let metrics = std::sync::Arc::clone(&state.metrics);
    let numbered = Mutex::new(Numbered {
        next: 0,
        output: Output::default(),
    });
    let first = {
        let mut n = numbered.lock().unwrap_or_else(|p| p.into_inner());
        let r = head.response("in_progress", &[], None);
        let created = json!({ "type": "response.created", "response": r });
        let progress = json!({ "type": "response.in_progress", "response": r });
        n.number(vec![created, progress])
    };
    Ok(stream(started, first, Format::Responses, move |piece| {
        let mut n = numbered.lock().unwrap_or_else(|p| p.into_inner());
        match piece {
            Piece::Text { text, .. } => {
                match &streaming {
                    None => n.output.delta(&json!({ "content": text })),
                    Some(s) => {
                        for d in s.text(0, &text) {
                            n.output.delta(&d);
                        }
                    }
                }
                let events = n.output.take_events();
                n.number(events)
            }
            Piece::End { summary, .. } => {
                let finish = match &streaming {
                    None => summary.finish.openai(),
                    Some(s) => {
                        let (deltas, finish, tally) = s.end(0, summary.finish.openai());
                        if let Some(t) = tally {
                            metrics.tool_answer(t.calls, t.broken);
                        }
                        for d in &deltas {
                            n.output.delta(d);
                        }
                        finish
                    }
                };
                let status = status(finish);
                n.output.finish(status == "incomplete");
                let mut events = n.output.take_events();
                let usage = response_usage(prompt_tokens, &summary);
                let r = head.response(status, n.output.items(), Some(usage));
                let kind = if status == "completed" {
                    "response.completed"
                } else {
                    "response.incomplete"
                };
                events.push(json!({ "type": kind, "response": r, "timings": summary }));
                n.number(events)
            }
            Piece::Failed(error) => {
                // The error event, then the response as failed: a client waiting for the
                // response's end gets one.
                let (code, message) = (&error["error"]["type"], &error["error"]["message"]);
                let mut r = head.response("failed", n.output.items(), None);
                r["error"] = json!({ "code": code, "message": message });
                n.number(vec![
                    json!({ "type": "error", "code": code, "message": message, "param": null }),
                    json!({ "type": "response.failed", "response": r }),
                ])
            }
            Piece::Progress => {
                let r = head.response("in_progress", &[], None);
                n.number(vec![
                    json!({ "type": "response.in_progress", "response": r }),
                ])
            }
            Piece::Usage { .. } => Vec::new(),
        }
    }))
}

/// `POST /v1/responses/input_tokens`: the prompt's length, with nothing generated.
pub async fn input_tokens(
    State(state): State<AppState>,
    Extension(lane): Extension<Lane>,
    Body(body): Body,
) -> Result<Response, ApiError> {
    let chat = input::to_chat(&parse(&body)?)?;
    let chat = serde_json::to_vec(&chat).map_err(|e| ApiError::internal(e.to_string()))?;
    let tokens = super::openai::chat_prompt_tokens(&state, lane, &chat).await?;
    Ok(
        axum::Json(json!({ "object": "response.input_tokens", "input_tokens": tokens }))
            .into_response(),
    )
}

/// A stream's output and the number its next event gets (`sequence_number`).
struct Numbered {
    next: u64,
    output: Output,
}

impl Numbered {
    fn number(&mut self, mut events: Vec<Value>) -> Vec<Value> {
        for e in &mut events {
            e["sequence_number"] = json!(self.next);
            self.next += 1;
        }
        events
    }
}
