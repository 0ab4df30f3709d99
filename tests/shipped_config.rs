//! What we ship is what we test: `envoy/envoy.yaml` (the bootstrap docker-compose runs,
//! router fallback: Envoy >= 1.39, keys' limits held by the rate limit service) runs in the
//! pinned Envoy with only its addresses changed, beside a real rate limit service that reads
//! its keys from that same file, and a client gets real answers through it, with the
//! access log line Envoy prints. A second test pins the other direction: apart from those
//! addresses and the documented global limits, `envoy/envoy.yaml` is exactly
//! `envoy/local-router.yaml`, so the two cannot drift apart.
//!
//! The substitution ([`for_test`]) is the one documented at the top of `envoy/envoy.yaml`,
//! addresses only:
//! - admin and the listener bind the given addresses (ephemeral ports here);
//! - cluster `fake`'s endpoint (STRICT_DNS `fakes:8081` in compose) becomes the given
//!   address (still STRICT_DNS: an IP address resolves to itself), and so does cluster
//!   `ratelimit`'s (`ratelimit:8081`);
//! - every wasm `vm_config.code.local.filename` (the filter's and its upstream role's)
//!   becomes the given path.
//!
//! Everything else runs as shipped: the HCM `access_log` (the usage line from filter
//! state), the TLS provider clusters, the catch-all routes.

// Test code: a failing unwrap is a failing test (clippy.toml allows these only inside #[test]).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::envoy::Envoy;
use common::ratelimit::{Redis, Rls};
use common::{root, send_raw, wasm_path};
use serde_json::{Value, json};
use serde_yaml::Value as Yaml;
use waygate_fakes::FakeProviders;

const HCM_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";

