//! What reaches the client or the log from outside: a provider's credential
//! scrubbed from bytes on their way out, and a client's text made one log
//! field ([`log_field`]).
//!
//! A provider may echo the request it got, its credential included: in an
//! error message, an echo model's answer, a value serde quotes back when it
//! refuses an answer. Whatever the filter passes on from a provider goes
//! through [`Secret::scrub_from`] first (streams through
//! [`crate::stream::StreamRewriter::redacting`], which also catches a
//! credential split across deltas).

use std::borrow::Cow;
use std::fmt;

use memchr::memmem::Finder;

/// What a scrubbed credential becomes.
pub const REDACTED: &str = "[redacted]";

/// Shorter credentials are not scrubbed: replacing every occurrence of a
/// few characters would mangle answers (real provider keys are far longer).
pub const MIN_LEN: usize = 8;

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

/// A provider's credential: its text, for the request headers, and its
/// searches (as is and JSON-escaped), built once with the configuration for
/// everything that comes back. Its `Debug` never shows it.
#[derive(Clone)]
pub struct Secret {
    plain: String,
    finder: Finder<'static>,
    /// The secret as it looks inside a JSON string, when that differs
    /// (usual keys have nothing JSON escapes).
    escaped: Option<Finder<'static>>,
}

impl PartialEq for Secret {
    fn eq(&self, other: &Self) -> bool {
        self.plain == other.plain
    }
}

impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Secret {
    pub fn new(secret: &str) -> Secret {
        Secret {
            plain: secret.to_string(),
            finder: Finder::new(secret).into_owned(),
            escaped: escaped_form(secret).map(|escaped| Finder::new(&escaped).into_owned()),
        }
    }

    /// Whether it is scrubbed at all: not when shorter than [`MIN_LEN`].
    pub fn worth_scrubbing(&self) -> bool {
        self.plain.len() >= MIN_LEN
    }

    pub fn as_str(&self) -> &str {
        &self.plain
    }

    /// Whether the secret itself occurs in `bytes`.
    pub fn occurs_in(&self, bytes: &[u8]) -> bool {
        self.finder.find(bytes).is_some()
    }

    /// Replaces every occurrence after `start`, in either form, with
    /// [`REDACTED`]. Runs on every held answer, so it allocates only when it
    /// finds something.
    pub fn scrub_from(&self, bytes: &mut Vec<u8>, start: usize) {
        if !self.worth_scrubbing() {
            return;
        }
        replace_all(bytes, start, &self.finder);
        if let Some(escaped) = &self.escaped {
            replace_all(bytes, start, escaped);
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

fn replace_all(bytes: &mut Vec<u8>, start: usize, needle: &Finder<'_>) {
    let Some(tail) = bytes.get(start..) else { return };
    // Occurrences that do not overlap, in order.
    let mut found = needle.find_iter(tail).map(|at| at.saturating_add(start)).peekable();
    if found.peek().is_none() {
        return;
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut from = 0;
    for at in found {
        out.extend_from_slice(bytes.get(from..at).unwrap_or_default());
        out.extend_from_slice(REDACTED.as_bytes());
        from = at.saturating_add(needle.needle().len());
    }
    out.extend_from_slice(bytes.get(from..).unwrap_or_default());
    *bytes = out;
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
        Secret::new("SECRET-KEY").scrub_from(&mut bytes, 0);
        assert_eq!(text(&bytes), "a[redacted]b[redacted][redacted]c");
        let mut bytes = b"a short key".to_vec();
        Secret::new("short").scrub_from(&mut bytes, 0);
        assert_eq!(text(&bytes), "a short key");
    }

    #[test]
    fn the_json_escaped_form_is_replaced_too() {
        let mut bytes = br#"{"m":"key \"quoted\" key"}"#.to_vec();
        Secret::new(r#"key "quoted" key"#).scrub_from(&mut bytes, 0);
        assert_eq!(text(&bytes), r#"{"m":"[redacted]"}"#);
    }

    #[test]
    fn a_secret_scrubs_only_after_where_it_is_told_to_start() {
        let mut bytes = b"sk-proj-abQ9z sk-proj-abQ9 sk-proj-abQ9zsk-proj-abQ9z".to_vec();
        Secret::new("sk-proj-abQ9z").scrub_from(&mut bytes, 1);
        assert_eq!(text(&bytes), "sk-proj-abQ9z sk-proj-abQ9 [redacted][redacted]");
        let mut bytes = b"aaaaaaaaa".to_vec();
        Secret::new("aaaaaaaa").scrub_from(&mut bytes, 0);
        assert_eq!(text(&bytes), "[redacted]a");
    }

    #[test]
    fn a_secret_never_shows_in_debug() {
        let secret = Secret::new("sk-proj-abQ9z");
        assert_eq!(format!("{secret:?}"), REDACTED);
        assert_eq!(secret, Secret::new("sk-proj-abQ9z"));
        assert_ne!(secret, Secret::new("sk-proj-abQ9y"));
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
