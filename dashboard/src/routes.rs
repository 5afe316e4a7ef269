//! The router and its handlers: who is asking (session cookie, bearer token, CSRF token) and
//! what each route answers.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{ConnectInfo, DefaultBodyLimit, Extension, Form, FromRequest, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};

mod guard;
mod origin;

use guard::Caller;
pub use guard::Group;
use origin::Served;

use crate::auth::{self, Session};
use crate::error::DashError;
use crate::listener::ClientAddr;
use crate::{App, chat, live, pages};

/// The session cookie's name.
pub const COOKIE: &str = "appliance_session";
/// Largest request body: a login form or a chat question.
pub(super) const BODY_LIMIT: usize = 16 * 1024;
/// No inline scripts or styles; everything from this origin only.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
const APP_JS: &str = include_str!("assets/app.js");
const STYLE_CSS: &str = include_str!("assets/style.css");

/// Declares every route with the group whose check guards it ([`Group`]): the router is built
/// from this list only, so a route cannot be added without a group, and [`ROUTES`] lists
/// them for the test that asks each one without credentials.
macro_rules! routes {
    ($($method:ident $path:expr => $route:expr, $group:ident;)*) => {
        /// Every route: method, path and the group that may call it.
        pub const ROUTES: &[(&str, &str, Group)] = &[$((stringify!($method), $path, Group::$group)),*];

        fn guarded_routes(app: &Arc<App>) -> Router<Arc<App>> {
            Router::new()
                $(.route($path, $route.route_layer(axum::middleware::from_fn_with_state(
                    (Arc::clone(app), Group::$group),
                    guard::check,
                ))))*
        }
    };
}

routes! {
    GET "/" => get(overview), Page;
    GET "/login" => get(login_page), Public;
    POST "/login" => post(login), Public;
    POST "/logout" => post(logout), Browser;
    GET "/events" => get(events), Live;
    GET "/api/status" => get(api_status), Reader;
    GET "/metrics" => get(metrics), Reader;
    POST "/api/chat" => post(api_chat), Browser;
    POST "/api/enroll" => post(api_enroll), Enrol;
    GET "/api/cluster" => get(crate::cluster::get_part), Enrol;
    PUT crate::cluster::PEERS => put(crate::cluster::put_peers), Operator;
    POST "/api/identity" => post(api_identity), Public;
    POST crate::update::PATH => post(api_update_upload).layer(DefaultBodyLimit::disable()), Operator;
    GET crate::update::PATH => get(api_update_progress), Reader;
    GET "/api/models" => get(crate::models::list), Reader;
    POST crate::models::PUSH => post(crate::models::push)
        .layer(DefaultBodyLimit::max(crate::models::MAX_PUSH as usize)), Operator;
    PUT "/api/models/incoming/{id}/{part}/{index}" => put(crate::models::chunk)
        .layer(DefaultBodyLimit::max(crate::models::MAX_CHUNK as usize)), Operator;
    POST "/api/models/use" => post(crate::models::switch), Operator;
    DELETE "/api/models/{id}" => delete(crate::models::remove), Operator;
    GET "/assets/app.js" => get(app_js), Public;
    GET "/assets/style.css" => get(style_css), Public;
}

/// Every route, with the security headers and the body limit. `over_tls`: the router of the
/// HTTPS listener; the plain one redirects other machines to HTTPS when the box serves it.
pub fn router(app: Arc<App>, over_tls: bool) -> Router {
    let routes = guarded_routes(&app)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            loopback_host,
        ))
        .layer(axum::middleware::map_response(security_headers));
    let routes = if app.https.is_some() && !over_tls {
        routes.layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            redirect_to_https,
        ))
    } else {
        routes
    };
    // Outermost: every check below reads the one Host header.
    routes
        .layer(axum::middleware::from_fn(origin::single_host))
        .layer(Extension(Served { tls: over_tls }))
        .with_state(app)
}

/// Plain HTTP once HTTPS is served: the box itself (loopback) is still answered, every other
/// machine is sent to HTTPS, where passwords and cookies are safe on the wire.
async fn redirect_to_https(
    State(app): State<Arc<App>>,
    ConnectInfo(ClientAddr(client)): ConnectInfo<ClientAddr>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(https) = app.https else {
        return next.run(request).await;
    };
    if client.ip().is_loopback() {
        return next.run(request).await;
    }
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(host_name)
        .unwrap_or_else(|| https.ip().to_string());
    let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
    Redirect::permanent(&format!("https://{host}:{}{path}", https.port())).into_response()
}

