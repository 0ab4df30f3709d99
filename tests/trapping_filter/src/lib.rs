//! A filter that traps: a request carrying `x-trap` panics in `on_http_request_headers`,
//! which kills the VM as any trap in waygate would. Any other request is counted in
//! shared data, where waygate keeps its local limits, and answered here: `200` with the
//! body `alive <count>`. It stands in for waygate in the test of the shipped bootstraps'
//! `failure_policy` (tests/chaos.rs), in both the downstream and the upstream role.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType};

proxy_wasm::main! {{
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Trapping) });
}}

struct Trapping;

impl Context for Trapping {}

impl RootContext for Trapping {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Trapping))
    }
}

impl HttpContext for Trapping {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        if self.get_http_request_header_bytes("x-trap").is_some() {
            panic!("trapping as asked");
        }
        let count = loop {
            let (seen, cas) = self.get_shared_data("trapping/served");
            let next = seen
                .and_then(|bytes| String::from_utf8(bytes).ok())
                .and_then(|text| text.parse::<u64>().ok())
                .unwrap_or(0)
                + 1;
            if self
                .set_shared_data("trapping/served", Some(next.to_string().as_bytes()), cas)
                .is_ok()
            {
                break next;
            }
        };
        let body = format!("alive {count}");
        self.send_http_response(200, vec![("content-type", "text/plain")], Some(body.as_bytes()));
        Action::Pause
    }
}
