//! Request checks of the fake OpenAI API, with the real API's error messages: unknown
//! top-level parameters, required fields, value ranges, message roles and parts, and
//! the pairing of assistant `tool_calls` with `tool` messages.

use serde_json::{Map, Value};

use super::{Checked, invalid};
use crate::reply::Reply;

const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool", "function"];
const PART_TYPES: &[&str] = &["text", "image_url", "input_audio", "file", "refusal"];
const CHAT_FIELDS: &[&str] = &[
    "model",
    "messages",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
];
const LEGACY_FIELDS: &[&str] = &[
    "model",
    "prompt",
    "best_of",
    "echo",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "max_tokens",
    "n",
    "presence_penalty",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "suffix",
    "temperature",
    "top_p",
    "user",
];

pub(super) fn validate_chat(body: &Map<String, Value>) -> Checked {
    unknown_fields(body, CHAT_FIELDS)?;
    require_model(body)?;
    let messages = match body.get("messages") {
        None => return Err(missing("messages")),
        Some(Value::Array(m)) => m,
        Some(other) => return Err(invalid_type("messages", "an array", other)),
    };
    if messages.is_empty() {
        return Err(invalid(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            Some("messages"),
            Some("empty_array"),
        ));
    }
    let mut open: Vec<String> = Vec::new();
    let mut answerable: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        validate_message(i, m, &mut open, &mut answerable)?;
    }
    if !open.is_empty() {
        return Err(unanswered(&open));
    }
    common_params(body)?;
    validate_tools(body)
}

fn validate_message(i: usize, m: &Value, open: &mut Vec<String>, answerable: &mut Vec<String>) -> Checked {
    let at = format!("messages[{i}]");
    let Some(m) = m.as_object() else {
        return Err(invalid_type(&at, "an object", m));
    };
    let role = match m.get("role") {
        None => return Err(missing(&format!("{at}.role"))),
        Some(Value::String(r)) if ROLES.contains(&r.as_str()) => r.as_str(),
        Some(other) => {
            return Err(invalid(
                &format!(
                    "Invalid value: '{}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'.",
                    other.as_str().unwrap_or_default()
                ),
                Some(&format!("{at}.role")),
                Some("invalid_value"),
            ));
        }
    };
    if role == "tool" {
        let id = match m.get("tool_call_id") {
            Some(Value::String(id)) => id,
            None => return Err(missing(&format!("{at}.tool_call_id"))),
            Some(other) => {
                return Err(invalid_type(&format!("{at}.tool_call_id"), "a string", other));
            }
        };
        if !answerable.contains(id) {
            return Err(invalid(
                "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                Some(&format!("messages.[{i}].role")),
                None,
            ));
        }
        open.retain(|o| o != id);
    } else if !open.is_empty() {
        return Err(unanswered(open));
    } else {
        answerable.clear();
    }
    let has_calls = m.get("tool_calls").is_some() || m.get("function_call").is_some();
    match m.get("content") {
        None | Some(Value::Null) if role == "assistant" && has_calls => {}
        None | Some(Value::Null) => return Err(missing(&format!("{at}.content"))),
        Some(Value::String(_)) => {}
        Some(Value::Array(parts)) => validate_parts(&at, parts)?,
        Some(other) => {
            return Err(invalid_type(
                &format!("{at}.content"),
                "one of a string or array of objects",
                other,
            ));
        }
    }
    if role == "assistant"
        && let Some(calls) = m.get("tool_calls")
    {
        let ids = validate_tool_calls(&at, calls)?;
        open.clone_from(&ids);
        *answerable = ids;
    }
    Ok(())
}

fn validate_parts(at: &str, parts: &[Value]) -> Checked {
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let kind = match part.get("type") {
            Some(Value::String(t)) if PART_TYPES.contains(&t.as_str()) => t.as_str(),
            None => return Err(missing(&format!("{at}.type"))),
            Some(other) => {
                return Err(invalid(
                    &format!(
                        "Invalid value: '{}'. Supported values are: 'text', 'image_url', 'input_audio', 'refusal', and 'file'.",
                        other.as_str().unwrap_or_default()
                    ),
                    Some(&format!("{at}.type")),
                    Some("invalid_value"),
                ));
            }
        };
        let field = match kind {
            "text" => part.get("text").filter(|t| t.is_string()),
            "image_url" => part
                .get("image_url")
                .and_then(|u| u.get("url"))
                .filter(|u| u.is_string()),
            _ => Some(part),
        };
        if field.is_none() {
            let name = if kind == "text" { "text" } else { "image_url.url" };
            return Err(missing(&format!("{at}.{name}")));
        }
    }
    Ok(())
}

fn validate_tool_calls(at: &str, calls: &Value) -> Result<Vec<String>, Reply> {
    let Some(calls) = calls.as_array() else {
        return Err(invalid_type(&format!("{at}.tool_calls"), "an array", calls));
    };
    let mut ids = Vec::new();
    for (k, call) in calls.iter().enumerate() {
        let at = format!("{at}.tool_calls[{k}]");
        let Some(id) = call.get("id").and_then(Value::as_str) else {
            return Err(missing(&format!("{at}.id")));
        };
        if call.get("type").and_then(Value::as_str) != Some("function") {
            return Err(missing(&format!("{at}.type")));
        }
        if call.pointer("/function/name").and_then(Value::as_str).is_none() {
            return Err(missing(&format!("{at}.function.name")));
        }
        match call.pointer("/function/arguments") {
            Some(Value::String(_)) => {}
            None => return Err(missing(&format!("{at}.function.arguments"))),
            Some(other) => {
                return Err(invalid_type(&format!("{at}.function.arguments"), "a string", other));
            }
        }
        ids.push(id.to_owned());
    }
    Ok(ids)
}

