//! The top-level members of a JSON object as borrowed slices of the bytes
//! they came in, for targeted rewrites: rename the model, drop the routing
//! field, stamp an answer's id. Everything else goes on byte for byte,
//! without building a DOM and encoding it again (the costliest steps of a
//! request, measured by `make bench`).

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::Serialize;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use crate::json::split::split;

/// One object's members in their order: name (unescaped) and raw value.
pub struct Members<'a>(pub Vec<(Cow<'a, str>, Raw<'a>)>);

/// A member's value as the JSON text it came as (already checked to be JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Raw<'a>(&'a str);

impl<'a> Raw<'a> {
    pub fn get(&self) -> &'a str {
        self.0
    }
}

impl<'a> Members<'a> {
    /// Parses `bytes` as one JSON object (anything else is an error).
    pub fn parse(bytes: &'a [u8]) -> Result<Members<'a>, serde_json::Error> {
        // One UTF-8 check of the whole text: parsed as bytes, serde checks every
        // raw value again on its own.
        Self::parse_str(super::utf8(bytes)?)
    }

    /// [`Members::parse`] on text already known to be UTF-8 (not checked again).
    /// The single-pass [`split`] answers for the usual text, serde for the rest.
    pub fn parse_str(text: &'a str) -> Result<Members<'a>, serde_json::Error> {
        let mut members = Vec::with_capacity(16);
        match split(text, |name, value| members.push((Cow::Borrowed(name), Raw(value)))) {
            Some(()) => Ok(Members(members)),
            None => serde_json::from_str(text),
        }
    }

    /// The members at `spans` of `text` (name, value), as an earlier walk of
    /// it found them; `None` if a span does not fit the text.
    pub fn from_spans(text: &'a str, spans: &[(Range<usize>, Range<usize>)]) -> Option<Members<'a>> {
        let mut members = Vec::with_capacity(spans.len());
        for (name, value) in spans {
            let name = text.get(name.clone())?;
            members.push((Cow::Borrowed(name), Raw(text.get(value.clone())?)));
        }
        Some(Members(members))
    }

    /// The value named `name`; the last one when a name repeats, as in
    /// serde_json's DOM (so validation and rewrite agree).
    pub fn get(&self, name: &str) -> Option<Raw<'a>> {
        self.0.iter().rev().find(|(k, _)| k == name).map(|(_, v)| *v)
    }
}

/// A member name, borrowed unless it has escapes.
struct Name<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl<'de> Visitor<'de> for NameVisitor {
            type Value = Name<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Name(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_str(NameVisitor)
    }
}

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ObjectVisitor;
        impl<'de> Visitor<'de> for ObjectVisitor {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some((Name(name), value)) = map.next_entry::<Name<'de>, &'de RawValue>()? {
                    members.push((name, Raw(value.get())));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(ObjectVisitor)
    }
}

/// Writes one JSON object member by member.
pub struct ObjectWriter<'o> {
    out: &'o mut Vec<u8>,
    empty: bool,
}

impl<'o> ObjectWriter<'o> {
    pub fn new(out: &'o mut Vec<u8>) -> ObjectWriter<'o> {
        out.push(b'{');
        ObjectWriter { out, empty: true }
    }

    fn name(&mut self, name: &str) {
        self.comma();
        // Names here are the filter's own ("id", "usage"): nothing to escape,
        // so serde's escaping writer is kept for a name that would need it.
        if name.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
            self.out.push(b'"');
            self.out.extend_from_slice(name.as_bytes());
            self.out.extend_from_slice(b"\":");
        } else {
            write_string(self.out, name);
            self.out.push(b':');
        }
    }

    fn comma(&mut self) {
        if !self.empty {
            self.out.push(b',');
        }
        self.empty = false;
    }

    /// A member whose value is already JSON.
    pub fn raw(&mut self, name: &str, json: &str) {
        self.name(name);
        self.out.extend_from_slice(json.as_bytes());
    }

