//! The Responses API over the chat form: requests as the clients send them
//! (Codex CLI's shape, the SDKs'), refusals, answers, and streams replayed
//! from the recorded provider streams in `tests/fixtures/` under every
//! chunking.

use serde_json::{Value, json};

use super::*;
use crate::config::Api;
use crate::inbound::Client;
use crate::inbound::recorded::{self, TEXT_STREAMS, TOOL_STREAMS};
use crate::request::{Operation, parse};
use crate::stream::StreamRewriter;

fn chat_of(request: Value) -> Result<Value, ApiError> {
    let (chat, _) = to_chat(request.to_string().as_bytes(), "waygate")?;
    Ok(serde_json::from_slice(&chat).unwrap())
}

/// Why no chat provider may serve `request`: invalid for every provider, or
/// left to a provider that serves the Responses API itself.
fn refused(request: Value) -> (u16, String, Option<String>) {
    let e = match to_chat(request.to_string().as_bytes(), "waygate") {
        Err(e) => e,
        Ok((_, echo)) => echo.untranslatable.expect("a chat provider can serve it"),
    };
    (e.status, e.code, e.param)
}

fn stamp() -> Stamp {
    Stamp {
        op: Operation::Chat,
        id: "resp_ABCDEFGHIJKLMNOPQRSTUVWX".into(),
        model: "fake/ok".into(),
        created: 1_700_000_000,
    }
}

#[test]
fn a_codex_turn_becomes_a_chat_request_with_its_tool_round_trip() {
    // The members `codex exec` sends (issue #45), with a finished tool call.
    let chat = chat_of(json!({
        "model": "fake/tool",
        "instructions": "You are Codex.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Sandbox: read-only."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Running ls."}]},
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"command\":[\"ls\"]}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "README.md\nsrc"}
        ],
        "tools": [{"type": "function", "name": "shell", "description": "Runs a command.", "strict": false,
                   "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}],
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199-session",
        "client_metadata": {"originator": "codex_exec"},
        "waygate": {"routing": {"allow_fallbacks": false}}
    }))
    .unwrap();
    assert_eq!(
        chat,
        json!({
            "model": "fake/tool",
            "messages": [
                {"role": "system", "content": "You are Codex."},
                {"role": "developer", "content": [{"type": "text", "text": "Sandbox: read-only."}]},
                {"role": "user", "content": [{"type": "text", "text": "List the files."}]},
                {"role": "assistant", "content": "Running ls.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": "{\"command\":[\"ls\"]}"}}
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "README.md\nsrc"}
            ],
            "tools": [{"type": "function", "function": {"name": "shell", "description": "Runs a command.", "strict": false,
                       "parameters": {"type": "object", "properties": {"command": {"type": "array"}}}}}],
            "tool_choice": "auto",
            "parallel_tool_calls": false,
            "reasoning_effort": "medium",
            "stream": true,
            "stream_options": {"include_usage": true},
            "waygate": {"routing": {"allow_fallbacks": false}}
        })
    );
    // The internal form's own rules accept it.
    let (body, _) = to_chat(
        serde_json::to_vec(&json!({"model": "a/b", "input": "hi"}))
            .unwrap()
            .as_slice(),
        "waygate",
    )
    .unwrap();
    assert!(parse(Operation::Chat, &body).is_ok());
}

#[test]
fn settings_images_and_json_schema_take_chats_names() {
    let chat = chat_of(json!({
        "model": "a/b",
        "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}
        ]}],
        "max_output_tokens": 64, "temperature": 0.5, "top_p": 0.9, "user": "u-1",
        "text": {"format": {"type": "json_schema", "name": "thing", "strict": true, "schema": {"type": "object"}},
                 "verbosity": "low"},
        "tool_choice": {"type": "function", "name": "lookup"},
        "metadata": {"k": "v"}, "background": false, "truncation": "disabled", "service_tier": null
    }))
    .unwrap();
    assert_eq!(
        chat,
        json!({
            "model": "a/b",
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}}
            ]}],
            "max_completion_tokens": 64, "temperature": 0.5, "top_p": 0.9, "user": "u-1",
            "response_format": {"type": "json_schema", "json_schema": {"name": "thing", "strict": true, "schema": {"type": "object"}}},
            "verbosity": "low",
            "tool_choice": {"type": "function", "function": {"name": "lookup"}}
        })
    );
    let json_object =
        chat_of(json!({"model": "a/b", "input": "x", "text": {"format": {"type": "json_object"}}})).unwrap();
    assert_eq!(json_object["response_format"], json!({"type": "json_object"}));
    let text = chat_of(json!({"model": "a/b", "input": "x", "text": {"format": {"type": "text"}}})).unwrap();
    assert_eq!(text.get("response_format"), None);
}

