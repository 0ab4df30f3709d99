//! Stamps an OpenAI-shaped answer for the client (contract §6): our own id,
//! the client's model id exactly, `created`, and `usage` always present; and
//! reshapes a chat answer into `text_completion` for the legacy endpoint.

use serde_json::{Map, Value, json};

use crate::request::Operation;
use crate::usage::Usage;

/// What every answer to one request shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub op: Operation,
    pub id: String,
    pub model: String,
    pub created: u64,
}

/// Finishes a non-streaming answer. `answer` is a `chat.completion` or a
/// native `text_completion` object (already checked to have `choices`).
pub fn finish(stamp: &Stamp, answer: Value, usage: Usage) -> Value {
    let mut answer = match answer {
        Value::Object(map) => map,
        _ => Map::new(),
    };
    let created = answer.get("created").and_then(Value::as_u64).unwrap_or(stamp.created);
    if stamp.op == Operation::Completions {
        let choices = answer.remove("choices").unwrap_or(Value::Null);
        answer.insert("choices".into(), Value::Array(text_choices(&choices)));
        answer.insert("object".into(), "text_completion".into());
    } else {
        answer.insert("object".into(), "chat.completion".into());
    }
    answer.insert("id".into(), Value::String(stamp.id.clone()));
    answer.insert("model".into(), Value::String(stamp.model.clone()));
    answer.insert("created".into(), created.into());
    answer.insert("usage".into(), usage.to_json());
    Value::Object(answer)
}

/// Chat choices (`message.content`) or native legacy choices (`text`) as
/// legacy choices.
fn text_choices(choices: &Value) -> Vec<Value> {
    let Some(choices) = choices.as_array() else {
        return Vec::new();
    };
    choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let text = c
                .get("text")
                .or_else(|| c.pointer("/message/content"))
                .and_then(Value::as_str)
                .unwrap_or("");
            json!({
                "text": text,
                "index": c.get("index").and_then(Value::as_u64).unwrap_or(i as u64),
                "logprobs": c.get("logprobs").cloned().unwrap_or(Value::Null),
                "finish_reason": c.get("finish_reason").cloned().unwrap_or(Value::Null),
            })
        })
        .collect()
}

/// One legacy stream choice from a chat delta (`delta.content`) or a native
/// legacy chunk (`text`).
pub fn text_stream_choice(c: &Value, fallback_index: usize) -> Value {
    let text = c
        .get("text")
        .or_else(|| c.pointer("/delta/content"))
        .and_then(Value::as_str)
        .unwrap_or("");
    json!({
        "text": text,
        "index": c.get("index").and_then(Value::as_u64).unwrap_or(fallback_index as u64),
        "logprobs": Value::Null,
        "finish_reason": c.get("finish_reason").cloned().unwrap_or(Value::Null),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(op: Operation) -> Stamp {
        Stamp {
            op,
            id: "chatcmpl_X".into(),
            model: "openai/gpt".into(),
            created: 7,
        }
    }

    #[test]
    fn chat_answers_get_our_id_model_and_usage() {
        let a = json!({"id":"up","object":"chat.completion","created":5,"model":"gpt-4o-2024",
            "choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]});
        let out = finish(
            &stamp(Operation::Chat),
            a,
            Usage {
                prompt_tokens: 3,
                completion_tokens: 1,
            },
        );
        assert_eq!(out["id"], "chatcmpl_X");
        assert_eq!(out["model"], "openai/gpt");
        assert_eq!(out["created"], 5);
        assert_eq!(
            out["usage"],
            json!({"prompt_tokens":3,"completion_tokens":1,"total_tokens":4})
        );
        assert_eq!(out["choices"][0]["message"]["content"], "hi");
    }

    #[test]
    fn chat_becomes_text_completion_for_legacy() {
        let a = json!({"choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"length"}]});
        let out = finish(&stamp(Operation::Completions), a, Usage::default());
        assert_eq!(out["object"], "text_completion");
        assert_eq!(out["created"], 7);
        assert_eq!(
            out["choices"],
            json!([{"text":"hi","index":0,"logprobs":null,"finish_reason":"length"}])
        );
        assert_eq!(out["usage"]["total_tokens"], 0);
    }
}
