//! Shared pieces of the fuzz targets: the configuration they run under, the
//! requests answers and streams are translated for, chunk plans read from
//! the fuzz input, and the invariants every target checks on top of "no
//! panic" (the contract's error envelope, a client stream's ending, secrets
//! that never reach the client).
//!
//! A failed invariant panics, which libFuzzer reports as a crash.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::collections::HashMap;
use std::rc::Rc;

use serde_json::Value;
use waygate::answer::Stamp;
use waygate::config::{Api, Config, Provider};
use waygate::errors::ApiError;
use waygate::limits::{SharedStore, StoreError};
use waygate::providers::{self, StreamTranslator};
use waygate::request::{self, Operation, ParsedRequest};
use waygate::stream::StreamRewriter;

/// The client key the exchange target authenticates with.
pub const CLIENT_KEY: &str = "wg-fuzz-client-key-0001";
/// A client key limited to 3 requests and 200 tokens a minute.
pub const LIMITED_KEY: &str = "wg-fuzz-limited-key-0002";
/// Provider credentials: none may ever reach a client.
pub const SECRETS: [&str; 4] = [
    "sk-fuzz-openai-secret-1111",
    "sk-fuzz-anthropic-secret-2222",
    "fuzz-gemini-secret-3333",
    "sk-fuzz-legacy-secret-4444",
];

