//! An Anthropic-backed model through the compiled filter, against the fake
//! Messages API (which checks requests like the real one: `x-api-key`,
//! `anthropic-version`, required `max_tokens`, no unknown fields, block
//! shapes, `tool_use` / `tool_result` pairing): what the Anthropic API gets
//! and gives its own way. What every provider API does alike is in
//! `tests/providers.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{DEV_KEY, Gateway, ask, chain_config, stream_chunks, text_of, tools};
use serde_json::{Value, json};

#[test]
fn the_provider_gets_the_messages_api_with_its_own_credential() {
    let gw = Gateway::start();
    let r = gw.chat(
        json!({"model": "fakeanthropic/echo", "user": "u-7", "seed": 3, "temperature": 0.2,
        "stop": "END", "waygate": {"routing": {"max_provider_tries": 1}},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "one"},
            {"role": "user", "content": "two"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Anthropic names the operator's organization on every answer; the client never sees it.
    assert_eq!(r.header("anthropic-organization-id"), None, "{:?}", r.headers);
    assert!(r.header("request-id").is_some(), "{:?}", r.headers);
    let got = gw.fakes.received();
    assert_eq!(got.len(), 1);
    let req = &got[0];
    assert_eq!(req.path, "/v1/messages");
    assert_eq!(req.header("x-api-key"), Some("fake-anthropic-key"));
    assert_eq!(req.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        req.header("authorization"),
        None,
        "the client's key never goes upstream"
    );
    assert!(req.headers.iter().all(|(_, v)| !v.contains(DEV_KEY)));
    assert_eq!(
        req.body_json().unwrap(),
        json!({"model": "echo", "max_tokens": 1024, "temperature": 0.2, "stop_sequences": ["END"],
            "metadata": {"user_id": "u-7"},
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}]})
    );
}

#[test]
fn tool_calls_and_results_reach_the_provider_as_tool_use_and_tool_result_blocks() {
    let gw = Gateway::start();
    let mut body = ask("fakeanthropic/tool");
    body["tools"] = tools();
    let r = gw.chat(body.clone());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(choice["message"]["content"].is_null());
    let call = &choice["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "add");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args.is_object(), "{args}");

    // The client runs the tool and sends the result back: the fake checks
    // that the tool_result pairs with the tool_use id.
    let history = body["messages"].as_array_mut().unwrap();
    history.push(choice["message"].clone());
    history.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "5"}));
    body["model"] = json!("fakeanthropic/ok");
    let r = gw.chat(body);
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = gw.fakes.received()[1].body_json().unwrap();
    assert_eq!(sent["messages"][1]["content"][0]["type"], "tool_use");
    assert_eq!(sent["messages"][1]["content"][0]["id"], call["id"]);
    assert_eq!(
        sent["messages"][2]["content"],
        json!([{"type": "tool_result", "tool_use_id": call["id"], "content": [{"type": "text", "text": "5"}]}])
    );
}

#[test]
fn an_image_request_reaches_the_provider_as_image_blocks() {
    let gw = Gateway::start();
    let r = gw.chat(json!({"model": "fakeanthropic/ok", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Same cat?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg", "detail": "high"}}]}]}));
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = gw.fakes.received()[0].body_json().unwrap();
    let content = &sent["messages"][0]["content"];
    assert_eq!(content[1]["source"]["type"], "base64");
    assert_eq!(content[1]["source"]["media_type"], "image/png");
    assert!(
        content[1]["source"]["data"]
            .as_str()
            .unwrap()
            .starts_with("iVBORw0KGgo")
    );
    assert_eq!(
        content[2],
        json!({"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}})
    );

    let r = gw.chat(
        json!({"model": "fakeanthropic/ok", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "file:///etc/passwd"}}]}]}),
    );
    r.assert_error(
        400,
        "invalid_request_error",
        "invalid_value",
        Some("messages.0.content.0.image_url.url"),
    );
}

#[test]
fn json_mode_is_emulated_and_a_non_json_answer_is_a_502() {
    let gw = Gateway::start();
    let mut body = ask("fakeanthropic/json");
    body["response_format"] = json!({"type": "json_object"});
    let r = gw.chat(body.clone());
    assert_eq!(r.status, 200, "{}", r.text());
    let content = r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        serde_json::from_str::<Value>(&content).unwrap().is_object(),
        "{content}"
    );
    let sent = gw.fakes.received()[0].body_json().unwrap();
    assert!(sent["system"][0]["text"].as_str().unwrap().contains("JSON"), "{sent}");

    // The fake's plain answer is prose: not silently passed off as JSON.
    body["model"] = json!("fakeanthropic/ok");
    gw.chat(body.clone())
        .assert_error(502, "upstream_error", "invalid_upstream_response", None);
    body["stream"] = json!(true);
    let (chunks, done) = stream_chunks(&gw.chat(body), "fakeanthropic/ok");
    assert!(!done);
    assert_eq!(chunks.last().unwrap()["error"]["code"], "stream_interrupted");
}

#[test]
fn json_schema_is_answered_through_a_forced_tool() {
    let gw = Gateway::start();
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
    let mut body = ask("fakeanthropic/ok");
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "place", "schema": schema}});
    let r = gw.chat(body.clone());
    assert_eq!(r.status, 200, "{}", r.text());
    let choice = &r.json()["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    assert!(choice["message"].get("tool_calls").is_none());
    let answer: Value = serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
    assert!(answer["city"].is_string(), "{answer}");

    body["stream"] = json!(true);
    let (chunks, done) = stream_chunks(&gw.chat(body), "fakeanthropic/ok");
    assert!(done);
    let streamed: Value = serde_json::from_str(&text_of(&chunks, 0)).unwrap();
    assert!(streamed["city"].is_string());
}

#[test]
fn n_above_one_is_refused_unless_another_candidate_can_serve_it() {
    let gw = Gateway::start();
    let mut body = ask("fakeanthropic/ok");
    body["n"] = json!(2);
    gw.chat(body)
        .assert_error(400, "invalid_request_error", "unsupported_parameter", Some("n"));
    assert!(gw.fakes.received().is_empty());

    let gw = Gateway::with_config(&chain_config(&[("fakeanthropic", "ok"), ("fakegemini", "ok")]));
    let r = gw.chat(json!({"model": "chain/x", "n": 2, "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-provider"), Some("fakegemini"));
    assert_eq!(r.json()["choices"].as_array().unwrap().len(), 2);
}

#[test]
fn an_overloaded_anthropic_529_is_a_502_upstream_error() {
    let gw = Gateway::start();
    let r = gw.chat(ask("fakeanthropic/status-529"));
    r.assert_error(502, "upstream_error", "upstream_error", None);
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:529"));
}

#[test]
fn an_overloaded_anthropic_falls_back_to_gemini() {
    let gw = Gateway::with_config(&chain_config(&[("fakeanthropic", "status-529"), ("fakegemini", "ok")]));
    let r = gw.chat(json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:529,fakegemini:200"));
    assert_eq!(r.json()["choices"][0]["message"]["content"], "Hello from gemini fake.");
}
