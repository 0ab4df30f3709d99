//! Fake Anthropic Messages API: `POST /v1/messages`, JSON and SSE, and
//! `POST /v1/messages/count_tokens` (the input tokens a message would report).
//!
//! Shapes follow `tests/fixtures/anthropic/` (recorded api.anthropic.com traffic): a
//! `message` object; a stream of `message_start`, `content_block_start`, `ping`,
//! `content_block_delta` (`text_delta` / `input_json_delta`), `content_block_stop`,
//! `message_delta` (stop_reason + usage), `message_stop`; errors as
//! `{"type":"error","error":{"type","message"},"request_id"}`. Requests are checked like
//! the real API: `x-api-key`, `anthropic-version`, required `model` / `max_tokens` /
//! `messages`, no extra fields, roles, block shapes, tool_use / tool_result pairing.

mod validate;

use serde_json::{Map, Value, json};

use super::answer::{self, Answer, Ask, Content, Finish, ToolChoice, ToolDecl, random_id};
use super::reply::Reply;
use super::steer::{self, Directive};
use super::{ANTHROPIC_KEY, RecordedRequest};

const SSE: &str = "text/event-stream; charset=utf-8";
type Checked = Result<(), Reply>;

/// Answers one request under `/v1/messages`.
pub(crate) fn handle(req: &RecordedRequest) -> Reply {
    let counting = match req.path_only() {
        "/v1/messages" => false,
        "/v1/messages/count_tokens" => true,
        _ => return error(404, "not_found_error", "Not Found"),
    };
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
        // 2026-10-21: what the Anthropic SDKs pinned in tests/clients send.
        Some("2023-06-01" | "2023-01-01" | "2026-10-21") => {}
        Some(other) => return invalid(&format!("anthropic-version: invalid version '{other}'")),
    }
    let body = match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(map)) => map,
        Ok(_) => {
            return invalid("Input should be a valid dictionary or object to extract fields from");
        }
        Err(e) => return invalid(&format!("There was an error parsing the body: {e}")),
    };
    // The beta Claude Code 2.1.332 sends, under which a turn may be a `system` one.
    let system_turns = req
        .header("anthropic-beta")
        .is_some_and(|betas| betas.split(',').any(|b| b.trim() == validate::PER_TURN_CONTROL));
    if counting {
        return count(body, system_turns);
    }
    match validate::validate(&body, system_turns) {
        Ok(()) => respond(req, &body),
        Err(reply) => reply,
    }
}

/// `count_tokens`: a Messages request without `max_tokens` or `stream`,
/// counted as [`respond`] counts a message's input tokens.
fn count(mut body: Map<String, Value>, system_turns: bool) -> Reply {
    for field in ["max_tokens", "stream", "stop_sequences", "temperature", "metadata"] {
        if body.contains_key(field) {
            return invalid(&format!("{field}: Extra inputs are not permitted"));
        }
    }
    body.insert("max_tokens".into(), 1.into());
    if let Err(reply) = validate::validate(&body, system_turns) {
        return reply;
    }
    let model = body.get("model").and_then(Value::as_str).unwrap_or_default();
    match steer::parse(model) {
        Directive::Status(code) => return status_error(code),
        Directive::Limited(seconds) => return status_error(429).replace_header("retry-after", &seconds.to_string()),
        _ => {}
    }
    Reply::json(200, &json!({"input_tokens": input_tokens(&body)}))
}

/// The input tokens of a request: a token a word of its system prompt and messages, at least 1.
fn input_tokens(body: &Map<String, Value>) -> u64 {
    let words = answer::input_words(body.get("system").unwrap_or(&Value::Null))
        + answer::input_words(body.get("messages").unwrap_or(&Value::Null));
    words.max(1) as u64
}

fn respond(req: &RecordedRequest, body: &Map<String, Value>) -> Reply {
    let model = body.get("model").and_then(Value::as_str).unwrap_or_default();
    let directive = steer::parse(model);
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    match directive {
        Directive::Status(code) => return status_error(code),
        Directive::Limited(seconds) => return status_error(429).replace_header("retry-after", &seconds.to_string()),
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
    let reply = reply
        .header("request-id", &request_id())
        .header("anthropic-organization-id", "fake-0000-4000-8000-organization");
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
