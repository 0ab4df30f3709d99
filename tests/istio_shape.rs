//! The Istio install's Envoy shape, run in Envoy. No cluster runs Istio here, so this test
//! plays istiod's part for what the gateway's Envoy gets from `envoy/istio/*.yaml`: a
//! cluster per ServiceEntry named as Istio names it (`outbound|80||<host>`, here at the fake
//! providers, without TLS), the VirtualService's routes, the DestinationRules' retry
//! breakers, and the filter installed as its HTTP_FILTER patch installs it, by ECDS from its
//! EXTENSION_CONFIG, with its plugin configuration as written (but for the fakes' keys and
//! one listed model with a fallback). With
//! `router-fallback.yaml`, its patches are applied as Istio applies them: the route first in
//! the virtual host, the virtual host's merge, each cluster's HttpProtocolOptions replaced
//! whole, and the upstream role's ECDS config (read from a file here, from istiod there).
//!
//! What it shows: with the plugin's clusters named as Istio names them, a fallback reaches
//! the next provider in both modes, and router fallback's patches stream it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod common;

use std::path::Path;

use common::envoy::{self, Envoy};
use common::{DEV_KEY_SHA256, Gateway, stream_chunks, text_of, wasm_path};
use serde_json::{Value, json};
use serde_yaml::Value as Yaml;
use waygate_fakes::FakeProviders;

/// Every object of `envoy/istio/*.yaml`.
fn manifests() -> Vec<Yaml> {
    let dir = common::root().join("envoy/istio");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut objects = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value: Yaml = serde::Deserialize::deserialize(doc).unwrap();
            if !value.is_null() {
                objects.push(value);
            }
        }
    }
    objects
}

/// The patches of the EnvoyFilter named `name`.
fn patches<'a>(objects: &'a [Yaml], name: &str) -> Vec<&'a Yaml> {
    let filter = objects
        .iter()
        .find(|o| o["kind"] == "EnvoyFilter" && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no EnvoyFilter {name} in envoy/istio"));
    filter["spec"]["configPatches"].as_sequence().unwrap().iter().collect()
}

/// The value of the patch applying to `apply_to` whose value or name matches `pick`.
fn patch_value<'a>(patches: &[&'a Yaml], apply_to: &str, pick: impl Fn(&Yaml) -> bool) -> &'a Yaml {
    patches
        .iter()
        .find(|p| p["applyTo"] == apply_to && pick(p))
        .map(|p| &p["patch"]["value"])
        .unwrap_or_else(|| panic!("no {apply_to} patch"))
}

/// A Wasm ECDS config's `config` with the built module for the remote `oci://` one (the
/// Istio agent's part).
fn local_module(config: &Yaml) -> Yaml {
    let mut config = config.clone();
    let code = &mut config["vm_config"]["code"];
    *code = serde_yaml::to_value(json!({"local": {"filename": wasm_path().to_string_lossy()}})).unwrap();
    config
}

/// The Istio plugin configuration for the fakes: their keys for the environment's, the dev
/// key, and `chain/x`, a listed model whose first provider fails.
fn plugin_config(written: &str, fallback: &str) -> String {
    let mut config: Value = serde_json::from_str(written).unwrap();
    assert_eq!(
        config["fallback"], "http_call",
        "the Istio plugin configuration ships as http_call"
    );
    config["fallback"] = json!(fallback);
    config["keys"] = json!([{"id": "dev", "sha256": DEV_KEY_SHA256}]);
    for provider in config["providers"].as_array_mut().unwrap() {
        let key = format!("fake-{}-key", provider["api"].as_str().unwrap());
        let provider = provider.as_object_mut().unwrap();
        provider.remove("api_key_env");
        provider.insert("api_key".into(), json!(key));
    }
    config["models"] = json!([{"id": "chain/x", "endpoints": [
        {"provider": "openai", "model": "status-503"},
        {"provider": "anthropic", "model": "long-5"},
        {"provider": "gemini", "model": "ok"}]},
        {"id": "openai/ok", "endpoints": [{"provider": "openai", "model": "ok"}]}]);
    config.to_string()
}

