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

/// One accepted connection; its slot is freed when it closes.
pub struct CappedStream {
    stream: TcpStream,
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

impl AsyncRead for CappedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CappedStream {
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