/// The name part of a `Host` header, if it is a plain host name or IP address (nothing that
/// could smuggle another URL into the redirect).
fn host_name(host: &str) -> Option<String> {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    };
    let bracketed = name.starts_with('[')
        && name.ends_with(']')
        && name[1..name.len() - 1]
            .bytes()
            .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.');
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    (bracketed || plain).then(|| name.to_string())
}

/// Without a password the dashboard trusts its loopback address, so it answers only requests
/// addressed to it by a loopback name: a web page that rebinds its own DNS name to 127.0.0.1
/// must not get in through the visitor's browser.
async fn loopback_host(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if app.open && !addressed_to_loopback(request.headers()) {
        return (
            StatusCode::FORBIDDEN,
            "without a password this dashboard answers only at http://127.0.0.1 or http://localhost\n",
        )
            .into_response();
    }
    next.run(request).await
}

fn addressed_to_loopback(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    matches!(
        name.to_ascii_lowercase().as_str(),
        "127.0.0.1" | "localhost" | "[::1]"
    )
}

async fn security_headers(response: Response) -> Response {
    with_security_headers(response)
}

/// Every answer's security headers, also on the connection guard's own refusals.
pub(super) fn with_security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // Not `no-referrer`: under it a browser sends `Origin: null` even with a same-origin form,
    // and the login's Origin check could not tell the box's own form from a stranger's.
    // `same-origin` still tells other sites nothing.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// The session cookie's value, if the request has one.
fn cookie_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (name, value) = pair.trim().split_once('=')?;
            (name == COOKIE).then(|| value.to_string())
        })
}

impl App {
    /// The session the request's cookie names, if it is live.
    fn session(&self, headers: &HeaderMap) -> Option<(String, Session)> {
        let id = cookie_id(headers)?;
        let session = self.sessions.get(&id)?;
        Some((id, session))
    }

    /// A fresh session and its `Set-Cookie` value, `Secure` once the box serves HTTPS (before
    /// that it serves plain HTTP, where a Secure cookie would never be sent back; browsers
    /// send Secure cookies to http://localhost too).
    fn new_session(&self) -> Result<(Session, HeaderValue), DashError> {
        let (id, session) = self.sessions.create().map_err(DashError::Internal)?;
        let cookie = format!(
            "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{}",
            auth::SESSION_LIFETIME.as_secs(),
            if self.https.is_some() { "; Secure" } else { "" }
        );
        let value =
            HeaderValue::from_str(&cookie).map_err(|e| DashError::Internal(e.to_string()))?;
        Ok((session, value))
    }
}

