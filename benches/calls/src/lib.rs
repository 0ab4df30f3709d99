//! Waygate's host calls and nothing else: for the bench's OpenAI-compatible request, the
//! same reads and writes of headers, bodies, filter state, stats, clock and log line, in the
//! same callbacks, as waygate's shell makes (docs/performance.md "Performance" counts them: 39 for the
//! non-streamed request), with no parsing, validation, translation or record behind them.
//! The values are fixed, the bodies go back as they came (but for the model's provider
//! prefix, which the fake upstream would not know, and a stream's usage asked for, as
//! waygate asks for it). Its cost above Envoy alone is what those calls
//! cost in Envoy; waygate's above it is its own code. When waygate's shell changes what it
//! asks of the host for these requests, this changes with it.

use std::cell::RefCell;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, MetricType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root) });
}}

struct Root;

impl Context for Root {}

impl RootContext for Root {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        // waygate reads the clock as its context is made (the request's start).
        let started = clock();
        Some(Box::new(Calls {
            started,
            answer: Vec::new(),
            stream: false,
            first_byte_timed: false,
        }))
    }
}

struct Calls {
    started: Duration,
    /// The held answer so far (a non-streamed one).
    answer: Vec<u8>,
    stream: bool,
    /// The first answer byte's time was read (waygate keeps it for its stats).
    first_byte_timed: bool,
}

impl Context for Calls {}

fn clock() -> Duration {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .unwrap_or_default()
}

fn set(map: MapType, name: &str, value: &str) {
    let _ = hostcalls::set_map_value(map, name, Some(value));
}

fn property(name: &str, value: &[u8]) {
    let _ = hostcalls::set_property(vec![name], Some(value));
}

fn body(kind: BufferType, size: usize) -> Vec<u8> {
    hostcalls::get_buffer(kind, 0, size).ok().flatten().unwrap_or_default()
}

