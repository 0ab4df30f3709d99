//! Provider health across requests (contract "Health"): circuits learned
//! from every attempt's outcome, shared by every worker of one Envoy, read
//! when a request's candidates are planned.
//!
//! Three circuits stand behind each candidate: its provider as a whole
//! (connect failures, resets, timeouts), the credential it is sent with
//! (401/403, 429, 5xx) and its endpoint, the provider with the model it is
//! asked for (404, 429, 5xx; a 429 not when the provider has several keys,
//! whose others then take the load). A circuit opens after `failures` consecutive
//! failures, or at once on a 429 that says when to come back
//! (`retry-after`); it stays open for a cooldown that doubles each time it
//! opens again without having closed (capped); once the cooldown is over,
//! one request claims the probe and tries it, and its success closes it. A
//! client's own errors (400, 413, 422), a stream cut after its first byte
//! and a client that goes away count neither way.
//!
//! [`arrange`] moves every candidate with an open circuit after the healthy
//! ones (those still cooling by when they end), so a dead provider costs a
//! request nothing while another can serve it; none is dropped, so a
//! request is never refused without an attempt. [`report`] runs at the
//! request's end with what each attempt got.
//!
//! Each provider's circuits are one shared-data entry (`waygate.health.<id>`):
//! a request reads one entry per provider it may try, and writes only when a
//! circuit changes, so a healthy provider's entry stays empty and costs a
//! request one read. Writes go through the entry's CAS token, as the local
//! limits' do.

use std::rc::Rc;

use crate::config::{Health, Provider};
use crate::limits::{SharedStore, StoreError};
use crate::record::{Outcome, Tried};
use crate::routing::Candidate;

const KEY_PREFIX: &str = "waygate.health.";

/// Endpoint circuits one provider's entry holds at most. The endpoint's
/// model comes from the client (any `<provider>/<model>` is routed), so a
/// client naming a new model in every request must not grow the entry
/// without bound; past this many, a new endpoint's failures are not
/// recorded (its provider's and credential's still are).
const MAX_CIRCUITS: usize = 64;

/// How many times one entry update retries after losing a race.
const MAX_CAS_RETRIES: usize = 16;

/// What a circuit stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The provider as a whole: its cluster can be reached.
    Provider,
    /// One credential of the provider.
    Credential,
    /// The provider with one model.
    Endpoint,
}

impl Scope {
    fn tag(self) -> &'static str {
        match self {
            Scope::Provider => "p",
            Scope::Credential => "c",
            Scope::Endpoint => "e",
        }
    }

    fn from_tag(tag: &str) -> Option<Scope> {
        match tag {
            "p" => Some(Scope::Provider),
            "c" => Some(Scope::Credential),
            "e" => Some(Scope::Endpoint),
            _ => None,
        }
    }

    /// As stats and log lines name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Provider => "provider",
            Scope::Credential => "credential",
            Scope::Endpoint => "endpoint",
        }
    }
}

/// One circuit's state. Times are unix milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Circuit {
    /// Consecutive failures.
    failures: u32,
    /// Times opened since it last closed; 0: closed.
    opens: u32,
    /// While open, when its cooldown ends.
    open_until: u64,
    /// A probe is out until then (the lease of the request that claimed it).
    probe_until: u64,
    /// The failure ratio's window (`health.failure_percent`): when it began
    /// (at a failure: a circuit without one is not stored), the attempts and
    /// failures counted in it.
    window_start: u64,
    requests: u32,
    window_failures: u32,
}

impl Circuit {
    /// Counts one attempt in the ratio's window, starting a new window when
    /// there is none or it has run out.
    fn count(&mut self, settings: &Health, now: u64, failed: bool) {
        if settings.failure_percent.is_none() {
            return;
        }
        if self.requests == 0 || now >= self.window_start.saturating_add(settings.window_ms) {
            if !failed {
                // A window only begins at a failure.
                *self = Circuit {
                    window_start: 0,
                    requests: 0,
                    window_failures: 0,
                    ..*self
                };
                return;
            }
            self.window_start = now;
            self.requests = 0;
            self.window_failures = 0;
        }
        self.requests = self.requests.saturating_add(1);
        if failed {
            self.window_failures = self.window_failures.saturating_add(1);
        }
    }

    /// The failure ratio has reached `health.failure_percent` over at least
    /// `health.min_requests` attempts.
    fn ratio_reached(&self, settings: &Health) -> bool {
        settings.failure_percent.is_some_and(|percent| {
            self.requests >= settings.min_requests
                && u64::from(self.window_failures) * 100 >= u64::from(percent) * u64::from(self.requests)
        })
    }
}

