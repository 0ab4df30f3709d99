//! The request path (Envoy's decoder side): the request headers through the plugin, the
//! body as it arrives (held, buffered or streamed as the plugin's actions say), the route
//! chosen on the headers the plugin left, and the upstream request the router sends.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::Request;
use hyper::body::{Body as _, Frame, Incoming};
use proxy_wasm_host::abi::v0_2_1::StreamKind;
use proxy_wasm_host::abi::v0_2_1::types::Action;
use tokio::sync::{mpsc, oneshot};

use super::convert::{declared_length, request_headers, upstream_request};
use super::headers::Headers;
use super::{RespSource, Stream, request_id, wire};
use crate::body::{HostBody, Reset};
use crate::config::{FailurePolicy, RouteAction};
use crate::local_reply::{self, reasons};
use crate::router;

impl Stream {
    pub(super) fn start(&mut self, request: Request<Incoming>) {
        let (parts, body) = request.into_parts();
        self.is_head = parts.method == hyper::Method::HEAD;
        let mut headers = request_headers(&parts);
        if !headers.contains("x-request-id") {
            headers.set("x-request-id", request_id::new().as_bytes());
        }
        let ends_with_headers = body.is_end_stream();
        self.req_had_body = !ends_with_headers;
        if !ends_with_headers {
            self.req_body = Some(body);
        }
        // xds.route_name / xds.cluster_name before routing reflect the route matched on
        // the original headers (semantics §1.4.2).
        self.note_route(&headers);
        self.hs.req_headers = headers;

        let Some(vm_rc) = self.ctx.vm.clone() else {
            return self.forward_request_headers();
        };
        let created = {
            let Ok(mut vm) = vm_rc.try_borrow_mut() else {
                self.logs().host("internal error: the VM is busy at stream start");
                return self.reset();
            };
            if vm.failed {
                None
            } else {
                let root = vm.root;
                let entered = Instant::now();
                let mut scope = vm.guest.enter_root();
                let created = scope
                    .on_context_create(Some(root))
                    .and_then(|id| scope.expect_stream_kind(id, StreamKind::Http).map(|()| id));
                drop(scope);
                self.in_guest = self.in_guest.saturating_add(entered.elapsed());
                match created {
                    Ok(id) => {
                        let (tx, rx) = mpsc::unbounded_channel();
                        vm.streams.insert(id.get(), tx);
                        self.events = rx;
                        Some(Ok(id))
                    }
                    Err(e) => {
                        if vm.guest.is_poisoned() {
                            vm.failed = true;
                        }
                        Some(Err(e))
                    }
                }
            }
        };
        match created {
            Some(Ok(id)) => self.context = Some(id),
            Some(Err(e)) => {
                self.logs().host(format!("on_context_create failed: {e}"));
                self.context = None;
                self.filter_off = true;
                return self.failed_at_start();
            }
            // A failed VM: fail closed answers 503 to every later request on this
            // worker; fail open does not install the filter (1.36-era createContext).
            None => return self.failed_at_start(),
        }

        self.hs.req_headers_open = true;
        let count = wire(self.hs.req_headers.len());
        let Some(action) = self.call(|scope, id| scope.on_request_headers(id, count, ends_with_headers)) else {
            self.hs.req_headers_open = false;
            if !self.decode_aborted && !self.done {
                self.forward_request_headers();
            }
            return;
        };
        match self.forced(action) {
            Action::Continue => {
                self.hs.req_headers_open = false;
                self.forward_request_headers();
            }
            Action::Pause => {
                self.req_headers_held = true;
                // Without allow_on_headers_stop_iteration, Pause is
                // StopAllIterationAndWatermark: no body callback until resumed.
                self.req_stop_all = !self.allow_stop_iteration;
            }
        }
        self.run_deferred();
    }

    fn failed_at_start(&mut self) {
        self.filter_off = true;
        let policy = self.failure_policy();
        match policy {
            FailurePolicy::FailClosed => {
                self.local_reply(local_reply::from_reason(reasons::WASM_FAIL_STREAM, self.is_head));
            }
            FailurePolicy::FailOpen => self.forward_request_headers(),
        }
    }

    fn note_route(&mut self, headers: &Headers) {
        let matched = router::select(&self.ctx.listener.route_config, headers);
        self.hs.props.route_name = matched.as_ref().map(|m| m.route.name.clone());
        self.hs.props.cluster_name = matched.and_then(|m| match &m.route.action {
            RouteAction::Cluster { cluster, .. } => Some(cluster.clone()),
            RouteAction::Direct { .. } => None,
        });
    }

