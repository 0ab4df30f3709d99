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

/// The index of the lowest flagged lane (little-endian: the first byte is
/// the lowest lane).
fn lane(flagged: u64) -> usize {
    (flagged.trailing_zeros() / 8) as usize
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

/// The first byte of `bytes` below `n` (`n` at most 0x80; one test per
/// word where a search for two bytes takes two), and whether every byte
/// before it (or every byte, when none is) is ASCII: the scan that finds a
/// line's end also answers whether the line needs a UTF-8 check, for two
/// operators a word more.
pub fn position_below_ascii(bytes: &[u8], n: u8) -> (Option<usize>, bool) {
    // The lanes below the one flagged, of a word with a flagged lane.
    let before = |flagged: u64| {
        flagged
            .trailing_zeros()
            .checked_sub(7)
            .map_or(0, |bits| (1u64 << bits) - 1)
    };
    let (mut at, mut seen) = (0usize, 0u64);
    while let Some(pair) = bytes
        .get(at..at.wrapping_add(16))
        .and_then(|w| <[u8; 16]>::try_from(w).ok())
        .map(u128::from_le_bytes)
    {
        let (low, high) = (pair as u64, (pair >> 64) as u64);
        let (low_flagged, high_flagged) = (lanes_below(low, n), lanes_below(high, n));
        if low_flagged | high_flagged != 0 {
            let (found, seen) = if low_flagged != 0 {
                (at.wrapping_add(lane(low_flagged)), seen | (low & before(low_flagged)))
            } else {
                (
                    at.wrapping_add(8).wrapping_add(lane(high_flagged)),
                    seen | low | (high & before(high_flagged)),
                )
            };
            return (Some(found), seen & HIGHS == 0);
        }
        seen |= low | high;
        at = at.wrapping_add(16);
    }
    // Under sixteen bytes left: a word, then the last word with the lanes
    // already seen shifted out. The zero lanes shifted in stand past the
    // end: a stop found there is no stop, and they are ASCII.
    let word = |at: usize| {
        bytes
            .get(at..at.wrapping_add(8))
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_le_bytes)
    };
    let last = bytes.len().wrapping_sub(8);
    loop {
        let w = match word(at) {
            Some(w) => w,
            None if at > last && at < bytes.len() => match word(last) {
                Some(w) => w >> (at.wrapping_sub(last) * 8),
                None => break,
            },
            None => break,
        };
        let flagged = lanes_below(w, n);
        if flagged != 0 {
            let found = at.wrapping_add(lane(flagged));
            let ascii = (seen | (w & before(flagged))) & HIGHS == 0;
            return ((found < bytes.len()).then_some(found), ascii);
        }
        seen |= w;
        at = at.wrapping_add(8);
    }
    // Only a text under eight bytes long is left to go byte by byte.
    let mut ascii = seen & HIGHS == 0;
    while let Some(&b) = bytes.get(at) {
        if b < n {
            return (Some(at), ascii);
        }
        ascii &= b.is_ascii();
        at = at.wrapping_add(1);
    }
    (None, ascii)
}

/// Where the run of plain JSON string text starting at `at` ends: the index
/// of its first quote, backslash or control character (below 0x20, which
/// JSON forbids unescaped), or `bytes.len()`.
/// The JSON walk's inner loop ([`crate::json::split`]): inlined, with a plain index
/// for an answer, it keeps the position in a wasm local instead of the
/// stack a returned `Option<usize>` goes through.
#[inline(always)]
pub fn string_stop_from(bytes: &[u8], mut at: usize) -> usize {
    let (quote, backslash) = (ONES.wrapping_mul(u64::from(b'"')), ONES.wrapping_mul(u64::from(b'\\')));
    let stops = |w: u64| zero_lanes(w ^ quote) | zero_lanes(w ^ backslash) | lanes_below(w, 0x20);
    let word = |at: usize| {
        bytes
            .get(at..at.wrapping_add(8))
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_le_bytes)
    };
    while let Some(w) = word(at) {
        let flagged = stops(w);
        if flagged != 0 {
            return at.wrapping_add(lane(flagged));
        }
        at = at.wrapping_add(8);
    }
    // Under eight bytes left: the text's last word, its lanes before `at`
    // shifted out. The zero lanes shifted in stand past the end and stop
    // the search there, so a stop in none of the real lanes gives the length.
    let last = bytes.len().wrapping_sub(8);
    if at > last
        && at < bytes.len()
        && let Some(w) = word(last)
    {
        let found = at.wrapping_add(lane(stops(w >> (at.wrapping_sub(last) * 8))));
        return found.min(bytes.len());
    }
    while let Some(&b) = bytes.get(at) {
        if b == b'"' || b == b'\\' || b < 0x20 {
            return at;
        }
        at = at.wrapping_add(1);
    }
    at
}

