//! The gateway as a client sees it: the built `waygate.wasm` in real Envoy
//! ([`envoy`]), configured by `envoy/local.yaml` with only addresses and the
//! plugin configuration swapped, in front of the fake providers. A raw
//! HTTP/1.1 client keeps the exact bytes and headers visible.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![allow(dead_code)]

mod bootstrap;
pub mod envoy;
pub mod ratelimit;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde_json::Value;
use waygate_fakes::FakeProviders;

use envoy::Envoy;

pub const DEV_KEY: &str = "wg-dev-key";
pub const DEV_KEY_SHA256: &str = "3f8df8d36341df6ddbd3fadf70c0d7685e06fcf0b0b90ff0b241284e7638da96";
/// A second key that may only use `fake/ok*` models.
pub const NARROW_KEY: &str = "wg-narrow-key";
/// Five requests a minute.
pub const LIMITED_KEY: &str = "wg-limited-key";
/// Thirty tokens a minute.
pub const TOKEN_LIMITED_KEY: &str = "wg-token-limited-key";

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn wasm_path() -> PathBuf {
    root().join("target/wasm32-wasip1/wasm/waygate.wasm")
}

/// Tests must never run against a stale `.wasm`: it must be newer than
/// every file under `src/` (`make test` builds it first).
pub fn check_wasm_is_fresh() {
    let wasm = wasm_path();
    let built = std::fs::metadata(&wasm)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| panic!("{} is missing: run `make test`", wasm.display()));
    let newest = newest_mtime(&root().join("src"));
    assert!(
        built >= newest,
        "{} is older than src/: run `make test`",
        wasm.display()
    );
}

fn newest_mtime(dir: &Path) -> SystemTime {
    let mut newest = SystemTime::UNIX_EPOCH;
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let t = if path.is_dir() {
            newest_mtime(&path)
        } else {
            entry.metadata().unwrap().modified().unwrap()
        };
        newest = newest.max(t);
    }
    newest
}

/// The plugin configuration the tests use: the dev key (every model), a
/// narrow key, the fake provider under a few ids, and listed models.
pub fn test_plugin_config() -> Value {
    serde_json::json!({
        "keys": [
            {"id": "dev", "sha256": DEV_KEY_SHA256},
            {"id": "narrow", "sha256": sha256_hex(NARROW_KEY), "models": ["fake/ok*"]},
            {"id": "limited", "sha256": sha256_hex(LIMITED_KEY), "requests_per_minute": 5},
            {"id": "tokenlimited", "sha256": sha256_hex(TOKEN_LIMITED_KEY), "tokens_per_minute": 30}
        ],
        "max_request_bytes": 65536,
        "providers": [
            {"id": "fake", "api": "openai", "cluster": "fake", "authority": "fake.local",
             "path_prefix": "/v1", "api_key": "fake-openai-key", "legacy_completions": true, "timeout_ms": 30000},
            {"id": "fakechat", "api": "openai", "cluster": "fake", "authority": "fake.local",
             "path_prefix": "/v1", "api_key": "fake-openai-key"},
            {"id": "nokey", "api": "openai", "cluster": "fake", "authority": "fake.local",
             "api_key_env": "WAYGATE_TEST_UNSET_KEY"},
            {"id": "ghost", "api": "openai", "cluster": "nowhere", "authority": "ghost.local", "api_key": "ghost-key"},
            {"id": "closed", "api": "openai", "cluster": "closed", "authority": "closed.local", "api_key": "closed-key"},
            {"id": "slammer", "api": "openai", "cluster": "slammer", "authority": "slammer.local", "api_key": "slam-key"},
            {"id": "fastfail", "api": "openai", "cluster": "fake", "authority": "fake.local",
             "path_prefix": "/v1", "api_key": "fake-openai-key", "timeout_ms": 300},
            {"id": "backup", "api": "openai", "cluster": "fake", "authority": "fake.local",
             "path_prefix": "/v1", "api_key": "fake-openai-key"},
            {"id": "fakeanthropic", "api": "anthropic", "cluster": "fake", "authority": "fake.local",
             "path_prefix": "/v1", "api_key": "fake-anthropic-key", "default_max_tokens": 1024},
            {"id": "fakegemini", "api": "gemini", "cluster": "fake", "authority": "fake.local",
             "path_prefix": "/v1beta", "api_key": "fake-gemini-key"}
        ],
        "models": [
            {"id": "demo/chat", "endpoints": [{"provider": "fake", "model": "ok"}]},
            {"id": "demo/keyless", "endpoints": [{"provider": "nokey", "model": "ok"}]},
            {"id": "demo/spare", "endpoints": [{"provider": "nokey", "model": "ok"}, {"provider": "fake", "model": "ok"}]}
        ]
    })
}