fn sha256_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One provider per API (plus a native-legacy OpenAI one and one without a
/// credential), two client keys, and a model served by all three APIs in
/// turn, so fallbacks cross APIs.
pub fn config() -> Rc<Config> {
    thread_local! {
        static CONFIG: Rc<Config> = build_config();
    }
    CONFIG.with(Rc::clone)
}

fn build_config() -> Rc<Config> {
    let json = serde_json::json!({
        "max_request_bytes": 65536,
        "max_provider_tries": 4,
        "keys": [
            {"id": "dev", "sha256": sha256_hex(CLIENT_KEY)},
            {"id": "limited", "sha256": sha256_hex(LIMITED_KEY), "requests_per_minute": 3,
             "tokens_per_minute": 200, "models": ["chain/*", "oa/*"]}
        ],
        "providers": [
            {"id": "oa", "api": "openai", "cluster": "c_oa", "authority": "oa.local", "api_key": SECRETS[0]},
            {"id": "an", "api": "anthropic", "cluster": "c_an", "authority": "an.local", "api_key": SECRETS[1],
             "default_max_tokens": 512},
            {"id": "ge", "api": "gemini", "cluster": "c_ge", "authority": "ge.local", "api_key": SECRETS[2]},
            {"id": "lg", "api": "openai", "cluster": "c_lg", "authority": "lg.local", "api_key": SECRETS[3],
             "legacy_completions": true},
            {"id": "nokey", "api": "openai", "cluster": "c_nk", "authority": "nk.local",
             "api_key_env": "WAYGATE_FUZZ_UNSET"}
        ],
        "models": [
            {"id": "chain/x", "endpoints": [
                {"provider": "oa", "model": "gpt"}, {"provider": "an", "model": "claude"},
                {"provider": "ge", "model": "gemini-2.5-flash"}, {"provider": "lg", "model": "legacy"}]},
            {"id": "chain/keyless", "endpoints": [{"provider": "nokey", "model": "x"}, {"provider": "ge", "model": "g"}]}
        ]
    });
    let bytes = serde_json::to_vec(&json).unwrap();
    Rc::new(Config::parse(&bytes, &|_| None).expect("the fuzz configuration is valid"))
}

/// The configured provider speaking `api` (the native-legacy one when asked).
pub fn provider(config: &Config, api: Api, legacy: bool) -> Provider {
    config
        .providers
        .iter()
        .find(|p| p.api == api && p.legacy_completions == legacy && p.credential.is_some())
        .map(|p| Provider::clone(p))
        .expect("a provider for every API")
}

/// The requests answers and streams are translated for, picked by one byte:
/// plain chat, usage asked, legacy, JSON modes, tools, several candidates.
pub fn request_variant(selector: u8) -> ParsedRequest {
    const BODIES: [(&str, Operation); 8] = [
        (
            r#"{"model":"p/m","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            Operation::Chat,
        ),
        (
            r#"{"model":"p/m","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}"#,
            Operation::Chat,
        ),
        (
            r#"{"model":"p/m","prompt":"say hi","stream":true}"#,
            Operation::Completions,
        ),
        (
            r#"{"model":"p/m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_object"}}"#,
            Operation::Chat,
        ),
        (
            r#"{"model":"p/m","messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"a","schema":{"type":"object","properties":{"a":{"type":"string"}}}}}}"#,
            Operation::Chat,
        ),
        (
            r#"{"model":"p/m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"lookup","parameters":{"type":"object"}}}]}"#,
            Operation::Chat,
        ),
        (
            r#"{"model":"p/m","messages":[{"role":"user","content":"hi"}],"n":2}"#,
            Operation::Chat,
        ),
        (
            r#"{"model":"p/m","prompt":"say hi","stream":true,"stream_options":{"include_usage":true}}"#,
            Operation::Completions,
        ),
    ];
    let (body, op) = BODIES[usize::from(selector) % BODIES.len()];
    request::parse(op, body.as_bytes()).expect("the fuzz requests are valid")
}

pub fn stamp(op: Operation) -> Stamp {
    Stamp {
        op,
        id: "chatcmpl_FUZZ".into(),
        model: "client/model".into(),
        created: 1,
    }
}

pub fn translator(api: Api, request: &ParsedRequest) -> Box<dyn StreamTranslator> {
    providers::stream_translator(api, request)
}

/// Splits fuzz input into a chunk plan and a payload: the first byte's low
/// nibble is how many chunk sizes follow (one byte each), the rest is the
/// payload. Seeds are fixtures with a zero byte in front (one chunk).
pub fn plan_and_payload(data: &[u8]) -> (Vec<usize>, &[u8]) {
    let Some((&first, rest)) = data.split_first() else {
        return (Vec::new(), data);
    };
    let n = usize::from(first & 0x0f).min(rest.len());
    let (sizes, payload) = rest.split_at(n);
    (sizes.iter().map(|s| usize::from(*s)).collect(), payload)
}

/// `payload` cut by `sizes` (empty chunks included), the remainder last.
pub fn chunked<'a>(sizes: &[usize], mut payload: &'a [u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::with_capacity(sizes.len() + 1);
    for &size in sizes {
        let (head, tail) = payload.split_at(size.min(payload.len()));
        out.push(head);
        payload = tail;
    }
    out.push(payload);
    out
}

/// The secret the stream targets scrub, when the selector asks.
pub const STREAM_SECRET: &str = "sk-stream-secret-42";

/// Runs a stream through a fresh rewriter, chunk by chunk, and finishes it.
pub fn rewrite(api: Api, request: &ParsedRequest, redact: bool, chunks: &[&[u8]]) -> Vec<u8> {
    rewrite_with(translator(api, request), request, redact, chunks)
}

/// [`rewrite`] with a translator of the caller's (a reference path to compare with).
pub fn rewrite_with(
    translator: Box<dyn StreamTranslator>,
    request: &ParsedRequest,
    redact: bool,
    chunks: &[&[u8]],
) -> Vec<u8> {
    let mut rewriter = StreamRewriter::new(translator, stamp(request.op), request.include_usage);
    if redact {
        rewriter = rewriter.redacting(&waygate::redact::Secret::new(STREAM_SECRET));
    }
    let mut out = Vec::new();
    for chunk in chunks {
        rewriter.push(chunk, &mut out);
    }
    rewriter.finish(&mut out);
    assert!(rewriter.is_finished(), "a finished stream says so");
    out
}

/// The stream translator invariants: the client's output is the same under
/// the whole input, the fuzzed chunking and byte-by-byte chunking, and it is
/// a well-formed OpenAI stream ending in `[DONE]` or one error event.
pub fn check_stream_target(api: Api, data: &[u8]) {
    let Some((&selector, data)) = data.split_first() else {
        return;
    };
    let request = request_variant(selector);
    let redact = selector & 0x80 != 0;
    let (sizes, payload) = plan_and_payload(data);
    let whole = rewrite_with(translator(api, &request), &request, redact, &[payload]);
    let fuzzed = rewrite(api, &request, redact, &chunked(&sizes, payload));
    assert_eq!(
        String::from_utf8_lossy(&whole),
        String::from_utf8_lossy(&fuzzed),
        "chunking {sizes:?} changed the output"
    );
    if payload.len() <= 1024 {
        let bytes: Vec<&[u8]> = payload.chunks(1).collect();
        assert_eq!(
            whole,
            rewrite(api, &request, redact, &bytes),
            "byte-by-byte chunking changed the output"
        );
    }
    check_client_stream(&whole, request.op, true, Some(&stamp(request.op)));
    if api == Api::Openai {
        // The copy path for OpenAI chunks agrees with the translator's path.
        let out = rewrite_with(Box::new(Translated), &request, redact, &[payload]);
        // Where the translator found an event "not JSON" only because serde's DOM refuses
        // a number beyond f64 or nesting past 128, the copy passes the event on as written.
        if !contains(&out, b"not JSON") {
            assert_eq!(
                events_as_json(&whole),
                events_as_json(&out),
                "copied and translated chunks differ"
            );
        }
    }
    // Text deltas written without a DOM are byte for byte what their DOM gives.
    let out = rewrite_with(
        Box::new(ContentAsDom(translator(api, &request))),
        &request,
        redact,
        &[payload],
    );
    assert_eq!(
        String::from_utf8_lossy(&whole),
        String::from_utf8_lossy(&out),
        "content items and their DOM differ"
    );
    if redact {
        assert!(!contains(&whole, STREAM_SECRET.as_bytes()), "the secret in the stream");
        for text in stream_texts(&whole) {
            assert!(!text.contains(STREAM_SECRET), "the secret across deltas: {text:?}");
        }
    }
}

/// OpenAI's translator without the copy path.
struct Translated;

impl StreamTranslator for Translated {
    fn on_event(&mut self, event: &waygate::sse::SseEvent, items: &mut Vec<providers::StreamItem>) {
        providers::openai::OpenAiStream.on_event(event, items);
    }
}

/// A translator whose text deltas and finishes go out as the chunk DOM that
/// [`providers::StreamItem::Content`] and [`providers::StreamItem::Finish`] stand for.
struct ContentAsDom(Box<dyn StreamTranslator>);

impl StreamTranslator for ContentAsDom {
    fn on_event(&mut self, event: &waygate::sse::SseEvent, items: &mut Vec<providers::StreamItem>) {
        let start = items.len();
        self.0.on_event(event, items);
        for item in items.iter_mut().skip(start) {
            let chunk = match item {
                providers::StreamItem::Content { index, text } => {
                    serde_json::json!({"choices": [{"index": *index, "delta": {"content": text}, "finish_reason": null}]})
                }
                providers::StreamItem::Finish { index, reason } => {
                    serde_json::json!({"choices": [{"index": *index, "delta": {}, "finish_reason": reason}]})
                }
                _ => continue,
            };
            *item = providers::StreamItem::Chunk(chunk);
        }
    }

    fn passthrough(&self) -> bool {
        self.0.passthrough()
    }
}

/// A client stream's events, read literally (see [`event_value`]) where they are JSON.
fn events_as_json(out: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(out)
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|e| waygate::json::dom::parse(e).unwrap_or_else(|_| Value::String(e.to_string())))
        .collect()
}

