//! Request validation (docs/contract.md §2): every documented
//! field is checked for type and range, and the fields the filter needs are
//! pulled out. Unknown fields are kept: OpenAI's API has many more, and they
//! pass through to providers.
//!
//! Two paths give the same answers: `fast` walks the text once and accepts
//! the usual body without building a DOM; whatever it is not sure of, and
//! every error, goes to the DOM validator here, whose errors name the field.
//! The DOM is built later only for translators that need one.

mod fast;

use std::cell::OnceCell;
use std::ops::Range;

use serde_json::{Map, Value};

use crate::errors::ApiError;
use crate::json::members::Members;

/// Which operation the client called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Chat,
    Completions,
}

/// A validated request body.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    pub op: Operation,
    pub model: String,
    pub stream: bool,
    /// `stream_options.include_usage`, as the client asked.
    pub include_usage: bool,
    /// The client's body as it came (an accepted body is always UTF-8).
    raw: String,
    /// `raw`'s top-level members (name, value) when the fast path read it.
    spans: Option<Vec<(Range<usize>, Range<usize>)>>,
    /// The body as a DOM: built by the DOM validator, or on first use.
    dom: OnceCell<Map<String, Value>>,
}

impl ParsedRequest {
    /// The client's body as a JSON object, parsed now if the fast path
    /// accepted it (it was valid then, so this fails only on a bug).
    pub fn body(&self) -> Result<&Map<String, Value>, ApiError> {
        if let Some(dom) = self.dom.get() {
            return Ok(dom);
        }
        let Ok(Value::Object(dom)) = crate::json::dom::parse(&self.raw) else {
            return Err(unreadable());
        };
        Ok(self.dom.get_or_init(|| dom))
    }

    /// The client's body as it came.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The top-level members as they came, for rewrites that copy them
    /// (from the fast path's walk when it had one).
    pub fn members(&self) -> Result<Members<'_>, ApiError> {
        match &self.spans {
            Some(spans) => Members::from_spans(&self.raw, spans),
            None => Members::parse_str(&self.raw).ok(),
        }
        .ok_or_else(unreadable)
    }

    /// One top-level member's value (the last, when a name repeats, as in
    /// the DOM), without building the DOM when it is not there yet.
    pub fn member(&self, name: &str) -> Result<Option<Value>, ApiError> {
        if self.dom.get().is_some() {
            return Ok(self.body()?.get(name).cloned());
        }
        match self.members()?.get(name) {
            None => Ok(None),
            Some(raw) => crate::json::dom::parse(raw.get()).map(Some).map_err(|_| unreadable()),
        }
    }
}

fn unreadable() -> ApiError {
    ApiError::new(
        500,
        crate::errors::ErrorType::Upstream,
        "internal_error",
        "The request body could not be read again.",
    )
}

/// Parses and validates a request body for `op`.
pub fn parse(op: Operation, bytes: &[u8]) -> Result<ParsedRequest, ApiError> {
    // Checked as UTF-8 in one pass, then parsed as text: serde reading bytes
    // checks each string on its own, which costs more.
    let text = std::str::from_utf8(bytes);
    if let Ok(text) = text
        && let Some(accepted) = fast::check(op, text)
    {
        return Ok(ParsedRequest {
            op,
            model: accepted.model,
            stream: accepted.stream,
            include_usage: accepted.include_usage,
            raw: text.to_owned(),
            spans: Some(accepted.spans),
            dom: OnceCell::new(),
        });
    }
    validate_dom(op, bytes, text)
}

/// The DOM validator alone: what [`parse`] does when the fast path is not
/// sure. Public so the tests and the `request` fuzz target can hold the two
/// paths to the same answers.
pub fn parse_dom(op: Operation, bytes: &[u8]) -> Result<ParsedRequest, ApiError> {
    validate_dom(op, bytes, std::str::from_utf8(bytes))
}

