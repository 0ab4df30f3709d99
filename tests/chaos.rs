//! Faults through the compiled filter in Envoy: hostile client headers
//! (non-UTF-8 bytes, 60 KB values, thousands of headers), slow and vanishing
//! clients, and an upstream on a raw socket that closes at every point,
//! splits UTF-8, sends invalid UTF-8, a 10 MB line, an endless body, the
//! wrong content type or duplicate headers.
//!
//! Each case ends with a clean answer (the contract's envelope, or a stream
//! ending in `[DONE]` or one error event) or a clean close, and then the VMs
//! are shown healthy: requests succeed and Envoy logged no panic or trap.
//! Last, a trap itself, with a module that traps in waygate's place: the
//! shipped failure policy gives the worker a new VM.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;
mod raw_upstream;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::{DEV_KEY, Gateway, Response, wait_for};
use raw_upstream::Chaos;
use serde_json::{Value, json};

const CHAT: &str = "/api/v1/chat/completions";

// ---- a raw client that tolerates anything ------------------------------------------

/// What the client saw: an HTTP answer (maybe cut short), or a close
/// without one.
#[derive(Debug)]
enum Outcome {
    Answer(Response),
    Closed,
}

impl Outcome {
    fn answer(self) -> Response {
        match self {
            Outcome::Answer(r) => r,
            Outcome::Closed => panic!("the connection closed without an answer"),
        }
    }
}

fn request_bytes(path: &str, headers: &[(&[u8], &[u8])], body: &[u8]) -> Vec<u8> {
    let mut req = format!("POST {path} HTTP/1.1\r\nhost: gateway.local\r\nconnection: close\r\n").into_bytes();
    for (k, v) in headers {
        req.extend_from_slice(k);
        req.extend_from_slice(b": ");
        req.extend_from_slice(v);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    req.extend_from_slice(body);
    req
}

fn json_request(body: &Value) -> Vec<u8> {
    let auth = format!("Bearer {DEV_KEY}");
    request_bytes(
        CHAT,
        &[
            (b"authorization", auth.as_bytes()),
            (b"content-type", b"application/json"),
        ],
        body.to_string().as_bytes(),
    )
}

/// Sends `request` and reads until the server closes; a write the server
/// refused mid-way still reads whatever it answered.
fn exchange(addr: SocketAddr, request: &[u8]) -> Outcome {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let _ = s.write_all(request);
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::TimedOut => {
                panic!("no close within 30 s: {}", String::from_utf8_lossy(&raw))
            }
            Err(_) => break, // reset: what arrived is what the client got
        }
    }
    parse(&raw)
}

fn parse(raw: &[u8]) -> Outcome {
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Outcome::Closed;
    };
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let length = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .map(|(_, v)| v.parse::<usize>().unwrap());
    let (body, complete) = if chunked {
        dechunk(rest)
    } else if let Some(n) = length {
        (rest[..n.min(rest.len())].to_vec(), rest.len() >= n)
    } else {
        (rest.to_vec(), true)
    };
    Outcome::Answer(Response {
        status,
        headers,
        body,
        complete,
    })
}

fn dechunk(mut rest: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16).unwrap();
        rest = &rest[eol + 2..];
        if size == 0 {
            return (out, true);
        }
        if rest.len() < size + 2 {
            out.extend_from_slice(&rest[..size.min(rest.len())]);
            return (out, false);
        }
        out.extend_from_slice(&rest[..size]);
        rest = &rest[size + 2..];
    }
}

/// A stream read as it comes, for clients that leave early.
struct LiveStream {
    socket: TcpStream,
    raw: Vec<u8>,
}

impl LiveStream {
    fn open(addr: SocketAddr, request: &[u8]) -> LiveStream {
        let mut socket = TcpStream::connect(addr).unwrap();
        socket.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        socket.write_all(request).unwrap();
        LiveStream {
            socket,
            raw: Vec::new(),
        }
    }

