//! Envoy's local replies (`Utility::sendLocalReply`, `source/common/http/utility.cc`):
//! `:status`, then the plugin's headers added with `addCopy` (duplicates possible), then
//! for a non-empty body `content-length` and `content-type: text/plain` only when the
//! plugin set none; an empty body drops both `content-length` and `content-type`. A HEAD
//! request gets the headers only. Details have spaces replaced with `_`. (`date` and
//! `server: envoy` are added later by the codec, for every response.)

use crate::stream::headers::Headers;

/// The router's and the HCM's own replies: status, body text, `response.code_details`.
pub mod reasons {
    pub const ROUTE_NOT_FOUND: (u16, &str, &str) = (404, "", "route_not_found");
    pub const CONNECT_FAILURE: (u16, &str, &str) = (
        503,
        "upstream connect error or disconnect/reset before headers. reset reason: connection failure",
        "upstream_reset_before_response_started{connection_failure}",
    );
    pub const CONNECTION_TERMINATION: (u16, &str, &str) = (
        503,
        "upstream connect error or disconnect/reset before headers. reset reason: connection termination",
        "upstream_reset_before_response_started{connection_termination}",
    );
    pub const NO_HEALTHY_UPSTREAM: (u16, &str, &str) = (503, "no healthy upstream", "no_healthy_upstream");
    pub const RESPONSE_TIMEOUT: (u16, &str, &str) = (504, "upstream request timeout", "response_timeout");
    pub const STREAM_IDLE_TIMEOUT: (u16, &str, &str) = (408, "stream timeout", "stream_idle_timeout");
    pub const REQUEST_TOO_LARGE: (u16, &str, &str) = (413, "Payload Too Large", "request_payload_too_large");
    pub const RESPONSE_TOO_LARGE: (u16, &str, &str) = (500, "Internal Server Error", "response_payload_too_large");
    pub const WASM_FAIL_STREAM: (u16, &str, &str) = (503, "", "wasm_fail_stream");
}

#[derive(Debug, Clone)]
pub struct LocalReply {
    pub headers: Headers,
    pub body: Vec<u8>,
    pub details: String,
}

impl LocalReply {
    pub fn status(&self) -> u16 {
        self.headers
            .first_str(":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(500)
    }
}

/// One of [`reasons`].
pub fn from_reason(reason: (u16, &str, &str), is_head: bool) -> LocalReply {
    let (status, body, details) = reason;
    build(status, Vec::new(), body.as_bytes().to_vec(), details, is_head)
}

pub fn build(status: u16, extra: Vec<(Vec<u8>, Vec<u8>)>, body: Vec<u8>, details: &str, is_head: bool) -> LocalReply {
    let mut headers = Headers::new(vec![(b":status".to_vec(), status.to_string().into_bytes())]);
    for (key, value) in extra {
        headers.add(&String::from_utf8_lossy(&key).to_ascii_lowercase(), &value);
    }
    if body.is_empty() {
        headers.remove("content-length");
        headers.remove("content-type");
    } else {
        headers.set("content-length", body.len().to_string().as_bytes());
        if !headers.contains("content-type") {
            headers.set("content-type", b"text/plain");
        }
    }
    LocalReply {
        headers,
        body: if is_head { Vec::new() } else { body },
        details: details.replace(' ', "_"),
    }
}
