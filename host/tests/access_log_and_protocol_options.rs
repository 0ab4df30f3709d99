//! The HCM's access logs (stdout / stderr / file loggers and Envoy's format operators) and a
//! cluster's `HttpProtocolOptions` (`auto_sni`, `auto_san_validation`, the HTTP version
//! choice), as envoy/envoy.yaml uses them. Each test names the Envoy source or doc it mirrors.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use waygate_host::config::{self, UpstreamProtocol};
use waygate_host::{FileFlush, HostOptions, RunningHost};

const STDOUT_LOG: &str = "type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog";
const FILE_LOG: &str = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog";
const OPTIONS_TYPE: &str = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

// ------------------------------------------------------------------ helpers

/// The probe bootstrap with `access_log` entries (YAML list items, indented for the HCM).
fn with_access_log(yaml: &str, entries: &str) -> String {
    yaml.replace(
        "          stat_prefix: main\n",
        &format!("          stat_prefix: main\n          access_log:\n{entries}"),
    )
}

/// One stdout logger with an inline text format.
fn stdout_logger(format: &str) -> String {
    format!(
        "          - name: envoy.access_loggers.stdout\n            typed_config:\n              \"@type\": {STDOUT_LOG}\n              log_format:\n                text_format_source:\n                  inline_string: {}\n",
        yaml_string(format)
    )
}

/// A YAML double-quoted scalar.
fn yaml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap()
}

