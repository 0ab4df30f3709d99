//! Per-key request and token limits (contract §8), held across every Envoy
//! worker VM in proxy-wasm shared data.
//!
//! Each limited key has one entry, `waygate/limits/<key id>`, holding its
//! current fixed one-minute window as `"<minute> <requests> <tokens>"`; a
//! new minute overwrites the old one in place (shared data has no delete, so
//! an entry per window would grow without end). Updates are
//! compare-and-swap: a lost race re-reads and tries again, so no count is
//! lost however many workers admit at once.
//!
//! Envoy ignores the cas when a key is absent, so two first writers would
//! both win and one count would vanish. [`prepare`] therefore creates every
//! entry at `on_configure`, before the VM serves; from then on every write is
//! guarded. The store is a trait so the logic runs natively in tests; the
//! shell backs it with shared data.
//!
//! With `"limits": "global"` none of that runs: Envoy's global rate limit
//! filter, after this one, asks a rate limit service, and [`envoy_refusal`]
//! gives its refusals the contract's shape.

use crate::config::{Key, Keys};
use crate::errors::{ApiError, ErrorType, Header};

/// Shared data as proxy-wasm offers it.
pub trait SharedStore {
    /// The value and its CAS token; `None` when the key was never set.
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)>;
    /// Writes if `cas` still matches (0: unconditionally). `Err` on mismatch
    /// or any other refusal.
    fn set(&mut self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError>;
}

/// Why a shared-data write failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    CasMismatch,
    Other,
}

/// How many times one update retries after losing a race.
const MAX_CAS_RETRIES: usize = 64;

/// Counts in one window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    pub requests: u64,
    pub tokens: u64,
}

/// A key's stored window: which minute it counts, and the counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Stored {
    minute: u64,
    counts: Window,
}

impl Stored {
    fn parse(raw: &[u8]) -> Stored {
        let text = std::str::from_utf8(raw).unwrap_or("");
        let mut parts = text.split(' ').map(|p| p.parse::<u64>().unwrap_or(0));
        Stored {
            minute: parts.next().unwrap_or(0),
            counts: Window {
                requests: parts.next().unwrap_or(0),
                tokens: parts.next().unwrap_or(0),
            },
        }
    }

    fn encode(self) -> Vec<u8> {
        format!("{} {} {}", self.minute, self.counts.requests, self.counts.tokens).into_bytes()
    }

    /// The window in force at `now`: the stored one while its minute lasts,
    /// else a fresh one. A worker whose clock reads a little behind one that
    /// already moved on counts into the newer window rather than resetting it.
    fn at(self, now: u64) -> Stored {
        let minute = now / 60;
        if self.minute >= minute {
            self
        } else {
            Stored {
                minute,
                counts: Window::default(),
            }
        }
    }
}

/// Reads a key's entry: the stored window and its cas, or a zero window and
/// cas 0 when the entry is missing (only if [`prepare`] could not write it).
fn load(store: &dyn SharedStore, slot: &str) -> (Stored, u32) {
    match store.get(slot) {
        Some((raw, cas)) => (Stored::parse(&raw), cas),
        None => (Stored::default(), 0),
    }
}

/// What a limited key's answers say about its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
    pub used: Window,
}

impl Standing {
    /// OpenAI-style `x-ratelimit-*` headers.
    pub fn headers(&self) -> Vec<Header> {
        let mut h = Vec::new();
        if let Some(rpm) = self.rpm {
            h.push(("x-ratelimit-limit-requests".into(), rpm.to_string()));
            h.push((
                "x-ratelimit-remaining-requests".into(),
                rpm.saturating_sub(self.used.requests).to_string(),
            ));
        }
        if let Some(tpm) = self.tpm {
            h.push(("x-ratelimit-limit-tokens".into(), tpm.to_string()));
            h.push((
                "x-ratelimit-remaining-tokens".into(),
                tpm.saturating_sub(self.used.tokens).to_string(),
            ));
        }
        h
    }
}

fn slot(key: &Key) -> String {
    format!("waygate/limits/{}", key.id)
}

