//! The HCM's access logs (`access_log[]`): `envoy.access_loggers.stdout` / `.stderr`
//! (`StdoutAccessLog` / `StderrAccessLog`) and `envoy.access_loggers.file` (`FileAccessLog`),
//! each with a text format (`log_format.text_format_source` or `log_format.text_format`).
//!
//! The format language is Envoy's (`source/common/formatter/substitution_formatter.cc`
//! `SubstitutionFormatParser::parse`, docs `configuration/observability/access_log/usage.rst`):
//! `%COMMAND(SUBCOMMAND):LENGTH%`, `%%` for a literal `%`, anything else literal. A `%` that
//! does not start a well-formed command, a command the host does not implement, or a
//! parameter/length a command does not take is a startup error naming it (Envoy's
//! `CommandSyntaxChecker`), never a silently wrong line. An unset value prints `-`
//! (`omit_empty_values`: nothing); an empty one prints nothing, as in Envoy.
//!
//! Operators and the Envoy code each mirrors (`stream_info_formatter.cc` unless noted):
//! `START_TIME` (UTC `%Y-%m-%dT%H:%M:%E3SZ`, `AccessLogDateTimeFormatter`), `REQ(X?Y):Z` /
//! `RESP(X?Y):Z` (`HeaderFormatter`: first value of X, else of Y, truncated to Z),
//! `RESPONSE_CODE` (0 when no response), `RESPONSE_CODE_DETAILS` (whitespace → `_` unless
//! `ALLOW_WHITESPACES`), `RESPONSE_FLAGS` (`ResponseFlagUtils::toShortString`), `DURATION`,
//! `UPSTREAM_CLUSTER` / `UPSTREAM_CLUSTER_RAW`, `UPSTREAM_HOST`, `ROUTE_NAME`,
//! `BYTES_RECEIVED` / `BYTES_SENT` (body bytes), `PROTOCOL`, `CONNECTION_ID`,
//! `DOWNSTREAM_{REMOTE,LOCAL}_ADDRESS[_WITHOUT_PORT]`, and `FILTER_STATE(wasm.<name>:PLAIN):Z`
//! (`FilterStateFormatter`: the bytes the plugin stored with `set_property`, which Envoy
//! keeps as filter state `wasm.<name>`; PLAIN is `CelState::serializeAsString`, the raw
//! value).
//!
//! A line is written once the stream is over, after the plugin's `on_log` (Envoy's
//! `FilterManager::log` runs the filters' access log handlers first, then the HCM's
//! loggers: `filter_access_loggers_first`), so a value the plugin sets in `on_log` is
//! printed. The sink buffers it and its flush thread writes it (`log_sink`, as Envoy's
//! `AccessLogFileImpl` does, off the request path). Every line is also kept for
//! [`crate::RunningHost::access_log_lines`].

use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::log_sink::Sink;
use crate::stream::headers::Headers;

/// Envoy's `DefaultUnspecifiedValueString`.
const UNSET: &str = "-";

/// The operators the host implements, for error messages.
const SUPPORTED: &str = "START_TIME, REQ(X?Y):Z, RESP(X?Y):Z, RESPONSE_CODE, RESPONSE_CODE_DETAILS, \
RESPONSE_FLAGS, DURATION, UPSTREAM_CLUSTER, UPSTREAM_CLUSTER_RAW, UPSTREAM_HOST, ROUTE_NAME, \
BYTES_RECEIVED, BYTES_SENT, PROTOCOL, CONNECTION_ID, DOWNSTREAM_REMOTE_ADDRESS[_WITHOUT_PORT], \
DOWNSTREAM_LOCAL_ADDRESS[_WITHOUT_PORT], FILTER_STATE(wasm.<name>:PLAIN):Z";

/// Envoy's default format (`SubstitutionFormatUtils::DEFAULT_FORMAT`), used when an access
/// logger has no `log_format`.
pub const DEFAULT_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% %PROTOCOL%\" \
%RESPONSE_CODE% %RESPONSE_FLAGS% %BYTES_RECEIVED% %BYTES_SENT% %DURATION% \
%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \
\"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\"\n";

