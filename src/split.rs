//! The fast path of [`crate::members::Members`]: one JSON object split into
//! its top-level members in a single pass over the text, without serde's
//! machinery per member (in wasm that machinery, not the bytes, was most of
//! the cost of a stream event).
//!
//! It is conservative. It answers only for text that serde_json reads the
//! same way: JSON as serde's raw values accept it, member names without
//! escapes (serde borrows those as they are), nesting under [`MAX_DEPTH`].
//! For anything else, valid or not, it says `None` and the caller asks serde,
//! whose errors then name the problem. The raw values are the slices serde's
//! `RawValue` gives: the value's own bytes, no whitespace around them.
//!
//! [`Walk`] holds the text to what serde's `Value` accepts, which is stricter than a raw value: they also refuse lone
//! surrogate escapes and, conservatively, any number with an exponent or over
//! 300 integer digits (serde refuses those beyond f64's range).

use crate::scan::position_of_string_stop;

/// Deeper nesting is left to serde (which allows any depth in a raw value).
const MAX_DEPTH: usize = 64;

/// Integer digits past which a number might leave f64's range (its limit is
/// 309 digits); [`Walk`] leaves such numbers to serde.
const MAX_VALUE_DIGITS: usize = 300;

/// Calls `member(name, raw value)` for each top-level member in order;
/// `None`: not sure (some members may have been given already).
pub fn split<'a>(text: &'a str, member: impl FnMut(&'a str, &'a str)) -> Option<()> {
    members(Cursor::new(text, false), member)
}

/// A walk over JSON text for a caller that looks inside some values as it
/// passes them (the request's fast check reads each message once, a stream
/// chunk's copy each choice). Each step takes one value off the walk and
/// gives its raw text; `None`: not sure, as everywhere here. One copy serves
/// every caller (`dyn` callbacks): a copy per closure would add kilobytes.
pub struct Walk<'a> {
    c: Cursor<'a>,
    depth: usize,
}

impl<'a> Walk<'a> {
    /// A walk held to serde's `Value`, for text a DOM would be built from.
    pub fn values(text: &'a str) -> Self {
        Walk {
            c: Cursor::new(text, true),
            depth: 0,
        }
    }

    /// A walk held only to serde's raw values, as [`split`] is.
    pub fn raw(text: &'a str) -> Self {
        Walk {
            c: Cursor::new(text, false),
            depth: 0,
        }
    }

    /// The first byte of the next value.
    pub fn peek(&mut self) -> Option<u8> {
        self.c.whitespace();
        self.c.peek()
    }

