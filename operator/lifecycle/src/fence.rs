//! The fencing token (§6): minted by the WMS for a fence-issuing transition
//! ([`FencingToken::mint`]), held in the item's [`Lease`](crate::Lease), returned to
//! the new owner in the decision, presented by every fenced command and
//! observation, and admitted by one check, [`Lease::admits`](crate::Lease::admits).
//!
//! Pure: no clock, no store. The wire form is the bare string (`fence-<n>`), so
//! stored records, CRD status and JSON schemas read the same as before the type.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An opaque fencing token. The empty token is "no fence presented" (an
/// envelope's default); a lease never holds one, because [`FencingToken::mint`]
/// never makes one and the evaluator fails closed without a minted token.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FencingToken(String);

/// The schema of the bare string, inlined where a token appears (the derive would name a
/// schema of its own and change the published OpenAPI description).
#[cfg(feature = "schemars")]
impl schemars::JsonSchema for FencingToken {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        String::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        String::json_schema(generator)
    }
}

impl FencingToken {
    /// The token a store mints from its fence counter (`fence-<counter>`). The
    /// counter lives in the store and survives restarts, so a token is never
    /// handed out twice.
    pub fn mint(counter: u64) -> FencingToken {
        FencingToken(format!("fence-{counter}"))
    }

    /// Whether no token is presented.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The token as written on the wire.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A token read back from the wire or from storage (a CRD status, a test fixture).
impl From<String> for FencingToken {
    fn from(token: String) -> FencingToken {
        FencingToken(token)
    }
}

/// A token read back from the wire or from storage (a CRD status, a test fixture).
impl From<&str> for FencingToken {
    fn from(token: &str) -> FencingToken {
        FencingToken(token.to_owned())
    }
}

impl From<FencingToken> for String {
    fn from(token: FencingToken) -> String {
        token.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl PartialEq<str> for FencingToken {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<String> for FencingToken {
    fn eq(&self, other: &String) -> bool {
        self.0 == *other
    }
}

impl PartialEq<&str> for FencingToken {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// Why a Job Site caller's fence is refused (§6 `fence_status`, in the order
/// the contract checks them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceStatus {
    /// The item holds no lease.
    Missing,
    /// The lease expired (`expires_at <= now`); a correct token does not help.
    Expired,
    /// The lease belongs to another subject.
    OwnerMismatch,
    /// The token is empty or not the lease's.
    Stale,
}

impl FenceStatus {
    /// The contractual `fence_status` detail.
    pub fn as_str(self) -> &'static str {
        match self {
            FenceStatus::Missing => "missing",
            FenceStatus::Expired => "expired",
            FenceStatus::OwnerMismatch => "owner-mismatch",
            FenceStatus::Stale => "stale",
        }
    }
}

impl fmt::Display for FenceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_token_is_its_bare_string_on_the_wire() {
        let token = FencingToken::mint(7);
        assert_eq!(token, "fence-7");
        assert_eq!(serde_json::to_value(&token).unwrap(), "fence-7");
        let back: FencingToken = serde_json::from_str("\"fence-7\"").unwrap();
        assert_eq!(back, token);
        assert!(FencingToken::default().is_empty());
        assert!(!token.is_empty());
    }

    #[test]
    fn a_lease_admits_its_own_token_only_and_refuses_in_the_contract_order() {
        let at = |s: i64| jiff::Timestamp::from_second(1_800_000_000 + s).unwrap();
        let lease = crate::Lease {
            owner: "job-site-a".into(),
            fencing_token: FencingToken::mint(3),
            expires_at: at(60),
        };
        let (live, other, none) = (
            FencingToken::mint(3),
            FencingToken::mint(4),
            FencingToken::default(),
        );
        assert!(lease.admits(&live));
        assert!(!lease.admits(&other));
        assert!(!lease.admits(&none));
        assert_eq!(lease.refusal("job-site-a", &live, at(0)), None);
        assert_eq!(
            lease.refusal("job-site-a", &other, at(0)),
            Some(FenceStatus::Stale)
        );
        assert_eq!(
            lease.refusal("job-site-b", &other, at(0)),
            Some(FenceStatus::OwnerMismatch)
        );
        // Expiry is exclusive and checked first: the live token does not help.
        assert_eq!(
            lease.refusal("job-site-a", &live, at(60)),
            Some(FenceStatus::Expired)
        );
    }
}
