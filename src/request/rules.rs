//! The request rules (docs/contract.md §2), each written once over a
//! [`View`], so the client's text and serde's DOM are checked by the same
//! code: every documented field for type and range, in a fixed order, the
//! first problem named by its path (`messages.1.role`).

use std::borrow::Cow;

use super::view::{Kind, Unsure, View};
use super::{Operation, bad_value, missing, wrong_type};
use crate::errors::ApiError;

/// Why the rules did not accept a body.
#[derive(Debug)]
pub(super) enum Refused {
    /// The contract's 400 answer.
    Invalid(ApiError),
    /// The raw form could not read part of the body exactly: the DOM's to
    /// check.
    Unsure,
}

impl From<ApiError> for Refused {
    fn from(e: ApiError) -> Self {
        Refused::Invalid(e)
    }
}

impl From<Unsure> for Refused {
    fn from(_: Unsure) -> Self {
        Refused::Unsure
    }
}

/// What the rules read from an accepted body.
pub(super) struct Read {
    pub model: String,
    pub stream: bool,
    pub include_usage: bool,
}

/// The numbers a request may carry and their ranges (OpenAI's API reference).
const NUMBER_RANGES: [(&str, f64, f64); 4] = [
    ("temperature", 0.0, 2.0),
    ("top_p", 0.0, 1.0),
    ("presence_penalty", -2.0, 2.0),
    ("frequency_penalty", -2.0, 2.0),
];

/// The integers a request may carry and their least values.
const INTEGER_MINIMUMS: [(&str, i64); 4] = [
    ("max_tokens", 1),
    ("max_completion_tokens", 1),
    ("n", 1),
    ("seed", i64::MIN),
];

/// `response_format.type`'s values.
const RESPONSE_FORMATS: [&str; 3] = ["text", "json_object", "json_schema"];

