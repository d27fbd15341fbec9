//! The request log: every resource request the double served, in order, with
//! its verb, target, field manager, patch type, body and response code, so a
//! test can assert exactly which writes a controller made (and that nothing
//! else was sent).

use serde_json::Value;

use crate::faults::Verb;

/// One served resource request.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    /// The verb.
    pub verb: Verb,
    /// API group (empty for core).
    pub group: String,
    /// Version from the path.
    pub version: String,
    /// Plural resource name.
    pub plural: String,
    /// Namespace from the path.
    pub namespace: Option<String>,
    /// Object name from the path.
    pub name: Option<String>,
    /// Subresource (`status`, `log`).
    pub subresource: Option<String>,
    /// `fieldManager` query parameter.
    pub field_manager: Option<String>,
    /// `force=true` on apply.
    pub force: bool,
    /// Content type of a PATCH (`application/apply-patch+yaml`, …).
    pub patch_type: Option<String>,
    /// The request body, when it was JSON or YAML.
    pub body: Option<Value>,
    /// The HTTP status code answered.
    pub code: u16,
}

impl RecordedRequest {
    /// Whether the request could change state (create, update, patch, delete).
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb,
            Verb::Create | Verb::Update | Verb::Patch | Verb::Delete | Verb::DeleteCollection
        )
    }

    /// Whether this is a server-side apply.
    pub fn is_apply(&self) -> bool {
        self.patch_type.as_deref() == Some("application/apply-patch+yaml")
    }

    /// `verb plural[/name][/subresource]`, e.g. `Patch widgets/w1/status`, for readable assertions.
    pub fn summary(&self) -> String {
        let mut s = format!("{:?} {}", self.verb, self.plural);
        if let Some(n) = &self.name {
            s.push('/');
            s.push_str(n);
        }
        if let Some(sub) = &self.subresource {
            s.push('/');
            s.push_str(sub);
        }
        s
    }
}
