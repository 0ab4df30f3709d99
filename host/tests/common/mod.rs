//! Shared test harness: the probe guest (host/test-guest, built once per test binary), a
//! scriptable raw HTTP/1.1 upstream that records what it got, a raw HTTP client (so a
//! reset is visible), and a bootstrap generator.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use waygate_host::{HostOptions, RunningHost};

/// Builds host/test-guest for wasm32-wasip1 (once per test binary) and returns the .wasm.
pub fn probe_wasm() -> PathBuf {
    static WASM: OnceLock<PathBuf> = OnceLock::new();
    WASM.get_or_init(|| {
        let host_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let target = host_dir.join("../target/test-guest");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = std::process::Command::new(cargo)
            .args(["build", "--release", "--target", "wasm32-wasip1", "--manifest-path"])
            .arg(host_dir.join("test-guest/Cargo.toml"))
            .arg("--target-dir")
            .arg(&target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building host/test-guest failed");
        target.join("wasm32-wasip1/release/probe.wasm")
    })
    .clone()
}

// ------------------------------------------------------------------ upstream

#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// A raw HTTP/1.1 server. Paths: `/sse` (3 chunked events 200 ms apart), `/slow/<ms>`,
/// `/cut` (content-length 100, 10 bytes, close), `/status/<n>`, `/empty`, `/nobody`
/// (content-length 0); anything else answers 200 `echo:<body>`.
pub struct Upstream {
    pub addr: SocketAddr,
    pub received: Arc<Mutex<Vec<Recorded>>>,
}

impl Upstream {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let rec = Arc::clone(&received);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let rec = Arc::clone(&rec);
                std::thread::spawn(move || serve_upstream(stream, rec));
            }
        });
        Self { addr, received }
    }

    pub fn received(&self) -> Vec<Recorded> {
        self.received.lock().unwrap().clone()
    }
}

fn read_head(reader: &mut BufReader<TcpStream>) -> Option<(String, Vec<(String, String)>)> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let start = line.trim_end().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    Some((start, headers))
}

fn read_body(reader: &mut BufReader<TcpStream>, headers: &[(String, String)]) -> Option<Vec<u8>> {
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).ok()?;
            let size = usize::from_str_radix(size.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                return Some(body);
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    let len: usize = get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    Some(body)
}

fn serve_upstream(stream: TcpStream, rec: Arc<Mutex<Vec<Recorded>>>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    while let Some((start, headers)) = read_head(&mut reader) {
        let Some(body) = read_body(&mut reader, &headers) else {
            return;
        };
        let mut parts = start.split(' ');
        let method = parts.next().unwrap_or("").to_owned();
        let path = parts.next().unwrap_or("").to_owned();
        rec.lock().unwrap().push(Recorded {
            method,
            path: path.clone(),
            headers,
            body: body.clone(),
        });
        let ok = if path == "/sse" {
            let mut w = || -> std::io::Result<()> {
                writer.write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n",
                )?;
                for i in 0..3 {
                    let event = format!("data: {i}\n\n");
                    writer.write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes())?;
                    writer.flush()?;
                    std::thread::sleep(Duration::from_millis(200));
                }
                writer.write_all(b"0\r\n\r\n")
            };
            w().is_ok()
        } else if let Some(ms) = path.strip_prefix("/slow/") {
            std::thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
            respond(&mut writer, 200, b"slow")
        } else if path == "/cut" {
            let _ = writer.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n0123456789");
            let _ = writer.flush();
            std::thread::sleep(Duration::from_millis(100));
            return;
        } else if let Some(code) = path.strip_prefix("/status/") {
            respond(
                &mut writer,
                code.parse().unwrap_or(500),
                format!("status {code}").as_bytes(),
            )
        } else if path == "/empty" || path == "/nobody" {
            writer
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .is_ok()
        } else {
            let mut out = b"echo:".to_vec();
            out.extend_from_slice(&body);
            respond(&mut writer, 200, &out)
        };
        if !ok {
            return;
        }
    }
}

fn respond(writer: &mut TcpStream, status: u16, body: &[u8]) -> bool {
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    writer.write_all(head.as_bytes()).is_ok() && writer.write_all(body).is_ok()
}