pub fn sha256_hex(s: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The shipped bootstrap the run tests: `envoy/local-router.yaml` with router
/// fallback ([`router_fallback`]), else `envoy/local.yaml`; with ephemeral
/// ports, the fake cluster pointed at `fake`, a `closed` and a `slammer`
/// cluster added, and `plugin` as the filter's configuration.
pub fn bootstrap(fake: SocketAddr, plugin: &Value) -> String {
    if router_fallback() {
        router_bootstrap(fake, plugin)
    } else {
        shipped_bootstrap("envoy/local.yaml", fake, plugin)
    }
}

/// [`bootstrap`] from `envoy/local-router.yaml`, whatever the run, with
/// `"fallback": "router"` in `plugin` (Envoy >= 1.39).
pub fn router_bootstrap(fake: SocketAddr, plugin: &Value) -> String {
    let mut plugin = plugin.clone();
    plugin["fallback"] = "router".into();
    shipped_bootstrap("envoy/local-router.yaml", fake, &plugin)
}

/// `file` as [`bootstrap::shipped`] shapes it for the built module and `plugin`, plus the
/// tests' own clusters.
fn shipped_bootstrap(file: &str, fake: SocketAddr, plugin: &Value) -> String {
    let mut doc =
        bootstrap::shipped(&root(), file, fake, Some((plugin, &wasm_path()))).unwrap_or_else(|e| panic!("{e}"));
    // A `closed` cluster on a port nobody listens on, and a `slammer` cluster
    // whose server accepts and closes at once (a reset before any response).
    add_cluster_like_fake(&mut doc, "closed", closed_port());
    add_cluster_like_fake(&mut doc, "slammer", door_slammer_port());
    serde_yaml::to_string(&doc).unwrap()
}

/// Adds cluster `name` on `127.0.0.1:port`, a copy of `fake`, and routes to
/// it as the bootstrap routes to `fake`: its own `x-waygate-cluster` route, or
/// an entry in every slot of the router-fallback route's cluster matcher.
pub fn add_cluster_like_fake(doc: &mut serde_yaml::Value, name: &str, port: u16) {
    let clusters = doc["static_resources"]["clusters"].as_sequence_mut().unwrap();
    let mut cluster = clusters.iter().find(|c| c["name"] == "fake").unwrap().clone();
    cluster["name"] = name.into();
    cluster["load_assignment"]["cluster_name"] = name.into();
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] =
        serde_yaml::from_str(&format!("{{address: 127.0.0.1, port_value: {port}}}")).unwrap();
    clusters.push(cluster);
    let routes = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["route_config"]["virtual_hosts"][0]["routes"]
        .as_sequence_mut()
        .unwrap();
    if let Some(fake_route) = routes.iter().find(|r| r["name"] == "fake").cloned() {
        let mut route = fake_route;
        route["name"] = name.into();
        route["match"]["headers"][0]["string_match"]["exact"] = name.into();
        route["route"]["cluster"] = name.into();
        routes.insert(0, route);
    }
    // Only `get_mut`: indexing a missing key would insert it.
    for route in routes.iter_mut() {
        if let Some(specifier) = route
            .get_mut("route")
            .and_then(|r| r.get_mut("inline_cluster_specifier_plugin"))
        {
            add_to_cluster_maps(specifier, name);
        }
    }
}

/// Every `exact_match_map` under `matcher` that maps `fake` to its cluster
/// gets `name` mapped to `name` beside it.
fn add_to_cluster_maps(matcher: &mut serde_yaml::Value, name: &str) {
    match matcher {
        serde_yaml::Value::Mapping(m) => {
            if let Some(serde_yaml::Value::Mapping(map)) = m.get_mut("map")
                && let Some(fake) = map.get("fake").cloned()
            {
                let mut action = fake;
                action["action"]["name"] = name.into();
                action["action"]["typed_config"]["cluster"] = name.into();
                map.insert(name.into(), action);
            }
            for (_, v) in m.iter_mut() {
                add_to_cluster_maps(v, name);
            }
        }
        serde_yaml::Value::Sequence(items) => items.iter_mut().for_each(|v| add_to_cluster_maps(v, name)),
        _ => {}
    }
}

