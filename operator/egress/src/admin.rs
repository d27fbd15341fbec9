//! The admin listener: `GET /metrics` (Prometheus text format of the proxy's
//! registry), `GET /healthz` and `GET /usage/<run id>` (the run's metered
//! model usage as JSON, [`crate::meter::RunUsage`]; 404 when the meter saw no
//! model call of that run). Kept off the proxy port so sandboxes, which may
//! only reach port 3128, cannot read metrics or usage.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header};
use prometheus::{Encoder, Registry, TextEncoder};

use crate::meter::UsageMeter;

/// Answers one admin request (`meter`: the proxy's, when it meters).
pub fn respond(
    registry: &Registry,
    meter: Option<&UsageMeter>,
    request: &Request<Incoming>,
) -> Response<Full<Bytes>> {
    if request.method() != Method::GET {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    if let Some(run) = request.uri().path().strip_prefix("/usage/") {
        return usage(meter, run);
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
            "not found: try /metrics, /healthz or /usage/<run id>\n",
        ),
    }
}

fn usage(meter: Option<&UsageMeter>, run: &str) -> Response<Full<Bytes>> {
    let Some(meter) = meter else {
        return plain(StatusCode::NOT_FOUND, "this proxy does not meter usage\n");
    };
    match meter.run(run) {
        Some(record) => match serde_json::to_vec(&record) {
            Ok(body) => Response::builder()
                .status(StatusCode::OK)
                .header(header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)))
                .unwrap_or_else(|_| plain(StatusCode::INTERNAL_SERVER_ERROR, "")),
            Err(error) => plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                &format!("failed to encode the usage record: {error}\n"),
            ),
        },
        None => plain(
            StatusCode::NOT_FOUND,
            "no model call of this run was metered (it made none, or its record was dropped)\n",
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
