//! Fake Gemini API (generativelanguage v1beta): `POST /v1beta/models/{model}:generateContent`
//! and `:streamGenerateContent` (`?alt=sse` for SSE, else one JSON array), and
//! `:countTokens` (the prompt tokens an answer would report).
//!
//! Shapes follow `tests/fixtures/gemini/` (recorded traffic): pretty-printed
//! `GenerateContentResponse` JSON; SSE frames `data: <json>\r\n\r\n` in Google's spacing,
//! `usageMetadata` on every chunk and `finishReason` on the last; errors as
//! `{"error":{"code","message","status"}}`. Requests are checked like the real API:
//! `x-goog-api-key` or `?key=`, proto field names (camelCase or snake_case, unknown names
//! refused), `contents` / `parts` shapes, roles, function call / response turns.

mod validate;

use serde::Serialize as _;
use serde_json::{Map, Value, json};

use super::answer::{self, Answer, Ask, Content, Finish, ToolChoice, ToolDecl, random_id};
use super::reply::Reply;
use super::steer::{self, Directive};
use super::{GEMINI_KEY, RecordedRequest};

const NO_KEY: &str = "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.";

type Checked = Result<(), Reply>;

/// Answers one request under `/v1beta/`.
pub(crate) fn handle(req: &RecordedRequest) -> Reply {
    let Some((model, method)) = parse_path(req.path_only()) else {
        return error(
            404,
            "NOT_FOUND",
            &format!("The requested URL {} was not found on this server.", req.path_only()),
        );
    };
    let stream = match method.as_str() {
        "generateContent" | "countTokens" => false,
        "streamGenerateContent" => true,
        _ => {
            return error(
                404,
                "NOT_FOUND",
                &format!("models/{model} is not found for API version v1beta, or is not supported for {method}."),
            );
        }
    };
    if req.method != "POST" {
        return error(
            404,
            "NOT_FOUND",
            &format!("The requested URL {} was not found on this server.", req.path_only()),
        );
    }
    match req.header("x-goog-api-key").or_else(|| req.query_param("key")) {
        None => return error(403, "PERMISSION_DENIED", NO_KEY),
        Some(key) if key != GEMINI_KEY => return key_invalid(),
        Some(_) => {}
    }
    let body = match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(map)) => map,
        _ => return invalid("Invalid JSON payload received. Unexpected token."),
    };
    if method == "countTokens" {
        return count(&body, &model);
    }
    if let Err(reply) = validate::validate(&body) {
        return reply;
    }
    let sse = req.query_param("alt") == Some("sse");
    respond(req, &body, &model, stream, sse)
}

