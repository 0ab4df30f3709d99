//! The admin listener: `/ready` (200 `LIVE` once started, as Envoy's),
//! `/stats/prometheus` (the plugin's custom metrics, Envoy's naming) and the host's own
//! `/host/guest_time` (time in the guest per stream, read and reset; see
//! [`crate::guest_time`]). Everything else is 404; the rest of Envoy's admin API is not
//! served.

use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::guest_time::GuestTime;
use crate::shared::Shared;

pub async fn serve(listener: TcpListener, shared: Arc<Shared>, guest_time: Arc<GuestTime>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = Arc::clone(&shared);
        let guest_time = Arc::clone(&guest_time);
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let shared = Arc::clone(&shared);
                let guest_time = Arc::clone(&guest_time);
                async move { Ok::<_, std::convert::Infallible>(answer(request.uri().path(), &shared, &guest_time)) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(path: &str, shared: &Shared, guest_time: &GuestTime) -> Response<Full<Bytes>> {
    let (status, content_type, body) = match path {
        "/ready" => (StatusCode::OK, "text/plain; charset=UTF-8", "LIVE\n".to_owned()),
        "/stats/prometheus" => (StatusCode::OK, "text/plain; charset=UTF-8", shared.prometheus()),
        "/host/guest_time" => (StatusCode::OK, "application/json", guest_time.take_json()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain; charset=UTF-8",
            "not found\n".to_owned(),
        ),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    if let Ok(value) = content_type.parse() {
        response.headers_mut().insert(hyper::header::CONTENT_TYPE, value);
    }
    response
}
