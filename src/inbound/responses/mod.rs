//! OpenAI's Responses API in (`POST /responses`), stateless, over the chat
//! form (docs/contract.md "The Responses API"). A provider that serves the
//! Responses API itself (`responses: true`) gets the request as it came
//! instead (`providers::openai::responses_request`, with [`Echo`]'s body).
//!
//! - [`to_chat`]: a Responses request becomes a chat request. `instructions`
//!   and the `input` items become messages (a `function_call` item joins the
//!   assistant turn before it as a tool call, a `function_call_output` is a
//!   `tool` message), function tools and `tool_choice` take chat's shape,
//!   `text.format` becomes `response_format`, `reasoning.effort` becomes
//!   `reasoning_effort`. Reasoning items are dropped: chat has no place for
//!   them, and their encrypted content is only readable by OpenAI. What needs
//!   state the gateway does not keep (`previous_response_id`, `conversation`,
//!   a stored `prompt`, `background`, an `item_reference`), a tool run by
//!   the provider (`web_search`, `file_search`, ...) or an unknown field
//!   makes the request untranslatable ([`Echo::untranslatable`]): only a
//!   provider serving the Responses API may serve it, and without one it is
//!   a 400 naming the field (`unknown_parameter` for an unknown one, as
//!   OpenAI answers), before any provider is asked.
//! - [`to_response`]: the finished `chat.completion` becomes a `response`.
//! - [`stream::ResponsesStream`]: the finished chat stream becomes the
//!   Responses event sequence.
//!
//! The answer echoes the request's settings ([`Echo`]), as OpenAI's does.

pub mod stream;

use serde_json::{Map, Value, json};

use super::{chat_body, read_object};
use crate::answer::Stamp;
use crate::errors::ApiError;
use crate::request::{bad_value, missing, wrong_type};

/// Fields that need what a stateless gateway does not keep: earlier
/// responses, conversations, prompts stored with OpenAI, a response left
/// running after the request.
const STATEFUL: [&str; 4] = ["previous_response_id", "conversation", "prompt", "background"];

/// Fields accepted with nothing to do over chat: nothing is stored (the
/// answer says `"store": false`), nothing extra is included (no reasoning
/// is surfaced), and the rest are the client's bookkeeping or OpenAI's
/// account settings.
const ACCEPTED: [&str; 10] = [
    "store",
    "include",
    "metadata",
    "prompt_cache_key",
    "prompt_cache_retention",
    "client_metadata",
    "safety_identifier",
    "service_tier",
    "truncation",
    "stream_options",
];

/// Fields copied to the chat request under the same name.
const SAME_NAME: [&str; 5] = ["model", "temperature", "top_p", "parallel_tool_calls", "user"];

/// The request's settings a `response` object echoes.
const ECHOED: [&str; 11] = [
    "instructions",
    "max_output_tokens",
    "metadata",
    "parallel_tool_calls",
    "reasoning",
    "temperature",
    "text",
    "tool_choice",
    "tools",
    "top_p",
    "user",
];

/// What the answer echoes of the client's request, and the request as it
/// came for a provider that serves the Responses API itself.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Echo {
    settings: Map<String, Value>,
    /// Each function declared inside a `namespace` tool, and its namespace:
    /// a call to it says which.
    namespaces: Vec<(String, String)>,
    /// The body as the client sent it.
    pub body: Vec<u8>,
    /// Why the request cannot be translated to chat, when it cannot.
    pub untranslatable: Option<ApiError>,
}

/// A Responses request as a chat request's body, and what its answer echoes.
/// `routing_field` is copied as it came.
///
/// What only chat cannot carry (state the gateway does not keep, a tool the
/// provider runs, a field waygate does not know) is no error yet: a provider
/// that serves the Responses API takes the request as it came. The chat
/// request is then the request's routing members alone, and
/// [`Echo::untranslatable`] says why no other provider may be asked.
pub fn to_chat(body: &[u8], routing_field: &str) -> Result<(Vec<u8>, Echo), ApiError> {
    let request = read_object(body)?;
    let (chat, mut echo) = match translate(&request, routing_field) {
        Ok(translated) => translated,
        Err(e) if ["unsupported_parameter", "unknown_parameter"].contains(&e.code.as_str()) => {
            let mut chat = Map::new();
            for name in ["model", "stream", routing_field] {
                if let Some(value) = request.get(name).filter(|v| !v.is_null()) {
                    chat.insert(name.to_string(), value.clone());
                }
            }
            chat.insert("messages".into(), json!([{"role": "user", "content": ""}]));
            let echo = Echo {
                untranslatable: Some(e),
                ..Echo::default()
            };
            (chat_body(chat)?, echo)
        }
        Err(e) => return Err(e),
    };
    echo.body = body.to_vec();
    Ok((chat, echo))
}

