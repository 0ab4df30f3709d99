//! The table of limits this service enforces, derived from waygate's plugin configuration.
//!
//! The plugin configuration is the one source of truth: it is parsed by the filter's own
//! parser (`waygate::config`), so a configuration the filter refuses is refused here too,
//! and the numbers cannot drift between the filter and its rate limit service. Each key
//! with `requests_per_minute: N` gives a limit of N per 60 s on the descriptor entry
//! `waygate_key = <key id>`; each key with `tokens_per_minute: T` gives a limit of T per
//! 60 s on `waygate_tokens = <key id>`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use limitador::limit::{Expression, Limit, Predicate};
use waygate::config::Config;

/// The rate limit domain Envoy's filter must use; other domains are not ours.
pub const DOMAIN: &str = "waygate";

/// Every waygate limit counts per minute.
pub const WINDOW_SECONDS: u64 = 60;

/// What a limit counts, and so which descriptor entry key it answers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// `requests_per_minute`, on entry `waygate_key`.
    Requests,
    /// `tokens_per_minute`, on entry `waygate_tokens`.
    Tokens,
}

impl Kind {
    /// The descriptor entry key Envoy sends for this kind of limit.
    pub fn entry_key(self) -> &'static str {
        match self {
            Kind::Requests => "waygate_key",
            Kind::Tokens => "waygate_tokens",
        }
    }

    /// The kind a descriptor entry key names, if it is one of ours.
    pub fn from_entry_key(key: &str) -> Option<Kind> {
        match key {
            "waygate_key" => Some(Kind::Requests),
            "waygate_tokens" => Some(Kind::Tokens),
            _ => None,
        }
    }

    /// What is counted, for limit names and messages.
    pub fn unit(self) -> &'static str {
        match self {
            Kind::Requests => "requests",
            Kind::Tokens => "tokens",
        }
    }
}

/// One configured limit: `per_minute` of `kind` for the key `key_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLimit {
    pub kind: Kind,
    pub key_id: String,
    pub per_minute: u64,
}

impl KeyLimit {
    /// A stable, human-readable name: `waygate_key=team-a`. It names the counter in Redis
    /// and the limit in Envoy's `current_limit` and Limitador's metrics.
    pub fn name(&self) -> String {
        format!("{}={}", self.kind.entry_key(), self.key_id)
    }

    /// The Limitador condition that selects this limit: the request has a descriptor
    /// that is exactly the one entry `<entry key> = <key id>` (CEL list membership, map
    /// equality). Not `descriptors[0]...`: that would depend on the order Envoy's rate
    /// limit actions put the descriptors in. Not an `exists(d, ...)` macro: Limitador
    /// takes its bound `d` for an unset variable and never applies the limit.
    pub fn limitador_condition(&self) -> String {
        format!(
            "{{'{}': {}}} in descriptors",
            self.kind.entry_key(),
            cel_string(&self.key_id)
        )
    }

    /// This limit as Limitador's own type, namespace = [`DOMAIN`] (Limitador's namespace
    /// is the request's domain).
    fn to_limitador(&self) -> Result<Limit, String> {
        let condition = Predicate::parse(self.limitador_condition())
            .map_err(|e| format!("{}: cannot express as a Limitador condition: {e}", self.name()))?;
        let mut limit = Limit::with_id(
            self.name(),
            DOMAIN,
            self.per_minute,
            WINDOW_SECONDS,
            [condition],
            Vec::<Expression>::new(),
        );
        limit.set_name(self.name());
        Ok(limit)
    }
}