#[test]
fn what_needs_state_or_a_providers_tool_is_refused_naming_the_field() {
    let base = || json!({"model": "a/b", "input": "hi"});
    let with = |name: &str, value: Value| {
        let mut r = base();
        r[name] = value;
        refused(r)
    };
    let unsupported = |param: &str| (400, "unsupported_parameter".to_string(), Some(param.to_string()));
    assert_eq!(
        with("previous_response_id", json!("resp_1")),
        unsupported("previous_response_id")
    );
    assert_eq!(with("conversation", json!("conv_1")), unsupported("conversation"));
    assert_eq!(with("prompt", json!({"id": "pmpt_1"})), unsupported("prompt"));
    assert_eq!(with("background", json!(true)), unsupported("background"));
    assert_eq!(
        with("tools", json!([{"type": "web_search"}])),
        unsupported("tools.0.type")
    );
    assert_eq!(
        with("tool_choice", json!({"type": "file_search"})),
        unsupported("tool_choice")
    );
    assert_eq!(
        with("input", json!([{"type": "item_reference", "id": "msg_1"}])),
        unsupported("input.0")
    );
    assert_eq!(
        with("input", json!([{"type": "web_search_call", "id": "ws_1"}])),
        unsupported("input.0.type")
    );
    assert_eq!(
        with(
            "input",
            json!([{"role": "user", "content": [{"type": "input_file", "file_id": "file_1"}]}])
        ),
        unsupported("input.0.content.0.type")
    );
    assert_eq!(
        with(
            "input",
            json!([{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}])
        ),
        unsupported("input.0.content.0.file_id")
    );
    assert_eq!(
        with("frequency_penalty", json!(1)),
        (400, "unknown_parameter".into(), Some("frequency_penalty".into()))
    );
    assert_eq!(
        refused(json!({"model": "a/b"})),
        (400, "missing_field".into(), Some("input".into()))
    );
    assert_eq!(
        with("input", json!(3)),
        (400, "invalid_type".into(), Some("input".into()))
    );
    assert_eq!(
        with(
            "input",
            json!([{"type": "function_call", "name": "f", "arguments": "{}"}])
        ),
        (400, "missing_field".into(), Some("input.0.call_id".into()))
    );
    assert_eq!(
        with("input", json!([{"role": "tool", "content": "x"}])),
        (400, "invalid_value".into(), Some("input.0.role".into()))
    );
    let e = to_chat(b"{\"model\":", "waygate").unwrap_err();
    assert_eq!((e.status, e.code.as_str(), e.param), (400, "invalid_json", None));
}

#[test]
fn a_chat_answer_becomes_a_response_with_the_requests_settings() {
    let (_, echo) = to_chat(
        br#"{"model":"fake/ok","input":"hi","instructions":"Be brief.","temperature":0.2,"store":true}"#,
        "waygate",
    )
    .unwrap();
    let chat = include_bytes!("../../../tests/fixtures/openai/chat_completion.json");
    let response: Value = serde_json::from_slice(&to_response(&echo, &stamp(), chat).unwrap()).unwrap();
    let recorded: Value = serde_json::from_slice(chat).unwrap();
    let text = recorded["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(response["id"], "resp_ABCDEFGHIJKLMNOPQRSTUVWX");
    assert_eq!(response["object"], "response");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["model"], "fake/ok");
    assert_eq!(response["instructions"], "Be brief.");
    assert_eq!(response["temperature"], 0.2);
    // Nothing is kept, whatever the client asked.
    assert_eq!(response["store"], false);
    assert_eq!(
        response["output"],
        json!([{"id": "msg_ABCDEFGHIJKLMNOPQRSTUVWX0", "type": "message", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}])
    );
    let usage = &recorded["usage"];
    assert_eq!(response["usage"]["input_tokens"], usage["prompt_tokens"]);
    assert_eq!(response["usage"]["output_tokens"], usage["completion_tokens"]);
    assert_eq!(response["usage"]["total_tokens"], usage["total_tokens"]);
    assert_eq!(
        response["usage"]["input_tokens_details"]["cached_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"]
    );
}

