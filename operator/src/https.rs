//! A small HTTPS client for talking to boxes: the box's self-signed certificate is trusted by
//! its SHA-256 (pinned in `fleet.lock` at enrolment) rather than by a CA, and a box whose
//! certificate does not match is told nothing, not even the API token.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};

/// Connect and I/O deadline.
const TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read (a status document is a few KiB).
const MAX_RESPONSE: u64 = 4 << 20;

/// An answer from a box.
#[derive(Debug)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// Header names (lowercase) and values.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// SHA-256 of the certificate the box presented, hex.
    pub certificate_sha256: String,
}

/// Why a request got no answer.
#[derive(Debug)]
pub enum Failure {
    /// The box could not be reached (or did not speak TLS/HTTP).
    Unreachable(String),
    /// The box presented another certificate than the pinned one.
    IdentityMismatch {
        /// What it presented.
        presented: String,
    },
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Unreachable(why) => write!(f, "unreachable: {why}"),
            Failure::IdentityMismatch { presented } => write!(
                f,
                "IDENTITY MISMATCH: it presents certificate {presented}, not the enrolled one; not trusted"
            ),
        }
    }
}

/// Accepts the certificate whose SHA-256 is pinned (any, when none is), and records what was
/// presented. Handshake signatures are checked as usual: the server must hold the key.
#[derive(Debug)]
struct Pinned {
    pin: Option<String>,
    presented: Mutex<Option<String>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let sha = hex::encode(Sha256::digest(end_entity.as_ref()));
        let matches = self.pin.as_ref().is_none_or(|pin| *pin == sha);
        if let Ok(mut presented) = self.presented.lock() {
            *presented = Some(sha);
        }
        if matches {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::General(
                "certificate does not match the pin".into(),
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// One request: `method` `path` on `address` (`host:port`), with a bearer token and a body
/// (content type, bytes) if given, trusting only the certificate pinned by `pin` (any when
/// `None`).
pub fn request(
    address: &str,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<(&str, &[u8])>,
    pin: Option<&str>,
) -> Result<Response, Failure> {
    request_within(TIMEOUT, address, method, path, bearer, body, pin)
}

/// [`request`] with `timeout` for the connection and each read and write instead of the
/// usual 10 s: for an answer the box computes for longer (a pushed model's last chunk
/// verifies the whole model before it is answered).
pub fn request_within(
    timeout: Duration,
    address: &str,
    method: &str,
    path: &str,
    bearer: Option<&str>,
    body: Option<(&str, &[u8])>,
    pin: Option<&str>,
) -> Result<Response, Failure> {
    let unreachable = |e: &dyn std::fmt::Display| Failure::Unreachable(format!("{address}: {e}"));
    let host = address
        .rsplit_once(':')
        .map_or(address, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let name = ServerName::try_from(host).map_err(|e| unreachable(&e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(Pinned {
        pin: pin.map(str::to_ascii_lowercase),
        presented: Mutex::new(None),
        provider: Arc::clone(&provider),
    });
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| unreachable(&e))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::clone(&verifier) as Arc<dyn ServerCertVerifier>)
        .with_no_client_auth();
    let socket = address
        .to_socket_addrs()
        .map_err(|e| unreachable(&e))?
        .next()
        .ok_or_else(|| unreachable(&"no address"))?;
    let tcp = TcpStream::connect_timeout(&socket, timeout).map_err(|e| unreachable(&e))?;
    let _ = tcp.set_read_timeout(Some(timeout));
    let _ = tcp.set_write_timeout(Some(timeout));
    let connection =
        rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| unreachable(&e))?;
    let mut tls = rustls::StreamOwned::new(connection, tcp);
    // The handshake happens here, before anything is sent.
    let handshake = tls.conn.complete_io(&mut tls.sock);
    let presented = verifier
        .presented
        .lock()
        .ok()
        .and_then(|p| p.clone())
        .unwrap_or_default();
    if let Err(e) = handshake {
        if pin.is_some_and(|pin| !presented.is_empty() && !pin.eq_ignore_ascii_case(&presented)) {
            return Err(Failure::IdentityMismatch { presented });
        }
        return Err(unreachable(&e));
    }
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nAccept: application/json\r\n"
    );
    if let Some(token) = bearer {
        head.push_str(&format!("Authorization: Bearer {token}\r\n"));
    }
    let (content_type, body) = body.unwrap_or(("application/json", b""));
    if method != "GET" {
        head.push_str(&format!(
            "Content-Type: {content_type}\r\nContent-Length: {}\r\n",
            body.len()
        ));
    }
    head.push_str("\r\n");
    tls.write_all(head.as_bytes())
        .and_then(|()| tls.write_all(body))
        .and_then(|()| tls.flush())
        .map_err(|e| unreachable(&e))?;
    let mut raw = Vec::new();
    match (&mut tls).take(MAX_RESPONSE).read_to_end(&mut raw) {
        Ok(_) => {}
        // A server that closes without close_notify has still sent its whole answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(unreachable(&e)),
    }
    let (status, headers, body) = parse(&raw).map_err(|e| unreachable(&e))?;
    Ok(Response {
        status,
        headers,
        body,
        certificate_sha256: presented,
    })
}

type Parsed = (u16, Vec<(String, String)>, Vec<u8>);

/// Status code, headers and body of an HTTP/1.1 response read to its end.
fn parse(raw: &[u8]) -> Result<Parsed, String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no complete HTTP response")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let body = &raw[split + 4..];
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no HTTP status line")?;
    let headers: Vec<(String, String)> = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok((status, headers, body))
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("a truncated chunk")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| "a bad chunk size")?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = body.get(..size).ok_or("a truncated chunk")?;
        out.extend_from_slice(chunk);
        body = body.get(size + 2..).ok_or("a truncated chunk")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responses_are_read_plain_or_chunked() {
        let (status, headers, body) =
            parse(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi").expect("plain");
        assert_eq!((status, body.as_slice()), (200, b"hi".as_slice()));
        assert_eq!(
            headers,
            vec![("content-length".to_string(), "2".to_string())]
        );
        let raw = b"HTTP/1.1 409 Conflict\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let (status, _, body) = parse(raw).expect("chunked");
        assert_eq!((status, body.as_slice()), (409, b"abcde".as_slice()));
        assert!(parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nff\r\nab").is_err());
        assert!(parse(b"garbage").is_err());
    }
}