const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The top-level members the rules read. Filled member by member; the last
/// of a repeated name counts, as in serde's DOM.
#[derive(Default)]
pub(super) struct Top<'a> {
    model: Option<View<'a>>,
    messages: Option<Messages<'a>>,
    prompt: Option<View<'a>>,
    /// By [`NUMBER_RANGES`]' order.
    numbers: [Option<View<'a>>; NUMBER_RANGES.len()],
    /// By [`INTEGER_MINIMUMS`]' order.
    integers: [Option<View<'a>>; INTEGER_MINIMUMS.len()],
    stop: Option<View<'a>>,
    user: Option<View<'a>>,
    response_format: Option<View<'a>>,
    tools: Option<View<'a>>,
    stream: Option<View<'a>>,
    stream_options: Option<View<'a>>,
}

impl<'a> Top<'a> {
    /// Keeps `value` if the rules read a member called `name`.
    pub fn member(&mut self, name: &str, value: View<'a>) {
        let slot = match name {
            "model" => &mut self.model,
            "messages" => {
                self.messages = Some(Messages::Whole(value));
                return;
            }
            "prompt" => &mut self.prompt,
            "stop" => &mut self.stop,
            "user" => &mut self.user,
            "response_format" => &mut self.response_format,
            "tools" => &mut self.tools,
            "stream" => &mut self.stream,
            "stream_options" => &mut self.stream_options,
            // The tables' fields last: the members above are the common ones.
            _ => {
                let slot = match NUMBER_RANGES.iter().position(|(field, ..)| *field == name) {
                    Some(i) => self.numbers.get_mut(i),
                    None => (INTEGER_MINIMUMS.iter().position(|(field, _)| *field == name))
                        .and_then(|i| self.integers.get_mut(i)),
                };
                let Some(slot) = slot else {
                    return;
                };
                slot
            }
        };
        *slot = Some(value);
    }

    /// Keeps a `messages` member the raw walk split as it passed.
    pub fn split_messages(&mut self, messages: Vec<Message<'a>>) {
        self.messages = Some(Messages::Split(messages));
    }
}

/// The `messages` member: as a value, or, from the raw walk, already split
/// into messages (an array of objects), so the text is walked once.
enum Messages<'a> {
    Whole(View<'a>),
    Split(Vec<Message<'a>>),
}

/// A message's members the rules read; the last of each counts.
#[derive(Default)]
pub(super) struct Message<'a> {
    role: Option<View<'a>>,
    content: Option<View<'a>>,
    tool_calls: Option<View<'a>>,
    tool_call_id: Option<View<'a>>,
}

impl<'a> Message<'a> {
    /// Keeps `value` if the rules read a member called `name`.
    pub fn member(&mut self, name: &str, value: View<'a>) {
        match name {
            "role" => self.role = Some(value),
            "content" => self.content = Some(value),
            "tool_calls" => self.tool_calls = Some(value),
            "tool_call_id" => self.tool_call_id = Some(value),
            _ => {}
        }
    }
}

/// Checks a body's members, as [`Top`] kept them, for `op`.
pub(super) fn check(op: Operation, top: Top<'_>) -> Result<Read, Refused> {
    let model = match given(top.model) {
        None => return Err(missing("model").into()),
        Some(m) if m.kind() == Kind::String => m.text()?.into_owned(),
        Some(_) => return Err(wrong_type("model", "a string").into()),
    };
    match op {
        Operation::Chat => messages(top.messages)?,
        Operation::Completions => prompt(given(top.prompt))?,
    }
    for ((field, lo, hi), value) in NUMBER_RANGES.iter().zip(top.numbers) {
        number_in(value, field, *lo, *hi)?;
    }
    for ((field, lo), value) in INTEGER_MINIMUMS.iter().zip(top.integers) {
        integer_at_least(value, field, *lo)?;
    }
    if let Some(stop) = given(top.stop) {
        match stop.kind() {
            Kind::String => {}
            Kind::Array => elements_are(stop, Kind::String, "stop", "a string")?,
            _ => return Err(wrong_type("stop", "a string or an array of strings").into()),
        }
    }
    if given(top.user).is_some_and(|user| user.kind() != Kind::String) {
        return Err(wrong_type("user", "a string").into());
    }
    response_format(given(top.response_format))?;
    if let Some(tools) = given(top.tools) {
        if tools.kind() != Kind::Array {
            return Err(wrong_type("tools", "an array").into());
        }
        elements_are(tools, Kind::Object, "tools", "an object")?;
    }
    let stream = match given(top.stream).map(View::kind) {
        None => false,
        Some(Kind::Bool(b)) => b,
        Some(_) => return Err(wrong_type("stream", "a boolean").into()),
    };
    let include_usage = stream_options(given(top.stream_options))?;
    Ok(Read {
        model,
        stream,
        include_usage,
    })
}

/// Every element of `array` is of `kind`; the first that is not is named
/// (`stop.1` must be `expected`).
fn elements_are(array: View<'_>, kind: Kind, name: &str, expected: &str) -> Result<(), Refused> {
    array.elements(&mut |i, item| -> Result<(), Refused> {
        if item.kind() == kind {
            return Ok(());
        }
        Err(wrong_type(&format!("{name}.{i}"), expected).into())
    })?;
    Ok(())
}

/// The value when given and not `null`.
fn given<'a>(value: Option<View<'a>>) -> Option<View<'a>> {
    value.filter(|v| v.kind() != Kind::Null)
}

fn is_string(value: Option<View<'_>>) -> bool {
    value.is_some_and(|v| v.kind() == Kind::String)
}

/// A string's text, `None` for any other value.
fn text<'a>(value: Option<View<'a>>) -> Result<Option<Cow<'a, str>>, Unsure> {
    match value {
        Some(v) if v.kind() == Kind::String => v.text().map(Some),
        _ => Ok(None),
    }
}