fn is_limited(key: &Key) -> bool {
    key.requests_per_minute.is_some() || key.tokens_per_minute.is_some()
}

/// Creates the entry of every limited key that has none yet. Called from
/// `on_configure`, so the only unguarded write happens before this VM
/// serves; an entry left by an earlier configuration (same `vm_id`) keeps
/// its counts.
pub fn prepare(store: &mut dyn SharedStore, keys: &Keys) {
    for key in keys.iter().filter(|k| is_limited(k)) {
        let slot = slot(key);
        if store.get(&slot).is_none() && store.set(&slot, &Stored::default().encode(), 0).is_err() {
            log::warn!("cannot create the rate-limit entry of key {}", key.id);
        }
    }
}

/// Seconds until the current window ends: 1–60.
fn retry_after(now: u64) -> u64 {
    60 - now % 60
}

/// The contract's answer for a reply made by Envoy's global rate limit
/// filter, known by its `response.code_details`: `request_rate_limited` (an
/// over-limit key: 429 `rate_limited`, `retry-after` from the filter's
/// `x-ratelimit-reset` when it sends one, else the whole window) or
/// `rate_limiter_error` (the service unreachable with `failure_mode_deny`).
/// `None` for anything else.
pub fn envoy_refusal(code_details: &str, reset: Option<&[u8]>) -> Option<ApiError> {
    match code_details {
        "request_rate_limited" => {
            let seconds = reset
                .and_then(|v| std::str::from_utf8(v).ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map_or(60, |s| s.clamp(1, 60));
            let mut e = ApiError::new(
                429,
                ErrorType::RateLimit,
                "rate_limited",
                "Rate limit reached on this key; retry after the window resets.",
            );
            e.retry_after = Some(seconds.to_string());
            Some(e)
        }
        "rate_limiter_error" => Some(ApiError::new(
            500,
            ErrorType::Upstream,
            "rate_limit_unavailable",
            "The rate limit service could not be reached, and this gateway refuses what it cannot count.",
        )),
        _ => None,
    }
}

/// Admits one request for `key` at unix time `now`, counting it. A key
/// without limits is always admitted and counts nothing.
pub fn admit(store: &mut dyn SharedStore, key: &Key, now: u64) -> Result<Option<Standing>, ApiError> {
    if !is_limited(key) {
        return Ok(None);
    }
    let slot = slot(key);
    for _ in 0..MAX_CAS_RETRIES {
        let (stored, cas) = load(store, &slot);
        let window = stored.at(now);
        let current = window.counts;
        let standing = Standing {
            rpm: key.requests_per_minute,
            tpm: key.tokens_per_minute,
            used: current,
        };
        let over_requests = key.requests_per_minute.is_some_and(|rpm| current.requests >= rpm);
        let over_tokens = key.tokens_per_minute.is_some_and(|tpm| current.tokens >= tpm);
        if over_requests || over_tokens {
            let what = if over_requests { "requests" } else { "tokens" };
            let mut e = ApiError::new(
                429,
                ErrorType::RateLimit,
                "rate_limited",
                format!("Rate limit reached for {what} per minute on this key; retry after the window resets."),
            );
            e.retry_after = Some(retry_after(now).to_string());
            e.extra_headers = standing.headers();
            return Err(e);
        }
        let next = Window {
            requests: current.requests + 1,
            ..current
        };
        let written = Stored { counts: next, ..window };
        match store.set(&slot, &written.encode(), cas) {
            Ok(()) => return Ok(Some(Standing { used: next, ..standing })),
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other) => break,
        }
    }
    // Shared data refused: fail open for this one request rather than
    // refusing traffic because of the store; the log says so.
    log::warn!("rate-limit store unavailable for key {}; request admitted", key.id);
    Ok(None)
}