fn translate(request: &Map<String, Value>, routing_field: &str) -> Result<(Vec<u8>, Echo), ApiError> {
    let mut chat = Map::new();
    let mut echo = Echo::default();
    let mut messages: Vec<Value> = Vec::new();
    let mut stream = false;
    if let Some(instructions) = request.get("instructions").filter(|v| !v.is_null()) {
        let Value::String(text) = instructions else {
            return Err(wrong_type("instructions", "a string"));
        };
        messages.push(json!({"role": "system", "content": text}));
    }
    for (name, value) in request {
        if value.is_null() {
            continue;
        }
        if ECHOED.contains(&name.as_str()) {
            echo.settings.insert(name.clone(), value.clone());
        }
        match name.as_str() {
            "input" | "instructions" => {}
            "stream" => {
                stream = value.as_bool().ok_or_else(|| wrong_type("stream", "a boolean"))?;
                chat.insert("stream".into(), value.clone());
            }
            "max_output_tokens" => {
                chat.insert("max_completion_tokens".into(), value.clone());
            }
            "tools" => {
                chat.insert("tools".into(), tools(value, &mut echo.namespaces)?);
            }
            "tool_choice" => {
                chat.insert("tool_choice".into(), tool_choice(value)?);
            }
            "text" => text(value, &mut chat)?,
            "reasoning" => {
                let effort = value.get("effort").filter(|e| !e.is_null());
                if let Some(effort) = effort {
                    chat.insert("reasoning_effort".into(), effort.clone());
                }
            }
            "background" if value == &Value::Bool(false) => {}
            name if name == routing_field || SAME_NAME.contains(&name) => {
                chat.insert(name.to_string(), value.clone());
            }
            name if STATEFUL.contains(&name) => return Err(stateful(name)),
            name if ACCEPTED.contains(&name) => {}
            name => {
                return Err(ApiError::bad_request(
                    "unknown_parameter",
                    name,
                    format!("Unknown parameter: '{name}'."),
                ));
            }
        }
    }
    match request.get("input") {
        None | Some(Value::Null) => return Err(missing("input")),
        Some(Value::String(text)) => messages.push(json!({"role": "user", "content": text})),
        Some(Value::Array(items)) => input_items(items, &mut messages)?,
        Some(_) => return Err(wrong_type("input", "a string or an array of items")),
    }
    chat.insert("messages".into(), Value::Array(messages));
    if stream {
        // The usage chunk ends the internal stream: `response.completed` carries it.
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }
    let body = chat_body(chat)?;
    Ok((body, echo))
}

/// 400 for what the internal form cannot carry, before a provider is asked.
fn not_served(param: &str, why: &str) -> ApiError {
    ApiError::bad_request(
        "unsupported_parameter",
        param,
        format!("'{param}' is not supported: {why}."),
    )
}

fn stateful(param: &str) -> ApiError {
    not_served(
        param,
        "waygate's Responses API is stateless (it stores no responses, conversations or prompts); \
         send the whole conversation in 'input'",
    )
}

/// The `input` items as chat messages, after `instructions`' system message.
fn input_items(items: &[Value], messages: &mut Vec<Value>) -> Result<(), ApiError> {
    for (i, item) in items.iter().enumerate() {
        let at = format!("input.{i}");
        let Value::Object(item) = item else {
            return Err(wrong_type(&at, "an object"));
        };
        // A message may leave out its type ("easy input message").
        let kind = match item.get("type") {
            None | Some(Value::Null) if item.contains_key("role") => "message",
            Some(Value::String(kind)) => kind.as_str(),
            None | Some(Value::Null) => return Err(missing(&format!("{at}.type"))),
            Some(_) => return Err(wrong_type(&format!("{at}.type"), "a string")),
        };
        match kind {
            "message" => messages.push(message(item, &at)?),
            "function_call" => {
                let call = json!({
                    "id": string(item, &at, "call_id")?,
                    "type": "function",
                    "function": {"name": string(item, &at, "name")?, "arguments": string(item, &at, "arguments")?},
                });
                join_tool_call(messages, call);
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(text)) => text.clone(),
                    Some(Value::Array(parts)) => text_of(parts, &format!("{at}.output"))?,
                    None | Some(Value::Null) => return Err(missing(&format!("{at}.output"))),
                    Some(_) => return Err(wrong_type(&format!("{at}.output"), "a string or an array of parts")),
                };
                messages.push(json!({
                    "role": "tool",
                    "tool_call_id": string(item, &at, "call_id")?,
                    "content": output,
                }));
            }
            // Chat has no place for reasoning, and only OpenAI reads its encrypted content.
            "reasoning" => {}
            "item_reference" => return Err(stateful(&at)),
            other => {
                return Err(not_served(
                    &format!("{at}.type"),
                    &format!("input items of type '{other}' need a tool the provider runs"),
                ));
            }
        }
    }
    Ok(())
}