/// Whether this run tests router fallback: `WAYGATE_TEST_FALLBACK=router`
/// runs every gateway of the suite on `envoy/local-router.yaml` (`make test`
/// does, on Envoy >= 1.39); unset or `http_call`, on `envoy/local.yaml`.
pub fn router_fallback() -> bool {
    match std::env::var("WAYGATE_TEST_FALLBACK").as_deref() {
        Ok("router") => {
            assert!(
                envoy::supports_router_fallback(),
                "WAYGATE_TEST_FALLBACK=router needs Envoy >= 1.39, not {:?}",
                envoy::version()
            );
            true
        }
        Ok("http_call") | Err(_) => false,
        Ok(other) => panic!("WAYGATE_TEST_FALLBACK={other}: router or http_call"),
    }
}

/// A server that accepts every connection and closes it at once, shared by
/// the tests of one binary.
fn door_slammer_port() -> u16 {
    static PORT: std::sync::OnceLock<u16> = std::sync::OnceLock::new();
    *PORT.get_or_init(|| {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for conn in l.incoming().flatten() {
                drop(conn);
            }
        });
        port
    })
}

/// A local port with nothing listening: bound, then released.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// The test configuration plus a model `chain/x` served by `endpoints`
/// (provider id, upstream model) in order.
pub fn chain_config(endpoints: &[(&str, &str)]) -> Value {
    let mut config = test_plugin_config();
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(p, m)| serde_json::json!({"provider": p, "model": m}))
        .collect();
    config["models"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"id": "chain/x", "endpoints": endpoints}));
    config
}

/// A running gateway (Envoy with the filter) and its fake providers; Envoy
/// stops before the fakes.
pub struct Gateway {
    pub envoy: Envoy,
    pub fakes: FakeProviders,
    pub addr: SocketAddr,
}

impl Gateway {
    pub fn start() -> Gateway {
        Gateway::with_config(&test_plugin_config())
    }

    /// The gateway with `plugin`, in the fallback shape the run asks for
    /// ([`router_fallback`]).
    pub fn with_config(plugin: &Value) -> Gateway {
        Gateway::with_bootstrap(plugin, bootstrap)
    }

    /// The gateway in router-fallback shape ([`router_bootstrap`]); `None`
    /// when the Envoy under test predates it (< 1.39).
    pub fn routed(plugin: &Value) -> Option<Gateway> {
        envoy::supports_router_fallback().then(|| Gateway::with_bootstrap(plugin, router_bootstrap))
    }

    /// The gateway with `plugin` in the run's fallback shape ([`bootstrap`]), the
    /// bootstrap then changed by `edit`.
    pub fn with_edit(plugin: &Value, edit: impl FnOnce(&mut serde_yaml::Value)) -> Gateway {
        check_wasm_is_fresh();
        let fakes = FakeProviders::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let mut doc: serde_yaml::Value = serde_yaml::from_str(&bootstrap(fakes.addr(), plugin)).unwrap();
        edit(&mut doc);
        let envoy = Envoy::start(&serde_yaml::to_string(&doc).unwrap()).unwrap_or_else(|e| panic!("{e}"));
        let addr = envoy.listener("waygate");
        Gateway { envoy, fakes, addr }
    }

    fn with_bootstrap(plugin: &Value, make: fn(SocketAddr, &Value) -> String) -> Gateway {
        check_wasm_is_fresh();
        let fakes = FakeProviders::start("127.0.0.1:0".parse().unwrap()).unwrap();
        let envoy = Envoy::start(&make(fakes.addr(), plugin)).unwrap_or_else(|e| panic!("{e}"));
        let addr = envoy.listener("waygate");
        Gateway { envoy, fakes, addr }
    }

    pub fn post(&self, path: &str, body: &str) -> Response {
        self.send(
            "POST",
            path,
            &[
                ("authorization", &format!("Bearer {DEV_KEY}")),
                ("content-type", "application/json"),
            ],
            body.as_bytes(),
        )
    }

    /// A chat completion `body` with client key `key`.
    pub fn post_as(&self, key: &str, body: &str) -> Response {
        let auth = format!("Bearer {key}");
        self.send(
            "POST",
            "/api/v1/chat/completions",
            &[("authorization", &auth), ("content-type", "application/json")],
            body.as_bytes(),
        )
    }

