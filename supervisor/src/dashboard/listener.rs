//! The dashboard's TCP listener with a cap on open connections. Anyone on the clinic's network
//! can open connections before logging in; without a cap, idle ones could use up the file
//! descriptors the supervisor needs for the board, the engine's pipes and its state files.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Connections served at once; further clients wait in the kernel's backlog.
pub const MAX_CONNECTIONS: usize = 64;

/// A TCP listener that accepts only while fewer than [`MAX_CONNECTIONS`] are open.
pub struct CappedListener {
    inner: TcpListener,
    slots: Arc<Semaphore>,
}

impl CappedListener {
    /// Wraps a bound listener.
    pub fn new(inner: TcpListener) -> CappedListener {
        CappedListener {
            inner,
            slots: Arc::new(Semaphore::new(MAX_CONNECTIONS)),
        }
    }
}

/// One accepted connection (TCP, or TLS over TCP); its slot is freed when it closes.
pub struct CappedStream<S = TcpStream> {
    stream: S,
    _slot: OwnedSemaphorePermit,
}

/// The client's address, as handlers see it.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

impl Listener for CappedListener {
    type Io = CappedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok(slot) = Arc::clone(&self.slots).acquire_owned().await else {
                // The semaphore is never closed; should it be, stop accepting for a moment.
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            };
            match self.inner.accept().await {
                Ok((stream, addr)) => {
                    return (
                        CappedStream {
                            stream,
                            _slot: slot,
                        },
                        addr,
                    );
                }
                Err(e) => {
                    // Out of descriptors or an aborted handshake: wait rather than spin.
                    tracing::warn!("dashboard: accepting a connection failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl Connected<IncomingStream<'_, CappedListener>> for ClientAddr {
    fn connect_info(stream: IncomingStream<'_, CappedListener>) -> Self {
        ClientAddr(*stream.remote_addr())
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for ClientAddr {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        ClientAddr(*stream.remote_addr())
    }
}

/// A TLS handshake that has not finished by then is dropped (a client that connects and says
/// nothing must not hold a slot).
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// HTTPS: accepts under the same cap as [`CappedListener`], each handshake in a task of its
/// own so a slow client never holds up the next.
pub struct TlsListener {
    handshaken: tokio::sync::mpsc::Receiver<(CappedStream<TlsStream<TcpStream>>, SocketAddr)>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

type TlsStream<S> = tokio_rustls::server::TlsStream<S>;

impl TlsListener {
    /// Serves TLS with `config` on a bound listener.
    pub fn new(inner: TcpListener, config: Arc<rustls::ServerConfig>) -> io::Result<TlsListener> {
        let local = inner.local_addr()?;
        let (done, handshaken) = tokio::sync::mpsc::channel(MAX_CONNECTIONS);
        let tls = tokio_rustls::TlsAcceptor::from(config);
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        let acceptor = tokio::spawn(async move {
            loop {
                let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
                    return;
                };
                let (stream, addr) = match inner.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!("dashboard: accepting a connection failed: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (tls, done) = (tls.clone(), done.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            let _ = done
                                .send((
                                    CappedStream {
                                        stream,
                                        _slot: slot,
                                    },
                                    addr,
                                ))
                                .await;
                        }
                        Ok(Err(e)) => tracing::debug!("dashboard: TLS handshake with {addr}: {e}"),
                        Err(_) => tracing::debug!("dashboard: TLS handshake with {addr} timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            handshaken,
            local,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl Listener for TlsListener {
    type Io = CappedStream<TlsStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.handshaken.recv().await {
            Some(accepted) => accepted,
            // The acceptor is gone (it only ends when dropped): nothing more will come.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for CappedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for CappedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}
