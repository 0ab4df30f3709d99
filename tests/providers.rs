//! What every provider API does alike, through the compiled filter in Envoy: one table
//! over the OpenAI-compatible, Anthropic and Gemini fakes (each checks requests like the
//! real API), so a client cannot tell the providers apart but for `x-waygate-provider`.
//! What one API does its own way (its wire request, images, JSON modes, candidates) is
//! beside it, in `tests/openai_client.rs`, `tests/anthropic.rs` and `tests/gemini.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use std::time::Duration;

use common::{
    Gateway, ask, assert_a_cut_stream_never_ends_with_done, assert_legacy_completions_go_through_chat, stream_chunks,
    text_of, tools, wait_for,
};
use serde_json::{Value, json};

/// One provider API, as the test configuration names it, and what its fake answers.
struct Api {
    /// A provider of this API in `common::test_plugin_config` (the OpenAI-compatible one
    /// without native legacy completions, so a prompt goes through chat as for the others).
    provider: &'static str,
    /// The fake's `ok` answer.
    hello: &'static str,
    /// The fake's refusal (`status-400`): the contract error's `code` and its message.
    refusal: (&'static str, &'static str),
    /// The message of the fake's in-stream error (`stream-error`).
    stream_error: &'static str,
    /// Where the provider's request holds a legacy prompt, and what it is there.
    prompt_as_chat: fn() -> (&'static str, Value),
}

const APIS: [Api; 3] = [
    Api {
        provider: "fakechat",
        hello: "Hello from openai fake.",
        // Its error has `"code": null`: the contract's stand-in is `provider_error`.
        refusal: (
            "provider_error",
            "The fake provider was asked to fail with this status.",
        ),
        stream_error: "The server had an error while processing your request. Sorry about that!",
        prompt_as_chat: || ("messages", json!([{"role": "user", "content": "Say hello"}])),
    },
    Api {
        provider: "fakeanthropic",
        hello: "Hello from anthropic fake.",
        refusal: (
            "invalid_request_error",
            "The fake provider was asked to refuse this request.",
        ),
        stream_error: "Overloaded",
        prompt_as_chat: || {
            (
                "messages",
                json!([{"role": "user", "content": [{"type": "text", "text": "Say hello"}]}]),
            )
        },
    },
    Api {
        provider: "fakegemini",
        hello: "Hello from gemini fake.",
        refusal: ("INVALID_ARGUMENT", "Request contains an invalid argument."),
        stream_error: "The model is overloaded. Please try again later.",
        prompt_as_chat: || ("contents", json!([{"role": "user", "parts": [{"text": "Say hello"}]}])),
    },
];

impl Api {
    fn model(&self, directive: &str) -> String {
        format!("{}/{directive}", self.provider)
    }

    fn ask(&self, directive: &str) -> Value {
        ask(&self.model(directive))
    }

    fn stream(&self, directive: &str) -> Value {
        let mut body = self.ask(directive);
        body["stream"] = json!(true);
        body
    }
}

#[test]
fn a_chat_request_is_answered_in_openai_shape() {
    let gw = Gateway::start();
    for api in &APIS {
        let r = gw.chat(api.ask("ok"));
        assert_eq!(r.status, 200, "{}: {}", api.provider, r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        assert_eq!(r.header("x-waygate-provider"), Some(api.provider));
        assert_eq!(
            r.header("x-waygate-attempts"),
            Some(format!("{}:200", api.provider).as_str())
        );
        let v = r.json();
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], api.model("ok"));
        assert!(v["id"].as_str().unwrap().starts_with("chatcmpl_"), "{v}");
        // The members every API's answer has (an OpenAI-compatible provider's own extras,
        // such as `refusal`, pass through).
        let choices = v["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 1, "{v}");
        let choice = &choices[0];
        assert_eq!(
            (&choice["index"], &choice["logprobs"], &choice["finish_reason"]),
            (&json!(0), &Value::Null, &json!("stop")),
            "{v}"
        );
        assert_eq!(
            (&choice["message"]["role"], &choice["message"]["content"]),
            (&json!("assistant"), &json!(api.hello)),
            "{v}"
        );
        assert_eq!(
            v["usage"],
            json!({"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}),
            "{}",
            api.provider
        );
    }
}

#[test]
fn tool_calls_come_back_in_openai_shape_and_the_conversation_goes_on() {
    let gw = Gateway::start();
    for api in &APIS {
        let mut body = api.ask("tool");
        body["tools"] = tools();
        let r = gw.chat(body.clone());
        assert_eq!(r.status, 200, "{}: {}", api.provider, r.text());
        let v = r.json();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{}", api.provider);
        assert!(choice["message"]["content"].is_null());
        let call = &choice["message"]["tool_calls"][0];
        assert!(call["id"].as_str().is_some_and(|id| !id.is_empty()), "{call}");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "add");
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert!(args.is_object(), "{args}");

        // The client runs the tool and sends the result back; each fake checks that the
        // result pairs with the call, as its API does.
        let history = body["messages"].as_array_mut().unwrap();
        history.push(choice["message"].clone());
        history.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "5"}));
        body["model"] = json!(api.model("ok"));
        let r = gw.chat(body);
        assert_eq!(r.status, 200, "{}: {}", api.provider, r.text());
        assert_eq!(r.json()["choices"][0]["message"]["content"], api.hello);
    }
}

