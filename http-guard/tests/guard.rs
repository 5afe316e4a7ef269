//! The guard against hostile clients, over real sockets with a tiny app: slowloris from the
//! user's own address, header, idle and body timeouts, readable 413s, streams kept through
//! eviction, the per-client cap and graceful shutdown.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http_body::Frame;
use http_guard::{Limits, Server};

/// A server on 127.0.0.1 in a thread of its own; dropping it shuts it down.
struct TestServer {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestServer {
    /// Stops accepting and waits until every connection has finished.
    fn shut_down(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Not joined: a test that failed may leave a stream open that would block it.
    }
}

#[derive(Clone, Copy, Debug)]
struct Client(SocketAddr);

fn error_body(status: StatusCode, message: &str) -> Response {
    (status, format!("guard says: {message}")).into_response()
}

/// An endless response, as server-sent events are: a piece every 50 ms.
struct Ticks(tokio::time::Interval);

impl http_body::Body for Ticks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_tick(cx)
            .map(|_| Some(Ok(Frame::data(Bytes::from_static(b"data: tick\n\n")))))
    }
}

/// Which `/endless?id=N` answers have been dropped by the server (their connection closed).
static DROPPED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

fn dropped(id: u32) -> bool {
    DROPPED.lock().expect("dropped").contains(&id)
}

/// An endless answer of 64 KiB pieces as fast as the client takes them: what a long
/// generation's stream is to a client that stops reading.
struct Endless(u32);

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(Some(Ok(Frame::data(Bytes::from(vec![b'x'; 64 << 10])))))
    }
}

impl Drop for Endless {
    fn drop(&mut self) {
        DROPPED.lock().expect("dropped").push(self.0);
    }
}

#[derive(serde::Deserialize)]
struct Id {
    id: u32,
}

fn app() -> Router {
    Router::new()
        .route(
            "/endless",
            get(|axum::extract::Query(Id { id }): axum::extract::Query<Id>| async move {
                axum::body::Body::new(Endless(id))
            }),
        )
        .route(
            "/hello",
            get(|axum::extract::ConnectInfo(Client(peer)): axum::extract::ConnectInfo<Client>| async move {
                format!("hello {}", peer.ip())
            }),
        )
        .route("/echo", post(|body: Bytes| async move { format!("{} bytes", body.len()) }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "slow and done"
            }),
        )
        .route(
            "/stream",
            get(|| async {
                let ticks = tokio::time::interval(Duration::from_millis(50));
                ([("content-type", "text/event-stream")], axum::body::Body::new(Ticks(ticks)))
            }),
        )
}

fn start(limits: Limits) -> TestServer {
    let (ready, addr) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::spawn(move || {
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
            Server::new(limits, Client, error_body)
                .serve(listener, app(), async {
                    let _ = stopped.await;
                })
                .await;
        });
    });
    TestServer {
        addr: addr.recv().expect("the server's address"),
        stop: Some(stop),
        thread: Some(thread),
    }
}

/// Limits whose timeouts never end a test by themselves.
fn patient() -> Limits {
    Limits {
        header_timeout: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(60),
        body_frame_timeout: Duration::from_secs(60),
        body_timeout: Duration::from_secs(60),
        ..Limits::default()
    }
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
}

/// A connection from another loopback address (Linux routes all of 127/8 to `lo`).
fn connect_from(source: [u8; 4], addr: SocketAddr) -> TcpStream {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let stream = runtime.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(IpAddr::from(source), 0))
            .expect("bind the source address");
        socket.connect(addr).await.expect("connect")
    });
    let stream = stream.into_std().expect("std stream");
    stream.set_nonblocking(false).expect("blocking");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    stream
}

/// Half a request: the headers never end. False when the server had already reset the
/// connection to make room for others (an attacker it dropped before its first byte).
fn half_open(stream: &mut TcpStream) -> bool {
    match stream.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\nX-Slow: ") {
        Ok(()) => true,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
            ) =>
        {
            false
        }
        Err(e) => panic!("partial headers: {e}"),
    }
}

fn ask(stream: &mut TcpStream, path: &str, close: bool) {
    let connection = if close { "Connection: close\r\n" } else { "" };
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n{connection}\r\n").expect("request");
}

/// The whole answer on a connection the server closes after it.
fn answer(stream: &mut TcpStream) -> String {
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("the answer");
    String::from_utf8_lossy(&raw).into_owned()
}

/// One answer on a kept-alive connection: its head, and a body read by `Content-Length`.
fn keep_alive_answer(stream: &mut TcpStream) -> String {
    let mut reader = BufReader::new(stream);
    let mut head = String::new();
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("a header line");
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse().expect("length");
        }
        head.push_str(&line);
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).expect("the body");
    head + &String::from_utf8_lossy(&body)
}

