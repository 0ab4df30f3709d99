//! The request path: pause semantics, body buffering, header access, set_buffer_bytes,
//! routing on the plugin's headers, and content-length honesty.

mod common;

use std::time::Duration;

use common::*;

/// context.cc `decodeHeaders` + filter.h `StopAllIterationAndWatermark`: Pause in
/// on_request_headers without allow_on_headers_stop_iteration delivers NO body callback
/// (cpp-host issue #143); the request hangs until the stream idle timeout.
#[test]
fn pause_in_request_headers_suppresses_body_callbacks_by_default() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let a = addr(&host);
    let handle = std::thread::spawn(move || {
        let _ = request(a, "POST", "/x", &[("x-probe", "pause")], Some(b"hello"));
    });
    std::thread::sleep(Duration::from_millis(600));
    assert!(!wait_for(&host, "scenario=pause").is_empty());
    assert!(lines(&host, "req_body").is_empty(), "{:?}", host.logs());
    assert!(up.received().is_empty());
    drop(host);
    let _ = handle.join();
}

/// Envoy >= 1.35 `allow_on_headers_stop_iteration: true` turns Pause into StopIteration:
/// body chunks are delivered while the headers are held, and a body Continue forwards the
/// headers then the body (filter.h, context.cc).
#[test]
fn with_the_allow_flag_body_chunks_arrive_while_headers_are_held() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.allow_stop_iteration = true;
    let host = boot.start();
    let r = request(addr(&host), "POST", "/x", &[("x-probe", "pause")], Some(b"hello")).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "echo:hello");
    assert_eq!(lines(&host, "req_body size=5 eos=true").len(), 1, "{:?}", host.logs());
}

/// context.cc `decodeData`: after Pause the plugin sees the cumulative buffer; Continue
/// forwards the whole buffer as modified (semantics §1.4.3).
#[test]
fn paused_body_callbacks_see_the_cumulative_buffer_and_continue_flushes_it() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.allow_stop_iteration = true;
    let host = boot.start();
    let r = chunked(
        addr(&host),
        "/x",
        &[("x-probe", "buffer")],
        &[b"ab", b"cd", b"ef"],
        Duration::from_millis(80),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "echo:ABCDEF!");
    let sizes: Vec<String> = lines(&host, "req_body size=");
    assert!(sizes.iter().any(|l| l.contains("size=2 eos=false")), "{sizes:?}");
    assert!(sizes.iter().any(|l| l.contains("size=4 eos=false")), "{sizes:?}");
    // The chunked terminator arrives as an empty data callback with eos.
    assert!(sizes.iter().any(|l| l.contains("size=6 eos=true")), "{sizes:?}");
    let got = up.received();
    assert_eq!(got[0].body, b"ABCDEF!");
}

/// context.cc `decodeData`: after a Continue the buffer is only the current chunk.
#[test]
fn continued_body_callbacks_see_only_the_current_chunk() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = chunked(
        addr(&host),
        "/x",
        &[("x-probe", "chunks")],
        &[b"abc", b"de"],
        Duration::from_millis(80),
    )
    .unwrap();
    assert_eq!(r.text(), "echo:abcde");
    let sizes = lines(&host, "req_body size=");
    assert!(sizes.iter().any(|l| l.contains("size=3 eos=false")), "{sizes:?}");
    assert!(sizes.iter().any(|l| l.contains("size=2 eos=false")), "{sizes:?}");
    assert!(sizes.iter().any(|l| l.contains("size=0 eos=true")), "{sizes:?}");
}

/// context.cc `getMap` / cpp-host `exports.cc`: after on_request_headers returned Continue
/// the request header map is gone: get/replace answer BadArgument (2). (Envoy answers
/// get_header_map_pairs with Ok and no pairs; the host answers BadArgument, see README.)
#[test]
fn request_headers_are_refused_after_continue() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "POST", "/x", &[("x-probe", "after-continue")], Some(b"b")).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        lines(&host, "after-continue get=2 pairs=2 replace=2").len(),
        1,
        "{:?}",
        host.logs()
    );
}

/// While the headers are held (Pause + allow flag), body callbacks may still read them.
#[test]
fn held_request_headers_stay_readable_in_body_callbacks() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.allow_stop_iteration = true;
    let host = boot.start();
    let r = request(addr(&host), "POST", "/x", &[("x-probe", "body-headers")], Some(b"b")).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(lines(&host, "body-headers get=0").len(), 1, "{:?}", host.logs());
}

