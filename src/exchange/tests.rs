use super::*;
use crate::config::Keys;
use crate::limits::tests::MemoryStore;
use crate::record::TOTAL_TOKENS_PROPERTY;
use serde_json::json;
use sha2::{Digest, Sha256};

const SECRET: &str = "sk-oa-secret-0123456789";
const ANTHROPIC_SECRET: &str = "sk-an-secret-9876543210";
const CLIENT_KEY: &str = "wg-client-key";

fn config() -> Rc<Config> {
    let digest: String = Sha256::digest(CLIENT_KEY.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let json = format!(
        r#"{{"keys":[{{"id":"dev","sha256":"{digest}"}}],
          "providers":[
            {{"id":"oa","api":"openai","cluster":"c_oa","authority":"oa.local","api_key":"{SECRET}"}},
            {{"id":"an","api":"anthropic","cluster":"c_an","authority":"an.local","api_key":"{ANTHROPIC_SECRET}"}}],
          "models":[{{"id":"chain/x","endpoints":[{{"provider":"oa","model":"a"}},{{"provider":"an","model":"b"}}]}}]}}"#
    );
    Rc::new(Config::parse(json.as_bytes(), &|_| None).unwrap())
}

/// A chat request's headers with the client's key, plus `extra`, as the shell hands them over.
fn request_headers(extra: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let auth = format!("Bearer {CLIENT_KEY}");
    [
        (":method", "POST"),
        (":path", "/api/v1/chat/completions"),
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ]
    .iter()
    .chain(extra)
    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
    .collect()
}

/// An exchange whose request went upstream to `model`'s first provider.
fn forwarded(model: &str, stream: bool) -> Exchange {
    let mut ex = Exchange::new(config(), 0);
    let pairs = request_headers(&[]);
    assert_eq!(ex.on_request_headers(&pairs, false).action, HeadersAction::ReadBody);
    let body = json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]});
    let forward = ex
        .on_request_body(
            body.to_string().as_bytes(),
            1_700_000_000_000_000_000,
            &mut MemoryStore::default(),
        )
        .unwrap();
    assert!(replaced_or_removed(&forward, "authorization"), "{forward:?}");
    ex
}

/// Whether the client's `name` header cannot reach the provider: removed,
/// or set (which replaces it) to the provider's own value.
fn replaced_or_removed(forward: &Forward, name: &str) -> bool {
    forward.remove.iter().any(|r| r == name) || forward.set.iter().any(|(k, _)| k == name)
}

/// An upstream response's headers, as the shell hands them over.
fn head(status: u16, content_type: &str) -> Vec<(String, String)> {
    vec![
        (":status".into(), status.to_string()),
        ("content-type".into(), content_type.into()),
    ]
}

/// Envoy's `response.code_details` for a provider's own answer.
fn via_upstream() -> Option<Vec<u8>> {
    Some(b"via_upstream".to_vec())
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What `ex` logs: its access line and stats.
fn logged(ex: &mut Exchange) -> Log {
    let log = ex.on_log(
        &mut MemoryStore::default(),
        2_000_000,
        &mut metrics::OpenLabels::default(),
    );
    log.unwrap()
}

#[test]
fn an_answer_envoy_ended_past_the_filter_is_logged_as_it_ended() {
    for (details, ended) in [
        (
            &b"upstream_reset_after_response_started{remote_reset}"[..],
            " attempts=oa:error status=502 ",
        ),
        (b"response_timeout", " attempts=oa:error status=504 "),
    ] {
        let mut ex = forwarded("oa/x", false);
        ex.on_response_headers(&head(200, "application/json"), via_upstream, false);
        // The client gone is no failure of the provider's: the record stays.
        ex.on_ended_by_envoy(b"downstream_remote_disconnect");
        assert_eq!(ex.stage(), Stage::Buffering);
        ex.on_ended_by_envoy(details);
        let line = logged(&mut ex).line;
        assert!(line.contains(ended), "{line}");
    }
    // A stream: its 200 went out; the attempt failed, counted as interrupted.
    let mut ex = forwarded("oa/x", true);
    ex.on_response_headers(&head(200, "text/event-stream"), via_upstream, false);
    ex.on_ended_by_envoy(b"upstream_reset_after_response_started{connection_termination}");
    assert_eq!(ex.record.error_code.as_deref(), Some("stream_interrupted"));
    let line = logged(&mut ex).line;
    assert!(line.contains(" attempts=oa:error status=200 "), "{line}");
}

#[test]
fn a_provider_echoing_its_credential_in_an_answer_is_redacted() {
    let mut ex = forwarded("oa/echo", false);
    assert_eq!(
        ex.on_response_headers(&head(200, "application/json"), via_upstream, false)
            .action,
        ResponseAction::Buffer
    );
    let echoed = json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": format!("{{\"authorization\":\"Bearer {SECRET}\"}}")}}]});
    let rewrite = ex.on_buffered_body(echoed.to_string().as_bytes());
    assert_eq!(rewrite.status, 200);
    let body = text(&rewrite.body);
    assert!(!body.contains(SECRET) && body.contains("Bearer [redacted]"), "{body}");
    let length = rewrite.set.iter().find(|(k, _)| k == "content-length").unwrap();
    assert_eq!(length.1, rewrite.body.len().to_string());
}

