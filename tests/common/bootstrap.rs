//! The shipped Envoy bootstraps (`envoy/local.yaml`, `envoy/local-router.yaml`) shaped to
//! run on any machine beside other Envoys: ephemeral ports, the `fake` cluster on the fake
//! providers, and the filter loading a given module and configuration. The integration
//! tests start every gateway from it (`shipped_bootstrap` in `tests/common/mod.rs`), and so
//! does the `envoy` bench, which includes this file by path (`benches/envoy.rs`); each adds
//! its own changes after it.

// Configuration documents are indexed by key, as in both callers: the bootstrap's shape is
// checked when Envoy loads it. Indexing to write adds a missing key, so what a bootstrap
// may lack (an upstream role) is looked up instead.
#![allow(clippy::indexing_slicing)]

use std::net::SocketAddr;
use std::path::Path;

/// `file` under `root` with the admin and the listener on port 0 (the callers read the
/// ports back from the admin) and the `fake` cluster on `fake`'s port. With `filter` (the
/// plugin configuration and the module), the `waygate` filter runs them and every cluster's
/// upstream role (`waygate_upstream`, router fallback only) loads the same module; without,
/// both stay as shipped, for a caller that removes the filter.
pub fn shipped(
    root: &Path,
    file: &str,
    fake: SocketAddr,
    filter: Option<(&serde_json::Value, &Path)>,
) -> Result<serde_yaml::Value, String> {
    let text = std::fs::read_to_string(root.join(file)).map_err(|e| format!("{file}: {e}"))?;
    let mut doc: serde_yaml::Value = serde_yaml::from_str(&text).map_err(|e| format!("{file}: {e}"))?;
    doc["admin"]["address"]["socket_address"]["port_value"] = 0.into();
    let listener = &mut doc["static_resources"]["listeners"][0];
    listener["address"]["socket_address"]["port_value"] = 0.into();
    if let Some((plugin, wasm)) = filter {
        let waygate = listener["filter_chains"][0]["filters"][0]["typed_config"]["http_filters"]
            .as_sequence_mut()
            .and_then(|filters| filters.iter_mut().find(|f| f["name"] == "waygate"))
            .ok_or_else(|| format!("no waygate filter in {file}"))?;
        let config = &mut waygate["typed_config"]["config"];
        config["configuration"]["value"] = serde_json::to_string(plugin).map_err(|e| e.to_string())?.into();
        config["vm_config"]["code"]["local"]["filename"] = wasm.to_string_lossy().into_owned().into();
    }
    let clusters = doc["static_resources"]["clusters"]
        .as_sequence_mut()
        .ok_or_else(|| format!("no clusters in {file}"))?;
    for cluster in clusters.iter_mut() {
        if cluster["name"] == "fake" {
            cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]["port_value"] =
                fake.port().into();
        }
        let Some((_, wasm)) = filter else { continue };
        let upstream_filters = cluster
            .get_mut("typed_extension_protocol_options")
            .and_then(|o| o.get_mut("envoy.extensions.upstreams.http.v3.HttpProtocolOptions"))
            .and_then(|o| o.get_mut("http_filters"))
            .and_then(serde_yaml::Value::as_sequence_mut);
        for role in upstream_filters.into_iter().flatten() {
            if role["name"] == "waygate_upstream" {
                role["typed_config"]["config"]["vm_config"]["code"]["local"]["filename"] =
                    wasm.to_string_lossy().into_owned().into();
            }
        }
    }
    Ok(doc)
}
