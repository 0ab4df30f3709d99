//! Requests in flight per endpoint, for models whose strategy is
//! `fewest_in_flight` (contract §8, `models[].strategy`): counted in shared
//! data, so every worker of one Envoy plans with the same numbers.
//!
//! A request counts against the endpoint it is first sent to, from its
//! planning to its end (`on_log`, which Envoy calls however it ended); the
//! count is a decimal number under [`crate::routing::Candidate::inflight_key`].

use crate::config::{Config, Strategy};
use crate::limits::{SharedStore, StoreError};

/// How many times one update retries after losing a race.
const MAX_CAS_RETRIES: usize = 16;

/// Creates every counted endpoint's entry at 0 before the VM serves: updates
/// then always go through a CAS token.
pub fn prepare(store: &mut dyn SharedStore, config: &Config) {
    for m in config.models.iter().filter(|m| m.strategy == Strategy::FewestInFlight) {
        for i in 0..m.endpoints.len() {
            let key = format!("waygate.inflight.{}#{i}", m.id);
            if store.get(&key).is_none() {
                // Lost to another worker creating it first: that is as good.
                let _ = store.set(&key, b"0", 0);
            }
        }
    }
}

/// The endpoint's requests in flight now.
pub fn count(store: &dyn SharedStore, key: &str) -> u64 {
    store.get(key).map_or(0, |(bytes, _)| parse(&bytes))
}

/// Adds one request to the endpoint's count (`up`), or takes one away.
pub fn add(store: &mut dyn SharedStore, key: &str, up: bool) {
    for _ in 0..MAX_CAS_RETRIES {
        let Some((bytes, cas)) = store.get(key) else { return };
        let n = parse(&bytes);
        let n = if up { n.saturating_add(1) } else { n.saturating_sub(1) };
        match store.set(key, n.to_string().as_bytes(), cas) {
            Ok(()) => return,
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other) => return,
        }
    }
}

fn parse(bytes: &[u8]) -> u64 {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::tests::MemoryStore;

    #[test]
    fn counts_go_up_and_down_through_races_and_never_below_zero() {
        let json = br#"{"providers":[{"id":"a","api":"openai","cluster":"a","authority":"a","api_key":"k"}],
          "models":[{"id":"m","strategy":"fewest_in_flight","endpoints":[
            {"provider":"a","model":"x","priority":0},{"provider":"a","model":"y","priority":0}]}]}"#;
        let config = Config::parse(json, &|_| None).unwrap();
        let mut store = MemoryStore::default();
        prepare(&mut store, &config);
        store.guarded_only = true;
        let key = "waygate.inflight.m#1";
        assert_eq!(count(&store, key), 0);
        add(&mut store, key, true);
        store.conflicts = 3;
        add(&mut store, key, true);
        assert_eq!(count(&store, key), 2);
        for _ in 0..3 {
            add(&mut store, key, false);
        }
        assert_eq!(count(&store, key), 0);
        assert_eq!(count(&store, "waygate.inflight.m#0"), 0);
    }
}
