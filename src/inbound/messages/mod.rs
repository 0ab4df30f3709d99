//! Anthropic's Messages API in (`POST /messages`), over the chat form
//! (docs/contract.md "The Messages API"). An Anthropic provider gets the
//! request as it came instead (`providers::anthropic::native_request`, with
//! [`Asked`]'s body and headers).
//!
//! - [`to_chat`]: a Messages request becomes a chat request. `system` (a
//!   string or text blocks) and `system`-role turns become system messages;
//!   `text` and `image` blocks become parts; an assistant's `tool_use`
//!   blocks become its `tool_calls` and a user's `tool_result` blocks `tool`
//!   messages (an error result's text marked `Error: `); custom `tools`,
//!   `tool_choice`, `stop_sequences`, `metadata.user_id` and the effort take
//!   chat's names. Earlier turns' `thinking` blocks are dropped: chat has no
//!   place for them, and their signatures are Anthropic's alone.
//!   `cache_control` markers are dropped too: only Anthropic reads them.
//!   A server tool (`web_search`, `bash`, ...), a block chat cannot carry
//!   (`document`, `search_result`, a server tool's blocks) or an unknown
//!   field makes the request untranslatable ([`Asked::untranslatable`]):
//!   only an Anthropic provider may serve it, and without one it is a 400
//!   naming the field, before any provider is asked.
//! - [`to_message`]: the finished `chat.completion` becomes a `message`.
//! - [`stream::MessagesStream`]: the finished chat stream becomes Anthropic's
//!   event sequence.
//! - [`error_body`]: errors in Anthropic's envelope, on this endpoint.

pub mod stream;

use serde_json::{Map, Value, json};

use super::{chat_body, read_object};
use crate::answer::Stamp;
use crate::errors::{ApiError, ErrorType, Header};
use crate::request::{bad_value, missing, wrong_type};

/// Fields accepted with nothing to send over chat: the provider's own
/// server features (context editing, containers, MCP servers it connects
/// to) and account settings, which a chat provider has no use for.
const ACCEPTED: [&str; 5] = [
    "context_management",
    "service_tier",
    "container",
    "anthropic_version",
    "inference_geo",
];

/// Fields copied to the chat request under the same name.
const SAME_NAME: [&str; 4] = ["model", "temperature", "top_p", "max_tokens"];

/// The client's request as it came, for a provider that speaks the
/// Messages API itself (`providers::anthropic::native_request`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Asked {
    /// The body as the client sent it.
    pub body: Vec<u8>,
    /// The client's `anthropic-version` and `anthropic-beta`.
    pub headers: Vec<Header>,
    /// Why the request cannot be translated for another provider's API,
    /// when it cannot.
    pub untranslatable: Option<ApiError>,
    /// `top_k`, which chat has no member for: given to a translated provider
    /// that has it ([`crate::inbound::Client::carry_over`]).
    pub top_k: Option<u64>,
}

/// A Messages request as a chat request's body. `routing_field` is copied.
///
/// What only chat cannot carry (a block, a server tool, a field waygate does
/// not know) is no error yet: an Anthropic provider takes the request as it
/// came. The chat request is then the request's routing members alone, and
/// [`Asked::untranslatable`] says why no other provider may be asked.
pub fn to_chat(body: &[u8], routing_field: &str) -> Result<(Vec<u8>, Asked), ApiError> {
    let request = read_object(body)?;
    if request.get("max_tokens").is_none_or(Value::is_null) {
        return Err(missing("max_tokens"));
    }
    let (chat, mut asked) = match translate(&request, routing_field) {
        Ok(translated) => translated,
        Err(e) if ["unsupported_parameter", "unknown_parameter"].contains(&e.code.as_str()) => {
            let mut chat = Map::new();
            for name in ["model", "max_tokens", "stream", routing_field] {
                if let Some(value) = request.get(name) {
                    chat.insert(name.to_string(), value.clone());
                }
            }
            chat.insert("messages".into(), json!([{"role": "user", "content": ""}]));
            let chat = chat_body(chat)?;
            let asked = Asked {
                untranslatable: Some(e),
                ..Asked::default()
            };
            (chat, asked)
        }
        Err(e) => return Err(e),
    };
    asked.body = body.to_vec();
    Ok((chat, asked))
}

