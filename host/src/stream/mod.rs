//! One HTTP stream through the plugin and the router, as Envoy's filter manager runs it
//! with one wasm filter followed by `envoy.filters.http.router`.
//!
//! Request: headers → `on_request_headers` → body chunks as they arrive → the router
//! (route chosen on the headers as they are when they leave the plugin) → upstream.
//! Response: upstream headers → `on_response_headers` → body chunks streamed as they
//! arrive → downstream. Every rule in `envoy-host-semantics.md` §1.2–1.8 that the plugin
//! can observe is here; each place says which Envoy file it mirrors.
//!
//! The whole machine is synchronous: callbacks and their deferred actions run to the end
//! between two events, so nothing re-enters the VM (trap 13). The only awaits are in
//! [`Stream::run`], which waits for the next event: a request chunk, the upstream
//! response, a response chunk, an `http_call` result, a timer, or the client leaving.

pub mod body;
pub mod headers;
pub mod properties;
mod request_id;
pub mod state;
mod timer;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Frame, Incoming};
use hyper::{Request, Response};
use proxy_wasm_host::abi::v0_2_1::types::{Action, StreamType};
use proxy_wasm_host::abi::v0_2_1::{
    CallScope, CalloutId, ContextId, GuestError, HttpCallResponse, LocalResponse, StreamKind,
};
use tokio::sync::{mpsc, oneshot};

use crate::access_log::{self, Logger, flags};
use crate::body::{ChunkSender, HostBody, Reset};
use crate::config::{FailurePolicy, Listener, RouteAction};
use crate::guest_time::GuestTime;
use crate::local_reply::{self, LocalReply, reasons};
use crate::logs::LogStore;
use crate::upstream::{Pool, UpstreamAddress, UpstreamError};
use crate::vm::WorkerVm;
use crate::{calls, router};
use headers::Headers;
use state::{Deferred, HttpState};

/// What reaches a stream from outside its own event loop.
pub enum StreamEvent {
    CallResponse {
        callout: CalloutId,
        response: HttpCallResponse<'static>,
    },
}

/// One listener on one worker.
pub struct ListenerCtx {
    pub listener: Arc<Listener>,
    pub vm: Option<Rc<RefCell<WorkerVm>>>,
    pub pool: Rc<Pool>,
    pub logs: LogStore,
    /// The HCM's access loggers, written when a stream is over.
    pub access_logs: Arc<Vec<Logger>>,
    /// Time in the guest per stream, for the admin's `/host/guest_time`.
    pub guest_time: Arc<GuestTime>,
}

/// The downstream connection a stream arrived on.
pub struct ConnInfo {
    pub id: u64,
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

type Head = Result<Response<HostBody>, Reset>;
type UpstreamResult = Result<Response<Incoming>, UpstreamError>;

/// The hyper service: runs the stream on its own task (so `on_log`/`on_done`/`on_delete`
/// still run when the client goes away) and waits for the response head.
pub async fn handle(
    ctx: Rc<ListenerCtx>,
    conn: Rc<ConnInfo>,
    request: Request<Incoming>,
) -> Result<Response<HostBody>, Reset> {
    let (head_tx, head_rx) = oneshot::channel();
    tokio::task::spawn_local(async move {
        // Boxed: the stream is large, and a task's future is moved whole when spawned.
        let stream = Box::new(Stream::new(ctx, &conn, head_tx));
        stream.run(request).await;
    });
    match head_rx.await {
        Ok(head) => head,
        Err(_) => Err(Reset),
    }
}

enum RespSource {
    Upstream(Incoming),
    Local(Option<Bytes>),
}

enum Wake {
    Request(Option<Result<Frame<Bytes>, hyper::Error>>),
    Upstream(Result<UpstreamResult, oneshot::error::RecvError>),
    Response(Option<Result<Frame<Bytes>, String>>),
    Event(StreamEvent),
    RouteTimeout,
    IdleTimeout,
    ClientGone,
}

struct Stream {
    ctx: Rc<ListenerCtx>,
    hs: HttpState,
    context: Option<ContextId>,
    /// The filter no longer runs (VM failed); `context` stays for bookkeeping.
    filter_off: bool,
    allow_stop_iteration: bool,
    events: mpsc::UnboundedReceiver<StreamEvent>,
    is_head: bool,
    buffer_limit: usize,

