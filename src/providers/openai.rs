//! OpenAI-compatible providers: the request passes through with the model
//! renamed, the routing field removed and usage always asked for in streams;
//! legacy completions go to the provider's `/completions` when it has one, or
//! are translated to chat.

use serde_json::{Map, Value, json};

use super::{ErrorDetails, StreamItem, StreamTranslator, UpstreamRequest};
use crate::config::Provider;
use crate::errors::{ApiError, ErrorType};
use crate::request::{Operation, ParsedRequest};
use crate::sse::SseEvent;
use crate::usage::Usage;

/// Legacy parameters that chat cannot express without changing the answer.
const LEGACY_ONLY: [&str; 4] = ["echo", "suffix", "best_of", "logprobs"];

pub fn build_request(
    provider: &Provider,
    request: &ParsedRequest,
    upstream_model: &str,
    routing_field: &str,
) -> Result<UpstreamRequest, ApiError> {
    let mut body: Map<String, Value> = request.body.clone();
    body.remove(routing_field);
    body.insert("model".into(), Value::String(upstream_model.to_string()));
    let native_legacy = request.op == Operation::Completions && provider.legacy_completions;
    let path = if request.op == Operation::Chat || native_legacy {
        if native_legacy {
            "/completions"
        } else {
            "/chat/completions"
        }
    } else {
        legacy_to_chat(&mut body)?;
        "/chat/completions"
    };
    if request.stream {
        // Usage is asked for either way: limits and the access log need it.
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let body = serde_json::to_vec(&Value::Object(body)).map_err(|_| internal())?;
    let credential = provider.credential.as_deref().unwrap_or_default();
    Ok(UpstreamRequest {
        path: format!("{}{}", provider.path_prefix, path),
        headers: vec![("authorization".into(), format!("Bearer {credential}"))],
        body,
    })
}

fn legacy_to_chat(body: &mut Map<String, Value>) -> Result<(), ApiError> {
    for field in LEGACY_ONLY {
        if body
            .get(field)
            .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
        {
            return Err(ApiError::bad_request(
                "unsupported_parameter",
                field,
                format!("'{field}' is not supported by this model's provider."),
            ));
        }
        body.remove(field);
    }
    let prompt = body.remove("prompt").unwrap_or(Value::String(String::new()));
    body.insert("messages".into(), json!([{"role": "user", "content": prompt}]));
    Ok(())
}

fn internal() -> ApiError {
    ApiError::new(
        500,
        ErrorType::Upstream,
        "internal_error",
        "The request could not be encoded.",
    )
}

/// Checks a provider's 2xx body and reads its usage.
pub fn translate_answer(_request: &ParsedRequest, body: &[u8]) -> Result<(Value, Usage), String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    if !value.get("choices").is_some_and(Value::is_array) {
        return Err("answer has no 'choices' array".into());
    }
    let usage = Usage::from_openai(value.get("usage")).unwrap_or_default();
    Ok((value, usage))
}

/// OpenAI's stream: JSON chunks, usage on a chunk of its own, `[DONE]` last.
pub struct OpenAiStream;

impl StreamTranslator for OpenAiStream {
    fn on_event(&mut self, event: &SseEvent, items: &mut Vec<StreamItem>) {
        let data = event.data.trim();
        if data == "[DONE]" {
            items.push(StreamItem::Done);
            return;
        }
        let Ok(value) = serde_json::from_str::<Value>(data) else {
            items.push(StreamItem::Error(interrupted(
                "The provider sent an event that is not JSON.",
            )));
            return;
        };
        if let Some(error) = value.get("error") {
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("The provider reported an error.");
            items.push(StreamItem::Error(interrupted(message)));
            return;
        }
        if let Some(usage) = Usage::from_openai(value.get("usage")) {
            items.push(StreamItem::Usage(usage));
        }
        match value.get("choices") {
            Some(Value::Array(choices)) if choices.is_empty() => {}
            Some(Value::Array(_)) => items.push(StreamItem::Chunk(value)),
            _ => items.push(StreamItem::Error(interrupted(
                "The provider sent a chunk without 'choices'.",
            ))),
        }
    }
}

/// The contract's mid-stream failure (§6).
pub fn interrupted(message: &str) -> ApiError {
    ApiError::new(502, ErrorType::Upstream, "stream_interrupted", message)
}

/// `{"error": {"message": ..., "code": ...}}`, OpenAI's error shape.
pub fn error_details(body: &[u8]) -> ErrorDetails {
    let Ok(value) = serde_json::from_slice::<Value>(body) else {
        return ErrorDetails::default();
    };
    let error = value.get("error").unwrap_or(&Value::Null);
    ErrorDetails {
        code: error.get("code").and_then(Value::as_str).map(str::to_string),
        message: error
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| error.as_str())
            .map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::request::parse;

    fn provider(legacy: bool) -> Provider {
        let json = format!(
            r#"{{"providers":[{{"id":"openai","api":"openai","cluster":"c","authority":"h","api_key":"sk-test","legacy_completions":{legacy}}}]}}"#
        );
        Config::parse(json.as_bytes(), &|_| None).unwrap().providers.remove(0)
    }

    #[test]
    fn chat_is_passed_through_with_model_renamed_and_routing_removed() {
        let req = parse(
            Operation::Chat,
            br#"{"model":"openai/gpt","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"waygate":{"routing":{}},"stream":true}"#,
        )
        .unwrap();
        let up = build_request(&provider(false), &req, "gpt-4o", "waygate").unwrap();
        assert_eq!(up.path, "/v1/chat/completions");
        assert_eq!(
            up.headers,
            vec![("authorization".to_string(), "Bearer sk-test".to_string())]
        );
        let body: Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(body["model"], "gpt-4o");
        assert!(body.get("waygate").is_none());
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["tools"][0]["function"]["name"], "f");
    }

    #[test]
    fn legacy_goes_native_or_becomes_chat() {
        let req = parse(
            Operation::Completions,
            br#"{"model":"openai/x","prompt":"Say hi","max_tokens":5}"#,
        )
        .unwrap();
        let native = build_request(&provider(true), &req, "x", "waygate").unwrap();
        assert_eq!(native.path, "/v1/completions");
        let chat = build_request(&provider(false), &req, "x", "waygate").unwrap();
        assert_eq!(chat.path, "/v1/chat/completions");
        let body: Value = serde_json::from_slice(&chat.body).unwrap();
        assert_eq!(body["messages"], json!([{"role":"user","content":"Say hi"}]));
        assert!(body.get("prompt").is_none());
        assert_eq!(body["max_tokens"], 5);
    }

    #[test]
    fn legacy_only_parameters_cannot_become_chat() {
        let req = parse(
            Operation::Completions,
            br#"{"model":"openai/x","prompt":"a","echo":true}"#,
        )
        .unwrap();
        let e = build_request(&provider(false), &req, "x", "waygate").unwrap_err();
        assert_eq!(
            (e.code.as_str(), e.param.as_deref()),
            ("unsupported_parameter", Some("echo"))
        );
    }

    #[test]
    fn error_bodies_are_read() {
        let d = error_details(
            br#"{"error":{"message":"bad","type":"invalid_request_error","code":"context_length_exceeded"}}"#,
        );
        assert_eq!(d.code.as_deref(), Some("context_length_exceeded"));
        assert_eq!(d.message.as_deref(), Some("bad"));
        assert_eq!(error_details(b"<html>"), ErrorDetails::default());
    }
}