    /// The next value, passed over.
    pub fn value(&mut self) -> Option<&'a str> {
        self.c.whitespace();
        let start = self.c.at;
        self.c.value(self.depth)?;
        self.c.text.get(start..self.c.at)
    }

    /// The next value as an object: `member(name, walk)` for each member,
    /// which must take the member's value off the walk.
    pub fn object(&mut self, member: &mut dyn FnMut(&'a str, &mut Walk<'a>) -> Option<()>) -> Option<&'a str> {
        self.container(b'{', b'}', &mut |walk| {
            let name = walk.c.plain_name()?;
            walk.c.whitespace();
            walk.c.eat(b':')?;
            member(walk.c.text.get(name.0..name.1)?, walk)
        })
    }

    /// The next value as an array: `element(walk)` for each element, which
    /// must take it off the walk.
    pub fn array(&mut self, element: &mut dyn FnMut(&mut Walk<'a>) -> Option<()>) -> Option<&'a str> {
        self.container(b'[', b']', element)
    }

    /// Only whitespace is left.
    pub fn end(mut self) -> Option<()> {
        self.c.whitespace();
        (self.c.at == self.c.bytes.len()).then_some(())
    }

    fn container(&mut self, open: u8, close: u8, item: &mut dyn FnMut(&mut Walk<'a>) -> Option<()>) -> Option<&'a str> {
        if self.peek()? != open || self.depth >= MAX_DEPTH {
            return None;
        }
        let start = self.c.at;
        self.c.advance(1);
        self.depth = self.depth.saturating_add(1);
        if self.peek()? == close {
            self.c.advance(1);
        } else {
            loop {
                self.c.whitespace();
                item(self)?;
                self.c.whitespace();
                match self.c.next()? {
                    b',' => {}
                    b if b == close => break,
                    _ => return None,
                }
            }
        }
        self.depth = self.depth.saturating_sub(1);
        self.c.text.get(start..self.c.at)
    }
}

fn members<'a>(mut c: Cursor<'a>, mut member: impl FnMut(&'a str, &'a str)) -> Option<()> {
    let text = c.text;
    c.whitespace();
    c.eat(b'{')?;
    c.whitespace();
    if c.peek() == Some(b'}') {
        c.advance(1);
    } else {
        loop {
            c.whitespace();
            let name = c.plain_name()?;
            c.whitespace();
            c.eat(b':')?;
            c.whitespace();
            let start = c.at;
            c.value(0)?;
            member(text.get(name.0..name.1)?, text.get(start..c.at)?);
            c.whitespace();
            match c.next()? {
                b',' => {}
                b'}' => break,
                _ => return None,
            }
        }
    }
    c.whitespace();
    (c.at == text.len()).then_some(())
}

/// A position in the text; every step either moves on or says `None`.
struct Cursor<'a> {
    text: &'a str,
    bytes: &'a [u8],
    at: usize,
    /// Held to serde's `Value`, not only its raw values (checked only at
    /// escapes and numbers, so the raw split pays next to nothing for it).
    values: bool,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a str, values: bool) -> Self {
        Cursor {
            text,
            bytes: text.as_bytes(),
            at: 0,
            values,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn advance(&mut self, n: usize) {
        self.at = self.at.saturating_add(n);
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.advance(1);
        Some(b)
    }

    fn eat(&mut self, expected: u8) -> Option<()> {
        (self.next()? == expected).then_some(())
    }

    /// JSON's four whitespace bytes, as serde skips them.
    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\t' | b'\r')) {
            self.advance(1);
        }
    }

    /// A name without escapes: the span between its quotes.
    fn plain_name(&mut self) -> Option<(usize, usize)> {
        self.eat(b'"')?;
        let start = self.at;
        let stop = position_of_string_stop(self.bytes.get(start..)?)?;
        self.advance(stop);
        // A backslash or a control character: serde's to read (or refuse).
        self.eat(b'"')?;
        Some((start, start.saturating_add(stop)))
    }

    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => {
                self.advance(1);
                self.string_rest()
            }
            b'{' | b'[' if depth >= MAX_DEPTH => None,
            b'{' => self.container(b'}', depth.saturating_add(1)),
            b'[' => self.container(b']', depth.saturating_add(1)),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' => {
                self.advance(1);
                self.number()
            }
            b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// A string after its opening quote, escapes as serde's raw values
    /// accept them (any four hex digits after `\u`).
    fn string_rest(&mut self) -> Option<()> {
        loop {
            let stop = position_of_string_stop(self.bytes.get(self.at..)?)?;
            self.advance(stop);
            match self.next()? {
                b'"' => return Some(()),
                b'\\' => match self.next()? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {}
                    b'u' => {
                        let unit = self.hex4()?;
                        // serde's Value refuses a lone surrogate: a high one
                        // must be followed at once by an escaped low one.
                        if self.values && (0xD800..=0xDFFF).contains(&unit) {
                            if unit >= 0xDC00 {
                                return None;
                            }
                            self.eat(b'\\')?;
                            self.eat(b'u')?;
                            if !(0xDC00..=0xDFFF).contains(&self.hex4()?) {
                                return None;
                            }
                        }
                    }
                    _ => return None,
                },
                // A control character.
                _ => return None,
            }
        }
    }

    /// Four hex digits, as the code unit they spell.
    fn hex4(&mut self) -> Option<u32> {
        let mut unit = 0;
        for _ in 0..4 {
            let digit = char::from(self.next()?).to_digit(16)?;
            unit = (unit << 4) | digit;
        }
        Some(unit)
    }

    /// An object (`close` is `}`: `"name": value` members) or an array
    /// (`]`: values), its opening bracket next.
    fn container(&mut self, close: u8, depth: usize) -> Option<()> {
        self.advance(1);
        self.whitespace();
        if self.peek()? == close {
            self.advance(1);
            return Some(());
        }
        loop {
            self.whitespace();
            if close == b'}' {
                self.eat(b'"')?;
                self.string_rest()?;
                self.whitespace();
                self.eat(b':')?;
                self.whitespace();
            }
            self.value(depth)?;
            self.whitespace();
            match self.next()? {
                b',' => {}
                b if b == close => return Some(()),
                _ => return None,
            }
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at.checked_add(word.len())?;
        (self.bytes.get(self.at..end)? == word).then(|| self.at = end)
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.advance(1);
        }
        self.at.saturating_sub(start)
    }

    /// A number after its sign, in serde's grammar: one leading zero at
    /// most, digits after a point, digits after an exponent's sign.
    fn number(&mut self) -> Option<()> {
        match self.next()? {
            b'0' if self.peek().is_some_and(|b| b.is_ascii_digit()) => return None,
            b'0' => {}
            b'1'..=b'9' => {
                if self.digits() >= MAX_VALUE_DIGITS && self.values {
                    return None;
                }
            }
            _ => return None,
        }
        if self.peek() == Some(b'.') {
            self.advance(1);
            if self.digits() == 0 {
                return None;
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            if self.values {
                return None;
            }
            self.advance(1);
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.advance(1);
            }
            if self.digits() == 0 {
                return None;
            }
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What serde makes of `text` as an object of raw members, when it can.
    fn serde_split(text: &str) -> Option<Vec<(String, String)>> {
        let members = serde_json::from_str::<crate::members::Members>(text).ok()?;
        Some(
            members
                .0
                .iter()
                .map(|(k, v)| (k.to_string(), v.get().to_string()))
                .collect(),
        )
    }

    fn ours(text: &str) -> Option<Vec<(&str, &str)>> {
        let mut members = Vec::new();
        split(text, |k, v| members.push((k, v)))?;
        Some(members)
    }

    /// Whenever the split answers, serde reads the text the same way.
    fn agrees(text: &str) {
        if let Some(ours) = ours(text) {
            let ours: Vec<(String, String)> = ours.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            assert_eq!(Some(ours), serde_split(text), "{text:?}");
        }
    }

    #[test]
    fn plain_objects_split_as_serde_splits_them() {
        for text in [
            r#"{"id":"c1","object":"chat.completion.chunk","created":1755137933,"model":"gpt-5-nano","service_tier":"default","system_fingerprint":null,"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":null}],"obfuscation":"LcdzdJdMMgDHt6"}"#,
            " { \"b\" : 1.50 ,\n\t\"a\": {\"x\": [1, 2, {}, []]}, \"b\": \"two\" }\r\n",
            r#"{}"#,
            r#"{"a":-0.5e+10,"b":0,"c":-0,"d":1E3,"e":true,"f":false,"g":null,"h":[]}"#,
            r#"{"s":"esc \" \\ \/ \b \f \n \r \t \u00e9 \uD800 é ☃"}"#,
            r#"{"nested":{"k\u0041":"v","":{"":[[[]]]}}}"#,
        ] {
            assert!(ours(text).is_some(), "{text}");
            agrees(text);
        }
        let m = ours(r#"{ "b" : 1.50 , "a": {"x": [1]} }"#).unwrap();
        assert_eq!(m, [("b", "1.50"), ("a", r#"{"x": [1]}"#)]);
    }

    #[test]
    fn anything_unusual_is_left_to_serde() {
        for text in [
            "",
            "[]",
            "{",
            r#"{"a":1,}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":01}"#,
            r#"{"a":1.}"#,
            r#"{"a":1e}"#,
            r#"{"a":+1}"#,
            r#"{"a":.5}"#,
            r#"{"a":tru}"#,
            r#"{"a":nul}"#,
            r#"{"a":"x\q"}"#,
            r#"{"a":"\u12G4"}"#,
            "{\"a\":\"tab\tinside\"}",
            r#"{"esc\"aped":1}"#,
            r#"{"a":1} x"#,
            r#"{"a":1}{"#,
            r#"{"a" 1}"#,
            r#"{"a":1 "b":2}"#,
            r#"{a:1}"#,
            r#"{"a":{1:2}}"#,
            "\u{feff}{}",
        ] {
            assert!(ours(text).is_none(), "{text}");
        }
        let deep = format!("{{\"a\":{}{}}}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(ours(&deep).is_none());
        let fits = format!("{{\"a\":{}{}}}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(ours(&fits).is_some());
        agrees(&fits);
    }

    #[test]
    fn every_cut_of_an_event_is_refused_or_read_as_serde_reads_it() {
        let event = r#"{"id":"c1","n":-12.5e-3,"choices":[{"index":0,"delta":{"content":"Hi \"you\"\n"},"finish_reason":null}],"x":[true,false,null,{}]}"#;
        for end in 0..event.len() {
            let cut = &event[..end];
            agrees(cut);
            // And with one byte changed to each interesting byte.
            for b in [b'"', b'\\', b',', b'}', b']', b'0', b'-', b'e', b'.', b' ', b'x', b'\t'] {
                let mut bytes = event.as_bytes().to_vec();
                bytes[end] = b;
                agrees(std::str::from_utf8(&bytes).unwrap());
            }
        }
    }
}
