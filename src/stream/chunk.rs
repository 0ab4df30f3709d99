//! Reading an OpenAI chat chunk for the copy ([`super::StreamRewriter`]
//! copies a provider's chunk member by member instead of translating it).
//!
//! One walk reads the top-level members and, of `choices`, what each choice
//! holds that the copy needs. Anything unusual says `None`, and the event
//! goes to the translator, whose errors name the problem.

use crate::json::split::Walk;

/// What [`super::StreamRewriter::copy_chunk`] reads of one event: of the
/// (last) `choices` array, what each choice holds; the rest is copied (the
/// extras as [`read_chunk`] writes them).
pub(super) struct ChunkRead<'a> {
    pub choices: Option<&'a str>,
    pub choices_read: Vec<ChoiceRead<'a>>,
    /// An `error`, or a `usage` other than `null`: the translator's event.
    pub error_or_usage: bool,
}

/// One choice's members that the copy needs (`null` reads as absent, as
/// serde reads an `Option`).
#[derive(Default)]
pub(super) struct ChoiceRead<'a> {
    pub index: Option<&'a str>,
    /// The delta's `content` (`null` included) when the delta is an object.
    pub delta: Option<Option<&'a str>>,
    pub text: Option<&'a str>,
    pub finish_reason: Option<&'a str>,
}

/// Reads an event for the copy; `None` leaves it to the translator: not
/// plain JSON (an escaped name, say), `choices` not an array of objects, a
/// delta neither an object nor `null`, or a member a choice repeats.
/// `extras` gets the extras read, as the copy writes them, and
/// `choices_read` (empty) the choices: the stream's buffers, reused, no
/// allocation per chunk.
pub(super) fn read_chunk<'a>(
    data: &'a str,
    extras: &mut Vec<u8>,
    choices_read: Vec<ChoiceRead<'a>>,
) -> Option<ChunkRead<'a>> {
    extras.clear();
    let mut chunk = ChunkRead {
        choices: None,
        choices_read,
        error_or_usage: false,
    };
    let mut walk = Walk::raw(data);
    walk.object(&mut |name: &'a str, walk: &mut Walk<'a>| {
        let value = match name {
            "choices" => {
                let read = &mut chunk.choices_read;
                read.clear();
                let raw = walk.array(&mut |walk| {
                    read.push(read_choice(walk)?);
                    Some(())
                })?;
                chunk.choices = Some(raw);
                raw
            }
            _ => walk.value()?,
        };
        chunk.error_or_usage |= is_error_or_usage(name, value);
        write_extra(name, value, extras);
        Some(())
    })?;
    walk.end()?;
    Some(chunk)
}

/// A member other than those the copy writes itself (the stream's id,
/// object, created and model, `usage`, `choices`), written as it came.
fn write_extra(name: &str, value: &str, out: &mut Vec<u8>) {
    if !matches!(name, "id" | "object" | "created" | "model" | "usage" | "choices") {
        // The walk reads only names without escapes: copied as they are.
        out.extend_from_slice(b",\"");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b"\":");
        out.extend_from_slice(value.as_bytes());
    }
}

/// An `error`, or a `usage` other than `null`: the translator's event.
fn is_error_or_usage(name: &str, value: &str) -> bool {
    name == "error" || (name == "usage" && value != "null")
}

pub(super) fn read_choice<'a>(walk: &mut Walk<'a>) -> Option<ChoiceRead<'a>> {
    let mut choice = ChoiceRead::default();
    let mut seen = [false; 4];
    walk.object(&mut |name, walk| {
        let field = match name {
            "index" => 0,
            "delta" => 1,
            "text" => 2,
            "finish_reason" => 3,
            _ => return walk.value().map(drop),
        };
        // serde refuses a repeated field; so does this.
        let first = seen.get_mut(field).map(|seen| !std::mem::replace(seen, true))?;
        if !first {
            return None;
        }
        if field == 1 {
            choice.delta = read_delta(walk)?;
            return Some(());
        }
        let raw = walk.value()?;
        let raw = (raw != "null").then_some(raw);
        match field {
            0 => choice.index = raw,
            2 => choice.text = raw,
            _ => choice.finish_reason = raw,
        }
        Some(())
    })?;
    Some(choice)
}

/// `Some(None)` for a `null` delta, `Some(Some(content))` for an object.
fn read_delta<'a>(walk: &mut Walk<'a>) -> Option<Option<Option<&'a str>>> {
    if walk.peek()? == b'n' {
        return (walk.value()? == "null").then_some(None);
    }
    let (mut content, mut seen) = (None, false);
    walk.object(&mut |name, walk| {
        let raw = walk.value()?;
        if name == "content" {
            if std::mem::replace(&mut seen, true) {
                return None;
            }
            content = Some(raw);
        }
        Some(())
    })?;
    Some(Some(content))
}
