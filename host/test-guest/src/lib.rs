//! The probe guest: one scenario per request (header `x-probe`), each logging what the
//! host answered so that host/tests can assert Envoy's behaviour. Raw ABI imports are used
//! where the status itself is the point (the SDK would panic on it).

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::*;
use proxy_wasm::types::*;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_get_header_map_value(map: u32, kd: *const u8, ks: usize, rd: *mut *mut u8, rs: *mut usize) -> u32;
    fn proxy_get_header_map_pairs(map: u32, rd: *mut *mut u8, rs: *mut usize) -> u32;
    fn proxy_replace_header_map_value(map: u32, kd: *const u8, ks: usize, vd: *const u8, vs: usize) -> u32;
    fn proxy_set_buffer_bytes(buffer: u32, start: usize, size: usize, d: *const u8, s: usize) -> u32;
    fn proxy_get_buffer_bytes(buffer: u32, start: usize, max: usize, rd: *mut *mut u8, rs: *mut usize) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_http_call(
        ud: *const u8,
        us: usize,
        hd: *const u8,
        hs: usize,
        bd: *const u8,
        bs: usize,
        td: *const u8,
        ts: usize,
        timeout: u32,
        token: *mut u32,
    ) -> u32;
}

fn raw_get_value(map: u32, key: &str) -> u32 {
    let mut d = std::ptr::null_mut();
    let mut s = 0;
    unsafe { proxy_get_header_map_value(map, key.as_ptr(), key.len(), &mut d, &mut s) }
}

fn raw_pairs(map: u32) -> (u32, usize) {
    let mut d = std::ptr::null_mut();
    let mut s = 0;
    let status = unsafe { proxy_get_header_map_pairs(map, &mut d, &mut s) };
    (status, s)
}

fn raw_replace(map: u32, key: &str, value: &str) -> u32 {
    unsafe { proxy_replace_header_map_value(map, key.as_ptr(), key.len(), value.as_ptr(), value.len()) }
}

fn raw_set_buffer(buffer: u32, start: usize, size: usize, data: &[u8]) -> u32 {
    unsafe { proxy_set_buffer_bytes(buffer, start, size, data.as_ptr(), data.len()) }
}

/// (status, returned pointer is null, size)
fn raw_get_buffer(buffer: u32, start: usize, max: usize) -> (u32, bool, usize) {
    let mut d = std::ptr::null_mut();
    let mut s = 0;
    let status = unsafe { proxy_get_buffer_bytes(buffer, start, max, &mut d, &mut s) };
    (status, d.is_null(), s)
}

fn serialize(pairs: &[(&str, &str)]) -> Vec<u8> {
    let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
    for (k, v) in pairs {
        out.extend((k.len() as u32).to_le_bytes());
        out.extend((v.len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend(k.as_bytes());
        out.push(0);
        out.extend(v.as_bytes());
        out.push(0);
    }
    out
}

fn raw_http_call(cluster: &str, pairs: &[(&str, &str)], timeout_ms: u32) -> (u32, u32) {
    let headers = serialize(pairs);
    let mut token = 0;
    let status = unsafe {
        proxy_http_call(
            cluster.as_ptr(),
            cluster.len(),
            headers.as_ptr(),
            headers.len(),
            std::ptr::null(),
            0,
            std::ptr::null(),
            0,
            timeout_ms,
            &mut token,
        )
    };
    (status, token)
}

fn prop(path: &[&str]) -> String {
    match hostcalls::get_property(path.to_vec()) {
        Ok(Some(v)) if v.len() == 8 && matches!(path, ["response", "code"] | ["source", "port"]) => {
            i64::from_le_bytes(v.try_into().unwrap_or([0; 8])).to_string()
        }
        Ok(Some(v)) => String::from_utf8_lossy(&v).into_owned(),
        Ok(None) => "<none>".to_owned(),
        Err(e) => format!("<err {e:?}>"),
    }
}

const REQ_HEADERS: u32 = 0;
const RESP_HEADERS: u32 = 2;
const REQ_BODY: u32 = 0;
const RESP_BODY: u32 = 1;

#[derive(Default)]
struct Root {
    calls: u32,
}
impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, _: usize) {
        log::info!("root call response token={token} headers={headers} body={body}");
    }
}
impl RootContext for Root {
    fn on_tick(&mut self) {
        self.calls += 1;
        log::info!("tick {}", self.calls);
    }
    fn on_vm_start(&mut self, _: usize) -> bool {
        true
    }
    fn on_configure(&mut self, _: usize) -> bool {
        let cfg = self.get_plugin_configuration().unwrap_or_default();
        let cfg = String::from_utf8_lossy(&cfg).into_owned();
        log::info!("configure {cfg}");
        if cfg.contains("refuse") {
            log::error!("bad configuration: refused on purpose");
            return false;
        }
        if cfg == "tick" {
            self.set_tick_period(Duration::from_millis(100));
        }
        if let Some(rest) = cfg.strip_prefix("root-call:") {
            self.calls += 1;
            let r = self.dispatch_http_call(
                rest,
                vec![(":method", "GET"), (":path", "/root"), (":authority", "x")],
                None,
                vec![],
                Duration::from_secs(5),
            );
            log::info!("root dispatch {:?}", r.is_ok());
        }
        true
    }
    fn create_http_context(&self, id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Probe {
            id,
            scenario: String::new(),
            seen_body: 0,
        }))
    }
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Probe {
    id: u32,
    scenario: String,
    seen_body: usize,
}

