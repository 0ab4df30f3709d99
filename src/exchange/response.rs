//! The answer: an attempt's outcome recorded, a failure followed by the
//! next candidate (`http_call` fallback) or read from the router's attempts,
//! a stream rewritten as it passes, a buffered answer translated or turned
//! into the contract's error, in the client's API, the credential scrubbed.

use super::*;

impl Exchange {
    /// Response headers arrived, as lowercase name / raw value pairs.
    /// `code_details` reads Envoy's `response.code_details`, which is asked
    /// for only when the status is not 2xx (a host call per request
    /// otherwise): `via_upstream` for a real upstream answer; router-made
    /// replies (connect failure, timeout) say otherwise, and so do the
    /// replies of filters after ours (Envoy's rate limit filter).
    pub fn on_response_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        pairs: &[(K, V)],
        code_details: impl FnOnce() -> Option<Vec<u8>>,
        end_of_stream: bool,
    ) -> ResponseStep {
        let mut routed = match std::mem::replace(&mut self.state, State::Done) {
            State::Upstream(routed) => routed,
            // Only the awaited answer is ours (not our own reply passing back).
            other => {
                self.state = other;
                return self.response_step(pairs, ResponseAction::Continue);
            }
        };
        let head = ResponseHead::read(pairs);
        let details = if (200..300).contains(&head.status) {
            None
        } else {
            code_details()
        };
        let details = details.as_deref().and_then(|d| std::str::from_utf8(d).ok());
        let ratelimit_reset = header_in(pairs, "x-ratelimit-reset");
        if let Some(e) = details.and_then(|d| limits::envoy_refusal(d, ratelimit_reset)) {
            // Envoy's rate limit filter refused before any provider was tried.
            let answer = self.rewrite_error(&e, false);
            return self.response_step(pairs, ResponseAction::Answer(answer));
        }
        let router_error = details.is_some_and(|d| d != "via_upstream");
        match &routed.next {
            Next::Router(attempts) => {
                // The router has made every attempt already; this is the last one's answer.
                let outcomes = attempts.borrow().outcomes().to_vec();
                match outcomes.last() {
                    Some(last) => {
                        routed.provider = Rc::clone(&last.provider);
                        routed.model.clone_from(&last.model);
                    }
                    None => self.record_attempt(&routed, head.status, true, None),
                }
                self.record.attempts.extend(outcomes);
            }
            Next::Call(_) => {
                let retry_after = health::retry_after_ms(head.retry_after.as_deref());
                self.record_attempt(&routed, head.status, router_error, retry_after);
                if retryable(head.status, router_error)
                    && let Some(call) = self.next_call(&mut routed)
                {
                    self.state = State::Calling(routed);
                    return self.response_step(pairs, ResponseAction::Fallback(call));
                }
            }
        }
        let ok = (200..300).contains(&head.status) && !router_error;
        if ok && routed.asked.request.stream && head.event_stream && !end_of_stream {
            let rewriter = new_rewriter(&routed.asked, &routed.provider);
            self.state = State::Streaming(Box::new(rewriter));
            self.record.status = head.status;
            let mut set = vec![("content-type".to_string(), "text/event-stream".to_string())];
            set.extend(self.attempt_headers(true));
            let action = ResponseAction::Stream {
                remove: vec!["content-length".into()],
                set,
            };
            return self.response_step(pairs, action);
        }
        let held = Held::new(head.status, head.retry_after, router_error, head.event_stream);
        self.state = State::Buffering(routed, held);
        if end_of_stream {
            let answer = self.on_buffered_body(&[]);
            return self.response_step(pairs, ResponseAction::Answer(answer));
        }
        self.response_step(pairs, ResponseAction::Buffer)
    }

    /// `action`, with the upstream headers it lets through scrubbed, and
    /// for a limited key without the provider's own `x-ratelimit-*`: they
    /// describe the operator's account with the provider, and their names
    /// are the ones the key's limits are told in (contract "Limits"), which
    /// would mix the two.
    pub(super) fn response_step<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        pairs: &[(K, V)],
        action: ResponseAction,
    ) -> ResponseStep {
        if !matches!(action, ResponseAction::Stream { .. } | ResponseAction::Buffer) {
            return ResponseStep {
                scrub: Vec::new(),
                remove: Vec::new(),
                action,
            };
        }
        let remove = match self.record.standing {
            Some(_) => names_where(pairs, |name, _| name.starts_with("x-ratelimit-")),
            None => Vec::new(),
        };
        // A provider may echo its credential in a header, too.
        let scrub = self.scrub_headers(pairs);
        ResponseStep { scrub, remove, action }
    }

    /// The next fallback call, if a candidate is left.
    pub(super) fn next_call(&mut self, routed: &mut Routed) -> Option<Call> {
        let Next::Call(plan) = &mut routed.next else {
            return None;
        };
        let (provider, model, upstream) = plan.next(&routed.asked, &self.config.routing_field, &mut None)?;
        let mut headers: Vec<Header> = vec![
            (":method".into(), "POST".into()),
            (":path".into(), upstream.path),
            (":authority".into(), provider.authority.clone()),
            ("content-type".into(), "application/json".into()),
        ];
        headers.extend(upstream.headers);
        let call = Call {
            cluster: provider.cluster.clone(),
            headers,
            body: upstream.body,
            timeout_ms: provider.timeout_ms,
        };
        routed.provider = provider;
        routed.model = model;
        Some(call)
    }

    /// A fallback call's answer, as lowercase name / raw value pairs and its
    /// body; no `:status` when the call was reset (no headers at all).
    pub fn on_call_response<K: AsRef<[u8]>, V: AsRef<[u8]>>(&mut self, pairs: &[(K, V)], body: &[u8]) -> CallStep {
        let State::Calling(mut routed) = std::mem::replace(&mut self.state, State::Done) else {
            return CallStep::Reply(self.rewrite_error(&internal("call answer in an unexpected phase"), false));
        };
        let head = ResponseHead::read(pairs);
        // An http_call reports Envoy's own failures as ordinary responses;
        // only the router's text tells a connect failure or timeout apart.
        let router_error = head.status == 0 || is_envoy_local_reply(head.status, body);
        let retry_after = health::retry_after_ms(head.retry_after.as_deref());
        self.record_attempt(&routed, head.status, router_error, retry_after);
        if retryable(head.status, router_error)
            && let Some(call) = self.next_call(&mut routed)
        {
            self.state = State::Calling(routed);
            return CallStep::Dispatch(call);
        }
        let status = if head.status == 0 { 503 } else { head.status };
        let held = Held::new(status, head.retry_after, router_error, head.event_stream);
        self.state = State::Buffering(routed, held);
        CallStep::Reply(self.on_buffered_body(body))
    }

    /// The host refused to dispatch a fallback call (unknown cluster): that
    /// candidate counts as an attempt that failed to connect.
    pub fn on_call_refused(&mut self) -> CallStep {
        self.on_call_response::<&[u8], &[u8]>(&[], &[])
    }

    /// A fallback call's answer is over [`MAX_ANSWER_BYTES`] (its body
    /// unread); `status` is its status.
    pub fn on_call_too_large(&mut self, status: u16) -> Rewrite {
        let State::Calling(routed) = std::mem::replace(&mut self.state, State::Done) else {
            return self.rewrite_error(&internal("call answer in an unexpected phase"), false);
        };
        self.record_attempt(&routed, status, false, None);
        self.rewrite_error(&self.answer_too_large(), false)
    }

    /// The buffered answer grew past [`MAX_ANSWER_BYTES`]: the final answer
    /// is a 502, and the rest of the upstream body is dropped.
    pub fn on_buffered_too_large(&mut self) -> Rewrite {
        let e = match std::mem::replace(&mut self.state, State::Done) {
            State::Buffering(..) => self.answer_too_large(),
            _ => internal("response body in an unexpected phase"),
        };
        self.rewrite_error(&e, false)
    }

    pub(super) fn answer_too_large(&self) -> ApiError {
        ApiError::new(
            502,
            ErrorType::Upstream,
            "invalid_upstream_response",
            format!(
                "The provider's answer was larger than {MAX_ANSWER_BYTES} bytes ({}).",
                self.record.attempt_summary()
            ),
        )
    }

    /// Upstream response headers whose values carry the credential of a
    /// provider this request was sent to, with it scrubbed: the name and the
    /// value to set in place of every value of that name (joined with `, `).
    pub(super) fn scrub_headers<K: AsRef<[u8]>, V: AsRef<[u8]>>(&self, pairs: &[(K, V)]) -> Vec<Header> {
        let sent = self.sent_credentials();
        let mut scrubbed: Vec<Header> = Vec::new();
        for (name, value) in pairs {
            if !sent.iter().any(|s| s.occurs_in(value.as_ref())) {
                continue;
            }
            let Ok(name) = std::str::from_utf8(name.as_ref()) else {
                continue;
            };
            if name.starts_with(':') || scrubbed.iter().any(|(n, _)| n == name) {
                continue;
            }
            let values: Vec<String> = pairs
                .iter()
                .filter(|(n, _)| n.as_ref() == name.as_bytes())
                .map(|(_, v)| {
                    let mut v = v.as_ref().to_vec();
                    self.redact(&mut v);
                    String::from_utf8_lossy(&v).into_owned()
                })
                .collect();
            scrubbed.push((name.to_string(), values.join(", ")));
        }
        scrubbed
    }

    pub(super) fn record_attempt(
        &mut self,
        routed: &Routed,
        status: u16,
        router_error: bool,
        retry_after_ms: Option<u64>,
    ) {
        self.record.attempts.push(Tried {
            provider: Rc::clone(&routed.provider),
            model: routed.model.clone(),
            outcome: if router_error {
                Outcome::Failed
            } else {
                Outcome::Status(status)
            },
            retry_after_ms,
        });
    }

    /// A chunk of a live stream; the bytes that replace it go to `out`.
    pub fn on_stream_body(&mut self, chunk: &[u8], end_of_stream: bool, out: &mut Vec<u8>) {
        let State::Streaming(rewriter) = &mut self.state else {
            return;
        };
        // The rewriter scrubs the provider's credential itself (new_rewriter).
        self.streamed |= !chunk.is_empty();
        rewriter.push(chunk, out);
        if end_of_stream {
            rewriter.finish(out);
        }
        self.record.usage = rewriter.usage();
        if end_of_stream {
            // An error event is an error answer: counted by its code.
            self.record.error_code = rewriter.error_code().map(str::to_string);
            self.state = State::Done;
        }
    }

    /// Envoy ended the answer itself, past the filter: the provider's
    /// connection was reset, or its time ran out, after its headers had come
    /// (`code_details` says which). Envoy then sends a held answer's 502 or
    /// 504 straight to the client (the shipped listeners' local reply mapper
    /// gives it the contract's body) and resets a live stream; no callback
    /// tells the filter, so the record learns it here, at the log: the last
    /// attempt failed, and the request ended as the client saw it.
    pub fn on_ended_by_envoy(&mut self, code_details: &[u8]) {
        let timeout = code_details == b"response_timeout";
        if !timeout && !code_details.starts_with(b"upstream_reset_after_response_started") {
            return;
        }
        let held = match std::mem::replace(&mut self.state, State::Done) {
            State::Buffering(..) => true,
            State::Streaming(rewriter) => {
                self.record.usage = rewriter.usage();
                false
            }
            other => {
                self.state = other;
                return;
            }
        };
        // A stream that ends before its first byte failed as a held answer does.
        let cut_after_first_byte = !held && self.streamed;
        if let Some(last) = self.record.attempts.last_mut() {
            last.outcome = if cut_after_first_byte {
                Outcome::Cut
            } else {
                Outcome::Failed
            };
        }
        if held {
            let e = if timeout {
                self.failed_timeout()
            } else {
                self.failed_upstream()
            };
            self.record.status = e.status;
            self.record.error_code = Some(e.code);
        } else {
            // Its status went out with its headers; the stream was cut.
            self.record.error_code = Some(providers::openai::STREAM_INTERRUPTED.into());
        }
    }

    /// A chunk of a held answer (`end_of_stream`: its last). The exchange
    /// keeps the chunks until the end, then makes the final answer and
    /// says how it goes out.
    ///
    /// Once a body callback has paused, Envoy shows the filter its own buffer
    /// of the response body, a watermark buffer limited by the listener's
    /// `per_connection_buffer_limit_bytes`, and that buffer is not
    /// "streaming". Writing more than the limit into it makes Envoy send its
    /// own plain-text 500 (`response_payload_too_large`) *synchronously,
    /// inside that `set_buffer` call*: the stream ends and Envoy calls
    /// `proxy_on_log` while the callback is still running, which the SDK
    /// cannot take (it panics, the VM traps, and Envoy has been seen to
    /// crash). So the answer is written into that buffer only if it is no
    /// larger than a size Envoy is known to take (what the buffer has
    /// already held, or `max_request_bytes`, below the limit by the
    /// documented setup); a larger one is a local reply instead, which
    /// Envoy sends after the callback returns, directly to the client,
    /// outside the filter's buffers (as fallback answers are). The client
    /// gets the same status, headers the filter sets and body; the
    /// upstream's own other headers are not kept.
    ///
    /// Before any pause, a callback's buffer is only its chunk, which Envoy
    /// buffers after the callback returns as "streaming" data: over the
    /// limit that is flow control, never an error.
    pub fn on_buffered_chunk(&mut self, chunk: Vec<u8>, end_of_stream: bool) -> BufferStep {
        let State::Buffering(_, held) = &mut self.state else {
            let e = internal("response body in an unexpected phase");
            return BufferStep::Reply(self.rewrite_error(&e, false));
        };
        if let Some(most) = held.in_envoy.as_mut() {
            // After a pause this chunk sits in Envoy's own buffer.
            *most = (*most).max(chunk.len());
        }
        held.len = held.len.saturating_add(chunk.len());
        if held.len > MAX_ANSWER_BYTES {
            return BufferStep::Reply(self.on_buffered_too_large());
        }
        if !end_of_stream {
            held.chunks.push(chunk);
            // From now on the body callbacks see Envoy's own buffer.
            held.in_envoy.get_or_insert(0);
            return BufferStep::Hold;
        }
        let in_envoy = held.in_envoy;
        let body = held.whole(chunk);
        let rewrite = self.on_buffered_body(&body);
        drop(body);
        let envoy_takes = usize::try_from(self.config.max_request_bytes).unwrap_or(usize::MAX);
        match in_envoy {
            Some(most) if rewrite.body.len() > most.max(envoy_takes) => {
                log::debug!(
                    "{}-byte answer sent as a local reply (Envoy's buffer has held {most})",
                    rewrite.body.len()
                );
                BufferStep::Reply(rewrite)
            }
            _ => BufferStep::Write(rewrite),
        }
    }

    /// The whole buffered response body is here: the final answer.
    pub fn on_buffered_body(&mut self, body: &[u8]) -> Rewrite {
        let State::Buffering(routed, held) = std::mem::replace(&mut self.state, State::Done) else {
            return self.rewrite_error(&internal("response body in an unexpected phase"), false);
        };
        let provider = &routed.provider;
        if held.router_error {
            let e = if held.status == 504 {
                self.failed_timeout()
            } else {
                self.failed_upstream()
            };
            return self.rewrite_error(&e, false);
        }
        if (200..300).contains(&held.status) {
            return match self.translate_success(&routed, body, held.event_stream) {
                Ok(rewrite) => rewrite,
                Err(why) => {
                    // `why` may quote the provider's body (serde names the value it refused).
                    let mut why = why.into_bytes();
                    self.redact(&mut why);
                    let why = String::from_utf8_lossy(&why);
                    log::warn!("provider {} sent an invalid answer: {why}", provider.id);
                    let e = ApiError::new(
                        502,
                        ErrorType::Upstream,
                        "invalid_upstream_response",
                        format!(
                            "The provider's answer was not valid ({}).",
                            self.record.attempt_summary()
                        ),
                    );
                    self.rewrite_error(&e, false)
                }
            };
        }
        let details = providers::error_details(provider.api, body);
        let e = match held.status {
            400 | 413 | 422 => {
                let status = held.status;
                let mut e = ApiError::new(
                    status,
                    ErrorType::InvalidRequest,
                    details.code.as_deref().unwrap_or("provider_error"),
                    details
                        .message
                        .unwrap_or_else(|| format!("The provider refused the request ({status}).")),
                );
                e.provider = Some(provider.id.clone());
                return self.rewrite_error(&e, true);
            }
            429 => {
                let mut e = ApiError::new(
                    429,
                    ErrorType::RateLimit,
                    "upstream_rate_limited",
                    format!(
                        "Every provider tried is rate limited ({}).",
                        self.record.attempt_summary()
                    ),
                );
                e.retry_after = held
                    .retry_after
                    .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
                e
            }
            408 => self.failed_timeout(),
            _ => self.failed_upstream(),
        };
        self.rewrite_error(&e, false)
    }

    pub(super) fn translate_success(
        &mut self,
        routed: &Routed,
        body: &[u8],
        event_stream: bool,
    ) -> Result<Rewrite, String> {
        let Routed { asked, provider, .. } = routed;
        let (content_type, mut out) = if asked.request.stream {
            if !event_stream {
                return Err("a stream was asked for but the answer is not text/event-stream".into());
            }
            let mut rewriter = new_rewriter(asked, provider);
            let mut out = Vec::new();
            rewriter.push(body, &mut out);
            rewriter.finish(&mut out);
            self.record.usage = rewriter.usage();
            ("text/event-stream", out)
        } else if asked.client.is_native(provider) {
            // The client's own API: passed as it came, but for the model's name.
            let (out, usage) = asked.client.native_answer(provider, &asked.stamp, body)?;
            self.record.usage = Some(usage);
            ("application/json", out)
        } else if provider.api == Api::Openai && asked.stamp.op == Operation::Chat {
            // Already a chat.completion: a few members change, the rest is copied.
            let (out, usage) = providers::openai::finish_chat(&asked.stamp, body)?;
            self.record.usage = Some(usage);
            ("application/json", out)
        } else {
            let (answer, usage) = providers::translate_answer(provider.api, &asked.request, body)?;
            self.record.usage = Some(usage);
            let out = serde_json::to_vec(&answer::finish(&asked.stamp, answer, usage)).map_err(|e| e.to_string())?;
            ("application/json", out)
        };
        if content_type == "application/json" && !asked.client.is_native(provider) {
            out = asked.client.answer(&asked.stamp, out)?;
        }
        self.redact(&mut out);
        self.record.status = 200;
        let mut set = vec![
            (":status".to_string(), "200".to_string()),
            ("content-type".to_string(), content_type.to_string()),
            ("content-length".to_string(), out.len().to_string()),
        ];
        set.extend(self.attempt_headers(true));
        Ok(Rewrite {
            status: 200,
            remove: Vec::new(),
            set,
            body: out,
        })
    }

    pub(super) fn failed_upstream(&self) -> ApiError {
        ApiError::new(
            502,
            ErrorType::Upstream,
            "upstream_error",
            format!("Every provider tried failed ({}).", self.record.attempt_summary()),
        )
    }

    pub(super) fn failed_timeout(&self) -> ApiError {
        ApiError::new(
            504,
            ErrorType::Upstream,
            "upstream_timeout",
            format!(
                "The provider did not answer in time ({}).",
                self.record.attempt_summary()
            ),
        )
    }

    /// The final answer `e`; `served`: it is the serving provider's own error.
    pub(super) fn rewrite_error(&mut self, e: &ApiError, served: bool) -> Rewrite {
        self.record.status = e.status;
        self.record.error_code = Some(e.code.clone());
        // A provider's own message (400/413/422) may echo the request.
        let mut body = self.api.error_body(e);
        self.redact(&mut body);
        let mut set = vec![(":status".to_string(), e.status.to_string())];
        set.extend(e.headers());
        set.push(("content-length".into(), body.len().to_string()));
        set.extend(self.attempt_headers(served));
        // Upstream headers that would describe the old body, or leak its origin.
        let remove = ["content-encoding", "transfer-encoding", "retry-after"]
            .map(String::from)
            .to_vec();
        Rewrite {
            status: e.status,
            remove,
            set,
            body,
        }
    }

    /// `x-waygate-attempts`, `x-waygate-provider` when a provider served,
    /// and the key's `x-ratelimit-*` when it is limited.
    pub(super) fn attempt_headers(&self, served: bool) -> Vec<Header> {
        let mut headers = self.record.standing.map(|s| s.headers()).unwrap_or_default();
        if served && let Some(p) = self.served_by() {
            headers.push(("x-waygate-provider".to_string(), p.to_string()));
        }
        if !self.record.attempts.is_empty() {
            headers.push(("x-waygate-attempts".to_string(), self.record.attempt_list()));
        }
        headers
    }
}

