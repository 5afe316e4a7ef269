//! `engine serve` end to end on the real SmolLM2: the OpenAI endpoints (plain and streamed),
//! llama.cpp's /completion, bad requests, API keys, the queue limit, slowloris and oversized
//! bodies, and a real client (the `openai` Python package).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::serve::{
    Server, chat, events, free_port, post, raw_request, request, start, start_with_env,
};
use serde_json::{Value, json};

#[test]
fn chat_completions_plain_and_streamed_agree() {
    let server = start(&[]);
    let (status, plain) = post(
        &server,
        "/v1/chat/completions",
        &chat("Name a colour.", json!({ "max_tokens": 12 })),
    );
    assert_eq!(status, 200, "{plain}");
    let text = plain["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(!text.is_empty());
    assert_eq!(plain["choices"][0]["message"]["role"], "assistant");
    assert!(
        ["stop", "length"].contains(&plain["choices"][0]["finish_reason"].as_str().unwrap_or(""))
    );
    let usage = &plain["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(
            usage["prompt_tokens"].as_u64().unwrap_or(0)
                + usage["completion_tokens"].as_u64().unwrap_or(0)
        )
    );
    for field in [
        "prompt_n",
        "prompt_ms",
        "prompt_per_second",
        "predicted_n",
        "predicted_ms",
        "predicted_per_second",
        "cache_n",
    ] {
        assert!(
            plain["timings"][field].is_number(),
            "timings.{field}: {plain}"
        );
    }

    let body = chat(
        "Name a colour.",
        json!({ "max_tokens": 12, "stream": true, "stream_options": { "include_usage": true } }),
    );
    let (status, raw) = request(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&body.to_string()),
        None,
    )
    .expect("stream");
    assert_eq!(status, 200);
    let chunks = events(&raw);
    assert_eq!(
        chunks.first().map(|c| &c["choices"][0]["delta"]["role"]),
        Some(&json!("assistant"))
    );
    assert_eq!(chunks.last(), Some(&json!("[DONE]")));
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(
        streamed, text,
        "greedy streaming must produce the same text"
    );
    let finish = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .collect::<Vec<_>>();
    assert_eq!(finish.len(), 1);
    assert!(
        chunks
            .iter()
            .any(|c| c["usage"]["completion_tokens"].is_number())
    );
    // The same conversation again reuses its prefix from the cache.
    let (_, again) = post(
        &server,
        "/v1/chat/completions",
        &chat("Name a colour.", json!({ "max_tokens": 12 })),
    );
    assert!(
        again["timings"]["cache_n"].as_u64().unwrap_or(0) > 0,
        "{again}"
    );
    assert_eq!(
        again["choices"][0]["message"]["content"],
        plain["choices"][0]["message"]["content"]
    );
    // `cache_prompt: false` (llama.cpp's) prefills the whole prompt again, to the same answer.
    let (_, fresh) = post(
        &server,
        "/v1/chat/completions",
        &chat(
            "Name a colour.",
            json!({ "max_tokens": 12, "cache_prompt": false }),
        ),
    );
    assert_eq!(fresh["timings"]["cache_n"], 0, "{fresh}");
    assert_eq!(
        fresh["timings"]["prompt_n"].as_u64(),
        again["timings"]["prompt_n"]
            .as_u64()
            .zip(again["timings"]["cache_n"].as_u64())
            .map(|(evaluated, cached)| evaluated + cached),
        "{fresh}"
    );
    assert_eq!(
        fresh["choices"][0]["message"]["content"],
        plain["choices"][0]["message"]["content"]
    );
    // Its choices still share one prefill: the second starts from the first's prompt.
    let (_, before) = activity(&server);
    let (_, two) = post(
        &server,
        "/v1/chat/completions",
        &chat(
            "Name a colour.",
            json!({ "max_tokens": 4, "n": 2, "cache_prompt": false }),
        ),
    );
    let (_, after) = activity(&server);
    let prompt_tokens = two["usage"]["prompt_tokens"].as_u64().expect("usage");
    assert!(
        prompt_tokens > 10 && after - before < 2 * prompt_tokens,
        "{} tokens evaluated for two choices of a {prompt_tokens}-token prompt: {two}",
        after - before
    );
}