/// Where `for_test` points the bootstrap.
struct Addresses<'a> {
    admin: (&'a str, u16),
    listener: (&'a str, u16),
    fake: (&'a str, u16),
    /// The rate limit service (cluster `ratelimit`, STRICT_DNS `ratelimit:8081` in compose).
    ratelimit: (&'a str, u16),
    wasm: &'a str,
}

fn load(relative: &str) -> Yaml {
    let path = root().join(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn socket_address(host: &str, port: u16) -> Yaml {
    let mut map = serde_yaml::Mapping::new();
    map.insert("address".into(), host.into());
    map.insert("port_value".into(), u64::from(port).into());
    Yaml::Mapping(map)
}

/// The documented substitution, envoy/envoy.yaml -> a bootstrap the tests run.
fn for_test(mut doc: Yaml, to: &Addresses) -> Yaml {
    doc["admin"]["address"]["socket_address"] = socket_address(to.admin.0, to.admin.1);

    let listeners = doc["static_resources"]["listeners"]
        .as_sequence_mut()
        .expect("listeners");
    assert_eq!(listeners.len(), 1, "one listener");
    let listener = &mut listeners[0];
    listener["address"]["socket_address"] = socket_address(to.listener.0, to.listener.1);
    let mut wasm_filters = 0;
    for chain in listener["filter_chains"].as_sequence_mut().expect("filter_chains") {
        for filter in chain["filters"].as_sequence_mut().expect("filters") {
            let hcm = &mut filter["typed_config"];
            if hcm["@type"] != HCM_TYPE {
                continue;
            }
            for http_filter in hcm["http_filters"].as_sequence_mut().expect("http_filters") {
                let typed = &mut http_filter["typed_config"];
                if typed["@type"] == WASM_TYPE {
                    typed["config"]["vm_config"]["code"]["local"]["filename"] = to.wasm.into();
                    wasm_filters += 1;
                }
            }
        }
    }
    assert_eq!(wasm_filters, 1, "one wasm filter");
    for cluster in doc["static_resources"]["clusters"].as_sequence_mut().expect("clusters") {
        let upstream_filters = cluster
            .get_mut("typed_extension_protocol_options")
            .and_then(|o| o.get_mut("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"))
            .and_then(|o| o.get_mut("http_filters"))
            .and_then(Yaml::as_sequence_mut);
        for filter in upstream_filters.into_iter().flatten() {
            if filter["typed_config"]["@type"] == WASM_TYPE {
                filter["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] = to.wasm.into();
            }
        }
    }

    let mut fakes = 0;
    for cluster in doc["static_resources"]["clusters"].as_sequence_mut().expect("clusters") {
        if cluster["name"] == "ratelimit" {
            cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] =
                socket_address(to.ratelimit.0, to.ratelimit.1);
        }
        if cluster["name"] == "fake" {
            let endpoints = cluster["load_assignment"]["endpoints"]
                .as_sequence_mut()
                .expect("endpoints");
            assert_eq!(endpoints.len(), 1, "one locality for the fake cluster");
            let lb = endpoints[0]["lb_endpoints"].as_sequence_mut().expect("lb_endpoints");
            assert_eq!(lb.len(), 1, "one endpoint for the fake cluster");
            lb[0]["endpoint"]["address"]["socket_address"] = socket_address(to.fake.0, to.fake.1);
            fakes += 1;
        }
    }
    assert_eq!(fakes, 1, "one `fake` cluster");
    doc
}

fn http_filters(doc: &mut Yaml) -> &mut Vec<Yaml> {
    doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
        .as_sequence_mut()
        .expect("http_filters")
}

/// The plugin configuration, parsed and written back in one canonical form, so that two
/// files compare by content rather than by layout; `edit` changes it first.
fn canonical_plugin_config(doc: &mut Yaml, edit: impl FnOnce(&mut Value)) {
    let value = &mut http_filters(doc)[0]["typed_config"]["config"]["configuration"]["value"];
    let mut config: Value = serde_json::from_str(value.as_str().expect("a string configuration")).unwrap();
    edit(&mut config);
    *value = config.to_string().into();
}

/// envoy/envoy.yaml without its documented global limits: the rate limit HTTP filter, the
/// `ratelimit` cluster, `"limits": "global"` and the keys' numbers.
fn without_global_limits(mut doc: Yaml) -> Yaml {
    let filters = http_filters(&mut doc);
    let before = filters.len();
    filters.retain(|f| f["name"] != "envoy.filters.http.ratelimit");
    assert_eq!(filters.len(), before - 1, "one rate limit filter");
    let clusters = doc["static_resources"]["clusters"].as_sequence_mut().expect("clusters");
    let before = clusters.len();
    clusters.retain(|c| c["name"] != "ratelimit");
    assert_eq!(clusters.len(), before - 1, "one `ratelimit` cluster");
    canonical_plugin_config(&mut doc, |config| {
        let object = config.as_object_mut().unwrap();
        assert_eq!(object.remove("limits"), Some(json!("global")));
        for key in object["keys"].as_array_mut().unwrap() {
            let key = key.as_object_mut().unwrap();
            key.remove("requests_per_minute");
            key.remove("tokens_per_minute");
        }
    });
    doc
}

/// Lists every path at which two YAML trees differ (so a failure says where, not just that).
fn differences(path: &str, a: &Yaml, b: &Yaml, out: &mut Vec<String>) {
    match (a, b) {
        (Yaml::Mapping(ma), Yaml::Mapping(mb)) => {
            for (k, va) in ma {
                let key = k.as_str().map_or_else(|| format!("{k:?}"), str::to_owned);
                match mb.get(k) {
                    Some(vb) => differences(&format!("{path}.{key}"), va, vb, out),
                    None => out.push(format!("{path}.{key}: only in envoy/envoy.yaml")),
                }
            }
            for k in mb.keys().filter(|k| !ma.contains_key(*k)) {
                out.push(format!(
                    "{path}.{}: only in envoy/local-router.yaml",
                    k.as_str().unwrap_or("?")
                ));
            }
        }
        (Yaml::Sequence(sa), Yaml::Sequence(sb)) if sa.len() == sb.len() => {
            for (i, (va, vb)) in sa.iter().zip(sb).enumerate() {
                differences(&format!("{path}[{i}]"), va, vb, out);
            }
        }
        _ if a == b => {}
        _ => out.push(format!(
            "{path}: envoy/envoy.yaml has {a:?}, envoy/local-router.yaml has {b:?}"
        )),
    }
}

#[test]
fn shipped_config_differs_from_local_router_yaml_only_in_addresses_and_global_limits() {
    let local = load("envoy/local-router.yaml");
    // envoy/local-router.yaml's own addresses, so the rest must compare equal.
    let admin = &local["admin"]["address"]["socket_address"];
    let listener = &local["static_resources"]["listeners"][0]["address"]["socket_address"];
    let fake = local["static_resources"]["clusters"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "fake")
        .expect("envoy/local-router.yaml has a `fake` cluster");
    let fake = &fake["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"];
    let port = |v: &Yaml| u16::try_from(v["port_value"].as_u64().unwrap()).unwrap();
    let host = |v: &Yaml| v["address"].as_str().unwrap().to_owned();
    let (admin_host, listener_host, fake_host) = (host(admin), host(listener), host(fake));
    let to = Addresses {
        admin: (&admin_host, port(admin)),
        listener: (&listener_host, port(listener)),
        fake: (&fake_host, port(fake)),
        ratelimit: ("ratelimit", 8081),
        wasm: "target/wasm32-wasip1/wasm/waygate.wasm",
    };
    let shipped = without_global_limits(for_test(load("envoy/envoy.yaml"), &to));
    let mut local = local;
    canonical_plugin_config(&mut local, |_| {});
    let mut out = Vec::new();
    differences("", &shipped, &local, &mut out);
    assert!(
        out.is_empty(),
        "envoy/envoy.yaml and envoy/local-router.yaml differ beyond the documented addresses and limits:\n  {}",
        out.join("\n  ")
    );
}

/// envoy/envoy.yaml, substituted, running in Envoy in front of the fake providers.
struct Shipped {
    envoy: Envoy,
    _fakes: FakeProviders,
    _limits: (Redis, Rls),
    addr: SocketAddr,
}

/// `None` (the test is skipped, saying so) on an Envoy without router fallback: compose
/// pins 1.40.
fn start_shipped() -> Option<Shipped> {
    if !common::envoy::supports_router_fallback() {
        eprintln!(
            "skipped: envoy/envoy.yaml needs Envoy >= 1.39, not {:?}",
            common::envoy::version()
        );
        return None;
    }
    common::check_wasm_is_fresh();
    let fakes = FakeProviders::start("127.0.0.1:0".parse().unwrap()).unwrap();
    // The rate limit service as compose runs it: its keys read from envoy/envoy.yaml itself.
    let redis = Redis::start();
    let service = root().join("target/release/waygate-ratelimit");
    let rls = Rls::with_config_file(&service, &redis.url(), &root().join("envoy/envoy.yaml"));
    let wasm = wasm_path().to_string_lossy().into_owned();
    let to = Addresses {
        admin: ("127.0.0.1", 0),
        listener: ("127.0.0.1", 0),
        fake: ("127.0.0.1", fakes.addr().port()),
        ratelimit: ("127.0.0.1", rls.addr.port()),
        wasm: &wasm,
    };
    let yaml = serde_yaml::to_string(&for_test(load("envoy/envoy.yaml"), &to)).unwrap();
    let envoy =
        Envoy::start(&yaml).unwrap_or_else(|e| panic!("Envoy refused envoy/envoy.yaml after the substitution: {e}"));
    let addr = envoy.listener("waygate");
    Some(Shipped {
        envoy,
        _fakes: fakes,
        _limits: (redis, rls),
        addr,
    })
}

/// The access log entry (envoy.yaml's stdout logger) that contains `needle`: entries are
/// written once the stream is over, after the response reached the client.
fn access_line(gw: &Shipped, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lines = gw.envoy.access_log_lines();
        if let Some(line) = lines.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no access log line with `{needle}`; lines:\n{}",
            lines.join("\n")
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn shipped_config_serves_chat_completions_through_the_fake_provider() {
    let Some(gw) = start_shipped() else { return };

    // The README's curl: a provider-prefixed model through the `fake` cluster.
    let r = common::chat_to(
        gw.addr,
        &json!({"model": "fake/ok", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "body: {}", r.text());
    // The dev key's limits, as the rate limit service read them from the same file.
    let limit = r.header("x-ratelimit-limit").unwrap_or_default();
    assert!(limit.contains(r#"600;w=60;name="waygate_key=dev""#), "{limit}");
    assert!(limit.contains(r#"1000000;w=60;name="waygate_tokens=dev""#), "{limit}");
    let v = r.json();
    assert_eq!(v["object"], "chat.completion", "{v}");
    assert_eq!(v["model"], "fake/ok", "{v}");
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .is_some_and(|s| !s.is_empty()),
        "{v}"
    );
    let prompt = v["usage"]["prompt_tokens"].as_u64().expect("usage.prompt_tokens");
    let completion = v["usage"]["completion_tokens"]
        .as_u64()
        .expect("usage.completion_tokens");

    // The access log line carries the usage the filter published as filter state
    // (`%FILTER_STATE(wasm.waygate_*:PLAIN)%`), as Envoy prints it. `%REQ(:PATH)%` reads the
    // request headers as the filter left them: the provider's path.
    let line = access_line(&gw, "\"POST /v1/chat/completions HTTP/1.1\" 200");
    assert!(
        line.contains(&format!(
            "cluster=fake provider=fake prompt_tokens={prompt} completion_tokens={completion}"
        )),
        "{line}"
    );
    assert!(line.starts_with('[') && line.contains("Z] \""), "START_TIME: {line}");
    assert!(line.contains(" 200 - "), "no response flags: {line}");

    // A listed model of the shipped plugin configuration.
    let r = common::chat_to(
        gw.addr,
        &json!({"model": "demo/chat", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "body: {}", r.text());
    assert_eq!(r.json()["model"], "demo/chat");

    // Streaming passes the route's `timeout: 0s` and comes back as OpenAI chunks.
    let r = common::chat_to(
        gw.addr,
        &json!({"model": "fake/ok", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "body: {}", r.text());
    let events = r.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"), "{events:?}");
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk", "{first}");
}

#[test]
fn shipped_config_keeps_its_guards() {
    let Some(gw) = start_shipped() else { return };

    // No key: the filter answers before any route is chosen.
    let r = send_raw(
        gw.addr,
        "POST",
        "/api/v1/chat/completions",
        &[("content-type", b"application/json")],
        br#"{"model":"fake/ok","messages":[{"role":"user","content":"hi"}]}"#,
    );
    r.assert_error(401, "authentication_error", "missing_api_key", None);
    // No answer from a provider: nothing published, so Envoy's `-` for each value.
    let line = access_line(&gw, "\" 401 ");
    assert!(
        line.ends_with("cluster=- provider=- prompt_tokens=- completion_tokens=-"),
        "{line}"
    );

    // A real provider whose key variable is unset is never a candidate.
    let r = common::chat_to(
        gw.addr,
        &json!({"model": "openai/gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 503, "body: {}", r.text());
    assert_eq!(r.json()["error"]["code"], "no_provider_available", "body: {}", r.text());

    // Outside base_path the filter does not answer, and no route reaches a cluster.
    let r = send_raw(gw.addr, "GET", "/v1/models", &[], b"");
    assert_eq!(r.status, 404, "body: {}", r.text());
}
