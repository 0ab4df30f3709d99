//! `proxy_get_property` paths, as Envoy resolves them (context.cc `getProperty`/
//! `findValue`, docs `arch_overview/advanced/attributes.rst`).
//!
//! Values: strings raw, ints 8 bytes little-endian, bools 1 byte, timestamps i64
//! nanoseconds, maps in the proxy-wasm pair serialisation. The header-derived `request.*`
//! attributes resolve only while the request headers are held or in `on_log` (Envoy builds
//! them from a pointer cleared on Continue); `response.code_details` is `via_upstream`
//! only for upstream answers. `plugin_name`, `plugin_root_id` and `plugin_vm_id` are
//! answered by the crate. Anything else is `NotFound`.

use std::net::SocketAddr;

use super::headers::Headers;

#[derive(Debug, Clone, Default)]
pub struct Props {
    pub route_name: Option<String>,
    pub cluster_name: Option<String>,
    pub response_code: Option<u16>,
    pub code_details: Option<String>,
    pub source: Option<SocketAddr>,
    pub destination: Option<SocketAddr>,
    pub connection_id: u64,
    pub start_time_nanos: i64,
}

/// Writes the value of `path` into `out`; false when the path is not an attribute.
pub fn lookup(
    props: &Props,
    request: Option<&Headers>,
    response: Option<&Headers>,
    path: &[&[u8]],
    out: &mut Vec<u8>,
) -> bool {
    let segments: Vec<&str> = path
        .iter()
        .map(|s| std::str::from_utf8(s).unwrap_or("\u{fffd}"))
        .collect();
    let string = |out: &mut Vec<u8>, s: &[u8]| {
        out.extend_from_slice(s);
        true
    };
    let int = |out: &mut Vec<u8>, v: i64| {
        out.extend_from_slice(&v.to_le_bytes());
        true
    };
    match segments.as_slice() {
        ["request", "time"] => int(out, props.start_time_nanos),
        ["request", "protocol"] => string(out, b"HTTP/1.1"),
        ["request", attribute] => {
            let Some(headers) = request else {
                return false;
            };
            request_attribute(headers, attribute, out)
        }
        ["request", "headers", name] => {
            let Some(headers) = request else {
                return false;
            };
            joined(headers, name, out)
        }
        ["response", "code"] => props.response_code.is_some_and(|c| int(out, i64::from(c))),
        ["response", "code_details"] => props.code_details.as_deref().is_some_and(|d| string(out, d.as_bytes())),
        ["response", "flags"] => props.response_code.is_some() && int(out, 0),
        ["response", "headers"] => response.is_some_and(|h| {
            serialize_joined(h, out);
            true
        }),
        ["response", "headers", name] => response.is_some_and(|h| joined(h, name, out)),
        ["xds", "route_name"] => props.route_name.as_deref().is_some_and(|n| string(out, n.as_bytes())),
        ["xds", "cluster_name"] => props.cluster_name.as_deref().is_some_and(|n| string(out, n.as_bytes())),
        ["source", "address"] => props.source.is_some_and(|a| string(out, a.to_string().as_bytes())),
        ["source", "port"] => props.source.is_some_and(|a| int(out, i64::from(a.port()))),
        ["destination", "address"] => props.destination.is_some_and(|a| string(out, a.to_string().as_bytes())),
        ["destination", "port"] => props.destination.is_some_and(|a| int(out, i64::from(a.port()))),
        ["connection", "id"] => int(out, props.connection_id.cast_signed()),
        ["connection", "mtls"] => {
            out.push(0);
            true
        }
        _ => false,
    }
}

fn request_attribute(headers: &Headers, attribute: &str, out: &mut Vec<u8>) -> bool {
    let mut put = |value: Option<&[u8]>| match value {
        Some(v) => {
            out.extend_from_slice(v);
            true
        }
        None => false,
    };
    let path = headers.first(":path");
    match attribute {
        "path" => put(path),
        "url_path" => put(path.map(|p| p.split(|b| *b == b'?').next().unwrap_or(p))),
        "query" => put(Some(
            path.and_then(|p| p.iter().position(|b| *b == b'?').and_then(|i| p.get(i + 1..)))
                .unwrap_or(b""),
        )),
        "host" => put(headers.first(":authority")),
        "scheme" => put(headers.first(":scheme")),
        "method" => put(headers.first(":method")),
        "referer" => put(headers.first("referer")),
        "useragent" => put(headers.first("user-agent")),
        "id" => put(headers.first("x-request-id")),
        "headers" => {
            serialize_joined(headers, out);
            true
        }
        _ => false,
    }
}

/// One header's values joined with `,` (Envoy's CEL header lookup).
fn joined(headers: &Headers, name: &str, out: &mut Vec<u8>) -> bool {
    let values: Vec<&[u8]> = headers.all(&name.to_ascii_lowercase()).collect();
    if values.is_empty() {
        return false;
    }
    out.extend_from_slice(&values.join(&b","[..]));
    true
}

/// The proxy-wasm pair serialisation, one entry per name with values comma-joined.
fn serialize_joined(headers: &Headers, out: &mut Vec<u8>) {
    let mut merged: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for (k, v) in headers.pairs() {
        match merged.iter_mut().find(|(mk, _)| mk == k) {
            Some((_, mv)) => {
                mv.push(b',');
                mv.extend_from_slice(v);
            }
            None => merged.push((k.clone(), v.clone())),
        }
    }
    let count = u32::try_from(merged.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    for (k, v) in &merged {
        out.extend_from_slice(&u32::try_from(k.len()).unwrap_or(u32::MAX).to_le_bytes());
        out.extend_from_slice(&u32::try_from(v.len()).unwrap_or(u32::MAX).to_le_bytes());
    }
    for (k, v) in &merged {
        out.extend_from_slice(k);
        out.push(0);
        out.extend_from_slice(v);
        out.push(0);
    }
}
