//! Client authentication (contract §3): the bearer token, and the key whose
//! SHA-256 digest is the token's.
//!
//! The lookup is a binary search over the configured digests. Its timing can
//! say how a client's digest compares with configured ones, which is of no
//! use without a SHA-256 preimage; the tokens themselves are never compared.

use std::rc::Rc;

use sha2::{Digest, Sha256};

use crate::config::{Key, Keys};
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

/// Finds the key whose digest is `token`'s.
pub fn authenticate<'k>(keys: &'k Keys, token: &[u8]) -> Result<&'k Rc<Key>, ApiError> {
    let invalid = || ApiError::new(401, ErrorType::Authentication, "invalid_api_key", "Invalid API key.");
    if token.is_empty() {
        return Err(invalid());
    }
    let digest: [u8; 32] = Sha256::digest(token).into();
    keys.find(&digest).ok_or_else(invalid)
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
        let keys = Keys::new(vec![key("one", None), key("two", None)]);
        assert_eq!(authenticate(&keys, b"two").unwrap().id, "id-two");
        let e = authenticate(&keys, b"three").unwrap_err();
        assert_eq!((e.status, e.code.as_str()), (401, "invalid_api_key"));
        assert_eq!(authenticate(&keys, b"").unwrap_err().code, "invalid_api_key");
    }

    #[test]
    fn non_utf8_tokens_are_just_unknown() {
        let keys = Keys::new(vec![key("one", None)]);
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
    fn among_many_keys_each_is_found_and_no_other() {
        let keys = Keys::new((0..1000).map(|i| key(&format!("k{i}"), None)).collect());
        for i in [0, 1, 499, 998, 999] {
            let id = format!("id-k{i}");
            assert_eq!(authenticate(&keys, format!("k{i}").as_bytes()).unwrap().id, id);
        }
        for unknown in ["k1000", "K1", "k01", " k1"] {
            assert_eq!(
                authenticate(&keys, unknown.as_bytes()).unwrap_err().code,
                "invalid_api_key"
            );
        }
    }
}