/// Response flags (`envoy/stream_info/stream_info.h` `CoreResponseFlag`), short names.
pub(crate) mod flags {
    pub const NO_HEALTHY_UPSTREAM: &str = "UH";
    pub const UPSTREAM_REQUEST_TIMEOUT: &str = "UT";
    pub const UPSTREAM_CONNECTION_FAILURE: &str = "UF";
    pub const UPSTREAM_CONNECTION_TERMINATION: &str = "UC";
    pub const NO_ROUTE_FOUND: &str = "NR";
    pub const DOWNSTREAM_CONNECTION_TERMINATION: &str = "DC";
    pub const STREAM_IDLE_TIMEOUT: &str = "SI";

    /// The flag the router or the HCM sets with one of its local replies (by details).
    pub fn for_details(details: &str) -> Option<&'static str> {
        Some(match details {
            "route_not_found" => NO_ROUTE_FOUND,
            "no_healthy_upstream" => NO_HEALTHY_UPSTREAM,
            "upstream_reset_before_response_started{connection_failure}" => UPSTREAM_CONNECTION_FAILURE,
            "upstream_reset_before_response_started{connection_termination}" => UPSTREAM_CONNECTION_TERMINATION,
            "response_timeout" => UPSTREAM_REQUEST_TIMEOUT,
            "stream_idle_timeout" => STREAM_IDLE_TIMEOUT,
            _ => return None,
        })
    }
}

/// A parsed text format.
#[derive(Debug, Clone)]
pub struct Format {
    parts: Vec<Part>,
    omit_empty_values: bool,
}

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Op { op: Op, max_length: Option<usize> },
}

#[derive(Debug, Clone)]
enum Op {
    StartTime,
    Req { main: String, alternative: Option<String> },
    Resp { main: String, alternative: Option<String> },
    ResponseCode,
    ResponseCodeDetails { allow_whitespaces: bool },
    ResponseFlags,
    Duration,
    UpstreamCluster,
    UpstreamHost,
    RouteName,
    BytesReceived,
    BytesSent,
    Protocol,
    ConnectionId,
    DownstreamRemote { port: bool },
    DownstreamLocal { port: bool },
    FilterState(Vec<u8>),
}

/// What a command accepts (Envoy's `CommandSyntaxChecker` flags).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Params {
    None,
    Optional,
    Required,
}

impl Format {
    /// Parses a text format as `SubstitutionFormatParser::parse` does; the error names the
    /// offending command or position.
    pub fn parse(format: &str, omit_empty_values: bool) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut rest = format;
        while let Some(at) = rest.find('%') {
            let (before, from_percent) = rest.split_at(at);
            text.push_str(before);
            let position = format.len() - from_percent.len();
            if let Some(after) = from_percent.strip_prefix("%%") {
                text.push('%');
                rest = after;
                continue;
            }
            let (command, subcommand, length, after) = split_command(from_percent)
                .ok_or_else(|| format!("couldn't find a valid command operator at position {position} (`%COMMAND(SUBCOMMAND):LENGTH%`; `%%` is a literal `%`)"))?;
            if !text.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut text)));
            }
            let max_length = match length {
                Some(digits) => Some(
                    digits
                        .parse::<usize>()
                        .map_err(|_| format!("%{command}%: length `{digits}` is not a number"))?,
                ),
                None => None,
            };
            let op = operator(command, subcommand, max_length)?;
            parts.push(Part::Op { op, max_length });
            rest = after;
        }
        text.push_str(rest);
        if !text.is_empty() || parts.is_empty() {
            parts.push(Part::Text(text));
        }
        Ok(Self {
            parts,
            omit_empty_values,
        })
    }

    /// One log entry (`FormatterImpl::format`: each operator's value, or `-` when unset).
    pub(crate) fn render(&self, entry: &Entry<'_>) -> String {
        let mut line = String::with_capacity(256);
        for part in &self.parts {
            match part {
                Part::Text(text) => line.push_str(text),
                Part::Op { op, max_length } => match value(op, entry) {
                    Some(mut bytes) => {
                        if let Some(max) = max_length {
                            bytes.truncate(*max);
                        }
                        line.push_str(&String::from_utf8_lossy(&bytes));
                    }
                    None if self.omit_empty_values => {}
                    None => line.push_str(UNSET),
                },
            }
        }
        line
    }
}