/// Whether the server has closed `stream`: end of file, or a reset, within `limit`.
fn closed_within(stream: &mut TcpStream, limit: Duration) -> bool {
    stream.set_read_timeout(Some(limit)).expect("timeout");
    let mut byte = [0; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) => return true,
            // A 408 or anything else the server says before closing.
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn held_half_open_connections_do_not_shut_out_a_request_from_the_same_address() {
    // At the client's own cap, and at the global cap (one client allowed them all).
    for per_client in [16, 1000] {
        let server = start(Limits {
            max_connections: 64,
            per_client,
            ..patient()
        });
        let mut attack: Vec<TcpStream> = (0..80).map(|_| connect(server.addr)).collect();
        for stream in &mut attack {
            // Those past the caps may be dropped as they come: either way they hold nothing.
            half_open(stream);
        }
        let started = Instant::now();
        let mut user = connect(server.addr);
        ask(&mut user, "/hello", true);
        let reply = answer(&mut user);
        assert!(
            reply.starts_with("HTTP/1.1 200"),
            "per client {per_client}: {reply:?}"
        );
        assert!(
            reply.ends_with("hello 127.0.0.1"),
            "connect info: {reply:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // The first of them made room first: the longest idle went.
        assert!(closed_within(&mut attack[0], Duration::from_secs(5)));
        server.shut_down();
    }
}

#[test]
fn slow_headers_and_idle_connections_are_closed_after_their_timeouts() {
    let server = start(Limits {
        header_timeout: Duration::from_millis(300),
        ..patient()
    });
    let mut slow = connect(server.addr);
    assert!(half_open(&mut slow), "the only connection was reset");
    let started = Instant::now();
    assert!(
        closed_within(&mut slow, Duration::from_secs(10)),
        "held past the header timeout"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
    drop(server);

    let server = start(Limits {
        idle_timeout: Duration::from_millis(300),
        ..patient()
    });
    let mut kept = connect(server.addr);
    ask(&mut kept, "/hello", false);
    assert!(keep_alive_answer(&mut kept).starts_with("HTTP/1.1 200"));
    assert!(
        closed_within(&mut kept, Duration::from_secs(10)),
        "an idle keep-alive held"
    );
    let mut silent = connect(server.addr);
    assert!(
        closed_within(&mut silent, Duration::from_secs(10)),
        "a silent connection held"
    );
    server.shut_down();
}

#[test]
fn an_oversized_request_head_is_refused() {
    let server = start(patient());
    let mut stream = connect(server.addr);
    let filler = "a".repeat(100 << 10);
    // The server may stop reading (and answer) before all of it is sent.
    let _ = write!(
        stream,
        "GET /hello HTTP/1.1\r\nHost: x\r\nX-Big: {filler}\r\n\r\n"
    );
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 431"), "{reply:?}");
    server.shut_down();
}

#[test]
fn a_stalled_body_is_answered_408_after_the_body_timeout() {
    let server = start(Limits {
        body_frame_timeout: Duration::from_millis(300),
        ..patient()
    });
    let mut stream = connect(server.addr);
    stream
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly ten b")
        .expect("a partial body");
    let reply = answer(&mut stream);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply:?}");
    assert!(
        reply.contains("guard says: the request body did not arrive in time"),
        "{reply:?}"
    );
    server.shut_down();
}

#[test]
fn a_ten_mib_body_declared_or_chunked_gets_a_413_the_client_reads() {
    let server = start(patient());
    let body = vec![b'x'; 10 << 20];
    let mut stream = connect(server.addr);
    write!(
        stream,
        "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .expect("headers");
    stream
        .write_all(&body)
        .expect("the whole body is read by the server");
    let reply = answer(&mut stream);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply:?}");
    assert!(
        reply.to_ascii_lowercase().contains("connection: close"),
        "{reply:?}"
    );
    assert!(
        reply.contains("guard says: the request body is too large: at most 1048576 bytes"),
        "{reply:?}"
    );

    // Without a declared length (chunked), the limit is found while reading: the same answer,
    // read by the client, and never the app's.
    let mut stream = connect(server.addr);
    stream
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        .expect("headers");
    let chunk = [b'y'; 64 << 10];
    for _ in 0..160 {
        write!(stream, "{:x}\r\n", chunk.len()).expect("chunk size");
        stream
            .write_all(&chunk)
            .expect("the chunks are read by the server");
        stream.write_all(b"\r\n").expect("chunk end");
    }
    stream.write_all(b"0\r\n\r\n").expect("last chunk");
    let reply = answer(&mut stream);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply:?}");
    assert!(
        reply.contains("guard says: the request body is too large"),
        "{reply:?}"
    );

    // A client that waits for `100 Continue` is answered before it sends anything.
    let mut stream = connect(server.addr);
    stream
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 10485760\r\n\r\n")
        .expect("headers");
    let reply = answer(&mut stream);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply:?}");

    // Under the limit, the app gets the body.
    let mut stream = connect(server.addr);
    stream
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello")
        .expect("request");
    assert!(answer(&mut stream).ends_with("5 bytes"));
    server.shut_down();
}

