//! Response builders: JSON bodies with a status code, `Status` errors,
//! aggregated-discovery and plain-text responses, and how objects are presented
//! (at the requested version, or as `PartialObjectMetadata`).

use http::{Response, StatusCode, header};
use serde_json::{Value, json};

use super::Resp;
use crate::{body::ResponseBody, error::ApiError, resources::ResourceType};

pub(super) fn json_response(code: u16, value: &Value) -> Resp {
    let mut resp = Response::new(ResponseBody::full(value.to_string()));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

pub(super) fn aggregated_response(value: &Value) -> Resp {
    let mut resp = json_response(200, value);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        ),
    );
    resp
}

pub(super) fn error_response(err: &ApiError) -> Resp {
    json_response(err.code, &err.to_status())
}

pub(super) fn text_response(text: String) -> Resp {
    let mut resp = Response::new(ResponseBody::full(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain"),
    );
    resp
}

/// An object as served at `version`, or as `PartialObjectMetadata` when the
/// client asked for metadata only.
pub fn present(rt: &ResourceType, version: &str, obj: &Value, metadata_only: bool) -> Value {
    if metadata_only {
        return json!({
            "apiVersion": "meta.k8s.io/v1",
            "kind": "PartialObjectMetadata",
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        });
    }
    let mut out = obj.clone();
    out["apiVersion"] = json!(rt.api_version(version));
    out
}
