//! The filter's stats as Envoy's admin shows them (`/stats/prometheus`),
//! after a scripted run across two worker VMs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use common::{Gateway, chain_config, send_raw};
use serde_json::json;

fn prometheus(gw: &Gateway) -> Vec<(String, u64)> {
    let r = send_raw(gw.envoy.admin(), "GET", "/stats/prometheus", &[], b"");
    assert_eq!(r.status, 200);
    r.text()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (name, value) = l.rsplit_once(' ').unwrap();
            // Histogram sums are decimals; every value the test reads is a count.
            let value: f64 = value.parse().unwrap();
            (name.trim_end_matches("{}").to_string(), value as u64)
        })
        .collect()
}

fn value(stats: &[(String, u64)], name: &str) -> u64 {
    stats
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("{name} missing from {stats:#?}"))
}

#[test]
fn a_scripted_run_shows_in_prometheus_stats() {
    let gw = Gateway::with_config(&chain_config(&[("fake", "status-503"), ("backup", "ok")]));
    let mut completion_tokens = 0;
    for _ in 0..3 {
        let r = gw.chat(json!({"model": "fake/ok", "messages": [{"role": "user", "content": "hi there"}]}));
        assert_eq!(r.status, 200);
        completion_tokens += r.json()["usage"]["completion_tokens"].as_u64().unwrap();
    }
    let r = gw.chat(json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.header("x-waygate-attempts"), Some("fake:503,backup:200"));
    let r = gw.send(
        "POST",
        "/api/v1/chat/completions",
        &[("authorization", "Bearer nope")],
        b"{}",
    );
    assert_eq!(r.status, 401);

    // Counters show at once; histograms only after Envoy's next stats flush (every 5 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let stats = loop {
        let stats = prometheus(&gw);
        let flushed = stats
            .iter()
            .any(|(n, v)| n == "waygate_upstream_duration_ms_fake_count" && *v > 0);
        if flushed || std::time::Instant::now() > deadline {
            break stats;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(value(&stats, "waygate_requests_fake_2xx"), 3);
    assert_eq!(value(&stats, "waygate_requests_backup_2xx"), 1);
    assert_eq!(value(&stats, "waygate_requests_none_4xx"), 1);
    assert_eq!(value(&stats, "waygate_errors_invalid_api_key"), 1);
    assert_eq!(value(&stats, "waygate_attempts_fake_200"), 3);
    assert_eq!(value(&stats, "waygate_attempts_fake_503"), 1);
    assert_eq!(value(&stats, "waygate_attempts_backup_200"), 1);
    assert_eq!(value(&stats, "waygate_fallbacks_backup"), 1);
    assert_eq!(
        value(&stats, "waygate_tokens_completion_fake_fake_ok"),
        completion_tokens
    );
    assert!(value(&stats, "waygate_tokens_key_dev") > completion_tokens);
    assert_eq!(value(&stats, "waygate_upstream_duration_ms_fake_count"), 3);
    if common::router_fallback() {
        // The router's retry reaches the client as the route's own answer does.
        assert_eq!(value(&stats, "waygate_time_to_first_token_ms_backup_count"), 1);
    } else {
        assert!(
            !stats
                .iter()
                .any(|(n, _)| n.starts_with("waygate_time_to_first_token_ms_backup")),
            "a fallback call's answer arrives whole: no first-byte time"
        );
    }
    assert_eq!(value(&stats, "waygate_time_to_first_token_ms_fake_count"), 3);
}

/// Any `<provider>/<model>` is routed, and a provider that serves any model name (as
/// the fake does, and some self-hosted servers) would let a client add two stats to
/// Envoy with each new name it sends: Envoy keeps them until it restarts. Each worker's VM
/// labels its first 256 models by name and the rest `other`, so the stats stay bounded
/// and no token goes uncounted.
#[test]
fn a_client_naming_a_new_model_each_time_adds_bounded_stats_and_loses_no_token() {
    const LABELLED: usize = 256;
    let gw = Gateway::start();
    // One connection is one worker, so one VM's bound.
    let mut stream = std::net::TcpStream::connect(gw.addr).unwrap();
    let mut prompt_tokens = Vec::new();
    for i in 0..LABELLED + 100 {
        let body = json!({"model": format!("fake/model-{i}"), "messages": [{"role": "user", "content": "hi"}]});
        let r = common::chat_on(&mut stream, &body.to_string());
        assert_eq!(r.status, 200, "{}", r.text());
        prompt_tokens.push(r.json()["usage"]["prompt_tokens"].as_u64().unwrap());
    }
    let stats = prometheus(&gw);
    let by_model: Vec<&(String, u64)> = stats
        .iter()
        .filter(|(n, _)| n.starts_with("waygate_tokens_prompt_fake_"))
        .collect();
    assert_eq!(by_model.len(), LABELLED + 1, "{by_model:#?}");
    assert_eq!(
        value(&stats, "waygate_tokens_prompt_fake_fake_model_0"),
        prompt_tokens[0]
    );
    assert_eq!(
        value(&stats, "waygate_tokens_prompt_fake_other"),
        prompt_tokens[LABELLED..].iter().sum::<u64>()
    );
    let counted: u64 = by_model.iter().map(|(_, v)| v).sum();
    assert_eq!(counted, prompt_tokens.iter().sum::<u64>(), "every token counted");
}
