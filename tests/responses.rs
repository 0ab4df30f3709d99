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

/// The test configuration with `fakeresponses`, an OpenAI-compatible provider that serves
/// the Responses API itself, and `chain/x` served by `endpoints` in order.
fn with_native_provider(endpoints: &[(&str, &str)]) -> Value {
    let mut config = chain_config(endpoints);
    config["providers"].as_array_mut().unwrap().push(json!({
        "id": "fakeresponses", "api": "openai", "cluster": "fake", "authority": "fake.local",
        "path_prefix": "/v1", "api_key": "fake-openai-key", "responses": true
    }));
    config
}

#[test]
fn a_provider_serving_the_responses_api_gets_the_request_as_it_came() {
    let gw = Gateway::with_config(&with_native_provider(&[("fakeresponses", "echo")]));
    // State and a tool only OpenAI has: no chat provider could serve this.
    let body = r#"{"model":"chain/x","previous_response_id":"resp_earlier","input":[{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"gAAA"},{"role":"user","content":"hi"}],"tools":[{"type":"web_search"}],"store":true}"#;
    let r = gw.send(
        "POST",
        "/api/v1/responses",
        &[
            ("authorization", &format!("Bearer {DEV_KEY}")),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-provider"), Some("fakeresponses"));
    let v = r.json();
    assert_eq!(v["model"], "chain/x");
    assert!(v["id"].as_str().unwrap().starts_with("resp_"));
    let got = gw.fakes.received();
    assert_eq!(got[0].path_only(), "/v1/responses");
    assert_eq!(
        std::str::from_utf8(&got[0].body).unwrap(),
        body.replace(r#""model":"chain/x","#, "")
            .replace(r#","store":true}"#, r#","store":true,"model":"echo"}"#)
    );
    assert_eq!(got[0].header("authorization"), Some("Bearer fake-openai-key"));

    // Streamed, event for event, its usage counted.
    let r = responses(
        &gw,
        DEV_KEY,
        &json!({"model": "chain/x", "input": "hi", "stream": true}),
    );
    let events = events(&r);
    assert_eq!(events.first().unwrap()["type"], "response.created");
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    let usage = &events.last().unwrap()["response"]["usage"];
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let logged = format!(
        "provider=fakeresponses attempts=fakeresponses:200 status=200 prompt_tokens={} completion_tokens={}",
        usage["input_tokens"], usage["output_tokens"]
    );
    assert!(gw.logs().contains(&logged), "{logged}\n{}", gw.logs());
}

#[test]
fn a_failed_native_provider_falls_back_to_a_translated_one_and_state_is_refused_without_one() {
    let gw = Gateway::with_config(&with_native_provider(&[
        ("fakeresponses", "status-503"),
        ("fakegemini", "ok"),
    ]));
    let r = responses(&gw, DEV_KEY, &json!({"model": "chain/x", "input": "hi"}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeresponses:503,fakegemini:200"));
    assert_eq!(r.json()["output"][0]["content"][0]["text"], "Hello from gemini fake.");
    // An earlier response only the native provider could know: the fallback cannot serve it.
    let r = responses(
        &gw,
        DEV_KEY,
        &json!({"model": "chain/x", "input": "hi", "previous_response_id": "resp_1"}),
    );
    assert_eq!(
        r.header("x-waygate-attempts"),
        Some("fakeresponses:503"),
        "{}",
        r.text()
    );
    assert_eq!(r.status, 502, "{}", r.text());
}