#[test]
fn completions_native_endpoint_models_and_stop_strings() {
    let server = start(&[]);
    let (status, models) = request(&server, "GET", "/v1/models", None, None).expect("models");
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&models).expect("json");
    assert_eq!(models["object"], "list");
    assert!(models["data"][0]["id"].is_string());

    let (status, done) = post(
        &server,
        "/completion",
        &json!({ "prompt": "The capital of France is", "n_predict": 8, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{done}");
    assert!(
        done["content"].as_str().unwrap_or("").starts_with(" Paris"),
        "{done}"
    );
    assert_eq!(done["timings"]["predicted_n"], 8);
    // /health reports speeds only from requests long enough to mean something.
    let health = |server: &Server| -> Value {
        let (_, body) = request(server, "GET", "/health", None, None).expect("health");
        serde_json::from_str(&body).expect("json")
    };
    assert!(health(&server)["speeds"]["decode_tokens_per_second"].is_null());
    let (status, long) = post(
        &server,
        "/completion",
        &json!({ "prompt": "Once upon a time", "n_predict": 20, "temperature": 0 }),
    );
    assert_eq!(status, 200, "{long}");
    let speeds = health(&server)["speeds"].clone();
    let decode = speeds["decode_tokens_per_second"].as_f64().unwrap_or(0.0);
    assert!(decode > 0.0, "{speeds}");
    assert_eq!(
        decode,
        long["timings"]["predicted_per_second"]
            .as_f64()
            .unwrap_or(-1.0)
    );

    let (status, cut) = post(
        &server,
        "/v1/completions",
        &json!({ "prompt": "The capital of France is", "max_tokens": 30, "temperature": 0, "stop": ["."] }),
    );
    assert_eq!(status, 200, "{cut}");
    let text = cut["choices"][0]["text"].as_str().expect("text");
    assert!(!text.contains('.'), "{text:?}");
    assert_eq!(cut["choices"][0]["finish_reason"], "stop");

    // llama.cpp's dialect: a stop string is a "word", and its streams end without [DONE].
    let (_, word) = post(
        &server,
        "/completion",
        &json!({ "prompt": "The capital of France is", "n_predict": 30, "temperature": 0, "stop": ["."] }),
    );
    assert_eq!(word["stop_type"], "word", "{word}");
    assert_eq!(word["stopping_word"], ".");
    let body = json!({ "prompt": "Hello", "n_predict": 3, "stream": true }).to_string();
    let (_, raw) = request(&server, "POST", "/completion", Some(&body), None).expect("stream");
    let chunks = events(&raw);
    assert_eq!(
        chunks.last().map(|c| &c["stop"]),
        Some(&json!(true)),
        "{raw}"
    );
    assert!(!raw.contains("[DONE]"));
}

#[test]
fn bad_requests_get_openai_style_errors() {
    let server = start(&[]);
    let cases = [
        "{not json".to_string(),
        json!({ "messages": 3 }).to_string(),
        json!({ "messages": [] }).to_string(),
        chat("hi", json!({ "max_tokens": 0 })).to_string(),
        chat("hi", json!({ "temperature": -1 })).to_string(),
        chat(&"word ".repeat(800), json!({})).to_string(),
        chat(&"x".repeat(100_000), json!({})).to_string(),
        chat("hi", json!({ "stop": vec!["s"; 17] })).to_string(),
    ];
    for body in cases {
        let (status, text) =
            request(&server, "POST", "/v1/chat/completions", Some(&body), None).expect("response");
        assert_eq!(status, 400, "{body}: {text}");
        let error: Value = serde_json::from_str(&text).expect("json error");
        assert!(
            error["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{text}"
        );
        // A prompt over the context is llama.cpp's kind of 400, which clients act on.
        let kind = error["error"]["type"].as_str().unwrap_or("");
        assert!(
            ["invalid_request_error", "exceed_context_size_error"].contains(&kind),
            "{text}"
        );
    }
    // Still serving after all that.
    let (status, _) = post(
        &server,
        "/v1/chat/completions",
        &chat("hi", json!({ "max_tokens": 2 })),
    );
    assert_eq!(status, 200);
}

#[test]
fn slowloris_and_oversized_bodies_leave_the_server_answering() {
    let server = start(&[]);
    // More held half-open connections (headers begun, never ended) than the server keeps
    // open, from the address the next client uses too: it is answered anyway.
    let attack: Vec<TcpStream> = (0..160)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
            stream
                .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
                .expect("partial headers");
            stream
        })
        .collect();
    let started = Instant::now();
    let answer = request(&server, "GET", "/health", None, None);
    assert!(
        matches!(answer, Some((200, _))),
        "not answered during the attack: {answer:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // Held connections are bounded: the longest idle made room and was closed.
    let mut first = &attack[0];
    first
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut byte = [0u8; 1];
    assert!(
        matches!(first.read(&mut byte), Ok(0) | Err(_)),
        "the longest-idle half-open connection was kept"
    );
    drop(attack);

    // A 10 MiB body: a 413 in OpenAI's shape that the client reads, not a reset.
    let body = vec![b'x'; 10 << 20];
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .expect("headers");
    stream.write_all(&body).expect("the body is read");
    let mut raw = String::new();
    stream
        .read_to_string(&mut raw)
        .expect("the answer, not a reset");
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw:?}");
    let (_, text) = raw.split_once("\r\n\r\n").expect("a body");
    let error: Value = serde_json::from_str(text).expect("json error");
    assert_eq!(error["error"]["type"], "invalid_request_error", "{text}");
    assert_eq!(error["error"]["code"], 413, "{text}");
}

#[test]
fn an_api_key_is_required_when_set_and_beyond_loopback() {
    let server = start(&["--api-key", "s3cret"]);
    let body = chat("hi", json!({ "max_tokens": 2 })).to_string();
    let (status, text) =
        request(&server, "POST", "/v1/chat/completions", Some(&body), None).expect("response");
    assert_eq!(status, 401, "{text}");
    let (status, _) = request(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&body),
        Some("wrong"),
    )
    .expect("response");
    assert_eq!(status, 401);
    let (status, _) = request(
        &server,
        "POST",
        "/v1/chat/completions",
        Some(&body),
        Some("s3cret"),
    )
    .expect("response");
    assert_eq!(status, 200);
    let model = common::smollm2();
    let refused = Command::new(env!("CARGO_BIN_EXE_engine"))
        .args(["serve", "-m"])
        .arg(&model)
        .args(["--host", "0.0.0.0", "--port", &free_port().to_string()])
        .env_remove("ENGINE_API_KEY")
        .output()
        .expect("run");
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("API key"));
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let server = start(&["--queue", "1"]);
    let port = server.port;
    let long = chat(
        "Write a long story about a lighthouse.",
        json!({ "max_tokens": 300 }),
    )
    .to_string();
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let body = long.clone();
            std::thread::spawn(move || raw_request(port, "/v1/chat/completions", "", &body))
        })
        .collect();
    let responses: Vec<String> = handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect();
    let busy: Vec<&String> = responses
        .iter()
        .filter(|r| r.starts_with("HTTP/1.0 503"))
        .collect();
    assert!(
        !busy.is_empty(),
        "no request was turned away: {responses:?}"
    );
    assert!(
        busy.iter()
            .all(|r| r.to_ascii_lowercase().contains("retry-after: 1"))
    );
    assert!(responses.iter().any(|r| r.starts_with("HTTP/1.0 200")));
}

