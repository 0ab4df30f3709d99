//! The request's fast path: it accepts a body only when the DOM validator
//! ([`super::parse`]'s slow path) would accept it and read the same model and
//! stream flags. Anything else (an error, an escape in a name or value it must
//! compare, a number it cannot place exactly, a repeated name it cannot
//! resolve the way the DOM does) says `None`, and the DOM validator answers and
//! names the problem. So this never writes an error, and `request_fast` in the
//! tests and the `request` fuzz target hold both paths to the same answers.
//!
//! No DOM is built: the JSON is checked by one walk that also gives the
//! top-level members' spans for the OpenAI-compatible rewrite. In wasm the
//! DOM was the largest single cost of a request (`make bench`).

use std::ops::Range;

use super::{INTEGER_MINIMUMS, NUMBER_RANGES, Operation, RESPONSE_FORMATS, ROLES};
use crate::json::split::Walk;

/// What the fast path read from an accepted body.
pub(super) struct Accepted {
    /// Each top-level member's name and value, as spans of the text.
    pub spans: Vec<(Range<usize>, Range<usize>)>,
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
}

/// The top-level members the validator looks at; the last of a repeated
/// name counts, as in serde_json's DOM.
#[derive(Default)]
struct Fields<'a> {
    model: Option<&'a str>,
    messages: Option<&'a str>,
    prompt: Option<&'a str>,
    /// By [`NUMBER_RANGES`]' order.
    numbers: [Option<&'a str>; NUMBER_RANGES.len()],
    /// By [`INTEGER_MINIMUMS`]' order.
    integers: [Option<&'a str>; INTEGER_MINIMUMS.len()],
    stop: Option<&'a str>,
    user: Option<&'a str>,
    response_format: Option<&'a str>,
    tools: Option<&'a str>,
    stream: Option<&'a str>,
    stream_options: Option<&'a str>,
}

/// `Some` only when the DOM validator would accept `text` for `op`.
pub(super) fn check(op: Operation, text: &str) -> Option<Accepted> {
    let mut spans = Vec::with_capacity(16);
    let mut f = Fields::default();
    let mut walk = Walk::values(text);
    walk.object(&mut |name, walk| {
        // Messages are checked as the walk passes them, not walked again.
        let value = match (name, op) {
            ("messages", Operation::Chat) => messages(walk)?,
            _ => walk.value()?,
        };
        spans.push((span_in(text, name), span_in(text, value)));
        let slot = match name {
            "model" => &mut f.model,
            "messages" => &mut f.messages,
            "prompt" => &mut f.prompt,
            "stop" => &mut f.stop,
            "user" => &mut f.user,
            "response_format" => &mut f.response_format,
            "tools" => &mut f.tools,
            "stream" => &mut f.stream,
            "stream_options" => &mut f.stream_options,
            // The tables' fields last: the members above are the common ones.
            _ => {
                if let Some(i) = NUMBER_RANGES.iter().position(|(field, ..)| *field == name) {
                    f.numbers.get_mut(i)?
                } else if let Some(i) = INTEGER_MINIMUMS.iter().position(|(field, _)| *field == name) {
                    f.integers.get_mut(i)?
                } else {
                    return Some(());
                }
            }
        };
        *slot = Some(value);
        Some(())
    })?;
    walk.end()?;

    let model = plain_string(f.model?)?.to_string();
    match op {
        // Every `messages` member was checked as it passed; one must be there.
        Operation::Chat => f.messages.map(|_| ())?,
        Operation::Completions => is_string(f.prompt?).then_some(())?,
    }
    for ((_, lo, hi), raw) in NUMBER_RANGES.iter().zip(f.numbers) {
        number_in(raw, *lo, *hi)?;
    }
    for ((_, lo), raw) in INTEGER_MINIMUMS.iter().zip(f.integers) {
        integer_at_least(raw, *lo)?;
    }
    stop(f.stop)?;
    given(f.user).is_none_or(is_string).then_some(())?;
    response_format(f.response_format)?;
    tools(f.tools)?;
    let stream = optional_bool(f.stream)?;
    let include_usage = stream_options(f.stream_options)?;
    Some(Accepted {
        spans,
        model,
        stream,
        include_usage,
    })
}

/// Where `part`, a slice of `text`, lies in it.
fn span_in(text: &str, part: &str) -> Range<usize> {
    let start = (part.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
    start..start.saturating_add(part.len())
}

fn is_string(raw: &str) -> bool {
    raw.starts_with('"')
}

fn is_array(raw: &str) -> bool {
    raw.starts_with('[')
}

fn is_object(raw: &str) -> bool {
    raw.starts_with('{')
}

/// A string's text when it has no escapes (so the raw bytes are the text).
fn plain_string(raw: &str) -> Option<&str> {
    let inner = raw.strip_prefix('"')?.strip_suffix('"')?;
    (!inner.contains('\\')).then_some(inner)
}

/// `false` when absent or null, the literal otherwise; anything else is
/// the DOM's to refuse.
fn optional_bool(raw: Option<&str>) -> Option<bool> {
    match raw {
        None | Some("null" | "false") => Some(false),
        Some("true") => Some(true),
        Some(_) => None,
    }
}

/// A number in `lo..=hi`, decided on its decimal digits without parsing
/// a double: the DOM compares the nearest double, and rounding keeps a
/// number inside integer bounds inside, so this accepts only what the DOM
/// does (a number just outside that rounds onto a bound is the DOM's).
fn number_in(raw: Option<&str>, lo: i64, hi: i64) -> Option<()> {
    let Some(raw) = given(raw) else {
        return Some(());
    };
    let (negative, digits) = match raw.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, raw),
    };
    let (int, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    // The walk already held the number to JSON's grammar and refused
    // exponents; three integer digits are plenty for these bounds.
    if int.len() > 3 {
        return None;
    }
    let int: i64 = int.parse().ok()?;
    let fraction = fraction.bytes().any(|d| d != b'0');
    // |value| is `int` plus a fraction: at most `m` when...
    let at_most = |m: i64| int < m || (int == m && !fraction);
    let inside = if negative {
        at_most(lo.saturating_neg()) && int >= hi.saturating_neg()
    } else {
        int >= lo && at_most(hi)
    };
    inside.then_some(())
}

/// An integer (no point, no exponent) of at most 18 digits, at least `lo`;
/// longer ones are the DOM's to place (u64 or f64).
fn integer_at_least(raw: Option<&str>, lo: i64) -> Option<()> {
    let Some(raw) = given(raw) else {
        return Some(());
    };
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    // serde reads `-0` as the double -0.0, which the DOM calls no integer.
    if raw == "-0" || digits.is_empty() || digits.len() > 18 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let x: i64 = raw.parse().ok()?;
    (x >= lo).then_some(())
}

/// The value when given and not `null`.
fn given(raw: Option<&str>) -> Option<&str> {
    raw.filter(|r| *r != "null")
}

fn stop(raw: Option<&str>) -> Option<()> {
    match given(raw) {
        None => Some(()),
        Some(r) if is_string(r) => Some(()),
        Some(r) => each_element(r, &mut |item| is_string(item).then_some(())),
    }
}

fn response_format(raw: Option<&str>) -> Option<()> {
    let Some(raw) = given(raw) else {
        return Some(());
    };
    let mut kind = None;
    each_member(raw, &mut |name, value| {
        if name == "type" {
            kind = Some(value);
        }
    })?;
    kind.and_then(plain_string)
        .filter(|kind| RESPONSE_FORMATS.contains(kind))
        .map(|_| ())
}

fn tools(raw: Option<&str>) -> Option<()> {
    match given(raw) {
        None => Some(()),
        Some(r) => each_element(r, &mut |tool| is_object(tool).then_some(())),
    }
}

fn stream_options(raw: Option<&str>) -> Option<bool> {
    let Some(raw) = given(raw) else {
        return Some(false);
    };
    let (mut include_usage, mut others) = (None, false);
    each_member(raw, &mut |name, value| match name {
        "include_usage" => include_usage = Some(value),
        _ => others = true,
    })?;
    if others {
        return None;
    }
    optional_bool(include_usage)
}

/// `member(name, raw value)` for each member of the object `raw` (small
/// ones here, so walking them again costs little).
fn each_member<'a>(raw: &'a str, member: &mut dyn FnMut(&'a str, &'a str)) -> Option<()> {
    let mut walk = Walk::values(raw);
    walk.object(&mut |name, walk| {
        member(name, walk.value()?);
        Some(())
    })?;
    walk.end()
}

