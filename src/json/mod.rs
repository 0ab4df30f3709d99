//! The JSON toolkit: everything that reads or writes JSON text without
//! serde's derive, in one place.
//!
//! - [`dom`]: JSON text into a `serde_json::Value`, read literally (no key
//!   taken as serde_json's raw-value marker).
//! - [`split`]: an object's members and a walk inside its values, in one
//!   pass, for text serde reads the same way, and its string scan.
//! - [`members`]: an object's top-level members as borrowed raw slices, and
//!   an object writer, for targeted rewrites.
//! - Here: a string's text from its JSON form, escapes included, exactly as
//!   serde reads it; and bytes read through serde's text reader only.

pub mod dom;
pub mod members;
pub mod split;

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

/// A JSON string's text, borrowed unless it has escapes; `raw` is JSON
/// already checked (by serde or a walk), so the text between the quotes of
/// a string without a backslash is the string. One with escapes is read by
/// serde (`None` where serde refuses it: a lone surrogate, say).
pub fn json_text(raw: &str) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
        Some(Cow::Borrowed(inner))
    } else {
        serde_json::from_str::<String>(raw).ok().map(Cow::Owned)
    }
}

/// Deserializes `bytes` through serde's text reader. serde_json compiles
/// every type it reads once per reader, and reading from bytes too put a
/// second copy of serde's parser and of the configuration's and the
/// providers' answer types in the module: reading text only made it 44 KB
/// smaller.
pub fn from_bytes<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, serde_json::Error> {
    serde_json::from_str(utf8(bytes)?)
}

/// `bytes` as text, else an error that says where the bad byte is.
pub fn utf8(bytes: &[u8]) -> Result<&str, serde_json::Error> {
    std::str::from_utf8(bytes)
        .map_err(|e| serde::de::Error::custom(format_args!("invalid UTF-8 at byte {}", e.valid_up_to())))
}

pub fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// A JSON string's text, borrowed unless it has escapes.
pub fn json_str(raw: &RawValue) -> Option<Cow<'_, str>> {
    json_text(raw.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_string_is_borrowed_without_escapes_and_read_by_serde_with_them() {
        assert!(matches!(json_text(r#""plain é""#), Some(Cow::Borrowed("plain é"))));
        assert_eq!(
            json_text(r#""a\nb \"q\" \u00e9 \ud83d\ude00""#).as_deref(),
            Some("a\nb \"q\" é 😀")
        );
        assert_eq!(json_text(r#""lone \ud83d""#), None);
        assert_eq!(json_text("12"), None);
    }
}
