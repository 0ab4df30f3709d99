//! The chat stream as the Responses event sequence.
//!
//! [`ResponsesStream`] reads the finished chat stream (what
//! [`crate::stream::StreamRewriter`] wrote: chunks, the usage chunk,
//! `[DONE]`, or one error event) and writes, each event with its `type` and
//! `sequence_number`:
//!
//! - `response.created` and `response.in_progress` first;
//! - for text: `response.output_item.added` (a `message`),
//!   `response.content_part.added`, `response.output_text.delta`s, then at
//!   the finish `response.output_text.done`, `response.content_part.done`
//!   and `response.output_item.done`;
//! - for each tool call: `response.output_item.added` (a `function_call`),
//!   `response.function_call_arguments.delta`s, then
//!   `response.function_call_arguments.done` and `response.output_item.done`;
//! - at `[DONE]`: `response.completed` (or `response.incomplete` when the
//!   output hit `max_output_tokens`) with the whole response and its usage;
//! - an error event instead: `error`, then `response.failed`, never a
//!   silent end.

use serde_json::{Map, Value, json};

use super::{Echo, ending, item_id, message_item, output_text, usage};
use crate::answer::Stamp;
use crate::inbound::chat_stream::ChatStreamWriter;
use crate::sse::SseDecoder;

/// The message item being written.
struct OpenMessage {
    output_index: usize,
    id: String,
    text: String,
}

/// A tool call being written; `index` is chat's tool call index.
struct OpenCall {
    index: u64,
    output_index: usize,
    id: String,
    call_id: String,
    name: String,
    arguments: String,
}

/// Rewrites one chat stream as a Responses stream.
pub struct ResponsesStream {
    echo: Echo,
    stamp: Stamp,
    decoder: SseDecoder,
    sequence: u64,
    started: bool,
    finished: bool,
    /// Every item by its output index; open ones are `Null` until done.
    output: Vec<Value>,
    message: Option<OpenMessage>,
    calls: Vec<OpenCall>,
    finish_reason: Option<String>,
    usage: Option<Value>,
}

impl ResponsesStream {
    pub fn new(echo: Echo, stamp: Stamp) -> Self {
        ResponsesStream {
            echo,
            stamp,
            decoder: SseDecoder::default(),
            sequence: 0,
            started: false,
            finished: false,
            output: Vec::new(),
            message: None,
            calls: Vec::new(),
            finish_reason: None,
            usage: None,
        }
    }

    /// The next output index, held until its item is done.
    fn reserve(&mut self) -> usize {
        self.output.push(Value::Null);
        self.output.len().saturating_sub(1)
    }

    fn place(&mut self, output_index: usize, item: Value) {
        if let Some(slot) = self.output.get_mut(output_index) {
            *slot = item;
        }
    }

    fn close_message(&mut self, out: &mut Vec<u8>) {
        let Some(OpenMessage { output_index, id, text }) = self.message.take() else {
            return;
        };
        let at = |extra: (&'static str, Value)| {
            [
                ("item_id", Value::String(id.clone())),
                ("output_index", output_index.into()),
                ("content_index", 0.into()),
                extra,
            ]
        };
        let mut done = at(("text", Value::String(text.clone()))).to_vec();
        done.push(("logprobs", json!([])));
        self.emit("response.output_text.done", done, out);
        self.emit("response.content_part.done", at(("part", output_text(&text))), out);
        let item = message_item(id.clone(), &text, "completed");
        self.emit(
            "response.output_item.done",
            [("output_index", output_index.into()), ("item", item.clone())],
            out,
        );
        self.place(output_index, item);
    }

    fn close_items(&mut self, out: &mut Vec<u8>) {
        self.close_message(out);
        for call in std::mem::take(&mut self.calls) {
            let fields = [
                ("item_id", Value::String(call.id.clone())),
                ("output_index", call.output_index.into()),
                ("name", Value::String(call.name.clone())),
                ("arguments", Value::String(call.arguments.clone())),
            ];
            self.emit("response.function_call_arguments.done", fields, out);
            let item = (self.echo).function_call_item(call.id, &call.call_id, &call.name, &call.arguments, "completed");
            self.emit(
                "response.output_item.done",
                [("output_index", call.output_index.into()), ("item", item.clone())],
                out,
            );
            self.place(call.output_index, item);
        }
    }

    /// One event: `event: <type>` and its data, with `type` and `sequence_number`.
    fn emit(&mut self, kind: &str, fields: impl IntoIterator<Item = (&'static str, Value)>, out: &mut Vec<u8>) {
        let mut event = Map::new();
        event.insert("type".into(), kind.into());
        for (name, value) in fields {
            event.insert(name.into(), value);
        }
        event.insert("sequence_number".into(), self.sequence.into());
        self.sequence = self.sequence.saturating_add(1);
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(kind.as_bytes());
        out.extend_from_slice(b"\n");
        crate::sse::write_data(out, &serde_json::to_vec(&Value::Object(event)).unwrap_or_default());
    }
}

impl ChatStreamWriter for ResponsesStream {
    fn decoder(&mut self) -> &mut SseDecoder {
        &mut self.decoder
    }

