//! The client's side: the APIs clients call, and how each meets the one
//! internal form.
//!
//! Every request is served in one internal form, OpenAI's chat completion:
//! its request is what [`crate::request`] validates and [`crate::providers`]
//! translates for a provider's API; its answer (`chat.completion`) and its
//! stream (`chat.completion.chunk` events) are what they translate back. An
//! inbound API other than chat is one module here with three parts:
//!
//! - its request, checked and rewritten as a chat request (anything the
//!   internal form cannot carry is refused with a 400 naming the field,
//!   before a provider is asked);
//! - the finished `chat.completion`, rewritten as its answer;
//! - the finished chat stream, rewritten event by event as its stream.
//!
//! Chat completions and legacy completions are the internal form's own
//! endpoints and pass through untouched, so the other APIs cost chat nothing.
//! Each API answers errors in its own envelope ([`ClientApi::error_body`]).

mod chat_stream;
pub mod messages;
pub mod responses;

use serde_json::{Map, Value};

use crate::answer::Stamp;
use crate::config::{Api, Provider};
use crate::errors::{ApiError, ErrorType};
use crate::providers::UpstreamRequest;
use crate::providers::native::{NativeStream, Wire};
use crate::providers::{anthropic, gemini, openai};
use crate::request::{Operation, ParsedRequest};
use crate::stream::StreamRewriter;
use crate::usage::Usage;
use chat_stream::ChatStreamWriter;
use messages::stream::MessagesStream;
use responses::stream::ResponsesStream;

/// A client's body as a JSON object, or the 400 that says why it is not one.
fn read_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|_| invalid_json("Request body is not valid UTF-8."))?;
    match crate::json::dom::parse(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(crate::request::wrong_type("body", "a JSON object")),
        Err(e) => Err(invalid_json(&format!("Request body is not valid JSON: {e}."))),
    }
}

fn invalid_json(message: &str) -> ApiError {
    let mut e = ApiError::bad_request("invalid_json", "body", message);
    e.param = None;
    e
}

/// A rewritten request's body, written.
fn chat_body(chat: Map<String, Value>) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(&Value::Object(chat)).map_err(|_| invalid_json("The body could not be written."))
}

/// The API a client called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientApi {
    /// `POST /chat/completions`: the internal form itself.
    Chat,
    /// `POST /completions`: legacy, served as chat or natively.
    Completions,
    /// `POST /responses`: OpenAI's Responses API, stateless ([`responses`]).
    Responses,
    /// `POST /messages`: Anthropic's Messages API ([`messages`]).
    Messages,
    /// `POST /messages/count_tokens`: counted by a provider that counts
    /// (Anthropic, Gemini), else estimated by the filter.
    CountTokens,
}

impl ClientApi {
    /// The endpoint's path under `base_path`, and its API.
    pub fn from_path(sub: &[u8]) -> Option<ClientApi> {
        match sub {
            b"/chat/completions" => Some(ClientApi::Chat),
            b"/completions" => Some(ClientApi::Completions),
            b"/responses" => Some(ClientApi::Responses),
            b"/messages" => Some(ClientApi::Messages),
            b"/messages/count_tokens" => Some(ClientApi::CountTokens),
            _ => None,
        }
    }

    /// An error in this API's envelope.
    pub fn error_body(self, e: &ApiError) -> Vec<u8> {
        match self {
            ClientApi::Messages | ClientApi::CountTokens => messages::error_body(e),
            ClientApi::Chat | ClientApi::Completions | ClientApi::Responses => e.body(),
        }
    }

    /// The internal operation that serves it.
    pub fn operation(self) -> Operation {
        match self {
            ClientApi::Completions => Operation::Completions,
            ClientApi::Chat | ClientApi::Responses | ClientApi::Messages | ClientApi::CountTokens => Operation::Chat,
        }
    }

    /// The prefix of the id its answers carry.
    pub fn id_prefix(self) -> &'static str {
        match self {
            ClientApi::Chat => "chatcmpl_",
            ClientApi::Completions => "cmpl_",
            ClientApi::Responses => "resp_",
            ClientApi::Messages | ClientApi::CountTokens => "msg_",
        }
    }
}

/// What an answer needs of the client's API, decided with the request.
#[derive(Debug, Clone, PartialEq)]
pub enum Client {
    /// Chat or legacy completions: the internal form's answer is the client's.
    Internal,
    /// The Responses API, and what its answer echoes of the request.
    Responses(Box<responses::Echo>),
    /// The Messages API, and what its answer takes of the request.
    Messages(Box<messages::Asked>),
    /// The Messages API's `count_tokens`: only a provider that counts serves it.
    Count(Box<messages::Counted>),
}