fn start(yaml: &str) -> RunningHost {
    waygate_host::start(
        yaml,
        HostOptions {
            concurrency: 1,
            env: Some(Default::default()),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("host did not start: {e}\n{yaml}"))
}

/// Waits for the access log entry containing `needle` (written after the response).
fn access_line(host: &RunningHost, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lines = host.access_log_lines();
        if let Some(line) = lines.iter().find(|l| l.contains(needle)) {
            return line.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no access log entry with `{needle}`: {lines:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn problems(yaml: &str) -> String {
    config::parse(yaml, Path::new(".")).unwrap_err().to_string()
}

// ------------------------------------------------------------------ access log: operators

/// Envoy's command operators (docs `configuration/observability/access_log/usage.rst`;
/// `source/common/formatter/stream_info_formatter.cc`, `substitution_formatter.cc`): values
/// as the stream ended, headers as the router left them (`request_headers_to_remove`,
/// `host_rewrite_literal` edit the downstream map in Envoy), `-` for anything unset, and
/// filter state the plugin wrote with set_property, even in `on_log` (the access log is
/// written after the filters' `log()`).
#[test]
fn operators_print_what_envoy_prints() {
    let up = Upstream::start();
    let format = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" \
%RESPONSE_CODE% [%RESPONSE_CODE_DETAILS%] %RESPONSE_FLAGS% rx=%BYTES_RECEIVED% tx=%BYTES_SENT% \
d=%DURATION% route=%ROUTE_NAME% cluster=%UPSTREAM_CLUSTER% host=%UPSTREAM_HOST% \
authority=%REQ(:AUTHORITY)% secret=%REQ(X-SECRET)% alt=%REQ(X-NONE?X-PROBE)% ct=%RESP(CONTENT-TYPE)% \
cut=%REQ(X-LONG):3% early=%FILTER_STATE(wasm.probe_early:PLAIN)% late=%FILTER_STATE(wasm.probe_late:PLAIN)% \
none=%FILTER_STATE(wasm.absent:PLAIN)% pct=100%%\n";
    let host = start(&with_access_log(&Boot::new(up.addr).yaml(), &stdout_logger(format)));
    let r = request(
        addr(&host),
        "POST",
        "/echo",
        &[("x-probe", "state"), ("x-secret", "s"), ("x-long", "abcdef")],
        Some(b"hello"),
    )
    .unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "echo:hello"));

    let line = access_line(&host, "/echo");
    let (time, rest) = line
        .strip_prefix('[')
        .and_then(|l| l.split_once("] "))
        .unwrap_or_else(|| panic!("{line}"));
    // AccessLogDateTimeFormatter: 2016-04-15T20:17:00.310Z
    assert_eq!(time.len(), 24, "{time}");
    assert!(
        time.as_bytes()[4] == b'-' && &time[10..11] == "T" && &time[19..20] == "." && time.ends_with('Z'),
        "{time}"
    );
    let (before_duration, after_duration) = rest.split_once(" d=").unwrap();
    assert_eq!(
        before_duration,
        "\"POST /echo HTTP/1.1\" 200 [via_upstream] - rx=5 tx=10"
    );
    let (millis, after) = after_duration.split_once(' ').unwrap();
    assert!(millis.parse::<u64>().is_ok(), "DURATION: {millis}");
    assert_eq!(
        after,
        format!(
            "route=default cluster=upstream host={} authority=upstream.example secret=- alt=state \
ct=text/plain cut=abc early=early late=late none=- pct=100%",
            up.addr
        )
    );
}

/// Envoy's router and HCM set a response flag and details with their own replies
/// (`ResponseFlagUtils::toShortString`, router.cc `onUpstreamReset` /
/// `onResponseTimeout`, `Router::Filter::sendNoHealthyUpstreamResponse`); a direct
/// response has its route but no cluster; a plugin's `send_http_response` sets details `""`,
/// which prints empty, not `-` (only an unset value is `-`).
#[test]
fn local_replies_print_their_flags_details_and_route() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.route_timeout = Some("0.3s");
    let format = "%REQ(:PATH)% %RESPONSE_CODE% [%RESPONSE_CODE_DETAILS%] %RESPONSE_FLAGS% route=%ROUTE_NAME% \
cluster=%UPSTREAM_CLUSTER% host=%UPSTREAM_HOST%\n";
    let host = start(&with_access_log(&boot.yaml(), &stdout_logger(format)));

    let r = request(addr(&host), "GET", "/direct", &[], None).unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(
        access_line(&host, "/direct "),
        "/direct 404 [direct_response] - route=direct cluster=- host=-"
    );

    let r = request(addr(&host), "GET", "/dead", &[("x-route", "dead")], None).unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(
        access_line(&host, "/dead "),
        "/dead 503 [upstream_reset_before_response_started{connection_failure}] UF route=dead cluster=dead host=-"
    );

    let r = request(addr(&host), "GET", "/slow/2000", &[], None).unwrap();
    assert_eq!(r.status, 504);
    assert_eq!(
        access_line(&host, "/slow/2000 "),
        "/slow/2000 504 [response_timeout] UT route=default cluster=upstream host=-"
    );

    let r = request(addr(&host), "GET", "/denied", &[("x-probe", "local-req")], None).unwrap();
    assert_eq!(r.status, 403);
    assert_eq!(
        access_line(&host, "/denied "),
        "/denied 403 [] - route=default cluster=upstream host=-"
    );
}

/// `envoy.access_loggers.file` appends to its `path` (created at startup, as
/// `AccessLogFileImpl` opens it), `text_format` is the plain-string form, no `log_format` is
/// Envoy's default format (`SubstitutionFormatUtils::DEFAULT_FORMAT`), `omit_empty_values`
/// prints nothing for an unset value (`FormatterImpl`), and every logger gets every stream.
/// Lines wait in the sink's buffer (here for an interval longer than the test) and every
/// one is in the file once the host has stopped.
#[test]
fn file_logger_default_format_and_omit_empty_values() {
    let up = Upstream::start();
    let path = std::env::temp_dir().join(format!("waygate-host-access-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let file_logger = format!(
        "          - name: envoy.access_loggers.file\n            typed_config:\n              \"@type\": {FILE_LOG}\n              path: {}\n",
        path.display()
    );
    let stdout_logger = format!(
        "          - name: envoy.access_loggers.stdout\n            typed_config:\n              \"@type\": {STDOUT_LOG}\n              log_format:\n                text_format: \"plain %REQ(:PATH)% x=%REQ(X-NONE)%;\\n\"\n                omit_empty_values: true\n"
    );
    let entries = file_logger + &stdout_logger;
    let yaml = with_access_log(&Boot::new(up.addr).yaml(), &entries);
    let options = HostOptions {
        concurrency: 1,
        env: Some(Default::default()),
        file_flush: FileFlush {
            interval: Duration::from_secs(3600),
            ..FileFlush::default()
        },
        ..Default::default()
    };
    let host = waygate_host::start(&yaml, options).unwrap();
    assert!(path.exists(), "the file logger creates its file at startup");

    let r = request(addr(&host), "GET", "/plain", &[("x-request-id", "req-1")], None).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(access_line(&host, "plain /plain"), "plain /plain x=;");
    let default_line = access_line(&host, "\"GET /plain HTTP/1.1\"");
    // [START_TIME] "METHOD PATH PROTOCOL" CODE FLAGS RX TX DURATION SERVICE-TIME "XFF" "UA" "ID" "AUTHORITY" "UPSTREAM_HOST"
    let (_, after_time) = default_line.split_once("] ").unwrap();
    assert!(
        after_time.starts_with("\"GET /plain HTTP/1.1\" 200 - 0 5 "),
        "{default_line}"
    );
    assert!(
        after_time.ends_with(&format!(" \"-\" \"-\" \"req-1\" \"upstream.example\" \"{}\"", up.addr)),
        "{default_line}"
    );
    assert_eq!(host.access_log_lines().len(), 2, "one entry per logger");
    for i in 0..20 {
        let path = format!("/plain/{i}");
        let r = request(addr(&host), "GET", &path, &[], None).unwrap();
        assert_eq!(r.status, 200);
    }
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "",
        "a few lines wait for the flush interval"
    );
    drop(host);
    let written = std::fs::read_to_string(&path).unwrap();
    assert_eq!(written.lines().next(), Some(default_line.as_str()));
    let paths: Vec<&str> = written.lines().filter_map(|l| l.split(' ').nth(2)).collect();
    let expected: Vec<String> = std::iter::once("/plain".to_owned())
        .chain((0..20).map(|i| format!("/plain/{i}")))
        .collect();
    assert_eq!(paths, expected, "{written}");
    let _ = std::fs::remove_file(&path);
}

/// Envoy's `--log-path` opens its file at startup like an access log file: one that
/// cannot be opened stops the host, naming the flag and the path.
#[test]
fn a_log_path_that_cannot_be_opened_stops_startup() {
    let up = Upstream::start();
    let path = std::env::temp_dir().join(format!("waygate-no-such-dir-{}/host.log", std::process::id()));
    let options = HostOptions {
        concurrency: 1,
        env: Some(Default::default()),
        log_path: Some(path.clone()),
        ..Default::default()
    };
    let error = waygate_host::start(&Boot::new(up.addr).yaml(), options)
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with(&format!("--log-path {}: ", path.display())),
        "{error}"
    );
}

