//! The life of one request, as a state machine the shell drives.
//!
//! Each method takes what the host showed in one callback and returns one
//! step for the shell to apply: headers to remove or set, a body, filter
//! state, or a local reply. Nothing here calls the host, so the whole
//! request path runs natively in tests.
//!
//! A request goes through `State`: its headers are checked (contract §4, up
//! to the size) → its body is read (parse, resolve, authorise, route,
//! translate) → upstream → the answer streamed, buffered, or replaced by a
//! fallback call's → done, and [`Exchange::on_log`] writes what it was.
//! Each state holds the data only it needs; what the log and the stats say
//! of the request is gathered in one `Record` beside it.

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
use crate::inbound::{Client, ClientApi, ClientStream, messages, responses};
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

/// The candidates not yet tried, and how many more may be.
struct Plan {
    candidates: std::vec::IntoIter<Candidate>,
    tries_left: usize,
}

impl Plan {
    /// The next candidate whose API can express `request`, translated for it,
    /// while tries remain; the first refusal is kept in `refusal`.
    /// Translation starts from the parsed original every time, so it is the
    /// same whichever attempt it is.
    fn next(
        &mut self,
        asked: &Asked,
        routing_field: &str,
        refusal: &mut Option<ApiError>,
    ) -> Option<(Rc<Provider>, String, UpstreamRequest)> {
        if self.tries_left == 0 {
            return None;
        }
        for candidate in self.candidates.by_ref() {
            let provider = candidate.provider;
            let model = &candidate.upstream_model;
            let built = (asked.client.native_request(&provider, model, routing_field))
                .unwrap_or_else(|| providers::build_request(&provider, &asked.request, model, routing_field));
            match built {
                Ok(upstream) => {
                    self.tries_left -= 1;
                    return Some((provider, candidate.upstream_model, upstream));
                }
                Err(e) => {
                    log::info!("provider {} skipped: {}", provider.id, e.message);
                    refusal.get_or_insert(e);
                }
            }
        }
        None
    }
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

/// A buffered upstream answer's head.
struct Held {
    status: u16,
    retry_after: Option<String>,
    /// Envoy's own failure (connect failure, reset, timeout), not a provider's answer.
    router_error: bool,
    event_stream: bool,
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
}

const HOP_HEADERS_TO_DROP: [&str; 3] = ["authorization", "accept-encoding", "content-length"];

/// On the API, the client's headers that carry a credential or pick a provider
/// account (contract §3): none is the provider's business. A browser's cookies
/// and proxy credentials are for the gateway's side, and the gateway's
/// credential goes with its own account: a developer's `OPENAI_ORG_ID`, which
/// the official SDKs send as `OpenAI-Organization`, would make OpenAI refuse it.
const ACCOUNT_HEADERS: [&str; 7] = [
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "openai-organization",
    "openai-project",
    "cookie",
    "proxy-authorization",
];

/// What every translated request sets, first to last: where it goes on the
/// provider, its body's type and length, then the provider's own headers
/// (its credential, its API version); and the body.
fn request_headers(provider: &Provider, upstream: UpstreamRequest) -> (Vec<Header>, Vec<u8>) {
    let mut set: Vec<Header> = vec![
        (":path".into(), upstream.path),
        (":authority".into(), provider.authority.clone()),
        ("content-type".into(), "application/json".into()),
        ("content-length".into(), upstream.body.len().to_string()),
    ];
    set.extend(upstream.headers);
    (set, upstream.body)
}

/// With router fallback, this request header (value `1`) selects the
/// route that retries across clusters; that route removes it again.
pub const ROUTED_HEADER: &str = "x-waygate-routed";

/// The largest non-streaming answer the filter holds. The shell keeps the
/// answer itself rather than in Envoy's buffer, whose limit would end an
/// oversize answer with Envoy's plain-text 500; past this one the client
/// gets the contract's 502 instead.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

impl Exchange {
    pub fn new(config: Rc<Config>) -> Exchange {
        Exchange {
            config,
            state: State::Start,
            record: Record::default(),
            api: ClientApi::Chat,
            streamed: false,
        }
    }

    /// Request headers, as lowercase name / raw value pairs (pseudo-headers
    /// included). `end_of_stream`: the request has no body.
    pub fn on_request_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        pairs: &[(K, V)],
        end_of_stream: bool,
    ) -> HeadersStep {
        let cfg = Rc::clone(&self.config);
        let header = |name: &str| header_in(pairs, name);
        let path = header(":path").unwrap_or_default();
        let path = path.split(|b| *b == b'?').next().unwrap_or_default();
        let sub = under_base(path, cfg.base_path.as_bytes());
        // On every path, a client never picks a cluster (contract §3). On the
        // API, no `x-envoy-*` header of the client's goes on either: Envoy's
        // router obeys `x-envoy-retry-on`, `x-envoy-max-retries` and the like
        // from any client its connection manager counts as internal (a mesh's
        // pods, often), which could make one request several billed provider
        // calls; the filter sets the ones it needs itself. Nor does one that
        // picks a provider account.
        let remove = names_where(pairs, |name, _| {
            name.starts_with("x-waygate-")
                || name == cfg.cluster_header
                || (sub.is_some() && (name.starts_with("x-envoy-") || ACCOUNT_HEADERS.contains(&name)))
        });
        let Some(sub) = sub else {
            self.state = State::PassThrough;
            return HeadersStep {
                remove,
                action: HeadersAction::Continue,
            };
        };
        if let Some(api) = ClientApi::from_path(sub) {
            self.api = api;
        }
        self.record.title = header("x-title").map(printable);
        self.record.referer = header("http-referer").map(printable);
        let action = match self.check_head(&cfg, sub, &header, end_of_stream) {
            Ok(Some(api)) => {
                let key_headers = key_headers(pairs, header("authorization"));
                let api_headers = match api {
                    ClientApi::Messages => (anthropic::CLIENT_HEADERS.iter())
                        .filter_map(|name| Some((name.to_string(), printable(header(name)?))))
                        .collect(),
                    _ => Vec::new(),
                };
                self.state = State::Reading {
                    api,
                    key_headers,
                    api_headers,
                };
                HeadersAction::ReadBody
            }
            Ok(None) => {
                let key = self.record.key.as_deref();
                let listed = match sub.strip_prefix(b"/models/") {
                    Some(id) => models::entry(&cfg, key, id),
                    None => Ok(models::listing(&cfg, key)),
                };
                match listed {
                    Ok(listed) => HeadersAction::Reply(self.reply(json_reply(&listed))),
                    Err(e) => HeadersAction::Reply(self.reply_error(&e)),
                }
            }
            Err(e) => HeadersAction::Reply(self.reply_error(&e)),
        };
        HeadersStep { remove, action }
    }

