//! Counts hits per limit window in Redis, each update one atomic script, so every replica
//! of this service sharing one Redis shares one exact count.
//!
//! Why not Limitador's own Redis storage: its check-and-update reads the counters, decides,
//! then increments in a second round trip (its docs say it "sacrifices a bit of accuracy");
//! N+k requests arriving together all read "room left" and all pass. A limit of N must
//! admit exactly N however the requests interleave, so the decision and the increment
//! happen inside one Lua script here, where Redis runs nothing else in between.
//! Limitador still defines the limits and counters ([`limitador::counter::Counter`]).
//!
//! A window is fixed and starts at the first hit counted in it (the key's TTL), as in
//! Limitador: it needs no clock agreement between replicas, only Redis's.

use std::fmt;
use std::time::Duration;

use limitador::counter::Counter;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, Script};

/// Prefix of every key this service writes, so its counters are easy to find and never
/// collide with another tenant of the same Redis.
const KEY_PREFIX: &str = "waygate-ratelimit";

/// One update of one counter. `KEYS[1]` the counter; `ARGV`: window (ms), limit, hits,
/// mode. Returns `{used, ms until the window resets, 1 if allowed else 0}`.
///
/// - `admit`: counts the hits only if they fit (`used + hits <= limit`): a refused
///   request costs nothing, so exactly `limit` requests pass per window.
/// - `charge`: always counts (the tokens were already spent), allowed while
///   `used <= limit` after counting.
/// - `refund`: takes hits back (not below 0).
/// - `peek`: counts nothing; allowed while `used < limit` (room for one more).
///
/// Lua numbers are doubles: exact up to 2^53, above every limit waygate accepts.
const UPDATE_SCRIPT: &str = r"
local key = KEYS[1]
local window_ms = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local hits = tonumber(ARGV[3])
local mode = ARGV[4]
local used = tonumber(redis.call('GET', key) or '0')
local allowed
if mode == 'admit' then
  allowed = used + hits <= limit
  if allowed then used = redis.call('INCRBY', key, hits) end
elseif mode == 'charge' then
  used = redis.call('INCRBY', key, hits)
  allowed = used <= limit
elseif mode == 'refund' then
  if used > 0 then
    used = math.max(0, used - hits)
    redis.call('SET', key, used, 'KEEPTTL')
  end
  allowed = used <= limit
else
  allowed = used < limit
end
-- A counter written without a TTL (just created) starts its window now.
if redis.call('PTTL', key) == -1 then redis.call('PEXPIRE', key, window_ms) end
local ttl = redis.call('PTTL', key)
if ttl < 0 then ttl = window_ms end
if allowed then return {used, ttl, 1} end
return {used, ttl, 0}
";

/// How one call changes a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// Count `hits` only if they fit in the limit.
    Admit(u64),
    /// Count `hits` whatever the limit says.
    Charge(u64),
    /// Take `hits` back.
    Refund(u64),
    /// Count nothing; report whether one more would fit.
    Peek,
}

impl Update {
    fn mode_and_hits(self) -> (&'static str, u64) {
        match self {
            Update::Admit(hits) => ("admit", hits),
            Update::Charge(hits) => ("charge", hits),
            Update::Refund(hits) => ("refund", hits),
            Update::Peek => ("peek", 0),
        }
    }
}

/// A counter after an update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Whether the update was within the limit (see [`Update`] for what that means).
    pub allowed: bool,
    /// Hits counted in the current window.
    pub used: u64,
    /// Until the window ends and the count starts again from zero.
    pub resets_in: Duration,
}

/// Redis could not be asked, or answered something unexpected.
#[derive(Debug)]
pub struct StoreError(String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "counter store (Redis): {}", self.0)
    }
}

impl std::error::Error for StoreError {}

impl From<redis::RedisError> for StoreError {
    fn from(e: redis::RedisError) -> Self {
        StoreError(e.to_string())
    }
}

/// Time limits for Redis. Envoy waits 20 ms for the whole call by default, so anything
/// slower has already failed there; these only stop a dead Redis from holding requests
/// (and their memory) here for long.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Reconnection attempts after a failure, before the waiting calls get the error; the
/// next call starts a new round.
const RECONNECT_RETRIES: usize = 2;

/// The counters, in one Redis shared by every replica.
#[derive(Clone)]
pub struct RedisCounters {
    connection: ConnectionManager,
    update: Script,
}

impl RedisCounters {
    /// Prepares a connection to `url` (`redis://host:port/db`, `rediss://` for TLS is not
    /// built in). Connects lazily, so the service starts, and answers with an error, while
    /// Redis is down; it reconnects by itself when Redis is back.
    pub fn new(url: &str) -> Result<RedisCounters, StoreError> {
        let client = Client::open(url)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(250));
        let connection = ConnectionManager::new_lazy_with_config(client, config)?;
        Ok(RedisCounters {
            connection,
            update: Script::new(UPDATE_SCRIPT),
        })
    }

    /// Applies `update` to `counter`'s current window.
    pub async fn apply(&self, counter: &Counter, update: Update) -> Result<Standing, StoreError> {
        let (mode, hits) = update.mode_and_hits();
        let window_ms = u64::try_from(counter.window().as_millis()).unwrap_or(u64::MAX);
        let mut connection = self.connection.clone();
        let (used, ttl_ms, allowed): (i64, i64, i64) = self
            .update
            .key(counter_key(counter))
            .arg(window_ms)
            .arg(counter.max_value())
            .arg(hits)
            .arg(mode)
            .invoke_async(&mut connection)
            .await?;
        Ok(Standing {
            allowed: allowed == 1,
            used: u64::try_from(used).unwrap_or(0),
            resets_in: Duration::from_millis(u64::try_from(ttl_ms).unwrap_or(0)),
        })
    }
}

/// The Redis key of a counter: `waygate-ratelimit:{<namespace>}:<limit id>:<window>s`,
/// plus the counter's variables if its limit has any (waygate's limits have none). The
/// namespace is a hash tag so a Redis Cluster keeps one domain on one shard.
fn counter_key(counter: &Counter) -> String {
    let limit = counter.limit();
    // Every limit built by this crate has an id; the conditions identify any other.
    let id = limit.id().map_or_else(
        || {
            let mut conditions: Vec<String> = limit.conditions().into_iter().collect();
            conditions.sort();
            conditions.join("&&")
        },
        str::to_owned,
    );
    let mut key = format!(
        "{KEY_PREFIX}:{{{}}}:{id}:{}s",
        counter.namespace().as_ref(),
        limit.seconds()
    );
    for (name, value) in counter.set_variables() {
        key.push_str(&format!(":{name}={value}"));
    }
    key
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use limitador::limit::{Context, Expression, Limit, Predicate};

    use super::*;

    #[test]
    fn counter_keys_name_the_namespace_limit_and_window() {
        let limit = Limit::with_id(
            "waygate_key=team-a",
            "waygate",
            5,
            60,
            Vec::<Predicate>::new(),
            Vec::<Expression>::new(),
        );
        let counter = Counter::new(Arc::new(limit), &Context::default()).unwrap().unwrap();
        assert_eq!(
            counter_key(&counter),
            "waygate-ratelimit:{waygate}:waygate_key=team-a:60s"
        );
    }

    #[test]
    fn updates_name_their_script_mode() {
        assert_eq!(Update::Admit(3).mode_and_hits(), ("admit", 3));
        assert_eq!(Update::Charge(7).mode_and_hits(), ("charge", 7));
        assert_eq!(Update::Refund(2).mode_and_hits(), ("refund", 2));
        assert_eq!(Update::Peek.mode_and_hits(), ("peek", 0));
    }
}
