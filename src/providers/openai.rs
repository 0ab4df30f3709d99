//! OpenAI-compatible providers: the request passes through with the model
//! renamed, the routing field removed and usage always asked for in streams;
//! legacy completions go to the provider's `/completions` when it has one, or
//! are translated to chat.

use serde_json::{Map, Value, json};

use super::{ErrorDetails, StreamItem, StreamTranslator, UpstreamRequest};
use crate::answer::Stamp;
use crate::config::Provider;
use crate::errors::{ApiError, ErrorType};
use crate::json::members::{Members, ObjectWriter};
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
    let native_legacy = request.op == Operation::Completions && provider.legacy_completions;
    let (path, body) = if request.op == Operation::Chat || native_legacy {
        let path = if native_legacy {
            "/completions"
        } else {
            "/chat/completions"
        };
        (path, passthrough_body(request, upstream_model, routing_field)?)
    } else {
        let mut body: Map<String, Value> = request.body()?.clone();
        body.remove(routing_field);
        body.insert("model".into(), Value::String(upstream_model.to_string()));
        legacy_to_chat(&mut body)?;
        if request.stream {
            body.insert("stream_options".into(), json!({"include_usage": true}));
        }
        let body = serde_json::to_vec(&Value::Object(body)).map_err(|_| internal())?;
        ("/chat/completions", body)
    };
    let credential = provider.credential_text();
    Ok(UpstreamRequest {
        path: [provider.path_prefix.as_str(), path].concat(),
        headers: vec![("authorization".into(), ["Bearer ", credential].concat())],
        body,
    })
}

