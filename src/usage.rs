//! Token usage as OpenAI reports it, read from any answer.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Value, json};

use crate::json::members::ObjectWriter;

/// Prompt and completion tokens of one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// Reads an OpenAI `usage` object; `None` when absent or not an object.
    pub fn from_openai(v: Option<&Value>) -> Option<Usage> {
        let o = v?.as_object()?;
        let n = |k: &str| o.get(k).and_then(Value::as_u64).unwrap_or(0);
        Some(Usage {
            prompt_tokens: n("prompt_tokens"),
            completion_tokens: n("completion_tokens"),
        })
    }

    /// [`Usage::from_openai`] of a raw `usage` member, read without building a
    /// tree: on the answer path the usage object (with its `*_details`) was a
    /// tenth of the filter's work per request as a DOM.
    pub fn from_openai_raw(json: &str) -> Option<Usage> {
        serde_json::from_str::<WireUsage>(json).ok()?.0
    }

    /// [`Usage::to_json`] written straight into `w` (its members in the
    /// order serde's map gives them: names sorted), without a tree.
    pub fn write_json(self, mut w: ObjectWriter<'_>) {
        w.number("completion_tokens", self.completion_tokens);
        w.number("prompt_tokens", self.prompt_tokens);
        w.number("total_tokens", self.total());
        w.finish();
    }

    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total(),
        })
    }
}

/// Reads `usage` as `from_openai` reads its tree: an object gives its two counts
/// (the last of a repeated name wins, names may be escaped), anything else `None`.
struct WireUsage(Option<Usage>);

impl<'de> Deserialize<'de> for WireUsage {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UsageVisitor)
    }
}

struct UsageVisitor;

impl<'de> Visitor<'de> for UsageVisitor {
    type Value = WireUsage;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireUsage, A::Error> {
        let mut usage = Usage::default();
        while let Some(key) = map.next_key::<Key>()? {
            let count = |n: Option<u64>| n.unwrap_or(0);
            match key {
                Key::Prompt => usage.prompt_tokens = map.next_value_seed(AnyTo(count))?,
                Key::Completion => usage.completion_tokens = map.next_value_seed(AnyTo(count))?,
                Key::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(WireUsage(Some(usage)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<WireUsage, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(WireUsage(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<WireUsage, E> {
        Ok(WireUsage(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<WireUsage, E> {
        Ok(WireUsage(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<WireUsage, E> {
        Ok(WireUsage(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<WireUsage, E> {
        Ok(WireUsage(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<WireUsage, E> {
        Ok(WireUsage(None))
    }
    fn visit_unit<E>(self) -> Result<WireUsage, E> {
        Ok(WireUsage(None))
    }
}

/// The member names `usage` is read for.
enum Key {
    Prompt,
    Completion,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_str<E>(self, name: &str) -> Result<Key, E> {
                Ok(match name {
                    "prompt_tokens" => Key::Prompt,
                    "completion_tokens" => Key::Completion,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_str(KeyVisitor)
    }
}

/// Reads any JSON value and maps "a u64, or not" through `F` (`Value::as_u64`).
struct AnyTo<F>(F);

impl<'de, R, F: FnOnce(Option<u64>) -> R> de::DeserializeSeed<'de> for AnyTo<F> {
    type Value = R;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<R, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, R, F: FnOnce(Option<u64>) -> R> Visitor<'de> for AnyTo<F> {
    type Value = R;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_u64<E>(self, n: u64) -> Result<R, E> {
        Ok((self.0)(Some(n)))
    }
    fn visit_i64<E>(self, n: i64) -> Result<R, E> {
        Ok((self.0)(u64::try_from(n).ok()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<R, E> {
        Ok((self.0)(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<R, E> {
        Ok((self.0)(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<R, E> {
        Ok((self.0)(None))
    }
    fn visit_unit<E>(self) -> Result<R, E> {
        Ok((self.0)(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<R, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok((self.0)(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<R, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok((self.0)(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> Option<Usage> {
        Usage::from_openai_raw(json)
    }

    #[test]
    fn usage_is_written_as_its_tree_encodes() {
        for (prompt, completion) in [(0, 0), (8, 377), (u64::MAX, 1), (1234567890123, 9)] {
            let usage = Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
            };
            let mut out = Vec::new();
            usage.write_json(ObjectWriter::new(&mut out));
            assert_eq!(out, serde_json::to_vec(&usage.to_json()).unwrap());
        }
    }

    #[test]
    fn the_raw_read_equals_the_dom_read_for_every_shape() {
        for json in [
            r#"{"prompt_tokens":8,"completion_tokens":377,"total_tokens":385,
                "completion_tokens_details":{"reasoning_tokens":320,"audio_tokens":0},
                "prompt_tokens_details":{"cached_tokens":0}}"#,
            r#"{"prompt_tokens":3}"#,
            r#"{}"#,
            r#"{"prompt_tokens":-1,"completion_tokens":2.5}"#,
            r#"{"prompt_tokens":"7","completion_tokens":[1,{"a":2}]}"#,
            r#"{"prompt_tokens":{"n":1},"completion_tokens":null,"completion_tokens":true}"#,
            r#"{"prompt_tokens":18446744073709551615,"completion_tokens":1e3}"#,
            r#"null"#,
            r#"[{"prompt_tokens":1}]"#,
            r#""usage""#,
            r#"12"#,
            r#"false"#,
            r#"{"prompt\u005ftokens":5,"completion_tokens":4,"completion_tokens":"x"}"#,
            r#"{"completion_tokens":4,"completion_tokens":6}"#,
        ] {
            let dom: Value = serde_json::from_str(json).unwrap();
            assert_eq!(raw(json), Usage::from_openai(Some(&dom)), "{json}");
        }
    }
}