/// Format errors stop startup naming the operator and the YAML path
/// (`SubstitutionFormatParser::parse`, `CommandSyntaxChecker::verifySyntax`,
/// `FilterStateFormatter::create`); what the host does not implement is refused, never
/// printed wrong.
#[test]
fn bad_formats_are_startup_errors_naming_the_operator() {
    let boot = Boot::new("127.0.0.1:9".parse().unwrap());
    let path = "static_resources.listeners[0].filter_chains[0].filters[0].typed_config.access_log[0].typed_config.log_format.text_format_source.inline_string";
    for (format, expected) in [
        ("%FOO%", "%FOO% is not a command operator the host implements"),
        ("%START_TIME(%s)%", "custom time format"),
        ("%FILTER_STATE(wasm.x)%", "only PLAIN serialisation"),
        ("%FILTER_STATE(wasm.x:TYPED)%", "only PLAIN serialisation"),
        (
            "%FILTER_STATE(envoy.network.upstream_server_name:PLAIN)%",
            "`wasm.<name>`",
        ),
        ("%REQ%", "%REQ%: this command requires parameters"),
        ("%REQ(A?B?C)%", "more than 1 alternative header"),
        ("%PROTOCOL(x)%", "%PROTOCOL%: this command does not take parameters"),
        ("%DURATION:3%", "%DURATION%: this command does not take a length"),
        ("100% done", "couldn't find a valid command operator at position 3"),
    ] {
        let text = problems(&with_access_log(&boot.yaml(), &stdout_logger(format)));
        assert!(text.contains(path), "{format}: {text}");
        assert!(text.contains(expected), "{format}: {text}");
    }

    // Fields outside the subset: an access log filter, a JSON format, another logger.
    let filter = stdout_logger("%PROTOCOL%\n").replace(
        "            typed_config:",
        "            filter: { status_code_filter: { comparison: { op: GE, value: { default_value: 400, runtime_key: k } } } }\n            typed_config:",
    );
    let text = problems(&with_access_log(&boot.yaml(), &filter));
    assert!(text.contains("access_log[0]") && text.contains("filter"), "{text}");
    let json = format!(
        "          - name: envoy.access_loggers.stdout\n            typed_config:\n              \"@type\": {STDOUT_LOG}\n              log_format: {{ json_format: {{ a: \"%PROTOCOL%\" }} }}\n"
    );
    let text = problems(&with_access_log(&boot.yaml(), &json));
    assert!(
        text.contains("access_log[0].typed_config") && text.contains("json_format"),
        "{text}"
    );
    let grpc = "          - name: envoy.access_loggers.http_grpc\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig\n";
    let text = problems(&with_access_log(&boot.yaml(), grpc));
    assert!(text.contains("unsupported access logger type"), "{text}");
}

