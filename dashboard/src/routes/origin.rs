//! Whose request it is by its headers: exactly one `Host`, and for a login an `Origin` (when the
//! browser sends one) that is this box as the request addressed it.

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Which scheme a router serves, so a request's `Origin` can be compared with the box's own.
#[derive(Debug, Clone, Copy)]
pub struct Served {
    /// Served over TLS (`https`), else plain `http`.
    pub tls: bool,
}

/// Refuses a request with more than one `Host` header (400): the router and a proxy or the
/// loopback check in front of it could each judge a different one.
pub async fn single_host(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if request.headers().get_all(header::HOST).iter().count() > 1 {
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "more than one Host header; send exactly one\n",
        )
            .into_response();
    }
    next.run(request).await
}

/// Whether the request's `Origin`, if it has one, is this box: `scheme://host` with the scheme
/// served and the host the request's `Host` names. No `Origin` (a non-browser client, or an old
/// browser on a same-origin form) passes; a page elsewhere posting a login form does not.
pub fn same_origin(headers: &HeaderMap, served: Served) -> bool {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return true;
    };
    // A page served before its referrer policy allowed an Origin still posts `null`; the
    // browser's own `Sec-Fetch-Site` (no page can set it) then says whose form it was.
    if origin.as_bytes() == b"null" {
        return headers
            .get("sec-fetch-site")
            .is_some_and(|site| site.as_bytes() == b"same-origin");
    }
    let (Ok(origin), Some(Ok(host))) = (
        origin.to_str(),
        headers.get(header::HOST).map(|h| h.to_str()),
    ) else {
        return false;
    };
    let (scheme, default_port) = if served.tls {
        ("https", ":443")
    } else {
        ("http", ":80")
    };
    // Browsers leave the scheme's default port out of Origin; a client may put it in Host.
    let host = host.strip_suffix(default_port).unwrap_or(host);
    let Some(origin_host) = origin
        .strip_prefix(scheme)
        .and_then(|rest| rest.strip_prefix("://"))
    else {
        return false;
    };
    let origin_host = origin_host
        .strip_suffix(default_port)
        .unwrap_or(origin_host);
    !host.is_empty() && origin_host.eq_ignore_ascii_case(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, header::HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn an_origin_must_be_the_box_as_addressed_with_the_scheme_served() {
        let plain = Served { tls: false };
        let tls = Served { tls: true };
        let host = ("host", "box.local:8080");
        assert!(same_origin(&headers(&[host]), plain), "no Origin");
        assert!(same_origin(
            &headers(&[host, ("origin", "http://box.local:8080")]),
            plain
        ));
        assert!(same_origin(
            &headers(&[host, ("origin", "http://BOX.local:8080")]),
            plain
        ));
        for wrong in [
            "https://box.local:8080",
            "http://evil.example",
            "http://box.local:8081",
            "http://box.local:8080.evil.example",
            "null",
            "",
        ] {
            let with_origin = [host, ("origin", wrong)];
            assert!(!same_origin(&headers(&with_origin), plain), "{wrong}");
        }
        assert!(same_origin(
            &headers(&[("host", "box.local:443"), ("origin", "https://box.local")]),
            tls
        ));
        assert!(!same_origin(
            &headers(&[("host", "box.local"), ("origin", "http://box.local")]),
            tls
        ));
        assert!(
            !same_origin(&headers(&[("origin", "http://box.local")]), plain),
            "no Host to compare with"
        );
        assert!(same_origin(
            &headers(&[host, ("origin", "null"), ("sec-fetch-site", "same-origin")]),
            plain
        ));
        for site in ["cross-site", "same-site", "none"] {
            let cross = [host, ("origin", "null"), ("sec-fetch-site", site)];
            assert!(!same_origin(&headers(&cross), plain), "{site}");
        }
    }
}