fn prompt(prompt: Option<View<'_>>) -> Result<(), Refused> {
    let Some(prompt) = prompt else {
        return Err(missing("prompt").into());
    };
    match prompt.kind() {
        Kind::String => Ok(()),
        // OpenAI also takes a list of prompts, and clients send one in a list
        // (LangChain's `OpenAI.invoke`); the gateway answers one prompt a request.
        Kind::Array => {
            let mut first_is_string = false;
            let count = prompt.elements(&mut |i, item| -> Result<(), Refused> {
                first_is_string |= i == 0 && item.kind() == Kind::String;
                Ok(())
            })?;
            match (count, first_is_string) {
                (1, true) => Ok(()),
                (1, false) => Err(wrong_type("prompt.0", "a string").into()),
                _ => Err(bad_value(
                    "prompt",
                    "must hold exactly one prompt: the gateway answers one prompt a request",
                )
                .into()),
            }
        }
        _ => Err(wrong_type("prompt", "a string or an array of one string").into()),
    }
}

fn number_in(value: Option<View<'_>>, field: &str, lo: f64, hi: f64) -> Result<(), Refused> {
    let Some(value) = given(value) else {
        return Ok(());
    };
    if value.kind() != Kind::Number {
        return Err(wrong_type(field, "a number").into());
    }
    match value.number()?.as_f64() {
        Some(x) if (lo..=hi).contains(&x) => Ok(()),
        _ => Err(bad_value(field, &format!("must be between {lo} and {hi}")).into()),
    }
}

fn integer_at_least(value: Option<View<'_>>, field: &str, lo: i64) -> Result<(), Refused> {
    let Some(value) = given(value) else {
        return Ok(());
    };
    if value.kind() != Kind::Number {
        return Err(wrong_type(field, "an integer").into());
    }
    let n = value.number()?;
    match (n.as_i64(), n.as_u64()) {
        (Some(x), _) if x >= lo => Ok(()),
        (None, Some(_)) => Ok(()),
        (Some(_), _) => Err(bad_value(field, &format!("must be at least {lo}")).into()),
        (None, None) => Err(wrong_type(field, "an integer").into()),
    }
}

fn response_format(format: Option<View<'_>>) -> Result<(), Refused> {
    let Some(format) = format else {
        return Ok(());
    };
    if format.kind() != Kind::Object {
        return Err(wrong_type("response_format", "an object").into());
    }
    let mut kind = None;
    format.members(&mut |name, value| {
        if name == "type" {
            kind = Some(value);
        }
    })?;
    match (kind, text(kind)?) {
        (_, Some(t)) if RESPONSE_FORMATS.contains(&&*t) => Ok(()),
        (_, Some(_)) => Err(bad_value("response_format.type", "must be 'text', 'json_object' or 'json_schema'").into()),
        (None, _) => Err(missing("response_format.type").into()),
        (Some(_), None) => Err(wrong_type("response_format.type", "a string").into()),
    }
}

fn stream_options(options: Option<View<'_>>) -> Result<bool, Refused> {
    let Some(options) = options else {
        return Ok(false);
    };
    if options.kind() != Kind::Object {
        return Err(wrong_type("stream_options", "an object").into());
    }
    // The least unknown name is the one named, whichever order the members
    // came in (the DOM keeps them sorted).
    let (mut include_usage, mut unknown) = (None, None::<String>);
    options.members(&mut |name, value| match name {
        "include_usage" => include_usage = Some(value),
        _ if unknown.as_deref().is_none_or(|least| name < least) => unknown = Some(name.to_owned()),
        _ => {}
    })?;
    if let Some(key) = unknown {
        return Err(ApiError::bad_request(
            "unsupported_parameter",
            format!("stream_options.{key}"),
            format!("Unknown stream option '{key}'."),
        )
        .into());
    }
    match given(include_usage).map(View::kind) {
        None => Ok(false),
        Some(Kind::Bool(b)) => Ok(b),
        Some(_) => Err(wrong_type("stream_options.include_usage", "a boolean").into()),
    }
}

