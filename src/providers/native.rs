//! A provider's stream in the client's own API (the Messages API to an
//! Anthropic provider, the Responses API to a provider that serves it): its
//! events pass as they came, each re-framed whole, so a credential the
//! provider echoes is scrubbed event by event; its usage is read for limits
//! and stats; and a stream that ends without its API's last event gets that
//! API's `error` event, never a silent end.

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::errors::{ApiError, ErrorType};
use crate::json::members::{Members, ObjectWriter};
use crate::redact::Secret;
use crate::sse::SseDecoder;
use crate::usage::Usage;

/// The client's body for a provider of the client's own API: every member
/// byte for byte, but the routing field (removed) and `model` (the upstream
/// model, written last).
pub fn request_body(client_body: &[u8], upstream_model: &str, routing_field: &str) -> Result<Vec<u8>, ApiError> {
    let unreadable = || {
        ApiError::new(
            500,
            ErrorType::Upstream,
            "internal_error",
            "The request could not be read again.",
        )
    };
    let text = std::str::from_utf8(client_body).map_err(|_| unreadable())?;
    let members = Members::parse_str(text).map_err(|_| unreadable())?;
    let mut body = Vec::with_capacity(client_body.len().saturating_add(64));
    let mut w = ObjectWriter::new(&mut body);
    for (name, value) in &members.0 {
        if name != "model" && name != routing_field {
            w.member(name, *value);
        }
    }
    w.string("model", upstream_model);
    w.finish();
    Ok(body)
}

/// A provider's answer in the client's own API with `model` the client's,
/// every other member byte for byte.
pub fn answer_with_model(members: &Members<'_>, model: &str, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len.saturating_add(32));
    let mut w = ObjectWriter::new(&mut out);
    for (name, value) in &members.0 {
        if name == "model" {
            w.string("model", model);
        } else {
            w.member(name, *value);
        }
    }
    w.finish();
    out
}

/// The API the stream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// Anthropic's Messages API: ends with `message_stop`.
    Messages,
    /// OpenAI's Responses API: ends with `response.completed`,
    /// `response.incomplete` or `response.failed`.
    Responses,
}

/// The members of an event the stream reads: its type, and where usage is.
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    message: Option<&'a RawValue>,
    #[serde(borrow)]
    response: Option<&'a RawValue>,
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
}

/// One provider stream passed to a client of the same API.
pub struct NativeStream {
    wire: Wire,
    decoder: SseDecoder,
    usage: Option<Usage>,
    finished: bool,
    error_code: Option<String>,
    secret: Option<Secret>,
    /// Events passed, for the sequence number of an `error` event of ours.
    events: u64,
}

impl NativeStream {
    /// `secret`: the provider's credential, scrubbed from every event.
    pub fn new(wire: Wire, secret: Option<Secret>) -> Self {
        NativeStream {
            wire,
            decoder: SseDecoder::default(),
            usage: None,
            finished: false,
            error_code: None,
            secret: secret.filter(Secret::worth_scrubbing),
            events: 0,
        }
    }

    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    pub fn error_code(&self) -> Option<&str> {
        self.error_code.as_deref()
    }

    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        let mut rest = chunk;
        let mut decoder = std::mem::take(&mut self.decoder);
        loop {
            match decoder.next(&mut rest) {
                Ok(Some(event)) => self.on_event(event.data, out),
                Ok(None) => break,
                Err(_) => {
                    self.fail("The provider's stream broke its framing.", out);
                    break;
                }
            }
        }
        self.decoder = decoder;
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if let Ok(Some(last)) = self.decoder.finish().map(|e| e.map(|e| e.data.to_string())) {
            self.on_event(&last, out);
        }
        if !self.finished {
            self.fail("The provider's stream ended before it was complete.", out);
        }
    }

    fn on_event(&mut self, data: &str, out: &mut Vec<u8>) {
        if self.finished {
            return;
        }
        let Ok(event) = serde_json::from_str::<Event<'_>>(data) else {
            return self.fail("The provider sent an event that is not valid.", out);
        };
        let kind = event.kind.as_ref();
        let usage = match self.wire {
            Wire::Messages => super::anthropic::stream_usage(kind, event.message, event.usage, self.usage),
            Wire::Responses => event.response.and_then(|r| super::openai::responses_usage(r.get())),
        };
        if usage.is_some() {
            self.usage = usage;
        }
        let start = out.len();
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.push(b'\n');
        for line in data.split('\n') {
            out.extend_from_slice(b"data: ");
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
        out.push(b'\n');
        if let Some(secret) = &self.secret {
            secret.scrub_from(out, start);
        }
        self.events = self.events.saturating_add(1);
        match (self.wire, kind) {
            (Wire::Messages, "message_stop") | (Wire::Responses, "response.completed" | "response.incomplete") => {
                self.finished = true;
            }
            (_, "error") | (Wire::Responses, "response.failed") => {
                self.finished = true;
                self.error_code = Some("provider_error".into());
            }
            _ => {}
        }
    }

    /// The stream cannot go on: the API's `error` event ends it.
    fn fail(&mut self, message: &str, out: &mut Vec<u8>) {
        let e = super::openai::interrupted(message);
        out.extend_from_slice(b"event: error\n");
        let data = match self.wire {
            Wire::Messages => crate::inbound::messages::error_body(&e),
            Wire::Responses => serde_json::to_vec(&serde_json::json!({"type": "error", "code": e.code,
                "message": e.message, "param": null, "sequence_number": self.events}))
            .unwrap_or_default(),
        };
        crate::sse::write_data(out, &data);
        self.finished = true;
        self.error_code = Some(e.code);
    }
}
