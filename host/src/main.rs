//! `waygate-host -c <bootstrap.yaml> [--concurrency N] [--busy-poll-us N] [--log-level LEVEL]
//! [--log-path FILE] [--file-flush-interval-msec N] [--file-flush-min-size-kb N]` runs the host
//! until SIGINT/SIGTERM; `waygate-host fake-providers --listen ADDR` runs the fakes.

use std::path::PathBuf;
use std::process::ExitCode;

use waygate_host::{HostOptions, LogLevel};

/// Envoy links tcmalloc for the same reason: glibc's malloc was a fifth of a
/// worker's CPU per request (hyper's and the VM glue's many small buffers).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage:
  waygate-host -c <bootstrap.yaml> [--concurrency N] [--busy-poll-us N]
                  [--log-level trace|debug|info|warn|error|critical] [--log-path FILE]
                  [--file-flush-interval-msec N] [--file-flush-min-size-kb N]
  waygate-host fake-providers --listen 127.0.0.1:PORT";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("waygate-host: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), String> {
    if args.first().map(String::as_str) == Some("fake-providers") {
        let mut listen = None;
        let mut rest = args.iter().skip(1);
        while let Some(arg) = rest.next() {
            match arg.as_str() {
                "--listen" => listen = rest.next().cloned(),
                other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
            }
        }
        let listen = listen.ok_or_else(|| format!("--listen is required\n{USAGE}"))?;
        let addr = listen.parse().map_err(|e| format!("--listen {listen}: {e}"))?;
        return waygate_host::fakes::run_blocking(addr).map_err(|e| e.to_string());
    }
    let mut config = None;
    let mut options = HostOptions::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let mut value = || {
            rest.next()
                .cloned()
                .ok_or_else(|| format!("{arg} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "-c" | "--config-path" => config = Some(PathBuf::from(value()?)),
            "--concurrency" => {
                let workers = number(arg, &value()?)?;
                options.concurrency = usize::try_from(workers).map_err(|_| format!("{arg} {workers}: too many"))?;
            }
            "--busy-poll-us" => {
                options.busy_poll = std::time::Duration::from_micros(number(arg, &value()?)?);
            }
            "--file-flush-interval-msec" => {
                options.file_flush.interval = std::time::Duration::from_millis(number(arg, &value()?)?);
            }
            "--file-flush-min-size-kb" => {
                let kib = number(arg, &value()?)?;
                options.file_flush.min_size = usize::try_from(kib.saturating_mul(1024)).unwrap_or(usize::MAX);
            }
            "--log-level" => {
                let text = value()?;
                options.log_level =
                    LogLevel::parse(&text).ok_or_else(|| format!("--log-level {text}: unknown level"))?;
            }
            "--log-path" => options.log_path = Some(PathBuf::from(value()?)),
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    let config = config.ok_or_else(|| format!("-c <bootstrap.yaml> is required\n{USAGE}"))?;
    let yaml = std::fs::read_to_string(&config).map_err(|e| format!("{}: {e}", config.display()))?;
    let mut host = waygate_host::start(&yaml, options).map_err(|e| e.to_string())?;
    let mut names: Vec<String> = Vec::new();
    for listener in listener_names(&yaml) {
        if let Some(addr) = host.listener_addr(&listener) {
            names.push(format!("listener {listener} on http://{addr}"));
        }
    }
    for line in names {
        eprintln!("waygate-host: {line}");
    }
    if let Some(addr) = host.admin_addr() {
        eprintln!("waygate-host: admin on http://{addr}");
    }
    eprintln!("waygate-host: ready");
    wait_for_signal()?;
    eprintln!("waygate-host: shutting down");
    host.shutdown();
    Ok(())
}

/// A flag's unsigned value.
fn number(flag: &str, text: &str) -> Result<u64, String> {
    text.parse().map_err(|_| format!("{flag} {text}: not a number"))
}

/// Listener names in file order, for the ready message.
fn listener_names(yaml: &str) -> Vec<String> {
    let Ok(value) = serde_yaml::from_str::<serde_yaml::Value>(yaml) else {
        return Vec::new();
    };
    value
        .get("static_resources")
        .and_then(|s| s.get("listeners"))
        .and_then(|l| l.as_sequence())
        .map(|listeners| {
            listeners
                .iter()
                .filter_map(|l| l.get("name").and_then(|n| n.as_str()).map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

fn wait_for_signal() -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    runtime.block_on(async {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        Ok(())
    })
}