/// A `count_tokens` request, and the filter's estimate of its count for when
/// no provider that counts may be asked.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    /// The request as the client sent it (no `max_tokens`), for a provider
    /// that counts in its own API, Anthropic.
    pub asked: Asked,
    /// `{"input_tokens": N}`: a token for every four bytes of the request's
    /// system prompt, messages and tools as JSON, at least 1.
    pub estimate: Value,
}

/// A `count_tokens` request (a Messages request without `max_tokens`), checked
/// as a Messages request: its chat form (the model, and what a provider that
/// counts in another API reads), and what its count needs.
pub fn count_request(body: &[u8], routing_field: &str) -> Result<(Vec<u8>, Counted), ApiError> {
    let mut request = read_object(body)?;
    request.entry("max_tokens").or_insert_with(|| 1.into());
    let with_max = chat_body(request.clone())?;
    let (chat, mut asked) = to_chat(&with_max, routing_field)?;
    asked.body = body.to_vec();
    let estimate = count_tokens(&request);
    Ok((chat, Counted { asked, estimate }))
}

fn translate(request: &Map<String, Value>, routing_field: &str) -> Result<(Vec<u8>, Asked), ApiError> {
    let mut chat = Map::new();
    let mut asked = Asked::default();
    let mut messages: Vec<Value> = Vec::new();
    let mut stream = false;
    match request.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => messages.push(json!({"role": "system", "content": text})),
        Some(Value::Array(blocks)) => {
            let text = text_blocks(blocks, "system")?;
            messages.push(json!({"role": "system", "content": text}));
        }
        Some(_) => return Err(wrong_type("system", "a string or an array of text blocks")),
    }
    for (name, value) in request {
        if value.is_null() {
            continue;
        }
        match name.as_str() {
            "messages" | "system" => {}
            "stream" => {
                stream = value.as_bool().ok_or_else(|| wrong_type("stream", "a boolean"))?;
                chat.insert("stream".into(), value.clone());
            }
            "top_k" => {
                asked.top_k = Some(
                    value
                        .as_u64()
                        .ok_or_else(|| wrong_type("top_k", "a non-negative integer"))?,
                );
            }
            "stop_sequences" => {
                let Value::Array(stops) = value else {
                    return Err(wrong_type("stop_sequences", "an array of strings"));
                };
                if let Some(i) = stops.iter().position(|stop| !stop.is_string()) {
                    return Err(wrong_type(&format!("stop_sequences.{i}"), "a string"));
                }
                chat.insert("stop".into(), value.clone());
            }
            "metadata" => {
                if let Some(user) = value.get("user_id").and_then(Value::as_str) {
                    chat.insert("user".into(), user.into());
                }
            }
            "tools" => {
                chat.insert("tools".into(), tools(value)?);
            }
            "tool_choice" => tool_choice(value, &mut chat)?,
            "thinking" => thinking(value, &mut chat)?,
            "output_config" => {
                if let Some(effort) = value.get("effort").and_then(Value::as_str) {
                    // Chat's efforts stop at high.
                    let effort = if effort == "max" { "high" } else { effort };
                    chat.insert("reasoning_effort".into(), effort.into());
                }
                if value.get("format").is_some_and(|f| !f.is_null()) {
                    return Err(not_served(
                        "output_config.format",
                        "structured outputs are not served here",
                    ));
                }
            }
            name if name == routing_field || SAME_NAME.contains(&name) => {
                chat.insert(name.to_string(), value.clone());
            }
            name if ACCEPTED.contains(&name) => {}
            "mcp_servers" => {
                return Err(not_served(
                    "mcp_servers",
                    "MCP servers are connected by Anthropic's API only",
                ));
            }
            name => {
                return Err(ApiError::bad_request(
                    "unknown_parameter",
                    name,
                    format!("{name}: Extra inputs are not permitted"),
                ));
            }
        }
    }
    match request.get("messages") {
        Some(Value::Array(turns)) => turns_to_messages(turns, &mut messages)?,
        None | Some(Value::Null) => return Err(missing("messages")),
        Some(_) => return Err(wrong_type("messages", "an array")),
    }
    chat.insert("messages".into(), Value::Array(messages));
    if stream {
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let body = chat_body(chat)?;
    Ok((body, asked))
}

