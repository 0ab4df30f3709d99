use super::*;
use crate::config::Config;
use crate::limits::tests::MemoryStore;

const T0: u64 = 1_700_000_000_000;

fn config() -> Config {
    let json = br#"{"providers":[
        {"id":"a","api":"openai","cluster":"a","authority":"a","api_key":"k","timeout_ms":1000},
        {"id":"b","api":"anthropic","cluster":"b","authority":"b","api_key":"k","timeout_ms":2000},
        {"id":"c","api":"gemini","cluster":"c","authority":"c","api_key":"k","timeout_ms":4000}]}"#;
    Config::parse(json, &|_| None).unwrap()
}

fn provider(cfg: &Config, id: &str) -> Rc<Provider> {
    Rc::clone(cfg.providers.iter().find(|p| p.id == id).unwrap())
}

fn candidates(cfg: &Config, list: &[(&str, &str)]) -> Vec<Candidate> {
    list.iter()
        .map(|(p, m)| Candidate {
            provider: provider(cfg, p),
            upstream_model: (*m).to_string(),
            weight: 1,
            priority: 0,
            inflight_key: None,
        })
        .collect()
}

fn tried(cfg: &Config, p: &str, m: &str, outcome: Outcome) -> Tried {
    Tried {
        provider: provider(cfg, p),
        model: m.into(),
        outcome,
        retry_after_ms: None,
    }
}

fn new_store(cfg: &Config) -> MemoryStore {
    let mut store = MemoryStore::default();
    prepare(&mut store, &cfg.providers);
    // From here on, every write must go through a CAS token.
    store.guarded_only = true;
    store
}

/// The plan's order for `list` at `now`, as `provider/model`.
fn order(store: &mut MemoryStore, cfg: &Config, list: &[(&str, &str)], now: u64) -> (Vec<String>, Ticket) {
    let (planned, ticket) = arrange(store, &cfg.health, candidates(cfg, list), now);
    let names = planned
        .iter()
        .map(|c| format!("{}/{}", c.provider.id, c.upstream_model))
        .collect();
    (names, ticket)
}

fn fail(store: &mut MemoryStore, cfg: &Config, p: &str, m: &str, outcome: Outcome, now: u64) -> Vec<Change> {
    report(
        store,
        &cfg.health,
        &[tried(cfg, p, m, outcome)],
        &Ticket::default(),
        now,
    )
}

fn opened(changes: &[Change]) -> Vec<(String, Scope, String, u64)> {
    changes
        .iter()
        .filter_map(|c| Some((c.provider.id.clone(), c.scope, c.name.clone(), c.opened_for?)))
        .collect()
}

#[test]
fn a_healthy_provider_is_read_once_and_never_written() {
    let cfg = config();
    let mut store = new_store(&cfg);
    let before = store.values.clone();
    let (names, ticket) = order(&mut store, &cfg, &[("a", "m1"), ("a", "m2"), ("b", "m")], T0);
    assert_eq!(names, ["a/m1", "a/m2", "b/m"]);
    assert!(ticket.deferred.is_empty() && ticket.probes.is_empty());
    let ok = [tried(&cfg, "a", "m1", Outcome::Status(200))];
    assert!(report(&mut store, &cfg.health, &ok, &ticket, T0).is_empty());
    assert_eq!(store.values, before, "a success on a clean provider writes nothing");
}

#[test]
fn consecutive_failures_open_the_endpoint_and_credential_and_the_candidate_goes_last() {
    let cfg = config();
    let mut store = new_store(&cfg);
    for i in 0..2 {
        assert!(fail(&mut store, &cfg, "a", "m1", Outcome::Status(503), T0 + i).is_empty());
    }
    let changes = fail(&mut store, &cfg, "a", "m1", Outcome::Status(503), T0 + 2);
    assert_eq!(
        opened(&changes),
        [
            ("a".into(), Scope::Credential, "0".into(), 30_000),
            ("a".into(), Scope::Endpoint, "m1".into(), 30_000),
        ]
    );
    let (names, ticket) = order(&mut store, &cfg, &[("a", "m1"), ("b", "m")], T0 + 10);
    assert_eq!(names, ["b/m", "a/m1"]);
    assert_eq!(ticket.deferred.len(), 1);
    assert_eq!(
        ticket.deferred[0].open,
        [(Scope::Credential, "0".into()), (Scope::Endpoint, "m1".into())]
    );
    // The credential is open: the provider's other models wait too.
    let (names, _) = order(&mut store, &cfg, &[("a", "m2"), ("b", "m")], T0 + 10);
    assert_eq!(names, ["b/m", "a/m2"]);
}

