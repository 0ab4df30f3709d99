//! waygate-host: a proxy-wasm host on wasmtime that behaves like Envoy, plus fake providers.

pub mod fakes;
