//! What the access log, the stats and the published filter state say of one
//! request (contract §3 and "Observability"): gathered by the exchange as
//! the request goes, read at its end.

use std::rc::Rc;

use crate::config::{Key, Provider};
use crate::health::Ticket;
use crate::limits::Standing;
use crate::metrics;
use crate::redact;
use crate::usage::Usage;

/// The filter state `wasm.waygate_total_tokens`: the answer's prompt plus
/// completion tokens, what a token budget of Envoy's rate limit filter is charged.
pub const TOTAL_TOKENS_PROPERTY: &str = "waygate_total_tokens";

/// How one attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The provider answered with this status.
    Status(u16),
    /// Envoy's own failure before the answer's first byte: a connect
    /// failure, a reset or a timeout.
    Failed,
    /// A stream Envoy cut after its first byte (a reset, a timeout).
    Cut,
}

impl Outcome {
    /// As the access log and `x-waygate-attempts` give it: the status, or
    /// `error` for every failure of Envoy's.
    pub fn text(self) -> String {
        match self {
            Outcome::Status(status) => status.to_string(),
            Outcome::Failed | Outcome::Cut => "error".into(),
        }
    }
}

/// One attempt: the provider, the model it was asked for, how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tried {
    pub provider: Rc<Provider>,
    pub model: String,
    pub outcome: Outcome,
    /// A `retry-after` of whole seconds the answer carried, in milliseconds.
    pub retry_after_ms: Option<u64>,
}

/// What is known of the request so far. Every `None` is a request that
/// ended before the fact was known.
#[derive(Default)]
pub struct Record {
    pub key: Option<Rc<Key>>,
    pub title: Option<String>,
    pub referer: Option<String>,
    pub model: Option<String>,
    /// Every attempt made, in order.
    pub attempts: Vec<Tried>,
    /// What planning read of the providers' health and claimed.
    pub health: Ticket,
    /// The endpoint this request counts against while in flight
    /// (`fewest_in_flight`), given back at its end.
    pub inflight: Option<Rc<str>>,
    pub status: u16,
    /// The contract code of the error answered, if any.
    pub error_code: Option<String>,
    pub usage: Option<Usage>,
    /// The key's limits and use, when it has limits.
    pub standing: Option<Standing>,
}

impl Record {
    /// What the stats count of the request; `provider`: the one that served.
    pub fn summary<'a>(&'a self, provider: Option<&'a str>) -> metrics::Summary<'a> {
        metrics::Summary {
            key: self.key.as_ref().map(|k| k.id.as_str()),
            model: self.model.as_deref(),
            provider,
            attempts: self
                .attempts
                .iter()
                .map(|t| (t.provider.id.as_str(), t.outcome))
                .collect(),
            status: self.status,
            error_code: self.error_code.as_deref(),
            usage: self.usage,
        }
    }

    /// The access log line (contract §3: never a credential or a body).
    pub fn access_line(&self, provider: Option<&str>, duration_ms: u64) -> String {
        use std::fmt::Write;
        let attempts = self.attempt_list();
        let usage = self.usage.unwrap_or_default();
        // Built piece by piece: one line per request, and `format!` with ten
        // arguments costs more than the rest of the log phase in wasm.
        let model = self.model.as_deref().map_or("-".into(), redact::log_field);
        let mut line = String::with_capacity(256);
        for (name, value) in [
            ("waygate access key=", self.key.as_ref().map_or("-", |k| k.id.as_str())),
            (" model=", &model),
            (" provider=", provider.unwrap_or("-")),
            (" attempts=", if attempts.is_empty() { "-" } else { &attempts }),
        ] {
            line.push_str(name);
            line.push_str(value);
        }
        for (name, value) in [
            (" status=", u64::from(self.status)),
            (" prompt_tokens=", usage.prompt_tokens),
            (" completion_tokens=", usage.completion_tokens),
            (" duration_ms=", duration_ms),
        ] {
            line.push_str(name);
            line.push_str(&value.to_string());
        }
        // Client-supplied text, quoted and escaped as Rust's Debug does.
        let _ = write!(
            line,
            " title={:?} referer={:?}",
            self.title.as_deref().unwrap_or(""),
            self.referer.as_deref().unwrap_or("")
        );
        line
    }

    /// `provider:outcome` for every attempt, comma-separated (the access
    /// line, `x-waygate-attempts`), after `provider:open` for every candidate
    /// passed over for an open circuit and not tried after all.
    pub fn attempt_list(&self) -> String {
        let mut list = String::new();
        let passed_over = (self.health.deferred.iter())
            .filter(|d| {
                !self
                    .attempts
                    .iter()
                    .any(|t| Rc::ptr_eq(&t.provider, &d.provider) && t.model == d.model)
            })
            .map(|d| (&d.provider, "open".to_string()));
        let tried = self.attempts.iter().map(|t| (&t.provider, t.outcome.text()));
        for (provider, outcome) in passed_over.chain(tried) {
            if !list.is_empty() {
                list.push(',');
            }
            list.push_str(&provider.attempt_name());
            list.push(':');
            list.push_str(&outcome);
        }
        list
    }

    /// `openai: 503, groq: connect failure, reset or timeout`, for error
    /// messages.
    pub fn attempt_summary(&self) -> String {
        let list: Vec<String> = self
            .attempts
            .iter()
            .map(|t| {
                // `error` is every failure of Envoy's: its timeouts too.
                let outcome = match t.outcome {
                    Outcome::Status(status) => status.to_string(),
                    Outcome::Failed | Outcome::Cut => "connect failure, reset or timeout".into(),
                };
                format!("{}: {outcome}", t.provider.attempt_name())
            })
            .collect();
        list.join(", ")
    }

    /// The filter state that tells Envoy's access log and rate limit filter
    /// what the answer spent (contract "Observability"), to publish once the
    /// answer is known (before a stream's end: the rate limit filter charges
    /// it then); `provider`: the one that served. An answer without usage (an
    /// error, a refusal) spent no tokens: the total reads 0 rather than
    /// nothing, which the rate limit filter would skip with a warning.
    pub fn usage_properties(&self, provider: Option<&str>) -> Vec<(&'static str, String)> {
        let Some(usage) = self.usage else {
            return vec![(TOTAL_TOKENS_PROPERTY, "0".into())];
        };
        vec![
            ("waygate_prompt_tokens", usage.prompt_tokens.to_string()),
            ("waygate_completion_tokens", usage.completion_tokens.to_string()),
            (TOTAL_TOKENS_PROPERTY, usage.total().to_string()),
            ("waygate_provider", provider.unwrap_or("-").to_string()),
        ]
    }
}
