//! Byte searches for the hot paths: every answer and stream event is
//! scanned for line ends and for each credential. Wasm has 64-bit integers
//! but no SIMD here, so these look at eight bytes per step: a word holds a
//! byte `b` when its XOR with `b` repeated in every lane has a zero lane.

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The zero byte lanes of `x`, as each lane's high bit. Only the lowest set
/// bit is exact (a borrow can flag lanes above a zero one), and the lowest
/// is all a search needs.
fn zero_lanes(x: u64) -> u64 {
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// The lanes of `x` below `n` (`n` at most 0x80), lowest exact as above.
fn lanes_below(x: u64, n: u8) -> u64 {
    x.wrapping_sub(ONES.wrapping_mul(u64::from(n))) & !x & HIGHS
}

/// The first byte `hit` accepts: two words per step through `lanes`
/// (which flags the same bytes), then one, then the tail byte by byte. Two
/// words share one bounds check and one branch: in wasm, where every
/// operator counts, the loop's bookkeeping cost as much as the test.
#[inline(always)]
fn first(bytes: &[u8], lanes: impl Fn(u64) -> u64, hit: impl Fn(u8) -> bool) -> Option<usize> {
    let word = |at: usize| {
        bytes
            .get(at..at.wrapping_add(8))
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_le_bytes)
    };
    // Little-endian: the first byte is the lowest lane.
    let lane = |flagged: u64| (flagged.trailing_zeros() / 8) as usize;
    let mut at = 0usize;
    while let Some(pair) = bytes
        .get(at..at.wrapping_add(16))
        .and_then(|w| <[u8; 16]>::try_from(w).ok())
        .map(u128::from_le_bytes)
    {
        // Truncation keeps the low word.
        let (low, high) = (lanes(pair as u64), lanes((pair >> 64) as u64));
        if low | high != 0 {
            return Some(if low != 0 {
                at.wrapping_add(lane(low))
            } else {
                at.wrapping_add(8).wrapping_add(lane(high))
            });
        }
        at = at.wrapping_add(16);
    }
    if let Some(w) = word(at) {
        let flagged = lanes(w);
        if flagged != 0 {
            return Some(at.wrapping_add(lane(flagged)));
        }
        at = at.wrapping_add(8);
    }
    let offset = bytes.get(at..)?.iter().position(|b| hit(*b))?;
    Some(at.wrapping_add(offset))
}

/// The first `byte` in `bytes`.
pub fn position_of(bytes: &[u8], byte: u8) -> Option<usize> {
    let pattern = ONES.wrapping_mul(u64::from(byte));
    first(bytes, |w| zero_lanes(w ^ pattern), |b| b == byte)
}

/// The first byte of `bytes` below `n` (`n` at most 0x80): one test per
/// word where a search for two bytes takes two.
pub fn position_below(bytes: &[u8], n: u8) -> Option<usize> {
    first(bytes, |w| lanes_below(w, n), |b| b < n)
}

/// Where the run of plain JSON string text starting at `at` ends: the index
/// of its first quote, backslash or control character (below 0x20, which
/// JSON forbids unescaped), or `bytes.len()`.
/// The JSON walk's inner loop ([`crate::split`]): inlined, with a plain index
/// for an answer, it keeps the position in a wasm local instead of the
/// stack a returned `Option<usize>` goes through.
#[inline(always)]
pub fn string_stop_from(bytes: &[u8], mut at: usize) -> usize {
    let (quote, backslash) = (ONES.wrapping_mul(u64::from(b'"')), ONES.wrapping_mul(u64::from(b'\\')));
    while let Some(word) = bytes
        .get(at..at.wrapping_add(8))
        .and_then(|w| <[u8; 8]>::try_from(w).ok())
    {
        let w = u64::from_le_bytes(word);
        let flagged = zero_lanes(w ^ quote) | zero_lanes(w ^ backslash) | lanes_below(w, 0x20);
        if flagged != 0 {
            return at.wrapping_add((flagged.trailing_zeros() / 8) as usize);
        }
        at = at.wrapping_add(8);
    }
    while let Some(&b) = bytes.get(at) {
        if b == b'"' || b == b'\\' || b < 0x20 {
            return at;
        }
        at = at.wrapping_add(1);
    }
    at
}

/// Whether `bytes` starts with `prefix`, compared a word at a time (wasm's
/// `memcmp` from wasi-libc goes byte by byte).
pub fn starts_with(bytes: &[u8], prefix: &[u8]) -> bool {
    let Some(head) = bytes.get(..prefix.len()) else {
        return false;
    };
    let (mut a, mut b) = (head.chunks_exact(8), prefix.chunks_exact(8));
    let word = |w: &[u8]| <[u8; 8]>::try_from(w).map(u64::from_ne_bytes).ok();
    for (x, y) in (&mut a).zip(&mut b) {
        if word(x) != word(y) {
            return false;
        }
    }
    a.remainder().iter().eq(b.remainder())
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
        }
        assert_eq!(position_of(b"", b'a'), None);
        for start in 0..hay.len() {
            let tail = &hay[start..];
            for n in [1, 0x0e, 0x20, 0x80] {
                assert_eq!(position_below(tail, n), tail.iter().position(|b| *b < n), "{n}");
            }
        }
        let text: Vec<u8> = (0..75u32)
            .map(|i| [b'a', b'"', 0x1f, b'\\', 0x20, 0xff, 0x80, 0][(i * 7 % 13 % 8) as usize])
            .collect();
        for start in 0..text.len() {
            let tail = &text[start..];
            let plain = tail.iter().position(|b| *b == b'"' || *b == b'\\' || *b < 0x20);
            assert_eq!(string_stop_from(&text, start), plain.map_or(text.len(), |p| start + p));
            let letters = vec![b'x'; tail.len()];
            assert_eq!(string_stop_from(&letters, 0), letters.len());
        }
    }
}
