//! The service end to end: a real `redis-server`, the `waygate-ratelimit` binary, and
//! Envoy's RLS protocol through tonic's client, as Envoy would call it.
//!
//! Every test starts its own Redis on an ephemeral port (no persistence, in a temporary
//! directory) and its own service processes, so tests run in parallel without sharing
//! counts. Without `redis-server` the tests fail, saying how to install it.

// Test code: a failed unwrap or index is a failed test, which is the point.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

#[path = "../../tests/common/ratelimit.rs"]
mod processes;

use processes::{Redis, Rls, TempDir};

/// The binary under test.
fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_waygate-ratelimit"))
}

async fn client(rls: &Rls) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{}", rls.addr))
        .await
        .unwrap()
}

// ---- the service ---------------------------------------------------------------------

/// A plugin configuration with these keys: `(id, requests_per_minute, tokens_per_minute)`.
fn plugin_config(keys: &[(&str, Option<u64>, Option<u64>)]) -> String {
    let keys: Vec<String> = keys
        .iter()
        .enumerate()
        .map(|(i, (id, rpm, tpm))| {
            let mut key = format!(r#"{{"id":"{id}","sha256":"{}""#, format!("{:02x}", i + 1).repeat(32));
            if let Some(rpm) = rpm {
                key.push_str(&format!(r#","requests_per_minute":{rpm}"#));
            }
            if let Some(tpm) = tpm {
                key.push_str(&format!(r#","tokens_per_minute":{tpm}"#));
            }
            key.push('}');
            key
        })
        .collect();
    format!(r#"{{"keys":[{}]}}"#, keys.join(","))
}

fn entry(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..RateLimitDescriptor::default()
    }
}

/// The request-time check Envoy makes for a key: count one request, and look at the token
/// budget without spending any (descriptor `hits_addend` 0).
fn at_request(key_id: &str) -> RateLimitRequest {
    let mut tokens = entry("waygate_tokens", key_id);
    tokens.hits_addend = Some(UInt64Value { value: 0 });
    RateLimitRequest {
        domain: "waygate".into(),
        descriptors: vec![entry("waygate_key", key_id), tokens],
        hits_addend: 0,
    }
}

/// One request counted against `waygate_key = key_id`, hits_addend absent (1).
fn one_request(key_id: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "waygate".into(),
        descriptors: vec![entry("waygate_key", key_id)],
        hits_addend: 0,
    }
}

/// The stream-done charge: `tokens` on `waygate_tokens = key_id` via the request's hits_addend.
fn charge(key_id: &str, tokens: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "waygate".into(),
        descriptors: vec![entry("waygate_tokens", key_id)],
        hits_addend: tokens,
    }
}

async fn call(client: &mut RateLimitServiceClient<Channel>, request: RateLimitRequest) -> RateLimitResponse {
    client.should_rate_limit(request).await.unwrap().into_inner()
}

fn remaining(status: &DescriptorStatus) -> u32 {
    assert!(status.current_limit.is_some(), "{status:?}");
    status.limit_remaining
}

// ---- the tests -----------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_gets_exactly_its_requests_per_minute_then_over_limit() {
    let redis = Redis::start();
    let rls = Rls::start(binary(), &redis.url(), &plugin_config(&[("team-a", Some(5), None)]));
    let mut client = client(&rls).await;

    for expected_remaining in (0..5).rev() {
        let r = call(&mut client, one_request("team-a")).await;
        assert_eq!(r.overall_code, OK, "{r:?}");
        let status = &r.statuses[0];
        assert_eq!(status.code, OK);
        assert_eq!(remaining(status), expected_remaining);
        let limit = status.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit),
            ("waygate_key=team-a", 5)
        );
    }
    for _ in 0..3 {
        let r = call(&mut client, one_request("team-a")).await;
        assert_eq!(r.overall_code, OVER, "{r:?}");
        let status = &r.statuses[0];
        assert_eq!((status.code, remaining(status)), (OVER, 0));
        let reset = status.duration_until_reset.unwrap();
        assert!(
            (1..=60).contains(&reset.seconds) || (reset.seconds == 0 && reset.nanos > 0),
            "{reset:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_admitted_exactly_up_to_the_limit() {
    const LIMIT: usize = 20;
    let redis = Redis::start();
    let config = plugin_config(&[
        ("together", Some(LIMIT as u64), None),
        ("crowd", Some(LIMIT as u64), None),
    ]);
    let first = Rls::start(binary(), &redis.url(), &config);
    let second = Rls::start(binary(), &redis.url(), &config);
    let clients = [client(&first).await, client(&second).await];

    // Exactly N at once: all pass, the next one does not.
    let answers = futures_join(
        (0..LIMIT)
            .map(|i| {
                let mut client = clients[i % 2].clone();
                async move { call(&mut client, one_request("together")).await.overall_code }
            })
            .collect(),
    )
    .await;
    assert_eq!(answers.iter().filter(|&&c| c == OK).count(), LIMIT, "{answers:?}");
    let mut client = clients[0].clone();
    assert_eq!(call(&mut client, one_request("together")).await.overall_code, OVER);

    // Three times N at once, through two replicas: exactly N pass.
    let answers = futures_join(
        (0..3 * LIMIT)
            .map(|i| {
                let mut client = clients[i % 2].clone();
                async move { call(&mut client, one_request("crowd")).await.overall_code }
            })
            .collect(),
    )
    .await;
    assert_eq!(answers.iter().filter(|&&c| c == OK).count(), LIMIT, "{answers:?}");
    assert_eq!(answers.iter().filter(|&&c| c == OVER).count(), 2 * LIMIT);
}

/// Runs every future at once on the test's runtime and collects the outputs in order.
async fn futures_join<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut outputs = Vec::with_capacity(handles.len());
    for handle in handles {
        outputs.push(handle.await.unwrap());
    }
    outputs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_one_redis_share_one_count() {
    let redis = Redis::start();
    let config = plugin_config(&[("shared", Some(4), None)]);
    let first = Rls::start(binary(), &redis.url(), &config);
    let second = Rls::start(binary(), &redis.url(), &config);
    let (mut a, mut b) = (client(&first).await, client(&second).await);

    let mut remaining_seen = Vec::new();
    for i in 0..4 {
        let client = if i % 2 == 0 { &mut a } else { &mut b };
        let r = call(client, one_request("shared")).await;
        assert_eq!(r.overall_code, OK, "request {i}: {r:?}");
        remaining_seen.push(remaining(&r.statuses[0]));
    }
    assert_eq!(remaining_seen, [3, 2, 1, 0]);
    assert_eq!(call(&mut a, one_request("shared")).await.overall_code, OVER);
    assert_eq!(call(&mut b, one_request("shared")).await.overall_code, OVER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_budget_is_spent_by_charges_then_refuses() {
    let redis = Redis::start();
    let rls = Rls::start(
        binary(),
        &redis.url(),
        &plugin_config(&[("team-t", Some(100), Some(100))]),
    );
    let mut client = client(&rls).await;

    // Request time: the request counts, the budget is only looked at.
    let r = call(&mut client, at_request("team-t")).await;
    assert_eq!(r.overall_code, OK, "{r:?}");
    assert_eq!(remaining(&r.statuses[0]), 99);
    assert_eq!(remaining(&r.statuses[1]), 100);
    let tokens = r.statuses[1].current_limit.as_ref().unwrap();
    assert_eq!(
        (tokens.name.as_str(), tokens.requests_per_unit),
        ("waygate_tokens=team-t", 100)
    );

    // Stream done: 60 tokens, then 30: within the budget.
    let r = call(&mut client, charge("team-t", 60)).await;
    assert_eq!((r.overall_code, remaining(&r.statuses[0])), (OK, 40));
    let r = call(&mut client, charge("team-t", 30)).await;
    assert_eq!((r.overall_code, remaining(&r.statuses[0])), (OK, 10));
    assert_eq!(call(&mut client, at_request("team-t")).await.overall_code, OK);

    // 25 more: spent anyway (the answer already went out), now over the budget.
    let r = call(&mut client, charge("team-t", 25)).await;
    assert_eq!((r.overall_code, remaining(&r.statuses[0])), (OVER, 0));

    // The next request is refused on tokens, though it has requests left.
    let r = call(&mut client, at_request("team-t")).await;
    assert_eq!(r.overall_code, OVER, "{r:?}");
    assert_eq!(r.statuses[0].code, OK);
    assert_eq!((r.statuses[1].code, remaining(&r.statuses[1])), (OVER, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_has_no_limit_is_always_ok() {
    let redis = Redis::start();
    let rls = Rls::start(
        binary(),
        &redis.url(),
        &plugin_config(&[("unlimited", None, None), ("tokens-only", None, Some(1))]),
    );
    let mut client = client(&rls).await;

    let requests = [
        // A key without limits.
        one_request("unlimited"),
        at_request("unlimited"),
        charge("unlimited", 1_000_000),
        // A key id the configuration does not have.
        one_request("stranger"),
        // A limit kind the key does not have.
        one_request("tokens-only"),
        // Not our entry key, or not a one-entry descriptor.
        RateLimitRequest {
            domain: "waygate".into(),
            descriptors: vec![
                entry("generic_key", "tokens-only"),
                RateLimitDescriptor {
                    entries: vec![
                        Entry {
                            key: "waygate_tokens".into(),
                            value: "tokens-only".into(),
                        },
                        Entry {
                            key: "route".into(),
                            value: "chat".into(),
                        },
                    ],
                    hits_addend: Some(UInt64Value { value: 1000 }),
                    ..RateLimitDescriptor::default()
                },
            ],
            hits_addend: 0,
        },
        // Another domain's descriptors are not ours to count.
        RateLimitRequest {
            domain: "someone-else".into(),
            descriptors: vec![entry("waygate_tokens", "tokens-only")],
            hits_addend: 1000,
        },
        // No descriptors at all.
        RateLimitRequest {
            domain: "waygate".into(),
            descriptors: vec![],
            hits_addend: 0,
        },
    ];
    for round in 0..20 {
        for request in &requests {
            let r = call(&mut client, request.clone()).await;
            assert_eq!(r.overall_code, OK, "round {round}: {request:?} -> {r:?}");
            assert_eq!(r.statuses.len(), request.descriptors.len());
            for status in &r.statuses {
                assert_eq!(status.code, OK);
                assert!(status.current_limit.is_none(), "{status:?}");
            }
        }
    }
    // None of that spent the one token "tokens-only" has.
    let r = call(&mut client, at_request("tokens-only")).await;
    assert_eq!((r.overall_code, remaining(&r.statuses[1])), (OK, 1), "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_going_away_is_a_grpc_unavailable_error_until_it_is_back() {
    let mut redis = Redis::start();
    let rls = Rls::start(binary(), &redis.url(), &plugin_config(&[("team-r", Some(1000), None)]));
    let mut client = client(&rls).await;
    assert_eq!(call(&mut client, one_request("team-r")).await.overall_code, OK);

    redis.stop();
    for _ in 0..3 {
        let started = Instant::now();
        let status = client.should_rate_limit(one_request("team-r")).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(status.message().contains("Redis"), "{status:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "took {:?}",
            started.elapsed()
        );
    }
    // Descriptors that touch no counter still get their answer.
    assert_eq!(call(&mut client, one_request("stranger")).await.overall_code, OK);

    // Back on the same port (a fresh, empty Redis): the service reconnects by itself.
    assert!(redis.spawn(), "redis-server did not restart on port {}", redis.port);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match client.should_rate_limit(one_request("team-r")).await {
            Ok(r) => {
                assert_eq!(r.into_inner().overall_code, OK);
                break;
            }
            Err(status) if Instant::now() < deadline => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("still failing after Redis came back: {status:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_service_starts_before_redis_and_answers_once_it_is_up() {
    // Hold a Redis object without a process: its port is where Redis will appear.
    let mut redis = Redis::start();
    redis.stop();
    let rls = Rls::start(binary(), &redis.url(), &plugin_config(&[("early", Some(2), None)]));
    let mut client = client(&rls).await;
    let status = client.should_rate_limit(one_request("early")).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");

    assert!(redis.spawn(), "redis-server did not start on port {}", redis.port);
    let deadline = Instant::now() + Duration::from_secs(15);
    let first = loop {
        match client.should_rate_limit(one_request("early")).await {
            Ok(r) => break r.into_inner(),
            Err(status) if Instant::now() < deadline => {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => panic!("still failing after Redis came up: {status:?}"),
        }
    };
    assert_eq!((first.overall_code, remaining(&first.statuses[0])), (OK, 1));
}

#[test]
fn a_plugin_configuration_the_filter_refuses_stops_the_service() {
    let dir = TempDir::new("bad-config");
    let path = dir.0.join("plugin-config.json");
    std::fs::write(
        &path,
        r#"{"keys":[{"id":"a","sha256":"nothex","requests_per_minute":0}]}"#,
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_waygate-ratelimit"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--redis",
            "redis://127.0.0.1:1/",
            "--plugin-config",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("sha256 must be 64 lowercase hex digits"), "{stderr}");
    assert!(stderr.contains("requests_per_minute must be at least 1"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn limits_prints_both_formats_from_the_plugin_configuration() {
    let dir = TempDir::new("limits");
    let path = dir.0.join("plugin-config.json");
    std::fs::write(
        &path,
        plugin_config(&[("team-a", Some(600), Some(200_000)), ("free", None, None)]),
    )
    .unwrap();
    let limits = |format: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_waygate-ratelimit"))
            .args(["limits", "--format", format, "--plugin-config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let envoy = limits("envoy-ratelimit");
    assert!(envoy.contains("domain: waygate\n"), "{envoy}");
    assert!(
        envoy.contains("- key: waygate_tokens\n  value: team-a\n  rate_limit:\n    name: waygate_tokens=team-a\n    unit: minute\n    requests_per_unit: 200000\n"),
        "{envoy}"
    );
    assert!(!envoy.contains("free"), "{envoy}");
    let limitador = limits("limitador");
    assert!(limitador.contains("  max_value: 600\n  seconds: 60\n"), "{limitador}");
    assert!(
        limitador.contains("{''waygate_key'': ''team-a''} in descriptors"),
        "{limitador}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_waygate-ratelimit"))
        .args(["limits", "--format", "json", "--plugin-config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
