//! Anthropic's Messages API (`POST {path_prefix}/messages`), both ways.
//!
//! Request: `system` / `developer` messages become the top-level `system`
//! blocks; user and assistant turns alternate (consecutive same-role turns
//! are merged, `tool` messages become `tool_result` blocks of a user turn);
//! `max_tokens` is always sent, since the API requires it. What the API cannot
//! express is refused when it would change the answer's shape (`n > 1`,
//! `logprobs`) and dropped otherwise (`seed`, penalties), per contract §6.
//!
//! JSON modes are emulated: `json_object` adds an instruction to the system
//! prompt and checks the answer is a JSON object (a 502 otherwise, never a
//! silently wrong answer); `json_schema` forces a tool whose input schema is
//! the client's schema and returns the tool's input as the answer text.
//!
//! Answers and streams come back as OpenAI chat shapes; see [`AnthropicStream`]
//! for the event mapping.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};

use super::chat::{self, ImageSource, Message, Part, ResponseFormat, ToolChoice};
use super::openai::interrupted;
use super::{ErrorDetails, StreamItem, StreamTranslator, UpstreamRequest};
use crate::config::Provider;
use crate::errors::{ApiError, ErrorType};
use crate::json::{json_str, present};
use crate::request::{ParsedRequest, bad_value};
use crate::sse::SseEvent;
use crate::usage::Usage;

/// The API version this module speaks.
pub const VERSION: &str = "2023-06-01";

/// The instruction that emulates `response_format: json_object`.
const JSON_INSTRUCTION: &str = "Respond with a single valid JSON object and nothing else: \
no Markdown code fences, no text before or after it.";

/// The tool that carries a `json_schema` answer: forcing a tool whose input
/// schema is the client's schema is how Anthropic's API constrains output.
const SCHEMA_TOOL: &str = "json_response";

/// Image types the Messages API accepts.
const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// How the answer is read back, decided by the request alone (so that
/// [`build_request`], [`translate_answer`] and the stream agree).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    /// `json_object`, emulated: the answer text must be a JSON object.
    Json,
    /// `json_schema`: the forced [`SCHEMA_TOOL`]'s input is the answer.
    SchemaTool,
}

fn mode(body: &Map<String, Value>) -> Result<Mode, ApiError> {
    match chat::response_format(body) {
        ResponseFormat::Text => Ok(Mode::Plain),
        ResponseFormat::JsonObject | ResponseFormat::JsonSchema(None) => Ok(Mode::Json),
        ResponseFormat::JsonSchema(Some(schema)) => {
            // The forced tool would take the place of the client's own tools,
            // and a tool's input is always an object.
            let has_tools = body
                .get("tools")
                .and_then(Value::as_array)
                .is_some_and(|t| !t.is_empty());
            if has_tools || schema.get("type").and_then(Value::as_str) != Some("object") {
                return Err(chat::unsupported("response_format"));
            }
            Ok(Mode::SchemaTool)
        }
    }
}

mod native;
pub use native::{CLIENT_HEADERS, Endpoint, count_answer, native_answer, native_request, stream_usage};

// ---- request ------------------------------------------------------------------

pub fn build_request(
    provider: &Provider,
    request: &ParsedRequest,
    upstream_model: &str,
    routing_field: &str,
) -> Result<UpstreamRequest, ApiError> {
    chat::check_common(request, &provider.id, routing_field)?;
    let body = request.body()?;
    if chat::n(body) > 1 {
        return Err(chat::unsupported("n"));
    }
    for field in ["seed", "presence_penalty", "frequency_penalty"] {
        if chat::is_set(body.get(field)) {
            log::info!("provider {} cannot express {field}; dropped", provider.id);
        }
    }
    let mode = mode(body)?;
    let messages = chat::messages(request)?;
    let (mut system, turns) = conversation(&messages)?;
    if mode == Mode::Json {
        system.push(json!({"type": "text", "text": JSON_INSTRUCTION}));
    }

    let mut out = Map::new();
    out.insert("model".into(), upstream_model.into());
    let max_tokens = chat::max_tokens(body).unwrap_or(provider.default_max_tokens);
    out.insert("max_tokens".into(), max_tokens.into());
    out.insert("messages".into(), Value::Array(turns));
    if !system.is_empty() {
        out.insert("system".into(), Value::Array(system));
    }
    if let Some(t) = chat::number(body, "temperature") {
        // OpenAI's range is 0..2, Anthropic's 0..1: the top of the range is
        // the closest it can do.
        if t > 1.0 {
            log::info!("provider {} takes temperature up to 1; {t} sent as 1", provider.id);
        }
        out.insert("temperature".into(), json!(t.min(1.0)));
    }
    if let Some(p) = chat::number(body, "top_p") {
        out.insert("top_p".into(), json!(p));
    }
    let stop = chat::stop(body);
    if !stop.is_empty() {
        out.insert("stop_sequences".into(), json!(stop));
    }
    if let Some(user) = body.get("user").and_then(Value::as_str) {
        out.insert("metadata".into(), json!({"user_id": user}));
    }
    if mode == Mode::SchemaTool {
        let schema = body
            .get("response_format")
            .and_then(|f| f.pointer("/json_schema/schema"))
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        out.insert(
            "tools".into(),
            json!([{"name": SCHEMA_TOOL, "description": "Give the answer as this tool's input.", "input_schema": schema}]),
        );
        out.insert("tool_choice".into(), json!({"type": "tool", "name": SCHEMA_TOOL}));
    } else {
        insert_tools(body, &mut out)?;
    }
    if request.stream {
        out.insert("stream".into(), true.into());
    }

    let bytes = serde_json::to_vec(&Value::Object(out)).map_err(|_| encode_failed())?;
    let credential = provider.credential_text();
    Ok(UpstreamRequest {
        path: format!("{}/messages", provider.path_prefix),
        headers: vec![
            ("x-api-key".into(), credential.to_string()),
            ("anthropic-version".into(), VERSION.into()),
        ],
        body: bytes,
    })
}

fn encode_failed() -> ApiError {
    ApiError::new(
        500,
        ErrorType::Upstream,
        "internal_error",
        "The request could not be encoded.",
    )
}

/// `system` blocks and the alternating turns.
fn conversation(messages: &[Message<'_>]) -> Result<(Vec<Value>, Vec<Value>), ApiError> {
    let mut system = Vec::new();
    let mut turns: Vec<(&str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, blocks) = match message {
            Message::System(text) => {
                if !text.trim().is_empty() {
                    system.push(json!({"type": "text", "text": text}));
                }
                continue;
            }
            Message::User(parts) => {
                let mut blocks = Vec::with_capacity(parts.len());
                for part in parts {
                    if let Some(block) = user_block(part)? {
                        blocks.push(block);
                    }
                }
                ("user", blocks)
            }
            Message::Assistant { text, calls } => {
                let mut blocks = Vec::with_capacity(calls.len() + 1);
                blocks.extend(text_block(text));
                for call in calls {
                    blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}));
                }
                ("assistant", blocks)
            }
            Message::Tool { call_id, content, .. } => {
                let mut result = json!({"type": "tool_result", "tool_use_id": call_id});
                if let (Some(block), Some(map)) = (text_block(content), result.as_object_mut()) {
                    map.insert("content".into(), json!([block]));
                }
                ("user", vec![result])
            }
        };
        // The API refuses empty turns; a message with nothing to say adds nothing.
        if blocks.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, merged)) if *last == role => merged.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    for (role, blocks) in &mut turns {
        let is_result = |b: &Value| b.get("type").and_then(Value::as_str) == Some("tool_result");
        // The API wants a user turn's tool results before anything else
        // (moved only when one follows other content, the rare case).
        if *role == "user" && blocks.iter().skip_while(|b| is_result(b)).any(is_result) {
            let (mut results, others): (Vec<Value>, Vec<Value>) =
                std::mem::take(blocks).into_iter().partition(is_result);
            results.extend(others);
            *blocks = results;
        }
    }
    // A final assistant turn is a prefill, and the API refuses one that ends
    // in whitespace.
    if let Some(("assistant", blocks)) = turns.last_mut()
        && let Some(Value::Object(last)) = blocks.last_mut()
        && let Some(Value::String(text)) = last.get_mut("text")
    {
        let trimmed = text.trim_end().len();
        text.truncate(trimmed);
    }
    let turns = turns
        .into_iter()
        .map(|(role, blocks)| json!({"role": role, "content": blocks}))
        .collect();
    Ok((system, turns))
}

