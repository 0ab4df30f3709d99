//! `dispatch_http_call` (`proxy_http_call`) as Envoy's `Context::httpCall` runs it:
//! the call belongs to the root context (it outlives the stream), a timeout of 0 means
//! none, a non-empty body gets `content-length`, and the async client's router turns a
//! timeout into a 504 "upstream request timeout" and a connect failure into a 503
//! "upstream connect error or disconnect/reset before headers. reset reason: connection
//! failure" — ordinary responses, not failures. A reset after the response started is a
//! failure (zero headers). The response is delivered after the current callback has
//! returned (never re-entrant), to the stream that made the call if it still exists,
//! else dropped (the Rust SDK would drop it too), or to the root context.

use std::borrow::Cow;
use std::rc::Rc;

use http_body_util::BodyExt;
use proxy_wasm_host::abi::v0_2_1::{HeaderPairs, HttpCall, HttpCallResponse};

use crate::body::HostBody;
use crate::local_reply::{self, reasons};
use crate::stream::headers::Headers;
use crate::stream::{ListenerCtx, StreamEvent, upstream_request};
use crate::upstream::{Pool, UpstreamError};
use crate::vm::PendingCall;

/// Starts every call the VM queued during the callback that just returned.
pub fn spawn_pending(ctx: &Rc<ListenerCtx>) {
    let Some(vm) = &ctx.vm else {
        return;
    };
    let pending = match vm.try_borrow() {
        Ok(vm) => vm.callouts.take(),
        Err(_) => return,
    };
    for call in pending {
        tokio::task::spawn_local(run(Rc::clone(ctx), call));
    }
}

async fn run(ctx: Rc<ListenerCtx>, pending: PendingCall) {
    let response = perform(&ctx.pool, pending.call).await;
    let Some(vm_rc) = ctx.vm.clone() else {
        return;
    };
    let target = {
        let Ok(vm) = vm_rc.try_borrow() else {
            ctx.logs
                .host("internal error: VM busy when an http_call response arrived");
            return;
        };
        if vm.failed {
            return;
        }
        if pending.caller == vm.root {
            None
        } else {
            match vm.streams.get(&pending.caller.get()) {
                Some(tx) => Some(tx.clone()),
                // The stream is gone: Envoy delivers nothing the plugin can act on.
                None => return,
            }
        }
    };
    match target {
        Some(tx) => {
            let _ = tx.send(StreamEvent::CallResponse {
                callout: pending.callout,
                response,
            });
        }
        None => {
            let result = {
                let Ok(mut vm) = vm_rc.try_borrow_mut() else {
                    return;
                };
                let root = vm.root;
                let mut scope = vm.guest.enter_root();
                let result = scope.on_http_call_response(root, pending.callout, response);
                drop(scope);
                if result.is_err() && vm.guest.is_poisoned() {
                    vm.failed = true;
                }
                result
            };
            if let Err(e) = result {
                ctx.logs
                    .host(format!("on_http_call_response on the root context failed: {e}"));
            }
            spawn_pending(&ctx);
        }
    }
}

fn reply_as_response(reason: (u16, &str, &str)) -> HttpCallResponse<'static> {
    let reply = local_reply::from_reason(reason, false);
    let headers: HeaderPairs<'static> = reply
        .headers
        .pairs()
        .iter()
        .map(|(k, v)| (Cow::Owned(k.clone()), Cow::Owned(v.clone())))
        .collect();
    HttpCallResponse::received(headers).with_body(reply.body)
}

async fn perform(pool: &Rc<Pool>, call: HttpCall<'static>) -> HttpCallResponse<'static> {
    let cluster = String::from_utf8_lossy(&call.upstream).into_owned();
    let mut headers = Headers::new(
        call.headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_vec()))
            .collect(),
    );
    let body = call.body.into_owned();
    if !body.is_empty() {
        headers.set("content-length", body.len().to_string().as_bytes());
    }
    let Ok(request) = upstream_request(&headers, HostBody::full(body)) else {
        return reply_as_response(reasons::CONNECTION_TERMINATION);
    };
    let exchange = async {
        let response = match pool.send(&cluster, request).await {
            Ok(response) => response,
            Err(UpstreamError::NoHealthyUpstream(_)) => {
                return reply_as_response(reasons::NO_HEALTHY_UPSTREAM);
            }
            Err(UpstreamError::ConnectFailure(_)) => {
                return reply_as_response(reasons::CONNECT_FAILURE);
            }
            Err(UpstreamError::Terminated(_)) => {
                return reply_as_response(reasons::CONNECTION_TERMINATION);
            }
        };
        let (parts, body) = response.into_parts();
        let mut pairs: HeaderPairs<'static> = vec![(
            Cow::Borrowed(&b":status"[..]),
            Cow::Owned(parts.status.as_u16().to_string().into_bytes()),
        )];
        for (name, value) in &parts.headers {
            pairs.push((
                Cow::Owned(name.as_str().as_bytes().to_vec()),
                Cow::Owned(value.as_bytes().to_vec()),
            ));
        }
        match body.collect().await {
            Ok(collected) => {
                let trailers: HeaderPairs<'static> = collected
                    .trailers()
                    .map(|t| {
                        t.iter()
                            .map(|(k, v)| {
                                (
                                    Cow::Owned(k.as_str().as_bytes().to_vec()),
                                    Cow::Owned(v.as_bytes().to_vec()),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                HttpCallResponse::received(pairs)
                    .with_body(collected.to_bytes().to_vec())
                    .with_trailers(trailers)
            }
            // Reset after the headers: the callback sees zero headers.
            Err(_) => HttpCallResponse::failed(),
        }
    };
    if call.timeout.is_zero() {
        exchange.await
    } else {
        match tokio::time::timeout(call.timeout, exchange).await {
            Ok(response) => response,
            Err(_) => reply_as_response(reasons::RESPONSE_TIMEOUT),
        }
    }
}
