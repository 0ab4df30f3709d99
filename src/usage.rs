//! Token usage as OpenAI reports it, read from any answer.

use serde_json::{Value, json};

use crate::json::members::ObjectWriter;

/// Prompt and completion tokens of one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    /// Reads an OpenAI `usage` object; `None` when absent or not an object.
    pub fn from_openai(v: Option<&Value>) -> Option<Usage> {
        let o = v?.as_object()?;
        let n = |k: &str| o.get(k).and_then(Value::as_u64).unwrap_or(0);
        Some(Usage {
            prompt_tokens: n("prompt_tokens"),
            completion_tokens: n("completion_tokens"),
        })
    }

    /// [`Usage::from_openai`] of a raw `usage` member (already checked JSON).
    pub fn from_openai_raw(json: &str) -> Option<Usage> {
        Usage::from_openai(Some(&crate::json::dom::parse(json).ok()?))
    }

    /// [`Usage::to_json`] written straight into `w` (its members in the
    /// order serde's map gives them: names sorted), without a tree.
    pub fn write_json(self, mut w: ObjectWriter<'_>) {
        w.number("completion_tokens", self.completion_tokens);
        w.number("prompt_tokens", self.prompt_tokens);
        w.number("total_tokens", self.total());
        w.finish();
    }

    pub fn to_json(self) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(json: &str) -> Option<Usage> {
        Usage::from_openai_raw(json)
    }

    #[test]
    fn usage_is_written_as_its_tree_encodes() {
        for (prompt, completion) in [(0, 0), (8, 377), (u64::MAX, 1), (1234567890123, 9)] {
            let usage = Usage {
                prompt_tokens: prompt,
                completion_tokens: completion,
            };
            let mut out = Vec::new();
            usage.write_json(ObjectWriter::new(&mut out));
            assert_eq!(out, serde_json::to_vec(&usage.to_json()).unwrap());
        }
    }

    #[test]
    fn a_raw_usage_gives_its_two_counts_and_zero_for_anything_else() {
        let usage = |prompt_tokens, completion_tokens| {
            Some(Usage {
                prompt_tokens,
                completion_tokens,
            })
        };
        for (json, expected) in [
            (
                r#"{"prompt_tokens":8,"completion_tokens":377,"total_tokens":385,
                    "completion_tokens_details":{"reasoning_tokens":320},"prompt_tokens_details":{"cached_tokens":0}}"#,
                usage(8, 377),
            ),
            (r#"{"prompt_tokens":3}"#, usage(3, 0)),
            (r#"{}"#, usage(0, 0)),
            (r#"{"prompt_tokens":-1,"completion_tokens":2.5}"#, usage(0, 0)),
            (r#"{"prompt_tokens":"7","completion_tokens":[1,{"a":2}]}"#, usage(0, 0)),
            (
                r#"{"prompt_tokens":18446744073709551615,"completion_tokens":1e3}"#,
                usage(u64::MAX, 0),
            ),
            // The last of a repeated name counts; an escaped name is the name.
            (
                r#"{"prompt\u005ftokens":5,"completion_tokens":4,"completion_tokens":6}"#,
                usage(5, 6),
            ),
            (r#"null"#, None),
            (r#"[{"prompt_tokens":1}]"#, None),
            (r#""usage""#, None),
        ] {
            assert_eq!(raw(json), expected, "{json}");
        }
    }
}
