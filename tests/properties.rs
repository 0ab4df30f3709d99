//! Properties on generated inputs (proptest), natively on the core:
//!
//! - every stream translator (OpenAI, Anthropic, Gemini shapes) gives the
//!   same client stream under every chunking of a generated event sequence
//!   (whole, byte by byte, and generated split points), carries the text it
//!   was given, and ends with `[DONE]` or exactly one error event;
//! - a provider credential split anywhere across content deltas never
//!   reaches the client of a redacting stream;
//! - every error path of a request (headers, body, routing, the provider's
//!   answer) yields the contract's envelope.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::collections::HashMap;
use std::rc::Rc;

use proptest::prelude::*;
use serde_json::{Value, json};
use waygate::answer::Stamp;
use waygate::config::{Api, Config};
use waygate::exchange::{CallStep, Exchange, HeadersAction, ResponseAction};
use waygate::limits::{SharedStore, StoreError};
use waygate::providers;
use waygate::request::{self, Operation};
use waygate::stream::StreamRewriter;

// ---- generated provider streams ---------------------------------------------------

/// One thing a provider says in a stream.
#[derive(Debug, Clone)]
enum Step {
    Text(String),
    /// A tool call: its name and its arguments in pieces.
    Tool(String, Vec<String>),
    /// A keep-alive: an SSE comment, or Anthropic's `ping`.
    KeepAlive,
}

/// How the provider's stream ends.
#[derive(Debug, Clone)]
enum Ending {
    Complete,
    /// The connection closes after the last step, before the end.
    Cut,
    /// The provider's own in-stream error.
    Error(String),
    /// The connection closes inside an event: its first `at` bytes only.
    MidEvent(usize),
}

fn text() -> impl Strategy<Value = String> {
    // Multi-byte characters, quotes, backslashes, newlines and `data:` look-alikes.
    prop::collection::vec(
        prop_oneof![
            "[a-zA-Z0-9 ]{1,8}",
            Just("é".to_string()),
            Just("✓".to_string()),
            Just("🎉".to_string()),
            Just("\"".to_string()),
            Just("\\".to_string()),
            Just("\n".to_string()),
            Just("\r\n".to_string()),
            Just("data: [DONE]".to_string()),
        ],
        1..6,
    )
    .prop_map(|parts| parts.concat())
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => text().prop_map(Step::Text),
        1 => ("[a-z_]{1,8}", prop::collection::vec("[a-z0-9\":{}, ]{0,6}", 0..4)).prop_map(|(n, a)| Step::Tool(n, a)),
        1 => Just(Step::KeepAlive),
    ]
}

fn ending() -> impl Strategy<Value = Ending> {
    prop_oneof![
        6 => Just(Ending::Complete),
        1 => Just(Ending::Cut),
        1 => "[a-z ]{1,12}".prop_map(Ending::Error),
        1 => (1usize..40).prop_map(Ending::MidEvent),
    ]
}

/// `\n`, `\r\n` or `\r`, per stream.
fn line_end() -> impl Strategy<Value = &'static str> {
    prop_oneof![Just("\n"), Just("\r\n"), Just("\r")]
}

struct Rendered {
    bytes: Vec<u8>,
    /// The text the client must receive, in order.
    text: String,
    /// Whether the stream must end with `[DONE]` (else with the error event).
    complete: bool,
}

/// Frames events with the chosen line ending.
struct Writer {
    out: Vec<u8>,
    eol: &'static str,
}

impl Writer {
    fn event(&mut self, name: Option<&str>, data: &Value) {
        if let Some(name) = name {
            self.out
                .extend_from_slice(format!("event: {name}{}", self.eol).as_bytes());
        }
        self.out
            .extend_from_slice(format!("data: {data}{}{}", self.eol, self.eol).as_bytes());
    }

    fn comment(&mut self) {
        self.out
            .extend_from_slice(format!(": keep-alive{}{}", self.eol, self.eol).as_bytes());
    }

    fn raw(&mut self, data: &str) {
        self.out
            .extend_from_slice(format!("data: {data}{}{}", self.eol, self.eol).as_bytes());
    }
}