/// Recent context.cc + `Buffer::copyFrom`: (0,0) prepends, start >= len appends, a
/// middle start is refused; a zero-length read answers Ok with a null pointer
/// (cpp-host `get_buffer_bytes`; the Rust SDK turns it into None).
#[test]
fn set_buffer_bytes_follows_envoy_rules() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.allow_stop_iteration = true;
    let host = boot.start();
    let r = request(addr(&host), "POST", "/x", &[("x-probe", "set-buffer")], Some(b"abc")).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "echo:<abc>");
    let line = lines(&host, "set-buffer prepend=").join("");
    assert!(line.contains("prepend=0 append=0"), "{line}");
    // Envoy answers BadArgument (2); the crate maps a refused buffer write to NotFound (1).
    assert!(line.contains("middle=1"), "{line}");
    assert!(line.contains("empty_read=(0, true, 0)"), "{line}");
}

/// Semantics §1.4.3 and trap 9: Envoy never recomputes content-length. A filter that
/// changes the body and not the length gets a loud 500 and a FILTER BUG log line here.
#[test]
fn a_content_length_the_body_disagrees_with_fails_loudly() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.allow_stop_iteration = true;
    let host = boot.start();
    let r = request(addr(&host), "POST", "/x", &[("x-probe", "cl-mismatch")], Some(b"abc")).unwrap();
    assert_eq!(r.status, 500);
    assert!(r.text().contains("content-length 3"), "{}", r.text());
    assert_eq!(lines(&host, "FILTER BUG").len(), 1);
    let fixed = request(addr(&host), "POST", "/x", &[("x-probe", "cl-fixed")], Some(b"abc")).unwrap();
    assert_eq!(fixed.text(), "echo:ABC!");
}

/// Route cache clearing on header mutation (context.cc `onHeadersModified`, ABI 0.2.1):
/// the router matches the headers as the plugin left them; a rewritten :authority picks
/// another virtual host.
#[test]
fn the_router_matches_the_headers_the_plugin_left() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(
        addr(&host),
        "GET",
        "/x",
        &[("x-probe", "reroute"), ("x-to", "dead")],
        None,
    )
    .unwrap();
    // :path was rewritten to /rewritten, which has its own route.
    assert_eq!(r.text(), "rewritten-route");
    assert!(up.received().is_empty());
}

/// config_impl.cc: no virtual host or route → 404 with details route_not_found, which
/// the plugin sees in on_response_headers; direct_response answers with its body.
#[test]
fn no_route_is_a_404_and_direct_response_answers() {
    let up = Upstream::start();
    let boot = Boot::new(up.addr);
    let yaml = boot.yaml().replace("prefix: / }\n                route:\n                  cluster: upstream\n                  host_rewrite", "prefix: /only-this }\n                route:\n                  cluster: upstream\n                  host_rewrite");
    let host = waygate_host::start(
        &yaml,
        waygate_host::HostOptions {
            concurrency: 1,
            ..Default::default()
        },
    )
    .unwrap();
    let r = request(addr(&host), "GET", "/elsewhere", &[], None).unwrap();
    assert_eq!(r.status, 404);
    assert!(r.body.is_empty());
    assert!(r.header("content-length").is_none_or(|v| v == "0"));
    assert_eq!(
        wait_for(&host, "resp_headers n=1 eos=true status=404 details=route_not_found").len(),
        1,
        "{:?}",
        host.logs()
    );
    let d = request(addr(&host), "GET", "/direct", &[], None).unwrap();
    assert_eq!((d.status, d.text()), (404, r#"{"error":"no route"}"#.to_owned()));
    assert_eq!(d.header("content-type"), Some("text/plain"));
}

/// router.cc: request_headers_to_remove and host_rewrite_literal apply to the upstream
/// request only; the HCM adds x-forwarded-proto and x-request-id before the filters.
#[test]
fn upstream_request_gets_route_header_edits() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(
        addr(&host),
        "POST",
        "/x",
        &[("x-secret", "s"), ("x-keep", "k")],
        Some(b"hi"),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    let got = &up.received()[0];
    assert_eq!(got.header("host"), Some("upstream.example"));
    assert_eq!(got.header("x-secret"), None);
    assert_eq!(got.header("x-keep"), Some("k"));
    assert_eq!(got.header("x-forwarded-proto"), Some("http"));
    assert!(got.header("x-request-id").is_some());
    assert_eq!(r.header("server"), Some("envoy"));
    assert!(r.header("date").is_some());
    assert!(r.header("x-envoy-upstream-service-time").is_some());
}
