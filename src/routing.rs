//! Model resolution and candidate selection (contract §5).
//!
//! A model id resolves to its candidates (provider, credential and upstream
//! model), which [`spread`] orders: by priority, and within a priority by the
//! model's strategy over the endpoints' weights, then each endpoint's
//! credentials by theirs. The per-request routing object then reorders
//! (`prefer`), filters (`allow_fallbacks`) and bounds (`max_provider_tries`)
//! that list.

use std::rc::Rc;

use serde_json::Value;

use crate::config::{ASKED_MODEL, Config, Provider, Strategy};
use crate::errors::{ApiError, ErrorType};
use crate::request::{bad_value, wrong_type};

/// One provider (with one of its credentials) that may serve the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub provider: Rc<Provider>,
    pub upstream_model: String,
    /// Its endpoint's share of its priority's requests, and that priority.
    pub weight: u32,
    pub priority: u32,
    /// Under `fewest_in_flight`, the shared-data key counting its endpoint's
    /// requests in flight (`waygate.inflight.<model id>#<endpoint index>`).
    pub inflight_key: Option<Rc<str>>,
}

/// What a model id resolves to: its candidates in configuration order and
/// how they share its requests.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub candidates: Vec<Candidate>,
    pub strategy: Strategy,
}

/// 404 `model_not_found` for `model` (contract §4).
pub fn model_not_found(model: &str) -> ApiError {
    ApiError::new(
        404,
        ErrorType::InvalidRequest,
        "model_not_found",
        format!("The model '{model}' does not exist."),
    )
    .with_param("model")
}

/// Resolves a model id to its default candidates (contract §5 rules 1–3):
/// a catalog entry named so, else the first catalog pattern it matches,
/// else `<provider>/<model>`.
pub fn resolve(config: &Config, model: &str) -> Result<Resolved, ApiError> {
    let entry = (config.models.iter().find(|m| m.pattern.is_none() && m.id == model))
        .or_else(|| (config.models.iter()).find(|m| m.pattern.as_ref().is_some_and(|p| p.matches(model))));
    if let Some(m) = entry {
        let mut candidates = Vec::with_capacity(m.endpoints.len());
        for (i, e) in m.endpoints.iter().enumerate() {
            let upstream_model = if e.model == ASKED_MODEL { model } else { &e.model };
            let inflight_key: Option<Rc<str>> =
                (m.strategy == Strategy::FewestInFlight).then(|| format!("waygate.inflight.{}#{i}", m.id).into());
            for provider in config.credentials(&e.provider.id) {
                candidates.push(Candidate {
                    provider: Rc::clone(provider),
                    upstream_model: upstream_model.to_string(),
                    weight: e.weight,
                    priority: e.priority,
                    inflight_key: inflight_key.clone(),
                });
            }
        }
        return Ok(Resolved {
            candidates,
            strategy: m.strategy,
        });
    }
    let not_found = || model_not_found(model);
    if model.is_empty() {
        return Err(bad_value("model", "must not be empty"));
    }
    let Some((prefix, rest)) = model.split_once('/') else {
        return Err(not_found());
    };
    if rest.is_empty() {
        return Err(bad_value("model", "must name a model after the '/'"));
    }
    let candidates: Vec<Candidate> = (config.credentials(prefix))
        .map(|provider| Candidate {
            provider: Rc::clone(provider),
            upstream_model: rest.to_string(),
            weight: 1,
            priority: 0,
            inflight_key: None,
        })
        .collect();
    if candidates.is_empty() {
        return Err(not_found());
    }
    Ok(Resolved {
        candidates,
        strategy: Strategy::Weighted,
    })
}

