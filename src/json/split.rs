//! JSON text read in one pass without serde's machinery per member (in
//! wasm that machinery, not the bytes, was most of the cost of a stream
//! event): [`split`], the fast path of [`crate::json::members::Members`], gives
//! an object's top-level members; a [`Walk`] lets its caller look inside
//! values as it passes them (each message of a request, each choice of a
//! stream chunk).
//!
//! It is conservative. It answers only for text that serde_json reads the
//! same way: JSON as serde's raw values accept it, member names without
//! escapes (serde borrows those as they are), nesting under `MAX_DEPTH`.
//! For anything else, valid or not, it says `None` and the caller asks serde,
//! whose errors then name the problem. The raw values are the slices serde's
//! `RawValue` gives: the value's own bytes, no whitespace around them.
//!
//! [`Walk::values`] holds the text to what serde's `Value` accepts, which is
//! stricter than a raw value: it also refuses lone surrogate escapes and,
//! conservatively, any number with an exponent or over 300 integer digits
//! (serde refuses those beyond f64's range).

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
        let start = self.open(b'{')?;
        if self.first_item(b'}')? {
            self.members(member)?;
        }
        self.leave(start)
    }

    /// An object's members from the next name through its closing brace.
    fn members(&mut self, member: &mut dyn FnMut(&'a str, &mut Walk<'a>) -> Option<()>) -> Option<()> {
        loop {
            let (from, to) = self.c.plain_name()?;
            self.c.whitespace();
            self.c.eat(b':')?;
            member(self.c.text.get(from..to)?, self)?;
            if !self.next_item(b'}')? {
                return Some(());
            }
        }
    }

    /// The next value as an array: `element(walk)` for each element, which
    /// must take it off the walk.
    pub fn array(&mut self, element: &mut dyn FnMut(&mut Walk<'a>) -> Option<()>) -> Option<&'a str> {
        let start = self.open(b'[')?;
        let mut more = self.first_item(b']')?;
        while more {
            element(self)?;
            more = self.next_item(b']')?;
        }
        self.leave(start)
    }

    /// Only whitespace is left.
    pub fn end(mut self) -> Option<()> {
        self.c.whitespace();
        (self.c.at == self.c.bytes.len()).then_some(())
    }

    /// Steps into the container `open` starts; where it starts.
    fn open(&mut self, open: u8) -> Option<usize> {
        if self.peek()? != open || self.depth >= MAX_DEPTH {
            return None;
        }
        let start = self.c.at;
        self.c.advance(1);
        self.depth = self.depth.saturating_add(1);
        Some(start)
    }

    /// Just inside a container: whether an item comes before `close`.
    fn first_item(&mut self, close: u8) -> Option<bool> {
        if self.peek()? == close {
            self.c.advance(1);
            return Some(false);
        }
        Some(true)
    }

    /// After an item: whether another follows (a comma) or the container
    /// ends here (`close`); the next item's first byte is next.
    fn next_item(&mut self, close: u8) -> Option<bool> {
        self.c.whitespace();
        match self.c.next()? {
            b',' => {
                self.c.whitespace();
                Some(true)
            }
            b if b == close => Some(false),
            _ => None,
        }
    }

    /// Steps out of the container that began at `start`: its raw text.
    fn leave(&mut self, start: usize) -> Option<&'a str> {
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
        let stop = string_stop_from(self.bytes, start);
        // A backslash or a control character: serde's to read (or refuse).
        if self.bytes.get(stop) != Some(&b'"') {
            return None;
        }
        self.at = stop.wrapping_add(1);
        Some((start, stop))
    }

    /// One value, its first byte next, nested at most `MAX_DEPTH - depth`
    /// deeper. One loop, the position in a local and the open containers as
    /// bits of a word: in wasm a call per token, with the position kept in
    /// memory, cost more than the bytes themselves.
    fn value(&mut self, depth: usize) -> Option<()> {
        let (bytes, values) = (self.bytes, self.values);
        let room = MAX_DEPTH.saturating_sub(depth);
        let mut at = self.at;
        // Bit 0 is the innermost open container: 1 for an object.
        let (mut objects, mut open) = (0u64, 0usize);
        loop {
            // A value starts at `at`.
            match *bytes.get(at)? {
                b'"' => at = string_end(bytes, at.wrapping_add(1), values)?,
                bracket @ (b'{' | b'[') => {
                    if open >= room {
                        return None;
                    }
                    let object = bracket == b'{';
                    let close = if object { b'}' } else { b']' };
                    at = whitespace_from(bytes, at.wrapping_add(1));
                    if bytes.get(at) == Some(&close) {
                        at = at.wrapping_add(1);
                    } else {
                        objects = (objects << 1) | u64::from(object);
                        open = open.wrapping_add(1);
                        if object {
                            at = member_value_start(bytes, at, values)?;
                        }
                        continue;
                    }
                }
                b't' => at = literal_end(bytes, at, b"true")?,
                b'f' => at = literal_end(bytes, at, b"false")?,
                b'n' => at = literal_end(bytes, at, b"null")?,
                b'-' | b'0'..=b'9' => at = number_end(bytes, at, values)?,
                _ => return None,
            }
            // After a value: close what ends here, or on to the next item.
            loop {
                if open == 0 {
                    self.at = at;
                    return Some(());
                }
                at = whitespace_from(bytes, at);
                let object = objects & 1 == 1;
                match *bytes.get(at)? {
                    b',' => {
                        at = whitespace_from(bytes, at.wrapping_add(1));
                        if object {
                            at = member_value_start(bytes, at, values)?;
                        }
                        break;
                    }
                    b'}' if object => {}
                    b']' if !object => {}
                    _ => return None,
                }
                objects >>= 1;
                open = open.wrapping_sub(1);
                at = at.wrapping_add(1);
            }
        }
    }
}

