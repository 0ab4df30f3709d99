//! The router's upstream side: streaming, end of stream, failures as local replies,
//! timeouts, buffer limits.

mod common;

use std::time::Duration;

use common::*;

/// Semantics §1.8: response body callbacks arrive per upstream chunk and are forwarded
/// as they come; an SSE stream is never buffered by the host.
#[test]
fn an_sse_response_streams_chunk_by_chunk_through_the_plugin() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "GET", "/sse", &[("x-probe", "resp-stream")], None).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "DATA: 0\n\nDATA: 1\n\nDATA: 2\n\n");
    assert!(r.chunk_times.len() >= 3, "{:?}", r.chunk_times);
    let first = r.chunk_times[0];
    let last = r.chunk_times[r.chunk_times.len() - 1];
    assert!(
        last - first >= Duration::from_millis(300),
        "chunks arrived together: {:?}",
        r.chunk_times
    );
    assert!(
        lines(&host, "resp_body size=9 eos=false").len() >= 3,
        "{:?}",
        host.logs()
    );
}

/// Semantics §1.2.5: a headers-only response has end_of_stream on headers and no body
/// callback.
#[test]
fn a_headers_only_response_gets_no_body_callback() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "GET", "/empty", &[], None).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(wait_for(&host, "resp_headers").len(), 1);
    assert!(wait_for(&host, "resp_headers")[0].contains("eos=true"));
    let _ = wait_for(&host, "on_log");
    assert!(lines(&host, "resp_body").is_empty(), "{:?}", host.logs());
}

/// Response buffering with the allow flag: Pause in on_response_headers, Pause on body
/// until eos, replace the body (after removing content-length).
#[test]
fn a_buffered_response_is_replaced_at_end_of_stream() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.allow_stop_iteration = true;
    let host = boot.start();
    let r = request(addr(&host), "GET", "/sse", &[("x-probe", "resp-buffer")], None).unwrap();
    assert_eq!(r.text(), "[data: 0\n\ndata: 1\n\ndata: 2\n\n]");
    assert!(
        lines(&host, "resp_body size=27 eos=true").len() == 1,
        "{:?}",
        host.logs()
    );
}

/// context.cc `getMap` on the response side: after on_response_headers returned Continue
/// the response headers are refused (BadArgument = 2) in on_response_body.
#[test]
fn response_headers_are_refused_after_continue() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(
        addr(&host),
        "POST",
        "/x",
        &[("x-probe", "resp-after-continue")],
        Some(b"hey"),
    )
    .unwrap();
    assert_eq!(r.text(), "echo:hey");
    assert_eq!(lines(&host, "resp-after-continue get=2").len(), 1, "{:?}", host.logs());
}

/// router.cc `onUpstreamReset` before headers: 503 with the router's text, details
/// upstream_reset_before_response_started{connection_failure}, seen by the plugin.
#[test]
fn a_connect_failure_is_a_503_local_reply() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "GET", "/x", &[("x-route", "dead")], None).unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(
        r.text(),
        "upstream connect error or disconnect/reset before headers. reset reason: connection failure"
    );
    let seen = wait_for(&host, "resp_headers");
    assert!(
        seen[0].contains("details=upstream_reset_before_response_started{connection_failure}"),
        "{seen:?}"
    );
}

/// router.cc `onResponseTimeout`: the route timeout (default 15 s; here 0.3 s) gives 504
/// "upstream request timeout", details response_timeout.
#[test]
fn the_route_timeout_is_a_504() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.route_timeout = Some("0.3s");
    let host = boot.start();
    let r = request(addr(&host), "GET", "/slow/2000", &[], None).unwrap();
    assert_eq!(r.status, 504);
    assert_eq!(r.text(), "upstream request timeout");
    assert!(wait_for(&host, "resp_headers")[0].contains("details=response_timeout"));
    assert_eq!(up.received()[0].header("x-envoy-expected-rq-timeout-ms"), Some("300"));
}

/// router.cc: an upstream reset after the response started resets the downstream stream.
#[test]
fn an_upstream_cut_mid_response_resets_downstream() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "GET", "/cut", &[], None);
    assert!(r.is_err(), "{r:?}");
    assert_eq!(wait_for(&host, "on_log").len(), 1, "on_log still runs");
}

/// filter_manager.cc `requestDataTooLarge`: buffering (Pause on body) past the listener's
/// per_connection_buffer_limit_bytes gives Envoy's own 413, seen by the plugin.
#[test]
fn buffering_past_the_limit_is_a_413() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.allow_stop_iteration = true;
    boot.buffer_limit = Some(1024);
    let host = boot.start();
    let big = vec![b'a'; 4096];
    let r = chunked(
        addr(&host),
        "/x",
        &[("x-probe", "buffer")],
        &[&big[..1000], &big[1000..2000], &big[2000..]],
        Duration::from_millis(30),
    )
    .unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(r.text(), "Payload Too Large");
    assert!(wait_for(&host, "resp_headers")[0].contains("details=request_payload_too_large"));
    assert!(up.received().is_empty());
}

/// Pausing in headers (StopAllIterationAndWatermark) is backpressure, not a 413.
#[test]
fn pausing_headers_is_backpressure_not_413() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.buffer_limit = Some(1024);
    let host = boot.start();
    let a = addr(&host);
    let handle = std::thread::spawn(move || request(a, "POST", "/x", &[("x-probe", "pause")], Some(&vec![b'a'; 8192])));
    std::thread::sleep(Duration::from_millis(500));
    assert!(lines(&host, "resp_headers").is_empty(), "{:?}", host.logs());
    drop(host);
    let _ = handle.join();
}

/// conn_manager_impl.cc `onIdleTimeout`: no activity for `stream_idle_timeout` before the
/// response started gives 408 "stream timeout", details stream_idle_timeout, through the
/// plugin's response callbacks (here the plugin paused its headers and never resumed).
#[test]
fn the_stream_idle_timeout_is_a_408() {
    let up = Upstream::start();
    let boot = Boot::new(up.addr);
    let yaml = boot.yaml().replace(
        "stat_prefix: main",
        "stat_prefix: main\n          stream_idle_timeout: 0.3s",
    );
    let host = waygate_host::start(
        &yaml,
        waygate_host::HostOptions {
            concurrency: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let r = request(addr(&host), "GET", "/x", &[("x-probe", "pause-forever")], None).unwrap();
    assert_eq!(r.status, 408);
    assert_eq!(r.text(), "stream timeout");
    assert!(wait_for(&host, "resp_headers")[0].contains("details=stream_idle_timeout"));
}
