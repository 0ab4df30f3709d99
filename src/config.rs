//! Plugin configuration (contract §8): a raw serde mirror that refuses unknown
//! fields, validated into [`Config`] with every problem reported at once.
//!
//! Validation is deterministic and side-effect free because Envoy runs
//! `on_configure` on a throw-away canary VM and again on every worker. The
//! environment lookup is passed in, so the same code runs natively in tests.

use std::rc::Rc;

use serde::{Deserialize, Deserializer};

use crate::glob::Glob;
use crate::redact::Secret;

/// Which wire API a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Api {
    Openai,
    Anthropic,
    Gemini,
}

impl Api {
    fn default_path_prefix(self) -> &'static str {
        match self {
            Api::Openai | Api::Anthropic => "/v1",
            Api::Gemini => "/v1beta",
        }
    }
}

/// How a failed attempt reaches the next candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// The filter sends the next attempt with `dispatch_http_call`, whose
    /// answer Envoy buffers whole: works on every Envoy >= 1.35.
    HttpCall,
    /// Envoy's router retries, cluster by cluster, with the filter also
    /// installed as an upstream filter that rewrites each attempt: the next
    /// provider's answer streams. Needs Envoy >= 1.39 and its route shape
    /// (docs/deploying.md "Routing and fallback").
    Router,
}

/// Where `keys[].requests_per_minute` and `tokens_per_minute` are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limits {
    /// By the filter, in proxy-wasm shared data: one Envoy process.
    Local,
    /// By Envoy's global rate limit filter and a rate limit service, across
    /// every replica. The filter counts nothing; it publishes the key id and
    /// each answer's tokens for the rate limit filter's descriptors, and
    /// reshapes that filter's refusals (docs/operating.md "Limits and stats").
    Global,
}

/// A validated configuration, ready for requests.
#[derive(Debug, Clone)]
pub struct Config {
    pub routing_field: String,
    pub base_path: String,
    pub cluster_header: String,
    pub max_request_bytes: u64,
    pub max_provider_tries: u32,
    pub fallback: Fallback,
    pub limits: Limits,
    pub keys: Keys,
    /// Shared with every candidate, attempt and answer that names one: a
    /// provider is held, never looked up again.
    pub providers: Vec<Rc<Provider>>,
    pub models: Vec<Model>,
    pub health: Health,
}

/// The providers' circuits (contract "Health"; [`crate::health`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    pub enabled: bool,
    /// Consecutive failures that open a circuit.
    pub failures: u32,
    /// How long a circuit first stays open; each reopening without a
    /// close in between doubles it, up to `max_cooldown_ms`.
    pub cooldown_ms: u64,
    pub max_cooldown_ms: u64,
    /// A circuit also opens once this share of its attempts (in percent)
    /// failed within `window_ms` of its first failure, over at least
    /// `min_requests` attempts; `None`: consecutive failures only.
    pub failure_percent: Option<u32>,
    pub window_ms: u64,
    pub min_requests: u32,
}

impl Default for Health {
    fn default() -> Health {
        Health {
            enabled: true,
            failures: 3,
            cooldown_ms: 30_000,
            max_cooldown_ms: 300_000,
            failure_percent: None,
            window_ms: 60_000,
            min_requests: 10,
        }
    }
}

/// A client key: its digest, what it may use and its limits.
#[derive(Debug, Clone)]
pub struct Key {
    pub id: String,
    pub sha256: [u8; 32],
    /// `None`: every model.
    pub models: Option<Vec<Glob>>,
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
}

/// The client keys, sorted by digest: a request's key is found by binary
/// search, so ten thousand keys cost a request what ten do (contract §3).
#[derive(Debug, Clone, Default)]
pub struct Keys(Vec<Rc<Key>>);

impl Keys {
    pub fn new(keys: Vec<Rc<Key>>) -> Keys {
        // Sorted as `(&[u8], usize)`, as `report_repeats` sorts: one instance
        // of the sort in the module.
        let mut order: Vec<(&[u8], usize)> = keys.iter().enumerate().map(|(i, k)| (&k.sha256[..], i)).collect();
        order.sort_unstable();
        Keys(order.iter().filter_map(|(_, i)| keys.get(*i).cloned()).collect())
    }

