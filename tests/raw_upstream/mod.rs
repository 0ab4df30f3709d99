//! A misbehaving upstream on a raw socket, and a gateway whose `raw*`
//! providers point at it, for the chaos and secrets tests.
//!
//! The upstream reads one request per connection and does what the upstream
//! model name says (`raw/close-before-headers`, `rawanthropic/echo-400`, ...;
//! Gemini's model comes from the path): close at any point, split UTF-8,
//! send a 10 MB line or an endless body, duplicate headers, echo the request
//! (credentials included) in an error or an invalid answer. The gateway is
//! `envoy/local.yaml` as the other tests run it ([`common::bootstrap`]) plus
//! a `raw` cluster and route, cloned from the `fake` ones.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use waygate_fakes::FakeProviders;

use crate::common::envoy::Envoy;
use crate::common::{self, Gateway};

/// The credentials of the `raw*` providers.
pub const RAW_OPENAI_KEY: &str = "raw-openai-secret-0001";
pub const RAW_ANTHROPIC_KEY: &str = "raw-anthropic-secret-0002";
pub const RAW_GEMINI_KEY: &str = "raw-gemini-secret-0003";
/// Every provider credential the gateway holds in these tests.
pub const ALL_PROVIDER_KEYS: [&str; 7] = [
    RAW_OPENAI_KEY,
    RAW_ANTHROPIC_KEY,
    RAW_GEMINI_KEY,
    "fake-openai-key",
    "fake-anthropic-key",
    "fake-gemini-key",
    "ghost-key",
];

/// One request as the raw upstream read it.
#[derive(Debug, Clone)]
pub struct RawRequest {
    pub head: String,
    pub body: Vec<u8>,
}

pub struct RawUpstream {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Connections being served right now.
    pub active: Arc<AtomicUsize>,
    pub received: Arc<Mutex<Vec<RawRequest>>>,
    thread: Option<JoinHandle<()>>,
}

