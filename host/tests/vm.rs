//! VMs: canary refusal, traps and the failure policy, workers, environment, logs.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use waygate_host::HostOptions;

/// cpp-host `wasm.cc` `canary`: on_configure returning false stops startup, and the
/// error carries the plugin's log lines.
#[test]
fn a_canary_refusal_stops_startup_with_the_plugin_log() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.configuration = "refuse".to_owned();
    let error = waygate_host::start(
        &boot.yaml(),
        HostOptions {
            concurrency: 1,
            ..Default::default()
        },
    )
    .unwrap_err();
    let text = error.to_string();
    assert!(text.contains("bad configuration: refused on purpose"), "{text}");
    assert!(text.contains("wasm log probe probe_root probe_vm: error:"), "{text}");
}

/// Semantics §1.1: on_configure runs on the canary and on every worker VM.
#[test]
fn on_configure_runs_on_the_canary_and_every_worker() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start_with(HostOptions {
        concurrency: 3,
        env: Some(HashMap::new()),
        ..Default::default()
    });
    assert_eq!(lines(&host, "configure {}").len(), 4);
}

/// context.cc `CHECK_FAIL_HTTP` + 1.36-era `createContext`: a trap fails that worker's
/// VM for good; FAIL_CLOSED answers 503 (empty, wasm_fail_stream) for the in-flight and
/// every later request on that worker, without calling the VM again.
#[test]
fn a_trap_fails_the_worker_vm_closed() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    let r = request(addr(&host), "GET", "/x", &[("x-probe", "trap")], None).unwrap();
    assert_eq!(r.status, 503);
    assert!(r.body.is_empty());
    assert!(
        lines(&host, "panicked at").len() == 1 || lines(&host, "probe trap").len() == 1,
        "{:?}",
        host.logs()
    );
    let later = request(addr(&host), "GET", "/x", &[], None).unwrap();
    assert_eq!(later.status, 503);
    assert!(up.received().is_empty());
    // No callback ran for the later request.
    assert_eq!(lines(&host, "req_headers").len(), 1, "{:?}", host.logs());
}

/// FAIL_OPEN: the in-flight request continues without the filter; later requests skip it.
#[test]
fn a_trap_with_fail_open_skips_the_filter() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.failure_policy = "FAIL_OPEN";
    let host = boot.start();
    let r = request(addr(&host), "POST", "/x", &[("x-probe", "trap")], Some(b"a")).unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "echo:a");
    let later = request(addr(&host), "POST", "/x", &[], Some(b"b")).unwrap();
    assert_eq!(later.text(), "echo:b");
    assert_eq!(lines(&host, "req_headers").len(), 1, "{:?}", host.logs());
}

/// Worker isolation: a trap fails only the VM of the worker it happened on. Connections
/// go round-robin, so with 2 workers consecutive connections alternate.
#[test]
fn a_trap_fails_only_its_own_worker() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start_with(HostOptions {
        concurrency: 2,
        env: Some(HashMap::new()),
        ..Default::default()
    });
    let first = request(addr(&host), "GET", "/x", &[("x-probe", "trap")], None).unwrap();
    assert_eq!(first.status, 503);
    let statuses: Vec<u16> = (0..4)
        .map(|_| request(addr(&host), "GET", "/x", &[], None).unwrap().status)
        .collect();
    assert_eq!(statuses, vec![200, 503, 200, 503]);
}

/// Envoy `vm_config.environment_variables`: host_env_keys come from the host environment
/// (missing keys skipped), key_values are literal; nothing else of the process leaks.
#[test]
fn the_vm_sees_only_configured_environment_variables() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.env_keys = vec!["X", "MISSING"];
    boot.key_values = vec![("Y", "literal")];
    let env = HashMap::from([
        ("X".to_owned(), "from-host".to_owned()),
        ("HOME".to_owned(), "/root".to_owned()),
    ]);
    let host = boot.start_with(HostOptions {
        concurrency: 1,
        env: Some(env),
        ..Default::default()
    });
    let _ = request(addr(&host), "GET", "/x", &[("x-probe", "env")], None).unwrap();
    let line = lines(&host, "env X=").join("");
    assert!(
        line.contains(r#"X=Some("from-host") Y=Some("literal") HOME=None"#),
        "{line}"
    );
}

/// context.cc `Context::log`: `wasm log <name> <root_id> <vm_id>: ...`; debug lines are
/// dropped at the default (info) level and kept when the host level allows them.
#[test]
fn log_lines_carry_the_plugin_prefix_and_respect_the_level() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    assert!(
        host.logs()
            .iter()
            .all(|l| l.starts_with("wasm log probe probe_root probe_vm: ") || l.starts_with("waygate-host: "))
    );
    // The SDK logs at debug nowhere in the probe; at trace level the host keeps trace lines.
    let quiet = Boot::new(up.addr).start_with(HostOptions {
        concurrency: 1,
        log_level: waygate_host::LogLevel::Error,
        ..Default::default()
    });
    assert!(lines(&quiet, "configure").is_empty());
}

/// Semantics §1.2.4: on client disconnect no further body callback arrives, but
/// on_log/on_done/on_delete still run.
#[test]
fn on_log_runs_when_the_client_goes_away() {
    let up = Upstream::start();
    let host = Boot::new(up.addr).start();
    {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(addr(&host)).unwrap();
        s.write_all(b"GET /slow/1000 HTTP/1.1\r\nhost: a\r\nx-probe: props\r\n\r\n")
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(wait_for(&host, "on_log").len(), 1, "{:?}", host.logs());
}

/// Envoy `Wasm::setTimerPeriod`/`tickHandler`: the period belongs to each VM's root, so
/// every worker ticks on its own; the canary never ticks.
#[test]
fn every_worker_ticks_on_its_own() {
    let up = Upstream::start();
    let mut boot = Boot::new(up.addr);
    boot.configuration = "tick".to_owned();
    let host = boot.start_with(HostOptions {
        concurrency: 2,
        env: Some(HashMap::new()),
        ..Default::default()
    });
    std::thread::sleep(Duration::from_millis(450));
    let ticks = lines(&host, "info: tick ");
    // Two workers, each counting its own ticks from 1.
    assert!(ticks.iter().filter(|l| l.ends_with("tick 1")).count() == 2, "{ticks:?}");
    assert!(ticks.len() >= 4, "{ticks:?}");
}
