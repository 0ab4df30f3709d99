//! Router fallback's hand-over between the two roles of the filter: the
//! downstream context registers a request's attempts under a token it
//! publishes as filter state ([`TOKEN_PROPERTY`]) beside each attempt's
//! cluster ([`crate::attempts::SLOT_PROPERTY`], read by the route's cluster matcher), and
//! each router attempt's upstream context finds them by it: the upstream
//! request's filter state sees the downstream one's. Nothing of it is a
//! header, so nothing of it reaches a provider. Both roles run in the same VM on the same
//! worker thread when they share a `vm_config` (Envoy gives filters with the same
//! `vm_config` one VM per worker), so the registry is plain memory. The downstream context
//! removes its entry when Envoy deletes it, whatever ended the request.
//!
//! A configuration change can leave the roles in two VMs for a while (one role's
//! `vm_config` changed, the other's not yet). A token is therefore `<stamp>-<count>`, the
//! stamp random per VM: a token from another VM's registry is known as such and matches
//! nothing here, where a bare count would match another request's attempts and send its
//! prompt to this request's provider.

use std::cell::RefCell;
use std::rc::Rc;

use super::host;
use crate::attempts::Attempts;

/// The filter state (`wasm.waygate_routed`) that carries the token.
pub const TOKEN_PROPERTY: &str = "waygate_routed";

type Shared = Rc<RefCell<Attempts>>;

/// A worker holds as many entries as it has requests in flight: a short
/// list, searched linearly (a map's code costs more of the module).
struct Registry {
    /// This VM's stamp, the first part of its tokens.
    stamp: u64,
    next: u64,
    entries: Vec<(u64, Shared)>,
}

impl Registry {
    /// A registry with a random stamp; should the host refuse randomness, the clock
    /// still tells two VMs apart (they start at different nanoseconds).
    fn new() -> Registry {
        let stamp = getrandom::u64().unwrap_or_else(|_| host::now_nanos());
        Registry {
            stamp,
            next: 0,
            entries: Vec::new(),
        }
    }
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::new());
}

/// Why an upstream attempt found no attempts for its token.
#[derive(Debug, PartialEq, Eq)]
pub enum Miss {
    /// The token is not one this module writes.
    Unreadable,
    /// Registered by another VM: the two roles' `vm_config` differ.
    OtherVm,
    /// Registered here, and its request is gone.
    Gone,
}

/// Registers `attempts`: the count to [`forget`] them by, and the token to
/// publish.
pub fn register(attempts: Shared) -> (u64, String) {
    REGISTRY.with_borrow_mut(|r| {
        r.next = r.next.wrapping_add(1);
        let count = r.next;
        r.entries.push((count, attempts));
        (count, format!("{:x}-{count}", r.stamp))
    })
}

/// The attempts registered under `token`, while their request lives.
pub fn find(token: &[u8]) -> Result<Shared, Miss> {
    let (stamp, count) = std::str::from_utf8(token)
        .ok()
        .and_then(|t| t.split_once('-'))
        .and_then(|(stamp, count)| Some((u64::from_str_radix(stamp, 16).ok()?, count.parse::<u64>().ok()?)))
        .ok_or(Miss::Unreadable)?;
    REGISTRY.with_borrow(|r| {
        if stamp != r.stamp {
            return Err(Miss::OtherVm);
        }
        r.entries
            .iter()
            .find(|(c, _)| *c == count)
            .map(|(_, a)| Rc::clone(a))
            .ok_or(Miss::Gone)
    })
}

/// Forgets the attempts registered as `count` (the downstream context is
/// being deleted).
pub fn forget(count: u64) {
    REGISTRY.with_borrow_mut(|r| {
        r.entries.retain(|(c, _)| *c != count);
    });
}