/// Adds an answer's tokens to the key's window (a stream already running
/// finishes; the next request sees the spent window).
pub fn record_tokens(store: &mut dyn SharedStore, key: &Key, now: u64, tokens: u64) {
    if key.tokens_per_minute.is_none() || tokens == 0 {
        return;
    }
    let slot = slot(key);
    for _ in 0..MAX_CAS_RETRIES {
        let (stored, cas) = load(store, &slot);
        let mut next = stored.at(now);
        next.counts.tokens = next.counts.tokens.saturating_add(tokens);
        match store.set(&slot, &next.encode(), cas) {
            Ok(()) => return,
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other) => break,
        }
    }
    log::warn!("could not record {tokens} tokens for key {}", key.id);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::rc::Rc;

    /// An in-memory store with Envoy's CAS rules (absent key: any cas wins;
    /// every write gets a fresh non-zero cas).
    #[derive(Default)]
    pub struct MemoryStore {
        pub values: HashMap<String, (Vec<u8>, u32)>,
        next_cas: u32,
        /// Writes to fail with a mismatch before succeeding, to model races.
        pub conflicts: usize,
        /// Refuses (as a test failure) any write that Envoy would not guard:
        /// cas 0, or a key that does not exist yet.
        pub guarded_only: bool,
    }

    impl SharedStore for MemoryStore {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.values.get(key).cloned()
        }
        fn set(&mut self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
            assert!(
                !self.guarded_only || (cas != 0 && self.values.contains_key(key)),
                "unguarded write to {key} with cas {cas}"
            );
            if self.conflicts > 0 {
                self.conflicts -= 1;
                // Someone else wrote in between.
                self.next_cas += 1;
                if let Some(entry) = self.values.get_mut(key) {
                    entry.1 = self.next_cas;
                }
                return Err(StoreError::CasMismatch);
            }
            if let Some((_, current)) = self.values.get(key)
                && cas != 0
                && cas != *current
            {
                return Err(StoreError::CasMismatch);
            }
            self.next_cas += 1;
            self.values.insert(key.to_string(), (value.to_vec(), self.next_cas));
            Ok(())
        }
    }

    fn key(rpm: Option<u64>, tpm: Option<u64>) -> Rc<Key> {
        Rc::new(Key {
            id: "team".into(),
            sha256: [0; 32],
            models: None,
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
        })
    }

    #[test]
    fn envoy_rate_limit_refusals_get_the_contract_shape() {
        let e = envoy_refusal("request_rate_limited", Some(b"17")).unwrap();
        assert_eq!(
            (e.status, e.code.as_str(), e.retry_after.as_deref()),
            (429, "rate_limited", Some("17"))
        );
        assert_eq!(e.kind, ErrorType::RateLimit);
        // No header, one that is not a number, or past the window: the window.
        for reset in [None, Some(&b"soon"[..]), Some(b"3600")] {
            let e = envoy_refusal("request_rate_limited", reset).unwrap();
            assert_eq!(e.retry_after.as_deref(), Some("60"), "{reset:?}");
        }
        assert_eq!(
            envoy_refusal("request_rate_limited", Some(b"0"))
                .unwrap()
                .retry_after
                .as_deref(),
            Some("1")
        );
        let e = envoy_refusal("rate_limiter_error", None).unwrap();
        assert_eq!((e.status, e.code.as_str()), (500, "rate_limit_unavailable"));
        for other in [
            "via_upstream",
            "upstream_reset_before_response_started{connection_failure}",
            "",
        ] {
            assert!(envoy_refusal(other, None).is_none(), "{other}");
        }
    }

    #[test]
    fn requests_are_admitted_up_to_the_limit_then_refused_with_retry_after() {
        let mut store = MemoryStore::default();
        let k = key(Some(3), None);
        let now = 1_700_000_010;
        for i in 1..=3 {
            let s = admit(&mut store, &k, now).unwrap().unwrap();
            assert_eq!(s.used.requests, i);
        }
        let e = admit(&mut store, &k, now).unwrap_err();
        assert_eq!((e.status, e.code.as_str()), (429, "rate_limited"));
        assert_eq!(
            e.retry_after.as_deref(),
            Some("30"),
            "1_700_000_010 is 30 s into its minute"
        );
        assert!(
            e.extra_headers
                .contains(&("x-ratelimit-remaining-requests".into(), "0".into()))
        );
        // The next window starts afresh.
        assert!(admit(&mut store, &k, now + 60).is_ok());
    }

    #[test]
    fn lost_races_retry_and_never_lose_a_count() {
        let mut store = MemoryStore {
            conflicts: 5,
            ..Default::default()
        };
        let k = key(Some(100), None);
        admit(&mut store, &k, 0).unwrap();
        admit(&mut store, &k, 0).unwrap();
        store.conflicts = 7;
        admit(&mut store, &k, 0).unwrap();
        let (raw, _) = store.get(&slot(&k)).unwrap();
        assert_eq!(Stored::parse(&raw).counts.requests, 3);
    }

    #[test]
    fn tokens_trip_the_limit_after_earlier_answers() {
        let mut store = MemoryStore::default();
        let k = key(None, Some(100));
        admit(&mut store, &k, 5).unwrap();
        record_tokens(&mut store, &k, 5, 60);
        admit(&mut store, &k, 5).unwrap();
        record_tokens(&mut store, &k, 5, 60);
        let e = admit(&mut store, &k, 5).unwrap_err();
        assert!(e.message.contains("tokens"), "{}", e.message);
        assert!(
            e.extra_headers
                .contains(&("x-ratelimit-remaining-tokens".into(), "0".into()))
        );
    }

    #[test]
    fn after_prepare_every_write_is_guarded_by_the_entrys_cas() {
        // Envoy ignores the cas of a write to an absent key, so a cas-0 or
        // first write could silently overwrite another worker's count.
        let mut store = MemoryStore::default();
        let k = key(Some(10), Some(1000));
        prepare(&mut store, &Keys::new(vec![Rc::clone(&k)]));
        let (_, created) = store.get(&slot(&k)).unwrap();
        store.guarded_only = true;
        admit(&mut store, &k, 61).unwrap();
        record_tokens(&mut store, &k, 61, 7);
        admit(&mut store, &k, 125).unwrap();
        assert!(store.values.len() == 1 && store.get(&slot(&k)).unwrap().1 > created);
    }

    #[test]
    fn a_new_minute_reuses_the_one_entry_and_starts_from_zero() {
        let mut store = MemoryStore::default();
        let k = key(Some(2), Some(100));
        prepare(&mut store, &Keys::new(vec![Rc::clone(&k)]));
        for minute in 0..5u64 {
            let now = 1_700_000_000 + minute * 60;
            assert_eq!(admit(&mut store, &k, now).unwrap().unwrap().used.requests, 1);
            record_tokens(&mut store, &k, now, 40);
            let s = admit(&mut store, &k, now).unwrap().unwrap();
            assert_eq!((s.used.requests, s.used.tokens), (2, 40));
            assert!(admit(&mut store, &k, now).is_err());
        }
        assert_eq!(store.values.len(), 1, "shared data has no delete; one entry per key");
    }

    #[test]
    fn a_clock_a_little_behind_counts_into_the_newer_window() {
        let mut store = MemoryStore::default();
        let k = key(Some(2), None);
        admit(&mut store, &k, 120).unwrap();
        let s = admit(&mut store, &k, 119).unwrap().unwrap();
        assert_eq!(s.used.requests, 2, "the worker at 119 s did not reset minute 2");
        assert!(admit(&mut store, &k, 120).is_err());
    }

    #[test]
    fn prepare_keeps_the_counts_of_an_earlier_configuration() {
        let mut store = MemoryStore::default();
        let k = key(Some(5), None);
        prepare(&mut store, &Keys::new(vec![Rc::clone(&k)]));
        admit(&mut store, &k, 30).unwrap();
        prepare(&mut store, &Keys::new(vec![Rc::clone(&k), key(None, None)]));
        assert_eq!(store.values.len(), 1, "an unlimited key gets no entry");
        assert_eq!(admit(&mut store, &k, 30).unwrap().unwrap().used.requests, 2);
    }

    #[test]
    fn unlimited_keys_touch_nothing() {
        let mut store = MemoryStore::default();
        assert_eq!(admit(&mut store, &key(None, None), 0).unwrap(), None);
        record_tokens(&mut store, &key(None, None), 0, 10);
        assert!(store.values.is_empty());
    }
}
