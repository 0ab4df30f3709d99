//! The life of one request, as a state machine the shell drives.
//!
//! Each method takes what the host showed in one callback and returns one
//! step for the shell to apply: headers to remove or set, a body, filter
//! state, or a local reply. Nothing here calls the host, so the whole
//! request path runs natively in tests. What the request needs across
//! callbacks is here too: a held answer's chunks and its cap, the clock's
//! readings for the log, whether its usage was published.
//!
//! A request goes through `State`: its headers are checked (contract §4, up
//! to the size) → its body is read (parse, resolve, authorise, route,
//! translate) → upstream → the answer streamed, buffered, or replaced by a
//! fallback call's → done, and [`Exchange::on_log`] writes what it was.
//! Each state holds the data only it needs; what the log and the stats say
//! of the request is gathered in one `Record` beside it.
//!
//! Each phase has its module: `head` (the request headers), `route` (the
//! body, to the first attempt), `response` (every answer, fallback and
//! stream); this one holds the steps the shell applies, the states, and
//! what every phase uses (replies, redaction, the log).

mod head;
mod response;
mod route;
#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::rc::Rc;

use memchr::memmem::Finder;
use serde_json::Value;

use crate::answer::{self, Stamp};
use crate::attempts::{self, Attempts, Prepared};
use crate::auth;
use crate::config::{Api, Config, Fallback, Limits, Provider};
use crate::errors::{ApiError, ErrorType, Header};
use crate::headers::{ResponseHead, header_in, is_json, names_where, printable};
use crate::health;
use crate::ids::{self, new_id};
use crate::inbound::{Client, ClientApi, ClientStream, counts_tokens, messages, responses};
use crate::inflight;
use crate::limits::{self, SharedStore};
use crate::metrics;
use crate::models;
use crate::providers::anthropic;
use crate::providers::{self, UpstreamRequest};
use crate::record::{Outcome, Record, Tried};
use crate::redact::{self, Secret};
use crate::request::{self, Operation, ParsedRequest};
use crate::routing::{self, Candidate};
use crate::stream::StreamRewriter;
use route::Plan;

/// A local reply: the filter answers without (further) upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<Header>,
    pub body: Vec<u8>,
}

/// What to do at the end of the request headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadersAction {
    /// Not ours (outside `base_path`): let it through.
    Continue,
    /// Answer now.
    Reply(Reply),
    /// Hold the headers and read the whole body.
    ReadBody,
}

/// Result of the request-headers phase. `remove` always applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadersStep {
    pub remove: Vec<String>,
    pub action: HeadersAction,
}

/// What to do at a request body callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyStep {
    /// Not a body the filter reads (not ours, or answered already).
    Pass,
    /// Not all here yet: hold it.
    Wait,
    /// Answer now (the body is already too large).
    Reply(Reply),
    /// All here: read it and hand it to [`Exchange::on_request_body`].
    Read,
}

/// The filter state `wasm.waygate_key_id`: the client key's id, for Envoy's
/// rate limit descriptors and access log (docs/operating.md "Limits and stats").
pub const KEY_ID_PROPERTY: &str = "waygate_key_id";

/// The filter state `wasm.waygate_api`: `messages` for a request of the
/// Messages API, whose errors Envoy's own replies must give in Anthropic's
/// envelope (docs/contract.md §4 "Errors Envoy answers itself"); unset
/// otherwise.
pub const API_PROPERTY: &str = "waygate_api";

/// With router fallback, this request header (value `1`) selects the
/// route that retries across clusters; that route removes it again.
pub const ROUTED_HEADER: &str = "x-waygate-routed";

/// The largest non-streaming answer the filter holds (`Held`); past it the
/// client gets the contract's 502.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;
/// The rewritten request to send upstream, applied in field order.
#[derive(Debug, Clone)]
pub struct Forward {
    /// The body to send instead of the client's; `None` leaves it as sent
    /// (router fallback: each attempt replaces it).
    pub body: Option<Vec<u8>>,
    /// Removed first.
    pub remove: Vec<String>,
    /// Set after `remove`; each replaces any existing value.
    pub set: Vec<Header>,
    /// Filter state published before the request goes on (the filters after
    /// ours and the route read it): [`KEY_ID_PROPERTY`], and with router
    /// fallback each attempt's cluster ([`attempts::SLOT_PROPERTY`]).
    pub properties: Vec<(String, String)>,
    /// With router fallback: the attempts, handed to the upstream role.
    pub routed: Option<Rc<RefCell<Attempts>>>,
}