#[test]
fn a_provider_echoing_its_credential_in_a_stream_is_redacted() {
    let mut ex = forwarded("oa/echo", true);
    let action = ex
        .on_response_headers(&head(200, "text/event-stream"), via_upstream, false)
        .action;
    assert!(matches!(action, ResponseAction::Stream { .. }));
    let event = json!({"choices": [{"index": 0, "delta": {"content": SECRET}}]});
    let mut out = Vec::new();
    ex.on_stream_body(format!("data: {event}\n\n").as_bytes(), false, &mut out);
    let error = json!({"error": {"message": format!("bad key {SECRET}")}});
    ex.on_stream_body(format!("data: {error}\n\n").as_bytes(), true, &mut out);
    let out = text(&out);
    assert!(!out.contains(SECRET), "{out}");
    assert_eq!(out.matches("[redacted]").count(), 2, "{out}");
}

#[test]
fn a_provider_error_message_echoing_the_credential_is_redacted() {
    let mut ex = forwarded("oa/x", false);
    assert_eq!(
        ex.on_response_headers(&head(400, "application/json"), via_upstream, false)
            .action,
        ResponseAction::Buffer
    );
    let error =
        json!({"error": {"message": format!("Incorrect API key provided: {SECRET}."), "code": "invalid_api_key"}});
    let rewrite = ex.on_buffered_body(error.to_string().as_bytes());
    assert_eq!(rewrite.status, 400);
    let v: Value = serde_json::from_slice(&rewrite.body).unwrap();
    assert_eq!(v["error"]["message"], "Incorrect API key provided: [redacted].");
}

#[test]
fn a_fallback_answer_is_redacted_for_every_provider_tried() {
    let mut ex = forwarded("chain/x", false);
    let action = ex
        .on_response_headers(&head(503, "application/json"), via_upstream, false)
        .action;
    let ResponseAction::Fallback(call) = action else {
        panic!("expected a fallback: {action:?}")
    };
    assert_eq!(call.cluster, "c_an");
    assert!(call.headers.iter().all(|(_, v)| !v.contains(CLIENT_KEY)));
    let error = json!({"type": "error", "error": {"type": "invalid_request_error",
        "message": format!("keys {ANTHROPIC_SECRET} and {SECRET}")}});
    let CallStep::Reply(rewrite) = ex.on_call_response(&head(400, "application/json"), error.to_string().as_bytes())
    else {
        panic!("expected the final answer")
    };
    let body = text(&rewrite.body);
    assert!(!body.contains(SECRET) && !body.contains(ANTHROPIC_SECRET), "{body}");
}

