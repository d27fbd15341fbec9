//! The closed vocabulary of validation-rules/v1: states, lifecycle commands, roles,
//! the 30 adapter operations, rejection codes and retry hints.
//!
//! Names are the contract (`contracts/lifecycle.md` §1–§2); every enum here
//! round-trips through its exact wire spelling.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Defines a closed string enum with its wire names, `as_str`, `parse` and `ALL`.
macro_rules! wire_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $wire:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $wire)] $variant),+
        }

        impl $name {
            /// Every value, in contract order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The exact wire spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $wire),+ }
            }

            /// Parses the exact wire spelling (no case folding, no trimming).
            pub fn parse(s: &str) -> Option<Self> {
                match s { $($wire => Some($name::$variant),)+ _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

wire_enum! {
    /// A work-item lifecycle state. `Initial` is input-only: it is what `materialize`
    /// expects when no record exists yet, and is never stored.
    State {
        /// No record yet (input-only, expected version 0).
        Initial = "initial",
        /// Complete contract; a build-work dependency is not finished.
        Waiting = "waiting",
        /// Claimable.
        ReadyForBuilding = "ready-for-building",
        /// One Job Site holds a live lease and produces the change.
        Building = "building",
        /// Independent inspection of a candidate that passed the building gate.
        Inspecting = "inspecting",
        /// Needs a spec, impact, policy or reconciliation decision.
        Blocked = "blocked",
        /// The tested candidate is being merged under the merge fence.
        Merging = "merging",
        /// Terminal: merged with completion evidence.
        Completed = "completed",
        /// Terminal: cancelled, shown never to have integrated anything.
        Abandoned = "abandoned",
    }
}

impl State {
    /// True for `completed` and `abandoned`.
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Completed | State::Abandoned)
    }
}

wire_enum! {
    /// The 16 lifecycle commands evaluated by validation-rules/v1.
    Command {
        /// Create the work item from an approved source contract.
        Materialize = "materialize",
        /// `waiting` → `ready-for-building` once dependencies completed.
        RefreshDependencies = "refresh-dependencies",
        /// `waiting`/`ready-for-building` → `blocked` when a refresh finds a problem.
        Revalidate = "revalidate",
        /// `blocked` → `ready-for-building` with a consumed human approval.
        ResolveBlock = "resolve-block",
        /// Take a ready item: lease + fencing token.
        Claim = "claim",
        /// Extend the live lease.
        RenewLease = "renew-lease",
        /// `building` → `inspecting`.
        TestsPass = "tests-pass",
        /// Active work → `blocked` with a question.
        RaiseSpecQuestion = "raise-spec-question",
        /// Re-check readiness of active work.
        RefreshActive = "refresh-active",
        /// `inspecting` → `building` for rework.
        ReturnToBuilding = "return-to-building",
        /// `inspecting` → `merging` with the tested-candidate envelope.
        BeginMerge = "begin-merge",
        /// A merge conflicted (Job Site → building, reconciler → ready).
        MergeConflict = "merge-conflict",
        /// Reconciler: the merge never landed.
        MergeNotApplied = "merge-not-applied",
        /// `merging` → `completed`.
        RecordMerge = "record-merge",
        /// Reconciler: take back an expired lease.
        RecoverLease = "recover-lease",
        /// Human: cancel work that never integrated.
        Abandon = "abandon",
    }
}

wire_enum! {
    /// Trusted roles a Gate context may carry.
    Role {
        /// A person maintaining the project.
        HumanMaintainer = "human-maintainer",
        /// The Drafting Table agent (requests, previews, blocked-work submissions).
        DraftingTable = "drafting-table",
        /// The Materializer.
        Materializer = "materializer",
        /// A Job Site.
        JobSite = "job-site",
        /// The Git/WMS reconciler.
        Reconciler = "reconciler",
    }
}

