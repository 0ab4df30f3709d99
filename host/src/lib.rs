//! waygate-host: a proxy-wasm host on wasmtime that behaves like Envoy, plus fake providers.
//!
//! [`start`] reads an Envoy v3 bootstrap (the subset in `host/README.md`), compiles the
//! plugin once, runs a canary VM through `on_vm_start`/`on_configure` (a refusal stops
//! startup with the plugin's log lines), starts `concurrency` workers that each own one VM,
//! binds the listeners and the admin, and returns a [`RunningHost`] that stops everything
//! when dropped.
//!
//! Modules, each with one job:
//! [`config`] (the bootstrap), `vm` (VMs and `http_call` intake), `worker` (threads and
//! connections), `busy_poll` (a worker polling instead of sleeping between reads),
//! `stream` (one request through the plugin and the router), `router` (route selection),
//! `upstream` (clusters, TLS, pool), `calls` (`dispatch_http_call`), `local_reply`
//! (Envoy's local replies), `shared` (shared data and metrics), `guest_time` (time in the
//! guest per stream), `admin`,
//! [`access_log`] (the HCM's access loggers and their format), `log_sink` (where and when
//! their lines are written), [`logs`].

pub mod access_log;
pub mod config;
pub mod fakes;
pub mod logs;

mod admin;
mod body;
mod busy_poll;
mod calls;
mod guest_time;
mod local_reply;
mod log_sink;
mod router;
mod shared;
mod stream;
mod tls;
mod upstream;
mod vm;
mod worker;

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::guest_time::GuestTime;

pub use log_sink::FileFlush;
pub use logs::LogLevel;

/// How to run a bootstrap.
#[derive(Debug, Clone)]
pub struct HostOptions {
    /// Worker threads, each with its own VM (default: available cores).
    pub concurrency: usize,
    /// If `Some`, used instead of the process environment for
    /// `vm_config.environment_variables.host_env_keys`.
    pub env: Option<HashMap<String, String>>,
    /// Relative paths in the YAML (`code.local.filename`, `trusted_ca`) resolve against
    /// this (Envoy resolves them against its working directory).
    pub base_dir: PathBuf,
    /// The lowest plugin log level printed and kept (Envoy's `wasm` component level;
    /// default info, so trace/debug lines are dropped as Envoy drops them).
    pub log_level: LogLevel,
    /// How long a worker keeps polling its sockets after its last read before it sleeps
    /// (`busy_poll`; zero, the default, sleeps at once as Envoy does).
    pub busy_poll: Duration,
    /// When access log lines are written out (Envoy's `--file-flush-interval-msec` and
    /// `--file-flush-min-size-kb`; default Envoy's 10 s and 64 KiB).
    pub file_flush: FileFlush,
    /// Envoy's `--log-path`: the plugins' and the host's log lines go to this file,
    /// buffered and flushed as access log files are, instead of one `write` to stderr per
    /// line from the worker. Relative to the working directory, as in Envoy.
    pub log_path: Option<PathBuf>,
}

impl Default for HostOptions {
    fn default() -> Self {
        Self {
            concurrency: std::thread::available_parallelism().map_or(1, |n| n.get()),
            env: None,
            base_dir: PathBuf::from("."),
            log_level: LogLevel::Info,
            busy_poll: Duration::ZERO,
            file_flush: FileFlush::default(),
            log_path: None,
        }
    }
}

/// Why the host did not start.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("{0}")]
    Config(#[from] config::ConfigErrors),
    #[error("{0}")]
    Io(String),
    #[error("wasm: {0}")]
    Wasm(String),
    #[error("upstream TLS: {0}")]
    Tls(String),
    #[error("plugin {plugin} refused its configuration ({reason}); its log:{}", log_lines(.log))]
    PluginRefused {
        plugin: String,
        reason: String,
        log: Vec<String>,
    },
}

fn log_lines(lines: &[String]) -> String {
    if lines.is_empty() {
        return " (nothing)".to_owned();
    }
    lines.iter().map(|l| format!("\n  {l}")).collect()
}

/// A started host. Dropping it (or [`RunningHost::shutdown`]) stops every thread.
pub struct RunningHost {
    listeners: HashMap<String, SocketAddr>,
    admin: Option<SocketAddr>,
    logs: logs::LogStore,
    access_logs: access_log::AccessLogStore,
    /// Every access log destination, closed (flushed) once the workers are gone.
    sinks: Vec<Arc<log_sink::Sink>>,
    shared: Arc<shared::Shared>,
    shutdown: watch::Sender<bool>,
    acceptor: Option<tokio::runtime::Runtime>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for RunningHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningHost")
            .field("listeners", &self.listeners)
            .field("admin", &self.admin)
            .finish_non_exhaustive()
    }
}