    pub fn chat(&self, body: Value) -> Response {
        self.post("/api/v1/chat/completions", &body.to_string())
    }

    pub fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Response {
        let raw: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        send_raw(self.addr, method, path, &raw, body)
    }

    /// Envoy's log, the plugin's lines included.
    pub fn logs(&self) -> String {
        self.envoy.logs()
    }
}

/// What the client received.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// False when the connection closed before the body's end (a chunked
    /// body without its last chunk): what a client sees of a stream reset.
    pub complete: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn events(&self) -> Vec<String> {
        assert!(self.complete, "the stream was cut: {}", self.text());
        let text = self.text();
        assert!(text.ends_with("\n\n"), "stream must end on an event boundary: {text:?}");
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.strip_prefix("data: ")
                    .unwrap_or_else(|| panic!("not a data event: {e:?}"))
                    .to_string()
            })
            .collect()
    }

    /// The JSON chunks of a stream that must end with `[DONE]`.
    pub fn done_chunks(&self) -> Vec<Value> {
        let events = self.events();
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
        events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str(e).unwrap())
            .collect()
    }

    /// Asserts the contract's error envelope and returns it.
    pub fn assert_error(&self, status: u16, kind: &str, code: &str, param: Option<&str>) -> Value {
        assert_eq!(self.status, status, "body: {}", self.text());
        assert_eq!(
            self.header("content-type"),
            Some("application/json"),
            "body: {}",
            self.text()
        );
        let v = self.json();
        let e = &v["error"];
        assert_eq!(e["type"], kind, "{v}");
        assert_eq!(e["code"], code, "{v}");
        match param {
            Some(p) => assert_eq!(e["param"], p, "{v}"),
            None => assert!(e["param"].is_null(), "{v}"),
        }
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        v
    }
}

/// A chat completion `body` with the dev key to the gateway at `addr`, on a fresh
/// connection.
pub fn chat_to(addr: SocketAddr, body: &Value) -> Response {
    let auth = format!("Bearer {DEV_KEY}");
    send_raw(
        addr,
        "POST",
        "/api/v1/chat/completions",
        &[
            ("authorization", auth.as_bytes()),
            ("content-type", b"application/json"),
        ],
        body.to_string().as_bytes(),
    )
}

/// One request on a fresh connection, headers as raw bytes so tests can send
/// what a hostile client would.
pub fn send_raw(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Response {
    send_timed(addr, method, path, headers, body).response
}

/// Writes `request` (a whole HTTP/1.1 request) on a kept-alive connection and reads one
/// answer with a `content-length`, leaving the connection open for the next.
pub fn answer_on(stream: &mut TcpStream, request: &[u8]) -> Response {
    stream.write_all(request).unwrap();
    let (mut raw, mut buf) = (Vec::new(), [0u8; 16384]);
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().unwrap())
                .expect("an answer with a content-length");
            if raw.len() >= end + 4 + length {
                return parse_response(&raw);
            }
        }
        let n = stream.read(&mut buf).unwrap();
        assert!(
            n > 0,
            "closed before the answer's end: {}",
            String::from_utf8_lossy(&raw)
        );
        raw.extend_from_slice(&buf[..n]);
    }
}

