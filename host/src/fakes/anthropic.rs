//! Fake Anthropic Messages API: `POST /v1/messages`, JSON and SSE.
//!
//! Shapes follow `tests/fixtures/anthropic/` (recorded api.anthropic.com traffic): a
//! `message` object; a stream of `message_start`, `content_block_start`, `ping`,
//! `content_block_delta` (`text_delta` / `input_json_delta`), `content_block_stop`,
//! `message_delta` (stop_reason + usage), `message_stop`; errors as
//! `{"type":"error","error":{"type","message"},"request_id"}`. Requests are checked like
//! the real API: `x-api-key`, `anthropic-version`, required `model` / `max_tokens` /
//! `messages`, no extra fields, roles, block shapes, tool_use / tool_result pairing.

use serde_json::{Map, Value, json};

use super::answer::{self, Answer, Ask, Content, Finish, ToolChoice, ToolDecl, random_id};
use super::reply::Reply;
use super::steer::{self, Directive};
use super::{ANTHROPIC_KEY, RecordedRequest};

const SSE: &str = "text/event-stream; charset=utf-8";
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "metadata",
    "thinking",
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
];
const BLOCK_TYPES: &[&str] = &[
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "search_result",
    "server_tool_use",
    "web_search_tool_result",
];
const MEDIA_TYPES: &[&str] = &["image/jpeg", "image/png", "image/gif", "image/webp"];

type Checked = Result<(), Reply>;

/// Answers one request under `/v1/messages`.
pub(crate) fn handle(req: &RecordedRequest) -> Reply {
    if req.path_only() != "/v1/messages" {
        return error(404, "not_found_error", "Not Found");
    }
    if req.method != "POST" {
        return error(405, "invalid_request_error", "Method Not Allowed");
    }
    match req.header("x-api-key") {
        None => return error(401, "authentication_error", "x-api-key header is required"),
        Some(key) if key != ANTHROPIC_KEY => {
            return error(401, "authentication_error", "invalid x-api-key");
        }
        Some(_) => {}
    }
    match req.header("anthropic-version") {
        None => return invalid("anthropic-version: header is required"),
        Some("2023-06-01" | "2023-01-01") => {}
        Some(other) => return invalid(&format!("anthropic-version: invalid version '{other}'")),
    }
    let body = match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(map)) => map,
        Ok(_) => {
            return invalid("Input should be a valid dictionary or object to extract fields from");
        }
        Err(e) => return invalid(&format!("There was an error parsing the body: {e}")),
    };
    match validate(&body) {
        Ok(()) => respond(req, &body),
        Err(reply) => reply,
    }
}

fn respond(req: &RecordedRequest, body: &Map<String, Value>) -> Reply {
    let model = body.get("model").and_then(Value::as_str).unwrap_or_default();
    let directive = steer::parse(model);
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    match directive {
        Directive::Status(code) => return status_error(code),
        Directive::Garbage => return garbage(stream),
        Directive::StreamError if !stream => return status_error(529),
        _ => {}
    }
    let ask = Ask {
        provider: "anthropic",
        directive,
        tools: tools(body),
        tool_choice: tool_choice(body),
        json_mode: false,
        max_tokens: body.get("max_tokens").and_then(Value::as_u64),
        input_words: answer::input_words(body.get("system").unwrap_or(&Value::Null))
            + answer::input_words(body.get("messages").unwrap_or(&Value::Null)),
        request: req,
    };
    let answer = answer::answer(&ask);
    let id = format!("msg_01{}", random_id(22));
    let reply = if stream {
        let mut events = stream_events(model, &id, &answer);
        if directive == Directive::StreamError {
            events.truncate(4);
            events.push(event(
                "error",
                &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ));
        }
        Reply::sse(SSE, events)
    } else {
        Reply::json(200, &message(model, &id, &answer))
    };
    let reply = reply.header("request-id", &request_id());
    match directive {
        Directive::Slow(ms) => reply.delayed(ms),
        Directive::Cut(n) => reply.cut(n),
        _ => reply,
    }
}

