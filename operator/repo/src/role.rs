//! Sandboxed roles and what each may see and write, by path class.
//!
//! Pure. Worker A: shared + valid tests, writes tests. Worker B: shared + implementation,
//! writes implementation. Inspector: the read-only candidate minus integration-only paths.
//! Unclassified paths are denied to every role.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

use crate::manifest::PathClass;

/// A role that receives a projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Test worker.
    WorkerA,
    /// Implementation worker.
    WorkerB,
    /// Read-only reviewer of the candidate.
    Inspector,
}

/// Whether a role sees a `test` path depends on the test catalog; everything else is by class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// Exported.
    Visible,
    /// Exported unless the test catalog withholds it (quarantined or legacy) and the current
    /// build did not write it.
    IfValidTest,
    /// Never exported.
    Hidden,
}

impl Role {
    /// Stable name used in trailers, records and CLI flags.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::WorkerA => "worker-a",
            Role::WorkerB => "worker-b",
            Role::Inspector => "inspector",
        }
    }

    /// What the role sees of a path of class `class` (`None` = unclassified).
    pub fn visibility(self, class: Option<PathClass>) -> Visibility {
        use PathClass::*;
        match (self, class) {
            (_, None) => Visibility::Hidden,
            (_, Some(Shared)) => Visibility::Visible,
            (Role::WorkerA, Some(Test)) => Visibility::IfValidTest,
            (Role::WorkerB, Some(Implementation)) => Visibility::Visible,
            (Role::Inspector, Some(Test | Implementation | AttestationOnly)) => Visibility::Visible,
            _ => Visibility::Hidden,
        }
    }

    /// The one class the role may write, if any.
    pub fn writable_class(self) -> Option<PathClass> {
        match self {
            Role::WorkerA => Some(PathClass::Test),
            Role::WorkerB => Some(PathClass::Implementation),
            Role::Inspector => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A role name that is not `A`, `B`, `inspector` or a canonical role name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse role `{0}`: expected A, B or inspector")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;

    /// Accepts the CLI spellings `A`, `B`, `inspector` and the canonical names.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "A" | "a" | "worker-a" => Ok(Role::WorkerA),
            "B" | "b" | "worker-b" => Ok(Role::WorkerB),
            "inspector" | "Inspector" => Ok(Role::Inspector),
            other => Err(UnknownRole(other.to_owned())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_role_sees_unclassified_or_integration_only_and_workers_never_see_each_other() {
        for role in [Role::WorkerA, Role::WorkerB, Role::Inspector] {
            assert_eq!(role.visibility(None), Visibility::Hidden);
            assert_eq!(
                role.visibility(Some(PathClass::IntegrationOnly)),
                Visibility::Hidden
            );
        }
        assert_eq!(
            Role::WorkerA.visibility(Some(PathClass::Implementation)),
            Visibility::Hidden
        );
        assert_eq!(
            Role::WorkerB.visibility(Some(PathClass::Test)),
            Visibility::Hidden
        );
        assert_eq!(
            Role::WorkerA.visibility(Some(PathClass::AttestationOnly)),
            Visibility::Hidden
        );
        assert_eq!(
            Role::WorkerB.visibility(Some(PathClass::AttestationOnly)),
            Visibility::Hidden
        );
        assert_eq!("A".parse::<Role>(), Ok(Role::WorkerA));
        assert!("C".parse::<Role>().is_err());
    }
}