fn texts(steps: &[Step]) -> String {
    steps
        .iter()
        .filter_map(|s| match s {
            Step::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

fn finish(w: Writer, steps: &[Step], ending: &Ending, last_event: Vec<u8>) -> Rendered {
    let mut bytes = w.out;
    let complete = match ending {
        Ending::Complete => {
            bytes.extend_from_slice(&last_event);
            true
        }
        Ending::MidEvent(at) => {
            bytes.extend_from_slice(&last_event[..(*at).min(last_event.len() - 1)]);
            false
        }
        Ending::Cut | Ending::Error(_) => false,
    };
    Rendered {
        bytes,
        text: texts(steps),
        complete,
    }
}

fn openai(steps: &[Step], ending: &Ending, eol: &'static str) -> Rendered {
    let mut w = Writer { out: Vec::new(), eol };
    let chunk = |delta: Value, finish: Value| {
        json!({"id": "up", "object": "chat.completion.chunk", "created": 1, "model": "gpt",
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    };
    w.event(None, &chunk(json!({"role": "assistant", "content": ""}), Value::Null));
    let mut calls = 0;
    for s in steps {
        match s {
            Step::Text(t) => w.event(None, &chunk(json!({"content": t}), Value::Null)),
            Step::Tool(name, args) => {
                let start = json!({"tool_calls": [{"index": calls, "id": format!("call_{calls}"), "type": "function",
                                                   "function": {"name": name, "arguments": ""}}]});
                w.event(None, &chunk(start, Value::Null));
                for a in args {
                    let piece = json!({"tool_calls": [{"index": calls, "function": {"arguments": a}}]});
                    w.event(None, &chunk(piece, Value::Null));
                }
                calls += 1;
            }
            Step::KeepAlive => w.comment(),
        }
    }
    if let Ending::Error(m) = ending {
        w.event(None, &json!({"error": {"message": m, "type": "server_error"}}));
    }
    let mut tail = Writer { out: Vec::new(), eol };
    tail.event(None, &chunk(json!({}), json!("stop")));
    tail.event(
        None,
        &json!({"id": "up", "object": "chat.completion.chunk", "created": 1, "model": "gpt", "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}),
    );
    tail.raw("[DONE]");
    finish(w, steps, ending, tail.out)
}

fn anthropic(steps: &[Step], ending: &Ending, eol: &'static str) -> Rendered {
    let mut w = Writer { out: Vec::new(), eol };
    w.event(
        Some("message_start"),
        &json!({"type": "message_start", "message": {"id": "msg", "type": "message", "role": "assistant",
                "content": [], "usage": {"input_tokens": 3, "output_tokens": 1}}}),
    );
    for (index, s) in steps.iter().enumerate() {
        match s {
            Step::Text(t) => {
                w.event(
                    Some("content_block_start"),
                    &json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
                );
                w.event(
                    Some("content_block_delta"),
                    &json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": t}}),
                );
                w.event(
                    Some("content_block_stop"),
                    &json!({"type": "content_block_stop", "index": index}),
                );
            }
            Step::Tool(name, args) => {
                w.event(
                    Some("content_block_start"),
                    &json!({"type": "content_block_start", "index": index,
                            "content_block": {"type": "tool_use", "id": format!("toolu_{index}"), "name": name, "input": {}}}),
                );
                for a in args {
                    w.event(
                        Some("content_block_delta"),
                        &json!({"type": "content_block_delta", "index": index,
                                "delta": {"type": "input_json_delta", "partial_json": a}}),
                    );
                }
                w.event(
                    Some("content_block_stop"),
                    &json!({"type": "content_block_stop", "index": index}),
                );
            }
            Step::KeepAlive => w.event(Some("ping"), &json!({"type": "ping"})),
        }
    }
    if let Ending::Error(m) = ending {
        w.event(
            Some("error"),
            &json!({"type": "error", "error": {"type": "overloaded_error", "message": m}}),
        );
    }
    let mut tail = Writer { out: Vec::new(), eol };
    tail.event(
        Some("message_delta"),
        &json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                "usage": {"output_tokens": 5}}),
    );
    tail.event(Some("message_stop"), &json!({"type": "message_stop"}));
    finish(w, steps, ending, tail.out)
}

fn gemini(steps: &[Step], ending: &Ending, eol: &'static str) -> Rendered {
    let mut w = Writer { out: Vec::new(), eol };
    let response = |parts: Value, finish: Option<&str>| {
        let mut candidate = json!({"content": {"parts": parts, "role": "model"}, "index": 0});
        if let Some(f) = finish {
            candidate["finishReason"] = f.into();
        }
        json!({"candidates": [candidate], "responseId": "r1",
               "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 5, "totalTokenCount": 8}})
    };
    for s in steps {
        match s {
            Step::Text(t) => w.event(None, &response(json!([{"text": t}]), None)),
            Step::Tool(name, args) => w.event(
                None,
                &response(
                    json!([{"functionCall": {"name": name, "args": {"pieces": args}}}]),
                    None,
                ),
            ),
            Step::KeepAlive => w.comment(),
        }
    }
    if let Ending::Error(m) = ending {
        w.event(
            None,
            &json!({"error": {"code": 503, "message": m, "status": "UNAVAILABLE"}}),
        );
    }
    let mut tail = Writer { out: Vec::new(), eol };
    tail.event(None, &response(json!([{"text": ""}]), Some("STOP")));
    finish(w, steps, ending, tail.out)
}

fn stream_request(include_usage: bool) -> request::ParsedRequest {
    let body = json!({"model": "p/m", "stream": true, "stream_options": {"include_usage": include_usage},
                      "messages": [{"role": "user", "content": "hi"}]});
    request::parse(Operation::Chat, body.to_string().as_bytes()).unwrap()
}

fn rewrite(api: Api, include_usage: bool, chunks: &[&[u8]]) -> Vec<u8> {
    let request = stream_request(include_usage);
    let stamp = Stamp {
        op: Operation::Chat,
        id: "chatcmpl_P".into(),
        model: "client/model".into(),
        created: 7,
    };
    let translator = providers::stream_translator(api, &request);
    let mut r = StreamRewriter::new(translator, stamp, include_usage);
    let mut out = Vec::new();
    for c in chunks {
        r.push(c, &mut out);
    }
    r.finish(&mut out);
    out
}

/// `bytes` cut at the generated sizes (cycled), the rest last.
fn cut<'a>(bytes: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = bytes;
    for size in sizes.iter().cycle() {
        if rest.is_empty() {
            break;
        }
        let (a, b) = rest.split_at((*size).min(rest.len()));
        out.push(a);
        rest = b;
    }
    out
}

/// The client's stream: its events' JSON (or `[DONE]`), checked for shape.
fn client_events(out: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(out).expect("UTF-8");
    assert!(text.ends_with("\n\n"), "{text:?}");
    text.trim_end_matches('\n')
        .split("\n\n")
        .map(|e| {
            let data = e.strip_prefix("data: ").unwrap_or_else(|| panic!("{e:?}"));
            if data == "[DONE]" {
                Value::String("[DONE]".into())
            } else {
                serde_json::from_str(data).unwrap_or_else(|err| panic!("{err}: {data:?}"))
            }
        })
        .collect()
}

fn check_stream(api: Api, rendered: &Rendered, include_usage: bool, sizes: &[usize]) -> Result<(), TestCaseError> {
    let whole = rewrite(api, include_usage, &[&rendered.bytes]);
    let generated = rewrite(api, include_usage, &cut(&rendered.bytes, sizes));
    prop_assert_eq!(String::from_utf8_lossy(&whole), String::from_utf8_lossy(&generated));
    let bytes: Vec<&[u8]> = rendered.bytes.chunks(1).collect();
    prop_assert_eq!(&whole, &rewrite(api, include_usage, &bytes));

    let events = client_events(&whole);
    let (last, body) = events.split_last().unwrap();
    for e in body {
        prop_assert!(
            e.get("error").is_none() && e != "[DONE]",
            "only the last event ends: {e}"
        );
        prop_assert_eq!(&e["id"], "chatcmpl_P");
        prop_assert_eq!(&e["object"], "chat.completion.chunk");
    }
    let content: String = body
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    if rendered.complete {
        prop_assert_eq!(last, "[DONE]");
        prop_assert_eq!(content, rendered.text.clone());
        let usage_chunk = body.iter().any(|e| e.get("usage").is_some());
        prop_assert_eq!(usage_chunk, include_usage);
    } else {
        let e = &last["error"];
        prop_assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{last}");
        prop_assert_eq!(&e["type"], "upstream_error");
        prop_assert_eq!(&e["code"], "stream_interrupted");
        prop_assert!(rendered.text.starts_with(&content), "text so far is a prefix");
    }
    Ok(())
}

fn sizes() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..48, 1..12)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn openai_streams_are_chunking_invariant(steps in prop::collection::vec(step(), 0..8), end in ending(),
                                             eol in line_end(), usage in any::<bool>(), sizes in sizes()) {
        check_stream(Api::Openai, &openai(&steps, &end, eol), usage, &sizes)?;
    }

    #[test]
    fn anthropic_streams_are_chunking_invariant(steps in prop::collection::vec(step(), 0..8), end in ending(),
                                                eol in line_end(), usage in any::<bool>(), sizes in sizes()) {
        check_stream(Api::Anthropic, &anthropic(&steps, &end, eol), usage, &sizes)?;
    }

    #[test]
    fn gemini_streams_are_chunking_invariant(steps in prop::collection::vec(step(), 0..8), end in ending(),
                                             eol in line_end(), usage in any::<bool>(), sizes in sizes()) {
        check_stream(Api::Gemini, &gemini(&steps, &end, eol), usage, &sizes)?;
    }
}

// ---- a credential split anywhere across deltas never reaches the client -----------

const SECRET: &str = "sk-prop-secret-0123456789";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_credential_split_across_deltas_is_always_scrubbed(
        pre in "[a-z ]{0,12}",
        post in "[a-z ]{0,12}",
        cuts in prop::collection::vec(0usize..60, 0..6),
        api in prop::sample::select(&[Api::Openai, Api::Anthropic, Api::Gemini][..]),
        sizes in sizes(),
    ) {
        let text = format!("{pre}{SECRET}{post}");
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (text.len() + 1)).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut pieces = Vec::new();
        let mut from = 0;
        for c in cuts.into_iter().chain([text.len()]) {
            if c > from {
                pieces.push(Step::Text(text[from..c].to_string()));
                from = c;
            }
        }
        let rendered = match api {
            Api::Openai => openai(&pieces, &Ending::Complete, "\n"),
            Api::Anthropic => anthropic(&pieces, &Ending::Complete, "\n"),
            Api::Gemini => gemini(&pieces, &Ending::Complete, "\n"),
        };
        let request = stream_request(false);
        let run = |chunks: &[&[u8]]| {
            let stamp = Stamp { op: Operation::Chat, id: "chatcmpl_P".into(), model: "m".into(), created: 7 };
            let translator = providers::stream_translator(api, &request);
            let mut r = StreamRewriter::new(translator, stamp, false).redacting(&waygate::redact::Secret::new(SECRET));
            let mut out = Vec::new();
            for c in chunks {
                r.push(c, &mut out);
            }
            r.finish(&mut out);
            out
        };
        let whole = run(&[&rendered.bytes]);
        prop_assert_eq!(&whole, &run(&cut(&rendered.bytes, &sizes)));
        let events = client_events(&whole);
        let content: String = events.iter().filter_map(|e| e["choices"][0]["delta"]["content"].as_str()).collect();
        prop_assert!(!content.contains(SECRET), "{}", content);
        prop_assert!(!String::from_utf8_lossy(&whole).contains(SECRET));
        prop_assert!(content.starts_with(&pre) && content.ends_with(&post), "{}", content);
        prop_assert!(content.contains("[redacted]"), "{}", content);
        prop_assert_eq!(events.last().unwrap(), "[DONE]");
    }
}

// ---- every error path is the contract's envelope ----------------------------------

const CLIENT_KEY: &str = "wg-prop-key";

fn config() -> Rc<Config> {
    use sha2::{Digest, Sha256};
    let digest: String = Sha256::digest(CLIENT_KEY.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let json = json!({
        "max_request_bytes": 4096,
        "keys": [{"id": "dev", "sha256": digest, "models": ["chain/*", "oa/*", "an/*", "ge/*"],
                  "requests_per_minute": 1000}],
        "providers": [
            {"id": "oa", "api": "openai", "cluster": "c_oa", "authority": "oa", "api_key": "sk-oa-0000000000"},
            {"id": "an", "api": "anthropic", "cluster": "c_an", "authority": "an", "api_key": "sk-an-0000000000"},
            {"id": "ge", "api": "gemini", "cluster": "c_ge", "authority": "ge", "api_key": "ge-key-000000000"},
            {"id": "off", "api": "openai", "cluster": "c_off", "authority": "off", "api_key_env": "UNSET_ENV"}
        ],
        "models": [{"id": "chain/x", "endpoints": [{"provider": "oa", "model": "a"}, {"provider": "an", "model": "b"},
                                                   {"provider": "ge", "model": "c"}]}]
    });
    Rc::new(Config::parse(json.to_string().as_bytes(), &|_| None).unwrap())
}

#[derive(Default)]
struct Store(HashMap<String, (Vec<u8>, u32)>, u32);

impl SharedStore for Store {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.0.get(key).cloned()
    }
    fn set(&mut self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        if self.0.get(key).is_some_and(|(_, c)| cas != 0 && cas != *c) {
            return Err(StoreError::CasMismatch);
        }
        self.1 += 1;
        self.0.insert(key.into(), (value.to_vec(), self.1));
        Ok(())
    }
}

/// Small JSON values from the request vocabulary, nested.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-3.0f64..3.0).prop_map(Value::from),
        prop_oneof![
            Just("user"),
            Just("assistant"),
            Just("tool"),
            Just("system"),
            Just("text"),
            Just("image_url"),
            Just("function"),
            Just("json_schema"),
            Just("json_object"),
            Just("chain/x"),
            Just("oa/gpt"),
            Just("an/claude"),
            Just("ge/gemini"),
            Just("off/x"),
            Just("nowhere/x"),
            Just(""),
            Just("data:image/png;base64,AAAA"),
            Just("ftp://x"),
        ]
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key(), inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("role"),
        Just("content"),
        Just("type"),
        Just("text"),
        Just("image_url"),
        Just("url"),
        Just("tool_calls"),
        Just("tool_call_id"),
        Just("function"),
        Just("name"),
        Just("arguments"),
        Just("parameters"),
        Just("routing"),
        Just("prefer"),
        Just("allow_fallbacks"),
        Just("max_provider_tries"),
        Just("schema"),
        Just("include_usage"),
    ]
    .prop_map(String::from)
}

