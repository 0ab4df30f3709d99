//! The error envelope every answer made by the filter uses (contract §4).
//!
//! An [`ApiError`] knows its HTTP status, its OpenAI-style `type` and `code`, a
//! client-safe message and the offending `param`. It never carries internal
//! detail: what goes into `message` is what the client may read.

use serde_json::{Value, json};

/// A header name and value, as the filter writes them on a request or an answer.
pub type Header = (String, String);

/// The `type` field of the error envelope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    InvalidRequest,
    Authentication,
    Permission,
    RateLimit,
    Upstream,
}

impl ErrorType {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorType::InvalidRequest => "invalid_request_error",
            ErrorType::Authentication => "authentication_error",
            ErrorType::Permission => "permission_error",
            ErrorType::RateLimit => "rate_limit_error",
            ErrorType::Upstream => "upstream_error",
        }
    }
}

/// An error answer: status, envelope fields and the extra headers it needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub status: u16,
    pub kind: ErrorType,
    pub code: String,
    pub message: String,
    pub param: Option<String>,
    /// Set when the error is a provider's own answer, reshaped.
    pub provider: Option<String>,
    /// `retry-after` seconds, for 429 answers.
    pub retry_after: Option<String>,
    /// `allow` header value, for 405 answers.
    pub allow: Option<&'static str>,
    /// More headers the answer carries (`x-ratelimit-*`).
    pub extra_headers: Vec<Header>,
}

impl ApiError {
    pub fn new(status: u16, kind: ErrorType, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            code: code.to_string(),
            message: message.into(),
            param: None,
            provider: None,
            retry_after: None,
            allow: None,
            extra_headers: Vec::new(),
        }
    }

    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// 400 `invalid_request_error` with the given code and param.
    pub fn bad_request(code: &str, param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::new(400, ErrorType::InvalidRequest, code, message).with_param(param)
    }

    /// The `{"error": {...}}` object, as a JSON value.
    pub fn envelope(&self) -> Value {
        let mut error = json!({
            "message": self.message,
            "type": self.kind.as_str(),
            "param": self.param,
            "code": self.code,
        });
        if let (Some(provider), Some(map)) = (&self.provider, error.as_object_mut()) {
            map.insert("provider".into(), Value::String(provider.clone()));
        }
        json!({ "error": error })
    }

    /// The envelope serialised, as sent in a body or an SSE `data:` line.
    pub fn body(&self) -> Vec<u8> {
        serde_json::to_vec(&self.envelope()).unwrap_or_default()
    }

    /// Headers of the error answer, `content-type` first.
    pub fn headers(&self) -> Vec<Header> {
        let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
        if let Some(seconds) = &self.retry_after {
            headers.push(("retry-after".into(), seconds.clone()));
        }
        if let Some(allow) = self.allow {
            headers.push(("allow".into(), allow.to_string()));
        }
        headers.extend(self.extra_headers.iter().cloned());
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_has_the_contract_fields_and_null_param() {
        let e = ApiError::new(401, ErrorType::Authentication, "missing_api_key", "no key");
        let v: Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(
            v,
            json!({"error": {"message": "no key", "type": "authentication_error", "param": null, "code": "missing_api_key"}})
        );
    }

    #[test]
    fn provider_errors_name_the_provider_inside_error() {
        let mut e = ApiError::bad_request("context_length_exceeded", "messages", "too long");
        e.provider = Some("openai".into());
        let v = e.envelope();
        assert_eq!(v["error"]["provider"], "openai");
        assert_eq!(v["error"]["param"], "messages");
    }

    #[test]
    fn retry_after_and_allow_become_headers() {
        let mut e = ApiError::new(429, ErrorType::RateLimit, "rate_limited", "slow down");
        e.retry_after = Some("7".into());
        e.allow = Some("POST");
        let h = e.headers();
        assert!(h.contains(&("retry-after".into(), "7".into())));
        assert!(h.contains(&("allow".into(), "POST".into())));
        assert_eq!(h[0], ("content-type".into(), "application/json".into()));
    }
}
