//! Tests of the fake providers over real HTTP/1.1 (a raw `TcpStream` client), and of
//! their shapes against the recorded payloads in `tests/fixtures/`.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use waygate_fakes::{ANTHROPIC_KEY, FakeProviders, GEMINI_KEY, OPENAI_KEY};

// ---------------------------------------------------------------- client helpers

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// HTTP chunks of a chunked body (one per event the server wrote).
    chunks: usize,
    /// The body ended cleanly (terminating chunk, or the whole content-length).
    complete: bool,
}

impl Resp {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// `data:` payloads of an SSE body (`[DONE]` kept as a string).
    fn data(&self) -> Vec<Value> {
        sse_data(&self.text())
    }
}

fn sse_data(text: &str) -> Vec<Value> {
    text.replace("\r\n", "\n")
        .split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.to_owned())))
        .collect()
}

fn sse_names(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("event: ")))
        .map(str::to_owned)
        .collect()
}

fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n");
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read: {e}"),
        }
    }
    parse(&raw)
}

fn parse(raw: &[u8]) -> Resp {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("no response head");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let rest = &raw[split + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let find = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    if find("transfer-encoding").as_deref() == Some("chunked") {
        let (body, chunks, complete) = dechunk(rest);
        return Resp {
            status,
            headers,
            body,
            chunks,
            complete,
        };
    }
    let complete = find("content-length").is_none_or(|l| l.parse::<usize>().unwrap() == rest.len());
    Resp {
        status,
        headers,
        body: rest.to_vec(),
        chunks: 1,
        complete,
    }
}

fn dechunk(mut rest: &[u8]) -> (Vec<u8>, usize, bool) {
    let (mut body, mut chunks) = (Vec::new(), 0);
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (body, chunks, false);
        };
        let size_line = String::from_utf8_lossy(&rest[..eol]).into_owned();
        let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return (body, chunks, true);
        }
        let start = eol + 2;
        if rest.len() < start + size + 2 {
            body.extend_from_slice(&rest[start.min(rest.len())..]);
            return (body, chunks, false);
        }
        body.extend_from_slice(&rest[start..start + size]);
        chunks += 1;
        rest = &rest[start + size + 2..];
    }
}

fn start() -> FakeProviders {
    FakeProviders::start("127.0.0.1:0".parse().unwrap()).unwrap()
}

fn openai(f: &FakeProviders, path: &str, body: &Value) -> Resp {
    let auth = format!("Bearer {OPENAI_KEY}");
    let headers = [("authorization", auth.as_str()), ("content-type", "application/json")];
    send(f.addr(), "POST", path, &headers, body.to_string().as_bytes())
}

fn anthropic(f: &FakeProviders, body: &Value) -> Resp {
    let headers = [
        ("x-api-key", ANTHROPIC_KEY),
        ("anthropic-version", "2023-06-01"),
        ("content-type", "application/json"),
    ];
    send(f.addr(), "POST", "/v1/messages", &headers, body.to_string().as_bytes())
}

fn gemini(f: &FakeProviders, model: &str, stream: bool, body: &Value) -> Resp {
    let path = if stream {
        format!("/v1beta/models/{model}:streamGenerateContent?alt=sse")
    } else {
        format!("/v1beta/models/{model}:generateContent")
    };
    let headers = [("x-goog-api-key", GEMINI_KEY), ("content-type", "application/json")];
    send(f.addr(), "POST", &path, &headers, body.to_string().as_bytes())
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Say hello to the test suite"}]})
}

