//! Server-sent events: a generation's events shaped by its dialect into chunks. OpenAI's
//! stream ends with a usage chunk (`"choices": []`, when asked for) and `data: [DONE]`;
//! llama.cpp's native one ends with its final object. Dropping the stream (a disconnected
//! client) drops the receiver, which stops generation.

use std::convert::Infallible;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::error::ApiError;
use super::generation::{SHUTTING_DOWN, Started, failed, usage};
use super::worker::choose::TokenProbs;
use super::worker::{Event, Summary};

/// Which stream dialect.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenAI's, with a final usage chunk when `include_usage`.
    OpenAi {
        /// `stream_options.include_usage`.
        include_usage: bool,
    },
    /// llama.cpp's `/completion`.
    Native,
    /// OpenAI's Responses API: each event named by its `type`, no `[DONE]`.
    Responses,
}

impl Format {
    /// Whether the stream ends with `data: [DONE]`.
    fn says_done(self) -> bool {
        matches!(self, Format::OpenAi { .. })
    }
}

/// What a stream's shaper sees.
pub enum Piece {
    /// A choice's next text.
    Text {
        /// Which choice.
        choice: usize,
        /// The text.
        text: String,
        /// Its tokens' probabilities, when asked for.
        probs: Vec<TokenProbs>,
        /// The tokens it finishes.
        tokens: Vec<u32>,
    },
    /// The prefill went on (`return_progress`): the dialect's empty chunk, which the stream
    /// gives llama.cpp's `prompt_progress`.
    Progress,
    /// A choice ended.
    End {
        /// Which choice.
        choice: usize,
        /// How it went.
        summary: Summary,
    },
    /// The generation failed (its error as the API's body): a dialect that ends a failed
    /// stream its own way says how; the others end with the error as it is.
    Failed(Value),
    /// Every choice ended: the usage (OpenAI, when asked for), with the first choice's
    /// timings (llama-server puts them in the usage chunk too).
    Usage {
        /// OpenAI's usage object.
        usage: Value,
        /// How the first choice went.
        timings: Summary,
    },
}

/// The stream: `first`, then the shaped pieces, then the dialect's end.
pub fn stream(
    started: Started,
    first: Vec<Value>,
    format: Format,
    shape: impl Fn(Piece) -> Vec<Value> + Send + 'static,
) -> Response {
    let Started {
        events,
        prompt_tokens,
        choices,
    } = started;
    let to_events = move |values: Vec<Value>| -> Vec<SseEvent> {
        values.into_iter().map(|v| event(&v, format)).collect()
    };
    let state = Run {
        events,
        first: Some(to_events(first)),
        done: false,
        summaries: Vec::new(),
        shape,
    };
    let body = futures_util::stream::unfold(state, move |mut run| async move {
        if let Some(first) = run.first.take() {
            return Some((first, run));
        }
        if run.done {
            return None;
        }
        let out = match run.events.recv().await {
            Some(Event::Text {
                choice,
                text,
                probs,
                tokens,
                timings,
            }) => {
                let mut values = (run.shape)(Piece::Text {
                    choice,
                    text,
                    probs,
                    tokens,
                });
                if let (Some(t), Some(last)) = (timings, values.last_mut()) {
                    last["timings"] = serde_json::json!(t);
                }
                to_events(values)
            }
            Some(Event::Progress(p)) => {
                let mut values = (run.shape)(Piece::Progress);
                if let Some(last) = values.last_mut() {
                    last["prompt_progress"] = serde_json::json!(p);
                }
                to_events(values)
            }
            Some(Event::Done { choice, summary }) => {
                run.summaries.push(summary.clone());
                let mut out = to_events((run.shape)(Piece::End { choice, summary }));
                if run.summaries.len() == choices {
                    run.done = true;
                    if format
                        == (Format::OpenAi {
                            include_usage: true,
                        })
                    {
                        let usage = usage(prompt_tokens, &run.summaries);
                        let timings = run.summaries[0].clone();
                        out.extend(to_events((run.shape)(Piece::Usage { usage, timings })));
                    }
                    if format.says_done() {
                        out.push(SseEvent::default().data("[DONE]"));
                    }
                }
                out
            }
            Some(Event::Failed(failure)) => {
                run.done = true;
                final_error(&failed(failure), format, &run.shape)
            }
            Some(Event::ShuttingDown) => {
                run.done = true;
                final_error(&ApiError::unavailable(SHUTTING_DOWN), format, &run.shape)
            }
            None => return None,
        };
        Some((out, run))
    });
    let flat = futures_util::StreamExt::flat_map(body, |events: Vec<SseEvent>| {
        futures_util::stream::iter(events.into_iter().map(Ok::<_, Infallible>))
    });
    Sse::new(flat)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A stream under way.
struct Run<S> {
    events: tokio::sync::mpsc::UnboundedReceiver<Event>,
    first: Option<Vec<SseEvent>>,
    done: bool,
    summaries: Vec<Summary>,
    shape: S,
}

/// A stream's last events when it fails: the error, then (OpenAI dialect) `[DONE]`, so a
/// client can tell a cut-off answer from a connection that merely dropped.
fn final_error(
    error: &ApiError,
    format: Format,
    shape: &impl Fn(Piece) -> Vec<Value>,
) -> Vec<SseEvent> {
    let shaped = shape(Piece::Failed(error.body()));
    let mut out: Vec<SseEvent> = if shaped.is_empty() {
        vec![event(&error.body(), format)]
    } else {
        shaped.iter().map(|v| event(v, format)).collect()
    };
    if format.says_done() {
        out.push(SseEvent::default().data("[DONE]"));
    }
    out
}

/// One value as an event: named by its `type` in the Responses dialect, as OpenAI sends them.
fn event(value: &Value, format: Format) -> SseEvent {
    let data = SseEvent::default().data(value.to_string());
    match (format, value.get("type").and_then(Value::as_str)) {
        (Format::Responses, Some(name)) => data.event(name),
        _ => data,
    }
}
