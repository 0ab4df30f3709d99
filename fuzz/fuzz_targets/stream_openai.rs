//! The openai stream translator through `StreamRewriter`, on arbitrary bytes
//! under arbitrary chunking: the same output under every chunking, and a
//! well-formed client stream ending in `[DONE]` or one error event.

#![no_main]

use libfuzzer_sys::fuzz_target;
use waygate::config::Api;

fuzz_target!(|data: &[u8]| waygate_fuzz::check_stream_target(Api::Openai, data));