fn with(mut base: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

fn messages(model: &str) -> Value {
    json!({"model": model, "max_tokens": 100, "messages": [{"role": "user", "content": "Say hello to the test suite"}]})
}

fn contents() -> Value {
    json!({"contents": [{"role": "user", "parts": [{"text": "Say hello to the test suite"}]}]})
}

fn weather_tool_schema() -> Value {
    json!({"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]})
}

// ---------------------------------------------------------------- fixture helpers

fn fixture(rel: &str) -> String {
    let path = format!("{}/../tests/fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn fixture_json(rel: &str) -> Value {
    serde_json::from_str(&fixture(rel)).unwrap()
}

/// Keys the real API sends that the fakes leave out on purpose.
const NOT_FAKED: &[&str] = &[
    "obfuscation",
    "thoughtsTokenCount",
    "thoughtSignature",
    "caller",
    "inference_geo",
    "cache_creation",
];
/// Keys whose value is the caller's data (tool arguments): only its JSON type is compared.
const OPAQUE: &[&str] = &["args", "input"];

/// Every key of the recorded payload is in the fake's, with the same JSON type (null
/// matches anything: nullable fields).
fn assert_shape(real: &Value, fake: &Value, at: &str) {
    match (real, fake) {
        (Value::Null, _) | (_, Value::Null) => {}
        (Value::Object(r), Value::Object(f)) => {
            for (k, rv) in r.iter().filter(|(k, _)| !NOT_FAKED.contains(&k.as_str())) {
                let fv = f
                    .get(k)
                    .unwrap_or_else(|| panic!("{at}.{k} missing from the fake's {fake}"));
                if OPAQUE.contains(&k.as_str()) {
                    assert_eq!(kind(rv), kind(fv), "{at}.{k}");
                } else {
                    assert_shape(rv, fv, &format!("{at}.{k}"));
                }
            }
        }
        (Value::Array(r), Value::Array(f)) => {
            for rv in r {
                let tag = |v: &Value| v.get("type").or_else(|| v.get("@type")).cloned();
                let peer = match tag(rv) {
                    Some(t) => f.iter().find(|fv| tag(fv) == Some(t.clone())),
                    None => f.first(),
                };
                if let Some(fv) = peer {
                    assert_shape(rv, fv, &format!("{at}[]"));
                }
            }
        }
        (r, f) => assert_eq!(kind(r), kind(f), "{at}: recorded {r} vs fake {f}"),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

// ---------------------------------------------------------------- OpenAI

#[test]
fn openai_chat_ok_json_has_the_recorded_shape() {
    let f = start();
    let r = openai(&f, "/v1/chat/completions", &chat("ok"));
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("application/json"));
    let body = r.json();
    assert_shape(&fixture_json("openai/chat_completion.json"), &body, "$");
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "ok");
    assert_eq!(body["choices"][0]["message"]["content"], "Hello from openai fake.");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let usage = &body["usage"];
    assert_eq!(usage["prompt_tokens"], 6);
    assert_eq!(usage["completion_tokens"], 4);
    assert_eq!(usage["total_tokens"], 10);
}

#[test]
fn openai_chat_stream_with_include_usage_is_chunked_like_openai() {
    let f = start();
    let body = with(
        chat("ok"),
        json!({"stream": true, "stream_options": {"include_usage": true}}),
    );
    let r = openai(&f, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
    assert!(r.complete);
    let data = r.data();
    assert_eq!(r.chunks, data.len(), "each event is its own write");
    assert_eq!(data.last().unwrap(), "[DONE]");
    let recorded = sse_data(&fixture("openai/chat_completion_stream_include_usage.sse"));
    assert_shape(&recorded[0], &data[0], "first");
    let usage_chunk = &data[data.len() - 2];
    assert_shape(&recorded[recorded.len() - 2], usage_chunk, "usage chunk");
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 4);
    let chunks = &data[..data.len() - 2];
    assert!(chunks.iter().all(|c| c["usage"].is_null() && c.get("usage").is_some()));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello from openai fake.");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");
    let ids: Vec<&Value> = chunks.iter().map(|c| &c["id"]).collect();
    assert!(ids.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn openai_stream_without_include_usage_has_no_usage() {
    let f = start();
    let r = openai(&f, "/v1/chat/completions", &with(chat("ok"), json!({"stream": true})));
    let data = r.data();
    assert!(data.iter().all(|c| c.get("usage").is_none()));
    assert_shape(
        &sse_data(&fixture("openai/chat_completion_stream.sse"))[1],
        &data[1],
        "content chunk",
    );
}

#[test]
fn openai_legacy_completions_json_and_stream() {
    let f = start();
    let body = json!({"model": "ok", "prompt": "Say hello"});
    let r = openai(&f, "/v1/completions", &body);
    assert_eq!(r.status, 200);
    let json = r.json();
    assert_shape(&fixture_json("openai/completion.json"), &json, "$");
    assert_eq!(json["choices"][0]["text"], "Hello from openai fake.");
    let stream = with(body, json!({"stream": true, "stream_options": {"include_usage": true}}));
    let data = openai(&f, "/v1/completions", &stream).data();
    let recorded = sse_data(&fixture("openai/completion_stream_include_usage.sse"));
    assert_shape(&recorded[0], &data[0], "chunk");
    assert_shape(&recorded[recorded.len() - 2], &data[data.len() - 2], "usage chunk");
    assert_eq!(data[data.len() - 3]["choices"][0]["finish_reason"], "stop");
}

#[test]
fn openai_tool_call_json_and_parallel_stream() {
    let f = start();
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": weather_tool_schema()}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
    ]);
    let r = openai(&f, "/v1/chat/completions", &with(chat("tool"), json!({"tools": tools})));
    let body = r.json();
    assert_shape(&fixture_json("openai/chat_completion_tool_calls.json"), &body, "$");
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    let call = &body["choices"][0]["message"]["tool_calls"][0];
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args["location"].is_string());

    let stream = with(
        chat("tools"),
        json!({"tools": tools, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let data = openai(&f, "/v1/chat/completions", &stream).data();
    let recorded = sse_data(&fixture("openai/chat_completion_stream_parallel_tool_calls.sse"));
    for (real, fake) in recorded.iter().zip(&data).take(3) {
        assert_shape(real, fake, "tool chunk");
    }
    let mut args = [String::new(), String::new()];
    for chunk in &data[..data.len() - 1] {
        for call in chunk["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = call["index"].as_u64().unwrap() as usize;
            args[i].push_str(call["function"]["arguments"].as_str().unwrap());
        }
    }
    assert!(
        args.iter()
            .all(|a| serde_json::from_str::<Value>(a).unwrap().is_object())
    );
}

#[test]
fn openai_checks_credentials() {
    let f = start();
    let body = chat("ok").to_string();
    let missing = send(f.addr(), "POST", "/v1/chat/completions", &[], body.as_bytes());
    assert_eq!(missing.status, 401);
    assert!(
        missing.json()["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("You didn't provide an API key")
    );
    let wrong = send(
        f.addr(),
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer sk-wrong-key-123456")],
        body.as_bytes(),
    );
    assert_eq!(wrong.status, 401);
    assert_shape(
        &fixture_json("openai/error_401_invalid_api_key.json"),
        &wrong.json(),
        "$",
    );
    assert_eq!(wrong.json()["error"]["code"], "invalid_api_key");
    assert!(!wrong.text().contains("sk-wrong-key-123456"));
}

#[test]
fn openai_refuses_what_the_real_api_refuses() {
    let f = start();
    let auth = format!("Bearer {OPENAI_KEY}");
    let not_json = send(
        f.addr(),
        "POST",
        "/v1/chat/completions",
        &[("authorization", &auth)],
        b"{nope",
    );
    assert_eq!(not_json.status, 400);
    assert_shape(
        &fixture_json("openai/error_400_unsupported_parameter.json"),
        &not_json.json(),
        "$",
    );
    let cases = [
        (json!({"model": "ok"}), Some("messages")),
        (with(chat("ok"), json!({"waygate": {"routing": {}}})), None),
        (
            with(chat("ok"), json!({"stream_options": {"include_usage": true}})),
            Some("stream_options"),
        ),
        (with(chat("ok"), json!({"temperature": 3})), Some("temperature")),
        (
            json!({"model": "ok", "messages": [{"role": "tool", "tool_call_id": "call_1", "content": "x"}]}),
            Some("messages.[0].role"),
        ),
        (
            json!({"model": "ok", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": {}}}]}]}),
            Some("messages[1].tool_calls[0].function.arguments"),
        ),
    ];
    for (body, param) in cases {
        let r = openai(&f, "/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["param"].as_str(), param, "{body}");
    }
    let not_found = send(f.addr(), "GET", "/v1/nothing", &[("authorization", &auth)], b"");
    assert_eq!(not_found.status, 404);
}

#[test]
fn openai_models_list() {
    let f = start();
    let auth = format!("Bearer {OPENAI_KEY}");
    let r = send(f.addr(), "GET", "/v1/models", &[("authorization", &auth)], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["object"], "list");
    assert!(r.json()["data"].as_array().unwrap().iter().any(|m| m["id"] == "ok"));
}

#[test]
fn openai_max_tokens_and_json_mode() {
    let f = start();
    let r = openai(
        &f,
        "/v1/chat/completions",
        &with(chat("long-10"), json!({"max_tokens": 3})),
    );
    let body = r.json();
    assert_eq!(body["choices"][0]["message"]["content"], "word1 word2 word3");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 3);
    let r = openai(
        &f,
        "/v1/chat/completions",
        &with(chat("ok"), json!({"response_format": {"type": "json_object"}})),
    );
    let text = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(serde_json::from_str::<Value>(&text).unwrap().is_object());
}

// ---------------------------------------------------------------- steering (all providers)

#[test]
fn status_429_carries_retry_after_on_every_provider() {
    let f = start();
    let r = openai(&f, "/v1/chat/completions", &chat("status-429"));
    assert_eq!((r.status, r.header("retry-after")), (429, Some("7")));
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    let r = anthropic(&f, &messages("claude-status-429"));
    assert_eq!((r.status, r.header("retry-after")), (429, Some("7")));
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    let r = gemini(&f, "status-429", false, &contents());
    assert_eq!((r.status, r.header("retry-after")), (429, Some("7")));
    assert_shape(
        &fixture_json("gemini/error_429_resource_exhausted.json"),
        &r.json(),
        "$",
    );
    assert_eq!(r.json()["error"]["status"], "RESOURCE_EXHAUSTED");
    let r = anthropic(&f, &messages("status-529"));
    assert_eq!(r.status, 529);
    assert_shape(&fixture_json("anthropic/error_529_overloaded.json"), &r.json(), "$");
    assert_eq!(r.json()["error"]["type"], "overloaded_error");
    let r = openai(
        &f,
        "/v1/chat/completions",
        &with(chat("status-503"), json!({"stream": true})),
    );
    assert_eq!(r.status, 503);
}

#[test]
fn cut_closes_streams_without_the_terminal_event() {
    let f = start();
    let r = openai(
        &f,
        "/v1/chat/completions",
        &with(chat("cut-3"), json!({"stream": true})),
    );
    assert_eq!(r.status, 200);
    assert!(!r.complete, "no terminating chunk");
    assert_eq!(r.data().len(), 3);
    assert!(!r.text().contains("[DONE]"));

    let r = anthropic(&f, &with(messages("cut-5"), json!({"stream": true})));
    assert!(!r.complete);
    assert_eq!(sse_names(&r.text()).len(), 5);
    assert!(!r.text().contains("message_stop"));

    let r = gemini(&f, "cut-100", true, &contents());
    assert!(!r.complete);
    assert!(!r.data().is_empty());
    assert!(
        !r.text().contains("finishReason"),
        "the finishing chunk is the terminal one"
    );

    let r = openai(&f, "/v1/chat/completions", &chat("cut-1"));
    assert_eq!(r.status, 200);
    assert!(!r.complete, "half a body");
    assert!(serde_json::from_slice::<Value>(&r.body).is_err());
}

#[test]
fn echo_reflects_what_was_received() {
    let f = start();
    let body = with(chat("echo"), json!({"temperature": 0.5}));
    let r = openai(&f, "/v1/chat/completions", &body);
    let text = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let echoed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(echoed["method"], "POST");
    assert_eq!(echoed["path"], "/v1/chat/completions");
    assert_eq!(echoed["body"], body);
    assert_eq!(echoed["headers"]["authorization"], format!("Bearer {OPENAI_KEY}"));

    let r = gemini(&f, "echo", true, &contents());
    let text: String = r
        .data()
        .iter()
        .filter_map(|c| c["candidates"][0]["content"]["parts"][0]["text"].as_str())
        .collect();
    let echoed: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(echoed["query"], "alt=sse");
    assert_eq!(echoed["body"], contents());
}

#[test]
fn slow_garbage_long_and_json() {
    let f = start();
    let t = Instant::now();
    assert_eq!(openai(&f, "/v1/chat/completions", &chat("slow-300")).status, 200);
    assert!(t.elapsed() >= Duration::from_millis(300));

    let r = anthropic(&f, &messages("garbage"));
    assert_eq!(r.status, 200);
    assert!(serde_json::from_slice::<Value>(&r.body).is_err());
    let r = gemini(&f, "garbage", true, &contents());
    assert!(
        r.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .any(|d| serde_json::from_str::<Value>(d.trim()).is_err())
    );

    let r = anthropic(&f, &with(messages("long-6"), json!({"stream": true})));
    let deltas: Vec<Value> = r
        .data()
        .into_iter()
        .filter(|d| d["type"] == "content_block_delta")
        .collect();
    assert_eq!(deltas.len(), 6);
    let r = anthropic(&f, &messages("json"));
    let text = r.json()["content"][0]["text"].as_str().unwrap().to_owned();
    assert!(serde_json::from_str::<Value>(&text).unwrap().is_object());
}

#[test]
fn requests_are_recorded() {
    let f = start();
    openai(&f, "/v1/chat/completions", &chat("ok"));
    gemini(&f, "ok", true, &contents());
    let got = f.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].method, "POST");
    assert_eq!(got[0].path, "/v1/chat/completions");
    assert_eq!(
        got[0].header("authorization"),
        Some(format!("Bearer {OPENAI_KEY}").as_str())
    );
    assert!(got[0].headers.iter().all(|(n, _)| *n == n.to_ascii_lowercase()));
    assert_eq!(serde_json::from_slice::<Value>(&got[0].body).unwrap(), chat("ok"));
    assert_eq!(got[1].path, "/v1beta/models/ok:streamGenerateContent?alt=sse");
    assert_eq!(got[1].query_param("alt"), Some("sse"));
    assert!(got[1].header("authorization").is_none());
    f.clear_received();
    assert!(f.received().is_empty());
}

#[test]
fn drop_stops_the_server() {
    let f = start();
    let addr = f.addr();
    drop(f);
    assert!(TcpStream::connect_timeout(&addr, Duration::from_millis(500)).is_err());
}

// ---------------------------------------------------------------- Anthropic

#[test]
fn anthropic_ok_json_and_stream_have_the_recorded_shapes() {
    let f = start();
    let r = anthropic(&f, &messages("ok"));
    assert_eq!(r.status, 200);
    let body = r.json();
    assert_shape(&fixture_json("anthropic/message.json"), &body, "$");
    assert_eq!(body["content"][0]["text"], "Hello from anthropic fake.");
    assert_eq!(body["stop_reason"], "end_turn");
    assert_eq!(
        (
            body["usage"]["input_tokens"].as_u64(),
            body["usage"]["output_tokens"].as_u64()
        ),
        (Some(6), Some(4))
    );

    let r = anthropic(&f, &with(messages("ok"), json!({"stream": true})));
    assert!(r.complete);
    let names = sse_names(&r.text());
    let expected = [
        "message_start",
        "content_block_start",
        "ping",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ];
    assert_eq!(names, expected);
    assert_eq!(r.chunks, names.len());
    let data = r.data();
    for real in sse_data(&fixture("anthropic/message_stream.sse")) {
        let fake = data.iter().find(|d| d["type"] == real["type"]).unwrap();
        assert_shape(&real, fake, real["type"].as_str().unwrap());
    }
    let text: String = data.iter().filter_map(|d| d["delta"]["text"].as_str()).collect();
    assert_eq!(text, "Hello from anthropic fake.");
    let last_delta = data.iter().find(|d| d["type"] == "message_delta").unwrap();
    assert_eq!(last_delta["delta"]["stop_reason"], "end_turn");
    assert_eq!(last_delta["usage"]["output_tokens"], 4);
}

#[test]
fn anthropic_tool_use_json_and_stream() {
    let f = start();
    let tools = json!([{"name": "get_weather", "description": "Weather", "input_schema": weather_tool_schema()}]);
    let r = anthropic(&f, &with(messages("tool"), json!({"tools": tools})));
    let body = r.json();
    assert_shape(&fixture_json("anthropic/message_tool_use.json"), &body, "$");
    assert_eq!(body["stop_reason"], "tool_use");
    assert_eq!(body["content"][0]["name"], "get_weather");
    assert!(body["content"][0]["input"]["location"].is_string());

    let r = anthropic(&f, &with(messages("tool"), json!({"tools": tools, "stream": true})));
    let data = r.data();
    for real in sse_data(&fixture("anthropic/message_stream_tool_use.sse"))
        .iter()
        .filter(|d| d.to_string().contains("tool_use") || d["delta"]["type"] == "input_json_delta")
    {
        let fake = data
            .iter()
            .find(|d| d["type"] == real["type"] && d["delta"]["type"] == real["delta"]["type"])
            .unwrap();
        assert_shape(real, fake, real["type"].as_str().unwrap());
    }
    let json: String = data
        .iter()
        .filter_map(|d| d["delta"]["partial_json"].as_str())
        .collect();
    assert!(serde_json::from_str::<Value>(&json).unwrap()["location"].is_string());
}

#[test]
fn anthropic_checks_headers_and_body() {
    let f = start();
    let body = messages("ok").to_string();
    let no_key = send(
        f.addr(),
        "POST",
        "/v1/messages",
        &[("anthropic-version", "2023-06-01")],
        body.as_bytes(),
    );
    assert_eq!(no_key.status, 401);
    let wrong = send(
        f.addr(),
        "POST",
        "/v1/messages",
        &[("x-api-key", "nope"), ("anthropic-version", "2023-06-01")],
        body.as_bytes(),
    );
    assert_eq!(wrong.status, 401);
    assert_shape(
        &fixture_json("anthropic/error_401_authentication.json"),
        &wrong.json(),
        "$",
    );
    assert_shape(&fixture_json("anthropic/error_404_not_found.json"), &wrong.json(), "$");
    let no_version = send(
        f.addr(),
        "POST",
        "/v1/messages",
        &[("x-api-key", ANTHROPIC_KEY)],
        body.as_bytes(),
    );
    assert_eq!(no_version.status, 400);
    assert_eq!(
        no_version.json()["error"]["message"],
        "anthropic-version: header is required"
    );
    let cases = [
        (
            json!({"model": "ok", "messages": [{"role": "user", "content": "hi"}]}),
            "max_tokens: Field required",
        ),
        (json!({"model": "ok", "max_tokens": 10}), "messages: Field required"),
        (
            with(messages("ok"), json!({"seed": 1})),
            "seed: Extra inputs are not permitted",
        ),
        (
            with(messages("ok"), json!({"temperature": 1.5})),
            "temperature: Input should be less than or equal to 1",
        ),
        (
            json!({"model": "ok", "max_tokens": 10, "messages": [{"role": "system", "content": "hi"}]}),
            "messages.0.role: Input should be 'user' or 'assistant'",
        ),
        (
            json!({"model": "ok", "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x"}]}]}),
            "unexpected `tool_use_id`",
        ),
    ];
    for (body, message) in cases {
        let r = anthropic(&f, &body);
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["type"], "error");
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
        assert!(
            r.json()["error"]["message"].as_str().unwrap().contains(message),
            "{}",
            r.text()
        );
    }
}

#[test]
fn anthropic_stream_error_event() {
    let f = start();
    let r = anthropic(&f, &with(messages("stream-error"), json!({"stream": true})));
    let names = sse_names(&r.text());
    assert_eq!(names.last().unwrap(), "error");
    assert!(!names.contains(&"message_stop".to_owned()));
    let error = r.data().pop().unwrap();
    assert_shape(
        &sse_data(&fixture("anthropic/stream_error_event.sse"))[0],
        &error,
        "error",
    );
}

// ---------------------------------------------------------------- Gemini

#[test]
fn gemini_ok_json_and_sse_have_the_recorded_shapes() {
    let f = start();
    let r = gemini(&f, "ok", false, &contents());
    assert_eq!(r.status, 200);
    let body = r.json();
    assert_shape(&fixture_json("gemini/generate_content.json"), &body, "$");
    assert_eq!(
        body["candidates"][0]["content"]["parts"][0]["text"],
        "Hello from gemini fake."
    );
    assert_eq!(body["candidates"][0]["finishReason"], "STOP");
    assert_eq!(body["usageMetadata"]["candidatesTokenCount"], 4);

    let r = gemini(&f, "ok", true, &contents());
    assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
    assert!(r.text().ends_with("}\r\n\r\n"), "alt=sse framing");
    let data = r.data();
    assert_eq!(r.chunks, data.len());
    let recorded = sse_data(&fixture("gemini/stream_generate_content.sse"));
    assert_shape(&recorded[0], &data[0], "chunk");
    assert_shape(&recorded[recorded.len() - 1], &data[data.len() - 1], "last chunk");
    let finishes = data
        .iter()
        .filter(|c| c["candidates"][0].get("finishReason").is_some())
        .count();
    assert_eq!(finishes, 1);
    assert_eq!(data.last().unwrap()["usageMetadata"]["candidatesTokenCount"], 4);
    let text: String = data
        .iter()
        .filter_map(|c| c["candidates"][0]["content"]["parts"][0]["text"].as_str())
        .collect();
    assert_eq!(text, "Hello from gemini fake.");
}

#[test]
fn gemini_function_calls() {
    let f = start();
    let decls = json!([{"functionDeclarations": [
        {"name": "add", "parameters": {"type": "OBJECT", "properties": {"a": {"type": "INTEGER"}, "b": {"type": "INTEGER"}}, "required": ["a", "b"]}},
        {"name": "multiply", "parameters": {"type": "OBJECT", "properties": {"a": {"type": "INTEGER"}}}}]}]);
    let body = with(contents(), json!({"tools": decls}));
    let r = gemini(&f, "tool", false, &body);
    let json = r.json();
    assert_shape(&fixture_json("gemini/generate_content_function_call.json"), &json, "$");
    assert_eq!(
        json["candidates"][0]["content"]["parts"][0]["functionCall"],
        json!({"name": "add", "args": {"a": 2, "b": 2}})
    );
    let r = gemini(&f, "tools", true, &body);
    let data = r.data();
    assert_shape(
        &sse_data(&fixture("gemini/stream_generate_content_parallel_function_calls.sse"))[0],
        &data[0],
        "chunk",
    );
    assert_eq!(
        data[0]["candidates"][0]["content"]["parts"].as_array().unwrap().len(),
        2
    );
}

#[test]
fn gemini_checks_key_and_body() {
    let f = start();
    let body = contents().to_string();
    let path = "/v1beta/models/ok:generateContent";
    let none = send(f.addr(), "POST", path, &[], body.as_bytes());
    assert_eq!(none.status, 403);
    assert_shape(
        &fixture_json("gemini/error_403_permission_denied.json"),
        &none.json(),
        "$",
    );
    let wrong = send(f.addr(), "POST", path, &[("x-goog-api-key", "nope")], body.as_bytes());
    assert_eq!(wrong.status, 400);
    assert_shape(
        &fixture_json("gemini/error_400_api_key_invalid.json"),
        &wrong.json(),
        "$",
    );
    let by_query = send(
        f.addr(),
        "POST",
        &format!("{path}?key={GEMINI_KEY}"),
        &[],
        body.as_bytes(),
    );
    assert_eq!(by_query.status, 200);
    let cases = [
        json!({}),
        json!({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "max_tokens": 5}),
        json!({"contents": [{"role": "user", "parts": [{"text": "x"}]}], "generationConfig": {"max_tokens": 5}}),
        json!({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}),
        json!({"contents": [{"role": "user", "parts": []}]}),
        json!({"contents": [{"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]}]}),
    ];
    for body in cases {
        let r = gemini(&f, "ok", false, &body);
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["status"], "INVALID_ARGUMENT");
    }
    let snake = json!({"contents": [{"parts": [{"text": "x"}]}], "generation_config": {"max_output_tokens": 1}, "system_instruction": {"parts": [{"text": "be brief"}]}});
    let r = gemini(&f, "ok", false, &snake);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["candidates"][0]["finishReason"], "MAX_TOKENS");
}

// ---------------------------------------------------------------- fixtures

#[test]
fn every_fixture_is_listed_in_its_sources() {
    let root = format!("{}/../tests/fixtures", env!("CARGO_MANIFEST_DIR"));
    for provider in ["openai", "anthropic", "gemini"] {
        let sources = fixture(&format!("{provider}/SOURCES.md"));
        let listed: Vec<String> = sources
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .map(str::to_owned)
            .collect();
        let mut files: Vec<String> = std::fs::read_dir(format!("{root}/{provider}"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != "SOURCES.md")
            .collect();
        files.sort();
        let mut sorted = listed.clone();
        sorted.sort();
        assert_eq!(files, sorted, "{provider}: files vs SOURCES.md");
        for name in files.iter().filter(|n| n.ends_with(".json")) {
            serde_json::from_str::<Value>(&fixture(&format!("{provider}/{name}"))).unwrap();
        }
        for name in files.iter().filter(|n| n.ends_with(".sse")) {
            let data = sse_data(&fixture(&format!("{provider}/{name}")));
            assert!(
                !data.is_empty() && data.iter().all(|d| d.is_object() || d == "[DONE]"),
                "{name}"
            );
        }
    }
}

#[test]
fn anthropic_takes_system_turns_and_newer_versions_as_claude_code_sends_them() {
    let f = start();
    let body = json!({"model": "ok", "max_tokens": 10, "output_config": {"effort": "medium"},
        "messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "# Environment"}]});
    let send_with = |beta: &str, version: &str| {
        let headers = [
            ("x-api-key", ANTHROPIC_KEY),
            ("anthropic-version", version),
            ("anthropic-beta", beta),
            ("content-type", "application/json"),
        ];
        send(f.addr(), "POST", "/v1/messages", &headers, body.to_string().as_bytes())
    };
    let r = send_with("claude-code-20250219,per-turn-control-2026-07-01", "2026-10-21");
    assert_eq!(r.status, 200, "{}", r.text());
    // Without the beta, a system turn is refused, as the real API refuses it.
    let r = send_with("claude-code-20250219", "2023-06-01");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("messages.1.role"), "{}", r.text());
}