#[test]
fn reserved_headers_go_on_every_path_and_the_clients_x_envoy_and_account_ones_on_the_api() {
    let extra = [
        ("x-waygate-cluster", "ghost"),
        ("x-envoy-max-retries", "3"),
        ("x-envoy-retry-on", "5xx"),
        ("x-envoyish", "kept"),
        ("openai-organization", "org-developers-own"),
        ("openai-project", "proj_developers_own"),
        ("x-api-key", "sk-ant-developers-own"),
        ("openai-beta", "assistants=v2"),
        ("cookie", "session=gateway-site-session"),
    ];
    let step = Exchange::new(config(), 0).on_request_headers(&request_headers(&extra), false);
    assert_eq!(step.action, HeadersAction::ReadBody);
    assert_eq!(
        step.remove,
        [
            "x-waygate-cluster",
            "x-envoy-max-retries",
            "x-envoy-retry-on",
            "openai-organization",
            "openai-project",
            "x-api-key",
            "cookie"
        ]
    );
    // Outside base_path the request is not the filter's: only the cluster is its business.
    let mut elsewhere = request_headers(&extra);
    elsewhere[1].1 = b"/elsewhere".to_vec();
    let step = Exchange::new(config(), 0).on_request_headers(&elsewhere, false);
    assert_eq!(step.action, HeadersAction::Continue);
    assert_eq!(step.remove, ["x-waygate-cluster"]);
}

#[test]
fn the_body_is_held_until_its_end_and_refused_once_too_large() {
    let mut ex = Exchange::new(config(), 0);
    assert_eq!(ex.on_request_body_chunk(10, false), BodyStep::Pass, "headers not seen");
    assert_eq!(
        ex.on_request_headers(&request_headers(&[]), false).action,
        HeadersAction::ReadBody
    );
    assert_eq!(ex.on_request_body_chunk(10, false), BodyStep::Wait);
    assert_eq!(ex.on_request_body_chunk(20, true), BodyStep::Read);
    let limit = usize::try_from(config().max_request_bytes).unwrap();
    let BodyStep::Reply(reply) = ex.on_request_body_chunk(limit + 1, false) else {
        panic!("an oversize body is refused before its end");
    };
    assert_eq!(reply.status, 413);
    assert_eq!(ex.on_request_body_chunk(limit + 2, true), BodyStep::Pass, "answered");
    assert_eq!(ex.stage(), Stage::Untouched);
}

#[test]
fn the_answers_spend_is_published_and_an_error_spends_nothing() {
    let mut ex = forwarded("oa/x", false);
    ex.on_response_headers(&head(200, "application/json"), via_upstream, false);
    let answer = json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": "hi"}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3}});
    assert!(ex.take_usage().is_empty(), "not before the answer is final");
    assert_eq!(ex.on_buffered_body(answer.to_string().as_bytes()).status, 200);
    let published = ex.take_usage();
    assert!(ex.take_usage().is_empty() && ex.take_usage_at_log().is_empty(), "once");
    for expected in [
        ("waygate_prompt_tokens", "7"),
        ("waygate_completion_tokens", "3"),
        (TOTAL_TOKENS_PROPERTY, "10"),
        ("waygate_provider", "oa"),
    ] {
        assert!(
            published.contains(&(expected.0, expected.1.to_string())),
            "{expected:?} in {published:?}"
        );
    }

    let mut ex = forwarded("oa/x", false);
    ex.on_response_headers(&head(400, "application/json"), via_upstream, false);
    assert_eq!(ex.on_buffered_body(b"{}").status, 400);
    assert_eq!(ex.usage_properties(), [(TOTAL_TOKENS_PROPERTY, "0".to_string())]);
}

/// The access line and the stats say the request ended as the contract's 500.
fn assert_logged_as_internal_error(ex: &mut Exchange) {
    let log = logged(ex);
    assert!(log.line.contains("status=500"), "{}", log.line);
    assert!(
        log.metrics.iter().any(|u| u.name == "waygate.errors.internal_error"),
        "{:?}",
        log.metrics
    );
}

