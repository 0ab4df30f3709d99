//! One HTTP stream: Envoy's callbacks in, [`Exchange`] steps applied.

use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host::{self, Buffer, Map};
use super::routed;
use crate::config::Config;
use crate::exchange::{
    BodyStep, Call, CallStep, Exchange, Forward, HeadersAction, MAX_ANSWER_BYTES, Reply, ResponseAction, Rewrite, Stage,
};

pub struct Stream {
    exchange: Exchange,
    started_ns: u64,
    usage_published: bool,
    /// A non-streaming answer so far. Held here, not in Envoy's buffer, so
    /// that its size limit is ours and an oversize answer gets the
    /// contract's 502 rather than Envoy's plain-text 500. Kept as the chunks
    /// that came, so that growing it never needs one large reallocation
    /// (a VM's memory never shrinks).
    answer: Vec<Vec<u8>>,
    answer_len: usize,
    /// The most Envoy's own buffer of the held answer has held, once a body
    /// callback paused; `None` before. See [`Stream::finish_held`].
    held_max: Option<usize>,
    /// With router fallback, this request's count in [`routed`]'s registry.
    routed_count: Option<u64>,
    /// A size Envoy's body buffers are known to take: the listener's
    /// `per_connection_buffer_limit_bytes` must be above `max_request_bytes`
    /// for requests to pass at all (docs/deploying.md, "Running it in Envoy").
    envoy_buffer_floor: usize,
    /// A streamed chunk's rewrite, reused by every chunk of the stream.
    stream_out: Vec<u8>,
    /// When the request went upstream, its first answer byte, its end.
    forwarded_ns: Option<u64>,
    first_byte_ns: Option<u64>,
    done_ns: Option<u64>,
}

