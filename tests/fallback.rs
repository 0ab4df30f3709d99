//! Fallback across providers (contract §4, §5) through the compiled filter,
//! in the shape the run asks for (`common::router_fallback`): with
//! `"fallback": "http_call"` the first attempt goes through the route and a
//! failed one is held while the next candidates are called with
//! `dispatch_http_call`; with `"fallback": "router"` Envoy's router retries
//! cluster by cluster and the filter's upstream role rewrites each attempt.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{Gateway, Response, chain_config};
use serde_json::{Value, json};

fn ask(gw: &Gateway, routing: Option<Value>) -> Response {
    let mut body = json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}]});
    if let Some(r) = routing {
        body["waygate"] = json!({"routing": r});
    }
    gw.chat(body)
}

/// `config` without provider health (contract "Health"), for tests that ask
/// a failing provider more often than its circuit takes to open, about
/// fallback itself (tests/health.rs has the circuits).
fn without_health(mut config: Value) -> Value {
    config["health"] = json!({"enabled": false});
    config
}

fn served(r: &Response, provider: &str, attempts: &str) {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-provider"), Some(provider), "{:?}", r.headers);
    assert_eq!(r.header("x-waygate-attempts"), Some(attempts));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "chain/x");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl_"));
}

#[test]
fn retryable_statuses_fall_back_to_the_next_provider() {
    for status in [429, 500, 503, 529, 401, 403, 404, 408, 409] {
        let gw = Gateway::with_config(&chain_config(&[
            ("fake", &format!("status-{status}")),
            ("backup", "ok"),
        ]));
        served(&ask(&gw, None), "backup", &format!("fake:{status},backup:200"));
        let got = gw.fakes.received();
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].header("authorization"), Some("Bearer fake-openai-key"));
        assert_eq!(got[1].body_json().unwrap()["model"], "ok");
    }
}

#[test]
fn a_provider_client_error_is_not_retried() {
    let gw = Gateway::with_config(&chain_config(&[("fake", "status-400"), ("backup", "ok")]));
    let r = ask(&gw, None);
    r.assert_error(400, "invalid_request_error", "provider_error", None);
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:400"));
    assert_eq!(gw.fakes.received().len(), 1);
}

#[test]
fn connect_refused_and_missing_clusters_fall_back() {
    let gw = Gateway::with_config(&chain_config(&[("closed", "ok"), ("ghost", "ok"), ("backup", "ok")]));
    if !common::router_fallback() {
        served(&ask(&gw, None), "backup", "closed:error,ghost:error,backup:200");
        return;
    }
    // With router retries a slot naming a cluster Envoy lacks ends the request:
    // the router would send that attempt to the previous cluster, and the
    // upstream filter refuses to send a provider's credential there.
    let r = ask(&gw, None);
    r.assert_error(502, "upstream_error", "upstream_error", None);
    assert_eq!(r.header("x-waygate-attempts"), Some("closed:error,ghost:error"));
    assert_eq!(gw.fakes.received().len(), 0);
}

#[test]
fn a_reset_before_any_response_falls_back() {
    let gw = Gateway::with_config(&chain_config(&[("slammer", "ok"), ("backup", "ok")]));
    served(&ask(&gw, None), "backup", "slammer:error,backup:200");
    // As a fallback call too.
    let gw = Gateway::with_config(&chain_config(&[
        ("fake", "status-503"),
        ("slammer", "ok"),
        ("backup", "ok"),
    ]));
    served(&ask(&gw, None), "backup", "fake:503,slammer:error,backup:200");
}