#[test]
fn a_parallel_tool_call_stream_has_tool_call_indexes_zero_and_one() {
    let gw = Gateway::start();
    for api in &APIS {
        let mut body = api.stream("tools");
        body["tools"] = tools();
        let (chunks, done) = stream_chunks(&gw.chat(body), &api.model("tools"));
        assert!(done, "{}", api.provider);
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        // No text at all, not even an empty one: clients such as the AI SDK
        // open a text part for any `content` string (OpenAI sends `null`).
        let texts: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c.pointer("/choices/0/delta/content"))
            .filter(|content| !content.is_null())
            .collect();
        assert!(texts.is_empty(), "{}: {texts:?}", api.provider);
        // (id, name, arguments) per tool call index, the arguments joined from their pieces.
        let mut calls: Vec<(String, String, String)> = Vec::new();
        for delta in chunks
            .iter()
            .filter_map(|c| c.pointer("/choices/0/delta/tool_calls").and_then(Value::as_array))
            .flatten()
        {
            let i = delta["index"].as_u64().unwrap() as usize;
            if i == calls.len() {
                assert_eq!(delta["type"], "function");
                calls.push((
                    delta["id"].as_str().unwrap().to_string(),
                    delta["function"]["name"].as_str().unwrap().to_string(),
                    String::new(),
                ));
            }
            calls[i]
                .2
                .push_str(delta["function"]["arguments"].as_str().unwrap_or(""));
        }
        assert_eq!(calls.len(), 2, "{}: {chunks:?}", api.provider);
        assert_eq!((calls[0].1.as_str(), calls[1].1.as_str()), ("add", "multiply"));
        assert_ne!(calls[0].0, calls[1].0);
        for (_, _, args) in &calls {
            assert!(serde_json::from_str::<Value>(args).unwrap().is_object(), "{args}");
        }
        assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
    }
}