// ------------------------------------------------------------------ protocol options

/// The probe bootstrap with `HttpProtocolOptions` on the `upstream` cluster.
fn with_protocol_options(yaml: &str, body: &str) -> String {
    yaml.replace(
        "  - name: upstream\n    type: STATIC\n",
        &format!(
            "  - name: upstream\n    type: STATIC\n    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": {OPTIONS_TYPE}\n{body}"
        ),
    )
}

/// `extensions/upstreams/http/v3/http_protocol_options.proto`: one of
/// `explicit_http_config`, `use_downstream_protocol_config`, `auto_config` is required;
/// every choice is accepted (the host speaks HTTP/1.1 upstream and says so at startup for
/// HTTP/2 and ALPN); fields the host does not implement are errors naming their path.
#[test]
fn http_protocol_options_are_parsed_and_the_http_version_noted() {
    let up = Upstream::start();
    let boot = Boot::new(up.addr);
    let parsed = |body: &str| {
        let yaml = with_protocol_options(&boot.yaml(), body);
        let parsed = config::parse(&yaml, Path::new(".")).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
        parsed.clusters["upstream"].http
    };
    let h1 = parsed(
        "        upstream_http_protocol_options: { auto_sni: true, auto_san_validation: true }\n        explicit_http_config: { http_protocol_options: {} }\n",
    );
    assert!(h1.auto_sni && h1.auto_san_validation);
    assert_eq!(h1.protocol, UpstreamProtocol::Http1);
    let h2 = parsed("        explicit_http_config: { http2_protocol_options: {} }\n");
    assert_eq!(h2.protocol, UpstreamProtocol::Http2);
    assert!(!h2.auto_sni);
    let auto = parsed("        auto_config: { http_protocol_options: {}, http2_protocol_options: {} }\n");
    assert_eq!(auto.protocol, UpstreamProtocol::Auto);
    let down = parsed("        use_downstream_protocol_config: {}\n");
    assert_eq!(down.protocol, UpstreamProtocol::Downstream);

    // HTTP/2 asked for: startup says the host speaks HTTP/1.1, and requests work over it.
    let host = start(&with_protocol_options(
        &boot.yaml(),
        "        explicit_http_config: { http2_protocol_options: {} }\n",
    ));
    assert_eq!(
        lines(
            &host,
            "cluster upstream: explicit_http_config.http2_protocol_options accepted; the host speaks HTTP/1.1 upstream"
        )
        .len(),
        1,
        "{:?}",
        host.logs()
    );
    let r = request(addr(&host), "GET", "/h2", &[], None).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "echo:"));

    let path = "static_resources.clusters[0].typed_extension_protocol_options.envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
    for (body, expected) in [
        (
            "        upstream_http_protocol_options: { auto_sni: true }\n",
            "exactly one of `explicit_http_config`",
        ),
        (
            "        upstream_http_protocol_options: { auto_sni: true, override_auto_sni_header: x-host }\n        explicit_http_config: { http_protocol_options: {} }\n",
            "override_auto_sni_header",
        ),
        (
            "        explicit_http_config: { http3_protocol_options: {} }\n",
            "http3_protocol_options",
        ),
        (
            "        explicit_http_config: { http_protocol_options: { header_key_format: { proper_case_words: {} } } }\n",
            "header_key_format",
        ),
        (
            "        explicit_http_config: { http_protocol_options: {}, http2_protocol_options: {} }\n",
            "exactly one of `http_protocol_options` or `http2_protocol_options`",
        ),
        (
            "        common_http_protocol_options: { idle_timeout: 1s }\n        explicit_http_config: { http_protocol_options: {} }\n",
            "common_http_protocol_options",
        ),
    ] {
        let text = problems(&with_protocol_options(&boot.yaml(), body));
        assert!(text.contains(path) && text.contains(expected), "{body}: {text}");
    }
    let yaml = boot.yaml().replace(
        "  - name: upstream\n    type: STATIC\n",
        "  - name: upstream\n    type: STATIC\n    typed_extension_protocol_options:\n      envoy.extensions.upstreams.tcp.v3.TcpProtocolOptions:\n        \"@type\": type.googleapis.com/envoy.extensions.upstreams.tcp.v3.TcpProtocolOptions\n",
    );
    assert!(problems(&yaml).contains("unsupported protocol options"));
}