fn not_served(param: &str, why: &str) -> ApiError {
    ApiError::bad_request(
        "unsupported_parameter",
        param,
        format!("{param}: not supported: {why}."),
    )
}

/// Text blocks joined (a system prompt, a tool's result).
fn text_blocks(blocks: &[Value], at: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (i, block) in blocks.iter().enumerate() {
        let at = format!("{at}.{i}");
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(
                block
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| missing(&format!("{at}.text")))?,
            ),
            Some(other) => {
                return Err(not_served(
                    &format!("{at}.type"),
                    &format!("'{other}' blocks cannot be carried here; only text"),
                ));
            }
            None => return Err(missing(&format!("{at}.type"))),
        }
    }
    Ok(text)
}

/// The conversation's turns as chat messages.
fn turns_to_messages(turns: &[Value], messages: &mut Vec<Value>) -> Result<(), ApiError> {
    for (i, turn) in turns.iter().enumerate() {
        let at = format!("messages.{i}");
        let Value::Object(turn) = turn else {
            return Err(wrong_type(&at, "an object"));
        };
        let role = match turn.get("role") {
            Some(Value::String(role)) if ["user", "assistant", "system"].contains(&role.as_str()) => role.as_str(),
            Some(Value::String(_)) => return Err(bad_value(&format!("{at}.role"), "must be 'user' or 'assistant'")),
            _ => return Err(missing(&format!("{at}.role"))),
        };
        let blocks = match turn.get("content") {
            Some(Value::String(text)) => {
                messages.push(json!({"role": role, "content": text}));
                continue;
            }
            Some(Value::Array(blocks)) => blocks,
            _ => return Err(wrong_type(&format!("{at}.content"), "a string or an array of blocks")),
        };
        let at = format!("{at}.content");
        match role {
            "assistant" => messages.push(assistant_turn(blocks, &at)?),
            "system" => messages.push(json!({"role": "system", "content": text_blocks(blocks, &at)?})),
            _ => user_turn(blocks, &at, messages)?,
        }
    }
    Ok(())
}

/// An assistant turn: its text, and its `tool_use` blocks as tool calls.
fn assistant_turn(blocks: &[Value], at: &str) -> Result<Value, ApiError> {
    let mut text = String::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.{j}");
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or_default()),
            Some("tool_use") => {
                let field = |name: &str| {
                    block
                        .get(name)
                        .and_then(Value::as_str)
                        .ok_or_else(|| missing(&format!("{at}.{name}")))
                };
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({"id": field("id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": input.to_string()}}));
            }
            // Only Anthropic reads an earlier turn's thinking (it is signed).
            Some("thinking" | "redacted_thinking") => {}
            Some(other) => return Err(block_not_served(&at, other)),
            None => return Err(missing(&format!("{at}.type"))),
        }
    }
    let mut message = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) }});
    if !calls.is_empty()
        && let Some(map) = message.as_object_mut()
    {
        map.insert("tool_calls".into(), Value::Array(calls));
    }
    Ok(message)
}

/// A user turn: `tool` messages for its tool results first (chat wants them
/// right after the calls), then its text and images.
fn user_turn(blocks: &[Value], at: &str, messages: &mut Vec<Value>) -> Result<(), ApiError> {
    let mut parts = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.{j}");
        match block.get("type").and_then(Value::as_str) {
            Some("text") => parts
                .push(json!({"type": "text", "text": block.get("text").and_then(Value::as_str).unwrap_or_default()})),
            Some("image") => parts.push(image(block, &at)?),
            Some("tool_result") => {
                let id = block
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| missing(&format!("{at}.tool_use_id")))?;
                let mut text = match block.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(text)) => text.clone(),
                    Some(Value::Array(inner)) => text_blocks(inner, &format!("{at}.content"))?,
                    Some(_) => return Err(wrong_type(&format!("{at}.content"), "a string or an array of blocks")),
                };
                if block.get("is_error").and_then(Value::as_bool) == Some(true) {
                    // Chat has no error flag on a tool's result: the text says it.
                    text.insert_str(0, "Error: ");
                }
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": text}));
            }
            Some(other) => return Err(block_not_served(&at, other)),
            None => return Err(missing(&format!("{at}.type"))),
        }
    }
    if !parts.is_empty() {
        messages.push(json!({"role": "user", "content": parts}));
    }
    Ok(())
}