#[test]
fn a_success_between_failures_starts_the_count_again() {
    let cfg = config();
    let mut store = new_store(&cfg);
    for outcome in [503, 503, 200, 503, 503].map(Outcome::Status) {
        assert!(opened(&fail(&mut store, &cfg, "a", "m", outcome, T0)).is_empty());
    }
    let (names, _) = order(&mut store, &cfg, &[("a", "m"), ("b", "m")], T0);
    assert_eq!(names, ["a/m", "b/m"]);
}

#[test]
fn after_the_cooldown_one_request_probes_and_its_success_closes_the_circuit() {
    let cfg = config();
    let mut store = new_store(&cfg);
    for _ in 0..3 {
        fail(&mut store, &cfg, "a", "m", Outcome::Failed, T0);
    }
    let list = [("a", "m"), ("b", "m")];
    assert_eq!(order(&mut store, &cfg, &list, T0 + 29_999).0, ["b/m", "a/m"]);
    let after = T0 + 30_000;
    let (names, probe) = order(&mut store, &cfg, &list, after);
    assert_eq!(names, ["a/m", "b/m"], "the probe keeps its place");
    assert_eq!(probe.probes.len(), 1);
    assert_eq!(probe.probes[0].0.open, [(Scope::Provider, String::new())]);
    assert_eq!(probe.probes[0].1, after + 1000, "leased for the provider's time");
    // Every other request still passes it over while the probe is out.
    let (names, other) = order(&mut store, &cfg, &list, after + 1);
    assert_eq!(names, ["b/m", "a/m"]);
    assert!(other.probes.is_empty());
    let ok = [tried(&cfg, "a", "m", Outcome::Status(200))];
    let changes = report(&mut store, &cfg.health, &ok, &probe, after + 500);
    assert_eq!(changes.len(), 1);
    assert_eq!((changes[0].scope, changes[0].opened_for), (Scope::Provider, None));
    assert_eq!(order(&mut store, &cfg, &list, after + 501).0, ["a/m", "b/m"]);
    assert_eq!(
        store.values["waygate.health.a"].0, b"",
        "a healthy provider's entry is empty again"
    );
}

#[test]
fn a_failed_probe_opens_the_circuit_again_for_twice_as_long_up_to_the_cap() {
    let cfg = config();
    let mut store = new_store(&cfg);
    for _ in 0..3 {
        fail(&mut store, &cfg, "a", "m", Outcome::Status(404), T0);
    }
    let mut now = T0;
    for cooldown in [30_000, 60_000, 120_000, 240_000, 300_000, 300_000] {
        now += cooldown;
        let (_, probe) = order(&mut store, &cfg, &[("a", "m")], now);
        assert_eq!(probe.probes.len(), 1);
        let failed = [tried(&cfg, "a", "m", Outcome::Status(404))];
        let changes = report(&mut store, &cfg.health, &failed, &probe, now);
        let next = match cooldown {
            300_000 => 300_000,
            c => (c * 2).min(300_000),
        };
        assert_eq!(opened(&changes), [("a".into(), Scope::Endpoint, "m".into(), next)]);
    }
}

#[test]
fn a_429_that_says_when_to_come_back_opens_at_once_for_that_long() {
    let cfg = config();
    let mut store = new_store(&cfg);
    let mut limited = tried(&cfg, "a", "m", Outcome::Status(429));
    limited.retry_after_ms = retry_after_ms(Some(" 2 "));
    let changes = report(&mut store, &cfg.health, &[limited], &Ticket::default(), T0);
    // One key: its endpoint and its credential (with two, the credential only: below).
    assert_eq!(
        opened(&changes),
        [
            ("a".into(), Scope::Credential, "0".into(), 2000),
            ("a".into(), Scope::Endpoint, "m".into(), 2000)
        ]
    );
    let list = [("a", "m"), ("b", "m")];
    assert_eq!(order(&mut store, &cfg, &list, T0 + 1999).0, ["b/m", "a/m"]);
    assert_eq!(order(&mut store, &cfg, &list, T0 + 2000).0, ["a/m", "b/m"]);
    // Without retry-after, a 429 is one failure of three.
    let cfg = config();
    let mut store = new_store(&cfg);
    assert!(fail(&mut store, &cfg, "a", "m", Outcome::Status(429), T0).is_empty());
}

