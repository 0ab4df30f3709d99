//! dispatch_http_call as Envoy's `Context::httpCall` (context.cc) runs it.

mod common;

use common::*;

/// The call goes to the cluster, the response is delivered after the callback returned,
/// and a local reply from on_http_call_response answers the paused request.
#[test]
fn an_http_call_answers_the_paused_request() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(
        addr(&host),
        "GET",
        "/x",
        &[
            ("x-probe", "call"),
            ("x-call-cluster", "upstream"),
            ("x-call-path", "/status/201"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-call-status"), Some("201"));
    assert_eq!(r.text(), "status 201");
    let got = up.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].path, "/status/201");
    assert_eq!(got[0].header("host"), Some("called"));
}

/// Resume from the call response: the request goes on with headers changed meanwhile
/// (they are still held, so still writable).
#[test]
fn resume_from_the_call_response_forwards_the_request() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(
        addr(&host),
        "POST",
        "/x",
        &[("x-probe", "call-resume"), ("x-call-cluster", "upstream")],
        Some(b"payload"),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "echo:payload");
    let got = up.received();
    assert_eq!(got.len(), 2);
    let forwarded = got.iter().find(|g| g.path == "/x").unwrap();
    assert_eq!(forwarded.header("x-after-call"), Some("yes"));
}

/// context.cc: an unknown cluster is BadArgument (2); so is a call missing :path
/// (cpp-host `exports.cc http_call`).
#[test]
fn bad_calls_are_bad_argument() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "GET", "/x", &[("x-probe", "call-bad")], None).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(
        lines(&host, "call-bad unknown=2 missing_path=2").len(),
        1,
        "{:?}",
        host.logs()
    );
}

/// A call timeout is an ordinary 504 response (the async client's router), not a
/// failure; a connect failure is an ordinary 503 with the router's text.
#[test]
fn call_timeouts_and_connect_failures_are_responses() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(
        addr(&host),
        "GET",
        "/x",
        &[
            ("x-probe", "call"),
            ("x-call-cluster", "upstream"),
            ("x-call-path", "/slow/2000"),
            ("x-call-timeout", "200"),
        ],
        None,
    )
    .unwrap();
    assert_eq!(r.header("x-call-status"), Some("504"));
    assert_eq!(r.text(), "upstream request timeout");
    let dead = request(
        addr(&host),
        "GET",
        "/x",
        &[("x-probe", "call"), ("x-call-cluster", "dead")],
        None,
    )
    .unwrap();
    assert_eq!(dead.header("x-call-status"), Some("503"));
    assert!(
        dead.text().contains("reset reason: connection failure"),
        "{}",
        dead.text()
    );
}

/// Semantics §1.7 / 3.2: dispatching while the response is paused and answering with
/// send_http_response replaces the upstream response (direct reply).
#[test]
fn a_call_from_paused_response_headers_can_replace_the_response() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(
        addr(&host),
        "GET",
        "/status/500",
        &[("x-probe", "call-resp-pause")],
        None,
    )
    .unwrap();
    assert_eq!(r.status, 299);
    assert_eq!(r.text(), "replaced");
    assert_eq!(r.header("x-from"), Some("call"));
}

/// A call made by the root context (here from on_configure) is delivered to the root.
#[test]
fn a_root_context_call_is_delivered_to_the_root() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.configuration = "root-call:upstream".to_owned();
    let host = boot.start();
    assert!(
        !wait_for(&host, "root call response token=").is_empty(),
        "{:?}",
        host.logs()
    );
}
