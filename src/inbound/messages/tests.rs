//! The Messages API over the chat form: recorded Messages requests
//! (`tests/fixtures/anthropic/*.request.json`) and Claude Code's shape,
//! refusals, answers, errors, and streams replayed from every provider's
//! recorded streams under every chunking.

use serde_json::{Value, json};

use super::*;
use crate::config::Api;
use crate::inbound::Client;
use crate::inbound::recorded::{self, TEXT_STREAMS, TOOL_STREAMS};
use crate::request::{Operation, parse};
use crate::stream::StreamRewriter;

fn chat_of(request: &[u8]) -> Result<Value, ApiError> {
    let (chat, _) = to_chat(request, "waygate")?;
    // The internal form's own rules accept every translation.
    parse(Operation::Chat, &chat).unwrap();
    Ok(serde_json::from_slice(&chat).unwrap())
}

fn refused(request: Value) -> (u16, String, Option<String>) {
    let e = to_chat(request.to_string().as_bytes(), "waygate").unwrap_err();
    (e.status, e.code, e.param)
}

/// Why a request that passes to an Anthropic provider as it came cannot be
/// translated for another.
fn untranslatable(request: Value) -> (u16, String, Option<String>) {
    let (chat, asked) = to_chat(request.to_string().as_bytes(), "waygate").unwrap();
    let e = asked.untranslatable.unwrap();
    // The chat form still routes it.
    let chat: Value = serde_json::from_slice(&chat).unwrap();
    assert_eq!(chat["model"], request["model"]);
    (e.status, e.code, e.param)
}

fn stamp() -> Stamp {
    Stamp {
        op: Operation::Chat,
        id: "msg_ABCDEFGHIJKLMNOPQRSTUVWX".into(),
        model: "claude-sonnet-4-5".into(),
        created: 1_700_000_000,
    }
}

