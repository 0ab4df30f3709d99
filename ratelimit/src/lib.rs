//! waygate-ratelimit: Envoy's rate limit service (RLS) for waygate's per-key limits, so
//! `keys[].requests_per_minute` and `keys[].tokens_per_minute` hold across every Envoy
//! replica instead of within one Envoy process.
//!
//! The parts, each with one job:
//!
//! - [`limits`] reads waygate's plugin configuration (the same JSON Envoy gives the
//!   filter, parsed by the filter's own parser) into the table of limits, keyed by the
//!   descriptor entry each limit answers to.
//! - [`formats`] prints that table for the two off-the-shelf servers a team may run
//!   instead: envoyproxy/ratelimit's YAML and Limitador's limits file.
//! - [`store`] counts hits per one-minute window in Redis, atomically, so replicas of this
//!   service sharing one Redis share one count.
//! - [`service`] answers Envoy's `ShouldRateLimit` calls from the table and the store.
//!
//! The descriptor contract (what Envoy must send) is in the crate's README.md.

pub mod formats;
pub mod limits;
pub mod service;
pub mod store;
