//! Answers Envoy's `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` from the
//! limit table and the Redis counters.
//!
//! The contract (also in the crate's README.md):
//!
//! - Domain `waygate`. A request for any other domain is not ours: every descriptor is
//!   answered OK with no limit and nothing is counted.
//! - A descriptor with the single entry `waygate_key = <key id>` is counted against the
//!   key's `requests_per_minute`; one with the single entry `waygate_tokens = <key id>`
//!   against its `tokens_per_minute`. Any other descriptor, or a key id without that
//!   limit configured, is OK with no limit.
//! - Hits: the descriptor's own `hits_addend` when set (0 there means "check only,
//!   count nothing"), else the request's `hits_addend`, where 0 or absent means 1.
//!   `is_negative_hits` gives the hits back.
//! - `waygate_key` admits: a request is counted only when it fits, so exactly N pass per
//!   window. `waygate_tokens` charges: tokens are always counted (they were spent), and
//!   the key is over once the window's total passes the budget.
//! - OVER_LIMIT overall when any descriptor is over. Each limited descriptor's status
//!   carries its limit, what remains and the time to reset, for Envoy's
//!   `x-ratelimit-*` headers.
//! - Redis unreachable: the call fails with gRPC `UNAVAILABLE`, so Envoy's
//!   `failure_mode_deny` decides (false, Envoy's default: the request passes; true: 500).

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus, RateLimit};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use limitador::counter::Counter;
use limitador::limit::Context;
use tonic::{Request, Response, Status};

use crate::limits::{DOMAIN, Entry, Kind, LimitTable};
use crate::store::{RedisCounters, Standing, Update};

/// The `RateLimitService` implementation.
pub struct RateLimiter {
    table: Arc<LimitTable>,
    counters: RedisCounters,
}

impl RateLimiter {
    pub fn new(table: Arc<LimitTable>, counters: RedisCounters) -> RateLimiter {
        RateLimiter { table, counters }
    }

    /// The limit a descriptor selects: exactly one entry, one of ours, with a configured
    /// key id. Longer descriptors are someone else's (envoyproxy/ratelimit also matches
    /// only at the descriptor's full depth).
    fn limit_of(&self, descriptor: &RateLimitDescriptor) -> Option<&Entry> {
        let [entry] = descriptor.entries.as_slice() else {
            return None;
        };
        let kind = Kind::from_entry_key(&entry.key)?;
        self.table.find(kind, &entry.value)
    }

    /// Counts one descriptor and says how it stands.
    async fn check(&self, descriptor: &RateLimitDescriptor, request_hits: u64) -> Result<DescriptorStatus, Status> {
        let Some(entry) = self.limit_of(descriptor) else {
            return Ok(unlimited());
        };
        let update = update_for(entry.limit.kind, descriptor, request_hits);
        // Limitador's counter for the limit: waygate's limits have no variables, so the
        // context is not consulted and each limit has exactly one counter.
        let counter = match Counter::new(Arc::clone(&entry.limitador), &Context::default()) {
            Ok(Some(counter)) => counter,
            // Unreachable for variable-free limits; failing loudly beats not limiting.
            Ok(None) => return Err(Status::internal(format!("{}: no counter", entry.limit.name()))),
            Err(e) => return Err(Status::internal(format!("{}: {e}", entry.limit.name()))),
        };
        let standing = self.counters.apply(&counter, update).await.map_err(|e| {
            // The detail goes to the log; Envoy only needs the code.
            eprintln!("waygate-ratelimit: {e}");
            Status::unavailable("rate limit counters unavailable (Redis); see the service log")
        })?;
        Ok(status(&entry.limit.name(), entry.limit.per_minute, standing))
    }
}

/// How a descriptor changes its counter: see the module doc for the hits rules.
fn update_for(kind: Kind, descriptor: &RateLimitDescriptor, request_hits: u64) -> Update {
    let hits = descriptor.hits_addend.map_or(request_hits, |h| h.value);
    if hits == 0 {
        Update::Peek
    } else if descriptor.is_negative_hits {
        Update::Refund(hits)
    } else {
        match kind {
            Kind::Requests => Update::Admit(hits),
            Kind::Tokens => Update::Charge(hits),
        }
    }
}

