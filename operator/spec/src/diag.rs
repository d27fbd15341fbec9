//! Diagnostics: the code/severity/path/record/field/message/hint records that
//! validation produces, their canonical ordering, and the mapping from a set
//! of diagnostics to an exit class (contract §15, §16).

use std::cmp::Ordering;

/// One validation finding. Optional parts are omitted from JSON when empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// Stable dotted code, for example `requirement.invalid_id`.
    pub code: String,
    /// Project-relative path of the file the finding is about.
    pub path: Option<String>,
    /// ID of the record the finding is about.
    pub record_id: Option<String>,
    /// Field inside the record, for example `applies_to.interfaces`.
    pub field: Option<String>,
    /// One-sentence statement of what is wrong.
    pub message: String,
    /// What the user can do about it.
    pub hint: Option<String>,
}

impl Diagnostic {
    /// A diagnostic with only a code and a message.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            path: None,
            record_id: None,
            field: None,
            message: message.into(),
            hint: None,
        }
    }

    /// Sets the path. Control characters are replaced and absolute paths
    /// are refused, so a diagnostic never echoes an unsafe path (§1).
    pub fn at(mut self, path: impl Into<String>) -> Self {
        let path: String = path.into();
        let clean: String = path
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        self.path = if clean.starts_with('/') || clean.contains(":\\") {
            None
        } else {
            Some(clean)
        };
        self
    }

    /// Sets the record ID (ignored when empty).
    pub fn record(mut self, id: &str) -> Self {
        if !id.is_empty() {
            self.record_id = Some(id.to_owned());
        }
        self
    }

    /// Sets the field.
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// Sets the hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    /// Whether this diagnostic forces the project class (status 3, §16 rule 1).
    pub fn is_project_class(&self) -> bool {
        if self.code.starts_with("schema.") {
            return true;
        }
        if self.code.starts_with("project.") {
            let digest_field = self
                .field
                .as_deref()
                .is_some_and(|f| f.starts_with("store_digests"));
            return self.code != "project.remote_credentials" && !digest_field;
        }
        false
    }

    /// Whether this diagnostic only says the impact assessment is still a
    /// draft (§16 rule 2); such findings are dropped when drafts are allowed.
    pub fn is_draft_only(&self) -> bool {
        match self.code.as_str() {
            "change_set.incomplete_impact" | "change_set.stale_impact" => true,
            "change_set.missing_field" => self.field.as_deref() == Some("impact_assessment"),
            _ => false,
        }
    }

    fn sort_key(&self) -> [&str; 7] {
        [
            self.path.as_deref().unwrap_or(""),
            &self.code,
            self.record_id.as_deref().unwrap_or(""),
            self.field.as_deref().unwrap_or(""),
            "error",
            &self.message,
            self.hint.as_deref().unwrap_or(""),
        ]
    }
}

/// Orders diagnostics canonically and removes exact duplicates.
///
/// §28.3: the Go validator sorts by path, record, field, code; the newest
/// contract text (and the newer scoped check) sorts by path, code, record,
/// field, severity, message, hint. We follow the newest text.
pub fn normalize(diags: &mut Vec<Diagnostic>) {
    diags.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    diags.dedup();
}

/// Compares two diagnostics in canonical order.
pub fn compare(a: &Diagnostic, b: &Diagnostic) -> Ordering {
    a.sort_key().cmp(&b.sort_key())
}