// ------------------------------------------------------------------ client

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Arrival time of each body chunk (chunked responses), relative to the request.
    pub chunk_times: Vec<Duration>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends raw bytes, reads one response. `Err` = the connection closed before a complete
/// response (a reset as HTTP/1 shows it).
pub fn raw(addr: SocketAddr, request: &[u8]) -> Result<Resp, String> {
    let started = Instant::now();
    let stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut writer = stream.try_clone().unwrap();
    writer.write_all(request).map_err(|e| e.to_string())?;
    let mut reader = BufReader::new(stream);
    let (start, headers) = read_head(&mut reader).ok_or("closed before the response head")?;
    let status: u16 = start
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("bad status line")?;
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let mut body = Vec::new();
    let mut chunk_times = Vec::new();
    if request.starts_with(b"HEAD ") {
    } else if get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        loop {
            let mut size = String::new();
            if reader.read_line(&mut size).map_err(|e| e.to_string())? == 0 {
                return Err("closed mid-body (chunked)".to_owned());
            }
            let size = usize::from_str_radix(size.trim(), 16).map_err(|e| e.to_string())?;
            let mut chunk = vec![0; size + 2];
            reader
                .read_exact(&mut chunk)
                .map_err(|_| "closed mid-body (chunked)".to_owned())?;
            if size == 0 {
                break;
            }
            chunk_times.push(started.elapsed());
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(len) = get("content-length") {
        let len: usize = len.parse().map_err(|_| "bad content-length")?;
        body = vec![0; len];
        reader
            .read_exact(&mut body)
            .map_err(|_| "closed mid-body (content-length)".to_owned())?;
    }
    Ok(Resp {
        status,
        headers,
        body,
        chunk_times,
    })
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Result<Resp, String> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nhost: test.local\r\nconnection: close\r\n");
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(body) = body {
        out.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if let Some(body) = body {
        bytes.extend_from_slice(body);
    }
    raw(addr, &bytes)
}

/// A POST whose body is sent with chunked encoding in the given pieces, `gap` apart.
pub fn chunked(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    pieces: &[&[u8]],
    gap: Duration,
) -> Result<Resp, String> {
    let stream = TcpStream::connect(addr).map_err(|e| e.to_string())?;
    let mut writer = stream.try_clone().unwrap();
    let mut head =
        format!("POST {path} HTTP/1.1\r\nhost: test.local\r\nconnection: close\r\ntransfer-encoding: chunked\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    writer.write_all(head.as_bytes()).unwrap();
    // The host may answer (413, local reply) and close before the body is sent: stop
    // writing then and read what it said.
    let mut send = || -> std::io::Result<()> {
        for piece in pieces {
            std::thread::sleep(gap);
            writer.write_all(format!("{:x}\r\n", piece.len()).as_bytes())?;
            writer.write_all(piece)?;
            writer.write_all(b"\r\n")?;
            writer.flush()?;
        }
        std::thread::sleep(gap);
        writer.write_all(b"0\r\n\r\n")
    };
    let _ = send();
    drop(stream);
    // Read through the cloned stream.
    let mut reader = BufReader::new(writer);
    let (start, headers) = read_head(&mut reader).ok_or("closed before the response head")?;
    let status: u16 = start
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("bad status")?;
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    reader.read_exact(&mut body).map_err(|e| e.to_string())?;
    Ok(Resp {
        status,
        headers,
        body,
        chunk_times: Vec::new(),
    })
}

// ------------------------------------------------------------------ bootstrap

pub struct Boot {
    pub upstream: SocketAddr,
    pub allow_stop_iteration: bool,
    pub failure_policy: &'static str,
    pub buffer_limit: Option<u32>,
    pub route_timeout: Option<&'static str>,
    pub configuration: String,
    pub env_keys: Vec<&'static str>,
    pub key_values: Vec<(&'static str, &'static str)>,
    pub wasm: bool,
}

impl Boot {
    pub fn new(upstream: SocketAddr) -> Self {
        Self {
            upstream,
            allow_stop_iteration: false,
            failure_policy: "FAIL_CLOSED",
            buffer_limit: None,
            route_timeout: None,
            configuration: "{}".to_owned(),
            env_keys: Vec::new(),
            key_values: Vec::new(),
            wasm: true,
        }
    }

    pub fn yaml(&self) -> String {
        let limit = self
            .buffer_limit
            .map(|l| format!("    per_connection_buffer_limit_bytes: {l}\n"))
            .unwrap_or_default();
        let timeout = self
            .route_timeout
            .map(|t| format!("\n                  timeout: {t}"))
            .unwrap_or_default();
        let keys = self.env_keys.join(", ");
        let kv: String = self
            .key_values
            .iter()
            .map(|(k, v)| format!("\n                      {k}: {v}"))
            .collect();
        let wasm = if self.wasm {
            format!(
                r#"
          - name: probe
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
              config:
                name: probe
                root_id: probe_root
                failure_policy: {policy}
                allow_on_headers_stop_iteration: {allow}
                configuration:
                  "@type": type.googleapis.com/google.protobuf.StringValue
                  value: '{config}'
                vm_config:
                  vm_id: probe_vm
                  runtime: envoy.wasm.runtime.v8
                  code: {{ local: {{ filename: {wasm} }} }}
                  environment_variables:
                    host_env_keys: [{keys}]
                    key_values: {{{kv_open}}}"#,
                policy = self.failure_policy,
                allow = self.allow_stop_iteration,
                config = self.configuration,
                wasm = probe_wasm().display(),
                kv_open = if kv.is_empty() {
                    String::new()
                } else {
                    kv.clone() + "\n                    "
                },
            )
        } else {
            String::new()
        };
        format!(
            r#"admin:
  address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
static_resources:
  listeners:
  - name: main
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
{limit}    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: main
          route_config:
            name: local
            virtual_hosts:
            - name: rewritten_host
              domains: ["rewritten.example"]
              routes:
              - name: by_authority
                match: {{ prefix: / }}
                direct_response: {{ status: 200, body: {{ inline_string: by-authority }} }}
            - name: all
              domains: ["*"]
              routes:
              - name: rewritten
                match: {{ path: /rewritten }}
                direct_response: {{ status: 200, body: {{ inline_string: rewritten-route }} }}
              - name: dead
                match: {{ prefix: /, headers: [{{ name: x-route, string_match: {{ exact: dead }} }}] }}
                route: {{ cluster: dead }}
              - name: direct
                match: {{ prefix: /direct }}
                direct_response: {{ status: 404, body: {{ inline_string: '{{"error":"no route"}}' }} }}
              - name: nowhere
                match: {{ prefix: /nowhere }}
                route: {{ cluster: upstream }}
                request_headers_to_remove: [x-secret]
              - name: default
                match: {{ prefix: / }}
                route:
                  cluster: upstream
                  host_rewrite_literal: upstream.example{timeout}
                request_headers_to_remove: [x-secret]
          http_filters:{wasm}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream
      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }} }}] }}]
  - name: dead
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: dead
      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: 1 }} }} }} }}] }}]
"#,
            port = self.upstream.port(),
        )
    }

    pub fn start(&self) -> RunningHost {
        self.start_with(HostOptions {
            concurrency: 1,
            env: Some(HashMap::new()),
            ..Default::default()
        })
    }

    pub fn start_with(&self, options: HostOptions) -> RunningHost {
        waygate_host::start(&self.yaml(), options)
            .unwrap_or_else(|e| panic!("host did not start: {e}\n{}", self.yaml()))
    }
}

/// Lines of the plugin's log containing `needle`.
pub fn lines(host: &RunningHost, needle: &str) -> Vec<String> {
    host.logs().into_iter().filter(|l| l.contains(needle)).collect()
}

/// Waits until a log line contains `needle` (on_log runs after the response is sent).
pub fn wait_for(host: &RunningHost, needle: &str) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = lines(host, needle);
        if !found.is_empty() || Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn addr(host: &RunningHost) -> SocketAddr {
    host.listener_addr("main").unwrap()
}
