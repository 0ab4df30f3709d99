//! Request validation, for both operations: an error is always the
//! contract's 400 envelope, and an accepted body is stable when re-encoded.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use waygate::request::{self, Operation};
use waygate_fuzz::check_api_error;

fuzz_target!(|data: &[u8]| {
    for op in [Operation::Chat, Operation::Completions] {
        match request::parse(op, data) {
            Ok(r) => {
                assert_eq!(r.op, op);
                assert_eq!(r.body.get("model").and_then(Value::as_str), Some(r.model.as_str()));
                let again = serde_json::to_vec(&Value::Object(r.body.clone())).unwrap();
                let reparsed = request::parse(op, &again).expect("an accepted body, re-encoded, is accepted");
                assert_eq!(reparsed.body, r.body);
            }
            Err(e) => {
                check_api_error(&e);
                assert_eq!((e.status, e.kind.as_str()), (400, "invalid_request_error"), "{e:?}");
            }
        }
    }
});
