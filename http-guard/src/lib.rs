//! Serves an axum [`Router`] to untrusted clients over HTTP/1.1 (hyper), so that no client can
//! make the server unanswerable for the others:
//!
//! - **timeouts** on the TLS handshake, on request headers (slowloris), on each body frame and
//!   the whole body, and on time without a request in flight;
//! - **a connection cap that evicts**: at [`Limits::max_connections`] a new connection closes
//!   the one idle longest (waiting for its first request or between keep-alive requests),
//!   never one whose request is being handled or whose response is still being sent to a
//!   client that reads it (e.g. a stream of server-sent events); attacker and user may share
//!   an address, so a per-address cap alone could not keep the user served;
//! - **a per-client cap**: at [`Limits::per_client`] a client's new connection closes that
//!   client's own most evictable one, or is itself closed if all of them are busy; an IPv6
//!   client is counted by its /64;
//! - **bodies and answers the client holds up**: a request body still arriving after a short
//!   grace, and an answer the client has stopped reading, make room like idle connections do
//!   (after them); the body clocks start when the head has arrived, and an answer not read
//!   for [`Limits::write_timeout`] (under 4 KiB taken: zero-window probes trickle a byte now
//!   and then) resets its connection. The kernel's send buffer is capped at
//!   [`Limits::send_buffer`], so an unread answer holds little memory meanwhile; one that fit
//!   in it whole is reset a write timeout after its connection ended (idle or timed out), not
//!   left to the kernel's retries;
//! - **a readable 413**: a declared body over [`Limits::max_body`] is read and discarded (up to
//!   [`Limits::drain_limit`]) before the answer, so the close is not a reset that loses it;
//! - graceful shutdown: stop accepting, let requests in flight finish;
//! - a Unix socket ([`Server::serve_unix`]) under the same limits: a path of its own for a
//!   trusted local client (a supervisor's probe) that the TCP port's clients cannot fill.
//!
//! The app's own error shape is kept: 408 and 413 bodies come from the app's [`ErrorBody`],
//! and the connection's client address reaches handlers as `ConnectInfo<C>` of the app's type.

mod body;
mod connection;
mod handshake;
mod registry;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::Response;
use tokio::net::{TcpListener, UnixListener};

#[cfg(feature = "tls")]
pub use handshake::Tls;
pub use handshake::{Handshake, PlainTcp};

use registry::Registry;

/// What one server allows its clients.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once (including handshakes in progress).
    pub max_connections: usize,
    /// Connections open at once from one IP address.
    pub per_client: usize,
    /// Time for the TLS handshake (plain TCP has none).
    pub handshake_timeout: Duration,
    /// Time for a request's head, from when the connection starts waiting for it: hyper 1.12
    /// arms it right after the previous response, so it also closes idle keep-alives.
    pub header_timeout: Duration,
    /// Time a connection may spend with no request in flight, counted by the guard itself: a
    /// bound that holds whatever hyper's header timer covers (today that is sooner).
    pub idle_timeout: Duration,
    /// Time between two pieces of a request body.
    pub body_frame_timeout: Duration,
    /// Time for a whole request body, from when its request's head has arrived.
    pub body_timeout: Duration,
    /// Time an answer may wait for its client to take a single byte before the connection is
    /// closed (the client stopped reading).
    pub write_timeout: Duration,
    /// The socket's send buffer (`SO_SNDBUF`; the kernel doubles it): at most this much of an
    /// answer waits in the kernel for a client that does not read.
    pub send_buffer: usize,
    /// The largest request head (request line and headers) read; larger ones get 431. Also
    /// the most hyper buffers per connection, so it bounds the memory half-open ones hold.
    pub max_header_bytes: usize,
    /// The largest request body passed to the app: a larger declared `Content-Length` is
    /// refused before the app runs, a larger body without one when it is found so.
    pub max_body: u64,
    /// The largest oversized body read (and discarded) so its 413 can be read; beyond it the
    /// connection is closed after the answer.
    pub drain_limit: u64,
    /// Requests that may carry more than `max_body` (an update bundle): by method and exact
    /// path, each with its own size and whole-body time limit; every other limit still holds.
    pub uploads: Vec<Upload>,
}

