//! The bootstrap: Envoy's own v3 YAML, the subset the host understands, validated once.
//!
//! `raw` mirrors the YAML with `deny_unknown_fields`; [`parse`] turns it into the
//! validated types below, reporting every problem with its path (for example
//! `static_resources.listeners[0].filter_chains[0].filters[0].typed_config.foo`). Nothing
//! outside the subset is silently ignored: a config that loads here means the same thing
//! in Envoy (the reverse is not true; see `host/README.md`).

mod duration;
mod raw;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_yaml::Value;

pub use duration::parse as parse_duration;

use crate::access_log::{AccessLogConfig, Format, SinkConfig};

const HCM_TYPE: &str =
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const WASM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const TLS_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";
const STDOUT_LOG_TYPE: &str = "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog";
const STDERR_LOG_TYPE: &str = "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StderrAccessLog";
const FILE_LOG_TYPE: &str = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog";
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const HTTP_PROTOCOL_OPTIONS_TYPE: &str = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
const STRING_VALUE_TYPE: &str = "type.googleapis.com/google.protobuf.StringValue";
const STRUCT_TYPE: &str = "type.googleapis.com/google.protobuf.Struct";

/// Envoy's default `per_connection_buffer_limit_bytes` (1 MiB).
pub const DEFAULT_BUFFER_LIMIT: usize = 1024 * 1024;
/// Envoy's default route timeout (`RouteAction.timeout`): 15 s.
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(15);
/// Envoy's default cluster `connect_timeout`: 5 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Envoy's default HCM `stream_idle_timeout`: 5 min.
pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// The validated bootstrap.
#[derive(Debug, Clone)]
pub struct Bootstrap {
    pub admin: Option<HostPort>,
    pub listeners: Vec<Arc<Listener>>,
    pub clusters: HashMap<String, Arc<Cluster>>,
}

/// An `address`/`port_value` pair (port 0 = ephemeral).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    pub host: String,
    pub port: u16,
}

#[derive(Debug, Clone)]
pub struct Listener {
    pub name: String,
    pub address: HostPort,
    pub buffer_limit: usize,
    pub stat_prefix: String,
    pub stream_idle_timeout: Option<Duration>,
    pub route_config: Arc<RouteConfig>,
    pub wasm: Option<Arc<WasmPlugin>>,
    /// The HCM's `access_log[]`, in order.
    pub access_logs: Vec<AccessLogConfig>,
}

#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    pub virtual_hosts: Vec<VirtualHost>,
}

#[derive(Debug, Clone)]
pub struct VirtualHost {
    pub name: String,
    pub domains: Vec<String>,
    pub routes: Vec<Arc<Route>>,
    pub request_headers_to_remove: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub name: String,
    pub path: PathMatch,
    pub headers: Vec<(String, String)>,
    pub action: RouteAction,
    pub request_headers_to_remove: Vec<String>,
}

#[derive(Debug, Clone)]
pub enum PathMatch {
    Prefix(String),
    Path(String),
}

#[derive(Debug, Clone)]
pub enum RouteAction {
    Cluster {
        cluster: String,
        /// `None` = no timeout (`0s`).
        timeout: Option<Duration>,
        idle_timeout: Option<Duration>,
        host_rewrite_literal: Option<String>,
    },
    Direct {
        status: u16,
        body: Option<Vec<u8>>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailurePolicy {
    FailClosed,
    FailOpen,
}

#[derive(Debug, Clone)]
pub struct WasmPlugin {
    pub name: String,
    pub root_id: String,
    pub vm_id: String,
    pub code: PathBuf,
    pub configuration: Vec<u8>,
    pub vm_configuration: Vec<u8>,
    pub failure_policy: FailurePolicy,
    pub allow_on_headers_stop_iteration: bool,
    pub host_env_keys: Vec<String>,
    pub key_values: Vec<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiscoveryType {
    Static,
    StrictDns,
    LogicalDns,
}

#[derive(Debug, Clone)]
pub struct Cluster {
    pub name: String,
    pub discovery: DiscoveryType,
    pub connect_timeout: Duration,
    pub endpoints: Vec<HostPort>,
    pub tls: Option<TlsSettings>,
    /// `typed_extension_protocol_options` `HttpProtocolOptions` (defaults when absent).
    pub http: UpstreamHttpOptions,
}

/// What a cluster's `HttpProtocolOptions` asks of its upstream connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UpstreamHttpOptions {
    /// SNI from the upstream request's `:authority` (not for an IP address), as the router
    /// sets `UpstreamServerName` (router.cc `decodeHeaders`).
    pub auto_sni: bool,
    /// The certificate is checked against that name (rustls checks the name it sends as SNI,
    /// so this goes with `auto_sni`).
    pub auto_san_validation: bool,
    pub protocol: UpstreamProtocol,
}

/// The HTTP version a cluster's options select; the host speaks HTTP/1.1 upstream in every
/// case (see host/README.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum UpstreamProtocol {
    /// No options, or `explicit_http_config.http_protocol_options`.
    #[default]
    Http1,
    /// `explicit_http_config.http2_protocol_options`: Envoy would speak HTTP/2.
    Http2,
    /// `auto_config`: ALPN; the host offers only `http/1.1`.
    Auto,
    /// `use_downstream_protocol_config`: downstream is always HTTP/1.1 here.
    Downstream,
}

#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub sni: Option<String>,
    /// `None`: Envoy without a `validation_context` does not verify the server.
    pub trusted_ca: Option<PathBuf>,
}

