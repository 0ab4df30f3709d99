//! Fake OpenAI API: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`.
//!
//! Shapes follow `tests/fixtures/openai/` (recorded api.openai.com traffic): JSON
//! `chat.completion` / `text_completion`, SSE `chat.completion.chunk`s ending with
//! `data: [DONE]`, and with `stream_options.include_usage` a last chunk with
//! `choices: []` and `usage` (every earlier chunk then carries `"usage": null`).
//! Requests are checked like the real API: bearer key, JSON body, required fields,
//! unknown top-level parameters, value ranges, tool-call / tool-message pairing.

use serde_json::{Map, Value, json};

use super::answer::{self, Answer, Ask, Content, Finish, ToolChoice, ToolDecl, random_id};
use super::reply::Reply;
use super::steer::{self, Directive};
use super::{OPENAI_KEY, RecordedRequest};

const SSE: &str = "text/event-stream; charset=utf-8";
const NO_KEY: &str = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the API from your browser and are prompted for a username and password. You can obtain an API key from https://platform.openai.com/account/api-keys.";
const NOT_JSON: &str = "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)";
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

type Checked = Result<(), Reply>;

/// Answers one request to the OpenAI paths (and any unknown path).
pub(crate) fn handle(req: &RecordedRequest) -> Reply {
    let (chat, method) = match req.path_only() {
        "/v1/chat/completions" => (true, "POST"),
        "/v1/completions" => (false, "POST"),
        "/v1/models" => (false, "GET"),
        _ => return invalid_url(req),
    };
    if req.method != method {
        return invalid_url(req);
    }
    if let Err(reply) = check_key(req) {
        return reply;
    }
    if method == "GET" {
        return models();
    }
    let body = match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(map)) => map,
        Ok(other) => {
            return invalid(
                &format!(
                    "Invalid type for request body: expected an object, but got {} instead.",
                    type_name(&other)
                ),
                None,
                Some("invalid_type"),
            );
        }
        Err(_) => return invalid(NOT_JSON, None, None),
    };
    let checked = if chat {
        validate_chat(&body)
    } else {
        validate_legacy(&body)
    };
    match checked {
        Ok(()) => respond(req, &body, chat),
        Err(reply) => reply,
    }
}

fn respond(req: &RecordedRequest, body: &Map<String, Value>, chat: bool) -> Reply {
    let model = body.get("model").and_then(Value::as_str).unwrap_or_default();
    let directive = steer::parse(model);
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    match directive {
        Directive::Status(code) => return status_error(code),
        Directive::Garbage => return garbage(stream),
        Directive::StreamError if !stream => return status_error(500),
        _ => {}
    }
    let ask = Ask {
        provider: "openai",
        directive,
        tools: if chat { tools(body) } else { Vec::new() },
        tool_choice: tool_choice(body),
        json_mode: json_mode(body),
        max_tokens: ["max_completion_tokens", "max_tokens"]
            .iter()
            .find_map(|k| body.get(*k).and_then(Value::as_u64)),
        input_words: answer::input_words(body.get("messages").unwrap_or(&Value::Null))
            + answer::input_words(body.get("prompt").unwrap_or(&Value::Null)),
        request: req,
    };
    let answer = answer::answer(&ask);
    let n = body.get("n").and_then(Value::as_u64).unwrap_or(1).clamp(1, 128) as usize;
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let s = Shape {
        model,
        answer: &answer,
        n,
        chat,
        include_usage,
    };
    let reply = if stream {
        let mut events = s.events();
        if directive == Directive::StreamError {
            events.truncate(2);
            events.push(data(&server_error_body()));
        }
        Reply::sse(SSE, events)
    } else {
        Reply::json(200, &s.body())
    };
    let reply = reply
        .header("x-request-id", &request_id())
        .header("openai-processing-ms", "3");
    match directive {
        Directive::Slow(ms) => reply.delayed(ms),
        Directive::Cut(n) => reply.cut(n),
        _ => reply,
    }
}

/// An answer in chat or legacy shape.
struct Shape<'a> {
    model: &'a str,
    answer: &'a Answer,
    n: usize,
    chat: bool,
    include_usage: bool,
}

