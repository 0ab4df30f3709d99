//! Provider health across requests (contract "Health") through the compiled
//! filter in real Envoy, in the run's fallback shape: a provider that answers
//! 503, one that resets, one that hangs past its time and one that answers
//! 429 with `retry-after`, each beside a healthy one; the whole cycle of a
//! circuit (open, skip, probe, close) read from what the fakes received.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{Gateway, Response, chain_config};
use serde_json::{Value, json};
use waygate_fakes::FakeProviders;

/// `chain/x` served by `endpoints` in order, circuits cooling for `cooldown_ms` first.
fn config(endpoints: &[(&str, &str)], cooldown_ms: u64) -> Value {
    let mut config = chain_config(endpoints);
    config["health"] = json!({"cooldown_ms": cooldown_ms});
    config
}

fn ask(gw: &Gateway) -> Response {
    gw.chat(json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}]}))
}

/// Asserts the request was served by `provider` after `attempts`.
fn served(r: &Response, provider: &str, attempts: &str) {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-provider"), Some(provider), "{:?}", r.headers);
    assert_eq!(r.header("x-waygate-attempts"), Some(attempts), "{:?}", r.headers);
    assert_eq!(r.json()["object"], "chat.completion");
}

/// How many requests for upstream model `model` the fakes received.
fn received(fakes: &FakeProviders, model: &str) -> usize {
    fakes
        .received()
        .iter()
        .filter(|r| r.body_json().is_some_and(|b| b["model"] == model))
        .count()
}

/// A stat's value in Envoy's `/stats`; 0 when Envoy has not defined it.
fn stat(gw: &Gateway, name: &str) -> u64 {
    let all = gw.envoy.admin_get("/stats?filter=waygate.circuit");
    // Envoy's text form keeps the `wasmcustom.` prefix it stores wasm stats under.
    all.lines()
        .find_map(|l| l.strip_prefix("wasmcustom.")?.strip_prefix(name)?.strip_prefix(": "))
        .map_or(0, |v| v.trim().parse().unwrap())
}

/// Sleeps until `since + ms` (and a margin) has passed.
fn wait_past(since: Instant, ms: u64) {
    let until = since + Duration::from_millis(ms + 150);
    if let Some(left) = until.checked_duration_since(Instant::now()) {
        std::thread::sleep(left);
    }
}

#[test]
fn a_provider_answering_503_is_passed_over_until_its_cooldown_then_probed_once() {
    let gw = Gateway::with_config(&config(&[("fake", "status-503"), ("backup", "ok")], 1500));
    for _ in 0..3 {
        served(&ask(&gw), "backup", "fake:503,backup:200");
    }
    let opened = Instant::now();
    // Open: no request goes to it while it cools down.
    for _ in 0..5 {
        served(&ask(&gw), "backup", "fake:open,backup:200");
    }
    assert_eq!(received(&gw.fakes, "status-503"), 3);
    assert_eq!(received(&gw.fakes, "ok"), 8);
    let prefix = "waygate.circuit.fake";
    assert_eq!(stat(&gw, &format!("{prefix}.endpoint.status-503.opens")), 1);
    assert_eq!(stat(&gw, &format!("{prefix}.credential.0.opens")), 1);
    assert_eq!(stat(&gw, &format!("{prefix}.endpoint.status-503.state")), 1);
    assert_eq!(stat(&gw, &format!("{prefix}.endpoint.status-503.skips")), 5);
    assert!(
        gw.logs()
            .contains("circuit opened: provider fake endpoint status-503, for 1500 ms"),
        "{}",
        gw.logs()
    );
    // Cooled down: exactly one probe, which fails and opens it for twice as long.
    wait_past(opened, 1500);
    served(&ask(&gw), "backup", "fake:503,backup:200");
    let reopened = Instant::now();
    served(&ask(&gw), "backup", "fake:open,backup:200");
    assert_eq!(received(&gw.fakes, "status-503"), 4);
    assert_eq!(stat(&gw, &format!("{prefix}.endpoint.status-503.probes")), 1);
    assert_eq!(stat(&gw, &format!("{prefix}.endpoint.status-503.opens")), 2);
    assert!(
        gw.logs()
            .contains("circuit opened: provider fake endpoint status-503, for 3000 ms")
    );
    wait_past(reopened, 1500);
    served(&ask(&gw), "backup", "fake:open,backup:200");
    assert_eq!(received(&gw.fakes, "status-503"), 4, "still cooling at 1.5 s of 3 s");
}

