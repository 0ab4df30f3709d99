//! waygate: an OpenAI- and Anthropic-compatible LLM gateway as a proxy-wasm
//! HTTP filter.
//!
//! A request's life, and the module that owns each step:
//!
//! 1. `shell` (built for wasm only) receives Envoy's callbacks and is the only code
//!    that talks to the host. It hands what it read to an [`exchange::Exchange`]
//!    and applies what comes back.
//! 2. Request headers (read as bytes, [`headers`]): cluster and `x-waygate-*`
//!    headers are stripped from every request; under `base_path`, [`inbound`]
//!    names the API the client called, [`auth`] checks the key against
//!    SHA-256 digests, then endpoint, method, content type and size.
//! 3. Request body: one internal form, the chat completion, serves every
//!    inbound API: [`inbound`] rewrites a Responses or Messages request as
//!    one; [`request`] validates it (one set of rules over the client's text,
//!    or serde's DOM where its walk is not sure), [`routing`] resolves the
//!    model to candidates, spreads them over priorities, weights and
//!    credentials and applies the routing object, [`health`] puts those with
//!    an open circuit last, [`providers`] translates it for the chosen
//!    provider's API.
//! 4. Response: a stream goes through [`stream`] (one [`sse`] framer, one
//!    provider translator, OpenAI chunks out); a JSON answer or an error is
//!    buffered and reshaped by [`answer`] or into an [`errors::ApiError`];
//!    [`inbound`] then rewrites either into the client's API. Whatever came
//!    from a provider has its credential scrubbed ([`redact`]).
//! 5. The access log line and the stats come from [`exchange::Exchange::on_log`],
//!    out of the [`record`] the exchange kept of the request; every attempt's
//!    outcome goes to [`health`], shared by the workers of one Envoy.
//!
//! Under `base_path`, `GET /models` and `GET /models/{id}` are answered by
//! [`models`] once the key is checked.
//!
//! [`config`] parses the plugin configuration once per VM; [`json`] is the
//! JSON toolkit (a literal DOM reader, one-pass member reads and walks,
//! targeted rewrites).

pub mod answer;
pub mod attempts;
pub mod auth;
pub mod config;
pub mod errors;
pub mod exchange;
pub mod glob;
pub mod headers;
pub mod health;
pub mod ids;
pub mod inbound;
pub mod inflight;
pub mod json;
pub mod limits;
pub mod metrics;
pub mod models;
pub mod providers;
pub mod record;
pub mod redact;
pub mod request;
pub mod routing;
pub mod sse;
pub mod stream;
pub mod usage;

#[cfg(target_arch = "wasm32")]
mod shell;
