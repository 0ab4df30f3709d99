//! Wall time spent inside the plugin's VM per HTTP stream, summed over the stream's
//! callbacks (`on_context_create` .. `on_delete`, and any `on_http_call_response`), one
//! sample per stream that ran the filter. Served, and reset, by the admin's
//! `/host/guest_time`; Envoy has no such statistic, it is the host's own.
//!
//! Why: `make bench` measures the filter alone in the wasm bench (callbacks back to back,
//! caches warm) and the whole gateway end to end. Between the two lies the question the
//! end-to-end figures cannot answer by subtraction: how long the guest itself ran while
//! the host served real connections, at concurrency 1 (a callback every few hundred µs,
//! with the host's own work between) and under load.
//!
//! One bucket per µs, so the bench can merge samples from several reads and take exact
//! percentiles to the µs; a stream over the last bucket's bound counts in the last.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Buckets `[i, i + 1)` µs for `i < LAST`; bucket `LAST` holds every sample of `LAST` µs
/// or more.
const LAST: usize = 1023;

pub struct GuestTime {
    buckets: Vec<AtomicU64>,
}

impl Default for GuestTime {
    fn default() -> Self {
        Self {
            buckets: (0..=LAST).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl GuestTime {
    /// Counts one stream that spent `spent` in the guest.
    pub fn record(&self, spent: Duration) {
        let micros = usize::try_from(spent.as_micros()).unwrap_or(LAST).min(LAST);
        if let Some(bucket) = self.buckets.get(micros) {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The samples since the last call, as JSON: `{"streams": N, "us": [c0, c1, ...]}`
    /// where `cI` counts the streams that spent `[I, I + 1)` µs in the guest (the last
    /// element: that many or more); trailing zero buckets are left out. Resets them.
    pub fn take_json(&self) -> String {
        let counts: Vec<u64> = self.buckets.iter().map(|b| b.swap(0, Ordering::Relaxed)).collect();
        let used = counts.iter().rposition(|&c| c > 0).map_or(0, |last| last + 1);
        let mut json = format!("{{\"streams\":{},\"us\":[", counts.iter().sum::<u64>());
        for (i, count) in counts.iter().take(used).enumerate() {
            let comma = if i == 0 { "" } else { "," };
            let _ = write!(json, "{comma}{count}");
        }
        json.push_str("]}\n");
        json
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_by_microsecond_and_resets_on_read() {
        let time = GuestTime::default();
        for nanos in [0, 999, 1_000, 2_500, 2_999] {
            time.record(Duration::from_nanos(nanos));
        }
        assert_eq!(time.take_json(), "{\"streams\":5,\"us\":[2,1,2]}\n");
        assert_eq!(time.take_json(), "{\"streams\":0,\"us\":[]}\n");
    }

    #[test]
    fn a_long_stream_counts_in_the_last_bucket() {
        let time = GuestTime::default();
        time.record(Duration::MAX);
        time.record(Duration::from_millis(5));
        let json: serde_json::Value = serde_json::from_str(&time.take_json()).unwrap();
        let us = json["us"].as_array().unwrap();
        assert_eq!(us.len(), LAST + 1);
        assert_eq!(us[LAST], 2);
        assert_eq!(json["streams"], 2);
    }
}
