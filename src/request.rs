//! Request validation (docs/contract.md §2): every documented
//! field is checked for type and range, and the fields the filter needs are
//! pulled out. Unknown fields are kept: OpenAI's API has many more, and they
//! pass through to providers.
//!
//! The rules (`rules`) are written once and read the body through a view
//! (`view`): of the client's text, walked once without building a DOM, or,
//! for text the walk is not sure of, of serde's DOM. The DOM is otherwise
//! built later, and only for translators that need one.

mod rules;
mod view;

use std::cell::OnceCell;
use std::ops::Range;

use serde_json::{Map, Value};

use crate::errors::ApiError;
use crate::json::members::Members;
use crate::json::split::Walk;
use rules::{Message, Read, Refused, Top};
use view::View;

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
    /// `raw`'s top-level members (name, value) when the rules read the text.
    spans: Option<Vec<(Range<usize>, Range<usize>)>>,
    /// The body as a DOM: built when the rules read the DOM, or on first use.
    dom: OnceCell<Map<String, Value>>,
}

impl ParsedRequest {
    /// A body the rules accepted, in the form they read it in: the text
    /// with its members' spans, or the DOM.
    fn accepted(
        op: Operation,
        read: Read,
        raw: String,
        spans: Option<Vec<(Range<usize>, Range<usize>)>>,
        dom: OnceCell<Map<String, Value>>,
    ) -> ParsedRequest {
        ParsedRequest {
            op,
            model: read.model,
            stream: read.stream,
            include_usage: read.include_usage,
            raw,
            spans,
            dom,
        }
    }

    /// The client's body as a JSON object, parsed now if the rules read
    /// the text (it was valid then, so this fails only on a bug).
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
    /// (from the walk of the text when the rules read it).
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
        && let Some(answer) = parse_raw(op, text)
    {
        return answer;
    }
    validate_dom(op, bytes, text)
}

/// The rules over the client's text, without a DOM; `None` when the walk
/// is not sure of it (JSON it does not read exactly as serde does, or not
/// JSON at all), which is the DOM's to answer.
fn parse_raw(op: Operation, text: &str) -> Option<Result<ParsedRequest, ApiError>> {
    let mut spans = Vec::with_capacity(16);
    let mut top = Top::default();
    let mut walk = Walk::values(text);
    walk.object(&mut |name, walk| {
        let value = match (name, op) {
            // Messages are split as the walk passes them, not walked again.
            ("messages", Operation::Chat) if walk.peek() == Some(b'[') => {
                let mut messages = Vec::new();
                let value = walk.array(&mut |walk| {
                    let mut message = Message::default();
                    walk.object(&mut |name, walk| {
                        message.member(name, View::Raw(walk.value()?));
                        Some(())
                    })?;
                    messages.push(message);
                    Some(())
                })?;
                top.split_messages(messages);
                value
            }
            _ => {
                let value = walk.value()?;
                top.member(name, View::Raw(value));
                value
            }
        };
        spans.push((span_in(text, name), span_in(text, value)));
        Some(())
    })?;
    walk.end()?;
    match rules::check(op, top) {
        Ok(read) => Some(Ok(ParsedRequest::accepted(
            op,
            read,
            text.to_owned(),
            Some(spans),
            OnceCell::new(),
        ))),
        Err(Refused::Invalid(e)) => Some(Err(e)),
        Err(Refused::Unsure) => None,
    }
}

