//! What each request adds to the filter's Envoy stats.
//!
//! Proxy-wasm metrics have no labels, so dimensions are part of the name,
//! dot-separated as Envoy stats are (`waygate.requests.openai.2xx`). Envoy
//! prefixes them with `wasmcustom.` internally and strips that prefix in
//! `/stats` and Prometheus output, where dots become underscores:
//! `waygate_requests_openai_2xx`. Label values are reduced to
//! `[A-Za-z0-9_-]` so a model id cannot add a level.
//!
//! Two dimensions take values from outside the configuration: the model a
//! client names (any `<provider>/<model>` is routed) and a provider's error
//! code. Envoy keeps every stat it is asked to define until it restarts, so
//! [`OpenLabels`] bounds them per VM.
//!
//! Names follow the OpenTelemetry gen_ai conventions where they fit
//! (`token.usage` split into prompt and completion, `server.request.duration`
//! and `time_to_first_token` as histograms in milliseconds).

use std::borrow::Cow;

use crate::health::{Change, Scope, Ticket};
use crate::record::Outcome;
use crate::usage::Usage;

/// A stat kind, as the ABI numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Counter,
    /// Set to the value (a circuit's state).
    Gauge,
    Histogram,
}

/// One change to one stat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    pub kind: Kind,
    pub name: String,
    /// Counter increment (> 0), gauge value or histogram sample.
    pub value: u64,
}

/// What the exchange knows about a finished request.
#[derive(Debug, Clone, Default)]
pub struct Summary<'a> {
    pub key: Option<&'a str>,
    pub model: Option<&'a str>,
    pub provider: Option<&'a str>,
    /// Every attempt: provider id and outcome.
    pub attempts: Vec<(&'a str, Outcome)>,
    pub status: u16,
    pub error_code: Option<&'a str>,
    pub usage: Option<Usage>,
}

/// Times measured by the shell, in milliseconds since the request arrived.
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    pub upstream_ms: Option<u64>,
    pub first_byte_ms: Option<u64>,
}

/// Reduces a label value to characters that keep the stat name flat.
/// Borrowed when already clean: it runs for every stat of every request.
pub fn label(value: &str) -> Cow<'_, str> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b == b'-' || b == b'_';
    if value.is_empty() {
        return Cow::Borrowed("none");
    }
    // The usual case (ids and model names) is already clean.
    if value.len() <= 64 && value.bytes().all(allowed) {
        return Cow::Borrowed(value);
    }
    value
        .chars()
        .take(64)
        .map(|c| if c.is_ascii() && allowed(c as u8) { c } else { '_' })
        .collect::<String>()
        .into()
}

/// The values a VM has labelled in the dimensions that come from outside the
/// configuration. The first [`OpenLabels::MAX`] distinct values of each are
/// labelled as they are; any later new one is labelled `other`, so a client
/// naming a new model in every request adds no stats (nor memory, nor series
/// to every scrape) and the totals stay whole.
#[derive(Debug, Default)]
pub struct OpenLabels {
    /// Sorted, for a binary search.
    models: Vec<String>,
    error_codes: Vec<String>,
}

impl OpenLabels {
    pub const MAX: usize = 256;

    fn bounded<'a>(seen: &mut Vec<String>, value: Cow<'a, str>) -> Cow<'a, str> {
        match seen.binary_search_by(|s| s.as_str().cmp(&value)) {
            Ok(_) => value,
            Err(at) if seen.len() < Self::MAX => {
                seen.insert(at, value.to_string());
                value
            }
            Err(_) => Cow::Borrowed("other"),
        }
    }
}

fn counter(name: String, value: u64) -> Update {
    Update {
        kind: Kind::Counter,
        name,
        value,
    }
}

fn histogram(name: String, value: u64) -> Update {
    Update {
        kind: Kind::Histogram,
        name,
        value,
    }
}