/// `element(raw value)` for each element of the array `raw`, stopping at
/// the first `None`.
fn each_element<'a>(raw: &'a str, element: &mut dyn FnMut(&'a str) -> Option<()>) -> Option<()> {
    let mut walk = Walk::values(raw);
    walk.array(&mut |walk| element(walk.value()?))?;
    walk.end()
}

/// A message's members the validator looks at (the last of each counts).
#[derive(Default)]
struct Message<'a> {
    role: Option<&'a str>,
    content: Option<&'a str>,
    tool_calls: Option<&'a str>,
    tool_call_id: Option<&'a str>,
}

/// The `messages` array, checked as the walk passes it; its raw text.
fn messages<'a>(walk: &mut Walk<'a>) -> Option<&'a str> {
    let mut count = 0usize;
    let raw = walk.array(&mut |walk| {
        count = count.saturating_add(1);
        one_message(walk)
    })?;
    (count > 0).then_some(raw)
}

fn one_message(walk: &mut Walk<'_>) -> Option<()> {
    let mut m = Message::default();
    walk.object(&mut |name, walk| {
        let value = match name {
            // Parts are checked as they pass: every `content` given must
            // pass, so the last one (the DOM's) does.
            "content" if walk.peek() == Some(b'[') => walk.array(&mut part)?,
            _ => walk.value()?,
        };
        match name {
            "role" => m.role = Some(value),
            "content" => m.content = Some(value),
            "tool_calls" => m.tool_calls = Some(value),
            "tool_call_id" => m.tool_call_id = Some(value),
            _ => {}
        }
        Some(())
    })?;
    let role = m.role.and_then(plain_string).filter(|r| ROLES.contains(r))?;
    let has_tool_calls = m.tool_calls.is_some_and(is_nonempty_array);
    match given(m.content) {
        None => (role == "assistant" && has_tool_calls).then_some(())?,
        // An array's parts were checked as they passed.
        Some(c) if is_string(c) || is_array(c) => {}
        Some(_) => return None,
    }
    if role == "tool" && !m.tool_call_id.is_some_and(is_string) {
        return None;
    }
    given(m.tool_calls).is_none_or(is_array).then_some(())
}