async fn overview(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, DashError> {
    let (session, cookie) = match caller {
        Caller::Session(_, session) => (session, None),
        // Without a password the box's own loopback is the only way in (the guard let only it
        // through): no login to ask for.
        Caller::Anyone => {
            let (session, cookie) = app.new_session()?;
            (session, Some(cookie))
        }
        // An API token never opens a browser session.
        Caller::Token => return Err(DashError::LoginRequired),
    };
    let status = app.status_off_thread().await?.to_wire();
    let fields = crate::fields::fields(&status, &app.engine_log());
    let (charts, seq) = {
        let history = app.history.lock().unwrap_or_else(|p| p.into_inner());
        (history.charts(crate::unix_ms()), history.seq())
    };
    let page = pages::overview(&pages::Overview {
        status: &status,
        fields: &fields,
        charts: &charts,
        csrf: &session.csrf,
        notice: pages::loopback_notice(app.open, app.bound),
        login: !app.open,
        seq,
    });
    let mut response = Html(page).into_response();
    if let Some(cookie) = cookie {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    Ok(response)
}

async fn login_page(State(app): State<Arc<App>>, headers: HeaderMap) -> Response {
    if app.open || app.session(&headers).is_some() {
        return Redirect::to("/").into_response();
    }
    Html(pages::login(None)).into_response()
}

async fn login(
    State(app): State<Arc<App>>,
    Extension(served): Extension<Served>,
    ConnectInfo(ClientAddr(client)): ConnectInfo<ClientAddr>,
    headers: HeaderMap,
    request: axum::extract::Request,
) -> Result<Response, DashError> {
    if app.open {
        return Ok(Redirect::to("/").into_response());
    }
    // A login has no session to carry a CSRF token yet: a page elsewhere posting this form
    // (logging the visitor into an account of the attacker's) is told apart by its Origin.
    if !origin::same_origin(&headers, served) {
        tracing::warn!(client = %client.ip(), "dashboard: cross-origin login refused");
        return Err(DashError::CrossOrigin);
    }
    if let Some(wait) = app.limiter.check(client.ip()) {
        tracing::warn!(client = %client.ip(), "dashboard: login refused, too many failed attempts");
        return Err(DashError::TooManyAttempts(wait));
    }
    // A client that has failed is refused rather than queued, so a burst gets no more guesses
    // than the limiter allows; one that has not waits its turn, so strangers keeping the
    // checks busy cannot turn the owner away.
    let _verifying = if app.limiter.has_failed(client.ip()) {
        app.verifying
            .try_acquire()
            .map_err(|_| DashError::TooManyAttempts(1))?
    } else {
        app.verifying
            .acquire()
            .await
            .map_err(|e| DashError::Internal(format!("password check unavailable: {e}")))?
    };
    // Asked again now, and counted in the same step: attempts of a burst that waited for a
    // check may have failed meanwhile, and one running beside this one counts already.
    let attempt = app
        .limiter
        .attempt(client.ip())
        .map_err(DashError::TooManyAttempts)?;
    // The body only now: a refused or cross-origin login costs no read of its form.
    let form = match Form::<HashMap<String, String>>::from_request(request, &()).await {
        Ok(Form(form)) => form,
        Err(rejection) => return Ok(rejection.into_response()),
    };
    let password = form.get("password").cloned().unwrap_or_default();
    let phc = app
        .sources
        .config
        .dashboard
        .password_hash
        .as_str()
        .to_string();
    // Argon2 is deliberately slow: off the runtime thread the daemon also supervises from.
    let ok = tokio::task::spawn_blocking(move || auth::verify_password(&phc, &password))
        .await
        .map_err(|e| DashError::Internal(format!("password check crashed: {e}")))?;
    if !ok {
        // The attempt stays counted as failed.
        tracing::warn!(client = %client.ip(), "dashboard: wrong password");
        return Ok((
            StatusCode::UNAUTHORIZED,
            Html(pages::login(Some("Wrong password."))),
        )
            .into_response());
    }
    attempt.succeeded();
    tracing::info!(client = %client.ip(), "dashboard: logged in");
    let (_, cookie) = app.new_session()?;
    let mut response = Redirect::to("/").into_response();
    response.headers_mut().insert(header::SET_COOKIE, cookie);
    Ok(response)
}

async fn logout(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, DashError> {
    if let Caller::Session(id, _) = caller {
        app.sessions.remove(&id);
    }
    let mut response = Redirect::to("/login").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "appliance_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0",
        ),
    );
    Ok(response)
}

async fn events(
    State(app): State<Arc<App>>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, DashError> {
    let Caller::Session(id, _) = caller else {
        return Err(DashError::Unauthorized);
    };
    let updates = app.updates.subscribe();
    let allowed = move || app.sessions.get(&id).is_some();
    Ok(live::stream(updates, allowed).into_response())
}

async fn api_status(State(app): State<Arc<App>>) -> Result<Response, DashError> {
    Ok(Json(app.status_off_thread().await?.to_wire()).into_response())
}

/// `GET /metrics`: the same status document in Prometheus' text format, to the same readers.
async fn metrics(State(app): State<Arc<App>>) -> Result<Response, DashError> {
    let status = app.status_off_thread().await?;
    Ok((
        [(header::CONTENT_TYPE, metrics_text::CONTENT_TYPE)],
        supervisor_core::metrics::exposition(&status),
    )
        .into_response())
}

/// `POST /api/update`: a bundle as the body, from a session with its CSRF token or with an API
/// token (the fleet tool). A dashboard without a password takes none: it has no sessions to
/// tell the box's owner from any page the browser opens.
async fn api_update_upload(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, DashError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok());
    let progress = crate::update::accept(
        Arc::clone(&app.uploads),
        app.sources.board.clone(),
        app.sources.config.clone(),
        declared,
        body,
    )
    .await?;
    Ok((StatusCode::ACCEPTED, Json(progress)).into_response())
}

/// `GET /api/update`: how the last upload's install is doing.
async fn api_update_progress(State(app): State<Arc<App>>) -> Result<Response, DashError> {
    Ok(Json(app.uploads.progress()).into_response())
}

/// The nonce of an enrolment or identity request: 32-128 hex digits.
fn nonce_of(body: &[u8]) -> Result<String, DashError> {
    let request: wire::NonceRequest = serde_json::from_slice(body)
        .map_err(|e| DashError::BadRequest(format!("expected {{\"nonce\": \"<hex>\"}}: {e}")))?;
    let nonce = request.nonce;
    if !(32..=128).contains(&nonce.len()) || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(DashError::BadRequest(
            "the nonce is 32-128 hex digits, fresh for each request".into(),
        ));
    }
    Ok(nonce)
}