/// What to do at the end of the response headers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseAction {
    /// Not ours to touch (our own reply, or a request we passed through).
    Continue,
    /// A live stream: apply these edits, continue, then call
    /// [`Exchange::on_stream_body`] for each chunk.
    Stream { remove: Vec<String>, set: Vec<Header> },
    /// Hold the headers, buffer the whole body, then call
    /// [`Exchange::on_buffered_body`].
    Buffer,
    /// The final answer is known already (a headers-only answer, or a
    /// refusal by a filter after ours): it replaces the upstream one.
    Answer(Rewrite),
    /// This attempt failed before any byte reached the client: hold the
    /// response (its body is dropped) and send this call to the next
    /// candidate; its answer comes to [`Exchange::on_call_response`].
    Fallback(Call),
}

/// Result of the response-headers phase: `scrub` applies first (the
/// upstream headers that echo a credential, with the value to set instead),
/// then `remove` (upstream headers that would pass for the filter's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseStep {
    pub scrub: Vec<Header>,
    pub remove: Vec<String>,
    pub action: ResponseAction,
}

/// A fallback attempt, sent with `dispatch_http_call`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub cluster: String,
    /// Pseudo-headers (`:method`, `:path`, `:authority`) first.
    pub headers: Vec<Header>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

/// What to do with a fallback call's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallStep {
    /// That one failed too: try this next.
    Dispatch(Call),
    /// The final answer, sent as a local reply that replaces the held
    /// upstream response.
    Reply(Rewrite),
}

/// The final shape of a buffered answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pub status: u16,
    pub remove: Vec<String>,
    pub set: Vec<Header>,
    pub body: Vec<u8>,
}

/// What to do with a chunk of a held (non-streamed) answer, from
/// [`Exchange::on_buffered_chunk`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufferStep {
    /// More is to come and the exchange keeps this chunk: empty Envoy's
    /// buffer of it and pause.
    Hold,
    /// The final answer: its headers and body written over the held
    /// upstream answer, `body` replacing the callback's buffer.
    Write(Rewrite),
    /// The final answer, sent as a local reply in place of the upstream one.
    Reply(Rewrite),
}

/// Where the request is, as far as the shell's response callbacks care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Not ours, or answered already: every response callback passes.
    Untouched,
    /// Sent upstream, its response headers not yet here.
    Awaiting,
    /// The upstream answer failed and is held while fallback calls run.
    Calling,
    Streaming,
    Buffering,
}

/// What `on_log` hands the host: the stats to change and the access log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Log {
    pub metrics: Vec<metrics::Update>,
    pub line: String,
}

/// The client's request, read in the internal form, the id, model and time
/// its answer carries, and what its answer needs of the client's API.
struct Asked {
    request: ParsedRequest,
    stamp: Stamp,
    client: Client,
}

/// How a failed attempt is followed.
enum Next {
    /// `"http_call"`: the filter calls the next candidate itself.
    Call(Plan),
    /// `"router"`: Envoy's router has made the attempts by the time the
    /// response headers come; the upstream role reports each one here.
    Router(Rc<RefCell<Attempts>>),
}

/// A request on its way: what was asked, the provider serving it now (and
/// the model it is asked for), and how a failure goes on.
struct Routed {
    asked: Asked,
    provider: Rc<Provider>,
    model: String,
    next: Next,
}

/// A buffered upstream answer: its head, and its body so far.
///
/// The body is held here, not in Envoy's buffer, so that its size limit is
/// ours ([`MAX_ANSWER_BYTES`]) and an oversize answer gets the contract's
/// 502 rather than Envoy's plain-text 500. It is kept as the chunks that
/// came, so that growing it never needs one large reallocation (a VM's
/// memory never shrinks).
struct Held {
    status: u16,
    retry_after: Option<String>,
    /// Envoy's own failure (connect failure, reset, timeout), not a provider's answer.
    router_error: bool,
    event_stream: bool,
    chunks: Vec<Vec<u8>>,
    len: usize,
    /// The most Envoy's own buffer of this answer has held, once a body
    /// callback paused; `None` before. See [`Exchange::on_buffered_chunk`].
    in_envoy: Option<usize>,
}

impl Held {
    fn new(status: u16, retry_after: Option<String>, router_error: bool, event_stream: bool) -> Held {
        Held {
            status,
            retry_after,
            router_error,
            event_stream,
            chunks: Vec::new(),
            len: 0,
            in_envoy: None,
        }
    }

    /// The held chunks followed by the `last` one, in one allocation.
    fn whole(&mut self, last: Vec<u8>) -> Vec<u8> {
        if self.chunks.is_empty() {
            return last;
        }
        let mut body = Vec::with_capacity(self.len);
        for chunk in self.chunks.drain(..) {
            body.extend_from_slice(&chunk);
        }
        body.extend_from_slice(&last);
        body
    }
}

