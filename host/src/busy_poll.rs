//! Busy polling (`--busy-poll-us N`, off by default): after the last byte a worker read
//! from any of its connections, it keeps polling its sockets for up to N µs instead of
//! sleeping in `epoll_wait`, as Linux's `SO_BUSY_POLL`, Seastar's reactor and Go's
//! spinning scheduler do.
//!
//! Why: on a virtual machine a sleeping CPU is woken by an inter-processor interrupt
//! that the hypervisor delivers, and on our 2-core build machine that costs ~50 µs each
//! time. A request through a gateway crosses the gateway's CPU twice (the client's bytes
//! in, the upstream's answer back), so at concurrency 1 a bare TCP relay that sleeps adds
//! ~0.11–0.14 ms over the direct upstream (`make bench`, e2e) and one that polls ~0.03
//! ms. Under load the worker never sleeps anyway, so the option changes nothing there;
//! once its connections go quiet for N µs the worker sleeps as before, so an idle host
//! costs no CPU. Envoy has no such option: it is the host's, to show the filter's cost
//! apart from the wake-ups.

use std::cell::Cell;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

thread_local! {
    /// This worker's poller, when busy polling is on.
    static POLLER: Cell<Option<Rc<Poller>>> = const { Cell::new(None) };
}

struct Poller {
    window: Duration,
    last_read: Cell<Instant>,
    /// Wakes the polling task from its sleep; a permit is kept if it is not asleep.
    wake: Notify,
}

/// Starts busy polling on this worker thread (inside its `LocalSet`). A zero window
/// leaves the worker as it was.
pub fn start(window: Duration) {
    if window.is_zero() {
        return;
    }
    let poller = Rc::new(Poller {
        window,
        last_read: Cell::new(Instant::now()),
        wake: Notify::new(),
    });
    POLLER.with(|p| p.set(Some(Rc::clone(&poller))));
    tokio::task::spawn_local(poll(poller));
}

/// The polling task: while the worker read something less than `window` ago it yields
/// at once, which makes the runtime poll its sockets without sleeping (tokio polls the
/// I/O driver with a zero timeout while a yielded task waits); then it sleeps until the
/// next read.
async fn poll(poller: Rc<Poller>) {
    loop {
        if poller.last_read.get().elapsed() < poller.window {
            tokio::task::yield_now().await;
        } else {
            poller.wake.notified().await;
        }
    }
}

fn read_happened() {
    POLLER.with(|p| {
        let poller = p.take();
        if let Some(poller) = &poller {
            poller.last_read.set(Instant::now());
            poller.wake.notify_one();
        }
        p.set(poller);
    });
}

/// A connection whose reads keep the worker polling.
pub struct Active<T>(pub T);

impl<T: AsyncRead + Unpin> AsyncRead for Active<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.get_mut().0).poll_read(cx, buf);
        if matches!(result, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            read_happened();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Active<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}