fn validate_tools(body: &Map<String, Value>) -> Checked {
    let tools = match body.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(t)) => Some(t),
        Some(other) => return Err(invalid_type("tools", "an array", other)),
    };
    for (i, tool) in tools.into_iter().flatten().enumerate() {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(missing(&format!("tools[{i}].type")));
        }
        let Some(name) = tool.pointer("/function/name").and_then(Value::as_str) else {
            return Err(missing(&format!("tools[{i}].function.name")));
        };
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(invalid(
                &format!(
                    "Invalid 'tools[{i}].function.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
                ),
                Some(&format!("tools[{i}].function.name")),
                Some("invalid_value"),
            ));
        }
    }
    let has_tools = tools.is_some_and(|t| !t.is_empty());
    match body.get("tool_choice") {
        None | Some(Value::Null) => Ok(()),
        Some(_) if !has_tools => Err(invalid(
            "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
            Some("tool_choice"),
            None,
        )),
        Some(Value::String(s)) if ["none", "auto", "required"].contains(&s.as_str()) => Ok(()),
        Some(Value::Object(o))
            if o.get("function")
                .and_then(|f| f.get("name"))
                .is_some_and(Value::is_string) =>
        {
            Ok(())
        }
        Some(_) => Err(invalid(
            "Invalid value for 'tool_choice'.",
            Some("tool_choice"),
            Some("invalid_value"),
        )),
    }
}

pub(super) fn validate_legacy(body: &Map<String, Value>) -> Checked {
    unknown_fields(body, LEGACY_FIELDS)?;
    require_model(body)?;
    match body.get("prompt") {
        None => return Err(missing("prompt")),
        Some(Value::String(_) | Value::Array(_)) => {}
        Some(other) => return Err(invalid_type("prompt", "a string or an array", other)),
    }
    common_params(body)
}

fn common_params(body: &Map<String, Value>) -> Checked {
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(invalid_type("stream", "a boolean", other)),
    };
    if body.get("stream_options").is_some_and(|o| !o.is_null()) && !stream {
        return Err(invalid(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            Some("stream_options"),
            None,
        ));
    }
    range(body, "temperature", 0.0, 2.0, false)?;
    range(body, "top_p", 0.0, 1.0, false)?;
    range(body, "presence_penalty", -2.0, 2.0, false)?;
    range(body, "frequency_penalty", -2.0, 2.0, false)?;
    range(body, "n", 1.0, 128.0, true)?;
    range(body, "max_tokens", 1.0, f64::MAX, true)?;
    range(body, "max_completion_tokens", 1.0, f64::MAX, true)
}

fn range(body: &Map<String, Value>, key: &str, min: f64, max: f64, integer: bool) -> Checked {
    let kind = if integer { "integer" } else { "decimal" };
    let value = match body.get(key) {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Number(n)) if !integer || n.is_i64() || n.is_u64() => n.as_f64().unwrap_or(0.0),
        Some(other) => {
            return Err(invalid_type(
                key,
                if integer { "an integer" } else { "a number" },
                other,
            ));
        }
    };
    if value < min {
        return Err(invalid(
            &format!(
                "Invalid '{key}': {kind} below minimum value. Expected a value >= {min}, but got {value} instead."
            ),
            Some(key),
            Some(&format!("{kind}_below_min_value")),
        ));
    }
    if value > max {
        return Err(invalid(
            &format!(
                "Invalid '{key}': {kind} above maximum value. Expected a value <= {max}, but got {value} instead."
            ),
            Some(key),
            Some(&format!("{kind}_above_max_value")),
        ));
    }
    Ok(())
}

fn unknown_fields(body: &Map<String, Value>, known: &[&str]) -> Checked {
    match body.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(invalid(
            &format!("Unrecognized request argument supplied: {k}"),
            None,
            None,
        )),
        None => Ok(()),
    }
}

fn require_model(body: &Map<String, Value>) -> Checked {
    match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => Ok(()),
        None | Some(Value::String(_)) => Err(invalid("you must provide a model parameter", None, None)),
        Some(other) => Err(invalid_type("model", "a string", other)),
    }
}

fn unanswered(open: &[String]) -> Reply {
    invalid(
        &format!(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
            open.join(", ")
        ),
        Some("messages"),
        None,
    )
}

fn missing(param: &str) -> Reply {
    invalid(
        &format!("Missing required parameter: '{param}'."),
        Some(param),
        Some("missing_required_parameter"),
    )
}

fn invalid_type(param: &str, expected: &str, got: &Value) -> Reply {
    invalid(
        &format!(
            "Invalid type for '{param}': expected {expected}, but got {} instead.",
            type_name(got)
        ),
        Some(param),
        Some("invalid_type"),
    )
}

pub(super) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a decimal",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