/// The supervisor's own requests (its health probe) carry the control key and are never
/// refused because users filled the queue, and go before users already waiting; a wrong key is
/// just a user.
#[test]
fn control_requests_skip_a_full_user_queue() {
    let server = start_with_env(&["--queue", "1"], &[("ENGINE_CONTROL_KEY", "box-secret")]);
    let port = server.port;
    let long = chat(
        "Write a long story about a lighthouse.",
        json!({ "max_tokens": 400, "ignore_eos": true }),
    )
    .to_string();
    // One running, one waiting: the users' queue is full.
    let user = |wait_for: &dyn Fn() -> bool, what: &str| {
        let body = long.clone();
        let sent = std::thread::spawn(move || raw_request(port, "/v1/chat/completions", "", &body));
        let deadline = Instant::now() + Duration::from_secs(60);
        while !wait_for() {
            assert!(Instant::now() < deadline, "the {what} request never did");
            std::thread::sleep(Duration::from_millis(20));
        }
        sent
    };
    let users = [
        user(&|| activity(&server).0, "first (running)"),
        user(&|| queued(&server) == 1, "second (waiting)"),
    ];
    let probe = r#"{"prompt":"Hello","n_predict":1,"temperature":0}"#;
    let stranger = raw_request(port, "/completion", "X-Engine-Control: guessed\r\n", probe);
    assert!(stranger.starts_with("HTTP/1.0 503"), "{stranger}");
    let control = raw_request(
        port,
        "/completion",
        "X-Engine-Control: box-secret\r\n",
        probe,
    );
    assert!(control.starts_with("HTTP/1.0 200"), "{control}");
    // Served before the user request that was already waiting: that one still has its 400
    // tokens to generate (a queue served in order would have answered it first).
    assert!(
        !users[1].is_finished(),
        "the waiting user request was answered before the control request"
    );
    for user in users {
        let answer = user.join().expect("thread");
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    }
}