#[test]
fn a_text_stream_has_role_first_usage_when_asked_and_done_last() {
    let gw = Gateway::start();
    for api in &APIS {
        let mut body = api.stream("long-6");
        body["stream_options"] = json!({"include_usage": true});
        let (chunks, done) = stream_chunks(&gw.chat(body), &api.model("long-6"));
        assert!(done, "{}", api.provider);
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(text_of(&chunks, 0), "word1 word2 word3 word4 word5 word6");
        let n = chunks.len();
        assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[n - 1]["choices"], json!([]));
        assert_eq!(
            chunks[n - 1]["usage"],
            json!({"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}),
            "{}",
            api.provider
        );
        for c in &chunks[..n - 1] {
            assert!(c.get("usage").is_none(), "{}: {c}", api.provider);
        }
    }
}

#[test]
fn max_tokens_cuts_the_answer_with_finish_reason_length() {
    let gw = Gateway::start();
    for api in &APIS {
        for name in ["max_tokens", "max_completion_tokens"] {
            let mut body = api.ask("long-20");
            body[name] = json!(3);
            let v = gw.chat(body).json();
            assert_eq!(
                v["choices"][0]["finish_reason"], "length",
                "{} {name}: {v}",
                api.provider
            );
            assert_eq!(v["choices"][0]["message"]["content"], "word1 word2 word3");
        }
    }
}

#[test]
fn provider_errors_become_the_contract_envelope() {
    let gw = Gateway::start();
    for api in &APIS {
        let (code, message) = api.refusal;
        let v = gw
            .chat(api.ask("status-400"))
            .assert_error(400, "invalid_request_error", code, None);
        assert_eq!(v["error"]["provider"], api.provider);
        assert_eq!(v["error"]["message"], message);
        let r = gw.chat(api.ask("status-429"));
        r.assert_error(429, "rate_limit_error", "upstream_rate_limited", None);
        assert_eq!(r.header("retry-after"), Some("7"), "{}", api.provider);
        assert_eq!(
            r.header("x-waygate-attempts"),
            Some(format!("{}:429", api.provider).as_str())
        );
        gw.chat(api.ask("status-503"))
            .assert_error(502, "upstream_error", "upstream_error", None);
        gw.chat(api.ask("garbage"))
            .assert_error(502, "upstream_error", "invalid_upstream_response", None);
    }
}

#[test]
fn an_error_event_ends_the_stream_with_one_error_event() {
    let gw = Gateway::start();
    for api in &APIS {
        let (chunks, done) = stream_chunks(&gw.chat(api.stream("stream-error")), &api.model("stream-error"));
        assert!(!done, "{}", api.provider);
        assert_eq!(
            chunks.last().unwrap()["error"],
            json!({"message": api.stream_error, "type": "upstream_error", "param": null, "code": "stream_interrupted"})
        );
        assert_eq!(chunks.iter().filter(|c| c.get("error").is_some()).count(), 1);
    }
}

#[test]
fn a_garbage_stream_ends_with_the_error_event() {
    let gw = Gateway::start();
    for api in &APIS {
        let (chunks, done) = stream_chunks(&gw.chat(api.stream("garbage")), &api.model("garbage"));
        assert!(!done, "{}", api.provider);
        assert_eq!(chunks.last().unwrap()["error"]["code"], "stream_interrupted");
    }
}

#[test]
fn a_stream_cut_mid_way_never_ends_with_done() {
    let gw = Gateway::start();
    for api in &APIS {
        assert_a_cut_stream_never_ends_with_done(&gw, &api.model("cut-3"));
    }
}

/// A provider's connection dropped after its answer's headers, before the filter had
/// the whole answer (the fake's `cut-3` sends half a body, then closes): Envoy answers
/// the client itself, past the filter, and no callback tells the filter. The shipped
/// listener's local reply mapper gives that answer the contract's body; the filter's
/// access line learns at the log that the attempt failed. A stream so cut was reset
/// (its 200 had gone out), and its line says the attempt failed too.
#[test]
fn an_answer_cut_after_its_headers_is_the_contracts_502_and_logged_as_failed() {
    let gw = Gateway::start();
    for api in &APIS {
        let r = gw.chat(api.ask("cut-3"));
        r.assert_error(502, "upstream_error", "upstream_error", None);
        assert_eq!(r.header("content-type"), Some("application/json"), "{}", api.provider);
        assert_a_cut_stream_never_ends_with_done(&gw, &api.model("cut-3"));
    }
    let access_lines = || -> Vec<String> {
        let logs = gw.logs();
        logs.lines()
            .filter(|l| l.contains(": waygate access key="))
            .map(str::to_string)
            .collect()
    };
    wait_for(Duration::from_secs(10), "the access lines", || {
        access_lines().len() >= 2 * APIS.len()
    });
    let lines = access_lines();
    for api in &APIS {
        let attempt = format!(" attempts={}:error ", api.provider);
        let of_model: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains(&format!(" model={} ", api.model("cut-3"))))
            .collect();
        assert_eq!(of_model.len(), 2, "{lines:#?}");
        assert!(
            of_model[0].contains(&attempt) && of_model[0].contains(" status=502 "),
            "{}",
            of_model[0]
        );
        assert!(
            of_model[1].contains(&attempt) && of_model[1].contains(" status=200 "),
            "{}",
            of_model[1]
        );
    }
}

