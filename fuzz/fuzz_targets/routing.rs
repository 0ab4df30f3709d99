//! Model resolution, the spread over priorities and weights, the routing
//! object and the candidate plan: errors are envelopes, the spread keeps every
//! candidate in priority order, and a plan only ever holds configured,
//! credentialed, distinct candidates in the order the routing object asks for.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use waygate::routing;
use waygate_fuzz::{check_api_error, config};

fuzz_target!(|data: &[u8]| {
    let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let cfg = config();
    let model = body.get("model").and_then(Value::as_str).unwrap_or("chain/x");
    let resolved = match routing::resolve(&cfg, model) {
        Ok(r) => r,
        Err(e) => {
            check_api_error(&e);
            assert!(e.status == 400 || e.status == 404, "{e:?}");
            return;
        }
    };
    let listed = resolved.candidates.clone();
    // The draws come from the input, so every order is reachable.
    let mut bytes = data.iter().cycle();
    let mut draw = || bytes.next().map_or(0, |b| u64::from(*b));
    let mut inflight = |key: &str| key.len() as u64 % 3;
    let defaults = routing::spread(resolved.candidates, resolved.strategy, &mut draw, &mut inflight);
    assert!(!defaults.is_empty());
    assert_eq!(defaults.len(), listed.len(), "the spread keeps every candidate");
    assert!(listed.iter().all(|c| defaults.contains(c)));
    assert!(
        defaults.windows(2).all(|w| w[0].priority <= w[1].priority),
        "by priority"
    );
    assert!(defaults.iter().all(|c| cfg.providers.contains(&c.provider)));
    let directive = match routing::parse_directive(&cfg, body.get(&cfg.routing_field)) {
        Ok(d) => d,
        Err(e) => {
            check_api_error(&e);
            assert_eq!(e.status, 400);
            assert!(e.param.as_deref().is_some_and(|p| p.starts_with("waygate")), "{e:?}");
            return;
        }
    };
    for id in &directive.prefer {
        assert!(cfg.provider(id).is_some(), "prefer names only known providers");
    }
    assert!(routing::max_tries(&cfg, &directive) >= 1);
    let plan = routing::plan(defaults.clone(), &directive);
    for (i, c) in plan.iter().enumerate() {
        assert!(defaults.contains(c), "a planned candidate is a default one");
        assert!(!plan[i + 1..].contains(c), "no candidate twice");
        assert!(c.provider.credential.is_some(), "credentialed only");
    }
    let credentialed: Vec<_> = defaults.iter().filter(|c| c.provider.credential.is_some()).collect();
    if directive.allow_fallbacks {
        assert!(
            credentialed.iter().all(|c| plan.contains(c)),
            "fallbacks keep every candidate"
        );
    } else if directive.prefer.is_empty() {
        assert!(plan.len() <= 1);
    } else {
        assert!(
            plan.iter().all(|c| directive.prefer.contains(&c.provider.id)),
            "without fallbacks only preferred providers"
        );
    }
    // Preferred providers come first, in the order asked.
    let ranks: Vec<usize> = plan
        .iter()
        .map_while(|c| directive.prefer.iter().position(|p| *p == c.provider.id))
        .collect();
    // A provider's candidates (its credentials, its endpoints) come together.
    assert!(ranks.windows(2).all(|w| w[0] <= w[1]), "prefer order kept: {ranks:?}");
});
