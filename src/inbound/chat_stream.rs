//! The internal chat stream read back, for the modules that rewrite it into
//! another API's stream: one reading, each adapter says what it writes for
//! each kind of event ([`ChatStreamWriter`]).
//!
//! The chat stream is what [`crate::stream::StreamRewriter`] wrote: chunks
//! (choice 0's reasoning, text, refusal and tool call deltas, its finish reason), the
//! usage chunk, then `[DONE]`; or one error event instead of `[DONE]`.

use serde_json::Value;

use crate::sse::SseDecoder;

/// An API's stream written from the chat stream's events.
pub trait ChatStreamWriter {
    /// The decoder of the chat stream's bytes, kept between pieces.
    fn decoder(&mut self) -> &mut SseDecoder;
    /// Whether the client's stream has ended (what follows is ignored).
    fn finished(&self) -> bool;
    /// Before the first event's own output.
    fn start(&mut self, out: &mut Vec<u8>);
    /// Reasoning of choice 0 (`reasoning_content`: a provider's thoughts,
    /// shown when the request asked for an effort), before its text.
    fn reasoning(&mut self, text: &str, out: &mut Vec<u8>);
    /// Text of choice 0 (its content, or a refusal).
    fn text(&mut self, text: &str, out: &mut Vec<u8>);
    /// One tool call delta of choice 0 (`index`, `id`, `function`).
    fn tool_call(&mut self, call: &Value, out: &mut Vec<u8>);
    /// Choice 0's finish reason.
    fn finish_reason(&mut self, reason: &str, out: &mut Vec<u8>);
    /// A `usage` object (the latest counts).
    fn usage(&mut self, usage: &Value);
    /// `[DONE]`: the stream's own end.
    fn done(&mut self, out: &mut Vec<u8>);
    /// The error event (`{"error": {...}}`'s inside), or `None` for a stream
    /// that ended with neither `[DONE]` nor one.
    fn failed(&mut self, error: Option<&Value>, out: &mut Vec<u8>);

    /// Rewrites a piece of the chat stream into `out`.
    fn push(&mut self, chat: &[u8], out: &mut Vec<u8>) {
        let mut rest = chat;
        let mut decoder = std::mem::take(self.decoder());
        while let Ok(Some(event)) = decoder.next(&mut rest) {
            on_event(self, event.data, out);
        }
        *self.decoder() = decoder;
    }

    /// The chat stream is over: the client's ends with it, never silently.
    fn finish(&mut self, out: &mut Vec<u8>) {
        if let Ok(Some(last)) = self.decoder().finish().map(|e| e.map(|e| e.data.to_string())) {
            on_event(self, &last, out);
        }
        if !self.finished() {
            self.start(out);
            self.failed(None, out);
        }
    }
}

fn on_event<W: ChatStreamWriter + ?Sized>(w: &mut W, data: &str, out: &mut Vec<u8>) {
    if w.finished() {
        return;
    }
    w.start(out);
    if data == "[DONE]" {
        return w.done(out);
    }
    let Ok(chunk) = crate::json::dom::parse(data) else {
        return;
    };
    if let Some(error) = chunk.get("error") {
        return w.failed(Some(error), out);
    }
    if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
        w.usage(usage);
    }
    // Neither API has more than one choice.
    let choices = chunk.get("choices").and_then(Value::as_array).map(Vec::as_slice);
    let Some(choice) =
        (choices.unwrap_or_default().iter()).find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
    else {
        return;
    };
    if let Some(delta) = choice.get("delta") {
        if let Some(text) = delta
            .get("reasoning_content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            w.reasoning(text, out);
        }
        for key in ["content", "refusal"] {
            if let Some(text) = delta.get(key).and_then(Value::as_str).filter(|t| !t.is_empty()) {
                w.text(text, out);
            }
        }
        let calls = delta.get("tool_calls").and_then(Value::as_array).map(Vec::as_slice);
        for call in calls.unwrap_or_default() {
            w.tool_call(call, out);
        }
    }
    if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
        w.finish_reason(reason, out);
    }
}