impl Probe {
    fn is(&self, s: &str) -> bool {
        self.scenario == s
    }
}

impl Context for Probe {
    fn on_http_call_response(&mut self, _token: u32, nh: usize, body_size: usize, _: usize) {
        let status = self.get_http_call_response_header(":status").unwrap_or_default();
        let body = self.get_http_call_response_body(0, body_size).unwrap_or_default();
        log::info!(
            "call response headers={nh} status={status} body={}",
            String::from_utf8_lossy(&body)
        );
        if self.is("call-resume") {
            self.set_http_request_header("x-after-call", Some("yes"));
            self.resume_http_request();
        } else if self.is("call-resp-pause") {
            self.send_http_response(299, vec![("x-from", "call")], Some(b"replaced"));
        } else {
            self.send_http_response(200, vec![("x-call-status", &status)], Some(&body));
        }
    }
}

impl HttpContext for Probe {
    fn on_http_request_headers(&mut self, n: usize, eos: bool) -> Action {
        self.scenario = self.get_http_request_header("x-probe").unwrap_or_default();
        log::info!("ctx={} req_headers n={n} eos={eos} scenario={}", self.id, self.scenario);
        match self.scenario.as_str() {
            "pause" | "pause-forever" => Action::Pause,
            "buffer" | "cl-mismatch" | "cl-fixed" | "set-buffer" | "body-headers" => Action::Pause,
            "local-req" => {
                self.send_http_response(403, vec![("x-local", "1")], Some(b"denied"));
                Action::Continue
            }
            "local-req-typed" => {
                self.send_http_response(401, vec![("content-type", "application/json")], Some(b"{}"));
                Action::Pause
            }
            "local-req-empty" => {
                self.send_http_response(204, vec![("content-type", "text/html"), ("content-length", "5")], None);
                Action::Pause
            }
            "trap" => panic!("probe trap"),
            "state" => {
                // Filter state `wasm.probe_early` (Envoy's set_property), for the access log.
                self.set_property(vec!["probe_early"], Some(b"early"));
                Action::Continue
            }
            "reroute" => {
                let cluster = self.get_http_request_header("x-to").unwrap_or_default();
                self.set_http_request_header("x-route", Some(&cluster));
                self.set_http_request_header(":path", Some("/rewritten"));
                Action::Continue
            }
            "props" => {
                log::info!(
                    "props headers: path={} method={} host={} route={} cluster={} code={} plugin={} root={} vm={}",
                    prop(&["request", "path"]),
                    prop(&["request", "method"]),
                    prop(&["request", "host"]),
                    prop(&["xds", "route_name"]),
                    prop(&["xds", "cluster_name"]),
                    prop(&["response", "code"]),
                    prop(&["plugin_name"]),
                    prop(&["plugin_root_id"]),
                    prop(&["plugin_vm_id"])
                );
                self.set_property(vec!["probe", "state"], Some(b"kept"));
                Action::Continue
            }
            "call" | "call-timeout" | "call-resume" => {
                let cluster = self.get_http_request_header("x-call-cluster").unwrap_or_default();
                let path = self.get_http_request_header("x-call-path").unwrap_or("/called".into());
                let timeout: u64 = self
                    .get_http_request_header("x-call-timeout")
                    .and_then(|t| t.parse().ok())
                    .unwrap_or(5000);
                let r = self.dispatch_http_call(
                    &cluster,
                    vec![(":method", "GET"), (":path", &path), (":authority", "called")],
                    None,
                    vec![],
                    Duration::from_millis(timeout),
                );
                log::info!("dispatch ok={}", r.is_ok());
                Action::Pause
            }
            "call-bad" => {
                let (unknown, _) = raw_http_call(
                    "no-such-cluster",
                    &[(":method", "GET"), (":path", "/"), (":authority", "a")],
                    1000,
                );
                let (missing, _) = raw_http_call("upstream", &[(":method", "GET"), (":authority", "a")], 1000);
                log::info!("call-bad unknown={unknown} missing_path={missing}");
                Action::Continue
            }
            "metrics" => {
                let c = hostcalls::define_metric(MetricType::Counter, "probe.requests").unwrap_or(0);
                let g = hostcalls::define_metric(MetricType::Gauge, "probe.level").unwrap_or(0);
                let h = hostcalls::define_metric(MetricType::Histogram, "probe.sizes").unwrap_or(0);
                let inc = unsafe { proxy_increment_metric(c, 1) };
                let zero = unsafe { proxy_increment_metric(c, 0) };
                let neg = unsafe { proxy_increment_metric(c, -1) };
                let hist = unsafe { proxy_increment_metric(h, 1) };
                let _ = hostcalls::record_metric(g, 7);
                let _ = hostcalls::record_metric(h, 42);
                log::info!(
                    "metrics inc={inc} zero={zero} neg={neg} hist_inc={hist} value={:?}",
                    hostcalls::get_metric(c)
                );
                Action::Continue
            }
            "shared" => {
                let (_, cas) = self.get_shared_data("k");
                let first = self.set_shared_data("k", Some(b"v1"), Some(12345)).is_ok();
                let (v, cas1) = self.get_shared_data("k");
                let stale = self.set_shared_data("k", Some(b"v2"), cas1.map(|c| c + 1000)).is_ok();
                let good = self.set_shared_data("k", Some(b"v3"), cas1).is_ok();
                log::info!(
                    "shared absent_cas={cas:?} first={first} value={:?} stale={stale} good={good}",
                    v.map(|v| String::from_utf8_lossy(&v).into_owned())
                );
                Action::Continue
            }
            "env" => {
                log::info!(
                    "env X={:?} Y={:?} HOME={:?}",
                    std::env::var("X").ok(),
                    std::env::var("Y").ok(),
                    std::env::var("HOME").ok()
                );
                Action::Continue
            }
            _ => Action::Continue,
        }
    }