/// A chat completion with the dev key on `stream`, which stays open, and its answer.
pub fn chat_on(stream: &mut TcpStream, body: &str) -> Response {
    let request = format!(
        "POST /api/v1/chat/completions HTTP/1.1\r\nhost: gateway.local\r\nauthorization: Bearer {DEV_KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    answer_on(stream, request.as_bytes())
}

/// An answer and when it came: its first SSE event (`data: `), if any, and its end.
pub struct Timed {
    pub first_event: Option<Duration>,
    pub whole: Duration,
    pub response: Response,
}

/// [`send_raw`], timed from the request's first byte written.
pub fn send_timed(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Timed {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nhost: gateway.local\r\nconnection: close\r\n").into_bytes();
    for (k, v) in headers {
        req.extend_from_slice(k.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(v);
        req.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() || method == "POST" {
        req.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    req.extend_from_slice(b"\r\n");
    req.extend_from_slice(body);
    let started = std::time::Instant::now();
    stream.write_all(&req).unwrap();
    let (mut first_event, mut raw, mut buf) = (None, Vec::new(), [0u8; 16384]);
    loop {
        let n = stream.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        // Only the new bytes (and the 5 before them) are searched: rescanning the
        // whole answer at each read made a 12 MiB answer take seconds to read, and
        // once in CI, under load, long enough for Envoy's delayed close (1 s without
        // write progress, after `connection: close`) to cut its end.
        let from = raw.len().saturating_sub(5);
        raw.extend_from_slice(&buf[..n]);
        if first_event.is_none() && raw[from..].windows(6).any(|w| w == b"data: ") {
            first_event = Some(started.elapsed());
        }
    }
    Timed {
        first_event,
        whole: started.elapsed(),
        response: parse_response(&raw),
    }
}

pub fn parse_response(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("no end of headers");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let status: u16 = status_line.split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked"));
    let (body, complete) = if chunked { dechunk(rest) } else { (rest.to_vec(), true) };
    if let Some(len) = headers.iter().find(|(k, _)| k == "content-length") {
        assert_eq!(
            len.1.parse::<usize>().unwrap(),
            body.len(),
            "content-length disagrees with the body"
        );
    }
    Response {
        status,
        headers,
        body,
        complete,
    }
}

/// Decodes a chunked body; `false` when it stops before the last chunk.
fn dechunk(mut rest: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size = usize::from_str_radix(
            String::from_utf8_lossy(&rest[..eol]).split(';').next().unwrap().trim(),
            16,
        )
        .unwrap();
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

/// Two function tools, `add` (described, with required parameters) and `multiply`.
pub fn tools() -> Value {
    serde_json::json!([
        {"type": "function", "function": {"name": "add", "description": "Adds two numbers",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"]}}},
        {"type": "function", "function": {"name": "multiply",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}
    ])
}

/// The text of choice `index` across a stream's chunks.
pub fn text_of(chunks: &[Value], index: u64) -> String {
    chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["index"] == index)
        .filter_map(|c| c["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

/// A one-message chat request for `model`.
pub fn ask(model: &str) -> Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": "Say hello"}]})
}

/// Through a provider that cuts its stream mid-way (`<provider>/cut-N`): the
/// client never gets `[DONE]`. Envoy resets the client's stream when the
/// upstream connection dies after the headers went out; when the filter gets
/// to write first, the last event is the contract's error.
pub fn assert_a_cut_stream_never_ends_with_done(gw: &Gateway, model: &str) {
    let mut body = ask(model);
    body["stream"] = Value::Bool(true);
    let r = gw.chat(body);
    assert_eq!(r.status, 200);
    assert!(!r.text().contains("[DONE]"), "{}", r.text());
    if r.complete {
        let last: Value = serde_json::from_str(r.events().last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "stream_interrupted");
    }
}

/// A legacy completion through a chat-only provider, plain and streamed:
/// `text_completion` answers with `greeting` and then the fake's four
/// counted words. Returns the provider's request body for the prompt
/// "Say hello" (what its API makes of a prompt).
pub fn assert_legacy_completions_go_through_chat(gw: &Gateway, provider: &str, greeting: &str) -> Value {
    let r = gw.post(
        "/api/v1/completions",
        &serde_json::json!({"model": format!("{provider}/ok"), "prompt": "Say hello"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl_"));
    assert_eq!(v["choices"][0]["text"], greeting);
    let sent = gw.fakes.received()[0].body_json().unwrap();

    let r = gw.post(
        "/api/v1/completions",
        &serde_json::json!({"model": format!("{provider}/long-4"), "prompt": "Count", "stream": true}).to_string(),
    );
    let chunks = r.done_chunks();
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, "word1 word2 word3 word4");
    sent
}

/// The stream's JSON chunks (checked to share id, model and created) and
/// whether it ended with `[DONE]`.
pub fn stream_chunks(r: &Response, model: &str) -> (Vec<Value>, bool) {
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let events = r.events();
    let done = events.last().is_some_and(|e| e == "[DONE]");
    let chunks: Vec<Value> = events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    for c in chunks.iter().filter(|c| c.get("error").is_none()) {
        assert_eq!(c["id"], chunks[0]["id"]);
        assert_eq!(c["created"], chunks[0]["created"]);
        assert_eq!(c["model"], model);
    }
    (chunks, done)
}

/// Waits until `cond` holds, checking every 20 ms; fails naming `what` after `limit`
/// (Envoy writes a request's log lines after its answer has gone).
pub fn wait_for(limit: Duration, what: &str, cond: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
