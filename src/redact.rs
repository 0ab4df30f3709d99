//! Scrubbing a provider's credential from bytes on their way to the client
//! or the log.
//!
//! A provider may echo the request it got, its credential included: in an
//! error message, an echo model's answer, a value serde quotes back when it
//! refuses an answer. Whatever the filter passes on from a provider goes
//! through [`scrub`] first (streams through
//! [`crate::stream::StreamRewriter::redacting`], which also catches a
//! credential split across deltas).

/// What a scrubbed credential becomes.
pub const REDACTED: &str = "[redacted]";

/// Shorter credentials are not scrubbed: replacing every occurrence of a
/// few characters would mangle answers (real provider keys are far longer).
pub const MIN_LEN: usize = 8;

/// Replaces every occurrence of `secret` in `bytes`, as is and as it looks
/// inside a JSON string, with [`REDACTED`].
pub fn scrub(bytes: &mut Vec<u8>, secret: &str) {
    if secret.len() < MIN_LEN {
        return;
    }
    replace_all(bytes, secret.as_bytes());
    if let Ok(quoted) = serde_json::to_string(secret)
        && let Some(escaped) = quoted.get(1..quoted.len().saturating_sub(1))
        && escaped != secret
    {
        replace_all(bytes, escaped.as_bytes());
    }
}

/// [`scrub`] on what was appended to `bytes` after `start`.
pub fn scrub_from(bytes: &mut Vec<u8>, start: usize, secret: &str) {
    if start >= bytes.len() || secret.len() < MIN_LEN {
        return;
    }
    let mut tail = bytes.split_off(start);
    scrub(&mut tail, secret);
    bytes.append(&mut tail);
}

fn replace_all(bytes: &mut Vec<u8>, needle: &[u8]) {
    let Some(mut at) = find(bytes, needle, 0) else {
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
        let offset = tail.iter().position(|b| *b == first)?;
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
}
