//! Errors: `ApiError` is what the double answers over HTTP (a Kubernetes `Status`),
//! `TestkitError` is what setup calls (CRD registration, kubelet start) return to a test.

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// One `StatusCause` of a failed request (`details.causes[]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// Machine-readable reason, e.g. `FieldValueInvalid` or `FieldManagerConflict`.
    pub reason: String,
    /// Human-readable description.
    pub message: String,
    /// The field path the cause is about, e.g. `spec.replicas`.
    pub field: String,
}

/// `Status.details` of a failed request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorDetails {
    /// `details.name`.
    pub name: String,
    /// `details.group`.
    pub group: String,
    /// `details.kind` (the plural for NotFound/Conflict, the Kind for Invalid, as upstream).
    pub kind: String,
    /// `details.causes`.
    pub causes: Vec<Cause>,
}

/// A failed API request, rendered as a `v1 Status` object with the same code,
/// reason and message shape the real API server uses.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `Expired`.
    pub reason: String,
    /// `Status.message`.
    pub message: String,
    /// `Status.details`, boxed to keep `Result<_, ApiError>` small.
    pub details: Option<Box<ErrorDetails>>,
}

impl ApiError {
    /// A bare error with a code, reason and message.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.to_owned(),
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, rt: &ResourceType, name: &str) -> Self {
        self.details = Some(Box::new(ErrorDetails {
            name: name.to_owned(),
            group: rt.group.clone(),
            kind: rt.plural.clone(),
            causes: Vec::new(),
        }));
        self
    }

    /// Attach causes (creating empty details if needed).
    pub fn with_causes(mut self, causes: Vec<Cause>) -> Self {
        self.details.get_or_insert_with(Box::default).causes = causes;
        self
    }

    /// 404 `NotFound` for one object.
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", rt.qualified()),
        )
        .with_details(rt, name)
    }

    /// 409 `AlreadyExists` on create.
    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", rt.qualified()),
        )
        .with_details(rt, name)
    }

    /// 409 `Conflict` for a stale `resourceVersion` precondition.
    pub fn conflict(rt: &ResourceType, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                rt.qualified()
            ),
        )
        .with_details(rt, name)
    }

    /// 422 `Invalid` with one cause per field error.
    pub fn invalid(rt: &ResourceType, name: &str, causes: Vec<Cause>) -> Self {
        // Causes carry the field separately; the message names it, as upstream.
        let summary: Vec<String> = causes
            .iter()
            .map(|c| format!("{}: {}", c.field, c.message))
            .collect();
        let summary = if summary.len() == 1 {
            summary.join("")
        } else {
            format!("[{}]", summary.join(", "))
        };
        let qualified_kind = if rt.group.is_empty() {
            rt.kind.clone()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let mut err = Self::new(
            422,
            "Invalid",
            format!("{qualified_kind} \"{name}\" is invalid: {summary}"),
        );
        err.details = Some(Box::new(ErrorDetails {
            name: name.to_owned(),
            group: rt.group.clone(),
            kind: rt.kind.clone(),
            causes,
        }));
        err
    }

    /// 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405 `MethodNotAllowed`.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 410 `Expired` for a resource version older than the retained history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 500 `InternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 415 `UnsupportedMediaType`.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// The `v1 Status` JSON object for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            let causes: Vec<Value> = d
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            let mut details = json!({"name": d.name, "group": d.group, "kind": d.kind});
            if !causes.is_empty() {
                details["causes"] = Value::Array(causes);
            }
            status["details"] = details;
        }
        status
    }
}

/// Errors from setting the double up (not from serving requests).
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    /// A YAML document could not be parsed.
    #[error("failed to parse YAML document")]
    Yaml {
        /// The parser error.
        #[source]
        source: Box<serde_yaml_ng::Error>,
    },
    /// A file or directory could not be read.
    #[error("failed to read {path}")]
    Io {
        /// The path.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A CRD document is missing a field the double needs.
    #[error("unable to register CRD {name}: {reason}")]
    InvalidCrd {
        /// `metadata.name` of the CRD (or `<unnamed>`).
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Creating an object through the store failed.
    #[error("failed to create {what}")]
    Create {
        /// What was being created.
        what: String,
        /// The API error.
        #[source]
        source: Box<ApiError>,
    },
}
