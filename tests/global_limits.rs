//! Keys' limits across replicas (`"limits": "global"`, docs/operating.md "Limits and stats"): two
//! Envoys, each with the filter and Envoy's rate limit filter as `envoy/envoy.yaml` ships
//! them, share one rate limit service (`waygate-ratelimit`) and one real Redis.
//!
//! Each replica is the run's bootstrap ([`common::bootstrap`]) with the rate limit filter
//! and the `ratelimit` cluster copied from `envoy/envoy.yaml`, so what is tested is what
//! ships, on every tested Envoy.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::ratelimit::{Redis, Rls};
use common::{Gateway, LIMITED_KEY, Response, TOKEN_LIMITED_KEY, chain_config, root};
use serde_json::{Value, json};
use serde_yaml::Value as Yaml;

/// The service binary `make build` (and `cargo test --workspace`) builds.
fn service_binary() -> PathBuf {
    let path = root().join("target/release/waygate-ratelimit");
    assert!(
        path.exists(),
        "{} is missing: run `make test` (it builds the rate limit service)",
        path.display()
    );
    path
}

/// `envoy/envoy.yaml`'s rate limit HTTP filter and its `ratelimit` cluster.
fn shipped_rate_limiting() -> (Yaml, Yaml) {
    let text = std::fs::read_to_string(root().join("envoy/envoy.yaml")).unwrap();
    let doc: Yaml = serde_yaml::from_str(&text).unwrap();
    let filter =
        doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|f| f["name"] == "envoy.filters.http.ratelimit")
            .expect("envoy/envoy.yaml has the rate limit filter")
            .clone();
    let cluster = doc["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "ratelimit")
        .expect("envoy/envoy.yaml has the `ratelimit` cluster")
        .clone();
    (filter, cluster)
}

/// The tests' plugin configuration with limits held by the service.
fn global_config() -> Value {
    // `chain/x`: a provider that answers 503, then one that answers.
    let mut config = chain_config(&[("fake", "status-503"), ("backup", "ok")]);
    config["limits"] = "global".into();
    config
}

/// A gateway replica whose rate limit filter (right after waygate) asks the service at
/// `rls`; `deny` sets `failure_mode_deny`.
fn replica(rls: std::net::SocketAddr, deny: bool) -> Gateway {
    let (mut filter, mut cluster) = shipped_rate_limiting();
    filter["typed_config"]["failure_mode_deny"] = deny.into();
    // A service under load on a 2-core machine answers in well under a second.
    filter["typed_config"]["timeout"] = "1s".into();
    cluster["type"] = "STATIC".into();
    cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] =
        serde_yaml::from_str(&format!("{{address: 127.0.0.1, port_value: {}}}", rls.port())).unwrap();
    Gateway::with_edit(&global_config(), |doc| {
        let listener = &mut doc["static_resources"]["listeners"][0];
        let filters = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
            .as_sequence_mut()
            .unwrap();
        assert_eq!(filters[0]["name"], "waygate");
        filters.insert(1, filter);
        doc["static_resources"]["clusters"]
            .as_sequence_mut()
            .unwrap()
            .push(cluster);
    })
}

/// One Redis, one service reading the tests' keys, two replicas.
struct Replicas {
    redis: Redis,
    rls: Rls,
    gateways: [Gateway; 2],
}

fn replicas(deny: bool) -> Replicas {
    let redis = Redis::start();
    let rls = Rls::start(&service_binary(), &redis.url(), &global_config().to_string());
    let gateways = [replica(rls.addr, deny), replica(rls.addr, deny)];
    Replicas { redis, rls, gateways }
}

fn post_as(gw: &Gateway, key: &str, body: &Value) -> Response {
    gw.post_as(key, &body.to_string())
}

fn ask(stream: bool) -> Value {
    ask_model("fake/ok", stream)
}

fn ask_model(model: &str, stream: bool) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    if stream {
        body["stream"] = true.into();
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

/// The request count a provider saw across both replicas.
fn provider_requests(r: &Replicas) -> usize {
    r.gateways.iter().map(|g| g.fakes.received().len()).sum()
}

fn assert_refused(r: &Response) {
    r.assert_error(429, "rate_limit_error", "rate_limited", None);
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "retry-after {retry}");
}

