//! Native benchmarks of the pure core's hot paths (`make bench` runs them).
//!
//! - `exchange/*`: one whole non-streaming ~1 KB chat request through
//!   [`Exchange`]: request headers → body → response headers → buffered
//!   body → access log, for an OpenAI-compatible and an Anthropic provider.
//! - `keys/*`: a configuration with 20,000 client keys: parsing it (each
//!   worker's VM does, at start) and finding one request's key.
//! - `stream/*`: SSE translation with [`StreamRewriter`] on recorded provider
//!   streams (`tests/fixtures/*/*.sse`) fed one event per chunk, as a
//!   provider writes them; throughput is provider input bytes.
//!
//! Shared inputs (plugin configuration, the request body) are in
//! `benches/data/`, so the end-to-end benchmark in Envoy (`benches/envoy.rs`)
//! measures the same request.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::Value;
use sha2::{Digest, Sha256};
use waygate::answer::Stamp;
use waygate::auth;
use waygate::config::{Api, Config};
use waygate::exchange::{Exchange, HeadersAction, ResponseAction};
use waygate::limits::{SharedStore, StoreError};
use waygate::metrics::OpenLabels;
use waygate::providers;
use waygate::request::{self, Operation};
use waygate::stream::StreamRewriter;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> Vec<u8> {
    std::fs::read(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn config() -> Rc<Config> {
    let raw = read("benches/data/plugin.json");
    Rc::new(Config::parse(&raw, &|_| None).unwrap())
}

/// The ~1 KB chat request with `model` (and `stream`) set.
fn chat_body(model: &str, stream: bool) -> Vec<u8> {
    let mut body: Value = serde_json::from_slice(&read("benches/data/chat_1k.json")).unwrap();
    body["model"] = model.into();
    if stream {
        body["stream"] = true.into();
    }
    serde_json::to_vec(&body).unwrap()
}

fn request_headers(body_len: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    [
        (":method", "POST".to_string()),
        (":path", "/api/v1/chat/completions".to_string()),
        (":authority", "gateway.local".to_string()),
        (":scheme", "http".to_string()),
        ("authorization", "Bearer wg-dev-key".to_string()),
        ("content-type", "application/json".to_string()),
        ("content-length", body_len.to_string()),
        ("user-agent", "OpenAI/Python 1.99.0".to_string()),
        ("accept", "application/json".to_string()),
        ("x-forwarded-proto", "http".to_string()),
        ("x-request-id", "5f1c2d3e-0000-4000-8000-000000000001".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.as_bytes().to_vec(), v.into_bytes()))
    .collect()
}

/// The bench key has no limits, so shared data is never read or written.
struct NoLimits;

impl SharedStore for NoLimits {
    fn get(&self, _key: &str) -> Option<(Vec<u8>, u32)> {
        None
    }
    fn set(&mut self, _key: &str, _value: &[u8], _cas: u32) -> Result<(), StoreError> {
        Ok(())
    }
}

/// One whole request; returns the client's body so the work is not optimised away.
fn exchange_once(config: &Rc<Config>, headers: &[(Vec<u8>, Vec<u8>)], body: &[u8], answer: &[u8]) -> Vec<u8> {
    let mut ex = Exchange::new(Rc::clone(config), 1_755_000_000_000_000_000);
    let step = ex.on_request_headers(headers, false);
    assert_eq!(step.action, HeadersAction::ReadBody);
    let forward = ex
        .on_request_body(body, 1_755_000_000_000_000_000, &mut NoLimits)
        .unwrap();
    black_box(&forward);
    let head = [(":status", "200"), ("content-type", "application/json")];
    let step = ex.on_response_headers(&head, || None, false);
    assert_eq!(step.action, ResponseAction::Buffer);
    let rewrite = ex.on_buffered_body(answer);
    assert_eq!(rewrite.status, 200);
    // The VM's labels, as a VM keeps them from one request to the next.
    thread_local!(static OPEN: std::cell::RefCell<OpenLabels> = Default::default());
    OPEN.with(|open| black_box(ex.on_log(&mut NoLimits, 1_755_000_003_000_000_000, &mut open.borrow_mut())));
    rewrite.body
}

fn bench_exchange(c: &mut Criterion) {
    let config = config();
    let mut group = c.benchmark_group("exchange");
    let cases = [
        (
            "openai",
            "fake/gpt-4o-mini",
            "tests/fixtures/openai/chat_completion.json",
        ),
        (
            "anthropic",
            "fakeanthropic/claude-sonnet-4",
            "tests/fixtures/anthropic/message.json",
        ),
    ];
    for (name, model, answer) in cases {
        let body = chat_body(model, false);
        let headers = request_headers(body.len());
        let answer = read(answer);
        // Checked once outside the timing: the answer is a chat.completion.
        let out: Value = serde_json::from_slice(&exchange_once(&config, &headers, &body, &answer)).unwrap();
        assert_eq!(out["object"], "chat.completion", "{out}");
        group.throughput(Throughput::Elements(1));
        group.bench_function(format!("{name}_1k_chat"), |b| {
            b.iter(|| exchange_once(&config, &headers, black_box(&body), black_box(&answer)))
        });
    }
    group.finish();
}

/// A multi-tenant gateway's key list: the bench configuration with 20,000 keys more.
fn bench_keys(c: &mut Criterion) {
    const KEYS: usize = 20_000;
    let mut plugin: Value = serde_json::from_slice(&read("benches/data/plugin.json")).unwrap();
    let keys = plugin["keys"].as_array_mut().unwrap();
    for i in 0..KEYS {
        let digest: String = Sha256::digest(format!("tenant-key-{i}"))
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        keys.push(serde_json::json!({"id": format!("tenant-{i}"), "sha256": digest}));
    }
    let json = serde_json::to_vec(&plugin).unwrap();
    let config = Config::parse(&json, &|_| None).unwrap();
    let token = format!("tenant-key-{}", KEYS / 3);
    assert_eq!(
        auth::authenticate(&config.keys, token.as_bytes()).unwrap().id,
        format!("tenant-{}", KEYS / 3)
    );
    let mut group = c.benchmark_group("keys");
    group.throughput(Throughput::Elements(1));
    group.bench_function("parse_20k_keys", |b| {
        b.iter(|| Config::parse(black_box(&json), &|_| None))
    });
    group.bench_function("authenticate_among_20k_keys", |b| {
        b.iter(|| auth::authenticate(&config.keys, black_box(token.as_bytes())).is_ok())
    });
    group.finish();
}

/// A recorded stream split into the events a provider writes, one per chunk.
fn events(path: &str) -> (Vec<Vec<u8>>, usize) {
    let raw = read(path);
    let text = String::from_utf8(raw).unwrap().replace("\r\n", "\n");
    let chunks: Vec<Vec<u8>> = text.split_inclusive("\n\n").map(|e| e.as_bytes().to_vec()).collect();
    let total = chunks.iter().map(Vec::len).sum();
    (chunks, total)
}

fn bench_stream(c: &mut Criterion) {
    let mut group = c.benchmark_group("stream");
    let cases = [
        (
            "openai",
            Api::Openai,
            "tests/fixtures/openai/chat_completion_stream.sse",
        ),
        (
            "anthropic",
            Api::Anthropic,
            "tests/fixtures/anthropic/message_stream.sse",
        ),
    ];
    for (name, api, path) in cases {
        let body = chat_body("fake/x", true);
        let parsed = request::parse(Operation::Chat, &body).unwrap();
        let (chunks, total) = events(path);
        let run = || {
            let stamp = Stamp {
                op: Operation::Chat,
                id: "chatcmpl_bench".into(),
                model: "fake/x".into(),
                created: 1_755_000_000,
            };
            // As in the filter, which scrubs the provider's credential.
            let mut rewriter = StreamRewriter::new(providers::stream_translator(api, &parsed), stamp, true)
                .redacting(&waygate::redact::Secret::new("sk-bench-0123456789abcdef"));
            let mut out = Vec::with_capacity(total * 2);
            for chunk in &chunks {
                rewriter.push(black_box(chunk), &mut out);
            }
            rewriter.finish(&mut out);
            out
        };
        let out = String::from_utf8(run()).unwrap();
        assert!(out.ends_with("data: [DONE]\n\n"), "{name}: {out}");
        group.throughput(Throughput::Bytes(total as u64));
        group.bench_function(format!("{name}_{}", file_stem(path)), |b| b.iter(run));
    }
    group.finish();
}

fn file_stem(path: &str) -> String {
    Path::new(path)
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn short() -> Criterion {
    // Seconds, not minutes: the machine is shared and the figures are stable.
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(40)
        .configure_from_args()
}

criterion_group! {
    name = core;
    config = short();
    targets = bench_exchange, bench_keys, bench_stream
}
criterion_main!(core);