/// Reads from a streamed answer until `count` more events have arrived.
fn read_ticks(stream: &mut TcpStream, count: usize) {
    let mut seen = 0;
    let mut buffer = [0; 4096];
    let mut text = String::new();
    while seen < count {
        let n = stream.read(&mut buffer).expect("the stream goes on");
        assert!(n > 0, "the stream was closed");
        text.push_str(&String::from_utf8_lossy(&buffer[..n]));
        seen = text.matches("data: tick").count();
    }
}

#[test]
fn a_streaming_answer_is_never_evicted() {
    let server = start(Limits {
        max_connections: 4,
        per_client: 100,
        ..patient()
    });
    let mut stream = connect(server.addr);
    ask(&mut stream, "/stream", false);
    read_ticks(&mut stream, 1);
    let mut attack: Vec<TcpStream> = (0..20).map(|_| connect(server.addr)).collect();
    for s in &mut attack {
        half_open(s);
    }
    let mut user = connect(server.addr);
    ask(&mut user, "/hello", true);
    assert!(answer(&mut user).starts_with("HTTP/1.1 200"));
    read_ticks(&mut stream, 5);

    // All four slots streaming: a new connection is closed, the streams go on.
    let mut streams = vec![stream];
    for _ in 0..3 {
        let mut s = connect(server.addr);
        ask(&mut s, "/stream", false);
        read_ticks(&mut s, 1);
        streams.push(s);
    }
    let mut refused = connect(server.addr);
    assert!(closed_within(&mut refused, Duration::from_secs(5)));
    for s in &mut streams {
        read_ticks(s, 2);
    }
}

#[test]
fn one_client_cannot_take_more_than_its_share() {
    let server = start(Limits {
        per_client: 2,
        ..patient()
    });
    // Two busy connections: a third from the same address is closed, others are served.
    let mut busy: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = connect_from([127, 0, 0, 2], server.addr);
            ask(&mut s, "/stream", false);
            read_ticks(&mut s, 1);
            s
        })
        .collect();
    let mut third = connect_from([127, 0, 0, 2], server.addr);
    assert!(closed_within(&mut third, Duration::from_secs(5)));
    let mut other = connect_from([127, 0, 0, 3], server.addr);
    ask(&mut other, "/hello", true);
    assert!(answer(&mut other).ends_with("hello 127.0.0.3"));
    for s in &mut busy {
        read_ticks(s, 1);
    }

    // Idle ones: the client's own longest idle makes room, the other stays usable.
    let mut first = connect_from([127, 0, 0, 4], server.addr);
    let mut second = connect_from([127, 0, 0, 4], server.addr);
    ask(&mut second, "/hello", false);
    assert!(keep_alive_answer(&mut second).starts_with("HTTP/1.1 200"));
    let mut newest = connect_from([127, 0, 0, 4], server.addr);
    ask(&mut newest, "/hello", true);
    assert!(answer(&mut newest).ends_with("hello 127.0.0.4"));
    assert!(
        closed_within(&mut first, Duration::from_secs(5)),
        "the longest idle kept"
    );
    ask(&mut second, "/hello", true);
    assert!(
        answer(&mut second).ends_with("hello 127.0.0.4"),
        "the other was closed"
    );
}

#[test]
fn shutting_down_finishes_the_request_in_flight() {
    let mut server = start(patient());
    let mut slow = connect(server.addr);
    ask(&mut slow, "/slow", true);
    // Let the request reach the handler before the server is told to stop.
    std::thread::sleep(Duration::from_millis(100));
    let addr = server.addr;
    let stopping = std::thread::spawn(move || {
        server.stop_now();
    });
    assert!(answer(&mut slow).ends_with("slow and done"));
    stopping.join().expect("stopped");
    assert!(
        TcpStream::connect(addr).is_err(),
        "still accepting after shutdown"
    );
}

/// Starts a request whose body never finishes arriving: headers, then a few bytes of a
/// declared kilobyte.
fn trickle(stream: &mut TcpStream) {
    stream
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
        .expect("a slow body");
}

