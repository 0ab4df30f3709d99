//! What the request rules see of a JSON value, read from either of two
//! forms of the same body: the client's text, which a walk has held
//! to what serde's `Value` accepts, so no DOM is built (in wasm the DOM was
//! the largest single cost of a request); or serde's DOM, for text the walk
//! is not sure of. The rules (`super::rules`) are written once over
//! [`View`]; the tests and the `request` fuzz target hold the two forms to
//! the same answers.

use std::borrow::Cow;

use serde_json::{Number, Value};

use crate::json::split::Walk;

/// The raw form cannot read a part exactly as serde would: the DOM's to
/// answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unsure;

/// A value's JSON type (and a boolean's value, which is all the rules read
/// of one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Null,
    Bool(bool),
    Number,
    String,
    Array,
    Object,
}

/// A JSON value as the rules read it, in either form. The raw form may be
/// [`Unsure`] of a part the walk does not read exactly as serde does (a
/// member name with escapes); the DOM never is.
#[derive(Debug, Clone, Copy)]
pub(super) enum View<'a> {
    /// The value's text, from a body a [`Walk::values`] accepted.
    Raw(&'a str),
    Dom(&'a Value),
}

impl<'a> View<'a> {
    pub fn kind(self) -> Kind {
        let raw = match self {
            View::Raw(raw) => raw,
            View::Dom(value) => {
                return match value {
                    Value::Null => Kind::Null,
                    Value::Bool(b) => Kind::Bool(*b),
                    Value::Number(_) => Kind::Number,
                    Value::String(_) => Kind::String,
                    Value::Array(_) => Kind::Array,
                    Value::Object(_) => Kind::Object,
                };
            }
        };
        match raw.as_bytes().first() {
            Some(b'"') => Kind::String,
            Some(b'[') => Kind::Array,
            Some(b'{') => Kind::Object,
            Some(b't') => Kind::Bool(true),
            Some(b'f') => Kind::Bool(false),
            Some(b'n') => Kind::Null,
            // The walk held the text to JSON: what is left starts a number.
            _ => Kind::Number,
        }
    }

    /// A string's text.
    pub fn text(self) -> Result<Cow<'a, str>, Unsure> {
        match self {
            View::Raw(raw) => crate::json::json_text(raw),
            View::Dom(value) => value.as_str().map(Cow::Borrowed),
        }
        .ok_or(Unsure)
    }

    /// A number, as serde_json reads it (u64, i64 or the nearest f64).
    pub fn number(self) -> Result<Number, Unsure> {
        match self {
            // serde_json's own number reader, so the DOM's number exactly.
            View::Raw(raw) => raw.parse().ok(),
            View::Dom(value) => value.as_number().cloned(),
        }
        .ok_or(Unsure)
    }

    /// Calls `element(index, value)` for each element of an array, in
    /// order, stopping at the first error; how many there were.
    pub fn elements<E: From<Unsure>>(
        self,
        element: &mut dyn FnMut(usize, View<'a>) -> Result<(), E>,
    ) -> Result<usize, E> {
        let raw = match self {
            View::Raw(raw) => raw,
            View::Dom(value) => {
                let items = value.as_array().ok_or(Unsure)?;
                for (i, item) in items.iter().enumerate() {
                    element(i, View::Dom(item))?;
                }
                return Ok(items.len());
            }
        };
        let (mut count, mut failed) = (0usize, None);
        let walked = Walk::values(raw).array(&mut |walk| {
            let value = walk.value()?;
            if let Err(e) = element(count, View::Raw(value)) {
                failed = Some(e);
                return None;
            }
            count = count.saturating_add(1);
            Some(())
        });
        match (failed, walked) {
            (Some(e), _) => Err(e),
            (None, Some(_)) => Ok(count),
            (None, None) => Err(Unsure.into()),
        }
    }

    /// Calls `member(name, value)` for each member of an object. A repeated
    /// name comes again and again in the raw form, once in the DOM with its
    /// last value: a caller keeping the last of each reads both alike.
    pub fn members(self, member: &mut dyn FnMut(&str, View<'a>)) -> Result<(), Unsure> {
        match self {
            // A name with escapes stops the walk: serde's to read.
            View::Raw(raw) => Walk::values(raw)
                .object(&mut |name, walk| {
                    member(name, View::Raw(walk.value()?));
                    Some(())
                })
                .map(|_| ())
                .ok_or(Unsure),
            View::Dom(value) => {
                for (name, value) in value.as_object().ok_or(Unsure)? {
                    member(name, View::Dom(value));
                }
                Ok(())
            }
        }
    }
}