    /// Reads until the answer so far satisfies `done`, the peer closes, or
    /// `limit` passes; returns the answer so far.
    fn read_until(&mut self, limit: Duration, done: impl Fn(&Response) -> bool) -> Response {
        let start = Instant::now();
        let mut buf = [0u8; 16 * 1024];
        loop {
            if let Outcome::Answer(r) = parse(&self.raw)
                && done(&r)
            {
                return r;
            }
            assert!(
                start.elapsed() < limit,
                "nothing conclusive within {limit:?}: {:?}",
                parse(&self.raw)
            );
            match self.socket.read(&mut buf) {
                Ok(0) => return parse(&self.raw).answer(),
                Ok(n) => self.raw.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) => {}
                Err(_) => return parse(&self.raw).answer(),
            }
        }
    }
}

/// The `data:` payloads so far (complete events only).
fn events(body: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(body);
    let complete = text.rfind("\n\n").map_or("", |at| &text[..at]);
    complete
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").unwrap_or_else(|| panic!("{e:?}")).to_string())
        .collect()
}

fn content(events: &[String]) -> String {
    events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

/// Asserts a finished client stream ends with one error event of `code`.
fn assert_error_event(r: &Response, code: &str) -> Value {
    assert_eq!(r.status, 200, "{}", r.text());
    let ev = r.events();
    let last: Value = serde_json::from_str(ev.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], code, "{}", r.text());
    assert_eq!(last["error"]["type"], "upstream_error");
    assert!(last["error"]["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert!(!r.text().contains("[DONE]"));
    let errors = ev.iter().filter(|e| e.contains("\"error\"")).count();
    assert_eq!(errors, 1, "one error event: {}", r.text());
    last
}

fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]})
}

fn access_lines(c: &Chaos) -> usize {
    c.gw.logs().matches("waygate access").count()
}

// ---- the client's side ----------------------------------------------------------------

#[test]
fn non_utf8_request_headers_are_answered_cleanly() {
    let c = Chaos::start();
    let body = br#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}]}"#;
    let good: &[u8] = b"Bearer wg-dev-key";
    let json_ct: &[u8] = b"application/json";
    // (authorization, content-type, x-title, status)
    type Case<'a> = (&'a [u8], &'a [u8], &'a [u8], u16);
    let cases: [Case; 7] = [
        (b"Bearer wg-dev-key\xff", json_ct, b"t", 401),
        (b"Bearer \xff\xfe\xfd", json_ct, b"t", 401),
        (b"\xc3\x28earer wg-dev-key", json_ct, b"t", 401),
        (good, b"application/json\xff", b"t", 415),
        (good, b"\xfe\xff/\xfe", b"t", 415),
        (good, json_ct, b"caf\xe9 \xc3\x28 \xff title", 200),
        (
            b"Bearer \xf0\x9f\x8e",
            b"application/\xe9json",
            b"\xf0\x9f tab\there",
            401,
        ),
    ];
    for (auth, ct, title, status) in cases {
        let req = request_bytes(
            CHAT,
            &[(b"authorization", auth), (b"content-type", ct), (b"x-title", title)],
            body,
        );
        let r = exchange(c.gw.addr, &req).answer();
        assert_eq!(r.status, status, "{auth:?} {ct:?}: {}", r.text());
        if status == 401 {
            let code = if auth.starts_with(b"Bearer ") {
                "invalid_api_key"
            } else {
                "missing_api_key"
            };
            r.assert_error(401, "authentication_error", code, None);
        } else if status == 415 {
            r.assert_error(415, "invalid_request_error", "unsupported_media_type", None);
        }
    }
    // Control characters in a value: Envoy's HTTP/1 codec refuses the request
    // (400, its own plain body) before any filter sees it, in both pinned Envoys.
    let req = request_bytes(
        CHAT,
        &[
            (b"authorization", good),
            (b"content-type", json_ct),
            (b"x-title", b"\x1b[31mred\x7f"),
        ],
        body,
    );
    let r = exchange(c.gw.addr, &req).answer();
    assert_eq!((r.status, r.text().as_str()), (400, "Bad Request"));
    // The non-UTF-8 title is logged lossily, on one line, without control characters.
    let logs = c.gw.logs();
    assert!(
        logs.contains("title=\"caf\u{fffd} \u{fffd}( \u{fffd} title\""),
        "{logs}"
    );
    assert!(!logs.contains('\u{1b}') && !logs.contains('\u{7f}'), "{logs}");
    // A header *name* that is not a token: refused by the codec too.
    let req = request_bytes(
        CHAT,
        &[
            (b"authorization", good),
            (b"content-type", json_ct),
            (b"x-\xff\xfe", b"v"),
        ],
        body,
    );
    let r = exchange(c.gw.addr, &req).answer();
    assert_eq!((r.status, r.text().as_str()), (400, "Bad Request"));
    c.assert_healthy();
}

