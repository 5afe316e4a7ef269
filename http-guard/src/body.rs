//! Request bodies read under timeouts, oversized bodies drained, and response bodies that keep
//! their request counted as in flight until they have been sent.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::{Instant, Sleep};

use crate::registry::{Activity, InFlight};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a request body was cut off; the server answers 408 or 413 whatever the handler made of
/// the error it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// No frame within the frame timeout, or not all of it within the whole-body timeout.
    TimedOut,
    /// More than the limit arrived (a body without a declared length, e.g. chunked).
    TooLarge,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::TimedOut => "the request body did not arrive in time",
            Refusal::TooLarge => "the request body is too large",
        })
    }
}

impl std::error::Error for Refusal {}

/// Where a body records its [`Refusal`] for the server to read after the handler.
#[derive(Debug, Default)]
pub(crate) struct Verdict(AtomicU8);

impl Verdict {
    fn set(&self, refusal: Refusal) {
        let code = match refusal {
            Refusal::TimedOut => 1,
            Refusal::TooLarge => 2,
        };
        self.0.store(code, Ordering::Relaxed);
    }

    pub(crate) fn get(&self) -> Option<Refusal> {
        match self.0.load(Ordering::Relaxed) {
            1 => Some(Refusal::TimedOut),
            2 => Some(Refusal::TooLarge),
            _ => None,
        }
    }
}

/// What a request body may be.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits {
    pub(crate) frame_timeout: Duration,
    pub(crate) whole_timeout: Duration,
    pub(crate) max: u64,
    pub(crate) drain: u64,
}

/// A request body read under the body limits: it fails with a [`Refusal`] when the client
/// stalls or sends more than the limit. Past the limit it first reads and discards the rest
/// (up to the drain limit), so the 413 is not lost to a reset. The clocks start when the
/// request's head has arrived, not when the handler first reads: a client owes its body from
/// then on. What arrives is reported to the connection's [`Activity`], which is how a body
/// still trickling in counts as evictable.
pub(crate) struct GuardedBody<B> {
    inner: B,
    limits: BodyLimits,
    received: u64,
    draining: bool,
    frame: Pin<Box<Sleep>>,
    whole: Pin<Box<Sleep>>,
    verdict: Arc<Verdict>,
    activity: Arc<Activity>,
}

impl<B> GuardedBody<B> {
    pub(crate) fn new(
        inner: B,
        limits: BodyLimits,
        verdict: Arc<Verdict>,
        activity: Arc<Activity>,
    ) -> GuardedBody<B> {
        let now = Instant::now();
        GuardedBody {
            inner,
            limits,
            received: 0,
            draining: false,
            frame: Box::pin(tokio::time::sleep_until(now + limits.frame_timeout)),
            whole: Box::pin(tokio::time::sleep_until(now + limits.whole_timeout)),
            verdict,
            activity,
        }
    }

    fn refuse(&self, refusal: Refusal) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        self.verdict.set(refusal);
        Poll::Ready(Some(Err(Box::new(refusal))))
    }
}

impl<B> Body for GuardedBody<B>
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
        loop {
            let limits = this.limits;
            let next = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(next) => next,
                Poll::Pending => {
                    if this.frame.as_mut().poll(cx).is_ready()
                        || this.whole.as_mut().poll(cx).is_ready()
                    {
                        return this.refuse(Refusal::TimedOut);
                    }
                    return Poll::Pending;
                }
            };
            this.frame
                .as_mut()
                .reset(Instant::now() + limits.frame_timeout);
            let Some(Ok(next)) = next else {
                this.activity.body_done();
                if this.draining {
                    // Drained to its end (or the client gave up): now the 413.
                    return this.refuse(Refusal::TooLarge);
                }
                return Poll::Ready(next.map(|r| r.map_err(Into::into)));
            };
            let size = next.data_ref().map_or(0, |d| d.len() as u64);
            this.received = this.received.saturating_add(size);
            this.activity.body_received(size);
            if this.inner.is_end_stream() {
                this.activity.body_done();
            }
            if this.draining {
                if this.received > limits.drain {
                    return this.refuse(Refusal::TooLarge);
                }
                continue;
            }
            if this.received > limits.max {
                this.draining = true;
                continue;
            }
            return Poll::Ready(Some(Ok(next)));
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
pub(crate) async fn drain<B>(body: GuardedBody<B>)
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