/// A CEL string literal for `value`: single-quoted, with the escapes CEL defines, so a
/// key id with a quote or a backslash cannot end the literal early.
fn cel_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\'' => out.push_str("\\'"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// A configured limit with Limitador's view of it.
#[derive(Debug)]
pub struct Entry {
    pub limit: KeyLimit,
    pub limitador: Arc<Limit>,
}

/// Every limit of one plugin configuration, in configuration order (requests before
/// tokens within a key), looked up by descriptor entry.
#[derive(Debug)]
pub struct LimitTable {
    limits: Vec<KeyLimit>,
    requests: HashMap<String, Entry>,
    tokens: HashMap<String, Entry>,
}

impl LimitTable {
    /// Reads and validates the plugin configuration at `path`: the JSON itself, or (a
    /// `.yaml` / `.yml` file) the Envoy bootstrap that carries it inline, so that the
    /// bootstrap Envoy runs is the one place a key's numbers are written.
    pub fn load(path: &Path) -> Result<LimitTable, Vec<String>> {
        let text = std::fs::read_to_string(path).map_err(|e| vec![format!("{}: {e}", path.display())])?;
        let is_yaml = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
        if is_yaml {
            let json = plugin_config_in_bootstrap(&text).map_err(|e| vec![e])?;
            return LimitTable::from_plugin_config(json.as_bytes());
        }
        LimitTable::from_plugin_config(text.as_bytes())
    }

    /// Builds the table from the plugin configuration JSON. Every problem the filter
    /// would refuse the configuration for is returned. Environment variables are not
    /// consulted: they only supply provider credentials, which limits do not need.
    pub fn from_plugin_config(json: &[u8]) -> Result<LimitTable, Vec<String>> {
        let config = Config::parse(json, &|_| None)?;
        let mut limits = Vec::new();
        for key in &config.keys {
            for (kind, per_minute) in [
                (Kind::Requests, key.requests_per_minute),
                (Kind::Tokens, key.tokens_per_minute),
            ] {
                if let Some(per_minute) = per_minute {
                    limits.push(KeyLimit {
                        kind,
                        key_id: key.id.clone(),
                        per_minute,
                    });
                }
            }
        }
        LimitTable::from_limits(limits)
    }

    /// Builds the table from a list of limits; a key id given twice for one kind is refused.
    pub fn from_limits(limits: Vec<KeyLimit>) -> Result<LimitTable, Vec<String>> {
        let mut table = LimitTable {
            limits: Vec::with_capacity(limits.len()),
            requests: HashMap::new(),
            tokens: HashMap::new(),
        };
        let mut problems = Vec::new();
        for limit in limits {
            match limit.to_limitador() {
                Ok(limitador) => {
                    let entry = Entry {
                        limit: limit.clone(),
                        limitador: Arc::new(limitador),
                    };
                    let by_id = match limit.kind {
                        Kind::Requests => &mut table.requests,
                        Kind::Tokens => &mut table.tokens,
                    };
                    if by_id.insert(limit.key_id.clone(), entry).is_some() {
                        problems.push(format!("{}: configured twice", limit.name()));
                    }
                    table.limits.push(limit);
                }
                Err(problem) => problems.push(problem),
            }
        }
        if problems.is_empty() { Ok(table) } else { Err(problems) }
    }

    /// The limits, in configuration order.
    pub fn limits(&self) -> &[KeyLimit] {
        &self.limits
    }

    /// The limit a descriptor entry selects, if one is configured.
    pub fn find(&self, kind: Kind, key_id: &str) -> Option<&Entry> {
        match kind {
            Kind::Requests => self.requests.get(key_id),
            Kind::Tokens => self.tokens.get(key_id),
        }
    }

    /// Limitador's view of every limit, in configuration order.
    pub fn limitador_limits(&self) -> impl Iterator<Item = &Arc<Limit>> {
        self.limits
            .iter()
            .filter_map(|l| self.find(l.kind, &l.key_id).map(|e| &e.limitador))
    }
}

/// The waygate filter's configuration in Envoy YAML: the string `configuration` of the one
/// wasm HTTP filter config (`envoy.extensions.filters.http.wasm.v3.Wasm`) with root id
/// `waygate` that is not the upstream role (`{"role": "upstream"}`), wherever it sits: an
/// Envoy bootstrap's listener, or an Istio `EnvoyFilter`'s patch (the file may hold several
/// YAML documents).
pub fn plugin_config_in_bootstrap(yaml: &str) -> Result<String, String> {
    let mut found = Vec::new();
    for document in serde_yaml::Deserializer::from_str(yaml) {
        let doc = serde_yaml::Value::deserialize(document).map_err(|e| format!("not Envoy YAML: {e}"))?;
        collect_plugin_configs(&doc, &mut found);
    }
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => {
            Err("no waygate filter (a wasm HTTP filter config with root_id waygate and a string configuration)".into())
        }
        _ => Err(format!("{} waygate filter configs; expected one", found.len())),
    }
}

