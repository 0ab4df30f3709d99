//! The floor: what any proxy-wasm filter that routes on the request body costs in Envoy.
//! It holds the request headers, reads the whole body when it has arrived, then sets what
//! waygate sets for an OpenAI-compatible provider (the route header, `:path`, the
//! provider's credential) and lets the request go; answers pass untouched. No parsing, no
//! translation, no stats, no logging: waygate's cost above this row is its own.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Floor) });
}}

struct Floor;

impl Context for Floor {}

impl RootContext for Floor {
    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Floor))
    }
}

impl HttpContext for Floor {
    fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
        if end_of_stream { Action::Continue } else { Action::Pause }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        // Read, as every body-routing filter must; its content is not looked at.
        let _body = self.get_http_request_body(0, body_size);
        self.set_http_request_header("x-waygate-cluster", Some("fake"));
        self.set_http_request_header(":path", Some("/v1/chat/completions"));
        self.set_http_request_header("authorization", Some("Bearer fake-openai-key"));
        Action::Continue
    }
}
