//! Soak (`make soak`, ignored by `make test`): SOAK_REQUESTS (default
//! 100,000) mixed requests through Envoy at concurrency 32 on keep-alive
//! connections: OpenAI, Anthropic and Gemini answers, streamed and not, the
//! providers' in-stream errors, provider and client errors, and fallbacks
//! after a 503 and after a connection failure. Every answer is checked
//! (status, the contract's envelope, a stream that ends with `[DONE]` or one
//! error event); lost or malformed answers fail the run. Envoy's RSS (its two
//! workers' VMs included) is sampled every 10% to show it is flat.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;
mod raw_upstream;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::envoy::Envoy;
use common::{DEV_KEY, Gateway};
use serde_json::{Value, json};
use waygate_fakes::FakeProviders;

const CONCURRENCY: usize = 32;

/// One kind of request in the mix, and what its answer must be.
struct Kind {
    path: &'static str,
    body: String,
    key: &'static str,
    status: u16,
    stream: bool,
    /// A stream that must end with the error event instead of `[DONE]`.
    stream_error: bool,
    /// `x-waygate-attempts` expected, if checked.
    attempts: Option<&'static str>,
}

fn kinds() -> Vec<Kind> {
    let chat = |model: &str, stream: bool| {
        json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "soak"}]}).to_string()
    };
    let ok = |path, body, status, stream| Kind {
        path,
        body,
        key: DEV_KEY,
        status,
        stream,
        stream_error: false,
        attempts: None,
    };
    let mut kinds = Vec::new();
    for provider in ["fake", "fakeanthropic", "fakegemini"] {
        kinds.push(ok(CHAT, chat(&format!("{provider}/ok"), false), 200, false));
        kinds.push(ok(CHAT, chat(&format!("{provider}/ok"), false), 200, false));
        kinds.push(ok(CHAT, chat(&format!("{provider}/long-40"), true), 200, true));
        kinds.push(ok(CHAT, chat(&format!("{provider}/ok"), true), 200, true));
        kinds.push(Kind {
            stream_error: true,
            ..ok(CHAT, chat(&format!("{provider}/stream-error"), true), 200, true)
        });
        kinds.push(ok(CHAT, chat(&format!("{provider}/status-400"), false), 400, false));
    }
    kinds.push(ok(
        "/api/v1/completions",
        json!({"model": "fake/ok", "prompt": "soak"}).to_string(),
        200,
        false,
    ));
    kinds.push(ok(CHAT, "{\"model\": ".to_string(), 400, false));
    kinds.push(Kind {
        key: "wg-wrong-key",
        ..ok(CHAT, chat("fake/ok", false), 401, false)
    });
    kinds.push(ok(CHAT, chat("fake/status-429", false), 429, false));
    kinds.push(Kind {
        attempts: Some("fake:503,backup:200"),
        ..ok(CHAT, chat("soak/after-503", false), 200, false)
    });
    kinds.push(Kind {
        attempts: Some("fake:503,backup:200"),
        ..ok(CHAT, chat("soak/after-503", true), 200, true)
    });
    kinds.push(Kind {
        attempts: Some("closed:error,fake:200"),
        ..ok(CHAT, chat("soak/after-refused", false), 200, false)
    });
    kinds
}

const CHAT: &str = "/api/v1/chat/completions";

fn config() -> Value {
    let mut config = common::test_plugin_config();
    config["models"].as_array_mut().unwrap().extend([
        json!({"id": "soak/after-503", "endpoints": [{"provider": "fake", "model": "status-503"},
                                                     {"provider": "backup", "model": "ok"}]}),
        json!({"id": "soak/after-refused", "endpoints": [{"provider": "closed", "model": "x"},
                                                         {"provider": "fake", "model": "ok"}]}),
    ]);
    config
}

/// One keep-alive connection.
struct Conn {
    addr: SocketAddr,
    reader: Option<BufReader<TcpStream>>,
}

struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Conn {
    fn send(&mut self, kind: &Kind) -> std::io::Result<Answer> {
        if self.reader.is_none() {
            let s = TcpStream::connect(self.addr)?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            s.set_nodelay(true)?;
            self.reader = Some(BufReader::new(s));
        }
        let result = self.exchange(kind);
        let close = match &result {
            Ok(a) => a
                .headers
                .iter()
                .any(|(k, v)| k == "connection" && v.eq_ignore_ascii_case("close")),
            Err(_) => true,
        };
        if close {
            self.reader = None;
        }
        result
    }

    fn exchange(&mut self, kind: &Kind) -> std::io::Result<Answer> {
        let reader = self.reader.as_mut().unwrap();
        let req = format!(
            "POST {} HTTP/1.1\r\nhost: gateway.local\r\nauthorization: Bearer {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{}",
            kind.path,
            kind.key,
            kind.body.len(),
            kind.body
        );
        reader.get_mut().write_all(req.as_bytes())?;
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status line: {line:?}")))?;
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line)? == 0 {
                return Err(std::io::Error::other("closed in the headers"));
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
            }
        }
        let header = |name: &str| headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let mut body = Vec::new();
        if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
            loop {
                let mut size = String::new();
                reader.read_line(&mut size)?;
                let size = usize::from_str_radix(size.trim(), 16).map_err(std::io::Error::other)?;
                let mut chunk = vec![0; size + 2];
                reader.read_exact(&mut chunk)?;
                if size == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..size]);
            }
        } else if let Some(n) = header("content-length") {
            body = vec![0; n.parse().map_err(std::io::Error::other)?];
            reader.read_exact(&mut body)?;
        } else {
            reader.read_to_end(&mut body)?;
            headers.push(("connection".into(), "close".into()));
        }
        Ok(Answer { status, headers, body })
    }
}

/// Why an answer is not what its kind promises, if it is not.
fn check(kind: &Kind, a: &Answer) -> Result<(), String> {
    let text = || String::from_utf8_lossy(&a.body).into_owned();
    if a.status != kind.status {
        return Err(format!("status {} instead of {}: {}", a.status, kind.status, text()));
    }
    let header = |name: &str| a.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    if let Some(attempts) = kind.attempts
        && header("x-waygate-attempts") != Some(attempts)
    {
        return Err(format!("attempts {:?}", header("x-waygate-attempts")));
    }
    if a.status != 200 {
        let v: Value = serde_json::from_slice(&a.body).map_err(|e| format!("{e}: {}", text()))?;
        let e = &v["error"];
        let fine = header("content-type") == Some("application/json")
            && e["message"].as_str().is_some_and(|m| !m.is_empty())
            && e["code"].as_str().is_some_and(|c| !c.is_empty())
            && e["type"].is_string();
        return if fine {
            Ok(())
        } else {
            Err(format!("not the envelope: {v}"))
        };
    }
    if !kind.stream {
        let v: Value = serde_json::from_slice(&a.body).map_err(|e| format!("{e}: {}", text()))?;
        let fine = v["choices"][0].is_object() && v["id"].is_string() && v["usage"]["total_tokens"].is_u64();
        return if fine {
            Ok(())
        } else {
            Err(format!("not an answer: {v}"))
        };
    }
    let body = text();
    let Some(events) = body.strip_suffix("\n\n") else {
        return Err(format!("stream not ended on an event: {body:?}"));
    };
    let events: Vec<&str> = events.split("\n\n").collect();
    let (last, rest) = events.split_last().unwrap();
    for e in rest {
        let v: Value = e
            .strip_prefix("data: ")
            .and_then(|d| serde_json::from_str(d).ok())
            .ok_or_else(|| format!("bad event {e:?}"))?;
        if v.get("error").is_some() || v["object"] != "chat.completion.chunk" {
            return Err(format!("bad chunk {v}"));
        }
    }
    match (kind.stream_error, *last) {
        (false, "data: [DONE]") => Ok(()),
        (true, last) if last.contains("\"stream_interrupted\"") => Ok(()),
        (_, last) => Err(format!("stream ended with {last:?}")),
    }
}

