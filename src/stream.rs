//! Streaming answers (contract §6): provider bytes in, OpenAI SSE bytes out.
//!
//! [`StreamRewriter`] frames the provider's bytes with the one SSE decoder,
//! lets the provider's translator turn events into [`StreamItem`]s, and writes
//! them in OpenAI's shape: the same id, model and created in every chunk, the
//! role on the first delta, usage only in one extra chunk right before
//! `[DONE]` and only when the client asked, and one error event (no `[DONE]`)
//! when the stream fails or ends without its terminal event.
//!
//! With [`StreamRewriter::redacting`], the provider's credential never
//! reaches the client: it is scrubbed from every event written, and from the
//! streamed text even when a provider that echoes it splits it across deltas
//! (see `Scrubber`).

use std::borrow::Cow;

use serde_json::{Value, json};

use crate::answer::{Stamp, text_stream_choice};
use crate::errors::ApiError;
use crate::json::json_text;
use crate::json::split::string_stop_from;
use crate::providers::openai::interrupted;
use crate::providers::{StreamItem, StreamTranslator};
use crate::redact::{self, REDACTED};
use crate::request::Operation;
use crate::sse::{DONE, SseDecoder, SseError, SseEvent, write_data};
use crate::usage::Usage;

mod chunk;
use chunk::{ChoiceRead, ChunkRead, read_chunk};

/// An empty list of another lifetime in `spare`'s allocation: std collects
/// a vector's iterator in place when the items have one layout, and no item
/// of an emptied list is mapped.
fn recycle<T, U>(mut spare: Vec<T>) -> Vec<U> {
    spare.clear();
    spare.into_iter().filter_map(|_| None).collect()
}

/// Rewrites one provider stream.
pub struct StreamRewriter {
    decoder: SseDecoder,
    translator: Box<dyn StreamTranslator>,
    stamp: Stamp,
    include_usage: bool,
    usage: Option<Usage>,
    role_sent: bool,
    finished: bool,
    /// The `code` of the error event written, if the stream ended with one.
    error_code: Option<String>,
    /// Scratch space reused across events.
    items: Vec<StreamItem>,
    scrubber: Option<Scrubber>,
    /// `data: {"id":…,"object":…,"created":…,"model":…,"choices":` as
    /// every chunk starts, encoded once.
    chunk_open: Vec<u8>,
    /// `chunk_open`, then a text delta's choice up to its text.
    content_open: Vec<u8>,
    /// The provider's events are OpenAI chat chunks: after the first, most
    /// are copied member by member ([`StreamRewriter::copy_chunk`]).
    copy_chunks: bool,
    /// The allocations of a copied chunk's lists, kept for the next.
    spare_choices: Vec<ChoiceRead<'static>>,
    spare_texts: Vec<Option<Option<Cow<'static, str>>>>,
    /// The extras of the chunk being copied, written (reused across chunks).
    extras: Vec<u8>,
    /// With a credential of word characters only, which none of the bytes
    /// a text delta's chunk is written with can hold (see [`Self::write_content`]).
    clean_template: bool,
}

impl StreamRewriter {
    pub fn new(translator: Box<dyn StreamTranslator>, stamp: Stamp, include_usage: bool) -> Self {
        let copy_chunks = translator.passthrough() && stamp.op == Operation::Chat;
        let chunk_open = chunk_open(&stamp);
        StreamRewriter {
            decoder: SseDecoder::default(),
            include_usage,
            usage: None,
            role_sent: false,
            finished: false,
            error_code: None,
            items: Vec::new(),
            scrubber: None,
            translator,
            content_open: [chunk_open.as_slice(), CONTENT_OPEN].concat(),
            chunk_open,
            copy_chunks,
            spare_choices: Vec::new(),
            spare_texts: Vec::new(),
            extras: Vec::new(),
            clean_template: false,
            stamp,
        }
    }

    /// Scrubs `secret` (the provider's credential) from everything written.
    pub fn redacting(mut self, secret: &redact::Secret) -> Self {
        if secret.worth_scrubbing() {
            let scrubber = Scrubber::new(secret);
            // Every word a text delta's chunk is written with, but its text
            // and index: the head, the members, the role.
            let mut template = Vec::new();
            self.begin_chunk(&mut template);
            for part in [CONTENT_OPEN, b"\"\"", ROLE, CONTENT_CLOSE, b"0", CHUNK_CLOSE] {
                template.extend_from_slice(part);
            }
            self.clean_template = scrubber.word && !scrubber.secret.occurs_in(&template);
            self.scrubber = Some(scrubber);
        }
        self
    }

    /// Usage seen so far (for the access log and limits).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Whether the stream ended, cleanly or with the error event.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// The `code` of the error event the stream ended with, if it did.
    pub fn error_code(&self) -> Option<&str> {
        self.error_code.as_deref()
    }