#[test]
fn tool_calls_become_function_call_items_and_a_length_stop_is_incomplete() {
    let chat = include_bytes!("../../../tests/fixtures/openai/chat_completion_tool_calls.json");
    let response: Value = serde_json::from_slice(&to_response(&Echo::default(), &stamp(), chat).unwrap()).unwrap();
    let recorded: Value = serde_json::from_slice(chat).unwrap();
    let calls = recorded["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    let items = response["output"].as_array().unwrap();
    let function_calls: Vec<&Value> = items.iter().filter(|i| i["type"] == "function_call").collect();
    assert_eq!(function_calls.len(), calls.len());
    for (item, call) in function_calls.iter().zip(calls) {
        assert_eq!(item["call_id"], call["id"]);
        assert_eq!(item["name"], call["function"]["name"]);
        assert_eq!(item["arguments"], call["function"]["arguments"]);
        assert!(item["id"].as_str().unwrap().starts_with("fc_"));
    }
    let cut = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Once upon"},
                     "finish_reason": "length"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
    let response: Value =
        serde_json::from_slice(&to_response(&Echo::default(), &stamp(), cut.to_string().as_bytes()).unwrap()).unwrap();
    assert_eq!(response["status"], "incomplete");
    assert_eq!(response["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert!(to_response(&Echo::default(), &stamp(), br#"{"choices":[]}"#).is_err());
}

/// The whole way a provider's stream goes for a Responses client: the
/// provider's translator, the internal chat stream, the Responses events.
fn replay(api: Api, request: Value, chunks: &[&[u8]]) -> Vec<u8> {
    let (chat, echo) = to_chat(request.to_string().as_bytes(), "waygate").unwrap();
    let parsed = parse(Operation::Chat, &chat).unwrap();
    let translator = crate::providers::stream_translator(api, &parsed);
    let rewriter = StreamRewriter::new(translator, stamp(), parsed.include_usage);
    let mut stream = Client::Responses(Box::new(echo)).stream(&stamp(), rewriter);
    let mut out = Vec::new();
    for chunk in chunks {
        stream.push(chunk, &mut out);
    }
    stream.finish(&mut out);
    out
}

/// Checks the sequence numbers count from 0.
fn numbered(events: Vec<Value>) -> Vec<Value> {
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], i as u64, "{event}");
    }
    events
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

fn replay_every_chunking(api: Api, request: Value, input: &[u8]) -> Vec<Value> {
    numbered(recorded::replay_every_chunking(input, &|chunks| {
        replay(api, request.clone(), chunks)
    }))
}

const STREAMED_TEXT: [&str; 9] = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
];

/// The deltas joined, and the event types with repeated deltas counted once.
fn text_and_shape(events: &[Value]) -> (String, Vec<&str>) {
    let text = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap())
        .collect();
    let mut shape = types(events);
    shape.dedup();
    (text, shape)
}

#[test]
fn each_providers_recorded_text_stream_is_the_responses_event_sequence() {
    let request = json!({"model": "fake/ok", "input": "hi", "stream": true});
    for (api, input) in TEXT_STREAMS {
        let events = replay_every_chunking(api, request.clone(), input);
        let (text, shape) = text_and_shape(&events);
        assert_eq!(shape, STREAMED_TEXT, "{api:?}");
        assert!(!text.is_empty());
        let completed = &events.last().unwrap()["response"];
        assert_eq!(completed["status"], "completed");
        assert_eq!(completed["id"], "resp_ABCDEFGHIJKLMNOPQRSTUVWX");
        assert_eq!(completed["output"][0]["content"][0]["text"], text.as_str());
        let done = events
            .iter()
            .find(|e| e["type"] == "response.output_text.done")
            .unwrap();
        assert_eq!(done["text"], text.as_str());
        // That recording of OpenAI's was made without usage asked for.
        if api != Api::Openai {
            assert!(
                completed["usage"]["output_tokens"].as_u64().unwrap() > 0,
                "{api:?}: {completed}"
            );
        }
        assert_eq!(events[0]["response"]["status"], "in_progress");
    }
}