/// A TLS upstream that records the SNI of each connection and answers `sni=<name>`
/// (keep-alive, content-length bodies). Certificate: `*.test.example` and
/// `api.test.example`, issued by tests/fixtures/tls/ca.pem.
struct TlsUpstream {
    addr: SocketAddr,
    snis: Arc<Mutex<Vec<String>>>,
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
}

impl TlsUpstream {
    fn start() -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(fixture("server.pem"))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(fixture("server.key")).unwrap();
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let snis = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&snis);
        std::thread::spawn(move || {
            for tcp in listener.incoming() {
                let Ok(mut tcp) = tcp else { continue };
                let config = Arc::clone(&config);
                let seen = Arc::clone(&seen);
                std::thread::spawn(move || {
                    let mut conn = rustls::ServerConnection::new(config).unwrap();
                    while conn.is_handshaking() {
                        if conn.complete_io(&mut tcp).is_err() {
                            return; // the client refused the certificate
                        }
                    }
                    let sni = conn.server_name().unwrap_or("").to_owned();
                    seen.lock().unwrap().push(sni.clone());
                    serve_tls(rustls::StreamOwned::new(conn, tcp), &sni);
                });
            }
        });
        Self { addr, snis }
    }

    fn snis(&self) -> Vec<String> {
        self.snis.lock().unwrap().clone()
    }
}

fn serve_tls(stream: rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>, sni: &str) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let answer = format!("sni={sni}");
        let head = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{answer}", answer.len());
        let stream = reader.get_mut();
        if stream.write_all(head.as_bytes()).and_then(|()| stream.flush()).is_err() {
            return;
        }
    }
}

fn tls_bootstrap(upstream: SocketAddr) -> String {
    let ca = fixture("ca.pem");
    let cluster = |name: &str, options: &str| {
        format!(
            r#"  - name: {name}
    type: STATIC
    connect_timeout: 2s
    load_assignment:
      cluster_name: {name}
      endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }} }}] }}]
{options}    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: api.test.example
        common_tls_context: {{ validation_context: {{ trusted_ca: {{ filename: {ca} }} }} }}