/// A circuit as planning sees it at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Closed,
    /// Open, its cooldown running until then.
    Cooling(u64),
    /// Open, its cooldown over, a probe out until then.
    Probing(u64),
    /// Open, its cooldown over, no probe out: the next request may claim it.
    Ready,
}

impl Circuit {
    fn standing(&self, now: u64) -> Standing {
        if self.opens == 0 {
            Standing::Closed
        } else if now < self.open_until {
            Standing::Cooling(self.open_until)
        } else if now < self.probe_until {
            Standing::Probing(self.probe_until)
        } else {
            Standing::Ready
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    scope: Scope,
    /// The credential's id or the endpoint's model; empty for the provider.
    name: String,
    circuit: Circuit,
}

/// One provider's circuits, as stored: a line per circuit that is open, has
/// failures or a failure ratio's window, `<scope> <failures> <opens>
/// <open_until> <probe_until> <window_start> <requests> <window_failures>
/// <name>` (the name last: a model may hold spaces).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Board {
    entries: Vec<Entry>,
}

impl Board {
    fn decode(bytes: &[u8]) -> Board {
        let text = String::from_utf8_lossy(bytes);
        let entries = text.lines().filter_map(Board::decode_line).collect();
        Board { entries }
    }

    fn decode_line(line: &str) -> Option<Entry> {
        let mut parts = line.splitn(9, ' ');
        let scope = Scope::from_tag(parts.next()?)?;
        let mut number = || parts.next()?.parse::<u64>().ok();
        let failures = u32::try_from(number()?).ok()?;
        let opens = u32::try_from(number()?).ok()?;
        let open_until = number()?;
        let probe_until = number()?;
        let window_start = number()?;
        let requests = u32::try_from(number()?).ok()?;
        let window_failures = u32::try_from(number()?).ok()?;
        let name = parts.next()?.to_string();
        Some(Entry {
            scope,
            name,
            circuit: Circuit {
                failures,
                opens,
                open_until,
                probe_until,
                window_start,
                requests,
                window_failures,
            },
        })
    }

    fn encode(&self) -> Vec<u8> {
        use std::fmt::Write;
        let mut out = String::new();
        for e in &self.entries {
            let c = &e.circuit;
            let _ = writeln!(
                out,
                "{} {} {} {} {} {} {} {} {}",
                e.scope.tag(),
                c.failures,
                c.opens,
                c.open_until,
                c.probe_until,
                c.window_start,
                c.requests,
                c.window_failures,
                e.name
            );
        }
        out.into_bytes()
    }

    fn get(&self, scope: Scope, name: &str) -> Option<&Circuit> {
        let e = self.entries.iter().find(|e| e.scope == scope && e.name == name)?;
        Some(&e.circuit)
    }

    /// The circuit, created closed if absent; `None` for a new endpoint when
    /// the board holds its most (or when the name cannot be stored: a line
    /// break would split its line).
    fn get_mut(&mut self, scope: Scope, name: &str) -> Option<&mut Circuit> {
        let at = self.entries.iter().position(|e| e.scope == scope && e.name == name);
        let at = match at {
            Some(at) => at,
            None if !name.contains(['\n', '\r'])
                && (scope != Scope::Endpoint
                    || self.entries.iter().filter(|e| e.scope == Scope::Endpoint).count() < MAX_CIRCUITS) =>
            {
                self.entries.push(Entry {
                    scope,
                    name: name.to_string(),
                    circuit: Circuit::default(),
                });
                self.entries.len() - 1
            }
            None => return None,
        };
        self.entries.get_mut(at).map(|e| &mut e.circuit)
    }

    /// Closed circuits without failures or a live window are not kept: a
    /// healthy provider's entry is empty.
    fn prune(&mut self, settings: &Health, now: u64) {
        self.entries.retain(|e| {
            let c = &e.circuit;
            let window = c.requests > 0 && now < c.window_start.saturating_add(settings.window_ms);
            c.opens > 0 || c.failures > 0 || (settings.failure_percent.is_some() && window)
        });
    }

