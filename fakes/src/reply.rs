//! What a fake provider answers, and how it is written on the wire.
//!
//! A [`Reply`] is a status, headers, an optional delay before the headers and a
//! [`Plan`] for the body. Stream events are sent one frame each with a short pause in
//! between, so every event is its own write; a cut body is aborted, which makes hyper
//! close the connection without the terminating chunk.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::Response;
use hyper::body::{Body, Frame};
use hyper::header::{HeaderName, HeaderValue};
use serde_json::Value;
use tokio::sync::mpsc;

type Sender = mpsc::Sender<Result<Bytes, std::io::Error>>;

/// The response body of the fake server: frames fed by a task; an error aborts it.
pub(crate) struct FakeBody {
    rx: mpsc::Receiver<Result<Bytes, std::io::Error>>,
}

impl Body for FakeBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        self.get_mut()
            .rx
            .poll_recv(cx)
            .map(|item| item.map(|r| r.map(Frame::data)))
    }
}

/// Pause between two stream events, so each one leaves in its own write.
const EVENT_GAP: Duration = Duration::from_millis(1);
/// Pause before aborting a cut body, so what was sent is flushed first.
const CUT_GRACE: Duration = Duration::from_millis(30);

/// How the body goes out.
#[derive(Debug)]
pub(crate) enum Plan {
    /// One body with a `content-length`.
    Full(Vec<u8>),
    /// Stream events, each its own frame, then a clean end.
    Events(Vec<Vec<u8>>),
    /// Stream events, then the connection is closed without a clean end.
    Cut(Vec<Vec<u8>>),
    /// `content-length` of the whole body, half of it, then the connection is closed.
    Half(Vec<u8>),
}

/// A complete answer of a fake provider.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub delay_ms: u64,
    pub plan: Plan,
}

impl Reply {
    /// A body of the given content type.
    pub fn bytes(status: u16, content_type: &str, body: Vec<u8>) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            delay_ms: 0,
            plan: Plan::Full(body),
        }
    }

    /// A compact JSON body.
    pub fn json(status: u16, value: &Value) -> Reply {
        Reply::bytes(status, "application/json", value.to_string().into_bytes())
    }

    /// A `text/event-stream` made of the given events.
    pub fn sse(content_type: &str, events: Vec<Vec<u8>>) -> Reply {
        let mut reply = Reply::bytes(200, content_type, Vec::new());
        reply.plan = Plan::Events(events);
        reply.headers.push(("cache-control".into(), "no-cache".into()));
        reply
    }

    /// Adds a response header.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Replaces every header `name` with one of `value`.
    pub fn replace_header(mut self, name: &str, value: &str) -> Reply {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.header(name, value)
    }

    /// Waits `ms` milliseconds before the headers.
    pub fn delayed(mut self, ms: u64) -> Reply {
        self.delay_ms = ms;
        self
    }

    /// Sends at most `n` stream events and then closes the connection; the terminal
    /// event is never sent. A non-stream body becomes half a body.
    pub fn cut(mut self, n: usize) -> Reply {
        self.plan = match self.plan {
            Plan::Events(mut events) | Plan::Cut(mut events) => {
                let keep = n.min(events.len().saturating_sub(1));
                events.truncate(keep);
                Plan::Cut(events)
            }
            Plan::Full(body) | Plan::Half(body) => Plan::Half(body),
        };
        self
    }

    /// Waits for the delay, then returns the response whose body is written by a task.
    pub async fn into_response(self) -> Response<FakeBody> {
        if self.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(self.delay_ms)).await;
        }
        let (tx, rx) = mpsc::channel(1);
        let mut response = Response::new(FakeBody { rx });
        *response.status_mut() =
            hyper::StatusCode::from_u16(self.status).unwrap_or(hyper::StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        for (name, value) in &self.headers {
            if let (Ok(n), Ok(v)) = (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value)) {
                headers.append(n, v);
            }
        }
        if let Plan::Full(body) | Plan::Half(body) = &self.plan {
            headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        tokio::spawn(write_body(tx, self.plan));
        response
    }
}

async fn write_body(tx: Sender, plan: Plan) {
    match plan {
        Plan::Full(body) => {
            let _ = tx.send(Ok(Bytes::from(body))).await;
        }
        Plan::Half(mut body) => {
            body.truncate(body.len() / 2);
            if tx.send(Ok(Bytes::from(body))).await.is_ok() {
                tokio::time::sleep(CUT_GRACE).await;
            }
            abort(&tx, "body cut").await;
        }
        Plan::Events(events) => {
            let _ = send_events(&tx, events).await;
        }
        Plan::Cut(events) => {
            if send_events(&tx, events).await {
                tokio::time::sleep(CUT_GRACE).await;
            }
            abort(&tx, "stream cut").await;
        }
    }
}

/// Sends each event as its own frame; false when the client went away.
async fn send_events(tx: &Sender, events: Vec<Vec<u8>>) -> bool {
    for event in events {
        if tx.send(Ok(Bytes::from(event))).await.is_err() {
            return false;
        }
        tokio::time::sleep(EVENT_GAP).await;
    }
    true
}

/// Makes hyper fail the body, which closes the connection without a clean end.
async fn abort(tx: &Sender, why: &str) {
    let _ = tx
        .send(Err(std::io::Error::other(format!("fake provider: {why}"))))
        .await;
}
