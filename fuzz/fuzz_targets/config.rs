//! Plugin configuration parsing: deterministic, every refusal explained,
//! and an accepted configuration is internally consistent.

#![no_main]

use libfuzzer_sys::fuzz_target;
use waygate::config::Config;

fuzz_target!(|data: &[u8]| {
    let env = |name: &str| match name {
        "OPENAI_API_KEY" | "WAYGATE_FUZZ_SET" => Some("sk-from-env".to_string()),
        _ => None,
    };
    let first = Config::parse(data, &env);
    let second = Config::parse(data, &env);
    match (&first, &second) {
        (Ok(a), Ok(b)) => {
            assert_eq!(format!("{a:?}"), format!("{b:?}"), "parsing is deterministic");
            assert!((1..=100).contains(&a.max_provider_tries));
            assert!(a.max_request_bytes >= 1);
            assert!(a.base_path.starts_with('/') && !a.routing_field.is_empty());
            for (i, p) in a.providers.iter().enumerate() {
                assert!(!p.id.is_empty() && !p.cluster.is_empty() && !p.authority.is_empty());
                assert!(
                    a.providers.iter().skip(i + 1).all(|q| q.id != p.id),
                    "duplicate provider id {}",
                    p.id
                );
                assert!(a.provider(&p.id).is_some());
            }
            for m in &a.models {
                for e in &m.endpoints {
                    assert!(a.providers.contains(&e.provider), "endpoint names a provider");
                }
            }
        }
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "refusals are deterministic");
            assert!(
                !a.is_empty() && a.iter().all(|p| !p.is_empty()),
                "every refusal says why"
            );
        }
        _ => panic!("parsing is not deterministic"),
    }
});