#[test]
fn a_429_on_one_of_two_keys_moves_the_load_to_the_other() {
    let json = br#"{"providers":[
        {"id":"a","api":"openai","cluster":"a","authority":"a","credentials":[
            {"id":"one","api_key":"k1"},{"id":"two","api_key":"k2"}]},
        {"id":"b","api":"openai","cluster":"b","authority":"b","api_key":"k"}]}"#;
    let cfg = Config::parse(json, &|_| None).unwrap();
    let mut store = new_store(&cfg);
    let keys: Vec<Rc<Provider>> = cfg.credentials("a").cloned().collect();
    let mut limited = tried(&cfg, "a", "m", Outcome::Status(429));
    limited.provider = Rc::clone(&keys[0]);
    limited.retry_after_ms = Some(5000);
    let changes = report(&mut store, &cfg.health, &[limited], &Ticket::default(), T0);
    assert_eq!(opened(&changes), [("a".into(), Scope::Credential, "one".into(), 5000)]);
    let planned: Vec<Candidate> = keys
        .iter()
        .chain(cfg.credentials("b"))
        .map(|p| Candidate {
            provider: Rc::clone(p),
            upstream_model: "m".into(),
            weight: 1,
            priority: 0,
            inflight_key: None,
        })
        .collect();
    let (order, ticket) = arrange(&mut store, &cfg.health, planned, T0 + 1);
    let names: Vec<String> = order
        .iter()
        .map(|c| format!("{}.{}", c.provider.id, c.provider.credential_id))
        .collect();
    assert_eq!(names, ["a.two", "b.0", "a.one"]);
    assert_eq!(ticket.deferred[0].open, [(Scope::Credential, "one".into())]);
}

#[test]
fn each_failure_counts_against_its_circuits_only() {
    let cfg = config();
    let three = |outcome: Outcome| {
        let mut store = new_store(&cfg);
        for _ in 0..3 {
            fail(&mut store, &cfg, "a", "m1", outcome, T0);
        }
        let (names, _) = order(&mut store, &cfg, &[("a", "m2"), ("b", "m")], T0);
        let m1 = order(&mut store, &cfg, &[("a", "m1"), ("b", "m")], T0).0;
        (names.first().cloned().unwrap(), m1.first().cloned().unwrap())
    };
    // (what a second model of the provider gets, what the failing one gets)
    assert_eq!(three(Outcome::Failed), ("b/m".into(), "b/m".into()), "the provider");
    assert_eq!(
        three(Outcome::Status(401)),
        ("b/m".into(), "b/m".into()),
        "the credential"
    );
    assert_eq!(
        three(Outcome::Status(404)),
        ("a/m2".into(), "b/m".into()),
        "the endpoint"
    );
    // Never the client's own errors, nor a stream cut after its first byte.
    for outcome in [
        Outcome::Status(400),
        Outcome::Status(413),
        Outcome::Status(422),
        Outcome::Cut,
    ] {
        assert_eq!(three(outcome), ("a/m2".into(), "a/m1".into()), "{outcome:?}");
    }
}

#[test]
fn a_probe_claimed_and_not_tried_is_given_back() {
    let cfg = config();
    let mut store = new_store(&cfg);
    for _ in 0..3 {
        fail(&mut store, &cfg, "b", "m", Outcome::Status(500), T0);
    }
    let list = [("a", "m"), ("b", "m")];
    let now = T0 + 30_000;
    let (names, probe) = order(&mut store, &cfg, &list, now);
    assert_eq!(names, ["a/m", "b/m"]);
    assert_eq!(probe.probes.len(), 1, "b's probe is claimed in its own place");
    // `a` served: b was never asked.
    let ok = [tried(&cfg, "a", "m", Outcome::Status(200))];
    assert!(report(&mut store, &cfg.health, &ok, &probe, now + 10).is_empty());
    let (_, next) = order(&mut store, &cfg, &list, now + 20);
    assert_eq!(next.probes.len(), 1, "the next request may probe");
}