    pub(super) fn request_frame(&mut self, frame: Option<Result<Frame<Bytes>, hyper::Error>>) {
        self.touch();
        match frame {
            Some(Ok(frame)) => {
                let Ok(data) = frame.into_data() else {
                    return; // trailers: not delivered (see README)
                };
                self.bytes_received += data.len() as u64;
                let eos = self.req_body.as_ref().is_none_or(|b| b.is_end_stream());
                if eos {
                    self.req_body = None;
                }
                self.request_data(data.to_vec(), eos);
            }
            // A chunked body ends with an empty data callback with end_of_stream (the
            // HTTP/1 codec's terminating chunk, semantics §1.2.5).
            None => {
                self.req_body = None;
                self.request_data(Vec::new(), true);
            }
            Some(Err(_)) => self.client_gone(),
        }
    }

    fn request_data(&mut self, data: Vec<u8>, eos: bool) {
        if self.decode_aborted {
            return;
        }
        if !self.filter_on() {
            self.forward_data(data, eos);
            return;
        }
        if self.req_headers_held && self.req_stop_all {
            self.held_req.extend_from_slice(&data);
            self.held_req_eos = eos;
            return;
        }
        self.request_body_callback(data, eos);
    }

    fn request_body_callback(&mut self, data: Vec<u8>, eos: bool) {
        // context.cc `decodeData`: after a Pause the chunk joins the buffered body and the
        // plugin sees all of it; after a Continue only the current chunk.
        if self.req_buffering {
            self.hs.req_body.bytes.extend_from_slice(&data);
        } else {
            self.hs.req_body.bytes = data;
        }
        self.req_buffer_eos = eos;
        self.hs.req_body_open = true;
        let size = wire(self.hs.req_body.bytes.len());
        let Some(action) = self.call(|scope, id| scope.on_request_body(id, size, eos)) else {
            self.hs.req_body_open = false;
            if !self.decode_aborted && !self.done {
                let body = std::mem::take(&mut self.hs.req_body.bytes);
                self.req_buffering = false;
                self.flush_request(body, eos);
            }
            return;
        };
        match self.forced(action) {
            Action::Continue => {
                self.req_buffering = false;
                self.hs.req_body_open = false;
                let body = std::mem::take(&mut self.hs.req_body.bytes);
                self.flush_request(body, eos);
            }
            Action::Pause => self.req_buffering = true,
        }
        self.run_deferred();
        // StopIterationAndBuffer past the buffer limit: Envoy's own 413
        // (`requestDataTooLarge`), and the VM is not called for this body again.
        if self.req_buffering && !self.decode_aborted && self.hs.req_body.bytes.len() > self.buffer_limit {
            self.hs.req_body_open = false;
            self.router_reply(reasons::REQUEST_TOO_LARGE);
        }
    }

    /// A body Continue: forwards held headers first, then the (modified) buffer.
    fn flush_request(&mut self, body: Vec<u8>, eos: bool) {
        if self.req_headers_held {
            self.req_headers_held = false;
            self.hs.req_headers_open = false;
            self.forward_request_headers();
        }
        self.forward_data(body, eos);
    }

    pub(super) fn resume_request(&mut self) {
        if self.decode_aborted || self.done {
            return;
        }
        if self.req_headers_held {
            self.req_headers_held = false;
            self.hs.req_headers_open = false;
            self.forward_request_headers();
            if self.req_stop_all {
                // Envoy delivers what it buffered meanwhile in one body callback
                // (`iterate_from_current_filter_`), then later chunks as they come.
                let data = std::mem::take(&mut self.held_req);
                let eos = self.held_req_eos;
                if !data.is_empty() || eos {
                    self.request_body_callback(data, eos);
                }
            } else if self.req_buffering {
                self.flush_buffered_request();
            }
        } else if self.req_buffering {
            self.flush_buffered_request();
        } else {
            // Envoy would ASSERT in a debug build: resuming a stream that is not stopped.
            self.logs().host("resume_http_request() called while the request is not paused (Envoy asserts on this in debug builds); ignored");
        }
    }

    fn flush_buffered_request(&mut self) {
        self.req_buffering = false;
        self.hs.req_body_open = false;
        let body = std::mem::take(&mut self.hs.req_body.bytes);
        let eos = self.req_buffer_eos;
        self.forward_data(body, eos);
    }

    // ---------------------------------------------------------------- router