    fn on_http_request_body(&mut self, size: usize, eos: bool) -> Action {
        log::info!("req_body size={size} eos={eos}");
        match self.scenario.as_str() {
            "after-continue" => {
                let value = raw_get_value(REQ_HEADERS, "x-probe");
                let (pairs, _) = raw_pairs(REQ_HEADERS);
                let replace = raw_replace(REQ_HEADERS, "x-a", "b");
                log::info!("after-continue get={value} pairs={pairs} replace={replace}");
                Action::Continue
            }
            "buffer" | "cl-mismatch" | "cl-fixed" | "body-headers" => {
                if !eos {
                    return Action::Pause;
                }
                let body = self.get_http_request_body(0, size).unwrap_or_default();
                let new = String::from_utf8_lossy(&body).to_uppercase() + "!";
                self.set_http_request_body(0, size, new.as_bytes());
                if self.is("cl-fixed") || self.is("buffer") || self.is("body-headers") {
                    self.set_http_request_header("content-length", Some(&new.len().to_string()));
                }
                if self.is("body-headers") {
                    log::info!("body-headers get={}", raw_get_value(REQ_HEADERS, "x-probe"));
                }
                Action::Continue
            }
            "set-buffer" => {
                if !eos {
                    return Action::Pause;
                }
                let prepend = raw_set_buffer(REQ_BODY, 0, 0, b"<");
                let len = self.get_http_request_body(0, usize::MAX).map(|b| b.len()).unwrap_or(0);
                let append = raw_set_buffer(REQ_BODY, len, 0, b">");
                let middle = raw_set_buffer(REQ_BODY, 1, 1, b"x");
                let empty = raw_get_buffer(REQ_BODY, 0, 0);
                log::info!("set-buffer prepend={prepend} append={append} middle={middle} empty_read={empty:?}");
                self.set_http_request_header("content-length", None);
                Action::Continue
            }
            "pause" => {
                self.seen_body += size;
                Action::Continue
            }
            "trap-body" => panic!("probe trap in body"),
            _ => Action::Continue,
        }
    }