/// A request body: mostly a valid base with generated fields on top.
fn body() -> impl Strategy<Value = Vec<u8>> {
    const FIELDS: [&str; 16] = [
        "model",
        "messages",
        "prompt",
        "stream",
        "stream_options",
        "temperature",
        "max_tokens",
        "n",
        "stop",
        "tools",
        "tool_choice",
        "response_format",
        "logprobs",
        "waygate",
        "user",
        "seed",
    ];
    prop_oneof![
        8 => (prop::sample::select(&["chain/x", "oa/gpt", "an/claude", "ge/gemini", "off/x", "x"][..]),
              prop::collection::vec((prop::sample::select(&FIELDS[..]), json_value()), 0..3))
            .prop_map(|(model, fields)| {
                let mut v = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
                for (k, val) in fields {
                    v[k] = val;
                }
                v.to_string().into_bytes()
            }),
        1 => json_value().prop_map(|v| v.to_string().into_bytes()),
        1 => prop::collection::vec(any::<u8>(), 0..64),
    ]
}

#[derive(Debug, Clone)]
struct Upstream {
    status: u16,
    event_stream: bool,
    router_error: bool,
    body: Vec<u8>,
}

fn upstream() -> impl Strategy<Value = Upstream> {
    (
        prop::sample::select(&[200u16, 200, 400, 401, 404, 408, 413, 422, 429, 500, 503, 504][..]),
        any::<bool>(),
        prop::bool::weighted(0.15),
        prop_oneof![
            Just(b"{\"error\":{\"message\":\"nope\",\"code\":\"bad\"}}".to_vec()),
            Just(b"{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}".to_vec()),
            Just(b"not json".to_vec()),
            Just(b"data: {\"choices\":[]}\n\n".to_vec()),
            Just(Vec::new()),
            prop::collection::vec(any::<u8>(), 0..32),
        ],
    )
        .prop_map(|(status, event_stream, router_error, body)| Upstream {
            status,
            event_stream,
            router_error,
            body,
        })
}