#[test]
fn fallback_crosses_apis_both_ways_streaming_and_not() {
    for (chain, attempts, provider) in [
        (
            [("fake", "status-503"), ("fakeanthropic", "long-4")],
            "fake:503,fakeanthropic:200",
            "fakeanthropic",
        ),
        (
            [("fakeanthropic", "status-529"), ("backup", "long-4")],
            "fakeanthropic:529,backup:200",
            "backup",
        ),
        (
            [("fakegemini", "status-429"), ("fakeanthropic", "long-4")],
            "fakegemini:429,fakeanthropic:200",
            "fakeanthropic",
        ),
    ] {
        // A 429 with retry-after would open its circuit at once.
        let gw = Gateway::with_config(&without_health(chain_config(&chain)));
        let r = ask(&gw, None);
        served(&r, provider, attempts);
        assert_eq!(
            r.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .count(),
            4
        );
        let r = gw.chat(json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}], "stream": true}));
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("x-waygate-attempts"), Some(attempts));
        let chunks = r.done_chunks();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text.split_whitespace().count(), 4, "{chunks:?}");
        assert!(
            chunks
                .iter()
                .all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "chain/x")
        );
    }
}

#[test]
fn a_timeout_falls_back() {
    // fastfail has timeout_ms 300; its upstream answers after 2 s.
    let gw = Gateway::with_config(&chain_config(&[("fastfail", "slow-2000"), ("backup", "ok")]));
    let started = std::time::Instant::now();
    served(&ask(&gw, None), "backup", "fastfail:error,backup:200");
    assert!(
        started.elapsed() < std::time::Duration::from_millis(1900),
        "the timeout did not cut the attempt"
    );
}

#[test]
fn fallbacks_chain_through_several_calls() {
    let gw = Gateway::with_config(&chain_config(&[
        ("fake", "status-503"),
        ("fakechat", "status-500"),
        ("backup", "ok"),
    ]));
    served(&ask(&gw, None), "backup", "fake:503,fakechat:500,backup:200");
}

#[test]
fn when_every_attempt_fails_the_last_one_decides() {
    let gw = Gateway::with_config(&chain_config(&[("fake", "status-503"), ("backup", "status-429")]));
    let r = ask(&gw, None);
    let v = r.assert_error(429, "rate_limit_error", "upstream_rate_limited", None);
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503,backup:429"));
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("fake: 503") && message.contains("backup: 429"),
        "{message}"
    );

    let gw = Gateway::with_config(&chain_config(&[("fake", "status-429"), ("backup", "status-502")]));
    let r = ask(&gw, None);
    r.assert_error(502, "upstream_error", "upstream_error", None);
    assert!(r.header("retry-after").is_none());

    let gw = Gateway::with_config(&chain_config(&[("fake", "status-503"), ("fastfail", "slow-2000")]));
    let r = ask(&gw, None);
    r.assert_error(504, "upstream_error", "upstream_timeout", None);
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503,fastfail:error"));
}

#[test]
fn prefer_reorders_the_candidates() {
    let gw = Gateway::with_config(&chain_config(&[("fake", "ok"), ("backup", "ok")]));
    served(&ask(&gw, Some(json!({"prefer": ["backup"]}))), "backup", "backup:200");
    served(&ask(&gw, None), "fake", "fake:200");
}

#[test]
fn allow_fallbacks_false_keeps_to_the_preferred_providers() {
    let gw = Gateway::with_config(&chain_config(&[("fake", "status-503"), ("backup", "ok")]));
    let r = ask(&gw, Some(json!({"allow_fallbacks": false})));
    r.assert_error(502, "upstream_error", "upstream_error", None);
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503"));
    let r = ask(&gw, Some(json!({"prefer": ["backup"], "allow_fallbacks": false})));
    served(&r, "backup", "backup:200");
}

#[test]
fn max_provider_tries_bounds_the_attempts() {
    let chain = [("fake", "status-503"), ("fakechat", "status-503"), ("backup", "ok")];
    let gw = Gateway::with_config(&without_health(chain_config(&chain)));
    let r = ask(&gw, Some(json!({"max_provider_tries": 1})));
    r.assert_error(502, "upstream_error", "upstream_error", None);
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503"));
    let r = ask(&gw, Some(json!({"max_provider_tries": 2})));
    r.assert_error(502, "upstream_error", "upstream_error", None);
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503,fakechat:503"));
    served(
        &ask(&gw, Some(json!({"max_provider_tries": 9}))),
        "backup",
        "fake:503,fakechat:503,backup:200",
    );
    // Without the routing object, the plugin setting (3) applies.
    served(&ask(&gw, None), "backup", "fake:503,fakechat:503,backup:200");
}

