//! The SSE decoder under arbitrary chunking (split points from the input):
//! the same events and the same outcome whole, fuzz-chunked and byte by
//! byte, with a small cap and the default one, and a bounded buffer.

#![no_main]

use libfuzzer_sys::fuzz_target;
use waygate::sse::{DEFAULT_LIMIT, SseDecoder, SseError};
use waygate_fuzz::{chunked, plan_and_payload};

/// Each event's data and whether it had several lines.
type Events = Vec<(String, bool)>;

fn decode(limit: usize, chunks: &[&[u8]]) -> (Events, Result<(), SseError>) {
    let mut decoder = SseDecoder::with_limit(limit);
    let mut events = Vec::new();
    for chunk in chunks {
        let mut rest = *chunk;
        loop {
            match decoder.next(&mut rest) {
                Ok(Some(event)) => events.push((event.data.to_string(), event.multiline)),
                Ok(None) => break,
                Err(e) => return (events, Err(e)),
            }
        }
        assert!(decoder.pending() <= 2 * limit, "the buffer is bounded");
    }
    let end = decoder
        .finish()
        .map(|last| events.extend(last.map(|event| (event.data.to_string(), event.multiline))));
    assert!(end.is_err() || decoder.pending() == 0, "finish flushes everything");
    (events, end)
}

fuzz_target!(|data: &[u8]| {
    let (sizes, payload) = plan_and_payload(data);
    for limit in [64, DEFAULT_LIMIT] {
        let whole = decode(limit, &[payload]);
        assert_eq!(whole, decode(limit, &chunked(&sizes, payload)), "chunking {sizes:?}");
        if payload.len() <= 2048 {
            let bytes: Vec<&[u8]> = payload.chunks(1).collect();
            assert_eq!(whole, decode(limit, &bytes), "byte by byte");
        }
        for (data, multiline) in &whole.0 {
            assert!(!data.contains('\r'), "lines end at CR too");
            assert_eq!(*multiline, data.contains('\n'), "a line break only between data lines");
        }
    }
});