/// Log pipelines read the access line's fields for usage by key: a model name or a field
/// name in the body must not end a field or the line, so it cannot forge either.
#[test]
fn client_text_in_the_body_cannot_forge_a_log_line() {
    let c = Chaos::start();
    let forged = "fake/ok status=200 key=root\nwaygate access key=root model=x prompt_tokens=999999";
    let body = json!({"model": forged, "messages": [{"role": "user", "content": "x"}]});
    let r = exchange(c.gw.addr, &json_request(&body)).answer();
    assert_eq!(r.status, 200, "{}", r.text());
    // A field Anthropic's API cannot express is dropped, and named in the log.
    let mut body = json!({"model": "fakeanthropic/ok", "messages": [{"role": "user", "content": "x"}]});
    body["dropped\nwaygate access key=root\u{1b}[31m"] = json!(1);
    let r = exchange(c.gw.addr, &json_request(&body)).answer();
    assert_eq!(r.status, 200, "{}", r.text());
    let lines = |logs: &str| logs.lines().filter(|l| l.contains(": waygate access key=")).count();
    wait_for(Duration::from_secs(5), "the access lines", || lines(&c.gw.logs()) >= 2);
    let logs = c.gw.logs();
    // Every line is Envoy's (a timestamp first): none began inside a client's text.
    assert!(logs.lines().all(|l| l.starts_with('[')), "{logs}");
    assert_eq!(lines(&logs), 2, "{logs}");
    let line = logs.lines().find(|l| l.contains(": waygate access key=")).unwrap();
    assert!(
        line.contains(r#"model="fake/ok status=200 key=root\nwaygate access key=root model=x prompt_tokens=999999" "#),
        "{line}"
    );
    assert!(line.contains(" prompt_tokens=1 "), "{line}");
    let dropped = logs.lines().find(|l| l.contains("cannot express")).unwrap();
    assert!(
        dropped.contains(r#"cannot express "dropped\nwaygate access key=root\u{1b}[31m"; dropped"#),
        "{dropped}"
    );
    assert!(!logs.contains('\u{1b}'), "{logs}");

    // A request may be megabytes: its log lines stay short.
    let mut body = json!({"model": format!("fakeanthropic/{}", "m".repeat(60_000)),
        "messages": [{"role": "user", "content": "x"}]});
    for i in 0..50 {
        body[format!("unknown_{i}")] = json!(1);
    }
    let r = exchange(c.gw.addr, &json_request(&body)).answer();
    assert_eq!(r.status, 200, "{}", r.text());
    wait_for(Duration::from_secs(5), "the access line", || lines(&c.gw.logs()) == 3);
    let logs = c.gw.logs();
    let line = logs.lines().rfind(|l| l.contains(": waygate access key=")).unwrap();
    assert!(line.len() < 600 && line.contains("mmm…\" provider="), "{line}");
    // Ten names (in the body's sorted order), then a count.
    let dropped = logs.lines().rfind(|l| l.contains("cannot express")).unwrap();
    assert!(dropped.contains("unknown_17, 40 more; dropped"), "{dropped}");
    c.assert_healthy();
}

#[test]
fn huge_header_values_and_thousands_of_headers_end_cleanly() {
    let c = Chaos::start();
    let body = br#"{"model":"fake/ok","messages":[{"role":"user","content":"x"}]}"#;
    let big = vec![b'a'; 60 * 1024];
    let big_auth = [b"Bearer ".as_slice(), &big].concat();
    let ok: [(&[u8], &[u8]); 2] = [
        (b"authorization", b"Bearer wg-dev-key"),
        (b"content-type", b"application/json"),
    ];

    // 60 KB in a header: Envoy's codec refuses the request (431, its own
    // plain body; `max_request_headers_kb` is 60 by default), before any
    // filter, in both pinned Envoys.
    for header in [(b"x-title".as_slice(), big.as_slice()), (b"authorization", &big_auth)] {
        let req = request_bytes(CHAT, &[ok[0], ok[1], header], body);
        let r = exchange(c.gw.addr, &req).answer();
        assert_eq!((r.status, r.text().as_str()), (431, "Request Header Fields Too Large"));
    }
    // 10 KB passes the codec: the title is answered and logged cut to 200
    // characters, the bearer token is an unknown key.
    let long = vec![b'a'; 10 * 1024];
    let req = request_bytes(CHAT, &[ok[0], ok[1], (b"x-title", &long)], body);
    assert_eq!(exchange(c.gw.addr, &req).answer().status, 200);
    wait_for(Duration::from_secs(5), "the access line", || {
        c.gw.logs().contains("waygate access")
    });
    let logs = c.gw.logs();
    let line = logs.lines().find(|l| l.contains("waygate access")).unwrap();
    assert!(line.contains(&format!("title=\"{}\"", "a".repeat(200))), "{line}");
    assert!(!line.contains(&"a".repeat(201)), "{line}");
    let long_auth = [b"Bearer ".as_slice(), &long].concat();
    let req = request_bytes(CHAT, &[(b"authorization", &long_auth), ok[1]], body);
    exchange(c.gw.addr, &req)
        .answer()
        .assert_error(401, "authentication_error", "invalid_api_key", None);
    // Thousands of headers, a third of them the filter's own, a third the
    // title, repeated: the codec refuses them (431, as Envoy's 100-header
    // default does); just under its limit they reach the filter, which
    // strips every reserved one.
    for count in [3000, 90] {
        let names: Vec<String> = (0..count)
            .map(|i| match i % 3 {
                0 => format!("x-filler-{i}"),
                1 => format!(
                    "x-waygate-{}",
                    if i % 2 == 0 {
                        "cluster".to_string()
                    } else {
                        format!("x{i}")
                    }
                ),
                _ => "x-title".to_string(),
            })
            .collect();
        let mut headers: Vec<(&[u8], &[u8])> = vec![ok[0], ok[1]];
        headers.extend(names.iter().map(|n| (n.as_bytes(), b"ghost".as_slice())));
        match exchange(c.gw.addr, &request_bytes(CHAT, &headers, body)) {
            Outcome::Answer(r) if r.status == 200 => {
                assert_eq!(count, 90, "3000 headers pass the codec");
                assert_eq!(r.json()["object"], "chat.completion");
                let got = c.gw.fakes.received();
                let last = got.last().unwrap();
                assert!(
                    last.headers.iter().all(|(k, _)| !k.starts_with("x-waygate-")),
                    "{count}"
                );
                assert_eq!(
                    last.headers.iter().filter(|(k, _)| k.starts_with("x-filler-")).count(),
                    count / 3
                );
            }
            Outcome::Answer(r) => {
                assert_eq!(
                    (count, r.status, r.text().as_str()),
                    (3000, 431, "Request Header Fields Too Large")
                );
            }
            Outcome::Closed => panic!("{count} headers: closed without an answer"),
        }
    }
    c.assert_healthy();
}

#[test]
fn slow_loris_client_bodies_neither_block_nor_break_the_workers() {
    let c = Chaos::start();
    let body = serde_json::to_vec(&chat("fake/ok", false)).unwrap();
    let head = {
        let full = json_request(&chat("fake/ok", false));
        full[..full.len() - body.len()].to_vec()
    };

    // A body trickled over ~1 s in a dozen pieces is answered normally.
    let mut s = TcpStream::connect(c.gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(&head).unwrap();
    for piece in body.chunks(body.len().div_ceil(12)) {
        std::thread::sleep(Duration::from_millis(80));
        s.write_all(piece).unwrap();
    }
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let r = parse(&raw).answer();
    assert_eq!(r.status, 200, "{}", r.text());

    // Two clients stall half-way through their bodies (one per worker):
    // every worker keeps answering others meanwhile.
    let stalled: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut s = TcpStream::connect(c.gw.addr).unwrap();
            s.write_all(&head).unwrap();
            s.write_all(&body[..body.len() / 2]).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..4 {
        assert_eq!(c.gw.chat(chat("fake/ok", false)).status, 200);
    }
    // Then they give up: the streams are cleaned up and logged.
    let before = access_lines(&c);
    drop(stalled);
    wait_for(Duration::from_secs(5), "on_log for both stalled clients", || {
        access_lines(&c) >= before + 2
    });
    c.assert_healthy();
}

#[test]
fn a_client_disconnecting_mid_stream_leaves_the_workers_healthy() {
    let c = Chaos::start();
    for _ in 0..2 {
        // The fake provider streams 20,000 words; the client reads a few.
        let before = access_lines(&c);
        let mut live = LiveStream::open(c.gw.addr, &json_request(&chat("fake/long-20000", true)));
        let r = live.read_until(Duration::from_secs(10), |r| events(&r.body).len() >= 5);
        assert_eq!(r.status, 200);
        drop(live);
        wait_for(Duration::from_secs(5), "on_log for the abandoned stream", || {
            access_lines(&c) > before
        });
    }
    // And from the raw upstream's side: the gateway lets go of an endless
    // upstream stream once its client has gone.
    let mut live = LiveStream::open(c.gw.addr, &json_request(&chat("raw/endless", true)));
    let r = live.read_until(Duration::from_secs(10), |r| events(&r.body).len() >= 20);
    assert!(content(&events(&r.body)).starts_with("more more"), "{}", r.text());
    drop(live);
    assert!(
        c.raw.wait_idle(Duration::from_secs(10)),
        "the upstream connection is released"
    );
    c.assert_healthy();
}

#[test]
fn a_client_leaving_a_fallback_stream_releases_the_attempt_and_leaves_no_state() {
    // Only router fallback streams a fallback answer (with http calls the client
    // would wait for an endless answer to end): `make test` runs this suite in
    // both shapes.
    if !common::router_fallback() {
        eprintln!("skipped: a fallback stream needs WAYGATE_TEST_FALLBACK=router");
        return;
    }
    let mut config = raw_upstream::plugin_config("close-before-headers");
    config["models"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "chaos/endless-fallback", "endpoints": [
        {"provider": "fake", "model": "status-503"}, {"provider": "raw", "model": "endless"}]}));
    // Every round falls back, as the test is about: provider health would pass the
    // failing provider over after its third 503.
    config["health"] = json!({"enabled": false});
    let c = Chaos::with_config(&config);
    let mut samples = Vec::new();
    for round in 0..40 {
        let before = access_lines(&c);
        let mut live = LiveStream::open(c.gw.addr, &json_request(&chat("chaos/endless-fallback", true)));
        let r = live.read_until(Duration::from_secs(10), |r| events(&r.body).len() >= 20);
        assert_eq!(r.status, 200, "round {round}: {}", r.text());
        assert_eq!(r.header("x-waygate-attempts"), Some("fake:503,raw:200"));
        assert!(content(&events(&r.body)).starts_with("more more"), "{}", r.text());
        drop(live);
        assert!(
            c.raw.wait_idle(Duration::from_secs(10)),
            "round {round}: the fallback attempt's upstream connection is released"
        );
        wait_for(Duration::from_secs(5), "on_log for the abandoned stream", || {
            access_lines(&c) > before
        });
        if round % 10 == 9 {
            samples.push(c.gw.envoy.rss_at_rest_kb());
        }
    }
    // The attempts registered for each request went with it: memory flat.
    let (first, last) = (samples[0], samples[samples.len() - 1]);
    assert!(
        last <= first + 4 * 1024,
        "Envoy's RSS grew from {first} KiB to {last} KiB: {samples:?}"
    );
    c.assert_healthy();
}

// ---- the upstream's side ---------------------------------------------------------------

#[test]
fn an_upstream_closing_before_headers_falls_back_or_answers_502() {
    let c = Chaos::start();
    // With a fallback: the next provider serves.
    let r = c.gw.chat(chat("chaos/fallback", false));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("raw:error,fake:200"));
    let r = c.gw.chat(chat("chaos/fallback", true));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.events().last().unwrap(), "[DONE]");
    // Alone: the contract's 502, JSON even for a stream (no byte was sent).
    for stream in [false, true] {
        let r = c.gw.chat(chat("raw/close-before-headers", stream));
        let v = r.assert_error(502, "upstream_error", "upstream_error", None);
        assert!(v["error"]["message"].as_str().unwrap().contains("raw"), "{v}");
    }
    c.assert_healthy();
}

