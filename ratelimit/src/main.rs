//! The `waygate-ratelimit` command line: `serve` runs the rate limit service, `limits`
//! prints the limits for envoyproxy/ratelimit or Limitador.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use waygate_ratelimit::formats::{self, Format};
use waygate_ratelimit::limits::{DOMAIN, LimitTable};
use waygate_ratelimit::service::RateLimiter;
use waygate_ratelimit::store::RedisCounters;

const USAGE: &str = "\
usage:
  waygate-ratelimit serve --listen ADDR --redis URL --plugin-config FILE
      Serves Envoy's rate limit service (envoy.service.ratelimit.v3) on ADDR
      (host:port; port 0 picks one), counting in the Redis at URL
      (redis://host:port/db), with the limits of waygate's plugin configuration FILE:
      its JSON, or (FILE.yaml) the Envoy YAML whose waygate filter carries it (a
      bootstrap, or Istio's EnvoyFilter manifest).
      Prints `listening on HOST:PORT` once it accepts calls. SIGTERM or Ctrl-C stops it.
  waygate-ratelimit limits --plugin-config FILE --format envoy-ratelimit|limitador
      Prints the same limits as envoyproxy/ratelimit's configuration YAML or as
      Limitador's limits file.

Exit status: 0 done, 1 a runtime failure, 2 bad arguments or configuration.";

/// Why the command stopped, and its exit status.
enum Failure {
    /// Bad arguments or a configuration that cannot be used: exit 2.
    Usage(Vec<String>),
    /// Anything that went wrong while running: exit 1.
    Runtime(String),
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(problems)) => {
            for problem in problems {
                eprintln!("waygate-ratelimit: {problem}");
            }
            ExitCode::from(2)
        }
        Err(Failure::Runtime(problem)) => {
            eprintln!("waygate-ratelimit: {problem}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<(), Failure> {
    let usage = |problem: String| Failure::Usage(vec![problem, USAGE.to_owned()]);
    let Some((command, options)) = args.split_first() else {
        return Err(usage("a command is required".into()));
    };
    let options = Options::parse(options).map_err(usage)?;
    match command.as_str() {
        "serve" => {
            options
                .allow(&["--listen", "--redis", "--plugin-config"])
                .map_err(usage)?;
            let listen: SocketAddr = options
                .required("--listen")
                .map_err(usage)?
                .parse()
                .map_err(|e| usage(format!("--listen: {e}")))?;
            let redis = options.required("--redis").map_err(usage)?;
            let table = load_table(&options)?;
            serve(listen, redis, table)
        }
        "limits" => {
            options.allow(&["--plugin-config", "--format"]).map_err(usage)?;
            let name = options.required("--format").map_err(usage)?;
            let format = Format::parse(name)
                .ok_or_else(|| usage(format!("--format: {name:?} is not envoy-ratelimit or limitador")))?;
            let table = load_table(&options)?;
            let text = formats::render(&table, format).map_err(Failure::Usage)?;
            print!("{text}");
            Ok(())
        }
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(usage(format!("unknown command {other:?}"))),
    }
}

fn load_table(options: &Options) -> Result<LimitTable, Failure> {
    let path = PathBuf::from(
        options
            .required("--plugin-config")
            .map_err(|p| Failure::Usage(vec![p]))?,
    );
    LimitTable::load(&path).map_err(|problems| {
        Failure::Usage(
            problems
                .into_iter()
                .map(|p| format!("plugin configuration {}: {p}", Path::display(&path)))
                .collect(),
        )
    })
}

/// Runs the gRPC server until SIGTERM or Ctrl-C.
fn serve(listen: SocketAddr, redis_url: &str, table: LimitTable) -> Result<(), Failure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::Runtime(format!("cannot start the runtime: {e}")))?;
    runtime.block_on(async move {
        // Inside the runtime: the connection manager spawns its reconnection task.
        let counters = RedisCounters::new(redis_url).map_err(|e| Failure::Usage(vec![format!("--redis: {e}")]))?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| Failure::Runtime(format!("cannot listen on {listen}: {e}")))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Failure::Runtime(format!("cannot read the listening address: {e}")))?;
        let limits = table.limits().len();
        let service = RateLimiter::new(Arc::new(table), counters);
        // stdout carries only this line, so a supervisor or a test can read the port.
        println!("listening on {bound}");
        eprintln!("waygate-ratelimit: domain {DOMAIN}, limits configured: {limits}, listening on {bound}");
        // One service, so no router: tonic's router would bring in axum for nothing.
        Server::builder()
            .serve_with_incoming_shutdown(
                RateLimitServiceServer::new(service),
                TcpIncoming::from(listener),
                stop_signal(),
            )
            .await
            .map_err(|e| Failure::Runtime(format!("server: {e}")))
    })
}

/// Resolves on SIGTERM (how orchestrators stop a process) or Ctrl-C.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            // Without a SIGTERM handler, Ctrl-C still stops it (and SIGTERM's default kills).
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    eprintln!("waygate-ratelimit: stopping");
}

/// `--name value` pairs, each name at most once.
struct Options(Vec<(String, String)>);

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        let mut rest = args.iter();
        while let Some(name) = rest.next() {
            if !name.starts_with("--") {
                return Err(format!("unexpected argument {name:?}"));
            }
            let Some(value) = rest.next() else {
                return Err(format!("{name} needs a value"));
            };
            if pairs.iter().any(|(n, _)| n == name) {
                return Err(format!("{name} given twice"));
            }
            pairs.push((name.clone(), value.clone()));
        }
        Ok(Options(pairs))
    }

    fn allow(&self, names: &[&str]) -> Result<(), String> {
        match self.0.iter().find(|(n, _)| !names.contains(&n.as_str())) {
            Some((name, _)) => Err(format!("unknown option {name}")),
            None => Ok(()),
        }
    }

    fn required(&self, name: &str) -> Result<&str, String> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| format!("{name} is required"))
    }
}
