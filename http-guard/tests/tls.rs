//! HTTPS through the guard: handshakes run in each connection's own task, so clients that
//! connect and never start one neither hold up the others nor keep their connection past the
//! handshake timeout. The client is curl, as a browser would be: any TLS client will do.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use http_guard::{Limits, Server, Tls};

fn error_body(status: StatusCode, message: &str) -> Response {
    (status, message.to_string()).into_response()
}

fn tls_config() -> Arc<rustls::ServerConfig> {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("config");
    Arc::new(config)
}

/// Serves HTTPS on 127.0.0.1 in a thread of its own for the rest of the test.
fn start(limits: Limits) -> SocketAddr {
    let (ready, addr) = std::sync::mpsc::channel();
    let config = tls_config();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            ready
                .send(listener.local_addr().expect("addr"))
                .expect("send");
            let router = Router::new().route("/hello", get(|| async { "hello over TLS" }));
            Server::new(limits, |peer| peer, error_body)
                .with_handshake(Tls(tokio_rustls::TlsAcceptor::from(config)))
                .serve(listener, router, std::future::pending())
                .await;
        });
    });
    addr.recv().expect("the server's address")
}

fn curl(addr: SocketAddr) -> String {
    let output = Command::new("curl")
        .args(["-sk", "--max-time", "10"])
        .arg(format!("https://localhost:{}/hello", addr.port()))
        .output()
        .expect("curl");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn silent_connections_neither_block_handshakes_nor_outlive_the_handshake_timeout() {
    let addr = start(Limits {
        max_connections: 64,
        per_client: 16,
        handshake_timeout: Duration::from_millis(500),
        ..Limits::default()
    });
    let mut silent: Vec<TcpStream> = (0..80)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    let started = Instant::now();
    assert_eq!(curl(addr), "hello over TLS");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The newest of them, which no later connection evicted, is closed by the handshake timeout.
    let last = silent.last_mut().expect("a connection");
    last.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut byte = [0; 1];
    // Closed (end of stream or reset), not merely silent until our own read timeout.
    let read = last.read(&mut byte);
    assert!(
        match &read {
            Ok(n) => *n == 0,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        },
        "kept past the handshake timeout: {read:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
}
