//! Plugin log lines: printed to stderr and kept for [`crate::RunningHost::logs`].
//!
//! Envoy writes `wasm log <plugin_name> <root_id> <vm_id>: <message>` to its `wasm`
//! logger (`Context::log`, context.cc); the level is in spdlog's prefix. We print
//! `wasm log <plugin_name> <root_id> <vm_id>: <level>: <message>` with the level
//! spelled `trace|debug|info|warn|error|critical`. Lines under the host's level (default
//! info, like Envoy's `wasm` component) are dropped, as Envoy drops them; WASI
//! `fd_write` to stdout/stderr arrives here at info/error (cpp-host `exports.cc`).
//! Host-side diagnostics (`waygate-host: ...`) go to the same store.

use std::sync::{Arc, Mutex, PoisonError};

use proxy_wasm_host::abi::v0_2_1::types::LogLevel as AbiLevel;
use proxy_wasm_host::abi::v0_2_1::{LogContext, LogSink};

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

/// Every line printed so far, shared by all VMs of one running host.
#[derive(Debug, Default, Clone)]
pub struct LogStore {
    lines: Arc<Mutex<Vec<String>>>,
}

impl LogStore {
    pub fn push(&self, line: String) {
        eprintln!("{line}");
        self.lines.lock().unwrap_or_else(PoisonError::into_inner).push(line);
    }

    /// A host diagnostic (not a plugin line), e.g. a content-length mismatch.
    pub fn host(&self, message: impl std::fmt::Display) {
        self.push(format!("waygate-host: {message}"));
    }

    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner).clone()
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