/// [`parse_dom`] on `bytes` already checked as UTF-8 (`text`), so the body
/// the fast path left is not checked twice.
fn validate_dom(
    op: Operation,
    bytes: &[u8],
    text: Result<&str, std::str::Utf8Error>,
) -> Result<ParsedRequest, ApiError> {
    // Invalid UTF-8 is parsed as bytes only for serde's error, which names
    // where the bad byte is.
    let parsed = match text {
        Ok(text) => crate::json::dom::parse(text),
        Err(_) => crate::json::dom::parse_slice(bytes),
    };
    let value: Value = parsed.map_err(|e| {
        ApiError::bad_request("invalid_json", "body", format!("Request body is not valid JSON: {e}.")).with_param_none()
    })?;
    let Value::Object(body) = value else {
        return Err(
            ApiError::bad_request("invalid_json", "body", "Request body must be a JSON object.").with_param_none(),
        );
    };

    let model = match body.get("model") {
        None | Some(Value::Null) => return Err(missing("model")),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(wrong_type("model", "a string")),
    };
    match op {
        Operation::Chat => validate_messages(&body)?,
        Operation::Completions => match body.get("prompt") {
            None | Some(Value::Null) => return Err(missing("prompt")),
            Some(Value::String(_)) => {}
            // OpenAI also takes a list of prompts, and clients send one in a list
            // (LangChain's `OpenAI.invoke`); the gateway answers one prompt a request.
            Some(Value::Array(items)) => match items.as_slice() {
                [Value::String(_)] => {}
                [_] => return Err(wrong_type("prompt.0", "a string")),
                _ => {
                    return Err(bad_value(
                        "prompt",
                        "must hold exactly one prompt: the gateway answers one prompt a request",
                    ));
                }
            },
            Some(_) => return Err(wrong_type("prompt", "a string or an array of one string")),
        },
    }
    validate_sampling(&body)?;
    let stream = optional_bool(&body, "stream")?.unwrap_or(false);
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => {
            for key in o.keys() {
                if key != "include_usage" {
                    return Err(ApiError::bad_request(
                        "unsupported_parameter",
                        format!("stream_options.{key}"),
                        format!("Unknown stream option '{key}'."),
                    ));
                }
            }
            match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(wrong_type("stream_options.include_usage", "a boolean")),
            }
        }
        Some(_) => return Err(wrong_type("stream_options", "an object")),
    };
    Ok(ParsedRequest {
        op,
        model,
        stream,
        include_usage,
        // serde accepted the body, so it is UTF-8: copied as it is.
        raw: text.map_or_else(|_| String::from_utf8_lossy(bytes).into_owned(), str::to_owned),
        spans: None,
        dom: OnceCell::from(body),
    })
}

impl ApiError {
    /// `invalid_json` names no field.
    fn with_param_none(mut self) -> Self {
        self.param = None;
        self
    }
}

/// A legacy request's prompt, as [`parse`] accepted it: a string, or the one
/// string of a list.
pub(crate) fn prompt_text(body: &Map<String, Value>) -> &str {
    match body.get("prompt") {
        Some(Value::Array(items)) => items.first().and_then(Value::as_str).unwrap_or(""),
        prompt => prompt.and_then(Value::as_str).unwrap_or(""),
    }
}

pub(crate) fn missing(param: &str) -> ApiError {
    ApiError::bad_request("missing_field", param, format!("Missing required field '{param}'."))
}

pub(crate) fn wrong_type(param: &str, expected: &str) -> ApiError {
    ApiError::bad_request("invalid_type", param, format!("'{param}' must be {expected}."))
}

pub(crate) fn bad_value(param: &str, why: &str) -> ApiError {
    ApiError::bad_request("invalid_value", param, format!("'{param}' {why}."))
}

fn optional_bool(body: &Map<String, Value>, field: &str) -> Result<Option<bool>, ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(wrong_type(field, "a boolean")),
    }
}

fn number_in(body: &Map<String, Value>, field: &str, lo: f64, hi: f64) -> Result<(), ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(x) if (lo..=hi).contains(&x) => Ok(()),
            _ => Err(bad_value(field, &format!("must be between {lo} and {hi}"))),
        },
        Some(_) => Err(wrong_type(field, "a number")),
    }
}