/// A `function_call` item joins the assistant turn just before it, as chat
/// keeps a turn's text and its tool calls in one message.
fn join_tool_call(messages: &mut Vec<Value>, call: Value) {
    if let Some(Value::Object(last)) = messages.last_mut()
        && last.get("role").and_then(Value::as_str) == Some("assistant")
    {
        if let Some(Value::Array(calls)) = last.get_mut("tool_calls") {
            calls.push(call);
        } else {
            last.insert("tool_calls".into(), Value::Array(vec![call]));
        }
        return;
    }
    messages.push(json!({"role": "assistant", "content": null, "tool_calls": [call]}));
}

fn string(item: &Map<String, Value>, at: &str, name: &str) -> Result<String, ApiError> {
    match item.get(name) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => Err(missing(&format!("{at}.{name}"))),
        Some(_) => Err(wrong_type(&format!("{at}.{name}"), "a string")),
    }
}

/// A message item as a chat message.
fn message(item: &Map<String, Value>, at: &str) -> Result<Value, ApiError> {
    let role = string(item, at, "role")?;
    if !["user", "system", "developer", "assistant"].contains(&role.as_str()) {
        return Err(bad_value(
            &format!("{at}.role"),
            "must be 'user', 'system', 'developer' or 'assistant'",
        ));
    }
    let content = match item.get("content") {
        Some(Value::String(text)) => Value::String(text.clone()),
        // Chat's assistant turn is text.
        Some(Value::Array(parts)) if role == "assistant" => Value::String(text_of(parts, &format!("{at}.content"))?),
        Some(Value::Array(parts)) => Value::Array(parts_of(parts, &format!("{at}.content"))?),
        None | Some(Value::Null) => return Err(missing(&format!("{at}.content"))),
        Some(_) => return Err(wrong_type(&format!("{at}.content"), "a string or an array of parts")),
    };
    Ok(json!({"role": role, "content": content}))
}

/// Content parts as chat parts: text and images.
fn parts_of(parts: &[Value], at: &str) -> Result<Vec<Value>, ApiError> {
    parts
        .iter()
        .enumerate()
        .map(|(j, part)| {
            let at = format!("{at}.{j}");
            let Value::Object(part) = part else {
                return Err(wrong_type(&at, "an object"));
            };
            match part.get("type").and_then(Value::as_str) {
                Some("input_image") => {
                    let url = match part.get("image_url") {
                        Some(Value::String(url)) => url.clone(),
                        _ if part.get("file_id").is_some_and(|f| !f.is_null()) => {
                            return Err(not_served(
                                &format!("{at}.file_id"),
                                "files stored with OpenAI are not served; send the image as a URL or a data URL",
                            ));
                        }
                        _ => return Err(missing(&format!("{at}.image_url"))),
                    };
                    let mut image = json!({"url": url});
                    if let (Some(detail), Some(map)) =
                        (part.get("detail").filter(|d| d.is_string()), image.as_object_mut())
                    {
                        map.insert("detail".into(), detail.clone());
                    }
                    Ok(json!({"type": "image_url", "image_url": image}))
                }
                _ => Ok(json!({"type": "text", "text": part_text(part, &at)?})),
            }
        })
        .collect()
}

/// The text of parts that must all be text (an assistant turn, a tool's output).
fn text_of(parts: &[Value], at: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{at}.{j}");
        let Value::Object(part) = part else {
            return Err(wrong_type(&at, "an object"));
        };
        text.push_str(&part_text(part, &at)?);
    }
    Ok(text)
}

/// A text part's text: `input_text`, `output_text` or a `refusal`.
fn part_text(part: &Map<String, Value>, at: &str) -> Result<String, ApiError> {
    match part.get("type").and_then(Value::as_str) {
        Some("input_text" | "output_text" | "text") => string(part, at, "text"),
        Some("refusal") => string(part, at, "refusal"),
        Some(other) => Err(not_served(
            &format!("{at}.type"),
            &format!("content parts of type '{other}' are not served here"),
        )),
        None => Err(missing(&format!("{at}.type"))),
    }
}

