//! Router-driven fallback (`"fallback": "router"`): the attempts one request
//! may make, prepared by the downstream filter once the body is read, and
//! what each router attempt's upstream filter applies and reports back.
//!
//! Envoy's router makes the attempts (cluster by cluster, following the slot
//! headers the downstream filter writes); the same VM's upstream filter
//! context of attempt `n` takes prepared attempt `n` from here, and records
//! its outcome, which the downstream filter reads when the final answer
//! arrives. Envoy shares the request header map between attempts, so every
//! attempt first removes the headers any other attempt would set.
//!
//! Every attempt is translated up front, not when the router starts it:
//! whether a candidate's API can express the request at all must be known
//! before its cluster is published as a slot, since an upstream filter
//! cannot pass an attempt on to the next cluster (its local reply goes to
//! the client and is never retried).

use std::rc::Rc;

use crate::config::Provider;
use crate::errors::Header;
use crate::record::{Outcome, Tried};

/// Followed by `n`: the filter state naming attempt `n`'s cluster
/// (`wasm.waygate_slot_<n>` in the route's matcher).
pub const SLOT_PROPERTY: &str = "waygate_slot_";

/// One candidate's request, translated for its provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    /// Its provider, whose cluster the router sends this attempt to.
    pub provider: Rc<Provider>,
    /// The model the provider is asked for.
    pub model: String,
    /// Headers this attempt sets (pseudo-headers, content type and length,
    /// the provider's credential).
    pub set: Vec<Header>,
    pub body: Vec<u8>,
}

/// The edits one attempt applies to the (shared) request, borrowed from
/// its prepared request: a body is never copied per attempt.
#[derive(Debug, PartialEq, Eq)]
pub struct Edits<'a> {
    /// The cluster the attempt must run in.
    pub cluster: &'a str,
    /// Applied first.
    pub remove: Vec<String>,
    /// Applied after `remove`; each replaces any existing value.
    pub set: &'a [Header],
    pub body: &'a [u8],
}

/// A request's prepared attempts and the outcome of each one started.
#[derive(Debug, Default)]
pub struct Attempts {
    prepared: Vec<Prepared>,
    /// Removed before each attempt's own headers are set: what any attempt
    /// sets, and the headers the client's key came in.
    cleared: Vec<String>,
    /// Per started attempt, in order: what it was and how it ended (failed
    /// until a response arrives: connect failures, resets and timeouts never
    /// reach the upstream filter's response callback).
    outcomes: Vec<Tried>,
    /// The router's number of each entry of `outcomes`.
    started: Vec<usize>,
}

impl Attempts {
    /// `client_headers`: request headers to clear before any attempt
    /// (the client's key, hop-by-hop headers).
    pub fn new(prepared: Vec<Prepared>, client_headers: &[String]) -> Attempts {
        let mut cleared: Vec<String> = Vec::new();
        let names = client_headers
            .iter()
            .map(String::as_str)
            .chain(prepared.iter().flat_map(|p| p.set.iter().map(|(k, _)| k.as_str())));
        for name in names {
            if !name.starts_with(':') && !cleared.iter().any(|c| c == name) {
                cleared.push(name.to_string());
            }
        }
        Attempts {
            prepared,
            cleared,
            outcomes: Vec::new(),
            started: Vec::new(),
        }
    }

    /// The clusters of the attempts, in order: slot `n` (1-based) is attempt `n`.
    pub fn clusters(&self) -> impl Iterator<Item = &str> {
        self.prepared.iter().map(|p| p.provider.cluster.as_str())
    }

    pub fn len(&self) -> usize {
        self.prepared.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prepared.is_empty()
    }

    /// The provider of attempt `n` (1-based).
    pub fn provider(&self, n: usize) -> Option<&Rc<Provider>> {
        self.prepared.get(n.checked_sub(1)?).map(|p| &p.provider)
    }

