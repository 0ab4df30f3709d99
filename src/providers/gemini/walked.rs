//! Gemini stream chunks read by one [`Walk`] instead of serde, which also
//! notes where the chunk's texts, finish reason, response id and usage
//! numbers are: the layout the next
//! chunk is read by ([`super::text_chunk`]) is then known at no extra cost
//! (a second walk to find it cost more than reading one chunk).
//!
//! Conservative, as the walk is: [`response`] answers only for a chunk that
//! serde would read the same way, and says `None` otherwise (a member given
//! twice, an escape in a name, a count that is not a plain `u64`, a
//! function call, an `error`, a member of a type serde would refuse or read
//! another way, anything not JSON), leaving the chunk to serde, whose
//! answer, error or not, then stands.

use super::{Candidate, Content, PromptFeedback, UsageMetadata, WirePart, WireResponse};
use crate::json::json_text;
use crate::layout::offset_in;
use crate::split::{Walk, plain_u64};

/// Where a token of the chunk is, and what it holds.
pub(super) type Span = (usize, usize, Role);

/// What a token of a chunk holds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Role {
    Text,
    PromptCount,
    ToolUsePromptCount,
    CandidatesCount,
    ThoughtsCount,
    /// A number the stream does not read (`totalTokenCount`, say).
    Unread,
    FinishReason,
    ResponseId,
}

impl Role {
    /// The role of `usageMetadata`'s member `name`.
    pub(super) fn of_count(name: &str) -> Role {
        match name {
            "promptTokenCount" => Role::PromptCount,
            "toolUsePromptTokenCount" => Role::ToolUsePromptCount,
            "candidatesTokenCount" => Role::CandidatesCount,
            "thoughtsTokenCount" => Role::ThoughtsCount,
            _ => Role::Unread,
        }
    }

    /// A bit of its own, to tell a member given twice.
    pub(super) fn bit(self) -> u8 {
        match self {
            Role::Text => 1,
            Role::PromptCount => 2,
            Role::ToolUsePromptCount => 4,
            Role::CandidatesCount => 8,
            Role::ThoughtsCount => 16,
            Role::Unread => 32,
            Role::FinishReason => 64,
            Role::ResponseId => 128,
        }
    }
}

/// The chunk as serde would read it into a [`WireResponse`]; `spans` gets
/// where each part's text, each finish reason, the response id and each
/// number of `usageMetadata` is, in order.
pub(super) fn response(data: &str, spans: &mut Vec<Span>) -> Option<WireResponse> {
    spans.clear();
    let mut response = WireResponse {
        candidates: None,
        prompt_feedback: None,
        usage_metadata: None,
        response_id: None,
        error: false,
    };
    let mut given = Given::default();
    let mut walk = Walk::raw(data);
    walk.object(&mut |name, w| {
        match name {
            "candidates" => {
                given.first(1)?;
                response.candidates = nullable(w, |w| {
                    let mut candidates = Vec::new();
                    w.array(&mut |w| {
                        candidates.push(candidate(data, w, spans)?);
                        Some(())
                    })?;
                    Some(candidates)
                })?;
            }
            "promptFeedback" => {
                given.first(2)?;
                response.prompt_feedback = nullable(w, |w| {
                    let mut feedback = PromptFeedback { block_reason: None };
                    let mut given = Given::default();
                    w.object(&mut |name, w| {
                        if name == "blockReason" {
                            given.first(1)?;
                            feedback.block_reason = string(w)?.map(|(text, _)| text);
                        } else {
                            w.value()?;
                        }
                        Some(())
                    })?;
                    Some(feedback)
                })?;
            }
            "usageMetadata" => {
                given.first(4)?;
                response.usage_metadata = nullable(w, |w| usage(data, w, spans))?;
            }
            "responseId" => {
                given.first(8)?;
                response.response_id = spanned_string(data, w, spans, Role::ResponseId)?;
            }
            // An error is read through a DOM, by serde.
            "error" => return None,
            _ => {
                w.value()?;
            }
        }
        Some(())
    })?;
    walk.end()?;
    Some(response)
}

fn candidate(data: &str, w: &mut Walk<'_>, spans: &mut Vec<Span>) -> Option<Candidate> {
    let mut candidate = Candidate {
        content: None,
        finish_reason: None,
        index: None,
    };
    let mut given = Given::default();
    w.object(&mut |name, w| {
        match name {
            "content" => {
                given.first(1)?;
                candidate.content = nullable(w, |w| content(data, w, spans))?;
            }
            "finishReason" => {
                given.first(2)?;
                candidate.finish_reason = spanned_string(data, w, spans, Role::FinishReason)?;
            }
            "index" => {
                given.first(4)?;
                candidate.index = count(w)?.map(|(n, _)| n);
            }
            _ => {
                w.value()?;
            }
        }
        Some(())
    })?;
    Some(candidate)
}

