//! Credentials through the compiled filter: a provider's credential never
//! reaches the client (answer, header, error message, stream) or the log,
//! even when the provider echoes the request back (the fakes' `echo` model,
//! and a raw upstream that quotes the request in errors and invalid
//! answers); the client's key never reaches a provider, on any API or
//! fallback. (Key comparison without short-circuit: `src/auth.rs` tests.)

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;
mod raw_upstream;

use common::{DEV_KEY, Response};
use raw_upstream::{ALL_PROVIDER_KEYS, Chaos, plugin_config};
use serde_json::{Value, json};

const CHAT: &str = "/api/v1/chat/completions";

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

/// Nothing the client received holds a provider credential.
fn assert_no_credential(r: &Response, what: &str) {
    for key in ALL_PROVIDER_KEYS {
        assert!(!r.text().contains(key), "{what}: {key} in the answer: {}", r.text());
        for (name, value) in &r.headers {
            assert!(!value.contains(key), "{what}: {key} in header {name}");
        }
    }
}

fn assert_clean_logs(c: &Chaos) {
    let logs = c.gw.logs();
    for key in ALL_PROVIDER_KEYS.iter().chain([&DEV_KEY]) {
        assert!(!logs.contains(key), "{key} in the logs:\n{logs}");
    }
    raw_upstream::assert_no_trap(&logs);
}

#[test]
fn an_echoing_provider_never_hands_its_credential_to_the_client() {
    let c = Chaos::start();
    for model in ["fake/echo", "fakeanthropic/echo", "fakegemini/echo"] {
        let r = c.gw.chat(chat(model, false));
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        assert_no_credential(&r, model);
        // The provider did echo its credential header: the filter scrubbed it.
        let echoed = r.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(echoed.contains("[redacted]"), "{model}: {echoed}");

        let r = c.gw.chat(chat(model, true));
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        assert_eq!(r.events().last().unwrap(), "[DONE]");
        assert_no_credential(&r, &format!("{model} stream"));
        assert!(r.text().contains("[redacted]"), "{model}: {}", r.text());
    }
    // The legacy endpoint, natively and translated.
    for model in ["fake/echo", "fakeanthropic/echo"] {
        let r = c.gw.post(
            "/api/v1/completions",
            &json!({"model": model, "prompt": "hi"}).to_string(),
        );
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        assert_no_credential(&r, model);
    }
    assert_clean_logs(&c);
}

#[test]
fn a_credential_echoed_in_a_response_header_is_scrubbed() {
    let c = Chaos::start();
    for (model, stream) in [("raw/echo-header", false), ("raw/echo-header-stream", true)] {
        let r = c.gw.chat(chat(model, stream));
        assert_eq!(r.status, 200, "{model}: {}", r.text());
        assert_no_credential(&r, model);
        assert_eq!(r.header("x-echo-auth"), Some("Bearer [redacted], second"), "{model}");
        assert_eq!(r.header("x-other"), Some("kept"), "{model}");
        if stream {
            assert_eq!(r.events().last().unwrap(), "[DONE]");
        } else {
            assert_eq!(r.json()["choices"][0]["message"]["content"], "fine");
        }
    }
    assert_clean_logs(&c);
}