    // Downstream.
    head_tx: Option<oneshot::Sender<Head>>,
    body_tx: Option<ChunkSender>,
    resp_headers_sent: bool,
    down_declared: Option<u64>,
    down_sent: u64,
    done: bool,

    // Decode side.
    req_body: Option<Incoming>,
    req_had_body: bool,
    req_headers_held: bool,
    req_stop_all: bool,
    held_req: Vec<u8>,
    held_req_eos: bool,
    req_buffering: bool,
    req_buffer_eos: bool,
    decode_aborted: bool,

    // Router.
    routed: bool,
    up_tx: Option<ChunkSender>,
    up_declared: Option<u64>,
    up_sent: u64,
    upstream_pending: Option<oneshot::Receiver<UpstreamResult>>,
    upstream_headers_received: bool,
    upstream_started: Instant,
    route_timeout: Option<Duration>,
    route_deadline: Option<tokio::time::Instant>,
    idle_timeout: Option<Duration>,
    idle_deadline: Option<tokio::time::Instant>,
    /// Fires at the earlier of the two deadlines.
    timer: timer::Timer,

    // Encode side.
    encoding_started: bool,
    resp_via_plugin: bool,
    resp_source: Option<RespSource>,
    resp_headers_held: bool,
    resp_headers_eos: bool,
    resp_stop_all: bool,
    held_resp: Vec<u8>,
    held_resp_eos: bool,
    resp_buffering: bool,
    resp_buffer_eos: bool,

    // Access log.
    started: Instant,
    start_time: SystemTime,
    bytes_received: u64,
    response_flags: Vec<&'static str>,
    /// The request headers as the router left them (Envoy's router edits the downstream
    /// map in place: `request_headers_to_remove`, `host_rewrite_literal`, ...).
    routed_request: Option<Headers>,
    upstream_host: Option<SocketAddr>,
    /// Wall time inside the VM so far, summed over this stream's callbacks.
    in_guest: Duration,
}

impl Stream {
    fn new(ctx: Rc<ListenerCtx>, conn: &ConnInfo, head_tx: oneshot::Sender<Head>) -> Self {
        let (_unused_tx, events) = mpsc::unbounded_channel();
        let listener = Arc::clone(&ctx.listener);
        let mut hs = HttpState::default();
        let start_time = SystemTime::now();
        hs.props.source = Some(conn.peer);
        hs.props.destination = Some(conn.local);
        hs.props.connection_id = conn.id;
        hs.props.start_time_nanos = start_time
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
        let allow_stop_iteration = listener
            .wasm
            .as_ref()
            .is_some_and(|w| w.allow_on_headers_stop_iteration);
        Self {
            ctx,
            hs,
            context: None,
            filter_off: false,
            allow_stop_iteration,
            events,
            is_head: false,
            buffer_limit: listener.buffer_limit,
            head_tx: Some(head_tx),
            body_tx: None,
            resp_headers_sent: false,
            down_declared: None,
            down_sent: 0,
            done: false,
            req_body: None,
            req_had_body: false,
            req_headers_held: false,
            req_stop_all: false,
            held_req: Vec::new(),
            held_req_eos: false,
            req_buffering: false,
            req_buffer_eos: false,
            decode_aborted: false,
            routed: false,
            up_tx: None,
            up_declared: None,
            up_sent: 0,
            upstream_pending: None,
            upstream_headers_received: false,
            upstream_started: Instant::now(),
            route_timeout: None,
            route_deadline: None,
            idle_timeout: listener.stream_idle_timeout,
            idle_deadline: None,
            timer: timer::Timer::default(),
            encoding_started: false,
            resp_via_plugin: true,
            resp_source: None,
            resp_headers_held: false,
            resp_headers_eos: false,
            resp_stop_all: false,
            held_resp: Vec::new(),
            held_resp_eos: false,
            resp_buffering: false,
            resp_buffer_eos: false,
            started: Instant::now(),
            start_time,
            bytes_received: 0,
            response_flags: Vec::new(),
            routed_request: None,
            upstream_host: None,
            in_guest: Duration::ZERO,
        }
    }

