//! Local replies: the router's (no route, no upstream, timeouts), the plugin's
//! `send_http_response`, and the host's own 500 for a plugin bug it refuses to paper over.
//! Before the response headers went out they replace the response; after, the stream resets.

use bytes::Bytes;
use proxy_wasm_host::abi::v0_2_1::LocalResponse;

use super::{RespSource, Stream};
use crate::access_log::flags;
use crate::local_reply::{self, LocalReply};

impl Stream {
    pub(super) fn router_reply(&mut self, reason: (u16, &str, &str)) {
        if let Some(flag) = flags::for_details(reason.2) {
            self.flag(flag);
        }
        let reply = local_reply::from_reason(reason, self.is_head);
        self.local_reply(reply);
    }

    /// `send_http_response` from the plugin (details `""` from the Rust SDK).
    pub(super) fn plugin_reply(&mut self, response: LocalResponse<'static>) {
        let status = u16::try_from(response.status_code).unwrap_or(500);
        let details = String::from_utf8_lossy(&response.status_code_details).into_owned();
        let headers = response
            .headers
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let reply = local_reply::build(status, headers, response.body.into_owned(), &details, self.is_head);
        self.local_reply(reply);
    }

    /// `FilterManager::sendLocalReply`: through the encoder filters (the plugin's own
    /// response callbacks included) when no response headers exist yet; a direct reply
    /// that replaces them and skips the filters when they exist but have not gone out;
    /// a reset once they have.
    pub(super) fn local_reply(&mut self, reply: LocalReply) {
        if self.done {
            return;
        }
        if self.resp_headers_sent {
            return self.reset();
        }
        self.decode_aborted = true;
        self.req_body = None;
        self.abort_upstream();
        self.hs.props.response_code = Some(reply.status());
        self.hs.props.code_details = Some(reply.details.clone());
        let eos = reply.body.is_empty();
        if self.encoding_started {
            self.resp_headers_held = false;
            self.resp_buffering = false;
            self.hs.resp_headers_open = false;
            self.hs.resp_body_open = false;
            self.held_resp.clear();
            self.resp_via_plugin = false;
            self.resp_source = None;
            self.hs.resp_headers = reply.headers;
            self.send_headers(eos);
            if !eos {
                self.send_data(reply.body, true);
            }
        } else {
            if !eos {
                self.resp_source = Some(RespSource::Local(Some(Bytes::from(reply.body))));
            }
            self.encode_headers(reply.headers, eos);
        }
    }

    /// A bug the host refuses to paper over: logged loudly, answered 500 (or reset).
    pub(super) fn host_failure(&mut self, message: &str) {
        self.logs().host(format!("FILTER BUG: {message}"));
        self.abort_upstream();
        self.decode_aborted = true;
        if self.resp_headers_sent {
            return self.reset();
        }
        self.encoding_started = true; // direct: do not run the plugin on it
        let reply = local_reply::build(
            500,
            Vec::new(),
            format!("waygate-host: {message}").into_bytes(),
            "waygate_host_filter_bug",
            self.is_head,
        );
        self.local_reply(reply);
    }
}
