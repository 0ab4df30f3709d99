//! Route selection as Envoy's `RouteMatcher` does it (`source/common/router/config_impl.cc`):
//! the virtual host by `:authority` against `domains` (exact, then `*.suffix` longest
//! first, then `prefix.*` longest first, then `*`; case-insensitive; the port is part of
//! the host), then the first route whose path rule and header matchers all hold.
//! `match.path` compares the path without its query string, `match.prefix` the start of
//! `:path`; a header matcher compares the header's values joined with `,`.
//!
//! It runs on the CURRENT headers when the router sees them, i.e. after the plugin changed
//! them: Envoy clears the route cache on every header mutation for ABI 0.2.1
//! (`onHeadersModified`), so the router re-matches.

use std::sync::Arc;

use crate::config::{PathMatch, Route, RouteConfig, VirtualHost};
use crate::stream::headers::Headers;

/// The matched virtual host and route.
pub struct Matched<'a> {
    pub virtual_host: &'a VirtualHost,
    pub route: Arc<Route>,
}

pub fn select<'a>(config: &'a RouteConfig, headers: &Headers) -> Option<Matched<'a>> {
    let authority = headers
        .first(":authority")
        .map(|a| String::from_utf8_lossy(a).to_ascii_lowercase())
        .unwrap_or_default();
    let virtual_host = virtual_host(config, &authority)?;
    let path = headers.first(":path").unwrap_or(b"/");
    virtual_host
        .routes
        .iter()
        .find(|route| matches(route, path, headers))
        .map(|route| Matched {
            virtual_host,
            route: Arc::clone(route),
        })
}

fn virtual_host<'a>(config: &'a RouteConfig, host: &str) -> Option<&'a VirtualHost> {
    let mut best: Option<(u8, usize, &VirtualHost)> = None;
    for vh in &config.virtual_hosts {
        for domain in &vh.domains {
            let rank = if domain == host {
                Some((3, domain.len()))
            } else if domain == "*" {
                Some((0, 0))
            } else if let Some(suffix) = domain.strip_prefix('*') {
                (host.ends_with(suffix) && host.len() > suffix.len()).then_some((2, domain.len()))
            } else if let Some(prefix) = domain.strip_suffix('*') {
                (host.starts_with(prefix) && host.len() > prefix.len()).then_some((1, domain.len()))
            } else {
                None
            };
            if let Some((class, len)) = rank
                && best.is_none_or(|(bc, bl, _)| (class, len) > (bc, bl))
            {
                best = Some((class, len, vh));
            }
        }
    }
    best.map(|(_, _, vh)| vh)
}

fn matches(route: &Route, path: &[u8], headers: &Headers) -> bool {
    let path_ok = match &route.path {
        PathMatch::Prefix(prefix) => path.starts_with(prefix.as_bytes()),
        PathMatch::Path(exact) => {
            let without_query = path.split(|b| *b == b'?').next().unwrap_or(path);
            without_query == exact.as_bytes()
        }
    };
    path_ok
        && route.headers.iter().all(|(name, exact)| {
            let values: Vec<&[u8]> = headers.all(name).collect();
            !values.is_empty() && values.join(&b","[..]) == exact.as_bytes()
        })
}