/// A stat name from its dot-separated parts. Built by hand: this runs for
/// every request, and `format!` costs more than the stat update in wasm.
fn stat(parts: &[&str]) -> String {
    let len = parts.iter().map(|p| p.len().saturating_add(1)).sum();
    let mut name = String::with_capacity(len);
    for part in parts {
        if !name.is_empty() {
            name.push('.');
        }
        name.push_str(part);
    }
    name
}

/// Every stat change for one finished request. Counters with a zero
/// increment are left out (Envoy refuses them).
pub fn updates(s: &Summary<'_>, t: Timing, open: &mut OpenLabels) -> Vec<Update> {
    let provider = label(s.provider.unwrap_or("none"));
    let provider = provider.as_ref();
    let class = match s.status / 100 {
        0 => "none",
        1 => "1xx",
        2 => "2xx",
        3 => "3xx",
        4 => "4xx",
        _ => "5xx",
    };
    let mut out = Vec::with_capacity(8);
    out.push(counter(stat(&["waygate.requests", provider, class]), 1));
    for (p, outcome) in &s.attempts {
        out.push(counter(stat(&["waygate.attempts", &label(p), &outcome.text()]), 1));
    }
    if s.attempts.len() > 1 {
        out.push(counter(
            stat(&["waygate.fallbacks", provider]),
            (s.attempts.len() - 1) as u64,
        ));
    }
    if let Some(code) = s.error_code {
        let code = OpenLabels::bounded(&mut open.error_codes, label(code));
        out.push(counter(stat(&["waygate.errors", &code]), 1));
    }
    if let Some(u) = s.usage {
        let model = OpenLabels::bounded(&mut open.models, label(s.model.unwrap_or("none")));
        if u.prompt_tokens > 0 {
            out.push(counter(
                stat(&["waygate.tokens.prompt", provider, &model]),
                u.prompt_tokens,
            ));
        }
        if u.completion_tokens > 0 {
            out.push(counter(
                stat(&["waygate.tokens.completion", provider, &model]),
                u.completion_tokens,
            ));
        }
        if let Some(key) = s.key
            && u.total() > 0
        {
            out.push(counter(stat(&["waygate.tokens.key", &label(key)]), u.total()));
        }
    }
    if let Some(ms) = t.upstream_ms {
        out.push(histogram(stat(&["waygate.upstream_duration_ms", provider]), ms));
    }
    if let Some(ms) = t.first_byte_ms {
        out.push(histogram(stat(&["waygate.time_to_first_token_ms", provider]), ms));
    }
    out
}

/// A circuit's `state` gauge: closed.
pub const CIRCUIT_CLOSED: u64 = 0;
/// Open (cooling, or waiting for a probe).
pub const CIRCUIT_OPEN: u64 = 1;
/// A probe is out.
pub const CIRCUIT_PROBING: u64 = 2;

/// The stats of the providers' circuits one request adds, each named
/// `waygate.circuit.<provider>.<scope>[.<credential id or model>].<stat>`:
/// `skips` for each open circuit of a candidate passed over, `probes` for
/// each one this request probed, `opens` for each that opened, and the
/// `state` gauge of each that changed.
pub fn circuit_updates(ticket: &Ticket, changes: &[Change], open: &mut OpenLabels) -> Vec<Update> {
    let mut out = Vec::new();
    let mut name = |provider: &str, scope: Scope, circuit: &str, stat_name: &str| {
        let provider = label(provider);
        match scope {
            Scope::Provider => stat(&["waygate.circuit", &provider, scope.as_str(), stat_name]),
            Scope::Credential => stat(&["waygate.circuit", &provider, scope.as_str(), &label(circuit), stat_name]),
            Scope::Endpoint => {
                let model = OpenLabels::bounded(&mut open.models, label(circuit));
                stat(&["waygate.circuit", &provider, scope.as_str(), &model, stat_name])
            }
        }
    };
    for held in &ticket.deferred {
        for (scope, circuit) in &held.open {
            out.push(counter(name(&held.provider.id, *scope, circuit, "skips"), 1));
        }
    }
    for (held, _) in &ticket.probes {
        for (scope, circuit) in &held.open {
            out.push(counter(name(&held.provider.id, *scope, circuit, "probes"), 1));
            out.push(gauge(
                name(&held.provider.id, *scope, circuit, "state"),
                CIRCUIT_PROBING,
            ));
        }
    }
    for change in changes {
        let p = &change.provider.id;
        if change.opened_for.is_some() {
            out.push(counter(name(p, change.scope, &change.name, "opens"), 1));
        }
        let state = if change.opened_for.is_some() {
            CIRCUIT_OPEN
        } else {
            CIRCUIT_CLOSED
        };
        out.push(gauge(name(p, change.scope, &change.name, "state"), state));
    }
    out
}

