//! Response ids: a prefix (`chatcmpl_`, `cmpl_`) and 24 random alphanumerics.

use std::cell::RefCell;

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const LEN: usize = 24;

/// Ids drawn per `random_get`: the call leaves the VM (and on Linux hosts that do not
/// buffer, makes a syscall), so it is made once per 64 ids rather than per id. Envoy's
/// own request ids are drawn from a buffer the same way.
const IDS_PER_DRAW: usize = 64;

/// Random bytes fetched ahead, and how many of them are used.
struct Drawn {
    bytes: [u8; LEN * IDS_PER_DRAW],
    used: usize,
}

thread_local! {
    static DRAWN: RefCell<Drawn> = const {
        RefCell::new(Drawn { bytes: [0; LEN * IDS_PER_DRAW], used: LEN * IDS_PER_DRAW })
    };
}

/// The next `LEN` random bytes, refilling the buffer from the host when it is used up.
fn random_bytes() -> Option<[u8; LEN]> {
    DRAWN
        .try_with(|drawn| {
            let mut drawn = drawn.try_borrow_mut().ok()?;
            let Drawn { bytes, used } = &mut *drawn;
            if *used + LEN > bytes.len() {
                getrandom::fill(&mut bytes[..]).ok()?;
                *used = 0;
            }
            let raw: [u8; LEN] = bytes.get(*used..*used + LEN)?.try_into().ok()?;
            *used += LEN;
            Some(raw)
        })
        .ok()
        .flatten()
}

/// A random number for routing's weighted draws (`routing::spread`), from
/// the same buffer as the ids.
pub fn random_u64() -> u64 {
    let raw = random_bytes().unwrap_or_default();
    raw.iter().take(8).fold(0u64, |n, b| (n << 8) | u64::from(*b))
}

/// A fresh id with `prefix`. Randomness comes from the host (`random_get`);
/// should it ever fail, a counter mixed into the buffer still keeps ids unique
/// within this VM rather than failing the request.
pub fn new_id(prefix: &str) -> String {
    let raw = random_bytes().unwrap_or_else(|| {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
        let n = COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        let mut raw = [0u8; LEN];
        for (i, b) in raw.iter_mut().enumerate() {
            *b = (n.rotate_left((i as u32 * 7) % 64) & 0xff) as u8;
        }
        raw
    });
    let mut id = String::with_capacity(prefix.len() + LEN);
    id.push_str(prefix);
    for b in raw {
        // 62 does not divide 256; the slight bias does not matter for an id.
        let c = ALPHABET.get(usize::from(b) % ALPHABET.len()).copied().unwrap_or(b'0');
        id.push(char::from(c));
    }
    id
}

#[cfg(test)]
mod tests {
    use super::new_id;

    #[test]
    fn ids_have_the_prefix_and_24_alphanumerics() {
        let id = new_id("chatcmpl_");
        let rest = id.strip_prefix("chatcmpl_").unwrap();
        assert_eq!(rest.len(), 24);
        assert!(rest.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_ne!(new_id("cmpl_"), new_id("cmpl_"));
    }

    #[test]
    fn ids_stay_distinct_across_many_refills_of_the_drawn_bytes() {
        let ids: std::collections::HashSet<String> = (0..10 * super::IDS_PER_DRAW).map(|_| new_id("x_")).collect();
        assert_eq!(ids.len(), 10 * super::IDS_PER_DRAW);
    }
}
