//! A stream's one timer for its route and idle timeouts (Envoy keeps a libevent timer per
//! stream and re-arms it on every event, which costs nothing there).
//!
//! On tokio, a timer has a price Envoy's has not: registering one that is due before the
//! timer wheel's next wake (always, on a worker with no other timer) writes the driver's
//! eventfd, a syscall plus one more `epoll_wait`. A fresh `sleep_until` per event loop turn
//! paid that twice a request (`perf trace` on the host without a filter). So the timer is
//! armed lazily: a deadline that moves later (the idle timeout, on every event) leaves it
//! where it is, and a timer that fires before the deadline then due is moved on to it.
//! Streams hand their timers to the next stream on the worker, still registered, so moving
//! one later is all a new stream costs.

use std::cell::RefCell;
use std::pin::Pin;

use tokio::time::{Instant, Sleep};

/// Spare timers per worker; more than this many are dropped.
const SPARE: usize = 64;

thread_local! {
    static SPARES: RefCell<Vec<Pin<Box<Sleep>>>> = const { RefCell::new(Vec::new()) };
}

#[derive(Default)]
pub struct Timer {
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Timer {
    /// Resolves once `deadline` has passed; never while it is `None`.
    pub async fn reached(&mut self, deadline: Option<Instant>) {
        let Some(deadline) = deadline else {
            return std::future::pending().await;
        };
        loop {
            let sleep = self.sleep.get_or_insert_with(|| spare(deadline));
            if sleep.deadline() > deadline {
                // Only an earlier deadline re-registers the timer.
                sleep.as_mut().reset(deadline);
            }
            sleep.as_mut().await;
            if Instant::now() >= deadline {
                return;
            }
            // Armed for an older, earlier deadline: on to the one now due.
            sleep.as_mut().reset(deadline);
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some(sleep) = self.sleep.take() {
            let _ = SPARES.try_with(|spares| {
                if let Ok(mut spares) = spares.try_borrow_mut()
                    && spares.len() < SPARE
                {
                    spares.push(sleep);
                }
            });
        }
    }
}

/// A timer for `deadline`: a spare one as it is (its deadline is usually the earlier, so
/// [`Timer::reached`] moves it on when it fires), else a new one.
fn spare(deadline: Instant) -> Pin<Box<Sleep>> {
    SPARES
        .try_with(|spares| spares.try_borrow_mut().ok().and_then(|mut s| s.pop()))
        .ok()
        .flatten()
        .unwrap_or_else(|| Box::pin(tokio::time::sleep_until(deadline)))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn run(test: impl std::future::Future<Output = ()>) {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build_local(tokio::runtime::LocalOptions::default())
            .expect("runtime")
            .block_on(test);
    }

    fn spares() -> usize {
        SPARES.with(|s| s.borrow().len())
    }

    #[test]
    fn a_deadline_moved_later_is_kept_though_the_timer_was_armed_earlier() {
        run(async {
            let mut timer = Timer::default();
            let first = Instant::now() + Duration::from_millis(20);
            let early = tokio::time::timeout(Duration::from_millis(1), timer.reached(Some(first))).await;
            assert!(early.is_err(), "not due after 1 ms");
            let later = Instant::now() + Duration::from_millis(80);
            timer.reached(Some(later)).await;
            assert!(Instant::now() >= later, "fired at the older deadline");
        });
    }

    #[test]
    fn an_earlier_deadline_re_arms_the_timer() {
        run(async {
            let mut timer = Timer::default();
            let late = Instant::now() + Duration::from_secs(3600);
            let armed = tokio::time::timeout(Duration::from_millis(1), timer.reached(Some(late))).await;
            assert!(armed.is_err());
            let early = Instant::now() + Duration::from_millis(10);
            let fired = tokio::time::timeout(Duration::from_secs(30), timer.reached(Some(early))).await;
            assert!(fired.is_ok(), "still armed for an hour");
            assert!(Instant::now() >= early);
        });
    }

    #[test]
    fn no_deadline_never_fires() {
        run(async {
            let mut timer = Timer::default();
            let none = tokio::time::timeout(Duration::from_millis(50), timer.reached(None)).await;
            assert!(none.is_err());
        });
    }

    #[test]
    fn a_finished_streams_timer_serves_the_next_one() {
        run(async {
            let before = spares();
            let mut first = Timer::default();
            first.reached(Some(Instant::now() + Duration::from_millis(5))).await;
            drop(first);
            assert_eq!(spares(), before + 1, "kept as a spare");
            let mut second = Timer::default();
            let due = Instant::now() + Duration::from_millis(30);
            second.reached(Some(due)).await;
            assert_eq!(spares(), before, "the spare was taken");
            assert!(
                Instant::now() >= due,
                "the spare's old deadline had passed; it waits for its new one"
            );
        });
    }
}