    /// The key whose SHA-256 digest is `digest`.
    pub fn find(&self, digest: &[u8; 32]) -> Option<&Rc<Key>> {
        let at = self.0.binary_search_by(|k| k.sha256.cmp(digest)).ok()?;
        self.0.get(at)
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Rc<Key>> {
        self.0.iter()
    }
}

impl<'k> IntoIterator for &'k Keys {
    type Item = &'k Rc<Key>;
    type IntoIter = std::slice::Iter<'k, Rc<Key>>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// An upstream provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provider {
    pub id: String,
    pub api: Api,
    pub cluster: String,
    pub authority: String,
    pub path_prefix: String,
    /// `None` when `api_key_env` names a variable the VM does not have: the
    /// provider is then never a candidate (so `make run` works with no keys).
    pub credential: Option<Secret>,
    /// Where the credential comes from, for messages (never the value).
    pub credential_source: String,
    /// The credential's id (`0` for a provider's only one): its circuit's name
    /// (contract "Health"), never the secret. A provider with several
    /// credentials is one `Provider` per credential, sharing the id.
    pub credential_id: String,
    /// The credential's share of its provider's traffic.
    pub credential_weight: u32,
    /// How many credentials the provider holds.
    pub credential_count: usize,
    pub legacy_completions: bool,
    /// The provider serves OpenAI's Responses API itself
    /// (`{path_prefix}/responses`): a `/responses` request goes to it as it came.
    pub responses: bool,
    pub timeout_ms: u64,
    pub default_max_tokens: u64,
}

/// A model id served by an ordered list of provider endpoints. An id with a
/// `*` is a pattern: it serves every model id it matches that no plain
/// entry names (Claude Code's `claude-*` names, say).
#[derive(Debug, Clone)]
pub struct Model {
    pub id: String,
    pub pattern: Option<Glob>,
    pub endpoints: Vec<Endpoint>,
    pub strategy: Strategy,
}

/// How the endpoints of one priority share a model's requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// At random, in proportion to their weights.
    #[default]
    Weighted,
    /// The one with the fewest of this Envoy's requests in flight first.
    FewestInFlight,
}

/// An endpoint's `model` that stands for the model id the client asked for
/// (under a pattern, the name Claude Code sent).
pub const ASKED_MODEL: &str = "*";

/// One provider serving a model under its own upstream model name.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub provider: Rc<Provider>,
    pub model: String,
    /// Its share of its priority's requests.
    pub weight: u32,
    /// Lower first; the next priority is the fallback of the one before.
    pub priority: u32,
}

impl Provider {
    /// As `x-waygate-attempts` and the access log name it: the id, and for a
    /// provider with several credentials `<id>#<credential id>`.
    pub fn attempt_name(&self) -> std::borrow::Cow<'_, str> {
        if self.credential_count > 1 {
            format!("{}#{}", self.id, self.credential_id).into()
        } else {
            self.id.as_str().into()
        }
    }

    /// The credential to send: empty for none, which routing never lets
    /// reach a request.
    pub fn credential_text(&self) -> &str {
        self.credential.as_ref().map_or("", Secret::as_str)
    }
}

impl Config {
    /// Provider `id` (its first credential).
    pub fn provider(&self, id: &str) -> Option<&Rc<Provider>> {
        self.providers.iter().find(|p| p.id == id)
    }

    /// Every credential of provider `id`, in configuration order.
    pub fn credentials<'c>(&'c self, id: &'c str) -> impl Iterator<Item = &'c Rc<Provider>> + 'c {
        self.providers.iter().filter(move |p| p.id == id)
    }

    /// Whether `json` configures the filter's upstream role, installed on
    /// provider clusters for router fallback: exactly `{"role": "upstream"}`.
    /// Its providers and keys are the downstream plugin's, in the same VM.
    pub fn is_upstream_role(json: &[u8]) -> bool {
        let Ok(serde_json::Value::Object(members)) = crate::json::dom::parse_slice(json) else {
            return false;
        };
        members.len() == 1 && members.get("role").and_then(serde_json::Value::as_str) == Some("upstream")
    }

    /// Parses and validates the plugin configuration. `env` looks up a VM
    /// environment variable. On failure, every problem found is returned.
    pub fn parse(json: &[u8], env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Vec<String>> {
        let raw: RawConfig = match crate::json::from_bytes(json) {
            Ok(raw) => raw,
            Err(e) => return Err(vec![format!("configuration is not valid: {e}")]),
        };
        raw.validate(env)
    }
}

// ---- the raw mirror -------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    routing_field: Option<String>,
    base_path: Option<String>,
    cluster_header: Option<String>,
    #[serde(default, deserialize_with = "whole_number")]
    max_request_bytes: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    max_provider_tries: Option<u64>,
    fallback: Option<Fallback>,
    limits: Option<Limits>,
    #[serde(default)]
    keys: Vec<RawKey>,
    #[serde(default)]
    providers: Vec<RawProvider>,
    #[serde(default)]
    models: Vec<RawModel>,
    health: Option<RawHealth>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealth {
    enabled: Option<bool>,
    #[serde(default, deserialize_with = "whole_number")]
    failures: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    cooldown_ms: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    max_cooldown_ms: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    failure_percent: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    window_ms: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    min_requests: Option<u64>,
}

