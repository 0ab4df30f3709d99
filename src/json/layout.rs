//! Recognising a JSON text laid out as an earlier one with another string in
//! one place: a provider's stream repeats its text deltas byte for byte but
//! for the text itself, and reading one with serde or a walk costs far more
//! than comparing it with the last.
//!
//! It is sound because JSON is context-free: a string token can stand where
//! another stood and the text still reads the same way, member for member,
//! but for that string. A [`Layout`] keeps the bytes before the string and
//! after it; [`Layout::read`] checks that a text has those bytes around a
//! valid string token, and answers nothing otherwise (the caller then reads
//! the text as before and may keep its layout for the next).

use crate::json::split::{string_token_end_escaped, whitespace_from};
use crate::scan;

/// The bytes around one string token of a JSON text.
pub struct Layout {
    before: String,
    after: String,
    /// `after` is only closing brackets and whitespace: it matches with any
    /// whitespace between the brackets (Anthropic pads its events with a
    /// different run of spaces each time). Whitespace in a string or a
    /// number matters, so any other `after` must match byte for byte.
    only_closers: bool,
}

/// Where a [`Layout`] found its string in a text.
pub struct Found {
    /// The string token: from its opening quote to just past its closing one.
    pub start: usize,
    pub end: usize,
    /// Just past the layout's `after` bytes.
    pub after_end: usize,
    /// The string has an escape (its text is not the bytes between its quotes).
    pub escaped: bool,
}

impl Layout {
    /// The layout of `text[from..to]` around its string token at
    /// `token_start..token_end` (the caller read the text and found it there).
    pub fn around(text: &str, from: usize, token_start: usize, token_end: usize, to: usize) -> Option<Layout> {
        let before = text.get(from..token_start)?;
        let after = text.get(token_end..to)?;
        if text.as_bytes().get(token_start) != Some(&b'"') {
            return None;
        }
        Some(Layout {
            before: before.to_string(),
            after: after.to_string(),
            only_closers: after
                .bytes()
                .all(|b| matches!(b, b'}' | b']' | b' ' | b'\n' | b'\t' | b'\r')),
        })
    }

    /// How long the layout's `before` is: where its string starts, from `from`.
    pub fn before_len(&self) -> usize {
        self.before.len()
    }

    /// The string token of `text` from `from` on, when the text is laid out
    /// as this layout there: the same bytes before it, a valid string token
    /// (as a raw walk reads it), then the same bytes after it.
    pub fn read(&self, text: &str, from: usize) -> Option<Found> {
        let bytes = text.as_bytes();
        if !scan::starts_with(bytes.get(from..)?, self.before.as_bytes()) {
            return None;
        }
        let start = from.wrapping_add(self.before.len());
        let (end, escaped) = string_token_end_escaped(bytes, start)?;
        let after_end = if self.only_closers {
            closers_end(bytes, end, self.after.as_bytes())?
        } else if scan::starts_with(bytes.get(end..)?, self.after.as_bytes()) {
            end.wrapping_add(self.after.len())
        } else {
            return None;
        };
        Some(Found {
            start,
            end,
            after_end,
            escaped,
        })
    }
}

/// Where `part` starts in `text`, when it is a slice of it (serde's raw
/// values and a walk's slices are): the offset of its first byte.
pub fn offset_in(text: &str, part: &str) -> Option<usize> {
    let at = (part.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
    let slice = text.get(at..at.checked_add(part.len())?)?;
    (slice.as_ptr() == part.as_ptr()).then_some(at)
}

/// [`whitespace_from`] for the runs of spaces Anthropic pads its events
/// with (a dozen is common): eight at a time, then byte by byte.
fn padding_from(bytes: &[u8], mut at: usize) -> usize {
    const SPACES: u64 = u64::from_le_bytes([b' '; 8]);
    while let Some(word) = bytes
        .get(at..at.wrapping_add(8))
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
        && u64::from_le_bytes(word) == SPACES
    {
        at = at.wrapping_add(8);
    }
    whitespace_from(bytes, at)
}

/// Where `expected`'s closing brackets end in `bytes` from `at`, whitespace
/// anywhere between them on either side (and none taken after the last).
fn closers_end(bytes: &[u8], mut at: usize, expected: &[u8]) -> Option<usize> {
    // `expected` is closing brackets and whitespace only (`only_closers`).
    for want in expected.iter().filter(|b| matches!(**b, b'}' | b']')) {
        at = padding_from(bytes, at);
        if bytes.get(at) != Some(want) {
            return None;
        }
        at = at.wrapping_add(1);
    }
    Some(at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout_of(text: &str, token: &str) -> Layout {
        let start = text.find(token).unwrap();
        Layout::around(text, 0, start, start + token.len(), text.len()).unwrap()
    }

    fn string_in(layout: &Layout, text: &str) -> Option<String> {
        let found = layout.read(text, 0)?;
        (found.after_end == text.len()).then(|| text[found.start..found.end].to_string())
    }

    #[test]
    fn a_text_laid_out_the_same_gives_its_string() {
        let layout = layout_of(r#"{"a":[{"t":"one"}],"n":1}"#, r#""one""#);
        assert_eq!(
            string_in(&layout, r#"{"a":[{"t":"two \"2\""}],"n":1}"#).unwrap(),
            r#""two \"2\"""#
        );
        assert_eq!(string_in(&layout, r#"{"a":[{"t":""}],"n":1}"#).unwrap(), r#""""#);
        // Anything else around it, or no valid string there: nothing.
        for other in [
            r#"{"a":[{"t":"two"}],"n":2}"#,
            r#"{"a":[{"t": "two"}],"n":1}"#,
            r#"{"a":[{"t":"two"} ],"n":1}"#,
            r#"{"a":[{"t":null}],"n":1}"#,
            r#"{"a":[{"t":"tw\o"}],"n":1}"#,
            "{\"a\":[{\"t\":\"t\nwo\"}],\"n\":1}",
            r#"{"a":[{"t":"two"#,
            r#"{"b":[{"t":"two"}],"n":1}"#,
        ] {
            assert!(string_in(&layout, other).is_none(), "{other}");
        }
    }

    #[test]
    fn closing_brackets_match_with_any_whitespace_between() {
        let layout = layout_of(r#"{"d":{"text":"a"}   }"#, r#""a""#);
        for same in [
            r#"{"d":{"text":"b"}}"#,
            "{\"d\":{\"text\":\"b\"}\n\t}",
            r#"{"d":{"text":"b"   }      }"#,
            // Runs of eight spaces and more (skipped a word at a time).
            r#"{"d":{"text":"b"        }                }"#,
        ] {
            assert_eq!(string_in(&layout, same).unwrap(), r#""b""#, "{same}");
        }
        for other in [
            r#"{"d":{"text":"b"}]"#,
            r#"{"d":{"text":"b"}"#,
            r#"{"d":{"text":"b"},}"#,
        ] {
            assert!(string_in(&layout, other).is_none(), "{other}");
        }
        // With more than closers after it, whitespace must match too.
        let layout = layout_of(r#"{"t":"a","n":12}"#, r#""a""#);
        assert!(string_in(&layout, r#"{"t":"b","n":1 2}"#).is_none());
        assert!(string_in(&layout, r#"{"t":"b","n":12}"#).is_some());
    }
}
