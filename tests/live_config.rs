//! The filter's configuration changed while Envoy serves. A control plane delivers it by
//! ECDS, Envoy's extension config discovery (Istio sends the EnvoyFilter's
//! EXTENSION_CONFIG of `envoy/istio/waygate-filter.yaml` this way); here Envoy reads the
//! same resource from a file it watches, and the test replaces that file whole.
//!
//! What an operator rotating keys or credentials relies on: the new configuration serves
//! the requests that follow without a restart; a stream already in flight finishes on the
//! configuration it started with; keys' local limit counts carry over, whether Envoy makes
//! a new plugin in the running VM or, when `vm_config` changed, a new VM; and a
//! configuration the filter refuses is refused whole, with the previous one serving on.
//! With router fallback both roles come by ECDS, as in Istio: while a new `vm_config` has
//! reached one role and not the other, they run in two VMs, and routed requests must fail
//! closed, never carry another request's attempt.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use std::net::TcpStream;
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{DEV_KEY, Gateway, LIMITED_KEY, Response, sha256_hex, test_plugin_config};
use serde_json::{Value, json};
use serde_yaml::Value as Yaml;

/// A key that exists only in the configurations pushed later.
const NEW_KEY: &str = "wg-new-key";

/// One filter of the gateway delivered by ECDS: the file Envoy watches for its resource,
/// and the Wasm filter config it started with.
struct Subscription {
    /// The resource's name, also the prefix of its stats.
    name: &'static str,
    stats: String,
    file: PathBuf,
    wasm: Value,
}

impl Subscription {
    /// Turns `filter` (a Wasm filter in the bootstrap) into a subscription to `name` in
    /// `dir`, whose first resource is the config `filter` had, with `vm_env` as its VM's
    /// `environment_variables.key_values`.
    fn subscribe(
        dir: &std::path::Path,
        name: &'static str,
        kind: &str,
        filter: &mut Yaml,
        vm_env: &Value,
    ) -> Subscription {
        let mut wasm = serde_json::to_value(&filter["typed_config"]).unwrap();
        wasm["config"]["vm_config"]["environment_variables"]["key_values"] = vm_env.clone();
        let file = dir.join(format!("{name}.json"));
        write_resource(&file, name, &wasm, "1");
        *filter = serde_yaml::to_value(json!({"name": name, "config_discovery": {
            "config_source": {"path_config_source": {"path": file.to_string_lossy()},
                "initial_fetch_timeout": "0s", "resource_api_version": "V3"},
            "type_urls": ["type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"]}}))
        .unwrap();
        let stats = format!("extension_config_discovery.{kind}.{name}.");
        Subscription {
            name,
            stats,
            file,
            wasm,
        }
    }

    /// One counter of this subscription's stats.
    fn counter(&self, gw: &Gateway, counter: &str) -> u64 {
        let all = gw.envoy.admin_get("/stats");
        let line = all
            .lines()
            .find_map(|l| {
                l.strip_prefix(self.stats.as_str())
                    .and_then(|l| l.strip_prefix(counter))
            })
            .unwrap_or_else(|| panic!("no {}{counter} in /stats", self.stats));
        line.trim_start_matches(':').trim().parse().unwrap()
    }