    /// Contract §4 checks that need only the headers, in order. `Ok(None)`:
    /// the models listing.
    fn check_head<'h>(
        &mut self,
        cfg: &Config,
        sub: &[u8],
        header: &dyn Fn(&str) -> Option<&'h [u8]>,
        end_of_stream: bool,
    ) -> Result<Option<ClientApi>, ApiError> {
        // Anthropic's clients send their key as `x-api-key`.
        let token = match header("authorization") {
            None if matches!(self.api, ClientApi::Messages | ClientApi::CountTokens)
                && let Some(key) = header("x-api-key") =>
            {
                key
            }
            authorization => auth::bearer_token(authorization)?,
        };
        self.record.key = Some(Rc::clone(auth::authenticate(&cfg.keys, token)?));

        let method = header(":method").unwrap_or_default();
        let (api, allowed) = match sub {
            _ if let Some(api) = ClientApi::from_path(sub) => (Some(api), "POST"),
            b"/models" => (None, "GET"),
            _ if sub.starts_with(b"/models/") => (None, "GET"),
            _ => {
                return Err(ApiError::new(
                    404,
                    ErrorType::InvalidRequest,
                    "unknown_endpoint",
                    format!("Unknown endpoint '{}'.", String::from_utf8_lossy(sub)),
                ));
            }
        };
        if method != allowed.as_bytes() {
            let mut e = ApiError::new(
                405,
                ErrorType::InvalidRequest,
                "method_not_allowed",
                format!("Method not allowed; use {allowed}."),
            );
            e.allow = Some(allowed);
            return Err(e);
        }
        let Some(api) = api else { return Ok(None) };

        if !is_json(header("content-type")) {
            return Err(ApiError::new(
                415,
                ErrorType::InvalidRequest,
                "unsupported_media_type",
                "Content-Type must be application/json.",
            ));
        }
        let declared = header("content-length")
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > cfg.max_request_bytes) {
            return Err(too_large(cfg.max_request_bytes));
        }
        if end_of_stream {
            let mut e = ApiError::bad_request("invalid_json", "body", "Request body is empty.");
            e.param = None;
            return Err(e);
        }
        Ok(Some(api))
    }

    /// A request body callback: `total` bytes are buffered so far, and
    /// `end_of_stream` says whether that is all of it.
    pub fn on_request_body_chunk(&mut self, total: usize, end_of_stream: bool) -> BodyStep {
        if !matches!(self.state, State::Reading { .. }) {
            return BodyStep::Pass;
        }
        if u64::try_from(total).unwrap_or(u64::MAX) > self.config.max_request_bytes {
            let e = too_large(self.config.max_request_bytes);
            return BodyStep::Reply(self.reply_error(&e));
        }
        if end_of_stream { BodyStep::Read } else { BodyStep::Wait }
    }

    /// The whole request body is here. `now_ms` is unix milliseconds.
    /// `store` holds what every worker shares: the per-key limit counters
    /// and the providers' health.
    pub fn on_request_body(&mut self, body: &[u8], now_ms: u64, store: &mut dyn SharedStore) -> Result<Forward, Reply> {
        let State::Reading {
            api,
            key_headers,
            api_headers,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(self.fail("request body in an unexpected phase"));
        };
        if api == ClientApi::CountTokens {
            return Err(match self.count_tokens(body) {
                Ok(count) => self.reply(json_reply(&count)),
                Err(e) => self.reply_error(&e),
            });
        }
        match self.route(api, &key_headers, api_headers, body, now_ms, store) {
            Ok((routed, forward)) => {
                self.state = State::Upstream(routed);
                Ok(forward)
            }
            Err(e) => Err(self.reply_error(&e)),
        }
    }

    /// `POST /messages/count_tokens`, answered here: the request is checked
    /// as a Messages request, its model resolved and allowed, and its tokens
    /// estimated (no provider is asked; docs/contract.md).
    fn count_tokens(&mut self, body: &[u8]) -> Result<Value, ApiError> {
        let cfg = Rc::clone(&self.config);
        if u64::try_from(body.len()).unwrap_or(u64::MAX) > cfg.max_request_bytes {
            return Err(too_large(cfg.max_request_bytes));
        }
        let (chat, count) = messages::count_request(body, &cfg.routing_field)?;
        let request = request::parse(Operation::Chat, &chat)?;
        self.record.model = Some(request.model.clone());
        routing::resolve(&cfg, &request.model)?;
        if self
            .record
            .key
            .as_ref()
            .is_some_and(|k| !auth::may_use(k, &request.model))
        {
            return Err(model_not_allowed(&request.model));
        }
        Ok(count)
    }

    fn route(
        &mut self,
        api: ClientApi,
        key_headers: &[String],
        api_headers: Vec<Header>,
        body: &[u8],
        now_ms: u64,
        store: &mut dyn SharedStore,
    ) -> Result<(Routed, Forward), ApiError> {
        let cfg = Rc::clone(&self.config);
        let now = now_ms / 1000;
        if u64::try_from(body.len()).unwrap_or(u64::MAX) > cfg.max_request_bytes {
            return Err(too_large(cfg.max_request_bytes));
        }
        // Another API's request is read as the internal form's.
        let (request, client) = match api {
            ClientApi::Responses => {
                let (chat, echo) = responses::to_chat(body, &cfg.routing_field)?;
                (
                    request::parse(api.operation(), &chat)?,
                    Client::Responses(Box::new(echo)),
                )
            }
            // Answered before routing (on_request_body); read as Messages all the same.
            ClientApi::Messages | ClientApi::CountTokens => {
                let (chat, mut asked) = messages::to_chat(body, &cfg.routing_field)?;
                asked.headers = api_headers;
                (
                    request::parse(api.operation(), &chat)?,
                    Client::Messages(Box::new(asked)),
                )
            }
            ClientApi::Chat | ClientApi::Completions => (request::parse(api.operation(), body)?, Client::Internal),
        };
        // Logged from here on: a refused model (404, 403) is worth an operator's eye.
        self.record.model = Some(request.model.clone());
        let resolved = routing::resolve(&cfg, &request.model)?;
        let key = self.record.key.clone();
        if key.as_ref().is_some_and(|k| !auth::may_use(k, &request.model)) {
            return Err(model_not_allowed(&request.model));
        }
        if let Some(key) = key.filter(|_| cfg.limits == Limits::Local) {
            self.record.standing = limits::admit(store, &key, now)?;
        }
        let directive = routing::parse_directive(&cfg, request.member(&cfg.routing_field)?.as_ref())?;
        // Named in the 503 if nothing is left: the usual cause is an unset key.
        let mut keyless: Vec<String> = Vec::new();
        for c in resolved.candidates.iter().filter(|c| c.provider.credential.is_none()) {
            if !keyless.contains(&c.provider.id) {
                keyless.push(c.provider.id.clone());
            }
        }
        let defaults = routing::spread(
            resolved.candidates,
            resolved.strategy,
            &mut ids::random_u64,
            &mut |key| inflight::count(store, key),
        );
        // Candidates with an open circuit go last (contract "Health").
        let (candidates, ticket) = health::arrange(store, &cfg.health, routing::plan(defaults, &directive), now_ms);
        self.record.health = ticket;
        if let Some(key) = candidates.first().and_then(|c| c.inflight_key.clone()) {
            inflight::add(store, &key, true);
            self.record.inflight = Some(key);
        }
        let mut plan = Plan {
            candidates: candidates.into_iter(),
            tries_left: routing::max_tries(&cfg, &directive),
        };
        let stamp = Stamp {
            op: api.operation(),
            id: new_id(api.id_prefix()),
            model: request.model.clone(),
            created: now,
        };
        let asked = Asked { request, stamp, client };
        let mut refusal = None;
        let mut properties: Vec<(String, String)> = Vec::new();
        if let Some(key) = &self.record.key {
            // Before the request goes on: the rate limit filter after us reads it.
            properties.push((KEY_ID_PROPERTY.into(), key.id.clone()));
        }

        if cfg.fallback == Fallback::Router {
            let mut prepared: Vec<Prepared> = Vec::new();
            while let Some((provider, model, upstream)) = plan.next(&asked, &cfg.routing_field, &mut refusal) {
                let (set, body) = request_headers(&provider, upstream);
                prepared.push(Prepared {
                    provider,
                    model,
                    set,
                    body,
                });
            }
            let Some((first, model)) = prepared.first().map(|p| (Rc::clone(&p.provider), p.model.clone())) else {
                return Err(refusal.unwrap_or_else(|| routing::no_provider(&asked.request.model, &keyless)));
            };
            let (forward, attempts) = route_attempts(prepared, key_headers, properties);
            let routed = Routed {
                asked,
                provider: first,
                model,
                next: Next::Router(attempts),
            };
            return Ok((routed, forward));
        }
        let Some((provider, model, upstream)) = plan.next(&asked, &cfg.routing_field, &mut refusal) else {
            return Err(refusal.unwrap_or_else(|| routing::no_provider(&asked.request.model, &keyless)));
        };
        let forward = forward(&cfg, &provider, upstream, key_headers, properties);
        let routed = Routed {
            asked,
            provider,
            model,
            next: Next::Call(plan),
        };
        Ok((routed, forward))
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

    /// Response headers arrived, as lowercase name / raw value pairs.
    /// `code_details` reads Envoy's `response.code_details`, which is asked
    /// for only when the status is not 2xx (a host call per request
    /// otherwise): `via_upstream` for a real upstream answer; router-made
    /// replies (connect failure, timeout) say otherwise, and so do the
    /// replies of filters after ours (Envoy's rate limit filter).
    pub fn on_response_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        pairs: &[(K, V)],
        code_details: impl FnOnce() -> Option<Vec<u8>>,
        end_of_stream: bool,
    ) -> ResponseStep {
        let mut routed = match std::mem::replace(&mut self.state, State::Done) {
            State::Upstream(routed) => routed,
            // Only the awaited answer is ours (not our own reply passing back).
            other => {
                self.state = other;
                return self.response_step(pairs, ResponseAction::Continue);
            }
        };
        let head = ResponseHead::read(pairs);
        let details = if (200..300).contains(&head.status) {
            None
        } else {
            code_details()
        };
        let details = details.as_deref().and_then(|d| std::str::from_utf8(d).ok());
        let ratelimit_reset = header_in(pairs, "x-ratelimit-reset");
        if let Some(e) = details.and_then(|d| limits::envoy_refusal(d, ratelimit_reset)) {
            // Envoy's rate limit filter refused before any provider was tried.
            let answer = self.rewrite_error(&e, false);
            return self.response_step(pairs, ResponseAction::Answer(answer));
        }
        let router_error = details.is_some_and(|d| d != "via_upstream");
        match &routed.next {
            Next::Router(attempts) => {
                // The router has made every attempt already; this is the last one's answer.
                let outcomes = attempts.borrow().outcomes().to_vec();
                match outcomes.last() {
                    Some(last) => {
                        routed.provider = Rc::clone(&last.provider);
                        routed.model.clone_from(&last.model);
                    }
                    None => self.record_attempt(&routed, head.status, true, None),
                }
                self.record.attempts.extend(outcomes);
            }
            Next::Call(_) => {
                let retry_after = health::retry_after_ms(head.retry_after.as_deref());
                self.record_attempt(&routed, head.status, router_error, retry_after);
                if retryable(head.status, router_error)
                    && let Some(call) = self.next_call(&mut routed)
                {
                    self.state = State::Calling(routed);
                    return self.response_step(pairs, ResponseAction::Fallback(call));
                }
            }
        }
        let ok = (200..300).contains(&head.status) && !router_error;
        if ok && routed.asked.request.stream && head.event_stream && !end_of_stream {
            let rewriter = new_rewriter(&routed.asked, &routed.provider);
            self.state = State::Streaming(Box::new(rewriter));
            self.record.status = head.status;
            let mut set = vec![("content-type".to_string(), "text/event-stream".to_string())];
            set.extend(self.attempt_headers(true));
            let action = ResponseAction::Stream {
                remove: vec!["content-length".into()],
                set,
            };
            return self.response_step(pairs, action);
        }
        let held = Held {
            status: head.status,
            retry_after: head.retry_after,
            router_error,
            event_stream: head.event_stream,
        };
        self.state = State::Buffering(routed, held);
        if end_of_stream {
            let answer = self.on_buffered_body(&[]);
            return self.response_step(pairs, ResponseAction::Answer(answer));
        }
        self.response_step(pairs, ResponseAction::Buffer)
    }

    /// `action`, with the upstream headers it lets through scrubbed, and
    /// for a limited key without the provider's own `x-ratelimit-*`: they
    /// describe the operator's account with the provider, and their names
    /// are the ones the key's limits are told in (contract "Limits"), which
    /// would mix the two.
    fn response_step<K: AsRef<[u8]>, V: AsRef<[u8]>>(&self, pairs: &[(K, V)], action: ResponseAction) -> ResponseStep {
        if !matches!(action, ResponseAction::Stream { .. } | ResponseAction::Buffer) {
            return ResponseStep {
                scrub: Vec::new(),
                remove: Vec::new(),
                action,
            };
        }
        let remove = match self.record.standing {
            Some(_) => names_where(pairs, |name, _| name.starts_with("x-ratelimit-")),
            None => Vec::new(),
        };
        // A provider may echo its credential in a header, too.
        let scrub = self.scrub_headers(pairs);
        ResponseStep { scrub, remove, action }
    }

    /// The next fallback call, if a candidate is left.
    fn next_call(&mut self, routed: &mut Routed) -> Option<Call> {
        let Next::Call(plan) = &mut routed.next else {
            return None;
        };
        let (provider, model, upstream) = plan.next(&routed.asked, &self.config.routing_field, &mut None)?;
        let mut headers: Vec<Header> = vec![
            (":method".into(), "POST".into()),
            (":path".into(), upstream.path),
            (":authority".into(), provider.authority.clone()),
            ("content-type".into(), "application/json".into()),
        ];
        headers.extend(upstream.headers);
        let call = Call {
            cluster: provider.cluster.clone(),
            headers,
            body: upstream.body,
            timeout_ms: provider.timeout_ms,
        };
        routed.provider = provider;
        routed.model = model;
        Some(call)
    }

    /// A fallback call's answer, as lowercase name / raw value pairs and its
    /// body; no `:status` when the call was reset (no headers at all).
    pub fn on_call_response<K: AsRef<[u8]>, V: AsRef<[u8]>>(&mut self, pairs: &[(K, V)], body: &[u8]) -> CallStep {
        let State::Calling(mut routed) = std::mem::replace(&mut self.state, State::Done) else {
            return CallStep::Reply(self.rewrite_error(&internal("call answer in an unexpected phase"), false));
        };
        let head = ResponseHead::read(pairs);
        // An http_call reports Envoy's own failures as ordinary responses;
        // only the router's text tells a connect failure or timeout apart.
        let router_error = head.status == 0 || is_envoy_local_reply(head.status, body);
        let retry_after = health::retry_after_ms(head.retry_after.as_deref());
        self.record_attempt(&routed, head.status, router_error, retry_after);
        if retryable(head.status, router_error)
            && let Some(call) = self.next_call(&mut routed)
        {
            self.state = State::Calling(routed);
            return CallStep::Dispatch(call);
        }
        let held = Held {
            status: if head.status == 0 { 503 } else { head.status },
            retry_after: head.retry_after,
            router_error,
            event_stream: head.event_stream,
        };
        self.state = State::Buffering(routed, held);
        CallStep::Reply(self.on_buffered_body(body))
    }

    /// The host refused to dispatch a fallback call (unknown cluster): that
    /// candidate counts as an attempt that failed to connect.
    pub fn on_call_refused(&mut self) -> CallStep {
        self.on_call_response::<&[u8], &[u8]>(&[], &[])
    }

    /// A fallback call's answer is over [`MAX_ANSWER_BYTES`] (its body
    /// unread); `status` is its status.
    pub fn on_call_too_large(&mut self, status: u16) -> Rewrite {
        let State::Calling(routed) = std::mem::replace(&mut self.state, State::Done) else {
            return self.rewrite_error(&internal("call answer in an unexpected phase"), false);
        };
        self.record_attempt(&routed, status, false, None);
        self.rewrite_error(&self.answer_too_large(), false)
    }

    /// The buffered answer grew past [`MAX_ANSWER_BYTES`]: the final answer
    /// is a 502, and the rest of the upstream body is dropped.
    pub fn on_buffered_too_large(&mut self) -> Rewrite {
        let e = match std::mem::replace(&mut self.state, State::Done) {
            State::Buffering(..) => self.answer_too_large(),
            _ => internal("response body in an unexpected phase"),
        };
        self.rewrite_error(&e, false)
    }

    fn answer_too_large(&self) -> ApiError {
        ApiError::new(
            502,
            ErrorType::Upstream,
            "invalid_upstream_response",
            format!(
                "The provider's answer was larger than {MAX_ANSWER_BYTES} bytes ({}).",
                self.record.attempt_summary()
            ),
        )
    }

    /// Upstream response headers whose values carry the credential of a
    /// provider this request was sent to, with it scrubbed: the name and the
    /// value to set in place of every value of that name (joined with `, `).
    fn scrub_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(&self, pairs: &[(K, V)]) -> Vec<Header> {
        let sent = self.sent_credentials();
        let mut scrubbed: Vec<Header> = Vec::new();
        for (name, value) in pairs {
            if !sent.iter().any(|s| s.occurs_in(value.as_ref())) {
                continue;
            }
            let Ok(name) = std::str::from_utf8(name.as_ref()) else {
                continue;
            };
            if name.starts_with(':') || scrubbed.iter().any(|(n, _)| n == name) {
                continue;
            }
            let values: Vec<String> = pairs
                .iter()
                .filter(|(n, _)| n.as_ref() == name.as_bytes())
                .map(|(_, v)| {
                    let mut v = v.as_ref().to_vec();
                    self.redact(&mut v);
                    String::from_utf8_lossy(&v).into_owned()
                })
                .collect();
            scrubbed.push((name.to_string(), values.join(", ")));
        }
        scrubbed
    }

    fn record_attempt(&mut self, routed: &Routed, status: u16, router_error: bool, retry_after_ms: Option<u64>) {
        self.record.attempts.push(Tried {
            provider: Rc::clone(&routed.provider),
            model: routed.model.clone(),
            outcome: if router_error {
                Outcome::Failed
            } else {
                Outcome::Status(status)
            },
            retry_after_ms,
        });
    }

    /// A chunk of a live stream; the bytes that replace it go to `out`.
    pub fn on_stream_body(&mut self, chunk: &[u8], end_of_stream: bool, out: &mut Vec<u8>) {
        let State::Streaming(rewriter) = &mut self.state else {
            return;
        };
        // The rewriter scrubs the provider's credential itself (new_rewriter).
        self.streamed |= !chunk.is_empty();
        rewriter.push(chunk, out);
        if end_of_stream {
            rewriter.finish(out);
        }
        self.record.usage = rewriter.usage();
        if end_of_stream {
            // An error event is an error answer: counted by its code.
            self.record.error_code = rewriter.error_code().map(str::to_string);
            self.state = State::Done;
        }
    }

    /// Envoy ended the answer itself, past the filter: the provider's
    /// connection was reset, or its time ran out, after its headers had come
    /// (`code_details` says which). Envoy then sends a held answer's 502 or
    /// 504 straight to the client (the shipped listeners' local reply mapper
    /// gives it the contract's body) and resets a live stream; no callback
    /// tells the filter, so the record learns it here, at the log: the last
    /// attempt failed, and the request ended as the client saw it.
    pub fn on_ended_by_envoy(&mut self, code_details: &[u8]) {
        let timeout = code_details == b"response_timeout";
        if !timeout && !code_details.starts_with(b"upstream_reset_after_response_started") {
            return;
        }
        let held = match std::mem::replace(&mut self.state, State::Done) {
            State::Buffering(..) => true,
            State::Streaming(rewriter) => {
                self.record.usage = rewriter.usage();
                false
            }
            other => {
                self.state = other;
                return;
            }
        };
        // A stream that ends before its first byte failed as a held answer does.
        let cut_after_first_byte = !held && self.streamed;
        if let Some(last) = self.record.attempts.last_mut() {
            last.outcome = if cut_after_first_byte {
                Outcome::Cut
            } else {
                Outcome::Failed
            };
        }
        if held {
            let e = if timeout {
                self.failed_timeout()
            } else {
                self.failed_upstream()
            };
            self.record.status = e.status;
            self.record.error_code = Some(e.code);
        } else {
            // Its status went out with its headers; the stream was cut.
            self.record.error_code = Some(providers::openai::STREAM_INTERRUPTED.into());
        }
    }

    /// The whole buffered response body is here: the final answer.
    pub fn on_buffered_body(&mut self, body: &[u8]) -> Rewrite {
        let State::Buffering(routed, held) = std::mem::replace(&mut self.state, State::Done) else {
            return self.rewrite_error(&internal("response body in an unexpected phase"), false);
        };
        let provider = &routed.provider;
        if held.router_error {
            let e = if held.status == 504 {
                self.failed_timeout()
            } else {
                self.failed_upstream()
            };
            return self.rewrite_error(&e, false);
        }
        if (200..300).contains(&held.status) {
            return match self.translate_success(&routed, body, held.event_stream) {
                Ok(rewrite) => rewrite,
                Err(why) => {
                    // `why` may quote the provider's body (serde names the value it refused).
                    let mut why = why.into_bytes();
                    self.redact(&mut why);
                    let why = String::from_utf8_lossy(&why);
                    log::warn!("provider {} sent an invalid answer: {why}", provider.id);
                    let e = ApiError::new(
                        502,
                        ErrorType::Upstream,
                        "invalid_upstream_response",
                        format!(
                            "The provider's answer was not valid ({}).",
                            self.record.attempt_summary()
                        ),
                    );
                    self.rewrite_error(&e, false)
                }
            };
        }
        let details = providers::error_details(provider.api, body);
        let e = match held.status {
            400 | 413 | 422 => {
                let status = held.status;
                let mut e = ApiError::new(
                    status,
                    ErrorType::InvalidRequest,
                    details.code.as_deref().unwrap_or("provider_error"),
                    details
                        .message
                        .unwrap_or_else(|| format!("The provider refused the request ({status}).")),
                );
                e.provider = Some(provider.id.clone());
                return self.rewrite_error(&e, true);
            }
            429 => {
                let mut e = ApiError::new(
                    429,
                    ErrorType::RateLimit,
                    "upstream_rate_limited",
                    format!(
                        "Every provider tried is rate limited ({}).",
                        self.record.attempt_summary()
                    ),
                );
                e.retry_after = held
                    .retry_after
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
                e
            }
            408 => self.failed_timeout(),
            _ => self.failed_upstream(),
        };
        self.rewrite_error(&e, false)
    }

    fn translate_success(&mut self, routed: &Routed, body: &[u8], event_stream: bool) -> Result<Rewrite, String> {
        let Routed { asked, provider, .. } = routed;
        let (content_type, mut out) = if asked.request.stream {
            if !event_stream {
                return Err("a stream was asked for but the answer is not text/event-stream".into());
            }
            let mut rewriter = new_rewriter(asked, provider);
            let mut out = Vec::new();
            rewriter.push(body, &mut out);
            rewriter.finish(&mut out);
            self.record.usage = rewriter.usage();
            ("text/event-stream", out)
        } else if asked.client.is_native(provider) {
            // The client's own API: passed as it came, but for the model's name.
            let (out, usage) = asked.client.native_answer(&asked.stamp, body)?;
            self.record.usage = Some(usage);
            ("application/json", out)
        } else if provider.api == Api::Openai && asked.stamp.op == Operation::Chat {
            // Already a chat.completion: a few members change, the rest is copied.
            let (out, usage) = providers::openai::finish_chat(&asked.stamp, body)?;
            self.record.usage = Some(usage);
            ("application/json", out)
        } else {
            let (answer, usage) = providers::translate_answer(provider.api, &asked.request, body)?;
            self.record.usage = Some(usage);
            let out = serde_json::to_vec(&answer::finish(&asked.stamp, answer, usage)).map_err(|e| e.to_string())?;
            ("application/json", out)
        };
        if content_type == "application/json" && !asked.client.is_native(provider) {
            out = asked.client.answer(&asked.stamp, out)?;
        }
        self.redact(&mut out);
        self.record.status = 200;
        let mut set = vec![
            (":status".to_string(), "200".to_string()),
            ("content-type".to_string(), content_type.to_string()),
            ("content-length".to_string(), out.len().to_string()),
        ];
        set.extend(self.attempt_headers(true));
        Ok(Rewrite {
            status: 200,
            remove: Vec::new(),
            set,
            body: out,
        })
    }

    fn failed_upstream(&self) -> ApiError {
        ApiError::new(
            502,
            ErrorType::Upstream,
            "upstream_error",
            format!("Every provider tried failed ({}).", self.record.attempt_summary()),
        )
    }

    fn failed_timeout(&self) -> ApiError {
        ApiError::new(
            504,
            ErrorType::Upstream,
            "upstream_timeout",
            format!(
                "The provider did not answer in time ({}).",
                self.record.attempt_summary()
            ),
        )
    }

    /// The final answer `e`; `served`: it is the serving provider's own error.
    fn rewrite_error(&mut self, e: &ApiError, served: bool) -> Rewrite {
        self.record.status = e.status;
        self.record.error_code = Some(e.code.clone());
        // A provider's own message (400/413/422) may echo the request.
        let mut body = self.api.error_body(e);
        self.redact(&mut body);
        let mut set = vec![(":status".to_string(), e.status.to_string())];
        set.extend(e.headers());
        set.push(("content-length".into(), body.len().to_string()));
        set.extend(self.attempt_headers(served));
        // Upstream headers that would describe the old body, or leak its origin.
        let remove = ["content-encoding", "transfer-encoding", "retry-after"]
            .map(String::from)
            .to_vec();
        Rewrite {
            status: e.status,
            remove,
            set,
            body,
        }
    }

    /// `x-waygate-attempts`, `x-waygate-provider` when a provider served,
    /// and the key's `x-ratelimit-*` when it is limited.
    fn attempt_headers(&self, served: bool) -> Vec<Header> {
        let mut headers = self.record.standing.map(|s| s.headers()).unwrap_or_default();
        if served && let Some(p) = self.served_by() {
            headers.push(("x-waygate-provider".to_string(), p.to_string()));
        }
        if !self.record.attempts.is_empty() {
            headers.push(("x-waygate-attempts".to_string(), self.record.attempt_list()));
        }
        headers
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
    /// `now_ms` is unix milliseconds.
    pub fn on_log(
        &mut self,
        store: &mut dyn SharedStore,
        now_ms: u64,
        timing: metrics::Timing,
        duration_ms: u64,
        open: &mut metrics::OpenLabels,
    ) -> Option<Log> {
        if matches!(self.state, State::PassThrough | State::Start) {
            return None;
        }
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
}

/// The request sent to `provider` (`"http_call"` fallback): its path,
/// authority, credential and body, the cluster it goes to and its time
/// budget, and the client's key headers removed.
fn forward(
    cfg: &Config,
    provider: &Provider,
    upstream: UpstreamRequest,
    key_headers: &[String],
    properties: Vec<(String, String)>,
) -> Forward {
    let (mut set, body) = request_headers(provider, upstream);
    set.push((cfg.cluster_header.clone(), provider.cluster.clone()));
    // The provider's time budget for this attempt: the route itself has no
    // timeout (it would cut long streams), and Envoy's router honours this
    // header as the attempt's timeout.
    set.push(("x-envoy-upstream-rq-timeout-ms".into(), provider.timeout_ms.to_string()));
    // Setting a header replaces it: removing one that is set anyway
    // (content-length, and authorization for OpenAI's API) is a wasted host call.
    let mut remove: Vec<String> = Vec::new();
    for name in HOP_HEADERS_TO_DROP
        .into_iter()
        .chain(key_headers.iter().map(String::as_str))
    {
        if !set.iter().any(|(k, _)| k == name) && !remove.iter().any(|r| r == name) {
            remove.push(name.to_string());
        }
    }
    Forward {
        body: Some(body),
        remove,
        set,
        properties,
        routed: None,
    }
}

/// Router fallback: the downstream request that carries the prepared
/// attempts (in order, bounded by the tries) to the router: the routed
/// route's marker, the retries allowed, and the client's key removed; each
/// attempt's cluster published for the route's matcher. The body is left as
/// the client sent it; each attempt replaces it.
fn route_attempts(
    prepared: Vec<Prepared>,
    key_headers: &[String],
    mut properties: Vec<(String, String)>,
) -> (Forward, Rc<RefCell<Attempts>>) {
    // Envoy's per-try timeout is one value for every attempt: the shortest
    // budget of the candidates, so no provider runs past its own.
    let per_try_ms = prepared.iter().map(|p| p.provider.timeout_ms).min().unwrap_or(0);
    let set: Vec<Header> = vec![
        (ROUTED_HEADER.into(), "1".into()),
        (
            "x-envoy-max-retries".into(),
            prepared.len().saturating_sub(1).to_string(),
        ),
        ("x-envoy-upstream-rq-per-try-timeout-ms".into(), per_try_ms.to_string()),
    ];
    let mut cleared: Vec<String> = HOP_HEADERS_TO_DROP
        .iter()
        .filter(|h| **h != "content-length")
        .map(|h| (*h).to_string())
        .collect();
    cleared.extend(key_headers.iter().cloned());
    let attempts = Attempts::new(prepared, &cleared);
    for (i, cluster) in attempts.clusters().enumerate() {
        properties.push((format!("{}{}", attempts::SLOT_PROPERTY, i + 1), cluster.to_string()));
    }
    let attempts = Rc::new(RefCell::new(attempts));
    let forward = Forward {
        body: None,
        remove: cleared,
        set,
        properties,
        routed: Some(Rc::clone(&attempts)),
    };
    (forward, attempts)
}

/// The serving provider's stream translated for the request asked: into
/// the internal chat stream, then into the client's API.
fn new_rewriter(asked: &Asked, provider: &Provider) -> ClientStream {
    if asked.client.is_native(provider) {
        return asked.client.native_stream(provider);
    }
    let translator = providers::stream_translator(provider.api, &asked.request);
    let rewriter = StreamRewriter::new(translator, asked.stamp.clone(), asked.request.include_usage);
    // Deltas may split the credential, which the byte-level redaction of
    // each output cannot see: the rewriter scrubs the text itself.
    let rewriter = match provider.credential.as_ref().filter(|c| c.worth_scrubbing()) {
        Some(secret) => rewriter.redacting(secret),
        None => rewriter,
    };
    asked.client.stream(&asked.stamp, rewriter)
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

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        413,
        ErrorType::InvalidRequest,
        "body_too_large",
        format!("Request body is larger than {limit} bytes."),
    )
}

