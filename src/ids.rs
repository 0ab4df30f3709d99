//! Response ids: a prefix (`chatcmpl_`, `cmpl_`) and 24 random alphanumerics.

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const LEN: usize = 24;

/// A fresh id with `prefix`. Randomness comes from the host (`random_get`);
/// should it ever fail, a counter mixed into the buffer still keeps ids unique
/// within this VM rather than failing the request.
pub fn new_id(prefix: &str) -> String {
    let mut raw = [0u8; LEN];
    if getrandom::fill(&mut raw).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
        let n = COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
        for (i, b) in raw.iter_mut().enumerate() {
            *b = (n.rotate_left((i as u32 * 7) % 64) & 0xff) as u8;
        }
    }
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
}
