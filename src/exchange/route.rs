//! The request body: read as the internal form (another API's request
//! rewritten by its `inbound` module), the model resolved and allowed, the
//! key admitted, the candidates spread, ordered by health and planned, and
//! the first attempt (or, with router fallback, every attempt) translated
//! for its provider.

use super::*;

/// Where a routed request goes.
// Made and taken apart once a request, never stored: boxing would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub(super) enum Routing {
    /// Upstream, its first attempt rewritten as `Forward` says.
    Upstream(Routed, Forward),
    /// Nowhere: the filter answers it with this JSON (a token count no
    /// candidate counts, estimated).
    Answered(Value),
}

/// The candidates not yet tried, and how many more may be.
pub(super) struct Plan {
    candidates: std::vec::IntoIter<Candidate>,
    tries_left: usize,
}

impl Plan {
    /// The next candidate whose API can express `request`, translated for it,
    /// while tries remain; the first refusal is kept in `refusal`.
    /// Translation starts from the parsed original every time, so it is the
    /// same whichever attempt it is.
    pub(super) fn next(
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
            let native = asked
                .client
                .native_request(&provider, &asked.request, model, routing_field);
            let built = native.unwrap_or_else(|| {
                let mut translated = providers::build_request(&provider, &asked.request, model, routing_field)?;
                asked.client.carry_over(&provider, &mut translated);
                Ok(translated)
            });
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

const HOP_HEADERS_TO_DROP: [&str; 3] = ["authorization", "accept-encoding", "content-length"];

/// What every translated request sets, first to last: where it goes on the
/// provider, its body's type and length, then the provider's own headers
/// (its credential, its API version); and the body.
pub(super) fn request_headers(provider: &Provider, upstream: UpstreamRequest) -> (Vec<Header>, Vec<u8>) {
    let mut set: Vec<Header> = vec![
        (":path".into(), upstream.path),
        (":authority".into(), provider.authority.clone()),
        ("content-type".into(), "application/json".into()),
        ("content-length".into(), upstream.body.len().to_string()),
    ];
    set.extend(upstream.headers);
    (set, upstream.body)
}

impl Exchange {
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

    /// The whole request body is here. `now_ns` is the host's clock (unix
    /// nanoseconds): the limits' window, and the upstream timings' start.
    /// `store` holds what every worker shares: the per-key limit counters
    /// and the providers' health.
    pub fn on_request_body(&mut self, body: &[u8], now_ns: u64, store: &mut dyn SharedStore) -> Result<Forward, Reply> {
        let now_ms = now_ns / 1_000_000;
        let State::Reading {
            api,
            key_headers,
            api_headers,
        } = std::mem::replace(&mut self.state, State::Done)
        else {
            return Err(self.fail("request body in an unexpected phase"));
        };
        match self.route(api, &key_headers, api_headers, body, now_ms, store) {
            Ok(Routing::Upstream(routed, forward)) => {
                self.state = State::Upstream(routed);
                self.clock.forwarded_ns = Some(now_ns);
                Ok(forward)
            }
            Ok(Routing::Answered(answer)) => Err(self.reply(json_reply(&answer))),
            Err(e) => Err(self.reply_error(&e)),
        }
    }

    pub(super) fn route(
        &mut self,
        api: ClientApi,
        key_headers: &[String],
        api_headers: Vec<Header>,
        body: &[u8],
        now_ms: u64,
        store: &mut dyn SharedStore,
    ) -> Result<Routing, ApiError> {
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
            ClientApi::CountTokens => {
                let (chat, mut counted) = messages::count_request(body, &cfg.routing_field)?;
                counted.asked.headers = api_headers;
                (
                    request::parse(api.operation(), &chat)?,
                    Client::Count(Box::new(counted)),
                )
            }
            ClientApi::Messages => {
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
        // A token count counts against no limit (docs/contract.md "The Messages API").
        if let Some(key) = key.filter(|_| cfg.limits == Limits::Local && api != ClientApi::CountTokens) {
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
        let (mut candidates, ticket) = health::arrange(store, &cfg.health, routing::plan(defaults, &directive), now_ms);
        self.record.health = ticket;
        if let Client::Count(counted) = &client {
            // Counted by the candidates that count, up to the first that does
            // not (its model's count would be another tokenizer's); estimated
            // when the first does not.
            let counting = candidates.iter().take_while(|c| counts_tokens(&c.provider)).count();
            candidates.truncate(counting);
            if candidates.is_empty() {
                return Ok(Routing::Answered(counted.estimate.clone()));
            }
        }
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
        if matches!(api, ClientApi::Messages | ClientApi::CountTokens) {
            // For the listener's local reply mapper: Envoy's own answers past the
            // filter (a reset, a timeout after the headers) in Anthropic's envelope.
            properties.push((API_PROPERTY.into(), "messages".into()));
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
            return Ok(Routing::Upstream(routed, forward));
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
        Ok(Routing::Upstream(routed, forward))
    }
}

/// The request sent to `provider` (`"http_call"` fallback): its path,
/// authority, credential and body, the cluster it goes to and its time
/// budget, and the client's key headers removed.
pub(super) fn forward(
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
pub(super) fn route_attempts(
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

/// A 200 JSON answer of the filter's own (the models listing).
pub(super) fn model_not_allowed(model: &str) -> ApiError {
    ApiError::new(
        403,
        ErrorType::Permission,
        "model_not_allowed",
        format!("This API key may not use the model '{model}'."),
    )
    .with_param("model")
}
