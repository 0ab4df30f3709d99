//! The OpenAI chat request as the translating providers (Anthropic, Gemini)
//! read it, and the OpenAI answer and chunk shapes they produce.
//!
//! [`crate::request`] has already checked the fields it knows (roles, content
//! parts, ranges). What it leaves open (tool calls inside assistant messages,
//! tool definitions, `tool_choice`, image URLs) is checked here, so that both
//! providers refuse the same requests with the same `param`. Everything here
//! borrows from the client's body: a fallback re-runs the translation from
//! the same untouched request.

use serde_json::{Map, Value, json};

use crate::errors::ApiError;
use crate::redact;
use crate::request::{Operation, ParsedRequest, bad_value, missing, wrong_type};

/// Fields a translating provider reads itself; any other field the client
/// sent is dropped (and logged), since these APIs refuse unknown fields.
const READ: [&str; 20] = [
    "model",
    "messages",
    "prompt",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "n",
    "user",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "logprobs",
];

/// Legacy parameters that chat cannot express without changing the answer.
const LEGACY_ONLY: [&str; 4] = ["echo", "suffix", "best_of", "logprobs"];

/// Refuses what no translating provider can express without changing the
/// answer's shape (contract §6), and logs what is dropped.
pub(super) fn check_common(request: &ParsedRequest, provider_id: &str, routing_field: &str) -> Result<(), ApiError> {
    let body = request.body()?;
    if request.op == Operation::Completions {
        for field in LEGACY_ONLY {
            if is_set(body.get(field)) {
                return Err(unsupported(field));
            }
        }
    } else if is_set(body.get("logprobs")) {
        return Err(unsupported("logprobs"));
    }
    for field in ["top_logprobs", "functions", "function_call", "audio"] {
        if is_set(body.get(field)) {
            return Err(unsupported(field));
        }
    }
    let dropped: Vec<&str> = body
        .iter()
        .filter(|(k, v)| !READ.contains(&k.as_str()) && k.as_str() != routing_field && is_set(Some(v)))
        .map(|(k, _)| k.as_str())
        .filter(|k| !LEGACY_ONLY.contains(k))
        .collect();
    if !dropped.is_empty() {
        // The names are the client's: each one log field, and a few of them.
        const NAMED: usize = 10;
        let mut names: Vec<_> = dropped.iter().take(NAMED).map(|n| redact::log_field(n)).collect();
        let more = dropped.len().saturating_sub(NAMED);
        if more > 0 {
            names.push(format!("{more} more").into());
        }
        log::info!("provider {provider_id} cannot express {}; dropped", names.join(", "));
    }
    Ok(())
}

/// A parameter is "set" unless it is absent, `null` or `false`.
pub(super) fn is_set(v: Option<&Value>) -> bool {
    v.is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
}

/// The contract's refusal for a parameter the provider cannot express.
pub(super) fn unsupported(param: &str) -> ApiError {
    ApiError::bad_request(
        "unsupported_parameter",
        param,
        format!("'{param}' is not supported by this model's provider."),
    )
}

/// `max_completion_tokens` (the current name) or `max_tokens`.
pub(super) fn max_tokens(body: &Map<String, Value>) -> Option<u64> {
    body.get("max_completion_tokens")
        .and_then(Value::as_u64)
        .or_else(|| body.get("max_tokens").and_then(Value::as_u64))
}

/// `stop` as a list (OpenAI takes a string or an array).
pub(super) fn stop(body: &Map<String, Value>) -> Vec<String> {
    match body.get("stop") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).map(str::to_string).collect(),
        _ => Vec::new(),
    }
}

/// `n`, 1 when absent.
pub(super) fn n(body: &Map<String, Value>) -> u64 {
    body.get("n").and_then(Value::as_u64).unwrap_or(1)
}

/// A finite number field, if present.
pub(super) fn number(body: &Map<String, Value>, field: &str) -> Option<f64> {
    body.get(field).and_then(Value::as_f64)
}

// ---- messages ---------------------------------------------------------------

/// One message of the conversation, in the order the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Message<'a> {
    /// A `system` or `developer` message: its text.
    System(String),
    User(Vec<Part<'a>>),
    Assistant {
        text: String,
        calls: Vec<ToolCall<'a>>,
    },
    /// A `tool` message; `name` is the function of the assistant tool call
    /// it answers (Gemini needs it; its API has no call ids).
    Tool {
        /// Its place in `messages`, for errors.
        index: usize,
        call_id: &'a str,
        name: Option<&'a str>,
        content: String,
    },
}