fn content(data: &str, w: &mut Walk<'_>, spans: &mut Vec<Span>) -> Option<Content> {
    let mut parts = Vec::new();
    let mut given = Given::default();
    w.object(&mut |name, w| {
        if name != "parts" {
            return w.value().map(drop);
        }
        given.first(1)?;
        // `parts` has a default when absent, but `null` is serde's to refuse.
        w.array(&mut |w| {
            parts.push(part(data, w, spans)?);
            Some(())
        })?;
        Some(())
    })?;
    Some(Content { parts })
}

fn part(data: &str, w: &mut Walk<'_>, spans: &mut Vec<Span>) -> Option<WirePart> {
    let mut part = WirePart {
        text: None,
        thought: false,
        function_call: None,
        thought_signature: None,
    };
    let mut given = Given::default();
    w.object(&mut |name, w| {
        match name {
            "text" => {
                given.first(1)?;
                part.text = spanned_string(data, w, spans, Role::Text)?;
            }
            "thought" => {
                given.first(2)?;
                part.thought = match w.value()? {
                    "true" => true,
                    "false" => false,
                    _ => return None,
                };
            }
            // A call's arguments are any JSON: serde's to read.
            "functionCall" => {
                given.first(4)?;
                (w.value()? == "null").then_some(())?;
            }
            "thoughtSignature" => {
                given.first(8)?;
                part.thought_signature = string(w)?.map(|(text, _)| text);
            }
            _ => {
                w.value()?;
            }
        }
        Some(())
    })?;
    Some(part)
}

fn usage(data: &str, w: &mut Walk<'_>, spans: &mut Vec<Span>) -> Option<UsageMetadata> {
    let mut usage = UsageMetadata {
        prompt_token_count: None,
        tool_use_prompt_token_count: None,
        candidates_token_count: None,
        thoughts_token_count: None,
    };
    let mut given = Given::default();
    w.object(&mut |name, w| {
        let role = Role::of_count(name);
        let slot = match role {
            Role::PromptCount => &mut usage.prompt_token_count,
            Role::ToolUsePromptCount => &mut usage.tool_use_prompt_token_count,
            Role::CandidatesCount => &mut usage.candidates_token_count,
            Role::ThoughtsCount => &mut usage.thoughts_token_count,
            // Another member: only where its number is, if it is one.
            _ => {
                let raw = w.value()?;
                if raw.starts_with(|c: char| c == '-' || c.is_ascii_digit()) {
                    spans.push(span(data, raw, Role::Unread)?);
                }
                return Some(());
            }
        };
        given.first(role.bit())?;
        *slot = match count(w)? {
            Some((n, raw)) => {
                spans.push(span(data, raw, role)?);
                Some(n)
            }
            None => None,
        };
        Some(())
    })?;
    Some(usage)
}

fn span(data: &str, raw: &str, role: Role) -> Option<Span> {
    let at = offset_in(data, raw)?;
    Some((at, at.checked_add(raw.len())?, role))
}

/// `null`, or what `read` makes of the value.
fn nullable<'a, T>(w: &mut Walk<'a>, read: impl FnOnce(&mut Walk<'a>) -> Option<T>) -> Option<Option<T>> {
    if w.peek()? == b'n' {
        return (w.value()? == "null").then_some(None);
    }
    read(w).map(Some)
}

/// An optional string: `null`, or its text and its token.
fn string<'a>(w: &mut Walk<'a>) -> Option<Option<(String, &'a str)>> {
    match w.value()? {
        "null" => Some(None),
        raw if raw.starts_with('"') => json_text(raw).map(|text| Some((text.into_owned(), raw))),
        _ => None,
    }
}

/// An optional string whose token, when it is one, goes into `spans` as `role`.
fn spanned_string(data: &str, w: &mut Walk<'_>, spans: &mut Vec<Span>, role: Role) -> Option<Option<String>> {
    match string(w)? {
        Some((text, raw)) => {
            spans.push(span(data, raw, role)?);
            Some(Some(text))
        }
        None => Some(None),
    }
}

/// An optional count: `null`, or a plain `u64` and its token.
fn count<'a>(w: &mut Walk<'a>) -> Option<Option<(u64, &'a str)>> {
    match w.value()? {
        "null" => Some(None),
        number => plain_u64(number).map(|n| Some((n, number))),
    }
}

/// The members of one object given so far: serde refuses one given twice.
#[derive(Default)]
struct Given(u8);

impl Given {
    /// `Some` the first time member `bit` is given.
    fn first(&mut self, bit: u8) -> Option<()> {
        if self.0 & bit != 0 {
            return None;
        }
        self.0 |= bit;
        Some(())
    }
}