/// Contract §5: what makes a candidate be abandoned for the next one.
fn retryable(status: u16, router_error: bool) -> bool {
    router_error || matches!(status, 401 | 403 | 404 | 408 | 409 | 429) || (500..=599).contains(&status)
}

/// A 200 JSON answer of the filter's own (the models listing).
fn model_not_allowed(model: &str) -> ApiError {
    ApiError::new(
        403,
        ErrorType::Permission,
        "model_not_allowed",
        format!("This API key may not use the model '{model}'."),
    )
    .with_param("model")
}

fn json_reply(value: &Value) -> Reply {
    Reply {
        status: 200,
        headers: vec![("content-type".into(), "application/json".into())],
        body: serde_json::to_vec(value).unwrap_or_default(),
    }
}

/// Envoy's own replies to an `http_call` (connect failure, reset, timeout),
/// told apart from a provider's answer with the same status by their text.
fn is_envoy_local_reply(status: u16, body: &[u8]) -> bool {
    match status {
        503 => body.starts_with(b"upstream connect error") || body.starts_with(b"no healthy upstream"),
        504 => body == b"upstream request timeout",
        _ => false,
    }
}

/// The names of the headers, other than `authorization`, whose value holds
/// the client's bearer token.
fn key_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)], authorization: Option<&[u8]>) -> Vec<String> {
    let Ok(token) = auth::bearer_token(authorization) else {
        return Vec::new();
    };
    if token.len() < redact::MIN_LEN {
        return Vec::new();
    }
    let token = Finder::new(token);
    names_where(pairs, |name, value| {
        name != "authorization" && token.find(value).is_some()
    })
}