fn message(model: &str, id: &str, answer: &Answer) -> Value {
    let content: Vec<Value> = match &answer.content {
        Content::Text(t) => vec![json!({"type": "text", "text": t})],
        Content::Calls(calls) => calls
            .iter()
            .map(|c| json!({"type": "tool_use", "id": tool_id(), "name": c.name, "input": c.args}))
            .collect(),
    };
    json!({
        "model": model, "id": id, "type": "message", "role": "assistant", "content": content,
        "stop_reason": stop_reason(answer.finish), "stop_sequence": null,
        "usage": {"input_tokens": answer.input_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0, "output_tokens": answer.output_tokens, "service_tier": "standard"},
    })
}

fn stream_events(model: &str, id: &str, answer: &Answer) -> Vec<Vec<u8>> {
    let start = json!({"type": "message_start", "message": {
        "model": model, "id": id, "type": "message", "role": "assistant", "content": [],
        "stop_reason": null, "stop_sequence": null,
        "usage": {"input_tokens": answer.input_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0, "output_tokens": 1, "service_tier": "standard"}}});
    let mut events = vec![event("message_start", &start)];
    let blocks: Vec<(Value, Vec<Value>)> = match &answer.content {
        Content::Text(t) => {
            let deltas = answer::stream_pieces(t)
                .into_iter()
                .map(|p| json!({"type": "text_delta", "text": p}));
            vec![(json!({"type": "text", "text": ""}), deltas.collect())]
        }
        Content::Calls(calls) => calls
            .iter()
            .map(|c| {
                let block = json!({"type": "tool_use", "id": tool_id(), "name": c.name, "input": {}});
                let pieces = std::iter::once(String::new()).chain(answer::chunks(&c.args.to_string(), 8));
                (
                    block,
                    pieces
                        .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                        .collect(),
                )
            })
            .collect(),
    };
    for (index, (block, deltas)) in blocks.into_iter().enumerate() {
        events.push(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        if index == 0 {
            events.push(b"event: ping\ndata: {\"type\": \"ping\"}\n\n".to_vec());
        }
        for delta in deltas {
            events.push(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push(event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }
    let delta = json!({"type": "message_delta",
        "delta": {"stop_reason": stop_reason(answer.finish), "stop_sequence": null},
        "usage": {"input_tokens": answer.input_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0, "output_tokens": answer.output_tokens}});
    events.push(event("message_delta", &delta));
    events.push(event("message_stop", &json!({"type": "message_stop"})));
    events
}

fn stop_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "end_turn",
        Finish::Length => "max_tokens",
        Finish::ToolCalls => "tool_use",
    }
}

fn tools(body: &Map<String, Value>) -> Vec<ToolDecl> {
    let declared = body.get("tools").and_then(Value::as_array).into_iter().flatten();
    declared
        .filter_map(|t| {
            let name = t.get("name")?.as_str()?.to_owned();
            let schema = t.get("input_schema")?.clone();
            Some(ToolDecl { name, schema })
        })
        .collect()
}

fn tool_choice(body: &Map<String, Value>) -> ToolChoice {
    let choice = body.get("tool_choice");
    match choice.and_then(|c| c.get("type")).and_then(Value::as_str) {
        Some("none") => ToolChoice::None,
        Some("any") => ToolChoice::Required,
        Some("tool") => choice
            .and_then(|c| c.get("name"))
            .and_then(Value::as_str)
            .map_or(ToolChoice::Required, |n| ToolChoice::Named(n.to_owned())),
        _ => ToolChoice::Auto,
    }
}

fn validate(body: &Map<String, Value>) -> Checked {
    if let Some(extra) = body.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(invalid(&format!("{extra}: Extra inputs are not permitted")));
    }
    match body.get("model") {
        None => return Err(invalid("model: Field required")),
        Some(Value::String(m)) if !m.is_empty() => {}
        Some(_) => return Err(invalid("model: Input should be a valid string")),
    }
    match body.get("max_tokens") {
        None => return Err(invalid("max_tokens: Field required")),
        Some(Value::Number(n)) if n.as_i64().is_some_and(|v| v >= 1) => {}
        Some(Value::Number(n)) if n.is_i64() => {
            return Err(invalid("max_tokens: Input should be greater than or equal to 1"));
        }
        Some(_) => return Err(invalid("max_tokens: Input should be a valid integer")),
    }
    let messages = match body.get("messages") {
        None => return Err(invalid("messages: Field required")),
        Some(Value::Array(m)) => m,
        Some(_) => return Err(invalid("messages: Input should be a valid list")),
    };
    if messages.is_empty() {
        return Err(invalid("messages: at least one message is required"));
    }
    let mut pending: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        pending = validate_message(i, m, &pending)?;
    }
    validate_system(body.get("system"))?;
    range(body, "temperature", 0.0, 1.0)?;
    range(body, "top_p", 0.0, 1.0)?;
    if let Some(stop) = body.get("stop_sequences")
        && !stop.as_array().is_some_and(|s| s.iter().all(Value::is_string))
    {
        return Err(invalid("stop_sequences: Input should be a valid list of strings"));
    }
    if body.get("stream").is_some_and(|s| !s.is_boolean()) {
        return Err(invalid("stream: Input should be a valid boolean"));
    }
    if let Some(meta) = body.get("metadata") {
        let Some(meta) = meta.as_object() else {
            return Err(invalid("metadata: Input should be a valid dictionary"));
        };
        if let Some(extra) = meta.keys().find(|k| *k != "user_id") {
            return Err(invalid(&format!("metadata.{extra}: Extra inputs are not permitted")));
        }
    }
    validate_tools(body)
}

