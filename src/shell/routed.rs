//! Router fallback's hand-over between the two roles of the filter: the
//! downstream context registers a request's attempts under a token it
//! publishes as filter state ([`TOKEN_PROPERTY`]) beside each attempt's
//! cluster ([`crate::attempts::SLOT_PROPERTY`], read by the route's cluster matcher), and
//! each router attempt's upstream context finds them by it: the upstream
//! request's filter state sees the downstream one's. Nothing of it is a
//! header, so nothing of it reaches a provider. Both run in the same VM on the same worker
//! thread (Envoy gives filters with the same `vm_config` one VM per worker),
//! so the registry is plain memory. The downstream context removes its entry
//! when Envoy deletes it, whatever ended the request.

use std::cell::RefCell;
use std::rc::Rc;

use crate::attempts::Attempts;

/// The filter state (`wasm.waygate_routed`) that carries the token.
pub const TOKEN_PROPERTY: &str = "waygate_routed";

type Shared = Rc<RefCell<Attempts>>;

/// A worker holds as many entries as it has requests in flight: a short
/// list, searched linearly (a map's code costs more of the module).
#[derive(Default)]
struct Registry {
    next: u64,
    entries: Vec<(u64, Shared)>,
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

/// Registers `attempts`; the token to write into the request.
pub fn register(attempts: Shared) -> u64 {
    REGISTRY.with_borrow_mut(|r| {
        r.next = r.next.wrapping_add(1);
        let token = r.next;
        r.entries.push((token, attempts));
        token
    })
}

/// The attempts registered under `token`, while their request lives.
pub fn find(token: u64) -> Option<Shared> {
    REGISTRY.with_borrow(|r| r.entries.iter().find(|(t, _)| *t == token).map(|(_, a)| Rc::clone(a)))
}

/// Forgets `token`'s attempts (the downstream context is being deleted).
pub fn forget(token: u64) {
    REGISTRY.with_borrow_mut(|r| {
        r.entries.retain(|(t, _)| *t != token);
    });
}
