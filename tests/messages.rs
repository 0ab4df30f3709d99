//! `POST /messages` through the compiled filter: an Anthropic provider gets the client's
//! request as it came (what only Anthropic reads survives), other providers get it
//! translated, a failed Anthropic provider falls back to an OpenAI-compatible one
//! (streamed and not, in the run's fallback shape), and errors are in Anthropic's envelope.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{DEV_KEY, Gateway, Response, chain_config};
use serde_json::{Value, json};

fn messages(gw: &Gateway, body: &str, extra: &[(&str, &str)]) -> Response {
    let mut headers = vec![("x-api-key", DEV_KEY), ("content-type", "application/json")];
    headers.extend_from_slice(extra);
    gw.send("POST", "/api/v1/messages?beta=true", &headers, body.as_bytes())
}

/// What only Anthropic reads: cache markers, a signed thinking block, a document.
const CLAUDE_TURN: &str = r#"{"model":"fakeanthropic/echo","max_tokens":1024,"system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"notes"}},{"type":"text","text":"Summarise."}]},{"role":"assistant","content":[{"type":"thinking","thinking":"Short notes.","signature":"EqQBCkgIARABGAIiQL"},{"type":"text","text":"Notes."}]},{"role":"user","content":"Again, shorter.","cache_control":null}],"thinking":{"type":"enabled","budget_tokens":1024},"context_management":{"edits":[{"type":"clear_thinking_20251015","keep":"all"}]}}"#;