/// `appliance fleet status`, before it sends the API token: the device key vouches for this
/// connection's certificate (no token needed; nothing secret in the answer).
async fn api_identity(
    State(app): State<Arc<App>>,
    body: axum::body::Bytes,
) -> Result<Response, DashError> {
    let nonce = nonce_of(&body)?;
    let board = app.sources.board.clone();
    let identity = tokio::task::spawn_blocking(move || {
        supervisor_core::provision::identity::identity_answer(&board, &nonce)
    })
    .await
    .map_err(|e| DashError::Internal(format!("identity crashed: {e}")))?
    .map_err(DashError::Internal)?
    .ok_or_else(|| {
        DashError::Conflict("this box is not provisioned: it has no identity yet".into())
    })?;
    Ok(Json(identity).into_response())
}

/// `appliance fleet enroll`: an API token, and a fresh nonce; the answer proves the box holds
/// its enrolment token and device key (see `provision::enroll`). Once per generation.
async fn api_enroll(
    State(app): State<Arc<App>>,
    body: axum::body::Bytes,
) -> Result<Response, DashError> {
    let nonce = nonce_of(&body)?;
    let board = app.sources.board.clone();
    let answer = tokio::task::spawn_blocking(move || enroll(&board, &nonce))
        .await
        .map_err(|e| DashError::Internal(format!("enrolment crashed: {e}")))??;
    Ok(Json(answer).into_response())
}

fn enroll(
    board: &supervisor_core::board::Board,
    nonce: &str,
) -> Result<provision::enroll::Answer, DashError> {
    use supervisor_core::provision as p;
    let settings = p::committed_settings(board)
        .map_err(DashError::Internal)?
        .ok_or_else(|| DashError::Conflict("this box is not provisioned".into()))?;
    // Once per generation: the check and the spending of the token under one lock.
    let _record = p::lock_record(board).map_err(DashError::Internal)?;
    let mut record = p::read_record(board)
        .map_err(DashError::Internal)?
        .unwrap_or_default();
    if record.enrolled_unix.is_some() {
        return Err(DashError::Conflict(
            "this box's enrolment token is spent (it enrolled already); to enrol it again, provision it with a higher generation".into(),
        ));
    }
    let answer = p::identity::enroll_answer(board, &settings, &record, nonce)
        .map_err(DashError::Conflict)?;
    record.enrolled_unix = Some(board.now_unix());
    p::write_record(board, &record).map_err(DashError::Internal)?;
    tracing::info!("dashboard: enrolled in fleet {}", answer.fleet);
    Ok(answer)
}

async fn api_chat(
    State(app): State<Arc<App>>,
    body: axum::body::Bytes,
) -> Result<Response, DashError> {
    let question: chat::Question = serde_json::from_slice(&body)
        .map_err(|e| DashError::BadRequest(format!("expected {{\"message\": \"...\"}}: {e}")))?;
    let engine = app.sources.engine.borrow().clone();
    let access = match (engine.state, engine.access) {
        (supervisor_core::engine::Phase::Ready, Some(access)) => access,
        (state, _) => {
            return Err(DashError::EngineUnavailable(format!(
                "the engine is not ready ({}); try again shortly",
                supervisor_core::report::word(state)
            )));
        }
    };
    let answer = tokio::task::spawn_blocking(move || chat::ask(&access, &question))
        .await
        .map_err(|e| DashError::Internal(format!("the chat request crashed: {e}")))??;
    Ok(Json(answer).into_response())
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn style_css() -> Response {
    asset("text/css; charset=utf-8", STYLE_CSS)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "max-age=300"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("theme=dark; appliance_session=abc123; other=1"),
        );
        assert_eq!(cookie_id(&headers).as_deref(), Some("abc123"));
        assert_eq!(cookie_id(&HeaderMap::new()), None);
    }

    #[test]
    fn redirects_keep_only_a_plain_host_name() {
        assert_eq!(
            host_name("north-1.lan:8000").as_deref(),
            Some("north-1.lan")
        );
        assert_eq!(host_name("192.168.1.20").as_deref(), Some("192.168.1.20"));
        assert_eq!(host_name("[fd00::20]:8000").as_deref(), Some("[fd00::20]"));
        for bad in ["evil.example/x", "a@b", "", "[fd00::20", "x y"] {
            assert_eq!(host_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn only_loopback_names_count_as_loopback() {
        let host = |h: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::HOST, HeaderValue::from_str(h).expect("header"));
            addressed_to_loopback(&headers)
        };
        for ok in [
            "127.0.0.1:8000",
            "localhost:8000",
            "LOCALHOST",
            "[::1]:8000",
        ] {
            assert!(host(ok), "{ok}");
        }
        for bad in [
            "evil.example:8000",
            "127.0.0.1.evil.example",
            "10.0.0.5:8000",
            "[::1]x",
        ] {
            assert!(!host(bad), "{bad}");
        }
        assert!(!addressed_to_loopback(&HeaderMap::new()));
    }
}
