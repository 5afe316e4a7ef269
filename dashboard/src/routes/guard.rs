//! Who may call a route, checked by the router before any handler runs: every route is
//! declared in one [`Group`] (`routes!` in `routes.rs` takes no route without one), and the
//! group's check is a layer on that route. A handler that needs the caller's session reads the
//! [`Caller`] the check found.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Form, FromRequest, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::super::App;
use super::super::auth::{self, Session};
use super::super::error::DashError;
use super::BODY_LIMIT;
use supervisor_core::config::Scope;

/// The callers a route answers. Least scope: the fleet's API tokens read the box's state,
/// upload updates and enrol it; they never chat or log out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Group {
    /// Anyone: the login page and form, the page assets, the device key's identity answer
    /// (nothing secret in it).
    Public,
    /// The overview page: a session, or anyone on loopback when the dashboard has no password
    /// (the handler then starts a session). Otherwise the browser is sent to log in.
    Page,
    /// The live events of a page: a session.
    Live,
    /// The box's state (`/api/status`, `/metrics`, an update's progress): an API token, a
    /// session, or anyone on loopback when the dashboard has no password.
    Reader,
    /// A page's own actions (chat, logout): a session and its CSRF token.
    Browser,
    /// Changing the box (uploading an update): an API token, or a session and its CSRF token.
    Operator,
    /// Enrolment into a fleet: an API token.
    Enrol,
}

/// Who the group's check let in.
#[derive(Clone)]
pub(super) enum Caller {
    /// A group that asks no one, or the open dashboard's loopback caller without a session.
    Anyone,
    /// A browser session: its id and what it holds.
    Session(String, Session),
    /// An API token.
    Token,
}

/// The layer of every route of `group`.
pub(super) async fn check(
    State((app, group)): State<(Arc<App>, Group)>,
    request: Request,
    next: Next,
) -> Response {
    match admit(&app, group, request).await {
        Ok((caller, mut request)) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(refusal) => refusal.into_response(),
    }
}

/// The caller `group` lets in, and the request to go on with (a form read for its CSRF token
/// is put back), or why not.
async fn admit(app: &App, group: Group, request: Request) -> Result<(Caller, Request), DashError> {
    let headers = request.headers();
    let has_token = headers.contains_key(header::AUTHORIZATION);
    let caller = match group {
        Group::Public => Caller::Anyone,
        Group::Page => match app.session(headers) {
            Some((id, session)) => Caller::Session(id, session),
            None if app.open => Caller::Anyone,
            None => return Err(DashError::LoginRequired),
        },
        Group::Live => {
            let (id, session) = app.session(headers).ok_or(DashError::Unauthorized)?;
            Caller::Session(id, session)
        }
        Group::Reader if has_token => token(app, headers, Scope::Read)?,
        Group::Reader => match app.session(headers) {
            Some((id, session)) => Caller::Session(id, session),
            None if app.open => Caller::Anyone,
            None => return Err(DashError::Unauthorized),
        },
        Group::Operator if has_token => token(app, headers, Scope::Operate)?,
        // The body may be a whole update bundle: only the header's CSRF token, never a form.
        Group::Operator => csrf(app, headers, None)?,
        Group::Enrol => token(app, headers, Scope::Enroll)?,
        Group::Browser => {
            let (form_token, request) = form_csrf(request).await?;
            let caller = csrf(app, request.headers(), form_token.as_deref())?;
            return Ok((caller, request));
        }
    };
    Ok((caller, request))
}

/// An API token the box accepts with `scope`: 401 for a token it does not know, 403 for one
/// whose scopes leave this out (a scraper's `read` token cannot install or enrol).
fn token(app: &App, headers: &HeaderMap, scope: Scope) -> Result<Caller, DashError> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    match auth::token_scopes(presented, &app.sources.config.dashboard.api_token_sha256) {
        None => Err(DashError::Unauthorized),
        Some(entry) if entry.allows(scope) => Ok(Caller::Token),
        Some(_) => Err(DashError::Refused(
            StatusCode::FORBIDDEN,
            format!(
                "this API token may not {}; give it the `{}` scope (`supervisor dashboard \
                 new-token --scope {}`)",
                match scope {
                    Scope::Read => "read the box's state",
                    Scope::Operate => "change the box",
                    Scope::Enroll => "enrol the box",
                },
                scope.word(),
                scope.word()
            ),
        )),
    }
}

/// A session whose CSRF token the request presents (`presented`, a form's field, or the
/// `X-CSRF-Token` header), or 403.
fn csrf(app: &App, headers: &HeaderMap, presented: Option<&str>) -> Result<Caller, DashError> {
    let (id, session) = app.session(headers).ok_or(DashError::Csrf)?;
    let presented = presented
        .or_else(|| headers.get("x-csrf-token").and_then(|v| v.to_str().ok()))
        .unwrap_or("");
    if auth::constant_time_eq(presented.as_bytes(), session.csrf.as_bytes()) {
        Ok(Caller::Session(id, session))
    } else {
        Err(DashError::Csrf)
    }
}

/// A form's `csrf` field, and the request with its body put back. Only a form body is read
/// (at most the dashboard's body limit); any other body is left for its handler.
async fn form_csrf(request: Request) -> Result<(Option<String>, Request), DashError> {
    let is_form = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    if !is_form {
        return Ok((None, request));
    }
    let (parts, body) = request.into_parts();
    let bytes = axum::body::to_bytes(body, BODY_LIMIT).await.map_err(|_| {
        DashError::Refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("a form is at most {BODY_LIMIT} bytes"),
        )
    })?;
    let copy = Request::post("/")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(bytes.clone()))
        .map_err(|e| DashError::Internal(e.to_string()))?;
    let field = match Form::<HashMap<String, String>>::from_request(copy, &()).await {
        Ok(Form(mut form)) => form.remove("csrf"),
        Err(_) => None,
    };
    Ok((field, Request::from_parts(parts, Body::from(bytes))))
}
