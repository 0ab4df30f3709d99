//! Writing to the client: the response head once, body chunks as they come, the declared
//! `content-length` kept, and a reset (the connection closed mid-message) when it cannot be.

use bytes::Bytes;
use hyper::Response;

use super::Stream;
use super::convert::{declared_length, header_name, header_value, is_hop_by_hop_bytes};
use crate::access_log::flags;
use crate::body::{HostBody, Reset};

impl Stream {
    pub(super) fn send_headers(&mut self, eos: bool) {
        if self.done || self.resp_headers_sent {
            return;
        }
        self.resp_headers_sent = true;
        let headers = &self.hs.resp_headers;
        let status = headers
            .first_str(":status")
            .and_then(|s| s.parse::<u16>().ok())
            .and_then(|s| hyper::StatusCode::from_u16(s).ok());
        let Some(status) = status else {
            self.logs().host("FILTER BUG: response :status is missing or invalid");
            return self.reset();
        };
        self.down_declared = if self.is_head { None } else { declared_length(headers) };
        let mut map = hyper::HeaderMap::with_capacity(headers.len() + 1);
        for (name, value) in headers.pairs() {
            if name.first() == Some(&b':') || is_hop_by_hop_bytes(name) || name == b"date" || name == b"server" {
                continue;
            }
            match (header_name(name), header_value(value)) {
                (Ok(name), Ok(value)) => {
                    map.append(name, value);
                }
                (Err(e), _) | (_, Err(e)) => {
                    self.logs().host(format!("FILTER BUG: invalid response header: {e}"));
                    return self.reset();
                }
            }
        }
        // The HCM stamps `server: envoy`; `date` is added by hyper, as Envoy's codec does.
        map.insert(hyper::header::SERVER, hyper::header::HeaderValue::from_static("envoy"));
        let (tx, body) = HostBody::after_headers(eos);
        self.body_tx = tx;
        let mut response = Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = map;
        if let Some(tx) = self.head_tx.take() {
            let _ = tx.send(Ok(response));
        }
        if eos {
            if let Some(declared) = self.down_declared
                && declared != 0
                && status != hyper::StatusCode::NO_CONTENT
                && status != hyper::StatusCode::NOT_MODIFIED
            {
                self.logs().host(format!(
                    "FILTER BUG: response content-length {declared} but the response has no body"
                ));
            }
            self.done = true;
        }
    }

    pub(super) fn send_data(&mut self, data: Vec<u8>, eos: bool) {
        if self.done {
            return;
        }
        if !self.resp_headers_sent {
            self.send_headers(false);
        }
        self.down_sent += data.len() as u64;
        if let Some(declared) = self.down_declared
            && (self.down_sent > declared || (eos && self.down_sent != declared))
        {
            self.logs().host(format!(
                "FILTER BUG: response content-length {declared} disagrees with the {}{} body bytes sent downstream; Envoy does not fix content-length, so the client would see a broken response (reset here)",
                if eos { "" } else { "more than " },
                self.down_sent
            ));
            return self.reset();
        }
        if let Some(tx) = &self.body_tx
            && !data.is_empty()
            && tx.send(Ok(Bytes::from(data))).is_err()
        {
            return self.client_gone();
        }
        if eos {
            self.body_tx = None;
            self.done = true;
        }
    }

    /// Resets the downstream stream (HTTP/1: the connection closes mid-message).
    pub(super) fn reset(&mut self) {
        if self.done {
            return;
        }
        self.abort_upstream();
        self.decode_aborted = true;
        if let Some(tx) = self.head_tx.take() {
            let _ = tx.send(Err(Reset));
        }
        if let Some(tx) = self.body_tx.take() {
            let _ = tx.send(Err(Reset));
        }
        self.done = true;
    }

    pub(super) fn client_gone(&mut self) {
        self.flag(flags::DOWNSTREAM_CONNECTION_TERMINATION);
        self.abort_upstream();
        self.decode_aborted = true;
        self.head_tx = None;
        self.body_tx = None;
        self.done = true;
    }
}