#[test]
fn an_anthropic_provider_gets_the_clients_request_as_it_came() {
    let gw = Gateway::start();
    let r = messages(&gw, CLAUDE_TURN, &[("anthropic-beta", "context-management-2025-06-27")]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-provider"), Some("fakeanthropic"));
    let answer = r.json();
    assert_eq!(answer["model"], "fakeanthropic/echo");
    let got = gw.fakes.received();
    assert_eq!(got.len(), 1);
    let sent = std::str::from_utf8(&got[0].body).unwrap();
    // Every member but the model, byte for byte, in the client's order.
    let expected = CLAUDE_TURN.replace(r#""model":"fakeanthropic/echo","#, "");
    assert_eq!(
        sent,
        format!("{}{}", &expected[..expected.len() - 1], r#","model":"echo"}"#)
    );
    assert_eq!(got[0].header("anthropic-beta"), Some("context-management-2025-06-27"));
    assert_eq!(got[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(got[0].header("x-api-key"), Some(waygate_fakes::ANTHROPIC_KEY));
    // Its usage counts as the access log says.
    let usage = &answer["usage"];
    let logged = format!(
        "model=fakeanthropic/echo provider=fakeanthropic attempts=fakeanthropic:200 status=200 prompt_tokens={} completion_tokens={}",
        usage["input_tokens"].as_u64().unwrap()
            + usage["cache_creation_input_tokens"].as_u64().unwrap_or(0)
            + usage["cache_read_input_tokens"].as_u64().unwrap_or(0),
        usage["output_tokens"]
    );
    std::thread::sleep(std::time::Duration::from_millis(1200));
    assert!(gw.logs().contains(&logged), "{logged}\n{}", gw.logs());
}

#[test]
fn an_anthropic_stream_passes_event_for_event() {
    let gw = Gateway::start();
    let body = json!({"model": "fakeanthropic/long-4", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "count"}]});
    let r = messages(&gw, &body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let text = r.text();
    let types: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(types.first(), Some(&"message_start"));
    assert_eq!(types.last(), Some(&"message_stop"));
    let deltas: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter(|e| e["delta"]["type"] == "text_delta")
        .map(|e| e["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas, "word1 word2 word3 word4");
}

#[test]
fn a_failed_anthropic_provider_falls_back_to_an_openai_one_translated() {
    let gw = Gateway::with_config(&chain_config(&[("fakeanthropic", "status-529"), ("fake", "long-3")]));
    let body = json!({"model": "chain/x", "max_tokens": 100, "messages": [{"role": "user", "content": "count"}]});
    let r = messages(&gw, &body.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:529,fake:200"));
    let v = r.json();
    assert_eq!(
        (v["type"].as_str(), v["model"].as_str()),
        (Some("message"), Some("chain/x"))
    );
    assert_eq!(v["content"], json!([{"type": "text", "text": "word1 word2 word3"}]));
    let got = gw.fakes.received();
    assert_eq!(got[1].path_only(), "/v1/chat/completions");

    let mut streamed = body.clone();
    streamed["stream"] = true.into();
    let r = messages(&gw, &streamed.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:529,fake:200"));
    let text = r.text();
    assert!(text.starts_with("event: message_start\n"), "{text}");
    assert!(
        text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{text}"
    );
}

#[test]
fn errors_are_in_anthropics_envelope_before_any_provider_is_asked() {
    let gw = Gateway::start();
    let error = |r: &Response, status: u16, kind: &str| {
        assert_eq!(r.status, status, "{}", r.text());
        let v = r.json();
        assert_eq!(
            (v["type"].as_str(), v["error"]["type"].as_str()),
            (Some("error"), Some(kind)),
            "{v}"
        );
        v["error"]["message"].as_str().unwrap().to_string()
    };
    let r = gw.send(
        "POST",
        "/api/v1/messages",
        &[("x-api-key", "wrong"), ("content-type", "application/json")],
        b"{}",
    );
    error(&r, 401, "authentication_error");
    let r = messages(
        &gw,
        r#"{"model":"atlantis/x","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
        &[],
    );
    error(&r, 404, "not_found_error");
    let r = messages(
        &gw,
        r#"{"model":"fake/ok","max_tokens":5,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}"#,
        &[],
    );
    let message = error(&r, 400, "invalid_request_error");
    assert!(message.contains("messages.0.content.0.type"), "{message}");
    let r = messages(&gw, r#"{"model":"fake/ok","messages":[]}"#, &[]);
    assert!(error(&r, 400, "invalid_request_error").contains("max_tokens"));
    assert!(gw.fakes.received().is_empty());
}

fn count_tokens(gw: &Gateway, body: &Value) -> Response {
    let headers = [("x-api-key", DEV_KEY), ("content-type", "application/json")];
    gw.send(
        "POST",
        "/api/v1/messages/count_tokens?beta=true",
        &headers,
        body.to_string().as_bytes(),
    )
}

#[test]
fn token_counts_come_from_the_provider_that_counts_and_are_estimated_otherwise() {
    let gw = Gateway::with_config(&chain_config(&[("fakeanthropic", "status-529"), ("fakegemini", "ok")]));
    let turn = json!({"system": "Be brief and kind.",
        "messages": [{"role": "user", "content": "How many words are in this question?"}]});
    let with = |model: &str| {
        let mut body = turn.clone();
        body["model"] = model.into();
        body
    };
    // What the same provider reports as a message's input tokens.
    let reported = |model: &str| {
        let mut body = with(model);
        body["max_tokens"] = 50.into();
        let r = messages(&gw, &body.to_string(), &[]);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["usage"]["input_tokens"].as_u64().unwrap()
    };
    for model in ["fakeanthropic/ok", "fakegemini/ok"] {
        gw.fakes.clear_received();
        let r = count_tokens(&gw, &with(model));
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        let provider = model.split('/').next().unwrap();
        assert_eq!(r.header("x-waygate-provider"), Some(provider));
        let counted = r.json()["input_tokens"].as_u64().unwrap();
        let got = gw.fakes.received();
        assert_eq!(got.len(), 1, "{model}");
        assert!(got[0].path_only().ends_with(if provider == "fakeanthropic" {
            "/messages/count_tokens"
        } else {
            ":countTokens"
        }));
        assert_eq!(counted, reported(model), "{model}: the provider's own count");
    }
    // The provider got the client's request (no max_tokens added) and its own key.
    gw.fakes.clear_received();
    count_tokens(&gw, &with("fakeanthropic/ok"));
    let got = gw.fakes.received();
    let sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(
        sent,
        json!({"system": "Be brief and kind.", "messages": turn["messages"], "model": "ok"})
    );
    assert_eq!(got[0].header("x-api-key"), Some(waygate_fakes::ANTHROPIC_KEY));

    // A failing Anthropic count falls back to the next provider that counts.
    let r = count_tokens(&gw, &with("chain/x"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("fakeanthropic:529,fakegemini:200"));

    // An OpenAI-compatible provider has no count: the filter's estimate, no provider asked.
    gw.fakes.clear_received();
    let r = count_tokens(&gw, &with("fake/ok"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-provider"), None);
    let bytes = (turn["system"].to_string().len() + turn["messages"].to_string().len()) as u64;
    assert_eq!(r.json(), json!({"input_tokens": bytes.div_ceil(4)}));
    assert!(gw.fakes.received().is_empty());
}

#[test]
fn a_translated_providers_thoughts_come_back_as_thinking_and_never_go_to_anthropic_unsigned() {
    let gw = Gateway::start();
    let ask = json!({"model": "fakegemini/ok", "max_tokens": 2000,
        "thinking": {"type": "enabled", "budget_tokens": 10000},
        "messages": [{"role": "user", "content": "Add 2 and 3."}]});
    let r = messages(&gw, &ask.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    let content = r.json()["content"].clone();
    // The budget became Gemini's thinkingBudget for a medium effort, and its thoughts a thinking block.
    assert_eq!(
        content[0],
        json!({"type": "thinking", "thinking": "Thinking within 8192 tokens.", "signature": ""})
    );
    assert_eq!(content[1]["type"], "text");
    let got = gw.fakes.received();
    let sent: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(
        sent["generationConfig"]["thinkingConfig"],
        json!({"thinkingBudget": 8192, "includeThoughts": true})
    );

    let mut streamed = ask.clone();
    streamed["stream"] = true.into();
    let r = messages(&gw, &streamed.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    let events: Vec<Value> = r
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let first_block = events.iter().find(|e| e["type"] == "content_block_start").unwrap();
    assert_eq!(first_block["content_block"]["type"], "thinking");
    let thinking: String = events
        .iter()
        .filter(|e| e["delta"]["type"] == "thinking_delta")
        .map(|e| e["delta"]["thinking"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(thinking, "Thinking within 8192 tokens.");

    // The client sends that turn back to a model Anthropic serves: the
    // unsigned block stays behind, the rest goes as it came.
    gw.fakes.clear_received();
    let next = json!({"model": "fakeanthropic/ok", "max_tokens": 100, "messages": [
        {"role": "user", "content": "Add 2 and 3."},
        {"role": "assistant", "content": content},
        {"role": "user", "content": "And 4?"}]});
    let r = messages(&gw, &next.to_string(), &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    let sent: Value = serde_json::from_slice(&gw.fakes.received()[0].body).unwrap();
    assert_eq!(sent["messages"][1]["content"], json!([content[1].clone()]));
    assert_eq!(sent["messages"][2], next["messages"][2]);
}

#[test]
fn top_k_reaches_a_gemini_provider_and_is_dropped_for_an_openai_compatible_one() {
    let gw = Gateway::start();
    for (model, sent) in [("fakegemini/ok", Some(7)), ("fake/ok", None)] {
        gw.fakes.clear_received();
        let body =
            json!({"model": model, "max_tokens": 50, "top_k": 7, "messages": [{"role": "user", "content": "hi"}]});
        let r = messages(&gw, &body.to_string(), &[]);
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        let got: Value = serde_json::from_slice(&gw.fakes.received()[0].body).unwrap();
        assert_eq!(
            got.pointer("/generationConfig/topK").and_then(Value::as_u64),
            sent,
            "{model}: {got}"
        );
        assert!(got.get("top_k").is_none(), "{model}: {got}");
    }
}
