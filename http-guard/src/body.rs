//! Request bodies read under timeouts, oversized bodies drained, and response bodies that keep
//! their request counted as in flight until they have been sent.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::{Instant, Sleep};

use crate::registry::InFlight;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request body stopped arriving: no frame within the frame timeout, or not all of it
/// within the whole-body timeout.
#[derive(Debug)]
pub(crate) struct BodyTimeout;

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive in time")
    }
}

impl std::error::Error for BodyTimeout {}

/// A request body that fails with [`BodyTimeout`] when the client stalls, and records that it
/// did so the server can answer 408 whatever the handler made of the error. The clocks start
/// when the handler first reads, not when the headers arrived.
pub(crate) struct TimedBody<B> {
    inner: B,
    frame_timeout: Duration,
    whole_timeout: Duration,
    frame: Option<Pin<Box<Sleep>>>,
    whole: Option<Pin<Box<Sleep>>>,
    timed_out: Arc<AtomicBool>,
}

impl<B> TimedBody<B> {
    pub(crate) fn new(
        inner: B,
        frame_timeout: Duration,
        whole_timeout: Duration,
        timed_out: Arc<AtomicBool>,
    ) -> TimedBody<B> {
        TimedBody {
            inner,
            frame_timeout,
            whole_timeout,
            frame: None,
            whole: None,
            timed_out,
        }
    }
}

impl<B> Body for TimedBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let now = Instant::now();
        let whole = this
            .whole
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(now + this.whole_timeout)));
        let frame = this
            .frame
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(now + this.frame_timeout)));
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(next) => {
                frame.as_mut().reset(now + this.frame_timeout);
                Poll::Ready(next.map(|r| r.map_err(Into::into)))
            }
            Poll::Pending => {
                if frame.as_mut().poll(cx).is_ready() || whole.as_mut().poll(cx).is_ready() {
                    this.timed_out.store(true, Ordering::Relaxed);
                    return Poll::Ready(Some(Err(Box::new(BodyTimeout))));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Reads and discards `body` so the answer to an oversized request reaches the client: closing
/// with unread bytes in the socket's receive buffer makes the kernel send a reset, and the
/// client loses the answer. Gives up at the first error or timeout (the caller closes anyway).
pub(crate) async fn drain<B>(body: TimedBody<B>)
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut body = body;
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            return;
        }
    }
}

/// A response body that holds its request's [`InFlight`] until the body is done or dropped:
/// a streamed answer keeps its connection safe from eviction for as long as it is sent.
pub(crate) struct Tracked {
    pub(crate) inner: axum::body::Body,
    pub(crate) _in_flight: InFlight,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