#[test]
fn a_key_limited_to_n_requests_a_minute_gets_exactly_n_across_two_replicas() {
    let r = replicas(false);
    // 24 at once, alternating replicas; the key has 5 a minute (the service's window
    // starts at its first hit, so no minute boundary can split the test).
    let answers: Vec<Response> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..24)
            .map(|i| {
                let gw = &r.gateways[i % 2];
                s.spawn(move || post_as(gw, LIMITED_KEY, &ask(false)))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let statuses: Vec<u16> = answers.iter().map(|a| a.status).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 5, "{statuses:?}");
    for refused in answers.iter().filter(|a| a.status != 200) {
        assert_refused(refused);
        assert_eq!(refused.header("x-waygate-attempts"), None, "no provider was tried");
    }
    for admitted in answers.iter().filter(|a| a.status == 200) {
        assert_eq!(admitted.json()["object"], "chat.completion");
        assert!(
            admitted.header("x-ratelimit-remaining").is_some(),
            "{:?}",
            admitted.headers
        );
    }
    assert_eq!(provider_requests(&r), 5, "refused requests never reach a provider");
    assert_eq!(
        r.redis
            .get("waygate-ratelimit:{waygate}:waygate_key=limited:60s")
            .as_deref(),
        Some("5")
    );
    // Refusals are the filter's answers: counted in its stats (at on_log, just after the
    // answer) like its own 429s.
    let refused = statuses.len() - 5;
    let deadline = Instant::now() + Duration::from_secs(5);
    while r.gateways.iter().map(refusals_counted).sum::<usize>() != refused {
        assert!(
            Instant::now() < deadline,
            "waygate_errors_rate_limited never reached {refused}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The replica's `waygate_errors_rate_limited` counter (`wasmcustom.waygate.errors.rate_limited`
/// in `/stats`; absent: 0).
fn refusals_counted(gw: &Gateway) -> usize {
    let stats = gw.envoy.admin_get("/stats?filter=errors.rate_limited");
    stats
        .lines()
        .find_map(|l| l.strip_prefix("wasmcustom.waygate.errors.rate_limited: "))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// Waits until the service has charged `expected` tokens to `key_id`: Envoy reports an
/// answer's tokens when its stream is done, just after the client has the answer.
fn wait_for_charge(redis: &Redis, key_id: &str, expected: u64) {
    let counter = format!("waygate-ratelimit:{{waygate}}:waygate_tokens={key_id}:60s");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let charged: u64 = redis.get(&counter).map_or(0, |v| v.parse().unwrap());
        if charged == expected {
            return;
        }
        assert!(
            charged < expected && Instant::now() < deadline,
            "charged {charged} tokens, the answers used {expected}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_token_budget_is_spent_by_the_answers_of_both_replicas_streamed_or_not() {
    let r = replicas(false);
    // The key has 30 tokens a minute; answers alternate replica and streaming, and the
    // first two come from a fallback (the second provider's tokens are charged).
    let mut used = 0;
    let mut answered = 0;
    let mut provider_calls = 0;
    while used < 30 {
        let streamed = answered % 2 == 1;
        let model = if answered < 2 { "chain/x" } else { "fake/ok" };
        let a = post_as(
            &r.gateways[answered % 2],
            TOKEN_LIMITED_KEY,
            &ask_model(model, streamed),
        );
        assert_eq!(a.status, 200, "{}", a.text());
        if answered < 2 {
            assert_eq!(a.header("x-waygate-attempts"), Some("fake:503,backup:200"));
        }
        provider_calls += if answered < 2 { 2 } else { 1 };
        let usage = if streamed {
            a.done_chunks().last().unwrap()["usage"].clone()
        } else {
            a.json()["usage"].clone()
        };
        let total = usage["total_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no usage: {}", a.text()));
        assert!(total > 0);
        used += total;
        answered += 1;
        wait_for_charge(&r.redis, "tokenlimited", used);
    }
    assert!(answered >= 3, "the budget took answers from both replicas");
    for gw in &r.gateways {
        assert_refused(&post_as(gw, TOKEN_LIMITED_KEY, &ask(false)));
        assert_refused(&post_as(gw, TOKEN_LIMITED_KEY, &ask(true)));
    }
    assert_eq!(provider_requests(&r), provider_calls);
    // A refusal spends no tokens.
    wait_for_charge(&r.redis, "tokenlimited", used);
}

#[test]
fn without_the_service_requests_pass_uncounted_or_are_refused_as_configured() {
    // Fail open (as shipped): with Redis gone (the service answers UNAVAILABLE), then the
    // service itself, every request is answered by the provider; none is lost.
    let mut open = replicas(false);
    open.redis.stop();
    for i in 0..6 {
        let a = post_as(&open.gateways[i % 2], LIMITED_KEY, &ask(i % 3 == 0));
        assert_eq!(a.status, 200, "{}", a.text());
    }
    open.rls.stop();
    for i in 0..6 {
        let a = post_as(&open.gateways[i % 2], LIMITED_KEY, &ask(i % 3 == 0));
        assert_eq!(a.status, 200, "{}", a.text());
    }
    assert_eq!(provider_requests(&open), 12);

    // Fail closed: the contract's envelope, not Envoy's empty 500; no provider is asked.
    let mut closed = replicas(true);
    closed.redis.stop();
    for gw in &closed.gateways {
        let a = post_as(gw, LIMITED_KEY, &ask(false));
        a.assert_error(500, "upstream_error", "rate_limit_unavailable", None);
    }
    assert_eq!(provider_requests(&closed), 0);
}