/// Checks one message; returns the `tool_use` ids it leaves waiting for results.
fn validate_message(i: usize, m: &Value, pending: &[String]) -> Result<Vec<String>, Reply> {
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        None if m.get("role").is_none() => {
            return Err(invalid(&format!("messages.{i}.role: Field required")));
        }
        _ => {
            return Err(invalid(&format!(
                "messages.{i}.role: Input should be 'user' or 'assistant'"
            )));
        }
    };
    let blocks: Vec<Value> = match m.get("content") {
        None => return Err(invalid(&format!("messages.{i}.content: Field required"))),
        Some(Value::String(s)) if s.trim().is_empty() => {
            return Err(invalid("messages: text content blocks must be non-empty"));
        }
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(b)) => b.clone(),
        Some(_) => {
            return Err(invalid(&format!("messages.{i}.content: Input should be a valid list")));
        }
    };
    if blocks.is_empty() {
        return Err(invalid(&format!(
            "messages.{i}.content: List should have at least 1 item after validation, not 0"
        )));
    }
    let mut results = Vec::new();
    let mut uses = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("messages.{i}.content.{j}");
        let kind = match block.get("type").and_then(Value::as_str) {
            Some(k) if BLOCK_TYPES.contains(&k) => k,
            None => return Err(invalid(&format!("{at}.type: Field required"))),
            Some(k) => {
                return Err(invalid(&format!(
                    "{at}: Input tag '{k}' found using 'type' does not match any of the expected tags: {}",
                    quoted(BLOCK_TYPES)
                )));
            }
        };
        validate_block(&at, kind, block)?;
        match (kind, role) {
            ("tool_use", "assistant") => uses.push(str_field(block, "id")),
            ("tool_result", "user") => results.push((at, str_field(block, "tool_use_id"))),
            ("tool_use" | "tool_result", _) => {
                return Err(invalid(&format!(
                    "{at}: `{kind}` blocks are not allowed in `{role}` messages"
                )));
            }
            _ => {}
        }
    }
    for (at, id) in &results {
        if !pending.contains(id) {
            return Err(invalid(&format!(
                "{at}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
            )));
        }
    }
    let missing: Vec<&String> = pending
        .iter()
        .filter(|p| !results.iter().any(|(_, id)| id == *p))
        .collect();
    if !missing.is_empty() {
        let ids: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
        return Err(invalid(&format!(
            "messages.{}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
            i.saturating_sub(1),
            ids.join(", ")
        )));
    }
    Ok(uses)
}

