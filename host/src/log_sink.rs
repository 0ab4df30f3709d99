//! Where access log lines go (stdout, stderr, a file), and when.
//!
//! Envoy never writes an access log line from the request path: `AccessLogFileImpl`
//! appends it to a buffer that a flush thread writes out later. The host keeps the line
//! off the request path too, more promptly: a worker collects the lines its streams
//! format during one turn of its event loop and writes them once the turn's I/O (the
//! response the line describes, first of all) has gone out, in one write per sink.
//! Elsewhere (a thread that is not a worker) a line is written at once.

use std::cell::RefCell;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use crate::access_log::SinkConfig;
use crate::logs::LogStore;

/// An opened sink.
pub(crate) enum Sink {
    Stdout,
    Stderr,
    File { path: PathBuf, file: Mutex<std::fs::File> },
}

/// Set once stdout or stderr refused a write: the stream sinks stop (not the host).
static STDOUT_BROKEN: AtomicBool = AtomicBool::new(false);
static STDERR_BROKEN: AtomicBool = AtomicBool::new(false);

impl Sink {
    pub fn open(config: &SinkConfig) -> Result<Self, String> {
        Ok(match config {
            SinkConfig::Stdout => Self::Stdout,
            SinkConfig::Stderr => Self::Stderr,
            SinkConfig::File(path) => Self::File {
                path: path.clone(),
                file: Mutex::new(open_append(path)?),
            },
        })
    }

    fn write_now(&self, text: &str, diagnostics: &LogStore) {
        match self {
            // `print!` goes through the test harness's output capture; its panic on a
            // closed stdout is caught, and the sink then stops.
            Self::Stdout => print_guarded(&STDOUT_BROKEN, diagnostics, "stdout", || print!("{text}")),
            Self::Stderr => print_guarded(&STDERR_BROKEN, diagnostics, "stderr", || eprint!("{text}")),
            Self::File { path, file } => {
                let mut file = file.lock().unwrap_or_else(PoisonError::into_inner);
                if let Err(e) = file.write_all(text.as_bytes()) {
                    diagnostics.host(format!("access log {}: {e}", path.display()));
                }
            }
        }
    }
}

/// One worker's lines not yet written, in order, consecutive lines to one sink together.
struct Pending {
    lines: Vec<(Arc<Sink>, String, LogStore)>,
    flusher: Rc<Notify>,
}

thread_local! {
    /// Set on a worker thread by [`flusher`].
    static PENDING: RefCell<Option<Pending>> = const { RefCell::new(None) };
}

/// Writes `line` to `sink`: on a worker, once its turn is over; elsewhere now.
pub(crate) fn write(sink: &Arc<Sink>, line: String, diagnostics: &LogStore) {
    let mut line = Some(line);
    let _ = PENDING.try_with(|pending| {
        let Ok(mut pending) = pending.try_borrow_mut() else {
            return;
        };
        let (Some(pending), Some(text)) = (pending.as_mut(), line.take()) else {
            return;
        };
        match pending.lines.last_mut() {
            Some((last, held, _)) if Arc::ptr_eq(last, sink) => held.push_str(&text),
            _ => {
                if pending.lines.is_empty() {
                    pending.flusher.notify_one();
                }
                pending.lines.push((Arc::clone(sink), text, diagnostics.clone()));
            }
        }
    });
    // Not a worker (or its thread-locals are gone): written now, never dropped.
    if let Some(line) = line {
        sink.write_now(&line, diagnostics);
    }
}

/// The worker's flushing task: from now on this thread's lines wait for it. Each time
/// lines are waiting it lets the runtime poll its sockets once (`yield_now` runs after
/// the I/O driver), so the turn's responses are written first, then writes the lines.
pub(crate) async fn flusher() {
    let notify = Rc::new(Notify::new());
    let set = PENDING.try_with(|pending| {
        if let Ok(mut pending) = pending.try_borrow_mut() {
            *pending = Some(Pending {
                lines: Vec::new(),
                flusher: Rc::clone(&notify),
            });
        }
    });
    if set.is_err() {
        return;
    }
    loop {
        notify.notified().await;
        tokio::task::yield_now().await;
        flush();
    }
}

/// Writes every line this thread holds (the flusher's turn, and a worker's last act).
pub(crate) fn flush() {
    let lines = PENDING
        .try_with(|pending| {
            pending
                .try_borrow_mut()
                .ok()
                .and_then(|mut p| p.as_mut().map(|p| std::mem::take(&mut p.lines)))
        })
        .ok()
        .flatten()
        .unwrap_or_default();
    for (sink, text, diagnostics) in lines {
        sink.write_now(&text, &diagnostics);
    }
}

fn print_guarded(broken: &AtomicBool, diagnostics: &LogStore, name: &str, print: impl FnOnce()) {
    if broken.load(Ordering::Relaxed) {
        return;
    }
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(print)).is_err() {
        broken.store(true, Ordering::Relaxed);
        diagnostics.host(format!("the {name} access log cannot be written; it stops"));
    }
}

fn open_append(path: &Path) -> Result<std::fs::File, String> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| format!("access log {}: {e}", path.display()))
}
