//! Metrics, shared data, properties and the admin listener.

mod common;

use std::io::{Read, Write};

use common::*;

fn admin_get(host: &waygate_host::RunningHost, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(host.admin_addr().unwrap()).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// context.cc `incrementMetric`: a counter takes only offsets > 0, a histogram no
/// increment (BadArgument = 2); stats are process-wide by name; Prometheus strips
/// `wasmcustom.` and maps `.` to `_` (envoy PR #17357).
#[test]
fn metrics_follow_envoy_rules_and_show_in_prometheus() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start_with(waygate_host::HostOptions {
        concurrency: 2,
        ..Default::default()
    });
    for _ in 0..2 {
        let _ = request(addr(&host), "GET", "/x", &[("x-probe", "metrics")], None).unwrap();
    }
    let first = lines(&host, "metrics inc=").join("\n");
    assert!(
        first.contains("metrics inc=0 zero=2 neg=2 hist_inc=2 value=Ok(1)"),
        "{first}"
    );
    // The second request ran on the other worker and still sees the global value.
    assert!(first.contains("value=Ok(2)"), "{first}");
    assert_eq!(host.metric("probe.requests"), Some(2));
    let prom = admin_get(&host, "/stats/prometheus");
    assert!(
        prom.contains("# TYPE probe_requests counter\nprobe_requests{} 2"),
        "{prom}"
    );
    assert!(prom.contains("probe_level{} 7"), "{prom}");
    assert!(prom.contains("probe_sizes_count{} 2"), "{prom}");
    assert!(admin_get(&host, "/ready").contains("200 OK"));
}

/// cpp-host `shared_data.cc`: a set on an absent key ignores the cas; a stale cas is
/// CasMismatch; the right cas wins.
#[test]
fn shared_data_cas_rules() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let _ = request(addr(&host), "GET", "/x", &[("x-probe", "shared")], None).unwrap();
    let line = lines(&host, "shared absent_cas").join("");
    assert!(
        line.contains(r#"absent_cas=None first=true value=Some("v1") stale=false good=true"#),
        "{line}"
    );
}

/// attributes.rst / context.cc `getProperty`: request.* while headers are held, xds.*
/// names, plugin_* names, `response.code_details` via_upstream, set_property as filter
/// state readable later in the stream.
#[test]
fn properties_resolve_like_envoy() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let _ = request(addr(&host), "GET", "/p?q=1", &[("x-probe", "props")], None).unwrap();
    let req = lines(&host, "props headers:").join("");
    assert!(req.contains("path=/p?q=1 method=GET host=test.local route=default cluster=upstream code=<none> plugin=probe root=probe_root vm=probe_vm"), "{req}");
    let resp = lines(&host, "props response:").join("");
    assert!(resp.contains("route=default cluster=upstream state=kept"), "{resp}");
    assert!(wait_for(&host, "resp_headers")[0].contains("details=via_upstream code=200"));
    // request.path resolves again in on_log.
    assert!(wait_for(&host, "on_log")[0].contains("path=/p?q=1"));
}

/// The host's own `/host/guest_time`: one sample per stream that ran the filter, in µs
/// buckets, reset by every read.
#[test]
fn guest_time_counts_each_filtered_stream_once_and_resets_on_read() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    for _ in 0..3 {
        let resp = request(addr(&host), "GET", "/x", &[], None).unwrap();
        assert_eq!(resp.status, 200);
    }
    let read = || {
        let resp = admin_get(&host, "/host/guest_time");
        assert!(resp.contains("content-type: application/json"), "{resp}");
        let body = resp.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
        serde_json::from_str::<serde_json::Value>(&body).unwrap()
    };
    // A stream is counted when it ends, just after the client has its response.
    let (mut streams, mut bucketed) = (0, 0);
    for _ in 0..100 {
        let sample = read();
        streams += sample["streams"].as_u64().unwrap();
        bucketed += sample["us"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_u64().unwrap())
            .sum::<u64>();
        if streams >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!((streams, bucketed), (3, 3));
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(read(), serde_json::json!({"streams": 0, "us": []}));
}