    /// The candidate's three circuits, the worst first: cooling, then
    /// probing, then ready; `Closed` only when all three are.
    fn standing(&self, credential: &str, model: &str, now: u64) -> Standing {
        let mut worst = Standing::Closed;
        for (scope, name) in scopes(credential, model) {
            let Some(c) = self.get(scope, name) else { continue };
            worst = match (worst, c.standing(now)) {
                (Standing::Cooling(a), Standing::Cooling(b)) => Standing::Cooling(a.max(b)),
                (Standing::Cooling(a), _) | (_, Standing::Cooling(a)) => Standing::Cooling(a),
                (Standing::Probing(a), Standing::Probing(b)) => Standing::Probing(a.max(b)),
                (Standing::Probing(a), _) | (_, Standing::Probing(a)) => Standing::Probing(a),
                (Standing::Ready, _) | (_, Standing::Ready) => Standing::Ready,
                (Standing::Closed, Standing::Closed) => Standing::Closed,
            };
        }
        worst
    }
}

/// A candidate's circuits: its provider, its credential, its endpoint.
fn scopes<'a>(credential: &'a str, model: &'a str) -> [(Scope, &'a str); 3] {
    [
        (Scope::Provider, ""),
        (Scope::Credential, credential),
        (Scope::Endpoint, model),
    ]
}

fn key(provider: &Provider) -> String {
    let mut key = String::with_capacity(KEY_PREFIX.len() + provider.id.len());
    key.push_str(KEY_PREFIX);
    key.push_str(&provider.id);
    key
}

/// Creates every provider's entry, empty, before the VM serves: updates
/// then always go through a CAS token (an absent entry has none, and two
/// workers creating it at once would each overwrite the other).
pub fn prepare(store: &mut dyn SharedStore, providers: &[Rc<Provider>]) {
    for p in providers {
        let key = key(p);
        if store.get(&key).is_none() {
            // Lost to another worker creating it first: that is as good.
            let _ = store.set(&key, b"", 0);
        }
    }
}

/// A candidate passed over for an open circuit, or whose probe this
/// request holds.
#[derive(Debug, Clone)]
pub struct Held {
    pub provider: Rc<Provider>,
    pub model: String,
    /// Its circuits that are open: scope and name.
    pub open: Vec<(Scope, String)>,
}

/// What planning learned and claimed, read again at the request's end.
#[derive(Debug, Default)]
pub struct Ticket {
    /// Providers whose entry was empty at planning: a success on them
    /// needs no write (nor a read).
    clean: Vec<String>,
    /// Probes this request claimed, each with its lease's end.
    pub probes: Vec<(Held, u64)>,
    /// Candidates moved after the healthy ones, in plan order.
    pub deferred: Vec<Held>,
}

/// `candidates` in the order to try them: healthy ones and those whose
/// probe this request claimed keep their order; the rest follow, the one
/// whose circuit reopens for a probe first leading. `now` is unix
/// milliseconds.
pub fn arrange(
    store: &mut dyn SharedStore,
    settings: &Health,
    candidates: Vec<Candidate>,
    now: u64,
) -> (Vec<Candidate>, Ticket) {
    let mut ticket = Ticket::default();
    if !settings.enabled {
        return (candidates, ticket);
    }
    let mut ready: Vec<Candidate> = Vec::with_capacity(candidates.len());
    let mut later: Vec<(u64, Candidate, Held)> = Vec::new();
    // A probe's lease covers the candidates before it, which may each take
    // their whole time first (http_call fallback).
    let mut lease_ms: u64 = 0;
    for candidate in candidates {
        lease_ms = lease_ms.saturating_add(candidate.provider.timeout_ms);
        if ticket.clean.contains(&candidate.provider.id) {
            ready.push(candidate);
            continue;
        }
        let held = |open| Held {
            provider: Rc::clone(&candidate.provider),
            model: candidate.upstream_model.clone(),
            open,
        };
        match claim(store, settings, &candidate, now, now.saturating_add(lease_ms)) {
            Claim::Clean => {
                ticket.clean.push(candidate.provider.id.clone());
                ready.push(candidate);
            }
            Claim::Healthy => ready.push(candidate),
            Claim::Probe(until, open) => {
                ticket.probes.push((held(open), until));
                ready.push(candidate);
            }
            Claim::Later(until, open) => {
                let held = held(open);
                // Kept in order of when each opens again; equal ones in plan order.
                let at = later.partition_point(|(u, _, _)| *u <= until);
                later.insert(at, (until, candidate, held));
            }
        }
    }
    for (_, candidate, held) in later {
        ticket.deferred.push(held);
        ready.push(candidate);
    }
    (ready, ticket)
}

