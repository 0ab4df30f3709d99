//! The models endpoints (contract §7): `GET /models` lists the configured
//! models a key may use that can be served, and `GET /models/{id}` gives one
//! of them.

use serde_json::{Value, json};

use crate::auth;
use crate::config::{Config, Key, Model};
use crate::errors::ApiError;
use crate::routing;

/// The listing, for `key` (every model when the gateway has no keys).
pub fn listing(config: &Config, key: Option<&Key>) -> Value {
    json!({"object": "list", "data": entries(config, key)})
}

/// `GET /models/{id}` (`models.retrieve`): the entry the listing has for
/// `id`, sent as is or percent-encoded (the official clients send
/// `demo%2Fchat`); 404 `model_not_found` otherwise.
pub fn entry(config: &Config, key: Option<&Key>, id: &[u8]) -> Result<Value, ApiError> {
    let id = percent_decoded(id);
    listed(config, key)
        .find(|m| m.id.as_bytes() == id.as_slice())
        .and_then(model_entry)
        .ok_or_else(|| routing::model_not_found(&String::from_utf8_lossy(&id)))
}

/// The listing's entries.
fn entries(config: &Config, key: Option<&Key>) -> Vec<Value> {
    listed(config, key).filter_map(model_entry).collect()
}

/// The configured models `key` may use.
fn listed<'c>(config: &'c Config, key: Option<&'c Key>) -> impl Iterator<Item = &'c Model> {
    config
        .models
        .iter()
        .filter(move |m| key.is_none_or(|k| auth::may_use(k, &m.id)))
}

/// A model's entry, `None` when it cannot be served: only the endpoints
/// that can be tried are listed, and a provider without its credential
/// never is (contract §5), so a model none of whose providers has one is
/// not listed.
fn model_entry(m: &Model) -> Option<Value> {
    // A pattern names no one model.
    if m.pattern.is_some() {
        return None;
    }
    let providers: Vec<&str> = m
        .endpoints
        .iter()
        .filter(|e| e.provider.credential.is_some())
        .map(|e| e.provider.id.as_str())
        .collect();
    let owner = m.id.split('/').next().unwrap_or_default();
    (!providers.is_empty())
        .then(|| json!({"id": m.id, "object": "model", "created": 0, "owned_by": owner, "providers": providers}))
}

/// A path segment with its `%XX` escapes decoded (a `%` not followed by two
/// hex digits stays as it is).
fn percent_decoded(segment: &[u8]) -> Vec<u8> {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = Vec::with_capacity(segment.len());
    let mut rest = segment;
    while let Some((&b, tail)) = rest.split_first() {
        if let (b'%', [hi, lo, after @ ..]) = (b, tail)
            && let (Some(hi), Some(lo)) = (hex(*hi), hex(*lo))
        {
            out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'%'));
            rest = after;
            continue;
        }
        out.push(b);
        rest = tail;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_decoded() {
        for (segment, decoded) in [
            ("demo%2Fchat", "demo/chat"),
            ("demo%2fchat", "demo/chat"),
            ("a%20b%25", "a b%"),
            ("plain", "plain"),
            ("bad%2", "bad%2"),
            ("bad%zz", "bad%zz"),
            ("%", "%"),
            ("%e2%9c%93", "✓"),
        ] {
            assert_eq!(percent_decoded(segment.as_bytes()), decoded.as_bytes(), "{segment}");
        }
    }
}