fn validate_block(at: &str, kind: &str, block: &Value) -> Checked {
    match kind {
        "text" => match block.get("text").and_then(Value::as_str) {
            None => Err(invalid(&format!("{at}.text.text: Field required"))),
            Some(t) if t.trim().is_empty() => Err(invalid("messages: text content blocks must be non-empty")),
            Some(_) => Ok(()),
        },
        "image" => validate_image(at, block.get("source")),
        "tool_use" => {
            for field in ["id", "name"] {
                if block.get(field).and_then(Value::as_str).is_none() {
                    return Err(invalid(&format!("{at}.tool_use.{field}: Field required")));
                }
            }
            match block.get("input") {
                Some(Value::Object(_)) => Ok(()),
                None => Err(invalid(&format!("{at}.tool_use.input: Field required"))),
                Some(_) => Err(invalid(&format!(
                    "{at}.tool_use.input: Input should be a valid dictionary"
                ))),
            }
        }
        "tool_result" => match block.get("tool_use_id").and_then(Value::as_str) {
            None => Err(invalid(&format!("{at}.tool_result.tool_use_id: Field required"))),
            Some(_) => match block.get("content") {
                None | Some(Value::String(_) | Value::Array(_)) => Ok(()),
                Some(_) => Err(invalid(&format!(
                    "{at}.tool_result.content: Input should be a valid list"
                ))),
            },
        },
        _ => Ok(()),
    }
}

fn validate_image(at: &str, source: Option<&Value>) -> Checked {
    let Some(source) = source else {
        return Err(invalid(&format!("{at}.image.source: Field required")));
    };
    match source.get("type").and_then(Value::as_str) {
        Some("base64") => {
            let media = source.get("media_type").and_then(Value::as_str).unwrap_or_default();
            if !MEDIA_TYPES.contains(&media) {
                return Err(invalid(&format!(
                    "{at}.image.source.base64.media_type: Input should be 'image/jpeg', 'image/png', 'image/gif' or 'image/webp'"
                )));
            }
            match source.get("data").and_then(Value::as_str) {
                Some(d) if !d.is_empty() && !d.starts_with("data:") => Ok(()),
                _ => Err(invalid(&format!(
                    "{at}.image.source.base64.data: Input should be valid base64 image data"
                ))),
            }
        }
        Some("url") => match source.get("url").and_then(Value::as_str) {
            Some(u) if u.starts_with("https://") || u.starts_with("http://") => Ok(()),
            _ => Err(invalid(&format!("{at}.image.source.url.url: Field required"))),
        },
        _ => Err(invalid(&format!(
            "{at}.image.source: Input tag found using 'type' does not match any of the expected tags: 'base64', 'url', 'file'"
        ))),
    }
}

fn validate_system(system: Option<&Value>) -> Checked {
    match system {
        None | Some(Value::String(_)) => Ok(()),
        Some(Value::Array(blocks)) => {
            for (j, b) in blocks.iter().enumerate() {
                if b.get("type").and_then(Value::as_str) != Some("text") || !b.get("text").is_some_and(Value::is_string)
                {
                    return Err(invalid(&format!("system.{j}: Input should be a valid text block")));
                }
            }
            Ok(())
        }
        Some(_) => Err(invalid("system: Input should be a valid string")),
    }
}

