//! The work-item execution lease (`status.lease` of a `BuildWorkItem`) and the pure rule
//! that mirrors it as the `Leased` condition.
//!
//! A lease is live while the evaluation time is strictly before `renewTime +
//! durationSeconds` (`contracts/lifecycle.md` §6: "expired" means expiry ≤ now). The
//! evaluation time is always passed in: lease time comes from the operator's clock only, and
//! the caller decides which clock that is.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::conditions::{ConditionStatus, ConditionUpdate, reasons, types};

/// The lease a Job Site holds on a work item while it is `building`, `inspecting` or
/// `merging` (where it is the merge fence).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// Trusted subject of the Job Site that holds the lease; it is the work item's owner.
    #[schemars(length(min = 1))]
    pub holder: String,
    /// Opaque fencing token minted by the store when the lease was issued (`fence-<n>` from
    /// the project's counter, which only grows, so a token is never reused); every fenced
    /// command must present it. A new claim issues a new token and kills the old one.
    #[schemars(length(min = 1))]
    pub fencing_token: String,
    /// When the lease (and its token) was issued.
    pub acquire_time: Time,
    /// When the lease was last issued or renewed; the expiry counts from here.
    pub renew_time: Time,
    /// Lease length in seconds, counted from `renewTime` (the project default is 900).
    #[schemars(range(min = 1))]
    pub duration_seconds: u32,
}

impl Lease {
    /// When the lease expires: `renewTime + durationSeconds` (saturating at the latest
    /// representable time).
    pub fn expires_at(&self) -> Timestamp {
        self.renew_time
            .0
            .checked_add(SignedDuration::from_secs(i64::from(self.duration_seconds)))
            .unwrap_or(Timestamp::MAX)
    }

    /// Whether the lease is live at `now`, i.e. `now` is strictly before the expiry.
    pub fn is_live_at(&self, now: Timestamp) -> bool {
        now < self.expires_at()
    }
}

/// Computes the `Leased` condition from the recorded lease at the evaluation time `now`:
///
/// | lease | status | reason |
/// | --- | --- | --- |
/// | none | `False` | `NotLeased` |
/// | live at `now` | `True` | `LeaseHeld` (message names the holder and the expiry) |
/// | expiry ≤ `now` | `False` | `LeaseExpired` (message names the holder and the expiry) |
///
/// The fencing token is deliberately not part of the message.
pub fn leased_condition(lease: Option<&Lease>, now: Timestamp) -> ConditionUpdate {
    match lease {
        None => ConditionUpdate::new(
            types::LEASED,
            ConditionStatus::False,
            reasons::NOT_LEASED,
            "no lease is recorded",
        ),
        Some(lease) if lease.is_live_at(now) => ConditionUpdate::new(
            types::LEASED,
            ConditionStatus::True,
            reasons::LEASE_HELD,
            format!("held by {} until {}", lease.holder, lease.expires_at()),
        ),
        Some(lease) => ConditionUpdate::new(
            types::LEASED,
            ConditionStatus::False,
            reasons::LEASE_EXPIRED,
            format!(
                "lease of {} expired at {}",
                lease.holder,
                lease.expires_at()
            ),
        ),
    }
}
