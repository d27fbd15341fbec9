//! The typed `BuildWorkItemStatus` the Kubernetes store writes: one pure function of the
//! item's shard (record and audit tail), the status it replaces, the object's generation and
//! the evaluation time. It is the only status model of a work item: every field of the CRD's
//! status is derived here from the record or removed from the CRD, and the record itself
//! travels in `ledger`, from which the store reads it back (these fields are for humans,
//! dashboards and GitOps tools; nothing reads them to decide).
//!
//! Time comes only from the caller: the evaluation time of the command that produced the
//! shard, or for trusted observations and imports (which carry no evaluation time) the
//! latest time the record itself knows. Conditions keep their `lastTransitionTime` unless
//! their status changes, so a lease renewal does not look like a new `Leased` transition.

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use protobot_api::{
    BuildWorkItemStatus, Lease, LifecycleState,
    build_work_item::{
        CompletionEvidence, ContractVersionEntry, CycleOutcome, CycleRecord, DependencyStatus,
        GitMutation, MergeEnvelope, Readiness, Reconciliation, ReconciliationStatus, StageUsage,
        TierUsage, UsageAmount, UsageStage, UsageStatus,
    },
    common::{LifecycleCommand, ModelTier},
};
use protobot_lifecycle::{Command, State, WorkItemRecord};

use super::shard::ItemShard;

/// What a status write knows besides the shard.
#[derive(Clone, Copy, Debug)]
pub struct StatusClock {
    /// The evaluation time of the command being written; `None` for observations and
    /// imports, which then use the latest time recorded in the item.
    pub now: Option<Timestamp>,
    /// The project's lease length, for a lease whose issue time is not otherwise known.
    pub lease_seconds: i64,
}

/// A record the status cannot describe (never produced by the evaluator).
#[derive(Debug, thiserror::Error)]
#[error(
    "work item {id} is in state {state}, which is never stored; the record is corrupt: restore it from a backup or abandon the item"
)]
pub struct UnstorableState {
    /// The work item.
    pub id: String,
    /// Its state.
    pub state: State,
}

/// The status an item carries, read back for the next write to build on.
///
/// Only the record in `ledger` is authority; the other fields are the previous write's
/// mirror, kept so that transition, acquire and observation times survive. A status this
/// version cannot decode (written by an older operator under an older schema and stored in
/// etcd as it was) is [`PreviousStatus::Unreadable`]: the next write rebuilds every mirrored
/// field from the record, as for a new item, instead of failing the project.
#[derive(Clone, Debug, PartialEq)]
pub enum PreviousStatus {
    /// No status yet (the item was created but its first status write did not happen).
    Absent,
    /// The status as typed.
    Typed(Box<BuildWorkItemStatus>),
    /// A status whose mirrored fields do not decode; why, for the log.
    Unreadable(String),
}

impl PreviousStatus {
    /// Decodes the raw `status` of an item object.
    pub fn decode(raw: Option<&serde_json::Value>) -> PreviousStatus {
        match raw {
            None | Some(serde_json::Value::Null) => PreviousStatus::Absent,
            Some(raw) => match serde_json::from_value::<BuildWorkItemStatus>(raw.clone()) {
                Ok(status) => PreviousStatus::Typed(Box::new(status)),
                Err(e) => PreviousStatus::Unreadable(e.to_string()),
            },
        }
    }

    /// The typed status, if there is one to build on.
    pub fn typed(self) -> Option<BuildWorkItemStatus> {
        match self {
            PreviousStatus::Typed(status) => Some(*status),
            PreviousStatus::Absent | PreviousStatus::Unreadable(_) => None,
        }
    }
}

/// The ledger of an item object's raw `status` (`None` before its first status write). Read
/// without the rest of the status, so that a mirror written by an older version never hides
/// the record.
pub fn raw_ledger(raw: Option<&serde_json::Value>) -> Option<&str> {
    raw.and_then(|s| s.get("ledger"))
        .and_then(serde_json::Value::as_str)
}

