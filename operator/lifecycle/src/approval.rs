//! Gate-owned, single-use human approvals (§12.2), blocked-work submissions
//! (§12.3) and the approval validity rule both share.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// A human approval record.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApprovalRecord {
    /// Approval id.
    pub id: String,
    /// The human who approved.
    pub approved_subject: String,
    /// The service allowed to use it.
    pub delegated_principal: String,
    /// Optional binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// Optional binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_item_id: Option<String>,
    /// Optional binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Optional binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolution_kind: Option<String>,
    /// Optional binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_state: Option<String>,
    /// Optional binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_contract_version: Option<u64>,
    /// Optional binding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<String>,
    /// Change-set binding (newest doc).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub change_set_id: Option<String>,
    /// Digest of what was approved.
    pub resolution_digest: String,
    /// The action it authorizes.
    pub action: String,
    /// Exclusive expiry.
    #[serde(default, with = "crate::strict::timestamp_option")]
    pub expires_at: Option<Timestamp>,
    /// `unused`, `consumed`, `revoked` (anything else is not usable).
    pub status: String,
}

/// What a use of an approval requires and binds.
#[derive(Clone, Debug, Default)]
pub struct ApprovalUse<'a> {
    /// Required `action`.
    pub action: &'a str,
    /// Required delegated principal.
    pub principal: &'a str,
    /// Digest the request presents.
    pub digest: &'a str,
    /// Request-side bindings.
    pub project_id: Option<&'a str>,
    /// Request-side binding.
    pub work_item_id: Option<&'a str>,
    /// Request-side binding.
    pub request_id: Option<&'a str>,
    /// Request-side binding.
    pub resolution_kind: Option<&'a str>,
    /// Request-side binding.
    pub expected_state: Option<&'a str>,
    /// Request-side binding.
    pub expected_contract_version: Option<u64>,
    /// Request-side binding.
    pub policy_version: Option<&'a str>,
    /// Request-side binding.
    pub change_set_id: Option<&'a str>,
}

impl ApprovalRecord {
    /// Whether the approval is valid for this use at `now`.
    ///
    /// Binding rule (§20.1, newest doc): a dimension the approval binds must be
    /// present and equal on the request side (an approval bound to a value the
    /// request leaves unset fails). The change-set binding is checked on both
    /// sides: a request naming a change set needs an approval bound to that
    /// same change set (VR-050), and vice versa.
    pub fn check(&self, use_: &ApprovalUse<'_>, now: Timestamp) -> Result<(), &'static str> {
        if self.approved_subject.trim().is_empty() {
            return Err("approval has no approved human subject");
        }
        if self.delegated_principal.is_empty() || self.delegated_principal != use_.principal {
            return Err("approval is delegated to another principal");
        }
        if self.action != use_.action {
            return Err("approval authorizes another action");
        }
        if self.resolution_digest.is_empty() || self.resolution_digest != use_.digest {
            return Err("approval digest does not match");
        }
        if self.status != "unused" {
            return Err("approval is not unused");
        }
        match self.expires_at {
            Some(exp) if now < exp => {}
            _ => return Err("approval expired or has no expiry"),
        }
        fn bound(a: &Option<String>, r: Option<&str>) -> bool {
            match a.as_deref() {
                None => true,
                Some(v) => r == Some(v),
            }
        }
        let ok = bound(&self.project_id, use_.project_id)
            && bound(&self.work_item_id, use_.work_item_id)
            && bound(&self.request_id, use_.request_id)
            && bound(&self.resolution_kind, use_.resolution_kind)
            && bound(&self.expected_state, use_.expected_state)
            && self
                .expected_contract_version
                .is_none_or(|v| use_.expected_contract_version == Some(v))
            && bound(&self.policy_version, use_.policy_version);
        if !ok {
            return Err("approval is bound to other values");
        }
        let cs_req = use_.change_set_id.filter(|s| !s.is_empty());
        if self.change_set_id.as_deref().filter(|s| !s.is_empty()) != cs_req {
            return Err("approval is bound to another change set");
        }
        Ok(())
    }
}

/// A durable blocked-work resolution submission.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Submission {
    /// `resolution-submission-NNN` / `acknowledgement-NNN`.
    pub id: String,
    /// The blocked item.
    pub work_item_id: String,
    /// `add-requirement`, `out-of-scope`, `impact-amendment`, `acknowledge`.
    pub kind: String,
    /// The change set it names (add-requirement, impact-amendment).
    pub change_set_id: String,
    /// The approval it names.
    pub approval_id: String,
    /// The approval digest.
    pub approval_digest: String,
    /// The human recorded at submission.
    pub approved_human_subject: String,
    /// `pending`, `superseded`, `consumed`.
    pub status: String,
    /// Per-item submission revision.
    pub revision: u64,
    /// Independent Inspector confirmation (out-of-scope).
    pub inspector_confirmed: bool,
}