/// Function tools in chat's shape, a `namespace` tool's functions among
/// them (each noted in `namespaces`); any other tool is run by the provider.
fn tools(value: &Value, namespaces: &mut Vec<(String, String)>) -> Result<Value, ApiError> {
    let Value::Array(tools) = value else {
        return Err(wrong_type("tools", "an array"));
    };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools.{i}");
        let Value::Object(tool) = tool else {
            return Err(wrong_type(&at, "an object"));
        };
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => out.push(function(tool, &at)?),
            Some("namespace") => {
                let namespace = string(tool, &at, "name")?;
                let Some(Value::Array(inner)) = tool.get("tools") else {
                    return Err(missing(&format!("{at}.tools")));
                };
                for (j, inner) in inner.iter().enumerate() {
                    let at = format!("{at}.tools.{j}");
                    let Value::Object(inner) = inner else {
                        return Err(wrong_type(&at, "an object"));
                    };
                    if inner.get("type").and_then(Value::as_str) != Some("function") {
                        return Err(not_served(
                            &format!("{at}.type"),
                            "a namespace is served with function tools only",
                        ));
                    }
                    namespaces.push((string(inner, &at, "name")?, namespace.clone()));
                    out.push(function(inner, &at)?);
                }
            }
            Some(other) => {
                return Err(not_served(
                    &format!("{at}.type"),
                    &format!("'{other}' is a tool the provider runs; only function tools are served"),
                ));
            }
            None => return Err(missing(&format!("{at}.type"))),
        }
    }
    Ok(Value::Array(out))
}

/// A function tool in chat's shape.
fn function(tool: &Map<String, Value>, at: &str) -> Result<Value, ApiError> {
    let mut function = Map::new();
    function.insert("name".into(), Value::String(string(tool, at, "name")?));
    for field in ["description", "parameters", "strict"] {
        if let Some(v) = tool.get(field).filter(|v| !v.is_null()) {
            function.insert(field.into(), v.clone());
        }
    }
    Ok(json!({"type": "function", "function": function}))
}

fn tool_choice(value: &Value) -> Result<Value, ApiError> {
    match value {
        Value::String(s) if ["auto", "none", "required"].contains(&s.as_str()) => Ok(value.clone()),
        Value::String(_) => Err(bad_value(
            "tool_choice",
            "must be 'none', 'auto', 'required' or a named function",
        )),
        Value::Object(choice) if choice.get("type").and_then(Value::as_str) == Some("function") => {
            let name = string(choice, "tool_choice", "name")?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        Value::Object(_) => Err(not_served(
            "tool_choice",
            "only 'auto', 'none', 'required' or a function are served",
        )),
        _ => Err(wrong_type("tool_choice", "a string or an object")),
    }
}

/// `text.format` as `response_format`, and `text.verbosity` as chat's.
fn text(value: &Value, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    let Value::Object(text) = value else {
        return Err(wrong_type("text", "an object"));
    };
    if let Some(verbosity) = text.get("verbosity").filter(|v| !v.is_null()) {
        chat.insert("verbosity".into(), verbosity.clone());
    }
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(());
    };
    let Value::Object(format) = format else {
        return Err(wrong_type("text.format", "an object"));
    };
    let response_format = match format.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(()),
        Some("json_object") => json!({"type": "json_object"}),
        Some("json_schema") => {
            let mut schema = Map::new();
            schema.insert("name".into(), Value::String(string(format, "text.format", "name")?));
            for field in ["schema", "strict", "description"] {
                if let Some(v) = format.get(field).filter(|v| !v.is_null()) {
                    schema.insert(field.into(), v.clone());
                }
            }
            json!({"type": "json_schema", "json_schema": schema})
        }
        _ => {
            return Err(bad_value(
                "text.format.type",
                "must be 'text', 'json_object' or 'json_schema'",
            ));
        }
    };
    chat.insert("response_format".into(), response_format);
    Ok(())
}

// ---- the answer ----------------------------------------------------------------

/// An output item's id: its kind's prefix, the response's own random part
/// and its place, so one response's ids are its own and a replayed stream
/// writes the same bytes.
fn item_id(stamp: &Stamp, prefix: &str, output_index: usize) -> String {
    let random = stamp.id.strip_prefix("resp_").unwrap_or(&stamp.id);
    format!("{prefix}{random}{output_index}")
}

