//! Request bodies of the OpenAI-compatible and llama.cpp-native endpoints, and the one error
//! type every handler returns (an OpenAI-style body with the matching status).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use crate::chat::Message;
use crate::sampler::Sampling;

/// An error as OpenAI clients expect it: `{"error": {"message", "type", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// 400: the request is wrong; `message` says what and how to fix it.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
        }
    }

    /// 401: no or wrong API key.
    pub fn unauthorized() -> ApiError {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            message: "missing or wrong API key: send `Authorization: Bearer KEY`".into(),
        }
    }

    /// 503: the model is loading or the queue is full.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
        }
    }

    /// 500: generation failed.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
        }
    }

    /// Any other status, e.g. the connection guard's 413 and 408.
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
        }
    }

    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::BAD_REQUEST => "invalid_request_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            // 413, 408: what the client sent is at fault, as for a 400.
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": { "message": self.message, "type": self.kind(), "code": self.status.as_u16() }
        });
        let mut response = (self.status, axum::Json(body)).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// Parses a JSON body into `T`, or a 400 naming the problem.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// Message content: a string, or OpenAI's list of parts (text parts are joined).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": "…"}, …]`.
    Parts(Vec<Part>),
}

/// One content part.
#[derive(Debug, Deserialize)]
pub struct Part {
    /// Only `text` parts are supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: Option<String>,
}

/// A chat message as sent.
#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ….
    pub role: String,
    /// Its content (null counts as empty).
    #[serde(default)]
    pub content: Option<Content>,
}

/// Sampling and length fields shared by every generation endpoint.
#[derive(Debug, Default, Deserialize)]
pub struct Knobs {
    /// OpenAI's limit (also `max_completion_tokens`).
    #[serde(default, alias = "max_completion_tokens")]
    pub max_tokens: Option<i64>,
    /// llama.cpp's name for the same limit.
    #[serde(default)]
    pub n_predict: Option<i64>,
    /// Temperature (0 = greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Top-k sampling.
    #[serde(default)]
    pub top_k: Option<i64>,
    /// Min-p sampling.
    #[serde(default)]
    pub min_p: Option<f32>,
    /// Repetition penalty (llama.cpp).
    #[serde(default)]
    pub repeat_penalty: Option<f32>,
    /// Sampler seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Stream as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// `{"include_usage": true}` adds a usage chunk to a stream.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Generate past end-of-generation tokens, up to the limit (llama.cpp).
    #[serde(default)]
    pub ignore_eos: bool,
}

/// Streaming options.
#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with token usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Everything else.
    #[serde(flatten)]
    pub knobs: Knobs,
}

/// `POST /v1/completions` and `POST /completion`: a raw prompt.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    /// The prompt text (special tokens in it are recognised).
    pub prompt: String,
    /// Everything else.
    #[serde(flatten)]
    pub knobs: Knobs,
}

/// Most stop strings per request.
pub const MAX_STOPS: usize = 16;

/// Longest stop string.
pub const MAX_STOP_BYTES: usize = 256;

/// Most tokens one request may ask for.
pub const MAX_TOKENS_LIMIT: i64 = 1 << 20;

impl Knobs {
    /// The token limit: `max_tokens`, else `n_predict` (−1: until the context is full), else
    /// `default`; a 400 when out of range.
    pub fn limit(&self, default: usize) -> Result<usize, ApiError> {
        match self.max_tokens.or(self.n_predict) {
            None => Ok(default),
            Some(-1) => Ok(usize::MAX),
            Some(n) if (1..=MAX_TOKENS_LIMIT).contains(&n) => Ok(n as usize),
            Some(n) => Err(ApiError::bad_request(format!(
                "max_tokens must be between 1 and {MAX_TOKENS_LIMIT}, not {n}"
            ))),
        }
    }

