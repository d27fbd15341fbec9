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
use protobot_lifecycle::{AuthorizationContext, Grant, NamedRef, RefField, Role};

/// The API group of the authorization resources.
pub const GROUP: &str = "protobot.dev";
/// The resource whose verbs are the adapter operations.
pub const OPERATIONS: &str = "wmsoperations";
/// The resource whose subresources are the store reads (verb `get`).
pub const READS: &str = "wmsreads";
/// The resource whose subresource is the Project and whose names are the refs
/// a payload may name (verbs [`ref_verb`]).
pub const REFS: &str = "wmsrefs";

/// The verb a ref named in `field` is reviewed with.
pub fn ref_verb(field: RefField) -> &'static str {
    match field {
        RefField::Target => "target",
        RefField::IntegrationHead | RefField::MergeCommit => "commit",
        RefField::InspectionRunId => "inspection-run",
    }
}

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
    /// The verb (an operation name, `get`, or a [`ref_verb`]).
    pub verb: String,
    /// [`OPERATIONS`], [`READS`] or [`REFS`].
    pub resource: &'static str,
    /// The role (operations), the read kind (reads) or the Project (refs).
    pub subresource: String,
    /// The Project's namespace.
    pub namespace: String,
    /// The object's name: the Project (operations, reads) or the ref (refs).
    pub name: String,
}

impl Access {
    /// Operation `operation` in `role` on Project `namespace/project`.
    pub fn operation(operation: &str, role: Role, namespace: &str, project: &str) -> Access {
        Access {
            verb: operation.to_string(),
            resource: OPERATIONS,
            subresource: role.as_str().to_string(),
            namespace: namespace.to_string(),
            name: project.to_string(),
        }
    }

    /// Store read `kind` on Project `namespace/project`.
    pub fn read(kind: &str, namespace: &str, project: &str) -> Access {
        Access {
            verb: "get".to_string(),
            resource: READS,
            subresource: kind.to_string(),
            namespace: namespace.to_string(),
            name: project.to_string(),
        }
    }

    /// Naming `named` in a payload for Project `namespace/project`.
    pub fn reference(named: &NamedRef, namespace: &str, project: &str) -> Access {
        Access {
            verb: ref_verb(named.field).to_string(),
            resource: REFS,
            subresource: project.to_string(),
            namespace: namespace.to_string(),
            name: named.name.clone(),
        }
    }

    /// `verb resource/subresource namespace/name`, for logs and refusals.
    pub fn describe(&self) -> String {
        format!(
            "{} {}.{GROUP}/{} {}/{}",
            self.verb, self.resource, self.subresource, self.namespace, self.name
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
                name: Some(access.name.clone()),
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
/// the SubjectAccessReview allowed, the only refs the Project's and the
/// payload refs each reviewed on its own (`refs`).
pub fn context(
    caller: &Caller,
    role: Role,
    project: &str,
    operation: &str,
    refs: &[NamedRef],
    policy_version: &str,
    now: Timestamp,
) -> AuthorizationContext {
    AuthorizationContext::new(Grant {
        project,
        role,
        subject: &caller.username,
        actions: &[operation],
        // At the end of time, no time left (fails closed).
        expires_at: now.checked_add(CONTEXT_TTL).unwrap_or(now),
        policy_version,
    })
    .with_refs(refs.iter().map(|r| r.name.as_str()))
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
            &[],
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
        let a = Access::operation("claim", Role::JobSite, "ns", "p");
        assert_eq!(
            a.describe(),
            "claim wmsoperations.protobot.dev/job-site ns/p"
        );
        assert_eq!(
            Access::read("findings", "ns", "p").describe(),
            "get wmsreads.protobot.dev/findings ns/p"
        );
    }

    fn named(field: RefField, name: &str) -> NamedRef {
        NamedRef {
            field,
            name: name.into(),
        }
    }

    #[test]
    fn each_payload_ref_is_reviewed_by_name_with_its_fields_verb_and_then_granted() {
        let target = Access::reference(&named(RefField::Target, "main"), "ns", "shop");
        assert_eq!(
            target.describe(),
            "target wmsrefs.protobot.dev/shop ns/main"
        );
        for (field, verb) in [
            (RefField::IntegrationHead, "commit"),
            (RefField::MergeCommit, "commit"),
            (RefField::InspectionRunId, "inspection-run"),
        ] {
            let a = Access::reference(&named(field, "x"), "ns", "shop");
            assert_eq!(
                (a.verb.as_str(), a.resource, a.name.as_str()),
                (verb, REFS, "x")
            );
        }
        let caller = Caller {
            username: "system:serviceaccount:ns:job-site".into(),
            uid: String::new(),
            groups: vec![],
            extra: BTreeMap::new(),
        };
        let now: Timestamp = "2026-12-01T00:00:00Z".parse().unwrap();
        let refs = [
            named(RefField::Target, "main"),
            named(RefField::IntegrationHead, "abc"),
            named(RefField::MergeCommit, "abc"),
        ];
        let ctx = context(
            &caller,
            Role::JobSite,
            "shop",
            "record-merge",
            &refs,
            "p/v1",
            now,
        );
        assert_eq!(ctx.allowed_refs, ["project:shop", "main", "abc"]);
        assert!(ctx.check_refs(&["main".into(), "abc".into()]).is_ok());
        assert!(
            ctx.check_refs(&["run-1".into()]).is_err(),
            "a ref that was not reviewed is not granted"
        );
    }
}