    /// Translates one chunk of provider bytes into `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if self.finished {
            return;
        }
        // Out of the way while its events, which may borrow it, are read.
        let mut decoder = std::mem::take(&mut self.decoder);
        let mut rest = chunk;
        let framed = loop {
            match decoder.next(&mut rest) {
                Ok(Some(event)) => self.on_event(&event, out),
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            }
            if self.finished {
                break Ok(());
            }
        };
        self.decoder = decoder;
        if let Err(SseError::TooLong { limit }) = framed {
            self.fail(
                &interrupted(&format!("The provider sent an event over {limit} bytes.")),
                out,
            );
        }
    }

    /// Whole events were written after `start`: a credential in them (a key,
    /// an error message, one delta) cannot be split across two calls, nor
    /// across two events (a credential is a header value: it has no line break).
    fn scrub(&self, out: &mut Vec<u8>, start: usize) {
        if let Some(scrubber) = &self.scrubber {
            scrubber.secret.scrub_from(out, start);
        }
    }

    /// End of the provider's stream: flushes what is held and makes sure the
    /// client's stream ends with `[DONE]` or the error event, never silently.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if self.finished {
            return;
        }
        let mut decoder = std::mem::take(&mut self.decoder);
        let framed = decoder.finish().map(|last| {
            if let Some(event) = last {
                self.on_event(&event, out);
            }
        });
        self.decoder = decoder;
        if framed.is_err() || !self.finished {
            self.fail(&interrupted("The provider's stream ended before it was complete."), out);
        }
    }

    /// A failure outside the stream (reset, timeout): the error event.
    pub fn fail(&mut self, error: &ApiError, out: &mut Vec<u8>) {
        if !self.finished {
            let start = out.len();
            self.flush_held(out);
            write_data(out, &error.body());
            self.finished = true;
            self.error_code = Some(error.code.clone());
            self.scrub(out, start);
        }
    }

    /// Text the scrubber still holds goes out before the stream ends.
    fn flush_held(&mut self, out: &mut Vec<u8>) {
        // Out of the way while its own text is written, or it would hold it again.
        let Some(mut scrubber) = self.scrubber.take() else {
            return;
        };
        for (index, text) in scrubber.drain() {
            let chunk = json!({"choices": [{"index": index, "delta": {"content": text}, "finish_reason": null}]});
            self.write_chunk(chunk, out);
        }
        self.scrubber = Some(scrubber);
    }

    /// Writes what one event says, scrubbed.
    fn on_event(&mut self, event: &SseEvent<'_>, out: &mut Vec<u8>) {
        if self.finished {
            return;
        }
        let start = out.len();
        // A line break between tokens (several data lines joined) would
        // end the client's data line if copied: such an event is written anew.
        if self.copy_chunks && !event.multiline && self.copy_chunk(event.data, out) {
            self.scrub(out, start);
            return;
        }
        self.translator.on_event(event, &mut self.items);
        let mut items = std::mem::take(&mut self.items);
        let mut clean = true;
        for item in items.drain(..) {
            clean &= self.write_item(item, out);
        }
        self.items = items;
        if !clean {
            self.scrub(out, start);
        }
    }

    /// Writes one item; `true` when what it wrote cannot hold the
    /// credential (see [`Self::write_content`]), so it need not be scrubbed.
    fn write_item(&mut self, item: StreamItem, out: &mut Vec<u8>) -> bool {
        if self.finished {
            return true;
        }
        match item {
            StreamItem::Chunk(chunk) => self.write_chunk(chunk, out),
            StreamItem::Content { index, text } => return self.write_content(index, text, out),
            StreamItem::Finish { index, reason } => return self.write_finish(index, reason, out),
            StreamItem::Usage(usage) => {
                self.usage = Some(usage);
                return true;
            }
            StreamItem::Done => {
                self.flush_held(out);
                if self.include_usage {
                    let usage = self.usage.unwrap_or_default().to_json();
                    self.write_envelope(&[], &[("usage", &usage)], out);
                }
                out.extend_from_slice(DONE);
                self.finished = true;
            }
            StreamItem::Error(error) => self.fail(&error, out),
        }
        false
    }

    fn write_chunk(&mut self, chunk: Value, out: &mut Vec<u8>) {
        let Value::Object(mut chunk) = chunk else { return };
        let Some(Value::Array(mut choices)) = chunk.remove("choices") else {
            return;
        };
        if let Some(scrubber) = self.scrubber.as_mut() {
            scrubber.scrub_choices(&mut choices);
        }
        if self.stamp.op == Operation::Completions {
            choices = choices
                .iter()
                .enumerate()
                .map(|(i, c)| text_stream_choice(c, i))
                .collect();
            // A role-only or empty delta carries nothing for a legacy client.
            choices.retain(|c| {
                c.get("text").and_then(Value::as_str).is_some_and(|t| !t.is_empty())
                    || c.get("finish_reason").is_some_and(|f| !f.is_null())
            });
            if choices.is_empty() {
                return;
            }
        } else if !self.role_sent
            && let Some(delta) = choices
                .first_mut()
                .and_then(|c| c.get_mut("delta"))
                .and_then(Value::as_object_mut)
        {
            delta.entry("role").or_insert_with(|| "assistant".into());
        }
        self.role_sent = true;
        // Provider extras (system_fingerprint and the like) are kept.
        let extras: Vec<(&str, &Value)> = chunk
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "id" | "object" | "created" | "model" | "usage"))
            .map(|(k, v)| (k.as_str(), v))
            .collect();
        self.write_envelope(&choices, &extras, out);
    }

    /// A chat chunk whose one choice's delta is just `text`, written as
    /// [`Self::write_chunk`] would write it but with no DOM: the stream's
    /// head, then `[{"delta":{"content":…},"finish_reason":null,"index":…}]`
    /// (serde's member order), the first with `"role":"assistant"` after the
    /// content as `write_chunk` adds it. Legacy streams (their choice has
    /// another shape) take the DOM path.
    ///
    /// `true` when the chunk cannot hold the credential: the scrubber took
    /// it out of the text, and with a credential of [`Scrubber::word`]
    /// characters that is not in [`Self::clean_template`], an occurrence
    /// elsewhere would have to sit in a run of word characters of the
    /// chunk, which are the text's (scrubbed again as written when it
    /// needed escapes), the index's digits, or the template's.
    fn write_content(&mut self, index: u64, text: String, out: &mut Vec<u8>) -> bool {
        if self.stamp.op != Operation::Chat {
            let chunk = json!({"choices": [{"index": index, "delta": {"content": text}, "finish_reason": null}]});
            self.write_chunk(chunk, out);
            return false;
        }
        let first = !std::mem::replace(&mut self.role_sent, true);
        let text = match self.scrubber.as_mut() {
            Some(scrubber) => scrubber.scrub(index, &text, false),
            None => Cow::Borrowed(text.as_str()),
        };
        out.extend_from_slice(&self.content_open);
        self.push_text(out, &text);
        if first {
            out.extend_from_slice(ROLE);
        }
        if index == 0 {
            out.extend_from_slice(FIRST_CHOICE_CLOSE);
        } else {
            out.extend_from_slice(CONTENT_CLOSE);
            push_decimal(out, index);
            out.extend_from_slice(CHUNK_CLOSE);
        }
        self.clean_template
    }

    /// A text (scrubbed already) as a JSON string. Escapes can make the
    /// credential of word characters out of the text's (`\n` then `abc…`
    /// holds `nabc…`), but only between the string's quotes: that is all
    /// the scrub must look at, where the chunk's other words are known
    /// ([`Self::clean_template`]).
    fn push_text(&self, out: &mut Vec<u8>, text: &str) {
        let before = out.len();
        push_json_string(out, text);
        let escaped = out.len().wrapping_sub(before) != text.len().wrapping_add(2);
        if escaped
            && self.clean_template
            && let Some(scrubber) = &self.scrubber
        {
            scrubber.secret.scrub_from(out, before);
        }
    }

    /// A chat chunk that finishes choice `index`, written as
    /// [`Self::write_chunk`] would write it but with no DOM:
    /// `[{"delta":{},"finish_reason":…,"index":…}]`, the delta holding as
    /// its content what the scrubber held back for the choice. Before the
    /// role went out, and in legacy streams, the DOM path.
    ///
    /// `true` when the chunk cannot hold the credential, as for
    /// [`Self::write_content`]: its words are the template's (`delta`,
    /// `content`, `finish_reason`, `index`), the held text's (scrubbed,
    /// its escapes too), the index's digits and the reason, which is
    /// looked at here.
    fn write_finish(&mut self, index: u64, reason: &str, out: &mut Vec<u8>) -> bool {
        if !self.role_sent || self.stamp.op != Operation::Chat {
            let chunk = json!({"choices": [{"index": index, "delta": {}, "finish_reason": reason}]});
            self.write_chunk(chunk, out);
            return false;
        }
        let held = match self.scrubber.as_mut() {
            Some(scrubber) => scrubber.scrub(index, "", true).into_owned(),
            None => String::new(),
        };
        self.begin_chunk(out);
        out.extend_from_slice(b"[{\"delta\":{");
        if !held.is_empty() {
            out.extend_from_slice(b"\"content\":");
            self.push_text(out, &held);
        }
        out.extend_from_slice(b"},\"finish_reason\":");
        push_json_string(out, reason);
        out.extend_from_slice(b",\"index\":");
        push_decimal(out, index);
        out.extend_from_slice(CHUNK_CLOSE);
        self.clean_template
            && !self
                .scrubber
                .as_ref()
                .is_some_and(|scrubber| scrubber.secret.occurs_in(reason.as_bytes()))
    }

    /// An OpenAI chat chunk after the first, copied: the stream's own id,
    /// object, created and model, then the provider's `choices` and other
    /// members as they came. The same output as the translator's path up
    /// to member order and number spelling (and numbers past f64's range,
    /// which it passes on where serde's DOM refuses them), at a fraction of the cost: no
    /// DOM is built unless the scrubber changes a delta. `false` leaves the
    /// event to the translator (the first chunk, `[DONE]`, usage, errors,
    /// anything unusual).
    fn copy_chunk(&mut self, data: &str, out: &mut Vec<u8>) -> bool {
        if !self.role_sent {
            return false;
        }
        // The chunk's lists borrow it, so they cannot outlive it; their
        // allocations are the stream's, for the next chunk.
        let mut extras = std::mem::take(&mut self.extras);
        let mut texts = recycle(std::mem::take(&mut self.spare_texts));
        let choices = recycle(std::mem::take(&mut self.spare_choices));
        let copied = match read_chunk(data, &mut extras, choices) {
            Some(chunk) => {
                let copied = self.copy_read(&chunk, &extras, &mut texts, out);
                self.spare_choices = recycle(chunk.choices_read);
                copied
            }
            None => false,
        };
        self.spare_texts = recycle(texts);
        self.extras = extras;
        copied
    }

    /// [`Self::copy_chunk`] of the chunk read, with its extras written and
    /// a list for its texts.
    fn copy_read<'a>(
        &mut self,
        chunk: &ChunkRead<'a>,
        extras: &[u8],
        texts: &mut Vec<Option<Option<Cow<'a, str>>>>,
        out: &mut Vec<u8>,
    ) -> bool {
        if chunk.error_or_usage {
            return false;
        }
        let Some(choices) = chunk.choices else {
            return false;
        };
        let views = &chunk.choices_read;
        if views.is_empty() {
            return true;
        }
        // Read every choice before the scrubber sees any: past this loop the
        // event can no longer go back to the translator.
        for view in views {
            if view.text.is_some() {
                return false;
            }
            let text = match view.delta {
                Some(content) => {
                    match content {
                        None => Some(None),
                        Some(raw) if raw.starts_with('"') => match json_text(raw) {
                            Some(text) => Some(Some(text)),
                            None => return false,
                        },
                        // `null` or not a string: the translator's path reshapes it.
                        Some(_) => return false,
                    }
                }
                None => None,
            };
            texts.push(text);
        }
        // The scrubber sees every delta's text, as on the translator's path.
        // Its answers are kept (and owned) only once one of them changes a delta:
        // the common event costs no allocation here.
        let mut scrubbed: Vec<Option<(bool, String)>> = Vec::new();
        if let Some(scrubber) = self.scrubber.as_mut() {
            for (position, (view, text)) in views.iter().zip(texts.drain(..)).enumerate() {
                let Some(text) = text else {
                    if !scrubbed.is_empty() {
                        scrubbed.push(None);
                    }
                    continue;
                };
                let index = view
                    .index
                    .and_then(|i| i.parse::<u64>().ok())
                    .unwrap_or(position as u64);
                let had_text = text.is_some();
                let text = text.unwrap_or_default();
                let clean = scrubber.scrub(index, &text, view.finish_reason.is_some());
                let changed = if had_text { clean != text } else { !clean.is_empty() };
                if changed && scrubbed.is_empty() {
                    // Every choice before this one went through unchanged.
                    scrubbed.resize(position, None);
                }
                if changed || !scrubbed.is_empty() {
                    scrubbed.push(Some((had_text, clean.into_owned())));
                }
            }
        }
        let changed = !scrubbed.is_empty();
        // A delta was scrubbed or held: its choices go through a DOM. (A body
        // serde's DOM refuses fails here as it does on the translator's path.)
        let scrubbed_choices = if changed {
            let Ok(Value::Array(mut values)) = crate::json::dom::parse(choices) else {
                return false;
            };
            for (choice, scrubbed) in values.iter_mut().zip(scrubbed) {
                if let Some((had_text, clean)) = scrubbed {
                    set_text(choice, had_text, clean);
                }
            }
            Some(values)
        } else {
            None
        };
        self.begin_chunk(out);
        match scrubbed_choices {
            Some(values) => {
                if serde_json::to_writer(&mut *out, &values).is_err() {
                    log::error!("a stream chunk could not be encoded");
                }
            }
            None => out.extend_from_slice(choices.as_bytes()),
        }
        // Provider extras, as they came.
        out.extend_from_slice(extras);
        out.extend_from_slice(b"}\n\n");
        true
    }

    /// `data: ` and the stream's head, then `"choices":`.
    fn begin_chunk(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.chunk_open);
    }

    /// One chunk event: the stream's head, `choices`, then `extra` members.
    fn write_envelope(&self, choices: &[Value], extra: &[(&str, &Value)], out: &mut Vec<u8>) {
        self.begin_chunk(out);
        let mut written = serde_json::to_writer(&mut *out, choices);
        for (key, value) in extra {
            out.push(b',');
            written = written
                .and_then(|()| serde_json::to_writer(&mut *out, key))
                .map(|()| out.push(b':'))
                .and_then(|()| serde_json::to_writer(&mut *out, value));
        }
        if written.is_err() {
            // Writing to a Vec fails only on a map with non-string keys,
            // which a parsed Value cannot hold.
            log::error!("a stream chunk could not be encoded");
        }
        out.extend_from_slice(b"}\n\n");
    }
}