#[test]
fn a_step_the_host_refused_ends_the_request_as_a_logged_500() {
    let mut ex = forwarded("oa/x", false);
    assert_eq!(ex.stage(), Stage::Awaiting);
    let reply = ex.fail("rewriting the request failed");
    assert_eq!(reply.status, 500);
    let v: Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(v["error"]["code"], "internal_error");
    // Envoy passes the reply back through the response callbacks: not ours.
    assert_eq!(ex.stage(), Stage::Untouched);
    let step = ex.on_response_headers(&head(500, "application/json"), via_upstream, false);
    assert_eq!(step.action, ResponseAction::Continue);
    assert_logged_as_internal_error(&mut ex);
}

#[test]
fn a_stream_the_shell_cut_is_logged_as_a_500_and_reads_no_more() {
    let mut ex = forwarded("oa/x", true);
    let step = ex.on_response_headers(&head(200, "text/event-stream"), via_upstream, false);
    assert!(matches!(step.action, ResponseAction::Stream { .. }), "{step:?}");
    ex.cut("replacing a stream chunk failed");
    assert_eq!(ex.stage(), Stage::Untouched);
    let mut out = Vec::new();
    ex.on_stream_body(b"data: {}\n\n", false, &mut out);
    assert!(out.is_empty(), "a cut stream writes nothing more");
    assert_logged_as_internal_error(&mut ex);
}

#[test]
fn the_clients_key_in_other_headers_is_never_forwarded() {
    let mut ex = Exchange::new(config(), 0);
    let pairs = request_headers(&[
        ("x-api-key", CLIENT_KEY),
        ("api-key", CLIENT_KEY),
        ("x-other", "harmless"),
    ]);
    assert_eq!(ex.on_request_headers(&pairs, false).action, HeadersAction::ReadBody);
    let body = json!({"model": "an/x", "messages": [{"role": "user", "content": "hi"}]});
    let forward = ex
        .on_request_body(body.to_string().as_bytes(), 1, &mut MemoryStore::default())
        .unwrap();
    for name in ["authorization", "x-api-key", "api-key"] {
        assert!(replaced_or_removed(&forward, name), "{name}: {forward:?}");
        assert!(!forward.set.iter().any(|(_, v)| v.contains(CLIENT_KEY)), "{forward:?}");
    }
    assert!(!forward.remove.iter().any(|r| r == "x-other"));
    // Replaced by the provider's own credential.
    assert!(
        forward
            .set
            .contains(&("x-api-key".to_string(), ANTHROPIC_SECRET.to_string()))
    );
}

