//! Provider APIs: one module per wire API, each translating in both
//! directions. Every translator is pure and idempotent: it starts from the
//! client's parsed request each time, so a fallback can re-run it.
//!
//! The contract between this module and the rest of the filter:
//! - [`build_request`] turns the client's request into the provider's;
//! - [`translate_answer`] turns a provider's 2xx body into an OpenAI-shaped
//!   answer (`chat.completion`, or `text_completion` for native legacy);
//! - [`stream_translator`] turns provider SSE events into [`StreamItem`]s;
//! - [`error_details`] reads a provider's error body.
//!
//! [`crate::answer`] and [`crate::stream`] then stamp ids and model names and
//! reshape to what the client asked for.

use serde_json::Value;

use crate::config::{Api, Provider};
use crate::errors::ApiError;
use crate::request::ParsedRequest;
use crate::sse::SseEvent;
use crate::usage::Usage;

pub mod anthropic;
mod chat;
pub mod gemini;
pub mod native;
pub mod openai;

/// What goes upstream: the path (after `path_prefix`), the provider's own
/// headers (credential, version) and the body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamRequest {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// One step of a translated stream.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// A chunk in OpenAI's shape: an object with `choices`, each with a
    /// `delta` (chat) or `text` (native legacy), `index` and `finish_reason`.
    Chunk(Value),
    /// The commonest chunk: choice `index`'s delta is just this text, and
    /// it does not finish. Written without building a chunk's DOM.
    Content { index: u64, text: String },
    /// Choice `index` finishes with `reason`, its delta empty. Written
    /// without a DOM too.
    Finish { index: u64, reason: &'static str },
    /// Usage reported by the provider (the latest one wins).
    Usage(Usage),
    /// The provider's own terminal event.
    Done,
    /// The provider reported a failure mid-stream.
    Error(ApiError),
}

/// Translates provider SSE events.
pub trait StreamTranslator {
    fn on_event(&mut self, event: &SseEvent<'_>, items: &mut Vec<StreamItem>);

    /// Whether the events are OpenAI chat chunks already, which
    /// [`crate::stream`] may copy member by member instead of translating.
    fn passthrough(&self) -> bool {
        false
    }
}

/// A provider's error body, read: its string code and message, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorDetails {
    pub code: Option<String>,
    pub message: Option<String>,
}

/// Builds the provider request for one candidate. An `Err` means this
/// candidate cannot serve the request (contract §6: a parameter the API
/// cannot express without changing the answer's shape).
pub fn build_request(
    provider: &Provider,
    request: &ParsedRequest,
    upstream_model: &str,
    routing_field: &str,
) -> Result<UpstreamRequest, ApiError> {
    match provider.api {
        Api::Openai => openai::build_request(provider, request, upstream_model, routing_field),
        Api::Anthropic => anthropic::build_request(provider, request, upstream_model, routing_field),
        Api::Gemini => gemini::build_request(provider, request, upstream_model, routing_field),
    }
}

/// Translates a 2xx body. `Err` is the reason the body is not a valid answer.
pub fn translate_answer(api: Api, request: &ParsedRequest, body: &[u8]) -> Result<(Value, Usage), String> {
    match api {
        Api::Openai => openai::translate_answer(request, body),
        Api::Anthropic => anthropic::translate_answer(request, body),
        Api::Gemini => gemini::translate_answer(request, body),
    }
}

/// A stream translator for the provider's API, for this request.
pub fn stream_translator(api: Api, request: &ParsedRequest) -> Box<dyn StreamTranslator> {
    match api {
        Api::Openai => Box::new(openai::OpenAiStream),
        Api::Anthropic => Box::new(anthropic::AnthropicStream::new(request)),
        Api::Gemini => Box::new(gemini::GeminiStream::new(request)),
    }
}

/// Reads a provider's error body.
pub fn error_details(api: Api, body: &[u8]) -> ErrorDetails {
    match api {
        Api::Openai => openai::error_details(body),
        Api::Anthropic => anthropic::error_details(body),
        Api::Gemini => gemini::error_details(body),
    }
}