    async fn run(mut self: Box<Self>, request: Request<Incoming>) {
        self.touch();
        self.start(request);
        while !self.done {
            let wake = tokio::select! {
                frame = next_request_frame(&mut self.req_body), if self.can_read_request() => Wake::Request(frame),
                result = pending_upstream(&mut self.upstream_pending) => Wake::Upstream(result),
                frame = next_response_frame(&mut self.resp_source), if self.can_read_response() => Wake::Response(frame),
                Some(event) = self.events.recv() => Wake::Event(event),
                () = self.timer.reached(earliest(self.route_deadline, self.idle_deadline)) => self.expired(),
                () = downstream_closed(&mut self.head_tx, &self.body_tx) => Wake::ClientGone,
            };
            self.wake(wake);
        }
        self.finish();
    }

    fn wake(&mut self, wake: Wake) {
        match wake {
            Wake::Request(frame) => self.request_frame(frame),
            Wake::Upstream(result) => {
                self.upstream_pending = None;
                match result {
                    Ok(result) => self.upstream_headers(result),
                    Err(_) => self.router_reply(reasons::CONNECTION_TERMINATION),
                }
            }
            Wake::Response(frame) => self.response_frame(frame),
            Wake::Event(StreamEvent::CallResponse { callout, response }) => {
                self.http_call_response(callout, response);
            }
            Wake::RouteTimeout => {
                self.route_deadline = None;
                // Router `onResponseTimeout`: 504 while awaiting headers, else a reset.
                if self.upstream_headers_received {
                    self.flag(flags::UPSTREAM_REQUEST_TIMEOUT);
                    self.reset();
                } else {
                    self.router_reply(reasons::RESPONSE_TIMEOUT);
                }
            }
            Wake::IdleTimeout => {
                self.idle_deadline = None;
                // HCM `onIdleTimeout`: 408 if no response headers went out, else reset.
                if self.resp_headers_sent {
                    self.flag(flags::STREAM_IDLE_TIMEOUT);
                    self.reset();
                } else {
                    self.router_reply(reasons::STREAM_IDLE_TIMEOUT);
                }
            }
            Wake::ClientGone => self.client_gone(),
        }
    }

    /// Which timeout the stream's timer fired for: the route's when both are due.
    fn expired(&self) -> Wake {
        let now = tokio::time::Instant::now();
        if self.route_deadline.is_some_and(|d| d <= now) {
            Wake::RouteTimeout
        } else {
            Wake::IdleTimeout
        }
    }

    /// `StreamInfo::setResponseFlag`: each flag once, in the order set.
    fn flag(&mut self, flag: &'static str) {
        if !self.response_flags.contains(&flag) {
            self.response_flags.push(flag);
        }
    }

    fn touch(&mut self) {
        self.idle_deadline = self.idle_timeout.map(|t| tokio::time::Instant::now() + t);
    }

    fn can_read_request(&self) -> bool {
        // StopAllIterationAndWatermark: data is buffered under flow control, so past the
        // limit we stop reading (backpressure), never a 413.
        self.req_body.is_some()
            && !self.decode_aborted
            && !(self.req_headers_held && self.req_stop_all && self.held_req.len() > self.buffer_limit)
    }

    fn can_read_response(&self) -> bool {
        self.resp_source.is_some()
            && !(self.resp_headers_held && self.resp_stop_all && self.held_resp.len() > self.buffer_limit)
    }

    fn filter_on(&self) -> bool {
        self.context.is_some() && !self.filter_off
    }

    fn logs(&self) -> &LogStore {
        &self.ctx.logs
    }

    // ---------------------------------------------------------------- the VM

