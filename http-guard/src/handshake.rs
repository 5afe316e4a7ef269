//! What happens on a connection before HTTP: nothing (plain TCP) or a TLS handshake. It runs
//! in the connection's own task under the handshake timeout, so a client that connects and
//! says nothing never holds up accepting the next one.

use std::future::Future;
use std::io;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// Turns an accepted TCP stream into the stream HTTP is spoken over.
pub trait Handshake: Send + Sync + 'static {
    /// The stream after the handshake.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// Performs the handshake; the server bounds it with `Limits::handshake_timeout`.
    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

/// Plain HTTP: the TCP stream as it is.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlainTcp;

impl Handshake for PlainTcp {
    type Stream = TcpStream;

    async fn handshake(&self, tcp: TcpStream) -> io::Result<TcpStream> {
        Ok(tcp)
    }
}

/// HTTPS through rustls.
#[cfg(feature = "tls")]
#[derive(Clone)]
pub struct Tls(pub tokio_rustls::TlsAcceptor);

#[cfg(feature = "tls")]
impl Handshake for Tls {
    type Stream = tokio_rustls::server::TlsStream<TcpStream>;

    fn handshake(&self, tcp: TcpStream) -> impl Future<Output = io::Result<Self::Stream>> + Send {
        self.0.accept(tcp)
    }
}