#[test]
fn with_router_fallback_every_attempt_is_prepared_and_the_last_answer_is_shaped() {
    let mut config = (*config()).clone();
    config.fallback = Fallback::Router;
    let mut ex = Exchange::new(Rc::new(config), 0);
    let pairs = request_headers(&[("x-api-key", CLIENT_KEY)]);
    assert_eq!(ex.on_request_headers(&pairs, false).action, HeadersAction::ReadBody);
    let body = json!({"model": "chain/x", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let forward = ex
        .on_request_body(body.to_string().as_bytes(), 1, &mut MemoryStore::default())
        .unwrap();
    // The downstream request carries the route marker and the retries, not a translation.
    assert!(forward.set.contains(&(ROUTED_HEADER.into(), "1".into())), "{forward:?}");
    assert!(forward.set.contains(&("x-envoy-max-retries".into(), "1".into())));
    assert_eq!(
        forward.body, None,
        "the client's body stays until each attempt replaces it"
    );
    for name in ["authorization", "x-api-key"] {
        assert!(forward.remove.iter().any(|r| r == name), "{name}: {forward:?}");
    }
    let routed = forward.routed.clone().unwrap();
    assert_eq!(routed.borrow().clusters().collect::<Vec<_>>(), ["c_oa", "c_an"]);
    // Published for the route's cluster matcher, slot by slot.
    for (name, cluster) in [("waygate_slot_1", "c_oa"), ("waygate_slot_2", "c_an")] {
        assert!(
            forward.properties.contains(&(name.into(), cluster.into())),
            "{:?}",
            forward.properties
        );
    }

    // What the upstream filter does for the router's two attempts.
    {
        let mut all = routed.borrow_mut();
        let first = all.start(1).unwrap();
        assert!(
            first
                .set
                .contains(&("authorization".into(), format!("Bearer {SECRET}")))
        );
        all.on_response(1, 503, None);
        let second = all.start(2).unwrap();
        assert!(
            second.set.contains(&(":path".into(), "/v1/messages".into())),
            "{second:?}"
        );
        assert!(second.set.contains(&("x-api-key".into(), ANTHROPIC_SECRET.into())));
        assert!(second.remove.iter().any(|r| r == "authorization"), "{second:?}");
        assert!(text(second.body).contains("\"model\":\"b\""), "{}", text(second.body));
    }
    routed.borrow_mut().on_response(2, 200, None);

    // The answer the client gets is the second one's, streamed and translated.
    let action = ex
        .on_response_headers(&head(200, "text/event-stream"), via_upstream, false)
        .action;
    let ResponseAction::Stream { set, .. } = action else {
        panic!("{action:?}");
    };
    assert!(
        set.contains(&("x-waygate-attempts".into(), "oa:503,an:200".into())),
        "{set:?}"
    );
    assert!(set.contains(&("x-waygate-provider".into(), "an".into())), "{set:?}");
    let mut out = Vec::new();
    ex.on_stream_body(
        b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"b\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n\
          event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\n\n",
        false,
        &mut out,
    );
    assert!(text(&out).contains("chat.completion.chunk"), "{}", text(&out));
}

/// A key limited to one request a minute, counted where `limits` says.
fn limited_config(limits: Limits) -> Rc<Config> {
    let mut config = (*config()).clone();
    config.limits = limits;
    let limited = config.keys.iter().map(|key| {
        let mut key = (**key).clone();
        key.requests_per_minute = Some(1);
        Rc::new(key)
    });
    config.keys = Keys::new(limited.collect());
    Rc::new(config)
}

fn send(ex: &mut Exchange, store: &mut MemoryStore) -> Result<Forward, Reply> {
    assert_eq!(
        ex.on_request_headers(&request_headers(&[]), false).action,
        HeadersAction::ReadBody
    );
    let body = json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}]});
    ex.on_request_body(body.to_string().as_bytes(), 1_700_000_000_000_000_000, store)
}

#[test]
fn with_global_limits_the_filter_counts_nothing_and_names_the_key() {
    let mut store = MemoryStore::default();
    let local = limited_config(Limits::Local);
    limits::prepare(&mut store, &local.keys);
    assert!(send(&mut Exchange::new(Rc::clone(&local), 0), &mut store).is_ok());
    let refused = send(&mut Exchange::new(local, 0), &mut store).unwrap_err();
    assert_eq!(refused.status, 429);

    let global = limited_config(Limits::Global);
    let mut store = MemoryStore::default();
    limits::prepare(&mut store, &global.keys);
    for _ in 0..3 {
        let mut ex = Exchange::new(Rc::clone(&global), 0);
        let forward = send(&mut ex, &mut store).unwrap();
        assert!(forward.properties.contains(&(KEY_ID_PROPERTY.into(), "dev".into())));
        assert!(
            !forward.set.iter().any(|(k, _)| k.starts_with("x-ratelimit")),
            "{forward:?}"
        );
    }
}

#[test]
fn envoys_rate_limit_refusal_is_answered_in_the_contract_shape_and_never_falls_back() {
    let mut ex = forwarded("chain/x", true);
    let refusal = [(":status", "429"), ("x-ratelimit-reset", "42")];
    let step = ex.on_response_headers(&refusal, || Some(b"request_rate_limited".to_vec()), true);
    let ResponseAction::Answer(rewrite) = step.action else {
        panic!("{:?}", step.action);
    };
    assert_eq!(rewrite.status, 429);
    assert!(
        rewrite.set.contains(&("retry-after".into(), "42".into())),
        "{:?}",
        rewrite.set
    );
    assert!(
        !rewrite.set.iter().any(|(k, _)| k == "x-waygate-attempts"),
        "no provider was tried"
    );
    let body: Value = serde_json::from_slice(&rewrite.body).unwrap();
    assert_eq!(body["error"]["code"], "rate_limited");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    let line = logged(&mut ex).line;
    assert!(
        line.contains("status=429") && line.contains("provider=- attempts=-"),
        "{line}"
    );
}