/// `candidates` (in configuration order) in the order to try them: by
/// priority; within one, its endpoints by `strategy` (a draw weighted by
/// their weights, or the fewest requests in flight first, `inflight`
/// counting them, ties by the draw); each endpoint's credentials, next to
/// each other, by a draw weighted by theirs. `draw` gives random numbers,
/// asked only when there is a choice: one endpoint a priority with one
/// credential each (the default) keeps the configuration's order.
pub fn spread(
    mut candidates: Vec<Candidate>,
    strategy: Strategy,
    draw: &mut dyn FnMut() -> u64,
    inflight: &mut dyn FnMut(&str) -> u64,
) -> Vec<Candidate> {
    // Priorities that only grow hold one candidate each: nothing to choose.
    let one_each = candidates.windows(2).all(|w| match w {
        [a, b] => a.priority < b.priority,
        _ => true,
    });
    if one_each {
        return candidates;
    }
    candidates.sort_by_key(|c| c.priority);
    let mut ordered = Vec::with_capacity(candidates.len());
    let mut rest = candidates.as_slice();
    while let Some(first) = rest.first() {
        let same = rest.iter().take_while(|c| c.priority == first.priority).count();
        let (group, after) = rest.split_at(same);
        rest = after;
        // The priority's endpoints (a provider and model), each with its credentials.
        let mut endpoints: Vec<Vec<&Candidate>> = Vec::new();
        for c in group {
            let same_endpoint = |e: &&mut Vec<&Candidate>| {
                e.first()
                    .is_some_and(|f| f.provider.id == c.provider.id && f.upstream_model == c.upstream_model)
            };
            match endpoints.iter_mut().find(same_endpoint) {
                Some(endpoint) => endpoint.push(c),
                None => endpoints.push(vec![c]),
            }
        }
        let weights: Vec<u64> = endpoints
            .iter()
            .map(|e| e.first().map_or(1, |c| u64::from(c.weight)))
            .collect();
        let mut order = weighted_order(&weights, draw);
        if strategy == Strategy::FewestInFlight && endpoints.len() > 1 {
            let busy: Vec<u64> = endpoints
                .iter()
                .map(|e| {
                    e.first()
                        .and_then(|c| c.inflight_key.as_deref())
                        .map_or(0, &mut *inflight)
                })
                .collect();
            order.sort_by_key(|i| busy.get(*i).copied().unwrap_or(0));
        }
        for i in order {
            let Some(endpoint) = endpoints.get(i) else { continue };
            let weights: Vec<u64> = endpoint
                .iter()
                .map(|c| u64::from(c.provider.credential_weight))
                .collect();
            for j in weighted_order(&weights, draw) {
                ordered.extend(endpoint.get(j).map(|c| (*c).clone()));
            }
        }
    }
    ordered
}

/// The indexes of `weights` in a random order where each next one is drawn
/// in proportion to its weight among those left.
fn weighted_order(weights: &[u64], draw: &mut dyn FnMut() -> u64) -> Vec<usize> {
    let mut left: Vec<usize> = (0..weights.len()).collect();
    let mut order = Vec::with_capacity(left.len());
    while left.len() > 1 {
        let total: u64 = left.iter().map(|i| weights.get(*i).copied().unwrap_or(0)).sum();
        let mut point = draw() % total.max(1);
        let mut at = 0;
        for (k, i) in left.iter().enumerate() {
            let w = weights.get(*i).copied().unwrap_or(0);
            if point < w {
                at = k;
                break;
            }
            point -= w;
        }
        order.push(left.remove(at));
    }
    order.extend(left);
    order
}

/// The parsed `<routing_field>.routing` object.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Directive {
    pub prefer: Vec<String>,
    pub allow_fallbacks: bool,
    pub max_provider_tries: Option<u32>,
}

/// Parses the routing object: `value` is the request body's `<routing_field>` member.
pub fn parse_directive(config: &Config, value: Option<&Value>) -> Result<Directive, ApiError> {
    let field = config.routing_field.as_str();
    let mut directive = Directive {
        allow_fallbacks: true,
        ..Directive::default()
    };
    let outer = match value {
        None | Some(Value::Null) => return Ok(directive),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(wrong_type(field, "an object")),
    };
    for key in outer.keys() {
        if key != "routing" {
            return Err(unknown(&format!("{field}.{key}")));
        }
    }
    let routing = match outer.get("routing") {
        None | Some(Value::Null) => return Ok(directive),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(wrong_type(&format!("{field}.routing"), "an object")),
    };
    for (key, value) in routing {
        let param = format!("{field}.routing.{key}");
        match (key.as_str(), value) {
            (_, Value::Null) => {}
            ("prefer", Value::Array(ids)) => {
                for (i, id) in ids.iter().enumerate() {
                    let Value::String(id) = id else {
                        return Err(wrong_type(&format!("{param}.{i}"), "a string"));
                    };
                    if config.provider(id).is_none() {
                        return Err(bad_value(
                            &format!("{param}.{i}"),
                            &format!("names unknown provider '{id}'"),
                        ));
                    }
                    directive.prefer.push(id.clone());
                }
            }
            ("prefer", _) => return Err(wrong_type(&param, "an array of provider ids")),
            ("allow_fallbacks", Value::Bool(b)) => directive.allow_fallbacks = *b,
            ("allow_fallbacks", _) => return Err(wrong_type(&param, "a boolean")),
            ("max_provider_tries", Value::Number(n)) => match n.as_u64() {
                Some(t) if t >= 1 => directive.max_provider_tries = Some(u32::try_from(t).unwrap_or(u32::MAX)),
                Some(_) => return Err(bad_value(&param, "must be at least 1")),
                None if n.is_i64() => return Err(bad_value(&param, "must be at least 1")),
                None => return Err(wrong_type(&param, "an integer")),
            },
            ("max_provider_tries", _) => return Err(wrong_type(&param, "an integer")),
            _ => return Err(unknown(&param)),
        }
    }
    Ok(directive)
}