    /// The router's `decodeHeaders`: match the route on the current headers and start the
    /// upstream request, or answer locally.
    fn forward_request_headers(&mut self) {
        if self.decode_aborted || self.done || self.routed {
            return;
        }
        self.routed = true;
        let listener = Arc::clone(&self.ctx.listener);
        let Some(matched) = router::select(&listener.route_config, &self.hs.req_headers) else {
            self.hs.props.route_name = None;
            return self.router_reply(reasons::ROUTE_NOT_FOUND);
        };
        let route = Arc::clone(&matched.route);
        self.hs.props.route_name = Some(route.name.clone());
        let (cluster, timeout, idle_timeout, host_rewrite) = match &route.action {
            RouteAction::Direct { status, body } => {
                self.hs.props.cluster_name = None;
                let reply = local_reply::build(
                    *status,
                    Vec::new(),
                    body.clone().unwrap_or_default(),
                    "direct_response",
                    self.is_head,
                );
                return self.local_reply(reply);
            }
            RouteAction::Cluster {
                cluster,
                timeout,
                idle_timeout,
                host_rewrite_literal,
            } => (cluster.clone(), *timeout, *idle_timeout, host_rewrite_literal.clone()),
        };
        self.hs.props.cluster_name = Some(cluster.clone());
        let mut headers = self.hs.req_headers.clone();
        for name in route
            .request_headers_to_remove
            .iter()
            .chain(matched.virtual_host.request_headers_to_remove.iter())
        {
            headers.remove(name);
        }
        if let Some(host) = host_rewrite {
            headers.set(":authority", host.as_bytes());
        }
        // Envoy's router lets `x-envoy-upstream-rq-timeout-ms` (set by a filter, or by a
        // trusted client) override the route's timeout, 0 meaning none, and strips it
        // before the upstream (router.cc `FilterUtility::finalTimeout`).
        let timeout = match headers
            .first_str("x-envoy-upstream-rq-timeout-ms")
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms)),
            None => timeout,
        };
        headers.remove("x-envoy-upstream-rq-timeout-ms");
        self.route_timeout = timeout;
        if let Some(idle) = idle_timeout {
            self.idle_timeout = Some(idle);
            self.touch();
        }
        if !self.ctx.access_logs.is_empty() {
            self.routed_request = Some(headers.clone());
        }
        self.up_declared = declared_length(&headers);
        let headers_only = !self.req_had_body;
        let (tx, body) = HostBody::after_headers(headers_only);
        self.up_tx = tx;
        if let Some(timeout) = timeout {
            // Not visible to the plugin: the router adds it to the upstream request only.
            headers.set(
                "x-envoy-expected-rq-timeout-ms",
                timeout.as_millis().to_string().as_bytes(),
            );
        }
        let request = match upstream_request(&headers, body) {
            Ok(request) => request,
            Err(problem) => {
                self.logs()
                    .host(format!("cannot build the upstream request: {problem}"));
                return self.local_reply(local_reply::build(
                    400,
                    Vec::new(),
                    b"Bad Request".to_vec(),
                    "waygate_host_bad_upstream_request",
                    self.is_head,
                ));
            }
        };
        let (tx, rx) = oneshot::channel();
        self.upstream_pending = Some(rx);
        self.upstream_started = Instant::now();
        let pool = Rc::clone(&self.ctx.pool);
        tokio::task::spawn_local(async move {
            let result = pool.send(&cluster, request).await;
            let _ = tx.send(result);
        });
        if headers_only {
            self.start_route_timer();
        }
    }

    /// Route timeout counts from the end of the downstream request (router.cc).
    fn start_route_timer(&mut self) {
        self.route_deadline = self.route_timeout.map(|t| tokio::time::Instant::now() + t);
    }

    /// Data leaving the plugin towards the upstream. The host never fixes
    /// `content-length`: a disagreement is the plugin's bug, so it fails loudly.
    fn forward_data(&mut self, data: Vec<u8>, eos: bool) {
        if self.decode_aborted || self.done || !self.routed {
            return;
        }
        let Some(tx) = self.up_tx.clone() else {
            return;
        };
        self.up_sent += data.len() as u64;
        if let Some(declared) = self.up_declared
            && (self.up_sent > declared || (eos && self.up_sent != declared))
        {
            let message = format!(
                "request content-length {declared} disagrees with the {}{} body bytes forwarded upstream; Envoy does not fix content-length, the filter must (semantics §1.4.3)",
                if eos { "" } else { "more than " },
                self.up_sent
            );
            return self.host_failure(&message);
        }
        if !data.is_empty() && tx.send(Ok(Bytes::from(data))).is_err() {
            return;
        }
        if eos {
            self.up_tx = None;
            self.start_route_timer();
        }
    }

    pub(super) fn abort_upstream(&mut self) {
        if let Some(tx) = self.up_tx.take() {
            let _ = tx.send(Err(Reset));
        }
        self.upstream_pending = None;
        if matches!(self.resp_source, Some(RespSource::Upstream(_))) {
            self.resp_source = None;
        }
        self.route_deadline = None;
    }
}