/// A text block, unless the text is blank (the API refuses blank blocks).
fn text_block(text: &str) -> Option<Value> {
    (!text.trim().is_empty()).then(|| json!({"type": "text", "text": text}))
}

fn user_block(part: &Part<'_>) -> Result<Option<Value>, ApiError> {
    match part {
        Part::Text(text) => Ok(text_block(text)),
        Part::Image {
            source: ImageSource::Inline { media_type, data },
            param,
        } => {
            if !IMAGE_TYPES.contains(media_type) {
                return Err(bad_value(
                    param,
                    "must be a JPEG, PNG, GIF or WebP image for this provider",
                ));
            }
            Ok(Some(
                json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}),
            ))
        }
        Part::Image {
            source: ImageSource::Url(url),
            ..
        } => Ok(Some(json!({"type": "image", "source": {"type": "url", "url": url}}))),
    }
}

fn insert_tools(body: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let tools = chat::tools(body)?;
    let choice = chat::tool_choice(body)?;
    if tools.is_empty() {
        return Ok(());
    }
    let declared: Vec<Value> = tools
        .iter()
        .map(|f| {
            let mut schema = f
                .parameters
                .cloned()
                .unwrap_or_else(|| json!({"type": "object", "properties": {}}));
            // OpenAI takes a schema without `type`; Anthropic wants it spelled out.
            if let Some(map) = schema.as_object_mut() {
                map.entry("type").or_insert_with(|| "object".into());
            }
            let mut tool = json!({"name": f.name, "input_schema": schema});
            if let (Some(d), Some(map)) = (f.description, tool.as_object_mut()) {
                map.insert("description".into(), d.into());
            }
            tool
        })
        .collect();
    out.insert("tools".into(), Value::Array(declared));
    let mut choice = match choice {
        None => None,
        Some(ToolChoice::Auto) => Some(json!({"type": "auto"})),
        Some(ToolChoice::None) => Some(json!({"type": "none"})),
        Some(ToolChoice::Required) => Some(json!({"type": "any"})),
        Some(ToolChoice::Named(name)) => Some(json!({"type": "tool", "name": name})),
    };
    if let Some(parallel) = body.get("parallel_tool_calls").and_then(Value::as_bool)
        && choice
            .as_ref()
            .is_none_or(|c| c.get("type").and_then(Value::as_str) != Some("none"))
    {
        let c = choice.get_or_insert_with(|| json!({"type": "auto"}));
        if let Some(map) = c.as_object_mut() {
            map.insert("disable_parallel_tool_use".into(), (!parallel).into());
        }
    }
    if let Some(choice) = choice {
        out.insert("tool_choice".into(), choice);
    }
    Ok(())
}

// ---- wire types -----------------------------------------------------------------

/// A `message` answer.
#[derive(Debug, Deserialize)]
struct WireMessage {
    #[serde(rename = "type")]
    kind: String,
    content: Vec<Block>,
    stop_reason: Option<String>,
    usage: Option<WireUsage>,
}

/// A content block; kinds the gateway does not translate (thinking, server
/// tools) are read as `Other` and left out.
#[derive(Debug)]
enum Block {
    Text {
        text: String,
    },
    ToolUse {
        id: String,
        name: String,
        /// `null` when the block has none.
        input: Value,
    },
    Other,
}

/// A block's members, raw until its `type` says which to read: serde's
/// internally tagged enum would first copy the whole block into a buffer
/// of its own (a stream's `content_block_start` cost twice as much).
#[derive(Deserialize)]
struct RawBlock<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    name: Option<&'a RawValue>,
    #[serde(borrow)]
    input: Option<&'a RawValue>,
}

impl<'de> Deserialize<'de> for Block {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = RawBlock::deserialize(d)?;
        let required = |member: Option<&RawValue>, name: &'static str| {
            let member = member.ok_or_else(|| D::Error::missing_field(name))?;
            serde_json::from_str::<String>(member.get()).map_err(D::Error::custom)
        };
        Ok(match raw.kind.as_ref() {
            "text" => Block::Text {
                text: required(raw.text, "text")?,
            },
            "tool_use" => Block::ToolUse {
                id: required(raw.id, "id")?,
                name: required(raw.name, "name")?,
                input: match raw.input {
                    Some(input) => serde_json::from_str(input.get()).map_err(D::Error::custom)?,
                    None => Value::Null,
                },
            },
            _ => Block::Other,
        })
    }
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
struct WireUsage {
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    cache_creation_input_tokens: Option<u64>,
    cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Every input token counts as prompt: cached or not, the model read it.
    fn prompt(&self) -> Option<u64> {
        let parts = [
            self.input_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ];
        parts
            .iter()
            .any(Option::is_some)
            .then(|| parts.iter().flatten().fold(0u64, |a, b| a.saturating_add(*b)))
    }
}

/// One stream event (the `type` inside `data`, which repeats the `event:` name).
#[derive(Debug)]
enum Event<'a> {
    MessageStart {
        message: StartMessage,
    },
    ContentBlockStart {
        index: u64,
        content_block: Block,
    },
    ContentBlockDelta {
        index: u64,
        delta: Delta<'a>,
    },
    MessageDelta {
        delta: MessageDeltaBody,
        usage: Option<WireUsage>,
    },
    MessageStop,
    Error {
        error: Value,
    },
    /// `ping`, `content_block_stop` and event types added later.
    Other,
}

/// An event's members, read in one pass with the values left raw until its
/// `type` says which to read. (A serde internally tagged enum would first
/// copy the whole event into a buffer of its own, twice for a delta: that
/// was most of the cost of an Anthropic stream.) Unknown members are
/// ignored; a member the event's type needs must be present and well typed.
#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    index: Option<&'a RawValue>,
    #[serde(borrow)]
    delta: Option<&'a RawValue>,
    #[serde(borrow)]
    content_block: Option<&'a RawValue>,
    #[serde(borrow)]
    message: Option<&'a RawValue>,
    #[serde(borrow)]
    usage: Option<&'a RawValue>,
    /// `null` is an error without details, as absent is not.
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<&'a RawValue>,
}

/// A required member, read as `T`; `None` when absent, `null` or mistyped.
fn member<'a, T: Deserialize<'a>>(raw: Option<&'a RawValue>) -> Option<T> {
    serde_json::from_str(raw?.get()).ok()
}

