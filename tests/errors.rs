//! Bad input through the compiled filter: every case asserts the status and
//! the contract's envelope (`type`, `code`, `param`), never a crash.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::{DEV_KEY, Gateway, NARROW_KEY, Response, send_raw};
use serde_json::json;

const CHAT: &str = "/api/v1/chat/completions";
const LEGACY: &str = "/api/v1/completions";

fn post(gw: &Gateway, path: &str, body: &str) -> Response {
    gw.post(path, body)
}

/// `(body, code, param)` cases on chat completions, all 400.
const BAD_CHAT_BODIES: &[(&str, &str, Option<&str>)] = &[
    ("not json", "invalid_json", None),
    ("{\"model\": ", "invalid_json", None),
    ("[]", "invalid_json", None),
    ("\"a string\"", "invalid_json", None),
    ("{}", "missing_field", Some("model")),
    (
        r#"{"messages":[{"role":"user","content":"x"}]}"#,
        "missing_field",
        Some("model"),
    ),
    (
        r#"{"model":null,"messages":[{"role":"user","content":"x"}]}"#,
        "missing_field",
        Some("model"),
    ),
    (
        r#"{"model":42,"messages":[{"role":"user","content":"x"}]}"#,
        "invalid_type",
        Some("model"),
    ),
    (r#"{"model":"fake/ok"}"#, "missing_field", Some("messages")),
    (
        r#"{"model":"fake/ok","messages":"hi"}"#,
        "invalid_type",
        Some("messages"),
    ),
    (
        r#"{"model":"fake/ok","messages":[]}"#,
        "invalid_value",
        Some("messages"),
    ),
    (
        r#"{"model":"fake/ok","messages":["hi"]}"#,
        "invalid_type",
        Some("messages.0"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"content":"x"}]}"#,
        "missing_field",
        Some("messages.0.role"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"wizard","content":"x"}]}"#,
        "invalid_value",
        Some("messages.0.role"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":7,"content":"x"}]}"#,
        "invalid_type",
        Some("messages.0.role"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user"}]}"#,
        "missing_field",
        Some("messages.0.content"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":5}]}"#,
        "invalid_type",
        Some("messages.0.content"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"video"}]}]}"#,
        "invalid_value",
        Some("messages.1.content.0.type"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
        "invalid_type",
        Some("messages.0.content.0.text"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
        "missing_field",
        Some("messages.0.content.0.image_url.url"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"tool","content":"42"}]}"#,
        "missing_field",
        Some("messages.0.tool_call_id"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"temperature":2.5}"#,
        "invalid_value",
        Some("temperature"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
        "invalid_type",
        Some("temperature"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"top_p":1.5}"#,
        "invalid_value",
        Some("top_p"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#,
        "invalid_value",
        Some("max_tokens"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"max_tokens":"10"}"#,
        "invalid_type",
        Some("max_tokens"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"n":0}"#,
        "invalid_value",
        Some("n"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"stop":7}"#,
        "invalid_type",
        Some("stop"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"stop":["a",1]}"#,
        "invalid_type",
        Some("stop.1"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"presence_penalty":3}"#,
        "invalid_value",
        Some("presence_penalty"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"frequency_penalty":-3}"#,
        "invalid_value",
        Some("frequency_penalty"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"seed":"abc"}"#,
        "invalid_type",
        Some("seed"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"user":5}"#,
        "invalid_type",
        Some("user"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#,
        "invalid_type",
        Some("stream"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":1}}"#,
        "invalid_type",
        Some("stream_options.include_usage"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"response_format":{"type":"yaml"}}"#,
        "invalid_value",
        Some("response_format.type"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"tools":{}}"#,
        "invalid_type",
        Some("tools"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"waygate":[]}"#,
        "invalid_type",
        Some("waygate"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"waygate":{"routing":{"max_provider_tries":0}}}"#,
        "invalid_value",
        Some("waygate.routing.max_provider_tries"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"waygate":{"routing":{"max_provider_tries":1.5}}}"#,
        "invalid_type",
        Some("waygate.routing.max_provider_tries"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"waygate":{"routing":{"prefer":"fake"}}}"#,
        "invalid_type",
        Some("waygate.routing.prefer"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"waygate":{"routing":{"prefer":["atlantis"]}}}"#,
        "invalid_value",
        Some("waygate.routing.prefer.0"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"waygate":{"routing":{"allow_fallbacks":"no"}}}"#,
        "invalid_type",
        Some("waygate.routing.allow_fallbacks"),
    ),
    (
        r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"waygate":{"routing":{"order":["fake"]}}}"#,
        "unsupported_parameter",
        Some("waygate.routing.order"),
    ),
    (
        r#"{"model":"","messages":[{"role":"user","content":"x"}]}"#,
        "invalid_value",
        Some("model"),
    ),
    (
        r#"{"model":"fake/","messages":[{"role":"user","content":"x"}]}"#,
        "invalid_value",
        Some("model"),
    ),
];

#[test]
fn bad_chat_bodies_get_400_with_the_field_named() {
    let gw = Gateway::start();
    for (body, code, param) in BAD_CHAT_BODIES {
        let r = post(&gw, CHAT, body);
        let v = r.assert_error(400, "invalid_request_error", code, *param);
        assert!(r.header("x-waygate-provider").is_none(), "{body}: {v}");
    }
    assert!(gw.fakes.received().is_empty(), "no bad request may reach a provider");
}

/// Envoy closes an HTTP/1 connection after a local 400 unless the shipped
/// bootstraps' `override_stream_error_on_invalid_http_message` says the
/// 400 is not a framing error: a client's invalid request costs it nothing
/// more than the answer. A broken request still closes it.
#[test]
fn an_invalid_request_keeps_its_http1_connection_and_a_broken_one_closes_it() {
    let gw = Gateway::start();
    let mut stream = TcpStream::connect(gw.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let ok = r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}]}"#;
    let bad_field = r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}],"temperature":9}"#;
    for (body, status) in [("not json", 400), (ok, 200), (bad_field, 400), (ok, 200)] {
        let r = common::chat_on(&mut stream, body);
        assert_eq!(r.status, status, "{body}: {}", r.text());
        assert_ne!(r.header("connection"), Some("close"), "{body}");
    }
    assert_eq!(
        gw.fakes.received().len(),
        2,
        "only the valid requests reach the provider"
    );
    // A framing error still ends the connection: nothing after it can be trusted.
    let broken = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gateway.local\r\nauthorization: Bearer {DEV_KEY}\r\n\
         content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\nnot-a-size\r\n"
    );
    stream.write_all(broken.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    let answer = String::from_utf8_lossy(&raw);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
    assert_eq!(gw.fakes.received().len(), 2);
}

