//! `waygate-fakes --listen ADDR`: the fake providers on `ADDR` until the process is
//! stopped (`make run`, `docker-compose.yml`, the benchmarks).

use std::process::ExitCode;

const USAGE: &str = "usage: waygate-fakes --listen 127.0.0.1:PORT";

fn main() -> ExitCode {
    match run(std::env::args().skip(1)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("waygate-fakes: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(mut args: impl Iterator<Item = String>) -> Result<(), String> {
    let mut listen = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => listen = args.next(),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    let listen = listen.ok_or_else(|| format!("--listen is required\n{USAGE}"))?;
    let addr = listen.parse().map_err(|e| format!("--listen {listen}: {e}"))?;
    waygate_fakes::run_blocking(addr).map_err(|e| e.to_string())
}