fn block_not_served(at: &str, kind: &str) -> ApiError {
    not_served(
        &format!("{at}.type"),
        &format!("'{kind}' blocks cannot be carried to this provider"),
    )
}

/// An `image` block as an `image_url` part (a data URL for base64).
fn image(block: &Value, at: &str) -> Result<Value, ApiError> {
    let source = block.get("source").ok_or_else(|| missing(&format!("{at}.source")))?;
    let url = match source.get("type").and_then(Value::as_str) {
        Some("base64") => {
            let media = source
                .get("media_type")
                .and_then(Value::as_str)
                .ok_or_else(|| missing(&format!("{at}.source.media_type")))?;
            let data = source
                .get("data")
                .and_then(Value::as_str)
                .ok_or_else(|| missing(&format!("{at}.source.data")))?;
            format!("data:{media};base64,{data}")
        }
        Some("url") => source
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| missing(&format!("{at}.source.url")))?
            .to_string(),
        _ => {
            return Err(not_served(
                &format!("{at}.source.type"),
                "images are served as base64 or a URL",
            ));
        }
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// Custom tools as chat functions; a server tool (it has a `type` of its
/// own) runs on Anthropic's side.
fn tools(value: &Value) -> Result<Value, ApiError> {
    let Value::Array(tools) = value else {
        return Err(wrong_type("tools", "an array"));
    };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools.{i}");
        match tool.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                return Err(not_served(
                    &format!("{at}.type"),
                    &format!("'{other}' is a tool Anthropic's API runs; custom tools only"),
                ));
            }
        }
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| missing(&format!("{at}.name")))?;
        let mut function = json!({"name": name, "parameters": tool.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object"}))});
        if let (Some(description), Some(map)) = (
            tool.get("description").filter(|d| d.is_string()),
            function.as_object_mut(),
        ) {
            map.insert("description".into(), description.clone());
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok(Value::Array(out))
}

fn tool_choice(value: &Value, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    let choice = match value.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = value
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| missing("tool_choice.name"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(bad_value("tool_choice.type", "must be 'auto', 'any', 'tool' or 'none'")),
    };
    chat.insert("tool_choice".into(), choice);
    if let Some(disable) = value.get("disable_parallel_tool_use").and_then(Value::as_bool) {
        chat.insert("parallel_tool_calls".into(), (!disable).into());
    }
    Ok(())
}

/// `thinking` as an effort: a budget's size, or the model's own choice.
fn thinking(value: &Value, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    let effort = match value.get("type").and_then(Value::as_str) {
        Some("enabled") => match value.get("budget_tokens").and_then(Value::as_u64) {
            Some(budget) if budget < 4096 => "low",
            Some(budget) if budget < 16384 => "medium",
            Some(_) => "high",
            None => return Err(missing("thinking.budget_tokens")),
        },
        // Adaptive thinking leaves the effort to the model (or output_config.effort).
        Some("disabled" | "adaptive") => return Ok(()),
        _ => {
            return Err(bad_value(
                "thinking.type",
                "must be 'enabled', 'adaptive' or 'disabled'",
            ));
        }
    };
    chat.entry("reasoning_effort").or_insert_with(|| effort.into());
    Ok(())
}

/// `count_tokens`' answer: an estimate, a token for every four bytes of the
/// request's system prompt, messages and tools as JSON (the rule of thumb
/// for English text and code), at least one.
fn count_tokens(request: &Map<String, Value>) -> Value {
    let bytes: usize = ["system", "messages", "tools"]
        .iter()
        .filter_map(|field| request.get(*field))
        .map(|v| v.to_string().len())
        .sum();
    json!({"input_tokens": bytes.div_ceil(4).max(1)})
}

// ---- the answer ----------------------------------------------------------------

/// Anthropic's `stop_reason` for chat's `finish_reason`.
fn stop_reason(finish_reason: Option<&str>) -> &'static str {
    match finish_reason {
        Some("length") => "max_tokens",
        Some("tool_calls") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    }
}

/// Anthropic's `usage` from chat's.
fn usage(chat: Option<&Value>) -> Value {
    let count = |pointer: &str| {
        chat.and_then(|u| u.pointer(pointer))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let cached = count("/prompt_tokens_details/cached_tokens");
    json!({
        // Anthropic counts cached tokens apart from the rest of the input.
        "input_tokens": count("/prompt_tokens").saturating_sub(cached),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": count("/completion_tokens"),
    })
}

/// A tool call's arguments as the `input` object (an empty object when a
/// provider's were not one).
fn input_of(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(input)) => Value::Object(input),
        _ => json!({}),
    }
}