/// `patch`'s ECDS config source reading `file` instead of istiod's ADS.
fn from_file(patch: &Yaml, file: &Path) -> Value {
    let mut value = serde_json::to_value(patch).unwrap();
    let source = value.pointer_mut("/config_discovery/config_source").unwrap();
    source.as_object_mut().unwrap().remove("ads");
    source["path_config_source"] = json!({"path": file.to_string_lossy()});
    value
}

/// Writes the ECDS resource of an EXTENSION_CONFIG patch's value, `typed_config` as given.
fn write_resource(file: &Path, extension: &Yaml, typed_config: Value) {
    let resource = json!({"resources": [{"@type": "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig",
        "name": extension["name"], "typed_config": typed_config}]});
    std::fs::write(file, resource.to_string()).unwrap();
}

/// The gateway's Envoy as istiod would configure it from the manifests, with router
/// fallback's patches when `router`. Each role's ECDS resource is written in `dir`.
fn istio_bootstrap(objects: &[Yaml], fake_port: u16, router: bool, dir: &Path) -> String {
    let waygate = patches(objects, "waygate");
    // The filter as its HTTP_FILTER patch installs it: by ECDS, from the EXTENSION_CONFIG.
    let wasm = patch_value(&waygate, "EXTENSION_CONFIG", |_| true);
    let mut filter = local_module(&wasm["typed_config"]["config"]);
    let written = filter["configuration"]["value"].as_str().unwrap().to_string();
    filter["configuration"]["value"] = plugin_config(&written, if router { "router" } else { "http_call" }).into();
    let mut typed = serde_json::to_value(&wasm["typed_config"]).unwrap();
    typed["config"] = serde_json::to_value(&filter).unwrap();
    write_resource(&dir.join("waygate.json"), wasm, typed);
    let discovered = patch_value(&waygate, "HTTP_FILTER", |p| p["patch"]["value"]["name"] == wasm["name"]);
    let waygate_filter = from_file(discovered, &dir.join("waygate.json"));
    let buffer_limit = patch_value(&waygate, "LISTENER", |_| true)["per_connection_buffer_limit_bytes"].clone();
    let local_replies = patch_value(&waygate, "NETWORK_FILTER", |_| true)["typed_config"]["local_reply_config"].clone();

    // The VirtualService's routes, as Istio writes them.
    let vs = objects.iter().find(|o| o["kind"] == "VirtualService").unwrap();
    let mut routes: Vec<Value> = Vec::new();
    for http in vs["spec"]["http"].as_sequence().unwrap() {
        let name = http["name"].as_str().unwrap();
        if let Some(direct) = http.get("directResponse") {
            let mut route = json!({"name": name, "match": {"prefix": http["match"][0]["uri"]["prefix"].as_str().unwrap_or("/")},
                "direct_response": {"status": direct["status"].as_u64().unwrap()}});
            if let Some(body) = direct["body"]["string"].as_str() {
                route["direct_response"]["body"] = json!({"inline_string": body});
            }
            routes.push(route);
            continue;
        }
        assert_eq!(
            http["retries"]["attempts"].as_u64(),
            Some(0),
            "{name}: Istio would retry it"
        );
        let (header, exact) = http["match"][0]["headers"].as_mapping().unwrap().iter().next().unwrap();
        let destination = &http["route"][0]["destination"];
        routes.push(json!({"name": name,
            "match": {"prefix": "/", "headers": [{"name": header.as_str().unwrap(), "string_match": {"exact": exact["exact"].as_str().unwrap()}}]},
            "request_headers_to_remove": http["headers"]["request"]["remove"],
            "response_headers_to_remove": http["headers"]["response"]["remove"],
            "route": {"cluster": format!("outbound|{}||{}", destination["port"]["number"].as_u64().unwrap(), destination["host"].as_str().unwrap()),
                "timeout": "0s"}}));
    }
    let mut vhost = json!({"name": "*:8080", "domains": ["*"], "routes": routes});

    // A cluster per ServiceEntry port, with its DestinationRule's retry breakers.
    let mut clusters: Vec<Value> = Vec::new();
    for se in objects.iter().filter(|o| o["kind"] == "ServiceEntry") {
        let host = se["spec"]["hosts"][0].as_str().unwrap();
        for port in se["spec"]["ports"].as_sequence().unwrap() {
            let number = port["number"].as_u64().unwrap();
            let name = format!("outbound|{number}||{host}");
            let dr = objects
                .iter()
                .find(|o| o["kind"] == "DestinationRule" && o["spec"]["host"] == host)
                .unwrap();
            let settings = dr["spec"]["trafficPolicy"]["portLevelSettings"]
                .as_sequence()
                .unwrap()
                .iter()
                .find(|s| s["port"]["number"].as_u64() == Some(number))
                .unwrap();
            let max_retries = settings["connectionPool"]["http"]["maxRetries"].as_u64().unwrap_or(3);
            clusters.push(json!({"name": name, "type": "STRICT_DNS", "connect_timeout": "5s",
                "circuit_breakers": {"thresholds": [{"max_retries": max_retries}]},
                "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [{"endpoint": {"address":
                    {"socket_address": {"address": "127.0.0.1", "port_value": fake_port}}}}]}]}}));
        }
    }

    if router {
        let patches = patches(objects, "waygate-router-fallback");
        // The route first, and the virtual host's merge.
        let route = patch_value(&patches, "HTTP_ROUTE", |p| p["patch"]["operation"] == "INSERT_FIRST");
        vhost["routes"]
            .as_array_mut()
            .unwrap()
            .insert(0, serde_json::to_value(route).unwrap());
        let merge = patch_value(&patches, "VIRTUAL_HOST", |_| true);
        for (k, v) in merge.as_mapping().unwrap() {
            vhost[k.as_str().unwrap()] = serde_json::to_value(v).unwrap();
        }
        // The upstream role's ECDS config, from a file instead of istiod.
        let role = patch_value(&patches, "EXTENSION_CONFIG", |_| true);
        let mut typed = serde_json::to_value(&role["typed_config"]).unwrap();
        typed["config"] = serde_json::to_value(local_module(&role["typed_config"]["config"])).unwrap();
        let ecds = dir.join("upstream.json");
        write_resource(&ecds, role, typed);
        // Each provider cluster's HttpProtocolOptions, replaced whole.
        for patch in patches.iter().filter(|p| p["applyTo"] == "CLUSTER") {
            let m = &patch["match"]["cluster"];
            let name = format!(
                "outbound|{}||{}",
                m["portNumber"].as_u64().unwrap(),
                m["service"].as_str().unwrap()
            );
            let cluster = clusters.iter_mut().find(|c| c["name"] == name.as_str()).unwrap();
            let mut options =
                serde_json::to_value(&patch["patch"]["value"]["typed_extension_protocol_options"]).unwrap();
            for f in options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]["http_filters"]
                .as_array_mut()
                .unwrap()
            {
                if f.get("config_discovery").is_some() {
                    *f = from_file(&serde_yaml::to_value(&*f).unwrap(), &ecds);
                }
            }
            cluster["typed_extension_protocol_options"] = options;
        }
    }

    let bootstrap = json!({
        "node": {"id": "waygate-gateway", "cluster": "waygate-gateway.waygate"},
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{"name": "waygate",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                "per_connection_buffer_limit_bytes": serde_json::to_value(&buffer_limit).unwrap(),
                "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "waygate", "route_config": {"name": "http.8080", "virtual_hosts": [vhost]},
                        "local_reply_config": serde_json::to_value(&local_replies).unwrap(),
                        "http_filters": [
                            waygate_filter,
                            {"name": "envoy.filters.http.router", "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}]}}]}]}],
            "clusters": clusters
        }
    });
    serde_yaml::to_string(&bootstrap).unwrap()
}

fn istio_gateway(router: bool) -> Gateway {
    common::check_wasm_is_fresh();
    let fakes = FakeProviders::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let dir = std::env::temp_dir().join(format!("waygate-istio-{}-{router}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = istio_bootstrap(&manifests(), fakes.addr().port(), router, &dir);
    // Envoy reads the ECDS files once it starts; they may go after that.
    let envoy = Envoy::start(&yaml).unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_dir_all(&dir);
    let addr = envoy.listener("waygate");
    Gateway { envoy, fakes, addr }
}

/// A fallback from an OpenAI-compatible provider's 503 to Anthropic, streamed and not.
fn falls_back_to_the_next_provider(gw: &Gateway) {
    let ask = json!({"model": "chain/x", "messages": [{"role": "user", "content": "hi"}]});
    let r = gw.chat(ask.clone());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-waygate-attempts"), Some("openai:503,anthropic:200"));
    assert_eq!(r.header("x-waygate-provider"), Some("anthropic"));
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "word1 word2 word3 word4 word5"
    );

    let mut stream = ask;
    stream["stream"] = json!(true);
    let r = gw.chat(stream);
    assert_eq!(r.header("x-waygate-attempts"), Some("openai:503,anthropic:200"));
    let (chunks, done) = stream_chunks(&r, "chain/x");
    assert!(done);
    assert_eq!(text_of(&chunks, 0), "word1 word2 word3 word4 word5");
    // Each provider got its own API at its own authority.
    let got = gw.fakes.received();
    let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "/v1/chat/completions",
            "/v1/messages",
            "/v1/chat/completions",
            "/v1/messages"
        ]
    );
    assert_eq!(
        got[1].header("host").or(got[1].header(":authority")),
        Some("api.anthropic.com")
    );
}