/// Prompts built to burn CPU before being refused are refused at once: a run of one character
/// far longer than the context (quadratic merging took minutes), a huge role, a flood of empty
/// messages. The bound is generous; the old code took 54 to 311 s.
#[test]
fn hostile_prompts_are_refused_quickly() {
    let server = start(&["-c", "8192"]);
    let port = server.port;
    let cases = [
        (
            "/v1/completions",
            json!({ "prompt": "x".repeat(65_536) }),
            "context",
        ),
        (
            "/completion",
            json!({ "prompt": "7".repeat(100_000) }),
            "context",
        ),
        (
            "/v1/chat/completions",
            chat(&"x".repeat(100_000), json!({})),
            "context",
        ),
        (
            "/v1/chat/completions",
            json!({ "messages": [{ "role": "r".repeat(50_000), "content": "hi" }] }),
            "role",
        ),
        (
            "/v1/chat/completions",
            json!({ "messages": vec![json!({ "role": "user", "content": "" }); 20_000] }),
            "messages",
        ),
    ];
    for (path, body, names) in cases {
        let started = Instant::now();
        let answer = raw_request(port, path, "", &body.to_string());
        let took = started.elapsed();
        assert!(answer.starts_with("HTTP/1.0 400"), "{path}: {answer}");
        assert!(
            answer.contains(names),
            "{path}: the error names {names}: {answer}"
        );
        assert!(
            took < Duration::from_secs(5),
            "{path}: refused only after {took:?}"
        );
    }
    let (status, _) = post(
        &server,
        "/v1/chat/completions",
        &chat("hi", json!({ "max_tokens": 2 })),
    );
    assert_eq!(status, 200);
}

/// The official `openai` Python client (installed by .ci/run) against the server.
#[test]
fn the_openai_python_client_works() {
    let server = start(&[]);
    common::serve::run_client("openai_client.py", &server, &[], "SmolLM2");
}

