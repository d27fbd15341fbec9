//! The trusted authorization context a Gate builds from an actor reference
//! (§3), and its fail-closed validation. Every failure is `UNAUTHORIZED_ACTION`.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::{
    envelope::Rejection,
    vocab::{Code, Role},
};

/// The Gate's output. Requests never carry or widen it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthorizationContext {
    /// The authenticated subject (becomes the lease owner).
    pub subject: String,
    /// One of the five roles; anything else fails closed.
    pub role: String,
    /// The project this context is valid for.
    pub project_id: String,
    /// Optional scoping to one work item.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_item_id: Option<String>,
    /// Optional scoping to one change set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change_set_id: Option<String>,
    /// Operations granted (no wildcards).
    pub allowed_actions: Vec<String>,
    /// Refs granted, including `project:<id>` (no wildcards).
    pub allowed_refs: Vec<String>,
    /// Exclusive expiry.
    #[serde(default, with = "crate::strict::timestamp_option")]
    pub expires_at: Option<Timestamp>,
    /// The Gate's policy version.
    pub policy_version: String,
}

fn is_wildcard(entry: &str) -> bool {
    let t = entry.trim();
    t == "*" || t.eq_ignore_ascii_case("all")
}

impl AuthorizationContext {
    /// The role, if it is one of the five.
    pub fn parsed_role(&self) -> Option<Role> {
        Role::parse(&self.role)
    }

    /// Context validity, §3 items 1–4 (evaluation time, identity, expiry, grants).
    pub fn validate(
        &self,
        trusted_project: &str,
        now: Option<Timestamp>,
    ) -> Result<Role, Rejection> {
        let deny = |why: &str| Err(unauthorized(why));
        let Some(now) = now else {
            return deny("evaluation time is missing");
        };
        if self.subject.trim().is_empty() {
            return deny("authorization context has no subject");
        }
        let Some(role) = self.parsed_role() else {
            return deny("authorization context role is not a known role");
        };
        if self.project_id.is_empty() || self.project_id != trusted_project {
            return deny("authorization context is not for this project");
        }
        if self.policy_version.is_empty() {
            return deny("authorization context has no policy version");
        }
        match self.expires_at {
            None => return deny("authorization context has no expiry"),
            Some(exp) if now >= exp => return deny("authorization context expired"),
            Some(_) => {}
        }
        if self.allowed_actions.is_empty() || self.allowed_refs.is_empty() {
            return deny("authorization context grants no actions or refs");
        }
        if self
            .allowed_actions
            .iter()
            .chain(&self.allowed_refs)
            .any(|e| is_wildcard(e))
        {
            return deny("authorization context contains a wildcard grant");
        }
        Ok(role)
    }

    /// §3 item 5: scoping ids must match the target and payload change set.
    pub fn check_scope(&self, target: &str, change_set: &str) -> Result<(), Rejection> {
        if let Some(wi) = self.work_item_id.as_deref().filter(|s| !s.is_empty())
            && wi != target
        {
            return Err(unauthorized(
                "authorization context is scoped to another work item",
            ));
        }
        if let Some(cs) = self.change_set_id.as_deref().filter(|s| !s.is_empty())
            && cs != change_set
        {
            return Err(unauthorized(
                "authorization context is scoped to another change set",
            ));
        }
        Ok(())
    }

    /// Whether `action` is granted.
    pub fn allows(&self, action: &str) -> bool {
        self.allowed_actions.iter().any(|a| a == action)
    }

    /// §3 item 7: `project:<id>` and every payload ref must be granted.
    pub fn check_refs(&self, refs: &[String]) -> Result<(), Rejection> {
        let project_ref = format!("project:{}", self.project_id);
        for r in std::iter::once(&project_ref).chain(refs) {
            if !self.allowed_refs.iter().any(|a| a == r) {
                return Err(unauthorized("a referenced ref is outside the allowed refs")
                    .with("ref", r.as_str()));
            }
        }
        Ok(())
    }

    /// §3 item 9: an echoed policy version must equal the Gate's exactly.
    pub fn check_policy_echo(&self, echoed: &str) -> Result<(), Rejection> {
        if !echoed.is_empty() && echoed != self.policy_version {
            return Err(unauthorized(
                "echoed policy version differs from the Gate's",
            ));
        }
        Ok(())
    }
}

/// An `UNAUTHORIZED_ACTION` rejection.
pub fn unauthorized(message: &str) -> Rejection {
    Rejection::new(Code::UnauthorizedAction, message)
}
