//! Google's Gemini API (generativelanguage `v1beta`), both ways:
//! `POST {path_prefix}/models/{model}:generateContent`, and
//! `:streamGenerateContent?alt=sse` for streams.
//!
//! Request: `system` / `developer` messages become `systemInstruction`; turns
//! are `user` / `model` contents, consecutive same-role turns merged (so the
//! function responses answering one model turn share one user turn, as the
//! API requires); sampling parameters go into `generationConfig`; tools are
//! `functionDeclarations` with the client's JSON Schema as
//! `parametersJsonSchema`, and `json_schema` answers use
//! `responseJsonSchema`, so schemas pass unchanged instead of being squeezed
//! into the older OpenAPI subset.
//!
//! Tool call ids: Gemini has none, so answers get `call_<tag>_<k>` ids, the
//! tag taken from the response id (stable across the chunks of one stream,
//! different between answers). A function call that came with a
//! `thoughtSignature` carries it in its id (`call_<tag>_<k>_<signature>`,
//! base64url so the id stays `[A-Za-z0-9_-]`): a client sends the id back
//! with the conversation, and Gemini 3 refuses function calls in the history
//! without their signature. A `tool` message finds its function name through
//! the assistant tool call with the same id.

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::chat::{self, ImageSource, Message, Part, ResponseFormat, ToolChoice};
use super::openai::{interrupted, json_event};
use super::{ErrorDetails, StreamItem, StreamTranslator, UpstreamRequest};
use crate::config::Provider;
use crate::errors::{ApiError, ErrorType};
use crate::request::{ParsedRequest, bad_value};
use crate::sse::SseEvent;
use crate::usage::Usage;

/// Google's documented stand-in for a thought signature, for function calls
/// that did not come from Gemini (another provider answered that turn, or
/// the client made the id up). Gemini 3 refuses such calls without one.
const SKIP_SIGNATURE: &str = "skip_thought_signature_validator";

/// File types Gemini takes by URL, by extension.
const URL_TYPES: [(&str, &str); 7] = [
    ("png", "image/png"),
    ("jpg", "image/jpeg"),
    ("jpeg", "image/jpeg"),
    ("webp", "image/webp"),
    ("heic", "image/heic"),
    ("heif", "image/heif"),
    ("pdf", "application/pdf"),
];

/// Gemini's most candidates per request (`candidateCount` is 1 to 8).
const MAX_CANDIDATES: u64 = 8;

// ---- request ------------------------------------------------------------------

pub fn build_request(
    provider: &Provider,
    request: &ParsedRequest,
    upstream_model: &str,
    routing_field: &str,
) -> Result<UpstreamRequest, ApiError> {
    chat::check_common(request, &provider.id, routing_field)?;
    let body = request.body()?;
    for field in ["user", "parallel_tool_calls"] {
        if chat::is_set(body.get(field)) {
            log::info!("provider {} cannot express {field}; dropped", provider.id);
        }
    }
    let messages = chat::messages(request)?;
    let (system, contents) = conversation(&messages, needs_signatures(upstream_model))?;

    let mut out = Map::new();
    out.insert("contents".into(), Value::Array(contents));
    if !system.is_empty() {
        // The role is what Google's own SDKs send; the API ignores it.
        out.insert("systemInstruction".into(), json!({"parts": system, "role": "user"}));
    }
    let config = generation_config(body);
    if !config.is_empty() {
        out.insert("generationConfig".into(), Value::Object(config));
    }
    insert_tools(body, &mut out)?;

    let bytes = serde_json::to_vec(&Value::Object(out)).map_err(|_| encode_failed())?;
    let model = upstream_model.strip_prefix("models/").unwrap_or(upstream_model);
    let method = if request.stream {
        "streamGenerateContent?alt=sse"
    } else {
        "generateContent"
    };
    let credential = provider.credential_text();
    Ok(UpstreamRequest {
        path: format!("{}/models/{}:{method}", provider.path_prefix, path_segment(model)),
        headers: vec![("x-goog-api-key".into(), credential.to_string())],
        body: bytes,
    })
}

/// A request's tokens counted by Gemini (`models/{model}:countTokens`): the
/// request it would send, whole, as the `generateContentRequest` to count
/// (system instruction and tools included, which a bare `contents` leaves out).
pub fn count_request(
    provider: &Provider,
    request: &ParsedRequest,
    upstream_model: &str,
    routing_field: &str,
) -> Result<UpstreamRequest, ApiError> {
    let generate = build_request(provider, request, upstream_model, routing_field)?;
    let model = upstream_model.strip_prefix("models/").unwrap_or(upstream_model);
    let Some(members) = generate.body.strip_prefix(b"{") else {
        return Err(encode_failed());
    };
    // The body is an object with `contents` at least: the model goes first in it.
    let name = serde_json::to_vec(&format!("models/{model}")).map_err(|_| encode_failed())?;
    let mut body = Vec::with_capacity(generate.body.len() + name.len() + 40);
    body.extend_from_slice(b"{\"generateContentRequest\":{\"model\":");
    body.extend_from_slice(&name);
    body.push(b',');
    body.extend_from_slice(members);
    body.push(b'}');
    Ok(UpstreamRequest {
        path: format!("{}/models/{}:countTokens", provider.path_prefix, path_segment(model)),
        headers: generate.headers,
        body,
    })
}

/// A translated request's body with `generationConfig.topK` set: what the
/// client's API asked that chat has no member for
/// ([`crate::inbound::Client::carry_over`]). A body that is not an object
/// (never: [`build_request`] wrote it) is left as it is.
pub fn with_top_k(body: &mut Vec<u8>, top_k: u64) {
    let Ok(Value::Object(mut request)) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let config = request.entry("generationConfig").or_insert_with(|| json!({}));
    if let Some(config) = config.as_object_mut() {
        config.insert("topK".into(), top_k.into());
    }
    if let Ok(bytes) = serde_json::to_vec(&Value::Object(request)) {
        *body = bytes;
    }
}

/// What a count must hold.
#[derive(Deserialize)]
struct Count {
    #[serde(rename = "totalTokens")]
    total_tokens: u64,
}

/// Gemini's count (`{"totalTokens": N, ...}`) as Anthropic's
/// (`{"input_tokens": N}`); `Err` says why it is not one.
pub fn count_answer(body: &[u8]) -> Result<Vec<u8>, String> {
    let count: Count = serde_json::from_slice(body).map_err(|e| format!("body is not a Gemini token count: {e}"))?;
    Ok(format!("{{\"input_tokens\":{}}}", count.total_tokens).into_bytes())
}

fn encode_failed() -> ApiError {
    ApiError::new(
        500,
        ErrorType::Upstream,
        "internal_error",
        "The request could not be encoded.",
    )
}

/// The model name as one path segment: the client chose it, so `/`, `?`,
/// `#` and `..` must not steer the request elsewhere.
fn path_segment(model: &str) -> String {
    let mut out = String::with_capacity(model.len());
    for b in model.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.bytes().all(|b| b == b'.') {
        return out.replace('.', "%2E");
    }
    out
}

