//! Fake LLM providers (OpenAI-compatible, Anthropic Messages, Gemini) steered by the
//! upstream model name, for tests and for `make run` without any real key.
//!
//! One HTTP/1.1 listener serves the three APIs by path:
//! - OpenAI: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`
//!   (credential `Authorization: Bearer` [`OPENAI_KEY`], of organization [`OPENAI_ORGANIZATION`]);
//! - Anthropic: `POST /v1/messages` (`x-api-key` [`ANTHROPIC_KEY`] and `anthropic-version`);
//! - Gemini: `POST /v1beta/models/{model}:generateContent` and
//!   `:streamGenerateContent?alt=sse` (`x-goog-api-key` or `?key=` [`GEMINI_KEY`]).
//!
//! Each answers in the provider's own shapes (see `tests/fixtures/<provider>/`), checks
//! credentials and required fields like the real API, and is steered by the model name:
//! `ok`, `status-NNN`, `limited-S`, `slow-MS`, `cut-N`, `garbage`, `echo`, `tool`, `tools`, `agent`, `json`,
//! `long-N`, `stream-error` (any prefix ending in `-` is allowed; unknown names are `ok`).
//! In tests every request received is recorded ([`FakeProviders::received`]); the
//! standalone server ([`run_blocking`]) keeps nothing, so it can serve for days.

mod answer;
mod anthropic;
mod gemini;
mod openai;
mod reply;
mod steer;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use reply::{FakeBody, Reply};

/// The key the fake OpenAI API accepts (`Authorization: Bearer fake-openai-key`).
pub const OPENAI_KEY: &str = "fake-openai-key";
/// A second key of the same account whose quota is spent: every request with it is
/// answered 429 with `retry-after: 20`.
pub const OPENAI_EXHAUSTED_KEY: &str = "fake-openai-key-exhausted";
/// The organization [`OPENAI_KEY`] belongs to (`OpenAI-Organization`).
pub const OPENAI_ORGANIZATION: &str = "org-fake";
/// The key the fake Anthropic API accepts (`x-api-key: fake-anthropic-key`).
pub const ANTHROPIC_KEY: &str = "fake-anthropic-key";
/// The key the fake Gemini API accepts (`x-goog-api-key: fake-gemini-key` or `?key=`).
pub const GEMINI_KEY: &str = "fake-gemini-key";

/// Largest request body read (bigger ones get a 413).
const MAX_BODY: usize = 64 * 1024 * 1024;

/// One request as the fake provider received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// Path with the query, as sent.
    pub path: String,
    /// Lowercase names, values as lossy UTF-8, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// `HTTP/1.1` or `HTTP/2.0`.
    pub version: String,
}

impl RecordedRequest {
    /// The first value of a header (name compared case-insensitively).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path without the query.
    pub fn path_only(&self) -> &str {
        self.path.split_once('?').map_or(&self.path, |(p, _)| p)
    }

    /// The raw query string, if any.
    pub fn query(&self) -> Option<&str> {
        self.path.split_once('?').map(|(_, q)| q)
    }

    /// The raw value of a query parameter.
    pub fn query_param(&self, key: &str) -> Option<&str> {
        self.query()?
            .split('&')
            .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    /// The body parsed as JSON.
    pub fn body_json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }
}

type Received = Arc<Mutex<Vec<RecordedRequest>>>;
/// Where requests are recorded; `None` keeps nothing.
type Recorder = Option<Received>;

/// The fake providers, served on their own thread and tokio runtime; stops on drop.
pub struct FakeProviders {
    addr: SocketAddr,
    received: Received,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeProviders {
    /// Binds `addr` (port 0 picks a free port) and starts serving.
    pub fn start(addr: SocketAddr) -> std::io::Result<FakeProviders> {
        let std_listener = std::net::TcpListener::bind(addr)?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("fake-providers")
            .enable_all()
            .build()?;
        let listener = {
            let _guard = runtime.enter();
            TcpListener::from_std(std_listener)?
        };
        let received = Received::default();
        let (tx, rx) = oneshot::channel::<()>();
        let state = received.clone();
        let thread = std::thread::Builder::new()
            .name("fake-providers".into())
            .spawn(move || {
                runtime.block_on(serve(listener, Some(state), async move {
                    let _ = rx.await;
                }));
                runtime.shutdown_timeout(Duration::from_millis(200));
            })?;
        Ok(FakeProviders {
            addr,
            received,
            shutdown: Some(tx),
            thread: Some(thread),
        })
    }

    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request received so far, in arrival order.
    pub fn received(&self) -> Vec<RecordedRequest> {
        lock(&self.received).clone()
    }

    /// Forgets the requests received so far.
    pub fn clear_received(&self) {
        lock(&self.received).clear();
    }
}

impl Drop for FakeProviders {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serves the fakes on `addr` until the process is killed; prints
/// `fake providers listening on http://ADDR` once bound.
pub fn run_blocking(addr: SocketAddr) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name("fake-providers")
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = TcpListener::bind(addr).await?;
        let bound = listener.local_addr()?;
        println!("fake providers listening on http://{bound}");
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        serve(listener, None, std::future::pending()).await;
        Ok(())
    })
}

fn lock(received: &Received) -> std::sync::MutexGuard<'_, Vec<RecordedRequest>> {
    received.lock().unwrap_or_else(|e| e.into_inner())
}

async fn serve(listener: TcpListener, received: Recorder, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            // Out of file descriptors or similar: do not spin.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let received = received.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(received.clone(), req));
            // HTTP/1.1, or HTTP/2 with prior knowledge (a provider cluster Envoy speaks h2 to).
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn handle(received: Recorder, req: Request<Incoming>) -> Result<Response<FakeBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes().to_vec(),
        Err(_) => {
            let too_large = serde_json::json!({"error": {"message": "request body too large or unreadable"}});
            return Ok(Reply::json(413, &too_large).into_response().await);
        }
    };
    let request = RecordedRequest {
        method: parts.method.as_str().to_owned(),
        path: parts
            .uri
            .path_and_query()
            .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
        headers: parts
            .headers
            .iter()
            .map(|(n, v)| {
                let value = String::from_utf8_lossy(v.as_bytes()).into_owned();
                (n.as_str().to_ascii_lowercase(), value)
            })
            .collect(),
        body,
        version: format!("{:?}", parts.version),
    };
    if let Some(received) = &received {
        lock(received).push(request.clone());
    }
    Ok(route(&request).into_response().await)
}

fn route(req: &RecordedRequest) -> Reply {
    let path = req.path_only();
    if path.starts_with("/v1beta/") {
        gemini::handle(req)
    } else if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        anthropic::handle(req)
    } else {
        openai::handle(req)
    }
}