#[test]
fn bad_legacy_bodies_get_400() {
    let gw = Gateway::start();
    for (body, code, param) in [
        (r#"{"model":"fake/ok"}"#, "missing_field", Some("prompt")),
        (
            r#"{"model":"fake/ok","prompt":["a","b"]}"#,
            "invalid_value",
            Some("prompt"),
        ),
        (
            r#"{"model":"fake/ok","prompt":[[1,2]]}"#,
            "invalid_type",
            Some("prompt.0"),
        ),
        (r#"{"prompt":"a"}"#, "missing_field", Some("model")),
        (
            r#"{"model":"fake/ok","prompt":"a","temperature":-1}"#,
            "invalid_value",
            Some("temperature"),
        ),
        (
            r#"{"model":"fakechat/ok","prompt":"a","echo":true}"#,
            "unsupported_parameter",
            Some("echo"),
        ),
    ] {
        post(&gw, LEGACY, body).assert_error(400, "invalid_request_error", code, param);
    }
}

#[test]
fn unknown_models_are_404_model_not_found() {
    let gw = Gateway::start();
    for model in [
        "gpt-4o",
        "atlantis/gpt",
        "demo/missing-from-list-but-demo-is-no-provider",
    ] {
        let r = gw.chat(json!({"model": model, "messages": [{"role": "user", "content": "x"}]}));
        r.assert_error(404, "invalid_request_error", "model_not_found", Some("model"));
    }
}

#[test]
fn keys_are_checked_before_anything_else() {
    let gw = Gateway::start();
    let body = br#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}]}"#;
    type Case<'a> = (&'a [(&'a str, &'a [u8])], &'a str);
    let cases: &[Case] = &[
        (&[], "missing_api_key"),
        (&[("authorization", b"Basic d2c6ZGV2")], "missing_api_key"),
        (&[("authorization", b"wg-dev-key")], "missing_api_key"),
        (&[("authorization", b"Bearer")], "invalid_api_key"),
        (&[("authorization", b"Bearer    ")], "invalid_api_key"),
        (&[("authorization", b"Bearer wrong-key")], "invalid_api_key"),
        (&[("authorization", b"Bearer wg-dev-key-but-longer")], "invalid_api_key"),
        (&[("authorization", b"Bearer \xff\xfe\xfd")], "invalid_api_key"),
    ];
    for (headers, code) in cases {
        let mut all: Vec<(&str, &[u8])> = headers.to_vec();
        all.push(("content-type", b"application/json"));
        let r = send_raw(gw.addr, "POST", CHAT, &all, body);
        r.assert_error(401, "authentication_error", code, None);
    }
    // Auth comes before endpoint checks: an unknown path without a key is 401.
    let r = send_raw(gw.addr, "GET", "/api/v1/nope", &[], b"");
    r.assert_error(401, "authentication_error", "missing_api_key", None);
    // The scheme is case-insensitive and spaces around are fine.
    let r = send_raw(
        gw.addr,
        "POST",
        CHAT,
        &[
            ("authorization", b"  bEaReR   wg-dev-key  "),
            ("content-type", b"application/json"),
        ],
        body,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(gw.fakes.received().len() == 1);
}

#[test]
fn endpoints_methods_media_types_and_sizes() {
    let gw = Gateway::start();
    let auth = format!("Bearer {DEV_KEY}");
    let json_headers = [("authorization", auth.as_str()), ("content-type", "application/json")];
    let body = r#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}]}"#;

    gw.send("POST", "/api/v1/embeddings", &json_headers, body.as_bytes())
        .assert_error(404, "invalid_request_error", "unknown_endpoint", None);
    gw.send("GET", "/api/v1", &json_headers, b"")
        .assert_error(404, "invalid_request_error", "unknown_endpoint", None);

    let r = gw.send("GET", CHAT, &json_headers, b"");
    r.assert_error(405, "invalid_request_error", "method_not_allowed", None);
    assert_eq!(r.header("allow"), Some("POST"));
    let r = gw.send("POST", "/api/v1/models", &json_headers, body.as_bytes());
    r.assert_error(405, "invalid_request_error", "method_not_allowed", None);
    assert_eq!(r.header("allow"), Some("GET"));

    for ct in ["text/plain", "application/x-www-form-urlencoded", "application/jsonx"] {
        gw.send(
            "POST",
            CHAT,
            &[("authorization", auth.as_str()), ("content-type", ct)],
            body.as_bytes(),
        )
        .assert_error(415, "invalid_request_error", "unsupported_media_type", None);
    }
    gw.send("POST", CHAT, &[("authorization", auth.as_str())], body.as_bytes())
        .assert_error(415, "invalid_request_error", "unsupported_media_type", None);
    let r = gw.send(
        "POST",
        CHAT,
        &[
            ("authorization", auth.as_str()),
            ("content-type", "Application/JSON; charset=utf-8"),
        ],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());

    // Over max_request_bytes (64 KiB in the test config): 413 from the filter, in JSON,
    // from the declared content-length, before any byte of the body. The client reads
    // it before sending the body: Envoy closes the connection after the 413, and body
    // bytes it has not read make that close a TCP reset, which can drop the answer
    // before the client reads it (seen once in CI).
    let mut stream = TcpStream::connect(gw.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gateway.local\r\nauthorization: {auth}\r\n\
         content-type: application/json\r\ncontent-length: 70000\r\n\r\n"
    );
    common::answer_on(&mut stream, head.as_bytes()).assert_error(413, "invalid_request_error", "body_too_large", None);
    // An empty body is not JSON.
    gw.send("POST", CHAT, &json_headers, b"")
        .assert_error(400, "invalid_request_error", "invalid_json", None);
}

#[test]
fn a_narrow_key_may_not_use_other_models() {
    let gw = Gateway::start();
    let auth = format!("Bearer {NARROW_KEY}");
    let headers = [("authorization", auth.as_str()), ("content-type", "application/json")];
    let r = gw.send(
        "POST",
        CHAT,
        &headers,
        br#"{"model":"fake/echo","messages":[{"role":"user","content":"x"}]}"#,
    );
    r.assert_error(403, "permission_error", "model_not_allowed", Some("model"));
    let r = gw.send(
        "POST",
        CHAT,
        &headers,
        br#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // 404 for an unknown model comes before 403.
    let r = gw.send(
        "POST",
        CHAT,
        &headers,
        br#"{"model":"atlantis/x","messages":[{"role":"user","content":"x"}]}"#,
    );
    r.assert_error(404, "invalid_request_error", "model_not_found", Some("model"));
}

#[test]
fn no_candidate_at_all_is_503_no_provider_available() {
    let gw = Gateway::start();
    let r = gw.chat(json!({"model": "demo/keyless", "messages": [{"role": "user", "content": "x"}]}));
    let v = r.assert_error(503, "upstream_error", "no_provider_available", None);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("nokey has no API key"),
        "{v}"
    );
    assert!(r.header("x-waygate-attempts").is_none(), "no provider was tried");
    assert!(gw.fakes.received().is_empty());
}

#[test]
fn provider_client_errors_keep_status_message_and_name_the_provider() {
    let gw = Gateway::start();
    for status in [400, 413, 422] {
        let r =
            gw.chat(json!({"model": format!("fake/status-{status}"), "messages": [{"role": "user", "content": "x"}]}));
        // The fake's body has no string code: provider_error, message kept.
        let v = r.assert_error(status, "invalid_request_error", "provider_error", None);
        assert_eq!(v["error"]["provider"], "fake", "{v}");
        assert_eq!(
            v["error"]["message"],
            "The fake provider was asked to fail with this status."
        );
        assert_eq!(r.header("x-waygate-attempts"), Some(format!("fake:{status}").as_str()));
        assert_eq!(r.header("x-waygate-provider"), Some("fake"));
    }
    assert_eq!(gw.fakes.received().len(), 3, "a client error is not retried");
}

#[test]
fn a_failed_last_attempt_decides_the_answer() {
    let gw = Gateway::start();
    let ask = |model: &str| gw.chat(json!({"model": model, "messages": [{"role": "user", "content": "x"}]}));
    let r = ask("fake/status-429");
    let v = r.assert_error(429, "rate_limit_error", "upstream_rate_limited", None);
    assert_eq!(r.header("retry-after"), Some("7"), "{v}");
    for status in [500, 503, 529, 401, 403, 404, 409] {
        let r = ask(&format!("fake/status-{status}"));
        let v = r.assert_error(502, "upstream_error", "upstream_error", None);
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("fake: {status}")),
            "{v}"
        );
        assert_eq!(r.header("x-waygate-attempts"), Some(format!("fake:{status}").as_str()));
    }
    ask("fake/status-408").assert_error(504, "upstream_error", "upstream_timeout", None);
    let r = ask("fake/garbage");
    r.assert_error(502, "upstream_error", "invalid_upstream_response", None);
    // A cluster nobody listens on: the router's connect failure becomes a 502.
    let r = ask("ghost/ok");
    let v = r.assert_error(502, "upstream_error", "upstream_error", None);
    assert_eq!(r.header("x-waygate-attempts"), Some("ghost:error"), "{v}");
}

#[test]
fn spoofed_cluster_and_waygate_headers_are_stripped_on_every_path() {
    let gw = Gateway::start();
    let auth = format!("Bearer {DEV_KEY}");
    // A client naming a cluster outside base_path must not reach it.
    let r = gw.send("GET", "/elsewhere", &[("x-waygate-cluster", "fake")], b"");
    assert_eq!(r.status, 404);
    assert!(gw.fakes.received().is_empty(), "a client picked a cluster");
    // Under base_path the filter's own choice wins, and x-waygate-* never goes up.
    let r = gw.send(
        "POST",
        CHAT,
        &[
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
            ("x-waygate-cluster", "ghost"),
            ("x-waygate-provider", "spoof"),
        ],
        br#"{"model":"fake/echo","messages":[{"role":"user","content":"x"}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let got = gw.fakes.received();
    assert_eq!(got.len(), 1);
    assert!(
        got[0].headers.iter().all(|(k, _)| !k.starts_with("x-waygate-")),
        "{:?}",
        got[0].headers
    );
}

/// A connection manager that counts the client as internal (here every
/// loopback client; in a mesh, often the pods' addresses) lets Envoy's router
/// obey the client's `x-envoy-*` headers. On the API the filter removes them,
/// so a client cannot make one request several provider calls, and none of
/// them reaches the provider.
#[test]
fn a_client_cannot_steer_envoys_router_with_x_envoy_headers() {
    let gw = Gateway::with_edit(&common::test_plugin_config(), |doc| {
        let manager = &mut doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
        manager["use_remote_address"] = true.into();
        manager["internal_address_config"] =
            serde_yaml::from_str("{cidr_ranges: [{address_prefix: 127.0.0.0, prefix_len: 8}]}").unwrap();
    });
    let auth = format!("Bearer {DEV_KEY}");
    let r = gw.send(
        "POST",
        CHAT,
        &[
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
            ("x-envoy-retry-on", "5xx"),
            ("x-envoy-max-retries", "3"),
            ("x-envoy-client-note", "spoof"),
        ],
        br#"{"model":"fake/status-503","messages":[{"role":"user","content":"x"}]}"#,
    );
    r.assert_error(502, "upstream_error", "upstream_error", None);
    let got = gw.fakes.received();
    assert_eq!(got.len(), 1, "the client's retries were obeyed");
    assert!(
        got[0].headers.iter().all(|(k, _)| k != "x-envoy-client-note"),
        "{:?}",
        got[0].headers
    );
}

#[test]
fn non_utf8_client_headers_do_not_crash_the_filter() {
    let gw = Gateway::start();
    let body = br#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}]}"#;
    // Each with the status it gets: a title and a referer are only logged; a media
    // type with a stray byte is not JSON's.
    for (name, value, status) in [
        ("x-title", &b"caf\xe9 \xff"[..], 200),
        ("http-referer", &b"https://\xc3\x28.example"[..], 200),
        ("content-type", &b"application/json\xff"[..], 415),
    ] {
        let r = send_raw(
            gw.addr,
            "POST",
            CHAT,
            &[
                ("authorization", b"Bearer wg-dev-key"),
                ("content-type", b"application/json"),
                (name, value),
            ],
            body,
        );
        assert_eq!(r.status, status, "{name}: {}", r.text());
    }
    // The VMs are still healthy: a plain request on every worker succeeds.
    for _ in 0..4 {
        assert_eq!(gw.post(CHAT, std::str::from_utf8(body).unwrap()).status, 200);
    }
    assert!(!gw.logs().contains("panicked"), "{}", gw.logs());
}