impl RawUpstream {
    pub fn start() -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let received = Arc::new(Mutex::new(Vec::new()));
        let active = Arc::new(AtomicUsize::new(0));
        let (s, r, a) = (stop.clone(), received.clone(), active.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let (s, r, a) = (s.clone(), r.clone(), a.clone());
                        a.fetch_add(1, Ordering::SeqCst);
                        std::thread::spawn(move || {
                            serve(conn, &s, &r);
                            a.fetch_sub(1, Ordering::SeqCst);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        RawUpstream {
            addr,
            stop,
            active,
            received,
            thread: Some(thread),
        }
    }

    pub fn received(&self) -> Vec<RawRequest> {
        self.received.lock().unwrap().clone()
    }

    /// Waits until no connection is being served (the gateway let go of
    /// every upstream connection); false after `limit`.
    pub fn wait_idle(&self, limit: Duration) -> bool {
        let start = Instant::now();
        while start.elapsed() < limit {
            if self.active.load(Ordering::SeqCst) == 0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }
}

impl Drop for RawUpstream {
    fn drop(&mut self) {
        // Connection threads see the flag too and end their endless bodies.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads the request head and body; `None` if the peer went away.
fn read_request(conn: &mut TcpStream) -> Option<RawRequest> {
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let mut reader = BufReader::new(conn.try_clone().ok()?);
    let mut head = String::new();
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line).ok()? == 0 {
            return None;
        }
        let line = String::from_utf8_lossy(&line).into_owned();
        let end = line == "\r\n";
        head.push_str(&line);
        if end {
            break;
        }
    }
    let length = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse::<usize>().ok())?
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(RawRequest { head, body })
}

/// The upstream model: the body's `model`, or Gemini's path segment.
fn scenario(req: &RawRequest) -> String {
    if let Some(model) = serde_json::from_slice::<Value>(&req.body)
        .ok()
        .and_then(|v| v["model"].as_str().map(str::to_string))
    {
        return model;
    }
    let path = req.head.split(' ').nth(1).unwrap_or_default();
    path.split("/models/")
        .nth(1)
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_default()
        .to_string()
}

const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n";

fn chunk(conn: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    conn.write_all(format!("{:x}\r\n", bytes.len()).as_bytes())?;
    conn.write_all(bytes)?;
    conn.write_all(b"\r\n")?;
    conn.flush()
}

fn event(content: &str) -> Vec<u8> {
    let v = json!({"id": "raw", "object": "chat.completion.chunk", "created": 1, "model": "raw",
                   "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]});
    format!("data: {v}\n\n").into_bytes()
}

fn stream_end() -> Vec<u8> {
    let finish = json!({"id": "raw", "object": "chat.completion.chunk", "created": 1, "model": "raw",
                        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    let usage = json!({"id": "raw", "object": "chat.completion.chunk", "created": 1, "model": "raw",
                       "choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}});
    format!("data: {finish}\n\ndata: {usage}\n\ndata: [DONE]\n\n").into_bytes()
}

fn completion(content: &str) -> Vec<u8> {
    json!({"id": "raw", "object": "chat.completion", "created": 1, "model": "raw",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}})
    .to_string()
    .into_bytes()
}

fn answer(conn: &mut TcpStream, status: &str, headers: &[(&str, &str)], body: &[u8]) -> std::io::Result<()> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    conn.write_all(out.as_bytes())?;
    conn.write_all(body)?;
    conn.flush()
}

/// Writes until the peer goes away, the upstream stops, or `limit` passes.
fn until_gone(limit: Duration, stop: &AtomicBool, mut write: impl FnMut() -> std::io::Result<()>) {
    let start = Instant::now();
    while start.elapsed() < limit && !stop.load(Ordering::Relaxed) {
        if write().is_err() {
            return;
        }
    }
}

fn serve(mut conn: TcpStream, stop: &AtomicBool, received: &Mutex<Vec<RawRequest>>) {
    let Some(req) = read_request(&mut conn) else { return };
    received.lock().unwrap().push(req.clone());
    let _ = conn.set_nodelay(true);
    let scenario = scenario(&req);
    let c = &mut conn;
    let _ = match scenario.as_str() {
        "close-before-headers" => Ok(()),
        // Chunked framing: a close before the last chunk is a reset.
        "close-after-headers" => c.write_all(format!("{SSE_HEAD}transfer-encoding: chunked\r\n\r\n").as_bytes()),
        // Close-delimited framing: the close is the body's end.
        "eof-after-headers" => c.write_all(format!("{SSE_HEAD}connection: close\r\n\r\n").as_bytes()),
        "eof-mid-event" => c
            .write_all(format!("{SSE_HEAD}connection: close\r\n\r\n").as_bytes())
            .and_then(|()| c.write_all(&event("part")))
            .and_then(|()| c.write_all(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"par")),
        "close-mid-event" => c
            .write_all(format!("{SSE_HEAD}transfer-encoding: chunked\r\n\r\n").as_bytes())
            .and_then(|()| chunk(c, &event("part")))
            .and_then(|()| chunk(c, b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"par")),
        "eof-mid-utf8" => c
            .write_all(format!("{SSE_HEAD}connection: close\r\n\r\n").as_bytes())
            .and_then(|()| c.write_all(&event("ok")))
            .and_then(|()| c.write_all(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"caf\xc3")),
        // A complete stream whose "é" and "🎉" are split across writes.
        "split-utf8" => {
            let full = [event("café 🎉"), stream_end()].concat();
            let cut1 = full.windows(2).position(|w| w == [0xc3, 0xa9]).unwrap() + 1;
            let cut2 = full.windows(4).position(|w| w == "🎉".as_bytes()).unwrap() + 2;
            c.write_all(format!("{SSE_HEAD}transfer-encoding: chunked\r\n\r\n").as_bytes())
                .and_then(|()| chunk(c, &full[..cut1]))
                .and_then(|()| sleep_ok(60))
                .and_then(|()| chunk(c, &full[cut1..cut2]))
                .and_then(|()| sleep_ok(60))
                .and_then(|()| chunk(c, &full[cut2..]))
                .and_then(|()| c.write_all(b"0\r\n\r\n"))
        }
        "invalid-utf8" => {
            let body = [
                b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\xffb\xc3\"}}]}\n\n".to_vec(),
                stream_end(),
            ]
            .concat();
            c.write_all(format!("{SSE_HEAD}connection: close\r\n\r\n").as_bytes())
                .and_then(|()| c.write_all(&body))
        }
        "invalid-utf8-json" => answer(
            c,
            "200 OK",
            &[("content-type", "application/json")],
            b"{\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"a\xffb\"}}]}",
        ),
        // An answer in the wrong shape for what was asked.
        "json-to-stream" | "wrong-content-type" => {
            answer(c, "200 OK", &[("content-type", "application/json")], &completion("hi"))
        }
        "html" => answer(c, "200 OK", &[("content-type", "text/html")], b"<html>hello</html>"),
        "sse-to-json" => {
            let body = [event("hi"), stream_end()].concat();
            answer(c, "200 OK", &[("content-type", "text/event-stream")], &body)
        }
        "dup-headers" => {
            let body = [event("dup"), stream_end()].concat();
            answer(
                c,
                "200 OK",
                &[
                    ("content-type", "text/event-stream"),
                    ("content-type", "application/json"),
                    ("x-dup", "1"),
                    ("x-dup", "2"),
                    ("set-cookie", "a=1"),
                    ("set-cookie", "b=2"),
                ],
                &body,
            )
        }
        "dup-429" => answer(
            c,
            "429 Too Many Requests",
            &[
                ("content-type", "application/json"),
                ("retry-after", "7"),
                ("retry-after", "9"),
            ],
            br#"{"error":{"message":"slow down","type":"requests","code":"rate_limit_exceeded"}}"#,
        ),
        "dup-length" => {
            let body = completion("twice");
            let len = body.len().to_string();
            answer(
                c,
                "200 OK",
                &[("content-type", "application/json"), ("content-length", len.as_str())],
                &body,
            )
        }
        // A 10 MB line, then the connection held open (written to, so a
        // closed peer is noticed) until the gateway lets go of it.
        "huge-line" => {
            let block = vec![b'a'; 64 * 1024];
            c.write_all(format!("{SSE_HEAD}transfer-encoding: chunked\r\n\r\n").as_bytes())
                .and_then(|()| chunk(c, &event("before")))
                .and_then(|()| chunk(c, b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\""))
                .and_then(|()| (0..160).try_for_each(|_| chunk(c, &block)))
                .map(|()| {
                    until_gone(Duration::from_secs(20), stop, || {
                        std::thread::sleep(Duration::from_millis(50));
                        chunk(c, b"a")
                    })
                })
        }
        // Valid events, forever.
        "endless" => c
            .write_all(format!("{SSE_HEAD}transfer-encoding: chunked\r\n\r\n").as_bytes())
            .map(|()| {
                until_gone(Duration::from_secs(20), stop, || {
                    std::thread::sleep(Duration::from_millis(1));
                    chunk(c, &event("more "))
                })
            }),
        // A non-stream answer's headers and a first piece of its body, then nothing:
        // the attempt's time runs out with the answer held by the filter.
        "stall-after-headers" => c
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"choices\":")
            .map(|()| {
                until_gone(Duration::from_secs(20), stop, || {
                    std::thread::sleep(Duration::from_millis(10));
                    Ok(())
                })
            }),
        // A non-stream answer that never ends.
        "endless-json" => c
            .write_all(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{\"choices\":[\"",
            )
            .map(|()| {
                let block = vec![b'x'; 64 * 1024];
                until_gone(Duration::from_secs(20), stop, || c.write_all(&block))
            }),
        // A valid answer of 12 MiB: over the listener's 8 MiB buffer limit,
        // under the filter's own 16 MiB.
        "big-json" => {
            let content = "y".repeat(12 * 1024 * 1024);
            answer(
                c,
                "200 OK",
                &[("content-type", "application/json")],
                &completion(&content),
            )
        }
        // The credential echoed in response headers, a stream or not.
        "echo-header" | "echo-header-stream" => {
            let key = credential(&req.head);
            let (content_type, body) = if scenario == "echo-header" {
                ("application/json", completion("fine"))
            } else {
                ("text/event-stream", [event("fine"), stream_end()].concat())
            };
            let seen = format!("Bearer {key}");
            answer(
                c,
                "200 OK",
                &[
                    ("content-type", content_type),
                    ("x-echo-auth", seen.as_str()),
                    ("x-echo-auth", "second"),
                    ("x-other", "kept"),
                ],
                &body,
            )
        }
        // The request, credentials included, echoed in an error or an
        // invalid answer: the gateway must not pass the credential on.
        "echo-400" | "echo-422" | "echo-503" => {
            let status = match scenario.as_str() {
                "echo-400" => "400 Bad Request",
                "echo-422" => "422 Unprocessable Entity",
                _ => "503 Service Unavailable",
            };
            let echo = format!("{}{}", req.head, String::from_utf8_lossy(&req.body));
            let body = json!({"type": "error", "error": {"message": format!("You sent: {echo}"),
                              "type": "invalid_request_error", "code": 400, "status": "INVALID_ARGUMENT"}});
            answer(
                c,
                status,
                &[("content-type", "application/json")],
                body.to_string().as_bytes(),
            )
        }
        "echo-invalid" => {
            // Every API refuses this shape, quoting the offending value.
            let key = credential(&req.head);
            let body = json!({"type": key, "choices": key, "candidates": key, "content": key});
            answer(
                c,
                "200 OK",
                &[("content-type", "application/json")],
                body.to_string().as_bytes(),
            )
        }
        "echo-stream" => {
            let key = credential(&req.head);
            let body = [
                event(&format!("your key is {key}")),
                format!("data: {}\n\n", json!({"error": {"message": format!("bad key {key}")}})).into_bytes(),
            ]
            .concat();
            c.write_all(format!("{SSE_HEAD}connection: close\r\n\r\n").as_bytes())
                .and_then(|()| c.write_all(&body))
        }
        "ok-stream" => {
            let body = [event("fine"), stream_end()].concat();
            c.write_all(format!("{SSE_HEAD}connection: close\r\n\r\n").as_bytes())
                .and_then(|()| c.write_all(&body))
        }
        _ => ok(c, &req),
    };
    let _ = conn.shutdown(Shutdown::Both);
}

/// A normal answer in the shape of the API the path names, streamed when
/// the request asks.
fn ok(c: &mut TcpStream, req: &RawRequest) -> std::io::Result<()> {
    let path = req.head.split(' ').nth(1).unwrap_or_default();
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let stream = body["stream"] == true || path.contains(":streamGenerateContent");
    let sse = |events: Vec<Value>, names: Option<Vec<&str>>| -> Vec<u8> {
        let mut out = String::new();
        for (i, e) in events.iter().enumerate() {
            if let Some(names) = &names {
                out.push_str(&format!("event: {}\n", names[i]));
            }
            out.push_str(&format!("data: {e}\n\n"));
        }
        out.into_bytes()
    };
    if path.starts_with("/v1/messages") {
        let message = json!({"id": "msg_raw", "type": "message", "role": "assistant", "model": "raw",
            "content": [{"type": "text", "text": "fine"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 2, "output_tokens": 1}});
        if !stream {
            return answer(
                c,
                "200 OK",
                &[("content-type", "application/json")],
                message.to_string().as_bytes(),
            );
        }
        let events = vec![
            json!({"type": "message_start", "message": {"id": "msg_raw", "type": "message", "role": "assistant",
                   "content": [], "usage": {"input_tokens": 2, "output_tokens": 0}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "fine"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 1}}),
            json!({"type": "message_stop"}),
        ];
        let names = vec![
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ];
        return answer(
            c,
            "200 OK",
            &[("content-type", "text/event-stream")],
            &sse(events, Some(names)),
        );
    }
    if path.starts_with("/v1beta/") {
        let response = json!({"candidates": [{"content": {"parts": [{"text": "fine"}], "role": "model"},
            "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 2, "candidatesTokenCount": 1}});
        if !stream {
            return answer(
                c,
                "200 OK",
                &[("content-type", "application/json")],
                response.to_string().as_bytes(),
            );
        }
        return answer(
            c,
            "200 OK",
            &[("content-type", "text/event-stream")],
            &sse(vec![response], None),
        );
    }
    if stream {
        let body = [event("fine"), stream_end()].concat();
        return answer(c, "200 OK", &[("content-type", "text/event-stream")], &body);
    }
    answer(
        c,
        "200 OK",
        &[("content-type", "application/json")],
        &completion("fine"),
    )
}

fn sleep_ok(ms: u64) -> std::io::Result<()> {
    std::thread::sleep(Duration::from_millis(ms));
    Ok(())
}

/// The credential the gateway sent, whichever header carries it.
fn credential(head: &str) -> String {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            let k = k.to_ascii_lowercase();
            (k == "authorization" || k == "x-api-key" || k == "x-goog-api-key")
                .then(|| v.trim().trim_start_matches("Bearer ").to_string())
        })
        .unwrap_or_default()
}

/// The test plugin configuration plus `raw` (OpenAI), `rawanthropic` and
/// `rawgemini` on the raw upstream, and `chaos/fallback`: a raw scenario
/// first, then the fake provider.
pub fn plugin_config(first_scenario: &str) -> Value {
    let mut config = common::test_plugin_config();
    let providers = config["providers"].as_array_mut().unwrap();
    providers.push(
        json!({"id": "raw", "api": "openai", "cluster": "raw", "authority": "raw.local",
                          "path_prefix": "/v1", "api_key": RAW_OPENAI_KEY, "timeout_ms": 20000}),
    );
    // The raw upstream with a short time budget, for answers that come late.
    providers.push(
        json!({"id": "rawquick", "api": "openai", "cluster": "raw", "authority": "raw.local",
                          "path_prefix": "/v1", "api_key": RAW_OPENAI_KEY, "timeout_ms": 500}),
    );
    providers.push(
        json!({"id": "rawanthropic", "api": "anthropic", "cluster": "raw", "authority": "raw.local",
                          "path_prefix": "/v1", "api_key": RAW_ANTHROPIC_KEY, "timeout_ms": 20000}),
    );
    providers.push(
        json!({"id": "rawgemini", "api": "gemini", "cluster": "raw", "authority": "raw.local",
                          "path_prefix": "/v1beta", "api_key": RAW_GEMINI_KEY, "timeout_ms": 20000}),
    );
    config["models"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "chaos/fallback", "endpoints": [
        {"provider": "raw", "model": first_scenario}, {"provider": "fake", "model": "ok"}]}));
    config
}

/// [`common::bootstrap`] plus the `raw` cluster and its route.
fn bootstrap(fake: SocketAddr, raw: SocketAddr, plugin: &Value) -> String {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&common::bootstrap(fake, plugin)).unwrap();
    common::add_cluster_like_fake(&mut doc, "raw", raw.port());
    serde_yaml::to_string(&doc).unwrap()
}

/// The gateway (Envoy, two workers unless asked for one) with the fakes and the raw upstream;
/// Envoy stops before the upstreams.
pub struct Chaos {
    pub gw: Gateway,
    pub raw: RawUpstream,
}

impl Chaos {
    pub fn start() -> Chaos {
        Chaos::with_config(&plugin_config("close-before-headers"))
    }

    pub fn with_config(plugin: &Value) -> Chaos {
        Chaos::launch(plugin, Envoy::start)
    }

    /// [`Chaos::start`] on one Envoy worker (see [`Envoy::start_single_worker`]).
    pub fn single_worker() -> Chaos {
        Chaos::launch(&plugin_config("close-before-headers"), Envoy::start_single_worker)
    }

    fn launch(plugin: &Value, start: fn(&str) -> Result<Envoy, String>) -> Chaos {
        common::check_wasm_is_fresh();
        let raw = RawUpstream::start();
        let fakes = FakeProviders::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let envoy = start(&bootstrap(fakes.addr(), raw.addr, plugin)).unwrap_or_else(|e| panic!("{e}"));
        let addr = envoy.listener("waygate");
        Chaos {
            gw: Gateway { envoy, fakes, addr },
            raw,
        }
    }

    /// The VMs survived: plain requests on fresh connections (spread over the
    /// workers by the kernel) succeed, and no log line tells of a panic or a trap.
    pub fn assert_healthy(&self) {
        for i in 0..4 {
            let r = self
                .gw
                .chat(json!({"model": "fake/ok", "messages": [{"role": "user", "content": "still there?"}]}));
            assert_eq!(r.status, 200, "request {i} after the fault: {}", r.text());
            assert_eq!(r.json()["choices"][0]["message"]["role"], "assistant");
        }
        assert_no_trap(&self.gw.logs());
    }
}

/// What Envoy logs of a panicking or trapped VM: the Rust panic message the
/// SDK's hook logs, and V8's `Function: proxy_on_... failed: Uncaught RuntimeError`.
pub fn assert_no_trap(logs: &str) {
    for needle in ["panicked", "RuntimeError", "Function: proxy_", "[critical]"] {
        assert!(!logs.contains(needle), "{needle:?} in Envoy's log:\n{logs}");
    }
}