/// Splits `%COMMAND(SUBCOMMAND):LENGTH%` off the front of `text` (which starts with `%`):
/// Envoy's `^%((?:[A-Z]|[0-9]|_)+)(?:\(([^\)]*)\))?(?::([0-9]+))?%`.
fn split_command(text: &str) -> Option<(&str, Option<&str>, Option<&str>, &str)> {
    let body = text.strip_prefix('%')?;
    let name_len = body
        .bytes()
        .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_')
        .count();
    if name_len == 0 {
        return None;
    }
    let (command, mut rest) = body.split_at(name_len);
    let mut subcommand = None;
    if let Some(open) = rest.strip_prefix('(') {
        let close = open.find(')')?;
        let (inner, after) = open.split_at(close);
        subcommand = Some(inner);
        rest = after.strip_prefix(')')?;
    }
    let mut length = None;
    if let Some(after_colon) = rest.strip_prefix(':') {
        let digits = after_colon.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let (number, after) = after_colon.split_at(digits);
        length = Some(number);
        rest = after;
    }
    let rest = rest.strip_prefix('%')?;
    Some((command, subcommand, length, rest))
}

/// Builds one operator, checking what it takes as `CommandSyntaxChecker::verifySyntax`.
fn operator(command: &str, subcommand: Option<&str>, length: Option<usize>) -> Result<Op, String> {
    let sub = subcommand.unwrap_or("");
    let check = |params: Params, length_allowed: bool| -> Result<(), String> {
        match params {
            Params::None if subcommand.is_some() => {
                return Err(format!("%{command}%: this command does not take parameters"));
            }
            Params::Required if sub.is_empty() => {
                return Err(format!("%{command}%: this command requires parameters"));
            }
            _ => {}
        }
        if length.is_some() && !length_allowed {
            return Err(format!("%{command}%: this command does not take a length"));
        }
        Ok(())
    };
    let simple = |op: Op| check(Params::None, false).map(|()| op);
    match command {
        "START_TIME" => {
            check(Params::Optional, false)?;
            if !sub.is_empty() {
                return Err(format!(
                    "%START_TIME({sub})%: a custom time format is not implemented by the host (only %START_TIME%)"
                ));
            }
            Ok(Op::StartTime)
        }
        "REQ" | "RESP" => {
            check(Params::Required, true)?;
            let (main, alternative) = headers_subcommand(command, sub)?;
            Ok(if command == "REQ" {
                Op::Req { main, alternative }
            } else {
                Op::Resp { main, alternative }
            })
        }
        "RESPONSE_CODE_DETAILS" => {
            check(Params::Optional, false)?;
            Ok(Op::ResponseCodeDetails {
                allow_whitespaces: sub == "ALLOW_WHITESPACES",
            })
        }
        "FILTER_STATE" => {
            check(Params::Optional, true)?;
            filter_state(sub)
        }
        "RESPONSE_CODE" => simple(Op::ResponseCode),
        "RESPONSE_FLAGS" => simple(Op::ResponseFlags),
        "DURATION" => simple(Op::Duration),
        "UPSTREAM_CLUSTER" | "UPSTREAM_CLUSTER_RAW" => simple(Op::UpstreamCluster),
        "UPSTREAM_HOST" => simple(Op::UpstreamHost),
        "ROUTE_NAME" => simple(Op::RouteName),
        "BYTES_RECEIVED" => simple(Op::BytesReceived),
        "BYTES_SENT" => simple(Op::BytesSent),
        "PROTOCOL" => simple(Op::Protocol),
        "CONNECTION_ID" => simple(Op::ConnectionId),
        "DOWNSTREAM_REMOTE_ADDRESS" => simple(Op::DownstreamRemote { port: true }),
        "DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT" => simple(Op::DownstreamRemote { port: false }),
        "DOWNSTREAM_LOCAL_ADDRESS" => simple(Op::DownstreamLocal { port: true }),
        "DOWNSTREAM_LOCAL_ADDRESS_WITHOUT_PORT" => simple(Op::DownstreamLocal { port: false }),
        other => Err(format!(
            "%{other}% is not a command operator the host implements (it implements {SUPPORTED})"
        )),
    }
}