/// Whether `bytes` starts with `prefix`: [`same`] on its head.
pub fn starts_with(bytes: &[u8], prefix: &[u8]) -> bool {
    bytes.get(..prefix.len()).is_some_and(|head| same(head, prefix))
}

/// Whether `bytes` ends with `suffix`: [`same`] on its tail.
pub fn ends_with(bytes: &[u8], suffix: &[u8]) -> bool {
    bytes
        .len()
        .checked_sub(suffix.len())
        .and_then(|at| bytes.get(at..))
        .is_some_and(|tail| same(tail, suffix))
}

/// Whether `a` and `b` are the same bytes, compared a word at a time, the
/// last word overlapping the one before it rather than a tail byte by byte
/// (wasm's `memcmp` from wasi-libc goes byte by byte).
pub fn same(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        let half = |s: &[u8], at: usize| {
            s.get(at..at.wrapping_add(4))
                .and_then(|w| <[u8; 4]>::try_from(w).ok())
                .map(u32::from_ne_bytes)
        };
        if n >= 4 {
            let last = n.wrapping_sub(4);
            return half(a, 0) == half(b, 0) && half(a, last) == half(b, last);
        }
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    let word = |s: &[u8], at: usize| {
        s.get(at..at.wrapping_add(8))
            .and_then(|w| <[u8; 8]>::try_from(w).ok())
            .map(u64::from_ne_bytes)
    };
    let mut at = 0usize;
    while at.wrapping_add(8) < n {
        if word(a, at) != word(b, at) {
            return false;
        }
        at = at.wrapping_add(8);
    }
    let last = n.wrapping_sub(8);
    word(a, last) == word(b, last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_agrees_with_slice_equality_at_every_length_and_difference() {
        let a: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        for len in 0..=a.len() {
            let x = &a[..len];
            let ending = [b"0123456789".as_slice(), x].concat();
            assert!(same(x, x) && starts_with(&a, x) && ends_with(&ending, x), "{len}");
            for at in 0..len {
                let mut y = x.to_vec();
                y[at] ^= 0x20;
                assert!(
                    !same(x, &y) && !starts_with(&a, &y) && !ends_with(&ending, &y),
                    "{len} {at}"
                );
            }
            assert!(!same(x, &a[..len.saturating_sub(1)]) || len == 0);
        }
        assert!(!starts_with(b"ab", b"abc") && !ends_with(b"bc", b"abc"));
    }

    #[test]
    fn the_line_scan_tells_ascii_before_its_stop_at_every_offset_and_length() {
        // Long plain runs (the two-word steps) with a non-ASCII byte and a
        // line end here and there, each in every lane as offsets move.
        let mut hay = [b'x'; 90];
        for (at, b) in [
            (5, 0xc3),
            (6, 0xa1),
            (29, b'\n'),
            (31, 0xe2),
            (47, 0x80),
            (70, b'\r'),
            (88, 0xff),
        ] {
            hay[at] = b;
        }
        for start in 0..hay.len() {
            for end in start..=hay.len() {
                let part = &hay[start..end];
                let found = part.iter().position(|b| *b < 0x0e);
                let ascii = part[..found.unwrap_or(part.len())].is_ascii();
                assert_eq!(position_below_ascii(part, 0x0e), (found, ascii), "{start}..{end}");
            }
        }
    }

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
                for len in 0..=tail.len() {
                    let part = &tail[..len];
                    let found = part.iter().position(|b| *b < n);
                    let before = &part[..found.unwrap_or(len)];
                    assert_eq!(
                        position_below_ascii(part, n),
                        (found, before.is_ascii()),
                        "{n} {part:?}"
                    );
                }
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