impl<'a> Event<'a> {
    /// `None` when `data` is not an event this stream can read.
    fn parse(data: &'a str) -> Option<Event<'a>> {
        let raw: RawEvent<'a> = serde_json::from_str(data).ok()?;
        Some(match raw.kind.as_ref() {
            "message_start" => Event::MessageStart {
                message: member(raw.message)?,
            },
            "content_block_start" => Event::ContentBlockStart {
                index: member(raw.index)?,
                content_block: member(raw.content_block)?,
            },
            "content_block_delta" => Event::ContentBlockDelta {
                index: member(raw.index)?,
                delta: Delta::parse(raw.delta?.get())?,
            },
            "message_delta" => Event::MessageDelta {
                delta: member(raw.delta)?,
                // Absent and `null` both mean no usage; anything else must read.
                usage: match raw.usage {
                    Some(usage) => serde_json::from_str(usage.get()).ok()?,
                    None => None,
                },
            },
            "message_stop" => Event::MessageStop,
            "error" => Event::Error {
                error: member(raw.error)?,
            },
            _ => Event::Other,
        })
    }
}

#[derive(Debug, Deserialize)]
struct StartMessage {
    usage: Option<WireUsage>,
}

#[derive(Debug)]
enum Delta<'a> {
    Text(Cow<'a, str>),
    InputJson(Cow<'a, str>),
    /// `thinking_delta`, `signature_delta`, `citations_delta`, ...
    Other,
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    text: Option<&'a RawValue>,
    #[serde(borrow)]
    partial_json: Option<&'a RawValue>,
}

impl<'a> Delta<'a> {
    fn parse(raw: &'a str) -> Option<Delta<'a>> {
        let delta: RawDelta<'a> = serde_json::from_str(raw).ok()?;
        Some(match delta.kind.as_ref() {
            "text_delta" => Delta::Text(json_str(delta.text?)?),
            "input_json_delta" => Delta::InputJson(json_str(delta.partial_json?)?),
            _ => Delta::Other,
        })
    }
}

#[derive(Debug, Deserialize)]
struct MessageDeltaBody {
    stop_reason: Option<String>,
}

/// Contract §6 mapping. `refusal` is Anthropic's safety stop.
fn finish_reason(stop_reason: Option<&str>) -> &'static str {
    match stop_reason {
        Some("max_tokens" | "model_context_window_exceeded") => "length",
        Some("tool_use") => "tool_calls",
        Some("refusal") => "content_filter",
        _ => "stop",
    }
}

// ---- answers --------------------------------------------------------------------

/// Translates a `message` into a `chat.completion`.
pub fn translate_answer(request: &ParsedRequest, body: &[u8]) -> Result<(Value, Usage), String> {
    let message: WireMessage =
        crate::json::from_bytes(body).map_err(|e| format!("body is not an Anthropic message: {e}"))?;
    if message.kind != "message" {
        return Err(format!("answer has type '{}', not 'message'", message.kind));
    }
    let body = request.body().map_err(|e| e.message)?;
    let mode = mode(body).unwrap_or(Mode::Plain);
    let mut text: Option<String> = None;
    let mut calls = Vec::new();
    let mut schema_answer = None;
    for block in message.content {
        match block {
            Block::Text { text: t } => text.get_or_insert_with(String::new).push_str(&t),
            Block::ToolUse { id, name, input } => {
                if mode == Mode::SchemaTool && name == SCHEMA_TOOL {
                    schema_answer = Some(input.to_string());
                } else {
                    calls.push(chat::tool_call(&id, &name, input.to_string()));
                }
            }
            Block::Other => {}
        }
    }
    let mut finish = finish_reason(message.stop_reason.as_deref());
    match mode {
        Mode::Plain => {}
        Mode::Json => {
            if finish == "stop" {
                let Some(json) = text.as_deref().and_then(chat::json_text) else {
                    return Err("the answer is not a JSON object (emulated response_format json_object)".into());
                };
                text = Some(json.to_string());
            }
        }
        Mode::SchemaTool => {
            if finish == "tool_calls" {
                finish = "stop";
            }
            if schema_answer.is_none() && finish == "stop" {
                return Err("the answer does not hold the response_format json_schema tool call".into());
            }
            text = schema_answer;
        }
    }
    let usage = message.usage.unwrap_or_default();
    let usage = Usage {
        prompt_tokens: usage.prompt().unwrap_or(0),
        completion_tokens: usage.output_tokens.unwrap_or(0),
    };
    Ok((chat::completion(vec![chat::choice(0, text, calls, finish)]), usage))
}

// ---- streams ----------------------------------------------------------------------

/// Anthropic's stream: `message_start` (input usage; the role chunk),
/// `content_block_start` (a `tool_use` block opens a tool call: its id and
/// name), `content_block_delta` (`text_delta` → content, `input_json_delta` →
/// argument pieces, the OpenAI tool call `index` counting tool blocks only),
/// `message_delta` (the finish chunk; output usage), `message_stop` (done),
/// `error` (the contract's error event). `ping` and unknown events are
/// ignored, as Anthropic asks of clients.
pub struct AnthropicStream {
    mode: Mode,
    /// Anthropic block index → OpenAI tool call index, for `tool_use` blocks.
    tool_blocks: Vec<(u64, u64)>,
    /// The block holding the [`SCHEMA_TOOL`] call, in `SchemaTool` mode.
    schema_block: Option<u64>,
    usage: Usage,
    /// In `Json` mode, the text so far: checked once the answer stops.
    text: String,
}

impl AnthropicStream {
    pub fn new(request: &ParsedRequest) -> Self {
        AnthropicStream {
            // Built when the request was: the body was read then.
            mode: request.body().and_then(mode).unwrap_or(Mode::Plain),
            tool_blocks: Vec::new(),
            schema_block: None,
            usage: Usage::default(),
            text: String::new(),
        }
    }

    /// A text delta (an unescaped one is already owned: no second copy).
    fn content(&mut self, text: Cow<'_, str>, items: &mut Vec<StreamItem>) {
        if text.is_empty() {
            return;
        }
        if self.mode == Mode::Json {
            self.text.push_str(&text);
        }
        items.push(StreamItem::Content {
            index: 0,
            text: text.into_owned(),
        });
    }

    fn block_start(&mut self, index: u64, block: Block, items: &mut Vec<StreamItem>) {
        match block {
            Block::Text { text } if self.mode != Mode::SchemaTool => self.content(Cow::Owned(text), items),
            Block::ToolUse { name, .. } if self.mode == Mode::SchemaTool && name == SCHEMA_TOOL => {
                self.schema_block = Some(index);
            }
            Block::ToolUse { id, name, .. } => {
                let k = self.tool_blocks.len() as u64;
                self.tool_blocks.push((index, k));
                let call =
                    json!({"index": k, "id": id, "type": "function", "function": {"name": name, "arguments": ""}});
                items.push(StreamItem::Chunk(chat::chunk(0, json!({"tool_calls": [call]}), None)));
            }
            _ => {}
        }
    }

    fn block_delta(&mut self, index: u64, delta: Delta, items: &mut Vec<StreamItem>) {
        match delta {
            // Text around the forced schema tool is not the answer.
            Delta::Text(text) if self.mode != Mode::SchemaTool => self.content(text, items),
            Delta::InputJson(partial_json) if self.schema_block == Some(index) => {
                if !partial_json.is_empty() {
                    items.push(StreamItem::Chunk(chat::chunk(
                        0,
                        json!({"content": partial_json}),
                        None,
                    )));
                }
            }
            Delta::InputJson(partial_json) => {
                let tool = self.tool_blocks.iter().find(|(block, _)| *block == index);
                if let Some((_, k)) = tool
                    && !partial_json.is_empty()
                {
                    let call = json!({"index": k, "function": {"arguments": partial_json}});
                    items.push(StreamItem::Chunk(chat::chunk(0, json!({"tool_calls": [call]}), None)));
                }
            }
            _ => {}
        }
    }

    fn message_delta(&mut self, stop_reason: Option<&str>, usage: Option<WireUsage>, items: &mut Vec<StreamItem>) {
        if let Some(usage) = usage {
            if let Some(prompt) = usage.prompt() {
                self.usage.prompt_tokens = prompt;
            }
            if let Some(output) = usage.output_tokens {
                self.usage.completion_tokens = output;
            }
            items.push(StreamItem::Usage(self.usage));
        }
        let Some(stop_reason) = stop_reason else {
            return;
        };
        let mut finish = finish_reason(Some(stop_reason));
        if self.mode == Mode::SchemaTool && finish == "tool_calls" {
            finish = "stop";
        }
        // The text already went out, so an emulated JSON answer that is not
        // JSON can only end the stream with an error instead of `[DONE]`.
        if self.mode == Mode::Json
            && finish == "stop"
            && self.tool_blocks.is_empty()
            && !matches!(crate::json::dom::parse(self.text.trim()), Ok(Value::Object(_)))
        {
            items.push(StreamItem::Error(interrupted(
                "The provider's answer is not a JSON object (response_format json_object).",
            )));
            return;
        }
        items.push(StreamItem::Finish {
            index: 0,
            reason: finish,
        });
    }
}

impl StreamTranslator for AnthropicStream {
    fn on_event(&mut self, event: &SseEvent<'_>, items: &mut Vec<StreamItem>) {
        let event = match Event::parse(event.data) {
            Some(event) => event,
            None => {
                items.push(StreamItem::Error(interrupted(
                    "The provider sent an event that is not valid.",
                )));
                return;
            }
        };
        match event {
            Event::MessageStart { message } => {
                if let Some(usage) = message.usage {
                    self.usage = Usage {
                        prompt_tokens: usage.prompt().unwrap_or(0),
                        completion_tokens: usage.output_tokens.unwrap_or(0),
                    };
                    items.push(StreamItem::Usage(self.usage));
                }
                // No chunk yet: the rewriter gives the role to the first one.
                // An empty text delta here would tell clients the answer has
                // text (`"content": ""`) before a tool call that has none: the
                // AI SDK then opens an empty text part, where OpenAI's
                // tool-call streams start with `"content": null`.
            }
            Event::ContentBlockStart { index, content_block } => self.block_start(index, content_block, items),
            Event::ContentBlockDelta { index, delta } => self.block_delta(index, delta, items),
            Event::MessageDelta { delta, usage } => self.message_delta(delta.stop_reason.as_deref(), usage, items),
            Event::MessageStop => items.push(StreamItem::Done),
            Event::Error { error } => {
                let message = error
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("The provider reported an error.");
                items.push(StreamItem::Error(interrupted(message)));
            }
            Event::Other => {}
        }
    }
}

// ---- errors ---------------------------------------------------------------------

/// `{"type":"error","error":{"type":"...","message":"..."}}`: the code is
/// the error's `type` (`overloaded_error`, `invalid_request_error`, ...).
pub fn error_details(body: &[u8]) -> ErrorDetails {
    let Ok(value) = crate::json::dom::parse_slice(body) else {
        return ErrorDetails::default();
    };
    let error = value.get("error").unwrap_or(&Value::Null);
    let text = |k: &str| error.get(k).and_then(Value::as_str).map(str::to_string);
    ErrorDetails {
        code: text("type"),
        message: text("message"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::providers::chat::tests::{chat, chunks, replay, streamed_text, streamed_tool_calls};
    use crate::request::{Operation, parse};

    fn provider() -> Provider {
        let json = r#"{"providers":[{"id":"claude","api":"anthropic","cluster":"c","authority":"h","api_key":"sk-ant","default_max_tokens":1000}]}"#;
        Provider::clone(&Config::parse(json.as_bytes(), &|_| None).unwrap().providers[0])
    }

    fn build(body: Value) -> Result<Value, ApiError> {
        let up = build_request(&provider(), &chat(body), "claude-x", "waygate")?;
        Ok(serde_json::from_slice(&up.body).unwrap())
    }

    fn fixture(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    fn answer(body: Value, bytes: &[u8]) -> Result<(Value, Usage), String> {
        translate_answer(&chat(body), bytes)
    }

    fn hi() -> Value {
        json!({"model": "claude/x", "messages": [{"role": "user", "content": "hi"}]})
    }

    fn stream(body: &Value, input: &[u8], include_usage: bool) -> Vec<String> {
        let req = chat(body.clone());
        replay(Operation::Chat, include_usage, input, &|| {
            Box::new(AnthropicStream::new(&req))
        })
    }

    // ---- requests

    #[test]
    fn the_recorded_simple_request_is_what_a_chat_request_becomes() {
        let up = build_request(
            &provider(),
            &chat(json!({"model": "anthropic/claude", "max_tokens": 4000, "messages": [
                {"role": "system", "content": "You are a helpful assistant"},
                {"role": "user", "content": "Say hi in Portuguese"}]})),
            "claude-sonnet-4-20250514",
            "waygate",
        )
        .unwrap();
        assert_eq!(up.path, "/v1/messages");
        assert_eq!(
            up.headers,
            vec![
                ("x-api-key".to_string(), "sk-ant".to_string()),
                ("anthropic-version".to_string(), "2023-06-01".to_string())
            ]
        );
        let mut expected = fixture(include_bytes!("../../tests/fixtures/anthropic/message.request.json"));
        // The recorded client sent its text as blocks; a string is the same turn.
        expected["messages"][0]["content"] = json!([{"type": "text", "text": "Say hi in Portuguese"}]);
        assert_eq!(serde_json::from_slice::<Value>(&up.body).unwrap(), expected);
    }

    #[test]
    fn the_recorded_tool_requests_are_what_chat_tool_requests_become() {
        let weather = json!([{"type": "function", "function": {"name": "weather",
            "description": "Get weather information for a location",
            "parameters": {"properties": {"location": {"description": "the city", "type": "string"}},
                "required": ["location"], "type": "object"}}}]);
        let first = json!({"model": "a/b", "max_tokens": 4000, "tools": weather, "tool_choice": "auto",
            "parallel_tool_calls": true, "messages": [
                {"role": "system", "content": "You are a helpful assistant"},
                {"role": "user", "content": [{"type": "text", "text": "What's the weather in Florence,Italy?"}]}]});
        let mut got = build(first.clone()).unwrap();
        got["model"] = json!("claude-sonnet-4-20250514");
        assert_eq!(
            got,
            fixture(include_bytes!(
                "../../tests/fixtures/anthropic/message_tool_use.request.json"
            ))
        );

        let mut second = first;
        let history = second["messages"].as_array_mut().unwrap();
        history.push(
            json!({"role": "assistant", "content": "I'll check the weather in Florence, Italy for you.",
            "tool_calls": [{"id": "toolu_01XLb9pzgfLa2EMyqWot6Ezt", "type": "function",
                "function": {"name": "weather", "arguments": "{\"location\":\"Florence,Italy\"}"}}]}),
        );
        history.push(json!({"role": "tool", "tool_call_id": "toolu_01XLb9pzgfLa2EMyqWot6Ezt", "content": "40 C"}));
        let mut got = build(second).unwrap();
        got["model"] = json!("claude-sonnet-4-20250514");
        assert_eq!(
            got,
            fixture(include_bytes!(
                "../../tests/fixtures/anthropic/message_tool_result.request.json"
            ))
        );
    }

    #[test]
    fn max_tokens_defaults_to_the_provider_setting_and_accepts_the_new_name() {
        assert_eq!(build(hi()).unwrap()["max_tokens"], 1000);
        let mut b = hi();
        b["max_completion_tokens"] = json!(7);
        b["max_tokens"] = json!(9);
        assert_eq!(build(b).unwrap()["max_tokens"], 7);
    }

    #[test]
    fn parameters_are_mapped_or_dropped_and_the_routing_field_never_sent() {
        let mut b = hi();
        for (k, v) in [
            ("temperature", json!(1.5)),
            ("top_p", json!(0.5)),
            ("stop", json!("END")),
            ("user", json!("u-42")),
            ("seed", json!(7)),
            ("presence_penalty", json!(0.5)),
            ("frequency_penalty", json!(0.5)),
            ("logit_bias", json!({"1": 2})),
            ("n", json!(1)),
            ("logprobs", json!(false)),
            ("waygate", json!({"routing": {}})),
            ("stream", json!(true)),
        ] {
            b[k] = v;
        }
        let got = build(b).unwrap();
        assert_eq!(got["temperature"], 1.0);
        assert_eq!(got["top_p"], 0.5);
        assert_eq!(got["stop_sequences"], json!(["END"]));
        assert_eq!(got["metadata"], json!({"user_id": "u-42"}));
        assert_eq!(got["stream"], true);
        let keys: Vec<&String> = got.as_object().unwrap().keys().collect();
        for gone in [
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "n",
            "logprobs",
            "waygate",
            "user",
        ] {
            assert!(got.get(gone).is_none(), "{gone} must not be sent: {keys:?}");
        }
    }

    #[test]
    fn what_would_change_the_answer_shape_is_refused() {
        for (k, v, param) in [
            ("n", json!(2), "n"),
            ("logprobs", json!(true), "logprobs"),
            ("top_logprobs", json!(2), "top_logprobs"),
            (
                "response_format",
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "array"}}}),
                "response_format",
            ),
        ] {
            let mut b = hi();
            b[k] = v;
            let e = build(b).unwrap_err();
            assert_eq!(
                (e.status, e.code.as_str(), e.param.as_deref()),
                (400, "unsupported_parameter", Some(param))
            );
        }
    }

    #[test]
    fn system_and_developer_messages_join_the_system_blocks_and_turns_alternate() {
        let got = build(json!({"model": "a/b", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "one"},
            {"role": "developer", "content": [{"type": "text", "text": "Use French."}]},
            {"role": "user", "content": [{"type": "text", "text": "two"}, {"type": "text", "text": "  "}]},
            {"role": "assistant", "content": "a"},
            {"role": "assistant", "content": "b  "},
        ]}))
        .unwrap();
        assert_eq!(
            got["system"],
            json!([{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Use French."}])
        );
        assert_eq!(
            got["messages"],
            json!([
                {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
                {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ])
        );
    }

    #[test]
    fn parallel_tool_results_share_one_user_turn_before_its_text() {
        let calls = json!([
            {"id": "toolu_a", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}},
            {"id": "toolu_m", "type": "function", "function": {"name": "mul", "arguments": "{}"}}]);
        let got = build(json!({"model": "a/b", "messages": [
            {"role": "user", "content": "2 and 3?"},
            {"role": "assistant", "content": null, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "toolu_a", "content": "5"},
            {"role": "tool", "tool_call_id": "toolu_m", "content": ""},
            {"role": "user", "content": "and?"},
        ]}))
        .unwrap();
        assert_eq!(
            got["messages"][1],
            json!({"role": "assistant", "content": [
                {"type": "tool_use", "id": "toolu_a", "name": "add", "input": {"a": 2, "b": 3}},
                {"type": "tool_use", "id": "toolu_m", "name": "mul", "input": {}}]})
        );
        assert_eq!(
            got["messages"][2],
            json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": [{"type": "text", "text": "5"}]},
                {"type": "tool_result", "tool_use_id": "toolu_m"},
                {"type": "text", "text": "and?"}]})
        );
        // Text between the results: the results move first, each kind in its order.
        let got = build(json!({"model": "a/b", "messages": [
            {"role": "user", "content": "2 and 3?"},
            {"role": "assistant", "content": null, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "toolu_a", "content": "5"},
            {"role": "user", "content": "first"},
            {"role": "tool", "tool_call_id": "toolu_m", "content": "6"},
            {"role": "user", "content": "second"},
        ]}))
        .unwrap();
        let order: Vec<&str> = got["messages"][2]["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["tool_use_id"].as_str().or(b["text"].as_str()).unwrap())
            .collect();
        assert_eq!(order, ["toolu_a", "toolu_m", "first", "second"]);
    }

    #[test]
    fn images_become_base64_or_url_sources() {
        let got = build(json!({"model": "a/b", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
            {"type": "text", "text": "Same animal?"}]}]}))
        .unwrap();
        assert_eq!(
            got["messages"][0]["content"],
            json!([
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                {"type": "text", "text": "Same animal?"}])
        );
        let e = build(json!({"model": "a/b", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/tiff;base64,AAAA"}}]}]}))
        .unwrap_err();
        assert_eq!(
            (e.code.as_str(), e.param.as_deref()),
            ("invalid_value", Some("messages.0.content.0.image_url.url"))
        );
    }

    #[test]
    fn tool_choice_maps_to_anthropic_kinds() {
        let tools = json!([{"type": "function", "function": {"name": "f"}}]);
        for (choice, expected) in [
            (json!("auto"), json!({"type": "auto"})),
            (json!("none"), json!({"type": "none"})),
            (json!("required"), json!({"type": "any"})),
            (
                json!({"type": "function", "function": {"name": "f"}}),
                json!({"type": "tool", "name": "f"}),
            ),
        ] {
            let mut b = hi();
            b["tools"] = tools.clone();
            b["tool_choice"] = choice;
            let got = build(b).unwrap();
            assert_eq!(got["tool_choice"], expected);
            assert_eq!(
                got["tools"],
                json!([{"name": "f", "input_schema": {"type": "object", "properties": {}}}])
            );
        }
        let mut b = hi();
        b["tools"] = json!([{"type": "function", "function": {"name": "f", "parameters": {"properties": {}}}}]);
        b["parallel_tool_calls"] = json!(false);
        let got = build(b.clone()).unwrap();
        assert_eq!(
            got["tools"][0]["input_schema"],
            json!({"type": "object", "properties": {}})
        );
        b["tools"] = tools;
        assert_eq!(
            build(b).unwrap()["tool_choice"],
            json!({"type": "auto", "disable_parallel_tool_use": true})
        );
    }

    #[test]
    fn legacy_prompts_become_one_user_turn() {
        let req = parse(
            Operation::Completions,
            br#"{"model":"a/b","prompt":"Say hi","max_tokens":5}"#,
        )
        .unwrap();
        let up = build_request(&provider(), &req, "claude-x", "waygate").unwrap();
        let got: Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(
            got["messages"],
            json!([{"role": "user", "content": [{"type": "text", "text": "Say hi"}]}])
        );
        assert_eq!(got["max_tokens"], 5);
        let req = parse(Operation::Completions, br#"{"model":"a/b","prompt":"a","echo":true}"#).unwrap();
        let e = build_request(&provider(), &req, "claude-x", "waygate").unwrap_err();
        assert_eq!(e.param.as_deref(), Some("echo"));
    }

    #[test]
    fn json_object_is_asked_for_in_the_system_prompt() {
        let mut b = hi();
        b["response_format"] = json!({"type": "json_object"});
        let got = build(b).unwrap();
        assert_eq!(got["system"][0]["text"], JSON_INSTRUCTION);
        assert!(got.get("response_format").is_none());
    }

    #[test]
    fn json_schema_forces_a_tool_with_that_schema() {
        let schema = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let mut b = hi();
        b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "place", "schema": schema}});
        let got = build(b.clone()).unwrap();
        assert_eq!(got["tools"][0]["input_schema"], schema);
        assert_eq!(got["tool_choice"], json!({"type": "tool", "name": SCHEMA_TOOL}));
        b["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
        assert_eq!(build(b).unwrap_err().param.as_deref(), Some("response_format"));
    }

    // ---- answers

    #[test]
    fn the_recorded_text_answer_translates() {
        let (v, usage) = answer(hi(), include_bytes!("../../tests/fixtures/anthropic/message.json")).unwrap();
        assert_eq!(
            v["choices"],
            json!([{"index": 0, "logprobs": null, "finish_reason": "stop", "message": {"role": "assistant",
                "content": "Olá! \n\n(That's \"hello\" in Portuguese. You could also say \"Oi!\" for a more casual \"hi!\")"}}])
        );
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 16,
                completion_tokens: 34
            }
        );
    }

    #[test]
    fn the_recorded_tool_use_answer_translates() {
        let (v, usage) = answer(
            hi(),
            include_bytes!("../../tests/fixtures/anthropic/message_tool_use.json"),
        )
        .unwrap();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(
            choice["message"]["content"],
            "I'll check the weather in Florence, Italy for you."
        );
        assert_eq!(
            choice["message"]["tool_calls"],
            json!([{"id": "toolu_01XLb9pzgfLa2EMyqWot6Ezt", "type": "function",
                "function": {"name": "weather", "arguments": "{\"location\":\"Florence,Italy\"}"}}])
        );
        assert_eq!(usage.prompt_tokens, 394);
    }

    #[test]
    fn only_tool_calls_means_null_content_and_cache_tokens_count_as_prompt() {
        let body = br#"{"id":"msg_1","type":"message","role":"assistant","content":[
            {"type":"thinking","thinking":"hmm","signature":"x"},
            {"type":"tool_use","id":"toolu_1","name":"f","input":{}}],
            "stop_reason":"tool_use","usage":{"input_tokens":3,"cache_creation_input_tokens":10,
            "cache_read_input_tokens":100,"output_tokens":5}}"#;
        let (v, usage) = answer(hi(), body).unwrap();
        assert!(v["choices"][0]["message"]["content"].is_null());
        assert_eq!(
            v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 113,
                completion_tokens: 5
            }
        );
    }

    #[test]
    fn stop_reasons_map_per_the_contract() {
        for (stop, finish) in [
            ("end_turn", "stop"),
            ("stop_sequence", "stop"),
            ("max_tokens", "length"),
            ("tool_use", "tool_calls"),
            ("refusal", "content_filter"),
            ("pause_turn", "stop"),
        ] {
            let body = format!(
                r#"{{"type":"message","content":[{{"type":"text","text":"x"}}],"stop_reason":"{stop}","usage":{{"input_tokens":1,"output_tokens":1}}}}"#
            );
            let (v, _) = answer(hi(), body.as_bytes()).unwrap();
            assert_eq!(v["choices"][0]["finish_reason"], finish, "{stop}");
        }
    }

    #[test]
    fn a_2xx_that_is_not_a_message_is_an_error() {
        for body in [
            &b"{\"id\":\"msg_garbage\",\"type\":\"message\",\"content\":[{\"type\":\"text\",\"text\":\"Hel"[..],
            b"{\"type\":\"error\",\"error\":{}}",
            b"[]",
        ] {
            assert!(answer(hi(), body).is_err(), "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn emulated_json_mode_checks_the_answer() {
        let mut b = hi();
        b["response_format"] = json!({"type": "json_object"});
        let msg = |text: &str, stop: &str| {
            json!({"type": "message", "content": [{"type": "text", "text": text}], "stop_reason": stop,
                "usage": {"input_tokens": 1, "output_tokens": 1}})
            .to_string()
        };
        let (v, _) = answer(b.clone(), msg("```json\n{\"a\": 1}\n```", "end_turn").as_bytes()).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "{\"a\": 1}");
        assert!(answer(b.clone(), msg("Here you go: {\"a\": 1}", "end_turn").as_bytes()).is_err());
        // A cut answer is reported as cut, as OpenAI does, not as garbage.
        let (v, _) = answer(b, msg("{\"a\": ", "max_tokens").as_bytes()).unwrap();
        assert_eq!(v["choices"][0]["finish_reason"], "length");
    }

    #[test]
    fn a_json_schema_answer_is_the_forced_tools_input() {
        let mut b = hi();
        b["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "p",
            "schema": {"type": "object"}}});
        let body = json!({"type": "message", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": SCHEMA_TOOL, "input": {"city": "Rome"}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 1, "output_tokens": 1}});
        let (v, _) = answer(b, body.to_string().as_bytes()).unwrap();
        assert_eq!(
            v["choices"][0],
            json!({"index": 0, "logprobs": null, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "{\"city\":\"Rome\"}"}})
        );
    }

    // ---- streams

    #[test]
    fn an_answer_without_content_still_gives_its_first_chunk_the_role() {
        let input = b"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3}}}\n\n\
            data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"max_tokens\"},\"usage\":{\"output_tokens\":0}}\n\n\
            data: {\"type\":\"message_stop\"}\n\n";
        let events = stream(&hi(), input, false);
        assert_eq!(events.last().unwrap(), "[DONE]");
        let c = chunks(&events);
        assert_eq!(
            c[0]["choices"][0],
            json!({"index": 0, "delta": {"role": "assistant"}, "finish_reason": "length"}),
            "{events:?}"
        );
    }

    #[test]
    fn the_recorded_text_stream_translates_under_every_chunking() {
        let events = stream(
            &hi(),
            include_bytes!("../../tests/fixtures/anthropic/message_stream.sse"),
            true,
        );
        assert_eq!(events.last().unwrap(), "[DONE]");
        let c = chunks(&events);
        // The role rides on the first text, as in a Gemini stream.
        assert_eq!(
            c[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": "Olá! ("})
        );
        assert_eq!(
            streamed_text(&c),
            "Olá! (That's \"hi\" in Portuguese)\n\nYou could also say \"Oi!\" which is a more casual way to say hi in Portuguese."
        );
        let finish = &c[c.len() - 2];
        assert_eq!(
            finish["choices"][0],
            json!({"index": 0, "delta": {}, "finish_reason": "stop"})
        );
        let usage = c.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(
            usage["usage"],
            json!({"prompt_tokens": 16, "completion_tokens": 38, "total_tokens": 54})
        );
    }

    #[test]
    fn the_sdk_stream_without_a_final_blank_line_still_ends_cleanly() {
        let events = stream(
            &hi(),
            include_bytes!("../../tests/fixtures/anthropic/message_stream_sdk_basic.sse"),
            false,
        );
        assert_eq!(events.last().unwrap(), "[DONE]");
        assert_eq!(streamed_text(&chunks(&events)), "Hello there!");
    }

    #[test]
    fn the_recorded_tool_stream_gives_one_tool_call_with_whole_arguments() {
        let events = stream(
            &hi(),
            include_bytes!("../../tests/fixtures/anthropic/message_stream_tool_use.sse"),
            false,
        );
        let c = chunks(&events);
        assert_eq!(
            streamed_text(&c),
            "I'll get the weather information for Florence, Italy for you."
        );
        assert_eq!(
            streamed_tool_calls(&c),
            vec![json!({"id": "toolu_01N2eM4V43kGCDkq2Lw7ChWQ", "name": "weather",
                "arguments": "{\"location\": \"Florence,Italy\"}"})]
        );
        assert_eq!(c.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(events.last().unwrap(), "[DONE]");
    }

    #[test]
    fn parallel_tool_blocks_get_tool_call_indexes_zero_and_one() {
        let input = include_bytes!("../../tests/fixtures/anthropic/message_stream_parallel_tool_use.sse");
        let events = stream(&hi(), input, true);
        let c = chunks(&events);
        assert_eq!(streamed_text(&c), "I'll add and multiply the numbers 2 and 3 for you.");
        assert_eq!(
            streamed_tool_calls(&c),
            vec![
                json!({"id": "toolu_01UYxUYC2zRPY8wiutnF48eP", "name": "add", "arguments": "{\"a\": 2, \"b\": 3}"}),
                json!({"id": "toolu_01VaRx1jpWCvPhi7L4kywAcd", "name": "multiply", "arguments": "{\"a\": 2, \"b\": 3}"}),
            ]
        );
        assert_eq!(c[c.len() - 2]["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(
            c[c.len() - 1]["usage"],
            json!({"prompt_tokens": 502, "completion_tokens": 137, "total_tokens": 639})
        );
        assert_eq!(events.last().unwrap(), "[DONE]");
    }

    #[test]
    fn a_stream_cut_before_message_stop_ends_with_the_error_event() {
        let input = include_bytes!("../../tests/fixtures/anthropic/message_stream_parallel_tool_use.sse");
        let cut = input.windows(20).position(|w| w == b"event: message_delta").unwrap();
        let events = stream(&hi(), &input[..cut], true);
        let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "stream_interrupted");
        assert!(!events.contains(&"[DONE]".to_string()));
    }

    #[test]
    fn the_recorded_error_event_ends_the_stream_with_the_contract_error() {
        let mut input = include_bytes!("../../tests/fixtures/anthropic/message_stream_sdk_basic.sse")[..600].to_vec();
        let cut = input.windows(2).rposition(|w| w == b"\n\n").unwrap() + 2;
        input.truncate(cut);
        input.extend_from_slice(include_bytes!("../../tests/fixtures/anthropic/stream_error_event.sse"));
        let events = stream(&hi(), &input, true);
        let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
        assert_eq!(
            last,
            json!({"error": {"message": "Overloaded", "type": "upstream_error", "param": null,
                "code": "stream_interrupted"}})
        );
    }

    #[test]
    fn a_stream_event_that_is_not_json_is_an_error() {
        let input = b"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let events = stream(&hi(), input, false);
        assert_eq!(events.len(), 1);
        assert!(events[0].contains("stream_interrupted"));
    }

    #[test]
    fn each_event_type_reads_only_its_own_members() {
        let start = r#"{"type":"message_start","message":{"usage":{"input_tokens":3}}}"#;
        let text = |t: &str| {
            format!(r#"{{"type":"content_block_delta","index":0,"delta":{{"type":"text_delta","text":{t}}}}}"#)
        };
        let cases = [
            // Unknown types and deltas are skipped whatever their members hold.
            (
                r#"{"type":"ping","index":"x","delta":7,"message":null}"#.to_string(),
                None,
            ),
            (
                r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","text":5}}"#.to_string(),
                None,
            ),
            // A text delta's text: escapes read, a missing or mistyped one refused.
            (text(r#""a\"\u00e9""#), Some(r#"a"é"#)),
            (text("7"), Some("!")),
            (
                r#"{"type":"content_block_delta","delta":{"type":"text_delta","text":"no index"}}"#.to_string(),
                Some("!"),
            ),
            (
                r#"{"type":"content_block_delta","index":0,"delta":null}"#.to_string(),
                Some("!"),
            ),
            (
                r#"{"type":"message_delta","delta":{"stop_reason":null},"usage":null}"#.to_string(),
                None,
            ),
            (
                r#"{"type":"message_delta","delta":{},"usage":{"output_tokens":"x"}}"#.to_string(),
                Some("!"),
            ),
            (
                r#"{"type":"content_block_delta","type":"ping","index":0}"#.to_string(),
                Some("!"),
            ),
        ];
        for (event, expect) in cases {
            let input = format!("data: {start}\n\ndata: {event}\n\ndata: {{\"type\":\"message_stop\"}}\n\n");
            let events = stream(&hi(), input.as_bytes(), false);
            // message_start writes nothing: the event's own output comes first.
            let first: Value = serde_json::from_str(&events[0]).unwrap_or(Value::Null);
            match expect {
                None => assert_eq!(events[0], "[DONE]", "{event}: {events:?}"),
                Some("!") => assert_eq!(first["error"]["code"], "stream_interrupted", "{event}: {events:?}"),
                Some(text) => assert_eq!(first["choices"][0]["delta"]["content"], text, "{event}"),
            }
        }
        // An error event without details still ends the stream with one.
        let input = format!("data: {start}\n\ndata: {{\"type\":\"error\",\"error\":null}}\n\n");
        let events = stream(&hi(), input.as_bytes(), false);
        let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
        assert_eq!(last["error"]["message"], "The provider reported an error.");
    }

    /// Every event's items, one event after the other through one stream.
    fn items_of(body: &Value, data: &[&str]) -> Vec<Vec<StreamItem>> {
        let req = chat(body.clone());
        let mut stream = AnthropicStream::new(&req);
        data.iter()
            .map(|d| {
                let mut items = Vec::new();
                let event = SseEvent {
                    data: d,
                    multiline: false,
                };
                stream.on_event(&event, &mut items);
                items
            })
            .collect()
    }

    #[test]
    fn message_start_and_delta_read_their_usage_and_stop_reason_or_fail() {
        let start = r#"{"type":"message_start","message":{"id":"m","usage":{"input_tokens":7,"output_tokens":1}}}"#;
        let delta = r#"{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"output_tokens":9}}"#;
        let data = [
            start,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":3,"cache_read_input_tokens":4}},"index":"odd","error":null}   "#,
            r#"{"type":"message_start","message":{}}"#,
            r#"{"type":"message_start","message":null}"#,
            r#"{"type":"message_start"}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":"x"}}}"#,
            r#"{"type":"message_start","message":{"usage":{}},"message":{"usage":{}}}"#,
            r#"{"type":"message_start","index":1,"index":2,"message":{"usage":{}}}"#,
            r#"{"type":"message_start","type":"ping","message":{"usage":{}}}"#,
            r#"{"type":"message_start","message":{"usage":{}}} x"#,
            r#"{"type":"message_start","message":{"usage":{}}"#,
            r#"{"type":"message_start_v2","message":{"usage":{}}}"#,
            r#"{"type":"message\u005fstart","message":{"usage":{"input_tokens":11}}}"#,
            r#"{"message":{"usage":{"input_tokens":12}},"type":"message_start"}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":null},"usage":null}"#,
            r#"{"type":"message_delta","delta":{},"usage":{"output_tokens":2,"input_tokens":5}}"#,
            r#"{"type":"message_delta","delta":null}"#,
            r#"{"type":"message_delta","usage":{"output_tokens":2}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":5}}"#,
            r#"{"type":"message_delta","delta":{},"usage":{"output_tokens":-1}}"#,
            r#"{"type":"message_delta","delta":{},"delta":{}}"#,
            r#"{"type":"message_delta","delta":{},"content_block":[1,2],"message":"m"}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":1,"input_tokens":2}}}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":null,"input_tokens":3}}}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":null,"output_tokens":null}}}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":1.0}}}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":-0}}}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":1e2}}}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":18446744073709551615}}}"#,
            r#"{"type":"message_start","message":{"usage":{"input_tokens":18446744073709551616}}}"#,
            r#"{"type":"message_start","message":{"usage":[1,2,3,4]}}"#,
            r#"{"type":"message_start","message":[{"input_tokens":6}]}"#,
            r#"["message_start",null,null,null,{"usage":{"input_tokens":8}}]"#,
            r#"{"type":"message_start","message":{"us\u0061ge":{"input_tokens":9}}}"#,
            r#"{"type":"message_start","message":{"usage":{"cache_creation":{"a":[{"b":null}]},"cache_creation_input_tokens":2,"cache_read_input_tokens":3,"input_tokens":4,"output_tokens":5,"x":"y"}}}"#,
            "{\"type\":\"message_start\",\"message\":{\"usage\":{},\"id\":\"a\tb\"}}",
            r#"{"type":"message_start","message":{"usage":{}}, "usage":5, "delta":"d", "error":{} }"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end\u005fturn"}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_reason":"x"}}"#,
            r#"{"type":"message_delta","delta":["max_tokens"]}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"refusal"},"usage":{"output_tokens":3,"output_tokens":4}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"refusal"},"usage":[1]}"#,
            r#"{"type":"message_delta","delta":{"stop_sequence":"x"},"usage":{"input_tokens":0}}"#,
            delta,
        ];
        let json_mode = json!({"model": "claude/x", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"}});
        // In JSON mode the `end_turn` is an error too: the text is no object.
        for (body, expected_errors) in [(hi(), 24), (json_mode, 25)] {
            let items = items_of(&body, &data);
            let errors = items.iter().flatten().filter(|i| matches!(i, StreamItem::Error(_)));
            assert_eq!(errors.count(), expected_errors, "{items:?}");
        }
    }

    #[test]
    fn events_with_odd_values_or_trailing_bytes_read_or_fail_whole() {
        let start = |id: &str, usage: &str| {
            format!(
                r#"{{"type":"message_start","message":{{"model":"claude-x","id":{id},"type":"message","role":"assistant","content":[],"stop_reason":null,"usage":{usage}}}   }}"#
            )
        };
        let stop = |reason: &str, usage: &str| {
            format!(
                r#"{{"type":"message_delta","delta":{{"stop_reason":{reason},"stop_sequence":null}},"usage":{usage}}}"#
            )
        };
        let counts = r#"{"input_tokens":16,"cache_read_input_tokens":0,"output_tokens":5,"service_tier":"standard"}"#;
        let data: Vec<String> = vec![
            start(r#""msg_1""#, counts),
            start(
                r#""msg_2""#,
                r#"{"input_tokens":3,"cache_read_input_tokens":9,"output_tokens":1,"service_tier":"priority"}"#,
            ),
            start(r#""msg_\u0033""#, counts).replace("   }", "}"),
            start(
                r#""msg_4""#,
                r#"{"input_tokens":null,"cache_read_input_tokens":0,"output_tokens":5,"service_tier":"x"}"#,
            ),
            start(
                r#""msg_5""#,
                r#"{"input_tokens":1.5,"cache_read_input_tokens":0,"output_tokens":5,"service_tier":"x"}"#,
            ),
            start(
                r#""msg_6""#,
                r#"{"input_tokens":-1,"cache_read_input_tokens":0,"output_tokens":5,"service_tier":"x"}"#,
            ),
            start(
                r#""msg_7""#,
                r#"{"input_tokens":18446744073709551616,"cache_read_input_tokens":0,"output_tokens":5,"service_tier":"x"}"#,
            ),
            start("7", counts),
            start(
                r#""msg_8""#,
                r#"{"input_tokens":2,"cache_read_input_tokens":0,"output_tokens":5,"service_tier":5e3}"#,
            ),
            start(r#""msg_9""#, "null"),
            start(r#""msg_10""#, "null"),
            start(r#""msg_11""#, counts).replace("   }", "} x"),
            start(r#""msg_12""#, counts).replace(r#""claude-x""#, r#""claude-y""#),
            stop(r#""end_turn""#, r#"{"output_tokens":38}"#),
            stop(r#""max_tokens""#, r#"{"output_tokens":7}"#),
            stop(r#""tool\u005fuse""#, r#"{"output_tokens":8}"#),
            stop("null", r#"{"output_tokens":9}"#),
            stop("5", r#"{"output_tokens":9}"#),
            stop(r#""refusal""#, r#"{"output_tokens":"9"}"#),
            stop(r#""stop_sequence""#, r#"{"output_tokens":10}      "#),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}            }"#.into(),
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#.into(),
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":"x"}}"#.into(),
            r#"{"type": "ping"}"#.into(),
            r#"{"type": "ping"}  "#.into(),
            r#"{"type": "ping"} ]"#.into(),
            r#"{"type":"content_block_stop","index":0            }"#.into(),
            r#"{"type":"content_block_stop","index":0}"#.into(),
            r#"{"type":"content_block_stop","index":01}"#.into(),
            r#"{"type":"message_stop"       }"#.into(),
            r#"{"type":"message_stop"}"#.into(),
            r#"{"type":"message_stop"}}"#.into(),
        ];
        let data: Vec<&str> = data.iter().map(String::as_str).collect();
        let json_mode = json!({"model": "claude/x", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"}});
        for (body, expected_errors) in [(hi(), 9), (json_mode, 11)] {
            let items = items_of(&body, &data);
            let errors = items.iter().flatten().filter(|i| matches!(i, StreamItem::Error(_)));
            assert_eq!(errors.count(), expected_errors, "{items:?}");
        }
    }

    #[test]
    fn content_blocks_read_only_what_their_type_needs() {
        let block = |json: &str| serde_json::from_str::<Block>(json).map_err(|e| e.to_string());
        assert!(matches!(block(r#"{"text":"hi","type":"text","x":[1]}"#), Ok(Block::Text { text }) if text == "hi"));
        assert!(matches!(block(r#"{"type":"text","text":"a\"b"}"#), Ok(Block::Text { text }) if text == "a\"b"));
        assert!(
            block(r#"{"type":"text"}"#)
                .unwrap_err()
                .contains("missing field `text`")
        );
        assert!(block(r#"{"type":"text","text":5}"#).is_err());
        assert!(block(r#"{"type":"text","text":"a","text":"b"}"#).is_err());
        assert!(matches!(
            block(r#"{"type":"tool_use","id":"t1","name":"f"}"#),
            Ok(Block::ToolUse { id, name, input: Value::Null }) if id == "t1" && name == "f"
        ));
        assert!(matches!(
            block(r#"{"type":"tool_use","id":"t1","name":"f","input":{"a":[1]}}"#),
            Ok(Block::ToolUse { input, .. }) if input == json!({"a": [1]})
        ));
        assert!(
            block(r#"{"type":"tool_use","name":"f"}"#)
                .unwrap_err()
                .contains("missing field `id`")
        );
        // Kinds the gateway leaves out are read no further.
        assert!(matches!(
            block(r#"{"type":"thinking","thinking":"…","text":5}"#),
            Ok(Block::Other)
        ));
        assert!(matches!(
            block(r#"{"type":"server_tool_use","id":1}"#),
            Ok(Block::Other)
        ));
        assert!(block(r#"{"text":"no type"}"#).is_err());
        assert!(block("[]").is_err());
    }

    #[test]
    fn a_legacy_stream_is_text_only() {
        let req = parse(
            Operation::Completions,
            br#"{"model":"a/b","prompt":"hi","stream":true}"#,
        )
        .unwrap();
        let input = include_bytes!("../../tests/fixtures/anthropic/message_stream_sdk_basic.sse");
        let events = replay(Operation::Completions, false, input, &|| {
            Box::new(AnthropicStream::new(&req))
        });
        let c = chunks(&events);
        let text: String = c.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
        assert_eq!(text, "Hello there!");
        assert_eq!(c[0]["object"], "text_completion");
        assert_eq!(c.last().unwrap()["choices"][0]["finish_reason"], "stop");
    }

    fn text_stream(text_pieces: &[&str]) -> Vec<u8> {
        let mut s = String::from(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n\
             event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        );
        for p in text_pieces {
            let delta = json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}});
            s.push_str(&format!("event: content_block_delta\ndata: {delta}\n\n"));
        }
        s.push_str(
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n\
             event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":4}}\n\n\
             event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        s.into_bytes()
    }

    #[test]
    fn an_emulated_json_stream_that_is_not_json_ends_with_an_error() {
        let mut b = hi();
        b["response_format"] = json!({"type": "json_object"});
        let ok = stream(&b, &text_stream(&["{\"a\"", ": 1}"]), false);
        assert_eq!(ok.last().unwrap(), "[DONE]");
        let bad = stream(&b, &text_stream(&["Sure: ", "{\"a\": 1}"]), false);
        assert!(bad.last().unwrap().contains("stream_interrupted"), "{bad:?}");
        assert!(!bad.contains(&"[DONE]".to_string()));
    }

    #[test]
    fn a_json_schema_stream_streams_the_tools_input_as_content() {
        let mut b = hi();
        b["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}});
        let input = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"json_response\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\": \\\"Rome\\\"}\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":9}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let events = stream(&b, input.as_bytes(), false);
        let c = chunks(&events);
        assert_eq!(streamed_text(&c), "{\"city\": \"Rome\"}");
        assert!(streamed_tool_calls(&c).is_empty());
        assert_eq!(c.last().unwrap()["choices"][0]["finish_reason"], "stop");
    }

    // ---- errors

    #[test]
    fn the_recorded_error_bodies_are_read() {
        let read = |bytes: &[u8]| {
            let d = error_details(bytes);
            (d.code.unwrap(), d.message.unwrap())
        };
        assert_eq!(
            read(include_bytes!(
                "../../tests/fixtures/anthropic/error_529_overloaded.json"
            )),
            ("overloaded_error".into(), "Overloaded".into())
        );
        assert_eq!(
            read(include_bytes!(
                "../../tests/fixtures/anthropic/error_401_authentication.json"
            )),
            ("authentication_error".into(), "invalid x-api-key".into())
        );
        assert_eq!(
            read(include_bytes!(
                "../../tests/fixtures/anthropic/error_404_not_found.json"
            )),
            (
                "not_found_error".into(),
                "The requested resource could not be found.".into()
            )
        );
        assert_eq!(error_details(b"<html>"), ErrorDetails::default());
    }
}
