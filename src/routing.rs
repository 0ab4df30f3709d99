//! Model resolution and candidate selection (contract §5).
//!
//! A model id resolves to an ordered list of candidates (provider + upstream
//! model). The per-request routing object then reorders (`prefer`), filters
//! (`allow_fallbacks`) and bounds (`max_provider_tries`) that list.

use std::rc::Rc;

use serde_json::Value;

use crate::config::{ASKED_MODEL, Config, Provider};
use crate::errors::{ApiError, ErrorType};
use crate::request::{bad_value, wrong_type};

/// One provider that may serve the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub provider: Rc<Provider>,
    pub upstream_model: String,
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
pub fn resolve(config: &Config, model: &str) -> Result<Vec<Candidate>, ApiError> {
    let entry = (config.models.iter().find(|m| m.pattern.is_none() && m.id == model))
        .or_else(|| (config.models.iter()).find(|m| m.pattern.as_ref().is_some_and(|p| p.matches(model))));
    if let Some(m) = entry {
        return Ok(m
            .endpoints
            .iter()
            .map(|e| Candidate {
                provider: Rc::clone(&e.provider),
                upstream_model: if e.model == ASKED_MODEL { model } else { &e.model }.to_string(),
            })
            .collect());
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
    match config.provider(prefix) {
        Some(provider) => Ok(vec![Candidate {
            provider: Rc::clone(provider),
            upstream_model: rest.to_string(),
        }]),
        None => Err(not_found()),
    }
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
        if let Some(c) = defaults.iter().find(|c| &c.provider.id == id)
            && !ordered.contains(c)
        {
            ordered.push(c.clone());
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
            let r = resolve(&c, model).unwrap();
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
        let r = resolve(&c, "openai/gpt-4o/mini").unwrap();
        assert_eq!(
            (r[0].provider.id.as_str(), r[0].upstream_model.as_str()),
            ("openai", "gpt-4o/mini")
        );
        assert_eq!(resolve(&c, "meta-llama/llama-3.1-70b").unwrap().len(), 3);
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
        let p = plan(resolve(&c, "meta-llama/llama-3.1-70b").unwrap(), &d);
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
        let p = plan(resolve(&c, "meta-llama/llama-3.1-70b").unwrap(), &d);
        assert_eq!(ids(&p), ["together"], "openai does not serve the model");
        let d = directive(&c, json!({"waygate":{"routing":{"allow_fallbacks":false}}})).unwrap();
        let p = plan(resolve(&c, "meta-llama/llama-3.1-70b").unwrap(), &d);
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
}
