//! HTTP/1.1 to what serves: our engine over its control socket (the supervisor's own way in,
//! which clients of the engine's TCP port cannot fill, however many connections they hold,
//! however slowly they send), or a server of another make (the cluster head's `llama-server`)
//! on its loopback port. One request per connection (`Connection: close`), blocking, under one
//! deadline for the whole exchange and a bound on the answer's size.

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::control::{self, ControlKey};

/// Where the supervisor reaches what serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// Our engine's control socket.
    Socket(PathBuf),
    /// A port on 127.0.0.1.
    Loopback(u16),
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Socket(path) => write!(f, "{}", path.display()),
            Endpoint::Loopback(port) => write!(f, "127.0.0.1:{port}"),
        }
    }
}

/// The way in to the running server: where, and the launch's control key when the server is
/// our engine (its requests are then served in the supervisor's own lane).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    /// Where it listens.
    pub endpoint: Endpoint,
    /// The control key it was launched with, if it takes one.
    pub key: Option<ControlKey>,
}

/// One connection, to a socket or a port.
enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn connect(endpoint: &Endpoint, timeout: Duration) -> std::io::Result<Stream> {
        Ok(match endpoint {
            Endpoint::Socket(path) => Stream::Unix(UnixStream::connect(path)?),
            Endpoint::Loopback(port) => Stream::Tcp(TcpStream::connect_timeout(
                &SocketAddr::from((Ipv4Addr::LOCALHOST, *port)),
                timeout,
            )?),
        })
    }

    fn set_timeouts(&self, read: Option<Duration>, write: Option<Duration>) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(read).and(s.set_write_timeout(write)),
            Stream::Tcp(s) => s.set_read_timeout(read).and(s.set_write_timeout(write)),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Unix(s) => s.flush(),
            Stream::Tcp(s) => s.flush(),
        }
    }
}

/// The largest response head read.
const MAX_HEAD: usize = 64 << 10;

/// An answer: its status and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body (chunked transfer decoded).
    pub body: String,
}

/// One request through `access`: `method path` with `headers` (and the control key's, if it
/// has one) and a JSON `body`, answered within `timeout`, at most `limit` bytes of body.
pub fn request(
    access: &Access,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
    timeout: Duration,
    limit: usize,
) -> Result<Answer, String> {
    let deadline = Instant::now() + timeout;
    let shown = || format!("{method} {path} on {}", access.endpoint);
    let mut stream = Stream::connect(&access.endpoint, timeout)
        .map_err(|e| format!("{}: cannot connect: {e}", shown()))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: engine\r\nConnection: close\r\n");
    let key = access.key.as_ref().map(|k| (control::HEADER, k.as_str()));
    for (name, value) in headers.iter().chain(key.iter()) {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if let Some(body) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body.unwrap_or("").as_bytes());
    stream
        .set_timeouts(None, Some(remaining(deadline, &shown)?))
        .and_then(|()| stream.write_all(&out))
        .map_err(|e| format!("{}: sending: {e}", shown()))?;
    let raw = read_until_closed(&mut stream, deadline, MAX_HEAD + limit, &shown)?;
    parse(&raw, limit).map_err(|e| format!("{}: {e}", shown()))
}

fn remaining(deadline: Instant, shown: &dyn Fn() -> String) -> Result<Duration, String> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("{}: timed out", shown()))
}

/// Everything the engine sends until it closes the connection, within the deadline and `max`.
fn read_until_closed(
    stream: &mut Stream,
    deadline: Instant,
    max: usize,
    shown: &dyn Fn() -> String,
) -> Result<Vec<u8>, String> {
    let mut raw = Vec::new();
    let mut buffer = [0u8; 16 << 10];
    loop {
        stream
            .set_timeouts(Some(remaining(deadline, shown)?), None)
            .map_err(|e| format!("{}: {e}", shown()))?;
        match stream.read(&mut buffer) {
            Ok(0) => return Ok(raw),
            Ok(n) => {
                raw.extend_from_slice(&buffer[..n]);
                if raw.len() > max {
                    return Err(format!("{}: the answer is over {max} bytes", shown()));
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Err(format!("{}: timed out", shown()));
            }
            Err(e) => return Err(format!("{}: reading: {e}", shown())),
        }
    }
}

/// A whole HTTP/1.1 response: status line, headers, then the body by `Content-Length`,
/// chunked, or to the end.
fn parse(raw: &[u8], limit: usize) -> Result<Answer, String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("the answer ended inside its head")?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| "the answer's head is not text")?;
    let rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.strip_prefix("HTTP/1."))
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or("the answer has no status line")?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("a malformed header line: {line:?}"));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("Content-Length {value:?}"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
        }
    }
    let body = if chunked {
        dechunk(rest)?
    } else if let Some(length) = length {
        rest.get(..length)
            .ok_or("the answer ended before its Content-Length")?
            .to_vec()
    } else {
        rest.to_vec()
    };
    if body.len() > limit {
        return Err(format!("the answer is over {limit} bytes"));
    }
    let body = String::from_utf8(body).map_err(|_| "the answer's body is not UTF-8")?;
    Ok(Answer { status, body })
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a chunk without its size line")?;
        let size_text = std::str::from_utf8(&rest[..end]).map_err(|_| "a chunk size not text")?;
        let size_text = size_text.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("a chunk size {size_text:?}"))?;
        rest = &rest[end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).ok_or("the answer ended inside a chunk")?;
        body.extend_from_slice(chunk);
        rest = rest.get(size + 2..).ok_or("a chunk without its end")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_by_length_chunked_or_to_the_end() {
        let by_length = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", 10).expect("ok");
        assert_eq!((by_length.status, by_length.body.as_str()), (200, "ok"));
        let chunked = parse(
            b"HTTP/1.1 503 X\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n",
            10,
        )
        .expect("chunked");
        assert_eq!((chunked.status, chunked.body.as_str()), (503, "abcde"));
        let to_end = parse(b"HTTP/1.0 200 OK\r\n\r\nall of it", 10).expect("to the end");
        assert_eq!(to_end.body, "all of it");
        for bad in [
            &b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"garbage\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 3",
        ] {
            assert!(
                parse(bad, 10).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(parse(b"HTTP/1.1 200 OK\r\n\r\nfar too long", 4).is_err());
    }

    #[test]
    fn a_silent_engine_times_out_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("engine.sock");
        let access = Access {
            endpoint: Endpoint::Socket(path.clone()),
            key: None,
        };
        let e = request(
            &access,
            "GET",
            "/health",
            &[],
            None,
            Duration::from_secs(1),
            100,
        )
        .expect_err("nobody listens");
        assert!(e.contains("cannot connect"), "{e}");
        let _listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let started = Instant::now();
        let e = request(
            &access,
            "GET",
            "/health",
            &[],
            None,
            Duration::from_millis(300),
            100,
        )
        .expect_err("never answered");
        assert!(e.contains("timed out"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