/// The VirtualService's provider routes drop what speaks for the provider's
/// origin (the fake OpenAI sends it as OpenAI's CDN does). Asked after the
/// fallback checks, which count what the providers received.
/// A provider's answer cut after its headers: Envoy's own 502, shaped by the
/// NETWORK_FILTER patch's local reply mappers.
fn a_cut_answer_is_the_contracts_502(gw: &Gateway) {
    let r = gw.chat(json!({"model": "openai/cut-3", "messages": [{"role": "user", "content": "hi"}]}));
    r.assert_error(502, "upstream_error", "upstream_error", None);
}

fn origin_headers_stay_behind(gw: &Gateway) {
    let r = gw.chat(json!({"model": "openai/ok", "messages": [{"role": "user", "content": "hi"}]}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("openai-processing-ms"), Some("3"), "{:?}", r.headers);
    assert_eq!(r.header("alt-svc"), None, "{:?}", r.headers);
    assert_eq!(r.header("strict-transport-security"), None, "{:?}", r.headers);
    assert_eq!(r.header("set-cookie"), None, "{:?}", r.headers);
}

#[test]
fn the_istio_shape_falls_back_by_http_call_to_clusters_named_as_istio_names_them() {
    let gw = istio_gateway(false);
    falls_back_to_the_next_provider(&gw);
    origin_headers_stay_behind(&gw);
    a_cut_answer_is_the_contracts_502(&gw);
}

#[test]
fn the_istio_router_fallback_patches_fall_back_through_the_router() {
    if !envoy::supports_router_fallback() {
        eprintln!("skipped: router fallback needs Envoy >= 1.39 (Istio >= 1.31)");
        return;
    }
    let gw = istio_gateway(true);
    falls_back_to_the_next_provider(&gw);
    // The router made the second attempt (an http call carries no attempt count).
    let got = gw.fakes.received();
    assert_eq!(got[1].header("x-envoy-attempt-count"), Some("2"));
    assert_eq!(got[3].header("x-envoy-attempt-count"), Some("2"));
    origin_headers_stay_behind(&gw);
    a_cut_answer_is_the_contracts_502(&gw);
}