    /// Runs one callback with this stream's state lent to the guest. `None` when the VM
    /// failed (the failure policy has then been applied) or refused the call.
    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut CallScope<'_, HttpState>, ContextId) -> Result<T, GuestError>,
    ) -> Option<T> {
        let context = self.context.filter(|_| !self.filter_off)?;
        let vm_rc = self.ctx.vm.clone()?;
        let outcome = {
            let Ok(mut vm) = vm_rc.try_borrow_mut() else {
                self.logs()
                    .host("internal error: the VM is busy (re-entrant call refused)");
                return None;
            };
            if vm.failed {
                Err(None)
            } else {
                let state = std::mem::take(&mut self.hs);
                let entered = Instant::now();
                let mut scope = vm.guest.enter(state);
                let result = f(&mut scope, context);
                self.hs = scope.finish();
                self.in_guest = self.in_guest.saturating_add(entered.elapsed());
                match result {
                    Ok(value) => Ok(value),
                    Err(error) => {
                        let poisoned = vm.guest.is_poisoned();
                        if poisoned {
                            vm.failed = true;
                        }
                        Err(Some((error, poisoned)))
                    }
                }
            }
        };
        calls::spawn_pending(&self.ctx);
        match outcome {
            Ok(value) => Some(value),
            Err(Some((error, false))) => {
                self.logs().host(format!("a callback was refused: {error}"));
                None
            }
            Err(detail) => {
                if let Some((error, _)) = detail {
                    let name = self.ctx.listener.wasm.as_ref().map_or("", |w| w.name.as_str());
                    self.logs().host(format!(
                        "wasm VM of plugin {name} failed: {error}; it stays failed on this worker"
                    ));
                }
                self.vm_failed();
                None
            }
        }
    }

    /// Envoy `CHECK_FAIL_HTTP`: fail open continues without the filter; fail closed sends
    /// 503 `wasm_fail_stream` (or resets when the response has started).
    fn vm_failed(&mut self) {
        self.filter_off = true;
        self.hs.deferred.clear();
        let policy = self
            .ctx
            .listener
            .wasm
            .as_ref()
            .map_or(FailurePolicy::FailClosed, |w| w.failure_policy);
        if policy == FailurePolicy::FailClosed {
            self.local_reply(local_reply::from_reason(reasons::WASM_FAIL_STREAM, self.is_head));
        }
    }

    /// The callback's action, forced to Pause when it sent a local reply (context.cc:
    /// `stopNextIteration(true)` after `sendLocalResponse`).
    fn forced(&self, action: Action) -> Action {
        if self.hs.local_reply_queued() {
            Action::Pause
        } else {
            action
        }
    }

    /// The actions a callback queued, in order, after it returned.
    fn run_deferred(&mut self) {
        let actions = std::mem::take(&mut self.hs.deferred);
        let mut replied = false;
        for action in actions {
            if self.done {
                break;
            }
            match action {
                Deferred::LocalReply(response) => {
                    if replied {
                        self.logs()
                            .host("a second send_local_response in one callback was ignored");
                        continue;
                    }
                    replied = true;
                    self.plugin_reply(response);
                }
                Deferred::Continue(StreamType::HttpRequest) => self.resume_request(),
                Deferred::Continue(_) => self.resume_response(),
                Deferred::Close => {
                    self.hs.props.code_details = Some("wasm_close_stream".to_owned());
                    self.reset();
                }
            }
        }
    }

    // ---------------------------------------------------------------- request path