#[test]
fn a_recorded_tool_round_trip_becomes_chat_turns() {
    let chat = chat_of(include_bytes!(
        "../../../tests/fixtures/anthropic/message_tool_result.request.json"
    ))
    .unwrap();
    assert_eq!(
        chat,
        json!({
            "model": "claude-sonnet-4-20250514",
            "max_tokens": 4000,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant"},
                {"role": "user", "content": [{"type": "text", "text": "What's the weather in Florence,Italy?"}]},
                {"role": "assistant", "content": "I'll check the weather in Florence, Italy for you.", "tool_calls": [
                    {"id": "toolu_01XLb9pzgfLa2EMyqWot6Ezt", "type": "function",
                     "function": {"name": "weather", "arguments": "{\"location\":\"Florence,Italy\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "toolu_01XLb9pzgfLa2EMyqWot6Ezt", "content": "40 C"}
            ],
            "tools": [{"type": "function", "function": {"name": "weather", "description": "Get weather information for a location",
                "parameters": {"properties": {"location": {"description": "the city", "type": "string"}}, "required": ["location"], "type": "object"}}}],
            "tool_choice": "auto",
            "parallel_tool_calls": true
        })
    );
}

#[test]
fn claude_codes_request_shape_is_served() {
    // The members Claude Code 2.1.332 sends (issue #46), cut down.
    let chat = chat_of(
        json!({
            "model": "claude-opus-5-5",
            "max_tokens": 128000,
            "stream": true,
            "system": [{"type": "text", "text": "You are Claude Code."},
                       {"type": "text", "text": " Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "say hi", "cache_control": {"type": "ephemeral"}}]},
                {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Hmm.", "signature": "EqQB"},
                    {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such file", "is_error": true},
                    {"type": "text", "text": "go on"}]}
            ],
            "tools": [{"name": "Bash", "description": "Runs a command.", "input_schema": {"type": "object"}}],
            "metadata": {"user_id": "{\"session_id\":\"92a9\"}"},
            "thinking": {"type": "adaptive"},
            "output_config": {"effort": "medium"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "temperature": 1, "top_k": 5, "stop_sequences": ["END"]
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "system", "content": "You are Claude Code. Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "say hi"}]},
            {"role": "system", "content": "# Environment"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}}]},
            {"role": "tool", "tool_call_id": "toolu_1", "content": "Error: no such file"},
            {"role": "user", "content": [{"type": "text", "text": "go on"}]}
        ])
    );
    assert_eq!(chat["user"], "{\"session_id\":\"92a9\"}");
    assert_eq!(chat["reasoning_effort"], "medium");
    assert_eq!(chat["stop"], json!(["END"]));
    assert_eq!(chat["stream_options"], json!({"include_usage": true}));
    assert_eq!(chat.get("top_k"), None);
    assert_eq!(chat.get("context_management"), None);
}

#[test]
fn images_and_a_thinking_budget_take_chats_shapes() {
    let chat = chat_of(
        json!({"model": "a/b", "max_tokens": 10, "thinking": {"type": "enabled", "budget_tokens": 2048},
            "tool_choice": {"type": "tool", "name": "f", "disable_parallel_tool_use": true},
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}]})
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    assert_eq!(
        chat["messages"][0]["content"],
        json!([{"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
               {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}])
    );
    assert_eq!(chat["reasoning_effort"], "low");
    assert_eq!(
        chat["tool_choice"],
        json!({"type": "function", "function": {"name": "f"}})
    );
    assert_eq!(chat["parallel_tool_calls"], false);
}

#[test]
fn what_chat_cannot_carry_is_named_and_what_is_invalid_is_refused() {
    let turn =
        |block: Value| json!({"model": "a/b", "max_tokens": 5, "messages": [{"role": "user", "content": [block]}]});
    let unsupported = |param: &str| (400, "unsupported_parameter".to_string(), Some(param.to_string()));
    let tools = json!({"model": "a/b", "max_tokens": 5, "messages": [], "tools": [{"type": "web_search_20250305", "name": "web_search"}]});
    assert_eq!(untranslatable(tools), unsupported("tools.0.type"));
    let document = json!({"type": "document", "source": {"type": "text", "data": "x", "media_type": "text/plain"}});
    assert_eq!(untranslatable(turn(document)), unsupported("messages.0.content.0.type"));
    let mcp = json!({"model": "a/b", "max_tokens": 5, "messages": [], "mcp_servers": [{"url": "https://x"}]});
    assert_eq!(untranslatable(mcp), unsupported("mcp_servers"));
    let unknown = json!({"model": "a/b", "max_tokens": 5, "messages": [], "frequency_penalty": 1});
    assert_eq!(
        untranslatable(unknown),
        (400, "unknown_parameter".into(), Some("frequency_penalty".into()))
    );
    // What is wrong for every provider is refused outright.
    assert_eq!(
        refused(json!({"model": "a/b", "messages": []})),
        (400, "missing_field".into(), Some("max_tokens".into()))
    );
    assert_eq!(
        refused(json!({"model": "a/b", "max_tokens": 5, "messages": [{"role": "robot", "content": "x"}]})),
        (400, "invalid_value".into(), Some("messages.0.role".into()))
    );
    let (_, asked) = to_chat(
        br#"{"model":"a/b","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
        "w",
    )
    .unwrap();
    assert_eq!(asked.untranslatable, None);
}

#[test]
fn a_chat_answer_becomes_a_message() {
    let tool_calls = include_bytes!("../../../tests/fixtures/openai/chat_completion_tool_calls.json");
    let message: Value = serde_json::from_slice(&to_message(&Asked::default(), &stamp(), tool_calls).unwrap()).unwrap();
    let recorded: Value = serde_json::from_slice(tool_calls).unwrap();
    assert_eq!(message["id"], "msg_ABCDEFGHIJKLMNOPQRSTUVWX");
    assert_eq!(
        (message["type"].as_str(), message["role"].as_str()),
        (Some("message"), Some("assistant"))
    );
    assert_eq!(message["model"], "claude-sonnet-4-5");
    assert_eq!(message["stop_reason"], "tool_use");
    let uses: Vec<&Value> = message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .collect();
    let calls = recorded["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(uses.len(), calls.len());
    for (block, call) in uses.iter().zip(calls) {
        assert_eq!(block["id"], call["id"]);
        let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(block["input"], arguments);
    }
    assert_eq!(
        message["usage"]["output_tokens"],
        recorded["usage"]["completion_tokens"]
    );

    let cut = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Once"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}}});
    let message: Value =
        serde_json::from_slice(&to_message(&Asked::default(), &stamp(), cut.to_string().as_bytes()).unwrap()).unwrap();
    assert_eq!(message["stop_reason"], "max_tokens");
    assert_eq!(message["content"], json!([{"type": "text", "text": "Once"}]));
    assert_eq!(
        message["usage"],
        json!({"input_tokens": 6, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4, "output_tokens": 1})
    );
}

#[test]
fn errors_are_in_anthropics_envelope() {
    let e = ApiError::bad_request("invalid_value", "temperature", "'temperature' must be at most 2.");
    assert_eq!(
        error_value(&e),
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "'temperature' must be at most 2. (invalid_value)"}})
    );
    let e = ApiError::new(404, ErrorType::InvalidRequest, "model_not_found", "There is none such.").with_param("model");
    assert_eq!(error_value(&e)["error"]["type"], "not_found_error");
    assert_eq!(
        error_value(&e)["error"]["message"],
        "model: There is none such. (model_not_found)"
    );
    let e = ApiError::new(
        502,
        ErrorType::Upstream,
        "upstream_error",
        "Every provider tried failed.",
    );
    assert_eq!(error_value(&e)["error"]["type"], "api_error");
}