/// Each choice's streamed text (content or legacy text), joined in order.
pub fn stream_texts(out: &[u8]) -> Vec<String> {
    let mut texts: Vec<(u64, String)> = Vec::new();
    for event in String::from_utf8_lossy(out).split("\n\n") {
        let Some(Ok(v)) = event.strip_prefix("data: ").map(waygate::json::dom::parse) else {
            continue;
        };
        for choice in v["choices"].as_array().into_iter().flatten() {
            let index = choice["index"].as_u64().unwrap_or(0);
            let text = choice["delta"]["content"]
                .as_str()
                .or(choice["text"].as_str())
                .unwrap_or("");
            match texts.iter_mut().find(|(i, _)| *i == index) {
                Some((_, t)) => t.push_str(text),
                None => texts.push((index, text.to_string())),
            }
        }
    }
    texts.into_iter().map(|(_, t)| t).collect()
}

/// A stream as the client receives it: `data: <json>\n\n` events, chunks
/// stamped with one id and the client's model (`stamp`'s when given), and,
/// when `ended`, either `data: [DONE]\n\n` last or exactly one error
/// envelope last.
pub fn check_client_stream(out: &[u8], op: Operation, ended: bool, stamp: Option<&Stamp>) {
    let text = std::str::from_utf8(out).expect("the client's stream is UTF-8");
    if text.is_empty() {
        assert!(!ended, "an ended stream is never silent");
        return;
    }
    assert!(text.ends_with("\n\n"), "the stream ends on an event boundary: {text:?}");
    let events: Vec<&str> = text.strip_suffix("\n\n").unwrap().split("\n\n").collect();
    let last = events.len() - 1;
    let mut closed = false;
    let mut first_stamp: Option<(String, String)> = None;
    for (i, event) in events.iter().enumerate() {
        let data = event
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("not one data line: {event:?}"));
        assert!(!data.contains('\n'), "one line per event: {event:?}");
        if data == "[DONE]" {
            assert_eq!(i, last, "[DONE] is the last event: {text:?}");
            closed = true;
            continue;
        }
        let value = event_value(data);
        if value.get("error").is_some() {
            assert_eq!(i, last, "the error event is the last event: {text:?}");
            check_envelope_value(&value);
            closed = true;
            continue;
        }
        let object = match op {
            Operation::Chat => "chat.completion.chunk",
            Operation::Completions => "text_completion",
        };
        assert_eq!(value["object"], object, "{data}");
        let id = value["id"].as_str().unwrap_or_else(|| panic!("no id: {data}"));
        let model = value["model"].as_str().unwrap_or_else(|| panic!("no model: {data}"));
        match stamp {
            Some(s) => assert_eq!((id, model), (s.id.as_str(), s.model.as_str()), "{data}"),
            None => {
                let seen = first_stamp.get_or_insert_with(|| (id.to_string(), model.to_string()));
                assert_eq!(
                    (id, model),
                    (seen.0.as_str(), seen.1.as_str()),
                    "one id and model per stream"
                );
            }
        }
        assert!(value["choices"].is_array(), "{data}");
    }
    assert!(
        closed || !ended,
        "an ended stream closes with [DONE] or the error event: {text:?}"
    );
}

