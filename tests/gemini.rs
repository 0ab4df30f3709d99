//! A Gemini-backed model through the compiled filter, against the fake
//! generativelanguage API (which checks requests like the real one:
//! `x-goog-api-key`, proto field names, non-empty parts, roles, function
//! response turns matching the call turn). The client must not be able to
//! tell it from an OpenAI model, but for `x-waygate-provider`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{
    DEV_KEY, Gateway, ask, assert_a_cut_stream_never_ends_with_done, assert_legacy_completions_go_through_chat,
    stream_chunks,
};
use serde_json::{Value, json};

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "add", "description": "Adds two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "multiply",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
    ])
}

/// The text of choice `index` across the chunks.
fn text_of(chunks: &[Value], index: u64) -> String {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["index"] == index)
        .filter_map(|c| c["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn a_chat_request_is_answered_in_openai_shape() {
    let gw = Gateway::start();
    let r = gw.chat(ask("fakegemini/ok"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-waygate-provider"), Some("fakegemini"));
    assert_eq!(r.header("x-waygate-attempts"), Some("fakegemini:200"));
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "fakegemini/ok");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl_"));
    assert_eq!(
        v["choices"],
        json!([{"index": 0, "logprobs": null, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Hello from gemini fake."}}])
    );
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6})
    );
}

#[test]
fn the_provider_gets_generate_content_with_its_own_credential() {
    let gw = Gateway::start();
    let r = gw.chat(
        json!({"model": "fakegemini/echo", "user": "u-7", "seed": 3, "temperature": 1.5,
        "max_tokens": 100, "stop": ["END"], "presence_penalty": 0.5,
        "waygate": {"routing": {"max_provider_tries": 1}},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "one"},
            {"role": "user", "content": "two"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let got = gw.fakes.received();
    assert_eq!(got.len(), 1);
    let req = &got[0];
    assert_eq!(req.path, "/v1beta/models/echo:generateContent");
    assert_eq!(req.header("x-goog-api-key"), Some("fake-gemini-key"));
    assert_eq!(
        req.header("authorization"),
        None,
        "the client's key never goes upstream"
    );
    assert!(req.headers.iter().all(|(_, v)| !v.contains(DEV_KEY)));
    assert_eq!(
        req.body_json().unwrap(),
        json!({
            "contents": [{"role": "user", "parts": [{"text": "one"}, {"text": "two"}]}],
            "systemInstruction": {"parts": [{"text": "Be brief."}], "role": "user"},
            "generationConfig": {"maxOutputTokens": 100, "temperature": 1.5, "stopSequences": ["END"],
                "seed": 3, "presencePenalty": 0.5}})
    );
}

#[test]
fn the_model_name_cannot_steer_the_upstream_path() {
    let gw = Gateway::start();
    let r = gw.chat(ask("fakegemini/../ok?key=x"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        gw.fakes.received()[0].path,
        "/v1beta/models/..%2Fok%3Fkey%3Dx:generateContent"
    );
}

#[test]
fn tool_calls_come_back_in_openai_shape_and_the_conversation_goes_on() {
    let gw = Gateway::start();
    let mut body = ask("fakegemini/tool");
    body["tools"] = tools();
    let r = gw.chat(body.clone());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert!(choice["message"]["content"].is_null());
    let call = &choice["message"]["tool_calls"][0];
    assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "add");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args.is_object(), "{args}");
    let sent = gw.fakes.received()[0].body_json().unwrap();
    assert_eq!(
        sent["tools"][0]["functionDeclarations"][0],
        json!({"name": "add", "description": "Adds two numbers",
            "parametersJsonSchema": tools()[0]["function"]["parameters"]})
    );

    // The tool result goes back as a functionResponse named after the call,
    // found through the id the gateway made up.
    let history = body["messages"].as_array_mut().unwrap();
    history.push(choice["message"].clone());
    history.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "5"}));
    body["model"] = json!("fakegemini/ok");
    let r = gw.chat(body);
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = gw.fakes.received()[1].body_json().unwrap();
    assert_eq!(sent["contents"][1]["role"], "model");
    assert_eq!(sent["contents"][1]["parts"][0]["functionCall"]["name"], "add");
    assert_eq!(
        sent["contents"][2],
        json!({"role": "user", "parts": [{"functionResponse": {"name": "add", "response": {"result": "5"}}}]})
    );
}

#[test]
fn a_parallel_tool_call_stream_has_tool_call_indexes_zero_and_one() {
    let gw = Gateway::start();
    let mut body = ask("fakegemini/tools");
    body["tools"] = tools();
    body["stream"] = json!(true);
    let r = gw.chat(body);
    let (chunks, done) = stream_chunks(&r, "fakegemini/tools");
    assert!(done);
    assert_eq!(
        gw.fakes.received()[0].path,
        "/v1beta/models/tools:streamGenerateContent?alt=sse"
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/delta/tool_calls").and_then(Value::as_array))
        .flatten()
        .collect();
    assert_eq!(deltas.len(), 2, "{chunks:?}");
    assert_eq!(
        (deltas[0]["index"].as_u64(), deltas[1]["index"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(
        (&deltas[0]["function"]["name"], &deltas[1]["function"]["name"]),
        (&json!("add"), &json!("multiply"))
    );
    assert_ne!(deltas[0]["id"], deltas[1]["id"]);
    for d in &deltas {
        assert_eq!(d["type"], "function");
        let args: Value = serde_json::from_str(d["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args.is_object());
    }
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn a_text_stream_has_role_first_usage_when_asked_and_done_last() {
    let gw = Gateway::start();
    let mut body = ask("fakegemini/long-6");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = gw.chat(body);
    let (chunks, done) = stream_chunks(&r, "fakegemini/long-6");
    assert!(done, "Gemini has no terminal event: the finish reason ends the stream");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(text_of(&chunks, 0), "word1 word2 word3 word4 word5 word6");
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(
        chunks[n - 1]["usage"],
        json!({"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8})
    );
    for c in &chunks[..n - 1] {
        assert!(c.get("usage").is_none());
    }
}

#[test]
fn max_tokens_cuts_the_answer_with_finish_reason_length() {
    let gw = Gateway::start();
    let mut body = ask("fakegemini/long-20");
    body["max_tokens"] = json!(3);
    let v = gw.chat(body).json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["message"]["content"], "word1 word2 word3");
}

#[test]
fn n_candidates_are_n_choices_answered_and_streamed() {
    let gw = Gateway::start();
    let mut body = ask("fakegemini/long-3");
    body["n"] = json!(2);
    let v = gw.chat(body.clone()).json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!(
        (choices[0]["index"].as_u64(), choices[1]["index"].as_u64()),
        (Some(0), Some(1))
    );
    assert_eq!(
        gw.fakes.received()[0].body_json().unwrap()["generationConfig"]["candidateCount"],
        2
    );

    body["stream"] = json!(true);
    let (chunks, done) = stream_chunks(&gw.chat(body), "fakegemini/long-3");
    assert!(done);
    assert_eq!(text_of(&chunks, 0), "word1 word2 word3");
    assert_eq!(text_of(&chunks, 1), "word1 word2 word3");
}

#[test]
fn an_image_request_reaches_the_provider_as_inline_and_file_data() {
    let gw = Gateway::start();
    let r = gw.chat(json!({"model": "fakegemini/ok", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "Same cat?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="}},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}));
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = gw.fakes.received()[0].body_json().unwrap();
    let parts = &sent["contents"][0]["parts"];
    assert_eq!(parts[1]["inlineData"]["mimeType"], "image/png");
    assert!(
        parts[1]["inlineData"]["data"]
            .as_str()
            .unwrap()
            .starts_with("iVBORw0KGgo")
    );
    assert_eq!(
        parts[2],
        json!({"fileData": {"mimeType": "image/png", "fileUri": "https://example.com/cat.png"}})
    );

    // Without an extension Gemini cannot be told the file's type.
    let r = gw.chat(
        json!({"model": "fakegemini/ok", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is it?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/photo"}}]}]}),
    );
    r.assert_error(
        400,
        "invalid_request_error",
        "invalid_value",
        Some("messages.0.content.1.image_url.url"),
    );
}

#[test]
fn json_mode_and_json_schema_are_native() {
    let gw = Gateway::start();
    let mut body = ask("fakegemini/ok");
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
    assert_eq!(
        gw.fakes.received()[0].body_json().unwrap()["generationConfig"],
        json!({"responseMimeType": "application/json"})
    );

    let schema = json!({"type": "object", "properties": {"answer": {"type": "string"}}});
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "a", "schema": schema}});
    assert_eq!(gw.chat(body).status, 200);
    assert_eq!(
        gw.fakes.received()[1].body_json().unwrap()["generationConfig"],
        json!({"responseMimeType": "application/json", "responseJsonSchema": schema})
    );
}

#[test]
fn gemini_3_history_from_elsewhere_carries_the_signature_stand_in() {
    let gw = Gateway::start();
    let r = gw.chat(
        json!({"model": "fakegemini/gemini-3-ok", "tools": tools(), "messages": [
        {"role": "user", "content": "2 and 3?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "toolu_01A", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}}]},
        {"role": "tool", "tool_call_id": "toolu_01A", "content": "5"}]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let sent = gw.fakes.received()[0].body_json().unwrap();
    assert_eq!(
        sent["contents"][1]["parts"][0]["thoughtSignature"],
        "skip_thought_signature_validator"
    );
}

#[test]
fn provider_errors_become_the_contract_envelope() {
    let gw = Gateway::start();
    let v = gw
        .chat(ask("fakegemini/status-400"))
        .assert_error(400, "invalid_request_error", "INVALID_ARGUMENT", None);
    assert_eq!(v["error"]["provider"], "fakegemini");
    assert_eq!(v["error"]["message"], "Request contains an invalid argument.");
    let r = gw.chat(ask("fakegemini/status-429"));
    r.assert_error(429, "rate_limit_error", "upstream_rate_limited", None);
    assert_eq!(r.header("retry-after"), Some("7"));
    assert_eq!(r.header("x-waygate-attempts"), Some("fakegemini:429"));
    gw.chat(ask("fakegemini/status-503"))
        .assert_error(502, "upstream_error", "upstream_error", None);
    gw.chat(ask("fakegemini/garbage"))
        .assert_error(502, "upstream_error", "invalid_upstream_response", None);
}

#[test]
fn an_error_chunk_ends_the_stream_with_one_error_event() {
    let gw = Gateway::start();
    let mut body = ask("fakegemini/stream-error");
    body["stream"] = json!(true);
    let (chunks, done) = stream_chunks(&gw.chat(body), "fakegemini/stream-error");
    assert!(!done);
    assert_eq!(
        chunks.last().unwrap()["error"],
        json!({"message": "The model is overloaded. Please try again later.", "type": "upstream_error",
            "param": null, "code": "stream_interrupted"})
    );
    assert_eq!(chunks.iter().filter(|c| c.get("error").is_some()).count(), 1);
}

#[test]
fn a_garbage_stream_ends_with_the_error_event() {
    let gw = Gateway::start();
    let mut body = ask("fakegemini/garbage");
    body["stream"] = json!(true);
    let (chunks, done) = stream_chunks(&gw.chat(body), "fakegemini/garbage");
    assert!(!done);
    assert_eq!(chunks.last().unwrap()["error"]["code"], "stream_interrupted");
}

#[test]
fn a_stream_cut_mid_way_never_ends_with_done() {
    assert_a_cut_stream_never_ends_with_done(&Gateway::start(), "fakegemini/cut-3");
}

#[test]
fn legacy_completions_go_through_chat_both_ways() {
    let gw = Gateway::start();
    let sent = assert_legacy_completions_go_through_chat(&gw, "fakegemini", "Hello from gemini fake.");
    assert_eq!(
        sent["contents"],
        json!([{"role": "user", "parts": [{"text": "Say hello"}]}])
    );
}
