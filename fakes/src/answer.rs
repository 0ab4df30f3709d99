//! The provider-neutral answer of a fake: text or tool calls, finish reason and usage.
//!
//! Usage looks real and is consistent: input tokens are the words of the request's
//! conversation, output tokens the words of the answer.

use serde_json::{Map, Value, json};

use super::RecordedRequest;
use super::steer::Directive;

/// A tool the request declared.
#[derive(Clone, Debug)]
pub(crate) struct ToolDecl {
    pub name: String,
    pub schema: Value,
}

/// What the request allows for tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// One tool call of the answer.
#[derive(Clone, Debug)]
pub(crate) struct ToolCall {
    pub name: String,
    pub args: Value,
}

/// Why the answer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finish {
    Stop,
    Length,
    ToolCalls,
}

/// Text or tool calls.
#[derive(Clone, Debug)]
pub(crate) enum Content {
    Text(String),
    Calls(Vec<ToolCall>),
}

/// The answer, before it is put in a provider's shape.
#[derive(Clone, Debug)]
pub(crate) struct Answer {
    pub content: Content,
    pub finish: Finish,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// Everything that decides the answer.
pub(crate) struct Ask<'a> {
    pub provider: &'static str,
    pub directive: Directive,
    pub tools: Vec<ToolDecl>,
    pub tool_choice: ToolChoice,
    pub json_mode: bool,
    pub max_tokens: Option<u64>,
    pub input_words: usize,
    pub request: &'a RecordedRequest,
}

/// Builds the answer for a request.
pub(crate) fn answer(ask: &Ask<'_>) -> Answer {
    let input_tokens = ask.input_words.max(1) as u64;
    if let Some(calls) = tool_calls(ask) {
        let output_tokens = calls.iter().map(|c| 1 + word_count(&c.args.to_string()) as u64).sum();
        return Answer {
            content: Content::Calls(calls),
            finish: Finish::ToolCalls,
            input_tokens,
            output_tokens,
        };
    }
    let hello = format!("Hello from {} fake.", ask.provider);
    let (text, may_truncate) = match ask.directive {
        Directive::Echo => (echo_text(ask.request), false),
        Directive::Agent => {
            let body = serde_json::from_slice::<Value>(&ask.request.body).unwrap_or(Value::Null);
            let result = last_tool_result(&body).unwrap_or_default();
            (format!("The tool said: {result}"), false)
        }
        Directive::Json => (json!({"answer": hello, "ok": true}).to_string(), false),
        _ if ask.json_mode => (json!({"answer": hello, "ok": true}).to_string(), false),
        Directive::Long(n) => (long_text(n), true),
        _ => (hello, true),
    };
    let (text, finish) = match ask.max_tokens {
        Some(max) if may_truncate && word_count(&text) as u64 > max => {
            (truncate_words(&text, max as usize), Finish::Length)
        }
        _ => (text, Finish::Stop),
    };
    Answer {
        output_tokens: word_count(&text).max(1) as u64,
        content: Content::Text(text),
        finish,
        input_tokens,
    }
}

fn tool_calls(ask: &Ask<'_>) -> Option<Vec<ToolCall>> {
    if ask.tools.is_empty() || ask.tool_choice == ToolChoice::None {
        return None;
    }
    let agent_turn = ask.directive == Directive::Agent && {
        let body = serde_json::from_slice::<Value>(&ask.request.body).unwrap_or(Value::Null);
        last_tool_result(&body).is_none()
    };
    let wanted = matches!(ask.directive, Directive::Tool | Directive::Tools)
        || agent_turn
        || matches!(ask.tool_choice, ToolChoice::Required | ToolChoice::Named(_));
    if !wanted {
        return None;
    }
    let chosen: Vec<&ToolDecl> = match &ask.tool_choice {
        ToolChoice::Named(name) => ask.tools.iter().filter(|t| &t.name == name).collect(),
        _ if ask.directive == Directive::Tools => ask.tools.iter().collect(),
        _ => ask.tools.iter().take(1).collect(),
    };
    let calls: Vec<ToolCall> = chosen
        .into_iter()
        .map(|t| ToolCall {
            name: t.name.clone(),
            args: sample_value(&t.schema, &t.name, 0),
        })
        .collect();
    (!calls.is_empty()).then_some(calls)
}

