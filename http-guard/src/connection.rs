//! One connection's task: the handshake, HTTP/1.1 through hyper with the header timeout, the
//! idle timeout, eviction and graceful shutdown; and each request's way through the limits to
//! the app.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tower_service::Service;

use crate::Shared;
use crate::body::{self, BodyLimits, GuardedBody, Refusal, Tracked, Verdict};
use crate::handshake::Handshake;
use crate::registry::{Activity, Admitted};

/// Takes the connection out of the table however its task ends.
struct Leave<H> {
    shared: Arc<Shared<H>>,
    id: u64,
}

impl<H> Drop for Leave<H> {
    fn drop(&mut self) {
        self.shared.registry().remove(self.id);
    }
}

/// What every request on one connection shares.
struct Connection<C, H> {
    shared: Arc<Shared<H>>,
    info: C,
    activity: Arc<Activity>,
}

/// Serves one accepted connection until it closes, is evicted, idles too long or the server
/// stops (then the request in flight, if any, is finished first).
pub(crate) async fn run<C, H>(
    shared: Arc<Shared<H>>,
    tcp: TcpStream,
    peer: SocketAddr,
    info: C,
    admitted: Admitted,
    mut stop: watch::Receiver<bool>,
) where
    C: Clone + Send + Sync + 'static,
    H: Handshake,
{
    let _leave = Leave {
        shared: Arc::clone(&shared),
        id: admitted.id,
    };
    let limits = shared.limits.clone();
    let stream = tokio::select! {
        done = tokio::time::timeout(limits.handshake_timeout, shared.handshake.handshake(tcp)) => {
            match done {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::debug!("handshake with {peer}: {e}");
                    return;
                }
                Err(_) => {
                    tracing::debug!("handshake with {peer} timed out");
                    return;
                }
            }
        }
        () = admitted.evicted.notified() => return,
        _ = stop.changed() => return,
    };
    let connection = Arc::new(Connection {
        shared,
        info,
        activity: Arc::clone(&admitted.activity),
    });
    let service = hyper::service::service_fn(move |request| {
        let connection = Arc::clone(&connection);
        async move { Ok::<_, Infallible>(handle(&connection, request).await) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    // The header timeout runs from when the connection starts waiting for a request head,
    // so it bounds slow headers and (with the idle timeout below) idle keep-alives.
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // The head's size is checked however it arrived; the buffer bound caps what a
        // half-open connection holds (hyper panics on one under its 8 KiB minimum).
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(8192));
    let conn = http.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut stopping = false;
    loop {
        if !stopping && *stop.borrow() {
            // Nothing in flight (half-sent headers count as nothing): close now, or a slow
            // client would hold the shutdown up for a whole header timeout.
            if admitted.activity.idle_since().is_some() {
                return;
            }
            stopping = true;
            conn.as_mut().graceful_shutdown();
        }
        // Our own bound on time without a request in flight, whatever hyper's timer covers;
        // while a request is in flight, look again one idle timeout later.
        let now = tokio::time::Instant::now();
        let wake = match admitted.activity.idle_since() {
            Some(since) => tokio::time::Instant::from_std(since) + limits.idle_timeout,
            None => now + limits.idle_timeout,
        };
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!("connection with {peer}: {e}");
                }
                return;
            }
            () = admitted.evicted.notified() => {
                // Chosen while idle, but a request may have begun since: let it finish.
                if admitted.activity.idle_since().is_none() {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                    continue;
                }
                tracing::debug!("connection with {peer} evicted to make room");
                return;
            }
            // Handled at the top of the loop.
            _ = stop.changed(), if !stopping => {}
            () = tokio::time::sleep_until(wake) => {
                let expired = admitted
                    .activity
                    .idle_since()
                    .is_some_and(|since| since.elapsed() >= limits.idle_timeout);
                if expired {
                    tracing::debug!("connection with {peer} idle too long");
                    return;
                }
            }
        }
    }
}

/// One request: counted in flight until its response body is sent, refused with a readable
/// 413 when its body is too large (declared, or found so while reading), its body read under
/// the body timeouts, the app's answer replaced by our 408 or 413 when the body was cut off.
async fn handle<C, H>(
    connection: &Connection<C, H>,
    request: Request<Incoming>,
) -> Response<Tracked>
where
    C: Clone + Send + Sync + 'static,
{
    let in_flight = connection.activity.begin();
    let shared = &connection.shared;
    let limits = &shared.limits;
    let verdict = Arc::new(Verdict::default());
    let (mut parts, incoming) = request.into_parts();
    let upload = limits
        .uploads
        .iter()
        .find(|u| parts.method.as_str() == u.method && parts.uri.path() == u.path);
    let (max_body, whole_timeout) = upload.map_or((limits.max_body, limits.body_timeout), |u| {
        (u.max_body, u.body_timeout)
    });
    let body_limits = BodyLimits {
        frame_timeout: limits.body_frame_timeout,
        whole_timeout,
        max: max_body,
        drain: limits.drain_limit,
    };
    let body = GuardedBody::new(incoming, body_limits, Arc::clone(&verdict));
    let too_large = format!("the request body is too large: at most {max_body} bytes are accepted");
    let response = match declared_length(&parts.headers) {
        Some(length) if length > max_body => {
            // A client waiting for `100 Continue` has not sent the body: answer at once.
            if !expects_continue(&parts.headers) && length <= limits.drain_limit {
                body::drain(body).await;
            }
            closing((shared.error_body)(
                StatusCode::PAYLOAD_TOO_LARGE,
                &too_large,
            ))
        }
        _ => {
            parts
                .extensions
                .insert(ConnectInfo(connection.info.clone()));
            let request = Request::from_parts(parts, axum::body::Body::new(body));
            let response = match shared.router.clone().call(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            match verdict.get() {
                None => response,
                Some(Refusal::TimedOut) => {
                    let message = Refusal::TimedOut.to_string();
                    closing((shared.error_body)(StatusCode::REQUEST_TIMEOUT, &message))
                }
                Some(Refusal::TooLarge) => closing((shared.error_body)(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    &too_large,
                )),
            }
        }
    };
    response.map(|inner| Tracked {
        inner,
        _in_flight: in_flight,
    })
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

/// The connection closes after this answer (its request's body was not, or not all, read).
fn closing(mut response: axum::response::Response) -> axum::response::Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