/// The bytes a text delta's chunk is written with after the stream's head
/// ([`StreamRewriter::write_content`]), and with which
/// [`StreamRewriter::redacting`] makes its template: the text, the role on
/// the first, the index between them.
const CONTENT_OPEN: &[u8] = b"[{\"delta\":{\"content\":";
const ROLE: &[u8] = b",\"role\":\"assistant\"";
const CONTENT_CLOSE: &[u8] = b"},\"finish_reason\":null,\"index\":";
const CHUNK_CLOSE: &[u8] = b"}]}\n\n";
/// [`CONTENT_CLOSE`], index 0 and [`CHUNK_CLOSE`]: the close of nearly
/// every text delta's chunk, in one piece.
const FIRST_CHOICE_CLOSE: &[u8] = b"},\"finish_reason\":null,\"index\":0}]}\n\n";

/// `n` as serde writes it (with the same `itoa`).
fn push_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

/// `text` as a JSON string, as serde writes it. Most deltas have nothing
/// serde escapes (a quote, a backslash, a control character): a word scan
/// finds that, and the text is copied between quotes, where serde's
/// escaping looks up every byte.
fn push_json_string(out: &mut Vec<u8>, text: &str) {
    if string_stop_from(text.as_bytes(), 0) == text.len() {
        out.push(b'"');
        out.extend_from_slice(text.as_bytes());
        out.push(b'"');
    } else if serde_json::to_writer(&mut *out, text).is_err() {
        log::error!("a stream chunk could not be encoded");
    }
}

