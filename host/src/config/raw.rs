//! A serde mirror of the part of Envoy's v3 bootstrap that the host accepts.
//!
//! Every struct denies unknown fields, so a field outside the subset stops startup with
//! its path instead of being silently ignored. `typed_config` and `Any` values stay
//! [`serde_yaml::Value`]s here: their shape depends on `@type`, and the validating layer
//! ([`super::parse`]) dispatches on it so that errors keep their path.

// Some fields are here only so that `deny_unknown_fields` accepts them (names, `@type`s
// already dispatched on); they carry no behaviour.
#![allow(dead_code)]

use serde::Deserialize;
use serde_yaml::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bootstrap {
    pub admin: Option<Admin>,
    pub static_resources: StaticResources,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Admin {
    pub address: Address,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StaticResources {
    #[serde(default)]
    pub listeners: Vec<Listener>,
    #[serde(default)]
    pub clusters: Vec<Cluster>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Address {
    pub socket_address: SocketAddress,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SocketAddress {
    pub address: String,
    #[serde(default)]
    pub port_value: u16,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Listener {
    pub name: String,
    pub address: Address,
    pub per_connection_buffer_limit_bytes: Option<u32>,
    pub filter_chains: Vec<FilterChain>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterChain {
    pub name: Option<String>,
    pub filters: Vec<TypedExtension>,
}

/// Any `{name, typed_config}` extension: network filters, HTTP filters, transport sockets.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypedExtension {
    pub name: String,
    pub typed_config: Value,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConnectionManager {
    #[serde(rename = "@type")]
    pub type_url: String,
    pub stat_prefix: String,
    pub codec_type: Option<String>,
    pub stream_idle_timeout: Option<String>,
    /// `config.accesslog.v3.AccessLog` entries, each parsed as a [`TypedExtension`] with its
    /// own path (`filter` is not supported: unknown field).
    #[serde(default)]
    pub access_log: Vec<Value>,
    pub route_config: RouteConfiguration,
    pub http_filters: Vec<TypedExtension>,
}

/// `extensions.access_loggers.stream.v3.StdoutAccessLog` / `StderrAccessLog`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamAccessLog {
    #[serde(rename = "@type")]
    pub type_url: String,
    pub log_format: Option<SubstitutionFormatString>,
}

/// `extensions.access_loggers.file.v3.FileAccessLog` (the deprecated `format`,
/// `json_format`, `typed_json_format` are not supported).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAccessLog {
    #[serde(rename = "@type")]
    pub type_url: String,
    pub path: String,
    pub log_format: Option<SubstitutionFormatString>,
}

/// `config.core.v3.SubstitutionFormatString`, text formats only.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubstitutionFormatString {
    pub text_format: Option<String>,
    pub text_format_source: Option<DataSource>,
    pub omit_empty_values: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfiguration {
    pub name: Option<String>,
    pub virtual_hosts: Vec<VirtualHost>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VirtualHost {
    pub name: String,
    pub domains: Vec<String>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub request_headers_to_remove: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    pub name: Option<String>,
    #[serde(rename = "match")]
    pub route_match: RouteMatch,
    pub route: Option<RouteAction>,
    pub direct_response: Option<DirectResponse>,
    #[serde(default)]
    pub request_headers_to_remove: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteMatch {
    pub prefix: Option<String>,
    pub path: Option<String>,
    #[serde(default)]
    pub headers: Vec<HeaderMatcher>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatcher {
    pub name: String,
    pub string_match: StringMatcher,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StringMatcher {
    pub exact: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteAction {
    pub cluster: String,
    pub timeout: Option<String>,
    pub idle_timeout: Option<String>,
    pub host_rewrite_literal: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DirectResponse {
    pub status: u16,
    pub body: Option<DataSource>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSource {
    pub inline_string: Option<String>,
    pub filename: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WasmFilter {
    #[serde(rename = "@type")]
    pub type_url: String,
    pub config: PluginConfig,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginConfig {
    pub name: Option<String>,
    pub root_id: Option<String>,
    pub vm_config: VmConfig,
    pub configuration: Option<Value>,
    pub failure_policy: Option<String>,
    pub fail_open: Option<bool>,
    pub allow_on_headers_stop_iteration: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    pub vm_id: Option<String>,
    pub runtime: String,
    pub code: AsyncDataSource,
    pub configuration: Option<Value>,
    pub environment_variables: Option<EnvironmentVariables>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AsyncDataSource {
    pub local: DataSource,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentVariables {
    #[serde(default)]
    pub host_env_keys: Vec<String>,
    #[serde(default)]
    pub key_values: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Router {
    #[serde(rename = "@type")]
    pub type_url: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cluster {
    pub name: String,
    #[serde(rename = "type")]
    pub discovery_type: Option<String>,
    pub connect_timeout: Option<String>,
    pub dns_lookup_family: Option<String>,
    pub load_assignment: ClusterLoadAssignment,
    pub transport_socket: Option<TypedExtension>,
    /// Extension name -> `Any`; only `envoy.extensions.upstreams.http.v3.HttpProtocolOptions`.
    pub typed_extension_protocol_options: Option<std::collections::BTreeMap<String, Value>>,
}

/// `extensions.upstreams.http.v3.HttpProtocolOptions` (`common_http_protocol_options` and
/// the rest are not supported).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpProtocolOptions {
    #[serde(rename = "@type")]
    pub type_url: String,
    pub upstream_http_protocol_options: Option<UpstreamHttpProtocolOptions>,
    pub explicit_http_config: Option<ExplicitHttpConfig>,
    pub use_downstream_protocol_config: Option<ProtocolChoice>,
    pub auto_config: Option<ProtocolChoice>,
}

/// `config.core.v3.UpstreamHttpProtocolOptions` (`override_auto_sni_header` is not supported).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamHttpProtocolOptions {
    pub auto_sni: Option<bool>,
    pub auto_san_validation: Option<bool>,
}

/// `HttpProtocolOptions.ExplicitHttpConfig` (`http3_protocol_options` is not supported).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExplicitHttpConfig {
    pub http_protocol_options: Option<NoOptions>,
    pub http2_protocol_options: Option<NoOptions>,
}

/// `UseDownstreamHttpConfig` / `AutoHttpConfig` without HTTP/3.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProtocolChoice {
    pub http_protocol_options: Option<NoOptions>,
    pub http2_protocol_options: Option<NoOptions>,
}

/// `Http1ProtocolOptions` / `Http2ProtocolOptions` with none of their fields: `{}` only,
/// anything inside is an error naming it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoOptions {}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterLoadAssignment {
    pub cluster_name: String,
    pub endpoints: Vec<LocalityLbEndpoints>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalityLbEndpoints {
    pub lb_endpoints: Vec<LbEndpoint>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LbEndpoint {
    pub endpoint: Endpoint,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    pub address: Address,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsContext {
    #[serde(rename = "@type")]
    pub type_url: String,
    pub sni: Option<String>,
    pub common_tls_context: Option<CommonTlsContext>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommonTlsContext {
    pub validation_context: Option<ValidationContext>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ValidationContext {
    pub trusted_ca: Option<DataSource>,
}
