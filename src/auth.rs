//! Client authentication (contract §3): the bearer token, its SHA-256 digest,
//! and a lookup that compares against every configured digest without
//! short-circuiting, so timing does not tell how much of a digest matched.

use std::rc::Rc;

use sha2::{Digest, Sha256};

use crate::config::Key;
use crate::errors::{ApiError, ErrorType};

/// Extracts the token from an `Authorization` header value. The scheme is
/// matched case-insensitively and surrounding spaces are ignored.
pub fn bearer_token(header: Option<&[u8]>) -> Result<&[u8], ApiError> {
    let missing = || {
        ApiError::new(
            401,
            ErrorType::Authentication,
            "missing_api_key",
            "Missing API key: send 'Authorization: Bearer <key>'.",
        )
    };
    let value = trim(header.ok_or_else(missing)?);
    let scheme_len = value.iter().position(|b| *b == b' ').unwrap_or(value.len());
    let (scheme, rest) = value.split_at(scheme_len);
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(missing());
    }
    Ok(trim(rest))
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

/// Finds the key whose digest matches `token`.
pub fn authenticate<'k>(keys: &'k [Rc<Key>], token: &[u8]) -> Result<&'k Rc<Key>, ApiError> {
    let invalid = || ApiError::new(401, ErrorType::Authentication, "invalid_api_key", "Invalid API key.");
    if token.is_empty() {
        return Err(invalid());
    }
    let digest: [u8; 32] = Sha256::digest(token).into();
    find_digest(keys, &digest, constant_time_eq).ok_or_else(invalid)
}

/// The key with `digest`, comparing with `eq`: every key is visited and
/// compared, wherever (or whether) the match is, so the time taken does not
/// tell which key matched.
fn find_digest<'k>(
    keys: &'k [Rc<Key>],
    digest: &[u8; 32],
    mut eq: impl FnMut(&[u8; 32], &[u8; 32]) -> bool,
) -> Option<&'k Rc<Key>> {
    let mut found = None;
    for key in keys {
        if eq(&key.sha256, digest) {
            found = Some(key);
        }
    }
    found
}

/// Equality whose running time does not depend on where the inputs differ.
pub fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Whether `key` may use `model` (contract §8: globs; absent means all).
pub fn may_use(key: &Key, model: &str) -> bool {
    match &key.models {
        None => true,
        Some(globs) => globs.iter().any(|g| g.matches(model)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::glob::Glob;

    fn key(token: &str, models: Option<&[&str]>) -> Rc<Key> {
        Rc::new(Key {
            id: format!("id-{token}"),
            sha256: Sha256::digest(token.as_bytes()).into(),
            models: models.map(|m| m.iter().map(|g| Glob::new(g)).collect()),
            requests_per_minute: None,
            tokens_per_minute: None,
        })
    }

    #[test]
    fn scheme_is_case_insensitive_and_spaces_are_ignored() {
        assert_eq!(bearer_token(Some(b"Bearer abc")).unwrap(), b"abc");
        assert_eq!(bearer_token(Some(b"  bearer   abc  ")).unwrap(), b"abc");
        assert_eq!(bearer_token(Some(b"BEARER abc")).unwrap(), b"abc");
        assert_eq!(bearer_token(Some(b"Bearer")).unwrap(), b"");
    }

    #[test]
    fn missing_header_or_other_scheme_is_missing_api_key() {
        assert_eq!(bearer_token(None).unwrap_err().code, "missing_api_key");
        assert_eq!(bearer_token(Some(b"Basic abc")).unwrap_err().code, "missing_api_key");
        assert_eq!(bearer_token(Some(b"")).unwrap_err().code, "missing_api_key");
        assert_eq!(bearer_token(Some(b"Bearerabc")).unwrap_err().code, "missing_api_key");
    }

    #[test]
    fn keys_are_found_by_digest() {
        let keys = [key("one", None), key("two", None)];
        assert_eq!(authenticate(&keys, b"two").unwrap().id, "id-two");
        let e = authenticate(&keys, b"three").unwrap_err();
        assert_eq!((e.status, e.code.as_str()), (401, "invalid_api_key"));
        assert_eq!(authenticate(&keys, b"").unwrap_err().code, "invalid_api_key");
    }

    #[test]
    fn non_utf8_tokens_are_just_unknown() {
        let keys = [key("one", None)];
        assert_eq!(authenticate(&keys, &[0xff, 0xfe]).unwrap_err().code, "invalid_api_key");
    }

    #[test]
    fn model_globs_limit_a_key() {
        let k = key("t", Some(&["openai/*", "anthropic/claude-3-5-haiku"]));
        assert!(may_use(&k, "openai/gpt-4o"));
        assert!(may_use(&k, "anthropic/claude-3-5-haiku"));
        assert!(!may_use(&k, "anthropic/claude-opus"));
        assert!(may_use(&key("u", None), "anything/else"));
    }

    #[test]
    fn key_lookup_compares_every_key_wherever_the_match_is() {
        let keys: Vec<Rc<Key>> = (0..5).map(|i| key(&format!("k{i}"), None)).collect();
        for (token, expect) in [
            ("k0", Some("id-k0")),
            ("k2", Some("id-k2")),
            ("k4", Some("id-k4")),
            ("x", None),
        ] {
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            let mut compared = Vec::new();
            let found = find_digest(&keys, &digest, |a, b| {
                compared.push(*a);
                constant_time_eq(a, b)
            });
            assert_eq!(found.map(|k| k.id.as_str()), expect, "{token}");
            let all: Vec<[u8; 32]> = keys.iter().map(|k| k.sha256).collect();
            assert_eq!(compared, all, "{token}: every key, in order, exactly once");
        }
    }

    #[test]
    fn constant_time_eq_has_no_early_exit() {
        // Differences at the first and at the last byte are both found: the
        // fold reads all 32 bytes (no short-circuiting `==` on slices).
        let a = [7u8; 32];
        for at in 0..32 {
            let mut b = a;
            b[at] ^= 0x80;
            assert!(!constant_time_eq(&a, &b), "difference at {at}");
        }
    }

    #[test]
    fn constant_time_eq_compares_whole_digests() {
        let a = [7u8; 32];
        let mut b = a;
        assert!(constant_time_eq(&a, &b));
        b[31] = 0;
        assert!(!constant_time_eq(&a, &b));
    }
}
