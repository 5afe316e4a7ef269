//! One connection's task: the handshake, HTTP/1.1 through hyper with the header timeout, the
//! idle timeout, the write-stall timeout, eviction and graceful shutdown; and each request's
//! way through the limits to the app.

use std::convert::Infallible;
use std::fmt::Display;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use hyper::body::{Body as _, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tower_service::Service;

use crate::Shared;
use crate::body::{self, BodyLimits, GuardedBody, Refusal, Tracked, Verdict};
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

/// Serves one accepted connection until it closes, is evicted, idles too long, leaves an
/// answer unread too long or the server stops (then the request in flight, if any, is
/// finished first). `stream` is the connection after its handshake (run here, under the
/// handshake timeout, so a silent client never holds up the accept loop).
pub(crate) async fn run<C, H, S>(
    shared: Arc<Shared<H>>,
    stream: impl Future<Output = io::Result<S>>,
    abort: Option<std::os::fd::OwnedFd>,
    peer: impl Display,
    info: C,
    admitted: Admitted,
    mut stop: watch::Receiver<bool>,
) where
    C: Clone + Send + Sync + 'static,
    H: Send + Sync + 'static,
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let _leave = Leave {
        shared: Arc::clone(&shared),
        id: admitted.id,
    };
    let limits = shared.limits.clone();
    let stream = tokio::select! {
        done = tokio::time::timeout(limits.handshake_timeout, stream) => {
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
    // Closing a connection the client stopped reading resets it: a plain close would leave an
    // answer it never took in the kernel, retried for minutes for an orphaned socket.
    let reset = abort.as_ref().and_then(|fd| fd.try_clone().ok());
    let reset_on_close = || {
        if let Some(fd) = &reset {
            let _ = socket2::SockRef::from(fd).set_linger(Some(Duration::ZERO));
        }
    };
    let stream = Watched {
        inner: stream,
        activity: Arc::clone(&admitted.activity),
        timeout: limits.write_timeout,
        stall: None,
        taken: 0,
        abort,
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
        // half-open connection holds (hyper panics on one under its 8 KiB minimum), and what
        // hyper queues of an answer the client does not read.
        .max_header_size(limits.max_header_bytes)
        .max_buf_size(limits.max_header_bytes.max(8192))
        // Header names go out as `Content-Type`, not `content-type`: HTTP says case does not
        // matter, but clients that copy headers into a plain map (llama.cpp's own test suite,
        // scripts) look them up as other servers write them.
        .title_case_headers(true);
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
        let now = Instant::now();
        let wake = match admitted.activity.idle_since() {
            Some(since) => Instant::from_std(since) + limits.idle_timeout,
            None => now + limits.idle_timeout,
        };
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!("connection with {peer}: {e}");
                    // Ended by a timeout or an error, perhaps with an answer its client has not
                    // taken still in the kernel: the client gets the rest and the end (FIN) at
                    // once, and one write timeout to take them before the connection is reset.
                    if let Some(fd) = reset.as_ref().and_then(|fd| fd.try_clone().ok()) {
                        let grace = limits.write_timeout;
                        tokio::spawn(async move {
                            let socket = socket2::SockRef::from(&fd);
                            let _ = socket.shutdown(std::net::Shutdown::Write);
                            tokio::time::sleep(grace).await;
                            let _ = socket.set_linger(Some(Duration::ZERO));
                        });
                    }
                }
                return;
            }
            () = admitted.evicted.notified() => {
                // Chosen as evictable, but its client may have caught up since (a request
                // begun, a body arrived, an answer read): then let that request finish.
                if admitted.activity.evictable(std::time::Instant::now()).is_none() {
                    stopping = true;
                    conn.as_mut().graceful_shutdown();
                    continue;
                }
                tracing::debug!("connection with {peer} evicted to make room");
                reset_on_close();
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
                    reset_on_close();
                    return;
                }
            }
        }
    }
}