fn plain_answer(content: &str) -> Vec<u8> {
    json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": content}}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    .to_string()
    .into_bytes()
}

#[test]
fn a_held_answer_is_kept_until_its_end_and_written_in_place() {
    let mut ex = forwarded("oa/x", false);
    ex.on_response_headers(&head(200, "application/json"), via_upstream, false);
    let answer = plain_answer("held in two parts");
    let (first, rest) = answer.split_at(20);
    assert_eq!(ex.on_buffered_chunk(first.to_vec(), false), BufferStep::Hold);
    assert!(ex.take_usage().is_empty(), "not final yet");
    let BufferStep::Write(rewrite) = ex.on_buffered_chunk(rest.to_vec(), true) else {
        panic!("an answer no larger than its upstream's is written into Envoy's buffer");
    };
    assert_eq!(rewrite.status, 200);
    assert_eq!(
        serde_json::from_slice::<Value>(&rewrite.body).unwrap()["choices"][0]["message"]["content"],
        "held in two parts"
    );
    assert!(ex.take_usage().contains(&(TOTAL_TOKENS_PROPERTY, "10".to_string())));
}

#[test]
fn an_answer_larger_than_envoy_has_held_goes_as_a_local_reply() {
    let small = r#"{"max_request_bytes": 64, "keys": [], "providers":
        [{"id":"oa","api":"openai","cluster":"c_oa","authority":"oa.local","api_key":"k"}]}"#;
    let small = Rc::new(Config::parse(small.as_bytes(), &|_| None).unwrap());
    let answer = plain_answer(&"long ".repeat(40));
    let in_chunks = |chunks: &[&[u8]]| {
        let mut ex = forwarded("oa/x", false);
        ex.config = Rc::clone(&small);
        ex.on_response_headers(&head(200, "application/json"), via_upstream, false);
        let (last, held) = chunks.split_last().unwrap();
        for chunk in held {
            assert_eq!(ex.on_buffered_chunk(chunk.to_vec(), false), BufferStep::Hold);
        }
        ex.on_buffered_chunk(last.to_vec(), true)
    };
    // In one callback: nothing sits in Envoy's buffer yet (flow control, never an error).
    assert!(matches!(in_chunks(&[&answer]), BufferStep::Write(_)));
    // After a pause, the rewrite is larger than the 64-byte floor and than
    // the most Envoy's buffer held: a local reply.
    let (head_part, rest) = answer.split_at(100);
    let BufferStep::Reply(rewrite) = in_chunks(&[head_part, rest]) else {
        panic!("a local reply");
    };
    assert_eq!(rewrite.status, 200);
    assert!(text(&rewrite.body).contains("long long"));
}

#[test]
fn an_answer_over_the_cap_is_the_contracts_502_and_is_dropped() {
    let mut ex = forwarded("oa/x", false);
    ex.on_response_headers(&head(200, "application/json"), via_upstream, false);
    assert_eq!(ex.on_buffered_chunk(vec![b' '; 1024], false), BufferStep::Hold);
    let BufferStep::Reply(rewrite) = ex.on_buffered_chunk(vec![b' '; MAX_ANSWER_BYTES], false) else {
        panic!("over the cap");
    };
    assert_eq!(rewrite.status, 502);
    assert!(
        text(&rewrite.body).contains("invalid_upstream_response"),
        "{}",
        text(&rewrite.body)
    );
    assert_eq!(
        ex.stage(),
        Stage::Untouched,
        "answered: the rest of the upstream body is dropped"
    );
}

