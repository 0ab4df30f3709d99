//! Fake OpenAI Responses API (`POST /v1/responses`), for a provider marked as serving it:
//! a `response` object, or its event stream (`response.created` … `response.completed`,
//! each with its `sequence_number`), with the text steered by the model name (`ok`,
//! `echo`, `long-N`, `status-NNN`) and usage counted as the other fakes count it.

use serde_json::{Value, json};

use super::super::answer::{echo_text, input_words, random_id, word_count};
use super::super::reply::Reply;
use super::super::steer::{self, Directive};
use super::{RecordedRequest, invalid, status_error};

const SSE: &str = "text/event-stream; charset=utf-8";

pub(super) fn handle(req: &RecordedRequest) -> Reply {
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(&req.body) else {
        return invalid("We could not parse the JSON body of your request.", None, None);
    };
    let Some(model) = body.get("model").and_then(Value::as_str) else {
        return invalid(
            "Missing required parameter: 'model'.",
            Some("model"),
            Some("missing_required_parameter"),
        );
    };
    let text = match steer::parse(model) {
        Directive::Status(code) => return status_error(code),
        Directive::Echo => echo_text(req),
        Directive::Long(n) => (1..=n).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" "),
        _ => "Hello from openai responses fake.".to_string(),
    };
    let id = format!("resp_{}", random_id(24));
    let input = input_words(body.get("input").unwrap_or(&Value::Null)).max(1) as u64;
    let output = word_count(&text).max(1) as u64;
    let message = json!({"id": format!("msg_{}", random_id(24)), "type": "message", "status": "completed",
        "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]});
    let response = |status: &str, output_items: Value, usage: Value| {
        json!({"id": id, "object": "response", "created_at": 1_700_000_000, "status": status, "model": model,
            "output": output_items, "usage": usage})
    };
    let usage = json!({"input_tokens": input, "output_tokens": output, "total_tokens": input + output});
    if body.get("stream").and_then(Value::as_bool) != Some(true) {
        return Reply::json(200, &response("completed", json!([message]), usage));
    }
    let mut events = Vec::new();
    let mut event = |kind: &str, mut data: Value| {
        data["type"] = kind.into();
        data["sequence_number"] = events.len().into();
        events.push(format!("event: {kind}\ndata: {data}\n\n").into_bytes());
    };
    event(
        "response.created",
        json!({"response": response("in_progress", json!([]), Value::Null)}),
    );
    for piece in text.split_inclusive(' ').enumerate() {
        event(
            "response.output_text.delta",
            json!({"item_id": message["id"], "output_index": 0,
            "content_index": 0, "delta": piece, "logprobs": [], }),
        );
    }
    event(
        "response.completed",
        json!({"response": response("completed", json!([message]), usage)}),
    );
    Reply::sse(SSE, events)
}