/// The connection's stream, watched for writes the client does not take: each time the socket
/// refuses bytes the connection is marked stalled (evictable after a grace), and a stall that
/// lasts the write timeout fails the connection (a stall ends only when the client has taken
/// [`STALL_ENDS_AFTER`] bytes since it began, or everything: a client that never reads still
/// lets its kernel take a byte now and then, by the sender's zero-window probes), which drops the answer and with it whatever
/// produced it. Hyper writes only what the socket takes and reads the answer's body only as
/// it writes, so the unsent bytes of a connection are the kernel's send buffer plus hyper's
/// bounded buffer.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
    timeout: Duration,
    stall: Option<Pin<Box<Sleep>>>,
    /// Bytes the socket took since the stall began.
    taken: usize,
    /// The socket's second descriptor (TCP): closed with the stream, after being set to
    /// reset the connection when the write timeout gave up on it, so the kernel does not keep
    /// retrying the unread bytes for an orphaned socket.
    abort: Option<std::os::fd::OwnedFd>,
}

/// Bytes a stalled client must take before its stall is over.
const STALL_ENDS_AFTER: usize = 4096;

impl<S> Watched<S> {
    /// `polled` is a write's outcome; `took` the bytes it moved (`usize::MAX`: everything
    /// buffered went out, as a finished flush or shutdown says).
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
        took: impl Fn(&T) -> usize,
    ) -> Poll<io::Result<T>> {
        if let Poll::Ready(result) = &polled {
            if self.stall.is_none() {
                return polled;
            }
            let took = result.as_ref().map_or(usize::MAX, &took);
            self.taken = self.taken.saturating_add(took);
            if self.taken >= STALL_ENDS_AFTER {
                self.stall = None;
                self.activity
                    .write_stalled(false, std::time::Instant::now());
                return polled;
            }
            // A trickle does not end the stall; its time may be up all the same.
            return match self.expired(cx) {
                Some(error) => Poll::Ready(Err(error)),
                None => polled,
            };
        }
        if self.stall.is_none() {
            self.taken = 0;
            self.activity.write_stalled(true, std::time::Instant::now());
            self.stall = Some(Box::pin(tokio::time::sleep(self.timeout)));
        }
        match self.expired(cx) {
            Some(error) => Poll::Ready(Err(error)),
            None => Poll::Pending,
        }
    }

    /// The write timeout's error when the stall has lasted it (the connection is then set to
    /// reset on close); polling the timer otherwise, so the task wakes when it runs out.
    fn expired(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let stall = self.stall.as_mut()?;
        if stall.as_mut().poll(cx).is_pending() {
            return None;
        }
        if let Some(fd) = &self.abort {
            let _ = socket2::SockRef::from(fd).set_linger(Some(Duration::ZERO));
        }
        Some(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client took under 4 KiB of its answer within the write timeout",
        ))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, polled, |n| *n)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, polled, |n| *n)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, polled, |()| usize::MAX)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.watch(cx, polled, |()| usize::MAX)
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
    let activity = &connection.activity;
    let in_flight = activity.begin(!request.body().is_end_stream(), std::time::Instant::now());
    let shared = &connection.shared;
    let limits = &shared.limits;
    let verdict = Arc::new(Verdict::default());
    let (mut parts, incoming) = request.into_parts();
    let upload = limits
        .uploads
        .iter()
        .find(|u| parts.method.as_str() == u.method && u.covers(parts.uri.path()));
    let (max_body, whole_timeout) = upload.map_or((limits.max_body, limits.body_timeout), |u| {
        (u.max_body, u.body_timeout)
    });
    let body_limits = BodyLimits {
        frame_timeout: limits.body_frame_timeout,
        whole_timeout,
        max: max_body,
        drain: limits.drain_limit,
    };
    let body = GuardedBody::new(
        incoming,
        body_limits,
        Arc::clone(&verdict),
        Arc::clone(activity),
    );
    let too_large = format!("the request body is too large: at most {max_body} bytes are accepted");
    let response = match declared_length(&parts.headers) {
        Some(length) if length > max_body => {
            // A client waiting for `100 Continue` has not sent the body: answer at once.
            if !expects_continue(&parts.headers) && length <= limits.drain_limit {
                body::drain(body).await;
            }
            activity.body_done();
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
            // Answered: whatever of the body the app left unread no longer holds it up (hyper
            // closes the connection after an answer to an unread body).
            activity.body_done();
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