/// Where `part`, a slice of `text`, lies in it.
fn span_in(text: &str, part: &str) -> Range<usize> {
    let start = (part.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
    start..start.saturating_add(part.len())
}

/// The rules over serde's DOM alone: what [`parse`] does when the walk is
/// not sure. Public so the tests and the `request` fuzz target can hold the
/// two forms to the same answers.
pub fn parse_dom(op: Operation, bytes: &[u8]) -> Result<ParsedRequest, ApiError> {
    validate_dom(op, bytes, std::str::from_utf8(bytes))
}

/// [`parse_dom`] on `bytes` already checked as UTF-8 (`text`), so the body
/// the walk left is not checked twice.
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
    let value: Value = parsed.map_err(|e| invalid_json(format!("Request body is not valid JSON: {e}.")))?;
    let Value::Object(body) = value else {
        return Err(invalid_json("Request body must be a JSON object.".into()));
    };
    let mut top = Top::default();
    for (name, value) in &body {
        top.member(name, View::Dom(value));
    }
    let read = match rules::check(op, top) {
        Ok(read) => read,
        Err(Refused::Invalid(e)) => return Err(e),
        // The DOM reads every part exactly; the rules' views say so.
        Err(Refused::Unsure) => return Err(unreadable()),
    };
    // serde accepted the body, so it is UTF-8: copied as it is.
    let raw = text.map_or_else(|_| String::from_utf8_lossy(bytes).into_owned(), str::to_owned);
    Ok(ParsedRequest::accepted(op, read, raw, None, OnceCell::from(body)))
}