fn integer_at_least(body: &Map<String, Value>, field: &str, lo: i64) -> Result<(), ApiError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::Number(n)) => match (n.as_i64(), n.as_u64()) {
            (Some(x), _) if x >= lo => Ok(()),
            (None, Some(_)) => Ok(()),
            (Some(_), _) => Err(bad_value(field, &format!("must be at least {lo}"))),
            (None, None) => Err(wrong_type(field, "an integer")),
        },
        Some(_) => Err(wrong_type(field, "an integer")),
    }
}

/// The numbers a request may carry and their ranges (OpenAI's API
/// reference). The rules below and the fast path ([`fast`]) both read these
/// tables, so each rule is written once.
const NUMBER_RANGES: [(&str, i64, i64); 4] = [
    ("temperature", 0, 2),
    ("top_p", 0, 1),
    ("presence_penalty", -2, 2),
    ("frequency_penalty", -2, 2),
];

/// The integers a request may carry and their least values.
const INTEGER_MINIMUMS: [(&str, i64); 4] = [
    ("max_tokens", 1),
    ("max_completion_tokens", 1),
    ("n", 1),
    ("seed", i64::MIN),
];

/// `response_format.type`'s values.
const RESPONSE_FORMATS: [&str; 3] = ["text", "json_object", "json_schema"];

/// Sampling and output parameters shared by both operations.
fn validate_sampling(body: &Map<String, Value>) -> Result<(), ApiError> {
    for (field, lo, hi) in NUMBER_RANGES {
        number_in(body, field, lo as f64, hi as f64)?;
    }
    for (field, lo) in INTEGER_MINIMUMS {
        integer_at_least(body, field, lo)?;
    }
    match body.get("stop") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                if !item.is_string() {
                    return Err(wrong_type(&format!("stop.{i}"), "a string"));
                }
            }
        }
        Some(_) => return Err(wrong_type("stop", "a string or an array of strings")),
    }
    match body.get("user") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(_) => return Err(wrong_type("user", "a string")),
    }
    match body.get("response_format") {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => match o.get("type") {
            Some(Value::String(t)) if RESPONSE_FORMATS.contains(&t.as_str()) => {}
            Some(Value::String(_)) => {
                return Err(bad_value(
                    "response_format.type",
                    "must be 'text', 'json_object' or 'json_schema'",
                ));
            }
            None => return Err(missing("response_format.type")),
            Some(_) => return Err(wrong_type("response_format.type", "a string")),
        },
        Some(_) => return Err(wrong_type("response_format", "an object")),
    }
    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            for (i, tool) in tools.iter().enumerate() {
                if !tool.is_object() {
                    return Err(wrong_type(&format!("tools.{i}"), "an object"));
                }
            }
        }
        Some(_) => return Err(wrong_type("tools", "an array")),
    }
    Ok(())
}

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

fn validate_messages(body: &Map<String, Value>) -> Result<(), ApiError> {
    let messages = match body.get("messages") {
        None | Some(Value::Null) => return Err(missing("messages")),
        Some(Value::Array(m)) => m,
        Some(_) => return Err(wrong_type("messages", "an array")),
    };
    if messages.is_empty() {
        return Err(bad_value("messages", "must contain at least one message"));
    }
    for (i, message) in messages.iter().enumerate() {
        // Named only when something is wrong: formatting every path would
        // cost more than checking the message.
        let at = || format!("messages.{i}");
        let Value::Object(m) = message else {
            return Err(wrong_type(&at(), "an object"));
        };
        let role = match m.get("role") {
            None | Some(Value::Null) => return Err(missing(&format!("{}.role", at()))),
            Some(Value::String(r)) => r.as_str(),
            Some(_) => return Err(wrong_type(&format!("{}.role", at()), "a string")),
        };
        if !ROLES.contains(&role) {
            return Err(bad_value(
                &format!("{}.role", at()),
                "must be one of 'system', 'developer', 'user', 'assistant', 'tool'",
            ));
        }
        let has_tool_calls = matches!(m.get("tool_calls"), Some(Value::Array(calls)) if !calls.is_empty());
        match m.get("content") {
            None | Some(Value::Null) if role == "assistant" && has_tool_calls => {}
            None | Some(Value::Null) => return Err(missing(&format!("{}.content", at()))),
            Some(Value::String(_)) => {}
            Some(Value::Array(parts)) => validate_parts(&at, parts)?,
            Some(_) => {
                return Err(wrong_type(
                    &format!("{}.content", at()),
                    "a string or an array of content parts",
                ));
            }
        }
        if role == "tool" && !matches!(m.get("tool_call_id"), Some(Value::String(_))) {
            return Err(missing(&format!("{}.tool_call_id", at())));
        }
        match m.get("tool_calls") {
            None | Some(Value::Null) | Some(Value::Array(_)) => {}
            Some(_) => return Err(wrong_type(&format!("{}.tool_calls", at()), "an array")),
        }
    }
    Ok(())
}

