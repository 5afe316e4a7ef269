//! The one error type every handler returns: an OpenAI-style body
//! (`{"error": {"message", "type", "code"}}`) with the matching status, for every refusal the
//! server makes — bad fields, unknown routes, wrong methods, oversized bodies.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

/// An error as OpenAI clients (and llama.cpp's) expect it.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    /// The `type` when it is more specific than the status's.
    kind: Option<&'static str>,
    /// Fields beside `message`, `type` and `code` (llama.cpp's context-size details).
    details: Map<String, Value>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind: None,
            details: Map::new(),
        }
    }

    /// 400: the request is wrong; `message` says what and how to fix it.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// 400 for a field the engine does not implement: named, never silently ignored.
    pub fn unsupported(field: &str, why: &str) -> ApiError {
        ApiError::bad_request(format!("`{field}` is not supported by this server: {why}"))
    }

    /// 400 in llama.cpp's `exceed_context_size_error` shape, which clients use to shorten
    /// their history: the prompt's length and the context's.
    pub fn exceeds_context(n_prompt_tokens: usize, n_ctx: usize) -> ApiError {
        let mut e = ApiError::bad_request(format!(
            "the request exceeds the available context size: the prompt is {n_prompt_tokens} \
             tokens and the context holds {n_ctx} (shorten it or start a new chat)"
        ));
        e.kind = Some("exceed_context_size_error");
        e.details
            .insert("n_prompt_tokens".into(), n_prompt_tokens.into());
        e.details.insert("n_ctx".into(), n_ctx.into());
        e
    }

    /// 401: no or wrong API key.
    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key: send `Authorization: Bearer KEY` or `X-Api-Key: KEY`",
        )
    }

    /// 404 for a path no endpoint serves.
    pub fn not_found(path: &str) -> ApiError {
        let mut e = ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "no endpoint at {path} (see /v1/models, /v1/chat/completions, /v1/completions, /completion)"
            ),
        );
        e.kind = Some("not_found_error");
        e
    }

    /// 405 for a known path asked with the wrong method.
    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{path} does not take {method}"),
        )
    }

    /// 503: the model is loading or the queue is full.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
    }

    /// 500: generation failed.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// 501: an endpoint this server was not started to serve; `message` says how to start it.
    pub fn not_supported(message: impl Into<String>) -> ApiError {
        ApiError {
            kind: Some("not_supported_error"),
            ..ApiError::new(StatusCode::NOT_IMPLEMENTED, message)
        }
    }

    /// Any other status, e.g. the connection guard's 413 and 408.
    pub fn with_status(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError::new(status, message)
    }

    fn kind(&self) -> &'static str {
        if let Some(kind) = self.kind {
            return kind;
        }
        match self.status {
            StatusCode::BAD_REQUEST => "invalid_request_error",
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::SERVICE_UNAVAILABLE => "unavailable_error",
            // 413, 408, 405: what the client sent is at fault, as for a 400.
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }

    /// The body's `error` object (also sent as a stream's last event).
    pub fn body(&self) -> Value {
        let mut error = self.details.clone();
        error.insert("message".into(), self.message.clone().into());
        error.insert("type".into(), self.kind().into());
        error.insert("code".into(), self.status.as_u16().into());
        json!({ "error": error })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// A request body read whole, with axum's refusals (too large, cut off) as [`ApiError`]s
/// instead of its plain-text ones.
pub struct Body(pub Bytes);

impl<S: Send + Sync> FromRequest<S> for Body {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Body, ApiError> {
        Bytes::from_request(request, state)
            .await
            .map(Body)
            .map_err(|rejection| ApiError::with_status(rejection.status(), rejection.body_text()))
    }
}

/// Parses a JSON body into `T`, or a 400 naming the problem.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_context_overflow_carries_llama_cpps_fields() {
        let body = ApiError::exceeds_context(5000, 4096).body();
        assert_eq!(body["error"]["type"], "exceed_context_size_error");
        assert_eq!(body["error"]["n_prompt_tokens"], 5000);
        assert_eq!(body["error"]["n_ctx"], 4096);
        assert_eq!(body["error"]["code"], 400);
    }
}