/// A content part of a user message.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Part<'a> {
    Text(&'a str),
    Image {
        source: ImageSource<'a>,
        /// `messages.N.content.M.image_url.url`, for errors.
        param: String,
    },
}

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ImageSource<'a> {
    /// A `data:<media type>;base64,<data>` URL.
    Inline { media_type: &'a str, data: &'a str },
    /// An `http(s)://` URL.
    Url(&'a str),
}

/// An assistant tool call being sent back as history.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ToolCall<'a> {
    pub id: &'a str,
    pub name: &'a str,
    /// The parsed `function.arguments` (both APIs want an object).
    pub arguments: Map<String, Value>,
}

/// The conversation: `messages`, or the legacy `prompt` as one user message.
pub(super) fn messages(request: &ParsedRequest) -> Result<Vec<Message<'_>>, ApiError> {
    if request.op == Operation::Completions {
        let prompt = crate::request::prompt_text(request.body()?);
        return Ok(vec![Message::User(vec![Part::Text(prompt)])]);
    }
    let Some(Value::Array(raw)) = request.body()?.get("messages") else {
        return Err(missing("messages"));
    };
    let mut out: Vec<Message<'_>> = Vec::with_capacity(raw.len());
    for (i, m) in raw.iter().enumerate() {
        let at = format!("messages.{i}");
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").unwrap_or(&Value::Null);
        let message = match role {
            "system" | "developer" => Message::System(text_only(content, &at)?),
            "user" => Message::User(parts(content, &at)?),
            "assistant" => Message::Assistant {
                text: text_only(content, &at)?,
                calls: tool_calls(m.get("tool_calls"), &at)?,
            },
            "tool" => {
                let call_id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
                Message::Tool {
                    index: i,
                    call_id,
                    name: call_name(&out, call_id),
                    content: text_only(content, &at)?,
                }
            }
            _ => return Err(bad_value(&format!("{at}.role"), "is not a known role")),
        };
        out.push(message);
    }
    Ok(out)
}

/// The function name of the latest earlier assistant tool call with this id.
fn call_name<'a>(earlier: &[Message<'a>], call_id: &str) -> Option<&'a str> {
    earlier.iter().rev().find_map(|m| match m {
        Message::Assistant { calls, .. } => calls.iter().find(|c| c.id == call_id).map(|c| c.name),
        _ => None,
    })
}

/// The text of a content that may only hold text (system, assistant, tool).
fn text_only(content: &Value, at: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(items) => {
            let mut text = String::new();
            for (j, part) in items.iter().enumerate() {
                match part.get("text").and_then(Value::as_str) {
                    Some(t) => text.push_str(t),
                    None => {
                        return Err(bad_value(
                            &format!("{at}.content.{j}.type"),
                            "must be 'text' outside user messages",
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Ok(String::new()),
    }
}

fn parts<'a>(content: &'a Value, at: &str) -> Result<Vec<Part<'a>>, ApiError> {
    match content {
        Value::String(s) => Ok(vec![Part::Text(s)]),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(j, part)| {
                if let Some(text) = part.get("text").and_then(Value::as_str) {
                    return Ok(Part::Text(text));
                }
                let param = format!("{at}.content.{j}.image_url.url");
                let url = part.pointer("/image_url/url").and_then(Value::as_str).unwrap_or("");
                Ok(Part::Image {
                    source: image_source(url, &param)?,
                    param,
                })
            })
            .collect(),
        _ => Ok(Vec::new()),
    }
}

/// Reads an image URL: a base64 `data:` URL or an `http(s)` URL.
fn image_source<'a>(url: &'a str, param: &str) -> Result<ImageSource<'a>, ApiError> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (header, data) = rest.split_once(',').unwrap_or((rest, ""));
        let media_type = header.strip_suffix(";base64").unwrap_or("");
        let media_type = media_type.split(';').next().unwrap_or("");
        if media_type.is_empty() || data.is_empty() {
            return Err(bad_value(
                param,
                "must be a base64 data URL ('data:image/png;base64,...') or an https URL",
            ));
        }
        return Ok(ImageSource::Inline { media_type, data });
    }
    let lower = url.get(..8).unwrap_or(url).to_ascii_lowercase();
    if lower.starts_with("https://") || lower.starts_with("http://") {
        return Ok(ImageSource::Url(url));
    }
    Err(bad_value(param, "must be a base64 data URL or an https URL"))
}

