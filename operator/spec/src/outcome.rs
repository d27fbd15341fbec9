//! Command outcomes: the failure type every command returns, its exit status
//! and retry token (contract §16), and the wrapping of validation
//! diagnostics into one failure.

use crate::diag::{self, Diagnostic};

/// Exit status classes of §16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// 0: success.
    Ok,
    /// 2: the request itself is malformed.
    Usage,
    /// 3: the project cannot be selected or needs upgrading.
    Project,
    /// 4: the request or the store is invalid.
    Validation,
    /// 5: conflict or stale state; refresh and review.
    Conflict,
    /// 6: I/O or Git failure.
    Io,
    /// 70: internal invariant broken.
    Internal,
}

impl Exit {
    /// Process exit status.
    pub fn code(self) -> i32 {
        match self {
            Exit::Ok => 0,
            Exit::Usage => 2,
            Exit::Project => 3,
            Exit::Validation => 4,
            Exit::Conflict => 5,
            Exit::Io => 6,
            Exit::Internal => 70,
        }
    }

    /// Retry token for the failure envelope.
    pub fn retry(self) -> &'static str {
        match self {
            Exit::Ok => "none",
            Exit::Usage => "correct-request",
            Exit::Project => "select-or-upgrade-project",
            Exit::Validation => "revise-request",
            Exit::Conflict => "refresh-and-review",
            Exit::Io => "reconcile-before-retry",
            Exit::Internal => "retain-diagnostic",
        }
    }
}

/// Whether a failed command may have changed anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// Nothing changed.
    None,
    /// A rollback could not be confirmed; reconcile before retrying.
    Unknown,
}

impl Mutation {
    /// Envelope spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Mutation::None => "none",
            Mutation::Unknown => "unknown",
        }
    }
}

/// A failed command: the `error` object of the failure envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Failure {
    /// Error code, for example `validation.failed`.
    pub code: String,
    /// Human sentence.
    pub message: String,
    /// Exit class.
    pub exit: Exit,
    /// Supporting diagnostics (possibly empty).
    pub diagnostics: Vec<Diagnostic>,
    /// Mutation state.
    pub mutation: Mutation,
}

impl Failure {
    /// A failure without diagnostics and with `mutation: none`.
    pub fn new(exit: Exit, code: &str, message: impl Into<String>) -> Self {
        Self {
            code: code.to_owned(),
            message: message.into(),
            exit,
            diagnostics: Vec::new(),
            mutation: Mutation::None,
        }
    }

    /// A usage failure (status 2).
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(Exit::Usage, "usage.invalid_request", message)
    }

    /// Attaches diagnostics.
    pub fn with_diagnostics(mut self, mut diags: Vec<Diagnostic>) -> Self {
        diag::normalize(&mut diags);
        self.diagnostics = diags;
        self
    }

    /// Marks the mutation state unknown.
    pub fn unknown(mut self) -> Self {
        self.mutation = Mutation::Unknown;
        self
    }
}

/// Message of the `validation.failed` wrapper (fixture wording).
pub const VALIDATION_FAILED_MESSAGE: &str = "The specification is not valid.";

/// Turns validation diagnostics into a failure by the rules of §16, or
/// `None` when there is nothing left after dropping draft-only findings
/// (when `allow_draft`).
pub fn wrap(mut diags: Vec<Diagnostic>, allow_draft: bool) -> Option<Failure> {
    if allow_draft {
        diags.retain(|d| !d.is_draft_only());
    }
    if diags.is_empty() {
        return None;
    }
    if diags.iter().any(Diagnostic::is_project_class) {
        return Some(
            Failure::new(
                Exit::Project,
                "project.invalid_configuration",
                "The project configuration is not valid.",
            )
            .with_diagnostics(diags),
        );
    }
    if diags.iter().all(Diagnostic::is_draft_only) {
        return Some(
            Failure::new(
                Exit::Conflict,
                "change_set.assessment_incomplete",
                "The impact assessment is incomplete or stale.",
            )
            .with_diagnostics(diags),
        );
    }
    Some(
        Failure::new(
            Exit::Validation,
            "validation.failed",
            VALIDATION_FAILED_MESSAGE,
        )
        .with_diagnostics(diags),
    )
}