/// JSON's four whitespace bytes from `at`, as serde skips them: where they end.
#[inline(always)]
fn whitespace_from(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\n' | b'\t' | b'\r')) {
        at = at.wrapping_add(1);
    }
    at
}

/// A member's `"name":` at `at` (any JSON string as a name): where its value starts.
#[inline(always)]
fn member_value_start(bytes: &[u8], at: usize, values: bool) -> Option<usize> {
    if bytes.get(at) != Some(&b'"') {
        return None;
    }
    let at = whitespace_from(bytes, string_end(bytes, at.wrapping_add(1), values)?);
    if bytes.get(at) != Some(&b':') {
        return None;
    }
    Some(whitespace_from(bytes, at.wrapping_add(1)))
}

/// The end of a string whose text starts at `at` (just past its quote).
#[inline(always)]
fn string_end(bytes: &[u8], at: usize, values: bool) -> Option<usize> {
    let stop = string_stop_from(bytes, at);
    if bytes.get(stop) == Some(&b'"') {
        return Some(stop.wrapping_add(1));
    }
    string_end_escaped(bytes, stop, values)
}

/// [`string_end`] from its first escape or control character, escapes as
/// serde's raw values accept them (any four hex digits after `\u`) or, for
/// `values`, as its `Value` does (no lone surrogates).
#[inline(never)]
fn string_end_escaped(bytes: &[u8], mut at: usize, values: bool) -> Option<usize> {
    loop {
        match *bytes.get(at)? {
            b'"' => return Some(at.wrapping_add(1)),
            b'\\' => {
                at = at.wrapping_add(1);
                match *bytes.get(at)? {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => at = at.wrapping_add(1),
                    b'u' => {
                        let unit = hex4(bytes, at.wrapping_add(1))?;
                        at = at.wrapping_add(5);
                        // serde's Value refuses a lone surrogate: a high one
                        // must be followed at once by an escaped low one.
                        if values && (0xD800..=0xDFFF).contains(&unit) {
                            if unit >= 0xDC00 || bytes.get(at..at.wrapping_add(2)) != Some(b"\\u") {
                                return None;
                            }
                            if !(0xDC00..=0xDFFF).contains(&hex4(bytes, at.wrapping_add(2))?) {
                                return None;
                            }
                            at = at.wrapping_add(6);
                        }
                    }
                    _ => return None,
                }
            }
            // A control character.
            _ => return None,
        }
        at = string_stop_from(bytes, at);
    }
}

/// The four hex digits at `at`, as the code unit they spell.
fn hex4(bytes: &[u8], at: usize) -> Option<u32> {
    let mut unit = 0;
    for digit in bytes.get(at..at.wrapping_add(4))? {
        unit = (unit << 4) | char::from(*digit).to_digit(16)?;
    }
    Some(unit)
}

#[inline(always)]
fn literal_end(bytes: &[u8], at: usize, word: &[u8]) -> Option<usize> {
    let end = at.checked_add(word.len())?;
    (bytes.get(at..end)? == word).then_some(end)
}

#[inline(always)]
fn digits_from(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_digit) {
        at = at.wrapping_add(1);
    }
    at
}