#[test]
fn provider_errors_echoing_the_request_do_not_leak_the_credential() {
    let c = Chaos::with_config(&plugin_config("echo-503"));
    for provider in ["raw", "rawanthropic", "rawgemini"] {
        // The provider's own message is passed on (400/422), scrubbed.
        for (scenario, status) in [("echo-400", 400), ("echo-422", 422)] {
            let r = c.gw.chat(chat(&format!("{provider}/{scenario}"), false));
            assert_eq!(r.status, status, "{provider}: {}", r.text());
            let message = r.json()["error"]["message"].as_str().unwrap().to_string();
            assert!(message.starts_with("You sent: POST"), "{message}");
            assert!(message.contains("[redacted]"), "{message}");
            assert_no_credential(&r, &format!("{provider}/{scenario}"));
        }
        // An answer that quotes the credential where a value was expected:
        // 502, and the log line naming why does not quote it either.
        let r = c.gw.chat(chat(&format!("{provider}/echo-invalid"), false));
        r.assert_error(502, "upstream_error", "invalid_upstream_response", None);
        assert_no_credential(&r, &format!("{provider}/echo-invalid"));
        // A retryable error echoing the request: our own message.
        let r = c.gw.chat(chat(&format!("{provider}/echo-503"), false));
        r.assert_error(502, "upstream_error", "upstream_error", None);
        assert_no_credential(&r, &format!("{provider}/echo-503"));
    }
    // The OpenAI-shaped stream that echoes the key in content and in its
    // error event.
    let r = c.gw.chat(chat("raw/echo-stream", true));
    assert_no_credential(&r, "raw/echo-stream");
    let events = r.events();
    assert!(events[0].contains("your key is [redacted]"), "{events:?}");
    assert!(events.last().unwrap().contains("bad key [redacted]"), "{events:?}");
    // A fallback after an echoing 503: served by the next provider.
    let r = c.gw.chat(chat("chaos/fallback", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("raw:503,fake:200"));
    assert_no_credential(&r, "chaos/fallback");
    assert!(
        c.gw.logs().contains("sent an invalid answer"),
        "the invalid answers were logged"
    );
    assert_clean_logs(&c);
}

#[test]
fn the_clients_key_never_reaches_a_provider() {
    let c = Chaos::with_config(&{
        let mut config = plugin_config("echo-503");
        config["models"]
            .as_array_mut()
            .unwrap()
            .push(json!({"id": "chain/all", "endpoints": [
            {"provider": "closed", "model": "x"}, {"provider": "fakeanthropic", "model": "status-529"},
            {"provider": "fakegemini", "model": "echo"}]}));
        config
    });
    let auth = format!("Bearer {DEV_KEY}");
    // A client that also sends its key the ways other SDKs do.
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
        ("x-api-key", DEV_KEY),
        ("api-key", DEV_KEY),
        ("x-goog-api-key", DEV_KEY),
    ];
    let models = [
        "fake/echo",
        "fakechat/echo",
        "fakeanthropic/echo",
        "fakegemini/echo",
        "chain/all",
        "raw/ok",
        "rawanthropic/ok",
        "rawgemini/ok",
    ];
    for model in models {
        for stream in [false, true] {
            let r =
                c.gw.send("POST", CHAT, &headers, chat(model, stream).to_string().as_bytes());
            assert_eq!(r.status, 200, "{model}: {}", r.text());
            assert!(
                !r.text().contains(DEV_KEY),
                "{model}: the echo shows the key went upstream"
            );
        }
    }
    let legacy = json!({"model": "fakechat/echo", "prompt": "hi"}).to_string();
    let r = c.gw.send("POST", "/api/v1/completions", &headers, legacy.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());

    let received = c.gw.fakes.received();
    // Four echo models and chain/all's two fake attempts, each twice, and the legacy one.
    assert_eq!(received.len(), 2 * 4 + 2 * 2 + 1);
    for req in &received {
        let all = format!("{} {:?} {}", req.path, req.headers, String::from_utf8_lossy(&req.body));
        assert!(!all.contains(DEV_KEY), "the client's key reached a provider: {all}");
        // Each API gets its own credential, and only that.
        let expect = match req.path_only() {
            p if p.starts_with("/v1beta/") => ("x-goog-api-key", "fake-gemini-key"),
            "/v1/messages" => ("x-api-key", "fake-anthropic-key"),
            _ => ("authorization", "Bearer fake-openai-key"),
        };
        assert_eq!(req.header(expect.0), Some(expect.1), "{all}");
    }
    for req in c.raw.received() {
        let all = format!("{}{}", req.head, String::from_utf8_lossy(&req.body));
        assert!(!all.contains(DEV_KEY), "the client's key reached a provider: {all}");
    }
    assert_clean_logs(&c);
}

/// A developer's environment names their own OpenAI organization and project, and the
/// official SDKs send them (`OpenAI-Organization`, `OpenAI-Project`); another SDK sends its
/// own provider key; a browser sends the cookies of the gateway's site. None of it reaches a
/// provider: the gateway's credential goes with its own account, where a foreign
/// organization would make OpenAI refuse it.
#[test]
fn a_clients_provider_account_headers_never_reach_a_provider() {
    let c = Chaos::with_config(&plugin_config("echo-503"));
    let auth = format!("Bearer {DEV_KEY}");
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
        ("OpenAI-Organization", "org-developers-own"),
        ("OpenAI-Project", "proj_developers_own"),
        ("x-api-key", "sk-ant-developers-own-key"),
        ("api-key", "azure-developers-own-key"),
        ("x-goog-api-key", "AIza-developers-own-key"),
        // A browser's, for the gateway's site.
        ("cookie", "sso_session=developers-own-session"),
        ("proxy-authorization", "Basic developers-own-proxy"),
    ];
    for model in ["fake/ok", "fakeanthropic/ok", "fakegemini/ok"] {
        for stream in [false, true] {
            let r =
                c.gw.send("POST", CHAT, &headers, chat(model, stream).to_string().as_bytes());
            assert_eq!(r.status, 200, "{model}: {}", r.text());
        }
    }
    let received = c.gw.fakes.received();
    assert_eq!(received.len(), 6);
    for req in &received {
        let all = format!("{:?}", req.headers);
        assert!(
            !all.contains("developers-own") && !all.contains("developers_own"),
            "{all}"
        );
    }
}
