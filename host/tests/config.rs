//! The bootstrap subset: anything outside it is a startup error naming its path.

mod common;

use std::path::Path;

use common::*;
use waygate_host::config;

fn problems(yaml: &str) -> String {
    config::parse(yaml, Path::new(".")).unwrap_err().to_string()
}

#[test]
fn an_unknown_field_is_an_error_naming_its_path() {
    let boot = Boot::new("127.0.0.1:9".parse().unwrap());
    let yaml = boot.yaml().replace(
        "stat_prefix: main",
        "stat_prefix: main\n          use_remote_address: true",
    );
    let text = problems(&yaml);
    assert!(
        text.contains("static_resources.listeners[0].filter_chains[0].filters[0].typed_config"),
        "{text}"
    );
    assert!(text.contains("use_remote_address"), "{text}");
    let yaml = boot.yaml().replace(
        "  - name: upstream\n    type: STATIC",
        "  - name: upstream\n    lb_policy: ROUND_ROBIN\n    type: STATIC",
    );
    let text = problems(&yaml);
    assert!(
        text.contains("static_resources.clusters[0]") && text.contains("lb_policy"),
        "{text}"
    );
}

#[test]
fn unsupported_types_and_unknown_clusters_are_errors() {
    let boot = Boot::new("127.0.0.1:9".parse().unwrap());
    let yaml = boot.yaml().replace("router.v3.Router", "router.v3.Other");
    assert!(problems(&yaml).contains("unsupported HTTP filter type"));
    let yaml = boot
        .yaml()
        .replace("route: { cluster: dead }", "route: { cluster: nope }");
    assert!(problems(&yaml).contains("unknown cluster `nope`"));
    let yaml = boot.yaml().replace("FAIL_CLOSED", "FAIL_RELOAD");
    assert!(problems(&yaml).contains("FAIL_RELOAD"));
}

#[test]
fn the_shipped_local_bootstrap_is_in_the_subset() {
    let yaml = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../envoy/local.yaml")).unwrap();
    let parsed = config::parse(&yaml, Path::new(".")).unwrap();
    assert_eq!(parsed.listeners.len(), 1);
    assert_eq!(parsed.listeners[0].buffer_limit, 8 * 1024 * 1024);
    assert_eq!(parsed.clusters.len(), 4);
    let wasm = parsed.listeners[0].wasm.as_ref().unwrap();
    assert!(wasm.allow_on_headers_stop_iteration);
    assert_eq!(
        wasm.host_env_keys,
        ["OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY"]
    );
}

/// A Struct configuration reaches the plugin as JSON, a StringValue raw (wasm.proto).
#[test]
fn a_struct_configuration_becomes_json() {
    let boot = Boot::new("127.0.0.1:9".parse().unwrap());
    let yaml = boot.yaml().replace(
        "\"@type\": type.googleapis.com/google.protobuf.StringValue\n                  value: '{}'",
        "\"@type\": type.googleapis.com/google.protobuf.Struct\n                  value: { a: 1 }",
    );
    let parsed = config::parse(&yaml, Path::new(".")).unwrap();
    assert_eq!(parsed.listeners[0].wasm.as_ref().unwrap().configuration, br#"{"a":1}"#);
}
