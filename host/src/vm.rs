//! The plugin's VMs: the compiled module shared by every worker, the throw-away canary
//! that must accept `on_vm_start` and `on_configure` before anything serves, and one VM
//! per worker (cpp-host `wasm.cc` `createWasm`, `canary`, `getOrCreateThreadLocalWasm`).
//!
//! Linear memory and statics are per worker; shared data and metrics are process-wide
//! ([`crate::shared::Shared`]). A trap poisons the worker's guest and the VM stays failed
//! (`failed`), as Envoy keeps `FailState::RuntimeError`.
//!
//! Environment variables come only from `vm_config.environment_variables`: `host_env_keys`
//! are looked up in [`crate::HostOptions::env`] (or the process environment), missing keys
//! are skipped as Envoy skips them, then `key_values` are added.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use proxy_wasm_host::abi::v0_2_1::{
    CalloutId, Callouts, ContextId, Guest, Host, HttpCall, HttpCallRefusal, Invocation, PluginConfig, Started,
    VmServices,
};
use proxy_wasm_host::{Engine, Limits, Module};
use tokio::sync::mpsc;

use crate::HostError;
use crate::config::WasmPlugin;
use crate::logs::{LogLevel, LogStore, PluginSink};
use crate::shared::Shared;
use crate::stream::StreamEvent;

/// An `http_call` the guest made during a callback, run once the callback returns.
pub struct PendingCall {
    pub caller: ContextId,
    pub callout: CalloutId,
    pub call: HttpCall<'static>,
}

/// The `Callouts` service of one VM: checks the cluster and queues the call.
pub struct CalloutQueue {
    clusters: HashSet<String>,
    pending: Mutex<Vec<PendingCall>>,
}

impl CalloutQueue {
    pub fn take(&self) -> Vec<PendingCall> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Callouts for CalloutQueue {
    fn http_call(&self, call: Invocation, callout: CalloutId, request: HttpCall<'_>) -> Result<(), HttpCallRefusal> {
        // Envoy `Context::httpCall`: an unknown cluster is BadArgument. The crate already
        // refuses a call without :method, :path or :authority with BadArgument.
        let cluster = String::from_utf8_lossy(&request.upstream).into_owned();
        if !self.clusters.contains(&cluster) {
            return Err(HttpCallRefusal::UnknownUpstream);
        }
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(PendingCall {
                caller: call.context,
                callout,
                call: request.into_owned(),
            });
        Ok(())
    }
}

/// What every VM of one plugin is built from.
pub struct PluginRuntime {
    pub plugin: Arc<WasmPlugin>,
    host: Host,
    module: Module,
    services: VmServices,
    limits: Limits,
    clusters: HashSet<String>,
    pub logs: LogStore,
}

impl PluginRuntime {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: &Engine,
        plugin: Arc<WasmPlugin>,
        env: &dyn Fn(&str) -> Option<String>,
        level: LogLevel,
        logs: LogStore,
        shared: Arc<Shared>,
        clusters: HashSet<String>,
    ) -> Result<Self, HostError> {
        let code = std::fs::read(&plugin.code)
            .map_err(|e| HostError::Wasm(format!("cannot read {}: {e}", plugin.code.display())))?;
        let module =
            Module::new(engine, &code).map_err(|e| HostError::Wasm(format!("{}: {e}", plugin.code.display())))?;
        let host = Host::new(engine).map_err(|e| HostError::Wasm(e.to_string()))?;
        let mut variables = Vec::new();
        for key in &plugin.host_env_keys {
            if let Some(value) = env(key) {
                variables.push((key.clone().into_bytes(), value.into_bytes()));
            }
        }
        for (key, value) in &plugin.key_values {
            variables.push((key.clone().into_bytes(), value.clone().into_bytes()));
        }
        let sink = PluginSink::new(&plugin.name, &plugin.root_id, &plugin.vm_id, level, logs.clone());
        let services = VmServices::new(Arc::new(sink))
            .with_environment(variables)
            .with_log_level(level.to_abi())
            .with_vm_id(plugin.vm_id.clone().into_bytes())
            .with_vm_configuration(plugin.vm_configuration.clone())
            .with_shared(shared);
        // Envoy sets no CPU budget per callback; a generous one still stops a runaway loop.
        let limits = Limits::default().with_cpu_time(Duration::from_secs(30));
        Ok(Self {
            plugin,
            host,
            module,
            services,
            limits,
            clusters,
            logs,
        })
    }

    fn plugin_config(&self) -> PluginConfig {
        PluginConfig::new()
            .with_name(self.plugin.name.clone().into_bytes())
            .with_root_id(self.plugin.root_id.clone().into_bytes())
            .with_configuration(self.plugin.configuration.clone())
    }

    /// Builds a VM and runs its root through `on_vm_start` and `on_configure`.
    pub fn start_vm(&self) -> Result<WorkerVm, HostError> {
        let queue = Arc::new(CalloutQueue {
            clusters: self.clusters.clone(),
            pending: Mutex::new(Vec::new()),
        });
        let services = self.services.clone().with_callouts(queue.clone());
        let mark = self.logs.mark();
        let mut guest = Guest::new(&self.host, &self.module, services, &self.limits)
            .map_err(|e| HostError::Wasm(format!("{}: {e}", self.plugin.code.display())))?;
        let refused = |what: String| {
            let plugin_lines = self.logs.since(mark);
            HostError::PluginRefused {
                plugin: self.plugin.name.clone(),
                reason: what,
                log: plugin_lines,
            }
        };
        match guest.start(self.plugin_config()) {
            Ok(Started::Serving(root)) => Ok(WorkerVm {
                guest,
                root,
                failed: false,
                callouts: queue,
                streams: HashMap::new(),
            }),
            Ok(Started::Refused { callback, .. }) => Err(refused(format!("{callback} returned false"))),
            Err(e) => Err(refused(e.to_string())),
        }
    }
}

/// One worker's VM.
pub struct WorkerVm {
    pub guest: Guest,
    pub root: ContextId,
    pub failed: bool,
    pub callouts: Arc<CalloutQueue>,
    /// Live streams by context id, for delivering `http_call` responses to them.
    pub streams: HashMap<u32, mpsc::UnboundedSender<StreamEvent>>,
}