fn gauge(name: String, value: u64) -> Update {
    Update {
        kind: Kind::Gauge,
        name,
        value,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_request_counts_requests_attempts_tokens_and_times() {
        let s = Summary {
            key: Some("team-a"),
            model: Some("meta-llama/llama-3.1-70b"),
            provider: Some("groq"),
            attempts: vec![("openai", Outcome::Status(503)), ("groq", Outcome::Status(200))],
            status: 200,
            error_code: None,
            usage: Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 3,
            }),
        };
        let u = updates(
            &s,
            Timing {
                upstream_ms: Some(12),
                first_byte_ms: Some(4),
            },
            &mut OpenLabels::default(),
        );
        let names: Vec<(&str, u64)> = u.iter().map(|u| (u.name.as_str(), u.value)).collect();
        assert_eq!(
            names,
            [
                ("waygate.requests.groq.2xx", 1),
                ("waygate.attempts.openai.503", 1),
                ("waygate.attempts.groq.200", 1),
                ("waygate.fallbacks.groq", 1),
                ("waygate.tokens.prompt.groq.meta-llama_llama-3_1-70b", 7),
                ("waygate.tokens.completion.groq.meta-llama_llama-3_1-70b", 3),
                ("waygate.tokens.key.team-a", 10),
                ("waygate.upstream_duration_ms.groq", 12),
                ("waygate.time_to_first_token_ms.groq", 4),
            ]
        );
    }

    #[test]
    fn a_refused_request_counts_its_error_and_nothing_upstream() {
        let s = Summary {
            status: 401,
            error_code: Some("invalid_api_key"),
            ..Summary::default()
        };
        let names: Vec<String> = updates(&s, Timing::default(), &mut OpenLabels::default())
            .into_iter()
            .map(|u| u.name)
            .collect();
        assert_eq!(names, ["waygate.requests.none.4xx", "waygate.errors.invalid_api_key"]);
    }

    #[test]
    fn models_and_error_codes_past_the_first_256_of_a_vm_count_as_other() {
        let mut open = OpenLabels::default();
        let mut stat_of = |model: &str, code: &str| {
            let s = Summary {
                model: Some(model),
                provider: Some("p"),
                status: 200,
                error_code: Some(code),
                usage: Some(Usage {
                    prompt_tokens: 1,
                    completion_tokens: 0,
                }),
                ..Summary::default()
            };
            let names: Vec<String> = updates(&s, Timing::default(), &mut open)
                .into_iter()
                .map(|u| u.name)
                .collect();
            (names[1].clone(), names[2].clone())
        };
        for i in 0..OpenLabels::MAX {
            let (errors, tokens) = stat_of(&format!("p/m{i}"), &format!("c{i}"));
            assert_eq!(errors, format!("waygate.errors.c{i}"));
            assert_eq!(tokens, format!("waygate.tokens.prompt.p.p_m{i}"));
        }
        let (errors, tokens) = stat_of("p/new", "new");
        assert_eq!(
            (errors.as_str(), tokens.as_str()),
            ("waygate.errors.other", "waygate.tokens.prompt.p.other")
        );
        // A value seen before the bound keeps its own stat.
        let (errors, tokens) = stat_of("p/m7", "c200");
        assert_eq!(
            (errors.as_str(), tokens.as_str()),
            ("waygate.errors.c200", "waygate.tokens.prompt.p.p_m7")
        );
    }
}