#[test]
fn an_upstream_closing_after_headers_ends_the_stream_cleanly() {
    let c = Chaos::start();
    // Close-delimited body: the close is the end, and the stream was not
    // complete: one error event.
    let r = c.gw.chat(chat("raw/eof-after-headers", true));
    assert_error_event(&r, "stream_interrupted");
    assert_eq!(r.events().len(), 1, "{}", r.text());
    // Chunked body cut short: a reset, which the client sees as a cut
    // stream (what Envoy does), or the error event.
    let r = exchange(c.gw.addr, &json_request(&chat("raw/close-after-headers", true)));
    if let Outcome::Answer(r) = r
        && r.complete
    {
        assert_error_event(&r, "stream_interrupted");
    }
    // Not a stream: nothing was sent yet, so the answer is an envelope: the
    // filter's for a close that ends the body, and for a reset Envoy's own
    // answer past the filter, which the shipped local reply mapper shapes.
    let r = c.gw.chat(chat("raw/eof-after-headers", false));
    r.assert_error(502, "upstream_error", "invalid_upstream_response", None);
    let r = c.gw.chat(chat("raw/close-after-headers", false));
    r.assert_error(502, "upstream_error", "upstream_error", None);
    c.assert_healthy();
}

/// An answer whose headers came in time and whose body did not: Envoy's
/// router times the attempt out with the answer held by the filter, and
/// answers the client itself, past the filter (a stream's 200 had gone out:
/// it is reset). The shipped local reply mapper gives the answer the
/// contract's 504; the filter's access line learns at the log that the
/// attempt failed.
#[test]
fn an_answer_late_after_its_headers_is_the_contracts_504_and_logged_as_failed() {
    if common::router_fallback() {
        // Router fallback's budget is Envoy's per-try timeout, which ends when the
        // answer's headers come (contract §5, "Timeouts"): the body then has the
        // route's idle_timeout (300 s).
        return;
    }
    let c = Chaos::start();
    let r = c.gw.chat(chat("rawquick/stall-after-headers", false));
    r.assert_error(504, "upstream_error", "upstream_timeout", None);
    wait_for(Duration::from_secs(5), "the access line", || access_lines(&c) >= 1);
    let logs = c.gw.logs();
    let line = logs.lines().find(|l| l.contains("waygate access")).unwrap();
    assert!(line.contains(" attempts=rawquick:error status=504 "), "{line}");
    c.assert_healthy();
}

