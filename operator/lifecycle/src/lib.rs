//! validation-rules/v1: the work-item lifecycle ruleset (as data) and its pure,
//! deterministic evaluator.
//!
//! Nothing here touches a clock, a store, Kubernetes or the network: callers
//! pass the trusted evaluation time and every trusted input, and receive the
//! decision plus the effects to write atomically. The contract is
//! `contracts/lifecycle.md`; where its sources disagree (§20) the newest
//! document wins, and each such choice is noted where it is implemented.

pub mod approval;
pub mod context;
pub mod envelope;
pub mod evaluator;
pub mod fence;
pub mod fingerprint;
pub mod inspect;
pub mod record;
pub mod ruleset;
pub mod strict;
pub mod vocab;

pub use approval::{ApprovalRecord, ApprovalUse, Submission};
pub use context::{AuthorizationContext, Grant};
pub use envelope::{
    Authority, CommandRequest, Decision, DecisionOutcome, EnvelopeOutcome, IdempotencyStatus,
    LifecyclePayload, Mutation, OperationEnvelope, Rejection, ResultEnvelope, StateVersion,
    WorkItemView,
};
pub use evaluator::{
    AuditEvent, Effects, Evaluation, IdempotencyEntry, Inputs, Prepared, Reservation, evaluate,
    evaluate_prepared, prepare,
};
pub use fence::{FenceStatus, FencingToken};
pub use record::{
    ATTEMPTS_KEPT, AttemptRecord, BUILD_BRANCH_SLUG, Dependency, Lease, MergeEnvelope, NamedRef,
    Readiness, Reconciliation, RefField, SourceContract, WorkItemRecord, integration_branch,
};
pub use ruleset::{RULE_VERSION, Ruleset};
pub use vocab::{Code, Command, Operation, Retry, Role, State};
