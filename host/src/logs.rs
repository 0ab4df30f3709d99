//! Plugin log lines: printed to stderr (or the `--log-path` file), the most recent kept
//! for [`crate::RunningHost::logs`].
//!
//! Envoy writes `wasm log <plugin_name> <root_id> <vm_id>: <message>` to its `wasm`
//! logger (`Context::log`, context.cc); the level is in spdlog's prefix. We print
//! `wasm log <plugin_name> <root_id> <vm_id>: <level>: <message>` with the level
//! spelled `trace|debug|info|warn|error|critical`. Lines under the host's level (default
//! info, like Envoy's `wasm` component) are dropped, as Envoy drops them; WASI
//! `fd_write` to stdout/stderr arrives here at info/error (cpp-host `exports.cc`).
//! Host-side diagnostics (`waygate-host: ...`) go to the same store.
//!
//! Envoy writes its application log to stderr a line at a time, a `write` on the worker's
//! thread for each; with `--log-path` it goes through the access log manager instead
//! (`FileSinkDelegate`), buffered and written by the flush thread. So do we.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use proxy_wasm_host::abi::v0_2_1::types::LogLevel as AbiLevel;
use proxy_wasm_host::abi::v0_2_1::{LogContext, LogSink};

use crate::log_sink::Sink;

/// The lowest level that is printed and kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum LogLevel {
    Trace,
    Debug,
    #[default]
    Info,
    Warn,
    Error,
    Critical,
}

impl LogLevel {
    /// Parses `trace|debug|info|warn|error|critical`.
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "trace" => Self::Trace,
            "debug" => Self::Debug,
            "info" => Self::Info,
            "warn" | "warning" => Self::Warn,
            "error" => Self::Error,
            "critical" => Self::Critical,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Trace => "trace",
            Self::Debug => "debug",
            Self::Info => "info",
            Self::Warn => "warn",
            Self::Error => "error",
            Self::Critical => "critical",
        }
    }

    pub(crate) fn to_abi(self) -> AbiLevel {
        match self {
            Self::Trace => AbiLevel::Trace,
            Self::Debug => AbiLevel::Debug,
            Self::Info => AbiLevel::Info,
            Self::Warn => AbiLevel::Warn,
            Self::Error => AbiLevel::Error,
            Self::Critical => AbiLevel::Critical,
        }
    }

    fn from_abi(level: AbiLevel) -> Self {
        match level {
            AbiLevel::Trace => Self::Trace,
            AbiLevel::Debug => Self::Debug,
            AbiLevel::Info => Self::Info,
            AbiLevel::Warn => Self::Warn,
            AbiLevel::Error => Self::Error,
            AbiLevel::Critical => Self::Critical,
        }
    }
}

/// How many lines a host keeps in memory for [`crate::RunningHost::logs`]; older ones
/// are only on stderr, so a long-running host does not grow by a line per request.
pub const KEPT_LINES: usize = 10_000;

/// The most recent lines printed, shared by all VMs of one running host.
#[derive(Debug, Default, Clone)]
pub struct LogStore {
    kept: Arc<Mutex<Kept>>,
    /// The `--log-path` file's sink; `None` prints to stderr.
    file: Option<Arc<Sink>>,
}

#[derive(Debug, Default)]
struct Kept {
    lines: VecDeque<String>,
    /// Lines ever pushed, so a caller can ask for what came after a point.
    total: u64,
}

impl LogStore {
    /// A store whose lines go to `file`'s sink instead of stderr (`--log-path`).
    pub(crate) fn writing_to(file: Arc<Sink>) -> Self {
        Self {
            kept: Arc::default(),
            file: Some(file),
        }
    }

    pub fn push(&self, line: String) {
        match &self.file {
            Some(file) => file.write_line(&line),
            None => {
                // Stderr is unbuffered: one write for the line and its newline, not two.
                let mut printed = Vec::with_capacity(line.len().saturating_add(1));
                printed.extend_from_slice(line.as_bytes());
                printed.push(b'\n');
                let _ = std::io::stderr().write_all(&printed);
            }
        }
        self.keep(line);
    }

    fn keep(&self, line: String) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.lines.len() >= KEPT_LINES {
            kept.lines.pop_front();
        }
        kept.lines.push_back(line);
        kept.total = kept.total.saturating_add(1);
    }

    /// A host diagnostic (not a plugin line), e.g. a content-length mismatch.
    pub fn host(&self, message: impl std::fmt::Display) {
        self.push(format!("waygate-host: {message}"));
    }

    pub fn lines(&self) -> Vec<String> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.lines.iter().cloned().collect()
    }

    /// A point to ask [`LogStore::since`] about.
    pub fn mark(&self) -> u64 {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner).total
    }

    /// The kept lines pushed after `mark`.
    pub fn since(&self, mark: u64) -> Vec<String> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let newer = usize::try_from(kept.total.saturating_sub(mark)).unwrap_or(usize::MAX);
        let skip = kept.lines.len().saturating_sub(newer);
        kept.lines.iter().skip(skip).cloned().collect()
    }
}

/// The sink of one plugin's VMs.
pub struct PluginSink {
    pub prefix: String,
    pub level: LogLevel,
    pub store: LogStore,
}

impl PluginSink {
    pub fn new(name: &str, root_id: &str, vm_id: &str, level: LogLevel, store: LogStore) -> Self {
        Self {
            prefix: format!("wasm log {name} {root_id} {vm_id}"),
            level,
            store,
        }
    }
}

impl LogSink for PluginSink {
    fn log(&self, _context: LogContext<'_>, level: AbiLevel, message: &[u8]) {
        let level = LogLevel::from_abi(level);
        if level < self.level {
            return;
        }
        let message = String::from_utf8_lossy(message);
        let message = message.strip_suffix('\n').unwrap_or(&message);
        self.store
            .push(format!("{}: {}: {}", self.prefix, level.name(), message));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_keeps_the_most_recent_lines_and_what_came_after_a_mark() {
        let store = LogStore::default();
        store.keep("a".into());
        let mark = store.mark();
        store.keep("b".into());
        store.keep("c".into());
        assert_eq!(store.since(mark), ["b", "c"]);
        for n in 0..KEPT_LINES {
            store.keep(n.to_string());
        }
        let lines = store.lines();
        assert_eq!(lines.len(), KEPT_LINES);
        assert_eq!(lines.first().map(String::as_str), Some("0"));
        let mark = store.mark();
        store.keep("last".into());
        assert_eq!(store.since(mark), ["last"]);
        assert_eq!(store.since(0).len(), KEPT_LINES, "older lines are gone, not repeated");
    }
}