/// `data: `, the members every chunk of one stream starts with as JSON,
/// then `"choices":`.
fn chunk_open(stamp: &Stamp) -> Vec<u8> {
    let object = match stamp.op {
        Operation::Chat => "chat.completion.chunk",
        Operation::Completions => "text_completion",
    };
    let head = json!({"id": stamp.id, "object": object, "created": stamp.created, "model": stamp.model});
    let mut bytes = b"data: ".to_vec();
    if serde_json::to_writer(&mut bytes, &head).is_err() {
        log::error!("a stream chunk could not be encoded");
    }
    bytes.pop(); // the closing brace: choices and extras follow
    bytes.extend_from_slice(b",\"choices\":");
    bytes
}

/// The shortest start of the secret held back at the end of a delta; a
/// shorter one goes out, and the rest of the secret is scrubbed from the
/// next delta instead, so at most this many characters less one are seen.
const HOLD_MIN: usize = 4;

/// Scrubs one secret from each choice's streamed text (`delta.content`, or
/// `text` for native legacy), where it may be split across deltas: a delta
/// ending in the first [`HOLD_MIN`]+ characters of the secret keeps them
/// back until the next delta of that choice tells, and a delta continuing a
/// shorter start that already went out has that continuation scrubbed.
/// Held text goes out with the choice's finish, at `[DONE]`, or before the
/// error event. Translation is per event, so this is chunking-invariant.
struct Scrubber {
    secret: redact::Secret,
    /// The secret is a word: letters, digits, `-`, `_` and `.` (so JSON
    /// never escapes it), not digits alone.
    word: bool,
    /// Where each byte occurs in the secret.
    positions: Positions,
    /// Per choice index: the held text, and the end of what went out (at
    /// least the secret's length of it).
    choices: Vec<(u64, String, String)>,
}

impl Scrubber {
    fn new(secret: &redact::Secret) -> Scrubber {
        let word_byte = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
        let plain = secret.as_str();
        Scrubber {
            word: plain.as_bytes().iter().all(word_byte) && !plain.bytes().all(|b| b.is_ascii_digit()),
            positions: Positions::new(plain.as_bytes()),
            secret: secret.clone(),
            choices: Vec::new(),
        }
    }

    fn scrub_choices(&mut self, choices: &mut [Value]) {
        for (position, choice) in choices.iter_mut().enumerate() {
            let index = choice.get("index").and_then(Value::as_u64).unwrap_or(position as u64);
            let finishing = choice.get("finish_reason").is_some_and(|f| !f.is_null());
            let Some(field) = text_field(choice) else { continue };
            let had_text = field.is_string();
            let scrubbed = self
                .scrub(index, field.as_str().unwrap_or_default(), finishing)
                .into_owned();
            set_text(choice, had_text, scrubbed);
        }
    }

    /// The text of one delta of choice `index`, scrubbed, minus what is
    /// held. Runs on every delta: borrows `text` unless it changes.
    fn scrub<'t>(&mut self, index: u64, text: &'t str, finishing: bool) -> Cow<'t, str> {
        let secret = self.secret.as_str();
        let at = match self.choices.iter().position(|(i, _, _)| *i == index) {
            Some(at) => at,
            None => {
                self.choices.push((index, String::new(), String::new()));
                self.choices.len().saturating_sub(1)
            }
        };
        let Some((_, held, tail)) = self.choices.get_mut(at) else {
            return Cow::Borrowed(text);
        };
        let mut s: Cow<'t, str> = if held.is_empty() {
            Cow::Borrowed(text)
        } else {
            let mut joined = std::mem::take(held);
            joined.push_str(text);
            Cow::Owned(joined)
        };
        if self.secret.occurs_in(s.as_bytes()) {
            s = Cow::Owned(s.replace(secret, REDACTED));
        }
        // The secret's start went out already: scrub its continuation. Only
        // the cuts where the bytes either side match can be it.
        let (last, first) = (tail.as_bytes().last(), s.as_bytes().first());
        let spanning = first
            .map_or(&[][..], |first| self.positions.of(*first))
            .iter()
            .map(|k| *k as usize)
            // A cut inside the secret: the byte before it went out last.
            .filter(|k| *k >= 1 && secret.as_bytes().get(k.wrapping_sub(1)) == last)
            .filter(|k| secret.is_char_boundary(*k))
            .filter_map(|k| {
                let (start, rest) = (secret.get(..k)?, secret.get(k..)?);
                (tail.ends_with(start) && s.starts_with(rest)).then_some(rest.len())
            })
            .max();
        if let Some(rest) = spanning {
            s = Cow::Owned(format!("{REDACTED}{}", s.get(rest..).unwrap_or_default()));
        }
        // Text ending in the secret's first HOLD_MIN+ characters (counting
        // what just went out): hold back this delta's part of them.
        let keep = match s.as_bytes().last() {
            Some(end) if !finishing => self
                .positions
                .of(*end)
                .iter()
                .map(|i| (*i as usize).saturating_add(1))
                .filter(|k| (HOLD_MIN..secret.len()).contains(k) && secret.is_char_boundary(*k))
                .filter(|k| secret.get(..*k).is_some_and(|start| ends_with_across(tail, &s, start)))
                .max()
                .map_or(0, |k| k.min(s.len())),
            _ => 0,
        };
        let emit_len = s.len().saturating_sub(keep);
        if !s.is_char_boundary(emit_len) {
            return s;
        }
        if keep > 0 {
            *held = s.get(emit_len..).unwrap_or_default().to_string();
            s = match s {
                Cow::Borrowed(b) => Cow::Borrowed(b.get(..emit_len).unwrap_or_default()),
                Cow::Owned(mut o) => {
                    o.truncate(emit_len);
                    Cow::Owned(o)
                }
            };
        }
        // At least the secret's length of what went out is kept; cut back
        // only past twice that, so most deltas just append.
        tail.push_str(&s);
        if tail.len() > secret.len().saturating_mul(2) {
            let mut cut = tail.len().saturating_sub(secret.len());
            while !tail.is_char_boundary(cut) {
                cut = cut.saturating_add(1);
            }
            tail.drain(..cut);
        }
        s
    }

    /// Every choice's held text, emptied.
    fn drain(&mut self) -> Vec<(u64, String)> {
        self.choices
            .iter_mut()
            .filter(|(_, held, _)| !held.is_empty())
            .map(|(index, held, _)| (*index, std::mem::take(held)))
            .collect()
    }
}