    fn finished(&self) -> bool {
        self.finished
    }

    /// `response.created` and `response.in_progress`, once.
    fn start(&mut self, out: &mut Vec<u8>) {
        if self.started {
            return;
        }
        self.started = true;
        let response = self.echo.response(&self.stamp, "in_progress", Vec::new(), Value::Null);
        for kind in ["response.created", "response.in_progress"] {
            self.emit(kind, [("response", Value::Object(response.clone()))], out);
        }
    }

    /// Not written. A Responses client sends a `reasoning` item back with its
    /// next turn, and one a translated provider's thoughts made would have no
    /// `encrypted_content`: a provider serving the Responses API natively
    /// refuses such an item (docs/contract.md "The Responses API").
    fn reasoning(&mut self, _text: &str, _out: &mut Vec<u8>) {}

    fn text(&mut self, text: &str, out: &mut Vec<u8>) {
        if self.message.is_none() {
            let output_index = self.reserve();
            let id = item_id(&self.stamp, "msg_", output_index);
            let item =
                json!({"id": id, "type": "message", "status": "in_progress", "role": "assistant", "content": []});
            self.emit(
                "response.output_item.added",
                [("output_index", output_index.into()), ("item", item)],
                out,
            );
            let part = [
                ("item_id", Value::String(id.clone())),
                ("output_index", output_index.into()),
                ("content_index", 0.into()),
                ("part", output_text("")),
            ];
            self.emit("response.content_part.added", part, out);
            self.message = Some(OpenMessage {
                output_index,
                id,
                text: String::new(),
            });
        }
        let Some(message) = self.message.as_mut() else {
            return;
        };
        message.text.push_str(text);
        let fields = [
            ("item_id", Value::String(message.id.clone())),
            ("output_index", message.output_index.into()),
            ("content_index", 0.into()),
            ("delta", text.into()),
            ("logprobs", json!([])),
        ];
        self.emit("response.output_text.delta", fields, out);
    }

    fn tool_call(&mut self, call: &Value, out: &mut Vec<u8>) {
        let index = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        let text = |pointer: &str| call.pointer(pointer).and_then(Value::as_str).unwrap_or_default();
        if !self.calls.iter().any(|c| c.index == index) {
            // Chat writes a turn's text before its tool calls.
            self.close_message(out);
            let output_index = self.reserve();
            let open = OpenCall {
                index,
                output_index,
                id: item_id(&self.stamp, "fc_", output_index),
                call_id: text("/id").to_string(),
                name: text("/function/name").to_string(),
                arguments: String::new(),
            };
            let item = (self.echo).function_call_item(open.id.clone(), &open.call_id, &open.name, "", "in_progress");
            self.emit(
                "response.output_item.added",
                [("output_index", output_index.into()), ("item", item)],
                out,
            );
            self.calls.push(open);
        }
        let arguments = text("/function/arguments");
        let Some(open) = self.calls.iter_mut().find(|c| c.index == index) else {
            return;
        };
        if arguments.is_empty() {
            return;
        }
        open.arguments.push_str(arguments);
        let fields = [
            ("item_id", Value::String(open.id.clone())),
            ("output_index", open.output_index.into()),
            ("delta", arguments.into()),
        ];
        self.emit("response.function_call_arguments.delta", fields, out);
    }

    fn finish_reason(&mut self, reason: &str, out: &mut Vec<u8>) {
        self.finish_reason = Some(reason.to_string());
        self.close_items(out);
    }

    fn usage(&mut self, usage: &Value) {
        self.usage = Some(usage.clone());
    }

    /// `[DONE]`: the whole response, with its usage.
    fn done(&mut self, out: &mut Vec<u8>) {
        self.close_items(out);
        let (status, incomplete) = ending(self.finish_reason.as_deref());
        let output = std::mem::take(&mut self.output);
        let mut response = self
            .echo
            .response(&self.stamp, status, output, usage(self.usage.as_ref()));
        response.insert("incomplete_details".into(), incomplete);
        let kind = if status == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.emit(kind, [("response", Value::Object(response))], out);
        self.finished = true;
    }

    /// The chat stream's error event: `error`, then `response.failed` with
    /// what was written so far.
    fn failed(&mut self, error: Option<&Value>, out: &mut Vec<u8>) {
        let cut = json!({"code": crate::providers::openai::STREAM_INTERRUPTED,
            "message": "The provider's stream ended before it was complete."});
        let error = error.unwrap_or(&cut);
        let field = |name: &str| error.get(name).cloned().unwrap_or(Value::Null);
        let (code, message) = (field("code"), field("message"));
        let fields = [
            ("code", code.clone()),
            ("message", message.clone()),
            ("param", field("param")),
        ];
        self.emit("error", fields, out);
        let output = std::mem::take(&mut self.output)
            .into_iter()
            .filter(|item| !item.is_null())
            .collect();
        let mut response = self
            .echo
            .response(&self.stamp, "failed", output, usage(self.usage.as_ref()));
        response.insert("error".into(), json!({"code": code, "message": message}));
        self.emit("response.failed", [("response", Value::Object(response))], out);
        self.finished = true;
    }
}