#[test]
fn when_every_candidate_is_open_the_first_to_reopen_leads_and_none_is_dropped() {
    let cfg = config();
    let mut store = new_store(&cfg);
    for (p, at) in [("a", T0 + 2), ("b", T0), ("c", T0 + 1)] {
        for _ in 0..3 {
            fail(&mut store, &cfg, p, "m", Outcome::Status(502), at);
        }
    }
    let (names, ticket) = order(&mut store, &cfg, &[("a", "m"), ("b", "m"), ("c", "m")], T0 + 10);
    assert_eq!(names, ["b/m", "c/m", "a/m"]);
    assert_eq!(ticket.deferred.len(), 3);
    // A failure while cooling changes nothing more.
    let tried_anyway = [tried(&cfg, "b", "m", Outcome::Status(502))];
    assert!(report(&mut store, &cfg.health, &tried_anyway, &ticket, T0 + 10).is_empty());
}

#[test]
fn updates_that_lose_a_race_are_read_again_and_applied() {
    let cfg = config();
    let mut store = new_store(&cfg);
    for _ in 0..2 {
        fail(&mut store, &cfg, "a", "m", Outcome::Status(503), T0);
    }
    store.conflicts = 3;
    let changes = fail(&mut store, &cfg, "a", "m", Outcome::Status(503), T0);
    assert_eq!(opened(&changes).len(), 2);
    store.conflicts = 2;
    let (_, probe) = order(&mut store, &cfg, &[("a", "m")], T0 + 30_000);
    assert_eq!(probe.probes.len(), 1);
}

#[test]
fn turned_off_nothing_is_read_or_written() {
    let mut cfg = config();
    cfg.health.enabled = false;
    let mut store = MemoryStore::default();
    for _ in 0..5 {
        assert!(fail(&mut store, &cfg, "a", "m", Outcome::Status(503), T0).is_empty());
    }
    assert_eq!(order(&mut store, &cfg, &[("a", "m"), ("b", "m")], T0).0, ["a/m", "b/m"]);
    assert!(store.values.is_empty());
}

#[test]
fn the_stored_board_reads_back_and_bounds_what_clients_name() {
    let mut board = Board::default();
    for i in 0..MAX_CIRCUITS + 10 {
        if let Some(c) = board.get_mut(Scope::Endpoint, &format!("model {i}")) {
            c.failures = 1;
        }
    }
    assert_eq!(board.entries.len(), MAX_CIRCUITS);
    assert!(board.get_mut(Scope::Endpoint, "one more").is_none());
    assert!(board.get_mut(Scope::Endpoint, "two\nlines").is_none());
    assert!(
        board.get_mut(Scope::Provider, "").is_some(),
        "the provider's always has room"
    );
    assert_eq!(Board::decode(&board.encode()), board);
    // Whatever is stored, reading it never fails.
    for junk in [
        &b"x 1 2 3 4 m\n"[..],
        b"e 1 2\n",
        b"p a b c d \n",
        b"\xff\xfe",
        b"e 99999999999 1 1 1 m",
    ] {
        assert!(Board::decode(junk).entries.is_empty(), "{junk:?}");
    }
}

#[test]
fn a_failure_ratio_over_a_window_opens_a_circuit_that_never_failed_three_times_running() {
    let mut cfg = config();
    cfg.health.failure_percent = Some(50);
    cfg.health.min_requests = 4;
    cfg.health.window_ms = 10_000;
    let mut store = new_store(&cfg);
    let outcomes = [503, 200, 503, 200, 503].map(Outcome::Status);
    let mut opened_at = None;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let changes = fail(&mut store, &cfg, "a", "m", outcome, T0 + i as u64);
        if !opened(&changes).is_empty() {
            opened_at = Some(i);
        }
    }
    // 3 of 5 failed: past half once at least 4 were counted.
    assert_eq!(opened_at, Some(4));
    // The same failures spread over more than the window never reach it.
    let mut store = new_store(&cfg);
    for (i, outcome) in outcomes.into_iter().enumerate() {
        let changes = fail(&mut store, &cfg, "a", "m", outcome, T0 + i as u64 * 6_000);
        assert!(opened(&changes).is_empty(), "{i}");
    }
    // A success with no failure in the window writes nothing.
    let mut store = new_store(&cfg);
    let before = store.values.clone();
    fail(&mut store, &cfg, "a", "m", Outcome::Status(200), T0);
    assert_eq!(store.values, before);
}
