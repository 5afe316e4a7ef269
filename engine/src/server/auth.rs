//! Who may ask: the API key (as `Authorization: Bearer` or `X-Api-Key`, only its hash kept),
//! the control key that puts the supervisor's requests in their own lane, and which browser
//! origins may call the API (CORS, answered before any key is asked for).

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::AppState;
use super::error::ApiError;
use super::worker::Lane;

/// The header that carries the control key.
pub const CONTROL_HEADER: &str = "x-engine-control";

/// The API key's second header (llama.cpp and many clients send it).
pub const API_KEY_HEADER: &str = "x-api-key";

/// Whether `addr` is loopback (the only place an unauthenticated server may listen).
pub fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// SHA-256 of an API key (only the hash is kept in memory).
pub fn key_hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Checks the key and decides the request's lane once, before its body is read; handlers
/// read the lane from the request's extensions.
pub async fn require_key(
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
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let given = bearer
        .or_else(|| headers.get(API_KEY_HEADER).and_then(|v| v.to_str().ok()))
        .map(|k| key_hash(k.trim()));
    // Comparing hashes keeps the comparison's timing independent of the key.
    match given {
        Some(h) if h == expected => Ok(()),
        _ => Err(ApiError::unauthorized()),
    }
}

/// Which origins browsers may call the API from (`--cors-origins`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CorsOrigins {
    /// None: preflights are answered, but allow no origin.
    #[default]
    None,
    /// Any origin (`*`): still only with the API key when one is required.
    Any,
    /// These origins exactly (`scheme://host[:port]`).
    List(Vec<String>),
}

impl CorsOrigins {
    /// Parses `--cors-origins`: `*`, or origins separated by commas.
    pub fn parse(text: &str) -> Result<CorsOrigins, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(CorsOrigins::None);
        }
        if text == "*" {
            return Ok(CorsOrigins::Any);
        }
        let origins: Vec<String> = text
            .split(',')
            .map(|o| o.trim().trim_end_matches('/').to_string())
            .collect();
        for origin in &origins {
            let valid = ["http://", "https://"]
                .iter()
                .filter_map(|scheme| origin.strip_prefix(scheme))
                .any(|host| {
                    !host.is_empty() && !host.contains('/') && HeaderValue::from_str(origin).is_ok()
                });
            if !valid {
                return Err(format!(
                    "--cors-origins: {origin:?} is not an origin (write scheme://host[:port], \
                     e.g. http://192.168.1.20:3000, separated by commas, or * for any)"
                ));
            }
        }
        Ok(CorsOrigins::List(origins))
    }

    /// The layer answering preflights and marking answers for the allowed origins.
    pub fn layer(&self) -> CorsLayer {
        let allow = match self {
            CorsOrigins::None => AllowOrigin::list(Vec::<HeaderValue>::new()),
            CorsOrigins::Any => AllowOrigin::any(),
            CorsOrigins::List(origins) => {
                AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
            }
        };
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                HeaderName::from_static(API_KEY_HEADER),
            ])
            .max_age(std::time::Duration::from_secs(600))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cors_origins_are_checked() {
        assert_eq!(CorsOrigins::parse("").expect("empty"), CorsOrigins::None);
        assert_eq!(CorsOrigins::parse("*").expect("any"), CorsOrigins::Any);
        assert_eq!(
            CorsOrigins::parse("http://a.lan:3000, https://b.lan/").expect("list"),
            CorsOrigins::List(vec!["http://a.lan:3000".into(), "https://b.lan".into()])
        );
        for bad in ["a.lan", "http://", "ftp://a", "http://a/path"] {
            assert!(CorsOrigins::parse(bad).is_err(), "{bad}");
        }
    }
}
