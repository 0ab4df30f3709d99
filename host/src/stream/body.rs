//! A body buffer with Envoy's `proxy_set_buffer_bytes` rules (recent context.cc,
//! `Buffer::copyFrom`): `start == 0` drains `size` bytes then prepends the data,
//! `start >= len` appends, anything in between is refused.
//!
//! The crate clamps the range before calling us, so `start == len` also covers every
//! start past the end. A refusal reaches the guest as `NOT_FOUND` (the crate's mapping
//! for a refused buffer write) where Envoy answers `BAD_ARGUMENT`; the Rust SDK panics on
//! both, so a plugin sees the same crash.

use proxy_wasm_host::{Buffer, NotAllowed};

#[derive(Debug, Clone, Default)]
pub struct Body {
    pub bytes: Vec<u8>,
}

impl Buffer for Body {
    fn len(&self) -> usize {
        self.bytes.len()
    }

    fn copy_range_into(&self, start: usize, max_size: usize, out: &mut Vec<u8>) {
        let len = self.bytes.len();
        let start = start.min(len);
        let end = start.saturating_add(max_size).min(len);
        if let Some(slice) = self.bytes.get(start..end) {
            out.extend_from_slice(slice);
        }
    }

    fn replace(&mut self, start: usize, size: usize, value: &[u8]) -> Result<(), NotAllowed> {
        let len = self.bytes.len();
        if start == 0 {
            let drained = size.min(len);
            self.bytes.splice(0..drained, value.iter().copied());
            Ok(())
        } else if start >= len {
            self.bytes.extend_from_slice(value);
            Ok(())
        } else {
            Err(NotAllowed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(text: &str) -> Body {
        Body {
            bytes: text.as_bytes().to_vec(),
        }
    }

    #[test]
    fn envoy_set_buffer_rules() {
        let mut b = body("hello");
        assert!(b.replace(0, 0, b">").is_ok());
        assert_eq!(b.bytes, b">hello");
        assert!(b.replace(0, 6, b"new").is_ok());
        assert_eq!(b.bytes, b"new");
        assert!(b.replace(0, 1, b"N").is_ok());
        assert_eq!(b.bytes, b"New");
        assert!(b.replace(3, 0, b"!").is_ok());
        assert_eq!(b.bytes, b"New!");
        assert!(b.replace(1, 1, b"x").is_err());
    }
}
