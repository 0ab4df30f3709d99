//! Real Envoy, as every integration test runs the filter: the pinned binary that `make`
//! installs (`target/envoy-<version>/bin/envoy`, named by `WAYGATE_ENVOY`), one process per
//! gateway with its own bootstrap file, two workers, and no environment (so no real
//! provider key reaches the VM). Ports are ephemeral: the admin's address comes from
//! `--admin-address-path`, the listeners' from the admin's `/listeners`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The Envoy the Makefile installed when `WAYGATE_ENVOY` is unset (a bare `cargo test`).
const DEFAULT_ENVOY: &str = "target/envoy-1.40.0/bin/envoy";

/// How long Envoy may take to load the bootstrap, compile the module and bind.
const STARTUP: Duration = Duration::from_secs(30);

/// The Envoy binary under test.
pub fn binary() -> PathBuf {
    let path = std::env::var_os("WAYGATE_ENVOY")
        .map(PathBuf::from)
        .unwrap_or_else(|| super::root().join(DEFAULT_ENVOY));
    assert!(
        path.exists(),
        "{} is missing: run `make test` (it installs the pinned Envoy into target/)",
        path.display()
    );
    path
}

/// The Envoy under test's version, as `(major, minor)`: from `envoy --version`
/// (`…/1.40.0/Clean/RELEASE/BoringSSL`), read once.
pub fn version() -> (u32, u32) {
    static VERSION: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();
    *VERSION.get_or_init(|| {
        let out = Command::new(binary()).arg("--version").output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split('/')
            .find_map(|part| {
                let mut numbers = part.split('.').map(|n| n.parse::<u32>().ok());
                match (numbers.next(), numbers.next(), numbers.next(), numbers.next()) {
                    (Some(Some(major)), Some(Some(minor)), Some(Some(_)), None) => Some((major, minor)),
                    _ => None,
                }
            })
            .unwrap_or_else(|| panic!("no version in `envoy --version`: {text}"))
    })
}

/// Router fallback needs `retry_policy.refresh_cluster_on_retry` (Envoy 1.39).
pub fn supports_router_fallback() -> bool {
    version() >= (1, 39)
}

/// One running Envoy; killed, and its files removed, when dropped.
pub struct Envoy {
    child: Child,
    dir: PathBuf,
    admin: SocketAddr,
    listeners: Vec<(String, SocketAddr)>,
}

impl Envoy {
    /// Starts Envoy on `bootstrap` (YAML) and waits until it is ready and its listeners
    /// are bound. `Err` carries Envoy's own log when it refused the config or exited.
    /// `WAYGATE_ENVOY_LOG_LEVEL` (say `debug`) raises its log level to debug a test.
    pub fn start(bootstrap: &str) -> Result<Envoy, String> {
        let level = std::env::var("WAYGATE_ENVOY_LOG_LEVEL").unwrap_or_else(|_| "info".into());
        Envoy::start_logging(bootstrap, &level)
    }

    /// [`Envoy::start`] with another `--log-level` (`warn` keeps the plugin's access lines out).
    pub fn start_logging(bootstrap: &str, log_level: &str) -> Result<Envoy, String> {
        Envoy::launch(bootstrap, log_level, 2)
    }

    /// [`Envoy::start`] with one worker thread: one VM, so a test of its memory
    /// high-water mark does not depend on which worker the kernel hands a connection.
    pub fn start_single_worker(bootstrap: &str) -> Result<Envoy, String> {
        Envoy::launch(bootstrap, "info", 1)
    }

