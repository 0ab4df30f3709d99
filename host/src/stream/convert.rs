//! Header maps to and from hyper's types at the host's two HTTP/1.1 edges: the map the
//! codec and the HCM hand the first filter, the request the router sends upstream, the
//! hop-by-hop headers neither side forwards, and a message's declared `content-length`.

use hyper::Request;

use super::headers::Headers;
use crate::body::HostBody;

pub(super) fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" | "te"
    )
}

pub(super) fn is_hop_by_hop_bytes(name: &[u8]) -> bool {
    std::str::from_utf8(name).is_ok_and(is_hop_by_hop)
}

pub(super) fn declared_length(headers: &Headers) -> Option<u64> {
    headers.first_str("content-length").and_then(|v| v.trim().parse().ok())
}

/// The header map the HTTP/1 codec and the HCM hand to the first filter: pseudo headers
/// first, `host` folded into `:authority`, connection headers gone, `x-forwarded-proto`
/// added.
pub(super) fn request_headers(parts: &hyper::http::request::Parts) -> Headers {
    let authority = parts
        .headers
        .get(hyper::header::HOST)
        .map(|h| h.as_bytes().to_vec())
        .or_else(|| parts.uri.authority().map(|a| a.as_str().as_bytes().to_vec()))
        .unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .as_bytes()
        .to_vec();
    let mut headers = Headers::new(vec![
        (b":authority".to_vec(), authority),
        (b":path".to_vec(), path),
        (b":method".to_vec(), parts.method.as_str().as_bytes().to_vec()),
        (b":scheme".to_vec(), b"http".to_vec()),
    ]);
    for (name, value) in &parts.headers {
        let name = name.as_str();
        if name == "host" || is_hop_by_hop(name) {
            continue;
        }
        headers.add(name, value.as_bytes());
    }
    if !headers.contains("x-forwarded-proto") {
        headers.set("x-forwarded-proto", b"http");
    }
    headers
}

/// The upstream HTTP/1.1 request: `:authority` becomes `host`, pseudo headers go.
pub fn upstream_request(headers: &Headers, body: HostBody) -> Result<Request<HostBody>, String> {
    let method = headers.first(":method").unwrap_or(b"GET");
    let path = headers.first_str(":path").unwrap_or("/");
    // Parts filled in place: `Request::builder()` moves its whole state once per header.
    let mut request = Request::new(body);
    *request.method_mut() = hyper::Method::from_bytes(method).map_err(|e| e.to_string())?;
    *request.uri_mut() = path.parse().map_err(|e: hyper::http::uri::InvalidUri| e.to_string())?;
    let map = request.headers_mut();
    map.reserve(headers.len());
    if let Some(authority) = headers.first(":authority") {
        map.append(hyper::header::HOST, header_value(authority)?);
    }
    for (name, value) in headers.pairs() {
        if name.first() == Some(&b':') || name == b"host" {
            continue;
        }
        map.append(header_name(name)?, header_value(value)?);
    }
    Ok(request)
}

pub(super) fn header_name(name: &[u8]) -> Result<hyper::header::HeaderName, String> {
    hyper::header::HeaderName::from_bytes(name).map_err(|e| e.to_string())
}

pub(super) fn header_value(value: &[u8]) -> Result<hyper::header::HeaderValue, String> {
    hyper::header::HeaderValue::from_bytes(value).map_err(|e| e.to_string())
}