/// The serving provider's stream translated for the request asked: into
/// the internal chat stream, then into the client's API.
pub(super) fn new_rewriter(asked: &Asked, provider: &Provider) -> ClientStream {
    if asked.client.is_native(provider) {
        return asked.client.native_stream(provider);
    }
    let translator = providers::stream_translator(provider.api, &asked.request);
    let rewriter = StreamRewriter::new(translator, asked.stamp.clone(), asked.request.include_usage);
    // Deltas may split the credential, which the byte-level redaction of
    // each output cannot see: the rewriter scrubs the text itself.
    let rewriter = match provider.credential.as_ref().filter(|c| c.worth_scrubbing()) {
        Some(secret) => rewriter.redacting(secret),
        None => rewriter,
    };
    asked.client.stream(&asked.stamp, rewriter)
}

/// Contract §5: what makes a candidate be abandoned for the next one.
pub(super) fn retryable(status: u16, router_error: bool) -> bool {
    router_error || matches!(status, 401 | 403 | 404 | 408 | 409 | 429) || (500..=599).contains(&status)
}

/// Envoy's own replies to an `http_call` (connect failure, reset, timeout),
/// told apart from a provider's answer with the same status by their text.
pub(super) fn is_envoy_local_reply(status: u16, body: &[u8]) -> bool {
    match status {
        503 => body.starts_with(b"upstream connect error") || body.starts_with(b"no healthy upstream"),
        504 => body == b"upstream request timeout",
        _ => false,
    }
}