#[test]
fn a_streamed_request_falls_back_to_a_complete_sse_body() {
    let gw = Gateway::with_config(&chain_config(&[("fake", "status-503"), ("backup", "long-5")]));
    let r = gw.chat(
        json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}], "stream": true,
        "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503,backup:200"));
    let chunks = r.done_chunks();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text.split_whitespace().count(), 5);
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 5);
    assert!(
        chunks
            .iter()
            .all(|c| c["model"] == "chain/x" && c["id"] == chunks[0]["id"])
    );
}

#[test]
fn a_provider_error_after_the_stream_started_ends_with_the_error_event() {
    let gw = Gateway::with_config(&chain_config(&[("fake", "stream-error"), ("backup", "ok")]));
    let r = gw.chat(json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}], "stream": true}));
    assert_eq!(r.status, 200);
    let events = r.events();
    assert!(!events.iter().any(|e| e == "[DONE]"), "{events:?}");
    let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "stream_interrupted", "{events:?}");
    assert_eq!(last["error"]["type"], "upstream_error");
    assert_eq!(
        gw.fakes.received().len(),
        1,
        "no fallback once bytes reached the client"
    );
}

#[test]
fn an_upstream_cut_mid_stream_is_not_retried_and_never_ends_with_done() {
    // The fake closes its connection mid-body. Envoy resets the client's
    // stream (its headers are already sent), so the client sees the events
    // so far and then the connection end: never a `[DONE]`.
    let gw = Gateway::with_config(&chain_config(&[("fake", "cut-3"), ("backup", "ok")]));
    let r = gw.chat(json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}], "stream": true}));
    assert_eq!(r.status, 200);
    assert!(!r.text().contains("[DONE]"), "{}", r.text());
    if r.complete {
        let last = r.events().last().unwrap().clone();
        let v: Value = serde_json::from_str(&last).unwrap();
        assert_eq!(v["error"]["code"], "stream_interrupted");
    }
    assert_eq!(
        gw.fakes.received().len(),
        1,
        "no fallback once bytes reached the client"
    );
    // The worker VMs are still healthy.
    for _ in 0..4 {
        assert_eq!(
            gw.chat(json!({"model": "fake/ok", "messages": [{"role": "user", "content": "hi"}]}))
                .status,
            200
        );
    }
}

/// A streamed chat request: when its first SSE event arrived, when it ended, and the answer.
fn timed_stream(gw: &Gateway, body: &Value) -> (std::time::Duration, std::time::Duration, Response) {
    let auth = format!("Bearer {}", common::DEV_KEY);
    let t = common::send_timed(
        gw.addr,
        "POST",
        "/api/v1/chat/completions",
        &[
            ("authorization", auth.as_bytes()),
            ("content-type", b"application/json"),
        ],
        body.to_string().as_bytes(),
    );
    (t.first_event.unwrap(), t.whole, t.response)
}