impl Stream {
    pub fn new(config: Rc<Config>) -> Stream {
        Stream {
            envoy_buffer_floor: usize::try_from(config.max_request_bytes).unwrap_or(usize::MAX),
            routed_count: None,
            exchange: Exchange::new(config),
            started_ns: host::now_nanos(),
            usage_published: false,
            answer: Vec::new(),
            answer_len: 0,
            held_max: None,
            stream_out: Vec::new(),
            forwarded_ns: None,
            first_byte_ns: None,
            done_ns: None,
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

    /// Publishes the answer's usage as filter state, once.
    fn publish_usage(&mut self) {
        if self.usage_published {
            return;
        }
        self.usage_published = true;
        for (name, value) in self.exchange.usage_properties() {
            if let Err(status) = host::set_property(name, value.as_bytes()) {
                log::debug!("filter state {name} not published (status {})", status.0);
            }
        }
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

    /// The held answer followed by its `last` chunk, in one allocation.
    fn whole_answer(&mut self, last: Vec<u8>) -> Vec<u8> {
        if self.answer.is_empty() {
            return last;
        }
        let mut body = Vec::with_capacity(self.answer_len.saturating_add(last.len()));
        for chunk in self.answer.drain(..) {
            body.extend_from_slice(&chunk);
        }
        body.extend_from_slice(&last);
        body
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

    /// Applies the final answer of a held (non-streamed) upstream answer.
    ///
    /// Once a body callback has paused, Envoy shows the filter its own buffer
    /// of the response body, a watermark buffer limited by the listener's
    /// `per_connection_buffer_limit_bytes`, and that buffer is not
    /// "streaming". Writing more than the limit into it makes Envoy send its
    /// own plain-text 500 (`response_payload_too_large`) *synchronously,
    /// inside that `set_buffer` call*: the stream ends and Envoy calls
    /// `proxy_on_log` while this callback is still running, which the SDK
    /// cannot take (it panics, the VM traps, and Envoy has been seen to
    /// crash). So the answer goes into that buffer only if it is no larger
    /// than a size Envoy is known to take (what the buffer has already held,
    /// or `max_request_bytes`, below the limit by the documented setup); a
    /// larger one is sent as a local reply instead,
    /// which Envoy sends after this callback returns, directly to the
    /// client, outside the filter's buffers (as fallback answers are). The
    /// client gets the same status, headers the filter sets and body; the
    /// upstream's own other headers are not kept.
    ///
    /// Before any pause, `body_size` is this chunk's own buffer, which Envoy
    /// only buffers after this callback returns, as "streaming" data: over
    /// the limit that is flow control, never an error.
    fn finish_held(&mut self, rewrite: &Rewrite, body_size: usize) -> Action {
        match self.held_max {
            Some(held) if rewrite.body.len() > held.max(self.envoy_buffer_floor) => {
                log::debug!(
                    "{}-byte answer sent as a local reply (Envoy's buffer has held {held})",
                    rewrite.body.len()
                );
                self.reply_with(rewrite)
            }
            _ => self.apply_rewrite(rewrite, body_size),
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
        // One clock read: the limits' window and the upstream timings' start.
        let now = host::now_nanos();
        match self
            .exchange
            .on_request_body(&body, now / 1_000_000, &mut host::SharedData)
        {
            Ok(forward) => match self.apply_forward(&forward, body_size) {
                Ok(()) => {
                    self.forwarded_ns = Some(now);
                    Action::Continue
                }
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
        let first_bytes = body_size > 0 && self.first_byte_ns.is_none();
        // The clock is read only when a time is taken: a stream has many callbacks.
        let stage = self.exchange.stage();
        if (first_bytes || end_of_stream) && matches!(stage, Stage::Streaming | Stage::Buffering) {
            let now = host::now_nanos();
            if first_bytes {
                self.first_byte_ns = Some(now);
            }
            if end_of_stream {
                self.done_ns = Some(now);
            }
        }
        match stage {
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
                if let Some(held) = self.held_max.as_mut() {
                    // After a pause this chunk sits in Envoy's own buffer.
                    *held = (*held).max(body_size);
                }
                self.answer_len = self.answer_len.saturating_add(chunk.len());
                if self.answer_len > MAX_ANSWER_BYTES {
                    self.answer = Vec::new();
                    let rewrite = self.exchange.on_buffered_too_large();
                    return self.reply_with(&rewrite);
                }
                if !end_of_stream {
                    self.answer.push(chunk);
                    if let Err(status) = host::set_buffer(Buffer::ResponseBody, 0, body_size, &[]) {
                        return self.internal_error("draining the response body", status);
                    }
                    // From now on the body callbacks see Envoy's own buffer.
                    self.held_max.get_or_insert(0);
                    return Action::Pause;
                }
                let body = self.whole_answer(chunk);
                let rewrite = self.exchange.on_buffered_body(&body);
                drop(body);
                self.publish_usage();
                self.finish_held(&rewrite, body_size)
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
                if let Some(held) = self.held_max.as_mut() {
                    *held = (*held).max(rest_len);
                }
                let body = self.whole_answer(rest);
                let rewrite = self.exchange.on_buffered_body(&body);
                drop(body);
                self.publish_usage();
                self.finish_held(&rewrite, rest_len)
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
        // on_log runs for every stream, client disconnects included: the one
        // place where an answer's tokens are sure to be counted.
        self.publish_usage();
        let now = host::now_nanos();
        let since = |t: Option<u64>, from: Option<u64>| Some(t?.saturating_sub(from?) / 1_000_000);
        let timing = crate::metrics::Timing {
            upstream_ms: since(self.done_ns.or(Some(now)), self.forwarded_ns),
            first_byte_ms: since(self.first_byte_ns, self.forwarded_ns),
        };
        let elapsed_ms = now.saturating_sub(self.started_ns) / 1_000_000;
        let log = OPEN_LABELS.with(|open| {
            // Never busy: a VM runs one callback at a time.
            let mut open = open.try_borrow_mut().ok()?;
            self.exchange
                .on_log(&mut host::SharedData, now / 1_000_000, timing, elapsed_ms, &mut open)
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

/// Sends a local reply; a refusal by the host is logged (nothing else can be done).
fn send_reply(status: u16, headers: &[(String, String)], body: &[u8]) -> Action {
    if let Err(status) = host::send_local_response(status, headers, body) {
        log::error!("local reply refused by the host (status {})", status.0);
    }
    Action::Pause
}
