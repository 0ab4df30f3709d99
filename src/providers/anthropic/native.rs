//! The Messages API in, an Anthropic provider out: the client's request
//! passes as it came, with nothing translated, so what only Anthropic reads
//! survives (`cache_control`, `thinking` blocks and their signatures,
//! documents, server tools, betas).
//!
//! - [`native_request`]: the client's body with `model` renamed and the
//!   routing field removed, every other member byte for byte (but for the
//!   unsigned thinking blocks of turns another provider served, removed from
//!   `messages`: Anthropic refuses a thinking block it did not sign); the client's
//!   `anthropic-version` (else [`VERSION`]) and `anthropic-beta` go with it,
//!   to `/messages`, or to `/messages/count_tokens` for a count ([`Endpoint`]).
//! - [`count_answer`]: the provider's count, as it came.
//! - [`native_answer`]: the provider's `message` with `model` as the client
//!   asked, every other member byte for byte, and its usage read.
//! - [`stream_usage`]: what a stream's event says of usage, for
//!   [`crate::providers::native::NativeStream`].

use serde::Deserialize;
use serde_json::value::RawValue;

use super::{VERSION, WireUsage};
use crate::config::Provider;
use crate::errors::{ApiError, Header};
use crate::json::members::{Members, ObjectWriter};
use crate::providers::UpstreamRequest;
use crate::usage::Usage;

/// The request headers of the client's that go to an Anthropic provider with
/// its request: the API version it speaks and the betas it asks for.
pub const CLIENT_HEADERS: [&str; 2] = ["anthropic-version", "anthropic-beta"];

/// Where on an Anthropic provider the client's request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/messages`: the message itself.
    Messages,
    /// `/messages/count_tokens`: its input tokens, counted by the provider.
    CountTokens,
}

/// The client's Messages request (its body and its `anthropic-*` headers)
/// for `endpoint` of an Anthropic provider.
pub fn native_request(
    provider: &Provider,
    endpoint: Endpoint,
    client_body: &[u8],
    client_headers: &[Header],
    upstream_model: &str,
    routing_field: &str,
) -> Result<UpstreamRequest, ApiError> {
    let signed_only = without_unsigned_thinking(client_body);
    let client_body = signed_only.as_deref().unwrap_or(client_body);
    let body = crate::providers::native::request_body(client_body, upstream_model, routing_field)?;
    let mut headers = vec![("x-api-key".to_string(), provider.credential_text().to_string())];
    for name in CLIENT_HEADERS {
        let sent = client_headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
        match (name, sent) {
            (_, Some(value)) => headers.push((name.to_string(), value)),
            ("anthropic-version", None) => headers.push((name.to_string(), VERSION.to_string())),
            _ => {}
        }
    }
    Ok(UpstreamRequest {
        path: match endpoint {
            Endpoint::Messages => format!("{}/messages", provider.path_prefix),
            Endpoint::CountTokens => format!("{}/messages/count_tokens", provider.path_prefix),
        },
        headers,
        body,
    })
}

/// Whether `body` may hold an empty `signature` (a thinking block the
/// Messages API's answers from a translated provider carry,
/// `inbound::messages`): `"signature"`, a colon and `""`, JSON whitespace
/// allowed between (a client may not write compact JSON).
fn may_hold_an_unsigned_block(body: &[u8]) -> bool {
    let is_space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r');
    memchr::memmem::find_iter(body, br#""signature""#).any(|at| {
        let rest = body.get(at + br#""signature""#.len()..).unwrap_or_default();
        let mut rest = rest.iter().skip_while(|b| is_space(b));
        rest.next() == Some(&b':') && {
            let mut value = rest.skip_while(|b| is_space(b));
            value.next() == Some(&b'"') && value.next() == Some(&b'"')
        }
    })
}

