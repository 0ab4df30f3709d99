//! Chat completions through the compiled filter: answers, streams, and what
//! the provider receives.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{DEV_KEY, Gateway};
use serde_json::{Value, json};

fn hello(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Say hello"}]})
}

#[test]
fn a_minimal_chat_request_is_answered_in_openai_shape() {
    let gw = Gateway::start();
    let r = gw.chat(hello("fake/ok"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-waygate-provider"), Some("fake"));
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:200"));
    // The provider's own headers pass (the answer is rewritten in Envoy's buffer,
    // not replaced by a local reply).
    assert_eq!(r.header("openai-processing-ms"), Some("3"), "{:?}", r.headers);
    assert!(r.header("x-envoy-upstream-service-time").is_some(), "{:?}", r.headers);
    // But not what speaks for the provider's origin (the bootstrap's virtual host drops it).
    assert_eq!(r.header("alt-svc"), None, "{:?}", r.headers);
    assert_eq!(r.header("strict-transport-security"), None, "{:?}", r.headers);
    assert_eq!(r.header("set-cookie"), None, "{:?}", r.headers);
    // Nor what names the operator's account with the provider.
    assert_eq!(r.header("openai-organization"), None, "{:?}", r.headers);
    assert_eq!(r.header("openai-project"), None, "{:?}", r.headers);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "fake/ok", "the client's model id, exactly");
    let id = v["id"].as_str().unwrap();
    let suffix = id.strip_prefix("chatcmpl_").unwrap();
    assert!(
        suffix.len() >= 24 && suffix.bytes().all(|b| b.is_ascii_alphanumeric()),
        "{id}"
    );
    assert!(v["created"].as_u64().unwrap() > 1_700_000_000);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().contains("fake"));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );
}

#[test]
fn the_provider_gets_its_own_credential_model_and_path_never_the_clients() {
    let gw = Gateway::start();
    let mut body = hello("fake/echo");
    body["waygate"] = json!({"routing": {"max_provider_tries": 1}});
    body["tools"] = json!([{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]);
    let r = gw.chat(body);
    assert_eq!(r.status, 200, "{}", r.text());
    let got = gw.fakes.received();
    assert_eq!(got.len(), 1);
    let req = &got[0];
    assert_eq!(req.path_only(), "/v1/chat/completions");
    assert_eq!(req.header("authorization"), Some("Bearer fake-openai-key"));
    assert_eq!(
        req.header("x-waygate-cluster"),
        None,
        "the route drops the cluster header"
    );
    assert_eq!(req.header("host"), Some("fake.local"));
    let sent = req.body_json().unwrap();
    assert_eq!(sent["model"], "echo");
    assert!(sent.get("waygate").is_none(), "routing field removed");
    assert_eq!(
        sent["tools"][0]["function"]["name"], "lookup",
        "tools pass through untouched"
    );
    assert!(!String::from_utf8_lossy(&req.body).contains(DEV_KEY));
    assert!(
        req.headers.iter().all(|(_, v)| !v.contains(DEV_KEY)),
        "client key leaked: {:?}",
        req.headers
    );
}

/// The filter reads the usual body's text without a DOM and leaves
/// anything its walk is not sure of to serde's DOM (`src/request/view.rs`).
/// Either way the provider gets the client's members byte for byte, only the model
/// renamed (written last, as the model is here) and an escaped name written
/// plainly.
#[test]
fn bodies_either_form_reads_reach_the_provider_byte_for_byte() {
    let gw = Gateway::start();
    let message = r#"{"role":"user","content":"caf\u00e9 \ud83d\ude00 \"quoted\""}"#;
    let deep = format!(r#""metadata":{{"a":{}{}}}"#, "[".repeat(70), "]".repeat(70));
    for (sent, expected) in [
        // The walk's: plain JSON.
        (
            r#""temperature":0.7,"max_tokens":64,"metadata":{"a":[1,{"b":null}]}"#,
            None,
        ),
        // The DOM's: exponents, a repeated name, an escaped name, deep nesting.
        (r#""temperature":7e-1,"logit_bias":{"50256":-1E2}"#, None),
        (r#""messages":[],"seed":1"#, None),
        (r#""m\u0065tadata":{"a":"b"}"#, Some(r#""metadata":{"a":"b"}"#)),
        (deep.as_str(), None),
    ] {
        gw.fakes.clear_received();
        let body = format!(r#"{{{sent},"messages":[{message}],"model":"fake/echo"}}"#);
        let r = gw.post("/api/v1/chat/completions", &body);
        assert_eq!(r.status, 200, "{body}: {}", r.text());
        let got = gw.fakes.received();
        assert_eq!(got.len(), 1);
        let expected = expected.unwrap_or(sent);
        assert_eq!(
            String::from_utf8_lossy(&got[0].body),
            format!(r#"{{{expected},"messages":[{message}],"model":"echo"}}"#)
        );
    }
    // And both refuse alike, naming the field.
    for body in [
        r#"{"model":"fake/echo","messages":[{"role":"user","content":"x"}],"temperature":2.5}"#,
        r#"{"model":"fake/echo","messages":[{"role":"user","content":"x"}],"temperature":25e-1}"#,
    ] {
        let r = gw.post("/api/v1/chat/completions", body);
        assert_eq!(r.status, 400, "{body}");
        assert_eq!(r.json()["error"]["param"], "temperature", "{body}");
    }
}

#[test]
fn a_stream_is_rewritten_chunk_by_chunk_and_ends_with_done() {
    let gw = Gateway::start();
    let mut body = hello("fake/long-12");
    body["stream"] = json!(true);
    let r = gw.chat(body);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("x-waygate-provider"), Some("fake"));
    assert_eq!(r.header("openai-organization"), None, "{:?}", r.headers);
    let chunks = r.done_chunks();
    assert!(chunks.len() >= 12, "{chunks:?}");
    let id = chunks[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl_"));
    for c in &chunks {
        assert_eq!(c["id"], id);
        assert_eq!(c["model"], "fake/long-12");
        assert_eq!(c["created"], chunks[0]["created"]);
        assert_eq!(c["object"], "chat.completion.chunk");
        assert!(c.get("usage").is_none(), "usage only when asked: {c}");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text.split_whitespace().count(), 12, "{text:?}");
    // The provider was asked for usage even though the client was not.
    let sent = gw.fakes.received()[0].body_json().unwrap();
    assert_eq!(sent["stream_options"]["include_usage"], true);
}

#[test]
fn include_usage_adds_one_usage_chunk_right_before_done() {
    let gw = Gateway::start();
    let mut body = hello("fake/long-3");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = gw.chat(body);
    let events = r.events();
    let n = events.len();
    assert_eq!(events[n - 1], "[DONE]");
    let usage: Value = serde_json::from_str(&events[n - 2]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    for e in &events[..n - 2] {
        let c: Value = serde_json::from_str(e).unwrap();
        assert!(c.get("usage").is_none());
    }
}