fn tool_calls<'a>(raw: Option<&'a Value>, at: &str) -> Result<Vec<ToolCall<'a>>, ApiError> {
    let Some(Value::Array(raw)) = raw else {
        return Ok(Vec::new());
    };
    raw.iter()
        .enumerate()
        .map(|(j, call)| {
            let at = format!("{at}.tool_calls.{j}");
            let id = match call.get("id") {
                Some(Value::String(id)) => id.as_str(),
                None | Some(Value::Null) => return Err(missing(&format!("{at}.id"))),
                Some(_) => return Err(wrong_type(&format!("{at}.id"), "a string")),
            };
            let name = match call.pointer("/function/name") {
                Some(Value::String(name)) => name.as_str(),
                None | Some(Value::Null) => return Err(missing(&format!("{at}.function.name"))),
                Some(_) => return Err(wrong_type(&format!("{at}.function.name"), "a string")),
            };
            let arguments = match call.pointer("/function/arguments") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::String(s)) if s.trim().is_empty() => Map::new(),
                Some(Value::String(s)) => match crate::json::dom::parse(s) {
                    Ok(Value::Object(map)) => map,
                    _ => {
                        return Err(bad_value(
                            &format!("{at}.function.arguments"),
                            "must be a JSON object encoded as a string",
                        ));
                    }
                },
                Some(_) => return Err(wrong_type(&format!("{at}.function.arguments"), "a string")),
            };
            Ok(ToolCall { id, name, arguments })
        })
        .collect()
}

// ---- tools ------------------------------------------------------------------

/// A function the client declared.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Function<'a> {
    pub name: &'a str,
    pub description: Option<&'a str>,
    /// The JSON Schema of the arguments, when given.
    pub parameters: Option<&'a Value>,
}

/// `tools`: function tools only.
pub(super) fn tools(body: &Map<String, Value>) -> Result<Vec<Function<'_>>, ApiError> {
    let Some(Value::Array(raw)) = body.get("tools") else {
        return Ok(Vec::new());
    };
    raw.iter()
        .enumerate()
        .map(|(i, tool)| {
            let at = format!("tools.{i}");
            match tool.get("type").and_then(Value::as_str) {
                Some("function") => {}
                None => return Err(missing(&format!("{at}.type"))),
                Some(_) => return Err(unsupported(&format!("{at}.type"))),
            }
            let Some(function) = tool.get("function") else {
                return Err(missing(&format!("{at}.function")));
            };
            let name = match function.get("name") {
                Some(Value::String(n)) if !n.is_empty() => n.as_str(),
                None | Some(Value::Null) => return Err(missing(&format!("{at}.function.name"))),
                Some(_) => return Err(wrong_type(&format!("{at}.function.name"), "a non-empty string")),
            };
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => None,
                Some(p @ Value::Object(_)) => Some(p),
                Some(_) => return Err(wrong_type(&format!("{at}.function.parameters"), "an object")),
            };
            Ok(Function {
                name,
                description: function.get("description").and_then(Value::as_str),
                parameters,
            })
        })
        .collect()
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ToolChoice<'a> {
    Auto,
    None,
    Required,
    Named(&'a str),
}

pub(super) fn tool_choice(body: &Map<String, Value>) -> Result<Option<ToolChoice<'_>>, ApiError> {
    match body.get("tool_choice") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(Some(ToolChoice::Auto)),
            "none" => Ok(Some(ToolChoice::None)),
            "required" => Ok(Some(ToolChoice::Required)),
            _ => Err(bad_value(
                "tool_choice",
                "must be 'none', 'auto', 'required' or a named function",
            )),
        },
        Some(Value::Object(o)) => match (o.get("type").and_then(Value::as_str), o.get("function")) {
            (Some("function"), Some(f)) => match f.get("name") {
                Some(Value::String(name)) => Ok(Some(ToolChoice::Named(name))),
                _ => Err(missing("tool_choice.function.name")),
            },
            (Some("function"), None) => Err(missing("tool_choice.function")),
            _ => Err(unsupported("tool_choice")),
        },
        Some(_) => Err(wrong_type("tool_choice", "a string or an object")),
    }
}

// ---- response_format ----------------------------------------------------------

/// `response_format`.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum ResponseFormat<'a> {
    Text,
    JsonObject,
    /// `json_schema`: the schema, when one was given.
    JsonSchema(Option<&'a Value>),
}