impl Shape<'_> {
    fn body(&self) -> Value {
        let choices: Vec<Value> = (0..self.n)
            .map(|i| {
                let mut choice = json!({"index": i, "logprobs": null, "finish_reason": finish(self.answer.finish)});
                let (key, value) = if self.chat {
                    ("message", message(self.answer))
                } else {
                    ("text", json!(text(self.answer)))
                };
                set(&mut choice, key, value);
                choice
            })
            .collect();
        let mut body = json!({
            "id": self.id(), "object": self.object(false), "created": answer::now_secs(),
            "model": self.model, "choices": choices, "usage": self.usage(),
        });
        if self.chat {
            set(&mut body, "service_tier", json!("default"));
            set(&mut body, "system_fingerprint", json!("fp_fake"));
        }
        body
    }

    fn events(&self) -> Vec<Vec<u8>> {
        let mut head =
            json!({"id": self.id(), "object": self.object(true), "created": answer::now_secs(), "model": self.model});
        if self.chat {
            set(&mut head, "service_tier", json!("default"));
            set(&mut head, "system_fingerprint", json!("fp_fake"));
        }
        let chunk = |choice: Value| {
            let mut c = head.clone();
            set(&mut c, "choices", json!([choice]));
            if self.include_usage {
                set(&mut c, "usage", Value::Null);
            }
            data(&c)
        };
        let mut events = Vec::new();
        for i in 0..self.n {
            let deltas = if self.chat {
                chat_deltas(self.answer)
            } else {
                legacy_texts(self.answer)
            };
            let last = deltas.len().saturating_sub(1);
            for (k, delta) in deltas.into_iter().enumerate() {
                let mut choice = json!({"index": i, "logprobs": null, "finish_reason": null});
                if !self.chat && k == last {
                    set(&mut choice, "finish_reason", json!(finish(self.answer.finish)));
                }
                set(&mut choice, if self.chat { "delta" } else { "text" }, delta);
                events.push(chunk(choice));
            }
            if self.chat {
                let done =
                    json!({"index": i, "delta": {}, "logprobs": null, "finish_reason": finish(self.answer.finish)});
                events.push(chunk(done));
            }
        }
        if self.include_usage {
            let mut c = head.clone();
            set(&mut c, "choices", json!([]));
            set(&mut c, "usage", self.usage());
            events.push(data(&c));
        }
        events.push(b"data: [DONE]\n\n".to_vec());
        events
    }

    fn id(&self) -> String {
        if self.chat {
            format!("chatcmpl-{}", random_id(29))
        } else {
            format!("cmpl-{}", random_id(29))
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.chat, chunk) {
            (true, false) => "chat.completion",
            (true, true) => "chat.completion.chunk",
            (false, _) => "text_completion",
        }
    }

    fn usage(&self) -> Value {
        let prompt = self.answer.input_tokens;
        let completion = self.answer.output_tokens * self.n as u64;
        let mut usage =
            json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion});
        if self.chat {
            set(
                &mut usage,
                "prompt_tokens_details",
                json!({"cached_tokens": 0, "audio_tokens": 0}),
            );
            set(
                &mut usage,
                "completion_tokens_details",
                json!({"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}),
            );
        }
        usage
    }
}

fn message(answer: &Answer) -> Value {
    match &answer.content {
        Content::Text(t) => {
            json!({"role": "assistant", "content": t, "refusal": null, "annotations": []})
        }
        Content::Calls(calls) => {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| json!({"id": call_id(), "type": "function", "function": {"name": c.name, "arguments": c.args.to_string()}}))
                .collect();
            json!({"role": "assistant", "content": null, "refusal": null, "annotations": [], "tool_calls": calls})
        }
    }
}

fn chat_deltas(answer: &Answer) -> Vec<Value> {
    match &answer.content {
        Content::Text(t) => std::iter::once(json!({"role": "assistant", "content": "", "refusal": null}))
            .chain(answer::stream_pieces(t).into_iter().map(|p| json!({"content": p})))
            .collect(),
        Content::Calls(calls) => {
            let mut deltas = vec![json!({"role": "assistant", "content": null})];
            for (i, call) in calls.iter().enumerate() {
                deltas.push(json!({"tool_calls": [{"index": i, "id": call_id(), "type": "function", "function": {"name": call.name, "arguments": ""}}]}));
                for piece in answer::chunks(&call.args.to_string(), 8) {
                    deltas.push(json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}));
                }
            }
            deltas
        }
    }
}

fn legacy_texts(answer: &Answer) -> Vec<Value> {
    answer::stream_pieces(&text(answer))
        .into_iter()
        .map(Value::String)
        .collect()
}

fn text(answer: &Answer) -> String {
    match &answer.content {
        Content::Text(t) => t.clone(),
        Content::Calls(_) => String::new(),
    }
}

fn finish(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::ToolCalls => "tool_calls",
    }
}

fn tools(body: &Map<String, Value>) -> Vec<ToolDecl> {
    let declared = body.get("tools").and_then(Value::as_array).into_iter().flatten();
    declared
        .filter_map(|t| t.get("function"))
        .filter_map(|f| {
            let name = f.get("name")?.as_str()?.to_owned();
            let schema = f.get("parameters").cloned().unwrap_or_else(|| json!({}));
            Some(ToolDecl { name, schema })
        })
        .collect()
}

