//! The one error type of the dashboard's handlers, and the HTTP response for each case.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};

/// Why a request was not served.
#[derive(Debug)]
pub enum DashError {
    /// A page asked for without a session: go and log in.
    LoginRequired,
    /// An API call without a session or a valid bearer token.
    Unauthorized,
    /// A POST whose CSRF token is missing or wrong.
    Csrf,
    /// A login posted from a page of another origin.
    CrossOrigin,
    /// Too many failed logins; try again after this many seconds.
    TooManyAttempts(u64),
    /// The request itself is wrong.
    BadRequest(String),
    /// The request cannot be served in the box's present state.
    Conflict(String),
    /// The engine cannot answer now.
    EngineUnavailable(String),
    /// Something on our side failed.
    Internal(String),
    /// Refused by the connection guard (`http-guard`): a body too large (413) or too slow to
    /// arrive (408).
    Refused(StatusCode, String),
}

impl IntoResponse for DashError {
    fn into_response(self) -> Response {
        let text = |status: StatusCode, message: String| {
            (
                status,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                message,
            )
                .into_response()
        };
        match self {
            DashError::LoginRequired => Redirect::to("/login").into_response(),
            DashError::Unauthorized => {
                let mut response = text(
                    StatusCode::UNAUTHORIZED,
                    "log in, or send Authorization: Bearer TOKEN with a token whose SHA-256 is in [dashboard] api_token_sha256\n".into(),
                );
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
                response
            }
            DashError::Csrf => text(
                StatusCode::FORBIDDEN,
                "the form's security token is missing or wrong; reload the page and try again\n"
                    .into(),
            ),
            DashError::CrossOrigin => text(
                StatusCode::FORBIDDEN,
                "a login must come from this dashboard's own page (its Origin is another site)\n"
                    .into(),
            ),
            DashError::TooManyAttempts(seconds) => {
                let mut response = text(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("too many failed logins; try again in {seconds} s\n"),
                );
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
                response
            }
            DashError::BadRequest(m) => text(StatusCode::BAD_REQUEST, format!("{m}\n")),
            DashError::Conflict(m) => text(StatusCode::CONFLICT, format!("{m}\n")),
            DashError::EngineUnavailable(m) => {
                text(StatusCode::SERVICE_UNAVAILABLE, format!("{m}\n"))
            }
            DashError::Refused(status, m) => text(status, format!("{m}\n")),
            DashError::Internal(m) => {
                tracing::error!("dashboard: {m}");
                text(StatusCode::INTERNAL_SERVER_ERROR, format!("{m}\n"))
            }
        }
    }
}