pub(super) fn response_format(body: &Map<String, Value>) -> ResponseFormat<'_> {
    let format = body.get("response_format");
    match format.and_then(|f| f.get("type")).and_then(Value::as_str) {
        Some("json_object") => ResponseFormat::JsonObject,
        Some("json_schema") => ResponseFormat::JsonSchema(
            format
                .and_then(|f| f.pointer("/json_schema/schema"))
                .filter(|s| s.is_object()),
        ),
        _ => ResponseFormat::Text,
    }
}

// ---- answers ------------------------------------------------------------------

/// An OpenAI tool call of an answer.
pub(super) fn tool_call(id: &str, name: &str, arguments: String) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

/// One `chat.completion` choice. `content` is `null` only beside tool calls
/// and no text, as OpenAI answers; otherwise a string, even when empty.
pub(super) fn choice(index: u64, text: Option<String>, tool_calls: Vec<Value>, finish_reason: &str) -> Value {
    let content = match text {
        Some(text) => Value::String(text),
        None if tool_calls.is_empty() => Value::String(String::new()),
        None => Value::Null,
    };
    let mut message = json!({"role": "assistant", "content": content});
    if !tool_calls.is_empty()
        && let Some(m) = message.as_object_mut()
    {
        m.insert("tool_calls".into(), Value::Array(tool_calls));
    }
    json!({"index": index, "message": message, "logprobs": null, "finish_reason": finish_reason})
}

/// A `chat.completion` without the stamp ([`crate::answer::finish`] adds it).
pub(super) fn completion(choices: Vec<Value>) -> Value {
    json!({"object": "chat.completion", "choices": choices})
}

/// One stream chunk holding one choice.
pub(super) fn chunk(index: u64, delta: Value, finish_reason: Option<&str>) -> Value {
    json!({"choices": [{"index": index, "delta": delta, "finish_reason": finish_reason}]})
}

