//! Local replies: deferred, forcing Stop, through the plugin's own response callbacks
//! from the request path, direct from on_response_headers, with Envoy's header rules.

mod common;

use common::*;

/// context.cc `sendLocalResponse` (deferred, `stopNextIteration`) + filter_manager.cc
/// `sendLocalReply` via the filter chain: a reply sent from on_request_headers reaches
/// the plugin's own on_response_headers/body with code_details "" (Rust SDK passes no
/// details); the upstream never sees the request even though the callback returned
/// Continue; utility.cc adds content-length and text/plain.
#[test]
fn a_local_reply_from_the_request_path_passes_through_the_plugin() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "POST", "/x", &[("x-probe", "local-req")], Some(b"body")).unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(r.text(), "denied");
    assert_eq!(r.header("x-local"), Some("1"));
    assert_eq!(r.header("content-type"), Some("text/plain"));
    assert_eq!(r.header("content-length"), Some("6"));
    assert_eq!(r.header("server"), Some("envoy"));
    assert!(up.received().is_empty());
    let seen = wait_for(&host, "resp_headers");
    assert_eq!(seen.len(), 1, "{:?}", host.logs());
    // details is "", which Envoy (cpp-host `copyToPointerSize`) returns as a null
    // pointer: the Rust SDK reads None.
    assert!(seen[0].contains("status=403 details=<none> code=403"), "{seen:?}");
    assert_eq!(lines(&host, "resp_body size=6 eos=true").len(), 1);
    assert!(
        lines(&host, "req_body").is_empty(),
        "no request body callback after a local reply"
    );
}

/// utility.cc: content-type text/plain is added only when the plugin set none.
#[test]
fn a_plugin_content_type_is_kept() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "GET", "/x", &[("x-probe", "local-req-typed")], None).unwrap();
    assert_eq!(r.status, 401);
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(r.text(), "{}");
}

/// utility.cc: an empty body drops both content-length and content-type.
#[test]
fn an_empty_local_reply_drops_length_and_type() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "GET", "/x", &[("x-probe", "local-req-empty")], None).unwrap();
    assert_eq!(r.status, 204);
    assert_eq!(r.header("content-type"), None);
    assert_eq!(r.header("content-length"), None);
}

/// filter_manager.cc `sendLocalReply` when response headers exist but were not sent:
/// `sendDirectLocalReply` replaces the upstream response and skips the encoder filters,
/// so the plugin's on_response_body never sees the reply.
#[test]
fn a_local_reply_from_response_headers_is_direct() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "GET", "/x", &[("x-probe", "local-resp")], None).unwrap();
    assert_eq!(r.status, 418);
    assert_eq!(r.text(), "teapot");
    assert_eq!(r.header("x-direct"), Some("1"));
    assert_eq!(up.received().len(), 1);
    let _ = wait_for(&host, "on_log");
    assert_eq!(lines(&host, "resp_headers").len(), 1, "{:?}", host.logs());
    assert!(lines(&host, "resp_body").is_empty(), "{:?}", host.logs());
}
