//! `engine serve` under the attacks a client on the network (or a process on the box) can make
//! without a key, at a small scale and bounded in time: while each runs, a legitimate client is
//! answered, the control socket is, and the engine's memory stays bounded.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use common::serve::{self, Server};
use serde_json::json;

/// A kilobyte of body declared, ten bytes sent: a request whose body never arrives.
fn trickle(port: u16) -> TcpStream {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .write_all(
            b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
              Content-Length: 1000\r\n\r\n{\"prompt\":",
        )
        .expect("a slow body");
    stream
}

/// One request over the control socket; the whole answer.
fn over_socket(socket: &Path, method: &str, path: &str, body: &str) -> String {
    let mut stream = UnixStream::connect(socket).expect("connect the control socket");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("ask");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("the answer");
    reply
}

/// A line of `/proc/PID/status` in KiB.
fn status_kib(server: &Server, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id()))
        .expect("the engine's status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in the engine's status"))
}

#[test]
fn slow_bodies_from_one_address_lock_nobody_out() {
    let dir = tempfile::tempdir().expect("dir");
    let socket = dir.path().join("control.sock");
    let server = serve::start(&["--control-socket", socket.to_str().expect("path")]);
    // As many as one address may hold, all from the address of the box's own clients.
    let attack: Vec<TcpStream> = (0..32).map(|_| trickle(server.port)).collect();
    // The control socket is the supervisor's own: answered at once, whatever the port holds.
    let reply = over_socket(&socket, "GET", "/health", "");
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // Past the grace a body still arriving makes room for a request that is whole.
    std::thread::sleep(Duration::from_millis(2500));
    let (status, _) = serve::request(&server, "GET", "/health", None, None).expect("answered");
    assert_eq!(status, 200);
    let (status, answer) = serve::post(
        &server,
        "/completion",
        &json!({ "prompt": "Hello", "n_predict": 2, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{answer}");
    let reply = over_socket(
        &socket,
        "POST",
        "/v1/chat/completions",
        &serve::chat("Hi", json!({ "max_tokens": 2 })).to_string(),
    );
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    drop(attack);
}

#[test]
fn tokenizing_many_large_texts_at_once_keeps_memory_bounded() {
    let server = serve::start(&[]);
    let before = status_kib(&server, "VmRSS:");
    // A mebibyte of varied text, with every token's piece asked for.
    let words = [
        "patient",
        "Überweisung",
        "12.5 mg",
        "\u{1F600}",
        "fn main() {}",
        "\n\t",
    ];
    let mut content = String::new();
    let mut i = 0usize;
    while content.len() < 900_000 {
        content.push_str(words[i % words.len()]);
        content.push(' ');
        i += 1;
    }
    let body = json!({ "content": content, "with_pieces": true }).to_string();
    let port = server.port;
    let clients: Vec<_> = (0..24)
        .map(|_| {
            let body = body.clone();
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
                stream
                    .set_read_timeout(Some(Duration::from_secs(300)))
                    .expect("timeout");
                write!(
                    stream,
                    "POST /tokenize HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                )
                .expect("head");
                stream.write_all(body.as_bytes()).expect("body");
                let mut reply = Vec::new();
                let _ = stream.read_to_end(&mut reply);
                String::from_utf8_lossy(&reply[..reply.len().min(12)]).into_owned()
            })
        })
        .collect();
    // Meanwhile a user's request is answered.
    std::thread::sleep(Duration::from_millis(500));
    let (status, answer) = serve::post(
        &server,
        "/completion",
        &json!({ "prompt": "Hello", "n_predict": 2, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{answer}");
    let replies: Vec<String> = clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect();
    let answered = replies
        .iter()
        .filter(|r| r.starts_with("HTTP/1.0 200") || r.starts_with("HTTP/1.1 200"))
        .count();
    for reply in &replies {
        assert!(
            reply.contains(" 200") || reply.contains(" 503"),
            "every request answered, in full or told to retry: {reply:?}"
        );
    }
    assert!(answered > 0, "none tokenized: {replies:?}");
    let peak = status_kib(&server, "VmHWM:");
    // Unbounded, 24 at once peaked 3 GB above the model; the budget keeps it to a few
    // tokenizations' worth.
    let grew_mib = peak.saturating_sub(before) / 1024;
    eprintln!("peak RSS grew {grew_mib} MiB; {answered} of 24 answered");
    assert!(
        grew_mib < 400,
        "peak RSS grew {grew_mib} MiB tokenizing 24 MiB of text ({answered} of 24 answered)"
    );
}

/// The engine-side sockets of `port` with bytes the kernel has not yet delivered (its
/// `tx_queue`), from `/proc/net/tcp` and `tcp6`.
fn unsent_bytes(port: u16) -> u64 {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .flat_map(|table| {
            table
                .lines()
                .skip(1)
                .filter_map(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    let local_port = fields.get(1)?.rsplit(':').next()?;
                    if u16::from_str_radix(local_port, 16).ok()? != port {
                        return None;
                    }
                    let tx = fields.get(4)?.split(':').next()?;
                    u64::from_str_radix(tx, 16).ok()
                })
                .collect::<Vec<u64>>()
        })
        .sum()
}

#[test]
fn a_client_that_never_reads_its_stream_is_cut_off() {
    let server = serve::start(&["-c", "4096"]);
    // A small receive buffer, so the answer backs up into the engine at once.
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    socket.set_recv_buffer_size(4096).expect("rcvbuf");
    socket
        .connect(&std::net::SocketAddr::from(([127, 0, 0, 1], server.port)).into())
        .expect("connect");
    let mut stream: TcpStream = socket.into();
    let body = json!({
        "prompt": "Write a long story.", "n_predict": 3000, "ignore_eos": true,
        "temperature": 0, "stream": true,
    })
    .to_string();
    write!(
        stream,
        "POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("ask");
    // Never read. The answer stalls in the engine's socket...
    let started = Instant::now();
    while unsent_bytes(server.port) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "nothing backed up"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // ...filling the send buffer as fast as the machine generates, then stalling. While the
    // answer is still being written, the write timeout (30 s without the client taking 4 KiB)
    // resets the connection; when the whole answer fit the capped send buffer (n-gram drafting
    // makes this story quick), the connection idles out (60 s) and is reset then. Either way
    // what was held is dropped. The clock runs from the last growth: how long filling takes is
    // the machine's speed, not the server's.
    let (mut held, mut grew) = (unsent_bytes(server.port), Instant::now());
    loop {
        let now = unsent_bytes(server.port);
        if now == 0 {
            break;
        }
        if now > held {
            (held, grew) = (now, Instant::now());
        }
        assert!(
            grew.elapsed() < Duration::from_secs(90),
            "{now} bytes still held 90 s after the last write went through, for a client that \
             never reads"
        );
        assert!(started.elapsed() < Duration::from_secs(600), "hung");
        std::thread::sleep(Duration::from_millis(500));
    }
    let (status, _) = serve::request(&server, "GET", "/health", None, None).expect("answered");
    assert_eq!(status, 200);
    drop(stream);
}

#[test]
fn a_bias_beyond_f32_and_an_overly_ambiguous_grammar_are_the_clients_to_fix() {
    let server = serve::start(&[]);
    // 1e308 would be +inf as f32: clamped, the token is forced and every probability finite.
    let (status, answer) = serve::post(
        &server,
        "/completion",
        &json!({
            "prompt": "Hello", "n_predict": 3, "temperature": 0, "n_probs": 3,
            "logit_bias": [[42, 1e308]],
        }),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["tokens"], json!([42, 42, 42]), "{answer}");
    for entry in answer["completion_probabilities"]
        .as_array()
        .expect("probabilities")
    {
        for top in entry["top_logprobs"].as_array().expect("top") {
            let logprob = top["logprob"].as_f64().expect("a number");
            assert!(logprob.is_finite() && logprob <= 0.0, "{entry}");
        }
    }
    // A grammar whose start has more alternatives alive than the matcher follows.
    let alternatives: Vec<String> = (0..5000).map(|i| format!("\"a{i}\"")).collect();
    let grammar = format!("root ::= {}", alternatives.join(" | "));
    let (status, answer) = serve::post(
        &server,
        "/completion",
        &json!({ "prompt": "Hello", "n_predict": 3, "grammar": grammar }),
    );
    assert_eq!(status, 400, "{answer}");
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("4096 alternatives"), "{message}");
    // The same ambiguity met after the start: refused as the client's too, not a 500.
    let grammar = format!(
        "root ::= \"x\" choice\nchoice ::= {}",
        alternatives.join(" | ")
    );
    let (status, answer) = serve::post(
        &server,
        "/completion",
        &json!({ "prompt": "Hello", "n_predict": 3, "grammar": grammar }),
    );
    assert_eq!(status, 400, "{answer}");
}
