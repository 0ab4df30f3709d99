//! End-to-end load through real Envoy (`make bench`): what the waygate filter costs on
//! top of Envoy itself, measured in one run against the same fake upstream.
//!
//! Rows, each in front of the same fake providers (`target/release/waygate-fakes`):
//!
//! 1. **the fake upstream direct**, the floor every proxy adds to;
//! 2. **Envoy alone**: `envoy/local.yaml` with the wasm filter removed and its `fake`
//!    route matched without the `x-waygate-cluster` header (the router only); the request
//!    already carries the provider's path and credential;
//! 3. **Envoy + waygate**: `envoy/local.yaml` with the built `waygate.wasm` (a copy taken
//!    at the start, by absolute path, so a concurrent build cannot swap it) and
//!    `benches/data/plugin.json` as its configuration, the one the `core` bench uses;
//! 4. **floor filter**: `envoy/local.yaml` with `benches/floor`'s module in waygate's place,
//!    the least any proxy-wasm filter that routes on the body costs (it holds the headers,
//!    reads the body, sets the route header, `:path` and credential, and passes answers
//!    untouched): waygate's cost above it is waygate's own;
//! 5. **waygate's calls**: `benches/calls`' module in waygate's place, which makes
//!    waygate's host calls for these requests (headers, bodies, filter state, stats, clock
//!    and log line, in the same callbacks) and nothing else: what those calls cost in
//!    Envoy, apart from what waygate's own code costs;
//! 6. **TensorZero 2026.6.0** (`WAYGATE_BENCH_PEERS=none` skips it): its Rust gateway as
//!    its PyPI wheel ships it, installed once into `target/bench/peers` and served over
//!    HTTP ([`start_tensorzero`]), routed to the same fake upstream.
//!
//! Every Envoy (`$WAYGATE_ENVOY`, which the Makefile exports; else the default version
//! under `target/`) run with [`ENVOY_FLAGS`], ports 0 read back from the admin's
//! `/listeners`. Every bootstrap copy drops the HTTP connection manager's `access_log`
//! and run at `--log-level warn`, so neither Envoy's access log nor the plugin's
//! per-request info line is on the hot path; otherwise they differ only by the filter.
//!
//! Placement: each proxy is pinned to CPU 0 with `taskset`; this load generator and the
//! fake upstream share CPU 1 (the bench re-runs itself under `taskset -c 1`). Without
//! `taskset` or a second CPU nothing is pinned and the header says so. The bench reads the
//! machine's idle policy for the header and changes no kernel or hypervisor setting.
//!
//! Load: raw HTTP/1.1 over keep-alive connections on one tokio thread, a fixed number of
//! requests shared by `c` connections, each timed from its first byte written to its last
//! byte read; p50/p99 over all of them, req/s from the wall time. Cells: a ~1 KB chat
//! request (`benches/data/chat_1k.json`) at c = 1 and c = 64, and a 20-event SSE answer
//! (the fake's `long-18`) at c = 16, also timed to its first body byte (TTFB); then
//! streams of 300 deltas (`long-300`, c = 16) in each provider API, through the filter and
//! the same provider stream through Envoy alone; then a streamed answer whose first
//! candidate answers 503 (`bench/fallback`), through each fallback mode (router fallback in
//! an Envoy of its own running `envoy/local-router.yaml`, from Envoy 1.39), against the same
//! stream asked of the second candidate first; then the inbound APIs: the same ~1 KB
//! conversation as a chat completion, a Responses request and a Messages request (to the
//! OpenAI-compatible fake, translated, and to the Anthropic one, native), plain (c = 64)
//! and streamed (long-18, c = 16), through the filter. Each cell
//! runs in interleaved rounds, every row in turn, so a noisy neighbour hits them alike.
//!
//! Per row and cell: the proxy's CPU per request, the growth of its threads' run time (the
//! scheduler's exact account, `/proc/<pid>/task/*/schedstat`, in ns) over the cell divided
//! by its requests; and once per row the proxy's
//! resident memory (VmRSS) once started, and at rest 3 s after the run, which the memory
//! target reads (a proxy just started still holds V8's compile peak, which the bootstrap's
//! `memory_allocator_manager` returns over the following minutes).
//! Then the floor's cost, waygate's calls alone and waygate's own code above them, the
//! filter's own cost (Envoy + waygate − Envoy alone) and issue #29's targets, each marked
//! met or missed for this run (with what the calls alone read), with the `.wasm` size.
//!
//! `WAYGATE_BENCH_SECONDS=S` runs each row of each cell for about S seconds instead of
//! the fixed request counts. `WAYGATE_BENCH_VARIANT=FILE.wasm` adds a row for another build
//! of the filter, in an Envoy of its own, and prints its cost against the built one: an
//! experiment measured in the same run as what it would replace.

// Bench code, like the tests: configuration documents are indexed by key (a missing key
// reads as null; the bootstrap's shape is checked when Envoy loads it).
#![allow(clippy::indexing_slicing)]

// The shipped bootstraps shaped as the integration tests shape them.
#[path = "../tests/common/bootstrap.rs"]
mod bootstrap;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

type Error = Box<dyn std::error::Error>;

/// Every Envoy in the bench: one worker, as the proxy gets one CPU.
const ENVOY_FLAGS: [&str; 5] = ["--concurrency", "1", "--log-level", "warn", "--disable-hot-restart"];
/// The Envoy the Makefile installs by default, when `WAYGATE_ENVOY` is unset.
const DEFAULT_ENVOY: &str = "target/envoy-1.40.0/bin/envoy";
/// Set in the copy of this bench that runs under `taskset -c 1`.
const PINNED_ENV: &str = "WAYGATE_BENCH_PINNED";

/// Row labels, looked up by the summaries.
const DIRECT: &str = "fake upstream direct";
const ENVOY_ALONE: &str = "Envoy alone";
const WAYGATE: &str = "Envoy + waygate";
const FLOOR: &str = "Envoy + floor filter";
const CALLS: &str = "Envoy + waygate's calls";
const TENSORZERO_ROW: &str = "TensorZero 2026.6.0";
const VARIANT: &str = "Envoy + variant";
/// A second build of the filter to measure beside the built one in the same run (an
/// experiment's A/B: Envoy's numbers drift between runs more than most changes move them).
const VARIANT_ENV: &str = "WAYGATE_BENCH_VARIANT";

/// Interleaved rounds per cell.
const ROUNDS: usize = 3;