    fn on_http_response_headers(&mut self, n: usize, eos: bool) -> Action {
        let status = self.get_http_response_header(":status").unwrap_or_default();
        log::info!(
            "resp_headers n={n} eos={eos} status={status} details={} code={}",
            prop(&["response", "code_details"]),
            prop(&["response", "code"])
        );
        match self.scenario.as_str() {
            "local-resp" => {
                self.send_http_response(418, vec![("x-direct", "1")], Some(b"teapot"));
                Action::Continue
            }
            "resp-buffer" => {
                self.set_http_response_header("content-length", None);
                Action::Pause
            }
            "resp-after-continue" | "resp-stream" => {
                self.set_http_response_header("content-length", None);
                Action::Continue
            }
            "call-resp-pause" => {
                let _ = self.dispatch_http_call(
                    "upstream",
                    vec![(":method", "GET"), (":path", "/called"), (":authority", "x")],
                    None,
                    vec![],
                    Duration::from_secs(5),
                );
                Action::Pause
            }
            "props" => {
                log::info!(
                    "props response: route={} cluster={} state={}",
                    prop(&["xds", "route_name"]),
                    prop(&["xds", "cluster_name"]),
                    prop(&["probe", "state"])
                );
                Action::Continue
            }
            _ => Action::Continue,
        }
    }

    fn on_http_response_body(&mut self, size: usize, eos: bool) -> Action {
        log::info!("resp_body size={size} eos={eos}");
        match self.scenario.as_str() {
            "resp-buffer" => {
                if !eos {
                    return Action::Pause;
                }
                let body = self.get_http_response_body(0, size).unwrap_or_default();
                let new = format!("[{}]", String::from_utf8_lossy(&body));
                self.set_http_response_body(0, size, new.as_bytes());
                Action::Continue
            }
            "resp-after-continue" => {
                log::info!("resp-after-continue get={}", raw_get_value(RESP_HEADERS, ":status"));
                Action::Continue
            }
            "resp-stream" => {
                let chunk = self.get_http_response_body(0, size).unwrap_or_default();
                let out = String::from_utf8_lossy(&chunk).replace("data:", "DATA:");
                self.set_http_response_body(0, size, out.as_bytes());
                let _ = RESP_BODY;
                Action::Continue
            }
            _ => Action::Continue,
        }
    }

    fn on_log(&mut self) {
        if self.scenario == "state" {
            // Set in on_log: the access log is written after it.
            self.set_property(vec!["probe_late"], Some(b"late"));
        }
        log::info!(
            "on_log ctx={} code={} details={} path={}",
            self.id,
            prop(&["response", "code"]),
            prop(&["response", "code_details"]),
            prop(&["request", "path"])
        );
    }
}