/// Every problem found in a bootstrap, one per line, each with its path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<String>);

impl std::fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid bootstrap:")?;
        for problem in &self.0 {
            write!(f, "\n  {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Parses and validates a bootstrap; relative file paths resolve against `base_dir`.
pub fn parse(yaml: &str, base_dir: &Path) -> Result<Bootstrap, ConfigErrors> {
    let raw: raw::Bootstrap = serde_yaml::from_str(yaml).map_err(|e| ConfigErrors(vec![e.to_string()]))?;
    let mut errors = Vec::new();
    let mut builder = Builder {
        errors: &mut errors,
        base_dir,
    };
    let bootstrap = builder.bootstrap(raw);
    if errors.is_empty() {
        Ok(bootstrap)
    } else {
        Err(ConfigErrors(errors))
    }
}

struct Builder<'a> {
    errors: &'a mut Vec<String>,
    base_dir: &'a Path,
}

impl Builder<'_> {
    fn err(&mut self, path: &str, message: impl std::fmt::Display) {
        self.errors.push(format!("{path}: {message}"));
    }

    fn typed<T: DeserializeOwned>(&mut self, path: &str, value: Value) -> Option<T> {
        match serde_yaml::from_value(value) {
            Ok(parsed) => Some(parsed),
            Err(e) => {
                self.err(path, e);
                None
            }
        }
    }

    fn duration(&mut self, path: &str, text: Option<&str>) -> Option<Duration> {
        let text = text?;
        match parse_duration(text) {
            Ok(d) => Some(d),
            Err(e) => {
                self.err(path, e);
                None
            }
        }
    }

    fn resolve(&self, file: &str) -> PathBuf {
        let path = Path::new(file);
        if path.is_absolute() {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    fn bootstrap(&mut self, raw: raw::Bootstrap) -> Bootstrap {
        let admin = raw.admin.map(|admin| host_port(admin.address));
        let mut clusters = HashMap::new();
        for (i, cluster) in raw.static_resources.clusters.into_iter().enumerate() {
            let path = format!("static_resources.clusters[{i}]");
            if let Some(cluster) = self.cluster(&path, cluster) {
                if clusters.contains_key(&cluster.name) {
                    self.err(&path, format!("duplicate cluster name `{}`", cluster.name));
                }
                clusters.insert(cluster.name.clone(), Arc::new(cluster));
            }
        }
        let mut listeners = Vec::new();
        for (i, listener) in raw.static_resources.listeners.into_iter().enumerate() {
            let path = format!("static_resources.listeners[{i}]");
            if let Some(listener) = self.listener(&path, listener, &clusters) {
                if listeners.iter().any(|l: &Arc<Listener>| l.name == listener.name) {
                    self.err(&path, format!("duplicate listener name `{}`", listener.name));
                }
                listeners.push(Arc::new(listener));
            }
        }
        Bootstrap {
            admin,
            listeners,
            clusters,
        }
    }

    fn listener(
        &mut self,
        path: &str,
        raw: raw::Listener,
        clusters: &HashMap<String, Arc<Cluster>>,
    ) -> Option<Listener> {
        let buffer_limit = raw
            .per_connection_buffer_limit_bytes
            .map_or(DEFAULT_BUFFER_LIMIT, |n| n as usize);
        if raw.filter_chains.len() != 1 {
            self.err(
                &format!("{path}.filter_chains"),
                "exactly one filter chain is supported",
            );
            return None;
        }
        let chain = raw.filter_chains.into_iter().next()?;
        if chain.filters.len() != 1 {
            self.err(
                &format!("{path}.filter_chains[0].filters"),
                "exactly one network filter (envoy.filters.network.http_connection_manager) is supported",
            );
            return None;
        }
        let filter = chain.filters.into_iter().next()?;
        let fpath = format!("{path}.filter_chains[0].filters[0].typed_config");
        let hcm: raw::HttpConnectionManager = self.typed(&fpath, filter.typed_config)?;
        if hcm.type_url != HCM_TYPE {
            self.err(
                &format!("{fpath}.@type"),
                format!("unsupported type `{}` (only {HCM_TYPE})", hcm.type_url),
            );
            return None;
        }
        if let Some(codec) = &hcm.codec_type
            && codec != "AUTO"
            && codec != "HTTP1"
        {
            self.err(
                &format!("{fpath}.codec_type"),
                format!("`{codec}` is not supported (AUTO or HTTP1; the host speaks HTTP/1.1)"),
            );
        }
        let stream_idle_timeout = match hcm.stream_idle_timeout.as_deref() {
            None => Some(DEFAULT_STREAM_IDLE_TIMEOUT),
            Some(text) => self
                .duration(&format!("{fpath}.stream_idle_timeout"), Some(text))
                .filter(|d| !d.is_zero()),
        };
        let access_logs = self.access_logs(&format!("{fpath}.access_log"), hcm.access_log);
        let route_config = self.route_config(&format!("{fpath}.route_config"), hcm.route_config, clusters);
        let wasm = self.http_filters(&format!("{fpath}.http_filters"), hcm.http_filters);
        Some(Listener {
            name: raw.name,
            address: host_port(raw.address),
            buffer_limit,
            stat_prefix: hcm.stat_prefix,
            stream_idle_timeout,
            route_config: Arc::new(route_config),
            wasm,
            access_logs,
        })
    }

    /// The HCM's `access_log[]`: stdout, stderr and file loggers with a text format.
    fn access_logs(&mut self, path: &str, logs: Vec<Value>) -> Vec<AccessLogConfig> {
        let mut out = Vec::new();
        for (i, log) in logs.into_iter().enumerate() {
            let Some(log) = self.typed::<raw::TypedExtension>(&format!("{path}[{i}]"), log) else {
                continue;
            };
            let tpath = format!("{path}[{i}].typed_config");
            let type_url = log
                .typed_config
                .get("@type")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let (sink, log_format) = match type_url.as_str() {
                STDOUT_LOG_TYPE | STDERR_LOG_TYPE => {
                    let Some(parsed) = self.typed::<raw::StreamAccessLog>(&tpath, log.typed_config) else {
                        continue;
                    };
                    let sink = if type_url == STDOUT_LOG_TYPE {
                        SinkConfig::Stdout
                    } else {
                        SinkConfig::Stderr
                    };
                    (sink, parsed.log_format)
                }
                FILE_LOG_TYPE => {
                    let Some(parsed) = self.typed::<raw::FileAccessLog>(&tpath, log.typed_config) else {
                        continue;
                    };
                    if parsed.path.is_empty() {
                        self.err(&format!("{tpath}.path"), "must not be empty");
                        continue;
                    }
                    (SinkConfig::File(self.resolve(&parsed.path)), parsed.log_format)
                }
                other => {
                    self.err(
                        &format!("{tpath}.@type"),
                        format!(
                            "unsupported access logger type `{other}` (supported: {STDOUT_LOG_TYPE}, {STDERR_LOG_TYPE}, {FILE_LOG_TYPE})"
                        ),
                    );
                    continue;
                }
            };
            if let Some(format) = self.log_format(&format!("{tpath}.log_format"), log_format) {
                out.push(AccessLogConfig {
                    sink,
                    format: Arc::new(format),
                });
            }
        }
        out
    }

    /// A `SubstitutionFormatString` with a text format (Envoy's default format without one).
    fn log_format(&mut self, path: &str, raw: Option<raw::SubstitutionFormatString>) -> Option<Format> {
        let (text, omit_empty_values, text_path) = match raw {
            None => (crate::access_log::DEFAULT_FORMAT.to_owned(), false, path.to_owned()),
            Some(raw) => {
                let omit = raw.omit_empty_values.unwrap_or(false);
                match (raw.text_format, raw.text_format_source) {
                    (Some(text), None) => (text, omit, format!("{path}.text_format")),
                    (
                        None,
                        Some(raw::DataSource {
                            inline_string: Some(text),
                            filename: None,
                        }),
                    ) => (text, omit, format!("{path}.text_format_source.inline_string")),
                    (
                        None,
                        Some(raw::DataSource {
                            inline_string: None,
                            filename: Some(file),
                        }),
                    ) => {
                        let fpath = format!("{path}.text_format_source.filename");
                        match std::fs::read_to_string(self.resolve(&file)) {
                            Ok(text) => (text, omit, fpath),
                            Err(e) => {
                                self.err(&fpath, format!("{file}: {e}"));
                                return None;
                            }
                        }
                    }
                    (None, Some(_)) => {
                        self.err(
                            &format!("{path}.text_format_source"),
                            "exactly one of `inline_string` or `filename`",
                        );
                        return None;
                    }
                    _ => {
                        self.err(
                            path,
                            "exactly one of `text_format_source` or `text_format` (the host supports text formats only)",
                        );
                        return None;
                    }
                }
            }
        };
        match Format::parse(&text, omit_empty_values) {
            Ok(format) => Some(format),
            Err(problem) => {
                self.err(&text_path, problem);
                None
            }
        }
    }

    fn http_filters(&mut self, path: &str, filters: Vec<raw::TypedExtension>) -> Option<Arc<WasmPlugin>> {
        let count = filters.len();
        let mut wasm = None;
        for (i, filter) in filters.into_iter().enumerate() {
            let fpath = format!("{path}[{i}].typed_config");
            let type_url = filter
                .typed_config
                .get("@type")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let last = i + 1 == count;
            if type_url == ROUTER_TYPE {
                let _router: Option<raw::Router> = self.typed(&fpath, filter.typed_config);
                if !last {
                    self.err(&fpath, "the router must be the last HTTP filter");
                }
            } else if type_url == WASM_TYPE {
                if wasm.is_some() {
                    self.err(&fpath, "only one envoy.filters.http.wasm filter is supported");
                }
                if last {
                    self.err(&fpath, "the last HTTP filter must be envoy.filters.http.router");
                }
                let parsed: Option<raw::WasmFilter> = self.typed(&fpath, filter.typed_config);
                if let Some(parsed) = parsed {
                    wasm = self.wasm(&format!("{fpath}.config"), parsed.config).map(Arc::new);
                }
            } else {
                self.err(
                    &format!("{fpath}.@type"),
                    format!("unsupported HTTP filter type `{type_url}` (supported: {WASM_TYPE}, {ROUTER_TYPE})"),
                );
            }
        }
        if count == 0 {
            self.err(path, "the HTTP filter chain must end with envoy.filters.http.router");
        }
        wasm
    }

    fn wasm(&mut self, path: &str, raw: raw::PluginConfig) -> Option<WasmPlugin> {
        let runtime = raw.vm_config.runtime.as_str();
        if !matches!(runtime, "envoy.wasm.runtime.v8" | "envoy.wasm.runtime.wasmtime") {
            self.err(
                &format!("{path}.vm_config.runtime"),
                format!("`{runtime}` is not supported (envoy.wasm.runtime.v8 or envoy.wasm.runtime.wasmtime)"),
            );
        }
        let code = match raw.vm_config.code.local.filename {
            Some(file) => self.resolve(&file),
            None => {
                self.err(&format!("{path}.vm_config.code.local"), "only `filename` is supported");
                PathBuf::new()
            }
        };
        // Envoy 1.33 added failure_policy; the legacy bool fail_open still maps onto it.
        let failure_policy = match (raw.failure_policy.as_deref(), raw.fail_open) {
            (Some(_), Some(_)) => {
                self.err(path, "set either failure_policy or fail_open, not both");
                FailurePolicy::FailClosed
            }
            (Some("FAIL_CLOSED") | Some("UNSPECIFIED"), None) | (None, None | Some(false)) => FailurePolicy::FailClosed,
            (Some("FAIL_OPEN"), None) | (None, Some(true)) => FailurePolicy::FailOpen,
            (Some(other), None) => {
                self.err(
                    &format!("{path}.failure_policy"),
                    format!("`{other}` is not supported (FAIL_CLOSED or FAIL_OPEN; FAIL_RELOAD is not implemented)"),
                );
                FailurePolicy::FailClosed
            }
        };
        let configuration = self.any(&format!("{path}.configuration"), raw.configuration);
        let vm_configuration = self.any(&format!("{path}.vm_config.configuration"), raw.vm_config.configuration);
        let (host_env_keys, key_values) = match raw.vm_config.environment_variables {
            Some(env) => (env.host_env_keys, env.key_values.into_iter().collect()),
            None => (Vec::new(), Vec::new()),
        };
        Some(WasmPlugin {
            name: raw.name.unwrap_or_default(),
            root_id: raw.root_id.unwrap_or_default(),
            vm_id: raw.vm_config.vm_id.unwrap_or_default(),
            code,
            configuration,
            vm_configuration,
            failure_policy,
            allow_on_headers_stop_iteration: raw.allow_on_headers_stop_iteration.unwrap_or(false),
            host_env_keys,
            key_values,
        })
    }

    /// An `Any` configuration: `StringValue` passes raw, `Struct` becomes JSON (as in Envoy).
    fn any(&mut self, path: &str, value: Option<Value>) -> Vec<u8> {
        let Some(value) = value else {
            return Vec::new();
        };
        let type_url = value
            .get("@type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let Value::Mapping(mut map) = value else {
            self.err(path, "expected a mapping with `@type`");
            return Vec::new();
        };
        map.remove("@type");
        let inner = map.remove("value");
        if let Some((key, _)) = map.iter().next() {
            self.err(path, format!("unknown field `{}`", key.as_str().unwrap_or("?")));
        }
        match type_url.as_str() {
            STRING_VALUE_TYPE => match inner {
                Some(Value::String(s)) => s.into_bytes(),
                None => Vec::new(),
                Some(_) => {
                    self.err(&format!("{path}.value"), "a StringValue's value must be a string");
                    Vec::new()
                }
            },
            STRUCT_TYPE => {
                let inner = inner.unwrap_or(Value::Mapping(serde_yaml::Mapping::new()));
                match serde_json::to_vec(&inner) {
                    Ok(json) => json,
                    Err(e) => {
                        self.err(&format!("{path}.value"), e);
                        Vec::new()
                    }
                }
            }
            other => {
                self.err(
                    &format!("{path}.@type"),
                    format!("unsupported type `{other}` ({STRING_VALUE_TYPE} or {STRUCT_TYPE})"),
                );
                Vec::new()
            }
        }
    }

    fn route_config(
        &mut self,
        path: &str,
        raw: raw::RouteConfiguration,
        clusters: &HashMap<String, Arc<Cluster>>,
    ) -> RouteConfig {
        let mut virtual_hosts = Vec::new();
        for (i, vh) in raw.virtual_hosts.into_iter().enumerate() {
            let vpath = format!("{path}.virtual_hosts[{i}]");
            let mut routes = Vec::new();
            for (j, route) in vh.routes.into_iter().enumerate() {
                let rpath = format!("{vpath}.routes[{j}]");
                if let Some(route) = self.route(&rpath, route, clusters) {
                    routes.push(Arc::new(route));
                }
            }
            virtual_hosts.push(VirtualHost {
                name: vh.name,
                domains: vh.domains.into_iter().map(|d| d.to_ascii_lowercase()).collect(),
                routes,
                request_headers_to_remove: lower(vh.request_headers_to_remove),
            });
        }
        RouteConfig {
            name: raw.name.unwrap_or_default(),
            virtual_hosts,
        }
    }

    fn route(&mut self, path: &str, raw: raw::Route, clusters: &HashMap<String, Arc<Cluster>>) -> Option<Route> {
        let path_match = match (raw.route_match.prefix, raw.route_match.path) {
            (Some(prefix), None) => PathMatch::Prefix(prefix),
            (None, Some(exact)) => PathMatch::Path(exact),
            _ => {
                self.err(
                    &format!("{path}.match"),
                    "exactly one of `prefix` or `path` is required",
                );
                return None;
            }
        };
        let headers = raw
            .route_match
            .headers
            .into_iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.string_match.exact))
            .collect();
        let action = match (raw.route, raw.direct_response) {
            (Some(action), None) => {
                if !clusters.contains_key(&action.cluster) {
                    self.err(
                        &format!("{path}.route.cluster"),
                        format!("unknown cluster `{}`", action.cluster),
                    );
                }
                let timeout = match action.timeout.as_deref() {
                    None => Some(DEFAULT_ROUTE_TIMEOUT),
                    Some(text) => self
                        .duration(&format!("{path}.route.timeout"), Some(text))
                        .filter(|d| !d.is_zero()),
                };
                let idle_timeout = self.duration(&format!("{path}.route.idle_timeout"), action.idle_timeout.as_deref());
                RouteAction::Cluster {
                    cluster: action.cluster,
                    timeout,
                    idle_timeout,
                    host_rewrite_literal: action.host_rewrite_literal,
                }
            }
            (None, Some(direct)) => {
                let body = match direct.body {
                    None => None,
                    Some(raw::DataSource {
                        inline_string: Some(text),
                        filename: None,
                    }) => Some(text.into_bytes()),
                    Some(raw::DataSource {
                        inline_string: None,
                        filename: Some(file),
                    }) => match std::fs::read(self.resolve(&file)) {
                        Ok(bytes) => Some(bytes),
                        Err(e) => {
                            self.err(&format!("{path}.direct_response.body.filename"), format!("{file}: {e}"));
                            None
                        }
                    },
                    Some(_) => {
                        self.err(
                            &format!("{path}.direct_response.body"),
                            "exactly one of `inline_string` or `filename`",
                        );
                        None
                    }
                };
                RouteAction::Direct {
                    status: direct.status,
                    body,
                }
            }
            _ => {
                self.err(path, "exactly one of `route` or `direct_response` is required");
                return None;
            }
        };
        Some(Route {
            name: raw.name.unwrap_or_default(),
            path: path_match,
            headers,
            action,
            request_headers_to_remove: lower(raw.request_headers_to_remove),
        })
    }

    fn cluster(&mut self, path: &str, raw: raw::Cluster) -> Option<Cluster> {
        let discovery = match raw.discovery_type.as_deref() {
            None | Some("STATIC") => DiscoveryType::Static,
            Some("STRICT_DNS") => DiscoveryType::StrictDns,
            Some("LOGICAL_DNS") => DiscoveryType::LogicalDns,
            Some(other) => {
                self.err(
                    &format!("{path}.type"),
                    format!("`{other}` is not supported (STATIC, STRICT_DNS, LOGICAL_DNS)"),
                );
                return None;
            }
        };
        if let Some(family) = raw.dns_lookup_family.as_deref()
            && !matches!(family, "AUTO" | "V4_ONLY" | "V6_ONLY" | "V4_PREFERRED" | "ALL")
        {
            self.err(
                &format!("{path}.dns_lookup_family"),
                format!("`{family}` is not a DnsLookupFamily"),
            );
        }
        let connect_timeout = self
            .duration(&format!("{path}.connect_timeout"), raw.connect_timeout.as_deref())
            .unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        if raw.load_assignment.cluster_name != raw.name {
            self.err(
                &format!("{path}.load_assignment.cluster_name"),
                "must equal the cluster name",
            );
        }
        let mut endpoints = Vec::new();
        for locality in raw.load_assignment.endpoints {
            for lb in locality.lb_endpoints {
                endpoints.push(host_port(lb.endpoint.address));
            }
        }
        if discovery == DiscoveryType::Static {
            for endpoint in &endpoints {
                if endpoint.host.parse::<std::net::IpAddr>().is_err() {
                    self.err(
                        &format!("{path}.load_assignment"),
                        format!("a STATIC cluster needs IP addresses, not `{}`", endpoint.host),
                    );
                }
            }
        }
        if discovery == DiscoveryType::LogicalDns && endpoints.len() != 1 {
            self.err(
                &format!("{path}.load_assignment"),
                "a LOGICAL_DNS cluster takes exactly one endpoint",
            );
        }
        let tls = match raw.transport_socket {
            None => None,
            Some(socket) => {
                let tpath = format!("{path}.transport_socket.typed_config");
                let ctx: raw::UpstreamTlsContext = self.typed(&tpath, socket.typed_config)?;
                if ctx.type_url != TLS_TYPE {
                    self.err(
                        &format!("{tpath}.@type"),
                        format!("unsupported type `{}` (only {TLS_TYPE})", ctx.type_url),
                    );
                }
                let trusted_ca = match ctx
                    .common_tls_context
                    .and_then(|c| c.validation_context)
                    .and_then(|v| v.trusted_ca)
                {
                    None => None,
                    Some(raw::DataSource {
                        filename: Some(file),
                        inline_string: None,
                    }) => Some(self.resolve(&file)),
                    Some(_) => {
                        self.err(
                            &format!("{tpath}.common_tls_context.validation_context.trusted_ca"),
                            "only `filename` is supported",
                        );
                        None
                    }
                };
                Some(TlsSettings {
                    sni: ctx.sni,
                    trusted_ca,
                })
            }
        };
        let http = match raw.typed_extension_protocol_options {
            None => UpstreamHttpOptions::default(),
            Some(options) => self.protocol_options(&format!("{path}.typed_extension_protocol_options"), options),
        };
        if http.auto_san_validation && !http.auto_sni && tls.is_some() {
            self.err(
                &format!("{path}.typed_extension_protocol_options"),
                "auto_san_validation without auto_sni is not supported: rustls verifies the certificate against the name it sends as SNI",
            );
        }
        Some(Cluster {
            name: raw.name,
            discovery,
            connect_timeout,
            endpoints,
            tls,
            http,
        })
    }

    /// `typed_extension_protocol_options`: only `HttpProtocolOptions`, whose protocol oneof
    /// is required (`extensions/upstreams/http/v3/http_protocol_options.proto`).
    fn protocol_options(
        &mut self,
        path: &str,
        options: std::collections::BTreeMap<String, Value>,
    ) -> UpstreamHttpOptions {
        let mut http = UpstreamHttpOptions::default();
        for (name, value) in options {
            let opath = format!("{path}.{name}");
            if name != HTTP_PROTOCOL_OPTIONS {
                self.err(
                    &opath,
                    format!("unsupported protocol options `{name}` (only {HTTP_PROTOCOL_OPTIONS})"),
                );
                continue;
            }
            let Some(parsed) = self.typed::<raw::HttpProtocolOptions>(&opath, value) else {
                continue;
            };
            if parsed.type_url != HTTP_PROTOCOL_OPTIONS_TYPE {
                self.err(
                    &format!("{opath}.@type"),
                    format!(
                        "`{}` does not match the key (expected {HTTP_PROTOCOL_OPTIONS_TYPE})",
                        parsed.type_url
                    ),
                );
            }
            if let Some(upstream) = parsed.upstream_http_protocol_options {
                http.auto_sni = upstream.auto_sni.unwrap_or(false);
                http.auto_san_validation = upstream.auto_san_validation.unwrap_or(false);
            }
            let choices = [
                parsed.explicit_http_config.is_some(),
                parsed.use_downstream_protocol_config.is_some(),
                parsed.auto_config.is_some(),
            ];
            if choices.iter().filter(|c| **c).count() != 1 {
                self.err(
                    &opath,
                    "exactly one of `explicit_http_config`, `use_downstream_protocol_config` or `auto_config` is required",
                );
                continue;
            }
            http.protocol = if let Some(explicit) = parsed.explicit_http_config {
                match (explicit.http_protocol_options, explicit.http2_protocol_options) {
                    (Some(_), None) => UpstreamProtocol::Http1,
                    (None, Some(_)) => UpstreamProtocol::Http2,
                    _ => {
                        self.err(
                            &format!("{opath}.explicit_http_config"),
                            "exactly one of `http_protocol_options` or `http2_protocol_options` is required",
                        );
                        UpstreamProtocol::Http1
                    }
                }
            } else if parsed.auto_config.is_some() {
                UpstreamProtocol::Auto
            } else {
                UpstreamProtocol::Downstream
            };
        }
        http
    }
}

fn host_port(address: raw::Address) -> HostPort {
    HostPort {
        host: address.socket_address.address,
        port: address.socket_address.port_value,
    }
}

fn lower(names: Vec<String>) -> Vec<String> {
    names.into_iter().map(|n| n.to_ascii_lowercase()).collect()
}
