//! The only code that calls the host. Each proxy-wasm ABI import the filter
//! needs is declared here with plain integer types and wrapped so that any
//! status comes back as an `Err`, never a trap.
//!
//! Why not the SDK's `hostcalls::*`: in proxy-wasm 0.2.5 they `panic!` on
//! any status they do not expect (a `BadArgument` when a map is no longer
//! available, for one), and the map getters unwrap UTF-8, so one non-UTF-8
//! byte in a client header would trap the worker's VM.

#![allow(unsafe_code)]

use std::ptr::null_mut;

/// A status other than `Ok` from the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status(pub u32);

const OK: u32 = 0;

/// A header name and value, as raw bytes.
pub type Pair = (Vec<u8>, Vec<u8>);

#[derive(Clone, Copy)]
/// Header maps, by their ABI number.
pub enum Map {
    Request = 0,
    Response = 2,
    CallResponse = 6,
}

#[derive(Clone, Copy)]
pub enum Buffer {
    RequestBody = 0,
    ResponseBody = 1,
    CallResponseBody = 4,
    PluginConfiguration = 7,
}

// The SDK declares the same imports with its own enum types; integers here
// keep an unexpected status from ever becoming an invalid enum value.
#[allow(clashing_extern_declarations)]
#[link(wasm_import_module = "env")]
unsafe extern "C" {
    fn proxy_get_header_map_pairs(map: u32, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_len: usize) -> u32;
    fn proxy_get_buffer_bytes(buffer: u32, start: usize, max: usize, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_set_buffer_bytes(buffer: u32, start: usize, size: usize, data: *const u8, len: usize) -> u32;
    fn proxy_get_property(path: *const u8, path_len: usize, data: *mut *mut u8, size: *mut usize) -> u32;
    fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
    fn proxy_close_stream(stream_type: u32) -> u32;
    fn proxy_log(level: u32, message: *const u8, message_len: usize) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_len: usize, id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
    fn proxy_set_property(path: *const u8, path_len: usize, value: *const u8, value_len: usize) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_len: usize,
        data: *mut *mut u8,
        size: *mut usize,
        cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(key: *const u8, key_len: usize, value: *const u8, value_len: usize, cas: u32) -> u32;
    #[allow(clippy::too_many_arguments)]
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_len: usize,
        body: *const u8,
        body_len: usize,
        headers: *const u8,
        headers_len: usize,
        grpc_status: i32,
    ) -> u32;
}

fn check(status: u32) -> Result<(), Status> {
    if status == OK { Ok(()) } else { Err(Status(status)) }
}

/// Takes ownership of a buffer the host allocated through
/// `proxy_on_memory_allocate` (exported by the SDK, which hands out
/// `Vec<u8>` allocations of exactly `size` bytes).
fn take(data: *mut u8, size: usize) -> Vec<u8> {
    if data.is_null() || size == 0 {
        return Vec::new();
    }
    // SAFETY: the host wrote `size` bytes into memory it obtained from our
    // allocator for exactly `size` bytes, and gave up ownership of it.
    unsafe { Vec::from_raw_parts(data, size, size) }
}

/// Every pair of a header map, as raw bytes (no UTF-8 assumption).
pub fn header_pairs(map: Map) -> Result<Vec<Pair>, Status> {
    let map = header_map(map)?;
    Ok(map.pairs().into_iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect())
}

/// The `:status` of a response header map; 0 when absent or not a number.
pub fn status(map: Map) -> u16 {
    header_map(map)
        .ok()
        .and_then(|map| {
            let (_, v) = map.pairs().into_iter().find(|(k, _)| *k == b":status")?;
            std::str::from_utf8(v).ok()?.parse().ok()
        })
        .unwrap_or(0)
}

/// A header map as the host serialised it; [`HeaderMap::pairs`] reads it
/// without copying each name and value (the hot paths' choice).
pub struct HeaderMap(Vec<u8>);

impl HeaderMap {
    /// Every name and value, borrowed, as raw bytes (no UTF-8 assumption).
    pub fn pairs(&self) -> Vec<(&[u8], &[u8])> {
        decode_pairs(&self.0)
    }
}

/// A header map, serialised; see [`HeaderMap`].
pub fn header_map(map: Map) -> Result<HeaderMap, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers to locals; the host fills them or leaves them.
    check(unsafe { proxy_get_header_map_pairs(map as u32, &mut data, &mut size) })?;
    Ok(HeaderMap(take(data, size)))
}