enum Claim {
    /// The provider's entry is empty.
    Clean,
    /// This candidate's circuits are closed.
    Healthy,
    /// This request holds the candidate's probe until then; its open circuits.
    Probe(u64, Vec<(Scope, String)>),
    /// Open: cooling, or another request's probe out, until then; its open circuits.
    Later(u64, Vec<(Scope, String)>),
}

/// Reads the candidate's circuits and, when its cooldowns are over and no
/// probe is out, claims the probe until `lease`.
fn claim(store: &mut dyn SharedStore, settings: &Health, candidate: &Candidate, now: u64, lease: u64) -> Claim {
    let key = key(&candidate.provider);
    let model = candidate.upstream_model.as_str();
    let credential = candidate.provider.credential_id.as_str();
    for _ in 0..MAX_CAS_RETRIES {
        let Some((bytes, cas)) = store.get(&key) else {
            return Claim::Clean;
        };
        if bytes.is_empty() {
            return Claim::Clean;
        }
        let mut board = Board::decode(&bytes);
        let open: Vec<(Scope, String)> = scopes(credential, model)
            .into_iter()
            .filter(|(scope, name)| board.get(*scope, name).is_some_and(|c| c.opens > 0))
            .map(|(scope, name)| (scope, name.to_string()))
            .collect();
        match board.standing(credential, model, now) {
            Standing::Closed => return Claim::Healthy,
            Standing::Cooling(until) | Standing::Probing(until) => return Claim::Later(until, open),
            Standing::Ready => {}
        }
        for (scope, name) in scopes(credential, model) {
            if let Some(c) = board.get_mut(scope, name)
                && c.opens > 0
            {
                c.probe_until = lease;
            }
        }
        board.prune(settings, now);
        match store.set(&key, &board.encode(), cas) {
            Ok(()) => return Claim::Probe(lease, open),
            Err(StoreError::CasMismatch) => continue,
            // Not claimed, so not tried ahead of the healthy ones.
            Err(StoreError::Other) => return Claim::Later(now, open),
        }
    }
    Claim::Later(now, Vec::new())
}

/// A circuit that changed state at a request's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub provider: Rc<Provider>,
    pub scope: Scope,
    /// The credential's id or the endpoint's model; empty for the provider.
    pub name: String,
    /// `Some(cooldown_ms)`: opened (or opened again after a failed probe);
    /// `None`: closed.
    pub opened_for: Option<u64>,
}

/// Which circuits an attempt's outcome fails, or `None` when it proves
/// them healthy (an answer), or neither (`Some(&[])`). `keys`: how many
/// credentials the provider holds.
fn failing(outcome: Outcome, keys: usize) -> Option<&'static [Scope]> {
    match outcome {
        Outcome::Failed => Some(&[Scope::Provider]),
        Outcome::Cut => Some(&[]),
        Outcome::Status(401 | 403) => Some(&[Scope::Credential]),
        Outcome::Status(404) => Some(&[Scope::Endpoint]),
        // With several keys a quota is one key's: counted against the
        // endpoint too, one key's 429 would take the others out with it.
        Outcome::Status(429) if keys > 1 => Some(&[Scope::Credential]),
        Outcome::Status(429) => Some(&[Scope::Endpoint, Scope::Credential]),
        Outcome::Status(408 | 500..=599) => Some(&[Scope::Endpoint, Scope::Credential]),
        // The provider answered: a success, or the client's own error (400,
        // 413, 422), which says it is up.
        Outcome::Status(_) => None,
    }
}

/// Applies every attempt's outcome to its provider's circuits and gives
/// back the probes `ticket` holds that were not tried. `now` is unix
/// milliseconds.
pub fn report(
    store: &mut dyn SharedStore,
    settings: &Health,
    tried: &[Tried],
    ticket: &Ticket,
    now: u64,
) -> Vec<Change> {
    let mut changes = Vec::new();
    if !settings.enabled {
        return changes;
    }
    let mut providers: Vec<&Rc<Provider>> = Vec::new();
    for p in tried
        .iter()
        .map(|t| &t.provider)
        .chain(ticket.probes.iter().map(|(h, _)| &h.provider))
    {
        if !providers.iter().any(|q| q.id == p.id) {
            providers.push(p);
        }
    }
    for provider in providers {
        let own: Vec<&Tried> = tried.iter().filter(|t| t.provider.id == provider.id).collect();
        let probes: Vec<&(Held, u64)> = ticket
            .probes
            .iter()
            .filter(|(h, _)| h.provider.id == provider.id)
            .collect();
        let clean = ticket.clean.contains(&provider.id);
        if probes.is_empty()
            && clean
            && own
                .iter()
                .all(|t| failing(t.outcome, t.provider.credential_count).is_none_or(<[Scope]>::is_empty))
        {
            continue;
        }
        update(store, settings, provider, &own, &probes, now, &mut changes);
    }
    changes
}