fn validate_tools(body: &Map<String, Value>) -> Checked {
    let tools = match body.get("tools") {
        None => &Vec::new(),
        Some(Value::Array(t)) => t,
        Some(_) => return Err(invalid("tools: Input should be a valid list")),
    };
    for (i, tool) in tools.iter().enumerate() {
        if tool.get("type").and_then(Value::as_str).is_some_and(|t| t != "custom") {
            continue; // server tools (web_search_..., bash_...) have their own shapes
        }
        let name = tool.get("name").and_then(Value::as_str);
        let Some(name) = name else {
            return Err(invalid(&format!("tools.{i}.custom.name: Field required")));
        };
        if name.is_empty()
            || name.len() > 128
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(invalid(&format!(
                "tools.{i}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'"
            )));
        }
        match tool.get("input_schema") {
            None => {
                return Err(invalid(&format!("tools.{i}.custom.input_schema: Field required")));
            }
            Some(s) if s.get("type").and_then(Value::as_str) == Some("object") => {}
            Some(_) => {
                return Err(invalid(&format!(
                    "tools.{i}.custom.input_schema.type: Input should be 'object'"
                )));
            }
        }
    }
    let Some(choice) = body.get("tool_choice") else {
        return Ok(());
    };
    match choice.get("type").and_then(Value::as_str) {
        _ if !choice.is_object() => Err(invalid(
            "tool_choice: Input should be a valid dictionary or object to extract fields from",
        )),
        Some("auto" | "any" | "none") => Ok(()),
        Some("tool") if choice.get("name").is_some_and(Value::is_string) => Ok(()),
        Some("tool") => Err(invalid("tool_choice.tool.name: Field required")),
        _ => Err(invalid(
            "tool_choice: Input tag found using 'type' does not match any of the expected tags: 'auto', 'any', 'tool', 'none'",
        )),
    }
}

fn range(body: &Map<String, Value>, key: &str, min: f64, max: f64) -> Checked {
    match body.get(key) {
        None => Ok(()),
        Some(Value::Number(n)) => {
            let v = n.as_f64().unwrap_or(0.0);
            if v < min {
                Err(invalid(&format!(
                    "{key}: Input should be greater than or equal to {min}"
                )))
            } else if v > max {
                Err(invalid(&format!("{key}: Input should be less than or equal to {max}")))
            } else {
                Ok(())
            }
        }
        Some(_) => Err(invalid(&format!("{key}: Input should be a valid number"))),
    }
}

fn status_error(code: u16) -> Reply {
    let (kind, message) = match code {
        400 => (
            "invalid_request_error",
            "The fake provider was asked to refuse this request.",
        ),
        401 => ("authentication_error", "invalid x-api-key"),
        402 => (
            "billing_error",
            "Your credit balance is too low to access the Anthropic API.",
        ),
        403 => (
            "permission_error",
            "Your API key does not have permission to use the specified resource.",
        ),
        404 => ("not_found_error", "The requested resource could not be found."),
        413 => (
            "request_too_large",
            "Request exceeds the maximum allowed number of bytes.",
        ),
        429 => (
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit.",
        ),
        504 => ("timeout_error", "Request timed out."),
        529 => ("overloaded_error", "Overloaded"),
        500..=599 => ("api_error", "Internal server error"),
        _ => (
            "invalid_request_error",
            "The fake provider was asked to fail with this status.",
        ),
    };
    let reply = error(code, kind, message);
    if code == 429 {
        reply.header("retry-after", "7")
    } else {
        reply
    }
}

fn garbage(stream: bool) -> Reply {
    if stream {
        let events = vec![
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\n\n".to_vec(),
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n".to_vec(),
        ];
        Reply::sse(SSE, events)
    } else {
        let broken = b"{\"id\":\"msg_garbage\",\"type\":\"message\",\"content\":[{\"type\":\"text\",\"text\":\"Hel";
        Reply::bytes(200, "application/json", broken.to_vec())
    }
}

fn str_field(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn quoted(items: &[&str]) -> String {
    items.iter().map(|i| format!("'{i}'")).collect::<Vec<_>>().join(", ")
}

fn invalid(message: &str) -> Reply {
    error(400, "invalid_request_error", message)
}

fn error(status: u16, kind: &str, message: &str) -> Reply {
    let id = request_id();
    let body = json!({"type": "error", "error": {"type": kind, "message": message}, "request_id": id});
    Reply::json(status, &body).header("request-id", &id)
}

fn event(name: &str, data: &Value) -> Vec<u8> {
    format!("event: {name}\ndata: {data}\n\n").into_bytes()
}

fn tool_id() -> String {
    format!("toolu_01{}", random_id(22))
}

fn request_id() -> String {
    format!("req_011C{}", random_id(20))
}