#[test]
fn a_stream_cut_by_max_output_tokens_is_incomplete_with_its_usage_details() {
    // All 100 tokens went to reasoning before the limit: no text at all.
    let events = replay_every_chunking(
        Api::Openai,
        json!({"model": "fake/ok", "input": "hi", "stream": true, "max_output_tokens": 100}),
        include_bytes!("../../../tests/fixtures/openai/chat_completion_stream_include_usage.sse"),
    );
    assert_eq!(
        types(&events),
        ["response.created", "response.in_progress", "response.incomplete"]
    );
    let response = &events[2]["response"];
    assert_eq!(response["incomplete_details"], json!({"reason": "max_output_tokens"}));
    assert_eq!(response["max_output_tokens"], 100);
    assert_eq!(response["output"], json!([]));
    // The internal stream carries the two counts (docs/contract.md "The Responses API").
    assert_eq!(
        [
            &response["usage"]["input_tokens"],
            &response["usage"]["output_tokens"],
            &response["usage"]["total_tokens"]
        ],
        [12, 100, 112]
    );
}

#[test]
fn each_providers_recorded_tool_stream_is_function_call_items() {
    let request = json!({"model": "fake/tools", "input": "weather?", "stream": true,
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]});
    for (api, input) in TOOL_STREAMS {
        let events = replay_every_chunking(api, request.clone(), input);
        let completed = &events.last().unwrap()["response"];
        assert_eq!(completed["status"], "completed", "{api:?}");
        let calls: Vec<&Value> = completed["output"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["type"] == "function_call")
            .collect();
        assert_eq!(calls.len(), 2, "{api:?}: {completed}");
        for call in calls {
            // Each call's arguments are its deltas joined, and a JSON object.
            let deltas: String = events
                .iter()
                .filter(|e| e["type"] == "response.function_call_arguments.delta" && e["item_id"] == call["id"])
                .map(|e| e["delta"].as_str().unwrap())
                .collect();
            assert_eq!(call["arguments"], deltas.as_str());
            assert!(serde_json::from_str::<Value>(&deltas).unwrap().is_object());
            assert!(!call["call_id"].as_str().unwrap().is_empty());
            let done = events
                .iter()
                .find(|e| e["type"] == "response.output_item.done" && e["item"]["id"] == call["id"])
                .unwrap();
            assert_eq!(&done["item"], call);
        }
    }
}

#[test]
fn a_provider_failing_mid_stream_ends_as_error_and_response_failed() {
    let request = json!({"model": "fake/ok", "input": "hi", "stream": true});
    let events = replay_every_chunking(
        Api::Anthropic,
        request.clone(),
        include_bytes!("../../../tests/fixtures/anthropic/stream_error_event.sse"),
    );
    let shape = types(&events);
    assert_eq!(shape[shape.len() - 2..], ["error", "response.failed"]);
    let failed = &events.last().unwrap()["response"];
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["code"], events[events.len() - 2]["code"]);

    // A stream cut short, with no terminal event.
    let cut = b"data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n";
    let events = replay_every_chunking(Api::Openai, request, cut);
    assert_eq!(
        types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "error",
            "response.failed"
        ]
    );
    assert_eq!(events[5]["code"], "stream_interrupted");
}

