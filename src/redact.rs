//! Scrubbing a provider's credential from bytes on their way to the client
//! or the log.
//!
//! A provider may echo the request it got, its credential included: in an
//! error message, an echo model's answer, a value serde quotes back when it
//! refuses an answer. Whatever the filter passes on from a provider goes
//! through [`scrub`] first (streams through
//! [`crate::stream::StreamRewriter::redacting`], which also catches a
//! credential split across deltas).

use crate::scan;

/// What a scrubbed credential becomes.
pub const REDACTED: &str = "[redacted]";

/// Shorter credentials are not scrubbed: replacing every occurrence of a
/// few characters would mangle answers (real provider keys are far longer).
pub const MIN_LEN: usize = 8;

/// Replaces every occurrence of `secret` in `bytes`, as is and as it looks
/// inside a JSON string, with [`REDACTED`].
pub fn scrub(bytes: &mut Vec<u8>, secret: &str) {
    scrub_from(bytes, 0, secret);
}

/// [`scrub`] on what was appended to `bytes` after `start`. Runs on every
/// answer and stream event, so it allocates only when it finds something.
pub fn scrub_from(bytes: &mut Vec<u8>, start: usize, secret: &str) {
    scrub_forms_from(bytes, start, secret, escaped_form(secret).as_deref());
}

/// How `secret` looks inside a JSON string when that differs from the
/// secret itself (usual keys have nothing JSON escapes).
pub fn escaped_form(secret: &str) -> Option<String> {
    if !secret.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        return None;
    }
    let quoted = serde_json::to_string(secret).ok()?;
    quoted.get(1..quoted.len().saturating_sub(1)).map(str::to_string)
}

/// [`scrub_from`] with the escaped form worked out once ([`escaped_form`]):
/// a stream scrubs every callback's output.
pub fn scrub_forms_from(bytes: &mut Vec<u8>, start: usize, secret: &str, escaped: Option<&str>) {
    if start >= bytes.len() || secret.len() < MIN_LEN {
        return;
    }
    replace_all(bytes, start, secret.as_bytes());
    if let Some(escaped) = escaped {
        replace_all(bytes, start, escaped.as_bytes());
    }
}

fn replace_all(bytes: &mut Vec<u8>, start: usize, needle: &[u8]) {
    let Some(mut at) = find(bytes, needle, start) else {
        return;
    };
    let mut out = Vec::with_capacity(bytes.len());
    let mut from = 0;
    loop {
        out.extend_from_slice(bytes.get(from..at).unwrap_or_default());
        out.extend_from_slice(REDACTED.as_bytes());
        from = at.saturating_add(needle.len());
        match find(bytes, needle, from) {
            Some(next) => at = next,
            None => break,
        }
    }
    out.extend_from_slice(bytes.get(from..).unwrap_or_default());
    *bytes = out;
}

/// The first `needle` in `haystack` at or after `from` (never for an empty
/// needle).
pub fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let mut start = from;
    while let Some(tail) = haystack.get(start..) {
        let offset = scan::position_of(tail, first)?;
        let at = start.saturating_add(offset);
        let after = at.saturating_add(1);
        if haystack.get(after..after.saturating_add(rest.len())) == Some(rest) {
            return Some(at);
        }
        start = after;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    #[test]
    fn every_occurrence_is_replaced_and_short_keys_are_spared() {
        let mut bytes = b"aSECRET-KEYbSECRET-KEYSECRET-KEYc".to_vec();
        scrub(&mut bytes, "SECRET-KEY");
        assert_eq!(text(&bytes), "a[redacted]b[redacted][redacted]c");
        let mut bytes = b"a short key".to_vec();
        scrub(&mut bytes, "short");
        assert_eq!(text(&bytes), "a short key");
    }

    #[test]
    fn the_json_escaped_form_is_replaced_too() {
        let mut bytes = br#"{"m":"key \"quoted\" key"}"#.to_vec();
        scrub(&mut bytes, r#"key "quoted" key"#);
        assert_eq!(text(&bytes), r#"{"m":"[redacted]"}"#);
    }

    #[test]
    fn scrub_from_leaves_what_came_before() {
        let mut bytes = b"SECRET-KEY|SECRET-KEY".to_vec();
        scrub_from(&mut bytes, 10, "SECRET-KEY");
        assert_eq!(text(&bytes), "SECRET-KEY|[redacted]");
    }

    #[test]
    fn find_finds_the_first_match_only() {
        assert_eq!(find(b"abcabd", b"abd", 0), Some(3));
        assert_eq!(find(b"abab", b"ab", 1), Some(2));
        assert_eq!(find(b"ab", b"abc", 0), None);
        assert_eq!(find(b"abc", b"", 0), None);
        assert_eq!(find(b"abc", b"c", 9), None);
    }

    #[test]
    fn find_agrees_with_a_plain_search_at_every_position() {
        let hay: Vec<u8> = (0..70u8)
            .map(|i| if i % 9 == 0 { 0xff } else { b'a' + i % 5 })
            .collect();
        for needle in [&b"\xffa"[..], b"cd", b"e", b"\xff", b"zz", b"abcde"] {
            for from in 0..=hay.len() + 1 {
                let plain = hay
                    .get(from..)
                    .and_then(|t| t.windows(needle.len()).position(|w| w == needle))
                    .map(|p| p + from);
                assert_eq!(find(&hay, needle, from), plain, "{needle:?} from {from}");
            }
        }
    }
}