    /// Router attempt `n` (1-based, Envoy's `x-envoy-attempt-count`) starts:
    /// its edits, and it counts as failed until [`Attempts::on_response`].
    /// `None` when the router makes more attempts than were prepared.
    pub fn start(&mut self, n: usize) -> Option<Edits<'_>> {
        let prepared = self.prepared.get(n.checked_sub(1)?)?;
        if !self.started.contains(&n) {
            self.started.push(n);
            self.outcomes.push(Tried {
                provider: Rc::clone(&prepared.provider),
                model: prepared.model.clone(),
                outcome: Outcome::Failed,
                retry_after_ms: None,
            });
        }
        let remove = self
            .cleared
            .iter()
            .filter(|c| !prepared.set.iter().any(|(k, _)| k == *c))
            .cloned()
            .collect();
        Some(Edits {
            cluster: &prepared.provider.cluster,
            remove,
            set: &prepared.set,
            body: &prepared.body,
        })
    }

    /// Attempt `n` got response headers with `status` (and `retry_after_ms`,
    /// [`crate::health::retry_after_ms`]).
    pub fn on_response(&mut self, n: usize, status: u16, retry_after_ms: Option<u64>) {
        let at = self.started.iter().position(|s| *s == n);
        if let Some(tried) = at.and_then(|i| self.outcomes.get_mut(i)) {
            tried.outcome = Outcome::Status(status);
            tried.retry_after_ms = retry_after_ms;
        }
    }

    /// Every attempt started so far, in order.
    pub fn outcomes(&self) -> &[Tried] {
        &self.outcomes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(cluster: &str, credential: (&str, &str)) -> Prepared {
        Prepared {
            provider: Rc::new(Provider {
                id: format!("{cluster}-provider"),
                api: crate::config::Api::Openai,
                cluster: cluster.into(),
                authority: format!("{cluster}.example"),
                path_prefix: String::new(),
                credential: Some(crate::redact::Secret::new(credential.1)),
                credential_source: "api_key".into(),
                credential_id: "0".into(),
                credential_weight: 1,
                credential_count: 1,
                legacy_completions: false,
                responses: false,
                timeout_ms: 1000,
                default_max_tokens: 1024,
            }),
            model: "m".into(),
            set: vec![
                (":path".into(), format!("/{cluster}")),
                (credential.0.into(), credential.1.into()),
            ],
            body: format!("body {cluster}").into_bytes(),
        }
    }

    #[test]
    fn each_attempt_clears_what_the_others_set_and_sets_its_own() {
        let mut a = Attempts::new(
            vec![
                prepared("openai", ("authorization", "Bearer sk")),
                prepared("anthropic", ("x-api-key", "ak")),
            ],
            &["authorization".into(), "api-key".into()],
        );
        assert_eq!(a.clusters().collect::<Vec<_>>(), ["openai", "anthropic"]);
        let first = a.start(1).unwrap();
        assert_eq!(first.remove, ["api-key", "x-api-key"]);
        assert_eq!(first.set[1], ("authorization".into(), "Bearer sk".into()));
        assert_eq!(first.body, b"body openai");
        assert_eq!(first.cluster, "openai");
        let second = a.start(2).unwrap();
        assert_eq!(second.remove, ["authorization", "api-key"]);
        assert_eq!(second.set[1], ("x-api-key".into(), "ak".into()));
        assert!(a.start(3).is_none(), "no third attempt was prepared");
        assert!(a.start(0).is_none());
    }

    #[test]
    fn outcomes_are_errors_until_a_response_arrives() {
        let mut a = Attempts::new(
            vec![
                prepared("a", ("authorization", "x")),
                prepared("b", ("authorization", "y")),
                prepared("c", ("authorization", "z")),
            ],
            &[],
        );
        a.start(1);
        a.on_response(1, 503, Some(2000));
        a.start(2);
        a.start(3);
        a.on_response(3, 200, None);
        let outcomes: Vec<(&str, Outcome, Option<u64>)> = a
            .outcomes()
            .iter()
            .map(|t| (t.provider.cluster.as_str(), t.outcome, t.retry_after_ms))
            .collect();
        assert_eq!(
            outcomes,
            [
                ("a", Outcome::Status(503), Some(2000)),
                ("b", Outcome::Failed, None),
                ("c", Outcome::Status(200), None)
            ]
        );
        assert_eq!(a.provider(2).map(|p| p.cluster.as_str()), Some("b"));
        assert!(a.provider(4).is_none());
    }
}
