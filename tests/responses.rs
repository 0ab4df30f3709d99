//! `POST /responses` through the compiled filter, as chat is served: fallback across
//! provider APIs (streamed and not, in the run's fallback shape), what the provider
//! received, limits, and refusals made before any provider is asked.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{DEV_KEY, Gateway, LIMITED_KEY, Response, chain_config};
use serde_json::{Value, json};

fn responses(gw: &Gateway, key: &str, body: &Value) -> Response {
    gw.send(
        "POST",
        "/api/v1/responses",
        &[
            ("authorization", &format!("Bearer {key}")),
            ("content-type", "application/json"),
        ],
        body.to_string().as_bytes(),
    )
}

/// The `data:` of each event of a Responses stream, its `event:` name checked.
fn events(r: &Response) -> Vec<Value> {
    assert!(r.complete, "the stream was cut: {}", r.text());
    r.text()
        .split_terminator("\n\n")
        .map(|e| {
            let (name, data) = e.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(name.strip_prefix("event: "), data["type"].as_str());
            data
        })
        .collect()
}

#[test]
fn a_failed_provider_falls_back_across_apis_streamed_and_not() {
    let gw = Gateway::with_config(&chain_config(&[("fake", "status-503"), ("fakeanthropic", "long-4")]));
    let r = responses(
        &gw,
        DEV_KEY,
        &json!({"model": "chain/x", "input": "hi", "max_output_tokens": 50}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503,fakeanthropic:200"));
    assert_eq!(r.header("x-waygate-provider"), Some("fakeanthropic"));
    let v = r.json();
    assert_eq!(
        (v["object"].as_str(), v["model"].as_str()),
        (Some("response"), Some("chain/x"))
    );
    assert_eq!(v["output"][0]["content"][0]["text"], "word1 word2 word3 word4");
    // The second provider got the Messages API, translated from the Responses request.
    let got = gw.fakes.received();
    let anthropic = got[1].body_json().unwrap();
    assert_eq!(anthropic["max_tokens"], 50);
    assert_eq!(
        anthropic["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    );

    let r = responses(
        &gw,
        DEV_KEY,
        &json!({"model": "chain/x", "input": "hi", "stream": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503,fakeanthropic:200"));
    let events = events(&r);
    let text: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "word1 word2 word3 word4");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.completed");
    assert_eq!(last["response"]["usage"]["output_tokens"], 4);
}

#[test]
fn what_cannot_be_served_is_refused_before_any_provider_is_asked() {
    let gw = Gateway::start();
    for (body, code, param) in [
        (
            json!({"model": "fake/ok", "input": "hi", "previous_response_id": "resp_1"}),
            "unsupported_parameter",
            "previous_response_id",
        ),
        (
            json!({"model": "fake/ok", "input": "hi", "tools": [{"type": "file_search"}]}),
            "unsupported_parameter",
            "tools.0.type",
        ),
        (
            json!({"model": "fake/ok", "input": [{"type": "item_reference", "id": "msg_1"}]}),
            "unsupported_parameter",
            "input.0",
        ),
        (
            json!({"model": "fake/ok", "input": "hi", "temperature": 7}),
            "invalid_value",
            "temperature",
        ),
        (
            json!({"model": "fake/ok", "input": "hi", "seed": 1}),
            "unknown_parameter",
            "seed",
        ),
        (json!({"model": "fake/ok"}), "missing_field", "input"),
    ] {
        let r = responses(&gw, DEV_KEY, &body);
        r.assert_error(400, "invalid_request_error", code, Some(param));
    }
    responses(&gw, "wg-wrong", &json!({"model": "fake/ok", "input": "hi"})).assert_error(
        401,
        "authentication_error",
        "invalid_api_key",
        None,
    );
    let r = gw.send(
        "GET",
        "/api/v1/responses",
        &[("authorization", &format!("Bearer {DEV_KEY}"))],
        b"",
    );
    r.assert_error(405, "invalid_request_error", "method_not_allowed", None);
    assert_eq!(r.header("allow"), Some("POST"));
    assert!(gw.fakes.received().is_empty());
}

/// Waits out the end of a minute, so a test's requests share one window.
fn away_from_a_minute_boundary() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let into = now.as_secs() % 60;
    if into > 50 {
        std::thread::sleep(std::time::Duration::from_secs(61 - into));
    }
}

#[test]
fn a_keys_request_limit_counts_responses_as_it_counts_chat() {
    let gw = Gateway::start();
    away_from_a_minute_boundary();
    let ask = json!({"model": "fake/ok", "input": "hi"});
    let answers: Vec<Response> = (0..6).map(|_| responses(&gw, LIMITED_KEY, &ask)).collect();
    let statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    answers[5].assert_error(429, "rate_limit_error", "rate_limited", None);
    assert_eq!(answers[4].header("x-ratelimit-remaining-requests"), Some("0"));
    assert_eq!(gw.fakes.received().len(), 5);
}
