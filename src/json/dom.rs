//! JSON text into `serde_json::Value`, read literally.
//!
//! With serde_json's `raw_value` feature on (we need it for `RawValue`), `Value`'s own
//! `Deserialize` treats an object whose first key is `$serde_json::private::RawValue` as
//! a raw value in disguise: `{"$serde_json::private::RawValue":"[1]"}` reads as `[1]`.
//! A client could so make the gateway see one value while the bytes it forwards say
//! another. This visitor builds the same `Value` but takes every key as a key.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Parses `text` as one JSON value (trailing whitespace allowed, nothing else).
pub fn parse(text: &str) -> Result<Value, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let value = Literal.deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// [`parse`] for bytes that may not be UTF-8 (the error then says where the bad byte is).
pub fn parse_slice(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    parse(super::utf8(bytes)?)
}

/// Builds a `Value` with no key treated specially.
#[derive(Clone, Copy)]
struct Literal;

impl<'de> DeserializeSeed<'de> for Literal {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Literal {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // serde_json never hands a non-finite number to a visitor; Null as Value does.
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut members = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            members.insert(key, value);
        }
        Ok(Value::Object(members))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const MAGIC: &str = "$serde_json::private::RawValue";

    #[test]
    fn the_raw_value_key_is_an_ordinary_key() {
        let text = format!(r#"{{"{MAGIC}":"[1]"}}"#);
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!([1]),
            "serde_json's own Value misreads it (why this module exists)"
        );
        let mut expected = Map::new();
        expected.insert(MAGIC.to_owned(), json!("[1]"));
        assert_eq!(parse(&text).unwrap(), Value::Object(expected.clone()));
        assert_eq!(parse_slice(text.as_bytes()).unwrap(), Value::Object(expected));
        // Escaped, nested, or not first: still a key.
        let escaped = r#"{"a":{"\u0024serde_json::private::RawValue":"2"}}"#;
        assert_eq!(parse(escaped).unwrap()["a"][MAGIC], json!("2"));
    }

    #[test]
    fn everything_else_reads_as_serde_json_reads_it() {
        for text in [
            r#"{"model":"openai/gpt-4o","messages":[{"role":"user","content":"hé \ud83d\ude00"}],"temperature":0.7}"#,
            r#"[null,true,false,0,-1,18446744073709551615,-9223372036854775808,1.5e300,0.1,"",{},[]]"#,
            r#"  "text"  "#,
            r#"{"dup":1,"dup":2}"#,
        ] {
            assert_eq!(
                parse(text).unwrap(),
                serde_json::from_str::<Value>(text).unwrap(),
                "{text}"
            );
        }
        for bad in ["", "{", "[1,]", "{\"a\":1} x", "nan", "\"\\ud800\""] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse_slice(b"{\"a\":\"\xff\"}").is_err());
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(parse(&deep).is_err(), "serde_json's recursion limit still holds");
    }
}