/// Issue #29's targets.
const FILTER_CPU_C64_US: f64 = 12.0;
const FILTER_CPU_C1_US: f64 = 45.0;
const C64_VS_ENVOY: f64 = 0.75;
const C64_VS_TENSORZERO: f64 = 2.0;
const ADDED_P50_C1_MS: f64 = 0.04;
const SSE_VS_ENVOY: f64 = 0.75;
const SSE_TTFB_ADDED_MS: f64 = 0.1;
const RSS_ADDED_MIB: f64 = 35.0;
const WASM_BYTES: u64 = 600_000;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("envoy bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One load pattern, measured on every row.
struct Cell {
    title: &'static str,
    concurrency: usize,
    streaming: bool,
    /// Requests (streams) per row, over all rounds, unless `WAYGATE_BENCH_SECONDS` is set.
    requests: usize,
}

/// Sized so that each proxied row takes a few seconds per cell on the 2-core build machine
/// (the whole bench about two minutes).
const CELLS: [Cell; 3] = [
    Cell {
        title: "c = 1",
        concurrency: 1,
        streaming: false,
        requests: 12_000,
    },
    Cell {
        title: "c = 64",
        concurrency: 64,
        streaming: false,
        requests: 45_000,
    },
    Cell {
        title: "SSE c = 16",
        concurrency: 16,
        streaming: true,
        requests: 1_500,
    },
];
/// Streams of a few hundred deltas, one row per provider API through the filter and the
/// same provider stream through Envoy alone: what the filter costs per API on answers as
/// long as real ones (the c = 16 cell's 20 events hide a per-event cost).
const LONG_STREAMS: Cell = Cell {
    title: "long SSE c = 64",
    concurrency: 64,
    streaming: true,
    requests: 576,
};
/// The fake's `long-N`: N deltas, ~1 ms apart.
const LONG_MODEL: &str = "long-300";
/// Each API's filter cost per long stream within this factor of the OpenAI-compatible one's.
const LONG_VS_OPENAI: f64 = 1.5;

/// A streamed answer that falls back: the first candidate answers 503, the second
/// streams `long-100` (100 deltas, ~0.2 s). Through the filter's two fallback modes, and
/// the same stream asked of the second candidate directly.
const FALLBACK_STREAMS: Cell = Cell {
    title: "fallback SSE c = 16",
    concurrency: 16,
    streaming: true,
    requests: 192,
};
/// `benches/data/plugin.json`'s model whose first endpoint fails.
const FALLBACK_MODEL: &str = "bench/fallback";
const FIRST_ATTEMPT: &str = "waygate, no fallback";
const HTTP_CALL_FALLBACK: &str = "waygate, http_call fallback";
const ROUTER_FALLBACK: &str = "waygate, router fallback";
/// Issue #27: a fallback stream's first byte within a few ms of the next provider's first
/// event (here: of the same stream asked of it first).
const FALLBACK_TTFB_ADDED_MS: f64 = 5.0;
/// The first Envoy with `retry_policy.refresh_cluster_on_retry`, which router fallback needs.
const ROUTER_FALLBACK_SINCE: (u32, u32) = (1, 39);

/// Issue #47: chat requests whose first candidate is dead, while it hangs past its
/// `timeout_ms` (1 s, `bench/hang`) and while it answers 503 (`bench/down`), the second
/// healthy; the same module with provider health on (the defaults) and off, each in an
/// Envoy of its own.
const DEAD_PROVIDER: Cell = Cell {
    title: "dead provider c = 16",
    concurrency: 16,
    streaming: false,
    requests: 192,
};
const DEAD_MODELS: [(&str, &str); 2] = [("first hangs", "bench/hang"), ("first answers 503", "bench/down")];

/// The inbound APIs, each over the same provider answer: the same ~1 KB conversation
/// as a chat completion, a Responses request and a Messages request, plain (c = 64) and
/// streamed (the fake's long-18, c = 16), through the filter.
const CLIENT_APIS: Cell = Cell {
    title: "inbound APIs c = 64",
    concurrency: 64,
    streaming: false,
    requests: 24_000,
};
const CLIENT_API_STREAMS: Cell = Cell {
    title: "inbound APIs SSE c = 16",
    concurrency: 16,
    streaming: true,
    requests: 1_500,
};
/// The inbound APIs' rows: label, path, and the provider that answers (the Messages API
/// translated to the OpenAI-compatible fake, and passed natively to the Anthropic one).
const CLIENT_API_PATHS: [(&str, &str, &str); 4] = [
    ("chat", "/api/v1/chat/completions", "fake"),
    ("responses", "/api/v1/responses", "fake"),
    ("messages", "/api/v1/messages", "fake"),
    ("messages, native", "/api/v1/messages", "fakeanthropic"),
];

const C1: usize = 0;
const C64: usize = 1;
const SSE: usize = 2;

/// A target of the load: where it listens, what it is sent, and which process to watch.
struct Row {
    label: String,
    addr: SocketAddr,
    /// The non-streaming chat request and the streaming one, as raw HTTP/1.1.
    chat: Vec<u8>,
    stream: Vec<u8>,
    /// The proxy's process (CPU time, memory); none for the upstream measured direct.
    proxy: Option<u32>,
}

/// One row's figures in one cell.
#[derive(Default)]
struct Measured {
    stats: Stats,
    /// The proxy's CPU time over the cell's rounds, in ns.
    cpu_ns: u64,
}

fn run() -> Result<(), Error> {
    // In the re-run copy only CPU 1 is visible, so the environment carries the decision.
    let pin = std::env::var_os(PINNED_ENV).is_some() || can_pin();
    if pin && std::env::var_os(PINNED_ENV).is_none() {
        // Children inherit CPU 1 (the fake upstream); each proxy is moved to CPU 0.
        let status = Command::new("taskset")
            .args(["-c", "1"])
            .arg(std::env::current_exe()?)
            .args(std::env::args_os().skip(1))
            .env(PINNED_ENV, "1")
            .status()?;
        if !status.success() {
            return Err(format!("the pinned run failed ({status})").into());
        }
        return Ok(());
    }
    let started = Instant::now();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let fakes_bin = root.join("target/release/waygate-fakes");
    let built_wasm = root.join("target/wasm32-wasip1/wasm/waygate.wasm");
    let floor_wasm = root.join("target/floor/wasm32-wasip1/release/waygate_floor.wasm");
    let calls_wasm = root.join("target/calls/wasm32-wasip1/release/waygate_calls.wasm");
    let envoy_bin = std::env::var_os("WAYGATE_ENVOY").map_or_else(|| root.join(DEFAULT_ENVOY), PathBuf::from);
    for (file, make) in [
        (&fakes_bin, "make build"),
        (&built_wasm, "make build"),
        (&floor_wasm, "make bench"),
        (&calls_wasm, "make bench"),
        (&envoy_bin, "make envoy"),
    ] {
        if !file.exists() {
            return Err(format!("{} is missing: run `{make}`", file.display()).into());
        }
    }
    let work = root.join("target/bench");
    std::fs::create_dir_all(&work)?;
    // Envoy loads a copy taken now, so the size printed is the module measured even if a
    // `make build` runs meanwhile (cargo first puts its unoptimised module in place).
    let wasm = work.join("waygate.wasm");
    std::fs::copy(&built_wasm, &wasm)?;
    let wasm_bytes = std::fs::metadata(&wasm)?.len();

    let fakes = Proc::spawn(
        Command::new(&fakes_bin).args(["--listen", "127.0.0.1:0"]),
        "fake providers listening on http://",
        &work.join("fakes.log"),
    )?;
    let plugin: Value = serde_json::from_slice(&std::fs::read(root.join("benches/data/plugin.json"))?)?;
    let envoy = |name: &str, filter: Option<(&Value, &Path)>| -> Result<Proc, Error> {
        let yaml = bootstrap(&root, "envoy/local.yaml", fakes.addr, filter)?;
        start_envoy(&envoy_bin, &yaml, &root, &work, name, pin)
    };
    let envoy_alone = envoy("envoy-alone", None)?;
    let waygate = envoy("envoy-waygate", Some((&plugin, &wasm)))?;
    let floor = envoy("envoy-floor", Some((&json!({}), &floor_wasm)))?;
    let calls = envoy("envoy-calls", Some((&json!({}), &calls_wasm)))?;
    let variant = match std::env::var_os(VARIANT_ENV) {
        Some(path) => {
            let copy = work.join("variant.wasm");
            std::fs::copy(&path, &copy).map_err(|e| format!("{VARIANT_ENV}={}: {e}", Path::new(&path).display()))?;
            // A build from before provider health refuses the setting it does not know;
            // it has none to turn off.
            let mut older = plugin.clone();
            if let Some(config) = older.as_object_mut() {
                config.remove("health");
            }
            Some(envoy("envoy-variant", Some((&older, &copy)))?)
        }
        None => None,
    };
    let peers = std::env::var("WAYGATE_BENCH_PEERS").unwrap_or_else(|_| "tensorzero".into());
    let tensorzero = if peers.split(',').any(|p| p.trim() == "tensorzero") {
        start_tensorzero(&work, pin, fakes.addr).map_err(|e| format!("it did not start: {e}"))
    } else {
        Err(format!("skipped (WAYGATE_BENCH_PEERS={peers})"))
    };

    let body: Value = serde_json::from_slice(&std::fs::read(root.join("benches/data/chat_1k.json"))?)?;
    let requests = Requests::new(&body);
    let body_bytes = body_len(&requests.provider);
    let mut rows = vec![
        Row {
            label: DIRECT.into(),
            addr: fakes.addr,
            chat: requests.provider.clone(),
            stream: requests.provider_stream.clone(),
            proxy: None,
        },
        Row {
            label: ENVOY_ALONE.into(),
            addr: envoy_alone.addr,
            chat: requests.provider.clone(),
            stream: requests.provider_stream.clone(),
            proxy: Some(envoy_alone.pid()),
        },
        Row {
            label: WAYGATE.into(),
            addr: waygate.addr,
            chat: requests.gateway.clone(),
            stream: requests.gateway_stream.clone(),
            proxy: Some(waygate.pid()),
        },
        Row {
            label: FLOOR.into(),
            addr: floor.addr,
            chat: requests.floor,
            stream: requests.floor_stream,
            proxy: Some(floor.pid()),
        },
        Row {
            label: CALLS.into(),
            addr: calls.addr,
            chat: requests.gateway.clone(),
            stream: requests.gateway_stream.clone(),
            proxy: Some(calls.pid()),
        },
    ];
    if let Some(p) = &variant {
        rows.push(Row {
            label: VARIANT.into(),
            addr: p.addr,
            chat: requests.gateway.clone(),
            stream: requests.gateway_stream.clone(),
            proxy: Some(p.pid()),
        });
    }
    if let Ok(p) = &tensorzero {
        rows.push(Row {
            label: TENSORZERO_ROW.into(),
            addr: p.addr,
            chat: requests.tensorzero,
            stream: requests.tensorzero_stream,
            proxy: Some(p.pid()),
        });
    }

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    // Before any load: what each proxy holds once started, and a check that every row answers.
    let start_rss: Vec<Option<u64>> = rows.iter().map(|r| r.proxy.and_then(rss_kib)).collect();
    let mut events = Vec::new();
    for row in &rows {
        rt.block_on(load(row.addr, &row.chat, 1, Budget::Requests(1)))
            .map_err(|e| format!("{}: {e}", row.label))?;
        events.push(
            rt.block_on(sse_events(row.addr, &row.stream))
                .map_err(|e| format!("{}: {e}", row.label))?,
        );
    }

    print_header(pin, &envoy_bin, &built_wasm, body_bytes, &tensorzero);
    let seconds = match std::env::var("WAYGATE_BENCH_SECONDS") {
        Ok(s) => Some(
            s.trim()
                .parse::<f64>()
                .map_err(|e| format!("WAYGATE_BENCH_SECONDS={s}: {e}"))?,
        ),
        Err(_) => None,
    };
    // Which servers exited, named in any failure: a dead upstream fails every row.
    let exited = || {
        let procs = [&fakes, &envoy_alone, &waygate, &floor, &calls]
            .into_iter()
            .chain(variant.as_ref())
            .chain(tensorzero.as_ref().ok());
        let dead: Vec<String> = procs
            .filter(|p| !p.alive())
            .map(|p| format!("target/bench/{}.log", p.name))
            .collect();
        (!dead.is_empty()).then(|| format!("exited (see their logs): {}", dead.join(", ")))
    };
    let mut results: Vec<Vec<Measured>> = Vec::new();
    for cell in &CELLS {
        let round = cell.round(seconds);
        let measured = measure(&rt, cell, &rows, round).map_err(|e| match exited() {
            Some(dead) => format!("{e}\n{dead}").into(),
            None => e,
        })?;
        print_cell(cell, &rows, &measured, &events, round);
        results.push(measured);
    }

    let mut filtered = vec![(WAYGATE, &waygate)];
    filtered.extend(variant.as_ref().map(|p| (VARIANT, p)));
    let router = if envoy_at_least(&envoy_bin, ROUTER_FALLBACK_SINCE) {
        let mut routed = plugin.clone();
        routed["fallback"] = "router".into();
        let yaml = bootstrap(&root, "envoy/local-router.yaml", fakes.addr, Some((&routed, &wasm)))?;
        Ok(start_envoy(&envoy_bin, &yaml, &root, &work, "envoy-router", pin)?)
    } else {
        Err(format!(
            "router fallback needs Envoy >= {}.{}",
            ROUTER_FALLBACK_SINCE.0, ROUTER_FALLBACK_SINCE.1
        ))
    };
    let fallback_rows = fallback_rows(&waygate, router.as_ref().ok(), &body);
    let fallback = stream_cell(&rt, &FALLBACK_STREAMS, &fallback_rows, seconds)?;
    if let Err(why) = &router {
        println!("  {ROUTER_FALLBACK}: not measured ({why})");
    }

    let long_rows = long_stream_rows(&envoy_alone, &filtered, &body);
    let long = stream_cell(&rt, &LONG_STREAMS, &long_rows, seconds)?;

    // A build that does not serve an inbound API (the previous module as the variant,
    // say) is measured on the others.
    let mut api_rows = Vec::new();
    for row in client_api_rows(&filtered, &body) {
        match rt.block_on(load(row.addr, &row.chat, 1, Budget::Requests(1))) {
            Ok(_) => api_rows.push(row),
            Err(e) if e.to_string().contains("status 404") => println!("  {}: not served by that build", row.label),
            Err(e) => return Err(format!("{}: {e}", row.label).into()),
        }
    }
    let plain = measure(&rt, &CLIENT_APIS, &api_rows, CLIENT_APIS.round(seconds))?;
    print_cell(&CLIENT_APIS, &api_rows, &plain, &[], CLIENT_APIS.round(seconds));
    stream_cell(&rt, &CLIENT_API_STREAMS, &api_rows, seconds)?;

    // The bench's plugin holds circuits shut (its fallback cell measures fallback itself);
    // this cell runs the defaults against health off.
    let mut healthy = plugin.clone();
    healthy["health"] = json!({});
    let health_on = envoy("envoy-health-on", Some((&healthy, &wasm)))?;
    healthy["health"] = json!({"enabled": false});
    let health_off = envoy("envoy-health-off", Some((&healthy, &wasm)))?;
    let dead_rows = dead_provider_rows(&health_on, &health_off, &body);
    let dead = measure(&rt, &DEAD_PROVIDER, &dead_rows, DEAD_PROVIDER.round(seconds))?;
    print_cell(&DEAD_PROVIDER, &dead_rows, &dead, &[], DEAD_PROVIDER.round(seconds));
    for (what, _) in DEAD_MODELS {
        let p50 = |health: &str| {
            let row = dead_rows
                .iter()
                .position(|r| r.label == format!("health {health}, {what}"));
            row.and_then(|i| dead.get(i)).map_or(f64::NAN, |m| m.stats.p(0.5) / 1e6)
        };
        println!(
            "  {what}: p50 {:.2} ms with health on, {:.2} ms with it off",
            p50("on"),
            p50("off")
        );
    }

    // At rest after the run: the bootstrap's memory_allocator_manager gives free heap back
    // every second, and a proxy just started still holds the memory V8 took to compile its
    // filter, which the allocator returns over the following minutes. The run has given it
    // that time, and every row's reading includes what its load left behind.
    std::thread::sleep(Duration::from_secs(3));
    let rest_rss: Vec<Option<u64>> = rows.iter().map(|r| r.proxy.and_then(rss_kib)).collect();
    println!("memory: the proxy's VmRSS once started, before any load / at rest after the run:");
    for ((row, start), rest) in rows.iter().zip(&start_rss).zip(&rest_rss) {
        if let (Some(start), Some(rest)) = (start, rest) {
            println!("  {:<22} {:>7.1} MiB / {:.1} MiB", row.label, mib(*start), mib(*rest));
        }
    }

    let figures = Figures {
        rows: &rows,
        results: &results,
        rest_rss: &rest_rss,
        long_rows: &long_rows,
        long: &long,
        fallback_rows: &fallback_rows,
        fallback: &fallback,
    };
    figures.print_verdicts(wasm_bytes, &tensorzero);

    if let Some(dead) = exited() {
        return Err(format!("{dead} during the run").into());
    }
    println!("(bench took {:.0} s)", started.elapsed().as_secs_f64());
    Ok(())
}

impl Cell {
    /// One row's share of a round: the cell's requests, or `seconds` of load.
    fn round(&self, seconds: Option<f64>) -> Budget {
        match seconds {
            Some(s) => Budget::Time(Duration::from_secs_f64(s / ROUNDS as f64)),
            None => Budget::Requests(self.requests / ROUNDS),
        }
    }
}

/// A streaming cell with rows of its own: each row's stream checked to end as its API
/// ends one (and its events counted), then measured and printed.
fn stream_cell(
    rt: &tokio::runtime::Runtime,
    cell: &Cell,
    rows: &[Row],
    seconds: Option<f64>,
) -> Result<Vec<Measured>, Error> {
    let mut events = Vec::new();
    for row in rows {
        events.push(
            rt.block_on(sse_events(row.addr, &row.stream))
                .map_err(|e| format!("{}: {e}", row.label))?,
        );
    }
    let round = cell.round(seconds);
    let measured = measure(rt, cell, rows, round)?;
    print_cell(cell, rows, &measured, &events, round);
    Ok(measured)
}

/// One cell on every row: a warm-up each, then [`ROUNDS`] rounds of `round`, every row in
/// turn, with the proxy's CPU time read around each load.
fn measure(rt: &tokio::runtime::Runtime, cell: &Cell, rows: &[Row], round: Budget) -> Result<Vec<Measured>, Error> {
    // Opens the cell's connections, Envoy's upstream pool included, and lets V8 tier up.
    let warm_up = Budget::Requests((cell.requests / 20).max(cell.concurrency));
    let load = |row: &Row, budget| {
        rt.block_on(load(row.addr, row.request(cell), cell.concurrency, budget))
            .map_err(|e| format!("{} at {}: {e}", row.label, cell.title))
    };
    for row in rows {
        load(row, warm_up)?;
    }
    let mut measured: Vec<Measured> = rows.iter().map(|_| Measured::default()).collect();
    for _ in 0..ROUNDS {
        for (row, m) in rows.iter().zip(&mut measured) {
            let before = row.proxy.map(cpu_ns).transpose()?;
            let stats = load(row, round)?;
            if let (Some(pid), Some(before)) = (row.proxy, before) {
                m.cpu_ns += cpu_ns(pid)?.saturating_sub(before);
            }
            m.stats.merge(stats);
        }
    }
    Ok(measured)
}

impl Row {
    fn request(&self, cell: &Cell) -> &[u8] {
        if cell.streaming { &self.stream } else { &self.chat }
    }
}

fn print_header(pin: bool, envoy: &Path, wasm: &Path, body_bytes: usize, tensorzero: &Result<Proc, String>) {
    let version = envoy_version(envoy);
    println!(
        "== envoy bench: Envoy {version} ({}), proxies {}",
        ENVOY_FLAGS.join(" "),
        if pin {
            "pinned to CPU 0, the load generator and the fake upstream to CPU 1 (taskset)"
        } else {
            "NOT pinned (taskset or a second CPU missing): every process shares every CPU"
        }
    );
    println!(
        "  bootstraps: envoy/local.yaml, ports 0, no access_log; Envoy alone: no wasm filter (router only); \
         Envoy + waygate: benches/data/plugin.json"
    );
    if let Err(why) = tensorzero {
        println!("  TensorZero not measured: {why}");
    }
    println!("  machine (read only, the bench changes nothing): {}", idle_policy());
    for warning in wasm_warnings(wasm) {
        println!("  warning: {warning}");
    }
    println!(
        "  requests: ~1 KB chat ({body_bytes} body bytes); streams: the fake's long-18, 20 SSE events ~1 ms apart \
         (the filter asks for the usage event, so the upstream direct and Envoy alone are asked for it too: 21)"
    );
}

/// Prints one cell's table.
fn print_cell(cell: &Cell, rows: &[Row], measured: &[Measured], events: &[usize], round: Budget) {
    let per_round = match round {
        Budget::Requests(n) => format!("{n} {}", if cell.streaming { "streams" } else { "requests" }),
        Budget::Time(d) => format!("{:.1} s", d.as_secs_f64()),
    };
    if cell.streaming {
        println!(
            "{}: streamed chat, {ROUNDS} interleaved rounds of {per_round} per row:",
            cell.title
        );
        println!(
            "  {:<22} {:>7} {:>11} {:>11} {:>11} {:>10} {:>15}",
            "", "events", "TTFB p50", "TTFB p99", "total p50", "streams/s", "CPU/stream"
        );
        for ((row, m), events) in rows.iter().zip(measured).zip(events) {
            println!(
                "  {:<22} {events:>7} {:>8} ms {:>8} ms {:>8} ms {:>10.0} {:>15}",
                row.label,
                ms(m.stats.first(0.5)),
                ms(m.stats.first(0.99)),
                ms(m.stats.p(0.5)),
                m.stats.rps(),
                cpu_cell(row, m),
            );
        }
    } else {
        println!(
            "{}: non-streaming ~1 KB chat, {ROUNDS} interleaved rounds of {per_round} per row:",
            cell.title
        );
        println!(
            "  {:<22} {:>11} {:>11} {:>10} {:>15}",
            "", "p50", "p99", "req/s", "CPU/request"
        );
        for (row, m) in rows.iter().zip(measured) {
            println!(
                "  {:<22} {:>8} ms {:>8} ms {:>10.0} {:>15}",
                row.label,
                ms(m.stats.p(0.5)),
                ms(m.stats.p(0.99)),
                m.stats.rps(),
                cpu_cell(row, m),
            );
        }
    }
}

fn cpu_cell(row: &Row, m: &Measured) -> String {
    match row.proxy {
        Some(_) => format!("{:.1} µs", m.cpu_us_per_request()),
        None => "-".into(),
    }
}

impl Measured {
    fn cpu_us_per_request(&self) -> f64 {
        self.cpu_ns as f64 / 1e3 / self.stats.count as f64
    }
}

/// The whole run's figures, for the filter's cost and the targets.
struct Figures<'a> {
    rows: &'a [Row],
    results: &'a [Vec<Measured>],
    /// Each row's VmRSS at rest after the run, in KiB.
    rest_rss: &'a [Option<u64>],
    /// The long-stream cell, which has rows of its own.
    long_rows: &'a [Row],
    long: &'a [Measured],
    /// The fallback cell, which has rows of its own.
    fallback_rows: &'a [Row],
    fallback: &'a [Measured],
}

