//! Per-key request and token limits (contract §8), held across every Envoy
//! worker VM in proxy-wasm shared data.
//!
//! Each key has one counter per fixed one-minute window, stored as
//! `"<requests> <tokens>"` under `waygate/limits/<key id>/<window>`. Updates
//! are compare-and-swap: a lost race re-reads and tries again, so no count is
//! lost however many workers admit at once. The store is a trait so the
//! logic runs natively in tests; the shell backs it with shared data.

use crate::config::Key;
use crate::errors::{ApiError, ErrorType};
use crate::exchange::Header;

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

impl Window {
    fn parse(raw: &[u8]) -> Window {
        let text = std::str::from_utf8(raw).unwrap_or("");
        let mut parts = text.split(' ').map(|p| p.parse::<u64>().unwrap_or(0));
        Window {
            requests: parts.next().unwrap_or(0),
            tokens: parts.next().unwrap_or(0),
        }
    }

    fn encode(self) -> Vec<u8> {
        format!("{} {}", self.requests, self.tokens).into_bytes()
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

fn slot(key: &Key, now: u64) -> String {
    format!("waygate/limits/{}/{}", key.id, now / 60)
}

/// Seconds until the current window ends: 1–60.
fn retry_after(now: u64) -> u64 {
    60 - now % 60
}

/// Admits one request for `key` at unix time `now`, counting it. A key
/// without limits is always admitted and counts nothing.
pub fn admit(store: &mut dyn SharedStore, key: &Key, now: u64) -> Result<Option<Standing>, ApiError> {
    if key.requests_per_minute.is_none() && key.tokens_per_minute.is_none() {
        return Ok(None);
    }
    let slot = slot(key, now);
    for _ in 0..MAX_CAS_RETRIES {
        let (current, cas) = match store.get(&slot) {
            Some((raw, cas)) => (Window::parse(&raw), cas),
            None => (Window::default(), 0),
        };
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
        // An absent key ignores the cas in Envoy; a first writer racing
        // another first writer is caught by the re-read on the next request.
        match store.set(&slot, &next.encode(), cas) {
            Ok(()) => return Ok(Some(Standing { used: next, ..standing })),
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other) => break,
        }
    }
    // Shared data refused: fail open for this one request rather than
    // refusing traffic because of the store; the log says so.
    log::warn!(
        "waygate: rate-limit store unavailable for key {}; request admitted",
        key.id
    );
    Ok(None)
}

/// Adds an answer's tokens to the key's window (a stream already running
/// finishes; the next request sees the spent window).
pub fn record_tokens(store: &mut dyn SharedStore, key: &Key, now: u64, tokens: u64) {
    if key.tokens_per_minute.is_none() || tokens == 0 {
        return;
    }
    let slot = slot(key, now);
    for _ in 0..MAX_CAS_RETRIES {
        let (current, cas) = match store.get(&slot) {
            Some((raw, cas)) => (Window::parse(&raw), cas),
            None => (Window::default(), 0),
        };
        let next = Window {
            tokens: current.tokens.saturating_add(tokens),
            ..current
        };
        match store.set(&slot, &next.encode(), cas) {
            Ok(()) => return,
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other) => break,
        }
    }
    log::warn!("waygate: could not record {tokens} tokens for key {}", key.id);
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::HashMap;

    /// An in-memory store with Envoy's CAS rules (absent key: any cas wins;
    /// every write gets a fresh non-zero cas).
    #[derive(Default)]
    pub struct MemoryStore {
        pub values: HashMap<String, (Vec<u8>, u32)>,
        next_cas: u32,
        /// Writes to fail with a mismatch before succeeding, to model races.
        pub conflicts: usize,
    }

    impl SharedStore for MemoryStore {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.values.get(key).cloned()
        }
        fn set(&mut self, key: &str, value: &[u8], cas: u32) -> Result<(), StoreError> {
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

    fn key(rpm: Option<u64>, tpm: Option<u64>) -> Key {
        Key {
            id: "team".into(),
            sha256: [0; 32],
            models: None,
            requests_per_minute: rpm,
            tokens_per_minute: tpm,
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
        let (raw, _) = store.get(&slot(&k, 0)).unwrap();
        assert_eq!(Window::parse(&raw).requests, 3);
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
    fn unlimited_keys_touch_nothing() {
        let mut store = MemoryStore::default();
        assert_eq!(admit(&mut store, &key(None, None), 0).unwrap(), None);
        record_tokens(&mut store, &key(None, None), 0, 10);
        assert!(store.values.is_empty());
    }
}