/// The status of the item in `shard` (whose record is `record`), replacing `previous`.
pub fn item_status(
    record: &WorkItemRecord,
    shard: &ItemShard,
    previous: Option<&BuildWorkItemStatus>,
    ledger: String,
    generation: Option<i64>,
    clock: StatusClock,
) -> Result<BuildWorkItemStatus, UnstorableState> {
    let state = lifecycle_state(record.state).ok_or_else(|| UnstorableState {
        id: record.id.clone(),
        state: record.state,
    })?;
    let now = clock.now.unwrap_or_else(|| record_clock(record, previous));
    let mut status = previous
        .cloned()
        .unwrap_or_else(|| BuildWorkItemStatus::materialized(state));
    status.state = state;
    status.contract_version = record.contract_version;
    append_transitions(&mut status, record, shard, now);
    status.owner = non_empty(&record.owner);
    status.lease = record
        .lease
        .as_ref()
        .map(|l| lease(l, previous.and_then(|p| p.lease.as_ref()), clock, now));
    status.readiness = Some(readiness(&record.readiness));
    status.dependencies = record
        .dependencies
        .iter()
        .filter(|d| !d.id.is_empty())
        .map(|d| DependencyStatus {
            id: d.id.clone(),
            state: lifecycle_state(d.state),
        })
        .collect();
    status.block_reason = non_empty(&record.block_reason);
    status.active_resolution_submission_id = non_empty(&record.active_resolution_submission_id);
    status.inspection_run_sealed = record.inspection_run_sealed;
    status.findings_terminal = record.findings_terminal;
    status.final_tests_passed = record.final_tests_passed;
    status.expected_merge = record.expected_merge.as_ref().map(envelope);
    let reconciliation = record.reconciliation.as_ref().and_then(reconciliation);
    status.reconciliation = reconciliation.map(|mut r| {
        // The observation time moves only when the evidence does.
        r.observed_time = previous
            .and_then(|p| p.reconciliation.as_ref())
            .filter(|p| p.status == r.status && p.merge_envelope == r.merge_envelope)
            .and_then(|p| p.observed_time.clone())
            .or(Some(Time(now)));
        r
    });
    let claimed = !record.attempts.is_empty()
        || matches!(
            state,
            LifecycleState::Building
                | LifecycleState::Inspecting
                | LifecycleState::Merging
                | LifecycleState::Completed
        );
    if claimed || status.branch.is_some() {
        status.branch = Some(protobot_lifecycle::integration_branch(&record.id));
    }
    status.cycles = record.attempts.iter().filter_map(cycle).collect();
    let newest = record.attempts.iter().max_by_key(|a| a.cycle);
    status.escalation_tier = newest.and_then(|a| tier(&a.tier));
    status.candidate_commit = record
        .expected_merge
        .as_ref()
        .map(|m| m.integration_head.clone())
        .filter(|h| is_commit(h))
        .or_else(|| {
            newest
                .map(|a| a.candidate_commit.clone())
                .filter(|c| is_commit(c))
        });
    let recorded = status
        .reconciliation
        .as_ref()
        .filter(|r| r.status == ReconciliationStatus::MergeRecorded)
        .cloned();
    status.merge_commit = recorded
        .as_ref()
        .and_then(|r| r.merge_envelope.as_ref())
        .and_then(|m| m.merge_commit.clone())
        // The record holds what the caller sent; the CRD's field is a commit id.
        .filter(|c| is_commit(c));
    status.completion = match (&recorded, state) {
        (Some(r), LifecycleState::Completed) => {
            r.merge_envelope
                .clone()
                .map(|merge_envelope| CompletionEvidence {
                    merge_envelope,
                    verified_on_target: r.git_mutation == GitMutation::Merged,
                    completed_time: Time(record.state_since.unwrap_or(now)),
                })
        }
        _ => None,
    };
    status.usage = usage(&record.usage);
    status.observed_generation = generation;
    status.ledger = Some(ledger);
    status.mirror_conditions(generation, now);
    Ok(status)
}