fn replay(api: Api, chunks: &[&[u8]]) -> Vec<u8> {
    let request = json!({"model": "fake/ok", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]});
    let (chat, asked) = to_chat(request.to_string().as_bytes(), "waygate").unwrap();
    let parsed = parse(Operation::Chat, &chat).unwrap();
    let translator = crate::providers::stream_translator(api, &parsed);
    let rewriter = StreamRewriter::new(translator, stamp(), parsed.include_usage);
    let mut stream = Client::Messages(Box::new(asked)).stream(&stamp(), rewriter);
    let mut out = Vec::new();
    for chunk in chunks {
        stream.push(chunk, &mut out);
    }
    stream.finish(&mut out);
    out
}

fn replay_every_chunking(api: Api, input: &[u8]) -> Vec<Value> {
    recorded::replay_every_chunking(input, &|chunks| replay(api, chunks))
}

#[test]
fn each_providers_recorded_streams_are_anthropics_event_sequence() {
    for (api, input) in TEXT_STREAMS {
        let events = replay_every_chunking(api, input);
        let mut shape: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        shape.dedup();
        assert_eq!(
            shape,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ],
            "{api:?}"
        );
        assert_eq!(events[0]["message"]["id"], "msg_ABCDEFGHIJKLMNOPQRSTUVWX");
        let delta = &events[events.len() - 2];
        assert_eq!(delta["delta"]["stop_reason"], "end_turn", "{api:?}");
    }
    for (api, input) in TOOL_STREAMS {
        let events = replay_every_chunking(api, input);
        let starts: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "content_block_start" && e["content_block"]["type"] == "tool_use")
            .collect();
        assert_eq!(starts.len(), 2, "{api:?}");
        for start in starts {
            let json: String = events
                .iter()
                .filter(|e| e["index"] == start["index"] && e["delta"]["type"] == "input_json_delta")
                .map(|e| e["delta"]["partial_json"].as_str().unwrap())
                .collect();
            assert!(
                serde_json::from_str::<Value>(&json).unwrap().is_object(),
                "{api:?}: {json}"
            );
            assert!(!start["content_block"]["name"].as_str().unwrap().is_empty());
        }
        assert_eq!(events[events.len() - 2]["delta"]["stop_reason"], "tool_use", "{api:?}");
    }
}

#[test]
fn a_provider_failing_mid_stream_ends_with_an_error_event() {
    let events = replay_every_chunking(
        Api::Anthropic,
        include_bytes!("../../../tests/fixtures/anthropic/stream_error_event.sse"),
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "error");
    assert!(!last["error"]["message"].as_str().unwrap().is_empty());
    assert!(!events.iter().any(|e| e["type"] == "message_stop"));
}

#[test]
fn count_tokens_is_an_estimate_that_grows_with_the_text_and_needs_no_max_tokens() {
    let count = |request: Value| {
        let body = request.to_string();
        let (_, counted) = count_request(body.as_bytes(), "waygate").unwrap();
        assert_eq!(
            counted.asked.body,
            body.as_bytes(),
            "the client's own body, for Anthropic"
        );
        counted.estimate["input_tokens"].as_u64().unwrap()
    };
    let short = count(json!({"model": "a/b", "messages": [{"role": "user", "content": "hi"}]}));
    let long = count(
        json!({"model": "a/b", "messages": [{"role": "user", "content": "hi ".repeat(400)}],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}]}),
    );
    assert!(0 < short && short < long, "{short} {long}");
    // 1,200 characters of text are about 300 tokens.
    assert!((300..340).contains(&long), "{long}");
    assert!(
        count_request(
            br#"{"model":"a/b","messages":[{"role":"robot","content":"x"}]}"#,
            "waygate"
        )
        .is_err()
    );
}

