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

use crate::scan;
use crate::split::{digits_token_end, string_token_end, string_token_end_escaped, whitespace_from};

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

/// The kind of a scalar token a [`Holes`] layout leaves open.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Token {
    String,
    /// A number written as counts are, digits only: any other number in
    /// its place (negative, fractional) leaves the text to be read whole.
    Number,
}

/// A whole JSON text's bytes around several scalar tokens: a chunk that
/// repeats the last one but for its text and its counts (Gemini's usage
/// counts change with every chunk). Sound for the reason [`Layout`] is: a
/// string token can stand where another stood, a number where another did.
pub struct Holes {
    /// The text it was made from, and its tokens' spans, in order.
    text: String,
    spans: Vec<(usize, usize, Token)>,
    /// Where the closing brackets and whitespace the text ends with start:
    /// they match with any whitespace between them (Anthropic pads its
    /// events before the last bracket, each with its own run of spaces).
    closers_from: usize,
}

impl Holes {
    /// The layout of `text` around its tokens at `spans` (in order, not
    /// overlapping; the caller read the text and found them there).
    pub fn around(text: &str, spans: Vec<(usize, usize, Token)>) -> Option<Holes> {
        let mut at = 0;
        for (start, end, _) in &spans {
            if *start < at || end < start || *end > text.len() {
                return None;
            }
            at = *end;
        }
        let closers = text
            .bytes()
            .rev()
            .take_while(|b| matches!(b, b'}' | b']' | b' ' | b'\n' | b'\t' | b'\r'))
            .count();
        Some(Holes {
            text: text.to_string(),
            spans,
            closers_from: text.len().saturating_sub(closers).max(at),
        })
    }

    /// The spans of `text`'s tokens (into `spans`, emptied first) when the
    /// whole text is laid out as this layout: the same bytes between valid
    /// tokens of the same kinds, then only whitespace.
    pub fn read(&self, text: &str, spans: &mut Vec<(usize, usize)>) -> Option<()> {
        let (bytes, model) = (text.as_bytes(), self.text.as_bytes());
        spans.clear();
        // Where the text and the model stand: past the same token.
        let (mut at, mut model_at) = (0usize, 0usize);
        for (start, end, kind) in &self.spans {
            let fixed = model.get(model_at..*start)?;
            if !scan::starts_with(bytes.get(at..)?, fixed) {
                return None;
            }
            let token_start = at.wrapping_add(fixed.len());
            let token_end = match kind {
                Token::String => string_token_end(bytes, token_start)?,
                Token::Number => digits_token_end(bytes, token_start)?,
            };
            spans.push((token_start, token_end));
            (at, model_at) = (token_end, *end);
        }
        let last = model.get(model_at..self.closers_from)?;
        if !scan::starts_with(bytes.get(at..)?, last) {
            return None;
        }
        let end = closers_end(bytes, at.wrapping_add(last.len()), model.get(self.closers_from..)?)?;
        only_whitespace_from(bytes, end).then_some(())
    }
}

/// Where `part` starts in `text`, when it is a slice of it (serde's raw
/// values and a walk's slices are): the offset of its first byte.
pub fn offset_in(text: &str, part: &str) -> Option<usize> {
    let at = (part.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
    let slice = text.get(at..at.checked_add(part.len())?)?;
    (slice.as_ptr() == part.as_ptr()).then_some(at)
}

/// Whether `bytes` from `at` on are JSON whitespace only.
pub fn only_whitespace_from(bytes: &[u8], at: usize) -> bool {
    padding_from(bytes, at) == bytes.len()
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
    fn a_text_laid_out_with_holes_gives_its_tokens() {
        let model = r#"{"t":"one","u":{"a":12,"b":3},"z":"fixed"}"#;
        let span = |token: &str, kind| {
            let at = model.find(token).unwrap();
            (at, at + token.len(), kind)
        };
        let holes = Holes::around(
            model,
            vec![
                span(r#""one""#, Token::String),
                span("12", Token::Number),
                span("3", Token::Number),
            ],
        )
        .unwrap();
        let tokens = |text: &str| {
            let mut spans = Vec::new();
            holes.read(text, &mut spans)?;
            Some(spans.iter().map(|(s, e)| text[*s..*e].to_string()).collect::<Vec<_>>())
        };
        assert_eq!(tokens(model).unwrap(), [r#""one""#, "12", "3"]);
        assert_eq!(
            tokens("{\"t\":\"tw\\\"o\",\"u\":{\"a\":1234567,\"b\":0},\"z\":\"fixed\"} \n").unwrap(),
            [r#""tw\"o""#, "1234567", "0"]
        );
        for other in [
            r#"{"t":"two","u":{"a":12,"b":3},"z":"fixe"}"#,
            r#"{"t":"two","u":{"a":12,"b":3},"z":"fixed"} x"#,
            r#"{"t":"two","u":{"a":"12","b":3},"z":"fixed"}"#,
            r#"{"t":"two","u":{"a":012,"b":3},"z":"fixed"}"#,
            r#"{"t":"two","u":{"a":1.,"b":3},"z":"fixed"}"#,
            // Numbers that are not counts are left to a walk.
            r#"{"t":"two","u":{"a":-1,"b":3},"z":"fixed"}"#,
            r#"{"t":"two","u":{"a":1.5,"b":3},"z":"fixed"}"#,
            r#"{"t":"two","u":{"a":12,"b":3e2},"z":"fixed"}"#,
            r#"{"t":null,"u":{"a":12,"b":3},"z":"fixed"}"#,
            r#"{"t":"two","u":{"a":12, "b":3},"z":"fixed"}"#,
            r#"{"t":"two","u":{"a":12,"b":3}"#,
        ] {
            assert!(tokens(other).is_none(), "{other}");
        }
        // Spans out of order or past the text make no layout.
        assert!(Holes::around(model, vec![span("12", Token::Number), span(r#""one""#, Token::String)]).is_none());
        assert!(Holes::around("ab", vec![(1, 3, Token::Number)]).is_none());
    }

    #[test]
    fn holes_match_the_closing_brackets_with_any_whitespace_between() {
        let reads = |model: &str, spans, text: &str| {
            let holes = Holes::around(model, spans).unwrap();
            holes.read(text, &mut Vec::new()).is_some()
        };
        let model = r#"{"type":"stop","n":1   }"#;
        for same in [model, r#"{"type":"stop","n":1}"#, "{\"type\":\"stop\",\"n\":1\n} "] {
            assert!(reads(model, vec![], same), "{same}");
        }
        for other in [
            r#"{"type":"stop","n":12 }"#,
            r#"{"type":"stop","n":1 ]"#,
            r#"{"type":"stop","n":1 }}"#,
            r#"{"type":"stop","n": 1}"#,
            r#"{"type":"stop","n":1 } x"#,
            r#"{"type":"stop","n":1 }        x"#,
        ] {
            assert!(!reads(model, vec![], other), "{other}");
        }
        // After the last hole as well, and only there.
        let model = r#"{"d":{"t":"a"}   }"#;
        let hole = vec![(10, 13, Token::String)];
        assert!(reads(model, hole.clone(), r#"{"d":{"t":"bc"}}"#));
        assert!(reads(model, hole.clone(), "{\"d\":{\"t\":\"b\"\n}\t}"));
        assert!(!reads(model, hole, r#"{"d": {"t":"b"}}"#));
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