#[test]
fn trickled_bodies_from_the_users_own_address_do_not_shut_it_out() {
    let server = start(Limits {
        max_connections: 64,
        per_client: 8,
        ..patient()
    });
    let mut attack: Vec<TcpStream> = (0..8).map(|_| connect(server.addr)).collect();
    for stream in &mut attack {
        trickle(stream);
    }
    // Their handlers are reading: each request is in flight. Past the grace a body still
    // arriving makes room for a client that has a request to make.
    std::thread::sleep(Duration::from_millis(2500));
    let mut user = connect(server.addr);
    ask(&mut user, "/hello", true);
    assert!(answer(&mut user).starts_with("HTTP/1.1 200"));
    let mut poster = connect(server.addr);
    poster
        .write_all(b"POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello")
        .expect("a whole body");
    assert!(answer(&mut poster).ends_with("5 bytes"));
    let closed = attack
        .iter_mut()
        .filter_map(|s| closed_within(s, Duration::from_millis(200)).then_some(()))
        .count();
    // The user's own closed connection left room for the second request.
    assert_eq!(closed, 1, "one trickler made room");
}

#[test]
fn a_body_owed_since_its_headers_times_out_even_if_the_app_never_reads_it() {
    let server = start(Limits {
        body_timeout: Duration::from_millis(500),
        ..patient()
    });
    // The body timer runs from the head, so the app that reads at once sees it expired after
    // half a second of silence, not after a fresh timeout.
    let mut slow = connect(server.addr);
    trickle(&mut slow);
    let started = Instant::now();
    let reply = answer(&mut slow);
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn an_answer_nobody_reads_makes_room_and_is_closed_after_the_write_timeout() {
    let server = start(Limits {
        per_client: 1,
        write_timeout: Duration::from_secs(30),
        ..patient()
    });
    let mut unread = connect(server.addr);
    ask(&mut unread, "/endless?id=1", false);
    // Not read at all: the socket fills, and after the grace the connection makes room.
    std::thread::sleep(Duration::from_secs(6));
    assert!(!dropped(1), "the answer is kept while its connection is");
    let mut user = connect(server.addr);
    ask(&mut user, "/hello", true);
    assert!(answer(&mut user).starts_with("HTTP/1.1 200"));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !dropped(1) {
        assert!(
            Instant::now() < deadline,
            "the unread answer was not dropped"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // With room to spare, the write timeout closes it on its own.
    let server = start(Limits {
        write_timeout: Duration::from_secs(1),
        ..patient()
    });
    let mut unread = connect(server.addr);
    ask(&mut unread, "/endless?id=2", false);
    let started = Instant::now();
    while !dropped(2) {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "an unread answer outlived its write timeout"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // A client that reads is never cut: the timeout is for no progress, not for length.
    let mut reader = connect(server.addr);
    ask(&mut reader, "/endless?id=3", false);
    let mut buffer = vec![0; 1 << 20];
    let mut total = 0usize;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(3) {
        let n = reader.read(&mut buffer).expect("still answered");
        assert!(n > 0, "closed while being read");
        total += n;
    }
    assert!(!dropped(3) && total > 1 << 20, "{total} bytes read");
}

#[test]
fn a_unix_socket_answers_while_tcp_clients_hold_every_connection() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("control.sock");
    let (ready, addr) = std::sync::mpsc::channel();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let unix_path = path.clone();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let unix = tokio::net::UnixListener::bind(&unix_path).expect("bind the socket");
            ready.send(tcp.local_addr().expect("addr")).expect("send");
            let limits = Limits {
                max_connections: 2,
                per_client: 2,
                ..patient()
            };
            let until = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
                let _ = stopped.wait_for(|s| *s).await;
            };
            let unix_client = Client(SocketAddr::from(([0, 0, 0, 0], 0)));
            tokio::join!(
                Server::new(limits.clone(), Client, error_body).serve(
                    tcp,
                    app(),
                    until(stopped.clone())
                ),
                Server::new(limits, Client, error_body).serve_unix(
                    unix,
                    unix_client,
                    app(),
                    until(stopped)
                ),
            );
        });
    });
    let addr = addr.recv().expect("the server's address");
    let mut streams: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = connect(addr);
            ask(&mut s, "/stream", false);
            read_ticks(&mut s, 1);
            s
        })
        .collect();
    let mut refused = connect(addr);
    assert!(closed_within(&mut refused, Duration::from_secs(5)));
    let mut local = std::os::unix::net::UnixStream::connect(&path).expect("connect");
    local
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        local,
        "GET /hello HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .expect("ask");
    let mut reply = String::new();
    local.read_to_string(&mut reply).expect("the answer");
    assert!(reply.ends_with("hello 0.0.0.0"), "{reply:?}");
    for s in &mut streams {
        read_ticks(s, 1);
    }
    drop(streams);
    let _ = stop.send(true);
    thread.join().expect("stopped");
}