/// `X?Y` (`parseSubcommandHeaders`): one alternative at most, names lower-cased.
fn headers_subcommand(command: &str, sub: &str) -> Result<(String, Option<String>), String> {
    let mut names = sub.split('?');
    let main = names.next().unwrap_or_default().to_ascii_lowercase();
    let alternative = names.next().map(str::to_ascii_lowercase);
    if names.next().is_some() {
        return Err(format!("%{command}({sub})%: more than 1 alternative header specified"));
    }
    Ok((main, alternative.filter(|a| !a.is_empty())))
}

/// `FILTER_STATE(KEY:F)` (`FilterStateFormatter::create`): only the plugin's `wasm.*` state
/// exists in the host, and only PLAIN serialisation is implemented.
fn filter_state(sub: &str) -> Result<Op, String> {
    let mut tokens = sub.split(':');
    let key = tokens.next().unwrap_or_default();
    let serialize = tokens.next().unwrap_or_default();
    if key.is_empty() {
        return Err(format!("%FILTER_STATE({sub})%: the key cannot be empty"));
    }
    match serialize {
        "PLAIN" => {}
        "" | "TYPED" | "FIELD" => {
            return Err(format!(
                "%FILTER_STATE({sub})%: only PLAIN serialisation is implemented by the host (write %FILTER_STATE({key}:PLAIN)%)"
            ));
        }
        other => {
            return Err(format!(
                "%FILTER_STATE({sub})%: `{other}` is not a serialize type (PLAIN, TYPED or FIELD)"
            ));
        }
    }
    let Some(name) = key.strip_prefix("wasm.") else {
        return Err(format!(
            "%FILTER_STATE({sub})%: the host only has the filter state the plugin writes with set_property (`wasm.<name>`)"
        ));
    };
    Ok(Op::FilterState(name.as_bytes().to_vec()))
}

/// Everything a line may print about one finished stream.
pub(crate) struct Entry<'a> {
    pub start_time: SystemTime,
    pub duration: Duration,
    pub request_headers: &'a Headers,
    pub response_headers: &'a Headers,
    pub response_code: Option<u16>,
    pub response_code_details: Option<&'a str>,
    pub response_flags: &'a [&'static str],
    pub route_name: Option<&'a str>,
    pub upstream_cluster: Option<&'a str>,
    pub upstream_host: Option<SocketAddr>,
    pub bytes_received: u64,
    pub bytes_sent: u64,
    pub connection_id: u64,
    pub downstream_remote: Option<SocketAddr>,
    pub downstream_local: Option<SocketAddr>,
    /// `set_property` values by path (segments joined with NUL).
    pub filter_state: &'a HashMap<Vec<u8>, Vec<u8>>,
}

fn value(op: &Op, entry: &Entry<'_>) -> Option<Vec<u8>> {
    let text = |s: String| Some(s.into_bytes());
    let non_empty = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(|s| s.as_bytes().to_vec());
    match op {
        Op::StartTime => text(format_start_time(entry.start_time)),
        Op::Req { main, alternative } => header(entry.request_headers, main, alternative.as_deref()),
        Op::Resp { main, alternative } => header(entry.response_headers, main, alternative.as_deref()),
        Op::ResponseCode => text(entry.response_code.unwrap_or(0).to_string()),
        Op::ResponseCodeDetails { allow_whitespaces } => entry.response_code_details.map(|d| {
            if *allow_whitespaces {
                d.as_bytes().to_vec()
            } else {
                // StringUtil::replaceAllEmptySpace
                d.chars()
                    .map(|c| {
                        if matches!(c, ' ' | '\t' | '\n' | '\r' | '\x0b' | '\x0c') {
                            '_'
                        } else {
                            c
                        }
                    })
                    .collect::<String>()
                    .into_bytes()
            }
        }),
        Op::ResponseFlags => text(if entry.response_flags.is_empty() {
            UNSET.to_owned()
        } else {
            entry.response_flags.join(",")
        }),
        Op::Duration => text(entry.duration.as_millis().to_string()),
        Op::UpstreamCluster => non_empty(entry.upstream_cluster),
        Op::UpstreamHost => entry.upstream_host.map(|a| a.to_string().into_bytes()),
        Op::RouteName => non_empty(entry.route_name),
        Op::BytesReceived => text(entry.bytes_received.to_string()),
        Op::BytesSent => text(entry.bytes_sent.to_string()),
        Op::Protocol => text("HTTP/1.1".to_owned()),
        Op::ConnectionId => text(entry.connection_id.to_string()),
        Op::DownstreamRemote { port } => address(entry.downstream_remote, *port),
        Op::DownstreamLocal { port } => address(entry.downstream_local, *port),
        Op::FilterState(key) => entry.filter_state.get(key).cloned(),
    }
}