/// The text of the conversation's last tool result, in any provider's shape: an
/// OpenAI `tool` message, an Anthropic `tool_result` block, a Gemini `functionResponse`.
pub(crate) fn last_tool_result(body: &Value) -> Option<String> {
    fn text(content: &Value) -> String {
        match content {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
            other => other.to_string(),
        }
    }
    let mut last = None;
    let mut stack = vec![body];
    // Depth first, in document order: the last one found is the conversation's last.
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                let openai = map.get("role").and_then(Value::as_str) == Some("tool");
                let anthropic = map.get("type").and_then(Value::as_str) == Some("tool_result");
                if openai || anthropic {
                    last = map.get("content").map(text).or(last);
                } else if let Some(response) = map.get("functionResponse") {
                    last = response.get("response").map(|r| match r.get("result") {
                        Some(result) => text(result),
                        None => r.to_string(),
                    });
                }
                stack.extend(map.values().rev());
            }
            Value::Array(items) => stack.extend(items.iter().rev()),
            _ => {}
        }
    }
    last
}

/// `word1 word2 … wordN`.
fn long_text(n: usize) -> String {
    (1..=n).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" ")
}

/// The request as JSON text: method, path, query, headers (lowercase), body.
pub(crate) fn echo_text(req: &RecordedRequest) -> String {
    let mut headers = Map::new();
    for (name, value) in &req.headers {
        let joined = match headers.get(name).and_then(Value::as_str) {
            Some(prev) => format!("{prev}, {value}"),
            None => value.clone(),
        };
        headers.insert(name.clone(), Value::String(joined));
    }
    let body = serde_json::from_slice::<Value>(&req.body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&req.body).into_owned()));
    json!({
        "method": req.method,
        "path": req.path_only(),
        "query": req.query(),
        "headers": headers,
        "body": body,
    })
    .to_string()
}

/// Words separated by whitespace.
pub(crate) fn word_count(text: &str) -> usize {
    text.split_whitespace().count()
}

fn truncate_words(text: &str, max: usize) -> String {
    text.split_whitespace().take(max.max(1)).collect::<Vec<_>>().join(" ")
}

/// Keys whose string values are not conversation text.
const NOT_TEXT: &[&str] = &[
    "role",
    "type",
    "id",
    "tool_call_id",
    "tool_use_id",
    "name",
    "media_type",
    "mime_type",
    "mimeType",
    "data",
    "url",
    "detail",
    "cache_control",
    "signature",
    "thoughtSignature",
    "fileUri",
    "file_uri",
];

/// Words of every text value in `value`, skipping ids, roles and binary data.
pub(crate) fn input_words(value: &Value) -> usize {
    match value {
        Value::String(s) => word_count(s),
        Value::Array(items) => items.iter().map(input_words).sum(),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| !NOT_TEXT.contains(&k.as_str()))
            .map(|(_, v)| input_words(v))
            .sum(),
        _ => 0,
    }
}

/// Splits answer text into stream pieces: one word each (with its leading space),
/// long words split further so no piece exceeds 48 bytes.
pub(crate) fn stream_pieces(text: &str) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        let word_ends = c.is_whitespace() && current.chars().last().is_some_and(|l| !l.is_whitespace());
        if word_ends || current.len() + c.len_utf8() > 48 {
            pieces.push(std::mem::take(&mut current));
        }
        current.push(c);
    }
    if !current.is_empty() || pieces.is_empty() {
        pieces.push(current);
    }
    pieces
}

/// Splits a string into pieces of at most `size` bytes on char boundaries.
pub(crate) fn chunks(text: &str, size: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for c in text.chars() {
        if current.len() + c.len_utf8() > size.max(4) {
            out.push(std::mem::take(&mut current));
        }
        current.push(c);
    }
    out.push(current);
    out
}

