//! Request checks of the fake Anthropic API, with the real API's error messages:
//! required `model` / `max_tokens` / `messages`, no extra fields, roles, content block
//! shapes, `tool_use` / `tool_result` pairing, tools and `tool_choice`, value ranges.

use serde_json::{Map, Value, json};

use super::{Checked, invalid};
use crate::reply::Reply;

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
    // Claude Code 2.1.332's effort and region settings.
    "output_config",
    "inference_geo",
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

/// The beta under which a conversation may hold `system` turns.
pub(super) const PER_TURN_CONTROL: &str = "per-turn-control-2026-07-01";

/// `system_turns`: the request asked for [`PER_TURN_CONTROL`].
pub(super) fn validate(body: &Map<String, Value>, system_turns: bool) -> Checked {
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
        pending = validate_message(i, m, &pending, system_turns)?;
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
fn validate_message(i: usize, m: &Value, pending: &[String], system_turns: bool) -> Result<Vec<String>, Reply> {
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        Some(r @ "system") if system_turns => r,
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

fn str_field(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

fn quoted(items: &[&str]) -> String {
    items.iter().map(|i| format!("'{i}'")).collect::<Vec<_>>().join(", ")
}