#[test]
fn a_circuit_goes_through_its_whole_cycle_and_the_provider_serves_again() {
    // `flaky` is a port with nothing listening: connect failures, until a
    // fake provider starts there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut plugin = config(&[("flaky", "ok"), ("backup", "ok")], 1000);
    plugin["providers"].as_array_mut().unwrap().push(json!({
        "id": "flaky", "api": "openai", "cluster": "flaky", "authority": "flaky.local",
        "path_prefix": "/v1", "api_key": "fake-openai-key"
    }));
    let gw = Gateway::with_edit(&plugin, |doc| common::add_cluster_like_fake(doc, "flaky", port));
    for _ in 0..3 {
        served(&ask(&gw), "backup", "flaky:error,backup:200");
    }
    let opened = Instant::now();
    served(&ask(&gw), "backup", "flaky:open,backup:200");
    assert_eq!(stat(&gw, "waygate.circuit.flaky.provider.state"), 1);
    assert!(
        gw.logs()
            .contains("circuit opened: provider flaky provider, for 1000 ms")
    );

    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let recovered = FakeProviders::start(addr).unwrap();
    served(&ask(&gw), "backup", "flaky:open,backup:200");
    assert!(recovered.received().is_empty(), "no request while it cools down");
    wait_past(opened, 1000);
    // The probe succeeds and closes the circuit; the provider is first again.
    served(&ask(&gw), "flaky", "flaky:200");
    assert_eq!(recovered.received().len(), 1);
    assert_eq!(
        recovered.received()[0].header("authorization"),
        Some("Bearer fake-openai-key")
    );
    served(&ask(&gw), "flaky", "flaky:200");
    assert_eq!(recovered.received().len(), 2);
    assert_eq!(stat(&gw, "waygate.circuit.flaky.provider.state"), 0);
    assert_eq!(stat(&gw, "waygate.circuit.flaky.provider.probes"), 1);
    assert_eq!(stat(&gw, "waygate.circuit.flaky.provider.opens"), 1);
    assert!(gw.logs().contains("circuit closed: provider flaky provider"));
}

#[test]
fn a_provider_that_resets_or_hangs_costs_nothing_once_open() {
    for (provider, model, received_as) in [("slammer", "ok", None), ("fastfail", "slow-3000", Some("slow-3000"))] {
        let gw = Gateway::with_config(&config(&[(provider, model), ("backup", "ok")], 60_000));
        for _ in 0..3 {
            served(&ask(&gw), "backup", &format!("{provider}:error,backup:200"));
        }
        for _ in 0..3 {
            served(&ask(&gw), "backup", &format!("{provider}:open,backup:200"));
        }
        if let Some(model) = received_as {
            assert_eq!(received(&gw.fakes, model), 3);
        }
        assert_eq!(stat(&gw, &format!("waygate.circuit.{provider}.provider.opens")), 1);
    }
}

#[test]
fn a_429_with_retry_after_opens_at_once_for_that_long() {
    let mut plugin = config(&[("fake", "limited-2"), ("backup", "ok")], 60_000);
    plugin["models"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "chain/y", "endpoints": [
            {"provider": "fake", "model": "json"}, {"provider": "backup", "model": "ok"}
        ]}));
    let gw = Gateway::with_config(&plugin);
    served(&ask(&gw), "backup", "fake:429,backup:200");
    let opened = Instant::now();
    served(&ask(&gw), "backup", "fake:open,backup:200");
    // One key: the credential and the endpoint open.
    for circuit in ["credential 0", "endpoint limited-2"] {
        let line = format!("circuit opened: provider fake {circuit}, for 2000 ms");
        assert!(gw.logs().contains(&line), "{line}\n{}", gw.logs());
    }
    // The credential is open: the provider's other models wait too.
    let r = gw.chat(json!({"model": "chain/y", "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:open,backup:200"));
    assert_eq!(received(&gw.fakes, "json"), 0);
    wait_past(opened, 2000);
    served(&ask(&gw), "backup", "fake:429,backup:200");
    assert_eq!(received(&gw.fakes, "limited-2"), 2);
}

#[test]
fn a_request_is_never_refused_without_an_attempt() {
    let gw = Gateway::with_config(&config(&[("fake", "status-500")], 60_000));
    for _ in 0..5 {
        let r = ask(&gw);
        r.assert_error(502, "upstream_error", "upstream_error", None);
        assert_eq!(r.header("x-waygate-attempts"), Some("fake:500"));
    }
    assert_eq!(received(&gw.fakes, "status-500"), 5);
}

#[test]
fn with_health_off_every_request_tries_the_failing_provider_first() {
    let mut plugin = config(&[("fake", "status-503"), ("backup", "ok")], 1000);
    plugin["health"] = json!({"enabled": false});
    let gw = Gateway::with_config(&plugin);
    for _ in 0..5 {
        served(&ask(&gw), "backup", "fake:503,backup:200");
    }
    assert_eq!(stat(&gw, "waygate.circuit.fake.endpoint.status-503.opens"), 0);
}