/// A value that satisfies a JSON schema (OpenAPI-style upper-case types too).
pub(crate) fn sample_value(schema: &Value, key: &str, depth: usize) -> Value {
    if let Some(first) = schema.get("enum").and_then(Value::as_array).and_then(|a| a.first()) {
        return first.clone();
    }
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.to_ascii_lowercase(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .unwrap_or("null")
            .to_ascii_lowercase(),
        _ if schema.get("properties").is_some() => "object".into(),
        _ => "string".into(),
    };
    match ty.as_str() {
        "integer" | "number" => json!(2),
        "boolean" => json!(true),
        "null" => Value::Null,
        "array" if depth < 8 => match schema.get("items") {
            Some(items) => json!([sample_value(items, key, depth + 1)]),
            None => json!([]),
        },
        "object" if depth < 8 => {
            let props = schema.get("properties").and_then(Value::as_object);
            let required: Vec<&str> = schema
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut out = Map::new();
            for (name, sub) in props.into_iter().flatten() {
                if required.is_empty() || required.contains(&name.as_str()) {
                    out.insert(name.clone(), sample_value(sub, name, depth + 1));
                }
            }
            Value::Object(out)
        }
        "array" => json!([]),
        "object" => json!({}),
        _ => json!(format!("example {key}")),
    }
}

/// Random letters and digits (getrandom; a clock-based fallback if it fails).
pub(crate) fn random_id(len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut buf = vec![0u8; len];
    if getrandom::fill(&mut buf).is_err() {
        let seed = now_nanos();
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (seed >> ((i % 16) * 4)) as u8 ^ (i as u8).wrapping_mul(31);
        }
    }
    buf.iter()
        .map(|b| {
            let i = usize::from(*b) % ALPHABET.len();
            char::from(ALPHABET.get(i).copied().unwrap_or(b'x'))
        })
        .collect()
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// Unix seconds.
pub(crate) fn now_secs() -> u64 {
    (now_nanos() / 1_000_000_000) as u64
}

#[cfg(test)]
mod tests {
    use super::{chunks, last_tool_result, sample_value, stream_pieces};
    use serde_json::json;

    #[test]
    fn pieces_keep_the_text() {
        let text = "Hello from openai fake.";
        let pieces = stream_pieces(text);
        assert_eq!(pieces, vec!["Hello", " from", " openai", " fake."]);
        assert_eq!(pieces.concat(), text);
        let long = "x".repeat(100);
        assert_eq!(stream_pieces(&long).concat(), long);
        assert_eq!(chunks("{\"a\": 1}", 4).concat(), "{\"a\": 1}");
    }

    #[test]
    fn sample_values_follow_the_schema() {
        let schema = json!({"type": "object", "properties": {
            "location": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]},
            "days": {"type": "INTEGER"}}, "required": ["location", "unit"]});
        assert_eq!(
            sample_value(&schema, "f", 0),
            json!({"location": "example location", "unit": "c"})
        );
    }

    #[test]
    fn the_last_tool_result_is_read_in_every_providers_shape() {
        let openai = json!({"messages": [{"role": "tool", "tool_call_id": "a", "content": "first"},
            {"role": "user", "content": "again"}, {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "second"}]}]});
        assert_eq!(last_tool_result(&openai).as_deref(), Some("second"));
        let anthropic = json!({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": "sunny"}]}]});
        assert_eq!(last_tool_result(&anthropic).as_deref(), Some("sunny"));
        let gemini = json!({"contents": [{"role": "user", "parts": [
            {"functionResponse": {"name": "w", "response": {"result": "18 degrees"}}}]}]});
        assert_eq!(last_tool_result(&gemini).as_deref(), Some("18 degrees"));
        assert_eq!(
            last_tool_result(&json!({"messages": [{"role": "user", "content": "hi"}]})),
            None
        );
    }
}
