//! `--busy-poll-us`: a worker keeps polling for a while after its last read, then
//! sleeps; with the option off it sleeps at once. Measured by the worker thread's own
//! CPU time (/proc), the only thing the option changes; requests must still work.
//! One test in this binary, so no other host's worker runs beside it.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use waygate_host::HostOptions;

/// CPU time (user + system) of this process's thread named `name`, in clock ticks.
fn thread_ticks(name: &str) -> u64 {
    let tasks = std::fs::read_dir("/proc/self/task").unwrap();
    for task in tasks {
        let dir = task.unwrap().path();
        if std::fs::read_to_string(dir.join("comm")).unwrap().trim() != name {
            continue;
        }
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap();
        // Fields after the command name, which is in parentheses: state is field 3,
        // utime and stime are fields 14 and 15.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        return fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    panic!("no thread named {name}");
}

/// Ticks the worker burns over `span` after a request.
fn ticks_after_request(host: &waygate_host::RunningHost, wait: Duration, span: Duration) -> u64 {
    let r = request(addr(host), "POST", "/echo", &[], Some(b"ping")).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "echo:ping"));
    std::thread::sleep(wait);
    let before = thread_ticks("wg-worker-0");
    std::thread::sleep(span);
    thread_ticks("wg-worker-0") - before
}

#[test]
fn a_polling_worker_spins_after_a_read_and_sleeps_once_quiet() {
    let ticks_per_second = 100; // USER_HZ on Linux
    let up = Upstream::start();
    let boot = Boot::new(up.addr);

    let polling = boot.start_with(HostOptions {
        concurrency: 1,
        env: Some(HashMap::new()),
        busy_poll: Duration::from_millis(600),
        ..Default::default()
    });
    // Within the window the worker polls: it is on the CPU most of the time (half is
    // plenty of margin for a busy test machine).
    let spinning = ticks_after_request(&polling, Duration::ZERO, Duration::from_millis(400));
    assert!(
        spinning >= ticks_per_second * 400 / 1000 / 2,
        "the worker did not poll after a read: {spinning} ticks in 400 ms"
    );
    // Past the window it sleeps.
    let quiet = ticks_after_request(&polling, Duration::from_millis(700), Duration::from_millis(500));
    assert!(
        quiet <= 2,
        "the worker kept polling past its window: {quiet} ticks in 500 ms"
    );
    // An SSE response still streams chunk by chunk while the worker polls.
    let r = request(addr(&polling), "GET", "/sse", &[("x-probe", "resp-stream")], None).unwrap();
    assert_eq!(r.text(), "DATA: 0\n\nDATA: 1\n\nDATA: 2\n\n");
    drop(polling);

    // Off (the default): the worker sleeps right after the request.
    let sleeping = boot.start();
    let idle = ticks_after_request(&sleeping, Duration::from_millis(50), Duration::from_millis(500));
    assert!(idle <= 2, "a worker without busy polling used {idle} ticks in 500 ms");
}