fn respond(req: &RecordedRequest, body: &Map<String, Value>, model: &str, stream: bool, sse: bool) -> Reply {
    let directive = steer::parse(model);
    let generation = body.get("generationConfig").or_else(|| body.get("generation_config"));
    let config = |key: &str| generation.and_then(|g| g.get(key).or_else(|| g.get(snake(key).as_str())));
    match directive {
        Directive::Status(code) => return status_error(code),
        Directive::Limited(seconds) => return status_error(429).replace_header("retry-after", &seconds.to_string()),
        Directive::Garbage => return garbage(sse),
        Directive::StreamError if !stream => return status_error(503),
        _ => {}
    }
    let ask = Ask {
        provider: "gemini",
        directive,
        tools: tools(body),
        tool_choice: tool_choice(body),
        json_mode: config("responseMimeType").and_then(Value::as_str) == Some("application/json"),
        max_tokens: config("maxOutputTokens").and_then(Value::as_u64),
        input_words: answer::input_words(body.get("contents").unwrap_or(&Value::Null))
            + answer::input_words(field(body, "systemInstruction").unwrap_or(&Value::Null)),
        request: req,
    };
    let answer = answer::answer(&ask);
    // With `includeThoughts`, a thought summary comes first; it names the budget it was given.
    let thinking = config("thinkingConfig");
    let thought = thinking
        .filter(|t| field_of(t, "includeThoughts").and_then(Value::as_bool) == Some(true))
        .map(|t| {
            let budget = field_of(t, "thinkingBudget").and_then(Value::as_i64).unwrap_or(-1);
            json!({"text": format!("Thinking within {budget} tokens."), "thought": true})
        });
    let n = config("candidateCount")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .clamp(1, 8) as usize;
    let id = random_id(23);
    let reply = if !stream {
        Reply::bytes(
            200,
            "application/json; charset=UTF-8",
            pretty(&response(model, &id, &answer, n, thought.as_ref())),
        )
    } else if sse {
        let mut events: Vec<Vec<u8>> = chunks(model, &id, &answer, n, thought.as_ref())
            .iter()
            .map(frame)
            .collect();
        if directive == Directive::StreamError {
            events.truncate(1);
            events.push(frame(&json!({"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}})));
        }
        Reply::sse("text/event-stream", events)
    } else {
        let array = Value::Array(chunks(model, &id, &answer, n, thought.as_ref()));
        Reply::bytes(200, "application/json; charset=UTF-8", pretty(&array))
    };
    match directive {
        Directive::Slow(ms) => reply.delayed(ms),
        Directive::Cut(n) => reply.cut(n),
        _ => reply,
    }
}

/// `countTokens`: `contents` alone, or a whole `generateContentRequest` (its
/// `model` the path's), counted as [`respond`] counts an answer's prompt.
fn count(body: &Map<String, Value>, model: &str) -> Reply {
    let request = match (body.get("contents"), field(body, "generateContentRequest")) {
        (Some(_), None) => body.clone(),
        (None, Some(Value::Object(request))) => {
            let named = request.get("model").and_then(Value::as_str);
            if named != Some(format!("models/{model}").as_str()) {
                return invalid(&format!(
                    "* CountTokensRequest.generate_content_request.model: must be models/{model}, not {named:?}\n"
                ));
            }
            let mut request = request.clone();
            request.remove("model");
            request
        }
        _ => return invalid("* CountTokensRequest: either contents or generate_content_request is required\n"),
    };
    if let Err(reply) = validate::validate(&request) {
        return reply;
    }
    match steer::parse(model) {
        Directive::Status(code) => return status_error(code),
        Directive::Limited(seconds) => return status_error(429).replace_header("retry-after", &seconds.to_string()),
        _ => {}
    }
    let words = answer::input_words(request.get("contents").unwrap_or(&Value::Null))
        + answer::input_words(field(&request, "systemInstruction").unwrap_or(&Value::Null));
    let tokens = words.max(1);
    let answer = json!({"totalTokens": tokens, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": tokens}]});
    Reply::bytes(200, "application/json; charset=UTF-8", pretty(&answer))
}

fn response(model: &str, id: &str, answer: &Answer, n: usize, thought: Option<&Value>) -> Value {
    let mut parts = parts(answer);
    if let Some(thought) = thought {
        parts.insert(0, thought.clone());
    }
    let candidates: Vec<Value> = (0..n).map(|i| candidate(parts.clone(), i, Some(answer))).collect();
    let out = answer.output_tokens * n as u64;
    json!({"candidates": candidates, "usageMetadata": usage(answer.input_tokens, out), "modelVersion": model, "responseId": id})
}

/// The stream chunks: a thought summary's first if any, then one per text
/// piece (tool calls all in one chunk).
fn chunks(model: &str, id: &str, answer: &Answer, n: usize, thought: Option<&Value>) -> Vec<Value> {
    let mut pieces: Vec<Vec<Value>> = match &answer.content {
        Content::Calls(_) => vec![parts(answer)],
        Content::Text(t) => answer::stream_pieces(t)
            .into_iter()
            .map(|p| vec![json!({"text": p})])
            .collect(),
    };
    if let Some(thought) = thought {
        pieces.insert(0, vec![thought.clone()]);
    }
    let last = pieces.len().saturating_sub(1);
    let mut words = 0;
    pieces
        .into_iter()
        .enumerate()
        .map(|(k, parts)| {
            words += parts.iter().filter_map(|p| p.get("text")?.as_str()).map(answer::word_count).sum::<usize>();
            let done = (k == last).then_some(answer);
            let candidates: Vec<Value> = (0..n).map(|i| candidate(parts.clone(), i, done)).collect();
            let so_far = if k == last { answer.output_tokens } else { words.max(1) as u64 };
            json!({"candidates": candidates, "usageMetadata": usage(answer.input_tokens, so_far * n as u64), "modelVersion": model, "responseId": id})
        })
        .collect()
}

fn parts(answer: &Answer) -> Vec<Value> {
    match &answer.content {
        Content::Text(t) => vec![json!({"text": t})],
        Content::Calls(calls) => calls
            .iter()
            .map(|c| json!({"functionCall": {"name": c.name, "args": c.args}}))
            .collect(),
    }
}

fn candidate(parts: Vec<Value>, index: usize, done: Option<&Answer>) -> Value {
    let mut c = json!({"content": {"parts": parts, "role": "model"}, "index": index});
    if let (Some(answer), Some(map)) = (done, c.as_object_mut()) {
        let reason = if answer.finish == Finish::Length {
            "MAX_TOKENS"
        } else {
            "STOP"
        };
        map.insert("finishReason".into(), json!(reason));
        if answer.finish == Finish::ToolCalls {
            map.insert("finishMessage".into(), json!("Model generated function call(s)."));
        }
    }
    c
}

fn usage(prompt: u64, candidates: u64) -> Value {
    json!({"promptTokenCount": prompt, "candidatesTokenCount": candidates, "totalTokenCount": prompt + candidates,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}]})
}

fn tools(body: &Map<String, Value>) -> Vec<ToolDecl> {
    let declared = body.get("tools").and_then(Value::as_array).into_iter().flatten();
    declared
        .filter_map(|t| field_of(t, "functionDeclarations").and_then(Value::as_array))
        .flatten()
        .filter_map(|d| {
            let name = d.get("name")?.as_str()?.to_owned();
            let schema = field_of(d, "parameters")
                .or_else(|| field_of(d, "parametersJsonSchema"))
                .cloned()
                .unwrap_or_else(|| json!({}));
            Some(ToolDecl { name, schema })
        })
        .collect()
}

fn tool_choice(body: &Map<String, Value>) -> ToolChoice {
    let config = field(body, "toolConfig").and_then(|c| field_of(c, "functionCallingConfig"));
    let allowed: Vec<&str> = config
        .and_then(|c| field_of(c, "allowedFunctionNames"))
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    match config.and_then(|c| c.get("mode")).and_then(Value::as_str) {
        Some("NONE") => ToolChoice::None,
        Some("ANY") => match allowed.as_slice() {
            [one] => ToolChoice::Named((*one).to_owned()),
            _ => ToolChoice::Required,
        },
        _ => ToolChoice::Auto,
    }
}

fn field<'a>(body: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    body.get(key).or_else(|| body.get(snake(key).as_str()))
}

fn field_of<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    value.get(key).or_else(|| value.get(snake(key).as_str()))
}

fn camel(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    let mut upper = false;
    for c in key.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn snake(key: &str) -> String {
    let mut out = String::with_capacity(key.len() + 4);
    for c in key.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn parse_path(path: &str) -> Option<(String, String)> {
    let rest = path
        .strip_prefix("/v1beta/models/")?
        .replace("%3A", ":")
        .replace("%3a", ":");
    let (model, method) = rest.rsplit_once(':')?;
    (!model.is_empty()).then(|| (model.to_owned(), method.to_owned()))
}

fn status_error(code: u16) -> Reply {
    let (status, message) = match code {
        400 => ("INVALID_ARGUMENT", "Request contains an invalid argument."),
        401 => ("UNAUTHENTICATED", "Request had invalid authentication credentials."),
        403 => ("PERMISSION_DENIED", "The caller does not have permission"),
        404 => ("NOT_FOUND", "Requested entity was not found."),
        409 => ("ABORTED", "The operation was aborted."),
        429 => (
            "RESOURCE_EXHAUSTED",
            "You exceeded your current quota, please check your plan and billing details.",
        ),
        499 => ("CANCELLED", "The operation was cancelled."),
        500 => (
            "INTERNAL",
            "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
        ),
        503 => ("UNAVAILABLE", "The model is overloaded. Please try again later."),
        504 => ("DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
        402..=498 => (
            "FAILED_PRECONDITION",
            "The fake provider was asked to fail with this status.",
        ),
        _ => ("UNKNOWN", "The fake provider was asked to fail with this status."),
    };
    if code != 429 {
        return error(code, status, message);
    }
    let details = json!([{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}]);
    error_with(code, status, message, Some(details)).header("retry-after", "7")
}

fn key_invalid() -> Reply {
    let message = "API key not valid. Please pass a valid API key.";
    let details = json!([
        {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID", "domain": "googleapis.com",
            "metadata": {"service": "generativelanguage.googleapis.com"}},
        {"@type": "type.googleapis.com/google.rpc.LocalizedMessage", "locale": "en-US", "message": message},
    ]);
    error_with(400, "INVALID_ARGUMENT", message, Some(details))
}

fn garbage(sse: bool) -> Reply {
    if sse {
        Reply::sse(
            "text/event-stream",
            vec![b"data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel\r\n\r\n".to_vec()],
        )
    } else {
        Reply::bytes(200, "application/json; charset=UTF-8", b"{\n  \"candidates\": [\n    {\n      \"content\": {\n        \"parts\": [\n          {\n            \"text\": \"Hel".to_vec())
    }
}

fn invalid(message: &str) -> Reply {
    error(400, "INVALID_ARGUMENT", message)
}

fn error(code: u16, status: &str, message: &str) -> Reply {
    error_with(code, status, message, None)
}

fn error_with(code: u16, status: &str, message: &str, details: Option<Value>) -> Reply {
    let mut error = json!({"code": code, "message": message, "status": status});
    if let (Some(details), Some(map)) = (details, error.as_object_mut()) {
        map.insert("details".into(), details);
    }
    Reply::bytes(
        code,
        "application/json; charset=UTF-8",
        pretty(&json!({"error": error})),
    )
}

fn pretty(value: &Value) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(value).unwrap_or_else(|_| value.to_string().into_bytes());
    out.push(b'\n');
    out
}

/// `data: <json>\r\n\r\n` with Google's spacing (`"key": value,"next": …`).
fn frame(value: &Value) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, GoogleStyle);
    if value.serialize(&mut ser).is_err() {
        out = format!("data: {value}").into_bytes();
    }
    out.extend_from_slice(b"\r\n\r\n");
    out
}

/// Compact JSON with a space after each colon, as Google's SSE chunks are written.
struct GoogleStyle;

impl serde_json::ser::Formatter for GoogleStyle {
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}