/// The `openai` package's Responses API: plain and streamed with its typed events, the same
/// answer as the chat it means, a past call in the input, a kept response refused.
#[test]
fn the_openai_python_client_reads_responses() {
    let server = start(&["-c", "1024"]);
    common::serve::run_client("responses_client.py", &server, &[], "SmolLM2");
}

/// A configured system prompt is prefilled at start, so the first chat already reuses it; a
/// conversation picked up again after another one reuses its own prefix.
#[test]
fn system_prompt_and_recent_conversations_come_from_the_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prompt = dir.path().join("system.txt");
    std::fs::write(&prompt, "You are a terse assistant.\n").expect("write");
    let server = start(&["--system-prompt", prompt.to_str().expect("utf8")]);
    let (_, first) = post(
        &server,
        "/v1/chat/completions",
        &chat("Hello", json!({ "max_tokens": 4 })),
    );
    assert!(
        first["timings"]["cache_n"].as_u64().unwrap_or(0) > 5,
        "{first}"
    );
    let (_, other) = post(
        &server,
        "/v1/chat/completions",
        &chat("Something else entirely", json!({ "max_tokens": 4 })),
    );
    assert_eq!(other["choices"][0]["message"]["role"], "assistant");
    let reply = first["choices"][0]["message"]["content"]
        .as_str()
        .expect("reply");
    let follow_up = json!({
        "messages": [
            { "role": "user", "content": "Hello" },
            { "role": "assistant", "content": reply },
            { "role": "user", "content": "And again?" },
        ],
        "max_tokens": 4, "temperature": 0,
    });
    let (_, again) = post(&server, "/v1/chat/completions", &follow_up);
    let (cached, evaluated) = (
        again["timings"]["cache_n"].as_u64().unwrap_or(0),
        again["timings"]["prompt_n"].as_u64().unwrap_or(0),
    );
    assert!(
        cached > evaluated,
        "the follow-up re-read its history: {again}"
    );
}

/// What `/health` says the generation thread is doing: whether a request is running, and the
/// tokens it has evaluated or generated since the engine started.
fn activity(server: &Server) -> (bool, u64) {
    let (status, body) = request(server, "GET", "/health", None, None).expect("health");
    assert_eq!(status, 200, "{body}");
    let health: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    let busy = health["busy"].as_bool();
    let tokens = health["tokens_processed"].as_u64();
    match (busy, tokens) {
        (Some(busy), Some(tokens)) => (busy, tokens),
        _ => panic!("no busy or tokens_processed: {health}"),
    }
}

/// Users' requests waiting, as `/health` reports them.
fn queued(server: &Server) -> u64 {
    let (_, body) = request(server, "GET", "/health", None, None).expect("health");
    let health: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("not JSON: {body}"));
    health["queued"]
        .as_u64()
        .unwrap_or_else(|| panic!("no queued: {health}"))
}

