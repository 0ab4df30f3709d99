//! Anthropic stream events read by one [`Walk`] instead of serde: in wasm,
//! serde's machinery per member is most of what an event costs, and a
//! `message_start` is mostly members nobody reads. One walk gives the
//! members [`super::RawEvent`] names, raw, and reads on its way the few
//! values inside them that the stream needs (a message's usage, a delta's
//! stop reason, the usage counts), so no part is read twice.
//!
//! Conservative, as the walk is: [`members`] answers only when serde would
//! read the event the same way, and says `None` otherwise (a member given
//! twice, an escape in a name or a needed string, a count that is not a
//! plain `u64`, a needed member of another type, anything not JSON),
//! leaving the event to serde, whose answer, error or not, then stands.

use std::borrow::Cow;

use super::WireUsage;
use crate::layout::{Token, offset_in};
use crate::split::{Walk, plain_u64};

/// What a scalar token of a `message_start` or `message_delta` holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Role {
    InputTokens,
    OutputTokens,
    CacheCreationInputTokens,
    CacheReadInputTokens,
    StopReason,
    /// A string or number the stream does not read (the message's id and
    /// model, which change with every stream).
    Unread(Token),
}

/// Where a token of the event is, and what it holds.
pub(super) type Span = (usize, usize, Role);

/// The members of an event that [`super::RawEvent`] names, raw, and what a
/// walk read inside them (`None`: not read, serde's to read).
#[derive(Default)]
pub(super) struct Members<'a> {
    pub kind: Cow<'a, str>,
    pub index: Option<&'a str>,
    pub delta: Option<&'a str>,
    pub content_block: Option<&'a str>,
    pub message: Option<&'a str>,
    pub usage: Option<&'a str>,
    pub error: Option<&'a str>,
    /// The `message` object's `usage`.
    pub message_usage: Option<Option<WireUsage>>,
    /// The `delta` object's `stop_reason`.
    pub stop_reason: Option<Option<&'a str>>,
    /// The `usage` member's counts.
    pub usage_counts: Option<Option<WireUsage>>,
}

/// An event's members, as serde would give them to [`super::RawEvent`];
/// `spans` gets, in order, where the counts, the stop reason and the
/// message's and delta's other strings and numbers are.
pub(super) fn members<'a>(data: &'a str, spans: &mut Vec<Span>) -> Option<Members<'a>> {
    spans.clear();
    let mut m = Members::default();
    let mut kind = None;
    let mut walk = Walk::raw(data);
    walk.object(&mut |name, w| {
        match name {
            "type" => kind = Some(once(&kind).and_then(|()| w.value())?),
            "index" => m.index = Some(once(&m.index).and_then(|()| w.value())?),
            "content_block" => m.content_block = Some(once(&m.content_block).and_then(|()| w.value())?),
            "error" => m.error = Some(once(&m.error).and_then(|()| w.value())?),
            "message" => {
                once(&m.message)?;
                let mut usage = None;
                m.message = Some(w.object(&mut |name, w| {
                    if name == "usage" {
                        once(&usage)?;
                        usage = Some(counts(data, w, spans)?);
                    } else {
                        unread(data, w.value()?, spans)?;
                    }
                    Some(())
                })?);
                m.message_usage = Some(usage.flatten());
            }
            "delta" => {
                once(&m.delta)?;
                let mut reason = None;
                m.delta = Some(w.object(&mut |name, w| {
                    if name == "stop_reason" {
                        once(&reason)?;
                        reason = Some(match w.value()? {
                            "null" => None,
                            raw => {
                                spans.push(span(data, raw, Role::StopReason)?);
                                Some(plain_string(raw)?)
                            }
                        });
                    } else {
                        unread(data, w.value()?, spans)?;
                    }
                    Some(())
                })?);
                m.stop_reason = Some(reason.flatten());
            }
            "usage" => {
                once(&m.usage)?;
                w.peek()?;
                let start = w.position();
                m.usage_counts = Some(counts(data, w, spans)?);
                m.usage = data.get(start..w.position());
            }
            _ => {
                w.value()?;
            }
        }
        Some(())
    })?;
    walk.end()?;
    m.kind = Cow::Borrowed(plain_string(kind?)?);
    Some(m)
}

/// A `usage` value: `null`, or an object's counts.
fn counts<'a>(data: &'a str, w: &mut Walk<'a>, spans: &mut Vec<Span>) -> Option<Option<WireUsage>> {
    if w.peek()? == b'n' {
        return (w.value()? == "null").then_some(None);
    }
    let mut usage = WireUsage::default();
    // Which counts were given: a `null` one leaves its slot empty.
    let mut given = 0u8;
    w.object(&mut |name, w| {
        let (bit, slot, role) = match name {
            "input_tokens" => (1, &mut usage.input_tokens, Role::InputTokens),
            "output_tokens" => (2, &mut usage.output_tokens, Role::OutputTokens),
            "cache_creation_input_tokens" => (
                4,
                &mut usage.cache_creation_input_tokens,
                Role::CacheCreationInputTokens,
            ),
            "cache_read_input_tokens" => (8, &mut usage.cache_read_input_tokens, Role::CacheReadInputTokens),
            _ => return unread(data, w.value()?, spans),
        };
        if given & bit != 0 {
            return None;
        }
        given |= bit;
        *slot = match w.value()? {
            "null" => None,
            number => {
                spans.push(span(data, number, role)?);
                Some(plain_u64(number)?)
            }
        };
        Some(())
    })?;
    Some(Some(usage))
}

/// Notes where `raw` is when it is a string or a number, which a layout
/// then leaves open; any other value is part of the layout.
fn unread(data: &str, raw: &str, spans: &mut Vec<Span>) -> Option<()> {
    let token = match raw.as_bytes().first()? {
        b'"' => Token::String,
        b'-' | b'0'..=b'9' => Token::Number,
        _ => return Some(()),
    };
    spans.push(span(data, raw, Role::Unread(token))?);
    Some(())
}

fn span(data: &str, raw: &str, role: Role) -> Option<Span> {
    let at = offset_in(data, raw)?;
    Some((at, at.checked_add(raw.len())?, role))
}

/// The text of a string token with no escapes (serde borrows those as
/// they are).
fn plain_string(raw: &str) -> Option<&str> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then_some(inner)
}

/// `Some` while a member is not yet given: serde refuses a member given twice.
fn once<T>(slot: &Option<T>) -> Option<()> {
    slot.is_none().then_some(())
}
