//! What the filter reads of HTTP headers, Envoy's name / value pairs with
//! lowercase names. Values are read as bytes: a client's (or a provider's)
//! header may hold anything, and nothing here fails on it.

use crate::redact;

/// The first value of header `name` (lowercase) in `pairs`.
pub fn header_in<'p, K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &'p [(K, V)], name: &str) -> Option<&'p [u8]> {
    pairs
        .iter()
        .find(|(k, _)| k.as_ref() == name.as_bytes())
        .map(|(_, v)| v.as_ref())
}

/// The names of the headers in `pairs` that `pick` chooses by name and
/// value, each once, in order; a name that is not UTF-8 is never chosen.
pub fn names_where<K: AsRef<[u8]>, V: AsRef<[u8]>>(
    pairs: &[(K, V)],
    pick: impl Fn(&str, &[u8]) -> bool,
) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for (name, value) in pairs {
        if let Ok(name) = std::str::from_utf8(name.as_ref())
            && pick(name, value.as_ref())
            && !names.iter().any(|n| n == name)
        {
            names.push(name.to_string());
        }
    }
    names
}

/// What the exchange reads of an upstream response's headers.
pub struct ResponseHead {
    /// 0 when there is none (a reset call).
    pub status: u16,
    pub event_stream: bool,
    pub retry_after: Option<String>,
}

impl ResponseHead {
    pub fn read<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> ResponseHead {
        ResponseHead {
            status: header_in(pairs, ":status")
                .and_then(|s| std::str::from_utf8(s).ok())
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            event_stream: header_in(pairs, "content-type")
                .is_some_and(|ct| starts_with_ignore_case(ct, b"text/event-stream")),
            retry_after: header_in(pairs, "retry-after").map(|v| String::from_utf8_lossy(v).trim().to_string()),
        }
    }
}

/// A `content-type` of `application/json`, parameters aside.
pub fn is_json(content_type: Option<&[u8]>) -> bool {
    let Some(ct) = content_type else { return false };
    let media = ct.split(|b| *b == b';').next().unwrap_or_default();
    let media = String::from_utf8_lossy(media);
    media.trim().eq_ignore_ascii_case("application/json")
}

fn starts_with_ignore_case(haystack: &[u8], prefix: &[u8]) -> bool {
    haystack
        .get(..prefix.len())
        .is_some_and(|h| h.eq_ignore_ascii_case(prefix))
}

/// A client-supplied attribution header, made safe for one log line (always
/// quoted there, unlike [`redact::log_field`], as the contract's line shows it).
pub fn printable(raw: &[u8]) -> String {
    String::from_utf8_lossy(raw)
        .chars()
        .filter(|c| !c.is_control())
        .take(redact::LOG_FIELD_CHARS)
        .collect()
}