/// The part of `path` after `base`, when `path` is `base` or below it.
fn under_base<'p>(path: &'p [u8], base: &[u8]) -> Option<&'p [u8]> {
    let rest = path.strip_prefix(base)?;
    (rest.is_empty() || rest.first() == Some(&b'/')).then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Keys;
    use crate::limits::tests::MemoryStore;
    use crate::record::TOTAL_TOKENS_PROPERTY;
    use serde_json::json;
    use sha2::{Digest, Sha256};

    const SECRET: &str = "sk-oa-secret-0123456789";
    const ANTHROPIC_SECRET: &str = "sk-an-secret-9876543210";
    const CLIENT_KEY: &str = "wg-client-key";

    fn config() -> Rc<Config> {
        let digest: String = Sha256::digest(CLIENT_KEY.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let json = format!(
            r#"{{"keys":[{{"id":"dev","sha256":"{digest}"}}],
              "providers":[
                {{"id":"oa","api":"openai","cluster":"c_oa","authority":"oa.local","api_key":"{SECRET}"}},
                {{"id":"an","api":"anthropic","cluster":"c_an","authority":"an.local","api_key":"{ANTHROPIC_SECRET}"}}],
              "models":[{{"id":"chain/x","endpoints":[{{"provider":"oa","model":"a"}},{{"provider":"an","model":"b"}}]}}]}}"#
        );
        Rc::new(Config::parse(json.as_bytes(), &|_| None).unwrap())
    }

    /// A chat request's headers with the client's key, plus `extra`, as the shell hands them over.
    fn request_headers(extra: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let auth = format!("Bearer {CLIENT_KEY}");
        [
            (":method", "POST"),
            (":path", "/api/v1/chat/completions"),
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
    }

    /// An exchange whose request went upstream to `model`'s first provider.
    fn forwarded(model: &str, stream: bool) -> Exchange {
        let mut ex = Exchange::new(config());
        let pairs = request_headers(&[]);
        assert_eq!(ex.on_request_headers(&pairs, false).action, HeadersAction::ReadBody);
        let body = json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
        let forward = ex
            .on_request_body(
                body.to_string().as_bytes(),
                1_700_000_000_000,
                &mut MemoryStore::default(),
            )
            .unwrap();
        assert!(replaced_or_removed(&forward, "authorization"), "{forward:?}");
        ex
    }

    /// Whether the client's `name` header cannot reach the provider: removed,
    /// or set (which replaces it) to the provider's own value.
    fn replaced_or_removed(forward: &Forward, name: &str) -> bool {
        forward.remove.iter().any(|r| r == name) || forward.set.iter().any(|(k, _)| k == name)
    }

    /// An upstream response's headers, as the shell hands them over.
    fn head(status: u16, content_type: &str) -> Vec<(String, String)> {
        vec![
            (":status".into(), status.to_string()),
            ("content-type".into(), content_type.into()),
        ]
    }

    /// Envoy's `response.code_details` for a provider's own answer.
    fn via_upstream() -> Option<Vec<u8>> {
        Some(b"via_upstream".to_vec())
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// What `ex` logs: its access line and stats.
    fn logged(ex: &mut Exchange) -> Log {
        let log = ex.on_log(
            &mut MemoryStore::default(),
            1,
            metrics::Timing::default(),
            2,
            &mut metrics::OpenLabels::default(),
        );
        log.unwrap()
    }

    #[test]
    fn an_answer_envoy_ended_past_the_filter_is_logged_as_it_ended() {
        for (details, ended) in [
            (
                &b"upstream_reset_after_response_started{remote_reset}"[..],
                " attempts=oa:error status=502 ",
            ),
            (b"response_timeout", " attempts=oa:error status=504 "),
        ] {
            let mut ex = forwarded("oa/x", false);
            ex.on_response_headers(&head(200, "application/json"), via_upstream, false);
            // The client gone is no failure of the provider's: the record stays.
            ex.on_ended_by_envoy(b"downstream_remote_disconnect");
            assert_eq!(ex.stage(), Stage::Buffering);
            ex.on_ended_by_envoy(details);
            let line = logged(&mut ex).line;
            assert!(line.contains(ended), "{line}");
        }
        // A stream: its 200 went out; the attempt failed, counted as interrupted.
        let mut ex = forwarded("oa/x", true);
        ex.on_response_headers(&head(200, "text/event-stream"), via_upstream, false);
        ex.on_ended_by_envoy(b"upstream_reset_after_response_started{connection_termination}");
        assert_eq!(ex.record.error_code.as_deref(), Some("stream_interrupted"));
        let line = logged(&mut ex).line;
        assert!(line.contains(" attempts=oa:error status=200 "), "{line}");
    }

    #[test]
    fn a_provider_echoing_its_credential_in_an_answer_is_redacted() {
        let mut ex = forwarded("oa/echo", false);
        assert_eq!(
            ex.on_response_headers(&head(200, "application/json"), via_upstream, false)
                .action,
            ResponseAction::Buffer
        );
        let echoed = json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": format!("{{\"authorization\":\"Bearer {SECRET}\"}}")}}]});
        let rewrite = ex.on_buffered_body(echoed.to_string().as_bytes());
        assert_eq!(rewrite.status, 200);
        let body = text(&rewrite.body);
        assert!(!body.contains(SECRET) && body.contains("Bearer [redacted]"), "{body}");
        let length = rewrite.set.iter().find(|(k, _)| k == "content-length").unwrap();
        assert_eq!(length.1, rewrite.body.len().to_string());
    }

    #[test]
    fn a_provider_echoing_its_credential_in_a_stream_is_redacted() {
        let mut ex = forwarded("oa/echo", true);
        let action = ex
            .on_response_headers(&head(200, "text/event-stream"), via_upstream, false)
            .action;
        assert!(matches!(action, ResponseAction::Stream { .. }));
        let event = json!({"choices": [{"index": 0, "delta": {"content": SECRET}}]});
        let mut out = Vec::new();
        ex.on_stream_body(format!("data: {event}\n\n").as_bytes(), false, &mut out);
        let error = json!({"error": {"message": format!("bad key {SECRET}")}});
        ex.on_stream_body(format!("data: {error}\n\n").as_bytes(), true, &mut out);
        let out = text(&out);
        assert!(!out.contains(SECRET), "{out}");
        assert_eq!(out.matches("[redacted]").count(), 2, "{out}");
    }

    #[test]
    fn a_provider_error_message_echoing_the_credential_is_redacted() {
        let mut ex = forwarded("oa/x", false);
        assert_eq!(
            ex.on_response_headers(&head(400, "application/json"), via_upstream, false)
                .action,
            ResponseAction::Buffer
        );
        let error =
            json!({"error": {"message": format!("Incorrect API key provided: {SECRET}."), "code": "invalid_api_key"}});
        let rewrite = ex.on_buffered_body(error.to_string().as_bytes());
        assert_eq!(rewrite.status, 400);
        let v: Value = serde_json::from_slice(&rewrite.body).unwrap();
        assert_eq!(v["error"]["message"], "Incorrect API key provided: [redacted].");
    }

    #[test]
    fn a_fallback_answer_is_redacted_for_every_provider_tried() {
        let mut ex = forwarded("chain/x", false);
        let action = ex
            .on_response_headers(&head(503, "application/json"), via_upstream, false)
            .action;
        let ResponseAction::Fallback(call) = action else {
            panic!("expected a fallback: {action:?}")
        };
        assert_eq!(call.cluster, "c_an");
        assert!(call.headers.iter().all(|(_, v)| !v.contains(CLIENT_KEY)));
        let error = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": format!("keys {ANTHROPIC_SECRET} and {SECRET}")}});
        let CallStep::Reply(rewrite) =
            ex.on_call_response(&head(400, "application/json"), error.to_string().as_bytes())
        else {
            panic!("expected the final answer")
        };
        let body = text(&rewrite.body);
        assert!(!body.contains(SECRET) && !body.contains(ANTHROPIC_SECRET), "{body}");
    }

    #[test]
    fn reserved_headers_go_on_every_path_and_the_clients_x_envoy_and_account_ones_on_the_api() {
        let extra = [
            ("x-waygate-cluster", "ghost"),
            ("x-envoy-max-retries", "3"),
            ("x-envoy-retry-on", "5xx"),
            ("x-envoyish", "kept"),
            ("openai-organization", "org-developers-own"),
            ("openai-project", "proj_developers_own"),
            ("x-api-key", "sk-ant-developers-own"),
            ("openai-beta", "assistants=v2"),
            ("cookie", "session=gateway-site-session"),
        ];
        let step = Exchange::new(config()).on_request_headers(&request_headers(&extra), false);
        assert_eq!(step.action, HeadersAction::ReadBody);
        assert_eq!(
            step.remove,
            [
                "x-waygate-cluster",
                "x-envoy-max-retries",
                "x-envoy-retry-on",
                "openai-organization",
                "openai-project",
                "x-api-key",
                "cookie"
            ]
        );
        // Outside base_path the request is not the filter's: only the cluster is its business.
        let mut elsewhere = request_headers(&extra);
        elsewhere[1].1 = b"/elsewhere".to_vec();
        let step = Exchange::new(config()).on_request_headers(&elsewhere, false);
        assert_eq!(step.action, HeadersAction::Continue);
        assert_eq!(step.remove, ["x-waygate-cluster"]);
    }

    #[test]
    fn the_body_is_held_until_its_end_and_refused_once_too_large() {
        let mut ex = Exchange::new(config());
        assert_eq!(ex.on_request_body_chunk(10, false), BodyStep::Pass, "headers not seen");
        assert_eq!(
            ex.on_request_headers(&request_headers(&[]), false).action,
            HeadersAction::ReadBody
        );
        assert_eq!(ex.on_request_body_chunk(10, false), BodyStep::Wait);
        assert_eq!(ex.on_request_body_chunk(20, true), BodyStep::Read);
        let limit = usize::try_from(config().max_request_bytes).unwrap();
        let BodyStep::Reply(reply) = ex.on_request_body_chunk(limit + 1, false) else {
            panic!("an oversize body is refused before its end");
        };
        assert_eq!(reply.status, 413);
        assert_eq!(ex.on_request_body_chunk(limit + 2, true), BodyStep::Pass, "answered");
        assert_eq!(ex.stage(), Stage::Untouched);
    }

    #[test]
    fn the_answers_spend_is_published_and_an_error_spends_nothing() {
        let mut ex = forwarded("oa/x", false);
        ex.on_response_headers(&head(200, "application/json"), via_upstream, false);
        let answer = json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "hi"}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3}});
        assert_eq!(ex.on_buffered_body(answer.to_string().as_bytes()).status, 200);
        let published = ex.usage_properties();
        for expected in [
            ("waygate_prompt_tokens", "7"),
            ("waygate_completion_tokens", "3"),
            (TOTAL_TOKENS_PROPERTY, "10"),
            ("waygate_provider", "oa"),
        ] {
            assert!(
                published.contains(&(expected.0, expected.1.to_string())),
                "{expected:?} in {published:?}"
            );
        }

        let mut ex = forwarded("oa/x", false);
        ex.on_response_headers(&head(400, "application/json"), via_upstream, false);
        assert_eq!(ex.on_buffered_body(b"{}").status, 400);
        assert_eq!(ex.usage_properties(), [(TOTAL_TOKENS_PROPERTY, "0".to_string())]);
    }

    /// The access line and the stats say the request ended as the contract's 500.
    fn assert_logged_as_internal_error(ex: &mut Exchange) {
        let log = logged(ex);
        assert!(log.line.contains("status=500"), "{}", log.line);
        assert!(
            log.metrics.iter().any(|u| u.name == "waygate.errors.internal_error"),
            "{:?}",
            log.metrics
        );
    }

    #[test]
    fn a_step_the_host_refused_ends_the_request_as_a_logged_500() {
        let mut ex = forwarded("oa/x", false);
        assert_eq!(ex.stage(), Stage::Awaiting);
        let reply = ex.fail("rewriting the request failed");
        assert_eq!(reply.status, 500);
        let v: Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(v["error"]["code"], "internal_error");
        // Envoy passes the reply back through the response callbacks: not ours.
        assert_eq!(ex.stage(), Stage::Untouched);
        let step = ex.on_response_headers(&head(500, "application/json"), via_upstream, false);
        assert_eq!(step.action, ResponseAction::Continue);
        assert_logged_as_internal_error(&mut ex);
    }

    #[test]
    fn a_stream_the_shell_cut_is_logged_as_a_500_and_reads_no_more() {
        let mut ex = forwarded("oa/x", true);
        let step = ex.on_response_headers(&head(200, "text/event-stream"), via_upstream, false);
        assert!(matches!(step.action, ResponseAction::Stream { .. }), "{step:?}");
        ex.cut("replacing a stream chunk failed");
        assert_eq!(ex.stage(), Stage::Untouched);
        let mut out = Vec::new();
        ex.on_stream_body(b"data: {}\n\n", false, &mut out);
        assert!(out.is_empty(), "a cut stream writes nothing more");
        assert_logged_as_internal_error(&mut ex);
    }

    #[test]
    fn the_clients_key_in_other_headers_is_never_forwarded() {
        let mut ex = Exchange::new(config());
        let pairs = request_headers(&[
            ("x-api-key", CLIENT_KEY),
            ("api-key", CLIENT_KEY),
            ("x-other", "harmless"),
        ]);
        assert_eq!(ex.on_request_headers(&pairs, false).action, HeadersAction::ReadBody);
        let body = json!({"model": "an/x", "messages": [{"role": "user", "content": "hi"}]});
        let forward = ex
            .on_request_body(body.to_string().as_bytes(), 1, &mut MemoryStore::default())
            .unwrap();
        for name in ["authorization", "x-api-key", "api-key"] {
            assert!(replaced_or_removed(&forward, name), "{name}: {forward:?}");
            assert!(!forward.set.iter().any(|(_, v)| v.contains(CLIENT_KEY)), "{forward:?}");
        }
        assert!(!forward.remove.iter().any(|r| r == "x-other"));
        // Replaced by the provider's own credential.
        assert!(
            forward
                .set
                .contains(&("x-api-key".to_string(), ANTHROPIC_SECRET.to_string()))
        );
    }

    #[test]
    fn with_router_fallback_every_attempt_is_prepared_and_the_last_answer_is_shaped() {
        let mut config = (*config()).clone();
        config.fallback = Fallback::Router;
        let mut ex = Exchange::new(Rc::new(config));
        let pairs = request_headers(&[("x-api-key", CLIENT_KEY)]);
        assert_eq!(ex.on_request_headers(&pairs, false).action, HeadersAction::ReadBody);
        let body = json!({"model": "chain/x", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
        let forward = ex
            .on_request_body(body.to_string().as_bytes(), 1, &mut MemoryStore::default())
            .unwrap();
        // The downstream request carries the route marker and the retries, not a translation.
        assert!(forward.set.contains(&(ROUTED_HEADER.into(), "1".into())), "{forward:?}");
        assert!(forward.set.contains(&("x-envoy-max-retries".into(), "1".into())));
        assert_eq!(
            forward.body, None,
            "the client's body stays until each attempt replaces it"
        );
        for name in ["authorization", "x-api-key"] {
            assert!(forward.remove.iter().any(|r| r == name), "{name}: {forward:?}");
        }
        let routed = forward.routed.clone().unwrap();
        assert_eq!(routed.borrow().clusters().collect::<Vec<_>>(), ["c_oa", "c_an"]);
        // Published for the route's cluster matcher, slot by slot.
        for (name, cluster) in [("waygate_slot_1", "c_oa"), ("waygate_slot_2", "c_an")] {
            assert!(
                forward.properties.contains(&(name.into(), cluster.into())),
                "{:?}",
                forward.properties
            );
        }

        // What the upstream filter does for the router's two attempts.
        {
            let mut all = routed.borrow_mut();
            let first = all.start(1).unwrap();
            assert!(
                first
                    .set
                    .contains(&("authorization".into(), format!("Bearer {SECRET}")))
            );
            all.on_response(1, 503, None);
            let second = all.start(2).unwrap();
            assert!(
                second.set.contains(&(":path".into(), "/v1/messages".into())),
                "{second:?}"
            );
            assert!(second.set.contains(&("x-api-key".into(), ANTHROPIC_SECRET.into())));
            assert!(second.remove.iter().any(|r| r == "authorization"), "{second:?}");
            assert!(text(second.body).contains("\"model\":\"b\""), "{}", text(second.body));
        }
        routed.borrow_mut().on_response(2, 200, None);

        // The answer the client gets is the second one's, streamed and translated.
        let action = ex
            .on_response_headers(&head(200, "text/event-stream"), via_upstream, false)
            .action;
        let ResponseAction::Stream { set, .. } = action else {
            panic!("{action:?}");
        };
        assert!(
            set.contains(&("x-waygate-attempts".into(), "oa:503,an:200".into())),
            "{set:?}"
        );
        assert!(set.contains(&("x-waygate-provider".into(), "an".into())), "{set:?}");
        let mut out = Vec::new();
        ex.on_stream_body(
            b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"b\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n\
              event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
            false,
            &mut out,
        );
        assert!(text(&out).contains("chat.completion.chunk"), "{}", text(&out));
    }

    /// A key limited to one request a minute, counted where `limits` says.
    fn limited_config(limits: Limits) -> Rc<Config> {
        let mut config = (*config()).clone();
        config.limits = limits;
        let limited = config.keys.iter().map(|key| {
            let mut key = (**key).clone();
            key.requests_per_minute = Some(1);
            Rc::new(key)
        });
        config.keys = Keys::new(limited.collect());
        Rc::new(config)
    }

    fn send(ex: &mut Exchange, store: &mut MemoryStore) -> Result<Forward, Reply> {
        assert_eq!(
            ex.on_request_headers(&request_headers(&[]), false).action,
            HeadersAction::ReadBody
        );
        let body = json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}]});
        ex.on_request_body(body.to_string().as_bytes(), 1_700_000_000_000, store)
    }

    #[test]
    fn with_global_limits_the_filter_counts_nothing_and_names_the_key() {
        let mut store = MemoryStore::default();
        let local = limited_config(Limits::Local);
        limits::prepare(&mut store, &local.keys);
        assert!(send(&mut Exchange::new(Rc::clone(&local)), &mut store).is_ok());
        let refused = send(&mut Exchange::new(local), &mut store).unwrap_err();
        assert_eq!(refused.status, 429);

        let global = limited_config(Limits::Global);
        let mut store = MemoryStore::default();
        limits::prepare(&mut store, &global.keys);
        for _ in 0..3 {
            let mut ex = Exchange::new(Rc::clone(&global));
            let forward = send(&mut ex, &mut store).unwrap();
            assert!(forward.properties.contains(&(KEY_ID_PROPERTY.into(), "dev".into())));
            assert!(
                !forward.set.iter().any(|(k, _)| k.starts_with("x-ratelimit")),
                "{forward:?}"
            );
        }
    }

    #[test]
    fn envoys_rate_limit_refusal_is_answered_in_the_contract_shape_and_never_falls_back() {
        let mut ex = forwarded("chain/x", true);
        let refusal = [(":status", "429"), ("x-ratelimit-reset", "42")];
        let step = ex.on_response_headers(&refusal, || Some(b"request_rate_limited".to_vec()), true);
        let ResponseAction::Answer(rewrite) = step.action else {
            panic!("{:?}", step.action);
        };
        assert_eq!(rewrite.status, 429);
        assert!(
            rewrite.set.contains(&("retry-after".into(), "42".into())),
            "{:?}",
            rewrite.set
        );
        assert!(
            !rewrite.set.iter().any(|(k, _)| k == "x-waygate-attempts"),
            "no provider was tried"
        );
        let body: Value = serde_json::from_slice(&rewrite.body).unwrap();
        assert_eq!(body["error"]["code"], "rate_limited");
        assert_eq!(body["error"]["type"], "rate_limit_error");
        let line = logged(&mut ex).line;
        assert!(
            line.contains("status=429") && line.contains("provider=- attempts=-"),
            "{line}"
        );
    }
}
