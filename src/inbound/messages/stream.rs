//! The chat stream as Anthropic's event sequence.
//!
//! [`MessagesStream`] reads the finished chat stream and writes, each as
//! `event: <type>` and its data: `message_start` (the message, empty) and a
//! `ping`; per run of reasoning a `thinking` block (`thinking_delta`s, its
//! signature empty: no provider but Anthropic signs); per text run
//! `content_block_start` (`text`),
//! `content_block_delta`s (`text_delta`) and `content_block_stop`; per tool
//! call `content_block_start` (`tool_use`), `content_block_delta`s
//! (`input_json_delta`) and `content_block_stop`; at `[DONE]`
//! `message_delta` (the `stop_reason` and the usage) and `message_stop`. The
//! chat stream's error event becomes an `error` event: it never ends
//! silently.

use serde_json::{Value, json};

use super::{stop_reason, usage};
use crate::answer::Stamp;
use crate::inbound::chat_stream::ChatStreamWriter;
use crate::sse::SseDecoder;

/// The content block being written.
enum Open {
    None,
    Thinking,
    Text,
    /// A tool call; `index` is chat's tool call index.
    Tool {
        index: u64,
    },
}

/// Rewrites one chat stream as a Messages stream.
pub struct MessagesStream {
    stamp: Stamp,
    decoder: SseDecoder,
    started: bool,
    finished: bool,
    /// The index the next content block gets.
    blocks: u64,
    open: Open,
    finish_reason: Option<String>,
    usage: Option<Value>,
}

impl MessagesStream {
    pub fn new(stamp: Stamp) -> Self {
        MessagesStream {
            stamp,
            decoder: SseDecoder::default(),
            started: false,
            finished: false,
            blocks: 0,
            open: Open::None,
            finish_reason: None,
            usage: None,
        }
    }

    fn close_block(&mut self, out: &mut Vec<u8>) {
        if matches!(std::mem::replace(&mut self.open, Open::None), Open::None) {
            return;
        }
        emit(
            out,
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": self.blocks}),
        );
        self.blocks = self.blocks.saturating_add(1);
    }
}

impl ChatStreamWriter for MessagesStream {
    fn decoder(&mut self) -> &mut SseDecoder {
        &mut self.decoder
    }

    fn finished(&self) -> bool {
        self.finished
    }

    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({"type": "message_start", "message": {
            "id": self.stamp.id, "type": "message", "role": "assistant", "model": self.stamp.model,
            "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage(None)}});
        emit(out, "message_start", &message);
        emit(out, "ping", &json!({"type": "ping"}));
    }

    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>) {
        if !matches!(self.open, Open::Thinking) {
            self.close_block(out);
            let start = json!({"type": "content_block_start", "index": self.blocks,
                "content_block": {"type": "thinking", "thinking": "", "signature": ""}});
            emit(out, "content_block_start", &start);
            self.open = Open::Thinking;
        }
        let delta = json!({"type": "content_block_delta", "index": self.blocks,
            "delta": {"type": "thinking_delta", "thinking": text}});
        emit(out, "content_block_delta", &delta);
    }

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if !matches!(self.open, Open::Text) {
            self.close_block(out);
            let start = json!({"type": "content_block_start", "index": self.blocks, "content_block": {"type": "text", "text": ""}});
            emit(out, "content_block_start", &start);
            self.open = Open::Text;
        }
        let delta =
            json!({"type": "content_block_delta", "index": self.blocks, "delta": {"type": "text_delta", "text": text}});
        emit(out, "content_block_delta", &delta);
    }

    fn tool_call(&mut self, call: &Value, out: &mut Vec<u8>) {
        let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        let text = |pointer: &str| call.pointer(pointer).and_then(Value::as_str).unwrap_or_default();
        let same = matches!(self.open, Open::Tool { index: open } if open == index);
        if !same {
            self.close_block(out);
            let start = json!({"type": "content_block_start", "index": self.blocks, "content_block":
                {"type": "tool_use", "id": text("/id"), "name": text("/function/name"), "input": {}}});
            emit(out, "content_block_start", &start);
            self.open = Open::Tool { index };
        }
        let arguments = text("/function/arguments");
        if !arguments.is_empty() {
            let delta = json!({"type": "content_block_delta", "index": self.blocks,
                "delta": {"type": "input_json_delta", "partial_json": arguments}});
            emit(out, "content_block_delta", &delta);
        }
    }

    fn finish_reason(&mut self, reason: &str, out: &mut Vec<u8>) {
        self.finish_reason = Some(reason.to_string());
        self.close_block(out);
    }

    fn usage(&mut self, usage: &Value) {
        self.usage = Some(usage.clone());
    }

    fn done(&mut self, out: &mut Vec<u8>) {
        self.close_block(out);
        let stop_reason = stop_reason(self.finish_reason.as_deref());
        let delta = json!({"type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": null},
            "usage": usage(self.usage.as_ref())});
        emit(out, "message_delta", &delta);
        emit(out, "message_stop", &json!({"type": "message_stop"}));
        self.finished = true;
    }

    fn failed(&mut self, error: Option<&Value>, out: &mut Vec<u8>) {
        let kind = match error.and_then(|e| e.get("type")).and_then(Value::as_str) {
            Some("rate_limit_error") => "rate_limit_error",
            _ => "api_error",
        };
        let message = match error {
            Some(e) => e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("The provider failed."),
            None => "The provider's stream ended before it was complete.",
        };
        emit(
            out,
            "error",
            &json!({"type": "error", "error": {"type": kind, "message": message}}),
        );
        self.finished = true;
    }
}

fn emit(out: &mut Vec<u8>, kind: &str, data: &Value) {
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\n");
    crate::sse::write_data(out, &serde_json::to_vec(data).unwrap_or_default());
}