/// A route that takes a large body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    /// The method, e.g. `POST`.
    pub method: &'static str,
    /// The exact path, e.g. `/api/update`; one ending in `*` takes every path that starts
    /// with what comes before it (`/api/models/incoming/*`).
    pub path: &'static str,
    /// The largest body passed to the app.
    pub max_body: u64,
    /// Time for the whole body.
    pub body_timeout: Duration,
}

impl Upload {
    /// Whether a request for `path` is this upload.
    pub fn covers(&self, path: &str) -> bool {
        match self.path.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => path == self.path,
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 64,
            per_client: 16,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_frame_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            write_timeout: Duration::from_secs(30),
            send_buffer: 128 << 10,
            max_header_bytes: 64 << 10,
            max_body: 1 << 20,
            drain_limit: 16 << 20,
            uploads: Vec::new(),
        }
    }
}

/// The app's error response for a status and a message (413, 408), in the app's own shape.
pub type ErrorBody = fn(StatusCode, &str) -> Response;

/// A configured server; [`Server::serve`] runs it.
pub struct Server<C, H = PlainTcp> {
    limits: Limits,
    handshake: H,
    connect_info: fn(SocketAddr) -> C,
    error_body: ErrorBody,
}

impl<C> Server<C, PlainTcp>
where
    C: Clone + Send + Sync + 'static,
{
    /// Plain HTTP under `limits`; handlers see `ConnectInfo(connect_info(peer))`.
    pub fn new(limits: Limits, connect_info: fn(SocketAddr) -> C, error_body: ErrorBody) -> Self {
        Server {
            limits,
            handshake: PlainTcp,
            connect_info,
            error_body,
        }
    }
}

impl<C, H> Server<C, H>
where
    C: Clone + Send + Sync + 'static,
    H: Handshake,
{
    /// The same server with another handshake, e.g. [`Tls`].
    pub fn with_handshake<H2: Handshake>(self, handshake: H2) -> Server<C, H2> {
        Server {
            limits: self.limits,
            handshake,
            connect_info: self.connect_info,
            error_body: self.error_body,
        }
    }

    /// Serves `router` on `listener` until `shutdown` completes, then stops accepting and
    /// returns once every connection has finished its request in flight and closed.
    pub async fn serve(
        self,
        listener: TcpListener,
        router: Router,
        shutdown: impl Future<Output = ()>,
    ) {
        let connect_info = self.connect_info;
        let send_buffer = self.limits.send_buffer;
        self.serve_with(
            listener,
            move |shared: &Arc<Shared<H>>, (tcp, peer): (tokio::net::TcpStream, SocketAddr)| {
                // Streamed answers are many small writes; do not hold them back for
                // coalescing. A small send buffer bounds what an unread answer holds.
                let _ = tcp.set_nodelay(true);
                let _ = socket2::SockRef::from(&tcp).set_send_buffer_size(send_buffer);
                // A second handle on the socket, to reset it if its client stops reading.
                let abort = std::os::fd::AsFd::as_fd(&tcp).try_clone_to_owned().ok();
                let shared = Arc::clone(shared);
                Accepted {
                    abort,
                    client: peer.ip(),
                    info: connect_info(peer),
                    peer: peer.to_string(),
                    stream: async move { shared.handshake.handshake(tcp).await },
                }
            },
            router,
            shutdown,
        )
        .await;
    }

    async fn serve_with<L: Listen, S, T>(
        self,
        listener: L,
        mut accepted: impl FnMut(&Arc<Shared<H>>, L::Connection) -> Accepted<C, T>,
        router: Router,
        shutdown: impl Future<Output = ()>,
    ) where
        T: Future<Output = std::io::Result<S>> + Send + 'static,
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let shared = Arc::new(Shared {
            registry: Mutex::new(Registry::new(
                self.limits.max_connections,
                self.limits.per_client,
            )),
            limits: self.limits,
            handshake: self.handshake,
            error_body: self.error_body,
            router,
        });
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let mut connections = tokio::task::JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            let next = tokio::select! {
                () = &mut shutdown => break,
                next = listener.accept() => next,
            };
            while connections.try_join_next().is_some() {}
            let next = match next {
                Ok(next) => next,
                Err(e) => {
                    // Out of descriptors, typically: wait for some to close rather than spin.
                    tracing::warn!("accepting a connection failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Accepted {
                abort,
                client,
                info,
                peer,
                stream,
            } = accepted(&shared, next);
            let Some(admitted) = shared.registry().admit(client, Instant::now()) else {
                tracing::debug!("{peer}: every connection busy at the cap; closed");
                continue;
            };
            connections.spawn(connection::run(
                Arc::clone(&shared),
                stream,
                abort,
                peer,
                info,
                admitted,
                stopped.clone(),
            ));
        }
        // New clients are refused from now on rather than left waiting in the backlog.
        drop(listener);
        let _ = stop.send(true);
        while connections.join_next().await.is_some() {}
    }
}

