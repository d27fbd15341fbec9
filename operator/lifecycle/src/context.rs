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

/// What a trusted in-process caller (the operator, the CLI) grants one of its own
/// components: the one way to build an [`AuthorizationContext`] outside a Gate. Named
/// fields, so a subject can never be passed where the project belongs.
#[derive(Clone, Copy, Debug)]
pub struct Grant<'a> {
    /// The project the context is valid for (its ref `project:<id>` is granted too).
    pub project: &'a str,
    /// The role.
    pub role: Role,
    /// The authenticated subject (becomes the lease owner).
    pub subject: &'a str,
    /// Operations granted.
    pub actions: &'a [&'a str],
    /// Exclusive expiry (the caller reads its clock; the context never does).
    pub expires_at: Timestamp,
    /// The policy version the caller speaks for.
    pub policy_version: &'a str,
}

impl AuthorizationContext {
    /// The context `grant` describes, with `project:<project>` as its only ref (add more
    /// with [`AuthorizationContext::with_refs`]) and no work-item or change-set scoping.
    pub fn new(grant: Grant<'_>) -> AuthorizationContext {
        AuthorizationContext {
            subject: grant.subject.to_owned(),
            role: grant.role.as_str().to_owned(),
            project_id: grant.project.to_owned(),
            work_item_id: None,
            change_set_id: None,
            allowed_actions: grant.actions.iter().map(|a| (*a).to_owned()).collect(),
            allowed_refs: vec![format!("project:{}", grant.project)],
            expires_at: Some(grant.expires_at),
            policy_version: grant.policy_version.to_owned(),
        }
    }

    /// The context with `refs` granted as well (duplicates are not added twice).
    pub fn with_refs<'r>(mut self, refs: impl IntoIterator<Item = &'r str>) -> Self {
        for r in refs {
            if !self.allowed_refs.iter().any(|have| have == r) {
                self.allowed_refs.push(r.to_owned());
            }
        }
        self
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap_or(Timestamp::UNIX_EPOCH)
    }

    fn grant() -> Grant<'static> {
        Grant {
            project: "demo",
            role: Role::JobSite,
            subject: "job-site-a",
            actions: &["claim", "renew-lease"],
            expires_at: at(60),
            policy_version: "p1",
        }
    }

    #[test]
    fn a_grant_builds_a_context_that_validates_for_its_project_only() {
        let ctx = AuthorizationContext::new(grant());
        assert_eq!(ctx.subject, "job-site-a");
        assert_eq!(ctx.role, "job-site");
        assert_eq!(ctx.project_id, "demo");
        assert_eq!(ctx.allowed_actions, ["claim", "renew-lease"]);
        assert_eq!(ctx.allowed_refs, ["project:demo"]);
        assert_eq!(ctx.expires_at, Some(at(60)));
        assert_eq!(ctx.policy_version, "p1");
        assert_eq!(ctx.validate("demo", Some(at(0))), Ok(Role::JobSite));
        assert!(ctx.validate("other", Some(at(0))).is_err());
        // The expiry is exclusive.
        assert!(ctx.validate("demo", Some(at(60))).is_err());
    }

    #[test]
    fn extra_refs_are_added_once() {
        let ctx = AuthorizationContext::new(grant()).with_refs(["main", "main", "project:demo"]);
        assert_eq!(ctx.allowed_refs, ["project:demo", "main"]);
    }

    #[test]
    fn a_grant_without_actions_fails_closed() {
        let ctx = AuthorizationContext::new(Grant {
            actions: &[],
            ..grant()
        });
        assert!(ctx.validate("demo", Some(at(0))).is_err());
    }
}
