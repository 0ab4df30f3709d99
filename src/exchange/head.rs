//! The request headers (contract §4, up to the size): the client's
//! reserved, `x-envoy-*` and account headers removed, the API it called,
//! its key, endpoint, method, media type and declared size checked; the
//! models listing answered.

use super::*;

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

impl Exchange {
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
                    ClientApi::Messages | ClientApi::CountTokens => (anthropic::CLIENT_HEADERS.iter())
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
    pub(super) fn check_head<'h>(
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
}

/// The names of the headers, other than `authorization`, whose value holds
/// the client's bearer token.
pub(super) fn key_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    pairs: &[(K, V)],
    authorization: Option<&[u8]>,
) -> Vec<String> {
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
pub(super) fn under_base<'p>(path: &'p [u8], base: &[u8]) -> Option<&'p [u8]> {
    let rest = path.strip_prefix(base)?;
    (rest.is_empty() || rest.first() == Some(&b'/')).then_some(rest)
}