#[test]
fn the_log_times_the_upstream_its_first_byte_and_the_whole_request() {
    let ms = 1_000_000;
    let mut ex = Exchange::new(config(), 1_000 * ms);
    ex.on_request_headers(&request_headers(&[]), false);
    let body = json!({"model": "oa/x", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    ex.on_request_body(body.to_string().as_bytes(), 1_005 * ms, &mut MemoryStore::default())
        .unwrap();
    ex.on_response_headers(&head(200, "text/event-stream"), via_upstream, false);
    let unread = || panic!("the clock is read only for the first byte and the end");
    ex.on_response_body_timing(0, false, unread);
    ex.on_response_body_timing(12, false, || 1_008 * ms);
    ex.on_response_body_timing(12, false, unread);
    ex.on_response_body_timing(0, true, || 1_020 * ms);
    let log = ex
        .on_log(
            &mut MemoryStore::default(),
            1_030 * ms,
            &mut metrics::OpenLabels::default(),
        )
        .unwrap();
    let observed = |name: &str| log.metrics.iter().find(|u| u.name == name).map(|u| u.value);
    assert_eq!(observed("waygate.upstream_duration_ms.oa"), Some(15));
    assert_eq!(observed("waygate.time_to_first_token_ms.oa"), Some(3));
    assert!(log.line.contains(" duration_ms=30"), "{}", log.line);
}

/// A `count_tokens` request for `model` through a fresh exchange: the forward
/// to a provider that counts, or the filter's own answer.
fn count(model: &str) -> (Exchange, Result<Forward, Reply>) {
    let mut ex = Exchange::new(config(), 0);
    let auth = format!("Bearer {CLIENT_KEY}");
    let pairs: Vec<(&str, &str)> = vec![
        (":method", "POST"),
        (":path", "/api/v1/messages/count_tokens?beta=true"),
        ("authorization", &auth),
        ("content-type", "application/json"),
        ("anthropic-version", "2023-06-01"),
    ];
    assert_eq!(ex.on_request_headers(&pairs, false).action, HeadersAction::ReadBody);
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi there"}]});
    let sent = ex.on_request_body(body.to_string().as_bytes(), 1, &mut MemoryStore::default());
    (ex, sent)
}

#[test]
fn a_token_count_is_asked_of_a_provider_that_counts_and_estimated_otherwise() {
    let (mut ex, sent) = count("an/claude-x");
    let forward = sent.unwrap();
    let path = forward.set.iter().find(|(k, _)| k == ":path").unwrap();
    assert!(path.1.ends_with("/messages/count_tokens"), "{path:?}");
    let body: Value = serde_json::from_slice(forward.body.as_ref().unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"messages": [{"role": "user", "content": "hi there"}], "model": "claude-x"})
    );
    assert!(forward.set.contains(&("anthropic-version".into(), "2023-06-01".into())));
    ex.on_response_headers(&head(200, "application/json"), via_upstream, false);
    let rewrite = ex.on_buffered_body(br#"{"input_tokens":11}"#);
    assert_eq!(
        (rewrite.status, text(&rewrite.body).as_str()),
        (200, r#"{"input_tokens":11}"#)
    );
    assert!(rewrite.set.contains(&("x-waygate-provider".into(), "an".into())));
    // A provider's own refusal is in Anthropic's envelope.
    let (mut ex, _) = count("an/claude-x");
    ex.on_response_headers(&head(400, "application/json"), via_upstream, false);
    let refused = ex.on_buffered_body(br#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#);
    assert_eq!(refused.status, 400);
    assert_eq!(serde_json::from_slice::<Value>(&refused.body).unwrap()["type"], "error");

    // OpenAI's API has no count: estimated by the filter, no provider asked,
    // whether the model's first candidate is OpenAI alone or before Anthropic.
    for model in ["oa/x", "chain/x"] {
        let (ex, sent) = count(model);
        let reply = sent.unwrap_err();
        assert_eq!(reply.status, 200, "{model}");
        let answer: Value = serde_json::from_slice(&reply.body).unwrap();
        assert!(answer["input_tokens"].as_u64().unwrap() >= 1, "{answer}");
        assert!(ex.record.attempts.is_empty());
    }
}
