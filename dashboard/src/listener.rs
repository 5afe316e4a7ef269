//! How the dashboard is served, plain and over TLS: through `http_guard`, because anyone on the
//! clinic's network can connect before logging in. Open connections are capped (idle ones,
//! such as a slowloris attacker's half-sent requests, make room for new clients; a page being
//! answered or a live event stream never does), so they cannot use up the file descriptors the
//! supervisor needs for the board, the engine's pipes and its state files, nor shut a user out.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tokio::net::TcpListener;

use crate::error::DashError;

/// Connections open at once on each of the plain and HTTPS listeners.
pub const MAX_CONNECTIONS: usize = 64;

/// Connections open at once from one address: a browser opens about six, plus a live event
/// stream per tab.
pub const PER_CLIENT: usize = 16;

/// The client's address, as handlers see it.
#[derive(Debug, Clone, Copy)]
pub struct ClientAddr(pub SocketAddr);

fn limits() -> http_guard::Limits {
    http_guard::Limits {
        max_connections: MAX_CONNECTIONS,
        per_client: PER_CLIENT,
        max_body: crate::routes::BODY_LIMIT as u64,
        uploads: vec![
            http_guard::Upload {
                method: "POST",
                path: crate::update::PATH,
                max_body: crate::update::MAX_BUNDLE,
                body_timeout: crate::update::UPLOAD_TIMEOUT,
            },
            http_guard::Upload {
                method: "POST",
                path: crate::models::PUSH,
                max_body: crate::models::MAX_PUSH,
                body_timeout: Duration::from_secs(60),
            },
            http_guard::Upload {
                method: "PUT",
                path: crate::models::CHUNKS,
                max_body: crate::models::MAX_CHUNK,
                body_timeout: crate::models::CHUNK_TIMEOUT,
            },
        ],
        ..http_guard::Limits::default()
    }
}

/// The guard's refusals (413, 408) in the dashboard's own error shape.
fn refused(status: StatusCode, message: &str) -> Response {
    crate::routes::with_security_headers(
        DashError::Refused(status, message.to_string()).into_response(),
    )
}

/// Serves plain HTTP until the task is aborted.
pub async fn serve_plain(listener: TcpListener, router: Router) {
    http_guard::Server::new(limits(), ClientAddr, refused)
        .serve(listener, router, std::future::pending())
        .await;
}

/// Serves HTTPS with `config` until the task is aborted; each handshake runs in its
/// connection's own task under the guard's handshake timeout.
pub async fn serve_tls(listener: TcpListener, router: Router, config: Arc<rustls::ServerConfig>) {
    let tls = http_guard::Tls(tokio_rustls::TlsAcceptor::from(config));
    http_guard::Server::new(limits(), ClientAddr, refused)
        .with_handshake(tls)
        .serve(listener, router, std::future::pending())
        .await;
}