fn collect_plugin_configs(value: &serde_yaml::Value, found: &mut Vec<String>) {
    const WASM: &str = "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm";
    match value {
        serde_yaml::Value::Mapping(map) => {
            let config = map.get("config");
            let is_waygate = map.get("@type").and_then(serde_yaml::Value::as_str) == Some(WASM)
                && config
                    .and_then(|c| c.get("root_id"))
                    .and_then(serde_yaml::Value::as_str)
                    == Some("waygate");
            let text = config
                .and_then(|c| c.get("configuration"))
                .and_then(|c| c.get("value"))
                .and_then(serde_yaml::Value::as_str);
            if let (true, Some(text)) = (is_waygate, text) {
                if !Config::is_upstream_role(text.as_bytes()) {
                    found.push(text.to_owned());
                }
                return;
            }
            map.values().for_each(|v| collect_plugin_configs(v, found));
        }
        serde_yaml::Value::Sequence(items) => items.iter().for_each(|v| collect_plugin_configs(v, found)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_envoy_yaml_gateways_run_is_a_source_of_the_limits() {
        let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../envoy/envoy.yaml")).unwrap();
        let json = plugin_config_in_bootstrap(&yaml).unwrap();
        let config = Config::parse(json.as_bytes(), &|_| None).unwrap();
        assert!(config.keys.iter().any(|k| k.id == "dev"), "{json}");
        let table = LimitTable::load(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../envoy/envoy.yaml"))).unwrap();
        assert_eq!(
            table.limits().len(),
            config
                .keys
                .iter()
                .map(|k| usize::from(k.requests_per_minute.is_some()) + usize::from(k.tokens_per_minute.is_some()))
                .sum::<usize>()
        );
        assert!(!table.limits().is_empty(), "envoy/envoy.yaml limits its dev key");

        let none = "static_resources: {listeners: []}";
        assert!(
            plugin_config_in_bootstrap(none)
                .unwrap_err()
                .contains("no waygate filter")
        );
        assert!(plugin_config_in_bootstrap("[").unwrap_err().contains("not Envoy YAML"));
        // The Istio install: an EnvoyFilter, whose plugin configuration is a patch's value.
        let istio = concat!(env!("CARGO_MANIFEST_DIR"), "/../envoy/istio/waygate-filter.yaml");
        let json = plugin_config_in_bootstrap(&std::fs::read_to_string(istio).unwrap()).unwrap();
        let config = Config::parse(json.as_bytes(), &|_| None).unwrap();
        assert!(config.keys.iter().any(|k| k.requests_per_minute.is_some()), "{json}");
        // Two waygate filters (two listeners) are ambiguous.
        let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../envoy/envoy.yaml")).unwrap();
        let twice = format!("{yaml}\n---\n{yaml}");
        assert!(
            plugin_config_in_bootstrap(&twice)
                .unwrap_err()
                .contains("2 waygate filter configs")
        );
    }

    pub(crate) fn digest(n: u8) -> String {
        format!("{n:02x}").repeat(32)
    }

    #[test]
    fn each_configured_number_becomes_one_limit() {
        let json = format!(
            r#"{{"keys":[
              {{"id":"team-a","sha256":"{}","requests_per_minute":600,"tokens_per_minute":200000}},
              {{"id":"team-b","sha256":"{}","tokens_per_minute":5.0}},
              {{"id":"free","sha256":"{}"}}]}}"#,
            digest(1),
            digest(2),
            digest(3)
        );
        let table = LimitTable::from_plugin_config(json.as_bytes()).unwrap();
        let got: Vec<(Kind, &str, u64)> = table
            .limits()
            .iter()
            .map(|l| (l.kind, l.key_id.as_str(), l.per_minute))
            .collect();
        assert_eq!(
            got,
            vec![
                (Kind::Requests, "team-a", 600),
                (Kind::Tokens, "team-a", 200_000),
                (Kind::Tokens, "team-b", 5),
            ]
        );
        assert!(table.find(Kind::Requests, "team-b").is_none());
        assert!(table.find(Kind::Requests, "free").is_none());
        let limit = &table.find(Kind::Tokens, "team-a").unwrap().limitador;
        assert_eq!((limit.max_value(), limit.seconds()), (200_000, 60));
        assert_eq!(limit.namespace().as_ref(), "waygate");
        assert_eq!(table.limitador_limits().count(), 3);
    }

    #[test]
    fn a_configuration_the_filter_refuses_is_refused() {
        let json = format!(
            r#"{{"keys":[{{"id":"a","sha256":"{}","requests_per_minute":0}}],"unknown":1}}"#,
            digest(1)
        );
        let problems = LimitTable::from_plugin_config(json.as_bytes()).unwrap_err();
        assert!(problems.iter().any(|p| p.contains("unknown")), "{problems:?}");
    }

    #[test]
    fn entry_keys_round_trip() {
        for kind in [Kind::Requests, Kind::Tokens] {
            assert_eq!(Kind::from_entry_key(kind.entry_key()), Some(kind));
        }
        assert_eq!(Kind::from_entry_key("generic_key"), None);
    }

    #[test]
    fn key_ids_are_escaped_in_cel() {
        assert_eq!(cel_string(r"it's a \ key"), r"'it\'s a \\ key'");
        assert_eq!(cel_string("a\u{1}b"), r"'a\u0001b'");
    }
}