fn validate_parts(message: &dyn Fn() -> String, parts: &[Value]) -> Result<(), ApiError> {
    for (j, part) in parts.iter().enumerate() {
        let at = || format!("{}.content.{j}", message());
        let Value::Object(p) = part else {
            return Err(wrong_type(&at(), "an object"));
        };
        match p.get("type").and_then(Value::as_str) {
            Some("text") => {
                if !matches!(p.get("text"), Some(Value::String(_))) {
                    return Err(wrong_type(&format!("{}.text", at()), "a string"));
                }
            }
            Some("image_url") => match p.get("image_url") {
                Some(Value::Object(img)) if matches!(img.get("url"), Some(Value::String(_))) => {}
                Some(Value::Object(_)) => return Err(missing(&format!("{}.image_url.url", at()))),
                None => return Err(missing(&format!("{}.image_url", at()))),
                Some(_) => return Err(wrong_type(&format!("{}.image_url", at()), "an object")),
            },
            Some(_) => return Err(bad_value(&format!("{}.type", at()), "must be 'text' or 'image_url'")),
            None => return Err(missing(&format!("{}.type", at()))),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(json: &str) -> Result<ParsedRequest, ApiError> {
        parse(Operation::Chat, json.as_bytes())
    }

    fn err(json: &str) -> (u16, String, Option<String>) {
        let e = chat(json).unwrap_err();
        (e.status, e.code, e.param)
    }

    #[test]
    fn a_minimal_request_parses() {
        let r = chat(r#"{"model":"openai/gpt-4o","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        assert_eq!(r.model, "openai/gpt-4o");
        assert!(!r.stream && !r.include_usage);
    }

    #[test]
    fn stream_and_usage_are_read() {
        let r = chat(r#"{"model":"a/b","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#).unwrap();
        assert!(r.stream && r.include_usage);
    }

    #[test]
    fn bad_bodies_name_the_field() {
        let p = |s: &str| Some(s.to_string());
        assert_eq!(err("nope"), (400, "invalid_json".into(), None));
        assert_eq!(err("[1]"), (400, "invalid_json".into(), None));
        assert_eq!(err(r#"{"messages":[]}"#), (400, "missing_field".into(), p("model")));
        assert_eq!(
            err(r#"{"model":1,"messages":[]}"#),
            (400, "invalid_type".into(), p("model"))
        );
        assert_eq!(err(r#"{"model":"a/b"}"#), (400, "missing_field".into(), p("messages")));
        assert_eq!(
            err(r#"{"model":"a/b","messages":[]}"#),
            (400, "invalid_value".into(), p("messages"))
        );
        assert_eq!(
            err(r#"{"model":"a/b","messages":[{"role":"user","content":"x"},{"role":"robot","content":"x"}]}"#),
            (400, "invalid_value".into(), p("messages.1.role"))
        );
        assert_eq!(
            err(
                r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"}]}]}"#
            ),
            (400, "missing_field".into(), p("messages.0.content.1.image_url"))
        );
        assert_eq!(
            err(r#"{"model":"a/b","messages":[{"role":"user","content":"x"}],"temperature":3}"#),
            (400, "invalid_value".into(), p("temperature"))
        );
        assert_eq!(
            err(r#"{"model":"a/b","messages":[{"role":"user","content":"x"}],"max_tokens":1.5}"#),
            (400, "invalid_type".into(), p("max_tokens"))
        );
        assert_eq!(
            err(r#"{"model":"a/b","messages":[{"role":"user","content":"x"}],"stop":[1]}"#),
            (400, "invalid_type".into(), p("stop.0"))
        );
    }

    /// serde_json's raw-value marker key is an ordinary key to the validator: the value
    /// checked is the value forwarded (serde_json's `Value` would read `0.5` here).
    #[test]
    fn the_raw_value_marker_key_is_read_as_written() {
        let p = |s: &str| Some(s.to_string());
        assert_eq!(
            err(
                r#"{"model":"a/b","messages":[{"role":"user","content":"x"}],"temperature":{"$serde_json::private::RawValue":"0.5"}}"#
            ),
            (400, "invalid_type".into(), p("temperature"))
        );
        assert_eq!(
            err(r#"{"model":{"$serde_json::private::RawValue":"\"a/b\""},"messages":[{"role":"user","content":"x"}]}"#),
            (400, "invalid_type".into(), p("model"))
        );
        let r = chat(r#"{"model":"a/b","messages":[{"role":"user","content":"x"}],"metadata":{"$serde_json::private::RawValue":"[1]"}}"#).unwrap();
        assert_eq!(
            r.member("metadata").unwrap(),
            Some(serde_json::json!({"$serde_json::private::RawValue": "[1]"}))
        );
        assert!(r.body().unwrap()["metadata"].is_object());
    }

    #[test]
    fn assistant_tool_calls_may_omit_content() {
        chat(r#"{"model":"a/b","messages":[{"role":"user","content":"x"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"42"}]}"#)
        .unwrap();
    }

    #[test]
    fn numbers_pass_through_re_encoding_unchanged() {
        // Found by the `request` fuzz target: without serde_json's
        // `float_roundtrip`, a number with more digits than a double holds
        // parsed to a neighbour of the nearest double, so the body sent
        // upstream changed the client's number.
        let long = format!("1{}0", "1".repeat(76));
        for number in [
            long.as_str(),
            "0.30000000000000004",
            "1.7976931348623157e308",
            "5e-324",
            "2.2250738585072014e-308",
        ] {
            let body = format!(r#"{{"model":"a/b","messages":[{{"role":"user","content":"x"}}],"x":{number}}}"#);
            let first = chat(&body).unwrap();
            let again = serde_json::to_vec(first.body().unwrap()).unwrap();
            let second = parse(Operation::Chat, &again).unwrap();
            assert_eq!(first.body().unwrap(), second.body().unwrap(), "{number}");
            let expect: f64 = number.parse().unwrap();
            assert_eq!(
                first.body().unwrap()["x"].as_f64(),
                Some(expect),
                "{number} is the nearest double"
            );
        }
    }

    #[test]
    fn legacy_prompt_is_one_string_alone_or_in_a_list() {
        for body in [r#"{"model":"a/b","prompt":"x"}"#, r#"{"model":"a/b","prompt":["x"]}"#] {
            let req = parse(Operation::Completions, body.as_bytes()).unwrap();
            assert_eq!(prompt_text(req.body().unwrap()), "x", "{body}");
        }
        for (prompt, code, param) in [
            (r#"["a","b"]"#, "invalid_value", "prompt"),
            ("[]", "invalid_value", "prompt"),
            ("[[1,2]]", "invalid_type", "prompt.0"),
            ("[1]", "invalid_type", "prompt.0"),
            ("5", "invalid_type", "prompt"),
        ] {
            let body = format!(r#"{{"model":"a/b","prompt":{prompt}}}"#);
            let e = parse(Operation::Completions, body.as_bytes()).unwrap_err();
            assert_eq!((e.code.as_str(), e.param.as_deref()), (code, Some(param)), "{body}");
        }
    }
}