/// The host clock's readings (nanoseconds) the log's durations come from:
/// when the request came, went upstream, and when its answer's first byte
/// and its end came.
#[derive(Default)]
struct Clock {
    started_ns: u64,
    forwarded_ns: Option<u64>,
    first_byte_ns: Option<u64>,
    done_ns: Option<u64>,
}

enum State {
    Start,
    /// Not ours: nothing to do, nothing to log.
    PassThrough,
    /// Headers accepted; the body is being read. `key_headers`: request
    /// headers besides `authorization` that carry the client's key (SDKs also
    /// send it as `x-api-key`, `api-key`, ...), never forwarded.
    Reading {
        api: ClientApi,
        key_headers: Vec<String>,
        /// The client's API headers that go with its request to a provider
        /// of the same API (`anthropic-version`, `anthropic-beta`).
        api_headers: Vec<Header>,
    },
    /// Sent upstream, waiting for the response headers.
    Upstream(Routed),
    /// A fallback call is out.
    Calling(Routed),
    Streaming(Box<ClientStream>),
    Buffering(Routed, Held),
    /// Answered (locally or upstream); only the log is left.
    Done,
}

/// One request's state.
pub struct Exchange {
    config: Rc<Config>,
    state: State,
    record: Record,
    /// The API the client called: its errors are in that API's envelope.
    api: ClientApi,
    /// A live stream has passed bytes on: Envoy cutting it now is not a
    /// failure before its first byte (health).
    streamed: bool,
    clock: Clock,
    /// The answer's usage has been handed out as filter state ([`Exchange::take_usage`]).
    usage_published: bool,
}

impl Exchange {
    /// A request that came at `now_ns` on the host's clock.
    pub fn new(config: Rc<Config>, now_ns: u64) -> Exchange {
        Exchange {
            config,
            state: State::Start,
            record: Record::default(),
            api: ClientApi::Chat,
            streamed: false,
            clock: Clock {
                started_ns: now_ns,
                ..Clock::default()
            },
            usage_published: false,
        }
    }

    /// Where the request is, for the shell's response callbacks.
    pub fn stage(&self) -> Stage {
        match self.state {
            State::Upstream(_) => Stage::Awaiting,
            State::Calling(_) => Stage::Calling,
            State::Streaming(_) => Stage::Streaming,
            State::Buffering(..) => Stage::Buffering,
            State::Start | State::PassThrough | State::Reading { .. } | State::Done => Stage::Untouched,
        }
    }

    /// The provider asked now, or the last one asked.
    fn serving(&self) -> Option<&Rc<Provider>> {
        match &self.state {
            State::Upstream(r) | State::Calling(r) | State::Buffering(r, _) => Some(&r.provider),
            _ => self.record.attempts.last().map(|t| &t.provider),
        }
    }

    /// The credentials of every provider this request was sent to. A
    /// provider that echoes the request (its error message, an echo model, a
    /// value serde quotes back) would otherwise hand our key to the client.
    fn sent_credentials(&self) -> Vec<&Secret> {
        // A handful of providers at most: no sort (its code would be kilobytes of the module).
        let mut sent: Vec<&Secret> = Vec::new();
        for p in self.record.attempts.iter().map(|t| &t.provider).chain(self.serving()) {
            if let Some(credential) = &p.credential
                && credential.worth_scrubbing()
                && !sent.contains(&credential)
            {
                sent.push(credential);
            }
        }
        sent
    }

    fn redact(&self, bytes: &mut Vec<u8>) {
        for secret in self.sent_credentials() {
            secret.scrub_from(bytes, 0);
        }
    }

    fn reply_error(&mut self, e: &ApiError) -> Reply {
        self.record.error_code = Some(e.code.clone());
        self.reply(Reply {
            status: e.status,
            headers: e.headers(),
            body: self.api.error_body(e),
        })
    }

    /// The shell could not apply a step (the host refused a call that
    /// should not fail): the request ends with the contract's 500, and is
    /// logged as such.
    pub fn fail(&mut self, what: &str) -> Reply {
        self.reply_error(&internal(what))
    }

    /// The shell had to reset a live stream (its headers are sent, so no
    /// answer can replace it): the request is logged as the contract's 500.
    pub fn cut(&mut self, what: &str) {
        let e = internal(what);
        self.state = State::Done;
        self.record.status = e.status;
        self.record.error_code = Some(e.code);
    }

    fn reply(&mut self, mut reply: Reply) -> Reply {
        self.state = State::Done;
        self.record.status = reply.status;
        if let Some(standing) = self.record.standing {
            reply.headers.extend(standing.headers());
        }
        reply
    }