fn messages(messages: Option<Messages<'_>>) -> Result<(), Refused> {
    let count = match messages {
        Some(Messages::Split(list)) => {
            let count = list.len();
            for (i, m) in list.into_iter().enumerate() {
                message(i, m)?;
            }
            count
        }
        Some(Messages::Whole(list)) => match list.kind() {
            Kind::Null => return Err(missing("messages").into()),
            Kind::Array => list.elements(&mut |i, value| {
                if value.kind() != Kind::Object {
                    return Err(wrong_type(&format!("messages.{i}"), "an object").into());
                }
                let mut m = Message::default();
                value.members(&mut |name, value| m.member(name, value))?;
                message(i, m)
            })?,
            _ => return Err(wrong_type("messages", "an array").into()),
        },
        None => return Err(missing("messages").into()),
    };
    if count == 0 {
        return Err(bad_value("messages", "must contain at least one message").into());
    }
    Ok(())
}

fn message(i: usize, m: Message<'_>) -> Result<(), Refused> {
    // Named only when something is wrong: formatting every path would cost
    // more than checking the message.
    let at = || format!("messages.{i}");
    let Message {
        role,
        content,
        tool_calls,
        tool_call_id,
    } = m;
    let role = match (given(role), text(role)?) {
        (None, _) => return Err(missing(&format!("{}.role", at())).into()),
        (_, Some(role)) if ROLES.contains(&&*role) => role,
        (_, Some(_)) => {
            return Err(bad_value(
                &format!("{}.role", at()),
                "must be one of 'system', 'developer', 'user', 'assistant', 'tool'",
            )
            .into());
        }
        (_, None) => return Err(wrong_type(&format!("{}.role", at()), "a string").into()),
    };
    let has_tool_calls = match tool_calls {
        Some(calls) if calls.kind() == Kind::Array => calls.elements(&mut |_, _| Ok::<_, Refused>(()))? > 0,
        _ => false,
    };
    match given(content) {
        None if role == "assistant" && has_tool_calls => {}
        None => return Err(missing(&format!("{}.content", at())).into()),
        Some(c) => match c.kind() {
            Kind::String => {}
            Kind::Array => {
                c.elements(&mut |j, p| part(&at, j, p))?;
            }
            _ => {
                return Err(wrong_type(&format!("{}.content", at()), "a string or an array of content parts").into());
            }
        },
    }
    if role == "tool" && !is_string(tool_call_id) {
        return Err(missing(&format!("{}.tool_call_id", at())).into());
    }
    if given(tool_calls).is_some_and(|calls| calls.kind() != Kind::Array) {
        return Err(wrong_type(&format!("{}.tool_calls", at()), "an array").into());
    }
    Ok(())
}

/// One content part: a text part with a string, or an image part with an
/// object holding a string `url`.
fn part(message: &dyn Fn() -> String, j: usize, part: View<'_>) -> Result<(), Refused> {
    let at = || format!("{}.content.{j}", message());
    if part.kind() != Kind::Object {
        return Err(wrong_type(&at(), "an object").into());
    }
    let (mut kind, mut text_value, mut image) = (None, None, None);
    part.members(&mut |name, value| match name {
        "type" => kind = Some(value),
        "text" => text_value = Some(value),
        "image_url" => image = Some(value),
        _ => {}
    })?;
    match text(kind)?.as_deref() {
        Some("text") if is_string(text_value) => Ok(()),
        Some("text") => Err(wrong_type(&format!("{}.text", at()), "a string").into()),
        Some("image_url") => match image {
            None => Err(missing(&format!("{}.image_url", at())).into()),
            Some(image) if image.kind() == Kind::Object => {
                let mut url = None;
                image.members(&mut |name, value| {
                    if name == "url" {
                        url = Some(value);
                    }
                })?;
                if is_string(url) {
                    return Ok(());
                }
                Err(missing(&format!("{}.image_url.url", at())).into())
            }
            Some(_) => Err(wrong_type(&format!("{}.image_url", at()), "an object").into()),
        },
        Some(_) => Err(bad_value(&format!("{}.type", at()), "must be 'text' or 'image_url'").into()),
        None => Err(missing(&format!("{}.type", at())).into()),
    }
}
