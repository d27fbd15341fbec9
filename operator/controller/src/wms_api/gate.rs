//! The Gate of the HTTP endpoint: who is calling (Kubernetes TokenReview of the
//! bearer token), whether they may (SubjectAccessReview against one verb per
//! operation) and the trusted authorization context the adapter then runs with.
//!
//! Authorization scheme (documented in docs/wms-api.md): an operation is the
//! verb, on resource `wmsoperations` of group `protobot.dev` with the role the
//! caller acts in as subresource, in the Project's namespace, named after the
//! Project. A Drafting Table creating a request in project `shop` of namespace
//! `team-a` needs `request.create` on `wmsoperations/drafting-table`
//! (resourceNames `shop`) in `team-a`. A store read is verb `get` on
//! `wmsreads/<kind>` (`work-item`, `request`, `submission`, `findings`,
//! `audit-log`).
//!
//! The reviews are the edge; [`context`] (the trusted context from a reviewed
//! caller) is pure.

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec},
    authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec},
};
use kube::{Api, Client, api::PostParams};
use protobot_lifecycle::{AuthorizationContext, Role};

/// The API group of the authorization resources.
pub const GROUP: &str = "protobot.dev";
/// The resource whose verbs are the adapter operations.
pub const OPERATIONS: &str = "wmsoperations";
/// The resource whose subresources are the store reads (verb `get`).
pub const READS: &str = "wmsreads";

/// A caller the API server authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The user name (`system:serviceaccount:<ns>:<name>` for a ServiceAccount).
    pub username: String,
    /// The user's UID.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes (passed on to the SubjectAccessReview).
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What the caller asks to do, as the SubjectAccessReview checks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The verb (an operation name, or `get`).
    pub verb: String,
    /// `wmsoperations` or `wmsreads`.
    pub resource: &'static str,
    /// The role (operations) or the read kind (reads).
    pub subresource: String,
    /// The Project's namespace.
    pub namespace: String,
    /// The Project's name.
    pub project: String,
}

impl Access {
    /// `verb resource/subresource namespace/project`, for logs and refusals.
    pub fn describe(&self) -> String {
        format!(
            "{} {}.{GROUP}/{} {}/{}",
            self.verb, self.resource, self.subresource, self.namespace, self.project
        )
    }
}

/// Why the Gate refused or could not decide.
#[derive(Debug, thiserror::Error)]
pub enum GateError {
    /// No bearer token, or the API server did not authenticate it.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The API server said the caller may not.
    #[error("forbidden: {user} may not {access}{}", .reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Forbidden {
        /// The caller.
        user: String,
        /// What was asked.
        access: String,
        /// The authorizer's reason, if it gave one.
        reason: Option<String>,
    },
    /// A review call failed (the operator's own RBAC, or the API server is down).
    #[error("failed to {review} for the WMS API; check that the operator may create {review}s")]
    Review {
        /// `create tokenreview` or `create subjectaccessreview`.
        review: &'static str,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// Authenticates `token` with a TokenReview. With `audiences`, the token must
/// be issued for one of them (a token minted for the API server cannot then be
/// replayed here, nor one minted for here against the API server).
pub async fn authenticate(
    client: &Client,
    token: &str,
    audiences: &[String],
) -> Result<Caller, GateError> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: token.to_string(),
            audiences: (!audiences.is_empty()).then(|| audiences.to_vec()),
        },
        ..TokenReview::default()
    };
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|source| GateError::Review {
            review: "create tokenreview",
            source,
        })?;
    let status = reviewed.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        return Err(GateError::Unauthenticated(status.error.unwrap_or_else(
            || "the API server did not authenticate the token".into(),
        )));
    }
    let user = status.user.unwrap_or_default();
    let username = user.username.unwrap_or_default();
    if username.is_empty() {
        return Err(GateError::Unauthenticated(
            "the token authenticates no user name".into(),
        ));
    }
    Ok(Caller {
        username,
        uid: user.uid.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    })
}

/// Asks the API server whether `caller` may perform `access`.
pub async fn authorize(client: &Client, caller: &Caller, access: &Access) -> Result<(), GateError> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(caller.username.clone()),
            uid: (!caller.uid.is_empty()).then(|| caller.uid.clone()),
            groups: Some(caller.groups.clone()),
            extra: (!caller.extra.is_empty()).then(|| caller.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(GROUP.into()),
                resource: Some(access.resource.into()),
                subresource: Some(access.subresource.clone()),
                verb: Some(access.verb.clone()),
                namespace: Some(access.namespace.clone()),
                name: Some(access.project.clone()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let reviewed = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .map_err(|source| GateError::Review {
            review: "create subjectaccessreview",
            source,
        })?;
    let status = reviewed.status.unwrap_or_default();
    if status.allowed && status.denied != Some(true) {
        Ok(())
    } else {
        Err(GateError::Forbidden {
            user: caller.username.clone(),
            access: access.describe(),
            reason: status.reason.filter(|r| !r.is_empty()),
        })
    }
}

/// How long a context the Gate builds is valid: one request.
pub const CONTEXT_TTL: SignedDuration = SignedDuration::from_secs(60);

/// The trusted context for an authorized call: the authenticated user is the
/// subject, the reviewed role the role; the only granted action is the one
/// the SubjectAccessReview allowed, the only ref the Project's.
pub fn context(
    caller: &Caller,
    role: Role,
    project: &str,
    operation: &str,
    policy_version: &str,
    now: Timestamp,
) -> AuthorizationContext {
    AuthorizationContext {
        subject: caller.username.clone(),
        role: role.as_str().to_string(),
        project_id: project.to_string(),
        work_item_id: None,
        change_set_id: None,
        allowed_actions: vec![operation.to_string()],
        allowed_refs: vec![format!("project:{project}")],
        expires_at: now.checked_add(CONTEXT_TTL).ok(),
        policy_version: policy_version.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_context_grants_exactly_the_reviewed_operation_on_the_project() {
        let caller = Caller {
            username: "system:serviceaccount:team-a:drafting-table".into(),
            uid: "u".into(),
            groups: vec![],
            extra: BTreeMap::new(),
        };
        let now: Timestamp = "2026-12-01T00:00:00Z".parse().unwrap();
        let ctx = context(
            &caller,
            Role::DraftingTable,
            "shop",
            "request.create",
            "p/v1",
            now,
        );
        assert_eq!(ctx.subject, caller.username);
        assert_eq!(ctx.role, "drafting-table");
        assert_eq!(ctx.allowed_actions, ["request.create"]);
        assert_eq!(ctx.allowed_refs, ["project:shop"]);
        assert_eq!(ctx.validate("shop", Some(now)), Ok(Role::DraftingTable));
        assert!(
            ctx.validate("shop", Some(now + CONTEXT_TTL)).is_err(),
            "expires after one request's time"
        );
        assert!(
            ctx.validate("other", Some(now)).is_err(),
            "bound to its project"
        );
    }

    #[test]
    fn access_describes_verb_resource_and_object() {
        let a = Access {
            verb: "claim".into(),
            resource: OPERATIONS,
            subresource: "job-site".into(),
            namespace: "ns".into(),
            project: "p".into(),
        };
        assert_eq!(
            a.describe(),
            "claim wmsoperations.protobot.dev/job-site ns/p"
        );
    }
}
