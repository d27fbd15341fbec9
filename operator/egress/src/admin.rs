//! The admin listener: `GET /metrics` (Prometheus text format of the proxy's
//! registry) and `GET /healthz`. Kept off the proxy port so sandboxes, which
//! may only reach port 3128, cannot read metrics.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};
use prometheus::{Encoder, Registry, TextEncoder};

/// Answers one admin request.
pub fn respond(registry: &Registry, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match request.uri().path() {
        "/healthz" => plain(StatusCode::OK, "ok\n"),
        "/metrics" => {
            let encoder = TextEncoder::new();
            let mut out = Vec::new();
            match encoder.encode(&registry.gather(), &mut out) {
                Ok(()) => Response::builder()
                    .status(StatusCode::OK)
                    .header(header::CONTENT_TYPE, encoder.format_type())
                    .body(Full::new(Bytes::from(out)))
                    .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "")),
                Err(error) => plain(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("failed to encode metrics: {error}\n"),
                ),
            }
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: try /metrics or /healthz\n",
        ),
    }
}

fn plain(status: StatusCode, text: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(text.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}
