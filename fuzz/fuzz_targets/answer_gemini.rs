//! The gemini answer translator on arbitrary 2xx bodies.

#![no_main]

use libfuzzer_sys::fuzz_target;
use waygate::config::Api;

fuzz_target!(|data: &[u8]| waygate_fuzz::check_answer(Api::Gemini, data));
