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
//!
//! This module holds the stream's state, its event loop and the calls into the VM; the
//! rest is split by path: `request` (decoder side and the router), `response` (encoder
//! side), `downstream` (writing to the client), `reply` (local replies), `end` (`on_log`,
//! `on_done`, `on_delete`, access log), `convert` (headers to and from hyper's types).

pub mod body;
mod convert;
mod downstream;
mod end;
pub mod headers;
pub mod properties;
mod reply;
mod request;
mod request_id;
mod response;
pub mod state;
mod timer;

pub use convert::upstream_request;

use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use proxy_wasm_host::abi::v0_2_1::types::{Action, StreamType};
use proxy_wasm_host::abi::v0_2_1::{CallScope, CalloutId, ContextId, GuestError, HttpCallResponse};
use tokio::sync::{mpsc, oneshot};

use crate::access_log::{Logger, flags};
use crate::body::{ChunkSender, HostBody, Reset};
use crate::calls;
use crate::config::{FailurePolicy, Listener};
use crate::guest_time::GuestTime;
use crate::local_reply::{self, reasons};
use crate::logs::LogStore;
use crate::upstream::{Pool, UpstreamError};
use crate::vm::WorkerVm;
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

    /// The plugin's `failure_policy` (fail closed, Envoy's default, when there is none).
    fn failure_policy(&self) -> FailurePolicy {
        self.ctx
            .listener
            .wasm
            .as_ref()
            .map_or(FailurePolicy::FailClosed, |w| w.failure_policy)
    }

    /// Envoy `CHECK_FAIL_HTTP`: fail open continues without the filter; fail closed sends
    /// 503 `wasm_fail_stream` (or resets when the response has started).
    fn vm_failed(&mut self) {
        self.filter_off = true;
        self.hs.deferred.clear();
        let policy = self.failure_policy();
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
