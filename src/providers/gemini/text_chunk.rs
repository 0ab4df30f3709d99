//! Gemini text chunks read from a layout: a stream's chunks repeat each
//! other byte for byte but for the text, the usage counts and, from one
//! stream to the next, the response id (and reading one with serde costs
//! far more than comparing it with the last). A chunk the walk read
//! ([`super::walked`]) whose one candidate says one text part and nothing
//! else, finishing or not, becomes a [`TextChunk`]: its bytes around the
//! text, the finish reason, the response id and each number of its
//! `usageMetadata` ([`Holes`]). A chunk laid out the same way is that chunk
//! with other values there; any other chunk is read the long way, and may
//! leave its own layout.

use super::walked::{Role, Span};
use super::{Candidate, Content, UsageMetadata, WirePart, WireResponse};
use crate::json::json_text;
use crate::layout::{Holes, Token};
use crate::split::plain_u64;

/// A text chunk's layout, and what it held that its holes do not.
pub(super) struct TextChunk {
    holes: Holes,
    /// What each hole holds, in order.
    roles: Vec<Role>,
    index: Option<u64>,
    /// The chunk had `usageMetadata` (its counts are holes or fixed `null`s).
    usage: bool,
}

impl TextChunk {
    /// The layout of `data`, which the walk read as `response` with its
    /// tokens at `spans` (in order), when that is a plain text chunk: one
    /// candidate, one part with a text and nothing else the stream reads,
    /// no prompt feedback, no error.
    pub(super) fn of(data: &str, response: &WireResponse, spans: &[Span]) -> Option<TextChunk> {
        let [candidate] = response.candidates.as_deref()? else {
            return None;
        };
        let [part] = candidate.content.as_ref()?.parts.as_slice() else {
            return None;
        };
        let plain = part.text.is_some() && !part.thought && part.function_call.is_none();
        if !plain
            || response.error
            || part.thought_signature.is_some()
            || response.prompt_feedback.is_some()
            || spans.iter().filter(|(_, _, role)| *role == Role::Text).count() != 1
        {
            return None;
        }
        let holes = spans
            .iter()
            .map(|(start, end, role)| {
                let token = match role {
                    Role::Text | Role::FinishReason | Role::ResponseId => Token::String,
                    _ => Token::Number,
                };
                (*start, *end, token)
            })
            .collect();
        Some(TextChunk {
            holes: Holes::around(data, holes)?,
            roles: spans.iter().map(|(_, _, role)| *role).collect(),
            index: candidate.index,
            usage: response.usage_metadata.is_some(),
        })
    }

    /// Whether chunks laid out this way finish their candidate.
    pub(super) fn finishing(&self) -> bool {
        self.roles.contains(&Role::FinishReason)
    }

    /// `data` as serde would read it, when it is laid out as this chunk
    /// and its holes read as serde reads them; `spans` is scratch space.
    pub(super) fn read(&self, data: &str, spans: &mut Vec<(usize, usize)>) -> Option<WireResponse> {
        self.holes.read(data, spans)?;
        // A string the layout has no hole for was `null` or absent.
        let (mut text, mut finish_reason, mut response_id) = (None, None, None);
        let mut usage = UsageMetadata {
            prompt_token_count: None,
            tool_use_prompt_token_count: None,
            candidates_token_count: None,
            thoughts_token_count: None,
        };
        for ((start, end), role) in spans.iter().zip(&self.roles) {
            let token = data.get(*start..*end)?;
            let count = || plain_u64(token).map(Some);
            let string = || json_text(token).map(|text| Some(text.into_owned()));
            match role {
                Role::Text => text = string()?,
                Role::FinishReason => finish_reason = string()?,
                Role::ResponseId => response_id = string()?,
                Role::PromptCount => usage.prompt_token_count = count()?,
                Role::ToolUsePromptCount => usage.tool_use_prompt_token_count = count()?,
                Role::CandidatesCount => usage.candidates_token_count = count()?,
                Role::ThoughtsCount => usage.thoughts_token_count = count()?,
                Role::Unread => {}
            }
        }
        let part = WirePart {
            text: Some(text?),
            thought: false,
            function_call: None,
            thought_signature: None,
        };
        Some(WireResponse {
            candidates: Some(vec![Candidate {
                content: Some(Content { parts: vec![part] }),
                finish_reason,
                index: self.index,
            }]),
            prompt_feedback: None,
            usage_metadata: self.usage.then_some(usage),
            response_id,
            error: false,
        })
    }
}
