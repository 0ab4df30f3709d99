//! Per-key limits (contract §8) through the compiled filter on two worker
//! VMs: counts are shared across workers with compare-and-swap.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::{Gateway, LIMITED_KEY, Response, TOKEN_LIMITED_KEY};

const BODY: &str = r#"{"model":"fake/ok","messages":[{"role":"user","content":"hi"}]}"#;

/// Waits out the end of a minute, so a test's requests share one window.
fn away_from_a_minute_boundary() {
    let into = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() % 60;
    if into > 50 {
        std::thread::sleep(std::time::Duration::from_secs(61 - into));
    }
}

/// A limited key's answer tells its own limits in OpenAI's `x-ratelimit-*`
/// names, here those of `kind` (`requests` or `tokens`) only; the fake provider
/// tells its account's in the same names, as OpenAI does, and none of those
/// may mix in.
fn assert_only_the_keys_own_limits(r: &Response, kind: &str) {
    let names: Vec<&str> = r
        .headers
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| k.starts_with("x-ratelimit-"))
        .collect();
    let own = [
        format!("x-ratelimit-limit-{kind}"),
        format!("x-ratelimit-remaining-{kind}"),
    ];
    assert_eq!(names, own, "{:?}", r.headers);
}

#[test]
fn concurrent_requests_against_a_limit_admit_exactly_that_many() {
    let gw = Gateway::start();
    away_from_a_minute_boundary();
    let answers: Vec<Response> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..24).map(|_| s.spawn(|| gw.post_as(LIMITED_KEY, BODY))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = answers.iter().filter(|r| r.status == 200).count();
    assert_eq!(ok, 5, "{:?}", answers.iter().map(|r| r.status).collect::<Vec<_>>());
    for r in answers.iter().filter(|r| r.status != 200) {
        r.assert_error(429, "rate_limit_error", "rate_limited", None);
        let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=60).contains(&retry), "{retry}");
        assert_eq!(r.header("x-ratelimit-limit-requests"), Some("5"));
        assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
    }
    let mut remaining: Vec<u64> = answers
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.header("x-ratelimit-remaining-requests").unwrap().parse().unwrap())
        .collect();
    remaining.sort();
    assert_eq!(remaining, [0, 1, 2, 3, 4], "each admitted request saw its own count");
    for r in answers.iter().filter(|r| r.status == 200) {
        assert_only_the_keys_own_limits(r, "requests");
    }
    assert_eq!(gw.fakes.received().len(), 5, "refused requests never reach a provider");
}

#[test]
fn the_token_limit_trips_after_the_usage_of_earlier_answers() {
    let gw = Gateway::start();
    away_from_a_minute_boundary();
    let long = r#"{"model":"fake/long-20","messages":[{"role":"user","content":"count"}]}"#;
    let first = gw.post_as(TOKEN_LIMITED_KEY, long);
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("x-ratelimit-limit-tokens"), Some("30"));
    assert_only_the_keys_own_limits(&first, "tokens");
    let second = gw.post_as(TOKEN_LIMITED_KEY, long);
    assert_eq!(second.status, 200, "{}", second.text());
    // 2 × (1 prompt + 20 completion) tokens > 30: the window is spent.
    let third = gw.post_as(TOKEN_LIMITED_KEY, BODY);
    let v = third.assert_error(429, "rate_limit_error", "rate_limited", None);
    assert!(v["error"]["message"].as_str().unwrap().contains("tokens"), "{v}");
    assert_eq!(third.header("x-ratelimit-remaining-tokens"), Some("0"));
}

#[test]
fn a_stream_counts_its_tokens_too() {
    let gw = Gateway::start();
    away_from_a_minute_boundary();
    let stream = r#"{"model":"fake/long-40","messages":[{"role":"user","content":"count"}],"stream":true}"#;
    let r = gw.post_as(TOKEN_LIMITED_KEY, stream);
    assert_eq!(r.status, 200);
    assert_only_the_keys_own_limits(&r, "tokens");
    assert_eq!(
        r.events().last().unwrap(),
        "[DONE]",
        "a stream past the limit still finishes"
    );
    gw.post_as(TOKEN_LIMITED_KEY, BODY)
        .assert_error(429, "rate_limit_error", "rate_limited", None);
}
