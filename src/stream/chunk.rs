//! Reading an OpenAI chat chunk for the copy ([`super::StreamRewriter`]
//! copies a provider's chunk member by member instead of translating it).
//!
//! One walk reads the top-level members and, of `choices`, what each choice
//! holds that the copy needs. Anything unusual says `None`, and the event
//! goes to the translator, whose errors name the problem.
//!
//! Providers repeat most of a chunk byte for byte: the members before
//! `choices` (id, object, created, model, ...) and, in a text delta, the
//! choice around its content. [`Preamble`] keeps what the last chunk held
//! there, so a chunk that starts the same way is read from where it differs.
//! JSON is context-free: bytes that read one way after the same bytes read
//! the same way again, and any string token can stand where another stood.

use crate::json::layout::{Layout, offset_in};
use crate::json::split::Walk;
use crate::scan;

/// What [`super::StreamRewriter::copy_chunk`] reads of one event: of the
/// (last) `choices` array, what each choice holds; the rest is copied (the
/// extras as [`read_chunk`] writes them).
pub(super) struct ChunkRead<'a> {
    /// The chunk starts with the last one's preamble, whose extras it has
    /// ([`Preamble::extras`]); those [`read_chunk`] wrote are the rest.
    pub after_preamble: bool,
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

/// What the last chunk read held before its `choices`: the bytes up to that
/// member's value, what the copy takes from the members among them, and how
/// its one choice was laid out around the delta's content.
#[derive(Default)]
pub(super) struct Preamble {
    text: String,
    /// Its members other than those the copy writes itself, as the copy
    /// writes them ([`write_extra`]).
    extras: Vec<u8>,
    /// It holds an `error` or a `usage` other than `null`.
    error_or_usage: bool,
    choice: Option<ChoiceTemplate>,
}

/// A `choices` array of one choice whose delta's content is a string: its
/// layout around that string, and where the choice's other members sat.
struct ChoiceTemplate {
    layout: Layout,
    /// Ranges in the array's text; one at or past the string lies after it.
    index: Option<(usize, usize)>,
    finish_reason: Option<(usize, usize)>,
    /// The length of the content string it was made from.
    content_len: usize,
}

