//! Request validation, for both operations: an error is always the
//! contract's 400 envelope, an accepted body is stable when re-encoded, and
//! the rules read through the client's text answer exactly as they do
//! through serde's DOM alone.

#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use waygate::request::{self, Operation};
use waygate_fuzz::check_api_error;

fuzz_target!(|data: &[u8]| {
    for op in [Operation::Chat, Operation::Completions] {
        let dom = request::parse_dom(op, data);
        match request::parse(op, data) {
            Ok(r) => {
                let d = dom.expect("the text is accepted only where the DOM is");
                assert_eq!(
                    (&r.model, r.stream, r.include_usage),
                    (&d.model, d.stream, d.include_usage)
                );
                assert_eq!(r.body().unwrap(), d.body().unwrap());
                assert_eq!(r.op, op);
                let body = r.body().unwrap();
                assert_eq!(body.get("model").and_then(Value::as_str), Some(r.model.as_str()));
                let members = r.members().unwrap();
                let again = request::parse_dom(op, r.raw().as_bytes()).unwrap();
                assert_eq!(members.0.len(), again.members().unwrap().0.len());
                let encoded = serde_json::to_vec(body).unwrap();
                let reparsed = request::parse(op, &encoded).expect("an accepted body, re-encoded, is accepted");
                assert_eq!(reparsed.body().unwrap(), body);
            }
            Err(e) => {
                check_api_error(&e);
                assert_eq!((e.status, e.kind.as_str()), (400, "invalid_request_error"), "{e:?}");
                assert_eq!(Some(e), dom.err(), "the text and the DOM are refused alike");
            }
        }
    }
});
