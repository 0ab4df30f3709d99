//! The filter's upstream role (router fallback): one context per router
//! attempt, installed on each provider cluster. It finds the request's
//! prepared attempts ([`super::routed`]), applies attempt `n`'s rewrite
//! (Envoy's `x-envoy-attempt-count`) to the request Envoy replays, and
//! records the attempt's status for the downstream context, which shapes
//! the final answer. It never answers itself: a local reply from an upstream
//! filter goes to the client and is never retried, so it replies only when
//! it cannot rewrite the request at all (rather than send it untranslated).

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::Action;

use super::host::{self, Buffer, Map};
use super::routed::{self, Miss, TOKEN_PROPERTY};
use crate::attempts::Attempts;
use crate::errors::{ApiError, ErrorType};
use crate::headers::ResponseHead;
use crate::health;

/// The header Envoy's router numbers its attempts with (the route's virtual
/// host sets `include_request_attempt_count`); absent means the first.
const ATTEMPT_COUNT_HEADER: &str = "x-envoy-attempt-count";

#[derive(Default)]
pub struct Attempt {
    /// The request's attempts and this attempt's number, once found.
    routed: Option<(Rc<RefCell<Attempts>>, usize)>,
}

impl Attempt {
    fn fail(&mut self, what: &str) -> Action {
        log::error!("upstream attempt: {what}");
        self.routed = None;
        let e = ApiError::new(
            500,
            ErrorType::Upstream,
            "internal_error",
            "The gateway failed to handle this request.",
        );
        if let Err(status) = host::send_local_response(500, &e.headers(), &e.body()) {
            log::error!("local reply refused by the host (status {})", status.0);
        }
        Action::Pause
    }

    fn apply(&mut self, body_size: usize) -> Action {
        let Some((attempts, n)) = self.routed.clone() else {
            return Action::Continue;
        };
        // The router picked this attempt's cluster from the slot headers; when
        // it is not the one prepared (a slot naming a cluster Envoy does not
        // have leaves the previous attempt's), neither the provider's
        // credential nor the prompt may go there. The attempt counts as failed.
        let cluster = host::property(&["xds", "cluster_name"]);
        let applied = match attempts.borrow_mut().start(n) {
            None => Err(format!("attempt {n} was not prepared")),
            Some(edits) if cluster.as_deref() != Some(edits.cluster.as_bytes()) => Err(format!(
                "attempt {n} runs in cluster {:?}, not the one prepared for it",
                String::from_utf8_lossy(&cluster.unwrap_or_default())
            )),
            // Host calls only: nothing here re-enters the guest, so the borrow is safe.
            Some(edits) => host::edit_headers(Map::Request, &edits.remove, edits.set)
                .and_then(|()| host::set_buffer(Buffer::RequestBody, 0, body_size, edits.body))
                .map_err(|status| format!("rewriting attempt {n} failed (host status {})", status.0)),
        };
        match applied {
            Ok(()) => Action::Continue,
            Err(what) => self.fail(&what),
        }
    }
}

impl Context for Attempt {}

impl HttpContext for Attempt {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        // Not a request the downstream filter routed this way: not ours.
        let Some(token) = host::property(&[TOKEN_PROPERTY]) else {
            return Action::Continue;
        };
        let attempts = match routed::find(&token) {
            Ok(attempts) => attempts,
            Err(Miss::OtherVm) => {
                return self.fail(
                    "the request was prepared in another VM: give the filter's two roles the same \
                     vm_config (a configuration change reaches one role before the other)",
                );
            }
            Err(Miss::Gone | Miss::Unreadable) => return self.fail("no attempts registered for this request"),
        };
        let map = match host::header_map(Map::Request) {
            Ok(map) => map,
            Err(status) => return self.fail(&format!("reading request headers (host status {})", status.0)),
        };
        let n = map
            .pairs()
            .into_iter()
            .find(|(k, _)| *k == ATTEMPT_COUNT_HEADER.as_bytes())
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.trim().parse().ok())
            .unwrap_or(1);
        self.routed = Some((attempts, n));
        if end_of_stream {
            return self.apply(0);
        }
        // Held until the body, replayed whole for every attempt, is here.
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.routed.is_none() {
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        self.apply(body_size)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some((attempts, n)) = &self.routed {
            // One read of the map: the status, and when to come back (health).
            let pairs = host::header_map(Map::Response).map(|map| ResponseHead::read(&map.pairs()));
            let (status, retry_after) = match pairs {
                Ok(head) => (head.status, health::retry_after_ms(head.retry_after.as_deref())),
                Err(_) => (0, None),
            };
            attempts.borrow_mut().on_response(*n, status, retry_after);
        }
        Action::Continue
    }
}
