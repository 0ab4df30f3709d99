//! The end of a stream: `on_log`, `on_done` and `on_delete` for the plugin (in Envoy's
//! order), the guest time recorded, and the HCM's access log lines.

use super::Stream;
use crate::access_log;

impl Stream {
    /// Envoy runs `on_log`, then `on_done`, then `on_delete`; the crate enforces the ABI
    /// order (`on_done` first), see host/README.md.
    pub(super) fn finish(&mut self) {
        self.abort_upstream();
        self.plugin_done();
        if self.context.is_some() {
            self.ctx.guest_time.record(self.in_guest);
        }
        self.access_log();
    }

    fn plugin_done(&mut self) {
        let Some(context) = self.context else {
            return;
        };
        if !self.filter_off {
            self.hs.req_headers_open = false;
            self.hs.resp_headers_open = false;
            self.hs.req_body_open = false;
            self.hs.resp_body_open = false;
            let _ = self.call(|scope, id| {
                if scope.on_done(id)? {
                    scope.on_log(id)?;
                    scope.on_delete(id)?;
                }
                Ok(())
            });
            self.hs.deferred.clear();
        }
        if let Some(vm) = &self.ctx.vm
            && let Ok(mut vm) = vm.try_borrow_mut()
        {
            vm.streams.remove(&context.get());
        }
    }

    /// The HCM's access logs, once the stream is over and the plugin's `on_log` has run.
    fn access_log(&self) {
        if self.ctx.access_logs.is_empty() {
            return;
        }
        let entry = access_log::Entry {
            start_time: self.start_time,
            duration: self.started.elapsed(),
            request_headers: self.routed_request.as_ref().unwrap_or(&self.hs.req_headers),
            response_headers: &self.hs.resp_headers,
            response_code: self.hs.props.response_code,
            response_code_details: self.hs.props.code_details.as_deref(),
            response_flags: &self.response_flags,
            route_name: self.hs.props.route_name.as_deref(),
            upstream_cluster: self.hs.props.cluster_name.as_deref(),
            upstream_host: self.upstream_host,
            bytes_received: self.bytes_received,
            bytes_sent: self.down_sent,
            connection_id: self.hs.props.connection_id,
            downstream_remote: self.hs.props.source,
            downstream_local: self.hs.props.destination,
            filter_state: &self.hs.filter_state,
        };
        for logger in self.ctx.access_logs.iter() {
            logger.log(&entry);
        }
    }
}