impl RawHealth {
    fn validate(self, problems: &mut Vec<String>) -> Health {
        let default = Health::default();
        let failures = self.failures.unwrap_or(u64::from(default.failures));
        if failures == 0 || failures > 1000 {
            problems.push("health.failures: must be between 1 and 1000".into());
        }
        let cooldown_ms = self.cooldown_ms.unwrap_or(default.cooldown_ms);
        if cooldown_ms == 0 {
            problems.push("health.cooldown_ms: must be at least 1".into());
        }
        let max_cooldown_ms = self.max_cooldown_ms.unwrap_or(default.max_cooldown_ms.max(cooldown_ms));
        if max_cooldown_ms < cooldown_ms {
            problems.push("health.max_cooldown_ms: must be at least cooldown_ms".into());
        }
        if self.failure_percent.is_some_and(|p| p == 0 || p > 100) {
            problems.push("health.failure_percent: must be between 1 and 100".into());
        }
        let window_ms = self.window_ms.unwrap_or(default.window_ms);
        if window_ms == 0 {
            problems.push("health.window_ms: must be at least 1".into());
        }
        let min_requests = self.min_requests.unwrap_or(u64::from(default.min_requests));
        if min_requests == 0 || min_requests > 100_000 {
            problems.push("health.min_requests: must be between 1 and 100000".into());
        }
        Health {
            enabled: self.enabled.unwrap_or(default.enabled),
            failures: u32::try_from(failures).unwrap_or(u32::MAX),
            cooldown_ms,
            max_cooldown_ms,
            failure_percent: self.failure_percent.and_then(|p| u32::try_from(p).ok()),
            window_ms,
            min_requests: u32::try_from(min_requests).unwrap_or(u32::MAX),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKey {
    id: String,
    sha256: String,
    models: Option<Vec<String>>,
    #[serde(default, deserialize_with = "whole_number")]
    requests_per_minute: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    tokens_per_minute: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProvider {
    id: String,
    api: Api,
    cluster: String,
    authority: String,
    path_prefix: Option<String>,
    api_key_env: Option<String>,
    api_key: Option<String>,
    credentials: Option<Vec<RawCredential>>,
    legacy_completions: Option<bool>,
    responses: Option<bool>,
    #[serde(default, deserialize_with = "whole_number")]
    timeout_ms: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    default_max_tokens: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCredential {
    id: String,
    api_key_env: Option<String>,
    api_key: Option<String>,
    #[serde(default, deserialize_with = "whole_number")]
    weight: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    id: String,
    endpoints: Vec<RawEndpoint>,
    strategy: Option<Strategy>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEndpoint {
    provider: String,
    model: String,
    #[serde(default, deserialize_with = "whole_number")]
    weight: Option<u64>,
    #[serde(default, deserialize_with = "whole_number")]
    priority: Option<u64>,
}

/// The most a weight may be: shares stay exact in the draw's arithmetic.
const MAX_WEIGHT: u64 = 1_000_000;

fn weight(value: Option<u64>, at: &str, problems: &mut Vec<String>) -> u32 {
    let weight = value.unwrap_or(1);
    if weight == 0 || weight > MAX_WEIGHT {
        problems.push(format!("{at}: weight must be between 1 and {MAX_WEIGHT}"));
    }
    u32::try_from(weight.clamp(1, MAX_WEIGHT)).unwrap_or(1)
}

/// Accepts `5` and `5.0`: an Istio `pluginConfig` is a protobuf Struct, whose
/// numbers arrive as doubles.
fn whole_number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let n = Option::<f64>::deserialize(d)?;
    match n {
        None => Ok(None),
        Some(f) if f >= 0.0 && f.fract() == 0.0 && f <= 9_007_199_254_740_992.0 => Ok(Some(f as u64)),
        Some(f) => Err(serde::de::Error::custom(format!(
            "expected a whole number >= 0, got {f}"
        ))),
    }
}

const DEFAULT_MAX_REQUEST_BYTES: u64 = 4 * 1024 * 1024;
const DEFAULT_MAX_PROVIDER_TRIES: u64 = 3;
const DEFAULT_TIMEOUT_MS: u64 = 300_000;
const DEFAULT_MAX_TOKENS: u64 = 4096;

impl RawConfig {
    fn validate(self, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Vec<String>> {
        let mut problems = Vec::new();

        let routing_field = self.routing_field.unwrap_or_else(|| "waygate".into());
        if routing_field.is_empty() {
            problems.push("routing_field: must not be empty".into());
        }
        let base_path = self.base_path.unwrap_or_else(|| "/api/v1".into());
        if !base_path.starts_with('/') || base_path.ends_with('/') || base_path.contains(['?', '#']) {
            problems.push(format!(
                "base_path: {base_path:?} must start with '/' and not end with '/'"
            ));
        }
        let cluster_header = self.cluster_header.unwrap_or_else(|| "x-waygate-cluster".into());
        if !is_header_name(&cluster_header) {
            problems.push(format!(
                "cluster_header: {cluster_header:?} is not a lowercase header name"
            ));
        }
        let max_request_bytes = self.max_request_bytes.unwrap_or(DEFAULT_MAX_REQUEST_BYTES);
        if max_request_bytes == 0 {
            problems.push("max_request_bytes: must be at least 1".into());
        }
        let max_provider_tries = self.max_provider_tries.unwrap_or(DEFAULT_MAX_PROVIDER_TRIES);
        if max_provider_tries == 0 || max_provider_tries > 100 {
            problems.push("max_provider_tries: must be between 1 and 100".into());
        }

        let providers = validate_providers(self.providers, env, &mut problems);
        let models = validate_models(self.models, &providers, &mut problems);
        let keys = validate_keys(self.keys, &mut problems);
        let health = self.health.map_or_else(Health::default, |h| h.validate(&mut problems));

        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(Config {
            routing_field,
            base_path,
            cluster_header,
            max_request_bytes,
            max_provider_tries: u32::try_from(max_provider_tries).unwrap_or(u32::MAX),
            fallback: self.fallback.unwrap_or(Fallback::HttpCall),
            limits: self.limits.unwrap_or(Limits::Local),
            keys,
            providers,
            models,
            health,
        })
    }
}

fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

fn validate_providers(
    raw: Vec<RawProvider>,
    env: &dyn Fn(&str) -> Option<String>,
    problems: &mut Vec<String>,
) -> Vec<Rc<Provider>> {
    let mut providers: Vec<Rc<Provider>> = Vec::with_capacity(raw.len());
    // Where each configured provider's first credential is in `providers`.
    let mut heads: Vec<usize> = Vec::with_capacity(raw.len());
    for (i, p) in raw.into_iter().enumerate() {
        let at = format!("providers[{i}] ({:?})", p.id);
        if p.id.is_empty() || p.id.contains('/') || p.id.contains(',') || p.id.contains(':') {
            problems.push(format!("{at}: id must be non-empty without '/', ',' or ':'"));
        }
        if p.cluster.is_empty() {
            problems.push(format!("{at}: cluster must not be empty"));
        }
        if p.authority.is_empty() || p.authority.contains(['/', ' ']) {
            problems.push(format!("{at}: authority must be a host[:port]"));
        }
        let path_prefix = p.path_prefix.unwrap_or_else(|| p.api.default_path_prefix().to_string());
        if !(path_prefix.is_empty() || path_prefix.starts_with('/') && !path_prefix.ends_with('/')) {
            problems.push(format!(
                "{at}: path_prefix {path_prefix:?} must start with '/' and not end with '/'"
            ));
        }
        // (id, the secret if set, where it comes from, weight)
        let credentials: Vec<(String, Option<String>, String, u32)> = match (p.api_key_env, p.api_key, p.credentials) {
            (Some(var), None, None) => vec![(
                "0".into(),
                env(&var).filter(|v| !v.is_empty()),
                format!("environment variable {var}"),
                1,
            )],
            (None, Some(key), None) => vec![("0".into(), Some(key), "api_key".to_string(), 1)],
            (None, None, Some(list)) if !list.is_empty() => {
                let mut credentials: Vec<(String, Option<String>, String, u32)> = Vec::with_capacity(list.len());
                for (j, c) in list.into_iter().enumerate() {
                    let at = format!("{at}.credentials[{j}] ({:?})", c.id);
                    if c.id.is_empty() || c.id.contains(['\n', '\r']) {
                        problems.push(format!("{at}: id must be a non-empty line"));
                    }
                    if credentials.iter().any(|(id, ..)| *id == c.id) {
                        problems.push(format!("{at}: duplicate credential id"));
                    }
                    let (secret, source) = match (c.api_key_env, c.api_key) {
                        (Some(var), None) => (
                            env(&var).filter(|v| !v.is_empty()),
                            format!("environment variable {var}"),
                        ),
                        (None, Some(key)) => (Some(key), format!("credential {}'s api_key", c.id)),
                        _ => {
                            problems.push(format!("{at}: exactly one of api_key_env and api_key is required"));
                            (None, String::new())
                        }
                    };
                    let weight = weight(c.weight, &at, problems);
                    credentials.push((c.id, secret, source, weight));
                }
                credentials
            }
            _ => {
                problems.push(format!(
                    "{at}: exactly one of api_key_env, api_key and a non-empty credentials is required"
                ));
                vec![("0".into(), None, String::new(), 1)]
            }
        };
        if p.legacy_completions == Some(true) && p.api != Api::Openai {
            problems.push(format!("{at}: legacy_completions is only for api \"openai\""));
        }
        if p.responses == Some(true) && p.api != Api::Openai {
            problems.push(format!("{at}: responses is only for api \"openai\""));
        }
        let timeout_ms = p.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS);
        if timeout_ms == 0 {
            problems.push(format!("{at}: timeout_ms must be at least 1"));
        }
        let default_max_tokens = p.default_max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
        if default_max_tokens == 0 {
            problems.push(format!("{at}: default_max_tokens must be at least 1"));
        }
        let first = providers.len();
        let credential_count = credentials.len();
        for (credential_id, secret, credential_source, credential_weight) in credentials {
            providers.push(Rc::new(Provider {
                id: p.id.clone(),
                api: p.api,
                cluster: p.cluster.clone(),
                authority: p.authority.clone(),
                path_prefix: path_prefix.clone(),
                credential: secret.map(|c| Secret::new(&c)),
                credential_source,
                credential_id,
                credential_weight,
                credential_count,
                legacy_completions: p.legacy_completions.unwrap_or(false),
                responses: p.responses.unwrap_or(false),
                timeout_ms,
                default_max_tokens,
            }));
        }
        heads.push(first);
    }
    // One entry per provider (its first credential) for the repeat check.
    let firsts: Vec<Rc<Provider>> = heads.iter().filter_map(|i| providers.get(*i).cloned()).collect();
    report_repeats(
        "providers",
        &firsts,
        |p| Some(p.id.as_bytes()),
        |p| &p.id,
        "duplicate provider id",
        problems,
    );
    providers
}

fn validate_models(raw: Vec<RawModel>, providers: &[Rc<Provider>], problems: &mut Vec<String>) -> Vec<Model> {
    let mut models: Vec<Model> = Vec::with_capacity(raw.len());
    for (i, m) in raw.into_iter().enumerate() {
        let at = format!("models[{i}] ({:?})", m.id);
        match m.id.split_once('/') {
            Some((p, rest)) if p.is_empty() || rest.is_empty() => {
                problems.push(format!(
                    "{at}: id must look like <provider>/<model>, a bare id or a pattern"
                ));
            }
            _ if m.id.is_empty() => problems.push(format!("{at}: id must not be empty")),
            _ => {}
        }
        if m.endpoints.is_empty() {
            problems.push(format!("{at}: endpoints must not be empty"));
        }
        let mut endpoints = Vec::with_capacity(m.endpoints.len());
        for (j, e) in m.endpoints.into_iter().enumerate() {
            let at = format!("{at}.endpoints[{j}]");
            if e.model.is_empty() {
                problems.push(format!("{at}: model must not be empty"));
            }
            let weight = weight(e.weight, &at, problems);
            // The list's order is the default: one endpoint a priority.
            let priority = e.priority.unwrap_or(u64::try_from(j).unwrap_or(u64::MAX));
            match providers.iter().find(|p| p.id == e.provider) {
                Some(provider) => endpoints.push(Endpoint {
                    provider: Rc::clone(provider),
                    model: e.model,
                    weight,
                    priority: u32::try_from(priority).unwrap_or(u32::MAX),
                }),
                None => problems.push(format!("{at}: unknown provider {:?}", e.provider)),
            }
        }
        let pattern = m.id.contains('*').then(|| Glob::new(&m.id));
        models.push(Model {
            id: m.id,
            pattern,
            endpoints,
            strategy: m.strategy.unwrap_or_default(),
        });
    }
    report_repeats(
        "models",
        &models,
        |m| Some(m.id.as_bytes()),
        |m| &m.id,
        "duplicate model id",
        problems,
    );
    models
}

fn validate_keys(raw: Vec<RawKey>, problems: &mut Vec<String>) -> Keys {
    let mut keys: Vec<Rc<Key>> = Vec::with_capacity(raw.len());
    for (i, k) in raw.into_iter().enumerate() {
        let at = format!("keys[{i}] ({:?})", k.id);
        if k.id.is_empty() {
            problems.push(format!("{at}: id must not be empty"));
        }
        let sha256 = match parse_digest(&k.sha256) {
            Some(d) => d,
            None => {
                problems.push(format!("{at}: sha256 must be 64 lowercase hex digits"));
                [0; 32]
            }
        };
        for (name, v) in [
            ("requests_per_minute", k.requests_per_minute),
            ("tokens_per_minute", k.tokens_per_minute),
        ] {
            if v == Some(0) {
                problems.push(format!("{at}: {name} must be at least 1"));
            }
        }
        keys.push(Rc::new(Key {
            id: k.id,
            sha256,
            models: k.models.map(|globs| globs.iter().map(|g| Glob::new(g)).collect()),
            requests_per_minute: k.requests_per_minute,
            tokens_per_minute: k.tokens_per_minute,
        }));
    }
    report_repeats(
        "keys",
        &keys,
        |k| Some(k.id.as_bytes()),
        |k| &k.id,
        "duplicate key id",
        problems,
    );
    // A digest that did not parse is reported as such, not as a repeat.
    let digest: fn(&Rc<Key>) -> Option<&[u8]> = |k| (k.sha256 != [0; 32]).then_some(&k.sha256[..]);
    report_repeats("keys", &keys, digest, |k| &k.id, "duplicate sha256", problems);
    Keys::new(keys)
}

/// Reports every item whose `key` an earlier item has, at its own index:
/// `<section>[i] ("<id>"): <what>`. Found by sorting, not by comparing pairs:
/// a configuration may hold tens of thousands of keys, and every worker's VM
/// validates it. `(&[u8], usize)` is the one element type sorted in the
/// module (each instance of a sort is kilobytes of wasm; [`Keys::new`] sorts
/// the same).
fn report_repeats<T>(
    section: &str,
    items: &[T],
    key: fn(&T) -> Option<&[u8]>,
    id: fn(&T) -> &str,
    what: &str,
    problems: &mut Vec<String>,
) {
    let mut order: Vec<(&[u8], usize)> = items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| Some((key(item)?, i)))
        .collect();
    order.sort_unstable();
    for pair in order.windows(2) {
        if let [(first, _), (repeat, i)] = pair
            && first == repeat
            && let Some(item) = items.get(*i)
        {
            problems.push(format!("{section}[{i}] ({:?}): {what}", id(item)));
        }
    }
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (slot, pair) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        let hi = hex_value(*pair.first()?)?;
        let lo = hex_value(*pair.get(1)?)?;
        *slot = hi << 4 | lo;
    }
    Some(out)
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn the_contract_example_parses() {
        let json = format!(
            r#"{{"routing_field":"waygate","base_path":"/api/v1","cluster_header":"x-waygate-cluster",
            "max_request_bytes":4194304,"max_provider_tries":3,
            "keys":[{{"id":"team-a","sha256":"{DIGEST}","models":["openai/*","anthropic/claude-3-5-haiku"],
              "requests_per_minute":600,"tokens_per_minute":200000}}],
            "providers":[
              {{"id":"openai","api":"openai","cluster":"openai","authority":"api.openai.com","path_prefix":"/v1",
                "api_key_env":"OPENAI_API_KEY","legacy_completions":true,"timeout_ms":300000}},
              {{"id":"anthropic","api":"anthropic","cluster":"anthropic","authority":"api.anthropic.com",
                "path_prefix":"/v1","api_key_env":"ANTHROPIC_API_KEY","default_max_tokens":4096}},
              {{"id":"gemini","api":"gemini","cluster":"gemini","authority":"generativelanguage.googleapis.com",
                "path_prefix":"/v1beta","api_key":"literal-for-dev-only"}},
              {{"id":"groq","api":"openai","cluster":"groq","authority":"api.groq.com","api_key":"g"}},
              {{"id":"together","api":"openai","cluster":"together","authority":"api.together.xyz","api_key":"t"}}],
            "models":[{{"id":"meta-llama/llama-3.1-70b","endpoints":[
              {{"provider":"groq","model":"llama-3.1-70b-versatile"}},
              {{"provider":"together","model":"meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo"}}]}}]}}"#
        );
        let env = |name: &str| (name == "OPENAI_API_KEY").then(|| "sk-real".to_string());
        let c = Config::parse(json.as_bytes(), &env).unwrap();
        assert_eq!(c.providers.len(), 5);
        assert_eq!(c.providers[0].credential_text(), "sk-real");
        assert_eq!(c.providers[1].credential, None, "unset env var: provider unavailable");
        assert_eq!(c.providers[2].path_prefix, "/v1beta");
        // A provider printed for debugging never shows its credential.
        let printed = format!("{:?}", c.providers);
        assert!(
            !printed.contains("sk-real") && !printed.contains("literal-for-dev-only"),
            "{printed}"
        );
        assert!(printed.contains("[redacted]"), "{printed}");
        assert_eq!(c.models[0].endpoints[1].provider.id, "together");
        assert_eq!(c.keys.iter().next().unwrap().sha256[0], 0x9f);
        assert_eq!(c.max_provider_tries, 3);
    }

    #[test]
    fn defaults_apply_to_an_empty_config() {
        let c = Config::parse(b"{}", &no_env).unwrap();
        assert_eq!(c.routing_field, "waygate");
        assert_eq!(c.base_path, "/api/v1");
        assert_eq!(c.cluster_header, "x-waygate-cluster");
        assert_eq!(c.max_request_bytes, 4 * 1024 * 1024);
        assert_eq!(c.limits, Limits::Local);
        assert_eq!(c.fallback, Fallback::HttpCall);
    }

    #[test]
    fn credentials_weights_priorities_and_health_are_read_and_checked() {
        let json = br#"{"providers":[
            {"id":"a","api":"openai","cluster":"c","authority":"h","credentials":[
                {"id":"east","api_key":"k1","weight":3},{"id":"west","api_key_env":"WEST"}]}],
            "models":[{"id":"m","strategy":"fewest_in_flight","endpoints":[
                {"provider":"a","model":"x","weight":2,"priority":0},{"provider":"a","model":"y"}]}],
            "health":{"failures":5,"cooldown_ms":400000}}"#;
        let env = |name: &str| (name == "WEST").then(|| "k2".to_string());
        let c = Config::parse(json, &env).unwrap();
        let keys: Vec<(&str, &str, u32, usize)> = c
            .credentials("a")
            .map(|p| {
                (
                    p.credential_id.as_str(),
                    p.credential_text(),
                    p.credential_weight,
                    p.credential_count,
                )
            })
            .collect();
        assert_eq!(keys, [("east", "k1", 3, 2), ("west", "k2", 1, 2)]);
        assert_eq!(
            c.provider("a").map(|p| p.attempt_name().into_owned()),
            Some("a#east".into())
        );
        let m = &c.models[0];
        assert_eq!(m.strategy, Strategy::FewestInFlight);
        let e: Vec<(u32, u32)> = m.endpoints.iter().map(|e| (e.weight, e.priority)).collect();
        assert_eq!(e, [(2, 0), (1, 1)], "the list's position is the default priority");
        assert_eq!((c.health.failures, c.health.cooldown_ms), (5, 400_000));
        assert_eq!(c.health.max_cooldown_ms, 400_000, "the cap is at least the cooldown");

