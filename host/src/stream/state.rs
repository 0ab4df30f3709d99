//! The per-stream state lent to the guest for each callback ([`StreamState`]), with
//! Envoy's access rules (context.cc `getMap`/`getBuffer`, cpp-host `exports.cc`):
//!
//! - request headers are readable and writable in `on_request_headers` and while held
//!   (that callback returned Pause and nothing resumed); after Continue every access is
//!   refused with `BadArgument` (the Rust SDK panics on it); `on_log` reads them;
//! - response headers likewise;
//! - a body is visible in its body callback and while it is being buffered (the last
//!   body callback returned Pause), otherwise `NotFound`;
//! - `continue_stream`, `send_local_response` and `close_stream` are queued and run when
//!   the callback returns (`addAfterVmCallAction`); `continue_stream` also drops access
//!   to the request headers and body at once, for either direction (a context.cc quirk).

use std::collections::HashMap;

use proxy_wasm_host::abi::v0_2_1::types::{BufferType, MapType, Status, StreamType};
use proxy_wasm_host::abi::v0_2_1::{Access, Callback, Invocation, LocalResponse, StreamState};
use proxy_wasm_host::{Buffer, HeaderMap};

use super::body::Body;
use super::headers::Headers;
use super::properties::{self, Props};

/// What a callback asked for, run after it returns.
#[derive(Debug)]
pub enum Deferred {
    Continue(StreamType),
    LocalReply(LocalResponse<'static>),
    Close,
}

#[derive(Default)]
pub struct HttpState {
    pub req_headers: Headers,
    pub resp_headers: Headers,
    pub req_headers_open: bool,
    pub resp_headers_open: bool,
    pub req_body: Body,
    pub resp_body: Body,
    pub req_body_open: bool,
    pub resp_body_open: bool,
    pub deferred: Vec<Deferred>,
    pub props: Props,
    /// `set_property` values (Envoy filter state `wasm.<path>`).
    pub filter_state: HashMap<Vec<u8>, Vec<u8>>,
}

impl HttpState {
    pub fn local_reply_queued(&self) -> bool {
        self.deferred.iter().any(|d| matches!(d, Deferred::LocalReply(_)))
    }
}

impl StreamState for HttpState {
    fn header_map(&mut self, call: Invocation, access: Access, map: MapType) -> Result<&mut dyn HeaderMap, Status> {
        let in_log = call.callback == Some(Callback::Log);
        let (open, headers) = match map {
            MapType::HttpRequestHeaders => (self.req_headers_open, &mut self.req_headers),
            MapType::HttpResponseHeaders => (self.resp_headers_open, &mut self.resp_headers),
            // No trailers reach the plugin (see host/README.md).
            _ => return Err(Status::BadArgument),
        };
        if open && !in_log {
            headers.read_only = false;
            return Ok(headers);
        }
        // Envoy's `log()` lends the access-log maps, const: reads work, writes do not.
        if in_log {
            headers.read_only = true;
            let _ = access;
            return Ok(headers);
        }
        Err(Status::BadArgument)
    }

    fn buffer(&mut self, _call: Invocation, _access: Access, buffer: BufferType) -> Result<&mut dyn Buffer, Status> {
        match buffer {
            BufferType::HttpRequestBody if self.req_body_open => Ok(&mut self.req_body),
            BufferType::HttpResponseBody if self.resp_body_open => Ok(&mut self.resp_body),
            _ => Err(Status::NotFound),
        }
    }

    fn continue_stream(&mut self, _call: Invocation, stream: StreamType) -> Result<(), Status> {
        match stream {
            StreamType::HttpRequest | StreamType::HttpResponse => {
                // context.cc `continueStream` clears the request pointers for either
                // direction, immediately (the resume itself is deferred).
                self.req_headers_open = false;
                self.req_body_open = false;
                self.deferred.push(Deferred::Continue(stream));
                Ok(())
            }
            _ => Err(Status::BadArgument),
        }
    }

    fn close_stream(&mut self, _call: Invocation, stream: StreamType) -> Result<(), Status> {
        match stream {
            StreamType::HttpRequest | StreamType::HttpResponse => {
                self.deferred.push(Deferred::Close);
                Ok(())
            }
            _ => Err(Status::BadArgument),
        }
    }

    fn send_local_response(&mut self, _call: Invocation, response: LocalResponse<'_>) -> Result<(), Status> {
        self.deferred.push(Deferred::LocalReply(response.into_owned()));
        Ok(())
    }

    fn property(&mut self, call: Invocation, path: &[&[u8]], out: &mut Vec<u8>) -> Result<(), Status> {
        let in_log = call.callback == Some(Callback::Log);
        let request_headers = (self.req_headers_open || in_log).then_some(&self.req_headers);
        let response_headers = (self.resp_headers_open || in_log).then_some(&self.resp_headers);
        if properties::lookup(&self.props, request_headers, response_headers, path, out) {
            return Ok(());
        }
        // Envoy falls back to filter state `wasm.<path>` (what set_property wrote).
        let key = path.join(&0u8);
        match self.filter_state.get(&key) {
            Some(value) => {
                out.extend_from_slice(value);
                Ok(())
            }
            None => Err(Status::NotFound),
        }
    }

    fn set_property(&mut self, _call: Invocation, path: &[&[u8]], value: &[u8]) -> Result<(), Status> {
        self.filter_state.insert(path.join(&0u8), value.to_vec());
        Ok(())
    }
}
