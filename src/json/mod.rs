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

use crate::json::split::string_stop_from;

/// A JSON string's text, borrowed unless it has escapes; `raw` is JSON
/// already checked (by serde or a walk), so the text between the quotes of
/// a string without a backslash is the string.
pub fn json_text(raw: &str) -> Option<Cow<'_, str>> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
        Some(Cow::Borrowed(inner))
    } else {
        unescape(inner).map(Cow::Owned)
    }
}

/// The text of a JSON string's inside with escapes, as serde reads it into
/// a `String` (serde's own reading, through its deserializer, cost as much
/// as the rest of a text delta); `None` where serde would refuse it: an
/// unknown escape, a lone surrogate, a control character or quote.
fn unescape(inner: &str) -> Option<String> {
    let bytes = inner.as_bytes();
    let mut text = String::with_capacity(inner.len());
    let mut at = 0;
    loop {
        let stop = string_stop_from(bytes, at);
        text.push_str(inner.get(at..stop)?);
        match bytes.get(stop) {
            None => return Some(text),
            Some(b'\\') => {}
            Some(_) => return None,
        }
        let escape = *bytes.get(stop.wrapping_add(1))?;
        at = stop.wrapping_add(2);
        let c = match escape {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let unit = crate::json::split::hex4(bytes, at)?;
                at = at.wrapping_add(4);
                if (0xD800..0xDC00).contains(&unit) {
                    // A high surrogate: its low one must follow at once.
                    if bytes.get(at) != Some(&b'\\') || bytes.get(at.wrapping_add(1)) != Some(&b'u') {
                        return None;
                    }
                    let low = crate::json::split::hex4(bytes, at.wrapping_add(2))?;
                    if !(0xDC00..0xE000).contains(&low) {
                        return None;
                    }
                    at = at.wrapping_add(6);
                    char::from_u32(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00))?
                } else {
                    // A lone low surrogate is no char.
                    char::from_u32(unit)?
                }
            }
            _ => return None,
        };
        text.push(c);
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
    fn escaped_strings_read_as_serde_reads_them() {
        let mut insides: Vec<String> = [
            r#"a\"b\\c\/d\be\ff\ng\rh\ti"#,
            r#"\u0041\u00e9\u00E9\u20AC\uFFFF\u0000\u001f"#,
            r#"\ud83d\ude00 pair \uD83D\uDE00"#,
            r#"lone high \ud83d"#,
            r#"lone high then text \ud83dx"#,
            r#"high then high \ud83d\ud83d"#,
            r#"high then escape \ud83d\n"#,
            r#"high then past the lows \ud83d\ue000"#,
            r#"high then below the lows \udbff\udbff"#,
            r#"last pair \udbff\udfff"#,
            r#"lone low \ude00"#,
            r#"short \u12"#,
            r#"bad hex \u12g4"#,
            r#"unknown \x41"#,
            r#"trailing \"#,
            "raw control \n\u{1}",
            r#"quote " inside \n"#,
            "é ✓ 🎉 \\n after non-ASCII",
            r#"\\\\\\"#,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        // Every escape of every code unit below 0x80, and each alone.
        for unit in 0..0x80u32 {
            insides.push(format!("x\\u{unit:04x}y\\u{unit:04X}"));
            if let Some(c) = char::from_u32(unit) {
                insides.push(format!("\\{c}"));
            }
        }
        for inside in &insides {
            let raw = format!("\"{inside}\"");
            let serde = serde_json::from_str::<String>(&raw).ok();
            assert_eq!(unescape(inside), serde, "{raw:?}");
            if inside.contains('\\') {
                assert_eq!(json_text(&raw).map(Cow::into_owned), serde, "{raw:?}");
            }
        }
    }
}
