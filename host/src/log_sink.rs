//! Where access log lines go (stdout, stderr, a file), and when: as Envoy's
//! `AccessLogFileImpl` does, never from the request path. The `--log-path` file (the
//! host's and plugins' log) is one of these too, as in Envoy.
//!
//! A worker appends the line to the sink's buffer under a lock and goes on; the sink's
//! flush thread writes the buffer out once it holds more than the minimum flush size
//! (Envoy's `--file-flush-min-size-kb`, 64 KiB) or the flush interval has passed since
//! its last write (`--file-flush-interval-msec`, 10 s), whichever comes first, and
//! whatever is left when the host stops. So under load a worker pays one `memcpy` per
//! line and the lines cost one `write` per 64 KiB; at a trickle a line shows up within
//! the interval (`make run` and docker-compose use 1 s, as Istio does). Loggers that name
//! the same destination share one sink, as Envoy keeps one file object per path.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::access_log::SinkConfig;
use crate::logs::LogStore;

/// When a sink's buffer is written out (Envoy's command-line flags of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileFlush {
    /// `--file-flush-interval-msec`: the longest a line waits.
    pub interval: Duration,
    /// `--file-flush-min-size-kb`: a buffer larger than this is written at once.
    pub min_size: usize,
}

impl Default for FileFlush {
    /// Envoy's defaults (`options_impl.cc`): 10 s and 64 KiB.
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(10),
            min_size: 64 * 1024,
        }
    }
}

/// An opened destination with its buffer and flush thread.
pub(crate) struct Sink {
    inner: Arc<Inner>,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

struct Inner {
    target: Target,
    flush: FileFlush,
    state: Mutex<Buffered>,
    /// Wakes the flush thread: the buffer passed `min_size`, or the host stops.
    wake: Condvar,
    diagnostics: LogStore,
}

#[derive(Default)]
struct Buffered {
    /// Whole lines, so every write is whole lines too.
    text: String,
    /// The flush thread writes what is left and ends; later lines are written at once.
    closed: bool,
}

enum Target {
    Stdout,
    Stderr,
    File { path: PathBuf, file: std::fs::File },
}

/// Set once stdout or stderr refused a write: the stream sinks stop (not the host).
static STDOUT_BROKEN: AtomicBool = AtomicBool::new(false);
static STDERR_BROKEN: AtomicBool = AtomicBool::new(false);

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = match &self.inner.target {
            Target::Stdout => "stdout".to_owned(),
            Target::Stderr => "stderr".to_owned(),
            Target::File { path, .. } => path.display().to_string(),
        };
        f.debug_struct("Sink").field("target", &target).finish_non_exhaustive()
    }
}

impl Sink {
    /// Opens the destination (a file is created if needed and appended to; one that
    /// cannot be opened stops startup) and starts its flush thread.
    pub fn open(config: &SinkConfig, flush: FileFlush, diagnostics: LogStore) -> Result<Self, String> {
        let target = match config {
            SinkConfig::Stdout => Target::Stdout,
            SinkConfig::Stderr => Target::Stderr,
            SinkConfig::File(path) => Target::File {
                path: path.clone(),
                file: open_append(path)?,
            },
        };
        let inner = Arc::new(Inner {
            target,
            flush,
            state: Mutex::new(Buffered::default()),
            wake: Condvar::new(),
            diagnostics,
        });
        let thread = Arc::clone(&inner);
        let flusher = std::thread::Builder::new()
            .name("wg-log-flush".to_owned())
            .spawn(move || thread.run())
            .map_err(|e| format!("log flush thread: {e}"))?;
        Ok(Self {
            inner,
            flusher: Mutex::new(Some(flusher)),
        })
    }

    /// Buffers `line`; wakes the flush thread only when this line takes the buffer past
    /// the minimum flush size, so a worker makes no system call for it otherwise.
    pub fn write(&self, line: &str) {
        self.append(&[line]);
    }

    /// [`Sink::write`] for a line without its newline, which is appended here rather than
    /// joined to the line in a copy first.
    pub fn write_line(&self, line: &str) {
        self.append(&[line, "\n"]);
    }