/// Where each byte value occurs in a secret, so a delta's checks visit only
/// the cuts that can match: an OpenAI key is 164 characters, and walking it
/// twice per delta cost more than the rest of the event (`make bench`).
struct Positions {
    /// `order[start[b]..start[b + 1]]`: the positions of byte `b`, ascending.
    start: Vec<u32>,
    order: Vec<u32>,
}

impl Positions {
    fn new(secret: &[u8]) -> Positions {
        // A counting sort of the positions by byte.
        let mut start = vec![0u32; 257];
        for b in secret {
            if let Some(count) = start.get_mut(usize::from(*b).saturating_add(1)) {
                *count = count.saturating_add(1);
            }
        }
        for b in 1..start.len() {
            let before = start.get(b.saturating_sub(1)).copied().unwrap_or(0);
            if let Some(here) = start.get_mut(b) {
                *here = here.saturating_add(before);
            }
        }
        let mut next = start.clone();
        let mut order = vec![0u32; secret.len()];
        for (i, b) in secret.iter().enumerate() {
            if let Some(slot) = next.get_mut(usize::from(*b))
                && let Some(at) = order.get_mut(*slot as usize)
            {
                *at = u32::try_from(i).unwrap_or(u32::MAX);
                *slot = slot.saturating_add(1);
            }
        }
        Positions { start, order }
    }

    /// The positions of `b` in the secret, ascending.
    fn of(&self, b: u8) -> &[u32] {
        let at = usize::from(b);
        match (self.start.get(at), self.start.get(at.saturating_add(1))) {
            (Some(lo), Some(hi)) => self.order.get(*lo as usize..*hi as usize).unwrap_or_default(),
            _ => &[],
        }
    }
}

/// The streamed text of a choice: native legacy `text`, else
/// `delta.content` (added as `null` when absent; [`set_text`] takes it out
/// again). `None` when the choice has no delta object.
fn text_field(choice: &mut Value) -> Option<&mut Value> {
    if choice.get("text").is_some_and(Value::is_string) {
        return choice.get_mut("text");
    }
    choice
        .get_mut("delta")
        .and_then(Value::as_object_mut)
        .map(|d| d.entry("content").or_insert(Value::Null))
}

/// Puts a choice's scrubbed text in place; `had_text`: the field held a
/// string before.
fn set_text(choice: &mut Value, had_text: bool, scrubbed: String) {
    let Some(field) = text_field(choice) else { return };
    if had_text || !scrubbed.is_empty() {
        *field = Value::String(scrubbed);
    } else if field.is_null()
        && let Some(delta) = choice.get_mut("delta").and_then(Value::as_object_mut)
        && delta.get("content").is_some_and(Value::is_null)
    {
        // Added only to look for the field: leave the delta as it was.
        delta.remove("content");
    }
}