/// Gemini 3 refuses function calls in the history that lack a thought
/// signature; earlier models take them without.
fn needs_signatures(model: &str) -> bool {
    model.contains("gemini-3")
}

/// `systemInstruction` parts and the `contents`.
fn conversation(messages: &[Message<'_>], signatures: bool) -> Result<(Vec<Value>, Vec<Value>), ApiError> {
    let mut system = Vec::new();
    let mut turns: Vec<(&str, Vec<Value>)> = Vec::new();
    for message in messages {
        let (role, parts) = match message {
            Message::System(text) => {
                if !text.is_empty() {
                    system.push(json!({"text": text}));
                }
                continue;
            }
            Message::User(parts) => {
                let mut out = Vec::with_capacity(parts.len());
                for part in parts {
                    out.extend(user_part(part)?);
                }
                ("user", out)
            }
            Message::Assistant { text, calls } => {
                let mut parts = Vec::with_capacity(calls.len() + 1);
                if !text.is_empty() {
                    parts.push(json!({"text": text}));
                }
                for call in calls {
                    let mut part = json!({"functionCall": {"name": call.name, "args": call.arguments}});
                    if let (Some(signature), Some(map)) = (signature_of(call.id), part.as_object_mut()) {
                        map.insert("thoughtSignature".into(), signature.into());
                    }
                    parts.push(part);
                }
                ("model", parts)
            }
            Message::Tool {
                index, name, content, ..
            } => {
                let Some(name) = name else {
                    return Err(bad_value(
                        &format!("messages.{index}.tool_call_id"),
                        "must be the id of a tool call in an earlier assistant message",
                    ));
                };
                let response = match crate::json::dom::parse(content) {
                    Ok(object @ Value::Object(_)) => object,
                    _ => json!({"result": content}),
                };
                (
                    "user",
                    vec![json!({"functionResponse": {"name": name, "response": response}})],
                )
            }
        };
        // The API refuses a content without parts.
        if parts.is_empty() {
            continue;
        }
        match turns.last_mut() {
            Some((last, merged)) if *last == role => merged.extend(parts),
            _ => turns.push((role, parts)),
        }
    }
    if signatures {
        for (_, parts) in turns.iter_mut().filter(|(role, _)| *role == "model") {
            let calls = || parts.iter().filter(|p| p.get("functionCall").is_some());
            if calls().all(|p| p.get("thoughtSignature").is_none())
                && let Some(Value::Object(first)) = parts.iter_mut().find(|p| p.get("functionCall").is_some())
            {
                first.insert("thoughtSignature".into(), SKIP_SIGNATURE.into());
            }
        }
    }
    let contents = turns
        .into_iter()
        .map(|(role, parts)| json!({"role": role, "parts": parts}))
        .collect();
    Ok((system, contents))
}

fn user_part(part: &Part<'_>) -> Result<Option<Value>, ApiError> {
    match part {
        // The API refuses an empty text part.
        Part::Text("") => Ok(None),
        Part::Text(text) => Ok(Some(json!({"text": text}))),
        Part::Image {
            source: ImageSource::Inline { media_type, data },
            ..
        } => Ok(Some(json!({"inlineData": {"mimeType": media_type, "data": data}}))),
        Part::Image {
            source: ImageSource::Url(url),
            param,
        } => {
            let Some(mime_type) = url_type(url) else {
                return Err(bad_value(
                    param,
                    "must be a base64 data URL, or a URL ending in .png, .jpg, .jpeg, .webp, .heic, .heif or .pdf, for this provider",
                ));
            };
            Ok(Some(json!({"fileData": {"mimeType": mime_type, "fileUri": url}})))
        }
    }
}

/// The media type of a URL's file, from its extension.
fn url_type(url: &str) -> Option<&'static str> {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    let name = path.rsplit('/').next().unwrap_or(path);
    let (_, ext) = name.rsplit_once('.')?;
    let ext = ext.to_ascii_lowercase();
    URL_TYPES.iter().find(|(e, _)| *e == ext).map(|(_, t)| *t)
}

fn generation_config(body: &Map<String, Value>) -> Map<String, Value> {
    let mut config = Map::new();
    if let Some(max) = chat::max_tokens(body) {
        config.insert("maxOutputTokens".into(), max.into());
    }
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "topP"),
        ("presence_penalty", "presencePenalty"),
        ("frequency_penalty", "frequencyPenalty"),
    ] {
        if let Some(x) = chat::number(body, from) {
            config.insert(to.into(), json!(x));
        }
    }
    let stop = chat::stop(body);
    if !stop.is_empty() {
        config.insert("stopSequences".into(), json!(stop));
    }
    let n = chat::n(body);
    if n > 1 {
        config.insert("candidateCount".into(), n.into());
    }
    if let Some(seed) = seed(body) {
        config.insert("seed".into(), seed.into());
    }
    if let Some(budget) = body
        .get("reasoning_effort")
        .and_then(Value::as_str)
        .and_then(thinking_budget)
    {
        // The thoughts come back too (as `reasoning_content`): a client that
        // asked for an effort shows them (the Messages API's thinking blocks).
        config.insert(
            "thinkingConfig".into(),
            json!({"thinkingBudget": budget, "includeThoughts": true}),
        );
    }
    match chat::response_format(body) {
        ResponseFormat::Text => {}
        ResponseFormat::JsonObject | ResponseFormat::JsonSchema(None) => {
            config.insert("responseMimeType".into(), "application/json".into());
        }
        ResponseFormat::JsonSchema(Some(schema)) => {
            config.insert("responseMimeType".into(), "application/json".into());
            config.insert("responseJsonSchema".into(), schema.clone());
        }
    }
    config
}

/// Gemini's thinking budget (tokens) for chat's `reasoning_effort`: the
/// middle of the Messages API's band for each effort
/// (docs/contract.md "The Messages API"); `None` for an effort Gemini has no
/// budget for (`none`, or a value of a later OpenAI).
fn thinking_budget(effort: &str) -> Option<u64> {
    match effort {
        "minimal" | "low" => Some(1024),
        "medium" => Some(8192),
        "high" => Some(24576),
        _ => None,
    }
}

/// OpenAI's seed is 64-bit, Gemini's 32-bit: a seed that does not fit keeps
/// its low 31 bits, so the same seed still means the same sampling.
fn seed(body: &Map<String, Value>) -> Option<i32> {
    let seed = body.get("seed")?;
    let wide = seed
        .as_i64()
        .or_else(|| seed.as_u64().map(|u| (u & 0x7fff_ffff) as i64))?;
    Some(i32::try_from(wide).unwrap_or((wide & 0x7fff_ffff) as i32))
}