impl Figures<'_> {
    fn measured(&self, cell: usize, label: &str) -> Option<&Measured> {
        let row = self.rows.iter().position(|r| r.label == label)?;
        self.results.get(cell)?.get(row)
    }

    /// A figure of the row `label` in `cell`; NaN when that row did not run.
    fn of(&self, cell: usize, label: &str, figure: impl Fn(&Measured) -> f64) -> f64 {
        self.measured(cell, label).map_or(f64::NAN, figure)
    }

    fn cpu(&self, cell: usize, label: &str) -> f64 {
        self.of(cell, label, |m| m.cpu_us_per_request())
    }

    fn rps(&self, cell: usize, label: &str) -> f64 {
        self.of(cell, label, |m| m.stats.rps())
    }

    /// p50 in ms.
    fn p50(&self, cell: usize, label: &str) -> f64 {
        self.of(cell, label, |m| m.stats.p(0.5) / 1e6)
    }

    /// TTFB p50 in ms.
    fn ttfb(&self, cell: usize, label: &str) -> f64 {
        self.of(cell, label, |m| m.stats.first(0.5) / 1e6)
    }

    /// The filter's CPU per long stream of `api`: its row through waygate less the same
    /// provider stream through Envoy alone.
    fn long_filter_cpu(&self, filter: &str, api: &str) -> f64 {
        let cpu = |label: String| {
            let row = self.long_rows.iter().position(|r| r.label == label);
            row.and_then(|i| self.long.get(i))
                .map_or(f64::NAN, |m| m.cpu_us_per_request())
        };
        cpu(format!("{filter}, {api}")) - cpu(format!("{ENVOY_ALONE}, {api}"))
    }

    /// TTFB p50 (ms) of a fallback-cell row; NaN when it did not run.
    fn fallback_ttfb(&self, label: &str) -> f64 {
        let row = self.fallback_rows.iter().position(|r| r.label == label);
        row.and_then(|i| self.fallback.get(i))
            .map_or(f64::NAN, |m| m.stats.first(0.5) / 1e6)
    }

    fn rest_mib(&self, label: &str) -> f64 {
        let row = self.rows.iter().position(|r| r.label == label);
        row.and_then(|i| *self.rest_rss.get(i)?).map_or(f64::NAN, mib)
    }

    /// Envoy + waygate − Envoy alone, and the targets set on it.
    fn print_verdicts(&self, wasm_bytes: u64, tensorzero: &Result<Proc, String>) {
        let filter_cpu = |cell| self.cpu(cell, WAYGATE) - self.cpu(cell, ENVOY_ALONE);
        let added_p50 = |cell| self.p50(cell, WAYGATE) - self.p50(cell, ENVOY_ALONE);
        let added_rss = self.rest_mib(WAYGATE) - self.rest_mib(ENVOY_ALONE);
        let above_floor = |cell| self.cpu(cell, WAYGATE) - self.cpu(cell, FLOOR);
        let floor_cpu = |cell| self.cpu(cell, FLOOR) - self.cpu(cell, ENVOY_ALONE);
        let calls_cpu = |cell| self.cpu(cell, CALLS) - self.cpu(cell, ENVOY_ALONE);
        let calls_p50 = self.p50(C1, CALLS) - self.p50(C1, ENVOY_ALONE);
        let calls_vs_envoy = self.rps(C64, CALLS) / self.rps(C64, ENVOY_ALONE);
        println!("the floor filter's cost (Envoy + floor filter − Envoy alone, this run):");
        println!(
            "  CPU per request: c = 1 {:+.1} µs, c = 64 {:+.1} µs, per SSE stream {:+.1} µs; c = 64 throughput {:.2}× Envoy alone; RSS at rest {:+.1} MiB",
            floor_cpu(C1),
            floor_cpu(C64),
            floor_cpu(SSE),
            self.rps(C64, FLOOR) / self.rps(C64, ENVOY_ALONE),
            self.rest_mib(FLOOR) - self.rest_mib(ENVOY_ALONE),
        );
        println!(
            "waygate above the floor: CPU per request c = 1 {:+.1} µs, c = 64 {:+.1} µs, per SSE stream {:+.1} µs",
            above_floor(C1),
            above_floor(C64),
            above_floor(SSE)
        );
        println!("waygate's calls alone (Envoy + waygate's calls − Envoy alone, this run):");
        println!(
            "  CPU per request: c = 1 {:+.1} µs, c = 64 {:+.1} µs, per SSE stream {:+.1} µs; c = 64 throughput {calls_vs_envoy:.2}× Envoy alone; p50 at c = 1 {calls_p50:+.3} ms",
            calls_cpu(C1),
            calls_cpu(C64),
            calls_cpu(SSE),
        );
        println!(
            "waygate's own code (Envoy + waygate − Envoy + waygate's calls): CPU per request c = 1 {:+.1} µs, c = 64 {:+.1} µs, per SSE stream {:+.1} µs",
            filter_cpu(C1) - calls_cpu(C1),
            filter_cpu(C64) - calls_cpu(C64),
            filter_cpu(SSE) - calls_cpu(SSE)
        );
        println!("the filter's own cost (Envoy + waygate − Envoy alone, this run):");
        println!(
            "  CPU per request: c = 1 {:+.1} µs, c = 64 {:+.1} µs, per SSE stream {:+.1} µs",
            filter_cpu(C1),
            filter_cpu(C64),
            filter_cpu(SSE)
        );
        println!(
            "  p50: c = 1 {:+.3} ms, c = 64 {:+.3} ms; SSE TTFB p50 {:+.3} ms; RSS at rest {added_rss:+.1} MiB",
            added_p50(C1),
            added_p50(C64),
            self.ttfb(SSE, WAYGATE) - self.ttfb(SSE, ENVOY_ALONE),
        );

        let [openai, anthropic, gemini] = LONG_APIS.map(|api| self.long_filter_cpu(WAYGATE, api));
        println!(
            "  per {LONG_MODEL} stream: OpenAI-compatible {openai:+.1} µs, Anthropic {anthropic:+.1} µs, Gemini {gemini:+.1} µs"
        );
        if self.measured(C1, VARIANT).is_some() {
            let than_waygate = |cell| self.cpu(cell, VARIANT) - self.cpu(cell, WAYGATE);
            let long = LONG_APIS.map(|api| self.long_filter_cpu(VARIANT, api) - self.long_filter_cpu(WAYGATE, api));
            println!(
                "the variant ({VARIANT_ENV}) − the built filter: CPU per request c = 1 {:+.1} µs, c = 64 {:+.1} µs, per SSE stream {:+.1} µs; \
                 per {LONG_MODEL} stream OpenAI-compatible {:+.1} µs, Anthropic {:+.1} µs, Gemini {:+.1} µs; RSS at rest {:+.1} MiB",
                than_waygate(C1),
                than_waygate(C64),
                than_waygate(SSE),
                long[0],
                long[1],
                long[2],
                self.rest_mib(VARIANT) - self.rest_mib(WAYGATE),
            );
        }

        let first = self.fallback_ttfb(FIRST_ATTEMPT);
        let (by_call, by_router) = (
            self.fallback_ttfb(HTTP_CALL_FALLBACK),
            self.fallback_ttfb(ROUTER_FALLBACK),
        );
        // NaN: the row did not run (router fallback needs Envoy >= 1.39).
        let after_first = |ttfb: f64| match ttfb - first {
            d if d.is_nan() => "not measured".to_string(),
            d => format!("{d:+.3} ms"),
        };
        println!(
            "  a fallback stream's first byte after the first attempt's: http_call {}, router {}",
            after_first(by_call),
            after_first(by_router)
        );

        let c64_vs_envoy = self.rps(C64, WAYGATE) / self.rps(C64, ENVOY_ALONE);
        let sse_vs_envoy = self.rps(SSE, WAYGATE) / self.rps(SSE, ENVOY_ALONE);
        let ttfb_added = self.ttfb(SSE, WAYGATE) - self.ttfb(SSE, ENVOY_ALONE);
        let c64_vs_tensorzero = match tensorzero {
            Ok(_) => {
                let ratio = self.rps(C64, WAYGATE) / self.rps(C64, TENSORZERO_ROW);
                Verdict::judge(
                    ratio >= C64_VS_TENSORZERO,
                    format!(
                        "{ratio:.2}× ({:.0} / {:.0} req/s)",
                        self.rps(C64, WAYGATE),
                        self.rps(C64, TENSORZERO_ROW)
                    ),
                )
            }
            Err(why) => Verdict::NotMeasured(format!("TensorZero {why}")),
        };
        let verdicts = [
            (
                format!("filter CPU at c = 64 ≤ {FILTER_CPU_C64_US} µs/request"),
                Verdict::judge(
                    filter_cpu(C64) <= FILTER_CPU_C64_US,
                    format!("{:.1} µs (its calls alone {:.1})", filter_cpu(C64), calls_cpu(C64)),
                ),
            ),
            (
                format!("filter CPU at c = 1 ≤ {FILTER_CPU_C1_US} µs/request"),
                Verdict::judge(
                    filter_cpu(C1) <= FILTER_CPU_C1_US,
                    format!("{:.1} µs (its calls alone {:.1})", filter_cpu(C1), calls_cpu(C1)),
                ),
            ),
            (
                format!("c = 64 throughput ≥ {C64_VS_ENVOY}× Envoy alone"),
                Verdict::judge(
                    c64_vs_envoy >= C64_VS_ENVOY,
                    format!(
                        "{c64_vs_envoy:.2}× ({:.0} / {:.0} req/s; its calls alone {calls_vs_envoy:.2}×)",
                        self.rps(C64, WAYGATE),
                        self.rps(C64, ENVOY_ALONE)
                    ),
                ),
            ),
            (
                format!("c = 64 throughput ≥ {C64_VS_TENSORZERO}× TensorZero"),
                c64_vs_tensorzero,
            ),
            (
                format!("p50 added at c = 1 over Envoy alone ≤ {ADDED_P50_C1_MS} ms"),
                Verdict::judge(
                    added_p50(C1) <= ADDED_P50_C1_MS,
                    format!("{:+.3} ms (its calls alone {calls_p50:+.3})", added_p50(C1)),
                ),
            ),
            (
                format!("SSE c = 16 throughput ≥ {SSE_VS_ENVOY}× Envoy alone"),
                Verdict::judge(sse_vs_envoy >= SSE_VS_ENVOY, format!("{sse_vs_envoy:.2}×")),
            ),
            (
                format!("SSE c = 16 TTFB p50 within {SSE_TTFB_ADDED_MS} ms of Envoy alone"),
                Verdict::judge(ttfb_added <= SSE_TTFB_ADDED_MS, format!("{ttfb_added:+.3} ms")),
            ),
            (
                format!("{LONG_MODEL} stream, Anthropic: filter CPU ≤ {LONG_VS_OPENAI}× the OpenAI-compatible one"),
                Verdict::judge(
                    anthropic <= LONG_VS_OPENAI * openai,
                    format!("{:.2}×", anthropic / openai),
                ),
            ),
            (
                format!("{LONG_MODEL} stream, Gemini: filter CPU ≤ {LONG_VS_OPENAI}× the OpenAI-compatible one"),
                Verdict::judge(gemini <= LONG_VS_OPENAI * openai, format!("{:.2}×", gemini / openai)),
            ),
            (
                format!("RSS at rest ≤ Envoy alone + {RSS_ADDED_MIB} MiB (one worker)"),
                Verdict::judge(added_rss <= RSS_ADDED_MIB, format!("{added_rss:+.1} MiB")),
            ),
            (
                format!("waygate.wasm ≤ {} KB", WASM_BYTES / 1000),
                Verdict::judge(
                    wasm_bytes <= WASM_BYTES,
                    format!("{} KB ({wasm_bytes} bytes)", (wasm_bytes + 500) / 1000),
                ),
            ),
        ];
        println!("issue #29 targets, this run:");
        for (target, verdict) in verdicts {
            println!("  {}", verdict.line(&target));
        }
        let target =
            format!("router fallback stream's TTFB p50 within {FALLBACK_TTFB_ADDED_MS} ms of a first attempt's");
        let verdict = if by_router.is_nan() {
            Verdict::NotMeasured("router fallback not measured in this Envoy".into())
        } else {
            Verdict::judge(
                by_router - first <= FALLBACK_TTFB_ADDED_MS,
                format!("{:+.3} ms ({by_router:.3} against {first:.3} ms)", by_router - first),
            )
        };
        println!("issue #27 target, this run:\n  {}", verdict.line(&target));
    }
}