#[test]
fn an_upstream_cut_mid_event_or_mid_utf8_ends_with_the_error_event() {
    let c = Chaos::start();
    let r = c.gw.chat(chat("raw/eof-mid-event", true));
    assert_error_event(&r, "stream_interrupted");
    assert_eq!(content(&r.events()), "part");
    let r = c.gw.chat(chat("raw/eof-mid-utf8", true));
    assert_error_event(&r, "stream_interrupted");
    assert_eq!(content(&r.events()), "ok");
    match exchange(c.gw.addr, &json_request(&chat("raw/close-mid-event", true))) {
        Outcome::Answer(r) if r.complete => {
            assert_error_event(&r, "stream_interrupted");
        }
        Outcome::Answer(r) => assert_eq!(content(&events(&r.body)), "part"),
        Outcome::Closed => panic!("the stream had started"),
    }
    // A complete stream whose characters were split across upstream chunks.
    let r = c.gw.chat(chat("raw/split-utf8", true));
    assert_eq!(r.status, 200);
    let ev = r.events();
    assert_eq!(content(&ev), "café 🎉");
    assert_eq!(ev.last().unwrap(), "[DONE]");
    c.assert_healthy();
}

#[test]
fn invalid_utf8_and_wrong_content_types_are_answered_cleanly() {
    let c = Chaos::start();
    // Invalid UTF-8 inside a stream's JSON: replaced, the stream goes on.
    let r = c.gw.chat(chat("raw/invalid-utf8", true));
    assert_eq!(r.status, 200);
    let ev = r.events();
    assert_eq!(content(&ev), "a\u{fffd}b\u{fffd}");
    assert_eq!(ev.last().unwrap(), "[DONE]");
    // ... and in a JSON answer: not a valid answer.
    c.gw.chat(chat("raw/invalid-utf8-json", false)).assert_error(
        502,
        "upstream_error",
        "invalid_upstream_response",
        None,
    );
    // The wrong content type for what was asked, either way round, or HTML.
    c.gw.chat(chat("raw/json-to-stream", true))
        .assert_error(502, "upstream_error", "invalid_upstream_response", None);
    c.gw.chat(chat("raw/sse-to-json", false))
        .assert_error(502, "upstream_error", "invalid_upstream_response", None);
    c.gw.chat(chat("raw/html", false))
        .assert_error(502, "upstream_error", "invalid_upstream_response", None);
    c.gw.chat(chat("raw/html", true))
        .assert_error(502, "upstream_error", "invalid_upstream_response", None);
    c.assert_healthy();
}