#[test]
fn a_providers_thoughts_are_a_thinking_block_before_the_text_under_every_chunking() {
    let input = include_bytes!("../../../tests/fixtures/gemini/stream_generate_content_thoughts.sse");
    let events = replay_every_chunking(Api::Gemini, input);
    let shape: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .map(|e| {
            (
                e["content_block"]["type"].as_str().unwrap(),
                e["content_block"]["signature"].as_str().unwrap_or("-"),
            )
        })
        .collect();
    assert_eq!(shape, [("thinking", ""), ("text", "-")]);
    let deltas = |kind: &str, field: &str| -> String {
        events
            .iter()
            .filter(|e| e["delta"]["type"] == kind)
            .map(|e| e["delta"][field].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        deltas("thinking_delta", "thinking"),
        "**Adding and multiplying**\n\nThe user wants the sum and the product of 2 and 3. Both are small: 5 and 6."
    );
    assert_eq!(
        deltas("text_delta", "text"),
        "The sum of 2 and 3 is 5. The product of 2 and 3 is 6."
    );
    // Each block is stopped before the next starts, the thinking one at index 0.
    let starts_and_stops: Vec<(&str, u64)> = events
        .iter()
        .filter(|e| ["content_block_start", "content_block_stop"].contains(&e["type"].as_str().unwrap()))
        .map(|e| (e["type"].as_str().unwrap(), e["index"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        starts_and_stops,
        [
            ("content_block_start", 0),
            ("content_block_stop", 0),
            ("content_block_start", 1),
            ("content_block_stop", 1)
        ]
    );
}

#[test]
fn a_providers_reasoning_is_an_unsigned_thinking_block_of_the_message() {
    let chat = json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": "5", "reasoning_content": "Two and three."}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}});
    let (_, asked) = to_chat(
        br#"{"model":"a/b","max_tokens":9,"messages":[{"role":"user","content":"hi"}]}"#,
        "waygate",
    )
    .unwrap();
    let message: Value =
        serde_json::from_slice(&to_message(&asked, &stamp(), chat.to_string().as_bytes()).unwrap()).unwrap();
    assert_eq!(
        message["content"],
        json!([{"type": "thinking", "thinking": "Two and three.", "signature": ""}, {"type": "text", "text": "5"}])
    );
}

#[test]
fn top_k_goes_to_a_gemini_provider_as_top_k_and_nowhere_else() {
    let request = br#"{"model":"a/b","max_tokens":9,"top_k":5,"messages":[{"role":"user","content":"hi"}]}"#;
    let (chat, asked) = to_chat(request, "waygate").unwrap();
    assert_eq!(asked.top_k, Some(5));
    let parsed = parse(Operation::Chat, &chat).unwrap();
    let client = Client::Messages(Box::new(asked));
    let config = crate::config::Config::parse(
        br#"{"providers":[{"id":"g","api":"gemini","cluster":"g","authority":"g","api_key":"k"},
            {"id":"o","api":"openai","cluster":"o","authority":"o","api_key":"k"}]}"#,
        &|_| None,
    )
    .unwrap();
    let sent = |id: &str| {
        let provider = config.provider(id).unwrap();
        let mut up = crate::providers::build_request(provider, &parsed, "m", "waygate").unwrap();
        client.carry_over(provider, &mut up);
        serde_json::from_slice::<Value>(&up.body).unwrap()
    };
    assert_eq!(sent("g")["generationConfig"]["topK"], 5);
    assert_eq!(sent("g")["generationConfig"]["maxOutputTokens"], 9);
    let openai = sent("o");
    assert!(
        openai.get("top_k").is_none() && openai.get("topK").is_none(),
        "{openai}"
    );
    assert_eq!(
        to_chat(br#"{"model":"a/b","max_tokens":9,"top_k":-1,"messages":[]}"#, "waygate")
            .unwrap_err()
            .param
            .as_deref(),
        Some("top_k")
    );
}