fn insert_tools(body: &Map<String, Value>, out: &mut Map<String, Value>) -> Result<(), ApiError> {
    let tools = chat::tools(body)?;
    let choice = chat::tool_choice(body)?;
    if tools.is_empty() {
        return Ok(());
    }
    let declarations: Vec<Value> = tools
        .iter()
        .map(|f| {
            let mut d = Map::new();
            d.insert("name".into(), f.name.into());
            if let Some(description) = f.description {
                d.insert("description".into(), description.into());
            }
            if let Some(schema) = f.parameters {
                d.insert("parametersJsonSchema".into(), schema.clone());
            }
            Value::Object(d)
        })
        .collect();
    out.insert("tools".into(), json!([{"functionDeclarations": declarations}]));
    let config = match choice {
        None => None,
        Some(ToolChoice::Auto) => Some(json!({"mode": "AUTO"})),
        Some(ToolChoice::None) => Some(json!({"mode": "NONE"})),
        Some(ToolChoice::Required) => Some(json!({"mode": "ANY"})),
        Some(ToolChoice::Named(name)) => Some(json!({"mode": "ANY", "allowedFunctionNames": [name]})),
    };
    if let Some(config) = config {
        out.insert("toolConfig".into(), json!({"functionCallingConfig": config}));
    }
    Ok(())
}

// ---- tool call ids --------------------------------------------------------------

/// The id of the `k`th function call of a candidate. `tag` is alphanumeric,
/// so the parts split unambiguously on `_`.
fn call_id(tag: &str, k: u64, signature: Option<&str>) -> String {
    match signature {
        None => format!("call_{tag}_{k}"),
        Some(signature) => {
            let url_safe: String = signature
                .chars()
                .filter(|c| *c != '=')
                .map(|c| match c {
                    '+' => '-',
                    '/' => '_',
                    c => c,
                })
                .collect();
            format!("call_{tag}_{k}_{url_safe}")
        }
    }
}

/// The thought signature an id made by [`call_id`] carries, as Gemini sent it.
fn signature_of(id: &str) -> Option<String> {
    let mut pieces = id.strip_prefix("call_")?.splitn(3, '_');
    let (tag, k, signature) = (pieces.next()?, pieces.next()?, pieces.next()?);
    let ours = !tag.is_empty()
        && tag.bytes().all(|b| b.is_ascii_alphanumeric())
        && !k.is_empty()
        && k.bytes().all(|b| b.is_ascii_digit());
    if !ours || signature.is_empty() {
        return None;
    }
    let mut standard: String = signature
        .chars()
        .map(|c| match c {
            '-' => '+',
            '_' => '/',
            c => c,
        })
        .collect();
    while !standard.len().is_multiple_of(4) {
        standard.push('=');
    }
    Some(standard)
}

/// The id tag of one candidate of one answer.
fn tag(response_id: Option<&str>, candidate: u64) -> String {
    let mut tag: String = response_id
        .unwrap_or("gemini")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    if candidate > 0 {
        tag.push_str(&format!("c{candidate}"));
    }
    if tag.is_empty() {
        tag.push_str("gemini");
    }
    tag
}

// ---- wire types -----------------------------------------------------------------

/// A `GenerateContentResponse` (the whole answer, or one stream chunk).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireResponse {
    candidates: Option<Vec<Candidate>>,
    prompt_feedback: Option<PromptFeedback>,
    usage_metadata: Option<UsageMetadata>,
    response_id: Option<String>,
    /// Whether the body has an `error` member at all (even `null`): then it
    /// is an error, whatever else it holds.
    #[serde(default, deserialize_with = "member_present")]
    error: bool,
}

