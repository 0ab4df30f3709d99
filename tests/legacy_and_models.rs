//! Legacy `/completions` (native and translated to chat), `GET /models`, and
//! the plugin's access log line in Envoy's log.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use std::time::Duration;

use common::{DEV_KEY, Gateway, NARROW_KEY, wait_for};
use serde_json::json;

#[test]
fn legacy_goes_to_the_providers_own_completions_when_it_has_one() {
    let gw = Gateway::start();
    let r = gw.post(
        "/api/v1/completions",
        r#"{"model":"fake/ok","prompt":"Say hi","max_tokens":5}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl_"));
    assert_eq!(v["model"], "fake/ok");
    assert!(!v["choices"][0]["text"].as_str().unwrap().is_empty());
    assert!(v["usage"]["total_tokens"].as_u64().unwrap() > 0);
    assert_eq!(gw.fakes.received()[0].path_only(), "/v1/completions");
}

#[test]
fn legacy_is_translated_to_chat_for_providers_without_it() {
    let gw = Gateway::start();
    let r = gw.post(
        "/api/v1/completions",
        r#"{"model":"fakechat/ok","prompt":"Say hi","temperature":0.5}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl_"));
    assert_eq!(v["model"], "fakechat/ok");
    let choice = &v["choices"][0];
    assert!(choice["text"].as_str().unwrap().contains("fake"), "{v}");
    assert_eq!(choice["finish_reason"], "stop");
    let sent = &gw.fakes.received()[0];
    assert_eq!(sent.path_only(), "/v1/chat/completions");
    let body = sent.body_json().unwrap();
    assert_eq!(body["messages"], json!([{"role": "user", "content": "Say hi"}]));
    assert_eq!(body["temperature"], 0.5);
}

#[test]
fn legacy_streams_are_text_completion_chunks_both_ways() {
    let gw = Gateway::start();
    for model in ["fake/long-4", "fakechat/long-4"] {
        let r = gw.post(
            "/api/v1/completions",
            &json!({"model": model, "prompt": "count", "stream": true}).to_string(),
        );
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        assert_eq!(r.header("content-type"), Some("text/event-stream"));
        let chunks = r.done_chunks();
        let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
        assert_eq!(text.split_whitespace().count(), 4, "{model}: {chunks:?}");
        for c in &chunks {
            assert_eq!(c["object"], "text_completion", "{model}");
            assert_eq!(c["model"], model);
            assert!(c["id"].as_str().unwrap().starts_with("cmpl_"));
        }
    }
}

#[test]
fn models_lists_what_the_key_may_use() {
    let gw = Gateway::start();
    let auth = format!("Bearer {DEV_KEY}");
    let r = gw.send("GET", "/api/v1/models", &[("authorization", auth.as_str())], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let v = r.json();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    // demo/keyless's only provider has no credential: it could not be served.
    assert_eq!(ids, ["demo/chat", "demo/spare"]);
    assert_eq!(
        v["data"][0],
        json!({"id": "demo/chat", "object": "model", "created": 0, "owned_by": "demo", "providers": ["fake"]})
    );
    // Only the providers that can be tried, and the model is served by them.
    assert_eq!(v["data"][1]["providers"], json!(["fake"]));
    let r = gw.chat(json!({"model": "demo/spare", "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(
        (r.status, r.header("x-waygate-provider")),
        (200, Some("fake")),
        "{}",
        r.text()
    );
    // One entry (`models.retrieve`), its id as is or percent-encoded.
    let auth = format!("Bearer {DEV_KEY}");
    for path in [
        "/api/v1/models/demo/chat",
        "/api/v1/models/demo%2Fchat",
        "/api/v1/models/demo%2fchat",
    ] {
        let r = gw.send("GET", path, &[("authorization", auth.as_str())], b"");
        assert_eq!((r.status, r.json()), (200, v["data"][0].clone()), "{path}");
    }
    for path in [
        "/api/v1/models/demo/keyless",
        "/api/v1/models/nosuch",
        "/api/v1/models/",
    ] {
        let r = gw.send("GET", path, &[("authorization", auth.as_str())], b"");
        r.assert_error(404, "invalid_request_error", "model_not_found", Some("model"));
    }
    let r = gw.send(
        "POST",
        "/api/v1/models/demo/chat",
        &[("authorization", auth.as_str())],
        b"",
    );
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));
    let auth = format!("Bearer {NARROW_KEY}");
    let r = gw.send("GET", "/api/v1/models", &[("authorization", auth.as_str())], b"");
    assert_eq!(r.json()["data"], json!([]), "the narrow key may use fake/ok* only");
    let r = gw.send(
        "GET",
        "/api/v1/models/demo/chat",
        &[("authorization", auth.as_str())],
        b"",
    );
    r.assert_error(404, "invalid_request_error", "model_not_found", Some("model"));
    let r = gw.send("GET", "/api/v1/models", &[], b"");
    r.assert_error(401, "authentication_error", "missing_api_key", None);
}

#[test]
fn a_listed_model_routes_to_its_endpoint() {
    let gw = Gateway::start();
    let r = gw.chat(json!({"model": "demo/chat", "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "demo/chat");
    assert_eq!(gw.fakes.received()[0].body_json().unwrap()["model"], "ok");
}

#[test]
fn one_access_log_line_per_request_without_secrets() {
    let gw = Gateway::start();
    let auth = format!("Bearer {DEV_KEY}");
    let r = gw.send(
        "POST",
        "/api/v1/chat/completions",
        &[
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
            ("x-title", "Test App"),
            ("http-referer", "https://app.example"),
        ],
        br#"{"model":"fake/ok","messages":[{"role":"user","content":"a secret prompt"}]}"#,
    );
    assert_eq!(r.status, 200);
    let logs = gw.logs();
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains("waygate access")).collect();
    assert_eq!(lines.len(), 1, "{logs}");
    let line = lines[0];
    for needle in [
        "key=dev",
        "model=fake/ok",
        "provider=fake",
        "attempts=fake:200",
        "status=200",
        "title=\"Test App\"",
        "referer=\"https://app.example\"",
    ] {
        assert!(line.contains(needle), "{needle} missing in {line}");
    }
    assert!(
        line.contains("prompt_tokens=") && !line.contains("prompt_tokens=0 "),
        "{line}"
    );
    for secret in [DEV_KEY, "fake-openai-key", "a secret prompt"] {
        assert!(!logs.contains(secret), "{secret} leaked into the log: {logs}");
    }
    // A refused model is logged as the client named it too.
    let r = gw.chat(json!({"model": "nosuch/model-x", "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 404, "{}", r.text());
    wait_for(Duration::from_secs(5), "the refused request's access line", || {
        gw.logs()
            .contains("model=nosuch/model-x provider=- attempts=- status=404 ")
    });
}