    /// Buffers `parts` as one piece of text (written at once, joined, after the close).
    fn append(&self, parts: &[&str]) {
        let mut state = self.inner.lock();
        if state.closed {
            drop(state);
            self.inner.target.write(&parts.concat(), &self.inner.diagnostics);
            return;
        }
        let before = state.text.len();
        for part in parts {
            state.text.push_str(part);
        }
        if before <= self.inner.flush.min_size && state.text.len() > self.inner.flush.min_size {
            self.inner.wake.notify_one();
        }
    }

    /// Writes everything buffered and stops the flush thread (the host is stopping).
    pub fn close(&self) {
        self.inner.lock().closed = true;
        self.inner.wake.notify_one();
        let flusher = self.flusher.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(flusher) = flusher {
            let _ = flusher.join();
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.close();
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Buffered> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The flush thread: waits for a full buffer, the interval or the close, then writes
    /// the buffer with the lock released (workers keep appending meanwhile).
    fn run(&self) {
        let mut held = String::new();
        loop {
            let closed = {
                let deadline = Instant::now() + self.flush.interval;
                let mut state = self.lock();
                while !state.closed && state.text.len() <= self.flush.min_size {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    state = self
                        .wake
                        .wait_timeout(state, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                // Swapped, not taken: both buffers keep their capacity.
                std::mem::swap(&mut held, &mut state.text);
                state.closed
            };
            if !held.is_empty() {
                self.target.write(&held, &self.diagnostics);
                held.clear();
            }
            if closed {
                return;
            }
        }
    }
}

impl Target {
    fn write(&self, text: &str, diagnostics: &LogStore) {
        match self {
            // `print!` goes through the test harness's output capture (which the flush
            // thread inherits); its panic on a closed stdout is caught, and the sink stops.
            Self::Stdout => print_guarded(&STDOUT_BROKEN, diagnostics, "stdout", || print!("{text}")),
            Self::Stderr => print_guarded(&STDERR_BROKEN, diagnostics, "stderr", || eprint!("{text}")),
            Self::File { path, file } => {
                if let Err(e) = (&*file).write_all(text.as_bytes()) {
                    diagnostics.host(format!("cannot write {}: {e}", path.display()));
                }
            }
        }
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
        .map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_sink(name: &str, flush: FileFlush) -> (Sink, PathBuf) {
        let path = std::env::temp_dir().join(format!("waygate-sink-{name}-{}.log", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let sink = Sink::open(&SinkConfig::File(path.clone()), flush, LogStore::default()).unwrap();
        (sink, path)
    }

    fn read(path: &Path) -> String {
        std::fs::read_to_string(path).unwrap_or_default()
    }

    /// Waits up to 5 s for `path` to hold `want` bytes.
    fn wait_for_len(path: &Path, want: usize) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let text = read(path);
            if text.len() >= want || Instant::now() > deadline {
                return text;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn small_buffers_are_written_each_interval_in_order() {
        let flush = FileFlush {
            interval: Duration::from_millis(30),
            min_size: 64 * 1024,
        };
        let (sink, path) = file_sink("interval", flush);
        sink.write("one\n");
        sink.write("two\n");
        assert_eq!(wait_for_len(&path, 8), "one\ntwo\n");
        sink.write("three\n");
        assert_eq!(
            wait_for_len(&path, 14),
            "one\ntwo\nthree\n",
            "the thread keeps flushing"
        );
        drop(sink);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_buffer_past_the_minimum_size_is_written_without_waiting_for_the_interval() {
        let flush = FileFlush {
            interval: Duration::from_secs(3600),
            min_size: 100,
        };
        let (sink, path) = file_sink("size", flush);
        let line = format!("{}\n", "x".repeat(59));
        sink.write(&line);
        sink.write(&line);
        assert_eq!(wait_for_len(&path, 120), line.repeat(2));
        drop(sink);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn close_writes_what_is_left_and_later_lines_go_straight_out() {
        let flush = FileFlush {
            interval: Duration::from_secs(3600),
            min_size: 64 * 1024,
        };
        let (sink, path) = file_sink("close", flush);
        for i in 0..100 {
            sink.write(&format!("line {i}\n"));
        }
        assert_eq!(read(&path), "");
        sink.close();
        let expected: String = (0..100).map(|i| format!("line {i}\n")).collect();
        assert_eq!(read(&path), expected);
        sink.write("late\n");
        sink.write_line("later");
        assert_eq!(read(&path), expected + "late\nlater\n");
        drop(sink);
        let _ = std::fs::remove_file(&path);
    }
}