wire_enum! {
    /// The adapter API: exactly these 30 operations, in contract order.
    Operation {
        /// Create a request.
        RequestCreate = "request.create",
        /// Refine a request (human approval).
        RequestRefine = "request.refine",
        /// Human business priority.
        RequestUpdatePriority = "request.update-priority",
        /// Link a change set to a request.
        RequestLinkChangeSet = "request.link-change-set",
        /// Link an existing build work item to a request.
        RequestLinkBuildWorkItem = "request.link-build-work-item",
        /// Read one request.
        RequestGet = "request.get",
        /// Query requests.
        RequestQuery = "request.query",
        /// Read one work item (sanitized).
        WorkItemGet = "work-item.get",
        /// Query work items (sanitized).
        WorkItemQuery = "work-item.query",
        /// List blocked work with resolution options.
        BlockedWorkQuery = "blocked-work.query",
        /// Advisory evaluation of a lifecycle command.
        LifecyclePreflight = "lifecycle.preflight",
        /// Submit a human-approved resolution for blocked work.
        BlockedWorkSubmitResolution = "blocked-work.submit-resolution",
        /// Acknowledge blocked work (consumes an approval).
        BlockedWorkAcknowledge = "blocked-work.acknowledge",
        /// Lifecycle: materialize.
        Materialize = "materialize",
        /// Lifecycle: refresh-dependencies.
        RefreshDependencies = "refresh-dependencies",
        /// Lifecycle: revalidate.
        Revalidate = "revalidate",
        /// Lifecycle: resolve-block.
        ResolveBlock = "resolve-block",
        /// Lifecycle: claim.
        Claim = "claim",
        /// Lifecycle: renew-lease.
        RenewLease = "renew-lease",
        /// Lifecycle: tests-pass.
        TestsPass = "tests-pass",
        /// Lifecycle: raise-spec-question.
        RaiseSpecQuestion = "raise-spec-question",
        /// Lifecycle: refresh-active.
        RefreshActive = "refresh-active",
        /// Lifecycle: return-to-building.
        ReturnToBuilding = "return-to-building",
        /// Lifecycle: begin-merge.
        BeginMerge = "begin-merge",
        /// Lifecycle: merge-conflict.
        MergeConflict = "merge-conflict",
        /// Lifecycle: merge-not-applied.
        MergeNotApplied = "merge-not-applied",
        /// Lifecycle: record-merge.
        RecordMerge = "record-merge",
        /// Lifecycle: recover-lease.
        RecoverLease = "recover-lease",
        /// Lifecycle: abandon.
        Abandon = "abandon",
        /// Finding Ledger append (Job Site only).
        FindingCreate = "finding.create",
    }
}

impl Operation {
    /// The lifecycle command this operation is, if it is one.
    pub fn command(self) -> Option<Command> {
        Command::parse(self.as_str())
    }

    /// The harness tool name: every `.` and `-` becomes `_`.
    pub fn tool_name(self) -> String {
        self.as_str().replace(['.', '-'], "_")
    }
}

wire_enum! {
    /// Stable rejection codes. Clients branch on these and on `details`, never on messages.
    Code {
        /// Authorization context, role, action, ref or approval failure.
        UnauthorizedAction = "UNAUTHORIZED_ACTION",
        /// Malformed or unknown request fields.
        InvalidRequest = "INVALID_REQUEST",
        /// Target not visible in the project.
        NotFound = "NOT_FOUND",
        /// Key reused with a different fingerprint or source.
        IdempotencyConflict = "IDEMPOTENCY_CONFLICT",
        /// The item is completed or abandoned.
        AlreadyTerminal = "ALREADY_TERMINAL",
        /// Another owner holds a live lease.
        DuplicateClaim = "DUPLICATE_CLAIM",
        /// Expected state differs from the stored state.
        StaleState = "STALE_STATE",
        /// Expected contract version differs (or is missing).
        StaleContractVersion = "STALE_CONTRACT_VERSION",
        /// Fence missing, expired, owned by another subject or superseded.
        StaleFencingToken = "STALE_FENCING_TOKEN",
        /// The command is not legal from the current state.
        InvalidTransition = "INVALID_TRANSITION",
        /// A command precondition or required evidence is missing.
        PreconditionFailed = "PRECONDITION_FAILED",
        /// Change type outside `undefined|changes|contradicts`.
        InvalidChangeType = "INVALID_CHANGE_TYPE",
        /// The store could not answer.
        WmsUnavailable = "WMS_UNAVAILABLE",
        /// Semantically identical request exists.
        DuplicateRequest = "DUPLICATE_REQUEST",
        /// Expected request revision differs.
        StaleRequestRevision = "STALE_REQUEST_REVISION",
        /// The write's outcome is unknown: read, then retry with the same key.
        UnknownMutation = "UNKNOWN_MUTATION",
    }
}

wire_enum! {
    /// What a client should do after a rejection.
    Retry {
        /// Obtain a fresh or broader authorization context.
        Authorize = "authorize",
        /// Re-read the record and retry with current expectations.
        Refresh = "refresh",
        /// Read state and reconcile before retrying with the same key.
        Reconcile = "reconcile",
        /// Retry only with a new idempotency key.
        NewKey = "new-key",
        /// Query the current owner or record.
        Query = "query",
        /// Never retry.
        Never = "never",
    }
}

impl Code {
    /// The default retry hint of a code (some call sites override it, e.g.
    /// a materialization-source conflict asks to reconcile).
    pub fn default_retry(self) -> Retry {
        match self {
            Code::UnauthorizedAction => Retry::Authorize,
            Code::InvalidRequest | Code::IdempotencyConflict | Code::InvalidChangeType => {
                Retry::NewKey
            }
            Code::NotFound
            | Code::StaleState
            | Code::StaleContractVersion
            | Code::InvalidTransition
            | Code::PreconditionFailed
            | Code::StaleRequestRevision
            | Code::WmsUnavailable => Retry::Refresh,
            Code::AlreadyTerminal => Retry::Never,
            Code::DuplicateClaim | Code::DuplicateRequest => Retry::Query,
            Code::StaleFencingToken | Code::UnknownMutation => Retry::Reconcile,
        }
    }
}
