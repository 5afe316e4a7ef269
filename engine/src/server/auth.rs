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
    /// Pages served from this machine only (`localhost`): `http(s)://localhost`, `127.0.0.1`
    /// or `[::1]`, on any port.
    Localhost,
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
        if text == "localhost" {
            return Ok(CorsOrigins::Localhost);
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

    /// The layer answering preflights and marking answers. As llama-server does, an allowed
    /// origin is reflected, with credentials allowed and the headers the preflight asks for;
    /// without `--cors-origins` no origin is allowed.
    pub fn layer(&self) -> CorsLayer {
        let methods = [Method::GET, Method::POST, Method::DELETE, Method::OPTIONS];
        let max_age = std::time::Duration::from_secs(600);
        let allow = match self {
            CorsOrigins::None => {
                return CorsLayer::new()
                    .allow_origin(AllowOrigin::list(Vec::<HeaderValue>::new()))
                    .allow_methods(methods)
                    .allow_headers([
                        header::AUTHORIZATION,
                        header::CONTENT_TYPE,
                        HeaderName::from_static(API_KEY_HEADER),
                    ])
                    .max_age(max_age);
            }
            CorsOrigins::Any => AllowOrigin::mirror_request(),
            CorsOrigins::Localhost => {
                AllowOrigin::predicate(|origin, _| origin.to_str().is_ok_and(is_localhost_origin))
            }
            CorsOrigins::List(origins) => {
                AllowOrigin::list(origins.iter().filter_map(|o| HeaderValue::from_str(o).ok()))
            }
        };
        CorsLayer::new()
            .allow_origin(allow)
            .allow_credentials(true)
            .allow_methods(methods)
            .allow_headers(tower_http::cors::AllowHeaders::mirror_request())
            .max_age(max_age)
    }
}

/// Whether `origin` is a page of this machine: `http(s)://` then `localhost`, `127.0.0.1` or
/// `[::1]`, then nothing or a port (`localhost.evil.com` is not).
fn is_localhost_origin(origin: &str) -> bool {
    let Some(rest) = ["http://", "https://"]
        .iter()
        .find_map(|scheme| origin.strip_prefix(scheme))
    else {
        return false;
    };
    ["localhost", "127.0.0.1", "[::1]"].iter().any(|host| {
        rest.strip_prefix(host).is_some_and(|port| {
            port.is_empty()
                || port
                    .strip_prefix(':')
                    .is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
    })
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
        assert_eq!(
            CorsOrigins::parse("localhost").expect("localhost"),
            CorsOrigins::Localhost
        );
    }

    #[test]
    fn only_this_machines_pages_are_localhost() {
        for yes in [
            "http://localhost",
            "http://localhost:8080",
            "http://127.0.0.1",
            "https://127.0.0.1:3000",
            "http://[::1]",
            "http://[::1]:3000",
        ] {
            assert!(is_localhost_origin(yes), "{yes}");
        }
        for no in [
            "http://web.mydomain.fr",
            "http://notlocalhost",
            "http://localhost.evil.com",
            "http://localhost:",
            "http://localhost:80x",
            "localhost",
            "http://127.0.0.1.evil.com",
        ] {
            assert!(!is_localhost_origin(no), "{no}");
        }
    }
}
