//! The response path (Envoy's encoder side): the upstream's headers and body through the
//! plugin's `on_response_headers` / `on_response_body`, held, buffered or streamed as its
//! actions say, on to the downstream writer.

use bytes::Bytes;
use hyper::body::{Body as _, Frame};
use proxy_wasm_host::abi::v0_2_1::types::Action;

use super::convert::is_hop_by_hop;
use super::headers::Headers;
use super::{RespSource, Stream, UpstreamResult, wire};
use crate::access_log::flags;
use crate::local_reply::{self, reasons};
use crate::upstream::{UpstreamAddress, UpstreamError};

impl Stream {
    pub(super) fn upstream_headers(&mut self, result: UpstreamResult) {
        if self.done {
            return;
        }
        let response = match result {
            Ok(response) => response,
            Err(UpstreamError::NoHealthyUpstream(why)) => {
                self.logs().host(format!("no healthy upstream: {why}"));
                return self.router_reply(reasons::NO_HEALTHY_UPSTREAM);
            }
            Err(UpstreamError::ConnectFailure(why)) => {
                self.logs().host(format!("upstream connect failure: {why}"));
                return self.router_reply(reasons::CONNECT_FAILURE);
            }
            Err(UpstreamError::Terminated(why)) => {
                self.logs().host(format!("upstream reset before headers: {why}"));
                return self.router_reply(reasons::CONNECTION_TERMINATION);
            }
        };
        self.touch();
        self.upstream_headers_received = true;
        let (parts, body) = response.into_parts();
        self.upstream_host = parts.extensions.get::<UpstreamAddress>().map(|a| a.0);
        let mut headers = Headers::new(vec![(
            b":status".to_vec(),
            parts.status.as_u16().to_string().into_bytes(),
        )]);
        for (name, value) in &parts.headers {
            if !is_hop_by_hop(name.as_str()) {
                headers.add(name.as_str(), value.as_bytes());
            }
        }
        // router.cc adds this before the encoder filters see the headers.
        headers.set(
            "x-envoy-upstream-service-time",
            self.upstream_started.elapsed().as_millis().to_string().as_bytes(),
        );
        self.hs.props.response_code = Some(parts.status.as_u16());
        self.hs.props.code_details = Some("via_upstream".to_owned());
        let eos = body.is_end_stream();
        if eos {
            self.route_deadline = None;
        } else {
            self.resp_source = Some(RespSource::Upstream(body));
        }
        self.encode_headers(headers, eos);
    }

    pub(super) fn encode_headers(&mut self, headers: Headers, eos: bool) {
        self.encoding_started = true;
        self.hs.resp_headers = headers;
        // `encode*` callbacks are skipped when the context was never created, and after
        // a VM failure (`failure_local_reply_sent_`).
        if !self.filter_on() || !self.resp_via_plugin {
            return self.send_headers(eos);
        }
        self.hs.resp_headers_open = true;
        let count = wire(self.hs.resp_headers.len());
        let Some(action) = self.call(|scope, id| scope.on_response_headers(id, count, eos)) else {
            self.hs.resp_headers_open = false;
            if !self.done && !self.resp_headers_sent && self.filter_off && !self.decode_aborted_by_fail() {
                self.send_headers(eos);
            }
            return;
        };
        match self.forced(action) {
            Action::Continue => {
                self.hs.resp_headers_open = false;
                self.send_headers(eos);
            }
            Action::Pause => {
                self.resp_headers_held = true;
                self.resp_headers_eos = eos;
                self.resp_stop_all = !self.allow_stop_iteration;
            }
        }
        self.run_deferred();
    }

    /// True when a fail-closed 503 already replaced the response.
    fn decode_aborted_by_fail(&self) -> bool {
        self.hs.props.code_details.as_deref() == Some("wasm_fail_stream")
    }