impl Client {
    /// The finished internal answer (a `chat.completion`) in the client's API.
    pub fn answer(&self, stamp: &Stamp, internal: Vec<u8>) -> Result<Vec<u8>, String> {
        match self {
            Client::Internal => Ok(internal),
            Client::Responses(echo) => responses::to_response(echo, stamp, &internal),
            Client::Messages(asked) => messages::to_message(asked, stamp, &internal),
            // Only providers that count are asked (Client::is_native).
            Client::Count(_) => Err("a token count is not a chat completion".into()),
        }
    }

    /// A stream in the client's API over the internal stream `chat`.
    pub fn stream(&self, stamp: &Stamp, chat: StreamRewriter) -> ClientStream {
        let way = match self {
            // A count is never streamed.
            Client::Internal | Client::Count(_) => Way::Internal(chat),
            Client::Responses(echo) => {
                Way::Rewritten(chat, Box::new(ResponsesStream::new(echo.for_answer(), stamp.clone())))
            }
            Client::Messages(_) => Way::Rewritten(chat, Box::new(MessagesStream::new(stamp.clone()))),
        };
        ClientStream {
            way,
            internal: Vec::new(),
        }
    }

    /// The client's own request for `provider` when it speaks the client's
    /// API (see [`Client::is_native`]), or why the request cannot be
    /// translated for it; `None` when it is to be translated.
    pub fn native_request(
        &self,
        provider: &Provider,
        request: &ParsedRequest,
        upstream_model: &str,
        routing_field: &str,
    ) -> Option<Result<UpstreamRequest, ApiError>> {
        match self {
            Client::Count(counted) if provider.api == Api::Anthropic => Some(anthropic::native_request(
                provider,
                anthropic::Endpoint::CountTokens,
                &counted.asked.body,
                &counted.asked.headers,
                upstream_model,
                routing_field,
            )),
            Client::Count(_) if provider.api == Api::Gemini => {
                Some(gemini::count_request(provider, request, upstream_model, routing_field))
            }
            // Routing asks only the candidates that count (exchange::route);
            // any other is a candidate that cannot serve the request.
            Client::Count(_) => Some(Err(ApiError::new(
                400,
                ErrorType::InvalidRequest,
                "unsupported_endpoint",
                format!("Provider '{}' does not count tokens.", provider.id),
            ))),
            Client::Messages(asked) if self.is_native(provider) => Some(anthropic::native_request(
                provider,
                anthropic::Endpoint::Messages,
                &asked.body,
                &asked.headers,
                upstream_model,
                routing_field,
            )),
            Client::Responses(echo) if self.is_native(provider) => Some(openai::responses_request(
                provider,
                &echo.body,
                upstream_model,
                routing_field,
            )),
            Client::Messages(asked) => asked.untranslatable.clone().map(Err),
            Client::Responses(echo) => echo.untranslatable.clone().map(Err),
            Client::Internal => None,
        }
    }

    /// What the client's API asked that chat has no member for, added to the
    /// request translated for `provider` when its API has it: a Messages
    /// request's `top_k` as Gemini's `topK` (an OpenAI-compatible API has
    /// none: dropped, as sampling that narrows less keeps the answer's shape, §6).
    pub fn carry_over(&self, provider: &Provider, upstream: &mut UpstreamRequest) {
        let Client::Messages(asked) = self else {
            return;
        };
        let Some(top_k) = asked.top_k else {
            return;
        };
        match provider.api {
            Api::Gemini => gemini::with_top_k(&mut upstream.body, top_k),
            Api::Openai | Api::Anthropic => log::info!("provider {} cannot express top_k; dropped", provider.id),
        }
    }

    /// Whether `provider` speaks the client's own API: the request and the
    /// answer then pass natively, with nothing translated.
    pub fn is_native(&self, provider: &Provider) -> bool {
        match self {
            Client::Messages(_) => provider.api == Api::Anthropic,
            Client::Responses(_) => provider.api == Api::Openai && provider.responses,
            Client::Count(_) => counts_tokens(provider),
            Client::Internal => false,
        }
    }

    /// The stream of a provider that speaks the client's own API.
    pub fn native_stream(&self, provider: &Provider) -> ClientStream {
        let wire = match self {
            Client::Responses(_) => Wire::Responses,
            Client::Messages(_) | Client::Count(_) | Client::Internal => Wire::Messages,
        };
        ClientStream {
            way: Way::Native(Box::new(NativeStream::new(wire, provider.credential.clone()))),
            internal: Vec::new(),
        }
    }

