//! The one body type the host sends, downstream and upstream: empty, a full buffer, or a
//! channel fed chunk by chunk (so an SSE stream is never buffered). Sending `Err(Reset)`
//! aborts the message: hyper then closes the connection, which is how an HTTP/1 stream
//! reset looks on the wire.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;

/// The stream was reset; the peer sees the connection close mid-message.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("stream reset by the host")]
pub struct Reset;

pub type ChunkSender = mpsc::UnboundedSender<Result<Bytes, Reset>>;

#[derive(Debug)]
pub enum HostBody {
    Empty,
    Full(Option<Bytes>),
    Chan(mpsc::UnboundedReceiver<Result<Bytes, Reset>>),
}

impl HostBody {
    /// The body of a message whose headers went out: empty when they ended the stream,
    /// else fed through the returned sender.
    pub fn after_headers(ended: bool) -> (Option<ChunkSender>, Self) {
        if ended {
            (None, Self::Empty)
        } else {
            let (tx, rx) = mpsc::unbounded_channel();
            (Some(tx), Self::Chan(rx))
        }
    }

    pub fn full(bytes: impl Into<Bytes>) -> Self {
        let bytes = bytes.into();
        if bytes.is_empty() {
            Self::Empty
        } else {
            Self::Full(Some(bytes))
        }
    }
}

impl Body for HostBody {
    type Data = Bytes;
    type Error = Reset;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Reset>>> {
        match self.get_mut() {
            Self::Empty => Poll::Ready(None),
            Self::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Self::Chan(rx) => rx.poll_recv(cx).map(|item| item.map(|r| r.map(Frame::data))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Self::Empty | Self::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Empty | Self::Full(None) => SizeHint::with_exact(0),
            Self::Full(Some(b)) => SizeHint::with_exact(b.len() as u64),
            Self::Chan(_) => SizeHint::default(),
        }
    }
}
