//! The "try it" box: one question passed to the engine's loopback chat endpoint, so the engine
//! itself is never exposed to the network. Bounded question, bounded answer, with a deadline.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use super::error::DashError;
use crate::engine::{ControlKey, control};

/// Longest question accepted, in characters.
pub const MAX_QUESTION: usize = 2000;
/// Longest answer asked for, in tokens: enough to see the model work, short enough to be quick.
const MAX_TOKENS: u32 = 128;
/// How long the engine gets to answer.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Largest engine answer read, in bytes.
const MAX_ANSWER_BYTES: u64 = 256 * 1024;

/// The browser's request.
#[derive(Debug, Deserialize)]
pub struct Question {
    /// What the user typed.
    pub message: String,
}

/// Asks the engine at `base_url` (loopback) and returns its answer and the engine's response.
/// The request carries the launch's control key: the owner trying the box is served even while
/// users fill the engine's queue.
pub fn ask(base_url: &str, key: &ControlKey, question: &Question) -> Result<Value, DashError> {
    let message = question.message.trim();
    if message.is_empty() {
        return Err(DashError::BadRequest("the question is empty".into()));
    }
    if message.chars().count() > MAX_QUESTION {
        return Err(DashError::BadRequest(format!(
            "the question is longer than {MAX_QUESTION} characters"
        )));
    }
    let url = format!("{base_url}/v1/chat/completions");
    let body = json!({
        "messages": [{ "role": "user", "content": message }],
        "max_tokens": MAX_TOKENS,
    });
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(TIMEOUT))
        .http_status_as_error(false)
        .build()
        .into();
    let unavailable =
        |e: String| DashError::EngineUnavailable(format!("the engine did not answer: {e}"));
    let mut response = agent
        .post(&url)
        .header("content-type", "application/json")
        .header(control::HEADER, key.as_str())
        .send(body.to_string())
        .map_err(|e| unavailable(e.to_string()))?;
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .with_config()
        .limit(MAX_ANSWER_BYTES)
        .read_to_string()
        .map_err(|e| unavailable(e.to_string()))?;
    if status != 200 {
        return Err(unavailable(format!("status {status}: {}", text.trim())));
    }
    let answer: Value =
        serde_json::from_str(&text).map_err(|e| unavailable(format!("unexpected answer: {e}")))?;
    let reply = answer["choices"][0]["message"]["content"]
        .as_str()
        .ok_or_else(|| unavailable("no message in the answer".into()))?;
    Ok(json!({
        "reply": reply,
        "usage": answer["usage"],
    }))
}