/// The JSON object an emulated JSON mode answer must be: the text itself, or
/// what a Markdown code fence around it holds. `None` when it is not a JSON
/// object (OpenAI's `json_object` mode promises an object).
pub(super) fn json_text(text: &str) -> Option<&str> {
    let trimmed = text.trim();
    let inner = trimmed
        .strip_prefix("```")
        .and_then(|rest| rest.strip_suffix("```"))
        .map(|rest| rest.strip_prefix("json").unwrap_or(rest).trim())
        .unwrap_or(trimmed);
    matches!(crate::json::dom::parse(inner), Ok(Value::Object(_))).then_some(inner)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::answer::Stamp;
    use crate::providers::StreamTranslator;
    use crate::request::parse;
    use crate::sse::tests::chunkings;
    use crate::stream::StreamRewriter;

    pub fn chat(body: Value) -> ParsedRequest {
        parse(Operation::Chat, body.to_string().as_bytes()).unwrap()
    }

    /// Replays `input` through a real [`StreamRewriter`] under every
    /// chunking and requires identical output; returns the `data:` payloads.
    pub fn replay(
        op: Operation,
        include_usage: bool,
        input: &[u8],
        translator: &dyn Fn() -> Box<dyn StreamTranslator>,
    ) -> Vec<String> {
        let mut reference: Option<Vec<u8>> = None;
        for chunks in chunkings(input) {
            let stamp = Stamp {
                op,
                id: "chatcmpl_ID".into(),
                model: "p/m".into(),
                created: 42,
            };
            let mut r = StreamRewriter::new(translator(), stamp, include_usage);
            let mut out = Vec::new();
            for c in &chunks {
                r.push(c, &mut out);
            }
            r.finish(&mut out);
            match &reference {
                None => reference = Some(out),
                Some(prev) => assert_eq!(
                    String::from_utf8_lossy(&out),
                    String::from_utf8_lossy(prev),
                    "chunking {:?} differs",
                    chunks.iter().map(|c| c.len()).collect::<Vec<_>>()
                ),
            }
        }
        let out = String::from_utf8(reference.unwrap()).unwrap();
        assert!(out.ends_with("\n\n"), "{out}");
        out.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap().to_string())
            .collect()
    }

    /// The payloads as JSON, `[DONE]` left out.
    pub fn chunks(events: &[String]) -> Vec<Value> {
        events
            .iter()
            .filter(|e| *e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }

    /// The text a client assembles from the deltas of choice 0.
    pub fn streamed_text(chunks: &[Value]) -> String {
        chunks
            .iter()
            .filter_map(|c| c.pointer("/choices/0/delta/content").and_then(Value::as_str))
            .collect()
    }

    /// The tool calls a client assembles from the deltas (as the OpenAI SDK
    /// does: by `index`, arguments concatenated).
    pub fn streamed_tool_calls(chunks: &[Value]) -> Vec<Value> {
        let mut calls: Vec<Value> = Vec::new();
        for c in chunks {
            let Some(deltas) = c.pointer("/choices/0/delta/tool_calls").and_then(Value::as_array) else {
                continue;
            };
            for d in deltas {
                let i = d["index"].as_u64().unwrap() as usize;
                if calls.len() <= i {
                    assert_eq!(calls.len(), i, "tool call indexes must grow by one: {d}");
                    assert!(
                        d["id"].is_string() && d["function"]["name"].is_string(),
                        "first delta: {d}"
                    );
                    calls.push(json!({"id": d["id"], "name": d["function"]["name"], "arguments": ""}));
                }
                let piece = d["function"]["arguments"].as_str().unwrap_or("");
                let args = format!("{}{piece}", calls[i]["arguments"].as_str().unwrap());
                calls[i]["arguments"] = json!(args);
            }
        }
        calls
    }

    #[test]
    fn legacy_prompt_is_one_user_message() {
        let req = parse(Operation::Completions, br#"{"model":"a/b","prompt":"Say hi"}"#).unwrap();
        assert_eq!(messages(&req).unwrap(), vec![Message::User(vec![Part::Text("Say hi")])]);
    }

    #[test]
    fn tool_messages_learn_their_function_name_from_the_latest_call() {
        let req = chat(json!({"model": "a/b", "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "first", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "1"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "second", "arguments": ""}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "2"}]},
            {"role": "tool", "tool_call_id": "nobody", "content": "3"},
        ]}));
        let m = messages(&req).unwrap();
        let names: Vec<Option<&str>> = m
            .iter()
            .filter_map(|m| match m {
                Message::Tool { name, .. } => Some(*name),
                _ => None,
            })
            .collect();
        assert_eq!(names, vec![Some("first"), Some("second"), None]);
    }

    #[test]
    fn images_are_data_or_http_urls() {
        let req = chat(json!({"model": "a/b", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is it"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg", "detail": "low"}},
        ]}]}));
        let Message::User(p) = &messages(&req).unwrap()[0] else {
            panic!()
        };
        assert_eq!(
            p[1],
            Part::Image {
                source: ImageSource::Inline {
                    media_type: "image/png",
                    data: "iVBORw0KGgo="
                },
                param: "messages.0.content.1.image_url.url".into()
            }
        );
        assert!(matches!(
            p[2],
            Part::Image {
                source: ImageSource::Url("https://example.com/cat.jpg"),
                ..
            }
        ));
        for bad in ["ftp://x/y.png", "data:image/svg+xml,%3Csvg%3E", "data:;base64,AAAA"] {
            let req = chat(json!({"model": "a/b", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": bad}}]}]}));
            let e = messages(&req).unwrap_err();
            assert_eq!(
                (e.status, e.code.as_str(), e.param.as_deref()),
                (400, "invalid_value", Some("messages.0.content.0.image_url.url")),
                "{bad}"
            );
        }
    }

    #[test]
    fn tool_call_arguments_must_be_a_json_object() {
        let req = chat(json!({"model": "a/b", "messages": [
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]}));
        let e = messages(&req).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages.0.tool_calls.0.function.arguments"));
    }

    #[test]
    fn tools_and_tool_choice_are_checked() {
        let body = chat(json!({"model": "a/b", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}}));
        let body = body.body().unwrap();
        assert_eq!(tools(body).unwrap()[0].name, "f");
        assert_eq!(tool_choice(body).unwrap(), Some(ToolChoice::Named("f")));
        let body = chat(json!({"model": "a/b", "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "web_search"}], "tool_choice": "sometimes"}));
        let body = body.body().unwrap();
        assert_eq!(tools(body).unwrap_err().param.as_deref(), Some("tools.0.type"));
        assert_eq!(tool_choice(body).unwrap_err().param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn json_text_accepts_a_fenced_object() {
        assert_eq!(json_text(" {\"a\":1}\n"), Some("{\"a\":1}"));
        assert_eq!(json_text("```json\n{\"a\":1}\n```"), Some("{\"a\":1}"));
        assert_eq!(json_text("Sure! {\"a\":1}"), None);
        assert_eq!(json_text("[1]"), None);
    }
}