    /// A member copied from [`Members`]: name and value as they came.
    #[allow(clippy::ptr_arg)] // whether the name is borrowed is the point
    pub fn member(&mut self, name: &Cow<'_, str>, value: Raw<'_>) {
        self.comma();
        write_name(self.out, name);
        self.out.push(b':');
        self.out.extend_from_slice(value.get().as_bytes());
    }

    pub fn string(&mut self, name: &str, value: &str) {
        self.name(name);
        write_string(self.out, value);
    }

    pub fn number(&mut self, name: &str, value: u64) {
        self.value(name, &value);
    }

    /// A member whose value is an object, written by the writer returned.
    pub fn object(&mut self, name: &str) -> ObjectWriter<'_> {
        self.name(name);
        ObjectWriter::new(self.out)
    }

    /// A member encoded by serde (a `Value`, a number).
    pub fn value<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) {
        self.name(name);
        if serde_json::to_writer(&mut *self.out, value).is_err() {
            // Only maps with non-string keys fail, which no caller passes.
            self.out.extend_from_slice(b"null");
        }
    }

    pub fn finish(self) {
        self.out.push(b'}');
    }
}

/// Appends a member name from [`Members`] as a JSON string. A borrowed name
/// is the input's own text between its quotes, free of escapes, so it is
/// copied as it is; only a name that had escapes is encoded again.
#[allow(clippy::ptr_arg)] // whether the name is borrowed is the point
fn write_name(out: &mut Vec<u8>, name: &Cow<'_, str>) {
    match name {
        Cow::Borrowed(text) => {
            out.push(b'"');
            out.extend_from_slice(text.as_bytes());
            out.push(b'"');
        }
        Cow::Owned(text) => write_string(out, text),
    }
}

/// Appends `s` as a JSON string.
fn write_string(out: &mut Vec<u8>, s: &str) {
    if serde_json::to_writer(&mut *out, s).is_err() {
        // Writing a str to a Vec cannot fail; keep the output valid anyway.
        out.extend_from_slice(b"\"\"");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn members_keep_order_raw_values_and_unescape_names() {
        let body = br#"{ "b" : 1.50 , "a\u0062": {"x": [1, 2]}, "b": "two" }"#;
        let m = Members::parse(body).unwrap();
        let names: Vec<&str> = m.0.iter().map(|(k, _)| k.as_ref()).collect();
        assert_eq!(names, ["b", "ab", "b"]);
        assert_eq!(m.0[0].1.get(), "1.50", "numbers stay as written");
        assert_eq!(m.get("ab").unwrap().get(), r#"{"x": [1, 2]}"#);
        assert_eq!(m.get("b").unwrap().get(), r#""two""#, "the last of a repeated name");
        assert!(m.get("zz").is_none());
    }

    #[test]
    fn only_objects_parse() {
        for bad in [&b"[1]"[..], b"\"s\"", b"{", b"{\"a\":1} x", b"", b"{\"a\":}"] {
            assert!(Members::parse(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        assert!(Members::parse(b" {} ").unwrap().0.is_empty());
    }

    #[test]
    fn the_writer_makes_valid_json() {
        let mut out = Vec::new();
        let mut w = ObjectWriter::new(&mut out);
        w.string("id", "a\"b");
        w.number("n", 7);
        w.raw("r", "[1,{}]");
        w.value("v", &json!({"k": null}));
        let m = Members::parse(br#"{"plain":1,"esc\"aped\u0041":[2]}"#).unwrap();
        for (name, value) in &m.0 {
            w.member(name, *value);
        }
        w.finish();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            json!({"id": "a\"b", "n": 7, "r": [1, {}], "v": {"k": null}, "plain": 1, "esc\"apedA": [2]})
        );
        let mut out = Vec::new();
        ObjectWriter::new(&mut out).finish();
        assert_eq!(out, b"{}");
    }
}