/// A finished message item.
fn message_item(id: String, text: &str, status: &str) -> Value {
    json!({
        "id": id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [output_text(text)],
    })
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

impl Echo {
    /// A function call item; a call to a function of a `namespace` tool names it.
    fn function_call_item(&self, id: String, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
        let mut item = json!({
            "id": id,
            "type": "function_call",
            "status": status,
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
        });
        let namespace = self.namespaces.iter().find(|(function, _)| function == name);
        if let (Some((_, namespace)), Some(map)) = (namespace, item.as_object_mut()) {
            map.insert("namespace".into(), Value::String(namespace.clone()));
        }
        item
    }
}

/// How a response ended, from chat's `finish_reason`.
fn ending(finish_reason: Option<&str>) -> (&'static str, Value) {
    match finish_reason {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some("content_filter") => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// Responses usage from a chat `usage` object, its details included.
fn usage(chat: Option<&Value>) -> Value {
    let count = |pointer: &str| {
        chat.and_then(|u| u.pointer(pointer))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let (input, output) = (count("/prompt_tokens"), count("/completion_tokens"));
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": count("/prompt_tokens_details/cached_tokens")},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": count("/completion_tokens_details/reasoning_tokens")},
        "total_tokens": input.saturating_add(output),
    })
}

impl Echo {
    /// What the answer echoes, without the request's body.
    pub fn for_answer(&self) -> Echo {
        Echo {
            settings: self.settings.clone(),
            namespaces: self.namespaces.clone(),
            body: Vec::new(),
            untranslatable: None,
        }
    }

    /// A `response` object: the request's settings echoed (OpenAI's
    /// defaults where it sent none), and what the answer says.
    fn response(&self, stamp: &Stamp, status: &str, output: Vec<Value>, usage: Value) -> Map<String, Value> {
        let mut response = Map::new();
        let defaults = [
            ("tools", json!([])),
            ("tool_choice", json!("auto")),
            ("parallel_tool_calls", json!(true)),
            ("text", json!({"format": {"type": "text"}})),
            ("reasoning", json!({"effort": null, "summary": null})),
            ("metadata", json!({})),
        ];
        for (name, default) in defaults {
            response.insert(name.into(), default);
        }
        for name in ["instructions", "max_output_tokens", "temperature", "top_p", "user"] {
            response.insert(name.into(), Value::Null);
        }
        for (name, value) in &self.settings {
            response.insert(name.clone(), value.clone());
        }
        response.insert("id".into(), Value::String(stamp.id.clone()));
        response.insert("object".into(), "response".into());
        response.insert("created_at".into(), stamp.created.into());
        response.insert("model".into(), Value::String(stamp.model.clone()));
        response.insert("status".into(), status.into());
        response.insert("background".into(), false.into());
        response.insert("error".into(), Value::Null);
        response.insert("incomplete_details".into(), Value::Null);
        response.insert("previous_response_id".into(), Value::Null);
        response.insert("store".into(), false.into());
        response.insert("truncation".into(), "disabled".into());
        response.insert("output".into(), Value::Array(output));
        response.insert("usage".into(), usage);
        response
    }
}

/// The finished `chat.completion` (already stamped) as a `response`.
/// `Err` is why the answer is not a valid one.
pub fn to_response(echo: &Echo, stamp: &Stamp, chat: &[u8]) -> Result<Vec<u8>, String> {
    let chat: Value = crate::json::from_bytes(chat).map_err(|e| e.to_string())?;
    let choice = chat.pointer("/choices/0").ok_or("the answer has no choice")?;
    let message = choice.get("message").ok_or("the answer's choice has no message")?;
    let mut output = Vec::new();
    let text = message.get("content").and_then(Value::as_str).unwrap_or_default();
    let refusal = message.get("refusal").and_then(Value::as_str).unwrap_or_default();
    let text = [text, refusal].concat();
    if !text.is_empty() {
        output.push(message_item(item_id(stamp, "msg_", output.len()), &text, "completed"));
    }
    let calls = message.get("tool_calls").and_then(Value::as_array).map(Vec::as_slice);
    for call in calls.unwrap_or_default() {
        let field = |pointer: &str| call.pointer(pointer).and_then(Value::as_str).unwrap_or_default();
        let (call_id, name, arguments) = (field("/id"), field("/function/name"), field("/function/arguments"));
        let id = item_id(stamp, "fc_", output.len());
        output.push(echo.function_call_item(id, call_id, name, arguments, "completed"));
    }
    let (status, incomplete) = ending(choice.get("finish_reason").and_then(Value::as_str));
    let mut response = echo.response(stamp, status, output, usage(chat.get("usage")));
    response.insert("incomplete_details".into(), incomplete);
    serde_json::to_vec(&Value::Object(response)).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
