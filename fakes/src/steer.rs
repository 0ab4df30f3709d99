//! Steering: what a fake provider does is chosen by the upstream model name.
//!
//! The whole name is tried first, then every suffix that follows a `-`, so
//! `claude-status-529` and `gpt-4o-cut-3` work as well as `status-529` and `cut-3`.
//! A name that matches nothing (e.g. `gpt-4o`) behaves like `ok`.

/// One steering directive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Directive {
    /// A normal answer: `Hello from <provider> fake.`
    Ok,
    /// `status-NNN`: answer status NNN with the provider's native error body.
    Status(u16),
    /// `limited-S`: answer 429 with `retry-after: S` (seconds).
    Limited(u64),
    /// `slow-MS`: wait MS milliseconds before sending the response headers.
    Slow(u64),
    /// `cut-N`: stream N events then close the connection; non-stream: half a body.
    Cut(usize),
    /// `garbage`: 200 with a body that is not valid JSON / not valid SSE data.
    Garbage,
    /// `echo`: the answer text is the JSON of the request that was received.
    Echo,
    /// `tool`: one call to the first (or the forced) tool, when the request has tools.
    Tool,
    /// `tools`: one call per declared tool (parallel tool calls).
    Tools,
    /// `agent`: an agent's turn. A call to the first (or the forced) tool while the
    /// conversation holds no tool result; then text quoting the last result.
    Agent,
    /// `json`: the answer text is a JSON object.
    Json,
    /// `long-N`: N words, streamed one word per event.
    Long(usize),
    /// `stream-error`: a stream that carries the provider's in-stream error event.
    StreamError,
}

/// Longest `slow-MS` honoured (ten minutes).
const MAX_SLOW_MS: u64 = 600_000;
/// Most words `long-N` produces.
const MAX_LONG: usize = 100_000;

/// The directive named by an upstream model name.
pub(crate) fn parse(model: &str) -> Directive {
    let name = model.rsplit('/').next().unwrap_or(model);
    let suffixes = name
        .char_indices()
        .filter(|&(_, c)| c == '-')
        .filter_map(|(i, _)| name.get(i + 1..));
    std::iter::once(name)
        .chain(suffixes)
        .find_map(parse_exact)
        .unwrap_or(Directive::Ok)
}

fn parse_exact(s: &str) -> Option<Directive> {
    let fixed = match s {
        "ok" => Some(Directive::Ok),
        "garbage" => Some(Directive::Garbage),
        "echo" => Some(Directive::Echo),
        "tool" => Some(Directive::Tool),
        "tools" => Some(Directive::Tools),
        "agent" => Some(Directive::Agent),
        "json" => Some(Directive::Json),
        "stream-error" => Some(Directive::StreamError),
        _ => None,
    };
    if fixed.is_some() {
        return fixed;
    }
    let (name, number) = s.split_once('-')?;
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match name {
        "status" => number
            .parse::<u16>()
            .ok()
            .filter(|n| (100..=599).contains(n))
            .map(Directive::Status),
        "slow" => number
            .parse::<u64>()
            .ok()
            .map(|ms| Directive::Slow(ms.min(MAX_SLOW_MS))),
        "cut" => number.parse::<usize>().ok().map(Directive::Cut),
        "limited" => number.parse::<u64>().ok().map(Directive::Limited),
        "long" => number
            .parse::<usize>()
            .ok()
            .map(|n| Directive::Long(n.clamp(1, MAX_LONG))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{Directive, parse};

    #[test]
    fn names_and_suffixes() {
        assert_eq!(parse("ok"), Directive::Ok);
        assert_eq!(parse("status-429"), Directive::Status(429));
        assert_eq!(parse("claude-status-529"), Directive::Status(529));
        assert_eq!(parse("gpt-4o-cut-3"), Directive::Cut(3));
        assert_eq!(parse("slow-250"), Directive::Slow(250));
        assert_eq!(parse("limited-2"), Directive::Limited(2));
        assert_eq!(parse("long-5"), Directive::Long(5));
        assert_eq!(parse("x-stream-error"), Directive::StreamError);
        assert_eq!(parse("models/echo"), Directive::Echo);
        assert_eq!(parse("claude-agent"), Directive::Agent);
        assert_eq!(parse("gpt-4o"), Directive::Ok);
        assert_eq!(parse("gemini-2.5-flash"), Directive::Ok);
        assert_eq!(parse("status-99"), Directive::Ok);
        assert_eq!(parse("status-"), Directive::Ok);
    }
}