    pub(super) fn response_frame(&mut self, frame: Option<Result<Frame<Bytes>, String>>) {
        self.touch();
        match frame {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    return;
                };
                let eos = match &self.resp_source {
                    Some(RespSource::Upstream(body)) => body.is_end_stream(),
                    _ => true,
                };
                if eos {
                    self.resp_source = None;
                    self.route_deadline = None;
                }
                self.response_data(data.to_vec(), eos);
            }
            None => {
                self.resp_source = None;
                self.route_deadline = None;
                self.response_data(Vec::new(), true);
            }
            Some(Err(why)) => {
                // Upstream reset after the router forwarded its headers: Envoy resets
                // the downstream stream.
                self.logs().host(format!("upstream reset mid-response: {why}"));
                self.resp_source = None;
                self.flag(flags::UPSTREAM_CONNECTION_TERMINATION);
                self.reset();
            }
        }
    }

    fn response_data(&mut self, data: Vec<u8>, eos: bool) {
        if self.done {
            return;
        }
        if !self.filter_on() || !self.resp_via_plugin {
            return self.send_data(data, eos);
        }
        if self.resp_headers_held && self.resp_stop_all {
            self.held_resp.extend_from_slice(&data);
            self.held_resp_eos = eos;
            return;
        }
        self.response_body_callback(data, eos);
    }

    fn response_body_callback(&mut self, data: Vec<u8>, eos: bool) {
        if self.resp_buffering {
            self.hs.resp_body.bytes.extend_from_slice(&data);
        } else {
            self.hs.resp_body.bytes = data;
        }
        self.resp_buffer_eos = eos;
        self.hs.resp_body_open = true;
        let size = wire(self.hs.resp_body.bytes.len());
        let Some(action) = self.call(|scope, id| scope.on_response_body(id, size, eos)) else {
            self.hs.resp_body_open = false;
            if !self.done && self.filter_off && !self.decode_aborted_by_fail() {
                let body = std::mem::take(&mut self.hs.resp_body.bytes);
                self.resp_buffering = false;
                self.flush_response(body, eos);
            }
            return;
        };
        match self.forced(action) {
            Action::Continue => {
                self.resp_buffering = false;
                self.hs.resp_body_open = false;
                let body = std::mem::take(&mut self.hs.resp_body.bytes);
                self.flush_response(body, eos);
            }
            Action::Pause => self.resp_buffering = true,
        }
        self.run_deferred();
        // `responseDataTooLarge`: 500 if the headers have not gone out, else reset.
        if self.resp_buffering && !self.done && self.hs.resp_body.bytes.len() > self.buffer_limit {
            self.hs.resp_body_open = false;
            if self.resp_headers_sent {
                self.reset();
            } else {
                self.local_reply(local_reply::from_reason(reasons::RESPONSE_TOO_LARGE, self.is_head));
            }
        }
    }

    fn flush_response(&mut self, body: Vec<u8>, eos: bool) {
        if self.resp_headers_held {
            self.resp_headers_held = false;
            self.hs.resp_headers_open = false;
            self.send_headers(false);
        }
        self.send_data(body, eos);
    }

    pub(super) fn resume_response(&mut self) {
        if self.done {
            return;
        }
        if self.resp_headers_held {
            self.resp_headers_held = false;
            self.hs.resp_headers_open = false;
            let headers_eos = self.resp_headers_eos;
            self.send_headers(headers_eos);
            if self.resp_stop_all {
                let data = std::mem::take(&mut self.held_resp);
                let eos = self.held_resp_eos;
                if !headers_eos && (!data.is_empty() || eos) {
                    self.response_body_callback(data, eos);
                }
            } else if self.resp_buffering {
                self.flush_buffered_response();
            }
        } else if self.resp_buffering {
            self.flush_buffered_response();
        } else {
            self.logs().host("resume_http_response() called while the response is not paused (Envoy asserts on this in debug builds); ignored");
        }
    }

    fn flush_buffered_response(&mut self) {
        self.resp_buffering = false;
        self.hs.resp_body_open = false;
        let body = std::mem::take(&mut self.hs.resp_body.bytes);
        let eos = self.resp_buffer_eos;
        self.send_data(body, eos);
    }
}
