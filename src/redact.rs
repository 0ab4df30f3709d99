//! What reaches the client or the log from outside: a provider's credential
//! scrubbed from bytes on their way out, and a client's text made one log
//! field ([`log_field`]).
//!
//! A provider may echo the request it got, its credential included: in an
//! error message, an echo model's answer, a value serde quotes back when it
//! refuses an answer. Whatever the filter passes on from a provider goes
//! through [`scrub`] first (streams through
//! [`crate::stream::StreamRewriter::redacting`], which also catches a
//! credential split across deltas).

use std::borrow::Cow;

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
/// answer, so it allocates only when it finds something (or for a secret
/// with characters JSON escapes).
pub fn scrub_from(bytes: &mut Vec<u8>, start: usize, secret: &str) {
    if secret.len() >= MIN_LEN {
        replace_all(bytes, start, secret.as_bytes(), anchor(secret.as_bytes()));
        if let Some(escaped) = escaped_form(secret) {
            replace_all(bytes, start, escaped.as_bytes(), anchor(escaped.as_bytes()));
        }
    }
}

/// Most characters of client text a log field keeps (`X-Title` and
/// `HTTP-Referer` too).
pub const LOG_FIELD_CHARS: usize = 200;

/// Client text (a model name, a field name) as one field of a log line: as it
/// is when plain (letters, digits, `-._/:@+`), else quoted and escaped as
/// Rust's Debug does. Text a client sends can then neither end a field nor
/// the line, so it cannot forge another field or another access line. Past
/// [`LOG_FIELD_CHARS`] it is cut and ends with `…`: a request may be megabytes.
pub fn log_field(text: &str) -> Cow<'_, str> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"-._/:@+".contains(&b);
    let cut = text.char_indices().nth(LOG_FIELD_CHARS).map(|(at, _)| at);
    match cut.and_then(|at| text.get(..at)) {
        Some(kept) => Cow::Owned(format!("{:?}", format!("{kept}…"))),
        None if !text.is_empty() && text.bytes().all(plain) => Cow::Borrowed(text),
        None => Cow::Owned(format!("{text:?}")),
    }
}

/// A credential made ready for scrubbing many outputs (a stream scrubs
/// every callback's): its JSON-escaped form and where each search starts,
/// worked out once.
pub struct Secret {
    plain: String,
    anchor: usize,
    /// The secret as it looks inside a JSON string, when that differs
    /// (usual keys have nothing JSON escapes), and its anchor.
    escaped: Option<(String, usize)>,
}

impl Secret {
    pub fn new(secret: &str) -> Secret {
        Secret {
            plain: secret.to_string(),
            anchor: anchor(secret.as_bytes()),
            escaped: escaped_form(secret).map(|escaped| {
                let at = anchor(escaped.as_bytes());
                (escaped, at)
            }),
        }
    }

    pub fn as_str(&self) -> &str {
        &self.plain
    }

    /// Whether the secret itself occurs in `bytes`.
    pub fn occurs_in(&self, bytes: &[u8]) -> bool {
        find_anchored(bytes, self.plain.as_bytes(), self.anchor, 0).is_some()
    }

    /// Replaces every occurrence after `start`, in either form, with [`REDACTED`].
    pub fn scrub_from(&self, bytes: &mut Vec<u8>, start: usize) {
        if self.plain.len() < MIN_LEN {
            return;
        }
        replace_all(bytes, start, self.plain.as_bytes(), self.anchor);
        if let Some((escaped, at)) = &self.escaped {
            replace_all(bytes, start, escaped.as_bytes(), *at);
        }
    }
}

/// How `secret` looks inside a JSON string when that differs from the
/// secret itself.
fn escaped_form(secret: &str) -> Option<String> {
    if !secret.bytes().any(|b| b == b'"' || b == b'\\' || b < 0x20) {
        return None;
    }
    let quoted = serde_json::to_string(secret).ok()?;
    quoted.get(1..quoted.len().saturating_sub(1)).map(str::to_string)
}

fn replace_all(bytes: &mut Vec<u8>, start: usize, needle: &[u8], anchor: usize) {
    let Some(mut at) = find_anchored(bytes, needle, anchor, start) else {
        return;
    };
    let mut out = Vec::with_capacity(bytes.len());
    let mut from = 0;
    loop {
        out.extend_from_slice(bytes.get(from..at).unwrap_or_default());
        out.extend_from_slice(REDACTED.as_bytes());
        from = at.saturating_add(needle.len());
        match find_anchored(bytes, needle, anchor, from) {
            Some(next) => at = next,
            None => break,
        }
    }
    out.extend_from_slice(bytes.get(from..).unwrap_or_default());
    *bytes = out;
}

/// Bytes to search for, with the byte the search looks for first, chosen
/// once (it costs a pass over the needle).
#[derive(Clone, Copy)]
pub struct Needle<'n> {
    bytes: &'n [u8],
    anchor: usize,
}

impl<'n> Needle<'n> {
    pub fn new(bytes: &'n [u8]) -> Self {
        Needle {
            bytes,
            anchor: anchor(bytes),
        }
    }