"#,
            port = upstream.port(),
            ca = ca.display(),
        )
    };
    let auto = format!(
        "    typed_extension_protocol_options:\n      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:\n        \"@type\": {OPTIONS_TYPE}\n        upstream_http_protocol_options: {{ auto_sni: true, auto_san_validation: true }}\n        explicit_http_config: {{ http_protocol_options: {{}} }}\n"
    );
    format!(
        r#"static_resources:
  listeners:
  - name: main
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: 0 }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: main
          access_log:
{logger}          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - {{ name: one, match: {{ prefix: /one }}, route: {{ cluster: auto, host_rewrite_literal: a.test.example }} }}
              - {{ name: two, match: {{ prefix: /two }}, route: {{ cluster: auto, host_rewrite_literal: "b.test.example:8443" }} }}
              - {{ name: bad, match: {{ prefix: /bad }}, route: {{ cluster: auto, host_rewrite_literal: api.other.example }} }}
              - {{ name: ip, match: {{ prefix: /ip }}, route: {{ cluster: auto, host_rewrite_literal: 127.0.0.1 }} }}
              - {{ name: fixed, match: {{ prefix: /fixed }}, route: {{ cluster: fixed, host_rewrite_literal: api.other.example }} }}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
{auto_cluster}{fixed_cluster}"#,
        logger = stdout_logger("%REQ(:PATH)% %RESPONSE_CODE% %RESPONSE_FLAGS% %REQ(:AUTHORITY)%\n"),
        auto_cluster = cluster("auto", &auto),
        fixed_cluster = cluster("fixed", ""),
    )
}

/// router.cc `Filter::decodeHeaders`: with `auto_sni` the SNI is the host of the request's
/// authority after the route's host rewrite, without its port, and not an IP address (the
/// cluster's `sni` then); `auto_san_validation` checks the certificate against that same
/// name (Envoy's `AutoSniIntegrationTest`: BasicAutoSniTest, AutoSniTestWithHostRewrite,
/// PassingHostWithoutPort, PassingNotDNS). Connections are pooled per SNI (Envoy hashes the
/// transport socket options into the pool key), and a cluster without the options keeps
/// its configured `sni`.
#[test]
fn auto_sni_takes_the_rewritten_authority_and_validates_it() {
    let tls = TlsUpstream::start();
    let host = start(&tls_bootstrap(tls.addr));
    let get = |path: &str| request(addr(&host), "GET", path, &[], None).unwrap();

    let r = get("/one");
    assert_eq!((r.status, r.text().as_str()), (200, "sni=a.test.example"));
    let r = get("/two");
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "sni=b.test.example"),
        "port stripped, own connection"
    );
    let r = get("/one");
    assert_eq!((r.status, r.text().as_str()), (200, "sni=a.test.example"));
    assert_eq!(access_line(&host, "/two "), "/two 200 - b.test.example:8443");

    // The certificate does not cover the authority: the handshake fails, Envoy's 503 UF.
    let r = get("/bad");
    assert_eq!(r.status, 503);
    assert!(r.text().contains("connection failure"), "{}", r.text());
    assert_eq!(access_line(&host, "/bad "), "/bad 503 UF api.other.example");

    // An IP address is not an SNI: the cluster's `sni` is used (and verified).
    let r = get("/ip");
    assert_eq!((r.status, r.text().as_str()), (200, "sni=api.test.example"));

    // Without the options the cluster's `sni` goes out whatever the authority.
    let r = get("/fixed");
    assert_eq!((r.status, r.text().as_str()), (200, "sni=api.test.example"));

    let snis = tls.snis();
    assert!(
        snis.contains(&"a.test.example".to_owned()) && snis.contains(&"b.test.example".to_owned()),
        "{snis:?}"
    );
}

/// `auto_san_validation` without `auto_sni` would send one name and check another; rustls
/// checks the name it sends, so the host refuses the combination rather than check the
/// wrong name.
#[test]
fn auto_san_validation_without_auto_sni_is_refused() {
    let yaml = tls_bootstrap("127.0.0.1:9".parse().unwrap()).replace(
        "{ auto_sni: true, auto_san_validation: true }",
        "{ auto_san_validation: true }",
    );
    let text = problems(&yaml);
    assert!(
        text.contains("static_resources.clusters[0].typed_extension_protocol_options")
            && text.contains("auto_san_validation without auto_sni"),
        "{text}"
    );
}