    /// The request is over (its stream has ended, however it ended; Envoy
    /// calls `on_log` even when the client went away). Counts the answer's
    /// tokens against the key's limit (a stream that ran past the limit
    /// finishes; the next request is refused), and says what the request
    /// adds to the stats and the access log; every attempt's outcome goes
    /// to its provider's health. `None` for a request passed through.
    /// `now_ns` is the host's clock (unix nanoseconds).
    pub fn on_log(&mut self, store: &mut dyn SharedStore, now_ns: u64, open: &mut metrics::OpenLabels) -> Option<Log> {
        if matches!(self.state, State::PassThrough | State::Start) {
            return None;
        }
        let now_ms = now_ns / 1_000_000;
        let clock = &self.clock;
        let since = |t: Option<u64>, from: Option<u64>| Some(t?.saturating_sub(from?) / 1_000_000);
        let timing = metrics::Timing {
            upstream_ms: since(clock.done_ns.or(Some(now_ns)), clock.forwarded_ns),
            first_byte_ms: since(clock.first_byte_ns, clock.forwarded_ns),
        };
        let duration_ms = now_ns.saturating_sub(clock.started_ns) / 1_000_000;
        let record = &self.record;
        if let (Some(_), Some(usage), Some(key)) = (record.standing, record.usage, &record.key) {
            limits::record_tokens(store, key, now_ms / 1000, usage.total());
        }
        if let Some(key) = &record.inflight {
            inflight::add(store, key, false);
        }
        let changes = health::report(store, &self.config.health, &record.attempts, &record.health, now_ms);
        for change in &changes {
            let circuit = match change.scope {
                health::Scope::Provider => String::new(),
                _ => format!(" {}", redact::log_field(&change.name)),
            };
            match change.opened_for {
                Some(ms) => log::warn!(
                    "circuit opened: provider {} {}{circuit}, for {ms} ms",
                    change.provider.id,
                    change.scope.as_str()
                ),
                None => log::info!(
                    "circuit closed: provider {} {}{circuit}",
                    change.provider.id,
                    change.scope.as_str()
                ),
            }
        }
        let served_by = if record.attempts.is_empty() {
            None
        } else {
            self.served_by()
        };
        let summary = record.summary(served_by);
        let mut metrics = metrics::updates(&summary, timing, open);
        metrics.extend(metrics::circuit_updates(&record.health, &changes, open));
        Some(Log {
            metrics,
            line: record.access_line(self.served_by(), duration_ms),
        })
    }

    /// The provider that served, once known.
    pub fn served_by(&self) -> Option<&str> {
        self.serving().map(|p| p.id.as_str())
    }

    /// The filter state that tells Envoy what the answer spent
    /// ([`Record::usage_properties`]).
    pub fn usage_properties(&self) -> Vec<(&'static str, String)> {
        self.record.usage_properties(self.served_by())
    }

    /// The answer's usage as filter state to publish once the answer is
    /// final (the filters after ours read it as it passes them); empty
    /// before, and once handed out.
    pub fn take_usage(&mut self) -> Vec<(&'static str, String)> {
        if matches!(self.state, State::Done) {
            self.take_usage_at_log()
        } else {
            Vec::new()
        }
    }

    /// [`Exchange::take_usage`] at the log, however the request ended (a
    /// client that went away mid-stream included): the one place where an
    /// answer's tokens are sure to be counted.
    pub fn take_usage_at_log(&mut self) -> Vec<(&'static str, String)> {
        if std::mem::replace(&mut self.usage_published, true) {
            return Vec::new();
        }
        self.usage_properties()
    }

    /// A response body callback brought `len` more bytes: the answer's first
    /// byte and its end are timed. `now_ns` reads the host's clock, only then
    /// (a stream has many callbacks).
    pub fn on_response_body_timing(&mut self, len: usize, end_of_stream: bool, now_ns: impl FnOnce() -> u64) {
        let first_bytes = len > 0 && self.clock.first_byte_ns.is_none();
        if !(first_bytes || end_of_stream) || !matches!(self.state, State::Streaming(_) | State::Buffering(..)) {
            return;
        }
        let now = now_ns();
        if first_bytes {
            self.clock.first_byte_ns = Some(now);
        }
        if end_of_stream {
            self.clock.done_ns = Some(now);
        }
    }
}

fn internal(what: &str) -> ApiError {
    log::error!("internal error: {what}");
    ApiError::new(
        500,
        ErrorType::Upstream,
        "internal_error",
        "The gateway failed to handle this request.",
    )
}

fn json_reply(value: &Value) -> Reply {
    Reply {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: serde_json::to_vec(value).unwrap_or_default(),
    }
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        413,
        ErrorType::InvalidRequest,
        "body_too_large",
        format!("Request body is larger than {limit} bytes."),
    )
}