#[test]
fn legacy_completions_go_through_chat_both_ways() {
    for api in &APIS {
        // A gateway each: the helper reads the first request the fake received.
        let gw = Gateway::start();
        let sent = assert_legacy_completions_go_through_chat(&gw, api.provider, api.hello);
        let (member, expected) = (api.prompt_as_chat)();
        assert_eq!(sent[member], expected, "{}", api.provider);
    }
}

/// A legacy prompt in a list of one (LangChain's `OpenAI.invoke` sends `["..."]`; OpenAI
/// takes lists) is that prompt for every API; a provider with native legacy completions
/// gets the list as the client sent it.
#[test]
fn a_legacy_prompt_in_a_list_of_one_is_that_prompt() {
    for api in &APIS {
        let gw = Gateway::start();
        let body = json!({"model": api.model("ok"), "prompt": ["Say hello"]});
        let r = gw.post("/api/v1/completions", &body.to_string());
        assert_eq!(r.status, 200, "{}: {}", api.provider, r.text());
        assert_eq!(r.json()["choices"][0]["text"], api.hello, "{}", api.provider);
        let sent = gw.fakes.received()[0].body_json().unwrap();
        let (member, expected) = (api.prompt_as_chat)();
        assert_eq!(sent[member], expected, "{}", api.provider);
    }
    let gw = Gateway::start();
    let r = gw.post(
        "/api/v1/completions",
        &json!({"model": "fake/ok", "prompt": ["Say hello"]}).to_string(),
    );
    assert_eq!(
        (r.status, r.json()["object"].clone()),
        (200, json!("text_completion")),
        "{}",
        r.text()
    );
    assert_eq!(
        gw.fakes.received()[0].body_json().unwrap()["prompt"],
        json!(["Say hello"])
    );
}

/// A provider cluster Envoy speaks HTTP/2 to (`http2_protocol_options`: one connection
/// carries many streams, as operators set it for providers that offer it): every API's
/// answer, stream, error and a streamed fallback come through as over HTTP/1.1.
#[test]
fn every_api_works_over_an_http2_provider_cluster() {
    let config = common::chain_config(&[("fake", "status-503"), ("fakeanthropic", "long-6")]);
    let gw = Gateway::with_edit(&config, |doc| {
        let clusters = doc["static_resources"]["clusters"].as_sequence_mut().unwrap();
        let fake = clusters.iter_mut().find(|c| c["name"] == "fake").unwrap();
        // Router fallback's cluster has these options already (the upstream role): only
        // the protocol changes. http-call fallback's has none.
        let name = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
        let options = &mut fake["typed_extension_protocol_options"][name];
        options["@type"] = format!("type.googleapis.com/{name}").into();
        options["explicit_http_config"] = serde_yaml::from_str("{http2_protocol_options: {}}").unwrap();
    });
    for api in &APIS {
        let r = gw.chat(api.ask("ok"));
        assert_eq!(r.status, 200, "{}: {}", api.provider, r.text());
        assert_eq!(r.json()["choices"][0]["message"]["content"], api.hello);
        let (chunks, done) = stream_chunks(&gw.chat(api.stream("long-6")), &api.model("long-6"));
        assert!(done, "{}", api.provider);
        assert_eq!(text_of(&chunks, 0), "word1 word2 word3 word4 word5 word6");
        let refused = gw.chat(api.ask("status-400"));
        let e = refused.assert_error(400, "invalid_request_error", api.refusal.0, None);
        assert_eq!(e["error"]["message"], api.refusal.1);
    }
    let mut body = ask("chain/x");
    body["stream"] = json!(true);
    let r = gw.chat(body);
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503,fakeanthropic:200"));
    let (chunks, done) = stream_chunks(&r, "chain/x");
    assert!(done);
    assert_eq!(text_of(&chunks, 0), "word1 word2 word3 word4 word5 word6");
    let received = gw.fakes.received();
    assert_eq!(received.len(), 3 * APIS.len() + 2);
    assert!(
        received.iter().all(|r| r.version == "HTTP/2.0"),
        "every request went over HTTP/2"
    );
}