/// The client's body as it came, with the model renamed, the routing field
/// removed and, in a stream, usage asked for (limits and the access log need
/// it). Every other member is copied byte for byte.
fn passthrough_body(request: &ParsedRequest, upstream_model: &str, routing_field: &str) -> Result<Vec<u8>, ApiError> {
    let members = request.members()?;
    let mut body = Vec::with_capacity(request.raw().len().saturating_add(64));
    let mut w = ObjectWriter::new(&mut body);
    for (name, value) in &members.0 {
        let replaced = name == "model" || (request.stream && name == "stream_options");
        if !replaced && name != routing_field {
            w.member(name, *value);
        }
    }
    w.string("model", upstream_model);
    if request.stream {
        w.raw("stream_options", r#"{"include_usage":true}"#);
    }
    w.finish();
    Ok(body)
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
    let prompt = crate::request::prompt_text(body).to_string();
    body.remove("prompt");
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
    let value = crate::json::dom::parse_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    if !value.get("choices").is_some_and(Value::is_array) {
        return Err("answer has no 'choices' array".into());
    }
    let usage = Usage::from_openai(value.get("usage")).unwrap_or_default();
    Ok((value, usage))
}

/// A provider's 2xx chat answer, finished for the client (as
/// [`crate::answer::finish`] would) by editing only its top-level members:
/// our id, the client's model, `object`, `created` kept when given, usage
/// always present. `Err` is the reason the body is not a valid answer.
/// Everything else is passed on as written, also what is valid JSON but
/// beyond serde's DOM (a number past f64's range, nesting deeper than 128).
pub fn finish_chat(stamp: &Stamp, body: &[u8]) -> Result<(Vec<u8>, Usage), String> {
    let members = Members::parse(body).map_err(|e| format!("body is not JSON: {e}"))?;
    if !members.get("choices").is_some_and(|c| c.get().starts_with('[')) {
        return Err("answer has no 'choices' array".into());
    }
    let usage = members
        .get("usage")
        .and_then(|raw| Usage::from_openai_raw(raw.get()))
        .unwrap_or_default();
    let created = members
        .get("created")
        .and_then(|raw| raw.get().parse::<u64>().ok())
        .unwrap_or(stamp.created);
    let mut out = Vec::with_capacity(body.len().saturating_add(64));
    let mut w = ObjectWriter::new(&mut out);
    w.string("id", &stamp.id);
    w.string("object", "chat.completion");
    w.number("created", created);
    w.string("model", &stamp.model);
    for (name, value) in &members.0 {
        if !matches!(name.as_ref(), "id" | "object" | "created" | "model" | "usage") {
            w.member(name, *value);
        }
    }
    usage.write_json(w.object("usage"));
    w.finish();
    Ok((out, usage))
}

/// OpenAI's stream: JSON chunks, usage on a chunk of its own, `[DONE]` last.
pub struct OpenAiStream;

impl StreamTranslator for OpenAiStream {
    fn passthrough(&self) -> bool {
        true
    }

    fn on_event(&mut self, event: &SseEvent<'_>, items: &mut Vec<StreamItem>) {
        let data = event.data.trim();
        if data == "[DONE]" {
            items.push(StreamItem::Done);
            return;
        }
        let value = match json_event(data) {
            Ok(value) => value,
            Err(error) => return items.push(StreamItem::Error(error)),
        };
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

/// One event's JSON, or the error event it calls for: not JSON, or the
/// provider's own `{"error": {"message": ...}}` (OpenAI and Gemini both send
/// that shape mid-stream).
pub fn json_event(data: &str) -> Result<Value, ApiError> {
    let Ok(value) = crate::json::dom::parse(data) else {
        return Err(interrupted("The provider sent an event that is not JSON."));
    };
    if let Some(error) = value.get("error") {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("The provider reported an error.");
        return Err(interrupted(message));
    }
    Ok(value)
}

/// The `code` of the contract's mid-stream failure (§6).
pub const STREAM_INTERRUPTED: &str = "stream_interrupted";

/// The contract's mid-stream failure (§6).
pub fn interrupted(message: &str) -> ApiError {
    ApiError::new(502, ErrorType::Upstream, STREAM_INTERRUPTED, message)
}

/// `{"error": {"message": ..., "code": ...}}`, OpenAI's error shape.
pub fn error_details(body: &[u8]) -> ErrorDetails {
    let Ok(value) = crate::json::dom::parse_slice(body) else {
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

// ---- the Responses API, natively ----------------------------------------------

/// A `/responses` request as the client sent it, for a provider that serves
/// the Responses API (`responses: true`): the model renamed, the routing
/// field removed, every other member byte for byte.
pub fn responses_request(
    provider: &Provider,
    client_body: &[u8],
    upstream_model: &str,
    routing_field: &str,
) -> Result<UpstreamRequest, ApiError> {
    let body = super::native::request_body(client_body, upstream_model, routing_field)?;
    Ok(UpstreamRequest {
        path: [provider.path_prefix.as_str(), "/responses"].concat(),
        headers: vec![("authorization".into(), ["Bearer ", provider.credential_text()].concat())],
        body,
    })
}

/// A `response` object's usage (`input_tokens`, `output_tokens`).
pub fn responses_usage(response: &str) -> Option<Usage> {
    let response = crate::json::dom::parse(response).ok()?;
    let usage = response.get("usage")?.as_object()?;
    let n = |k: &str| usage.get(k).and_then(Value::as_u64).unwrap_or(0);
    Some(Usage {
        prompt_tokens: n("input_tokens"),
        completion_tokens: n("output_tokens"),
    })
}

/// The provider's `response`, with `model` the client's, every other member
/// (its own id included: a later `previous_response_id` names it) byte for
/// byte; `Err` says why it is not a valid answer.
pub fn responses_answer(body: &[u8], model: &str) -> Result<(Vec<u8>, Usage), String> {
    let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
    let members = Members::parse_str(text).map_err(|e| format!("body is not a response: {e}"))?;
    if members.get("object").map(|o| o.get()) != Some("\"response\"") {
        return Err("the answer is not a response object".into());
    }
    let usage = responses_usage(text).unwrap_or_default();
    Ok((super::native::answer_with_model(&members, model, body.len()), usage))
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
        Provider::clone(&Config::parse(json.as_bytes(), &|_| None).unwrap().providers[0])
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
    fn answers_are_stamped_in_place_and_numbers_beyond_f64_pass_as_written() {
        // Found by the `answer_openai` fuzz target: serde's DOM refuses `1E999`
        // ("number out of range"); the stamping path passes it on, as the JSON it is.
        let stamp = Stamp {
            op: Operation::Chat,
            id: "chatcmpl_X".into(),
            model: "openai/gpt".into(),
            created: 7,
        };
        let body = br#"{"id":"up","created":175E9117370,"choices":[{"index":0,"message":{"content":"hi"},"x":1E999}],"usage":{"prompt_tokens":3,"completion_tokens":1}}"#;
        let (out, usage) = finish_chat(&stamp, body).unwrap();
        assert_eq!((usage.prompt_tokens, usage.completion_tokens), (3, 1));
        let out = String::from_utf8(out).unwrap();
        assert!(out.starts_with(r#"{"id":"chatcmpl_X","object":"chat.completion","created":7,"model":"openai/gpt","choices":[{"index":0,"#), "{out}");
        assert!(out.contains(r#""x":1E999"#), "{out}");
        assert!(
            out.ends_with(r#""usage":{"completion_tokens":1,"prompt_tokens":3,"total_tokens":4}}"#),
            "{out}"
        );
        assert!(finish_chat(&stamp, br#"{"choices":{}}"#).is_err());
        assert!(finish_chat(&stamp, b"[]").is_err());
    }

    #[test]
    fn an_answer_with_a_lone_surrogate_escape_passes_as_written() {
        // Found by the `answer_openai` fuzz target: `"\ud800"` is JSON by RFC 8259's
        // grammar; serde refuses it as a `String` but reads it as a raw value, so the
        // stamping path passes the choice on as the provider wrote it.
        let stamp = Stamp {
            op: Operation::Chat,
            id: "chatcmpl_X".into(),
            model: "openai/gpt".into(),
            created: 7,
        };
        let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":"a\ud800b"},"\ud800":"x"}]}"#;
        let (out, _) = finish_chat(&stamp, body).unwrap();
        let out = String::from_utf8(out).unwrap();
        assert!(
            out.contains(r#""choices":[{"index":0,"message":{"role":"assistant","content":"a\ud800b"},"\ud800":"x"}]"#),
            "{out}"
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