    fn launch(bootstrap: &str, log_level: &str, workers: usize) -> Result<Envoy, String> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "waygate-envoy-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("bootstrap.yaml");
        std::fs::write(&config, bootstrap).unwrap();
        let admin_path = dir.join("admin-address");
        let child = Command::new(binary())
            .arg("-c")
            .arg(&config)
            .args(["--disable-hot-restart", "--log-level", log_level])
            .args(["--concurrency", &workers.to_string()])
            // Access log lines (stdout) within 20 ms instead of Envoy's default 10 s.
            .args(["--file-flush-interval-msec", "20"])
            .arg("--admin-address-path")
            .arg(&admin_path)
            .current_dir(super::root())
            .env_clear()
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", binary().display()))?;
        let mut envoy = Envoy {
            child,
            dir,
            admin: "127.0.0.1:0".parse().unwrap(),
            listeners: Vec::new(),
        };
        envoy.wait_ready(&admin_path)?;
        Ok(envoy)
    }

    fn wait_ready(&mut self, admin_path: &Path) -> Result<(), String> {
        let deadline = Instant::now() + STARTUP;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(format!("Envoy exited ({status}):\n{}", self.logs()));
            }
            if Instant::now() > deadline {
                return Err(format!("Envoy not ready after {STARTUP:?}:\n{}", self.logs()));
            }
            if let Some(admin) = std::fs::read_to_string(admin_path)
                .ok()
                .and_then(|a| a.trim().parse().ok())
            {
                self.admin = admin;
                if admin_get(admin, "/ready").is_some_and(|(status, _)| status == 200) {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let (_, body) = admin_get(self.admin, "/listeners?format=json").ok_or("no /listeners")?;
        let listeners: Value = serde_json::from_str(&body).map_err(|e| format!("/listeners: {e}: {body}"))?;
        for l in listeners["listener_statuses"].as_array().into_iter().flatten() {
            let sa = &l["local_address"]["socket_address"];
            let addr = format!("{}:{}", sa["address"].as_str().unwrap_or(""), sa["port_value"]);
            if let (Some(name), Ok(addr)) = (l["name"].as_str(), addr.parse()) {
                self.listeners.push((name.to_owned(), addr));
            }
        }
        Ok(())
    }

    /// The bound address of the listener `name`.
    pub fn listener(&self, name: &str) -> SocketAddr {
        self.listeners
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
            .unwrap_or_else(|| panic!("no listener {name}: {:?}", self.listeners))
    }

    /// The admin's address (`/stats`, `/stats/prometheus`, `/memory`, ...).
    pub fn admin(&self) -> SocketAddr {
        self.admin
    }

    /// `GET path` on the admin: the body of a 200.
    pub fn admin_get(&self, path: &str) -> String {
        let (status, body) = admin_get(self.admin, path).unwrap_or_else(|| panic!("admin {path} did not answer"));
        assert_eq!(status, 200, "admin {path}: {body}");
        body
    }

    /// Envoy's own log so far (stderr): its messages and the plugin's `wasm log` lines.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    /// The access log lines written so far (the bootstrap's stdout logger).
    pub fn access_log_lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("stdout"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Waits up to 5 s for a log line containing `needle` (the plugin logs in `on_log`,
    /// after the client may already hold the answer) and returns it.
    pub fn log_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let logs = self.logs();
            if let Some(line) = logs.lines().find(|l| l.contains(needle)) {
                return line.to_owned();
            }
            assert!(Instant::now() < deadline, "no log line with {needle:?}:\n{logs}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Envoy's resident memory now and at its peak (`VmRSS`, `VmHWM`), in KiB: its
    /// workers' VMs included.
    pub fn memory_kb(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Envoy's resident memory at rest, in KiB: the shipped bootstraps give free heap
    /// back every second (`memory_allocator_manager`), so a reading right after load
    /// counts memory about to be released and one right after a release does not; this
    /// one waits for three releases.
    pub fn rss_at_rest_kb(&self) -> u64 {
        std::thread::sleep(Duration::from_secs(3));
        self.memory_kb().0
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A plain HTTP/1.1 GET; `None` when nothing answers.
fn admin_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let body = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        dechunk_text(body)
    } else {
        body.to_owned()
    };
    Some((status, body))
}

fn dechunk_text(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}