#[test]
fn duplicate_upstream_headers_are_harmless() {
    let c = Chaos::start();
    let r = c.gw.chat(chat("raw/dup-headers", true));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.headers.iter().filter(|(k, _)| k == "content-type").count(),
        1,
        "{:?}",
        r.headers
    );
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(content(&r.events()), "dup");
    assert_eq!(r.events().last().unwrap(), "[DONE]");
    // The first retry-after wins.
    let r = c.gw.chat(chat("raw/dup-429", false));
    r.assert_error(429, "rate_limit_error", "upstream_rate_limited", None);
    assert_eq!(r.header("retry-after"), Some("7"));
    // Two equal content-lengths: accepted, or refused by the codec as a 502/503.
    let r = c.gw.chat(chat("raw/dup-length", false));
    if r.status == 200 {
        assert_eq!(r.json()["choices"][0]["message"]["content"], "twice");
    } else {
        r.assert_error(r.status, "upstream_error", "upstream_error", None);
    }
    c.assert_healthy();
}

#[test]
fn a_10_mb_line_ends_the_stream_with_the_error_event() {
    let c = Chaos::start();
    for _ in 0..2 {
        // The upstream keeps the connection open after the line: the error
        // event must come from the decoder's cap, not from the end.
        let mut live = LiveStream::open(c.gw.addr, &json_request(&chat("raw/huge-line", true)));
        let r = live.read_until(Duration::from_secs(30), |r| {
            events(&r.body).last().is_some_and(|e| e.contains("\"error\""))
        });
        let ev = events(&r.body);
        assert_eq!(content(&ev), "before");
        let last: Value = serde_json::from_str(ev.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "stream_interrupted", "{last}");
        assert!(
            last["error"]["message"]
                .as_str()
                .unwrap()
                .contains("over 8388608 bytes"),
            "{last}"
        );
        assert!(r.body.len() < 4096, "the line itself never reaches the client");
        drop(live);
        assert!(c.raw.wait_idle(Duration::from_secs(10)), "the upstream is released");
    }
    c.assert_healthy();
}

