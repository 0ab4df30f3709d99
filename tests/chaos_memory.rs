//! Memory after the heaviest faults returns to its baseline: the 10 MB
//! line, the endless stream whose client leaves, and the endless JSON body
//! cut at the buffer limit, in rounds through Envoy. The first rounds set
//! the high-water mark (a VM's linear memory never shrinks); later rounds
//! must not add to Envoy's RSS at rest. One worker, so the first rounds set
//! the mark of every VM there is: with two, the kernel could hand all of one
//! fault's connections to the same worker until a later round (seen in CI as
//! a 25 MB step after the baseline).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;
mod raw_upstream;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::DEV_KEY;
use raw_upstream::Chaos;
use serde_json::json;

fn rss_at_rest_mb(c: &Chaos) -> f64 {
    c.gw.envoy.rss_at_rest_kb() as f64 / 1024.0
}

/// Sends a request and reads until `enough` of the answer came (or the end),
/// then leaves.
fn hit(c: &Chaos, model: &str, stream: bool, enough: &str) {
    let body = json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let req = format!(
        "POST /api/v1/chat/completions HTTP/1.1\r\nhost: g\r\nconnection: close\r\nauthorization: Bearer {DEV_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = TcpStream::connect(c.gw.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    s.write_all(req.as_bytes()).unwrap();
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 16384];
    while start.elapsed() < Duration::from_secs(30) {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
        if String::from_utf8_lossy(&got).contains(enough) {
            break;
        }
    }
    assert!(start.elapsed() < Duration::from_secs(30), "{model}: no answer");
}

#[test]
fn memory_returns_to_its_baseline_after_the_heaviest_faults() {
    let c = Chaos::single_worker();
    let round = |c: &Chaos| {
        for _ in 0..2 {
            hit(c, "raw/huge-line", true, "stream_interrupted");
            hit(c, "raw/endless", true, "\"more \"");
            hit(c, "raw/endless-json", false, "\r\n\r\n");
        }
        assert!(c.raw.wait_idle(Duration::from_secs(10)), "upstreams released");
        for _ in 0..20 {
            assert_eq!(
                c.gw.chat(json!({"model": "fake/ok", "messages": [{"role": "user", "content": "x"}]}))
                    .status,
                200
            );
        }
    };
    let before = rss_at_rest_mb(&c);
    round(&c);
    round(&c);
    let baseline = rss_at_rest_mb(&c);
    for _ in 0..4 {
        round(&c);
    }
    let after = rss_at_rest_mb(&c);
    eprintln!("chaos memory: RSS {before:.1} MB at start, {baseline:.1} MB after 2 rounds, {after:.1} MB after 6");
    assert!(
        after <= baseline + 8.0,
        "RSS grew from {baseline:.1} MB to {after:.1} MB over four more rounds"
    );
    c.assert_healthy();
}