/// `HeaderFormatter::findHeader`: the first value of the main header, else of the
/// alternative one.
fn header(headers: &Headers, main: &str, alternative: Option<&str>) -> Option<Vec<u8>> {
    headers
        .first(main)
        .or_else(|| alternative.and_then(|a| headers.first(a)))
        .map(<[u8]>::to_vec)
}

fn address(address: Option<SocketAddr>, with_port: bool) -> Option<Vec<u8>> {
    address.map(|a| {
        if with_port {
            a.to_string().into_bytes()
        } else {
            a.ip().to_string().into_bytes()
        }
    })
}

/// `AccessLogDateTimeFormatter::fromTime`: `2016-04-15T20:17:00.310Z`, always UTC.
pub fn format_start_time(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(i64::MAX);
    let of_day = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    let mut out = String::with_capacity(24);
    let _ = write!(
        out,
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3600,
        (of_day / 60) % 60,
        of_day % 60,
        since.subsec_millis()
    );
    out
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

// ------------------------------------------------------------------------ sinks

/// Where a logger writes (validated config; opened as a `Sink` at startup).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SinkConfig {
    Stdout,
    Stderr,
    File(PathBuf),
}

/// One configured access logger.
#[derive(Debug, Clone)]
pub struct AccessLogConfig {
    pub sink: SinkConfig,
    pub format: Arc<Format>,
}

/// How many entries `AccessLogStore` keeps (the most recent ones), so a long-running
/// host does not grow without bound; the sinks get every entry.
pub const KEPT_ENTRIES: usize = 10_000;

/// The most recent access log entries of one running host, in the order written.
#[derive(Debug, Default, Clone)]
pub(crate) struct AccessLogStore {
    lines: Arc<Mutex<VecDeque<String>>>,
}

impl AccessLogStore {
    pub fn lines(&self) -> Vec<String> {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    fn push(&self, line: String) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if lines.len() >= KEPT_ENTRIES {
            lines.pop_front();
        }
        lines.push_back(line);
    }
}

/// A logger ready to write: its format, its opened sink and the in-memory copy.
pub(crate) struct Logger {
    format: Arc<Format>,
    sink: Arc<Sink>,
    store: AccessLogStore,
}

impl Logger {
    /// A logger for `config` writing to `sink` (opened from `config.sink`, and shared by
    /// every logger with the same destination).
    pub fn new(config: &AccessLogConfig, sink: Arc<Sink>, store: AccessLogStore) -> Self {
        Self {
            format: Arc::clone(&config.format),
            sink,
            store,
        }
    }

    /// Formats one entry, keeps it (without its final newline) and hands it to the sink,
    /// whose flush thread writes it (see [`crate::log_sink`]).
    pub fn log(&self, entry: &Entry<'_>) {
        let line = self.format.render(entry);
        self.sink.write(&line);
        let mut kept = line;
        if kept.ends_with('\n') {
            kept.pop();
        }
        self.store.push(kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_envoy_utc_with_milliseconds() {
        let t = UNIX_EPOCH + Duration::from_millis(1_460_751_420_310);
        assert_eq!(format_start_time(t), "2016-04-15T20:17:00.310Z");
        assert_eq!(format_start_time(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(format_start_time(leap), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn command_syntax() {
        assert!(split_command("%REQ(:PATH):10%x").is_some_and(|c| c == ("REQ", Some(":PATH"), Some("10"), "x")));
        assert!(split_command("%PROTOCOL%").is_some());
        assert!(split_command("%protocol%").is_none());
        assert!(split_command("%REQ(:PATH%").is_none());
        assert!(split_command("%DURATION:%").is_none());
        assert!(split_command("%").is_none());
    }
}