#[test]
fn an_endless_json_body_gets_the_contracts_502_at_the_filters_limit() {
    let c = Chaos::start();
    // Not a stream: the filter holds the answer itself (Envoy's buffer
    // limit, 8 MiB here, would answer a plain-text 500) up to 16 MiB.
    let Outcome::Answer(r) = exchange(c.gw.addr, &json_request(&chat("raw/endless-json", false))) else {
        panic!("the connection closed without an answer");
    };
    assert!(r.complete);
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/json"));
    let body: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["error"]["type"], "upstream_error", "{body}");
    assert_eq!(body["error"]["code"], "invalid_upstream_response", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("larger than 16777216 bytes (raw: 200)"), "{message}");
    assert!(c.raw.wait_idle(Duration::from_secs(10)), "the upstream is released");
    c.assert_healthy();
}

#[test]
fn an_answer_over_envoys_buffer_limit_but_under_the_filters_arrives_whole() {
    let c = Chaos::start();
    // 12 MiB in many chunks: written back into Envoy's own buffer of the held
    // answer (limited to 8 MiB here), it would end in Envoy's plain-text 500
    // inside the filter's callback. The filter sends it as a local reply.
    let r = c.gw.chat(chat("raw/big-json", false));
    assert_eq!(r.status, 200, "{}", r.header("content-type").unwrap_or_default());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.header("x-waygate-provider"), Some("raw"));
    let body = r.json();
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content.len(), 12 * 1024 * 1024);
    assert!(content.bytes().all(|b| b == b'y'));
    assert_eq!(body["usage"]["total_tokens"], 5);
    c.assert_healthy();
}