    /// The provider's answer in the client's own API, with the client's
    /// model name, and its usage.
    pub fn native_answer(&self, provider: &Provider, stamp: &Stamp, body: &[u8]) -> Result<(Vec<u8>, Usage), String> {
        match self {
            Client::Responses(_) => openai::responses_answer(body, &stamp.model),
            // A count spends no tokens.
            Client::Count(_) if provider.api == Api::Gemini => Ok((gemini::count_answer(body)?, Usage::default())),
            Client::Count(_) => Ok((anthropic::count_answer(body)?, Usage::default())),
            Client::Messages(_) | Client::Internal => anthropic::native_answer(body, &stamp.model),
        }
    }
}

/// A provider's stream on its way to the client.
pub struct ClientStream {
    way: Way,
    /// The internal stream's bytes of the chunk at hand (reused).
    internal: Vec<u8>,
}

/// How a stream reaches the client: the internal chat stream as it is, its
/// rewriting into another API, or the provider's own stream in the client's
/// own API.
enum Way {
    Internal(StreamRewriter),
    Rewritten(StreamRewriter, Box<dyn ChatStreamWriter>),
    Native(Box<NativeStream>),
}

impl ClientStream {
    /// Translates one chunk of provider bytes into `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        self.internal.clear();
        match &mut self.way {
            Way::Internal(chat) => chat.push(chunk, out),
            Way::Native(native) => native.push(chunk, out),
            Way::Rewritten(chat, stream) => {
                chat.push(chunk, &mut self.internal);
                stream.push(&self.internal, out);
            }
        }
    }

    /// The provider's stream is over: the client's ends too, never silently.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.internal.clear();
        match &mut self.way {
            Way::Internal(chat) => chat.finish(out),
            Way::Native(native) => native.finish(out),
            Way::Rewritten(chat, stream) => {
                chat.finish(&mut self.internal);
                stream.push(&self.internal, out);
                stream.finish(out);
            }
        }
    }

    /// Usage seen so far (for the access log and limits).
    pub fn usage(&self) -> Option<Usage> {
        match &self.way {
            Way::Internal(chat) | Way::Rewritten(chat, _) => chat.usage(),
            Way::Native(native) => native.usage(),
        }
    }

    /// The `code` of the error the stream ended with, if it did.
    pub fn error_code(&self) -> Option<&str> {
        match &self.way {
            Way::Internal(chat) | Way::Rewritten(chat, _) => chat.error_code(),
            Way::Native(native) => native.error_code(),
        }
    }
}

/// Whether `provider` counts a request's tokens in its own API (Anthropic's
/// `count_tokens`, Gemini's `countTokens`); the others' counts are estimated.
pub fn counts_tokens(provider: &Provider) -> bool {
    matches!(provider.api, Api::Anthropic | Api::Gemini)
}

/// Each provider API's recorded streams (`tests/fixtures/`), which the
/// inbound APIs' tests replay through the whole way.
#[cfg(test)]
pub(crate) mod recorded {
    use serde_json::Value;

    use crate::config::Api;
    use crate::sse::tests::chunkings;

    /// The way from a provider's stream to the client's, run over chunks.
    pub type Replay<'a> = &'a dyn Fn(&[&[u8]]) -> Vec<u8>;

    /// The client's stream for `input` whole, byte by byte and split in two
    /// everywhere, which must all be the same; its events, each `event:`
    /// name checked to be its data's `type`.
    pub fn replay_every_chunking(input: &[u8], replay: Replay<'_>) -> Vec<Value> {
        let whole = replay(&[input]);
        for chunks in chunkings(input) {
            assert_eq!(replay(&chunks), whole);
        }
        std::str::from_utf8(&whole)
            .unwrap()
            .split_terminator("\n\n")
            .map(|event| {
                let (name, data) = event.split_once('\n').unwrap();
                let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                assert_eq!(Some(name.strip_prefix("event: ").unwrap()), data["type"].as_str());
                data
            })
            .collect()
    }

    /// A text answer in each provider API.
    pub const TEXT_STREAMS: [(Api, &[u8]); 3] = [
        (
            Api::Openai,
            include_bytes!("../../tests/fixtures/openai/chat_completion_stream.sse"),
        ),
        (
            Api::Anthropic,
            include_bytes!("../../tests/fixtures/anthropic/message_stream.sse"),
        ),
        (
            Api::Gemini,
            include_bytes!("../../tests/fixtures/gemini/stream_generate_content.sse"),
        ),
    ];

    /// Two parallel tool calls in each provider API.
    pub const TOOL_STREAMS: [(Api, &[u8]); 3] = [
        (
            Api::Openai,
            include_bytes!("../../tests/fixtures/openai/chat_completion_stream_parallel_tool_calls.sse"),
        ),
        (
            Api::Anthropic,
            include_bytes!("../../tests/fixtures/anthropic/message_stream_parallel_tool_use.sse"),
        ),
        (
            Api::Gemini,
            include_bytes!("../../tests/fixtures/gemini/stream_generate_content_parallel_function_calls.sse"),
        ),
    ];
}