/// The client's body without the thinking blocks no provider signed (a turn
/// a translated provider served, sent back by the client), a message left
/// empty by that removed too; `None` when it has none (nearly always: one
/// search), the body then passing byte for byte.
fn without_unsigned_thinking(body: &[u8]) -> Option<Vec<u8>> {
    if !may_hold_an_unsigned_block(body) {
        return None;
    }
    let members = Members::parse(body).ok()?;
    let messages = members.get("messages")?;
    let mut messages: Vec<serde_json::Value> = serde_json::from_str(messages.get()).ok()?;
    let unsigned = |block: &serde_json::Value| {
        block.get("type").and_then(serde_json::Value::as_str) == Some("thinking")
            && block.get("signature").and_then(serde_json::Value::as_str) == Some("")
    };
    let mut removed = false;
    messages.retain_mut(|message| {
        let Some(content) = message.get_mut("content").and_then(serde_json::Value::as_array_mut) else {
            return true;
        };
        let blocks = content.len();
        content.retain(|block| !unsigned(block));
        if content.len() == blocks {
            return true;
        }
        removed = true;
        !content.is_empty()
    });
    if !removed {
        return None;
    }
    let mut out = Vec::with_capacity(body.len());
    let mut w = ObjectWriter::new(&mut out);
    for (name, value) in &members.0 {
        if name == "messages" {
            w.value("messages", &messages);
        } else {
            w.member(name, *value);
        }
    }
    w.finish();
    Some(out)
}

/// What an answer must hold to be a `message`, and its usage.
#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(rename = "type", borrow)]
    kind: &'a str,
    #[serde(default)]
    usage: WireUsage,
}

fn usage_of(wire: &WireUsage) -> Usage {
    Usage {
        prompt_tokens: wire.prompt().unwrap_or(0),
        completion_tokens: wire.output_tokens.unwrap_or(0),
    }
}

/// The provider's `message`, with `model` the client's; `Err` says why it is
/// not a valid answer.
pub fn native_answer(body: &[u8], model: &str) -> Result<(Vec<u8>, Usage), String> {
    let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
    let answer: Answer<'_> =
        serde_json::from_str(text).map_err(|e| format!("body is not an Anthropic message: {e}"))?;
    if answer.kind != "message" {
        return Err(format!("answer has type '{}', not 'message'", answer.kind));
    }
    let members = Members::parse_str(text).map_err(|e| e.to_string())?;
    let out = crate::providers::native::answer_with_model(&members, model, body.len());
    Ok((out, usage_of(&answer.usage)))
}

/// The provider's count (`{"input_tokens": N}`) as it came; `Err` says why it
/// is not one.
pub fn count_answer(body: &[u8]) -> Result<Vec<u8>, String> {
    let count: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    match count.get("input_tokens").and_then(serde_json::Value::as_u64) {
        Some(_) => Ok(body.to_vec()),
        None => Err("body is not an Anthropic token count (no input_tokens)".into()),
    }
}

#[derive(Deserialize)]
struct StartMessage {
    #[serde(default)]
    usage: WireUsage,
}