#[test]
fn a_namespace_tools_functions_are_offered_and_a_call_to_one_names_it() {
    // Codex CLI groups its sub-agent tools in a namespace.
    let request = json!({"model": "a/b", "input": "hi", "tools": [
        {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
        {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
            {"type": "function", "name": "close_agent", "parameters": {"type": "object"}}
        ]}
    ]});
    let (chat, echo) = to_chat(request.to_string().as_bytes(), "waygate").unwrap();
    let chat: Value = serde_json::from_slice(&chat).unwrap();
    let names: Vec<&str> = chat["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["exec_command", "close_agent"]);
    let answer = json!({"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "close_agent", "arguments": "{}"}},
        {"id": "call_2", "type": "function", "function": {"name": "exec_command", "arguments": "{}"}}
    ]}}]});
    let response: Value =
        serde_json::from_slice(&to_response(&echo, &stamp(), answer.to_string().as_bytes()).unwrap()).unwrap();
    assert_eq!(response["output"][0]["namespace"], "multi_agent_v1");
    assert_eq!(response["output"][1].get("namespace"), None);
    assert_eq!(
        refused(
            json!({"model": "a/b", "input": "hi", "tools": [{"type": "namespace", "name": "n", "tools": [{"type": "web_search"}]}]})
        ),
        (400, "unsupported_parameter".into(), Some("tools.0.tools.0.type".into()))
    );
}

#[test]
fn a_provider_serving_the_responses_api_gets_the_request_as_it_came() {
    let json = br#"{"providers":[{"id":"o","api":"openai","cluster":"o","authority":"o","path_prefix":"/v1",
        "api_key":"sk-1","responses":true}]}"#;
    let config = crate::config::Config::parse(json, &|_| None).unwrap();
    let provider = config.provider("o").unwrap();
    // What chat cannot carry: an earlier response, a tool OpenAI runs, a reasoning item.
    let body = br#"{"model":"o/gpt-5","previous_response_id":"resp_1","input":[{"type":"reasoning","id":"rs_1","encrypted_content":"gAAA","summary":[]}],"tools":[{"type":"web_search"}],"waygate":{"routing":{}}}"#;
    let (chat, echo) = to_chat(body, "waygate").unwrap();
    let request = crate::request::parse(crate::request::Operation::Chat, &chat).unwrap();
    assert_eq!(
        echo.untranslatable.as_ref().map(|e| e.param.as_deref()),
        Some(Some("previous_response_id"))
    );
    let client = Client::Responses(Box::new(echo));
    assert!(client.is_native(provider));
    let up = client
        .native_request(provider, &request, "gpt-5", "waygate")
        .unwrap()
        .unwrap();
    assert_eq!(up.path, "/v1/responses");
    assert_eq!(
        std::str::from_utf8(&up.body).unwrap(),
        r#"{"previous_response_id":"resp_1","input":[{"type":"reasoning","id":"rs_1","encrypted_content":"gAAA","summary":[]}],"tools":[{"type":"web_search"}],"model":"gpt-5"}"#
    );
    assert_eq!(up.headers, [("authorization".to_string(), "Bearer sk-1".to_string())]);
    // Its answer keeps its own id and says the client's model.
    let answer = br#"{"id":"resp_abc","object":"response","model":"gpt-5-2025-08-07","output":[],"usage":{"input_tokens":7,"output_tokens":3,"total_tokens":10}}"#;
    let (out, usage) = client.native_answer(provider, &stamp(), answer).unwrap();
    assert_eq!(
        std::str::from_utf8(&out).unwrap(),
        r#"{"id":"resp_abc","object":"response","model":"fake/ok","output":[],"usage":{"input_tokens":7,"output_tokens":3,"total_tokens":10}}"#
    );
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (7, 3));
    // Its stream passes event for event, usage read from the last.
    let events = b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_abc\"}}\n\nevent: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":1,\"response\":{\"id\":\"resp_abc\",\"usage\":{\"input_tokens\":7,\"output_tokens\":3}}}\n\n";
    let passed = recorded::replay_every_chunking(events, &|chunks| {
        let mut stream = client.native_stream(provider);
        let mut out = Vec::new();
        for chunk in chunks {
            stream.push(chunk, &mut out);
        }
        stream.finish(&mut out);
        assert_eq!(stream.usage().map(|u| u.total()), Some(10));
        out
    });
    assert_eq!(passed.len(), 2);
    // Cut short, it ends with the API's error event.
    let mut stream = client.native_stream(provider);
    let mut out = Vec::new();
    stream.push(&events[..events.len() / 2], &mut out);
    stream.finish(&mut out);
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.ends_with("\"type\":\"error\"}\n\n") && text.contains("event: error"),
        "{text}"
    );
    assert_eq!(stream.error_code(), Some("stream_interrupted"));
}
