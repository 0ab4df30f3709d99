//! A Gemini-backed model through the compiled filter, against the fake
//! generativelanguage API (which checks requests like the real one:
//! `x-goog-api-key`, proto field names, non-empty parts, roles, function
//! response turns matching the call turn): what the Gemini API gets and
//! gives its own way. What every provider API does alike is in
//! `tests/providers.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{DEV_KEY, Gateway, ask, stream_chunks, text_of};
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
fn tools_and_results_reach_the_provider_as_declarations_and_function_responses() {
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
fn a_stream_asks_for_stream_generate_content_as_sse() {
    let gw = Gateway::start();
    let mut body = ask("fakegemini/long-2");
    body["stream"] = json!(true);
    let (chunks, done) = stream_chunks(&gw.chat(body), "fakegemini/long-2");
    assert!(done, "Gemini has no terminal event: the finish reason ends the stream");
    assert_eq!(text_of(&chunks, 0), "word1 word2");
    assert_eq!(
        gw.fakes.received()[0].path,
        "/v1beta/models/long-2:streamGenerateContent?alt=sse"
    );
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