/// An event read literally (`waygate::json::dom`: serde's DOM with `raw_value`
/// reads an object whose first member is named serde's raw-value token as that
/// member's string, so two writings of one chunk, its members in another order,
/// would read as different values; found by `stream_openai`). A copied OpenAI
/// chunk may hold a number beyond f64's range, passed on as the provider wrote
/// it where the DOM refuses it (docs/robustness.md "Robustness"; the stamping of answers
/// does the same): such an event must still be JSON as serde's raw values read
/// it, and its members that the DOM refuses stand in as an empty array or
/// object, or their raw text, for the checks of the event's shape.
fn event_value(data: &str) -> Value {
    match waygate::json::dom::parse(data) {
        Ok(value) => value,
        Err(e) if e.to_string().starts_with("number out of range") => {
            serde_json::from_str::<&serde_json::value::RawValue>(data)
                .unwrap_or_else(|e| panic!("event is not JSON ({e}): {data:?}"));
            let members = waygate::json::members::Members::parse_str(data)
                .unwrap_or_else(|e| panic!("event is not JSON ({e}): {data:?}"));
            let read = |raw: &str| {
                waygate::json::dom::parse(raw).unwrap_or_else(|_| match raw.as_bytes().first() {
                    Some(b'[') => Value::Array(Vec::new()),
                    Some(b'{') => Value::Object(serde_json::Map::new()),
                    _ => Value::String(raw.to_string()),
                })
            };
            Value::Object(
                members
                    .0
                    .iter()
                    .map(|(name, raw)| (name.to_string(), read(raw.get())))
                    .collect(),
            )
        }
        Err(e) => panic!("event is not JSON ({e}): {data:?}"),
    }
}

/// The member name serde's DOM reads an object's raw JSON text from.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// The contract's error envelope (§4): `{"error": {"message", "type",
/// "param", "code"}}`, message and code non-empty strings, a known type.
pub fn check_envelope(body: &[u8]) -> Value {
    let value: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {}", String::from_utf8_lossy(body)));
    check_envelope_value(&value);
    value
}