#[test]
fn with_router_retries_a_fallback_stream_reaches_the_client_as_it_is_generated() {
    // Envoy < 1.39 has no per-retry cluster choice: fallback there is the
    // buffered http call the tests above cover.
    let Some(gw) = Gateway::routed(&chain_config(&[("fake", "status-503"), ("fakeanthropic", "long-1500")])) else {
        eprintln!(
            "skipped: router fallback needs Envoy >= 1.39, not {:?}",
            common::envoy::version()
        );
        return;
    };
    // 1,500 events about 2 ms apart: the second provider generates for seconds.
    let body = json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}], "stream": true,
        "max_tokens": 2000});
    let (first, whole, r) = timed_stream(&gw, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503,fakeanthropic:200"));
    assert_eq!(r.header("x-waygate-provider"), Some("fakeanthropic"));
    let chunks = r.done_chunks();
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text.split_whitespace().count(), 1500, "every word, translated");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk" && c["model"] == "chain/x")
    );
    assert!(
        whole > std::time::Duration::from_millis(1500),
        "the provider took {whole:?}: too fast to tell streaming from buffering"
    );
    eprintln!("router fallback stream: first event after {first:?}, whole stream {whole:?}");
    assert!(
        first < whole / 5,
        "the first event arrived after {first:?} of {whole:?}: the fallback answer was held"
    );
    // Both attempts reached the fakes, each with its own API and credential only.
    let got = gw.fakes.received();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].path, "/v1/chat/completions");
    assert_eq!(got[0].header("authorization"), Some("Bearer fake-openai-key"));
    assert_eq!(got[0].header("x-api-key"), None);
    assert_eq!(got[1].path, "/v1/messages");
    assert_eq!(got[1].header("x-api-key"), Some("fake-anthropic-key"));
    assert_eq!(got[1].header("authorization"), None);
    for request in &got {
        assert!(
            request.headers.iter().all(|(k, _)| !k.starts_with("x-waygate-")),
            "{:?}",
            request.headers
        );
    }
}

/// Envoy's circuit breakers bound a provider cluster's connections, pending and active
/// requests (1,024 each by default, and an HTTP/1 stream holds its connection for its
/// whole length). Past them Envoy refuses a request at once; here `max_requests: 0` puts
/// the `fake` cluster past them for every request. The filter counts the refusal as the
/// attempt `<provider>:error`. With http-call fallback it then falls back; Envoy's router
/// never retries a refusal of its own circuit breakers, so with router fallback the
/// client gets the contract's 502 whatever the chain (docs/deploying.md "Load into your Envoy").
#[test]
fn a_provider_cluster_past_its_circuit_breakers_falls_back_or_gets_502() {
    let mut config = chain_config(&[("fake", "ok"), ("spare", "ok")]);
    config["providers"].as_array_mut().unwrap().push(json!({
        "id": "spare", "api": "openai", "cluster": "spare", "authority": "fake.local",
        "path_prefix": "/v1", "api_key": "fake-openai-key"
    }));
    let gw = Gateway::with_edit(&config, |doc| {
        let clusters = doc["static_resources"]["clusters"].as_sequence().unwrap();
        let fake = clusters.iter().find(|c| c["name"] == "fake").unwrap();
        let address = &fake["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"];
        let port = u16::try_from(address["socket_address"]["port_value"].as_u64().unwrap()).unwrap();
        // The spare is a copy of the fake cluster as shipped, made before the change.
        common::add_cluster_like_fake(doc, "spare", port);
        let clusters = doc["static_resources"]["clusters"].as_sequence_mut().unwrap();
        let fake = clusters.iter_mut().find(|c| c["name"] == "fake").unwrap();
        fake["circuit_breakers"] =
            serde_yaml::from_str("{thresholds: [{max_requests: 0, max_retries: 1000}]}").unwrap();
    });
    let alone = gw.chat(common::ask("fake/ok"));
    alone.assert_error(502, "upstream_error", "upstream_error", None);
    assert_eq!(alone.header("x-waygate-attempts"), Some("fake:error"));
    let streamed = json!({"model": "chain/x", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    if common::router_fallback() {
        for r in [ask(&gw, None), gw.chat(streamed)] {
            r.assert_error(502, "upstream_error", "upstream_error", None);
            assert_eq!(r.header("x-waygate-attempts"), Some("fake:error"));
        }
        assert!(gw.fakes.received().is_empty(), "no provider was reached");
        return;
    }
    served(&ask(&gw, None), "spare", "fake:error,spare:200");
    let stream = gw.chat(streamed);
    assert_eq!(stream.status, 200, "{}", stream.text());
    assert_eq!(stream.header("x-waygate-attempts"), Some("fake:error,spare:200"));
    assert_eq!(stream.events().last().map(String::as_str), Some("[DONE]"));
    assert_eq!(gw.fakes.received().len(), 2, "only the spare provider was reached");
}
