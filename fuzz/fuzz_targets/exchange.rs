//! A whole request through [`Exchange`], as the shell drives it: arbitrary
//! request header pairs (non-UTF-8 bytes included), a body, the upstream's
//! head and body (chunked for streams), fallback call answers, and a few
//! requests in a row sharing the limits store.
//!
//! Checked on every step: every error answer is the contract's envelope
//! with `content-type: application/json`; every header the filter sets is
//! injection-free; `content-length` matches; a stream ends with `[DONE]` or
//! one error event; the client's key never goes upstream in a header, nor a
//! header that picks a provider account; a
//! provider credential never reaches the client (answer, header, stream) or
//! the access log; stats are well-formed.

#![no_main]

use std::rc::Rc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use waygate::config::Config;
use waygate::exchange::{
    BodyStep, BufferStep, Call, CallStep, Exchange, Forward, HeadersAction, Reply, ResponseAction, Rewrite,
};
use waygate::metrics::{Kind, OpenLabels};
use waygate::request::Operation;
use waygate_fuzz::{
    CLIENT_KEY, LIMITED_KEY, MemoryStore, SECRETS, check_client_stream, check_envelope, check_header, chunked, config,
    contains, stream_texts,
};

#[derive(Arbitrary, Debug)]
enum Auth {
    Dev,
    Limited,
    Missing,
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Body {
    Raw(Vec<u8>),
    Template {
        model: u8,
        legacy: bool,
        stream: bool,
        include_usage: bool,
        content: String,
        routing: Option<(Vec<u8>, Option<bool>, Option<u8>)>,
        response_format: u8,
        n: Option<u8>,
    },
}

#[derive(Arbitrary, Debug)]
enum UpBody {
    Raw(Vec<u8>),
    Fixture(u8),
    Spliced { fixture: u8, at: u16, insert: Vec<u8> },
}

#[derive(Arbitrary, Debug)]
struct Upstream {
    status: u16,
    content_type: u8,
    details: u8,
    retry_after: Option<Vec<u8>>,
    headers_only: bool,
    body: UpBody,
    plan: Vec<u8>,
}

#[derive(Arbitrary, Debug)]
struct CallAnswer {
    refused: bool,
    status: u16,
    content_type: u8,
    retry_after: Option<Vec<u8>>,
    body: UpBody,
}

#[derive(Arbitrary, Debug)]
struct Input {
    auth: Auth,
    path: u8,
    method: u8,
    content_type: u8,
    declared_length: Option<u32>,
    extra: Vec<(Vec<u8>, Vec<u8>)>,
    headers_eos: bool,
    body: Body,
    progress: Vec<u32>,
    upstream: Upstream,
    calls: Vec<CallAnswer>,
    now: u32,
    repeat: u8,
}

const FIXTURES: [&[u8]; 12] = [
    include_bytes!("../../tests/fixtures/openai/chat_completion.json"),
    include_bytes!("../../tests/fixtures/openai/chat_completion_stream_include_usage.sse"),
    include_bytes!("../../tests/fixtures/openai/completion.json"),
    include_bytes!("../../tests/fixtures/openai/chat_completion_stream_parallel_tool_calls.sse"),
    include_bytes!("../../tests/fixtures/openai/error_400_unsupported_parameter.json"),
    include_bytes!("../../tests/fixtures/anthropic/message.json"),
    include_bytes!("../../tests/fixtures/anthropic/message_stream_tool_use.sse"),
    include_bytes!("../../tests/fixtures/anthropic/stream_error_event.sse"),
    include_bytes!("../../tests/fixtures/anthropic/error_529_overloaded.json"),
    include_bytes!("../../tests/fixtures/gemini/generate_content_function_call.json"),
    include_bytes!("../../tests/fixtures/gemini/stream_generate_content.sse"),
    include_bytes!("../../tests/fixtures/gemini/error_429_resource_exhausted.json"),
];

const PATHS: [&str; 7] = [
    "/api/v1/chat/completions",
    "/api/v1/completions",
    "/api/v1/models",
    "/api/v1/chat/completions?x=1",
    "/api/v1/unknown",
    "/elsewhere",
    "/api/v1",
];
const METHODS: [&str; 3] = ["POST", "GET", "PUT"];
const CONTENT_TYPES: [&str; 6] = [
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    "APPLICATION/JSON",
    "",
    "application/jsonx",
];
const UP_CONTENT_TYPES: [Option<&str>; 6] = [
    Some("application/json"),
    Some("text/event-stream"),
    Some("text/event-stream; charset=utf-8"),
    Some("text/plain"),
    None,
    Some("TEXT/EVENT-STREAM"),
];
const DETAILS: [Option<&str>; 6] = [
    Some("via_upstream"),
    None,
    Some("upstream_reset_before_response_started{connection_failure}"),
    Some("response_timeout"),
    // Envoy's rate limit filter's refusals ("limits": "global").
    Some("request_rate_limited"),
    Some("rate_limiter_error"),
];
const MODELS: [&str; 9] = [
    "chain/x",
    "oa/gpt-4o",
    "an/claude",
    "ge/gemini-2.5-flash",
    "lg/legacy",
    "chain/keyless",
    "nokey/x",
    "nowhere/x",
    "oa",
];

fn status(s: u16) -> u16 {
    const COMMON: [u16; 19] = [
        200, 200, 200, 200, 400, 401, 403, 404, 408, 409, 413, 422, 429, 500, 502, 503, 504, 201, 0,
    ];
    if s >= 0xf000 {
        s & 0x3ff
    } else {
        COMMON[usize::from(s) % COMMON.len()]
    }
}

fn up_body(b: &UpBody) -> Vec<u8> {
    match b {
        UpBody::Raw(raw) => raw.clone(),
        UpBody::Fixture(i) => FIXTURES[usize::from(*i) % FIXTURES.len()].to_vec(),
        UpBody::Spliced { fixture, at, insert } => {
            let mut f = FIXTURES[usize::from(*fixture) % FIXTURES.len()].to_vec();
            let at = usize::from(*at) % (f.len() + 1);
            f.splice(at..at, insert.iter().copied());
            f
        }
    }
}

fn request_body(body: &Body) -> Vec<u8> {
    match body {
        Body::Raw(raw) => raw.clone(),
        Body::Template {
            model,
            legacy,
            stream,
            include_usage,
            content,
            routing,
            response_format,
            n,
        } => {
            let model = MODELS[usize::from(*model) % MODELS.len()];
            let mut v = if *legacy {
                json!({"model": model, "prompt": content})
            } else {
                json!({"model": model, "messages": [{"role": "user", "content": content}]})
            };
            v["stream"] = (*stream).into();
            if *include_usage {
                v["stream_options"] = json!({"include_usage": true});
            }
            if let Some((prefer, fallbacks, tries)) = routing {
                let prefer: Vec<&str> = prefer
                    .iter()
                    .map(|p| ["oa", "an", "ge", "lg", "nokey"][usize::from(*p) % 5])
                    .collect();
                let mut r = json!({"prefer": prefer});
                if let Some(f) = fallbacks {
                    r["allow_fallbacks"] = (*f).into();
                }
                if let Some(t) = tries {
                    r["max_provider_tries"] = (*t).into();
                }
                v["waygate"] = json!({"routing": r});
            }
            match response_format % 4 {
                1 => v["response_format"] = json!({"type": "json_object"}),
                2 => {
                    v["response_format"] =
                        json!({"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}}})
                }
                _ => {}
            }
            if let Some(n) = n {
                v["n"] = (*n).into();
            }
            serde_json::to_vec(&v).unwrap()
        }
    }
}

/// Everything the client (or the log) sees, for the secret check.
#[derive(Default)]
struct Seen {
    client: Vec<u8>,
    upstream_headers: Vec<u8>,
}

impl Seen {
    fn headers(&mut self, headers: &[(String, String)]) {
        for (k, v) in headers {
            check_header(k, v);
            self.client.extend_from_slice(k.as_bytes());
            self.client.extend_from_slice(v.as_bytes());
            self.client.push(b'\n');
        }
    }
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

fn check_reply(r: &Reply, seen: &mut Seen) {
    seen.headers(&r.headers);
    seen.client.extend_from_slice(&r.body);
    if r.status >= 400 {
        check_envelope(&r.body);
        assert_eq!(header(&r.headers, "content-type"), Some("application/json"));
    } else {
        assert_eq!(r.status, 200);
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["object"], "list");
    }
}

fn check_rewrite(r: &Rewrite, op: Operation, seen: &mut Seen) {
    seen.headers(&r.set);
    seen.client.extend_from_slice(&r.body);
    assert_eq!(
        header(&r.set, "content-length"),
        Some(r.body.len().to_string().as_str())
    );
    assert_eq!(header(&r.set, ":status"), Some(r.status.to_string().as_str()));
    if r.status >= 400 {
        check_envelope(&r.body);
        assert_eq!(header(&r.set, "content-type"), Some("application/json"));
        return;
    }
    assert_eq!(r.status, 200, "a success is always 200");
    match header(&r.set, "content-type") {
        Some("application/json") => {
            let v: Value = serde_json::from_slice(&r.body).unwrap();
            assert!(
                v["choices"].is_array() && v["id"].is_string() && v["usage"].is_object(),
                "{v}"
            );
        }
        Some("text/event-stream") => {
            check_client_stream(&r.body, op, true, None);
            for text in stream_texts(&r.body) {
                seen.client.extend_from_slice(text.as_bytes());
                seen.client.push(b'\n');
            }
        }
        other => panic!("content-type {other:?}"),
    }
}

fn check_upstream_headers(headers: &[(String, String)], seen: &mut Seen) {
    for (k, v) in headers {
        check_header(k, v);
        seen.upstream_headers.extend_from_slice(v.as_bytes());
        seen.upstream_headers.push(b'\n');
    }
}

fn check_forward(f: &Forward, cfg: &Config, seen: &mut Seen) {
    // Removed, or replaced by the provider's own (setting replaces every value).
    assert!(
        f.remove.iter().any(|h| h == "authorization") || header(&f.set, "authorization").is_some(),
        "the client's key is removed"
    );
    check_upstream_headers(&f.set, seen);
    // The fuzzed configurations use http-call fallback: the body is translated.
    let body = f.body.as_deref().expect("a translated body");
    assert_eq!(header(&f.set, "content-length"), Some(body.len().to_string().as_str()));
    assert!(header(&f.set, ":path").is_some_and(|p| p.starts_with('/')));
    let cluster = header(&f.set, &cfg.cluster_header).expect("a cluster is chosen");
    assert!(cfg.providers.iter().any(|p| p.cluster == cluster));
    serde_json::from_slice::<Value>(body).expect("the upstream body is JSON");
}

fn check_call(c: &Call, cfg: &Config, seen: &mut Seen) {
    let names: Vec<&str> = c.headers.iter().take(3).map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, [":method", ":path", ":authority"]);
    assert!(cfg.providers.iter().any(|p| p.cluster == c.cluster));
    assert!(c.timeout_ms > 0);
    check_upstream_headers(&c.headers, seen);
    serde_json::from_slice::<Value>(&c.body).expect("the call body is JSON");
}

fn run(input: &Input, cfg: &Rc<Config>, store: &mut MemoryStore, round: u64) {
    let mut seen = Seen::default();
    let mut ex = Exchange::new(Rc::clone(cfg), 0);
    let path = PATHS[usize::from(input.path) % PATHS.len()];
    let op = if path.starts_with("/api/v1/completions") {
        Operation::Completions
    } else {
        Operation::Chat
    };
    let body = request_body(&input.body);
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = vec![
        (
            b":method".to_vec(),
            METHODS[usize::from(input.method) % METHODS.len()].into(),
        ),
        (b":path".to_vec(), path.into()),
        (b":authority".to_vec(), b"gateway.local".to_vec()),
        (
            b"content-type".to_vec(),
            CONTENT_TYPES[usize::from(input.content_type) % CONTENT_TYPES.len()].into(),
        ),
    ];
    match &input.auth {
        Auth::Dev => pairs.push((b"authorization".to_vec(), format!("Bearer {CLIENT_KEY}").into_bytes())),
        Auth::Limited => pairs.push((b"authorization".to_vec(), format!("Bearer {LIMITED_KEY}").into_bytes())),
        Auth::Missing => {}
        Auth::Raw(raw) => pairs.push((b"authorization".to_vec(), raw.clone())),
    }
    if let Some(n) = input.declared_length {
        pairs.push((b"content-length".to_vec(), n.to_string().into_bytes()));
    }
    pairs.extend(input.extra.iter().cloned());
    // What the client itself sent: a secret in there is not a leak.
    let mut from_client = body.clone();
    for (k, v) in &pairs {
        from_client.extend_from_slice(k);
        from_client.extend_from_slice(v);
    }

    let step = ex.on_request_headers(&pairs, input.headers_eos);
    // The client's x-envoy-* and provider-account headers go only on the API, never on a
    // path passed through; on the API every account header goes.
    const ACCOUNT: [&str; 7] = [
        "x-api-key",
        "api-key",
        "x-goog-api-key",
        "openai-organization",
        "openai-project",
        "cookie",
        "proxy-authorization",
    ];
    let api = !matches!(step.action, HeadersAction::Continue);
    for name in &step.remove {
        let reserved = name.starts_with("x-waygate-") || *name == cfg.cluster_header;
        let api_only = name.starts_with("x-envoy-") || ACCOUNT.contains(&name.as_str());
        assert!(reserved || (api && api_only), "{name}");
    }
    if api {
        for (name, _) in &pairs {
            if let Ok(name) = std::str::from_utf8(name)
                && ACCOUNT.contains(&name)
            {
                assert!(step.remove.iter().any(|r| r == name), "{name} goes upstream");
            }
        }
    }
    // Unix nanoseconds.
    let now = (1_700_000_000 + u64::from(input.now % 600) + round) * 1_000_000_000;
    let finished = match step.action {
        HeadersAction::Continue => {
            assert!(ex.on_log(store, now, &mut OpenLabels::default()).is_none());
            return;
        }
        HeadersAction::Reply(r) => {
            check_reply(&r, &mut seen);
            true
        }
        HeadersAction::ReadBody => false,
    };
    if !finished {
        drive_body(&mut ex, input, cfg, store, &body, op, now, &mut seen);
    }
    let log = ex
        .on_log(store, now + 7_000_000, &mut OpenLabels::default())
        .expect("ours, so logged");
    assert!(!log.line.contains(['\n', '\r']), "one log line: {:?}", log.line);
    seen.client.extend_from_slice(log.line.as_bytes());
    for update in log.metrics {
        // Envoy refuses a zero increment; a gauge is set, 0 included (a closed circuit).
        assert!(update.kind != Kind::Counter || update.value > 0, "{update:?}");
        assert!(
            update
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.'),
            "{update:?}"
        );
    }
    for secret in SECRETS {
        if !contains(&from_client, secret.as_bytes()) {
            assert!(
                !contains(&seen.client, secret.as_bytes()),
                "provider credential {secret} reached the client or the log"
            );
        }
    }
    for key in [CLIENT_KEY, LIMITED_KEY] {
        if !contains(&body, key.as_bytes()) {
            assert!(
                !contains(&seen.upstream_headers, key.as_bytes()),
                "the client's key went upstream"
            );
        }
    }
}

/// An upstream answer's headers as the shell hands them over.
fn response_head(status: u16, content_type: u8, retry_after: Option<&[u8]>) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut head = vec![(b":status".to_vec(), status.to_string().into_bytes())];
    if let Some(ct) = UP_CONTENT_TYPES[usize::from(content_type) % UP_CONTENT_TYPES.len()] {
        head.push((b"content-type".to_vec(), ct.as_bytes().to_vec()));
    }
    if let Some(v) = retry_after {
        head.push((b"retry-after".to_vec(), v.to_vec()));
    }
    head
}

#[allow(clippy::too_many_arguments)]
fn drive_body(
    ex: &mut Exchange,
    input: &Input,
    cfg: &Rc<Config>,
    store: &mut MemoryStore,
    body: &[u8],
    op: Operation,
    now: u64,
    seen: &mut Seen,
) {
    let totals = input.progress.iter().map(|t| (*t as usize, false));
    for (total, end) in totals.chain([(body.len(), true)]) {
        match ex.on_request_body_chunk(total, end) {
            BodyStep::Reply(r) => {
                assert_eq!(r.status, 413);
                check_reply(&r, seen);
                return;
            }
            BodyStep::Wait => assert!(!end),
            BodyStep::Read => assert!(end),
            BodyStep::Pass => panic!("a body the filter asked for is read"),
        }
    }
    let forward = match ex.on_request_body(body, now, store) {
        Ok(f) => f,
        Err(r) => {
            check_reply(&r, seen);
            assert!(r.status >= 400);
            return;
        }
    };
    check_forward(&forward, cfg, seen);
    let up = &input.upstream;
    let up_bytes = up_body(&up.body);
    let retry_after = up.retry_after.as_deref();
    let details = DETAILS[usize::from(up.details) % DETAILS.len()];
    let mut head = response_head(status(up.status), up.content_type, retry_after);
    if let Some(reset) = retry_after {
        head.push((b"x-ratelimit-reset".to_vec(), reset.to_vec()));
    }
    let step = ex.on_response_headers(&head, || details.map(|d| d.as_bytes().to_vec()), up.headers_only);
    seen.headers(&step.scrub);
    // Only a provider's x-ratelimit-* go, and only under a limited key's own.
    for name in &step.remove {
        assert!(name.starts_with("x-ratelimit-"), "{name}");
    }
    match step.action {
        ResponseAction::Continue => panic!("a forwarded request's answer is always ours"),
        ResponseAction::Stream { remove, set } => {
            assert!(!up.headers_only);
            assert!(remove.iter().any(|h| h == "content-length"));
            seen.headers(&set);
            let chunks = chunked(&up.plan.iter().map(|s| usize::from(*s)).collect::<Vec<_>>(), &up_bytes);
            let mut out = Vec::new();
            let last = chunks.len() - 1;
            for (i, chunk) in chunks.iter().enumerate() {
                ex.on_response_body_timing(chunk.len(), i == last, || now + 1_000_000);
                ex.on_stream_body(chunk, i == last, &mut out);
            }
            seen.client.extend_from_slice(&out);
            check_client_stream(&out, op, true, None);
            // A credential split across deltas is still scrubbed.
            for text in stream_texts(&out) {
                seen.client.extend_from_slice(text.as_bytes());
                seen.client.push(b'\n');
            }
            // Chunks after the end change nothing.
            let mut more = Vec::new();
            ex.on_stream_body(b"data: more\n\n", true, &mut more);
            assert!(more.is_empty());
        }
        ResponseAction::Answer(r) => {
            // A headers-only answer, or Envoy's rate limit filter's refusal (which
            // replaces whatever it came with).
            let refused = matches!(details, Some("request_rate_limited" | "rate_limiter_error"));
            assert!(up.headers_only || refused, "a rewrite at the headers: {r:?}");
            check_rewrite(&r, op, seen);
        }
        ResponseAction::Buffer => {
            let chunks = chunked(&up.plan.iter().map(|s| usize::from(*s)).collect::<Vec<_>>(), &up_bytes);
            let last = chunks.len() - 1;
            for (i, chunk) in chunks.iter().enumerate() {
                ex.on_response_body_timing(chunk.len(), i == last, || now + 2_000_000);
                match ex.on_buffered_chunk(chunk.to_vec(), i == last) {
                    BufferStep::Hold => assert!(i < last, "the last chunk ends the held answer"),
                    BufferStep::Write(rewrite) | BufferStep::Reply(rewrite) => {
                        assert_eq!(i, last, "held until its end (every answer here is under the cap)");
                        check_rewrite(&rewrite, op, seen);
                    }
                }
            }
        }
        ResponseAction::Fallback(mut call) => {
            let mut answers = input.calls.iter();
            for attempt in 0.. {
                assert!(attempt < 8, "fallbacks are bounded by the candidates");
                check_call(&call, cfg, seen);
                let step = match answers.next() {
                    None => ex.on_call_refused(),
                    Some(a) if a.refused => ex.on_call_refused(),
                    Some(a) => {
                        let bytes = up_body(&a.body);
                        let head = response_head(status(a.status), a.content_type, a.retry_after.as_deref());
                        ex.on_call_response(&head, &bytes)
                    }
                };
                match step {
                    CallStep::Dispatch(next) => call = next,
                    CallStep::Reply(r) => {
                        check_rewrite(&r, op, seen);
                        break;
                    }
                }
            }
        }
    }
}

fuzz_target!(|input: Input| {
    let cfg = config();
    let mut store = MemoryStore::default();
    // As the shell's on_configure does before the VM serves.
    waygate::limits::prepare(&mut store, &cfg.keys);
    waygate::health::prepare(&mut store, &cfg.providers);
    waygate::inflight::prepare(&mut store, &cfg);
    for round in 0..=u64::from(input.repeat % 5) {
        run(&input, &cfg, &mut store, round);
    }
});
