//! An Anthropic-backed model through the compiled filter, against the fake
//! Messages API (which checks requests like the real one: `x-api-key`,
//! `anthropic-version`, required `max_tokens`, no unknown fields, block
//! shapes, `tool_use` / `tool_result` pairing). The client must not be able
//! to tell it from an OpenAI model, but for `x-waygate-provider`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{
    DEV_KEY, Gateway, ask, assert_a_cut_stream_never_ends_with_done, assert_legacy_completions_go_through_chat,
    chain_config, stream_chunks,
};
use serde_json::{Value, json};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "add", "description": "Adds two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"]}}},
        {"type": "function", "function": {"name": "multiply",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
    ])
}

fn text_of(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/delta/content").and_then(Value::as_str))
        .collect()
}

#[test]
fn a_chat_request_is_answered_in_openai_shape() {
    let gw = Gateway::start();
    let r = gw.chat(ask("fakeanthropic/ok"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-waygate-provider"), Some("fakeanthropic"));
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:200"));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "fakeanthropic/ok");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl_"));
    assert_eq!(
        v["choices"],
        json!([{"index": 0, "logprobs": null, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Hello from anthropic fake."}}])
    );
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6})
    );
}

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
fn tool_calls_come_back_in_openai_shape_and_the_conversation_goes_on() {
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
fn a_parallel_tool_call_stream_has_tool_call_indexes_zero_and_one() {
    let gw = Gateway::start();
    let mut body = ask("fakeanthropic/tools");
    body["tools"] = tools();
    body["stream"] = json!(true);
    let r = gw.chat(body);
    let (chunks, done) = stream_chunks(&r, "fakeanthropic/tools");
    assert!(done);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut calls: Vec<(String, String, String)> = Vec::new();
    for c in &chunks {
        for d in c
            .pointer("/choices/0/delta/tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let i = d["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                calls.push((
                    d["id"].as_str().unwrap().to_string(),
                    d["function"]["name"].as_str().unwrap().to_string(),
                    String::new(),
                ));
            }
            calls[i].2.push_str(d["function"]["arguments"].as_str().unwrap_or(""));
        }
    }
    assert_eq!(calls.len(), 2, "{chunks:?}");
    assert_eq!((calls[0].1.as_str(), calls[1].1.as_str()), ("add", "multiply"));
    assert_ne!(calls[0].0, calls[1].0);
    for (_, _, args) in &calls {
        assert!(serde_json::from_str::<Value>(args).unwrap().is_object(), "{args}");
    }
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn a_text_stream_has_role_first_usage_when_asked_and_done_last() {
    let gw = Gateway::start();
    let mut body = ask("fakeanthropic/long-6");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = gw.chat(body);
    let (chunks, done) = stream_chunks(&r, "fakeanthropic/long-6");
    assert!(done);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(text_of(&chunks), "word1 word2 word3 word4 word5 word6");
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 6);
    for c in &chunks[..n - 1] {
        assert!(c.get("usage").is_none());
    }
    assert_eq!(gw.fakes.received()[0].body_json().unwrap()["stream"], true);
}

#[test]
fn max_tokens_cuts_the_answer_with_finish_reason_length() {
    let gw = Gateway::start();
    let mut body = ask("fakeanthropic/long-20");
    body["max_completion_tokens"] = json!(3);
    let v = gw.chat(body).json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["message"]["content"], "word1 word2 word3");
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
    let streamed: Value = serde_json::from_str(&text_of(&chunks)).unwrap();
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
fn provider_errors_become_the_contract_envelope() {
    let gw = Gateway::start();
    let r = gw.chat(ask("fakeanthropic/status-400"));
    let v = r.assert_error(400, "invalid_request_error", "invalid_request_error", None);
    assert_eq!(v["error"]["provider"], "fakeanthropic");
    assert_eq!(
        v["error"]["message"],
        "The fake provider was asked to refuse this request."
    );
    let r = gw.chat(ask("fakeanthropic/status-529"));
    r.assert_error(502, "upstream_error", "upstream_error", None);
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:529"));
    let r = gw.chat(ask("fakeanthropic/status-429"));
    r.assert_error(429, "rate_limit_error", "upstream_rate_limited", None);
    assert_eq!(r.header("retry-after"), Some("7"));
    gw.chat(ask("fakeanthropic/garbage"))
        .assert_error(502, "upstream_error", "invalid_upstream_response", None);
}

#[test]
fn an_overloaded_anthropic_falls_back_to_gemini() {
    let gw = Gateway::with_config(&chain_config(&[("fakeanthropic", "status-529"), ("fakegemini", "ok")]));
    let r = gw.chat(json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:529,fakegemini:200"));
    assert_eq!(r.json()["choices"][0]["message"]["content"], "Hello from gemini fake.");
}

#[test]
fn an_error_event_ends_the_stream_with_one_error_event() {
    let gw = Gateway::start();
    let mut body = ask("fakeanthropic/stream-error");
    body["stream"] = json!(true);
    let (chunks, done) = stream_chunks(&gw.chat(body), "fakeanthropic/stream-error");
    assert!(!done);
    let last = chunks.last().unwrap();
    assert_eq!(
        last["error"],
        json!({"message": "Overloaded", "type": "upstream_error", "param": null, "code": "stream_interrupted"})
    );
    assert_eq!(chunks.iter().filter(|c| c.get("error").is_some()).count(), 1);
}

#[test]
fn a_stream_cut_mid_way_never_ends_with_done() {
    assert_a_cut_stream_never_ends_with_done(&Gateway::start(), "fakeanthropic/cut-4");
}

#[test]
fn legacy_completions_go_through_chat_both_ways() {
    let gw = Gateway::start();
    let sent = assert_legacy_completions_go_through_chat(&gw, "fakeanthropic", "Hello from anthropic fake.");
    assert_eq!(
        sent["messages"],
        json!([{"role": "user", "content": [{"type": "text", "text": "Say hello"}]}])
    );
}