fn unknown(param: &str) -> ApiError {
    ApiError::bad_request(
        "unsupported_parameter",
        param,
        format!("Unknown routing parameter '{param}'."),
    )
}

/// Applies the directive to the default candidates. Providers without a
/// credential are never candidates. The list is not bounded here: a
/// candidate whose API cannot express the request is skipped without
/// counting as a try (see [`max_tries`]).
pub fn plan(defaults: Vec<Candidate>, directive: &Directive) -> Vec<Candidate> {
    let mut ordered: Vec<Candidate> = Vec::with_capacity(defaults.len());
    for id in &directive.prefer {
        for c in defaults.iter().filter(|c| &c.provider.id == id) {
            if !ordered.contains(c) {
                ordered.push(c.clone());
            }
        }
    }
    if directive.allow_fallbacks {
        for c in defaults {
            if !ordered.contains(&c) {
                ordered.push(c);
            }
        }
    } else if directive.prefer.is_empty() {
        ordered.extend(defaults.into_iter().take(1));
    }
    ordered.retain(|c| c.provider.credential.is_some());
    ordered
}

/// How many providers one request may try: the request's value wins over
/// the plugin setting.
pub fn max_tries(config: &Config, directive: &Directive) -> usize {
    let tries = directive.max_provider_tries.unwrap_or(config.max_provider_tries);
    usize::try_from(tries).unwrap_or(usize::MAX)
}