fn update(
    store: &mut dyn SharedStore,
    settings: &Health,
    provider: &Rc<Provider>,
    tried: &[&Tried],
    probes: &[&(Held, u64)],
    now: u64,
    changes: &mut Vec<Change>,
) {
    let key = key(provider);
    for _ in 0..MAX_CAS_RETRIES {
        let (bytes, cas) = store.get(&key).unwrap_or_default();
        let before = Board::decode(&bytes);
        let mut board = before.clone();
        let mut changed: Vec<Change> = Vec::new();
        for t in tried {
            apply(&mut board, settings, t, now, &mut |scope, name, opened_for| {
                changed.push(Change {
                    provider: Rc::clone(provider),
                    scope,
                    name: name.to_string(),
                    opened_for,
                });
            });
        }
        // A probe claimed and never tried (another candidate served first,
        // or the client left): the next request may claim it.
        for (held, lease) in probes {
            let credential = held.provider.credential_id.as_str();
            if tried
                .iter()
                .any(|t| t.model == held.model && t.provider.credential_id == credential)
            {
                continue;
            }
            for (scope, name) in scopes(credential, &held.model) {
                if let Some(c) = board.get_mut(scope, name)
                    && c.probe_until == *lease
                {
                    c.probe_until = 0;
                }
            }
        }
        board.prune(settings, now);
        if board == before {
            return;
        }
        match store.set(&key, &board.encode(), cas) {
            Ok(()) => {
                changes.extend(changed);
                return;
            }
            Err(StoreError::CasMismatch) => continue,
            Err(StoreError::Other) => {
                log::warn!("provider {}: its health could not be recorded", provider.id);
                return;
            }
        }
    }
}

/// One attempt's outcome on its circuits; `changed` hears of each circuit
/// that opened or closed.
fn apply(
    board: &mut Board,
    settings: &Health,
    tried: &Tried,
    now: u64,
    changed: &mut dyn FnMut(Scope, &str, Option<u64>),
) {
    let credential = tried.provider.credential_id.as_str();
    let Some(failed) = failing(tried.outcome, tried.provider.credential_count) else {
        for (scope, name) in scopes(credential, &tried.model) {
            if let Some(c) = board.get_mut(scope, name) {
                if c.opens > 0 {
                    changed(scope, name, None);
                    *c = Circuit::default();
                } else {
                    c.failures = 0;
                    c.count(settings, now, false);
                }
            }
        }
        return;
    };
    // A 429 that says when to come back is heeded at once.
    let told = match tried.outcome {
        Outcome::Status(429) => tried.retry_after_ms,
        _ => None,
    };
    for (scope, name) in scopes(credential, &tried.model) {
        if !failed.contains(&scope) {
            continue;
        }
        let Some(c) = board.get_mut(scope, name) else { continue };
        c.failures = c.failures.saturating_add(1);
        c.count(settings, now, true);
        // A failure while the cooldown runs (every candidate was open, so
        // this one was tried anyway) changes nothing more; after it, it is a
        // failed probe, and the circuit opens again for longer.
        let tripped = c.failures >= settings.failures || told.is_some() || c.ratio_reached(settings);
        let opens = (c.opens == 0 && tripped) || (c.opens > 0 && now >= c.open_until);
        if opens {
            c.opens = c.opens.saturating_add(1);
            let cooldown = told.unwrap_or_else(|| {
                let doublings = c.opens.saturating_sub(1).min(32);
                settings.cooldown_ms.saturating_mul(1u64 << doublings)
            });
            let cooldown = cooldown.min(settings.max_cooldown_ms);
            c.open_until = now.saturating_add(cooldown);
            c.probe_until = 0;
            changed(scope, name, Some(cooldown));
        }
    }
}

/// A `retry-after` of whole seconds, in milliseconds (its HTTP-date form is
/// not read).
pub fn retry_after_ms(value: Option<&str>) -> Option<u64> {
    let value = value?.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse::<u64>().ok().map(|s| s.saturating_mul(1000))
}

#[cfg(test)]
mod tests;