    /// Sampler settings: llama.cpp server's defaults where the request is silent.
    pub fn sampling(&self) -> Result<Sampling, ApiError> {
        let mut s = Sampling::default();
        if let Some(t) = self.temperature {
            if !(0.0..=100.0).contains(&t) {
                return Err(ApiError::bad_request(format!(
                    "temperature must be in 0..=100, not {t}"
                )));
            }
            s.temperature = t;
        }
        if let Some(p) = self.top_p {
            if !(0.0..=1.0).contains(&p) {
                return Err(ApiError::bad_request(format!(
                    "top_p must be in 0..=1, not {p}"
                )));
            }
            s.top_p = p;
        }
        if let Some(p) = self.min_p {
            if !(0.0..=1.0).contains(&p) {
                return Err(ApiError::bad_request(format!(
                    "min_p must be in 0..=1, not {p}"
                )));
            }
            s.min_p = p;
        }
        if let Some(k) = self.top_k {
            s.top_k = usize::try_from(k)
                .map_err(|_| ApiError::bad_request(format!("top_k must be ≥ 0, not {k}")))?;
        }
        if let Some(r) = self.repeat_penalty {
            if !(r > 0.0 && r.is_finite()) {
                return Err(ApiError::bad_request(format!(
                    "repeat_penalty must be > 0, not {r}"
                )));
            }
            s.repeat_penalty = r;
        }
        // Without a seed every request draws differently (so "regenerate" regenerates).
        s.seed = match self.seed {
            Some(seed) => seed,
            None => {
                use std::hash::{BuildHasher, Hasher};
                let mut h = std::collections::hash_map::RandomState::new().build_hasher();
                h.write_u128(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map(|d| d.as_nanos())
                        .unwrap_or(0),
                );
                h.finish()
            }
        };
        Ok(s)
    }

    /// The stop strings (at most [`MAX_STOPS`], each at most [`MAX_STOP_BYTES`]).
    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS || stops.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::bad_request(format!(
                "stop takes at most {MAX_STOPS} strings of at most {MAX_STOP_BYTES} bytes"
            )));
        }
        Ok(stops)
    }
}

/// Most messages in one chat: more than any context holds (each renders to a few tokens at
/// least), few enough that a template never spends long on them.
pub const MAX_MESSAGES: usize = 2048;

/// Longest role (`system`, `user`, `assistant`, `tool`, … are all far shorter).
pub const MAX_ROLE_BYTES: usize = 64;

/// The messages as the chat template takes them; a 400 for an empty or oversized chat, an
/// oversized role or non-text parts, before any work is done on them.
pub fn messages(sent: &[ChatMessage]) -> Result<Vec<Message>, ApiError> {
    if sent.is_empty() {
        return Err(ApiError::bad_request(
            "messages must hold at least one message",
        ));
    }
    if sent.len() > MAX_MESSAGES {
        return Err(ApiError::bad_request(format!(
            "messages holds {} messages; at most {MAX_MESSAGES} are accepted (start a new chat)",
            sent.len()
        )));
    }
    if let Some((i, m)) = sent
        .iter()
        .enumerate()
        .find(|(_, m)| m.role.len() > MAX_ROLE_BYTES || m.role.is_empty())
    {
        return Err(ApiError::bad_request(format!(
            "messages[{i}].role must be 1 to {MAX_ROLE_BYTES} bytes (system, user, assistant, …), not {} bytes",
            m.role.len()
        )));
    }
    sent.iter()
        .enumerate()
        .map(|(i, m)| {
            let content = match &m.content {
                None => String::new(),
                Some(Content::Text(t)) => t.clone(),
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match (p.kind.as_str(), &p.text) {
                            ("text", Some(t)) => text.push_str(t),
                            (kind, _) => {
                                return Err(ApiError::bad_request(format!(
                                    "messages[{i}]: content parts of type {kind:?} are not supported (text only)"
                                )));
                            }
                        }
                    }
                    text
                }
            };
            Ok(Message {
                role: m.role.clone(),
                content,
            })
        })
        .collect()
}