/// A listening socket the server accepts from.
trait Listen {
    type Connection;
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Connection>>;
}

impl Listen for TcpListener {
    type Connection = (tokio::net::TcpStream, SocketAddr);
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Connection>> {
        TcpListener::accept(self)
    }
}

impl Listen for UnixListener {
    type Connection = (tokio::net::UnixStream, tokio::net::unix::SocketAddr);
    fn accept(&self) -> impl Future<Output = std::io::Result<Self::Connection>> {
        UnixListener::accept(self)
    }
}

impl<C> Server<C, PlainTcp>
where
    C: Clone + Send + Sync + 'static,
{
    /// Serves `router` on a Unix socket until `shutdown` completes, like [`Server::serve`]:
    /// every connection is one client, whose handlers see `ConnectInfo(info)`. Who may
    /// connect is the socket file's permissions' to say.
    pub async fn serve_unix(
        self,
        listener: UnixListener,
        info: C,
        router: Router,
        shutdown: impl Future<Output = ()>,
    ) {
        self.serve_with(
            listener,
            move |_: &Arc<Shared<PlainTcp>>, (unix, _): (tokio::net::UnixStream, _)| Accepted {
                abort: None,
                // One client: the caps count every connection against the same address.
                client: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                info: info.clone(),
                peer: "the Unix socket's client".to_string(),
                stream: std::future::ready(Ok(unix)),
            },
            router,
            shutdown,
        )
        .await;
    }
}

/// A connection accepted, before admission: whom it counts against, what handlers see, its
/// name in logs, and its stream once the handshake is done.
struct Accepted<C, T> {
    /// A duplicate of a TCP socket's descriptor, to reset the connection (discarding what the
    /// kernel still holds of an unread answer) when the write timeout closes it.
    abort: Option<std::os::fd::OwnedFd>,
    client: IpAddr,
    info: C,
    peer: String,
    stream: T,
}

/// What the accept loop and every connection share.
struct Shared<H> {
    limits: Limits,
    handshake: H,
    error_body: ErrorBody,
    router: Router,
    registry: Mutex<Registry>,
}

impl<H> Shared<H> {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        // Every registry operation leaves it consistent; a panic elsewhere must not stop us.
        self.registry.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::Upload;
    use std::time::Duration;

    #[test]
    fn an_upload_path_is_exact_unless_it_ends_in_a_star() {
        let upload = |path| Upload {
            method: "PUT",
            path,
            max_body: 1,
            body_timeout: Duration::from_secs(1),
        };
        let exact = upload("/api/update");
        assert!(exact.covers("/api/update"));
        assert!(!exact.covers("/api/update/x") && !exact.covers("/api/updates"));
        let prefix = upload("/api/models/incoming/*");
        assert!(prefix.covers("/api/models/incoming/gemma/model/3"));
        assert!(!prefix.covers("/api/models/incomin") && !prefix.covers("/api/models/push"));
    }
}
