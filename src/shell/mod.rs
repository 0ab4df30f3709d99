//! The proxy-wasm shell: the only module that knows it runs inside Envoy.
//!
//! It reads what each callback may read (and the clock), hands it to the
//! pure core, applies the changes that come back in a fixed order (remove
//! headers, set headers, body, filter state), and returns Pause or Continue.
//! It never branches on a provider and keeps no state of the request but
//! the exchange: the held answer, its cap, the usage to publish and the
//! timings are the core's.
//!
//! It relies on `allow_on_headers_stop_iteration: true` (Envoy ≥ 1.35):
//! request headers are held while the body is read, so the route, path,
//! authority and credential can depend on the body.

mod attempt;
mod host;
mod http;
mod root;
mod routed;

proxy_wasm::main! {{
    // Also installs the SDK's panic hook, so a panic (there should be none)
    // is logged at critical before it traps.
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> { Box::new(root::Root::default()) });
}}