pub fn check_envelope_value(value: &Value) {
    let error = value
        .get("error")
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("no error object: {value}"));
    assert!(
        error
            .get("message")
            .and_then(Value::as_str)
            .is_some_and(|m| !m.is_empty()),
        "{value}"
    );
    assert!(
        error.get("code").and_then(Value::as_str).is_some_and(|c| !c.is_empty()),
        "{value}"
    );
    let kind = error.get("type").and_then(Value::as_str).unwrap_or_default();
    assert!(
        [
            "invalid_request_error",
            "authentication_error",
            "permission_error",
            "rate_limit_error",
            "upstream_error"
        ]
        .contains(&kind),
        "{value}"
    );
    assert!(
        matches!(error.get("param"), Some(Value::Null | Value::String(_))),
        "{value}"
    );
}

/// An [`ApiError`] as the client would get it.
pub fn check_api_error(e: &ApiError) {
    assert!((400..=599).contains(&e.status), "{e:?}");
    let v = check_envelope(&e.body());
    assert_eq!(v["error"]["code"], e.code.as_str());
    for (name, value) in e.headers() {
        check_header(&name, &value);
    }
}

/// A header the filter sets: a lowercase token name (or a pseudo-header)
/// and a value without line breaks or NUL, so nothing can be injected.
pub fn check_header(name: &str, value: &str) {
    let bare = name.strip_prefix(':').unwrap_or(name);
    assert!(
        !bare.is_empty()
            && bare
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'),
        "header name {name:?}"
    );
    assert!(
        !value.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0),
        "header {name} value {value:?}"
    );
}

pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

/// Shared data with Envoy's CAS rules, for the per-key limits.
#[derive(Default)]
pub struct MemoryStore {
    values: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
}

impl SharedStore for MemoryStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        self.values.get(key).cloned()
    }

    fn set(&mut self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
        if let Some((_, current)) = self.values.get(key)
            && cas != 0
            && cas != *current
        {
            return Err(StoreError::CasMismatch);
        }
        self.next_cas = self.next_cas.wrapping_add(1).max(1);
        self.values.insert(key.to_string(), (value.to_vec(), self.next_cas));
        Ok(())
    }
}

/// A request translator on a body that passed validation (the first byte
/// picks the operation and, for OpenAI, a native-legacy provider): the
/// translation is idempotent (fallbacks re-run it), the credential travels
/// in a header only, the routing object never leaves, and a refusal is the
/// contract's envelope.
pub fn check_build(api: Api, data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let op = if selector & 1 == 0 {
        Operation::Chat
    } else {
        Operation::Completions
    };
    let Ok(request) = request::parse(op, body) else { return };
    let cfg = config();
    let provider = provider(&cfg, api, api == Api::Openai && selector & 2 != 0);
    let upstream_model = request.model.split_once('/').map_or("model", |(_, m)| m);
    let first = providers::build_request(&provider, &request, upstream_model, &cfg.routing_field);
    let again = providers::build_request(&provider, &request, upstream_model, &cfg.routing_field);
    assert_eq!(first, again, "translation is idempotent");
    let up = match first {
        Ok(up) => up,
        Err(e) => {
            check_api_error(&e);
            assert!(e.status == 400 || e.status == 500, "{e:?}");
            return;
        }
    };
    assert!(up.path.starts_with(&provider.path_prefix), "{}", up.path);
    assert!(
        up.path.bytes().all(|b| b.is_ascii_graphic()),
        "the path is one visible-ASCII token: {:?}",
        up.path
    );
    let secret = provider.credential_text().to_string();
    for (name, value) in &up.headers {
        check_header(name, value);
    }
    assert!(
        up.headers.iter().any(|(_, v)| v.contains(&secret)),
        "the credential travels in a header"
    );
    if !contains(body, secret.as_bytes()) {
        assert!(
            !contains(&up.body, secret.as_bytes()),
            "the credential is never in the body"
        );
        assert!(!up.path.contains(&secret), "the credential is never in the path");
    }
    let sent: Value = serde_json::from_slice(&up.body).expect("the upstream body is JSON");
    let sent = sent.as_object().expect("the upstream body is an object");
    assert!(
        !sent.contains_key(&cfg.routing_field),
        "the routing object never leaves"
    );
}