// ---- the filter's own failure ----------------------------------------------------------

/// A trap kills the worker's VM. waygate has no trap to show (it never panics), so
/// `tests/trapping_filter`, which traps on a request carrying `x-trap` and otherwise
/// answers `alive <n>` with a count it keeps in shared data (where waygate keeps its local
/// limits), stands in for it in the shipped bootstrap (both roles, in router fallback).
/// The request that trapped fails closed; the shipped `failure_policy: FAIL_RELOAD` then
/// gives the worker a new VM, so the same connection (the same worker) is served again
/// after Envoy's reload backoff, and the count goes on where it was. Under `FAIL_CLOSED`
/// that worker would answer 503 to every request until Envoy restarted.
#[test]
fn a_worker_whose_vm_trapped_serves_again_with_its_shared_data() {
    let trapping = common::root().join("target/trapping/wasm32-wasip1/release/waygate_trapping_filter.wasm");
    assert!(trapping.exists(), "{} is missing: run `make test`", trapping.display());
    let gw = Gateway::with_edit(&common::test_plugin_config(), |doc| {
        let shipped = serde_yaml::to_string(doc).unwrap();
        let modules = common::wasm_path().to_string_lossy().into_owned();
        assert!(shipped.contains(&modules));
        *doc = serde_yaml::from_str(&shipped.replace(&modules, &trapping.to_string_lossy())).unwrap();
    });
    let mut stream = TcpStream::connect(gw.addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let ask = |stream: &mut TcpStream, extra: &str| {
        let request = format!("GET /api/v1/models HTTP/1.1\r\nhost: gateway.local\r\n{extra}\r\n");
        common::answer_on(stream, request.as_bytes())
    };
    for n in 1..=2 {
        let alive = ask(&mut stream, "");
        assert_eq!((alive.status, alive.text()), (200, format!("alive {n}")));
    }
    assert_eq!(
        ask(&mut stream, "x-trap: 1\r\n").status,
        503,
        "the request that trapped fails closed"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let served = loop {
        let r = ask(&mut stream, "");
        if r.status == 200 || Instant::now() > deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        (served.status, served.text()),
        (200, "alive 3".to_string()),
        "a new VM, and the shared data as it was"
    );
    assert!(gw.logs().contains("trapping as asked"), "the trap was logged");
}

/// Envoy's own answers past the filter (a reset after the headers; with
/// http-call fallback, a timeout after them) reach a Messages client in
/// Anthropic's envelope: the filter marks the request (`wasm.waygate_api`)
/// and the shipped local reply mapper reads it.
#[test]
fn envoys_own_answers_to_a_messages_client_are_in_anthropics_envelope() {
    let c = Chaos::start();
    let messages = |model: &str| {
        let body = json!({"model": model, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
        let headers = [("x-api-key", DEV_KEY), ("content-type", "application/json")];
        c.gw.send("POST", "/api/v1/messages", &headers, body.to_string().as_bytes())
    };
    let anthropic = |r: &common::Response, status: u16, says: &str| {
        assert_eq!(r.status, status, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/json"));
        let body = r.json();
        assert_eq!(
            (body["type"].as_str(), body["error"]["type"].as_str()),
            (Some("error"), Some("api_error")),
            "{body}"
        );
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{message}");
    };
    anthropic(&messages("raw/close-after-headers"), 502, "cut short");
    if !common::router_fallback() {
        // Router fallback's attempt timeout ends when the headers come (see above).
        anthropic(&messages("rawquick/stall-after-headers"), 504, "(upstream_timeout)");
    }
    // A chat client's are in OpenAI's, as before.
    c.gw.chat(chat("raw/close-after-headers", false))
        .assert_error(502, "upstream_error", "upstream_error", None);
    c.assert_healthy();
}
