//! `engine serve` on the real SmolLM2 for tests: started on a free port and waited for, killed
//! on drop, and spoken to over plain HTTP/1.0.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use test_support::Owned;

/// A running server, killed on drop.
pub struct Server {
    /// The `engine serve` process.
    pub child: Owned,
    /// Where it listens.
    pub port: u16,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub fn start(extra: &[&str]) -> Server {
    start_with_env(extra, &[])
}

pub fn start_with_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
    start_model(&super::smollm2(), extra, env)
}

/// `engine serve` on `model`.
pub fn start_model(model: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let port = free_port();
    let child = Owned::spawn(
        Command::new(env!("CARGO_BIN_EXE_engine"))
            .envs(env.iter().copied())
            .args(["serve", "-m"])
            .arg(model)
            .args(["--port", &port.to_string(), "-t", "2"])
            .args(if extra.contains(&"-c") {
                &[][..]
            } else {
                &["-c", "512"][..]
            })
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
        "engine serve",
    );
    let mut server = Server { child, port };
    // It maps the model and answers, with no work before readiness that grows with the
    // machine's load: the wait lasts while it starts and ends if it exits.
    server.child.wait_until(|| {
        matches!(
            request_at(port, "GET", "/health", None, None),
            Some((200, _))
        )
    });
    server
}

/// A client script of `tests/clients/` run against `server`'s OpenAI API (`/v1`) with `args`;
/// its output in the panic when it fails (`what`: which server it was).
pub fn run_client(script: &str, server: &Server, args: &[&str], what: &str) {
    let path = format!("{}/tests/clients/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new("python3")
        .arg(&path)
        .arg(format!("http://127.0.0.1:{}/v1", server.port))
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{script} on {what}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `GET path`'s JSON body.
pub fn get_json(server: &Server, path: &str) -> Value {
    let (status, text) = request(server, "GET", path, None, None).expect("response");
    assert_eq!(status, 200, "{path}: {text}");
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

/// One HTTP/1.0 request (so the body ends when the connection closes, never chunked).
pub fn request(
    server: &Server,
    method: &str,
    path: &str,
    body: Option<&str>,
    key: Option<&str>,
) -> Option<(u16, String)> {
    request_at(server.port, method, path, body, key)
}

/// [`request`] to a port.
fn request_at(
    port: u16,
    method: &str,
    path: &str,
    body: Option<&str>,
    key: Option<&str>,
) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .ok()?;
    let body = body.unwrap_or("");
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).ok()?;
    stream.write_all(body.as_bytes()).ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let status = raw.split_whitespace().nth(1)?.parse().ok()?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

pub fn post(server: &Server, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) =
        request(server, "POST", path, Some(&body.to_string()), None).expect("response");
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

/// The JSON payloads of a server-sent event stream, `[DONE]` as a string.
pub fn events(body: &str) -> Vec<Value> {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_string())))
        .collect()
}

pub fn chat(content: &str, extra: Value) -> Value {
    let mut body =
        json!({ "messages": [{ "role": "user", "content": content }], "temperature": 0 });
    if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
        b.extend(e.clone());
    }
    body
}

/// One raw HTTP/1.0 request with extra header lines; the whole response.
pub fn raw_request(port: u16, path: &str, headers: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let head = format!(
        "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    raw
}

/// One raw HTTP/1.0 exchange with extra header lines: the status, the response head
/// (lower-cased, for header checks) and the body.
pub fn exchange(
    port: u16,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: localhost\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(head.as_bytes()).expect("send");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).expect("read");
    let status = raw
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    (status, head.to_ascii_lowercase(), body.to_string())
}