    fn start(&mut self, request: Request<Incoming>) {
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
        let policy = self
            .ctx
            .listener
            .wasm
            .as_ref()
            .map_or(FailurePolicy::FailClosed, |w| w.failure_policy);
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

    fn request_frame(&mut self, frame: Option<Result<Frame<Bytes>, hyper::Error>>) {
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

    fn resume_request(&mut self) {
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
        let body = if headers_only {
            HostBody::Empty
        } else {
            let (tx, body) = HostBody::channel();
            self.up_tx = Some(tx);
            body
        };
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

    fn abort_upstream(&mut self) {
        if let Some(tx) = self.up_tx.take() {
            let _ = tx.send(Err(Reset));
        }
        self.upstream_pending = None;
        if matches!(self.resp_source, Some(RespSource::Upstream(_))) {
            self.resp_source = None;
        }
        self.route_deadline = None;
    }

    /// A bug the host refuses to paper over: logged loudly, answered 500 (or reset).
    fn host_failure(&mut self, message: &str) {
        self.logs().host(format!("FILTER BUG: {message}"));
        self.abort_upstream();
        self.decode_aborted = true;
        if self.resp_headers_sent {
            return self.reset();
        }
        self.encoding_started = true; // direct: do not run the plugin on it
        let reply = local_reply::build(
            500,
            Vec::new(),
            format!("waygate-host: {message}").into_bytes(),
            "waygate_host_filter_bug",
            self.is_head,
        );
        self.local_reply(reply);
    }

    // ---------------------------------------------------------------- response path

    fn upstream_headers(&mut self, result: UpstreamResult) {
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

    fn encode_headers(&mut self, headers: Headers, eos: bool) {
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

    fn response_frame(&mut self, frame: Option<Result<Frame<Bytes>, String>>) {
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

    fn resume_response(&mut self) {
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

    // ---------------------------------------------------------------- local replies

    fn router_reply(&mut self, reason: (u16, &str, &str)) {
        if let Some(flag) = flags::for_details(reason.2) {
            self.flag(flag);
        }
        let reply = local_reply::from_reason(reason, self.is_head);
        self.local_reply(reply);
    }

    /// `send_http_response` from the plugin (details `""` from the Rust SDK).
    fn plugin_reply(&mut self, response: LocalResponse<'static>) {
        let status = u16::try_from(response.status_code).unwrap_or(500);
        let details = String::from_utf8_lossy(&response.status_code_details).into_owned();
        let headers = response
            .headers
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let reply = local_reply::build(status, headers, response.body.into_owned(), &details, self.is_head);
        self.local_reply(reply);
    }

    /// `FilterManager::sendLocalReply`: through the encoder filters (the plugin's own
    /// response callbacks included) when no response headers exist yet; a direct reply
    /// that replaces them and skips the filters when they exist but have not gone out;
    /// a reset once they have.
    fn local_reply(&mut self, reply: LocalReply) {
        if self.done {
            return;
        }
        if self.resp_headers_sent {
            return self.reset();
        }
        self.decode_aborted = true;
        self.req_body = None;
        self.abort_upstream();
        self.hs.props.response_code = Some(reply.status());
        self.hs.props.code_details = Some(reply.details.clone());
        let eos = reply.body.is_empty();
        if self.encoding_started {
            self.resp_headers_held = false;
            self.resp_buffering = false;
            self.hs.resp_headers_open = false;
            self.hs.resp_body_open = false;
            self.held_resp.clear();
            self.resp_via_plugin = false;
            self.resp_source = None;
            self.hs.resp_headers = reply.headers;
            self.send_headers(eos);
            if !eos {
                self.send_data(reply.body, true);
            }
        } else {
            if !eos {
                self.resp_source = Some(RespSource::Local(Some(Bytes::from(reply.body))));
            }
            self.encode_headers(reply.headers, eos);
        }
    }

    // ---------------------------------------------------------------- downstream

    fn send_headers(&mut self, eos: bool) {
        if self.done || self.resp_headers_sent {
            return;
        }
        self.resp_headers_sent = true;
        let headers = &self.hs.resp_headers;
        let status = headers
            .first_str(":status")
            .and_then(|s| s.parse::<u16>().ok())
            .and_then(|s| hyper::StatusCode::from_u16(s).ok());
        let Some(status) = status else {
            self.logs().host("FILTER BUG: response :status is missing or invalid");
            return self.reset();
        };
        self.down_declared = if self.is_head { None } else { declared_length(headers) };
        let mut map = hyper::HeaderMap::with_capacity(headers.len() + 1);
        for (name, value) in headers.pairs() {
            if name.first() == Some(&b':') || is_hop_by_hop_bytes(name) || name == b"date" || name == b"server" {
                continue;
            }
            match (header_name(name), header_value(value)) {
                (Ok(name), Ok(value)) => {
                    map.append(name, value);
                }
                (Err(e), _) | (_, Err(e)) => {
                    self.logs().host(format!("FILTER BUG: invalid response header: {e}"));
                    return self.reset();
                }
            }
        }
        // The HCM stamps `server: envoy`; `date` is added by hyper, as Envoy's codec does.
        map.insert(hyper::header::SERVER, hyper::header::HeaderValue::from_static("envoy"));
        let body = if eos {
            HostBody::Empty
        } else {
            let (tx, body) = HostBody::channel();
            self.body_tx = Some(tx);
            body
        };
        let mut response = Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = map;
        if let Some(tx) = self.head_tx.take() {
            let _ = tx.send(Ok(response));
        }
        if eos {
            if let Some(declared) = self.down_declared
                && declared != 0
                && status != hyper::StatusCode::NO_CONTENT
                && status != hyper::StatusCode::NOT_MODIFIED
            {
                self.logs().host(format!(
                    "FILTER BUG: response content-length {declared} but the response has no body"
                ));
            }
            self.done = true;
        }
    }

    fn send_data(&mut self, data: Vec<u8>, eos: bool) {
        if self.done {
            return;
        }
        if !self.resp_headers_sent {
            self.send_headers(false);
        }
        self.down_sent += data.len() as u64;
        if let Some(declared) = self.down_declared
            && (self.down_sent > declared || (eos && self.down_sent != declared))
        {
            self.logs().host(format!(
                "FILTER BUG: response content-length {declared} disagrees with the {}{} body bytes sent downstream; Envoy does not fix content-length, so the client would see a broken response (reset here)",
                if eos { "" } else { "more than " },
                self.down_sent
            ));
            return self.reset();
        }
        if let Some(tx) = &self.body_tx
            && !data.is_empty()
            && tx.send(Ok(Bytes::from(data))).is_err()
        {
            return self.client_gone();
        }
        if eos {
            self.body_tx = None;
            self.done = true;
        }
    }

    /// Resets the downstream stream (HTTP/1: the connection closes mid-message).
    fn reset(&mut self) {
        if self.done {
            return;
        }
        self.abort_upstream();
        self.decode_aborted = true;
        if let Some(tx) = self.head_tx.take() {
            let _ = tx.send(Err(Reset));
        }
        if let Some(tx) = self.body_tx.take() {
            let _ = tx.send(Err(Reset));
        }
        self.done = true;
    }

    fn client_gone(&mut self) {
        self.flag(flags::DOWNSTREAM_CONNECTION_TERMINATION);
        self.abort_upstream();
        self.decode_aborted = true;
        self.head_tx = None;
        self.body_tx = None;
        self.done = true;
    }

    // ---------------------------------------------------------------- http_call

    fn http_call_response(&mut self, callout: CalloutId, response: HttpCallResponse<'static>) {
        let Some(context) = self.context else {
            return;
        };
        if self.done {
            return;
        }
        let delivered = self.call(|scope, _| scope.on_http_call_response(context, callout, response));
        if delivered.is_some() {
            self.run_deferred();
        }
    }

    // ---------------------------------------------------------------- the end

    /// Envoy runs `on_log`, then `on_done`, then `on_delete`; the crate enforces the ABI
    /// order (`on_done` first), see host/README.md.
    fn finish(&mut self) {
        self.abort_upstream();
        self.plugin_done();
        if self.context.is_some() {
            self.ctx.guest_time.record(self.in_guest);
        }
        self.access_log();
    }

    fn plugin_done(&mut self) {
        let Some(context) = self.context else {
            return;
        };
        if !self.filter_off {
            self.hs.req_headers_open = false;
            self.hs.resp_headers_open = false;
            self.hs.req_body_open = false;
            self.hs.resp_body_open = false;
            let _ = self.call(|scope, id| {
                if scope.on_done(id)? {
                    scope.on_log(id)?;
                    scope.on_delete(id)?;
                }
                Ok(())
            });
            self.hs.deferred.clear();
        }
        if let Some(vm) = &self.ctx.vm
            && let Ok(mut vm) = vm.try_borrow_mut()
        {
            vm.streams.remove(&context.get());
        }
    }

    /// The HCM's access logs, once the stream is over and the plugin's `on_log` has run.
    fn access_log(&self) {
        if self.ctx.access_logs.is_empty() {
            return;
        }
        let entry = access_log::Entry {
            start_time: self.start_time,
            duration: self.started.elapsed(),
            request_headers: self.routed_request.as_ref().unwrap_or(&self.hs.req_headers),
            response_headers: &self.hs.resp_headers,
            response_code: self.hs.props.response_code,
            response_code_details: self.hs.props.code_details.as_deref(),
            response_flags: &self.response_flags,
            route_name: self.hs.props.route_name.as_deref(),
            upstream_cluster: self.hs.props.cluster_name.as_deref(),
            upstream_host: self.upstream_host,
            bytes_received: self.bytes_received,
            bytes_sent: self.down_sent,
            connection_id: self.hs.props.connection_id,
            downstream_remote: self.hs.props.source,
            downstream_local: self.hs.props.destination,
            filter_state: &self.hs.filter_state,
        };
        for logger in self.ctx.access_logs.iter() {
            logger.log(&entry);
        }
    }
}

// -------------------------------------------------------------------- helpers

async fn next_request_frame(body: &mut Option<Incoming>) -> Option<Result<Frame<Bytes>, hyper::Error>> {
    match body {
        Some(body) => body.frame().await,
        None => std::future::pending().await,
    }
}

async fn next_response_frame(source: &mut Option<RespSource>) -> Option<Result<Frame<Bytes>, String>> {
    match source {
        Some(RespSource::Upstream(body)) => body.frame().await.map(|r| r.map_err(|e| e.to_string())),
        Some(RespSource::Local(bytes)) => bytes.take().map(|b| Ok(Frame::data(b))),
        None => std::future::pending().await,
    }
}

async fn pending_upstream(
    pending: &mut Option<oneshot::Receiver<UpstreamResult>>,
) -> Result<UpstreamResult, oneshot::error::RecvError> {
    match pending {
        Some(rx) => rx.await,
        None => std::future::pending().await,
    }
}

fn earliest(a: Option<tokio::time::Instant>, b: Option<tokio::time::Instant>) -> Option<tokio::time::Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

async fn downstream_closed(head: &mut Option<oneshot::Sender<Head>>, body: &Option<ChunkSender>) {
    if let Some(head) = head {
        head.closed().await;
    } else if let Some(body) = body {
        body.closed().await;
    } else {
        std::future::pending::<()>().await;
    }
}

fn wire(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn is_hop_by_hop(name: &str) -> bool {
    matches!(
        name,
        "connection" | "keep-alive" | "proxy-connection" | "transfer-encoding" | "upgrade" | "te"
    )
}

fn is_hop_by_hop_bytes(name: &[u8]) -> bool {
    std::str::from_utf8(name).is_ok_and(is_hop_by_hop)
}

fn declared_length(headers: &Headers) -> Option<u64> {
    headers.first_str("content-length").and_then(|v| v.trim().parse().ok())
}

/// The header map the HTTP/1 codec and the HCM hand to the first filter: pseudo headers
/// first, `host` folded into `:authority`, connection headers gone, `x-forwarded-proto`
/// added.
fn request_headers(parts: &hyper::http::request::Parts) -> Headers {
    let authority = parts
        .headers
        .get(hyper::header::HOST)
        .map(|h| h.as_bytes().to_vec())
        .or_else(|| parts.uri.authority().map(|a| a.as_str().as_bytes().to_vec()))
        .unwrap_or_default();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .as_bytes()
        .to_vec();
    let mut headers = Headers::new(vec![
        (b":authority".to_vec(), authority),
        (b":path".to_vec(), path),
        (b":method".to_vec(), parts.method.as_str().as_bytes().to_vec()),
        (b":scheme".to_vec(), b"http".to_vec()),
    ]);
    for (name, value) in &parts.headers {
        let name = name.as_str();
        if name == "host" || is_hop_by_hop(name) {
            continue;
        }
        headers.add(name, value.as_bytes());
    }
    if !headers.contains("x-forwarded-proto") {
        headers.set("x-forwarded-proto", b"http");
    }
    headers
}

/// The upstream HTTP/1.1 request: `:authority` becomes `host`, pseudo headers go.
pub fn upstream_request(headers: &Headers, body: HostBody) -> Result<Request<HostBody>, String> {
    let method = headers.first(":method").unwrap_or(b"GET");
    let path = headers.first_str(":path").unwrap_or("/");
    // Parts filled in place: `Request::builder()` moves its whole state once per header.
    let mut request = Request::new(body);
    *request.method_mut() = hyper::Method::from_bytes(method).map_err(|e| e.to_string())?;
    *request.uri_mut() = path.parse().map_err(|e: hyper::http::uri::InvalidUri| e.to_string())?;
    let map = request.headers_mut();
    map.reserve(headers.len());
    if let Some(authority) = headers.first(":authority") {
        map.append(hyper::header::HOST, header_value(authority)?);
    }
    for (name, value) in headers.pairs() {
        if name.first() == Some(&b':') || name == b"host" {
            continue;
        }
        map.append(header_name(name)?, header_value(value)?);
    }
    Ok(request)
}

fn header_name(name: &[u8]) -> Result<hyper::header::HeaderName, String> {
    hyper::header::HeaderName::from_bytes(name).map_err(|e| e.to_string())
}

fn header_value(value: &[u8]) -> Result<hyper::header::HeaderValue, String> {
    hyper::header::HeaderValue::from_bytes(value).map_err(|e| e.to_string())
}