impl RunningHost {
    /// The bound address of a listener (YAML `port_value: 0` = an ephemeral port).
    pub fn listener_addr(&self, listener_name: &str) -> Option<SocketAddr> {
        self.listeners.get(listener_name).copied()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin
    }

    /// The plugin log lines so far (and the host's own `waygate-host: ...` diagnostics;
    /// the most recent [`logs::KEPT_LINES`]), as printed to stderr: `wasm log <plugin_name> <root_id> <vm_id>: <level>: <msg>`.
    pub fn logs(&self) -> Vec<String> {
        self.logs.lines()
    }

    /// The access log entries written so far (HCM `access_log[]`, all listeners and loggers,
    /// in the order written; the most recent [`access_log::KEPT_ENTRIES`]), each without its
    /// final newline. Every entry is also written to its logger's stdout, stderr or file.
    pub fn access_log_lines(&self) -> Vec<String> {
        self.access_logs.lines()
    }

    /// The current value of a plugin counter or gauge (its name without `wasmcustom.`).
    pub fn metric(&self, name: &str) -> Option<u64> {
        self.shared.metric_value(name)
    }

    /// Stops the acceptors and the workers and waits for the worker threads.
    pub fn shutdown(&mut self) {
        let _ = self.shutdown.send(true);
        if let Some(runtime) = self.acceptor.take() {
            runtime.shutdown_background();
        }
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
        for sink in &self.sinks {
            sink.close();
        }
    }
}