fn tool_choice(body: &Map<String, Value>) -> ToolChoice {
    match body.get("tool_choice") {
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(Value::Object(o)) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map_or(ToolChoice::Required, |n| ToolChoice::Named(n.to_owned())),
        _ => ToolChoice::Auto,
    }
}

fn json_mode(body: &Map<String, Value>) -> bool {
    let kind = body
        .get("response_format")
        .and_then(|f| f.get("type"))
        .and_then(Value::as_str);
    matches!(kind, Some("json_object" | "json_schema"))
}

fn validate_chat(body: &Map<String, Value>) -> Checked {
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

fn validate_legacy(body: &Map<String, Value>) -> Checked {
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

fn check_key(req: &RecordedRequest) -> Checked {
    let token = req.header("authorization").and_then(|v| {
        let (scheme, rest) = v.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
    });
    match token {
        Some(OPENAI_KEY) => Ok(()),
        Some(key) if !key.is_empty() => Err(error(
            401,
            &format!(
                "Incorrect API key provided: {}. You can find your API key at https://platform.openai.com/account/api-keys.",
                redact(key)
            ),
            "invalid_request_error",
            None,
            Some("invalid_api_key"),
        )),
        _ => Err(error(401, NO_KEY, "invalid_request_error", None, None)),
    }
}

/// `sk-a****wxyz`: never the whole key.
fn redact(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    if chars.len() <= 8 {
        return "*".repeat(chars.len());
    }
    let head: String = chars.iter().take(4).collect();
    let tail: String = chars.iter().skip(chars.len() - 4).collect();
    format!("{head}{}{tail}", "*".repeat(chars.len() - 8))
}

fn status_error(code: u16) -> Reply {
    let (kind, err_code, message) = match code {
        401 => (
            "invalid_request_error",
            Some("invalid_api_key"),
            "Incorrect API key provided.",
        ),
        403 => (
            "request_forbidden",
            Some("unsupported_country_region_territory"),
            "Country, region, or territory not supported",
        ),
        404 => (
            "invalid_request_error",
            Some("model_not_found"),
            "The model does not exist or you do not have access to it.",
        ),
        429 => (
            "requests",
            Some("rate_limit_exceeded"),
            "Rate limit reached for requests. Please try again in 7s.",
        ),
        500..=599 => (
            "server_error",
            None,
            "The server had an error while processing your request. Sorry about that!",
        ),
        _ => (
            "invalid_request_error",
            None,
            "The fake provider was asked to fail with this status.",
        ),
    };
    let reply = error(code, message, kind, None, err_code);
    if code == 429 {
        reply.header("retry-after", "7")
    } else {
        reply
    }
}

fn server_error_body() -> Value {
    json!({"error": {"message": "The server had an error while processing your request. Sorry about that!", "type": "server_error", "param": null, "code": null}})
}

fn garbage(stream: bool) -> Reply {
    let broken = "{\"id\":\"chatcmpl-garbage\",\"object\":\"chat.completion\",\"choices\":[{\"index\":0,\"message\":{\"content\":\"Hel";
    if stream {
        Reply::sse(
            SSE,
            vec![format!("data: {broken}\n\n").into_bytes(), b"data: [DONE]\n\n".to_vec()],
        )
    } else {
        Reply::bytes(200, "application/json", broken.as_bytes().to_vec())
    }
}

fn models() -> Reply {
    let names = [
        "ok",
        "echo",
        "tool",
        "tools",
        "json",
        "garbage",
        "long-20",
        "slow-1000",
        "cut-3",
        "status-429",
        "status-500",
        "stream-error",
    ];
    let data: Vec<Value> = names
        .iter()
        .map(|n| json!({"id": n, "object": "model", "created": 1_686_935_002, "owned_by": "waygate-fake"}))
        .collect();
    Reply::json(200, &json!({"object": "list", "data": data}))
}

fn invalid_url(req: &RecordedRequest) -> Reply {
    error(
        404,
        &format!("Invalid URL ({} {})", req.method, req.path_only()),
        "invalid_request_error",
        None,
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

fn invalid(message: &str, param: Option<&str>, code: Option<&str>) -> Reply {
    error(400, message, "invalid_request_error", param, code)
}

fn error(status: u16, message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Reply {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": code}});
    Reply::json(status, &body).header("x-request-id", &request_id())
}

fn type_name(v: &Value) -> &'static str {
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

fn set(target: &mut Value, key: &str, value: Value) {
    if let Some(map) = target.as_object_mut() {
        map.insert(key.to_owned(), value);
    }
}

fn data(value: &Value) -> Vec<u8> {
    format!("data: {value}\n\n").into_bytes()
}

fn call_id() -> String {
    format!("call_{}", random_id(24))
}

fn request_id() -> String {
    format!("req_{}", random_id(32).to_ascii_lowercase())
}