/// `invalid_json` names no field.
fn invalid_json(message: String) -> ApiError {
    let mut e = ApiError::bad_request("invalid_json", "body", message);
    e.param = None;
    e
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::members::Members;

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

    // The raw form against the DOM.

    /// Whenever the raw form answers, the DOM answers the same: the same
    /// fields read, or the same error; and the spans are the body's members.
    /// Whether the raw form answered.
    fn agrees(op: Operation, text: &str) -> bool {
        let dom = parse_dom(op, text.as_bytes());
        let Some(raw) = parse_raw(op, text) else {
            return false;
        };
        let raw = match (raw, dom) {
            (Ok(raw), Ok(dom)) => {
                assert_eq!(
                    (&raw.model, raw.stream, raw.include_usage),
                    (&dom.model, dom.stream, dom.include_usage),
                    "{text}"
                );
                raw
            }
            (raw, dom) => {
                assert_eq!(raw.err(), dom.err(), "{text}");
                return true;
            }
        };
        let spans: Vec<(&str, &str)> = raw
            .spans
            .iter()
            .flatten()
            .map(|(n, v)| (&text[n.clone()], &text[v.clone()]))
            .collect();
        let members = Members::parse_str(text).unwrap();
        let members: Vec<(&str, &str)> = members.0.iter().map(|(n, v)| (n.as_ref(), v.get())).collect();
        assert_eq!(spans, members, "{text}");
        true
    }

    fn accepted_raw(op: Operation, text: &str) -> bool {
        matches!(parse_raw(op, text), Some(Ok(_)))
    }

    const MESSAGE: &str = r#"{"role":"user","content":"hi"}"#;

    fn chat_with(member: &str) -> String {
        format!(r#"{{"model":"a/b","messages":[{MESSAGE}],{member}}}"#)
    }

    #[test]
    fn usual_bodies_are_read_without_a_dom() {
        let bench = include_str!("../benches/data/chat_1k.json");
        let tools = r#"{"model":"a/b","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"42"}],
            "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],"tool_choice":"auto"}"#;
        let sampled = r#"{"model":"a/b","messages":[{"role":"developer","content":"d"},{"role":"user","content":"x \u00e9 \ud83d\ude00"}],
            "temperature":2,"top_p":1.0,"presence_penalty":-2.0,"frequency_penalty":-0.0,"max_tokens":1,"max_completion_tokens":100000,
            "n":1,"seed":-9007199254740993,"stop":["\n","END"],"user":"u1","response_format":{"type":"json_schema","json_schema":{"name":"x"}},
            "stream":true,"stream_options":{"include_usage":true},"waygate":{"routing":{"prefer":["a"]}}}"#;
        for (op, body) in [
            (Operation::Chat, bench),
            (Operation::Chat, tools),
            (Operation::Chat, sampled),
            (
                Operation::Completions,
                r#"{"model":"a/b","prompt":"Say hi","max_tokens":5,"stream":false}"#,
            ),
        ] {
            assert!(agrees(op, body) && accepted_raw(op, body), "not taken: {body}");
        }
        let read = parse_raw(Operation::Chat, sampled).unwrap().unwrap();
        assert_eq!(
            (read.model.as_str(), read.stream, read.include_usage),
            ("a/b", true, true)
        );
    }

    #[test]
    fn text_the_walk_is_not_sure_of_goes_to_the_dom() {
        for member in [
            r#""temperature":1e0"#,
            r#""x":1E400"#,
            r#""x":"\ud800""#,
            r#""x":"\udc00\ud800""#,
            r#""x":"\ud800\u0041""#,
            r#""stream_options":{"include_us\u0061ge":true}"#,
            r#""messages":[{"role":"user","con\u0074ent":"x"}]"#,
        ] {
            let body = chat_with(member);
            assert!(!agrees(Operation::Chat, &body), "taken: {member}");
            assert_eq!(
                parse(Operation::Chat, body.as_bytes()).map(|r| r.model),
                parse_dom(Operation::Chat, body.as_bytes()).map(|r| r.model),
                "{member}"
            );
        }
        assert!(!agrees(
            Operation::Chat,
            r#"{"model":"a/b","messages":[{"role":"user","content":"x"}]} x"#
        ));
    }

    #[test]
    fn the_raw_form_refuses_as_the_dom_does() {
        for member in [
            r#""temperature":2.00000000000000000001"#,
            r#""max_tokens":18446744073709551615"#,
            r#""stream_options":{"include_usage":true,"other":1}"#,
            r#""stream_options":{"zeta":1,"include_usage":true,"alpha":2}"#,
            r#""temperature":2.5"#,
            r#""temperature":-0.1"#,
            r#""top_p":"1""#,
            r#""max_tokens":0"#,
            r#""max_tokens":1.0"#,
            r#""max_tokens":-0"#,
            r#""n":-1"#,
            r#""stop":[1]"#,
            r#""stop":{}"#,
            r#""user":7"#,
            r#""response_format":{"type":"yaml"}"#,
            r#""response_format":{}"#,
            r#""response_format":{"type":null}"#,
            r#""tools":[1]"#,
            r#""tools":{}"#,
            r#""stream":"yes""#,
            r#""stream_options":[]"#,
            r#""stream_options":{"include_usage":1}"#,
        ] {
            assert!(agrees(Operation::Chat, &chat_with(member)), "not answered: {member}");
        }
        for body in [
            r#"{"model":"a/b","messages":[]}"#,
            r#"{"model":"a/\u0062","messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":null,"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"robot","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"assistant","content":null,"tool_calls":[]}]}"#,
            r#"{"model":"a/b","messages":[{"role":"tool","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"audio"}]}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":"x","tool_calls":{}}]}"#,
            r#"{"model":"a/b","messages":{}}"#,
        ] {
            assert!(agrees(Operation::Chat, body), "not answered: {body}");
        }
        assert!(agrees(Operation::Completions, r#"{"model":"a/b","prompt":["x"]}"#));
        let e = parse(
            Operation::Chat,
            chat_with(r#""stream_options":{"zeta":1,"include_usage":true,"alpha":2}"#).as_bytes(),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("stream_options.alpha"));
    }

    #[test]
    fn repeated_names_count_as_the_dom_counts_them() {
        // The last of a repeated name is the DOM's; the raw form either
        // reads the same or leaves it to the DOM.
        for body in [
            r#"{"model":"x/y","model":"a/b","messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"robot","role":"user","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","role":"robot","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[],"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":"x"}],"stream":true,"stream":false}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"bad"}],"content":"x"}]}"#,
        ] {
            agrees(Operation::Chat, body);
        }
        let read = parse_raw(
            Operation::Chat,
            r#"{"model":"x/y","model":"a/b","messages":[{"role":"user","content":"x"}]}"#,
        );
        assert_eq!(read.and_then(Result::ok).map(|r| r.model).as_deref(), Some("a/b"));
    }

    /// Every member the rules read, given every kind of value: the raw form
    /// answers as the DOM does.
    #[test]
    fn every_field_and_value_kind_agrees_with_the_dom() {
        let values = [
            "null",
            "true",
            "false",
            "0",
            "-0",
            "1",
            "2",
            "-2",
            "3",
            "0.5",
            "1.0",
            "2.0",
            "2.01",
            "-2.0",
            "-2.5",
            "1e1",
            "-1",
            "400",
            "-9223372036854775808",
            "18446744073709551616",
            r#""""#,
            r#""s""#,
            r#""text""#,
            "[]",
            r#"["a"]"#,
            "[1]",
            "[{}]",
            "{}",
            r#"{"type":"text"}"#,
            r#"{"type":"json_object"}"#,
            r#"{"include_usage":true}"#,
            r#"{"include_usage":null}"#,
            MESSAGE,
        ];
        let fields = [
            "model",
            "messages",
            "prompt",
            "temperature",
            "top_p",
            "presence_penalty",
            "frequency_penalty",
            "max_tokens",
            "max_completion_tokens",
            "n",
            "seed",
            "stop",
            "user",
            "response_format",
            "tools",
            "stream",
            "stream_options",
        ];
        let (mut answered, mut accepted) = (0, 0);
        for field in fields {
            for value in values {
                let body = chat_with(&format!(r#""{field}":{value}"#));
                answered += usize::from(agrees(Operation::Chat, &body));
                accepted += usize::from(accepted_raw(Operation::Chat, &body));
                let body = format!(r#"{{"model":"a/b","prompt":"p","{field}":{value}}}"#);
                answered += usize::from(agrees(Operation::Completions, &body));
                accepted += usize::from(accepted_raw(Operation::Completions, &body));
            }
        }
        // Messages and parts, member by member.
        let message_members = ["role", "content", "tool_calls", "tool_call_id", "name"];
        for member in message_members {
            for value in values
                .iter()
                .chain(&[r#""assistant""#, r#""tool""#, r#"[{"type":"text","text":"t"}]"#])
            {
                for role in ["user", "assistant", "tool"] {
                    let body = format!(
                        r#"{{"model":"a/b","messages":[{{"role":"{role}","content":"c","{member}":{value}}}]}}"#
                    );
                    answered += usize::from(agrees(Operation::Chat, &body));
                    accepted += usize::from(accepted_raw(Operation::Chat, &body));
                }
            }
        }
        for part in values.iter().map(|v| format!(r#"{{"type":"text","text":{v}}}"#)).chain(
            values
                .iter()
                .map(|v| format!(r#"{{"type":"image_url","image_url":{{"url":{v}}}}}"#)),
        ) {
            let body = format!(r#"{{"model":"a/b","messages":[{{"role":"user","content":[{part}]}}]}}"#);
            answered += usize::from(agrees(Operation::Chat, &body));
            accepted += usize::from(accepted_raw(Operation::Chat, &body));
        }
        assert!(accepted > 200, "the raw form accepted only {accepted}");
        assert!(answered > 1600, "the raw form answered only {answered}");
    }

    /// Every cut of a body, and every byte of it changed to each byte that
    /// matters to JSON: answered as the DOM answers.
    #[test]
    fn every_cut_and_changed_byte_agrees_with_the_dom() {
        let body = r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"text","text":"h\"i"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}],"temperature":0.5,"max_tokens":9,"stream":true,"stream_options":{"include_usage":false}}"#;
        assert!(agrees(Operation::Chat, body));
        for end in 0..body.len() {
            agrees(Operation::Chat, &body[..end]);
            for b in [
                b'"', b'\\', b',', b':', b'{', b'}', b'[', b']', b'0', b'9', b'-', b'.', b'e', b' ', b'n', b'x',
            ] {
                let mut bytes = body.as_bytes().to_vec();
                bytes[end] = b;
                if let Ok(text) = std::str::from_utf8(&bytes) {
                    agrees(Operation::Chat, text);
                }
            }
        }
    }
}
