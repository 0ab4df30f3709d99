//! Byte searches for the hot paths: every answer and stream event is
//! scanned for line ends and for each credential. Wasm has 64-bit integers
//! but no SIMD here, so these look at eight bytes per step: a word holds a
//! byte `b` when its XOR with `b` repeated in every lane has a zero lane.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// Whether any byte lane of `x` is zero.
fn has_zero(x: u64) -> bool {
    x.wrapping_sub(ONES) & !x & HIGHS != 0
}

/// How many leading bytes of `bytes` are whole words in which `hit` finds
/// nothing: the answer is at or after that offset.
fn clear_prefix(bytes: &[u8], hit: impl Fn(u64) -> bool) -> usize {
    let mut clear = 0usize;
    for word in bytes.chunks_exact(8) {
        let Ok(word) = <[u8; 8]>::try_from(word) else { break };
        if hit(u64::from_le_bytes(word)) {
            break;
        }
        clear = clear.saturating_add(8);
    }
    clear
}

/// The first `byte` in `bytes`.
pub fn position_of(bytes: &[u8], byte: u8) -> Option<usize> {
    let pattern = ONES.wrapping_mul(u64::from(byte));
    let clear = clear_prefix(bytes, |w| has_zero(w ^ pattern));
    let offset = bytes.get(clear..)?.iter().position(|b| *b == byte)?;
    Some(clear.saturating_add(offset))
}

/// The first byte of `bytes` that is `a` or `b`.
pub fn position_of_either(bytes: &[u8], a: u8, b: u8) -> Option<usize> {
    let (pa, pb) = (ONES.wrapping_mul(u64::from(a)), ONES.wrapping_mul(u64::from(b)));
    let clear = clear_prefix(bytes, |w| has_zero(w ^ pa) || has_zero(w ^ pb));
    let offset = bytes.get(clear..)?.iter().position(|x| *x == a || *x == b)?;
    Some(clear.saturating_add(offset))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn searches_agree_with_a_plain_scan_everywhere() {
        let hay: Vec<u8> = (0..75u32)
            .map(|i| [b'a', b'\n', 0xff, b'\r', 0, b'z'][(i * 7 % 11 % 6) as usize])
            .collect();
        for start in 0..hay.len() {
            let tail = &hay[start..];
            for byte in [b'a', b'\n', 0xff, b'\r', 0, b'z', b'q'] {
                assert_eq!(position_of(tail, byte), tail.iter().position(|x| *x == byte));
            }
            for (a, b) in [(b'\n', b'\r'), (0, 0xff), (b'q', b'z')] {
                assert_eq!(
                    position_of_either(tail, a, b),
                    tail.iter().position(|x| *x == a || *x == b)
                );
            }
        }
        assert_eq!(position_of(b"", b'a'), None);
    }
}