/// The request-level hits: proto3 cannot tell 0 from absent, and Envoy documents absent
/// as 1.
fn request_hits(request: &RateLimitRequest) -> u64 {
    match request.hits_addend {
        0 => 1,
        n => u64::from(n),
    }
}

/// A descriptor no limit applies to.
fn unlimited() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok.into(),
        ..DescriptorStatus::default()
    }
}

/// A limited descriptor's status. The proto's counts are 32-bit: larger ones saturate.
fn status(name: &str, limit: u64, standing: Standing) -> DescriptorStatus {
    let to_u32 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    DescriptorStatus {
        code: if standing.allowed { Code::Ok } else { Code::OverLimit }.into(),
        current_limit: Some(RateLimit {
            name: name.to_owned(),
            requests_per_unit: to_u32(limit),
            unit: Unit::Minute.into(),
        }),
        limit_remaining: to_u32(limit.saturating_sub(standing.used)),
        duration_until_reset: Some(ProtoDuration {
            seconds: i64::try_from(standing.resets_in.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(standing.resets_in.subsec_nanos()).unwrap_or(0),
        }),
        quota: None,
    }
}

#[tonic::async_trait]
impl RateLimitService for RateLimiter {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let request = request.into_inner();
        let statuses = if request.domain == DOMAIN {
            let hits = request_hits(&request);
            // One descriptor after the other: a request carries one or two, and the
            // multiplexed Redis connection keeps each round trip short.
            let mut statuses = Vec::with_capacity(request.descriptors.len());
            for descriptor in &request.descriptors {
                statuses.push(self.check(descriptor, hits).await?);
            }
            statuses
        } else {
            request.descriptors.iter().map(|_| unlimited()).collect()
        };
        let over = statuses.iter().any(|s| s.code == i32::from(Code::OverLimit));
        Ok(Response::new(RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok }.into(),
            statuses,
            ..RateLimitResponse::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry as DescriptorEntry;
    use envoy_types::pb::google::protobuf::UInt64Value;

    use super::*;

    fn descriptor(hits: Option<u64>, negative: bool) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: vec![DescriptorEntry {
                key: "waygate_key".into(),
                value: "a".into(),
            }],
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
            ..RateLimitDescriptor::default()
        }
    }

    #[test]
    fn hits_come_from_the_descriptor_then_the_request() {
        let request = |hits_addend| RateLimitRequest {
            hits_addend,
            ..RateLimitRequest::default()
        };
        assert_eq!(request_hits(&request(0)), 1);
        assert_eq!(request_hits(&request(250)), 250);
        assert_eq!(
            update_for(Kind::Requests, &descriptor(None, false), 1),
            Update::Admit(1)
        );
        assert_eq!(
            update_for(Kind::Tokens, &descriptor(None, false), 250),
            Update::Charge(250)
        );
        assert_eq!(
            update_for(Kind::Tokens, &descriptor(Some(40), false), 1),
            Update::Charge(40)
        );
        assert_eq!(update_for(Kind::Tokens, &descriptor(Some(0), false), 1), Update::Peek);
        assert_eq!(
            update_for(Kind::Tokens, &descriptor(Some(9), true), 1),
            Update::Refund(9)
        );
    }

    #[test]
    fn statuses_carry_limit_remaining_and_reset() {
        let s = status(
            "waygate_key=a",
            10,
            Standing {
                allowed: false,
                used: 12,
                resets_in: Duration::from_millis(1500),
            },
        );
        assert_eq!(s.code, i32::from(Code::OverLimit));
        assert_eq!(s.limit_remaining, 0);
        let limit = s.current_limit.unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (10, i32::from(Unit::Minute)));
        assert_eq!(
            s.duration_until_reset.unwrap(),
            ProtoDuration {
                seconds: 1,
                nanos: 500_000_000
            }
        );
        let big = status(
            "waygate_tokens=a",
            u64::from(u32::MAX) + 5,
            Standing {
                allowed: true,
                used: 0,
                resets_in: Duration::ZERO,
            },
        );
        assert_eq!(big.limit_remaining, u32::MAX);
        assert_eq!(unlimited().code, i32::from(Code::Ok));
        assert!(unlimited().current_limit.is_none());
    }
}