/// Replaces (or adds) one header.
pub fn set_header(map: Map, name: &str, value: &str) -> Result<(), Status> {
    // SAFETY: pointers and lengths of live slices.
    check(unsafe { proxy_replace_header_map_value(map as u32, name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

/// Removes every value of one header.
pub fn remove_header(map: Map, name: &str) -> Result<(), Status> {
    // SAFETY: pointer and length of a live slice.
    check(unsafe { proxy_remove_header_map_value(map as u32, name.as_ptr(), name.len()) })
}

/// Removes `remove`, then sets each of `set`: the order every rewrite is applied in.
pub fn edit_headers(map: Map, remove: &[String], set: &[(String, String)]) -> Result<(), Status> {
    remove.iter().try_for_each(|name| remove_header(map, name))?;
    set.iter().try_for_each(|(name, value)| set_header(map, name, value))
}

/// Reads `max` bytes of a buffer from `start`. An empty buffer reads as empty.
pub fn buffer(kind: Buffer, start: usize, max: usize) -> Result<Vec<u8>, Status> {
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: out-pointers to locals.
    check(unsafe { proxy_get_buffer_bytes(kind as u32, start, max, &mut data, &mut size) })?;
    Ok(take(data, size))
}

/// Envoy's `set_buffer_bytes`: `(0, len)` replaces everything.
pub fn set_buffer(kind: Buffer, start: usize, size: usize, bytes: &[u8]) -> Result<(), Status> {
    // SAFETY: pointer and length of a live slice.
    check(unsafe { proxy_set_buffer_bytes(kind as u32, start, size, bytes.as_ptr(), bytes.len()) })
}

/// A property such as `response.code_details`; `None` when absent.
pub fn property(path: &[&str]) -> Option<Vec<u8>> {
    let joined = path.join("\0");
    let mut data = null_mut();
    let mut size = 0usize;
    // SAFETY: pointer and length of a live string; out-pointers to locals.
    let status = unsafe { proxy_get_property(joined.as_ptr(), joined.len(), &mut data, &mut size) };
    let value = take(data, size);
    (status == OK).then_some(value)
}

/// Writes filter state `wasm.<name>` (Envoy's `set_property`), readable by
/// access logs as `%FILTER_STATE(wasm.<name>:PLAIN)%`.
pub fn set_property(name: &str, value: &[u8]) -> Result<(), Status> {
    // SAFETY: pointers and lengths of live slices.
    check(unsafe { proxy_set_property(name.as_ptr(), name.len(), value.as_ptr(), value.len()) })
}

const CAS_MISMATCH: u32 = 8;

/// FNV-1a: the metric-id cache is looked up about eight times per request
/// with names built from the configuration, so SipHash's resistance to
/// chosen keys buys nothing here and costs three times as much.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

type MetricIds = std::collections::HashMap<String, u32, std::hash::BuildHasherDefault<Fnv>>;

thread_local! {
    /// Metric ids of this VM, defined on first use.
    static METRICS: std::cell::RefCell<MetricIds> = Default::default();
}

/// Applies one stat change, defining the stat on first use. Envoy refuses a
/// counter increment of 0 and increments of histograms, so those are
/// recorded as samples and zero increments are never sent.
pub fn apply_metric(update: &crate::metrics::Update) -> Result<(), Status> {
    use crate::metrics::Kind;
    let kind = match update.kind {
        Kind::Counter => 0,
        Kind::Gauge => 1,
        Kind::Histogram => 2,
    };
    let known = METRICS.with(|m| m.borrow().get(&update.name).copied());
    let id = match known {
        Some(id) => id,
        None => {
            let mut id = 0u32;
            // SAFETY: pointer and length of a live string; out-pointer to a local.
            check(unsafe { proxy_define_metric(kind, update.name.as_ptr(), update.name.len(), &mut id) })?;
            METRICS.with(|m| m.borrow_mut().insert(update.name.clone(), id));
            id
        }
    };
    match update.kind {
        Kind::Counter if update.value == 0 => Ok(()),
        // SAFETY: plain integers.
        Kind::Counter => check(unsafe { proxy_increment_metric(id, i64::try_from(update.value).unwrap_or(i64::MAX)) }),
        // SAFETY: plain integers. Recording a gauge sets it.
        Kind::Gauge | Kind::Histogram => check(unsafe { proxy_record_metric(id, update.value) }),
    }
}

/// Proxy-wasm shared data: one map per `vm_id`, shared by every worker VM.
pub struct SharedData;

impl crate::limits::SharedStore for SharedData {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        let mut data = null_mut();
        let mut size = 0usize;
        let mut cas = 0u32;
        // SAFETY: pointer and length of a live string; out-pointers to locals.
        let status = unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas) };
        let value = take(data, size);
        (status == OK).then_some((value, cas))
    }

    fn set(&mut self, key: &str, value: &[u8], cas: u32) -> Result<(), crate::limits::StoreError> {
        // SAFETY: pointers and lengths of live slices.
        match unsafe { proxy_set_shared_data(key.as_ptr(), key.len(), value.as_ptr(), value.len(), cas) } {
            OK => Ok(()),
            CAS_MISMATCH => Err(crate::limits::StoreError::CasMismatch),
            _ => Err(crate::limits::StoreError::Other),
        }
    }
}

/// Writes one line to the host's log at info level, as it is: the access
/// line, which the `log` macros would format a second time.
pub fn log_info(line: &str) {
    const INFO: u32 = 2;
    // SAFETY: pointer and length of a live string. A refused line is lost,
    // as any log line would be.
    let _ = unsafe { proxy_log(INFO, line.as_ptr(), line.len()) };
}

/// Wall-clock time in nanoseconds since the Unix epoch (0 if unavailable).
pub fn now_nanos() -> u64 {
    let mut t = 0u64;
    // SAFETY: out-pointer to a local.
    match unsafe { proxy_get_current_time_nanoseconds(&mut t) } {
        OK => t,
        _ => 0,
    }
}

/// Resets the HTTP stream's response (ABI `proxy_close_stream`, Envoy resets
/// the stream once the current callback returns): for a live stream that
/// can no longer be rewritten, whose headers are already sent.
pub fn reset_response() -> Result<(), Status> {
    /// The ABI's `StreamType::HttpResponse`.
    const HTTP_RESPONSE: u32 = 1;
    // SAFETY: no pointers.
    check(unsafe { proxy_close_stream(HTTP_RESPONSE) })
}

/// Queues a local reply; Envoy sends it when the current callback returns.
pub fn send_local_response(status: u16, headers: &[(String, String)], body: &[u8]) -> Result<(), Status> {
    let encoded = encode_pairs(headers);
    // SAFETY: pointers and lengths of live buffers; an empty details string.
    check(unsafe {
        proxy_send_local_response(
            u32::from(status),
            std::ptr::null(),
            0,
            body.as_ptr(),
            body.len(),
            encoded.as_ptr(),
            encoded.len(),
            -1,
        )
    })
}

/// Decodes the ABI's map format: `u32 count`, `count × (u32 key_len, u32
/// value_len)`, then each key and value followed by a NUL. A malformed map
/// yields the pairs read so far rather than a trap.
fn decode_pairs(bytes: &[u8]) -> Vec<(&[u8], &[u8])> {
    let read_u32 = |at: usize| -> Option<usize> {
        let b = bytes.get(at..at.checked_add(4)?)?;
        let arr: [u8; 4] = b.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(arr)).ok()
    };
    let Some(count) = read_u32(0) else { return Vec::new() };
    let mut pairs = Vec::with_capacity(count.min(1024));
    let Some(mut p) = count.checked_mul(8).and_then(|n| n.checked_add(4)) else {
        return pairs;
    };
    for n in 0..count {
        let s = 4 + n * 8;
        let (Some(klen), Some(vlen)) = (read_u32(s), read_u32(s + 4)) else {
            break;
        };
        let key = bytes.get(p..p.saturating_add(klen));
        p = p.saturating_add(klen).saturating_add(1);
        let value = bytes.get(p..p.saturating_add(vlen));
        p = p.saturating_add(vlen).saturating_add(1);
        match (key, value) {
            (Some(k), Some(v)) => pairs.push((k, v)),
            _ => break,
        }
    }
    pairs
}

fn encode_pairs(pairs: &[(String, String)]) -> Vec<u8> {
    let len = |n: usize| u32::try_from(n).unwrap_or(u32::MAX).to_le_bytes();
    let mut out = Vec::new();
    out.extend_from_slice(&len(pairs.len()));
    for (k, v) in pairs {
        out.extend_from_slice(&len(k.len()));
        out.extend_from_slice(&len(v.len()));
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_bytes());
        out.push(0);
        out.extend_from_slice(v.as_bytes());
        out.push(0);
    }
    out
}