/// The 503 for an empty plan. `keyless` names providers that would serve
/// the model but have no credential configured (an unset `api_key_env`).
pub fn no_provider(model: &str, keyless: &[String]) -> ApiError {
    let message = if keyless.is_empty() {
        format!("No provider is available for '{model}' under this request's routing rules.")
    } else {
        format!(
            "No provider is available for '{model}': {} has no API key configured on this gateway.",
            keyless.join(", ")
        )
    };
    ApiError::new(503, ErrorType::Upstream, "no_provider_available", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> Config {
        let json = br#"{"providers":[
            {"id":"openai","api":"openai","cluster":"o","authority":"o","api_key":"k"},
            {"id":"groq","api":"openai","cluster":"g","authority":"g","api_key":"k"},
            {"id":"together","api":"openai","cluster":"t","authority":"t","api_key":"k"},
            {"id":"nokey","api":"openai","cluster":"n","authority":"n","api_key_env":"UNSET"}],
          "models":[{"id":"meta-llama/llama-3.1-70b","endpoints":[
            {"provider":"groq","model":"llama-g"},{"provider":"together","model":"llama-t"},
            {"provider":"nokey","model":"llama-n"}]}]}"#;
        Config::parse(json, &|_| None).unwrap()
    }

    fn ids(plan: &[Candidate]) -> Vec<String> {
        plan.iter().map(|x| x.provider.id.clone()).collect()
    }

    fn directive(c: &Config, v: Value) -> Result<Directive, ApiError> {
        parse_directive(c, v.as_object().unwrap().get(&c.routing_field))
    }

    #[test]
    fn bare_ids_and_patterns_resolve_as_claude_code_names_them() {
        let json = br#"{"providers":[
            {"id":"anthropic","api":"anthropic","cluster":"a","authority":"a","api_key":"k"},
            {"id":"openai","api":"openai","cluster":"o","authority":"o","api_key":"k"}],
          "models":[
            {"id":"claude-sonnet-4-5","endpoints":[{"provider":"anthropic","model":"claude-sonnet-4-5-20250929"},
                                                    {"provider":"openai","model":"gpt-5"}]},
            {"id":"claude-*","endpoints":[{"provider":"anthropic","model":"*"}]},
            {"id":"*","endpoints":[{"provider":"openai","model":"gpt-5-mini"}]}]}"#;
        let c = Config::parse(json, &|_| None).unwrap();
        let names = |model: &str| -> Vec<(String, String)> {
            let r = resolve(&c, model).unwrap().candidates;
            r.iter()
                .map(|x| (x.provider.id.clone(), x.upstream_model.clone()))
                .collect()
        };
        let pair = |p: &str, m: &str| (p.to_string(), m.to_string());
        // A plain entry first, though a pattern matches too.
        assert_eq!(
            names("claude-sonnet-4-5"),
            [pair("anthropic", "claude-sonnet-4-5-20250929"), pair("openai", "gpt-5")]
        );
        // The first pattern that matches, keeping the asked name.
        assert_eq!(names("claude-opus-5-5"), [pair("anthropic", "claude-opus-5-5")]);
        assert_eq!(names("haiku"), [pair("openai", "gpt-5-mini")]);
        // Before `<provider>/<model>`: a catch-all takes those too.
        assert_eq!(names("anthropic/x"), [pair("openai", "gpt-5-mini")]);
    }

    #[test]
    fn model_ids_resolve_by_list_then_prefix() {
        let c = config();
        let r = resolve(&c, "openai/gpt-4o/mini").unwrap().candidates;
        assert_eq!(
            (r[0].provider.id.as_str(), r[0].upstream_model.as_str()),
            ("openai", "gpt-4o/mini")
        );
        assert_eq!(resolve(&c, "meta-llama/llama-3.1-70b").unwrap().candidates.len(), 3);
        let e = resolve(&c, "gpt-4o").unwrap_err();
        assert_eq!((e.status, e.code.as_str()), (404, "model_not_found"));
        assert_eq!(resolve(&c, "mistral/large").unwrap_err().code, "model_not_found");
        let e = resolve(&c, "openai/").unwrap_err();
        assert_eq!(
            (e.status, e.code.as_str(), e.param.as_deref()),
            (400, "invalid_value", Some("model"))
        );
        assert_eq!(resolve(&c, "").unwrap_err().status, 400);
    }

    #[test]
    fn prefer_reorders_and_fallbacks_follow() {
        let c = config();
        let d = directive(&c, json!({"waygate":{"routing":{"prefer":["together"]}}})).unwrap();
        let p = plan(resolve(&c, "meta-llama/llama-3.1-70b").unwrap().candidates, &d);
        assert_eq!(ids(&p), ["together", "groq"], "nokey has no credential");
    }

    #[test]
    fn no_fallbacks_keeps_only_preferred_or_first() {
        let c = config();
        let d = directive(
            &c,
            json!({"waygate":{"routing":{"prefer":["together","openai"],"allow_fallbacks":false}}}),
        )
        .unwrap();
        let p = plan(resolve(&c, "meta-llama/llama-3.1-70b").unwrap().candidates, &d);
        assert_eq!(ids(&p), ["together"], "openai does not serve the model");
        let d = directive(&c, json!({"waygate":{"routing":{"allow_fallbacks":false}}})).unwrap();
        let p = plan(resolve(&c, "meta-llama/llama-3.1-70b").unwrap().candidates, &d);
        assert_eq!(ids(&p), ["groq"]);
    }

    #[test]
    fn the_request_bounds_tries_over_the_plugin_setting() {
        let c = config();
        let d = directive(&c, json!({"waygate":{"routing":{"max_provider_tries":1}}})).unwrap();
        assert_eq!(max_tries(&c, &d), 1);
        let d = directive(&c, json!({"waygate":{"routing":{"max_provider_tries":9}}})).unwrap();
        assert_eq!(max_tries(&c, &d), 9);
        let d = directive(&c, json!({})).unwrap();
        assert_eq!(max_tries(&c, &d), 3);
    }

    #[test]
    fn bad_directives_name_the_field() {
        let c = config();
        let e = |v: Value| {
            let e = directive(&c, v).unwrap_err();
            (e.status, e.code, e.param.unwrap())
        };
        assert_eq!(e(json!({"waygate": 1})), (400, "invalid_type".into(), "waygate".into()));
        assert_eq!(
            e(json!({"waygate":{"routing":{"max_provider_tries":0}}})),
            (400, "invalid_value".into(), "waygate.routing.max_provider_tries".into())
        );
        assert_eq!(
            e(json!({"waygate":{"routing":{"max_provider_tries":"2"}}})),
            (400, "invalid_type".into(), "waygate.routing.max_provider_tries".into())
        );
        assert_eq!(
            e(json!({"waygate":{"routing":{"prefer":["mystery"]}}})),
            (400, "invalid_value".into(), "waygate.routing.prefer.0".into())
        );
        assert_eq!(
            e(json!({"waygate":{"routing":{"allow_fallbacks":"yes"}}})),
            (400, "invalid_type".into(), "waygate.routing.allow_fallbacks".into())
        );
        assert_eq!(
            e(json!({"waygate":{"routing":{"order":[]}}})),
            (400, "unsupported_parameter".into(), "waygate.routing.order".into())
        );
    }

    /// A model served by two deployments of one priority (weights 3 and 1),
    /// a third as their fallback, and a provider with two credentials.
    fn spread_config(strategy: &str) -> Config {
        let json = format!(
            r#"{{"providers":[
            {{"id":"east","api":"openai","cluster":"e","authority":"e","api_key":"k"}},
            {{"id":"west","api":"openai","cluster":"w","authority":"w","credentials":[
                {{"id":"one","api_key":"k1","weight":1}},{{"id":"two","api_key":"k2","weight":4}}]}},
            {{"id":"spare","api":"openai","cluster":"s","authority":"s","api_key":"k"}}],
          "models":[{{"id":"m","strategy":"{strategy}","endpoints":[
            {{"provider":"east","model":"x","weight":3,"priority":0}},
            {{"provider":"west","model":"x","priority":0}},
            {{"provider":"spare","model":"x"}}]}}]}}"#
        );
        Config::parse(json.as_bytes(), &|_| None).unwrap()
    }

    fn order_of(c: &Config, draw: &mut dyn FnMut() -> u64, inflight: &mut dyn FnMut(&str) -> u64) -> String {
        let r = resolve(c, "m").unwrap();
        let spread = spread(r.candidates, r.strategy, draw, inflight);
        let names: Vec<String> = spread
            .iter()
            .map(|c| format!("{}.{}", c.provider.id, c.provider.credential_id))
            .collect();
        names.join(" ")
    }

    #[test]
    fn one_priority_shares_requests_by_weight_and_the_next_is_its_fallback() {
        let c = spread_config("weighted");
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut draw = move || {
            // xorshift64: a fixed sequence, so the counts are the same every run.
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..4000 {
            let order = order_of(&c, &mut draw, &mut |_| 0);
            assert!(order.ends_with("spare.0"), "{order}");
            // A provider's credentials stay together.
            assert!(
                order.contains("west.one west.two") || order.contains("west.two west.one"),
                "{order}"
            );
            *counts.entry(order).or_insert(0u32) += 1;
        }
        let first = |p: &str| -> u32 { counts.iter().filter(|(o, _)| o.starts_with(p)).map(|(_, n)| n).sum() };
        // east: 3 of 4; west: 1 of 4, its credential two 4 of 5 of that.
        // Binomial bounds at about four standard deviations.
        assert!((2890..3110).contains(&first("east.0")), "{counts:?}");
        assert!((700..900).contains(&first("west.two")), "{counts:?}");
        assert!((140..260).contains(&first("west.one")), "{counts:?}");
    }

    #[test]
    fn the_default_order_draws_nothing() {
        let c = config();
        let r = resolve(&c, "meta-llama/llama-3.1-70b").unwrap();
        let before = ids(&r.candidates);
        let spread = spread(r.candidates, r.strategy, &mut || panic!("no draw"), &mut |_| {
            panic!("no count")
        });
        assert_eq!(ids(&spread), before);
    }

    #[test]
    fn fewest_in_flight_goes_first_whatever_the_weights() {
        let c = spread_config("fewest_in_flight");
        let mut asked = Vec::new();
        let mut busy = |key: &str| {
            asked.push(key.to_string());
            if key.ends_with("#0") { 5 } else { 1 }
        };
        let order = order_of(&c, &mut || 0, &mut busy);
        assert!(order.starts_with("west."), "{order}");
        assert!(order.ends_with("east.0 spare.0"), "{order}");
        assert_eq!(asked, ["waygate.inflight.m#0", "waygate.inflight.m#1"]);
    }

    #[test]
    fn prefer_brings_every_credential_of_the_provider() {
        let c = spread_config("weighted");
        let d = directive(
            &c,
            json!({"waygate":{"routing":{"prefer":["west"],"allow_fallbacks":false}}}),
        )
        .unwrap();
        let p = plan(resolve(&c, "m").unwrap().candidates, &d);
        assert_eq!(ids(&p), ["west", "west"]);
    }
}