fn assert_envelope(status: u16, headers: &[(String, String)], body: &[u8]) -> Result<(), TestCaseError> {
    prop_assert!(
        headers
            .iter()
            .any(|(k, v)| k == "content-type" && v == "application/json"),
        "{status} {headers:?}"
    );
    let v: Value = serde_json::from_slice(body).map_err(|e| TestCaseError::fail(format!("{e}")))?;
    let e = &v["error"];
    prop_assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    prop_assert!(e["code"].as_str().is_some_and(|c| !c.is_empty()), "{v}");
    prop_assert!(e["type"].as_str().is_some_and(|t| t.ends_with("_error")), "{v}");
    // The envelope's four members, `param` present even when null (a
    // serializer skipping `None` would drop it, and OpenAI's SDKs read it),
    // and `provider` (a string) only on a provider's own refusal (contract §4).
    let mut members: Vec<&str> = e
        .as_object()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    members.sort_unstable();
    if e.get("provider").is_some() {
        prop_assert!(e["provider"].as_str().is_some_and(|p| !p.is_empty()), "{v}");
        prop_assert_eq!(members, ["code", "message", "param", "provider", "type"], "{}", v);
    } else {
        prop_assert_eq!(members, ["code", "message", "param", "type"], "{}", v);
    }
    prop_assert!(
        e["param"].is_null() || e["param"].as_str().is_some_and(|p| !p.is_empty()),
        "{v}"
    );
    Ok(())
}

fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(format!("Bearer {CLIENT_KEY}").into_bytes()),
        Just(b"Bearer wrong".to_vec()),
        Just(b"Basic abc".to_vec()),
        prop::collection::vec(any::<u8>(), 0..24),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn every_error_answer_is_the_contract_envelope(
        auth in prop::option::weighted(0.9, header_value()),
        path in prop::sample::select(&["/api/v1/chat/completions", "/api/v1/completions", "/api/v1/models", "/api/v1/x"][..]),
        method in prop::sample::select(&["POST", "GET", "DELETE"][..]),
        content_type in prop::sample::select(&["application/json", "text/plain", "application/json; charset=utf-8"][..]),
        body in body(),
        first in upstream(),
        calls in prop::collection::vec(upstream(), 0..4),
    ) {
        let mut ex = Exchange::new(config(), 0);
        let mut pairs = vec![
            (b":method".to_vec(), method.as_bytes().to_vec()),
            (b":path".to_vec(), path.as_bytes().to_vec()),
            (b"content-type".to_vec(), content_type.as_bytes().to_vec()),
        ];
        if let Some(auth) = auth {
            pairs.push((b"authorization".to_vec(), auth));
        }
        match ex.on_request_headers(&pairs, false).action {
            HeadersAction::Continue => prop_assert!(false, "everything under base_path is ours"),
            HeadersAction::Reply(r) => {
                if r.status >= 400 {
                    assert_envelope(r.status, &r.headers, &r.body)?;
                }
                return Ok(());
            }
            HeadersAction::ReadBody => {}
        }
        let mut store = Store::default();
        if let Err(r) = ex.on_request_body(&body, 1_700_000_000_000_000_000, &mut store) {
            prop_assert!(r.status >= 400);
            return assert_envelope(r.status, &r.headers, &r.body);
        }
        let head = |u: &Upstream| vec![
            (":status".to_string(), u.status.to_string()),
            ("content-type".into(), if u.event_stream { "text/event-stream" } else { "application/json" }.into()),
            ("retry-after".into(), "3".into()),
        ];
        let details = if first.router_error { "upstream_reset_before_response_started{connection_failure}" } else { "via_upstream" };
        let rewrite = match ex.on_response_headers(&head(&first), || Some(details.into()), false).action {
            ResponseAction::Continue => return Err(TestCaseError::fail("a forwarded answer is ours")),
            ResponseAction::Stream { .. } => {
                let mut out = Vec::new();
                ex.on_stream_body(&first.body, true, &mut out);
                let events = client_events(&out);
                let last = events.last().unwrap();
                if last != "[DONE]" {
                    let envelope = json!({"error": last["error"].clone()});
                    assert_envelope(502, &[("content-type".into(), "application/json".into())],
                                    envelope.to_string().as_bytes())?;
                }
                return Ok(());
            }
            ResponseAction::Answer(r) => r,
            ResponseAction::Buffer => ex.on_buffered_body(&first.body),
            ResponseAction::Fallback(_) => {
                let mut answers = calls.iter();
                loop {
                    let step = match answers.next() {
                        Some(u) => ex.on_call_response(&head(u), &u.body),
                        None => ex.on_call_refused(),
                    };
                    match step {
                        CallStep::Dispatch(_) => continue,
                        CallStep::Reply(r) => break r,
                    }
                }
            }
        };
        if rewrite.status >= 400 {
            assert_envelope(rewrite.status, &rewrite.set, &rewrite.body)?;
        } else {
            prop_assert_eq!(rewrite.status, 200);
        }
    }
}