    /// The first occurrence in `haystack` at or after `from` (never for an
    /// empty needle).
    pub fn find(&self, haystack: &[u8], from: usize) -> Option<usize> {
        find_anchored(haystack, self.bytes, self.anchor, from)
    }
}

/// Where in `needle` a search starts: its byte least common in the JSON
/// and prose it is searched in. Every byte the word scan stops at costs a
/// comparison; a key's first byte (`s` of `sk-`) is everywhere, an
/// uppercase letter or a digit of it rarely is.
fn anchor(needle: &[u8]) -> usize {
    let mut best = (u8::MAX, 0);
    for (at, b) in needle.iter().enumerate() {
        let common = COMMONNESS.get(usize::from(*b)).copied().unwrap_or(u8::MAX);
        if common < best.0 {
            best = (common, at);
        }
    }
    best.1
}

/// Letters from the rarest in English to the most common.
const LETTERS_BY_FREQUENCY: &[u8; 26] = b"zqxjkvbpygfwmucldrhsnioate";

/// How common each byte is in JSON text, lower for rarer: uppercase
/// letters, then digits and uncommon punctuation, then lowercase letters,
/// then what every JSON object is made of.
// Evaluated at compile time: an index out of range fails the build, never the filter.
#[allow(clippy::indexing_slicing)]
const COMMONNESS: [u8; 256] = {
    let mut table = [50u8; 256];
    let mut b = b'0';
    while b <= b'9' {
        table[b as usize] = 40;
        b += 1;
    }
    let mut rank = 0;
    while rank < 26 {
        let letter = LETTERS_BY_FREQUENCY[rank];
        table[letter.to_ascii_uppercase() as usize] = rank as u8;
        table[letter as usize] = 60 + rank as u8;
        rank += 1;
    }
    let common = b"\":,{}[]_-. \n";
    let mut i = 0;
    while i < common.len() {
        table[common[i] as usize] = 120;
        i += 1;
    }
    table
};

/// [`Needle::find`], looking first for the needle's byte at `anchor`.
fn find_anchored(haystack: &[u8], needle: &[u8], anchor: usize, from: usize) -> Option<usize> {
    let &byte = needle.get(anchor)?;
    let mut start = from.checked_add(anchor)?;
    while let Some(tail) = haystack.get(start..) {
        let hit = start.saturating_add(scan::position_of(tail, byte)?);
        let at = hit.wrapping_sub(anchor);
        if haystack
            .get(at..at.saturating_add(needle.len()))
            .is_some_and(|found| scan::same(found, needle))
        {
            return Some(at);
        }
        start = hit.saturating_add(1);
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

    fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
        Needle::new(needle).find(haystack, from)
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
    fn searches_start_from_the_rarest_byte() {
        assert_eq!(anchor(b"sk-proj-abQ9z"), 10);
        assert_eq!(anchor(b"fake-openai-key"), 2);
        assert_eq!(anchor(b"12-ab"), 0);
        let mut bytes = b"sk-proj-abQ9z sk-proj-abQ9 sk-proj-abQ9z".to_vec();
        Secret::new("sk-proj-abQ9z").scrub_from(&mut bytes, 1);
        assert_eq!(text(&bytes), "sk-proj-abQ9z sk-proj-abQ9 [redacted]");
    }

    #[test]
    fn find_agrees_with_a_plain_search_at_every_position() {
        let hay: Vec<u8> = (0..70u8)
            .map(|i| if i % 9 == 0 { 0xff } else { b'a' + i % 5 })
            .collect();
        // Anchored at their first, a middle and their last byte.
        for needle in [
            &b"\xffa"[..],
            b"cd",
            b"e",
            b"\xff",
            b"zz",
            b"abcde",
            b"cdeab",
            b"dab",
            b"eab\xff",
        ] {
            for from in 0..=hay.len() + 1 {
                let plain = hay
                    .get(from..)
                    .and_then(|t| t.windows(needle.len()).position(|w| w == needle))
                    .map(|p| p + from);
                assert_eq!(find(&hay, needle, from), plain, "{needle:?} from {from}");
            }
        }
    }

    #[test]
    fn client_text_is_one_log_field() {
        assert_eq!(log_field("openai/gpt-4o-mini"), "openai/gpt-4o-mini");
        assert_eq!(
            log_field("models/gemini-2.5-pro:latest"),
            "models/gemini-2.5-pro:latest"
        );
        assert_eq!(
            log_field("fake/ok status=200\nwaygate access key=root"),
            r#""fake/ok status=200\nwaygate access key=root""#
        );
        assert_eq!(log_field("say \"hi\"\u{1b}[31m"), r#""say \"hi\"\u{1b}[31m""#);
        assert_eq!(log_field("caf\u{e9}"), "\"caf\u{e9}\"");
        assert_eq!(log_field(""), "\"\"");
        let long = "m".repeat(LOG_FIELD_CHARS + 1);
        assert_eq!(log_field(&long), format!("\"{}…\"", &long[..LOG_FIELD_CHARS]));
        let exact = "m".repeat(LOG_FIELD_CHARS);
        assert_eq!(log_field(&exact), exact);
    }
}
