//! Worker threads, as Envoy's: each owns a single-threaded event loop, its own VM per
//! plugin and its own upstream connection pool. A connection is pinned to the worker that
//! accepted it for its whole life; the acceptor hands connections out round-robin (Envoy
//! leaves the spread to the kernel; round-robin is one legal outcome and makes
//! "request N lands on worker N mod concurrency" something a test can rely on).

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::thread::JoinHandle;

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, watch};

use crate::HostError;
use crate::access_log::Logger;
use crate::busy_poll::Active;
use crate::config::{Cluster, Listener};
use crate::guest_time::GuestTime;
use crate::logs::LogStore;
use crate::stream::{self, ConnInfo, ListenerCtx};
use crate::upstream::Pool;
use crate::vm::PluginRuntime;

/// A connection handed to a worker.
pub struct Accepted {
    pub listener: usize,
    pub stream: std::net::TcpStream,
    pub peer: SocketAddr,
    pub id: u64,
}

pub struct WorkerSpec {
    pub index: usize,
    pub listeners: Vec<Arc<Listener>>,
    pub plugins: HashMap<String, Arc<PluginRuntime>>,
    pub clusters: HashMap<String, Arc<Cluster>>,
    pub logs: LogStore,
    /// Each listener's opened access loggers, by listener name.
    pub access_logs: HashMap<String, Arc<Vec<Logger>>>,
    /// See [`crate::busy_poll`].
    pub busy_poll: std::time::Duration,
    /// See [`crate::guest_time`]; one for the whole host.
    pub guest_time: Arc<GuestTime>,
}

pub struct WorkerHandle {
    pub thread: JoinHandle<()>,
    pub connections: mpsc::UnboundedSender<Accepted>,
}

pub fn spawn(
    spec: WorkerSpec,
    shutdown: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<Result<(), HostError>>,
) -> Result<WorkerHandle, HostError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let thread = std::thread::Builder::new()
        .name(format!("wg-worker-{}", spec.index))
        .spawn(move || run(spec, rx, shutdown, ready))
        .map_err(|e| HostError::Io(format!("cannot start a worker thread: {e}")))?;
    Ok(WorkerHandle {
        thread,
        connections: tx,
    })
}

fn run(
    spec: WorkerSpec,
    mut connections: mpsc::UnboundedReceiver<Accepted>,
    mut shutdown: watch::Receiver<bool>,
    ready: std::sync::mpsc::Sender<Result<(), HostError>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            let _ = ready.send(Err(HostError::Io(format!("worker runtime: {e}"))));
            return;
        }
    };
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async move {
        let contexts = match contexts(&spec) {
            Ok(contexts) => contexts,
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        };
        // Calls a root context made while starting (e.g. from on_configure) go out now.
        for ctx in &contexts {
            crate::calls::spawn_pending(ctx);
            tokio::task::spawn_local(ticks(Rc::clone(ctx)));
        }
        crate::busy_poll::start(spec.busy_poll);
        let _ = ready.send(Ok(()));
        loop {
            tokio::select! {
                accepted = connections.recv() => {
                    let Some(accepted) = accepted else { break };
                    if let Some(ctx) = contexts.get(accepted.listener) {
                        tokio::task::spawn_local(serve(Rc::clone(ctx), accepted));
                    }
                }
                _ = shutdown.changed() => break,
            }
        }
    });
}

fn contexts(spec: &WorkerSpec) -> Result<Vec<Rc<ListenerCtx>>, HostError> {
    let pool = Pool::new(&spec.clusters).map_err(HostError::Tls)?;
    let mut contexts = Vec::new();
    for listener in &spec.listeners {
        let vm = match spec.plugins.get(&listener.name) {
            Some(plugin) => Some(Rc::new(RefCell::new(plugin.start_vm()?))),
            None => None,
        };
        contexts.push(Rc::new(ListenerCtx {
            listener: Arc::clone(listener),
            vm,
            pool: Rc::clone(&pool),
            logs: spec.logs.clone(),
            access_logs: spec.access_logs.get(&listener.name).cloned().unwrap_or_default(),
            guest_time: Arc::clone(&spec.guest_time),
        }));
    }
    Ok(contexts)
}

/// `proxy_on_tick` for this worker's root context: the period is per root of each VM, so
/// every worker ticks on its own (Envoy `Wasm::setTimerPeriod`/`tickHandler`); no tick
/// while the VM has failed. The period is re-read after every tick, and polled while none
/// is set.
async fn ticks(ctx: Rc<ListenerCtx>) {
    let Some(vm_rc) = ctx.vm.clone() else {
        return;
    };
    loop {
        let period = match vm_rc.try_borrow() {
            Ok(vm) if vm.failed => return,
            Ok(vm) => vm.guest.tick_period(vm.root).filter(|p| !p.is_zero()),
            Err(_) => None,
        };
        let Some(period) = period else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        tokio::time::sleep(period).await;
        let result = {
            let Ok(mut vm) = vm_rc.try_borrow_mut() else {
                continue;
            };
            if vm.failed || vm.guest.tick_period(vm.root).is_none_or(|p| p.is_zero()) {
                continue;
            }
            let root = vm.root;
            let mut scope = vm.guest.enter_root();
            let result = scope.on_tick(root);
            drop(scope);
            if result.is_err() && vm.guest.is_poisoned() {
                vm.failed = true;
            }
            result
        };
        if let Err(e) = result {
            ctx.logs.host(format!("on_tick failed: {e}"));
        }
        crate::calls::spawn_pending(&ctx);
    }
}

async fn serve(ctx: Rc<ListenerCtx>, accepted: Accepted) {
    let Ok(stream) = tokio::net::TcpStream::from_std(accepted.stream) else {
        return;
    };
    let _ = stream.set_nodelay(true);
    let local = stream.local_addr().unwrap_or(accepted.peer);
    let conn = Rc::new(ConnInfo {
        id: accepted.id,
        peer: accepted.peer,
        local,
    });
    let service = service_fn(move |request| stream::handle(Rc::clone(&ctx), Rc::clone(&conn), request));
    let _ = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(Active(stream)), service)
        .await;
}
