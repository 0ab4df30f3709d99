//! One HTTP stream: Envoy's callbacks in, [`Exchange`] steps applied.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host::{self, Buffer, Map};
use super::routed;
use crate::config::Config;
use crate::exchange::{
    BodyStep, BufferStep, Call, CallStep, Exchange, Forward, HeadersAction, MAX_ANSWER_BYTES, Reply, ResponseAction,
    Rewrite, Stage,
};

/// The exchange, and what only the host's side needs: nothing here decides
/// anything about the request.
pub struct Stream {
    exchange: Exchange,
    /// With router fallback, this request's count in [`routed`]'s registry.
    routed_count: Option<u64>,
    /// A streamed chunk's rewrite, reused by every chunk of the stream.
    stream_out: Vec<u8>,
}

impl Stream {
    pub fn new(config: Rc<Config>) -> Stream {
        Stream {
            exchange: Exchange::new(config, host::now_nanos()),
            routed_count: None,
            stream_out: Vec::new(),
        }
    }

    /// Sends a local reply. Envoy sends it after this callback returns and
    /// passes it back through our own response callbacks, which leave it
    /// alone: the exchange is done by the time it replies.
    fn reply(&mut self, reply: &Reply) -> Action {
        send_reply(reply.status, &reply.headers, &reply.body)
    }

    /// A live stream could not be read or rewritten. Its headers are sent,
    /// so no error answer can replace it, and passing the provider's bytes
    /// on would send them untranslated and unscrubbed: the stream is reset
    /// (the client's SDK raises a connection error), and logged as a 500.
    fn cut_stream(&mut self, what: &str, status: host::Status) -> Action {
        self.exchange.cut(&format!("{what} failed (host status {})", status.0));
        if let Err(status) = host::reset_response() {
            log::error!("resetting the stream failed (status {})", status.0);
        }
        Action::Pause
    }

    /// The host refused a step that should not fail: the contract's 500.
    fn internal_error(&mut self, what: &str, status: host::Status) -> Action {
        let reply = self.exchange.fail(&format!("{what} failed (host status {})", status.0));
        self.reply(&reply)
    }

    /// Publishes the answer's usage as filter state, when the exchange hands it out.
    fn publish_usage(&mut self) {
        publish(self.exchange.take_usage());
    }

    /// Sends a final answer as a local reply. From the response path, with
    /// the upstream headers not yet sent, Envoy sends it directly in place of
    /// the upstream answer. Envoy sets `content-length` itself.
    fn reply_with(&mut self, rewrite: &Rewrite) -> Action {
        let headers: Vec<(String, String)> = rewrite
            .set
            .iter()
            .filter(|(k, _)| !k.starts_with(':') && k != "content-length")
            .cloned()
            .collect();
        // Not cloned: a held answer's body may be many megabytes.
        send_reply(rewrite.status, &headers, &rewrite.body)
    }

    /// Sends fallback calls until one is dispatched, or the answer is final.
    fn dispatch(&mut self, mut call: Call) {
        loop {
            let headers: Vec<(&str, &str)> = call.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            let sent = self.dispatch_http_call(
                &call.cluster,
                headers,
                Some(&call.body),
                Vec::new(),
                Duration::from_millis(call.timeout_ms),
            );
            let step = match sent {
                Ok(_token) => return,
                Err(status) => {
                    log::warn!("fallback call to cluster {} refused ({status:?})", call.cluster);
                    self.exchange.on_call_refused()
                }
            };
            match step {
                CallStep::Dispatch(next) => call = next,
                CallStep::Reply(rewrite) => {
                    self.reply_with(&rewrite);
                    return;
                }
            }
        }
    }

    /// Applies a step of a held (non-streamed) answer, whose callback's
    /// buffer holds `body_size` bytes (the exchange's
    /// [`Exchange::on_buffered_chunk`] says why a large answer is a local reply).
    fn apply_buffered(&mut self, step: BufferStep, body_size: usize) -> Action {
        match step {
            BufferStep::Hold => match host::set_buffer(Buffer::ResponseBody, 0, body_size, &[]) {
                Ok(()) => Action::Pause,
                Err(status) => self.internal_error("draining the response body", status),
            },
            BufferStep::Write(rewrite) => {
                self.publish_usage();
                self.apply_rewrite(&rewrite, body_size)
            }
            BufferStep::Reply(rewrite) => {
                self.publish_usage();
                self.reply_with(&rewrite)
            }
        }
    }

    /// Applies a final answer while the response headers are still held.
    fn apply_rewrite(&mut self, rewrite: &Rewrite, body_size: usize) -> Action {
        let edits = host::edit_headers(Map::Response, &rewrite.remove, &rewrite.set)
            .and_then(|()| host::set_buffer(Buffer::ResponseBody, 0, body_size, &rewrite.body));
        match edits {
            Ok(()) => Action::Continue,
            Err(status) => {
                // Headers not editable (should not happen while held): a
                // direct local reply replaces the upstream answer instead.
                log::warn!("response edit refused (status {}), replying directly", status.0);
                self.reply_with(rewrite)
            }
        }
    }