#[test]
fn a_429_on_one_of_two_keys_moves_the_load_to_the_other() {
    let mut plugin = config(&[("pool", "ok")], 60_000);
    plugin["providers"].as_array_mut().unwrap().push(json!({
        "id": "pool", "api": "openai", "cluster": "fake", "authority": "fake.local", "path_prefix": "/v1",
        "credentials": [
            {"id": "spent", "api_key": waygate_fakes::OPENAI_EXHAUSTED_KEY},
            {"id": "fresh", "api_key": waygate_fakes::OPENAI_KEY}
        ]
    }));
    let gw = Gateway::with_config(&plugin);
    // Each key is drawn first half the time until the spent one answers 429 with
    // `retry-after: 20`; from then on the fresh one serves first.
    let mut until_429 = 0;
    loop {
        let r = ask(&gw);
        match r.header("x-waygate-attempts") {
            Some("pool#fresh:200") => until_429 += 1,
            Some("pool#spent:429,pool#fresh:200") => break,
            other => panic!("{other:?}: {}", r.text()),
        }
        assert!(until_429 < 30, "the spent key was never drawn first in 30 requests");
    }
    for _ in 0..20 {
        served(&ask(&gw), "pool", "pool#spent:open,pool#fresh:200");
    }
    let keys: Vec<String> = gw
        .fakes
        .received()
        .iter()
        .map(|r| r.header("authorization").unwrap().to_string())
        .collect();
    let spent = format!("Bearer {}", waygate_fakes::OPENAI_EXHAUSTED_KEY);
    assert_eq!(keys.iter().filter(|k| **k == spent).count(), 1, "asked once: {keys:?}");
    assert_eq!(keys.len(), until_429 + 22);
    assert!(
        gw.logs()
            .contains("circuit opened: provider pool credential spent, for 20000 ms")
    );
    assert_eq!(stat(&gw, "waygate.circuit.pool.credential.spent.opens"), 1);
}

#[test]
fn endpoints_of_one_priority_share_the_load_by_weight() {
    let mut plugin = common::test_plugin_config();
    plugin["models"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "spread/x", "endpoints": [
            {"provider": "fake", "model": "ok", "weight": 3, "priority": 0},
            {"provider": "backup", "model": "ok", "weight": 1, "priority": 0},
            {"provider": "fakechat", "model": "ok"}
        ]}));
    let gw = Gateway::with_config(&plugin);
    let n = 400;
    let mut fake = 0;
    for _ in 0..n {
        let r = gw.chat(json!({"model": "spread/x", "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(r.status, 200, "{}", r.text());
        match r.header("x-waygate-provider") {
            Some("fake") => fake += 1,
            Some("backup") => {}
            other => panic!("the third priority serves only as their fallback: {other:?}"),
        }
    }
    // 3 of 4 expected (300); a binomial's standard deviation here is 8.7.
    assert!((265..=335).contains(&fake), "fake served {fake} of {n}");
}

#[test]
fn every_inbound_api_plans_around_an_open_circuit() {
    let gw = Gateway::with_config(&config(&[("fakeanthropic", "status-529"), ("fake", "ok")], 60_000));
    let key = [("x-api-key", common::DEV_KEY), ("content-type", "application/json")];
    let bearer = format!("Bearer {}", common::DEV_KEY);
    let json_bearer = [("authorization", bearer.as_str()), ("content-type", "application/json")];
    let messages = json!({"model": "chain/x", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
    for _ in 0..3 {
        let r = gw.send("POST", "/api/v1/messages", &key, messages.to_string().as_bytes());
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:529,fake:200"));
    }
    let mut streamed = messages.clone();
    streamed["stream"] = true.into();
    let r = gw.send("POST", "/api/v1/messages", &key, streamed.to_string().as_bytes());
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:open,fake:200"));
    assert!(
        r.text()
            .ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
    );
    let responses = json!({"model": "chain/x", "input": "hi"});
    let r = gw.send(
        "POST",
        "/api/v1/responses",
        &json_bearer,
        responses.to_string().as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:open,fake:200"));
    assert_eq!(r.json()["object"], "response");
    let r = gw.send(
        "POST",
        "/api/v1/completions",
        &json_bearer,
        br#"{"model":"chain/x","prompt":"hi"}"#,
    );
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:open,fake:200"));
    assert_eq!(received(&gw.fakes, "status-529"), 3);
}

#[test]
fn fewest_in_flight_sends_the_next_request_to_the_idle_endpoint() {
    let mut plugin = common::test_plugin_config();
    plugin["models"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "busy/x", "strategy": "fewest_in_flight",
        "endpoints": [
            {"provider": "fake", "model": "slow-1500", "priority": 0},
            {"provider": "backup", "model": "slow-1500", "priority": 0}
        ]}));
    let gw = Gateway::with_config(&plugin);
    let ask = || gw.chat(json!({"model": "busy/x", "messages": [{"role": "user", "content": "hi"}]}));
    // With weights alone the second request would pick the busy endpoint half the
    // time; six rounds in a row would pass by chance once in 64 runs.
    for round in 0..6 {
        std::thread::scope(|s| {
            let first = s.spawn(ask);
            // The first request is planned (and counted) before the second starts.
            std::thread::sleep(Duration::from_millis(400));
            let second = ask();
            let first = first.join().unwrap();
            assert_eq!((first.status, second.status), (200, 200), "round {round}");
            assert_ne!(
                first.header("x-waygate-provider"),
                second.header("x-waygate-provider"),
                "round {round}: the second went to the endpoint already busy"
            );
        });
    }
}