/// An answer translator on a provider's 2xx body: a valid answer becomes a
/// stamped OpenAI answer with consistent usage, deterministically; an
/// invalid one is refused with a reason. Error bodies are read safely.
/// The single-pass member split answers only where serde reads the same members.
pub fn check_split(body: &[u8]) {
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let mut split = Vec::new();
    if waygate::json::split::split(text, |name, value| split.push((name, value))).is_some() {
        let serde: waygate::json::members::Members =
            serde_json::from_str(text).expect("serde reads what the split reads");
        let serde: Vec<(&str, &str)> = serde
            .0
            .iter()
            .map(|(name, value)| (name.as_ref(), value.get()))
            .collect();
        assert_eq!(split, serde);
    }
}

pub fn check_answer(api: Api, data: &[u8]) {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let request = request_variant(selector);
    check_split(body);
    let details = providers::error_details(api, body);
    assert_eq!(details, providers::error_details(api, body));
    let first = providers::translate_answer(api, &request, body);
    let again = providers::translate_answer(api, &request, body);
    assert_eq!(first, again, "translation is deterministic");
    if api == Api::Openai && request.op == Operation::Chat {
        // The byte-level fast path agrees with the DOM path: same verdict,
        // and the same answer once both are parsed.
        let fast = providers::openai::finish_chat(&stamp(request.op), body);
        match (&first, &fast) {
            (Ok((answer, usage)), Ok((bytes, fast_usage))) => {
                assert_eq!(usage, fast_usage);
                let slow = waygate::answer::finish(&stamp(request.op), answer.clone(), *usage);
                // Read literally, as the DOM path read the provider's answer: an object
                // member named serde's raw-value token is a member like any other.
                let fast: Value = waygate::json::dom::parse_slice(bytes).expect("the fast path writes JSON");
                assert_eq!(slow, fast);
            }
            (Err(_), Err(_)) => {}
            // Valid JSON that serde's DOM refuses (a number beyond f64, nesting past
            // 128): the fast path passes it on as written, by design.
            (Err(why), Ok(_)) if why.contains("number out of range") || why.contains("recursion limit") => {}
            // A lone UTF-16 surrogate escape (`"\ud800"`): JSON by RFC 8259's grammar, which
            // serde reads as a raw value but refuses as a `String`. The fast path passes the
            // provider's member on as written, for clients that read it (Python's and
            // JavaScript's JSON readers do) rather than failing the whole answer.
            (Err(why), Ok(_)) if why.contains("surrogate") || why.contains("hex escape") => {}
            // An object whose member is named serde's raw-value token: serde's DOM
            // (built with `raw_value`) reads that member's string as the object's
            // JSON text, so it refuses or misreads what is JSON to any other reader;
            // the fast path, the one the filter runs, passes it on as written.
            _ if body
                .windows(RAW_VALUE_TOKEN.len())
                .any(|w| w == RAW_VALUE_TOKEN.as_bytes()) => {}
            _ => panic!("the fast and DOM paths disagree: {first:?} / {fast:?}"),
        }
    }
    let (answer, usage) = match first {
        Ok(ok) => ok,
        Err(why) => {
            assert!(!why.is_empty());
            return;
        }
    };
    assert!(answer.get("choices").is_some_and(Value::is_array), "{answer}");
    let stamp = stamp(request.op);
    let finished = waygate::answer::finish(&stamp, answer, usage);
    let bytes = serde_json::to_vec(&finished).unwrap();
    // Literally, as the client's own JSON reader would (see the fast path's check above).
    let v: Value = waygate::json::dom::parse_slice(&bytes).unwrap();
    let object = match request.op {
        Operation::Chat => "chat.completion",
        Operation::Completions => "text_completion",
    };
    assert_eq!(
        (v["id"].as_str(), v["model"].as_str(), v["object"].as_str()),
        (Some("chatcmpl_FUZZ"), Some("client/model"), Some(object)),
        "{v}"
    );
    assert_eq!(v["usage"]["total_tokens"].as_u64(), Some(usage.total()));
    for choice in v["choices"].as_array().unwrap() {
        assert!(choice.is_object() || api == Api::Openai, "{v}");
        if request.op == Operation::Completions {
            assert!(choice["text"].is_string(), "{v}");
        } else if api != Api::Openai {
            assert_eq!(choice["message"]["role"], "assistant", "{v}");
        }
    }
}
