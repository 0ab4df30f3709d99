//! Anthropic events read from the layout of one read before, instead of
//! parsed: a provider writes every stream's events alike, byte for byte
//! but for their values (a text, the counts, the message's id), and
//! comparing an event with a layout costs a fraction of reading it.
//!
//! Two kinds of layout. A text delta's is its bytes around its text
//! ([`Layout`]), learned from the first delta and used by the rest. Every
//! other event the stream reads the same whatever its values, or whose
//! values a walk located ([`super::walked`]), leaves its bytes around
//! those values ([`Holes`]): a `message_start` (its counts; its id and
//! model are left open but unread), a `message_delta` (stop reason and
//! counts), a text block's start, a block's stop, a `ping`, a
//! `message_stop`. Sound for the reason [`Holes`] is: an event laid out as
//! one read before is that event with other values where it had values,
//! and reads the same but for those.

use std::borrow::Cow;

use super::walked::{Role, Span};
use super::{Block, Event, MessageDeltaBody, StartMessage, WireUsage};
use crate::json::json_text;
use crate::layout::{Holes, Layout, Token, offset_in};
use crate::split::plain_u64;

/// How many layouts of events other than text deltas are kept: a stream
/// has about six kinds; a stream with several blocks, a few more.
const MAX_EVENTS: usize = 8;

/// The layouts a provider's events were read by.
#[derive(Default)]
pub struct Layouts {
    /// The last text delta read whole, and its block index.
    text: Option<(Layout, u64)>,
    /// Other events' layouts, oldest first.
    events: Vec<EventLayout>,
    /// Which of `events` to try first: the one after the last that read
    /// an event. A provider sends its events in the same order every
    /// stream, so the layouts, learned in that order, are tried in it too
    /// and the first try reads the event (the others only cost a try).
    next: usize,
}

struct EventLayout {
    holes: Holes,
    /// What each hole holds, in order.
    roles: Vec<Role>,
    kind: Kind,
}

/// What an event laid out this way is.
enum Kind {
    /// A `message_start`; whether it had usage (its counts are holes, or
    /// `null` or absent in the layout).
    Start {
        usage: bool,
    },
    /// A `message_delta`; whether it had usage.
    Delta {
        usage: bool,
    },
    /// Events with no values the stream reads: the layout has no holes.
    Stop,
    Other,
    TextBlock {
        index: u64,
        text: String,
    },
}

impl Layouts {
    /// `data` read by a layout, when one fits; `spans` is scratch space.
    pub(super) fn read<'a>(&mut self, data: &'a str, spans: &mut Vec<(usize, usize)>) -> Option<Event<'a>> {
        if let Some(event) = self.text_delta(data) {
            return Some(event);
        }
        let count = self.events.len();
        for step in 0..count {
            let at = self.next.wrapping_add(step) % count;
            if let Some(event) = self.events.get(at).and_then(|layout| layout.read(data, spans)) {
                self.next = at.wrapping_add(1);
                return Some(event);
            }
        }
        None
    }

    /// A text delta laid out as the last one read whole.
    fn text_delta<'a>(&self, data: &'a str) -> Option<Event<'a>> {
        let (layout, index) = self.text.as_ref()?;
        let found = layout.read(data, 0)?;
        if !crate::layout::only_whitespace_from(data.as_bytes(), found.after_end) {
            return None;
        }
        let token = data.get(found.start..found.end)?;
        let text = if found.escaped {
            json_text(token)?
        } else {
            Cow::Borrowed(data.get(found.start.wrapping_add(1)..found.end.wrapping_sub(1))?)
        };
        Some(Event::ContentBlockDelta {
            index: *index,
            delta: super::Delta::Text(text, token),
        })
    }

    /// Keeps the layout of `data`, which was read as `event`; `walked`: the
    /// spans of its values when the walk read it (a `message_start` or
    /// `message_delta` needs them).
    pub(super) fn learn(&mut self, data: &str, event: &Event<'_>, walked: Option<&[Span]>) {
        if let Event::ContentBlockDelta {
            index,
            delta: super::Delta::Text(_, token),
        } = event
        {
            if let Some(layout) = text_layout(data, token) {
                self.text = Some((layout, *index));
            }
            return;
        }
        let (kind, spans) = match (event, walked) {
            (Event::MessageStart { message }, Some(spans)) => (
                Kind::Start {
                    usage: message.usage.is_some(),
                },
                spans,
            ),
            (Event::MessageDelta { usage, .. }, Some(spans)) => (Kind::Delta { usage: usage.is_some() }, spans),
            (Event::MessageStop, _) => (Kind::Stop, &[][..]),
            (Event::Other, _) => (Kind::Other, &[][..]),
            (
                Event::ContentBlockStart {
                    index,
                    content_block: Block::Text { text },
                },
                _,
            ) => (
                Kind::TextBlock {
                    index: *index,
                    text: text.clone(),
                },
                &[][..],
            ),
            _ => return,
        };
        let holes = spans
            .iter()
            .map(|(start, end, role)| {
                let token = match role {
                    Role::StopReason | Role::Unread(Token::String) => Token::String,
                    _ => Token::Number,
                };
                (*start, *end, token)
            })
            .collect();
        let Some(holes) = Holes::around(data, holes) else {
            return;
        };
        if self.events.len() >= MAX_EVENTS {
            self.events.remove(0);
        }
        self.events.push(EventLayout {
            holes,
            roles: spans.iter().map(|(_, _, role)| *role).collect(),
            kind,
        });
    }
}

/// The layout of a text delta's event around its text token.
fn text_layout(data: &str, token: &str) -> Option<Layout> {
    let start = offset_in(data, token)?;
    let end = data.trim_end_matches([' ', '\n', '\t', '\r']).len();
    Layout::around(data, 0, start, start.wrapping_add(token.len()), end)
}

impl EventLayout {
    fn read<'a>(&self, data: &'a str, spans: &mut Vec<(usize, usize)>) -> Option<Event<'a>> {
        self.holes.read(data, spans)?;
        let mut usage = WireUsage::default();
        let mut stop_reason = None;
        for ((start, end), role) in spans.iter().zip(&self.roles) {
            let token = data.get(*start..*end)?;
            let count = || plain_u64(token).map(Some);
            match role {
                Role::InputTokens => usage.input_tokens = count()?,
                Role::OutputTokens => usage.output_tokens = count()?,
                Role::CacheCreationInputTokens => usage.cache_creation_input_tokens = count()?,
                Role::CacheReadInputTokens => usage.cache_read_input_tokens = count()?,
                Role::StopReason => stop_reason = Some(json_text(token)?.into_owned()),
                Role::Unread(_) => {}
            }
        }
        Some(match &self.kind {
            Kind::Start { usage: had } => Event::MessageStart {
                message: StartMessage {
                    usage: had.then_some(usage),
                },
            },
            Kind::Delta { usage: had } => Event::MessageDelta {
                delta: MessageDeltaBody { stop_reason },
                usage: had.then_some(usage),
            },
            Kind::Stop => Event::MessageStop,
            Kind::Other => Event::Other,
            Kind::TextBlock { index, text } => Event::ContentBlockStart {
                index: *index,
                content_block: Block::Text { text: text.clone() },
            },
        })
    }
}