    /// Replaces the resource: `plugin` as the filter's configuration (else the first
    /// one's) and `vm_env` as its VM's environment. Waits until Envoy took or refused it;
    /// true when it took it.
    fn push(&self, gw: &Gateway, plugin: Option<&str>, vm_env: &Value, version: &str) -> bool {
        let (took, refused) = (self.counter(gw, "update_success"), self.counter(gw, "update_rejected"));
        let mut wasm = self.wasm.clone();
        if let Some(plugin) = plugin {
            wasm["config"]["configuration"]["value"] = plugin.into();
        }
        wasm["config"]["vm_config"]["environment_variables"]["key_values"] = vm_env.clone();
        write_resource(&self.file, self.name, &wasm, version);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if self.counter(gw, "update_success") > took {
                return true;
            }
            if self.counter(gw, "update_rejected") > refused {
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "Envoy did not read {} version {version}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The run's gateway with both roles of the filter delivered by ECDS, as Istio delivers
/// them: the `waygate` filter, and with router fallback every provider cluster's upstream
/// role (one resource, `waygate_upstream`).
struct Live {
    gw: Gateway,
    dir: PathBuf,
    downstream: Subscription,
    upstream: Option<Subscription>,
    /// The plugin configuration it started with, as the run's bootstrap wrote it (with
    /// router fallback's `"fallback": "router"`): what each push edits.
    plugin: Value,
}

impl Live {
    fn start(plugin: &Value, vm_env: &Value) -> Live {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("waygate-live-config-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (mut downstream, mut upstream) = (None, None);
        let gw = Gateway::with_edit(plugin, |doc| {
            // ECDS needs the node's identity, as any xDS subscription does.
            doc["node"] = serde_yaml::from_str("{id: waygate-test, cluster: waygate-test}").unwrap();
            let filters = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
                ["http_filters"]
                .as_sequence_mut()
                .unwrap();
            let filter = filters.iter_mut().find(|f| f["name"] == "waygate").unwrap();
            downstream = Some(Subscription::subscribe(&dir, "waygate", "http_filter", filter, vm_env));
            for cluster in doc["static_resources"]["clusters"].as_sequence_mut().unwrap() {
                let roles = cluster
                    .get_mut("typed_extension_protocol_options")
                    .and_then(|o| o.get_mut("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"))
                    .and_then(|o| o.get_mut("http_filters"))
                    .and_then(Yaml::as_sequence_mut);
                for role in roles.into_iter().flatten().filter(|f| f["name"] == "waygate_upstream") {
                    upstream = Some(Subscription::subscribe(
                        &dir,
                        "waygate_upstream",
                        "upstream_http_filter",
                        role,
                        vm_env,
                    ));
                }
            }
        });
        let downstream = downstream.unwrap();
        let plugin =
            serde_json::from_str(downstream.wasm["config"]["configuration"]["value"].as_str().unwrap()).unwrap();
        Live {
            gw,
            dir,
            downstream,
            upstream,
            plugin,
        }
    }

    /// Pushes the `waygate` filter's resource ([`Subscription::push`]).
    fn push(&self, plugin: &Value, vm_env: &Value, version: &str) -> bool {
        self.downstream
            .push(&self.gw, Some(&plugin.to_string()), vm_env, version)
    }

    /// Asks `model` with `key` until the answer's status is `status` (Envoy hands an
    /// accepted configuration to its workers right after it counts it); then every
    /// worker must answer so, each asked on its own connection.
    fn settled(&self, key: &str, model: &str, status: u16) -> Response {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut r = ask(&self.gw, key, model);
        while r.status != status && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            r = ask(&self.gw, key, model);
        }
        for _ in 0..6 {
            let again = ask(&self.gw, key, model);
            assert_eq!(again.status, status, "{}", again.text());
        }
        assert_eq!(r.status, status, "{}", r.text());
        r
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Writes the ECDS resource of `wasm` as one file replacing the last: Envoy reads a
/// watched file when one is moved onto it.
fn write_resource(file: &std::path::Path, name: &str, wasm: &Value, version: &str) {
    let resource = json!({"version_info": version, "resources": [{
        "@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": name, "typed_config": wasm}]});
    let next = file.with_extension("next");
    std::fs::write(&next, resource.to_string()).unwrap();
    std::fs::rename(&next, file).unwrap();
}

/// A chat completion with `key` on a new connection, read to its `content-length` (a
/// refusal's connection lingers open for a second: Envoy's delayed close).
fn ask(gw: &Gateway, key: &str, model: &str) -> Response {
    let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let request = format!(
        "POST /api/v1/chat/completions HTTP/1.1\r\nhost: gateway.local\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    common::answer_on(&mut TcpStream::connect(gw.addr).unwrap(), request.as_bytes())
}

/// Waits out the end of a minute, so the limit counts below share one window.
fn away_from_a_minute_boundary() {
    let into = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() % 60;
    if into > 50 {
        std::thread::sleep(Duration::from_secs(61 - into));
    }
}

/// The limited key (five requests a minute) asked once more: the requests its window
/// still has.
fn limited_remaining(gw: &Gateway) -> String {
    let r = ask(gw, LIMITED_KEY, "fake/ok");
    assert_eq!(r.status, 200, "{}", r.text());
    r.header("x-ratelimit-remaining-requests").unwrap().to_string()
}

/// A stream with the dev key that takes seconds, read whole on a thread of its own; it
/// returns once the provider got the request.
fn stream_in_flight(gw: &Gateway) -> JoinHandle<Response> {
    let (addr, before) = (gw.addr, gw.fakes.received().len());
    let handle = std::thread::spawn(move || {
        let body = json!({"model": "fake/long-3000", "stream": true,
            "messages": [{"role": "user", "content": "hi"}]});
        common::chat_to(addr, &body)
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while gw.fakes.received().len() == before {
        assert!(Instant::now() < deadline, "the stream never reached the provider");
        std::thread::sleep(Duration::from_millis(5));
    }
    handle
}

#[test]
fn a_pushed_configuration_serves_the_next_requests_and_carries_limit_counts_over() {
    let mut config = test_plugin_config();
    // A provider whose credential the VM reads from its environment (`vm_config`), first
    // one the provider no longer takes.
    config["providers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"id": "rotating", "api": "openai",
        "cluster": "fake", "authority": "fake.local", "path_prefix": "/v1", "api_key_env": "ROTATING_KEY"}));
    let stale = json!({"ROTATING_KEY": "fake-openai-key-revoked"});
    let live = Live::start(&config, &stale);
    let r = live.settled(DEV_KEY, "rotating/ok", 502);
    assert_eq!(r.header("x-waygate-attempts"), Some("rotating:401"));

    away_from_a_minute_boundary();
    let stream = stream_in_flight(&live.gw);
    assert_eq!(limited_remaining(&live.gw), "4");

    // The dev key revoked and a new key issued: a new plugin in the running VM.
    let mut rotated = live.plugin.clone();
    rotated["keys"][0] = json!({"id": "new", "sha256": sha256_hex(NEW_KEY)});
    assert!(live.push(&rotated, &stale, "2"), "{}", live.gw.logs());
    let r = live.settled(DEV_KEY, "fake/ok", 401);
    r.assert_error(401, "authentication_error", "invalid_api_key", None);
    let r = live.settled(NEW_KEY, "fake/ok", 200);
    assert_eq!(r.json()["choices"][0]["message"]["content"], "Hello from openai fake.");
    assert_eq!(limited_remaining(&live.gw), "3", "the count went on in the new plugin");

    // The provider's credential rotated: the VM's environment changed, so a new VM.
    let fresh = json!({"ROTATING_KEY": "fake-openai-key"});
    assert!(live.push(&rotated, &fresh, "3"), "{}", live.gw.logs());
    if let Some(upstream) = &live.upstream {
        // Router fallback hands a request to its attempts inside one VM: until the upstream
        // role runs in the same new VM, routed requests fail closed, and no provider gets
        // one. Enough of them that the new VM's registry counts past the stream's entry in
        // the old one (a bare count as token once sent the stream's prompt with them).
        let r = live.settled(NEW_KEY, "fake/ok", 502);
        assert_eq!(r.json()["error"]["code"], "upstream_error", "{}", r.text());
        let before = live.gw.fakes.received().len();
        for _ in 0..40 {
            assert_eq!(ask(&live.gw, NEW_KEY, "fake/ok").status, 502);
        }
        assert_eq!(live.gw.fakes.received().len(), before, "a provider got a request");
        let logs = live.gw.logs();
        assert!(logs.contains("the request was prepared in another VM"), "{logs}");
        assert!(upstream.push(&live.gw, None, &fresh, "2"), "{}", live.gw.logs());
    }
    if common::envoy::version() < (1, 40) {
        // Envoy 1.36 keeps a running VM, its environment with it, when only the
        // environment changed: the credential stays the revoked one.
        let r = live.settled(NEW_KEY, "rotating/ok", 502);
        assert_eq!(r.header("x-waygate-attempts"), Some("rotating:401"));
    } else {
        let r = live.settled(NEW_KEY, "rotating/ok", 200);
        assert_eq!(r.header("x-waygate-provider"), Some("rotating"));
        let got = live.gw.fakes.received();
        assert_eq!(
            got.last().unwrap().header("authorization"),
            Some("Bearer fake-openai-key")
        );
    }
    assert_eq!(limited_remaining(&live.gw), "2", "the count went on in the new VM");

    // The stream that began with the revoked key ran through both pushes, whole.
    assert!(
        !stream.is_finished(),
        "the stream ended before the pushes: make it longer"
    );
    let r = stream.join().unwrap();
    assert_eq!(r.status, 200);
    let chunks = r.done_chunks();
    assert_eq!(common::text_of(&chunks, 0).split_whitespace().count(), 3000);
    let stream_log = live.gw.envoy.log_line("model=fake/long-3000");
    assert!(
        stream_log.contains("key=dev ") && stream_log.contains("status=200"),
        "{stream_log}"
    );
}

#[test]
fn a_refused_configuration_leaves_the_previous_one_serving() {
    let env = json!({});
    let live = Live::start(&test_plugin_config(), &env);
    let mut broken = live.plugin.clone();
    broken["keys"][0]["sha256"] = "not-a-digest".into();
    assert!(!live.push(&broken, &env, "2"), "Envoy took a broken configuration");
    let cut_short = live.downstream.push(&live.gw, Some("{\"keys\": ["), &env, "3");
    assert!(!cut_short, "Envoy took a configuration cut short");
    assert_eq!(
        live.downstream.counter(&live.gw, "update_success"),
        1,
        "only the first was taken"
    );
    let logs = live.gw.logs();
    assert!(
        logs.contains("configuration refused: keys[0] (\"dev\"): sha256"),
        "{logs}"
    );
    // Every worker still serves the first configuration.
    let r = live.settled(DEV_KEY, "demo/chat", 200);
    assert_eq!(r.json()["choices"][0]["message"]["content"], "Hello from openai fake.");

    // A good configuration after the refused ones is taken.
    let mut rotated = live.plugin.clone();
    rotated["keys"][0] = json!({"id": "new", "sha256": sha256_hex(NEW_KEY)});
    assert!(live.push(&rotated, &env, "4"), "{}", live.gw.logs());
    live.settled(DEV_KEY, "demo/chat", 401);
    live.settled(NEW_KEY, "demo/chat", 200);
}