/// As the DOM's `Value::Array(calls) if !calls.is_empty()`.
fn is_nonempty_array(raw: &str) -> bool {
    raw.strip_prefix('[')
        .is_some_and(|rest| !rest.trim_start_matches([' ', '\n', '\t', '\r']).starts_with(']'))
}

/// One content part: a text part with a string, or an image part with an
/// object holding a string `url`.
fn part(walk: &mut Walk<'_>) -> Option<()> {
    let (mut kind, mut text, mut image) = (None, None, None);
    walk.object(&mut |name, walk| {
        let value = walk.value()?;
        match name {
            "type" => kind = Some(value),
            "text" => text = Some(value),
            "image_url" => image = Some(value),
            _ => {}
        }
        Some(())
    })?;
    match kind? {
        r#""text""# => text.is_some_and(is_string).then_some(()),
        r#""image_url""# => {
            let mut url = None;
            each_member(image?, &mut |name, value| {
                if name == "url" {
                    url = Some(value);
                }
            })?;
            url.is_some_and(is_string).then_some(())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::members::Members;
    use crate::request::parse_dom;

    /// Whenever the fast path accepts, the DOM validator accepts too and
    /// reads the same fields, and the spans are the body's members.
    fn agrees(op: Operation, text: &str) -> bool {
        let dom = parse_dom(op, text.as_bytes());
        let Some(fast) = check(op, text) else {
            return false;
        };
        let dom = dom.unwrap_or_else(|e| panic!("the fast path accepted what the DOM refuses ({e:?}): {text}"));
        assert_eq!(
            (&fast.model, fast.stream, fast.include_usage),
            (&dom.model, dom.stream, dom.include_usage),
            "{text}"
        );
        let spans: Vec<(&str, &str)> = fast
            .spans
            .iter()
            .map(|(n, v)| (&text[n.clone()], &text[v.clone()]))
            .collect();
        let members = Members::parse_str(text).unwrap();
        let members: Vec<(&str, &str)> = members.0.iter().map(|(n, v)| (n.as_ref(), v.get())).collect();
        assert_eq!(spans, members, "{text}");
        true
    }

    const MESSAGE: &str = r#"{"role":"user","content":"hi"}"#;

    fn chat_with(member: &str) -> String {
        format!(r#"{{"model":"a/b","messages":[{MESSAGE}],{member}}}"#)
    }

    #[test]
    fn usual_bodies_take_the_fast_path() {
        let bench = include_str!("../../benches/data/chat_1k.json");
        let tools = r#"{"model":"a/b","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"https://x/y.png","detail":"low"}}]},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"42"}],
            "tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{}}}}],"tool_choice":"auto"}"#;
        let sampled = r#"{"model":"a/b","messages":[{"role":"developer","content":"d"},{"role":"user","content":"x \u00e9 \ud83d\ude00"}],
            "temperature":2,"top_p":1.0,"presence_penalty":-2.0,"frequency_penalty":-0.0,"max_tokens":1,"max_completion_tokens":100000,
            "n":1,"seed":-9007199254740993,"stop":["\n","END"],"user":"u1","response_format":{"type":"json_schema","json_schema":{"name":"x"}},
            "stream":true,"stream_options":{"include_usage":true},"waygate":{"routing":{"prefer":["a"]}}}"#;
        for (op, body) in [
            (Operation::Chat, bench),
            (Operation::Chat, tools),
            (Operation::Chat, sampled),
            (
                Operation::Completions,
                r#"{"model":"a/b","prompt":"Say hi","max_tokens":5,"stream":false}"#,
            ),
        ] {
            assert!(agrees(op, body), "not taken: {body}");
        }
        let read = check(Operation::Chat, sampled).unwrap();
        assert_eq!(
            (read.model.as_str(), read.stream, read.include_usage),
            ("a/b", true, true)
        );
    }

    #[test]
    fn doubtful_values_go_to_the_dom() {
        for member in [
            // Valid, but the fast path cannot be sure cheaply.
            r#""temperature":1e0"#,
            r#""temperature":2.00000000000000000001"#,
            r#""max_tokens":18446744073709551615"#,
            r#""x":1E400"#,
            r#""x":"\ud800""#,
            r#""x":"\udc00\ud800""#,
            r#""x":"\ud800\u0041""#,
            r#""stream_options":{"include_usage":true,"other":1}"#,
            // Invalid: the DOM names the problem.
            r#""temperature":2.5"#,
            r#""temperature":-0.1"#,
            r#""top_p":"1""#,
            r#""max_tokens":0"#,
            r#""max_tokens":1.0"#,
            r#""n":-1"#,
            r#""stop":[1]"#,
            r#""stop":{}"#,
            r#""user":7"#,
            r#""response_format":{"type":"yaml"}"#,
            r#""response_format":{}"#,
            r#""tools":[1]"#,
            r#""tools":{}"#,
            r#""stream":"yes""#,
            r#""stream_options":[]"#,
            r#""stream_options":{"include_usage":1}"#,
        ] {
            assert!(!agrees(Operation::Chat, &chat_with(member)), "taken: {member}");
        }
        for body in [
            r#"{"model":"a/b","messages":[]}"#,
            r#"{"model":"a/\u0062","messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":null,"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"robot","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"assistant","content":null,"tool_calls":[]}]}"#,
            r#"{"model":"a/b","messages":[{"role":"tool","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"text"}]}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"audio"}]}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":"x","tool_calls":{}}]}"#,
            r#"{"model":"a/b","messages":[1]}"#,
            r#"{"model":"a/b","messages":{}}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":"x"}]} x"#,
        ] {
            assert!(!agrees(Operation::Chat, body), "taken: {body}");
        }
        assert!(!agrees(Operation::Completions, r#"{"model":"a/b","prompt":["x"]}"#));
    }

    #[test]
    fn repeated_names_count_as_the_dom_counts_them() {
        // The last of a repeated name is the DOM's; the fast path either
        // reads the same or leaves it to the DOM.
        for body in [
            r#"{"model":"x/y","model":"a/b","messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"robot","role":"user","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","role":"robot","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[],"messages":[{"role":"user","content":"x"}]}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":"x"}],"stream":true,"stream":false}"#,
            r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"bad"}],"content":"x"}]}"#,
        ] {
            agrees(Operation::Chat, body);
        }
        let read = check(
            Operation::Chat,
            r#"{"model":"x/y","model":"a/b","messages":[{"role":"user","content":"x"}]}"#,
        );
        assert_eq!(read.map(|r| r.model).as_deref(), Some("a/b"));
    }

    /// Every member the validator reads, given every kind of value: the
    /// fast path never accepts what the DOM refuses, nor reads otherwise.
    #[test]
    fn every_field_and_value_kind_agrees_with_the_dom() {
        let values = [
            "null",
            "true",
            "false",
            "0",
            "-0",
            "1",
            "2",
            "-2",
            "3",
            "0.5",
            "1.0",
            "2.0",
            "2.01",
            "-2.0",
            "-2.5",
            "1e1",
            "-1",
            "400",
            "-9223372036854775808",
            "18446744073709551616",
            r#""""#,
            r#""s""#,
            r#""text""#,
            "[]",
            r#"["a"]"#,
            "[1]",
            "[{}]",
            "{}",
            r#"{"type":"text"}"#,
            r#"{"type":"json_object"}"#,
            r#"{"include_usage":true}"#,
            r#"{"include_usage":null}"#,
            MESSAGE,
        ];
        let fields = [
            "model",
            "messages",
            "prompt",
            "temperature",
            "top_p",
            "presence_penalty",
            "frequency_penalty",
            "max_tokens",
            "max_completion_tokens",
            "n",
            "seed",
            "stop",
            "user",
            "response_format",
            "tools",
            "stream",
            "stream_options",
        ];
        let mut taken = 0;
        for field in fields {
            for value in values {
                let body = chat_with(&format!(r#""{field}":{value}"#));
                taken += usize::from(agrees(Operation::Chat, &body));
                let body = format!(r#"{{"model":"a/b","prompt":"p","{field}":{value}}}"#);
                taken += usize::from(agrees(Operation::Completions, &body));
            }
        }
        // Messages and parts, member by member.
        let message_members = ["role", "content", "tool_calls", "tool_call_id", "name"];
        for member in message_members {
            for value in values
                .iter()
                .chain(&[r#""assistant""#, r#""tool""#, r#"[{"type":"text","text":"t"}]"#])
            {
                for role in ["user", "assistant", "tool"] {
                    let body = format!(
                        r#"{{"model":"a/b","messages":[{{"role":"{role}","content":"c","{member}":{value}}}]}}"#
                    );
                    taken += usize::from(agrees(Operation::Chat, &body));
                }
            }
        }
        for part in values.iter().map(|v| format!(r#"{{"type":"text","text":{v}}}"#)).chain(
            values
                .iter()
                .map(|v| format!(r#"{{"type":"image_url","image_url":{{"url":{v}}}}}"#)),
        ) {
            let body = format!(r#"{{"model":"a/b","messages":[{{"role":"user","content":[{part}]}}]}}"#);
            taken += usize::from(agrees(Operation::Chat, &body));
        }
        assert!(taken > 200, "the fast path took only {taken}");
    }

    /// Every cut of a body, and every byte of it changed to each byte that
    /// matters to JSON: accepted only as the DOM accepts.
    #[test]
    fn every_cut_and_changed_byte_agrees_with_the_dom() {
        let body = r#"{"model":"a/b","messages":[{"role":"user","content":[{"type":"text","text":"h\"i"}]},{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}],"temperature":0.5,"max_tokens":9,"stream":true,"stream_options":{"include_usage":false}}"#;
        assert!(agrees(Operation::Chat, body));
        for end in 0..body.len() {
            agrees(Operation::Chat, &body[..end]);
            for b in [
                b'"', b'\\', b',', b':', b'{', b'}', b'[', b']', b'0', b'9', b'-', b'.', b'e', b' ', b'n', b'x',
            ] {
                let mut bytes = body.as_bytes().to_vec();
                bytes[end] = b;
                if let Ok(text) = std::str::from_utf8(&bytes) {
                    agrees(Operation::Chat, text);
                }
            }
        }
    }
}
