//! The anthropic request translator on bodies that passed validation.

#![no_main]

use libfuzzer_sys::fuzz_target;
use waygate::config::Api;

fuzz_target!(|data: &[u8]| waygate_fuzz::check_build(Api::Anthropic, data));