enum Verdict {
    Met(String),
    Missed(String),
    NotMeasured(String),
}

impl Verdict {
    /// NaN (a row that did not run) compares false, so it reads as missed.
    fn judge(met: bool, measured: String) -> Verdict {
        if met {
            Verdict::Met(measured)
        } else {
            Verdict::Missed(measured)
        }
    }

    fn line(&self, target: &str) -> String {
        match self {
            Verdict::Met(m) => format!("[met]    {target}: {m}"),
            Verdict::Missed(m) => format!("[missed] {target}: {m}"),
            Verdict::NotMeasured(why) => format!("[n/a]    {target}: {why}"),
        }
    }
}

fn ms(ns: f64) -> String {
    format!("{:.3}", ns / 1e6)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn body_len(request: &[u8]) -> usize {
    request
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |p| request.len() - p - 4)
}

/// Whether `taskset` can pin to CPUs 0 and 1.
fn can_pin() -> bool {
    std::thread::available_parallelism().is_ok_and(|n| n.get() >= 2)
        && Command::new("taskset")
            .args(["-c", "1", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

/// `program` as a command, pinned to CPU 0 when the run pins. `taskset` execs it, so the
/// child's pid is the program's own, whose `/proc` entries the bench reads.
fn on_cpu0(pin: bool, program: impl AsRef<std::ffi::OsStr>) -> Command {
    if pin {
        let mut c = Command::new("taskset");
        c.args(["-c", "0"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

/// The machine's idle policy, which dominates c = 1 on a virtual machine: a halted virtual
/// CPU is woken through the hypervisor, and a request through a proxy wakes CPUs where the
/// direct upstream does not. Only read.
fn idle_policy() -> String {
    let read = |path: &str| std::fs::read_to_string(path).ok().map(|s| s.trim().to_string());
    let driver = read("/sys/devices/system/cpu/cpuidle/current_driver").unwrap_or_else(|| "none".into());
    match read("/sys/module/haltpoll/parameters/guest_halt_poll_ns") {
        Some(ns) => format!("cpuidle driver {driver}, an idle CPU polls {ns} ns before it halts"),
        None => format!("cpuidle driver {driver}"),
    }
}

/// What may make the measured `.wasm` (a copy of `wasm`, the build's output) not the one
/// `make build` ships: older than a source file, or not `wasm-opt`'s output beside it.
fn wasm_warnings(wasm: &Path) -> Vec<String> {
    fn newest_in(dir: &Path) -> std::time::SystemTime {
        let mut newest = std::time::SystemTime::UNIX_EPOCH;
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            let modified = if path.is_dir() {
                newest_in(&path)
            } else {
                entry.metadata().and_then(|m| m.modified()).unwrap_or(newest)
            };
            newest = newest.max(modified);
        }
        newest
    }
    let mut warnings = Vec::new();
    let built = std::fs::metadata(wasm).and_then(|m| m.modified());
    let src = wasm.ancestors().nth(4).map(|root| root.join("src"));
    if let (Ok(built), Some(src)) = (built, src)
        && newest_in(&src) > built
    {
        warnings.push(format!(
            "{} is older than src/: `make build` rebuilds it",
            wasm.display()
        ));
    }
    let optimized = std::fs::read(wasm.with_file_name("waygate.optimized.wasm"));
    if optimized.is_ok_and(|optimized| std::fs::read(wasm).is_ok_and(|measured| measured != optimized)) {
        warnings.push(format!(
            "{} is not wasm-opt's output (a build was under way?): `make build` puts it back",
            wasm.display()
        ));
    }
    warnings
}

/// `envoy --version`'s release number, say `1.40.0`.
/// Whether the Envoy at `envoy` is `(major, minor)` or later.
fn envoy_at_least(envoy: &Path, (major, minor): (u32, u32)) -> bool {
    let version = envoy_version(envoy);
    let mut parts = version.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

fn envoy_version(envoy: &Path) -> String {
    let out = Command::new(envoy).arg("--version").output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    // "envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL"
    text.split('/')
        .find(|part| part.split('.').count() == 3 && part.split('.').all(|n| n.parse::<u32>().is_ok()))
        .unwrap_or("(unknown version)")
        .to_string()
}

/// The process's CPU time so far, in ns: the scheduler's own account of every thread's time
/// on a CPU (`/proc/<pid>/task/*/schedstat`), exact where `/proc/<pid>/stat`'s user and
/// system times are sampled in 10 ms ticks. Envoy's threads live as long as it does.
fn cpu_ns(pid: u32) -> Result<u64, Error> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        match std::fs::read_to_string(task?.path().join("schedstat")) {
            Ok(stat) => {
                let run_ns = stat.split_whitespace().next().ok_or("empty schedstat")?;
                total += run_ns.parse::<u64>()?;
            }
            // A thread that ended between the listing and the read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(total)
}

/// VmRSS of the process `pid`, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// `file` (`envoy/local.yaml` or `envoy/local-router.yaml`) as [`bootstrap::shipped`] shapes
/// it, without the access log. With `filter` (the plugin configuration and the `.wasm`), the
/// wasm filter and every cluster's upstream role run them; without, the filter is removed and
/// the `fake` route matches every request.
fn bootstrap(root: &Path, file: &str, fake: SocketAddr, filter: Option<(&Value, &Path)>) -> Result<String, Error> {
    let mut doc = bootstrap::shipped(root, file, fake, filter)?;
    let hcm = &mut doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    // One write per request off the hot path, in both Envoys alike.
    if let Some(hcm) = hcm.as_mapping_mut() {
        hcm.remove("access_log");
    }
    if filter.is_none() {
        hcm["http_filters"]
            .as_sequence_mut()
            .ok_or_else(|| format!("no http_filters in {file}"))?
            .retain(|f| f["name"] != "waygate");
        let routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
            .as_sequence_mut()
            .ok_or_else(|| format!("no routes in {file}"))?;
        for route in routes.iter_mut().filter(|r| r["name"] == "fake") {
            if let Some(m) = route["match"].as_mapping_mut() {
                m.remove("headers");
            }
        }
    }
    Ok(serde_yaml::to_string(&doc)?)
}

/// Envoy on `yaml`, on CPU 0, its log in `target/bench/<name>.log`; ready once its admin
/// says so, with the `waygate` listener's address read back from the admin.
fn start_envoy(binary: &Path, yaml: &str, root: &Path, work: &Path, name: &str, pin: bool) -> Result<Proc, Error> {
    let config = work.join(format!("{name}.yaml"));
    std::fs::write(&config, yaml)?;
    let admin_path = work.join(format!("{name}.admin"));
    let _ = std::fs::remove_file(&admin_path);
    let log_path = work.join(format!("{name}.log"));
    let log = std::fs::File::create(&log_path)?;
    let mut cmd = on_cpu0(pin, binary);
    cmd.arg("-c")
        .arg(&config)
        .args(ENVOY_FLAGS)
        .arg("--admin-address-path")
        .arg(&admin_path)
        .current_dir(root)
        // No real provider key reaches the VM (the bootstrap forwards these).
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("GEMINI_API_KEY")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    let mut proc = Proc {
        name: name.to_string(),
        child: cmd.spawn().map_err(|e| format!("{cmd:?}: {e}"))?,
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let admin = loop {
        let failed = if proc.child.try_wait()?.is_some() {
            Some("exited")
        } else if Instant::now() > deadline {
            Some("was not ready in 60 s")
        } else {
            None
        };
        if let Some(why) = failed {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(format!("Envoy {name} {why}:\n{log}").into());
        }
        let admin = std::fs::read_to_string(&admin_path)
            .ok()
            .and_then(|a| a.trim().parse().ok());
        if let Some(admin) = admin
            && admin_get(admin, "/ready").is_ok_and(|(status, _)| status == 200)
        {
            break admin;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (_, body) = admin_get(admin, "/listeners?format=json")?;
    let listeners: Value = serde_json::from_str(&body).map_err(|e| format!("/listeners: {e}: {body}"))?;
    let waygate = listeners["listener_statuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|l| l["name"] == "waygate")
        .ok_or_else(|| format!("Envoy {name} has no waygate listener: {body}"))?;
    let port = waygate["local_address"]["socket_address"]["port_value"]
        .as_u64()
        .ok_or_else(|| format!("Envoy {name}: no port in {waygate}"))?;
    proc.addr = SocketAddr::from(([127, 0, 0, 1], u16::try_from(port)?));
    Ok(proc)
}

/// A GET on Envoy's admin: status and body.
fn admin_get(addr: SocketAddr, path: &str) -> Result<(u16, String), Error> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(conn, "GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n")?;
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("admin: no header end")?;
    let status = head.split(' ').nth(1).ok_or("admin: no status")?.parse()?;
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    Ok((status, if chunked { dechunk(body) } else { body.to_string() }))
}

/// A chunked body's payload.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        let Some(chunk) = after.get(..size).filter(|_| size > 0) else {
            break;
        };
        out.push_str(chunk);
        rest = after.get(size..).unwrap_or_default().trim_start_matches("\r\n");
    }
    out
}

const TENSORZERO: &str = "tensorzero==2026.6.0";

/// TensorZero's Rust gateway, as its PyPI package ships it: the wheel embeds the whole
/// gateway (axum on tokio) and `_start_http_gateway` serves it over HTTP from the Python
/// process, which then only sleeps. Installed once into a venv in target/bench/peers; on
/// CPU 0 like Envoy (tokio sizes its runtime to the one CPU it may use); no
/// observability store; its log at `error`, as a deployment would run it (its default
/// level writes a warning per request for the body's `user` field).
fn start_tensorzero(work: &Path, pin: bool, fake: SocketAddr) -> Result<Proc, Error> {
    let venv = work.join("peers/tensorzero");
    let python = venv.join("bin/python");
    install_venv(&venv, TENSORZERO)?;
    let config = venv.join("bench.toml");
    let mut toml = String::new();
    for model in ["gpt-4o-mini", "long-18"] {
        toml.push_str(&format!(
            "[models.{model}]\nrouting = [\"fake\"]\n\n[models.{model}.providers.fake]\ntype = \"openai\"\n\
             model_name = \"{model}\"\napi_base = \"http://{fake}/v1/\"\napi_key_location = \"env::OPENAI_API_KEY\"\n\n"
        ));
    }
    toml.push_str("[gateway.observability]\nenabled = false\n");
    std::fs::write(&config, toml)?;
    let launcher = venv.join("serve.py");
    std::fs::write(
        &launcher,
        "import sys, time, urllib.parse\n\
         from tensorzero.tensorzero import _start_http_gateway\n\
         gateway = _start_http_gateway(config_file=sys.argv[1], clickhouse_url=None,\n    \
         postgres_url=None, valkey_url=None, async_setup=False)\n\
         print('tensorzero listening on http://' + urllib.parse.urlsplit(gateway.base_url).netloc, flush=True)\n\
         while True:\n    time.sleep(3600)\n",
    )?;
    let mut cmd = on_cpu0(pin, &python);
    cmd.arg(&launcher)
        .arg(&config)
        .env("OPENAI_API_KEY", "fake-openai-key")
        .env("RUST_LOG", "error")
        .env("TENSORZERO_DISABLE_PSEUDONYMOUS_USAGE_ANALYTICS", "1")
        .current_dir(&venv);
    Proc::spawn(
        &mut cmd,
        "tensorzero listening on http://",
        &work.join("tensorzero.log"),
    )
}

/// A venv at `venv` with `package` installed from PyPI, once: a marker written after
/// the install names what it holds, so an install cut short is done again.
fn install_venv(venv: &Path, package: &str) -> Result<(), Error> {
    let marker = venv.join(".waygate-installed");
    if std::fs::read_to_string(&marker).is_ok_and(|held| held == package) {
        return Ok(());
    }
    let pip = venv.join("bin/pip");
    let mut steps = [Command::new("python3"), Command::new(&pip)];
    steps[0].args(["-m", "venv"]).arg(venv);
    steps[1].args(["install", "-q", package]);
    for mut step in steps {
        let status = step.status().map_err(|e| format!("{step:?}: {e}"))?;
        if !status.success() {
            return Err(format!("installing {package} failed: {step:?}").into());
        }
    }
    std::fs::write(marker, package)?;
    Ok(())
}

/// A child server process, killed (by its own pid) when dropped.
struct Proc {
    name: String,
    child: Child,
    addr: SocketAddr,
}

impl Proc {
    /// Starts `cmd` with its stdout going to the file `log` and waits for the line
    /// `<prefix>ADDR` in it. A file, not a pipe: draining a pipe would wake a thread of
    /// this process (on the load generator's CPU) for every line a server logs.
    fn spawn(cmd: &mut Command, prefix: &str, log: &Path) -> Result<Proc, Error> {
        let name = log
            .file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        let file = std::fs::File::create(log)?;
        cmd.stdout(file.try_clone()?).stderr(file);
        let mut child = cmd.spawn().map_err(|e| format!("{cmd:?}: {e}"))?;
        let started = Instant::now();
        let addr = loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(addr) = text.lines().find_map(|line| line.strip_prefix(prefix)) {
                break addr.trim().parse()?;
            }
            let exited = child.try_wait()?.is_some();
            if exited || started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                let why = if exited { "exited" } else { "gave no address in 60 s" };
                return Err(format!("{cmd:?} {why}:\n{text}").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        Ok(Proc { name, child, addr })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process still runs: not exited, not a zombie waiting to be reaped.
    fn alive(&self) -> bool {
        // `try_wait` needs `&mut`; the state in `/proc/<pid>/stat` serves as well.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        state.is_some_and(|s| s != "Z" && s != "X")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The requests, as raw HTTP/1.1 bytes.
struct Requests {
    /// What the filter sends the provider for the gateway's request: the provider's path,
    /// credential and model name. Sent to the upstream direct and to Envoy alone.
    provider: Vec<u8>,
    provider_stream: Vec<u8>,
    gateway: Vec<u8>,
    gateway_stream: Vec<u8>,
    /// The provider's body on the gateway's path with the client's key: the floor filter
    /// routes it as it is.
    floor: Vec<u8>,
    floor_stream: Vec<u8>,
    tensorzero: Vec<u8>,
    tensorzero_stream: Vec<u8>,
}

fn http(path: &str, headers: &[(&str, &str)], body: &Value) -> Vec<u8> {
    let body = serde_json::to_vec(body).unwrap_or_default();
    let mut req = format!("POST {path} HTTP/1.1\r\nhost: gateway.local\r\ncontent-type: application/json\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("content-length: {}\r\n\r\n", body.len()));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(&body);
    bytes
}

impl Requests {
    fn new(body: &Value) -> Requests {
        let with = |model: &str, stream: bool| {
            let mut b = body.clone();
            b["model"] = model.into();
            if stream {
                b["stream"] = true.into();
            }
            b
        };
        let openai_key = [("authorization", "Bearer fake-openai-key")];
        let dev_key = [("authorization", "Bearer wg-dev-key")];
        let gateway_path = "/api/v1/chat/completions";
        // TensorZero's OpenAI-compatible endpoint names a model from its config this way.
        let tensorzero_path = "/openai/v1/chat/completions";
        let provider_body = with("gpt-4o-mini", false);
        // The filter adds `stream_options.include_usage` to count tokens, and the fake
        // paces the usage chunk like any other event, so a stream asked for without it
        // would end one event sooner and charge the filter for the fake's pause.
        let provider_stream_body = {
            let mut b = with("long-18", true);
            b["stream_options"] = json!({"include_usage": true});
            b
        };
        Requests {
            provider: http("/v1/chat/completions", &openai_key, &provider_body),
            provider_stream: http("/v1/chat/completions", &openai_key, &provider_stream_body),
            floor: http(gateway_path, &dev_key, &provider_body),
            floor_stream: http(gateway_path, &dev_key, &provider_stream_body),
            gateway: http(gateway_path, &dev_key, &with("fake/gpt-4o-mini", false)),
            gateway_stream: http(gateway_path, &dev_key, &with("fake/long-18", true)),
            tensorzero: http(
                tensorzero_path,
                &[],
                &with("tensorzero::model_name::gpt-4o-mini", false),
            ),
            tensorzero_stream: http(tensorzero_path, &[], &with("tensorzero::model_name::long-18", true)),
        }
    }
}

/// Latencies (ns) of every request, their times to the first body byte, and the wall time.
#[derive(Default)]
struct Stats {
    latency: Vec<u64>,
    first: Vec<u64>,
    wall: Duration,
    count: usize,
}

impl Stats {
    fn merge(&mut self, other: Stats) {
        self.latency.extend(other.latency);
        self.first.extend(other.first);
        self.wall += other.wall;
        self.count += other.count;
    }

    fn p(&self, q: f64) -> f64 {
        percentile(&self.latency, q)
    }

    fn first(&self, q: f64) -> f64 {
        percentile(&self.first, q)
    }

    fn rps(&self) -> f64 {
        self.count as f64 / self.wall.as_secs_f64()
    }
}

fn percentile(values: &[u64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = (sorted.len().saturating_sub(1) as f64 * q).round() as usize;
    sorted.get(rank).map_or(f64::NAN, |&ns| ns as f64)
}

/// How long one load runs: a number of requests, or a wall time.
#[derive(Clone, Copy)]
enum Budget {
    Requests(usize),
    Time(Duration),
}

/// Sends requests over `c` keep-alive connections until `budget` is spent.
async fn load(addr: SocketAddr, request: &[u8], c: usize, budget: Budget) -> Result<Stats, Error> {
    let request: Rc<[u8]> = Rc::from(request);
    let sent = Rc::new(std::cell::Cell::new(0usize));
    let start = Instant::now();
    let more = move |sent: usize| match budget {
        Budget::Requests(total) => sent < total,
        Budget::Time(wall) => start.elapsed() < wall,
    };
    let connections = match budget {
        Budget::Requests(total) => c.min(total),
        Budget::Time(_) => c,
    };
    let local = tokio::task::LocalSet::new();
    let results = local
        .run_until(async {
            let mut tasks = Vec::new();
            for _ in 0..connections {
                let (request, sent) = (Rc::clone(&request), Rc::clone(&sent));
                tasks.push(tokio::task::spawn_local(async move {
                    let mut conn = TcpStream::connect(addr).await?;
                    conn.set_nodelay(true)?;
                    let mut buf = Vec::with_capacity(64 * 1024);
                    let mut out = Vec::new();
                    while more(sent.get()) {
                        sent.set(sent.get() + 1);
                        out.push(exchange(&mut conn, &mut buf, &request).await?);
                    }
                    Ok::<_, std::io::Error>(out)
                }));
            }
            let mut all = Vec::new();
            for task in tasks {
                all.push(task.await);
            }
            all
        })
        .await;
    let mut stats = Stats {
        wall: start.elapsed(),
        ..Stats::default()
    };
    for result in results {
        for (latency, first) in result?? {
            stats.latency.push(latency);
            stats.first.push(first);
            stats.count += 1;
        }
    }
    Ok(stats)
}

enum Framing {
    Length(usize),
    Chunked,
}

/// One request on a keep-alive connection: (total ns, ns to the first body byte).
async fn exchange(conn: &mut TcpStream, buf: &mut Vec<u8>, request: &[u8]) -> std::io::Result<(u64, u64)> {
    let start = Instant::now();
    conn.write_all(request).await?;
    buf.clear();
    let mut head: Option<(usize, Framing)> = None;
    let mut first = None;
    loop {
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        if conn.read_buf(buf).await? == 0 {
            return Err(std::io::Error::other("connection closed mid-response"));
        }
        if head.is_none()
            && let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n")
        {
            head = Some((end + 4, parse_head(buf.get(..end).unwrap_or_default())?));
        }
        let Some((body_at, framing)) = &head else { continue };
        let body = buf.get(*body_at..).unwrap_or_default();
        if first.is_none() && !body.is_empty() {
            first = Some(start.elapsed().as_nanos() as u64);
        }
        let done = match framing {
            Framing::Length(n) => body.len() >= *n,
            Framing::Chunked => body.ends_with(b"\r\n0\r\n\r\n") || body == b"0\r\n\r\n",
        };
        if done {
            let total = start.elapsed().as_nanos() as u64;
            return Ok((total, first.unwrap_or(total)));
        }
    }
}

/// The response's framing; an error unless its status is 200.
fn parse_head(head: &[u8]) -> std::io::Result<Framing> {
    let text = String::from_utf8_lossy(head);
    let mut lines = text.split("\r\n");
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).unwrap_or("");
    if status != "200" {
        return Err(std::io::Error::other(format!("status {status}: {text}")));
    }
    let mut framing = Framing::Length(0);
    for line in lines {
        let Some((k, v)) = line.split_once(':') else { continue };
        let (k, v) = (k.trim().to_ascii_lowercase(), v.trim());
        if k == "content-length" {
            framing = Framing::Length(v.parse().map_err(std::io::Error::other)?);
        } else if k == "transfer-encoding" && v.eq_ignore_ascii_case("chunked") {
            framing = Framing::Chunked;
        }
    }
    Ok(framing)
}

/// SSE events in one streamed answer before `[DONE]` (checks each row streams alike).
/// The number of events of one stream, which must have ended as its API ends a stream.
async fn sse_events(addr: SocketAddr, request: &[u8]) -> Result<usize, Error> {
    let mut conn = TcpStream::connect(addr).await?;
    let mut buf = Vec::new();
    exchange(&mut conn, &mut buf, request).await?;
    let text = String::from_utf8_lossy(&buf);
    let events = text.matches("data: ").count();
    if text.contains("data: [DONE]") {
        Ok(events.saturating_sub(1))
    } else if ["\"message_stop\"", "\"finishReason\"", "\"response.completed\""]
        .iter()
        .any(|end| text.contains(end))
    {
        Ok(events)
    } else {
        Err(format!("the stream did not end: {text}").into())
    }
}

/// The fallback cell's rows: the second candidate's stream asked of it first, and the
/// model whose first candidate fails through each fallback mode.
fn fallback_rows(waygate: &Proc, router: Option<&Proc>, body: &Value) -> Vec<Row> {
    let stream = |model: &str| {
        let b = json!({"model": model, "stream": true, "messages": body["messages"]});
        http(
            "/api/v1/chat/completions",
            &[("authorization", "Bearer wg-dev-key")],
            &b,
        )
    };
    let row = |label: &str, proxy: &Proc, model: &str| Row {
        label: label.into(),
        addr: proxy.addr,
        chat: Vec::new(),
        stream: stream(model),
        proxy: Some(proxy.pid()),
    };
    let mut rows = vec![
        row(FIRST_ATTEMPT, waygate, "fake/long-100"),
        row(HTTP_CALL_FALLBACK, waygate, FALLBACK_MODEL),
    ];
    rows.extend(router.map(|r| row(ROUTER_FALLBACK, r, FALLBACK_MODEL)));
    rows
}

/// The dead-provider cell's rows: each dead model through health on and health off.
fn dead_provider_rows(on: &Proc, off: &Proc, body: &Value) -> Vec<Row> {
    let mut rows = Vec::new();
    for (what, model) in DEAD_MODELS {
        for (health, proxy) in [("on", on), ("off", off)] {
            let request = json!({"model": model, "messages": body["messages"], "max_tokens": 256});
            rows.push(Row {
                label: format!("health {health}, {what}"),
                addr: proxy.addr,
                chat: http(
                    "/api/v1/chat/completions",
                    &[("authorization", "Bearer wg-dev-key")],
                    &request,
                ),
                stream: Vec::new(),
                proxy: Some(proxy.pid()),
            });
        }
    }
    rows
}

/// The inbound-API cells' rows: per filtered build, the bench's conversation as each
/// inbound API's request, plain and streamed, all answered by the OpenAI-compatible fake.
fn client_api_rows(filtered: &[(&str, &Proc)], body: &Value) -> Vec<Row> {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let system: String = messages
        .iter()
        .filter(|m| m["role"] == "system")
        .filter_map(|m| m["content"].as_str())
        .collect();
    let turns: Vec<Value> = messages.iter().filter(|m| m["role"] != "system").cloned().collect();
    let request = |api: &str, model: &str, stream: bool| match api {
        "responses" => {
            json!({"model": model, "instructions": system, "input": turns, "max_output_tokens": 256, "stream": stream})
        }
        "messages" | "messages, native" => {
            json!({"model": model, "system": system, "messages": turns, "max_tokens": 256, "stream": stream})
        }
        _ => json!({"model": model, "messages": messages, "max_tokens": 256, "stream": stream}),
    };
    let mut rows = Vec::new();
    for (label, proxy) in filtered {
        for (api, path, provider) in CLIENT_API_PATHS {
            let send = |model: &str, stream: bool| {
                http(
                    path,
                    &[("authorization", "Bearer wg-dev-key")],
                    &request(api, model, stream),
                )
            };
            rows.push(Row {
                label: format!("{label}, {api}"),
                addr: proxy.addr,
                chat: send(&format!("{provider}/ok"), false),
                stream: send(&format!("{provider}/long-18"), true),
                proxy: Some(proxy.pid()),
            });
        }
    }
    rows
}

/// The provider APIs of the long-stream cell, as its row labels name them.
const LONG_APIS: [&str; 3] = ["OpenAI-compatible", "Anthropic", "Gemini"];

/// The long-stream cell's rows: per API, the stream through the filter (the bench plugin
/// configuration's provider of that API) and the same provider stream through Envoy alone.
fn long_stream_rows(envoy_alone: &Proc, filtered: &[(&str, &Proc)], body: &Value) -> Vec<Row> {
    let messages = body["messages"].clone();
    let gateway = |provider: &str| {
        let mut b = json!({"model": format!("{provider}/{LONG_MODEL}"), "stream": true, "messages": messages});
        if let Some(max) = body.get("max_tokens") {
            b["max_tokens"] = max.clone();
        }
        http(
            "/api/v1/chat/completions",
            &[("authorization", "Bearer wg-dev-key")],
            &b,
        )
    };
    let user = json!([{"role": "user", "content": "Tell me a long story."}]);
    let provider = [
        http(
            "/v1/chat/completions",
            &[("authorization", "Bearer fake-openai-key")],
            &json!({"model": LONG_MODEL, "stream": true, "stream_options": {"include_usage": true}, "messages": user}),
        ),
        http(
            "/v1/messages",
            &[("x-api-key", "fake-anthropic-key"), ("anthropic-version", "2023-06-01")],
            &json!({"model": LONG_MODEL, "stream": true, "max_tokens": 1024, "messages": user}),
        ),
        http(
            &format!("/v1beta/models/{LONG_MODEL}:streamGenerateContent?alt=sse"),
            &[("x-goog-api-key", "fake-gemini-key")],
            &json!({"contents": [{"role": "user", "parts": [{"text": "Tell me a long story."}]}]}),
        ),
    ];
    let through_filter = ["fake", "fakeanthropic", "fakegemini"].map(gateway);
    let mut rows = Vec::new();
    for ((api, direct), request) in LONG_APIS.iter().zip(provider).zip(through_filter) {
        rows.push(Row {
            label: format!("{ENVOY_ALONE}, {api}"),
            addr: envoy_alone.addr,
            chat: Vec::new(),
            stream: direct,
            proxy: Some(envoy_alone.pid()),
        });
        for (label, proxy) in filtered {
            rows.push(Row {
                label: format!("{label}, {api}"),
                addr: proxy.addr,
                chat: Vec::new(),
                stream: request.clone(),
                proxy: Some(proxy.pid()),
            });
        }
    }
    rows
}