        let json = br#"{"providers":[
            {"id":"a","api":"openai","cluster":"c","authority":"h","api_key":"k","credentials":[{"id":"x","api_key":"k"}]},
            {"id":"b","api":"openai","cluster":"c","authority":"h","credentials":[
                {"id":"x","api_key":"k","weight":0},{"id":"x","api_key":"k"},{"id":"y"}]}],
            "models":[{"id":"m","strategy":"round_robin","endpoints":[{"provider":"b","model":"x","weight":0}]}],
            "health":{"failures":0,"cooldown_ms":10,"max_cooldown_ms":5}}"#;
        let err = Config::parse(json, &no_env).unwrap_err();
        assert!(err.iter().any(|e| e.contains("round_robin")), "{err:?}");
        let json = br#"{"providers":[
            {"id":"a","api":"openai","cluster":"c","authority":"h","api_key":"k","credentials":[{"id":"x","api_key":"k"}]},
            {"id":"b","api":"openai","cluster":"c","authority":"h","credentials":[
                {"id":"x","api_key":"k","weight":0},{"id":"x","api_key":"k"},{"id":"y"}]}],
            "models":[{"id":"m","endpoints":[{"provider":"b","model":"x","weight":0}]}],
            "health":{"failures":0,"cooldown_ms":10,"max_cooldown_ms":5}}"#;
        let err = Config::parse(json, &no_env).unwrap_err().join("\n");
        for needle in [
            "providers[0] (\"a\"): exactly one of api_key_env, api_key and a non-empty credentials",
            "credentials[0] (\"x\"): weight must be between 1 and 1000000",
            "credentials[1] (\"x\"): duplicate credential id",
            "credentials[2] (\"y\"): exactly one of api_key_env and api_key",
            "endpoints[0]: weight must be between 1 and 1000000",
            "health.failures: must be between 1 and 1000",
            "health.max_cooldown_ms: must be at least cooldown_ms",
        ] {
            assert!(err.contains(needle), "{needle} not in:\n{err}");
        }
    }

    #[test]
    fn limits_are_local_or_global() {
        let c = Config::parse(br#"{"limits": "global"}"#, &no_env).unwrap();
        assert_eq!(c.limits, Limits::Global);
        let err = Config::parse(br#"{"limits": "redis"}"#, &no_env).unwrap_err();
        assert!(err[0].contains("unknown variant `redis`"), "{err:?}");
    }

    #[test]
    fn doubles_from_an_istio_struct_are_accepted() {
        let c = Config::parse(br#"{"max_request_bytes": 1024.0, "max_provider_tries": 2.0}"#, &no_env).unwrap();
        assert_eq!(c.max_request_bytes, 1024);
        assert_eq!(c.max_provider_tries, 2);
        assert!(Config::parse(br#"{"max_request_bytes": 1.5}"#, &no_env).is_err());
    }

    #[test]
    fn unknown_fields_are_refused() {
        let err = Config::parse(br#"{"max_tries": 3}"#, &no_env).unwrap_err();
        assert!(err[0].contains("unknown field `max_tries`"), "{err:?}");
        let err = Config::parse(
            br#"{"providers":[{"id":"a","api":"openai","cluster":"c","authority":"h","api_key":"k","colour":"red"}]}"#,
            &no_env,
        )
        .unwrap_err();
        assert!(err[0].contains("colour"), "{err:?}");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let json = br#"{"base_path":"api/","providers":[
            {"id":"a","api":"openai","cluster":"c","authority":"h","api_key":"k"},
            {"id":"a","api":"openai","cluster":"","authority":"h"}],
            "models":[{"id":"x/y","endpoints":[{"provider":"nope","model":"m"}]}],
            "keys":[{"id":"k","sha256":"ABC"}]}"#;
        let err = Config::parse(json, &no_env).unwrap_err();
        let all = err.join("\n");
        for needle in [
            "base_path",
            "duplicate provider id",
            "cluster must not be empty",
            "exactly one of api_key_env",
            "unknown provider \"nope\"",
            "64 lowercase hex",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in {all}");
        }
        assert_eq!(err.len(), 6, "{all}");
    }

    #[test]
    fn a_repeated_id_or_digest_is_named_at_its_repetition() {
        let digest = |c: char| c.to_string().repeat(64);
        let json = format!(
            r#"{{"keys":[{{"id":"a","sha256":"{}"}},{{"id":"b","sha256":"{}"}},
                {{"id":"a","sha256":"{}"}},{{"id":"c","sha256":"{}"}},{{"id":"a","sha256":"{}"}}]}}"#,
            digest('1'),
            digest('2'),
            digest('3'),
            digest('1'),
            digest('4')
        );
        let mut err = Config::parse(json.as_bytes(), &no_env).unwrap_err();
        err.sort();
        assert_eq!(
            err,
            [
                r#"keys[2] ("a"): duplicate key id"#,
                r#"keys[3] ("c"): duplicate sha256"#,
                r#"keys[4] ("a"): duplicate key id"#,
            ]
        );
        let keys: Vec<Rc<Key>> = Vec::new();
        assert!(Keys::new(keys).find(&[1; 32]).is_none(), "no keys: nothing is found");

        let json = br#"{"providers":[
            {"id":"a","api":"openai","cluster":"c","authority":"h","api_key":"k"},
            {"id":"b","api":"openai","cluster":"c","authority":"h","api_key":"k"},
            {"id":"a","api":"openai","cluster":"c","authority":"h","api_key":"k"}],
            "models":[{"id":"x/y","endpoints":[{"provider":"a","model":"m"}]},
                      {"id":"x/y","endpoints":[{"provider":"b","model":"m"}]}]}"#;
        let mut err = Config::parse(json, &no_env).unwrap_err();
        err.sort();
        assert_eq!(
            err,
            [
                r#"models[1] ("x/y"): duplicate model id"#,
                r#"providers[2] ("a"): duplicate provider id"#
            ]
        );
    }

    #[test]
    fn an_unknown_api_is_refused() {
        let err = Config::parse(
            br#"{"providers":[{"id":"a","api":"cohere","cluster":"c","authority":"h","api_key":"k"}]}"#,
            &no_env,
        )
        .unwrap_err();
        assert!(err[0].contains("cohere"), "{err:?}");
    }
}
