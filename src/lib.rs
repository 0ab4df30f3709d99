//! waygate: an OpenAI-compatible LLM gateway as a proxy-wasm HTTP filter.
