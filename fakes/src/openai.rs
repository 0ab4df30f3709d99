//! Fake OpenAI API: `POST /v1/chat/completions`, `POST /v1/completions`, `POST /v1/responses`,
//! `GET /v1/models`.
//!
//! Shapes follow `tests/fixtures/openai/` (recorded api.openai.com traffic): JSON
//! `chat.completion` / `text_completion`, SSE `chat.completion.chunk`s ending with
//! `data: [DONE]`, and with `stream_options.include_usage` a last chunk with
//! `choices: []` and `usage` (every earlier chunk then carries `"usage": null`).
//! Requests are checked like the real API: bearer key, JSON body, required fields,
//! unknown top-level parameters, value ranges, tool-call / tool-message pairing.

mod responses;
mod validate;

use serde_json::{Map, Value, json};

use super::answer::{self, Answer, Ask, Content, Finish, ToolChoice, ToolDecl, random_id};
use super::reply::Reply;
use super::steer::{self, Directive};
use super::{OPENAI_EXHAUSTED_KEY, OPENAI_KEY, OPENAI_ORGANIZATION, RecordedRequest};

const SSE: &str = "text/event-stream; charset=utf-8";
const NO_KEY: &str = "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the API from your browser and are prompted for a username and password. You can obtain an API key from https://platform.openai.com/account/api-keys.";
const NOT_JSON: &str = "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)";

type Checked = Result<(), Reply>;

/// Answers one request to the OpenAI paths (and any unknown path).
pub(crate) fn handle(req: &RecordedRequest) -> Reply {
    if req.path_only() == "/v1/responses" && req.method == "POST" {
        return check_key(req).err().unwrap_or_else(|| responses::handle(req));
    }
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
                    validate::type_name(&other)
                ),
                None,
                Some("invalid_type"),
            );
        }
        Err(_) => return invalid(NOT_JSON, None, None),
    };
    let checked = if chat {
        validate::validate_chat(&body)
    } else {
        validate::validate_legacy(&body)
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
        Directive::Limited(seconds) => return status_error(429).replace_header("retry-after", &seconds.to_string()),
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
    // OpenAI tells the account's own limits on every answer (platform.openai.com,
    // "Rate limits": HTTP headers); the gateway's limited keys tell theirs in the same names.
    let reply = reply
        .header("x-request-id", &request_id())
        .header("openai-organization", OPENAI_ORGANIZATION)
        .header("openai-project", "proj_fake")
        .header("openai-processing-ms", "3")
        .header("x-ratelimit-limit-requests", "10000")
        .header("x-ratelimit-remaining-requests", "9999")
        .header("x-ratelimit-reset-requests", "6ms")
        .header("x-ratelimit-limit-tokens", "2000000")
        .header("x-ratelimit-remaining-tokens", "1999980")
        .header("x-ratelimit-reset-tokens", "0s")
        // And, from its CDN, its own origin's policies and cookies.
        .header("alt-svc", "h3=\":443\"; ma=86400")
        .header(
            "strict-transport-security",
            "max-age=31536000; includeSubDomains; preload",
        )
        .header(
            "set-cookie",
            "__cf_bm=fake-bot-management; path=/; domain=.api.openai.com; HttpOnly; Secure; SameSite=None",
        );
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

fn check_key(req: &RecordedRequest) -> Checked {
    let token = req.header("authorization").and_then(|v| {
        let (scheme, rest) = v.trim().split_once(' ')?;
        scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
    });
    match token {
        // The key belongs to one organization; a request that names another is refused,
        // as OpenAI refuses it (seen in the wild: microsoft/foundry-dev-tools#262,
        // Realiserad/fish-ai#62).
        Some(OPENAI_KEY)
            if req
                .header("openai-organization")
                .is_some_and(|org| org != OPENAI_ORGANIZATION) =>
        {
            Err(error(
                401,
                "OpenAI-Organization header should match organization for API key",
                "invalid_request_error",
                None,
                Some("mismatched_organization"),
            ))
        }
        Some(OPENAI_KEY) => Ok(()),
        Some(OPENAI_EXHAUSTED_KEY) => Err(error(
            429,
            "Rate limit reached for requests on this key. Please try again in 20s.",
            "requests",
            None,
            Some("rate_limit_exceeded"),
        )
        .header("retry-after", "20")),
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

fn invalid(message: &str, param: Option<&str>, code: Option<&str>) -> Reply {
    error(400, message, "invalid_request_error", param, code)
}

fn error(status: u16, message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Reply {
    let body = json!({"error": {"message": message, "type": kind, "param": param, "code": code}});
    Reply::json(status, &body).header("x-request-id", &request_id())
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