/// Reads an event for the copy; `None` leaves it to the translator: not
/// plain JSON (an escaped name, say), `choices` not an array of objects, a
/// delta neither an object nor `null`, or a member a choice repeats.
/// `preamble` is what the last event read held, and becomes this one's;
/// `extras` gets the extras read (after the preamble, those after it), as
/// the copy writes them, and `choices_read` (empty) the choices: the
/// stream's buffers, reused, no allocation per chunk.
pub(super) fn read_chunk<'a>(
    data: &'a str,
    preamble: &mut Preamble,
    extras: &mut Vec<u8>,
    choices_read: Vec<ChoiceRead<'a>>,
) -> Option<ChunkRead<'a>> {
    extras.clear();
    let mut chunk = ChunkRead {
        after_preamble: false,
        choices: None,
        choices_read,
        error_or_usage: false,
    };
    let known = !preamble.text.is_empty() && scan::starts_with(data.as_bytes(), preamble.text.as_bytes());
    // Where the walk resumes, and whether `choices` was read already.
    let mut resume = None;
    if known {
        chunk.after_preamble = true;
        chunk.error_or_usage = preamble.error_or_usage;
        let at = preamble.text.len();
        resume = Some((at, false));
        if let Some((raw, choice)) = preamble.choice.as_ref().and_then(|t| t.read(data, at)) {
            chunk.choices = Some(raw);
            chunk.choices_read.push(choice);
            resume = Some((at.wrapping_add(raw.len()), true));
        }
    }
    // Where the first `choices` value starts; the extras written before it,
    // and whether an error or usage came before it.
    let mut choices_at = None;
    let mut member = |name: &'a str, walk: &mut Walk<'a>| {
        let value = match name {
            "choices" => {
                if choices_at.is_none() {
                    choices_at = Some((walk.position(), extras.len(), chunk.error_or_usage));
                }
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
    };
    match resume {
        Some((at, templated)) => {
            let mut walk = Walk::raw_resumed(data, at);
            if templated {
                walk.rest_after_value(&mut member)?;
            } else {
                walk.rest_of_object("choices", &mut member)?;
            }
            walk.end()?;
            if !templated {
                preamble.choice = ChoiceTemplate::of(data, at, &chunk);
            }
        }
        None => {
            let mut walk = Walk::raw(data);
            walk.object(&mut member)?;
            walk.end()?;
            preamble.remember(data, choices_at, &chunk, extras);
        }
    }
    Some(chunk)
}

impl Preamble {
    /// The extras of the members it holds, written.
    pub fn extras(&self) -> &[u8] {
        &self.extras
    }

    /// `data` was read whole: keeps what it held before the first `choices`
    /// (`choices_at`: where its value starts, how much of `extras` was
    /// written before it, and whether an error or usage came before it).
    fn remember(&mut self, data: &str, choices_at: Option<(usize, usize, bool)>, chunk: &ChunkRead<'_>, extras: &[u8]) {
        self.text.clear();
        self.extras.clear();
        self.choice = None;
        let Some((at, written, error_or_usage)) = choices_at else {
            return;
        };
        let (Some(head), Some(before)) = (data.get(..at), extras.get(..written)) else {
            return;
        };
        self.text.push_str(head);
        self.extras.extend_from_slice(before);
        self.error_or_usage = error_or_usage;
        self.choice = ChoiceTemplate::of(data, at, chunk);
    }
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

impl ChoiceTemplate {
    /// The template of `chunk`'s choices when they are one choice with a
    /// string content, the array starting at `at` (the first `choices`,
    /// with no space before its value).
    fn of(data: &str, at: usize, chunk: &ChunkRead<'_>) -> Option<ChoiceTemplate> {
        let raw = chunk.choices?;
        let [choice] = chunk.choices_read.as_slice() else {
            return None;
        };
        let content = choice.delta.flatten().filter(|c| c.starts_with('"'))?;
        if offset_in(data, raw)? != at || choice.text.is_some() {
            return None;
        }
        let hole = offset_in(raw, content)?;
        let span = |part: Option<&str>| -> Option<Option<(usize, usize)>> {
            let Some(part) = part else { return Some(None) };
            let from = offset_in(raw, part)?;
            Some(Some((from, from.wrapping_add(part.len()))))
        };
        Some(ChoiceTemplate {
            layout: Layout::around(raw, 0, hole, hole.wrapping_add(content.len()), raw.len())?,
            index: span(choice.index)?,
            finish_reason: span(choice.finish_reason)?,
            content_len: content.len(),
        })
    }

    /// The `choices` array at `at` in `data` when it is laid out as this
    /// template with another string for content, and its one choice.
    fn read<'a>(&self, data: &'a str, at: usize) -> Option<(&'a str, ChoiceRead<'a>)> {
        let found = self.layout.read(data, at)?;
        let raw = data.get(at..found.after_end)?;
        let content_len = found.end.wrapping_sub(found.start);
        let before = self.layout.before_len();
        let place = |span: Option<(usize, usize)>| -> Option<Option<&'a str>> {
            let Some((from, to)) = span else { return Some(None) };
            if from < before {
                return raw.get(from..to).map(Some);
            }
            // After the content: moved by the difference in its length.
            let shift = |o: usize| o.wrapping_sub(self.content_len).wrapping_add(content_len);
            raw.get(shift(from)..shift(to)).map(Some)
        };
        let choice = ChoiceRead {
            index: place(self.index)?,
            delta: Some(Some(data.get(found.start..found.end)?)),
            text: None,
            finish_reason: place(self.finish_reason)?,
        };
        Some((raw, choice))
    }
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