/// The test gateway, logging only warnings and without the HCM access log:
/// 100,000 lines of each would make the run measure the log files.
fn gateway() -> Gateway {
    common::check_wasm_is_fresh();
    let fakes = FakeProviders::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let yaml = common::bootstrap(fakes.addr(), &config());
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    if let Some(hcm) =
        doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"].as_mapping_mut()
    {
        hcm.remove("access_log");
    }
    let envoy = Envoy::start_logging(&serde_yaml::to_string(&doc).unwrap(), "warn").unwrap_or_else(|e| panic!("{e}"));
    let addr = envoy.listener("waygate");
    Gateway { envoy, fakes, addr }
}

#[test]
#[ignore = "soak: `make soak`"]
fn soak_mixed_requests_at_concurrency_32() {
    let total: usize = std::env::var("SOAK_REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let gw = Arc::new(gateway());
    let kinds = Arc::new(kinds());
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let lost = Arc::new(AtomicUsize::new(0));
    let malformed = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let start = Instant::now();
    let samples = std::sync::Mutex::new(vec![(0usize, gw.envoy.memory_kb().0)]);
    std::thread::scope(|scope| {
        for _ in 0..CONCURRENCY {
            let (gw, kinds, next, done, lost, malformed) = (&gw, &kinds, &next, &done, &lost, &malformed);
            let samples = &samples;
            scope.spawn(move || {
                let mut conn = Conn {
                    addr: gw.addr,
                    reader: None,
                };
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total {
                        return;
                    }
                    let kind = &kinds[i % kinds.len()];
                    match conn.send(kind) {
                        Ok(answer) => {
                            if let Err(why) = check(kind, &answer) {
                                malformed.lock().unwrap().push(format!("#{i} {}: {why}", kind.body));
                            }
                        }
                        Err(e) => {
                            lost.fetch_add(1, Ordering::Relaxed);
                            malformed.lock().unwrap().push(format!("#{i} lost: {e}"));
                        }
                    }
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if n % (total / 10).max(1) == 0 {
                        // The fakes record every request: the harness's memory, not the gateway's.
                        gw.fakes.clear_received();
                        samples.lock().unwrap().push((n, gw.envoy.memory_kb().0));
                    }
                }
            });
        }
    });
    let elapsed = start.elapsed();
    let samples = samples.into_inner().unwrap();
    let (rss, peak) = gw.envoy.memory_kb();
    let malformed = malformed.lock().unwrap();
    let logs = gw.logs();
    let access_lines = gw.envoy.access_log_lines().len();
    let mb = |kb: u64| kb as f64 / 1024.0;
    let series: Vec<String> = samples.iter().map(|(n, kb)| format!("{n}:{:.1}", mb(*kb))).collect();
    let mut summary = format!(
        "soak: {total} requests in {:.1} s ({:.0} req/s), concurrency {CONCURRENCY}, {} kinds; lost {}, malformed {}\n\
         soak: RSS MB by requests done {}; now {:.1} MB, peak {:.1} MB ({} log lines, {} access lines kept)\n",
        elapsed.as_secs_f64(),
        total as f64 / elapsed.as_secs_f64(),
        kinds.len(),
        lost.load(Ordering::Relaxed),
        malformed.len() - lost.load(Ordering::Relaxed),
        series.join(" "),
        mb(rss),
        mb(peak),
        logs.lines().count(),
        access_lines,
    );
    for m in malformed.iter().take(10) {
        summary.push_str(&format!("  {m}\n"));
    }
    eprint!("{summary}");
    let _ = std::fs::write(common::root().join("target/soak.txt"), &summary);
    assert!(malformed.is_empty(), "{} lost or malformed answers", malformed.len());
    raw_upstream::assert_no_trap(&logs);
    // Flat: the last sample within 25% (or 32 MB) of the one at 20%.
    let at = |frac: usize| samples.iter().find(|(n, _)| *n >= total * frac / 10).map_or(0, |s| s.1);
    let (early, late) = (at(2), at(10));
    assert!(
        late <= early + (early / 4).max(32 * 1024),
        "RSS grew from {:.1} MB to {:.1} MB",
        mb(early),
        mb(late)
    );
}