fn member_present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    serde::de::IgnoredAny::deserialize(d).map(|_| true)
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Candidate {
    content: Option<Content>,
    finish_reason: Option<String>,
    index: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Content {
    #[serde(default)]
    parts: Vec<WirePart>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WirePart {
    text: Option<String>,
    /// A thought summary: not part of the answer.
    #[serde(default)]
    thought: bool,
    function_call: Option<FunctionCall>,
    thought_signature: Option<String>,
}

#[derive(Debug, Deserialize)]
struct FunctionCall {
    name: String,
    args: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PromptFeedback {
    block_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct UsageMetadata {
    prompt_token_count: Option<u64>,
    tool_use_prompt_token_count: Option<u64>,
    candidates_token_count: Option<u64>,
    thoughts_token_count: Option<u64>,
}

impl UsageMetadata {
    /// Thinking tokens are billed as output, so they count as completion.
    fn usage(&self) -> Usage {
        let sum = |a: Option<u64>, b: Option<u64>| a.unwrap_or(0).saturating_add(b.unwrap_or(0));
        Usage {
            prompt_tokens: sum(self.prompt_token_count, self.tool_use_prompt_token_count),
            completion_tokens: sum(self.candidates_token_count, self.thoughts_token_count),
        }
    }
}

/// Contract §6 mapping; a function call makes a `STOP` a `tool_calls`.
fn finish_reason(reason: &str, has_calls: bool) -> &'static str {
    match reason {
        "STOP" if has_calls => "tool_calls",
        "MAX_TOKENS" => "length",
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => "content_filter",
        _ => "stop",
    }
}

/// What one candidate (or one chunk of it) says.
struct Said {
    text: Option<String>,
    /// Its thought summaries (parts marked `thought`), asked for with an effort.
    thoughts: Option<String>,
    calls: Vec<Value>,
}

/// Reads the parts of candidate `index` of the answer `response_id`; tool
/// call ids continue from `first_call`.
fn read_parts(parts: &[WirePart], (response_id, index): (Option<&str>, u64), first_call: u64, stream: bool) -> Said {
    let mut said = Said {
        text: None,
        thoughts: None,
        calls: Vec::new(),
    };
    // Only tool calls need the tag: most chunks are text.
    let mut call_tag: Option<String> = None;
    for part in parts {
        if let Some(call) = &part.function_call {
            let k = first_call + said.calls.len() as u64;
            let args = call.args.clone().unwrap_or_else(|| json!({}));
            let tag = call_tag.get_or_insert_with(|| tag(response_id, index));
            let id = call_id(tag, k, part.thought_signature.as_deref());
            let mut value = chat::tool_call(&id, &call.name, args.to_string());
            if stream && let Some(map) = value.as_object_mut() {
                map.insert("index".into(), k.into());
            }
            said.calls.push(value);
        } else if let Some(text) = &part.text {
            let said_as = if part.thought {
                &mut said.thoughts
            } else {
                &mut said.text
            };
            said_as.get_or_insert_with(String::new).push_str(text);
        }
    }
    said
}

// ---- answers --------------------------------------------------------------------

/// Translates a `GenerateContentResponse` into a `chat.completion`.
pub fn translate_answer(request: &ParsedRequest, body: &[u8]) -> Result<(Value, Usage), String> {
    let response: WireResponse =
        crate::json::from_bytes(body).map_err(|e| format!("body is not a Gemini response: {e}"))?;
    let usage = response
        .usage_metadata
        .as_ref()
        .map(UsageMetadata::usage)
        .unwrap_or_default();
    let candidates = response.candidates.unwrap_or_default();
    if candidates.is_empty() {
        // A refused prompt has no candidates, only the reason.
        if response.prompt_feedback.is_some_and(|f| f.block_reason.is_some()) {
            let n = chat::n(request.body().map_err(|e| e.message)?);
            let choices = (0..n.min(MAX_CANDIDATES))
                .map(|i| chat::choice(i, None, Vec::new(), "content_filter"))
                .collect();
            return Ok((chat::completion(choices), usage));
        }
        return Err("answer has no candidates".into());
    }
    let mut choices: Vec<(u64, Value)> = candidates
        .iter()
        .enumerate()
        .map(|(position, c)| {
            let index = c.index.unwrap_or(position as u64);
            let parts = c.content.as_ref().map(|c| c.parts.as_slice()).unwrap_or_default();
            let said = read_parts(parts, (response.response_id.as_deref(), index), 0, false);
            let finish = finish_reason(c.finish_reason.as_deref().unwrap_or("STOP"), !said.calls.is_empty());
            let mut choice = chat::choice(index, said.text, said.calls, finish);
            if let (Some(thoughts), Some(message)) =
                (said.thoughts, choice.get_mut("message").and_then(Value::as_object_mut))
            {
                message.insert("reasoning_content".into(), thoughts.into());
            }
            (index, choice)
        })
        .collect();
    // Candidates are few (one, unless the request asked for more): an
    // insertion sort keeps the module free of the standard sorts' code.
    for i in 1..choices.len() {
        let mut j = i;
        while j > 0 && choices.get(j - 1).map(|c| c.0) > choices.get(j).map(|c| c.0) {
            choices.swap(j - 1, j);
            j -= 1;
        }
    }
    let choices = choices.into_iter().map(|(_, c)| c).collect();
    Ok((chat::completion(choices), usage))
}

// ---- streams ----------------------------------------------------------------------

/// Gemini's `alt=sse` stream: every event is a `GenerateContentResponse`.
/// Text parts become content deltas, function calls whole tool call deltas
/// (Gemini sends them complete), `finishReason` the finish chunk and
/// `usageMetadata` the usage. Gemini has no terminal event: once every
/// candidate has finished, the stream is done; an upstream that closes
/// before that was cut, and the rewriter reports it.
pub struct GeminiStream {
    /// `n`: how many candidates must finish.
    expected: u64,
    candidates: Vec<CandidateState>,
}

#[derive(Default, Clone)]
struct CandidateState {
    calls: u64,
    finished: bool,
}

impl GeminiStream {
    pub fn new(request: &ParsedRequest) -> Self {
        GeminiStream {
            // Built when the request was: the body was read then.
            expected: request.body().map_or(1, chat::n).clamp(1, MAX_CANDIDATES),
            candidates: Vec::new(),
        }
    }

    fn state(&mut self, index: u64) -> Option<&mut CandidateState> {
        let at = usize::try_from(index).ok()?;
        // Candidate indexes come from the provider: bound what they can grow.
        if index >= MAX_CANDIDATES {
            return None;
        }
        if self.candidates.len() <= at {
            self.candidates.resize(at + 1, CandidateState::default());
        }
        self.candidates.get_mut(at)
    }

    fn all_finished(&self) -> bool {
        let finished = self.candidates.iter().filter(|c| c.finished).count() as u64;
        finished >= self.expected
    }
}

impl StreamTranslator for GeminiStream {
    fn on_event(&mut self, event: &SseEvent<'_>, items: &mut Vec<StreamItem>) {
        // Read straight into the wire type; an error event, or one that
        // does not read, goes through a DOM to say which it is.
        let response = match serde_json::from_str::<WireResponse>(event.data) {
            Ok(response) if !response.error => response,
            _ => {
                let value = match json_event(event.data) {
                    Ok(value) => value,
                    Err(error) => return items.push(StreamItem::Error(error)),
                };
                let Ok(response) = serde_json::from_value::<WireResponse>(value) else {
                    items.push(StreamItem::Error(interrupted(
                        "The provider sent a chunk that is not a Gemini response.",
                    )));
                    return;
                };
                response
            }
        };
        if let Some(usage) = &response.usage_metadata {
            items.push(StreamItem::Usage(usage.usage()));
        }
        let candidates = response.candidates.unwrap_or_default();
        if candidates.is_empty() && response.prompt_feedback.is_some_and(|f| f.block_reason.is_some()) {
            for index in 0..self.expected {
                items.push(StreamItem::Finish {
                    index,
                    reason: "content_filter",
                });
            }
            items.push(StreamItem::Done);
            return;
        }
        for (position, candidate) in candidates.iter().enumerate() {
            let index = candidate.index.unwrap_or(position as u64);
            let Some(state) = self.state(index) else {
                continue;
            };
            if state.finished {
                continue;
            }
            let parts = candidate
                .content
                .as_ref()
                .map(|c| c.parts.as_slice())
                .unwrap_or_default();
            let said = read_parts(parts, (response.response_id.as_deref(), index), state.calls, true);
            state.calls += said.calls.len() as u64;
            let text = said.text.filter(|t| !t.is_empty());
            let thoughts = said.thoughts.filter(|t| !t.is_empty());
            if said.calls.is_empty() && thoughts.is_none() {
                if let Some(text) = text {
                    items.push(StreamItem::Content { index, text });
                }
            } else {
                let mut delta = Map::new();
                if let Some(thoughts) = thoughts {
                    delta.insert("reasoning_content".into(), thoughts.into());
                }
                if let Some(text) = text {
                    delta.insert("content".into(), text.into());
                }
                if !said.calls.is_empty() {
                    delta.insert("tool_calls".into(), Value::Array(said.calls));
                }
                items.push(StreamItem::Chunk(chat::chunk(index, Value::Object(delta), None)));
            }
            if let Some(reason) = &candidate.finish_reason {
                state.finished = true;
                let finish = finish_reason(reason, state.calls > 0);
                items.push(StreamItem::Finish { index, reason: finish });
            }
        }
        if self.all_finished() {
            items.push(StreamItem::Done);
        }
    }
}

// ---- errors ---------------------------------------------------------------------

/// `{"error":{"code":429,"message":"...","status":"RESOURCE_EXHAUSTED"}}`:
/// the code is the `status` string. (`streamGenerateContent` without
/// `alt=sse` wraps it in an array.)
pub fn error_details(body: &[u8]) -> ErrorDetails {
    let Ok(value) = crate::json::dom::parse_slice(body) else {
        return ErrorDetails::default();
    };
    let value = match &value {
        Value::Array(items) => items.first().unwrap_or(&Value::Null),
        other => other,
    };
    let error = value.get("error").unwrap_or(&Value::Null);
    let text = |k: &str| error.get(k).and_then(Value::as_str).map(str::to_string);
    ErrorDetails {
        code: text("status"),
        message: text("message"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::providers::chat::tests::{chat, chunks, replay, streamed_text, streamed_tool_calls};
    use crate::request::{Operation, parse};

    const SIGNATURE: &str = "CloBvj72+4/aTlyeodvVsF6WQseQLaqynO0Ocu6hCxSIV1rJCGFv67dtpjtFqWaborKte+82ZXWG2DaoPZaL+k7ONU3tUVwUXH0yI3ADtb46NJAqGWp2V/Ht3uMKhQEBvj72+53r7rtJS2JS+RSr/gNHTgRy4DDPTPtEEj+K6F4GFNMQEXVmXPYPa87j/74GGwi14Qwvde1kfemWz/+cRwpf2EDDKELVYuZ56LWb6pmPj4kyXPBERjn3dCiTrAhaysdd21dD0/t3xSXCKNFbPTDjK6IeGzqAGRFeL5D37oKPrh2N";

    fn provider() -> Provider {
        let json = r#"{"providers":[{"id":"gem","api":"gemini","cluster":"c","authority":"h","api_key":"g-key"}]}"#;
        Provider::clone(&Config::parse(json.as_bytes(), &|_| None).unwrap().providers[0])
    }

    fn build_for(body: Value, model: &str) -> Result<Value, ApiError> {
        let up = build_request(&provider(), &chat(body), model, "waygate")?;
        Ok(serde_json::from_slice(&up.body).unwrap())
    }

    fn build(body: Value) -> Result<Value, ApiError> {
        build_for(body, "gemini-2.5-flash")
    }

    fn fixture(bytes: &[u8]) -> Value {
        serde_json::from_slice(bytes).unwrap()
    }

    fn hi() -> Value {
        json!({"model": "gem/x", "messages": [{"role": "user", "content": "hi"}]})
    }

    fn answer(body: Value, bytes: &[u8]) -> Result<(Value, Usage), String> {
        translate_answer(&chat(body), bytes)
    }

    fn stream(body: &Value, input: &[u8], include_usage: bool) -> Vec<String> {
        let req = chat(body.clone());
        replay(Operation::Chat, include_usage, input, &|| {
            Box::new(GeminiStream::new(&req))
        })
    }

    fn weather() -> Value {
        json!([{"type": "function", "function": {"name": "weather",
            "description": "Get weather information for a location",
            "parameters": {"properties": {"location": {"description": "the city", "type": "string"}},
                "required": ["location"], "type": "object"}}}])
    }

    // ---- requests

    #[test]
    fn the_recorded_simple_request_is_what_a_chat_request_becomes() {
        let req = chat(json!({"model": "gem/x", "max_tokens": 4000, "messages": [
            {"role": "system", "content": "You are a helpful assistant"},
            {"role": "user", "content": "Say hi in Portuguese"}]}));
        let up = build_request(&provider(), &req, "gemini-2.5-flash", "waygate").unwrap();
        assert_eq!(up.path, "/v1beta/models/gemini-2.5-flash:generateContent");
        assert_eq!(up.headers, vec![("x-goog-api-key".to_string(), "g-key".to_string())]);
        assert_eq!(
            serde_json::from_slice::<Value>(&up.body).unwrap(),
            fixture(include_bytes!(
                "../../tests/fixtures/gemini/generate_content.request.json"
            ))
        );
    }

    #[test]
    fn streams_use_the_sse_method_and_the_model_is_one_path_segment() {
        let mut b = hi();
        b["stream"] = json!(true);
        let up = build_request(&provider(), &chat(b), "models/gemini-2.5-flash", "waygate").unwrap();
        assert_eq!(up.path, "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse");
        let up = build_request(&provider(), &chat(hi()), "../../x?key=1#", "waygate").unwrap();
        assert_eq!(up.path, "/v1beta/models/..%2F..%2Fx%3Fkey%3D1%23:generateContent");
        let up = build_request(&provider(), &chat(hi()), "..", "waygate").unwrap();
        assert_eq!(up.path, "/v1beta/models/%2E%2E:generateContent");
    }

    /// The recorded tool requests, with the schema left out of the
    /// comparison: the recording's client converted it to the OpenAPI
    /// subset (`parameters`), the gateway passes JSON Schema unchanged
    /// (`parametersJsonSchema`).
    fn without_schemas(mut v: Value) -> Value {
        if let Some(d) = v
            .pointer_mut("/tools/0/functionDeclarations/0")
            .and_then(Value::as_object_mut)
        {
            d.remove("parameters");
            d.remove("parametersJsonSchema");
        }
        v
    }

    #[test]
    fn the_recorded_tool_requests_are_what_chat_tool_requests_become() {
        let first = json!({"model": "gem/x", "max_tokens": 4000, "tools": weather(), "tool_choice": "auto",
            "messages": [
                {"role": "system", "content": "You are a helpful assistant"},
                {"role": "user", "content": "What's the weather in Florence,Italy?"}]});
        let got = build(first.clone()).unwrap();
        assert_eq!(
            got["tools"][0]["functionDeclarations"][0]["parametersJsonSchema"],
            weather()[0]["function"]["parameters"]
        );
        assert_eq!(
            without_schemas(got),
            without_schemas(fixture(include_bytes!(
                "../../tests/fixtures/gemini/generate_content_function_call.request.json"
            )))
        );

        // The second turn sends back the id this module gave the call, with
        // the recorded signature inside.
        let (answer, _) = answer(
            first.clone(),
            include_bytes!("../../tests/fixtures/gemini/generate_content_function_call.json"),
        )
        .unwrap();
        let call = answer["choices"][0]["message"]["tool_calls"][0].clone();
        let mut second = first;
        let history = second["messages"].as_array_mut().unwrap();
        history.push(json!({"role": "assistant", "content": null, "tool_calls": [call.clone()]}));
        history.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "40 C"}));
        let mut expected = fixture(include_bytes!(
            "../../tests/fixtures/gemini/generate_content_function_response.request.json"
        ));
        // The recording's client numbered its calls; Gemini's own ids are optional.
        for part in [
            "/contents/1/parts/0/functionCall",
            "/contents/2/parts/0/functionResponse",
        ] {
            expected
                .pointer_mut(part)
                .unwrap()
                .as_object_mut()
                .unwrap()
                .remove("id");
        }
        assert_eq!(without_schemas(build(second).unwrap()), without_schemas(expected));
    }

    #[test]
    fn generation_parameters_are_mapped() {
        let mut b = hi();
        for (k, v) in [
            ("max_completion_tokens", json!(50)),
            ("temperature", json!(1.5)),
            ("top_p", json!(0.9)),
            ("stop", json!(["END", "STOP"])),
            ("n", json!(2)),
            ("seed", json!(42)),
            ("presence_penalty", json!(0.5)),
            ("frequency_penalty", json!(-0.5)),
            ("user", json!("u-1")),
            ("response_format", json!({"type": "json_object"})),
            ("waygate", json!({"routing": {}})),
        ] {
            b[k] = v;
        }
        let got = build(b).unwrap();
        assert_eq!(
            got["generationConfig"],
            json!({"maxOutputTokens": 50, "temperature": 1.5, "topP": 0.9, "stopSequences": ["END", "STOP"],
                "candidateCount": 2, "seed": 42, "presencePenalty": 0.5, "frequencyPenalty": -0.5,
                "responseMimeType": "application/json"})
        );
        assert_eq!(
            got.as_object().unwrap().keys().collect::<Vec<_>>(),
            vec!["contents", "generationConfig"],
            "user and the routing field are not sent"
        );
        let mut b = hi();
        b["seed"] = json!(i64::MAX);
        assert_eq!(build(b).unwrap()["generationConfig"]["seed"], 0x7fff_ffff);
    }

    #[test]
    fn a_json_schema_goes_as_json_schema() {
        let schema = json!({"type": "object", "properties": {"a": {"type": ["string", "null"]}},
            "additionalProperties": false});
        let mut b = hi();
        b["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": schema}});
        let got = build(b).unwrap();
        assert_eq!(
            got["generationConfig"],
            json!({"responseMimeType": "application/json", "responseJsonSchema": schema})
        );
    }

    #[test]
    fn logprobs_is_refused() {
        let mut b = hi();
        b["logprobs"] = json!(true);
        let e = build(b).unwrap_err();
        assert_eq!(
            (e.code.as_str(), e.param.as_deref()),
            ("unsupported_parameter", Some("logprobs"))
        );
    }

    #[test]
    fn turns_alternate_and_system_messages_become_the_instruction() {
        let got = build(json!({"model": "a/b", "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "one"},
            {"role": "user", "content": [{"type": "text", "text": ""}, {"type": "text", "text": "two"}]},
            {"role": "system", "content": "Use French."},
            {"role": "assistant", "content": "a"},
            {"role": "assistant", "content": "b"},
        ]}))
        .unwrap();
        assert_eq!(
            got["systemInstruction"],
            json!({"parts": [{"text": "Be brief."}, {"text": "Use French."}], "role": "user"})
        );
        assert_eq!(
            got["contents"],
            json!([{"role": "user", "parts": [{"text": "one"}, {"text": "two"}]},
                {"role": "model", "parts": [{"text": "a"}, {"text": "b"}]}])
        );
    }

    #[test]
    fn parallel_calls_and_their_responses_pair_up() {
        let got = build(json!({"model": "a/b", "messages": [
            {"role": "user", "content": "2 and 3?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_R1_0", "type": "function", "function": {"name": "add", "arguments": "{\"a\":2,\"b\":3}"}},
                {"id": "call_R1_1", "type": "function", "function": {"name": "multiply", "arguments": ""}}]},
            {"role": "tool", "tool_call_id": "call_R1_1", "content": "{\"product\": 6}"},
            {"role": "tool", "tool_call_id": "call_R1_0", "content": "5"},
        ]}))
        .unwrap();
        assert_eq!(
            got["contents"][1],
            json!({"role": "model", "parts": [
                {"functionCall": {"name": "add", "args": {"a": 2, "b": 3}}},
                {"functionCall": {"name": "multiply", "args": {}}}]})
        );
        assert_eq!(
            got["contents"][2],
            json!({"role": "user", "parts": [
                {"functionResponse": {"name": "multiply", "response": {"product": 6}}},
                {"functionResponse": {"name": "add", "response": {"result": "5"}}}]})
        );
    }

    #[test]
    fn a_tool_message_must_answer_a_known_call() {
        let e = build(json!({"model": "a/b", "messages": [
            {"role": "user", "content": "x"},
            {"role": "tool", "tool_call_id": "call_nobody", "content": "5"}]}))
        .unwrap_err();
        assert_eq!(
            (e.code.as_str(), e.param.as_deref()),
            ("invalid_value", Some("messages.1.tool_call_id"))
        );
    }

    #[test]
    fn gemini_3_history_gets_a_signature_on_each_call_turn() {
        let convo = json!({"model": "a/b", "messages": [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "toolu_from_claude", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "toolu_other", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "toolu_from_claude", "content": "1"},
            {"role": "tool", "tool_call_id": "toolu_other", "content": "2"}]});
        let got = build_for(convo.clone(), "gemini-3-flash-preview").unwrap();
        let parts = &got["contents"][1]["parts"];
        assert_eq!(parts[0]["thoughtSignature"], SKIP_SIGNATURE);
        assert!(parts[1].get("thoughtSignature").is_none());
        let got = build_for(convo, "gemini-2.5-flash").unwrap();
        assert!(got["contents"][1]["parts"][0].get("thoughtSignature").is_none());
    }

    #[test]
    fn signatures_survive_the_round_trip_through_the_id() {
        let id = call_id("XQCzaYWvIqfRz7IPupTlyAk", 0, Some(SIGNATURE));
        assert!(
            id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "{id}"
        );
        assert_eq!(signature_of(&id).as_deref(), Some(SIGNATURE));
        assert_eq!(signature_of(&call_id("abc", 3, Some("YQ=="))).as_deref(), Some("YQ=="));
        assert_eq!(signature_of(&call_id("abc", 3, None)), None);
        assert_eq!(signature_of("call_abc123"), None);
        assert_eq!(signature_of("call_a-b_1_x"), None);
    }

    #[test]
    fn images_become_inline_data_or_file_data() {
        let got = build(json!({"model": "a/b", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Compare"},
            {"type": "image_url", "image_url": {"url": "data:image/webp;base64,UklGRg=="}},
            {"type": "image_url", "image_url": {"url": "https://example.com/a/cat.JPG?size=large"}}]}]}))
        .unwrap();
        assert_eq!(
            got["contents"][0]["parts"],
            json!([{"text": "Compare"},
                {"inlineData": {"mimeType": "image/webp", "data": "UklGRg=="}},
                {"fileData": {"mimeType": "image/jpeg", "fileUri": "https://example.com/a/cat.JPG?size=large"}}])
        );
        let e = build(json!({"model": "a/b", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"},
            {"type": "image_url", "image_url": {"url": "https://example.com/image"}}]}]}))
        .unwrap_err();
        assert_eq!(
            (e.status, e.code.as_str(), e.param.as_deref()),
            (400, "invalid_value", Some("messages.0.content.1.image_url.url"))
        );
    }

    #[test]
    fn tool_choice_maps_to_function_calling_modes() {
        for (choice, expected) in [
            (json!("auto"), json!({"mode": "AUTO"})),
            (json!("none"), json!({"mode": "NONE"})),
            (json!("required"), json!({"mode": "ANY"})),
            (
                json!({"type": "function", "function": {"name": "weather"}}),
                json!({"mode": "ANY", "allowedFunctionNames": ["weather"]}),
            ),
        ] {
            let mut b = hi();
            b["tools"] = weather();
            b["tool_choice"] = choice;
            assert_eq!(build(b).unwrap()["toolConfig"]["functionCallingConfig"], expected);
        }
        let mut b = hi();
        b["tools"] = json!([{"type": "function", "function": {"name": "ping"}}]);
        assert_eq!(
            build(b).unwrap()["tools"],
            json!([{"functionDeclarations": [{"name": "ping"}]}])
        );
    }

    #[test]
    fn legacy_prompts_become_one_user_turn() {
        let req = parse(
            Operation::Completions,
            br#"{"model":"a/b","prompt":"Say hi","max_tokens":5}"#,
        )
        .unwrap();
        let up = build_request(&provider(), &req, "gemini-2.5-flash", "waygate").unwrap();
        let got: Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(
            got["contents"],
            json!([{"role": "user", "parts": [{"text": "Say hi"}]}])
        );
        assert_eq!(got["generationConfig"], json!({"maxOutputTokens": 5}));
    }

    // ---- answers

    #[test]
    fn the_recorded_text_answer_translates_with_thinking_tokens_as_completion() {
        let (v, usage) = answer(
            hi(),
            include_bytes!("../../tests/fixtures/gemini/generate_content.json"),
        )
        .unwrap();
        assert_eq!(
            v["choices"],
            json!([{"index": 0, "logprobs": null, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Olá!"}}])
        );
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 11,
                completion_tokens: 26
            }
        );
    }

    #[test]
    fn the_recorded_function_call_answer_translates() {
        let (v, usage) = answer(
            hi(),
            include_bytes!("../../tests/fixtures/gemini/generate_content_function_call.json"),
        )
        .unwrap();
        let choice = &v["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert!(choice["message"]["content"].is_null());
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["type"], "function");
        assert_eq!(
            call["function"],
            json!({"name": "weather", "arguments": "{\"location\":\"Florence,Italy\"}"})
        );
        let id = call["id"].as_str().unwrap();
        assert!(id.starts_with("call_"), "{id}");
        assert!(
            signature_of(id)
                .unwrap()
                .starts_with("CvMBAb4+9vvZC/KtDBiEfP1WF+wUiObd6G6yg5vTA8dfeleB3pTysSfmipk")
        );
        assert_eq!(
            usage,
            Usage {
                prompt_tokens: 54,
                completion_tokens: 63
            }
        );
    }

    #[test]
    fn finish_reasons_map_per_the_contract() {
        for (reason, finish) in [
            ("STOP", "stop"),
            ("MAX_TOKENS", "length"),
            ("SAFETY", "content_filter"),
            ("RECITATION", "content_filter"),
            ("BLOCKLIST", "content_filter"),
            ("PROHIBITED_CONTENT", "content_filter"),
            ("SPII", "content_filter"),
            ("OTHER", "stop"),
            ("MALFORMED_FUNCTION_CALL", "stop"),
        ] {
            let body = json!({"candidates": [{"content": {"parts": [{"text": "x"}], "role": "model"},
                "finishReason": reason, "index": 0}]});
            let (v, _) = answer(hi(), body.to_string().as_bytes()).unwrap();
            assert_eq!(v["choices"][0]["finish_reason"], finish, "{reason}");
        }
    }

    #[test]
    fn several_candidates_become_several_choices() {
        let body = json!({"responseId": "r1", "candidates": [
            {"content": {"parts": [{"text": "B"}]}, "finishReason": "STOP", "index": 1},
            {"content": {"parts": [{"thought": true, "text": "thinking..."}, {"text": "A"}]},
                "finishReason": "MAX_TOKENS", "index": 0}],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2}});
        let (v, usage) = answer(hi(), body.to_string().as_bytes()).unwrap();
        assert_eq!(v["choices"][0]["message"]["content"], "A");
        assert_eq!(v["choices"][0]["finish_reason"], "length");
        assert_eq!(v["choices"][1]["index"], 1);
        assert_eq!(v["choices"][1]["message"]["content"], "B");
        assert_eq!(usage.total(), 5);
    }

    #[test]
    fn a_blocked_prompt_is_a_content_filter_answer() {
        let body = br#"{"promptFeedback":{"blockReason":"SAFETY"},"usageMetadata":{"promptTokenCount":7}}"#;
        let (v, usage) = answer(hi(), body).unwrap();
        assert_eq!(
            v["choices"],
            json!([{"index": 0, "logprobs": null, "finish_reason": "content_filter",
                "message": {"role": "assistant", "content": ""}}])
        );
        assert_eq!(usage.prompt_tokens, 7);
    }

    #[test]
    fn a_2xx_that_is_not_a_response_is_an_error() {
        for body in [
            &b"{\n  \"candidates\": [\n    {\n      \"content\": {\n        \"parts\": [\n          {\n            \"text\": \"Hel"[..],
            b"{}",
            b"{\"candidates\": 3}",
        ] {
            assert!(answer(hi(), body).is_err(), "{}", String::from_utf8_lossy(body));
        }
    }

    // ---- streams

    #[test]
    fn the_recorded_text_stream_translates_under_every_chunking() {
        let input = include_bytes!("../../tests/fixtures/gemini/stream_generate_content.sse");
        let events = stream(&hi(), input, true);
        assert_eq!(events.last().unwrap(), "[DONE]");
        let c = chunks(&events);
        assert_eq!(
            c[0]["choices"][0]["delta"],
            json!({"role": "assistant", "content": "The sum of "})
        );
        assert_eq!(
            streamed_text(&c),
            "The sum of 2 and 3 is 5. The product of 2 and 3 is 6."
        );
        assert_eq!(
            c[c.len() - 2]["choices"][0],
            json!({"index": 0, "delta": {}, "finish_reason": "stop"})
        );
        assert_eq!(
            c[c.len() - 1]["usage"],
            json!({"prompt_tokens": 218, "completion_tokens": 22, "total_tokens": 240})
        );
    }

    #[test]
    fn the_recorded_parallel_calls_stream_gives_tool_calls_zero_and_one() {
        let input = include_bytes!("../../tests/fixtures/gemini/stream_generate_content_parallel_function_calls.sse");
        let events = stream(&hi(), input, false);
        let c = chunks(&events);
        let calls = streamed_tool_calls(&c);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["name"], "add");
        assert_eq!(calls[0]["arguments"], "{\"a\":2,\"b\":3}");
        assert_eq!(calls[1]["name"], "multiply");
        assert_eq!(calls[1]["id"], "call_XQCzaYWvIqfRz7IPupTlyAk_1");
        assert!(
            calls[0]["id"]
                .as_str()
                .unwrap()
                .starts_with("call_XQCzaYWvIqfRz7IPupTlyAk_0_CloBvj72-4_aTly")
        );
        assert_eq!(c.last().unwrap()["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(events.last().unwrap(), "[DONE]");
    }

    #[test]
    fn a_stream_without_a_finish_reason_was_cut() {
        let input = include_bytes!("../../tests/fixtures/gemini/stream_generate_content.sse");
        let text = std::str::from_utf8(input).unwrap();
        let cut = text.rfind("data: ").unwrap();
        let events = stream(&hi(), &input[..cut], true);
        assert!(events.last().unwrap().contains("stream_interrupted"), "{events:?}");
        assert!(!events.contains(&"[DONE]".to_string()));
    }

    #[test]
    fn an_error_chunk_ends_the_stream_with_the_contract_error() {
        let input = "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hel\"}],\"role\": \"model\"},\"index\": 0}]}\r\n\r\n\
                     data: {\"error\": {\"code\": 503,\"message\": \"The model is overloaded. Please try again later.\",\"status\": \"UNAVAILABLE\"}}\r\n\r\n";
        let events = stream(&hi(), input.as_bytes(), false);
        let last: Value = serde_json::from_str(events.last().unwrap()).unwrap();
        assert_eq!(last["error"]["code"], "stream_interrupted");
        assert_eq!(
            last["error"]["message"],
            "The model is overloaded. Please try again later."
        );
    }

    #[test]
    fn several_candidates_stream_until_each_has_finished() {
        let mut b = hi();
        b["n"] = json!(2);
        let input = concat!(
            "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"A\"}]},\"index\": 0},{\"content\": {\"parts\": [{\"text\": \"B\"}]},\"index\": 1}]}\r\n\r\n",
            "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"a\"}]},\"finishReason\": \"STOP\",\"index\": 0}]}\r\n\r\n",
            "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"b\"}]},\"finishReason\": \"MAX_TOKENS\",\"index\": 1}],\"usageMetadata\": {\"promptTokenCount\": 2,\"candidatesTokenCount\": 4}}\r\n\r\n",
        );
        let events = stream(&b, input.as_bytes(), true);
        assert_eq!(events.last().unwrap(), "[DONE]");
        let c = chunks(&events);
        let text = |i: u64| -> String {
            c.iter()
                .filter_map(|c| {
                    let choice = &c["choices"][0];
                    (choice["index"] == i).then(|| choice["delta"]["content"].as_str().unwrap_or("").to_string())
                })
                .collect()
        };
        assert_eq!((text(0), text(1)), ("Aa".to_string(), "Bb".to_string()));
        assert_eq!(c[c.len() - 1]["usage"]["total_tokens"], 6);
        // Without the last chunk, candidate 1 never finished: a cut stream.
        let cut = input.rfind("data: ").unwrap();
        let events = stream(&b, &input.as_bytes()[..cut], true);
        assert!(events.last().unwrap().contains("stream_interrupted"));
    }

    #[test]
    fn a_legacy_stream_is_text_only() {
        let req = parse(
            Operation::Completions,
            br#"{"model":"a/b","prompt":"hi","stream":true}"#,
        )
        .unwrap();
        let input = include_bytes!("../../tests/fixtures/gemini/stream_generate_content.sse");
        let events = replay(Operation::Completions, false, input, &|| {
            Box::new(GeminiStream::new(&req))
        });
        let c = chunks(&events);
        assert_eq!(c[0]["object"], "text_completion");
        let text: String = c.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
        assert_eq!(text, "The sum of 2 and 3 is 5. The product of 2 and 3 is 6.");
        assert_eq!(events.last().unwrap(), "[DONE]");
    }

    // ---- errors

    #[test]
    fn the_recorded_error_bodies_are_read() {
        let read = |bytes: &[u8]| {
            let d = error_details(bytes);
            (d.code.unwrap(), d.message.unwrap())
        };
        let (code, message) = read(include_bytes!(
            "../../tests/fixtures/gemini/error_429_resource_exhausted.json"
        ));
        assert_eq!(code, "RESOURCE_EXHAUSTED");
        assert!(message.starts_with("You exceeded your current quota"));
        assert_eq!(
            read(include_bytes!(
                "../../tests/fixtures/gemini/error_400_api_key_invalid.json"
            )),
            (
                "INVALID_ARGUMENT".into(),
                "API key not valid. Please pass a valid API key.".into()
            )
        );
        assert_eq!(
            read(include_bytes!(
                "../../tests/fixtures/gemini/error_403_permission_denied.json"
            ))
            .0,
            "PERMISSION_DENIED"
        );
        assert_eq!(
            read(br#"[{"error":{"code":503,"message":"busy","status":"UNAVAILABLE"}}]"#),
            ("UNAVAILABLE".into(), "busy".into())
        );
        assert_eq!(error_details(b"<html>"), ErrorDetails::default());
    }

    #[test]
    fn a_count_asks_count_tokens_with_the_whole_request_and_reads_total_tokens() {
        let body = json!({"model": "gem/x", "max_tokens": 1,
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]});
        let generate = build_request(&provider(), &chat(body.clone()), "gemini-2.5-flash", "waygate").unwrap();
        let up = count_request(&provider(), &chat(body), "gemini-2.5-flash", "waygate").unwrap();
        assert_eq!(up.path, "/v1beta/models/gemini-2.5-flash:countTokens");
        assert_eq!(up.headers, generate.headers, "the same credential");
        let sent: Value = serde_json::from_slice(&up.body).unwrap();
        let mut expected: Value = serde_json::from_slice(&generate.body).unwrap();
        expected["model"] = "models/gemini-2.5-flash".into();
        assert_eq!(sent, json!({"generateContentRequest": expected}));
        assert!(sent["generateContentRequest"]["systemInstruction"].is_object());
        assert!(sent["generateContentRequest"]["tools"].is_array());
        // As generativelanguage.googleapis.com answers countTokens.
        let answer = br#"{
  "totalTokens": 31,
  "promptTokensDetails": [
    {
      "modality": "TEXT",
      "tokenCount": 31
    }
  ]
}
"#;
        assert_eq!(count_answer(answer).unwrap(), br#"{"input_tokens":31}"#);
        assert!(count_answer(br#"{"candidates": []}"#).is_err());
    }

    #[test]
    fn an_effort_asks_for_a_thinking_budget_and_the_thoughts_come_back_as_reasoning() {
        let mut body = hi();
        body["reasoning_effort"] = "medium".into();
        assert_eq!(
            build(body.clone()).unwrap()["generationConfig"]["thinkingConfig"],
            json!({"thinkingBudget": 8192, "includeThoughts": true})
        );
        let none = build(hi()).unwrap();
        assert!(none.pointer("/generationConfig/thinkingConfig").is_none(), "{none}");
        // A thought summary before the answer (the shape of the thinking docs).
        let (v, _) = answer(
            body.clone(),
            br#"{"candidates": [{"content": {"parts": [{"text": "Two and three.", "thought": true}, {"text": "5"}], "role": "model"}, "finishReason": "STOP", "index": 0}]}"#,
        )
        .unwrap();
        assert_eq!(
            v["choices"][0]["message"],
            json!({"role": "assistant", "content": "5", "reasoning_content": "Two and three."})
        );
        let events = stream(
            &body,
            include_bytes!("../../tests/fixtures/gemini/stream_generate_content_thoughts.sse"),
            false,
        );
        let chunks = chunks(&events);
        let thoughts: String = chunks
            .iter()
            .filter_map(|c| c.pointer("/choices/0/delta/reasoning_content").and_then(Value::as_str))
            .collect();
        assert_eq!(
            thoughts,
            "**Adding and multiplying**\n\nThe user wants the sum and the product of 2 and 3. Both are small: 5 and 6."
        );
        assert_eq!(
            streamed_text(&chunks),
            "The sum of 2 and 3 is 5. The product of 2 and 3 is 6."
        );
    }
}