/// What a Messages stream event says of usage: `message_start`'s counts, or
/// a `message_delta`'s (cumulative; one without input counts keeps `before`'s).
pub fn stream_usage(
    kind: &str,
    message: Option<&RawValue>,
    usage: Option<&RawValue>,
    before: Option<Usage>,
) -> Option<Usage> {
    let wire = match kind {
        "message_start" => message
            .and_then(|m| serde_json::from_str::<StartMessage>(m.get()).ok())
            .map(|m| m.usage),
        "message_delta" => usage.and_then(|u| serde_json::from_str::<WireUsage>(u.get()).ok()),
        _ => None,
    }?;
    let mut now = usage_of(&wire);
    if wire.prompt().is_none() {
        now.prompt_tokens = before.map_or(0, |u| u.prompt_tokens);
    }
    Some(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sse::tests::chunkings;
    use serde_json::Value;

    fn provider() -> Provider {
        let json = br#"{"providers":[{"id":"a","api":"anthropic","cluster":"a","authority":"a","path_prefix":"/v1","api_key":"sk-ant-secret-1"}]}"#;
        let config = crate::config::Config::parse(json, &|_| None).unwrap();
        (*config.provider("a").unwrap().clone()).clone()
    }

    #[test]
    fn the_clients_request_passes_byte_for_byte_but_for_the_model_and_the_routing_field() {
        // What only Anthropic reads: cache markers, a signed thinking block, a document, a server tool.
        let body = br#"{"model":"claude-sonnet-4-5","max_tokens":1024,"system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"document","source":{"type":"text","media_type":"text/plain","data":"x"}}]},{"role":"assistant","content":[{"type":"thinking","thinking":"Hmm.","signature":"EqQB"}]}],"tools":[{"type":"web_search_20250305","name":"web_search"}],"waygate":{"routing":{"allow_fallbacks":false}}}"#;
        let headers = vec![(
            "anthropic-beta".to_string(),
            "context-management-2025-06-27".to_string(),
        )];
        let up = native_request(
            &provider(),
            Endpoint::Messages,
            body,
            &headers,
            "claude-sonnet-4-5-20250929",
            "waygate",
        )
        .unwrap();
        let text = std::str::from_utf8(&up.body).unwrap();
        assert!(text.starts_with(r#"{"max_tokens":1024,"system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],"messages":"#), "{text}");
        let sent: Value = serde_json::from_slice(&up.body).unwrap();
        let asked: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(sent["model"], "claude-sonnet-4-5-20250929");
        assert_eq!(sent.get("waygate"), None);
        for field in ["system", "messages", "tools", "max_tokens"] {
            assert_eq!(sent[field], asked[field], "{field}");
        }
        assert_eq!(up.path, "/v1/messages");
        assert_eq!(
            up.headers,
            [
                ("x-api-key".to_string(), "sk-ant-secret-1".to_string()),
                ("anthropic-version".to_string(), VERSION.to_string()),
                (
                    "anthropic-beta".to_string(),
                    "context-management-2025-06-27".to_string()
                ),
            ]
        );
    }

    #[test]
    fn the_answer_keeps_every_member_and_names_the_clients_model() {
        let body = include_bytes!("../../../tests/fixtures/anthropic/message.json");
        let (out, usage) = native_answer(body, "claude-sonnet-4-5").unwrap();
        let (mut got, mut want): (Value, Value) = (
            serde_json::from_slice(&out).unwrap(),
            serde_json::from_slice(body).unwrap(),
        );
        assert_eq!(got["model"], "claude-sonnet-4-5");
        got["model"] = Value::Null;
        want["model"] = Value::Null;
        assert_eq!(got, want);
        let u = &want["usage"];
        let n = |k: &str| u[k].as_u64().unwrap_or(0);
        assert_eq!(
            usage.prompt_tokens,
            n("input_tokens") + n("cache_creation_input_tokens") + n("cache_read_input_tokens")
        );
        assert_eq!(usage.completion_tokens, n("output_tokens"));
        assert!(native_answer(br#"{"type":"error","error":{}}"#, "m").is_err());
    }

    fn replay(chunks: &[&[u8]]) -> (Vec<u8>, Option<Usage>, Option<String>) {
        let mut stream = crate::providers::native::NativeStream::new(
            crate::providers::native::Wire::Messages,
            provider().credential.clone(),
        );
        let mut out = Vec::new();
        for chunk in chunks {
            stream.push(chunk, &mut out);
        }
        stream.finish(&mut out);
        (out, stream.usage(), stream.error_code().map(str::to_string))
    }

    #[test]
    fn a_recorded_stream_passes_event_for_event_under_every_chunking() {
        for input in [
            &include_bytes!("../../../tests/fixtures/anthropic/message_stream.sse")[..],
            &include_bytes!("../../../tests/fixtures/anthropic/message_stream_tool_use.sse")[..],
        ] {
            let whole = replay(&[input]);
            for chunks in chunkings(input) {
                assert_eq!(replay(&chunks), whole);
            }
            let (out, usage, error) = whole;
            // The same events, each with its data as it came.
            let datas = |bytes: &[u8]| -> Vec<String> {
                String::from_utf8_lossy(bytes)
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .map(str::to_string)
                    .collect()
            };
            assert_eq!(datas(&out), datas(input));
            assert!(usage.is_some_and(|u| u.completion_tokens > 0), "{usage:?}");
            assert_eq!(error, None);
        }
    }

    #[test]
    fn a_cut_or_echoing_stream_is_said_so_and_scrubbed() {
        let cut = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n";
        let (out, usage, error) = replay(&[cut]);
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("event: error\ndata: {\"error\":{\"message\":\"The provider's stream ended before it was complete. (stream_interrupted)\",\"type\":\"api_error\"},\"type\":\"error\"}\n\n"), "{text}");
        assert_eq!(
            (usage.unwrap().prompt_tokens, error.as_deref()),
            (3, Some("stream_interrupted"))
        );
        let echo = b"data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"key sk-ant-secret-1\"}}\n\ndata: {\"type\":\"message_stop\"}\n\n";
        let (out, _, error) = replay(&[echo]);
        let text = String::from_utf8(out).unwrap();
        assert!(
            !text.contains("sk-ant-secret-1") && text.contains(crate::redact::REDACTED),
            "{text}"
        );
        assert_eq!(error, None);
    }

    #[test]
    fn a_count_goes_to_count_tokens_as_the_client_sent_it_and_comes_back_as_it_came() {
        let body = br#"{"model":"claude-sonnet-4-5","system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}]}"#;
        let up = native_request(
            &provider(),
            Endpoint::CountTokens,
            body,
            &[],
            "claude-sonnet-4-5-20250929",
            "waygate",
        )
        .unwrap();
        assert_eq!(up.path, "/v1/messages/count_tokens");
        assert_eq!(
            std::str::from_utf8(&up.body).unwrap(),
            r#"{"system":[{"type":"text","text":"Be brief.","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":"hi"}],"model":"claude-sonnet-4-5-20250929"}"#
        );
        assert!(up.headers.contains(&("anthropic-version".into(), VERSION.into())));
        assert!(up.headers.contains(&("x-api-key".into(), "sk-ant-secret-1".into())));
        // As api.anthropic.com answers it.
        let answer = br#"{"input_tokens":14}"#;
        assert_eq!(count_answer(answer).unwrap(), answer);
        assert!(count_answer(br#"{"type":"message"}"#).is_err());
        assert!(count_answer(b"not json").is_err());
    }

    #[test]
    fn only_the_thinking_blocks_anthropic_signed_go_back_to_it() {
        // A turn a translated provider served (its thinking unsigned), then one Anthropic served.
        let body = br#"{"model":"claude-x","max_tokens":99,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"thinking","thinking":"mine","signature":""},{"type":"text","text":"b"}]},{"role":"assistant","content":[{"type":"thinking","thinking":"only","signature":""}]},{"role":"user","content":"c"},{"role":"assistant","content":[{"type":"thinking","thinking":"signed","signature":"EqQB"},{"type":"text","text":"d"}]},{"role":"user","content":"e"}],"stream":true}"#;
        let up = native_request(&provider(), Endpoint::Messages, body, &[], "claude-x", "waygate").unwrap();
        let sent: Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(
            sent["messages"],
            serde_json::json!([{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"text","text":"b"}]},
                {"role":"user","content":"c"},{"role":"assistant","content":[{"type":"thinking","thinking":"signed","signature":"EqQB"},{"type":"text","text":"d"}]},
                {"role":"user","content":"e"}])
        );
        assert!(
            std::str::from_utf8(&up.body)
                .unwrap()
                .starts_with(r#"{"max_tokens":99,"messages":"#),
            "the other members as they came"
        );
        assert_eq!(sent["stream"], true);
        // Without an unsigned block the body passes byte for byte.
        let signed = br#"{"max_tokens":99,"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"x","signature":"EqQB"}]}],"model":"claude-x"}"#;
        assert_eq!(
            native_request(&provider(), Endpoint::Messages, signed, &[], "claude-x", "waygate")
                .unwrap()
                .body,
            signed
        );
        // JSON as Python writes it (spaces after the colons); a message the
        // client itself sent empty is left to Anthropic's own answer.
        let spaced = br#"{"model": "claude-x", "messages": [{"role": "user", "content": []}, {"role": "assistant", "content": [{"type": "thinking", "thinking": "mine", "signature" : ""}, {"type": "text", "text": "b"}]}]}"#;
        let up = native_request(&provider(), Endpoint::Messages, spaced, &[], "claude-x", "waygate").unwrap();
        let sent: Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(
            sent["messages"],
            serde_json::json!([{"role": "user", "content": []}, {"role": "assistant", "content": [{"type": "text", "text": "b"}]}])
        );
        assert!(may_hold_an_unsigned_block(br#"{"signature":	""}"#));
        assert!(!may_hold_an_unsigned_block(br#"{"signature":"EqQB","x":""}"#));
    }
}
