//! The HCM's `x-request-id` for a request that came without one: a UUIDv4-shaped string,
//! its random bytes drawn from the OS in batches.

use std::cell::{Cell, RefCell};

/// Request ids drawn from the OS per `getrandom` call (Envoy's `RandomGeneratorImpl::uuid`
/// buffers its random bytes the same way): one syscall per 256 requests, not per request.
const IDS_PER_DRAW: usize = 256;

thread_local! {
    static REQUEST_IDS: Cell<u64> = const { Cell::new(0) };
    static RANDOM: RefCell<(Box<[u8; 16 * IDS_PER_DRAW]>, usize)> =
        RefCell::new((Box::new([0; 16 * IDS_PER_DRAW]), 16 * IDS_PER_DRAW));
}

/// 16 random bytes from this thread's buffer, refilled when used up; `None` when the OS
/// gives none (or the buffer is busy, which a worker never makes it).
fn random_16() -> Option<[u8; 16]> {
    RANDOM
        .try_with(|random| {
            let mut random = random.try_borrow_mut().ok()?;
            let (bytes, used) = &mut *random;
            if *used + 16 > bytes.len() {
                getrandom::fill(&mut bytes[..]).ok()?;
                *used = 0;
            }
            let out: [u8; 16] = bytes.get(*used..*used + 16)?.try_into().ok()?;
            *used += 16;
            Some(out)
        })
        .ok()
        .flatten()
}

/// A UUIDv4-shaped id, as the HCM's `x-request-id`.
pub fn new() -> String {
    let mut bytes = random_16().unwrap_or_else(|| {
        let n = REQUEST_IDS.with(|c| {
            c.set(c.get().wrapping_add(1));
            c.get()
        });
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&n.to_le_bytes());
        bytes
    });
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    // 8-4-4-4-12 hex digits, written straight out: formatting each byte was a
    // measurable share of the host's CPU per request.
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(36);
    for (i, b) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            id.push('-');
        }
        id.push(char::from(HEX[usize::from(b >> 4)]));
        id.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::new as request_id;

    #[test]
    fn request_ids_are_uuid_v4_strings() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| request_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            let groups: Vec<&str> = id.split('-').collect();
            let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
            assert_eq!(lengths, [8, 4, 4, 4, 12], "{id}");
            assert!(
                id.chars().all(|c| c == '-' || matches!(c, '0'..='9' | 'a'..='f')),
                "{id}"
            );
            assert!(groups[2].starts_with('4'), "version 4: {id}");
            assert!(
                matches!(groups[3].chars().next(), Some('8' | '9' | 'a' | 'b')),
                "variant: {id}"
            );
        }
    }
}