/// Polls `/health` until the generation thread is idle, or panics after `limit`; the tokens
/// processed by then.
fn wait_until_idle(server: &Server, limit: Duration) -> u64 {
    let deadline = Instant::now() + limit;
    loop {
        match activity(server) {
            (false, tokens) => return tokens,
            (true, tokens) => assert!(
                Instant::now() < deadline,
                "still generating after {limit:?} ({tokens} tokens processed)"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client that goes away stops its generation: the engine goes idle with its token count far
/// below the request's limit, and the count stays there.
#[test]
fn a_disconnected_client_cancels_its_generation() {
    const LIMIT: u64 = 1500;
    let server = start(&["-c", "2048"]);
    let (busy, before) = activity(&server);
    assert!(!busy, "idle before the request");
    // `ignore_eos`: only the limit or a cancellation can end this generation, so it cannot
    // stop early by itself and pass for cancelled.
    let body = chat(
        "Tell me everything about the sea.",
        json!({ "max_tokens": LIMIT, "stream": true, "ignore_eos": true }),
    )
    .to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("send");
    // Generation is under way once a chunk with text has arrived.
    let mut reader = std::io::BufReader::new(stream);
    let mut line = String::new();
    let has_text = |line: &str| {
        events(line).iter().any(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .is_some_and(|t| !t.is_empty())
        })
    };
    while !has_text(&line) {
        line.clear();
        let read = std::io::BufRead::read_line(&mut reader, &mut line).expect("stream");
        assert!(read > 0, "the stream ended before any text");
    }
    let (busy, running) = activity(&server);
    assert!(
        busy && running > before,
        "the request is being generated: busy {busy}, {before} → {running} tokens"
    );
    drop(reader); // the connection closes mid-stream

    // The generation thread is free again, long before the limit could have been reached.
    let after = wait_until_idle(&server, Duration::from_secs(10));
    let done = after - before;
    // The prompt is about 40 tokens; cancellation takes effect at the next token after the
    // server's write to the closed connection fails.
    assert!(
        done < LIMIT / 4,
        "{done} tokens processed for a request of at most {LIMIT} abandoned after its first text"
    );
    // Stopped, not paused: nothing more is processed for it.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        activity(&server),
        (false, after),
        "work went on after the cancellation"
    );

    let (status, _) = post(
        &server,
        "/v1/chat/completions",
        &chat("hi", json!({ "max_tokens": 2 })),
    );
    assert_eq!(status, 200, "the engine serves the next request");
}

/// curl, the other client the box's users have.
#[test]
fn curl_streams_a_chat() {
    let server = start(&[]);
    let body = chat("Hi", json!({ "max_tokens": 4, "stream": true })).to_string();
    let out = Command::new("curl")
        .args([
            "-sN",
            "--max-time",
            "60",
            "-H",
            "Content-Type: application/json",
            "-d",
            &body,
        ])
        .arg(format!(
            "http://127.0.0.1:{}/v1/chat/completions",
            server.port
        ))
        .output()
        .expect("run curl");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    let chunks = events(&text);
    assert_eq!(chunks.last(), Some(&json!("[DONE]")), "{text}");
    assert!(chunks.len() >= 3, "{text}");
}

/// SIGTERM (what the supervisor sends before SIGKILL) ends an answer in flight at once with an
/// error event and `[DONE]`, so the client can tell it was cut off, and the process exits.
#[test]
fn sigterm_ends_a_stream_with_an_error_then_done() {
    let mut server = start(&["-c", "2048"]);
    let body = chat(
        "Write a long story about the sea.",
        json!({ "max_tokens": 1800, "stream": true, "ignore_eos": true }),
    )
    .to_string();
    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("send");
    let mut reader = std::io::BufReader::new(stream);
    let mut received = String::new();
    while events(&received).len() < 8 {
        let read = std::io::BufRead::read_line(&mut reader, &mut received).expect("stream");
        assert!(read > 0, "the stream ended early: {received}");
    }
    // While it generates, /health answers at once and shows the work growing.
    let (busy, first) = activity(&server);
    assert!(busy, "/health during a generation says it is idle");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (still_busy, now) = activity(&server);
        assert!(still_busy, "the generation stopped by itself");
        if now > first {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/health shows no progress during a generation: {first} tokens"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let signalled = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(server.child.id()).expect("pid")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let mut rest = String::new();
    reader
        .read_to_string(&mut rest)
        .expect("the rest of the stream");
    let ended = signalled.elapsed();
    let all = events(&(received + &rest));
    let n = all.len();
    assert!(n >= 2, "{all:?}");
    assert_eq!(all[n - 1], json!("[DONE]"), "the stream ends with [DONE]");
    assert_eq!(
        all[n - 2]["error"]["code"],
        json!(503),
        "an error event says the answer was cut off: {}",
        all[n - 2]
    );
    // Well under the supervisor's 10 s grace (1800 tokens would take far longer).
    assert!(
        ended < Duration::from_secs(5),
        "the stream ended {ended:?} after SIGTERM"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = server.child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the engine did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit after SIGTERM: {status}");
}