/// The end of the number at `at`, in serde's grammar: a sign, one leading
/// zero at most, digits after a point, digits after an exponent's sign.
/// For `values`, no exponent and at most [`MAX_VALUE_DIGITS`] integer digits.
fn number_end(bytes: &[u8], mut at: usize, values: bool) -> Option<usize> {
    if bytes.get(at) == Some(&b'-') {
        at = at.wrapping_add(1);
    }
    match *bytes.get(at)? {
        b'0' => {
            at = at.wrapping_add(1);
            if bytes.get(at).is_some_and(u8::is_ascii_digit) {
                return None;
            }
        }
        b'1'..=b'9' => {
            let end = digits_from(bytes, at);
            if values && end.wrapping_sub(at) >= MAX_VALUE_DIGITS {
                return None;
            }
            at = end;
        }
        _ => return None,
    }
    if bytes.get(at) == Some(&b'.') {
        let end = digits_from(bytes, at.wrapping_add(1));
        if end == at.wrapping_add(1) {
            return None;
        }
        at = end;
    }
    if matches!(bytes.get(at), Some(b'e' | b'E')) {
        if values {
            return None;
        }
        at = at.wrapping_add(1);
        if matches!(bytes.get(at), Some(b'+' | b'-')) {
            at = at.wrapping_add(1);
        }
        let end = digits_from(bytes, at);
        if end == at {
            return None;
        }
        at = end;
    }
    Some(at)
}

// The string scan, eight bytes a step: wasm has 64-bit integers but no SIMD
// here, and `memchr` cannot stop at a byte range (control characters). A
// word holds a byte `b` when its XOR with `b` in every lane has a zero lane.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The zero byte lanes of `x`, as each lane's high bit. Only the lowest set
/// bit is exact (a borrow can flag lanes above a zero one), and the lowest
/// is all a search needs.
fn zero_lanes(x: u64) -> u64 {
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// The lanes of `x` below `n` (`n` at most 0x80), lowest exact as above.
fn lanes_below(x: u64, n: u8) -> u64 {
    x.wrapping_sub(ONES.wrapping_mul(u64::from(n))) & !x & HIGHS
}

/// The index of the lowest flagged lane (little-endian: the first byte is
/// the lowest lane).
fn lane(flagged: u64) -> usize {
    (flagged.trailing_zeros() / 8) as usize
}

/// Where the run of plain JSON string text starting at `at` ends: the index
/// of its first quote, backslash or control character (below 0x20, which
/// JSON forbids unescaped), or `bytes.len()`.
/// The JSON walk's inner loop ([`crate::json::split`]): inlined, with a plain index
/// for an answer, it keeps the position in a wasm local instead of the
/// stack a returned `Option<usize>` goes through.
#[inline(always)]
pub fn string_stop_from(bytes: &[u8], mut at: usize) -> usize {
    let (quote, backslash) = (ONES.wrapping_mul(u64::from(b'"')), ONES.wrapping_mul(u64::from(b'\\')));
    let stops = |w: u64| zero_lanes(w ^ quote) | zero_lanes(w ^ backslash) | lanes_below(w, 0x20);
    let word = |at: usize| {
        bytes
            .get(at..at.wrapping_add(8))
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_le_bytes)
    };
    while let Some(w) = word(at) {
        let flagged = stops(w);
        if flagged != 0 {
            return at.wrapping_add(lane(flagged));
        }
        at = at.wrapping_add(8);
    }
    // Under eight bytes left: the text's last word, its lanes before `at`
    // shifted out. The zero lanes shifted in stand past the end and stop
    // the search there, so a stop in none of the real lanes gives the length.
    let last = bytes.len().wrapping_sub(8);
    if at > last
        && at < bytes.len()
        && let Some(w) = word(last)
    {
        let found = at.wrapping_add(lane(stops(w >> (at.wrapping_sub(last) * 8))));
        return found.min(bytes.len());
    }
    while let Some(&b) = bytes.get(at) {
        if b == b'"' || b == b'\\' || b < 0x20 {
            return at;
        }
        at = at.wrapping_add(1);
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_string_scan_stops_where_a_plain_scan_does_everywhere() {
        let text: Vec<u8> = (0..75u32)
            .map(|i| [b'a', b'"', 0x1f, b'\\', 0x20, 0xff, 0x80, 0][(i * 7 % 13 % 8) as usize])
            .collect();
        for start in 0..text.len() {
            let tail = &text[start..];
            let plain = tail.iter().position(|b| *b == b'"' || *b == b'\\' || *b < 0x20);
            assert_eq!(string_stop_from(&text, start), plain.map_or(text.len(), |p| start + p));
            let letters = vec![b'x'; tail.len()];
            assert_eq!(string_stop_from(&letters, 0), letters.len());
        }
    }

    /// What serde makes of `text` as an object of raw members, when it can.
    fn serde_split(text: &str) -> Option<Vec<(String, String)>> {
        let members = serde_json::from_str::<crate::json::members::Members>(text).ok()?;
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