    /// Applies the request's rewrite in its fixed order: body, headers, filter
    /// state, and with router fallback the attempts' hand-over to the
    /// upstream role.
    fn apply_forward(&mut self, forward: &Forward, body_size: usize) -> Result<(), host::Status> {
        if let Some(body) = &forward.body {
            host::set_buffer(Buffer::RequestBody, 0, body_size, body)?;
        }
        host::edit_headers(Map::Request, &forward.remove, &forward.set)?;
        for (name, value) in &forward.properties {
            host::set_property(name, value.as_bytes())?;
        }
        if let Some(attempts) = &forward.routed {
            let (count, token) = routed::register(Rc::clone(attempts));
            self.routed_count = Some(count);
            host::set_property(routed::TOKEN_PROPERTY, token.as_bytes())?;
        }
        Ok(())
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Some(count) = self.routed_count {
            routed::forget(count);
        }
    }
}

impl Context for Stream {
    fn on_http_call_response(&mut self, _token: u32, num_headers: usize, body_size: usize, _num_trailers: usize) {
        if self.exchange.stage() != Stage::Calling {
            return;
        }
        if body_size > MAX_ANSWER_BYTES {
            let rewrite = self.exchange.on_call_too_large(host::status(Map::CallResponse));
            self.reply_with(&rewrite);
            return;
        }
        // Zero headers: the call was reset before an answer.
        let pairs = if num_headers == 0 {
            Vec::new()
        } else {
            host::header_pairs(Map::CallResponse).unwrap_or_default()
        };
        let body = host::buffer(Buffer::CallResponseBody, 0, body_size).unwrap_or_default();
        match self.exchange.on_call_response(&pairs, &body) {
            CallStep::Dispatch(call) => self.dispatch(call),
            CallStep::Reply(rewrite) => {
                self.publish_usage();
                self.reply_with(&rewrite);
            }
        }
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let map = match host::header_map(Map::Request) {
            Ok(map) => map,
            Err(status) => return self.internal_error("reading request headers", status),
        };
        let pairs = map.pairs();
        let step = self.exchange.on_request_headers(&pairs, end_of_stream);
        for name in &step.remove {
            if let Err(status) = host::remove_header(Map::Request, name) {
                return self.internal_error("removing a reserved header", status);
            }
        }
        match step.action {
            HeadersAction::Continue => Action::Continue,
            HeadersAction::Reply(reply) => self.reply(&reply),
            // Held until the whole body is read (allow_on_headers_stop_iteration).
            HeadersAction::ReadBody => Action::Pause,
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        match self.exchange.on_request_body_chunk(body_size, end_of_stream) {
            BodyStep::Pass => return Action::Continue,
            // Pause buffers: the next callback sees everything so far.
            BodyStep::Wait => return Action::Pause,
            BodyStep::Reply(reply) => return self.reply(&reply),
            BodyStep::Read => {}
        }
        let body = match host::buffer(Buffer::RequestBody, 0, body_size) {
            Ok(body) => body,
            Err(status) => return self.internal_error("reading the request body", status),
        };
        match self
            .exchange
            .on_request_body(&body, host::now_nanos(), &mut host::SharedData)
        {
            Ok(forward) => match self.apply_forward(&forward, body_size) {
                Ok(()) => Action::Continue,
                Err(status) => self.internal_error("rewriting the request", status),
            },
            Err(reply) => self.reply(&reply),
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.exchange.stage() != Stage::Awaiting {
            return Action::Continue;
        }
        let map = match host::header_map(Map::Response) {
            Ok(map) => map,
            // Nothing read: the exchange fails as an answer it cannot see.
            Err(status) => return self.internal_error("reading response headers", status),
        };
        let pairs = map.pairs();
        // Read only for a non-2xx answer (a 2xx is the provider's): the
        // property read costs ~2.5 µs a request in Envoy (docs/performance.md "Performance").
        let details = || host::property(&["response", "code_details"]);
        let step = self.exchange.on_response_headers(&pairs, details, end_of_stream);
        for (name, value) in &step.scrub {
            if let Err(status) = host::set_header(Map::Response, name, value) {
                return self.internal_error("scrubbing a response header", status);
            }
        }
        for name in &step.remove {
            if let Err(status) = host::remove_header(Map::Response, name) {
                return self.internal_error("removing a response header", status);
            }
        }
        match step.action {
            ResponseAction::Continue => Action::Continue,
            ResponseAction::Stream { remove, set } => {
                if let Err(status) = host::edit_headers(Map::Response, &remove, &set) {
                    return self.internal_error("editing stream headers", status);
                }
                Action::Continue
            }
            // A headers-only answer has no body to edit, and a refusal by a
            // filter after ours (limits::envoy_refusal) is not the provider's:
            // a direct local reply (we are in on_response_headers) replaces it.
            ResponseAction::Answer(rewrite) => {
                self.publish_usage();
                self.reply_with(&rewrite)
            }
            ResponseAction::Fallback(call) => {
                // Held, so no byte of the failed answer reaches the client.
                self.dispatch(call);
                Action::Pause
            }
            // Held: body callbacks still arrive (allow_on_headers_stop_iteration),
            // and status and headers can be fixed once the body is known.
            ResponseAction::Buffer => Action::Pause,
        }
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.exchange
            .on_response_body_timing(body_size, end_of_stream, host::now_nanos);
        match self.exchange.stage() {
            Stage::Untouched | Stage::Awaiting => Action::Continue,
            // The failed answer's body is held until the local reply drops it.
            Stage::Calling => Action::Pause,
            Stage::Streaming => {
                // After Continue, the visible buffer is only this chunk.
                let chunk = match host::buffer(Buffer::ResponseBody, 0, body_size) {
                    Ok(chunk) => chunk,
                    Err(status) => return self.cut_stream("reading a stream chunk", status),
                };
                self.stream_out.clear();
                self.exchange
                    .on_stream_body(&chunk, end_of_stream, &mut self.stream_out);
                if let Err(status) = host::set_buffer(Buffer::ResponseBody, 0, body_size, &self.stream_out) {
                    return self.cut_stream("replacing a stream chunk", status);
                }
                if end_of_stream {
                    self.publish_usage();
                }
                Action::Continue
            }
            Stage::Buffering => {
                // The previous callback drained Envoy's buffer: this is only the new chunk.
                let chunk = match host::buffer(Buffer::ResponseBody, 0, body_size) {
                    Ok(chunk) => chunk,
                    Err(status) => return self.internal_error("reading the response body", status),
                };
                let step = self.exchange.on_buffered_chunk(chunk, end_of_stream);
                self.apply_buffered(step, body_size)
            }
        }
    }

    fn on_http_response_trailers(&mut self, _num_trailers: usize) -> Action {
        // With trailers, no body callback had end_of_stream: finish here.
        match self.exchange.stage() {
            Stage::Streaming => {
                self.stream_out.clear();
                self.exchange.on_stream_body(&[], true, &mut self.stream_out);
                if !self.stream_out.is_empty()
                    && let Err(status) = host::set_buffer(Buffer::ResponseBody, usize::MAX, 0, &self.stream_out)
                {
                    return self.cut_stream("appending the stream end", status);
                }
                Action::Continue
            }
            Stage::Buffering => {
                let rest = host::buffer(Buffer::ResponseBody, 0, usize::MAX).unwrap_or_default();
                let rest_len = rest.len();
                let step = self.exchange.on_buffered_chunk(rest, true);
                self.apply_buffered(step, rest_len)
            }
            Stage::Calling => Action::Pause,
            Stage::Untouched | Stage::Awaiting => Action::Continue,
        }
    }

    fn on_log(&mut self) {
        // An answer still held or streaming here did not end through the
        // filter: Envoy ended it (read only then: a host call).
        if matches!(self.exchange.stage(), Stage::Streaming | Stage::Buffering)
            && let Some(details) = host::property(&["response", "code_details"])
        {
            self.exchange.on_ended_by_envoy(&details);
        }
        publish(self.exchange.take_usage_at_log());
        let now = host::now_nanos();
        let log = OPEN_LABELS.with(|open| {
            // Never busy: a VM runs one callback at a time.
            let mut open = open.try_borrow_mut().ok()?;
            self.exchange.on_log(&mut host::SharedData, now, &mut open)
        });
        let Some(log) = log else {
            return;
        };
        for update in &log.metrics {
            if let Err(status) = host::apply_metric(update) {
                log::debug!("stat {} not updated (status {})", update.name, status.0);
            }
        }
        host::log_info(&log.line);
    }
}

thread_local! {
    /// The stats' label values from outside the configuration this VM has
    /// seen, bounded (`metrics::OpenLabels`).
    static OPEN_LABELS: std::cell::RefCell<crate::metrics::OpenLabels> = Default::default();
}

/// Sets filter state; a refusal by the host is logged (nothing else can be done).
fn publish(properties: Vec<(&'static str, String)>) {
    for (name, value) in properties {
        if let Err(status) = host::set_property(name, value.as_bytes()) {
            log::debug!("filter state {name} not published (status {})", status.0);
        }
    }
}

/// Sends a local reply; a refusal by the host is logged (nothing else can be done).
fn send_reply(status: u16, headers: &[(String, String)], body: &[u8]) -> Action {
    if let Err(status) = host::send_local_response(status, headers, body) {
        log::error!("local reply refused by the host (status {})", status.0);
    }
    Action::Pause
}
