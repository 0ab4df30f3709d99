//! The inbound APIs (Responses, Messages, Messages' count) on arbitrary
//! bytes: a request is refused with the contract's error (by its module or
//! by the internal form's rules) or becomes a chat request; the internal answer and
//! stream, whatever the provider sent, come out in the client's API without
//! a panic, and a stream the same under every chunking.
//!
//! Input: a selector byte (bit 0-1: the API; bit 2: Gemini's stream, else
//! OpenAI's), then a chunk plan and a payload ([`plan_and_payload`]); the
//! payload is the request up to its first `0xff` byte, the provider's bytes
//! after it.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use waygate::answer::Stamp;
use waygate::config::Api;
use waygate::inbound::{Client, messages, responses};
use waygate::request::{self, Operation};
use waygate::stream::StreamRewriter;
use waygate_fuzz::{check_api_error, chunked, plan_and_payload};

fn stamp() -> Stamp {
    Stamp {
        op: Operation::Chat,
        id: "resp_FUZZ".into(),
        model: "client/model".into(),
        created: 1,
    }
}

/// The provider's bytes through the chat stream and the client's API.
fn streamed(client: &Client, api: Api, request: &request::ParsedRequest, chunks: &[&[u8]]) -> Vec<u8> {
    let translator = waygate::providers::stream_translator(api, request);
    let chat = StreamRewriter::new(translator, stamp(), request.include_usage);
    let mut stream = client.stream(&stamp(), chat);
    let mut out = Vec::new();
    for chunk in chunks {
        stream.push(chunk, &mut out);
    }
    stream.finish(&mut out);
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, data)) = data.split_first() else {
        return;
    };
    let (sizes, payload) = plan_and_payload(data);
    let (body, provider) = match payload.iter().position(|&b| b == 0xff) {
        Some(at) => {
            let (body, rest) = payload.split_at(at);
            (body, rest.get(1..).unwrap_or_default())
        }
        None => (payload, &[][..]),
    };
    let translated = match selector & 3 {
        0 => responses::to_chat(body, "waygate").map(|(chat, echo)| (chat, Client::Responses(Box::new(echo)))),
        1 => messages::to_chat(body, "waygate").map(|(chat, asked)| (chat, Client::Messages(Box::new(asked)))),
        _ => messages::count_request(body, "waygate").map(|(chat, counted)| {
            assert!(counted.estimate["input_tokens"].as_u64().is_some_and(|n| n >= 1));
            (chat, Client::Count(Box::new(counted)))
        }),
    };
    let (chat, client) = match translated {
        Ok(translated) => translated,
        Err(e) => return check_api_error(&e),
    };
    // What the translation leaves to the internal form's rules (a missing
    // `model`, say) is refused there, as the exchange refuses it.
    let request = match request::parse(Operation::Chat, &chat) {
        Ok(request) => request,
        Err(e) => return check_api_error(&e),
    };
    if matches!(client, Client::Count(_)) {
        return;
    }
    // The provider's bytes as a finished chat answer: the client's answer or a reason.
    if let Ok(answer) = client.answer(&stamp(), provider.to_vec()) {
        serde_json::from_slice::<Value>(&answer).expect("an answer is JSON");
    }
    let api = if selector & 4 == 0 { Api::Openai } else { Api::Gemini };
    let whole = streamed(&client, api, &request, &[provider]);
    let fuzzed = streamed(&client, api, &request, &chunked(&sizes, provider));
    assert_eq!(
        String::from_utf8_lossy(&whole),
        String::from_utf8_lossy(&fuzzed),
        "chunking {sizes:?} changed the stream"
    );
    assert!(!whole.is_empty(), "a stream never ends silently");
});