/// The finished `chat.completion` (already stamped) as a `message`.
pub fn to_message(_asked: &Asked, stamp: &Stamp, chat: &[u8]) -> Result<Vec<u8>, String> {
    let chat: Value = crate::json::from_bytes(chat).map_err(|e| e.to_string())?;
    let choice = chat.pointer("/choices/0").ok_or("the answer has no choice")?;
    let message = choice.get("message").ok_or("the answer's choice has no message")?;
    let mut content = Vec::new();
    let thoughts = message
        .get("reasoning_content")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !thoughts.is_empty() {
        // Unsigned: only Anthropic signs its thinking (and an Anthropic
        // provider never gets such a block back: providers::anthropic::native).
        content.push(json!({"type": "thinking", "thinking": thoughts, "signature": ""}));
    }
    let text = message.get("content").and_then(Value::as_str).unwrap_or_default();
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    let calls = message.get("tool_calls").and_then(Value::as_array).map(Vec::as_slice);
    for call in calls.unwrap_or_default() {
        let field = |pointer: &str| call.pointer(pointer).and_then(Value::as_str).unwrap_or_default();
        content.push(
            json!({"type": "tool_use", "id": field("/id"), "name": field("/function/name"),
            "input": input_of(field("/function/arguments"))}),
        );
    }
    let answer = json!({
        "id": stamp.id,
        "type": "message",
        "role": "assistant",
        "model": stamp.model,
        "content": content,
        "stop_reason": stop_reason(choice.get("finish_reason").and_then(Value::as_str)),
        "stop_sequence": null,
        "usage": usage(chat.get("usage")),
    });
    serde_json::to_vec(&answer).map_err(|e| e.to_string())
}

/// Anthropic's error `type` for an error of the filter's.
fn error_type(e: &ApiError) -> &'static str {
    match (e.status, e.kind) {
        (404, _) => "not_found_error",
        (413, _) => "request_too_large",
        (529, _) => "overloaded_error",
        (_, ErrorType::InvalidRequest) => "invalid_request_error",
        (_, ErrorType::Authentication) => "authentication_error",
        (_, ErrorType::Permission) => "permission_error",
        (_, ErrorType::RateLimit) => "rate_limit_error",
        (_, ErrorType::Upstream) => "api_error",
    }
}

/// An error in Anthropic's envelope: `{"type":"error","error":{"type","message"}}`.
/// The message says the field and the filter's code, which the envelope has
/// no place for.
pub fn error_value(e: &ApiError) -> Value {
    let message = match &e.param {
        Some(param) if !e.message.contains(param.as_str()) => format!("{param}: {} ({})", e.message, e.code),
        _ => format!("{} ({})", e.message, e.code),
    };
    json!({"type": "error", "error": {"type": error_type(e), "message": message}})
}

pub fn error_body(e: &ApiError) -> Vec<u8> {
    serde_json::to_vec(&error_value(e)).unwrap_or_default()
}

#[cfg(test)]
mod tests;
