//! The "try it" box: one question passed to the engine's chat endpoint over its control socket,
//! so the engine itself is never exposed to the network and users who fill its TCP port do not
//! lock the owner out. Bounded question, bounded answer, with a deadline. The owner may let a
//! model that reasons think first and offer tools; the answer's reasoning and calls come back
//! apart from its text, and the page shows them as such.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::DashError;
use supervisor_core::engine::local::{self, Access};

/// Longest question accepted, in characters.
pub const MAX_QUESTION: usize = 2000;
/// Longest answer asked for, in tokens: enough to see the model work, short enough to be quick.
const MAX_TOKENS: u32 = 128;
/// How long the engine gets to answer.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Largest engine answer read, in bytes.
const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// Most tools the box offers with one question.
pub const MAX_TOOLS: usize = 16;

/// The browser's request.
#[derive(Debug, Deserialize)]
pub struct Question {
    /// What the user typed.
    pub message: String,
    /// Let a model that reasons think first.
    #[serde(default)]
    pub thinking: bool,
    /// Tools the model may call (OpenAI's `tools`; the engine checks them).
    #[serde(default)]
    pub tools: Option<Value>,
    /// The model must call one of the tools (`tool_choice: required`), rather than decide.
    #[serde(default)]
    pub must_call: bool,
}

/// Asks the engine through `access` and returns its answer and the engine's response. The
/// request carries the launch's control key: the owner trying the box is served even while
/// users fill the engine's queue.
pub fn ask(access: &Access, question: &Question) -> Result<Value, DashError> {
    let message = question.message.trim();
    if message.is_empty() {
        return Err(DashError::BadRequest("the question is empty".into()));
    }
    if message.chars().count() > MAX_QUESTION {
        return Err(DashError::BadRequest(format!(
            "the question is longer than {MAX_QUESTION} characters"
        )));
    }
    let mut body = json!({
        "messages": [{ "role": "user", "content": message }],
        "max_tokens": MAX_TOKENS,
        "chat_template_kwargs": { "enable_thinking": question.thinking },
    });
    match &question.tools {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) if tools.len() <= MAX_TOOLS => {
            body["tools"] = json!(tools);
            body["tool_choice"] = json!(if question.must_call {
                "required"
            } else {
                "auto"
            });
        }
        Some(_) => {
            return Err(DashError::BadRequest(format!(
                "the tools must be a list of at most {MAX_TOOLS} OpenAI tools"
            )));
        }
    }
    let unavailable =
        |e: String| DashError::EngineUnavailable(format!("the engine did not answer: {e}"));
    let answer = local::request(
        access,
        "POST",
        "/v1/chat/completions",
        &[],
        Some(&body.to_string()),
        TIMEOUT,
        MAX_ANSWER_BYTES,
    )
    .map_err(unavailable)?;
    let (status, text) = (answer.status, answer.body);
    if status == 400 {
        // The engine names what it cannot use (a tool's schema, …): the user's to fix.
        return Err(DashError::BadRequest(text.trim().to_string()));
    }
    if status != 200 {
        return Err(unavailable(format!("status {status}: {}", text.trim())));
    }
    let answer: Value =
        serde_json::from_str(&text).map_err(|e| unavailable(format!("unexpected answer: {e}")))?;
    let message = &answer["choices"][0]["message"];
    if !message.is_object() {
        return Err(unavailable("no message in the answer".into()));
    }
    let calls: Vec<Value> = message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!({ "name": c["function"]["name"], "arguments": c["function"]["arguments"] }))
        .collect();
    Ok(json!({
        "reply": message["content"].as_str().unwrap_or(""),
        "reasoning": message["reasoning_content"],
        "tool_calls": calls,
        "usage": answer["usage"],
    }))
}
