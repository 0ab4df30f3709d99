//! Processes for limits across replicas: a real `redis-server` and the rate limit service
//! (`waygate-ratelimit serve`, crate ratelimit/), each on an ephemeral port and killed on
//! drop. Shared by the service's own tests (ratelimit/tests/rls.rs) and the gateway's
//! two-replica tests (tests/global_limits.rs), which include this file by path.
//!
//! Every caller starts its own Redis (no persistence, in a temporary directory), so tests
//! run in parallel without sharing counts. Without `redis-server` they fail, saying how to
//! install it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Where `redis-server` is: `WAYGATE_REDIS_SERVER`, else PATH, else Debian's path.
pub fn redis_server_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("WAYGATE_REDIS_SERVER") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("redis-server"))
        .find(|p| p.is_file());
    let binary = on_path.unwrap_or_else(|| PathBuf::from("/usr/bin/redis-server"));
    assert!(
        binary.is_file(),
        "redis-server not found (PATH, /usr/bin): these tests need a real Redis. Install it with \
         `apt-get install -y redis-server` (Debian/Ubuntu; .ci/run does this), or point \
         WAYGATE_REDIS_SERVER at a redis-server binary."
    );
    binary
}

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// A fresh temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("waygate-ratelimit-{what}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port free right now (the OS picks it); the caller binds it next.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One `redis-server` process on 127.0.0.1, no persistence, killed on drop.
pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    dir: TempDir,
}

impl Redis {
    pub fn start() -> Redis {
        let mut redis = Redis {
            child: None,
            port: 0,
            dir: TempDir::new("redis"),
        };
        // A port picked a moment ago can be taken in between: try a few.
        for _ in 0..5 {
            redis.port = free_port();
            if redis.spawn() {
                return redis;
            }
        }
        panic!("redis-server did not start on a free port (see its log above)");
    }

    /// Starts the server on `self.port`; true once it answers PING.
    pub fn spawn(&mut self) -> bool {
        let child = Command::new(redis_server_binary())
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir.0)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = self.child.as_ref().map(Child::id);
        while Instant::now() < deadline {
            // Another test's server may have taken the port in between (this one then
            // fails to bind and exits): the one answering must be this child.
            if ping(self.port) && server_pid(self.port) == pid {
                return true;
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop();
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Kills the server (as a crash would).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Redis {
    /// The value at `key` (`GET`), `None` when absent: the counters the service keeps.
    pub fn get(&self, key: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        stream
            .write_all(format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len()).as_bytes())
            .unwrap();
        let mut reader = BufReader::new(stream);
        let mut head = String::new();
        reader.read_line(&mut head).unwrap();
        if head.starts_with("$-1") {
            return None;
        }
        let len: usize = head
            .trim()
            .strip_prefix('$')
            .unwrap_or_else(|| panic!("GET {key}: {head:?}"))
            .parse()
            .unwrap();
        let mut value = vec![0u8; len + 2];
        reader.read_exact(&mut value).unwrap();
        value.truncate(len);
        Some(String::from_utf8(value).unwrap())
    }
}

/// Whether a Redis answers PING on `port` (RESP by hand: no client needed here).
pub fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}

/// The process id of the Redis server answering on `port` (`INFO server`).
fn server_pid(port: u16) -> Option<u32> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    while reader.read_line(&mut line).ok()? > 0 {
        if let Some(pid) = line.trim_end().strip_prefix("process_id:") {
            return pid.parse().ok();
        }
        line.clear();
    }
    None
}

// ---- the service ---------------------------------------------------------------------

/// One `waygate-ratelimit serve` process, killed on drop.
pub struct Rls {
    child: Child,
    pub addr: SocketAddr,
    _dir: TempDir,
}

impl Rls {
    /// The service at `binary` with `config`, a plugin configuration's JSON.
    pub fn start(binary: &Path, redis_url: &str, config: &str) -> Rls {
        let dir = TempDir::new("rls");
        let config_path = dir.0.join("plugin-config.json");
        std::fs::write(&config_path, config).unwrap();
        Rls::start_with_file(binary, redis_url, &config_path, dir)
    }

    /// The service reading its limits from `config_path` (JSON, or an Envoy bootstrap).
    pub fn with_config_file(binary: &Path, redis_url: &str, config_path: &Path) -> Rls {
        Rls::start_with_file(binary, redis_url, config_path, TempDir::new("rls"))
    }

    fn start_with_file(binary: &Path, redis_url: &str, config_path: &Path, dir: TempDir) -> Rls {
        let mut child = Command::new(binary)
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--redis",
                redis_url,
                "--plugin-config",
            ])
            .arg(config_path)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .unwrap();
        Rls { child, addr, _dir: dir }
    }
}

impl Rls {
    /// Kills the service (as a crash would).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        self.stop();
    }
}
