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

pub mod messages;
pub mod responses;

use crate::answer::Stamp;
use crate::errors::ApiError;
use crate::request::Operation;
use crate::stream::StreamRewriter;
use crate::usage::Usage;
use messages::stream::MessagesStream;
use responses::stream::ResponsesStream;

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
    /// `POST /messages/count_tokens`: answered by the filter, estimated.
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
    Responses(responses::Echo),
    /// The Messages API, and what its answer takes of the request.
    Messages(messages::Asked),
}

impl Client {
    /// The finished internal answer (a `chat.completion`) in the client's API.
    pub fn answer(&self, stamp: &Stamp, internal: Vec<u8>) -> Result<Vec<u8>, String> {
        match self {
            Client::Internal => Ok(internal),
            Client::Responses(echo) => responses::to_response(echo, stamp, &internal),
            Client::Messages(asked) => messages::to_message(asked, stamp, &internal),
        }
    }

    /// A stream in the client's API over the internal stream `chat`.
    pub fn stream(&self, stamp: &Stamp, chat: StreamRewriter) -> ClientStream {
        let outbound = match self {
            Client::Internal => Outbound::Internal,
            Client::Responses(echo) => Outbound::Responses(Box::new(ResponsesStream::new(echo.clone(), stamp.clone()))),
            Client::Messages(_) => Outbound::Messages(Box::new(MessagesStream::new(stamp.clone()))),
        };
        ClientStream {
            chat,
            outbound,
            internal: Vec::new(),
        }
    }
}

/// A provider's stream on its way to the client: the internal chat stream,
/// and, for another API, its rewriting.
pub struct ClientStream {
    chat: StreamRewriter,
    outbound: Outbound,
    /// The internal stream's bytes of the chunk at hand (reused).
    internal: Vec<u8>,
}

impl ClientStream {
    /// Translates one chunk of provider bytes into `out`.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<u8>) {
        if let Outbound::Internal = self.outbound {
            return self.chat.push(chunk, out);
        }
        self.internal.clear();
        self.chat.push(chunk, &mut self.internal);
        match &mut self.outbound {
            Outbound::Internal => {}
            Outbound::Responses(stream) => stream.push(&self.internal, out),
            Outbound::Messages(stream) => stream.push(&self.internal, out),
        }
    }

    /// The provider's stream is over: the client's ends too, never silently.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        if let Outbound::Internal = self.outbound {
            return self.chat.finish(out);
        }
        self.internal.clear();
        self.chat.finish(&mut self.internal);
        match &mut self.outbound {
            Outbound::Internal => {}
            Outbound::Responses(stream) => {
                stream.push(&self.internal, out);
                stream.finish(out);
            }
            Outbound::Messages(stream) => {
                stream.push(&self.internal, out);
                stream.finish(out);
            }
        }
    }

    /// Usage seen so far (for the access log and limits).
    pub fn usage(&self) -> Option<Usage> {
        self.chat.usage()
    }

    /// The `code` of the error the stream ended with, if it did.
    pub fn error_code(&self) -> Option<&str> {
        self.chat.error_code()
    }
}

/// The client's side of a stream: the internal chat stream as it is, or its
/// rewriting into another API.
enum Outbound {
    Internal,
    Responses(Box<ResponsesStream>),
    Messages(Box<MessagesStream>),
}