thread_local! {
    /// Stat ids by name, defined on first use, as waygate keeps them.
    static STATS: RefCell<Vec<(&'static str, u32)>> = const { RefCell::new(Vec::new()) };
}

fn stat(kind: MetricType, name: &'static str, value: u64) {
    let id = STATS.with(|stats| {
        let mut stats = stats.borrow_mut();
        if let Some((_, id)) = stats.iter().find(|(n, _)| *n == name) {
            return Some(*id);
        }
        let id = hostcalls::define_metric(kind, name).ok()?;
        stats.push((name, id));
        Some(id)
    });
    if let Some(id) = id {
        let _ = match kind {
            MetricType::Histogram => hostcalls::record_metric(id, value),
            _ => hostcalls::increment_metric(id, i64::try_from(value).unwrap_or(i64::MAX)),
        };
    }
}

/// The provider's body, as waygate would send it for the bench's requests: the model's
/// `fake/` prefix dropped and, in a stream, usage asked for. Both members stand in the body's
/// last bytes (the bench serialises its bodies with sorted members: `model` and `stream`
/// after `messages`), so only those are searched.
fn provider_body(body: &[u8]) -> Vec<u8> {
    const PREFIX: &[u8] = b"\"fake/";
    const STREAM: &[u8] = b"\"stream\":true";
    const USAGE: &[u8] = b",\"stream_options\":{\"include_usage\":true}";
    let tail = body.len().saturating_sub(128);
    let find = |needle: &[u8]| {
        body.get(tail..)?
            .windows(needle.len())
            .rposition(|w| w == needle)
            .map(|at| tail + at)
    };
    let mut out = Vec::with_capacity(body.len() + USAGE.len());
    match find(PREFIX) {
        Some(at) => {
            out.extend_from_slice(body.get(..=at).unwrap_or_default());
            out.extend_from_slice(body.get(at + PREFIX.len()..).unwrap_or_default());
        }
        None => out.extend_from_slice(body),
    }
    if find(STREAM).is_some() && out.last() == Some(&b'}') {
        out.pop();
        out.extend_from_slice(USAGE);
        out.push(b'}');
    }
    out
}

impl HttpContext for Calls {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let _headers = hostcalls::get_map_bytes(MapType::HttpRequestHeaders);
        if end_of_stream { Action::Continue } else { Action::Pause }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        let body = provider_body(&body(BufferType::HttpRequestBody, body_size));
        let _now = clock();
        let _ = hostcalls::set_buffer(BufferType::HttpRequestBody, 0, body_size, &body);
        let _ = hostcalls::set_map_value(MapType::HttpRequestHeaders, "accept-encoding", None);
        let request = MapType::HttpRequestHeaders;
        set(request, ":path", "/v1/chat/completions");
        set(request, ":authority", "fake.local");
        set(request, "content-type", "application/json");
        set(request, "content-length", &body.len().to_string());
        set(request, "authorization", "Bearer fake-openai-key");
        set(request, "x-waygate-cluster", "fake");
        set(request, "x-envoy-upstream-rq-timeout-ms", "30000");
        property("waygate_key_id", b"dev");
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        let headers = hostcalls::get_map_bytes(MapType::HttpResponseHeaders).unwrap_or_default();
        self.stream = headers
            .iter()
            .any(|(name, value)| name == "content-type" && value.starts_with(b"text/event-stream"));
        if end_of_stream {
            return Action::Continue;
        }
        if !self.stream {
            return Action::Pause;
        }
        let response = MapType::HttpResponseHeaders;
        let _ = hostcalls::set_map_value(response, "content-length", None);
        set(response, "content-type", "text/event-stream");
        set(response, "x-waygate-provider", "fake");
        set(response, "x-waygate-attempts", "fake:200");
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let first_bytes = body_size > 0 && !self.first_byte_timed;
        if first_bytes || (end_of_stream && !self.stream) {
            let _now = clock();
            self.first_byte_timed |= first_bytes;
        }
        let chunk = body(BufferType::HttpResponseBody, body_size);
        if self.stream {
            let _ = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, body_size, &chunk);
            if end_of_stream {
                publish_usage();
            }
            return Action::Continue;
        }
        self.answer.extend_from_slice(&chunk);
        if !end_of_stream {
            let _ = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, body_size, &[]);
            return Action::Pause;
        }
        publish_usage();
        let response = MapType::HttpResponseHeaders;
        set(response, ":status", "200");
        set(response, "content-type", "application/json");
        set(response, "content-length", &self.answer.len().to_string());
        set(response, "x-waygate-provider", "fake");
        set(response, "x-waygate-attempts", "fake:200");
        let _ = hostcalls::set_buffer(BufferType::HttpResponseBody, 0, body_size, &self.answer);
        Action::Continue
    }

    fn on_log(&mut self) {
        let elapsed = clock().saturating_sub(self.started);
        stat(MetricType::Counter, "waygate.requests.fake.2xx", 1);
        stat(MetricType::Counter, "waygate.attempts.fake.200", 1);
        stat(MetricType::Counter, "waygate.tokens.prompt.fake.fake_gpt-4o-mini", 12);
        stat(
            MetricType::Counter,
            "waygate.tokens.completion.fake.fake_gpt-4o-mini",
            34,
        );
        stat(MetricType::Counter, "waygate.tokens.key.dev", 46);
        stat(MetricType::Histogram, "waygate.upstream_duration_ms.fake", 1);
        stat(MetricType::Histogram, "waygate.time_to_first_token_ms.fake", 1);
        let line = format!(
            "waygate request id=chatcmpl_0123456789abcdefghijklmn key=dev model=fake/gpt-4o-mini \
             provider=fake attempts=fake:200 status=200 prompt_tokens=12 completion_tokens=34 ms={}",
            elapsed.as_millis()
        );
        let _ = hostcalls::log(LogLevel::Info, &line);
    }
}

/// The answer's usage and provider as filter state, as waygate publishes them.
fn publish_usage() {
    property("waygate_prompt_tokens", b"12");
    property("waygate_completion_tokens", b"34");
    property("waygate_total_tokens", b"46");
    property("waygate_provider", b"fake");
}

#[cfg(test)]
mod tests {
    use super::provider_body;

    #[test]
    fn the_provider_body_drops_the_prefix_and_asks_a_stream_for_usage() {
        let chat = br#"{"messages":[{"role":"user","content":"fake/"}],"model":"fake/gpt-4o-mini","user":"u"}"#;
        let expected = br#"{"messages":[{"role":"user","content":"fake/"}],"model":"gpt-4o-mini","user":"u"}"#;
        assert_eq!(provider_body(chat), expected.to_vec());
        let stream = br#"{"model":"fake/long-18","stream":true}"#;
        let expected = br#"{"model":"long-18","stream":true,"stream_options":{"include_usage":true}}"#;
        assert_eq!(provider_body(stream), expected.to_vec());
    }
}