impl Drop for RunningHost {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn bind(host: &str, port: u16) -> Result<TcpListener, HostError> {
    let listener =
        TcpListener::bind((host, port)).map_err(|e| HostError::Io(format!("cannot bind {host}:{port}: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| HostError::Io(e.to_string()))?;
    Ok(listener)
}

/// Starts a host; returns once every listener is bound and every VM (canary and workers)
/// has accepted its configuration.
pub fn start(bootstrap_yaml: &str, options: HostOptions) -> Result<RunningHost, HostError> {
    let bootstrap = config::parse(bootstrap_yaml, &options.base_dir)?;
    // Every log destination, opened before anything serves; an access logger naming the
    // `--log-path` file shares its sink (Envoy keeps one file object per path).
    let mut sinks: HashMap<access_log::SinkConfig, Arc<log_sink::Sink>> = HashMap::new();
    let logs = match &options.log_path {
        None => logs::LogStore::default(),
        Some(path) => {
            let config = access_log::SinkConfig::File(path.clone());
            // A failed write to the log file is reported on stderr, not to itself.
            let sink = log_sink::Sink::open(&config, options.file_flush, logs::LogStore::default())
                .map_err(|e| HostError::Io(format!("--log-path {e}")))?;
            let sink = Arc::new(sink);
            sinks.insert(config, Arc::clone(&sink));
            logs::LogStore::writing_to(sink)
        }
    };
    let shared = Arc::new(shared::Shared::default());
    let cluster_names: HashSet<String> = bootstrap.clusters.keys().cloned().collect();
    let env = |key: &str| match &options.env {
        Some(map) => map.get(key).cloned(),
        None => std::env::var(key).ok(),
    };

    // TLS settings are checked once here so a bad bundle stops startup.
    let mut cluster_names_sorted: Vec<&String> = bootstrap.clusters.keys().collect();
    cluster_names_sorted.sort();
    for name in cluster_names_sorted {
        let Some(cluster) = bootstrap.clusters.get(name) else {
            continue;
        };
        if let Some(tls) = &cluster.tls {
            tls::client_config(tls).map_err(|e| HostError::Tls(format!("cluster {}: {e}", cluster.name)))?;
        }
        let note = match cluster.http.protocol {
            config::UpstreamProtocol::Http2 => Some("explicit_http_config.http2_protocol_options"),
            config::UpstreamProtocol::Auto => Some("auto_config (ALPN offers only http/1.1)"),
            config::UpstreamProtocol::Http1 | config::UpstreamProtocol::Downstream => None,
        };
        if let Some(note) = note {
            logs.host(format!(
                "cluster {}: {note} accepted; the host speaks HTTP/1.1 upstream",
                cluster.name
            ));
        }
    }

    // Access log files are opened (created, appended to) before anything serves; loggers
    // with the same destination share its sink.
    let access_logs = access_log::AccessLogStore::default();
    let mut loggers = HashMap::new();
    for listener in &bootstrap.listeners {
        let mut opened = Vec::new();
        for config in &listener.access_logs {
            let sink = match sinks.get(&config.sink) {
                Some(sink) => Arc::clone(sink),
                None => {
                    let sink = log_sink::Sink::open(&config.sink, options.file_flush, logs.clone())
                        .map_err(|e| HostError::Io(format!("listener {}: access log {e}", listener.name)))?;
                    let sink = Arc::new(sink);
                    sinks.insert(config.sink.clone(), Arc::clone(&sink));
                    sink
                }
            };
            opened.push(access_log::Logger::new(config, sink, access_logs.clone()));
        }
        loggers.insert(listener.name.clone(), Arc::new(opened));
    }

    let mut plugins = HashMap::new();
    if bootstrap.listeners.iter().any(|l| l.wasm.is_some()) {
        let engine = proxy_wasm_host::Engine::new().map_err(|e| HostError::Wasm(e.to_string()))?;
        for listener in &bootstrap.listeners {
            let Some(plugin) = &listener.wasm else {
                continue;
            };
            let runtime = vm::PluginRuntime::new(
                &engine,
                Arc::clone(plugin),
                &env,
                options.log_level,
                logs.clone(),
                Arc::clone(&shared),
                cluster_names.clone(),
            )?;
            // The canary (cpp-host `wasm.cc` `canary`): a throw-away VM that must accept
            // on_vm_start and on_configure before anything serves.
            drop(runtime.start_vm()?);
            plugins.insert(listener.name.clone(), Arc::new(runtime));
        }
    }

    let mut bound = Vec::new();
    let mut listeners = HashMap::new();
    for listener in &bootstrap.listeners {
        let socket = bind(&listener.address.host, listener.address.port)?;
        let addr = socket.local_addr().map_err(|e| HostError::Io(e.to_string()))?;
        listeners.insert(listener.name.clone(), addr);
        bound.push(socket);
    }
    let admin_socket = match &bootstrap.admin {
        Some(admin) => Some(bind(&admin.host, admin.port)?),
        None => None,
    };
    let admin = match &admin_socket {
        Some(socket) => Some(socket.local_addr().map_err(|e| HostError::Io(e.to_string()))?),
        None => None,
    };

    let (shutdown, shutdown_rx) = watch::channel(false);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let concurrency = options.concurrency.max(1);
    let guest_time = Arc::new(GuestTime::default());
    let mut workers = Vec::new();
    let mut senders = Vec::new();
    for index in 0..concurrency {
        let spec = worker::WorkerSpec {
            index,
            listeners: bootstrap.listeners.clone(),
            plugins: plugins.clone(),
            clusters: bootstrap.clusters.clone(),
            logs: logs.clone(),
            access_logs: loggers.clone(),
            busy_poll: options.busy_poll,
            guest_time: Arc::clone(&guest_time),
        };
        let handle = worker::spawn(spec, shutdown_rx.clone(), ready_tx.clone())?;
        workers.push(handle.thread);
        senders.push(handle.connections);
    }
    drop(ready_tx);
    let mut host = RunningHost {
        listeners,
        admin,
        logs: logs.clone(),
        access_logs,
        sinks: sinks.into_values().collect(),
        shared: Arc::clone(&shared),
        shutdown,
        acceptor: None,
        workers,
    };
    for _ in 0..concurrency {
        match ready_rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(HostError::Io("a worker thread died during startup".to_owned()));
            }
        }
    }

    let acceptor = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("wg-acceptor")
        .enable_all()
        .build()
        .map_err(|e| HostError::Io(e.to_string()))?;
    let senders = Arc::new(senders);
    let next_worker = Arc::new(AtomicU64::new(0));
    let connection_ids = Arc::new(AtomicU64::new(0));
    {
        let _guard = acceptor.enter();
        for (index, socket) in bound.into_iter().enumerate() {
            let listener = tokio::net::TcpListener::from_std(socket).map_err(|e| HostError::Io(e.to_string()))?;
            let senders = Arc::clone(&senders);
            let next_worker = Arc::clone(&next_worker);
            let connection_ids = Arc::clone(&connection_ids);
            acceptor.spawn(async move {
                loop {
                    let Ok((stream, peer)) = listener.accept().await else {
                        continue;
                    };
                    let Ok(stream) = stream.into_std() else {
                        continue;
                    };
                    let worker = next_worker.fetch_add(1, Ordering::Relaxed) as usize % senders.len();
                    let id = connection_ids.fetch_add(1, Ordering::Relaxed) + 1;
                    if let Some(sender) = senders.get(worker) {
                        let _ = sender.send(worker::Accepted {
                            listener: index,
                            stream,
                            peer,
                            id,
                        });
                    }
                }
            });
        }
        if let Some(socket) = admin_socket {
            let listener = tokio::net::TcpListener::from_std(socket).map_err(|e| HostError::Io(e.to_string()))?;
            acceptor.spawn(admin::serve(listener, Arc::clone(&shared), guest_time));
        }
    }
    host.acceptor = Some(acceptor);
    Ok(host)
}