/// The latest time the record knows: when it entered its state, when its newest attempt
/// ended, when its lease was last issued (or, with no record time at all, the epoch).
fn record_clock(record: &WorkItemRecord, previous: Option<&BuildWorkItemStatus>) -> Timestamp {
    let attempts = record.attempts.iter().map(|a| a.finished_at);
    let renewed = previous
        .and_then(|p| p.lease.as_ref())
        .map(|l| l.renew_time.0);
    record
        .state_since
        .into_iter()
        .chain(attempts)
        .chain(renewed)
        .max()
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

/// Appends the transitions the audit tail holds past the newest recorded version.
fn append_transitions(
    status: &mut BuildWorkItemStatus,
    record: &WorkItemRecord,
    shard: &ItemShard,
    now: Timestamp,
) {
    let mut last = status.contract_versions.last().map_or(0, |e| e.version);
    for event in &shard.audit {
        let Some(after) = event.after.as_ref() else {
            continue;
        };
        if event.work_item_id != record.id || after.contract_version <= last {
            continue;
        }
        let (Some(command), Some(state)) = (
            Command::parse(&event.operation).map(lifecycle_command),
            lifecycle_state(after.state),
        ) else {
            continue;
        };
        last = after.contract_version;
        status.record_contract_version(ContractVersionEntry {
            version: after.contract_version,
            command,
            state,
            actor: non_empty(&event.subject),
            idempotency_key: non_empty(&event.idempotency_key),
            time: Time(now),
        });
    }
}

/// The lease for humans. A lease that was issued or renewed by this write (its token or
/// expiry moved) was renewed at `now`; one that did not move keeps its times.
fn lease(
    lease: &protobot_lifecycle::Lease,
    previous: Option<&Lease>,
    clock: StatusClock,
    now: Timestamp,
) -> Lease {
    let same_token = previous.filter(|p| lease.fencing_token == p.fencing_token.as_str());
    let unchanged = same_token.filter(|p| p.expires_at() == lease.expires_at);
    if let Some(p) = unchanged {
        return p.clone();
    }
    let renew = match clock.now {
        Some(now) if now < lease.expires_at => now,
        _ => lease
            .expires_at
            .checked_sub(SignedDuration::from_secs(clock.lease_seconds.max(1)))
            .unwrap_or(now),
    };
    let seconds = lease.expires_at.duration_since(renew).as_secs().max(1);
    Lease {
        holder: lease.owner.clone(),
        fencing_token: lease.fencing_token.to_string(),
        acquire_time: same_token.map_or(Time(renew), |p| p.acquire_time.clone()),
        renew_time: Time(renew),
        duration_seconds: u32::try_from(seconds).unwrap_or(u32::MAX),
    }
}

fn readiness(r: &protobot_lifecycle::Readiness) -> Readiness {
    Readiness {
        contract_complete: r.contract_complete,
        source_immutable: r.source_immutable,
        specification_validated: r.specification_validated,
        requirement_references_valid: r.requirement_references_valid,
        pipeline_entry_satisfied: r.pipeline_entry_satisfied,
        impact_dispositioned: r.impact_dispositioned,
        policy_compatible: r.policy_compatible,
        unresolved_reasons: r
            .unresolved_reasons
            .iter()
            .take(protobot_api::build_work_item::UNRESOLVED_REASONS_LIMIT as usize)
            .cloned()
            .collect(),
    }
}

fn envelope(m: &protobot_lifecycle::MergeEnvelope) -> MergeEnvelope {
    MergeEnvelope {
        product_tree_digest: m.product_tree_digest.clone(),
        inspection_run_id: m.inspection_run_id.clone(),
        integration_head: m.integration_head.clone(),
        target: m.target.clone(),
        contract_version: m.contract_version,
        merge_commit: non_empty(&m.merge_commit),
    }
}

fn reconciliation(r: &protobot_lifecycle::Reconciliation) -> Option<Reconciliation> {
    let status = match r.status.as_str() {
        "conflict" => ReconciliationStatus::Conflict,
        "not-applied" => ReconciliationStatus::NotApplied,
        "merge-recorded" => ReconciliationStatus::MergeRecorded,
        "lease-recovered" => ReconciliationStatus::LeaseRecovered,
        "not-integrated" => ReconciliationStatus::NotIntegrated,
        _ => return None,
    };
    let git_mutation = match r.git_mutation.as_str() {
        "none" => GitMutation::None,
        "conflict" => GitMutation::Conflict,
        "merged" => GitMutation::Merged,
        _ => return None,
    };
    Some(Reconciliation {
        status,
        git_mutation,
        merge_envelope: r.merge_envelope.as_ref().map(envelope),
        observed_time: None,
    })
}

fn cycle(a: &protobot_lifecycle::AttemptRecord) -> Option<CycleRecord> {
    let outcome = match a.outcome.as_str() {
        "passed" => CycleOutcome::Passed,
        "test" => CycleOutcome::TestFault,
        "implementation" => CycleOutcome::ImplementationFault,
        "both" => CycleOutcome::BothFaults,
        "rejected-inspection" => CycleOutcome::RejectedInspection,
        _ => CycleOutcome::Transient,
    };
    Some(CycleRecord {
        cycle: a.cycle.max(1),
        tier: tier(&a.tier)?,
        outcome,
        candidate_commit: Some(a.candidate_commit.clone()).filter(|c| is_commit(c)),
        start_time: Time(a.started_at.unwrap_or(a.finished_at)),
        end_time: Some(Time(a.finished_at)),
    })
}

/// The bounded usage summary of the record's ledger (`None` before any model call).
fn usage(ledger: &protobot_usage::UsageLedger) -> Option<UsageStatus> {
    if ledger.is_empty() {
        return None;
    }
    let summary = ledger.summary();
    let stage = |s: protobot_usage::Stage| match s {
        protobot_usage::Stage::WorkerA => UsageStage::WorkerA,
        protobot_usage::Stage::WorkerB => UsageStage::WorkerB,
        protobot_usage::Stage::Integration => UsageStage::Integration,
        protobot_usage::Stage::Inspection => UsageStage::Inspection,
    };
    Some(UsageStatus {
        runs: summary.runs,
        total: amount(&summary.total),
        stages: summary
            .by_stage
            .iter()
            .map(|(s, spent)| StageUsage {
                stage: stage(*s),
                spent: amount(spent),
            })
            .collect(),
        // Only the four tiers the Job Site escalates through; the ledger holds no other.
        tiers: summary
            .by_tier
            .iter()
            .filter_map(|(t, spent)| {
                tier(t).map(|tier| TierUsage {
                    tier,
                    spent: amount(spent),
                })
            })
            .collect(),
    })
}

fn amount(spend: &protobot_usage::Spend) -> UsageAmount {
    let t = &spend.tokens;
    let cost = spend.cost();
    UsageAmount {
        calls: spend.calls,
        calls_without_usage: spend.calls_without_usage,
        input_tokens: t.input,
        output_tokens: t.output,
        cache_read_tokens: t.cache_read,
        cache_write_tokens: t.cache_write,
        reasoning_tokens: t.reasoning,
        cost_microdollars: cost.map(|c| c.0),
        unpriced_calls: spend.unpriced_calls,
        cost: cost.map_or_else(|| "unknown".to_owned(), |c| c.to_string()),
    }
}

fn tier(t: &str) -> Option<ModelTier> {
    match t {
        "t1" => Some(ModelTier::T1),
        "t2" => Some(ModelTier::T2),
        "t3" => Some(ModelTier::T3),
        "t4" => Some(ModelTier::T4),
        _ => None,
    }
}

fn is_commit(s: &str) -> bool {
    s.len() == 40 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// The stored state for a record state; `None` for `initial`, which is never stored.
pub fn lifecycle_state(state: State) -> Option<LifecycleState> {
    Some(match state {
        State::Initial => return None,
        State::Waiting => LifecycleState::Waiting,
        State::ReadyForBuilding => LifecycleState::ReadyForBuilding,
        State::Building => LifecycleState::Building,
        State::Inspecting => LifecycleState::Inspecting,
        State::Blocked => LifecycleState::Blocked,
        State::Merging => LifecycleState::Merging,
        State::Completed => LifecycleState::Completed,
        State::Abandoned => LifecycleState::Abandoned,
    })
}

/// The CRD's spelling of a lifecycle command.
pub fn lifecycle_command(command: Command) -> LifecycleCommand {
    match command {
        Command::Materialize => LifecycleCommand::Materialize,
        Command::RefreshDependencies => LifecycleCommand::RefreshDependencies,
        Command::Revalidate => LifecycleCommand::Revalidate,
        Command::ResolveBlock => LifecycleCommand::ResolveBlock,
        Command::Claim => LifecycleCommand::Claim,
        Command::RenewLease => LifecycleCommand::RenewLease,
        Command::TestsPass => LifecycleCommand::TestsPass,
        Command::RaiseSpecQuestion => LifecycleCommand::RaiseSpecQuestion,
        Command::RefreshActive => LifecycleCommand::RefreshActive,
        Command::ReturnToBuilding => LifecycleCommand::ReturnToBuilding,
        Command::BeginMerge => LifecycleCommand::BeginMerge,
        Command::MergeConflict => LifecycleCommand::MergeConflict,
        Command::MergeNotApplied => LifecycleCommand::MergeNotApplied,
        Command::RecordMerge => LifecycleCommand::RecordMerge,
        Command::RecoverLease => LifecycleCommand::RecoverLease,
        Command::Abandon => LifecycleCommand::Abandon,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use kube::CustomResourceExt;
    use protobot_api::{BuildWorkItem, conditions::ConditionStatus};
    use protobot_lifecycle::{
        AttemptRecord, AuditEvent, Dependency, MergeEnvelope as RecordEnvelope, StateVersion,
    };

    use super::*;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn clock(now: i64) -> StatusClock {
        StatusClock {
            now: Some(t(now)),
            lease_seconds: 900,
        }
    }

    fn audit(id: &str, command: Command, state: State, version: u64) -> AuditEvent {
        AuditEvent {
            operation: command.as_str().to_string(),
            subject: "job-site-001".into(),
            authorized_human_subject: String::new(),
            request_id: String::new(),
            work_item_id: id.into(),
            idempotency_key: format!("{command}-{version}"),
            outcome: "allowed".into(),
            rule_version: "validation-rules/v1".into(),
            policy_version: "p1".into(),
            before: None,
            after: Some(StateVersion {
                state,
                contract_version: version,
            }),
        }
    }

    fn shard_with(record: &WorkItemRecord, events: Vec<AuditEvent>) -> ItemShard {
        ItemShard {
            record: Some(record.clone()),
            audit: events,
            ..ItemShard::default()
        }
    }

    fn claimed(at: i64, token: &str) -> WorkItemRecord {
        let mut r = WorkItemRecord::new("wi-1", "p", State::Building, 2);
        r.owner = "job-site-001".into();
        r.lease = Some(protobot_lifecycle::Lease {
            owner: "job-site-001".into(),
            fencing_token: token.into(),
            expires_at: t(at + 900),
        });
        r.state_since = Some(t(at));
        r
    }

    fn write(
        record: &WorkItemRecord,
        events: Vec<AuditEvent>,
        previous: Option<&BuildWorkItemStatus>,
        clock: StatusClock,
    ) -> BuildWorkItemStatus {
        item_status(
            record,
            &shard_with(record, events),
            previous,
            "{}".into(),
            Some(1),
            clock,
        )
        .unwrap()
    }

    fn condition<'a>(s: &'a BuildWorkItemStatus, type_: &str) -> &'a protobot_api::Condition {
        s.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    /// The status properties the CRD documents.
    fn documented() -> BTreeSet<String> {
        let crd = serde_json::to_value(BuildWorkItem::crd()).unwrap();
        crd.pointer("/spec/versions/0/schema/openAPIV3Schema/properties/status/properties")
            .and_then(|p| p.as_object())
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    fn written(s: &BuildWorkItemStatus) -> BTreeSet<String> {
        serde_json::to_value(s)
            .unwrap()
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    }

    fn spent(
        run: &str,
        stage: protobot_usage::Stage,
        tier: &str,
        unpriced: u64,
    ) -> protobot_usage::RunSpend {
        protobot_usage::RunSpend {
            run_id: run.into(),
            stage,
            tier: tier.into(),
            spend: protobot_usage::Spend {
                calls: 2,
                calls_without_usage: 1,
                tokens: protobot_usage::TokenCounts {
                    input: 1000,
                    output: 300,
                    cache_read: 400,
                    cache_write: 0,
                    reasoning: 100,
                },
                cost_microdollars: 3600,
                unpriced_calls: unpriced,
            },
        }
    }

    #[test]
    fn usage_is_summed_per_stage_and_tier_and_an_unpriced_call_makes_the_cost_unknown() {
        use protobot_usage::Stage;
        let mut r = claimed(0, "fence-1");
        assert_eq!(write(&r, Vec::new(), None, clock(1)).usage, None);
        r.usage.record(spent("wi-1-c1-a", Stage::WorkerA, "t1", 0));
        r.usage.record(spent("wi-1-c1-b", Stage::WorkerB, "t1", 0));
        r.usage
            .record(spent("wi-1-ir-1-i", Stage::Inspection, "", 0));
        let usage = write(&r, Vec::new(), None, clock(1)).usage.unwrap();
        assert_eq!(usage.runs, 3);
        assert_eq!(usage.total.input_tokens, 3000);
        assert_eq!(usage.total.cost_microdollars, Some(10_800));
        assert_eq!(usage.total.cost, "$0.010800");
        let stages: Vec<_> = usage.stages.iter().map(|s| s.stage).collect();
        assert_eq!(
            stages,
            [
                UsageStage::WorkerA,
                UsageStage::WorkerB,
                UsageStage::Inspection
            ]
        );
        assert_eq!(usage.tiers.len(), 1);
        assert_eq!(
            (usage.tiers[0].tier, usage.tiers[0].spent.calls),
            (ModelTier::T1, 4)
        );
        r.usage.record(spent("wi-1-c2-b", Stage::WorkerB, "t2", 1));
        let usage = write(&r, Vec::new(), None, clock(1)).usage.unwrap();
        assert_eq!(
            (
                usage.total.cost_microdollars,
                usage.total.cost.as_str(),
                usage.total.unpriced_calls
            ),
            (None, "unknown", 1)
        );
        let worker_b = &usage.stages[1].spent;
        assert_eq!((worker_b.cost.as_str(), worker_b.calls), ("unknown", 4));
        assert_eq!(
            usage.stages[0].spent.cost, "$0.003600",
            "worker-a is still priced"
        );
    }

    #[test]
    fn every_documented_status_field_is_written_for_some_item() {
        // A building item: leased, dependencies, attempts, an active submission.
        let mut building = claimed(0, "fence-1");
        building.dependencies = vec![Dependency {
            id: "wi-0".into(),
            state: State::Completed,
        }];
        building.active_resolution_submission_id = "sub-1".into();
        building.attempts = vec![AttemptRecord {
            cycle: 1,
            tier: "t2".into(),
            outcome: "implementation".into(),
            candidate_commit: "a".repeat(40),
            feedback: serde_json::Value::Null,
            started_at: Some(t(1)),
            finished_at: t(2),
        }];
        building
            .usage
            .record(spent("wi-1-c1-a", protobot_usage::Stage::WorkerA, "t2", 0));
        let events = vec![audit("wi-1", Command::Claim, State::Building, 2)];
        let building = write(&building, events, None, clock(3));
        // A blocked item.
        let mut blocked = WorkItemRecord::new("wi-2", "p", State::Blocked, 3);
        blocked.block_reason = "impact_dispositioned: impact is not dispositioned".into();
        let blocked = write(&blocked, Vec::new(), None, clock(3));
        // A completed item with its merge evidence.
        let mut done = WorkItemRecord::new("wi-3", "p", State::Completed, 9);
        let envelope = RecordEnvelope {
            product_tree_digest: "sha256:tree".into(),
            inspection_run_id: "ir-1".into(),
            integration_head: "b".repeat(40),
            target: "main".into(),
            contract_version: 8,
            merge_commit: String::new(),
        };
        done.expected_merge = Some(envelope.clone());
        done.reconciliation = Some(protobot_lifecycle::Reconciliation {
            status: "merge-recorded".into(),
            git_mutation: "merged".into(),
            merge_envelope: Some(RecordEnvelope {
                merge_commit: "c".repeat(40),
                ..envelope
            }),
        });
        done.inspection_run_sealed = true;
        done.findings_terminal = true;
        done.final_tests_passed = true;
        done.state_since = Some(t(50));
        let done = write(&done, Vec::new(), None, clock(50));
        assert_eq!(done.merge_commit.as_deref(), Some("c".repeat(40).as_str()));
        assert!(done.completion.as_ref().unwrap().verified_on_target);
        assert_eq!(
            done.candidate_commit.as_deref(),
            Some("b".repeat(40).as_str())
        );

        let mut union = written(&building);
        union.extend(written(&blocked));
        union.extend(written(&done));
        let documented = documented();
        let never: Vec<_> = documented.difference(&union).collect();
        assert!(
            never.is_empty(),
            "status fields the CRD documents that the store never writes: {never:?}"
        );
        let undocumented: Vec<_> = union.difference(&documented).collect();
        assert!(undocumented.is_empty(), "{undocumented:?}");
    }

    #[test]
    fn a_renewal_moves_the_renew_time_and_keeps_the_transition_and_acquire_times() {
        let first = write(
            &claimed(0, "fence-7"),
            vec![audit("wi-1", Command::Claim, State::Building, 2)],
            None,
            clock(0),
        );
        let mut renewed = claimed(0, "fence-7");
        renewed.contract_version = 3;
        renewed.lease.as_mut().unwrap().expires_at = t(300 + 900);
        let events = vec![
            audit("wi-1", Command::Claim, State::Building, 2),
            audit("wi-1", Command::RenewLease, State::Building, 3),
        ];
        let second = write(&renewed, events, Some(&first), clock(300));
        let lease = second.lease.as_ref().unwrap();
        assert_eq!(lease.acquire_time, Time(t(0)));
        assert_eq!(lease.renew_time, Time(t(300)));
        assert_eq!(lease.duration_seconds, 900);
        let leased = condition(&second, "Leased");
        assert_eq!(leased.status, ConditionStatus::True);
        assert_eq!(
            leased.last_transition_time,
            Time(t(0)),
            "a renewal is not a transition"
        );
        let versions: Vec<_> = second
            .contract_versions
            .iter()
            .map(|e| (e.version, e.command, e.time.clone()))
            .collect();
        assert_eq!(
            versions,
            vec![
                (2, LifecycleCommand::Claim, Time(t(0))),
                (3, LifecycleCommand::RenewLease, Time(t(300))),
            ],
            "each transition once, at its own evaluation time"
        );
        // A new claim (new token) is a new lease: acquired now.
        let reclaimed = write(
            &claimed(1000, "fence-8"),
            Vec::new(),
            Some(&second),
            clock(1000),
        );
        assert_eq!(
            reclaimed.lease.as_ref().unwrap().acquire_time,
            Time(t(1000))
        );
    }

    #[test]
    fn an_observation_without_an_evaluation_time_changes_no_lease_time() {
        let first = write(&claimed(0, "fence-1"), Vec::new(), None, clock(0));
        let mut observed = claimed(0, "fence-1");
        observed.attempts = vec![AttemptRecord {
            cycle: 1,
            tier: "t1".into(),
            outcome: "passed".into(),
            candidate_commit: String::new(),
            feedback: serde_json::Value::Null,
            started_at: None,
            finished_at: t(40),
        }];
        let clock = StatusClock {
            now: None,
            lease_seconds: 900,
        };
        let second = write(&observed, Vec::new(), Some(&first), clock);
        assert_eq!(second.lease, first.lease);
        assert_eq!(second.cycles.len(), 1);
        assert_eq!(
            condition(&second, "Leased").last_transition_time,
            Time(t(0))
        );
    }

    #[test]
    fn blocked_and_abandoned_items_are_stalled_and_completed_ones_ready() {
        let mut blocked = WorkItemRecord::new("wi-2", "p", State::Blocked, 3);
        blocked.block_reason = "spec question".into();
        let s = write(&blocked, Vec::new(), None, clock(0));
        assert_eq!(condition(&s, "Stalled").status, ConditionStatus::True);
        assert_eq!(condition(&s, "Stalled").message, "spec question");
        assert_eq!(condition(&s, "Ready").status, ConditionStatus::False);
        assert_eq!(condition(&s, "Ready").reason, "Blocked");
        assert_eq!(condition(&s, "Blocked").status, ConditionStatus::True);
        let s = write(
            &WorkItemRecord::new("wi-2", "p", State::Abandoned, 4),
            Vec::new(),
            Some(&s),
            clock(10),
        );
        assert_eq!(condition(&s, "Stalled").reason, "Abandoned");
        assert_eq!(condition(&s, "Blocked").status, ConditionStatus::False);
        assert!(
            s.block_reason.is_none(),
            "fields the record cleared are removed"
        );
        let s = write(
            &WorkItemRecord::new("wi-3", "p", State::Completed, 9),
            Vec::new(),
            None,
            clock(0),
        );
        assert_eq!(condition(&s, "Ready").status, ConditionStatus::True);
        assert_eq!(condition(&s, "Stalled").status, ConditionStatus::False);
    }

    #[test]
    fn values_that_are_not_commit_ids_stay_out_of_the_commit_fields() {
        let mut done = WorkItemRecord::new("wi-3", "p", State::Completed, 9);
        let envelope = RecordEnvelope {
            integration_head: "head-1".into(),
            target: "main".into(),
            merge_commit: "merge-1".into(),
            ..RecordEnvelope::default()
        };
        done.expected_merge = Some(envelope.clone());
        done.reconciliation = Some(protobot_lifecycle::Reconciliation {
            status: "merge-recorded".into(),
            git_mutation: "merged".into(),
            merge_envelope: Some(envelope),
        });
        let s = write(&done, Vec::new(), None, clock(0));
        assert_eq!(s.merge_commit, None);
        assert_eq!(s.candidate_commit, None);
        // The evidence itself is kept as recorded.
        let completion = s.completion.unwrap();
        assert_eq!(
            completion.merge_envelope.merge_commit.as_deref(),
            Some("merge-1")
        );
    }

    #[test]
    fn a_previous_status_is_typed_absent_or_unreadable_and_its_ledger_always_readable() {
        use serde_json::json;
        assert_eq!(PreviousStatus::decode(None), PreviousStatus::Absent);
        assert_eq!(
            PreviousStatus::decode(Some(&serde_json::Value::Null)),
            PreviousStatus::Absent
        );
        let typed = write(&claimed(0, "fence-1"), Vec::new(), None, clock(0));
        let raw = serde_json::to_value(&typed).unwrap();
        assert_eq!(
            PreviousStatus::decode(Some(&raw)),
            PreviousStatus::Typed(Box::new(typed.clone()))
        );
        assert_eq!(raw_ledger(Some(&raw)), Some("{}"));
        // A mirror in a shape this version does not know: unreadable, ledger still there.
        let old = json!({"state": "building", "contractVersion": 2, "lease": {"fencingToken": "x"}, "ledger": "{\"a\":1}"});
        let decoded = PreviousStatus::decode(Some(&old));
        assert!(
            matches!(&decoded, PreviousStatus::Unreadable(why) if why.contains("holder")),
            "{decoded:?}"
        );
        assert_eq!(decoded.typed(), None);
        assert_eq!(raw_ledger(Some(&old)), Some("{\"a\":1}"));
        assert_eq!(raw_ledger(Some(&json!({"state": "building"}))), None);
        assert_eq!(raw_ledger(None), None);
    }

    #[test]
    fn an_initial_record_is_refused_with_what_to_do() {
        let r = WorkItemRecord::new("wi-9", "p", State::Initial, 0);
        let err = item_status(
            &r,
            &shard_with(&r, Vec::new()),
            None,
            "{}".into(),
            None,
            clock(0),
        )
        .unwrap_err();
        assert!(err.to_string().contains("wi-9"), "{err}");
        assert!(err.to_string().contains("restore"), "{err}");
    }
}