/// Whether `a` followed by `b` ends with `suffix`.
fn ends_with_across(a: &str, b: &str, suffix: &str) -> bool {
    let (a, b, suffix) = (a.as_bytes(), b.as_bytes(), suffix.as_bytes());
    match suffix.len().checked_sub(b.len()) {
        None => b.ends_with(suffix),
        Some(from_a) => {
            suffix.get(from_a..).is_some_and(|end| end == b)
                && suffix.get(..from_a).is_some_and(|start| a.ends_with(start))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::providers::openai::OpenAiStream;
    use crate::sse::SseEvent;
    use crate::sse::tests::chunkings;

    fn stamp(op: Operation) -> Stamp {
        Stamp {
            op,
            id: "chatcmpl_ID".into(),
            model: "openai/gpt".into(),
            created: 42,
        }
    }

    /// Replays `input` under every chunking through a fresh rewriter from
    /// `make`, requires identical output, and returns it.
    fn replay_with(make: &dyn Fn() -> StreamRewriter, input: &[u8]) -> String {
        let mut reference: Option<Vec<u8>> = None;
        for chunks in chunkings(input) {
            let mut r = make();
            let mut out = Vec::new();
            for c in chunks {
                r.push(c, &mut out);
            }
            r.finish(&mut out);
            match &reference {
                None => reference = Some(out),
                Some(prev) => assert_eq!(&out, prev),
            }
        }
        String::from_utf8(reference.unwrap()).unwrap()
    }

    /// Each event of a client stream, parsed where it is JSON.
    fn parsed(out: &str) -> Vec<Value> {
        events(out)
            .iter()
            .map(|e| serde_json::from_str(e).unwrap_or(Value::String(e.to_string())))
            .collect()
    }

    /// Replays `input` under every chunking and requires identical output.
    fn replay(op: Operation, include_usage: bool, input: &[u8]) -> String {
        replay_with(
            &|| StreamRewriter::new(Box::new(OpenAiStream), stamp(op), include_usage),
            input,
        )
    }

    const UPSTREAM: &str = concat!(
        "data: {\"id\":\"up1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"up1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hé\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"up1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"up1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
        "data: [DONE]\n\n",
    );

    fn events(out: &str) -> Vec<&str> {
        out.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").unwrap())
            .collect()
    }

    /// Found by the `stream_openai` fuzz target (the harness then held every
    /// event to serde's DOM): a copied chunk passes a number beyond f64's
    /// range on as the provider wrote it, as the stamping of answers does,
    /// rather than ending the client's stream over a member it never reads.
    #[test]
    fn a_number_beyond_f64_in_a_copied_chunk_passes_as_written() {
        let input = UPSTREAM.replacen(
            "\"delta\":{\"content\":\"Hé\"},\"finish_reason\":null}]}",
            "\"delta\":{\"content\":\"Hé\"},\"finish_reason\":null,\"logprob\":-1e999}],\"x\":1E400}",
            1,
        );
        assert_ne!(input, UPSTREAM);
        let out = replay(Operation::Chat, false, input.as_bytes());
        let ev = events(&out);
        assert_eq!(ev.len(), 4, "{out}");
        assert!(
            ev[1].ends_with(
                r#""choices":[{"index":0,"delta":{"content":"Hé"},"finish_reason":null,"logprob":-1e999}],"x":1E400}"#
            ),
            "{out}"
        );
        assert_eq!(*ev.last().unwrap(), "[DONE]");
    }

    #[test]
    fn chunks_are_stamped_and_usage_hidden_unless_asked() {
        let out = replay(Operation::Chat, false, UPSTREAM.as_bytes());
        let ev = events(&out);
        assert_eq!(ev.len(), 4);
        assert_eq!(*ev.last().unwrap(), "[DONE]");
        for e in &ev[..3] {
            let v: Value = serde_json::from_str(e).unwrap();
            assert_eq!(
                (v["id"].as_str(), v["model"].as_str(), v["created"].as_u64()),
                (Some("chatcmpl_ID"), Some("openai/gpt"), Some(42))
            );
            assert_eq!(v["object"], "chat.completion.chunk");
            assert!(v.get("usage").is_none());
        }
        let first: Value = serde_json::from_str(ev[0]).unwrap();
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    }

    #[test]
    fn usage_chunk_comes_right_before_done_when_asked() {
        let out = replay(Operation::Chat, true, UPSTREAM.as_bytes());
        let ev = events(&out);
        assert_eq!(ev.len(), 5);
        let usage: Value = serde_json::from_str(ev[3]).unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(
            usage["usage"],
            json!({"prompt_tokens":9,"completion_tokens":2,"total_tokens":11})
        );
    }

    #[test]
    fn legacy_clients_get_text_completion_chunks() {
        let out = replay(Operation::Completions, false, UPSTREAM.as_bytes());
        let ev = events(&out);
        assert_eq!(ev.len(), 3, "the role-only chunk is dropped: {out}");
        let v: Value = serde_json::from_str(ev[0]).unwrap();
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], "Hé");
        let last: Value = serde_json::from_str(ev[1]).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn a_stream_without_done_ends_with_one_error_event() {
        let cut = UPSTREAM.split("data: {\"id\":\"up1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-4o\",\"choices\":[],").next().unwrap();
        let out = replay(Operation::Chat, true, cut.as_bytes());
        let ev = events(&out);
        let last: Value = serde_json::from_str(ev.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "stream_interrupted");
        assert_eq!(last["error"]["type"], "upstream_error");
        assert!(!out.contains("[DONE]"));
    }

    #[test]
    fn a_provider_error_event_ends_the_stream() {
        let input = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"error\":{\"message\":\"overloaded\"}}\n\ndata: [DONE]\n\n";
        let out = replay(Operation::Chat, false, input.as_bytes());
        let ev = events(&out);
        assert_eq!(ev.len(), 2);
        let last: Value = serde_json::from_str(ev[1]).unwrap();
        assert_eq!(last["error"]["message"], "overloaded");
    }

    /// OpenAI's translator without the copy path: what the copy path must
    /// match, event for event, once both are parsed.
    struct Translated(OpenAiStream);

    impl StreamTranslator for Translated {
        fn on_event(&mut self, event: &SseEvent<'_>, items: &mut Vec<StreamItem>) {
            self.0.on_event(event, items);
        }
    }

    fn parsed_events(
        translator: &dyn Fn() -> Box<dyn StreamTranslator>,
        input: &[u8],
        secret: Option<&str>,
    ) -> Vec<Value> {
        let make = || {
            let r = StreamRewriter::new(translator(), stamp(Operation::Chat), true);
            match secret {
                Some(secret) => r.redacting(&redact::Secret::new(secret)),
                None => r,
            }
        };
        parsed(&replay_with(&make, input))
    }

    #[test]
    fn a_chunk_over_several_data_lines_goes_out_on_one() {
        let head = r#"{"id":"u","object":"chat.completion.chunk","created":1,"model":"m","#;
        let mut input = format!(
            "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}}}}]}}\n\n"
        );
        for _ in 0..2 {
            input.push_str(&format!(
                "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"a\"}}}}]}}\n\n"
            ));
            input.push_str(&format!(
                "data: {head}\"choices\":[{{\"index\":0,\ndata: \"delta\":{{\"content\":\"two lines\"}}}}],\"x\":\ndata: [1]}}\n\n"
            ));
        }
        input.push_str("data: [DONE]\n\n");
        let out = replay(Operation::Chat, false, input.as_bytes());
        for line in out.lines() {
            assert!(line.is_empty() || line.starts_with("data: "), "{line:?} in {out}");
        }
        let texts: Vec<&str> = events(&out)
            .iter()
            .filter_map(|e| serde_json::from_str::<Value>(e).ok())
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().map(str::to_string))
            .map(|t| if t == "two lines" { "2" } else { "1" })
            .collect();
        assert_eq!(texts, ["1", "1", "2", "1", "2"]);
    }

    #[test]
    fn copied_chunks_equal_translated_chunks() {
        let head = r#"{"id":"u","object":"chat.completion.chunk","created":1,"model":"m","#;
        let first = format!(
            "data: {head}\"choices\":[{{\"index\":0,\"delta\":{{\"role\":\"assistant\",\"content\":\"\"}}}}]}}\n\n"
        );
        let odd_events = [
            r#""system_fingerprint":"fp","choices":[{"index":0,"delta":{"content":"a\"b\u00e9 \ud83d\ude00"},"logprobs":{"content":[{"token":"a","logprob":-1.0e-5,"bytes":[97]}]},"finish_reason":null}]}"#,
            r#""choices":[{"index":1,"delta":{"content":"two"}},{"index":0,"delta":{"content":"one"}}]}"#,
            r#""choices":[{"index":0,"delta":{"content":null,"tool_calls":[{"index":0,"function":{"arguments":"{\"x\""}}]}}]}"#,
            r#""choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":":1}"}}]}}]}"#,
            r#""choices":[{"index":0,"delta":null},{"delta":"odd"},{"index":"x","delta":{"content":"c"}}]}"#,
            r#""choices":[{"index":0,"delta":{"content":5}}]}"#,
            r#""choices":[{"index":0,"text":"legacy"}]}"#,
            r#""choices":[3]}"#,
            r#""choices":[],"usage":null}"#,
            r#""choices":[{"index":0,"delta":{"content":"dup"},"index":0}]}"#,
            r#""service_tier":"default","choices":[{"index":0,"delta":{"content":"sk-li"}}]}"#,
            r#""choices":[{"index":0,"delta":{"content":"ve-0123456789 and sk-live-0123456789"}}],"note":"sk-live-0123456789"}"#,
            r#""choices":[{"index":0,"delta":{"content":"ends sk-live-01"}}]}"#,
            r#""choices":[{"index":0,"delta":["array"]}]}"#,
            r#""choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}"#,
            r#""choices":[{"index":0,"delta":{"content":"x"}}],"choices":[{"index":0,"delta":{"content":"last"}}]}"#,
            r#""n\u0061me":1,"choices":[{"index":0,"delta":{"content":"escaped name"}}]}"#,
            r#""choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#""choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#,
        ];
        let mut input = first.clone();
        for e in odd_events {
            input.push_str(&format!("data: {head}{e}\n\n"));
        }
        // The members before `choices` change between chunks, and the
        // choice's members come in any order.
        let other = r#"{"id":"u","object":"chat.completion.chunk","created":2,"model":"m","#;
        for e in [
            r#""choices":[{"index":0,"delta":{"content":"created 2"}}]}"#,
            // Content with escapes.
            r#""choices":[{"index":0,"delta":{"content":"a longer one, \"escaped\" \u00e9"}}]}"#,
            r#""choices":[{"index":0,"delta":{"content":""}}]}"#,
            r#""choices":[{"index":0,"delta":{"content":null}}]}"#,
            r#""choices":[{"delta":{"content":"x"},"index":3,"finish_reason":null}]}"#,
            // A credential's start held back under choice 3, then ended by
            // the next chunks: the index is read wherever it stands.
            r#""choices":[{"delta":{"content":"held under 3: sk-live-01"},"index":3,"finish_reason":null}]}"#,
            r#""choices":[{"index":3,"delta":{"content":"23456789 redacted"}}]}"#,
            r#""choices":[{"delta":{"content":"23 4"},"index":3,"finish_reason":null}]}"#,
            r#""choices":[{"delta":{"content":"y"},"index":3,"finish_reason":"length"}]}"#,
            r#""choices":[{"delta":{"content":"sk-live-01"},"index":3,"finish_reason":"length"}]}"#,
            r#""choices":[{"index":0,"delta":{"content":"again"}},{"index":1,"delta":null}],"x":[1,{"y":null}]}"#,
            r#""choices" : [{"index":0,"delta":{"content":"spaced"}}]}"#,
            r#""choices":  [{"index":0,"delta":{"content":"spaced value"}}]}"#,
            r#""choices":[{"index":0,"delta":{"content":"usage after"}}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}"#,
            r#""choices":[{"index":0,"delta":{"content":"x"}}],"choices":[{"index":0,"delta":{"content":"second wins"}}]}"#,
            r#""choices":{"index":0},"choices":[{"index":0,"delta":{"content":"not an array first"}}]}"#,
            r#""choices":[{"index":0,"delta":{"content":"an error after"}}],"error":{"message":"late"}}"#,
        ] {
            input.push_str(&format!("data: {other}{e}\n\n"));
        }
        input.push_str("data: [DONE]\n\n");
        let mut inputs: Vec<Vec<u8>> = vec![input.into_bytes()];
        for fixture in [
            "chat_completion_stream.sse",
            "chat_completion_stream_include_usage.sse",
            "chat_completion_stream_parallel_tool_calls.sse",
        ] {
            let path = format!("{}/tests/fixtures/openai/{fixture}", env!("CARGO_MANIFEST_DIR"));
            inputs.push(std::fs::read(path).unwrap());
        }
        for input in &inputs {
            for secret in [None, Some(SECRET)] {
                let copied = parsed_events(&|| Box::new(OpenAiStream), input, secret);
                let translated = parsed_events(&|| Box::new(Translated(OpenAiStream)), input, secret);
                assert_eq!(copied, translated, "secret {secret:?}");
                assert!(copied.len() > 3);
            }
        }
    }

    /// A provider whose events are `{"i":<choice>,"t":"<text>"}` (a
    /// content delta) or `{"i":<choice>,"f":"<reason>"}` (a finish), ending
    /// with `[DONE]`. With `dom`, content goes out as the chunk DOM that
    /// [`StreamItem::Content`] stands for.
    struct Deltas {
        dom: bool,
    }

    impl StreamTranslator for Deltas {
        fn on_event(&mut self, event: &SseEvent<'_>, items: &mut Vec<StreamItem>) {
            if event.data == "[DONE]" {
                return items.push(StreamItem::Done);
            }
            let v: Value = serde_json::from_str(event.data).unwrap();
            let index = v["i"].as_u64().unwrap();
            items.push(match (&v["t"], &v["f"]) {
                (Value::String(text), _) if self.dom => StreamItem::Chunk(
                    json!({"choices": [{"index": index, "delta": {"content": text}, "finish_reason": null}]}),
                ),
                (Value::String(text), _) => StreamItem::Content {
                    index,
                    text: text.clone(),
                },
                (_, finish) if self.dom => {
                    StreamItem::Chunk(json!({"choices": [{"index": index, "delta": {}, "finish_reason": finish}]}))
                }
                (_, finish) => StreamItem::Finish {
                    index,
                    reason: match finish.as_str() {
                        Some("length") => "length",
                        Some("content_filter") => "content_filter",
                        _ => "stop",
                    },
                },
            });
        }
    }

    #[test]
    fn content_items_are_written_byte_for_byte_as_their_chunk_dom() {
        let events = [
            // A finish before any text: it carries the role.
            json!({"i": 3, "f": "length"}),
            json!({"i": 0, "t": "Hello"}),
            json!({"i": 0, "t": "a\"b\\c\u{7}\n é 😀 </script>"}),
            json!({"i": 1, "t": "other choice"}),
            json!({"i": 0, "t": ""}),
            json!({"i": 0, "t": "key sk-li"}),
            json!({"i": 0, "t": "ve-0123456789 whole sk-live-0123456789 end sk-live-01"}),
            json!({"i": 12, "t": "x"}),
            json!({"i": 0, "f": "stop"}),
            json!({"i": 1, "t": "sk-live-0123"}),
            json!({"i": 1, "f": "length"}),
        ];
        let mut input = String::new();
        for e in &events {
            input.push_str(&format!("data: {e}\n\n"));
        }
        input.push_str("data: [DONE]\n\n");
        for op in [Operation::Chat, Operation::Completions] {
            for secret in [None, Some(SECRET)] {
                let out = |dom: bool| {
                    let make = || {
                        let r = StreamRewriter::new(Box::new(Deltas { dom }), stamp(op), true);
                        match secret {
                            Some(secret) => r.redacting(&redact::Secret::new(secret)),
                            None => r,
                        }
                    };
                    replay_with(&make, input.as_bytes())
                };
                let (written, from_dom) = (out(false), out(true));
                assert_eq!(written, from_dom, "{op:?}, secret {secret:?}");
                assert!(written.ends_with("data: [DONE]\n\n"));
                assert_eq!(secret.is_some(), !written.contains("0123456789"), "{written}");
            }
        }
    }

    #[test]
    fn a_text_delta_is_scrubbed_wherever_its_chunk_could_hold_the_secret() {
        // Text deltas written without a DOM skip the scrub of their chunk
        // when it cannot hold the secret: each case here is one where it
        // could, outside the text the scrubber saw.
        let cases = [
            // Only once JSON escapes the text (`\n` + `abcdefgh1`).
            ("nabcdefgh1", json!({"i": 0, "t": "x\nabcdefgh1 y"})),
            // In the role, the object, the id, a member name, the index.
            ("assistant", json!({"i": 0, "t": "hi"})),
            ("completion.chunk", json!({"i": 0, "t": "hi"})),
            ("chatcmpl_ID", json!({"i": 0, "t": "hi"})),
            ("finish_reason", json!({"i": 0, "t": "hi"})),
            ("12345678", json!({"i": 12345678, "t": "hi"})),
            // Not a word: JSON escapes it.
            ("sk\"live\"key", json!({"i": 0, "t": "a sk\"live\"key"})),
        ];
        for (secret, event) in cases {
            let input = format!("data: {event}\n\ndata: [DONE]\n\n");
            let make = || {
                StreamRewriter::new(Box::new(Deltas { dom: false }), stamp(Operation::Chat), true)
                    .redacting(&redact::Secret::new(secret))
            };
            let written = replay_with(&make, input.as_bytes());
            let escaped = serde_json::to_string(secret).unwrap();
            assert!(!written.contains(secret), "{secret}: {written}");
            assert!(!written.contains(&escaped[1..escaped.len() - 1]), "{secret}: {written}");
            assert!(written.contains("[redacted]"), "{secret}: {written}");
        }
    }

    #[test]
    fn a_finish_chunk_is_scrubbed_wherever_it_could_hold_the_secret() {
        // Finish chunks written without a DOM skip the scrub of their chunk
        // as text deltas do: each case is one where it could hold the secret.
        for (secret, finish) in [
            // The reason, a template word, the stream's head.
            ("content_filter", "content_filter"),
            ("finish_reason", "stop"),
            ("completion.chunk", "length"),
        ] {
            let input = format!(
                "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
                json!({"i": 0, "t": "hi"}),
                json!({"i": 0, "f": finish})
            );
            let make = || {
                StreamRewriter::new(Box::new(Deltas { dom: false }), stamp(Operation::Chat), true)
                    .redacting(&redact::Secret::new(secret))
            };
            let written = replay_with(&make, input.as_bytes());
            assert!(!written.contains(secret), "{secret}: {written}");
            assert!(written.contains("[redacted]"), "{secret}: {written}");
        }
    }

    const SECRET: &str = "sk-live-0123456789";

    /// An OpenAI stream whose content deltas are `pieces`, then `ending`.
    fn stream_of(pieces: &[&str], ending: &str) -> String {
        let mut s = String::new();
        for p in pieces {
            let v = json!({"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": null}]});
            s.push_str(&format!("data: {v}\n\n"));
        }
        s.push_str(ending);
        s
    }

    /// Replays with the secret scrubbed; returns the client's events.
    fn scrubbed(op: Operation, input: &str) -> Vec<Value> {
        let make =
            || StreamRewriter::new(Box::new(OpenAiStream), stamp(op), true).redacting(&redact::Secret::new(SECRET));
        parsed(&replay_with(&make, input.as_bytes()))
    }

    fn text_of(events: &[Value]) -> String {
        events
            .iter()
            .filter_map(|e| {
                let c = &e["choices"][0];
                c["delta"]["content"]
                    .as_str()
                    .or(c["text"].as_str())
                    .map(str::to_string)
            })
            .collect()
    }

    const FINISH: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

    #[test]
    fn a_credential_split_across_deltas_is_scrubbed() {
        for cut in 1..SECRET.len() {
            let (a, b) = SECRET.split_at(cut);
            let events = scrubbed(Operation::Chat, &stream_of(&["key: ", a, b, " end"], FINISH));
            let text = text_of(&events);
            assert!(!text.contains(SECRET), "cut at {cut}: {text}");
            // At most the first HOLD_MIN - 1 characters went out before it.
            let shown = &SECRET[..cut.min(HOLD_MIN - 1)];
            let expect = if cut < HOLD_MIN {
                format!("key: {shown}[redacted] end")
            } else {
                "key: [redacted] end".to_string()
            };
            assert_eq!(text, expect, "cut at {cut}");
            assert_eq!(events.last().unwrap(), "[DONE]");
        }
        // Short pieces that add up to more than HOLD_MIN - 1 characters.
        let events = scrubbed(
            Operation::Chat,
            &stream_of(&["sk", "-", "l", "ive-0123456789", "."], FINISH),
        );
        assert_eq!(text_of(&events), "sk-[redacted].");
        // Three pieces, and legacy clients.
        let events = scrubbed(
            Operation::Completions,
            &stream_of(&["x", "sk-live-01", "2345", "6789!"], FINISH),
        );
        assert_eq!(text_of(&events), "x[redacted]!");
    }

    #[test]
    fn a_credential_outside_the_text_is_scrubbed_too() {
        // Found by the `stream_openai` fuzz target: the credential in a key
        // of the delta (passed through as is) and in an error message.
        let input = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"x{SECRET}\":1,\"content\":\"a\"}}}}]}}\n\n\
             data: {{\"error\":{{\"message\":\"bad key {SECRET}\"}}}}\n\n"
        );
        let events = scrubbed(Operation::Chat, &input);
        let all: String = events.iter().map(Value::to_string).collect();
        assert!(!all.contains(SECRET), "{all}");
        assert_eq!(events[0]["choices"][0]["delta"]["x[redacted]"], 1);
        assert_eq!(events[1]["error"]["message"], "bad key [redacted]");
    }

    #[test]
    fn held_text_that_was_not_the_credential_goes_out_at_the_end() {
        // Held at the finish chunk, at [DONE] without a finish, before an
        // error event: the text is whole and in order.
        let events = scrubbed(Operation::Chat, &stream_of(&["ask sk-live"], FINISH));
        assert_eq!(text_of(&events), "ask sk-live");
        let events = scrubbed(Operation::Chat, &stream_of(&["ask sk-live"], "data: [DONE]\n\n"));
        assert_eq!(text_of(&events), "ask sk-live");
        assert_eq!(events.last().unwrap(), "[DONE]");
        let events = scrubbed(Operation::Chat, &stream_of(&["ask sk-live"], ""));
        assert_eq!(text_of(&events), "ask sk-live");
        assert_eq!(events.last().unwrap()["error"]["code"], "stream_interrupted");
        // Ordinary text is never held.
        let events = scrubbed(Operation::Chat, &stream_of(&["cats", " sk", "s"], FINISH));
        let pieces: Vec<&str> = events
            .iter()
            .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(pieces, ["cats", " sk", "s"]);
    }

    #[test]
    fn positions_list_every_byte_of_the_secret_in_order() {
        for secret in ["sk-live-0123456789", "aaaa", "", "ключ-ключ-é", "a\"b\\c\u{1}"] {
            let positions = Positions::new(secret.as_bytes());
            for b in 0..=255u8 {
                let expected: Vec<u32> = (0..secret.len() as u32)
                    .filter(|i| secret.as_bytes()[*i as usize] == b)
                    .collect();
                assert_eq!(positions.of(b), expected.as_slice(), "{secret:?} {b}");
            }
        }
    }
}
