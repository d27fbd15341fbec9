//! Bounded status lists: the `record_*` helpers append and keep only the newest entries, so
//! a long-lived work item never outgrows its bound (which the schema also enforces).

use protobot_api::{
    BuildWorkItemStatus, LifecycleState,
    build_work_item::{
        CONTRACT_VERSIONS_LIMIT, CYCLES_LIMIT, ContractVersionEntry, CycleOutcome, CycleRecord,
    },
    common::{LifecycleCommand, ModelTier},
};

use crate::util::time;

fn renewal(version: u64) -> ContractVersionEntry {
    ContractVersionEntry {
        version,
        command: LifecycleCommand::RenewLease,
        state: LifecycleState::Building,
        actor: Some("job-site-001".to_owned()),
        idempotency_key: None,
        time: time(i64::try_from(version).unwrap()),
    }
}

#[test]
fn contract_version_history_keeps_the_newest_entries_in_order() {
    let mut status = BuildWorkItemStatus::materialized(LifecycleState::Building);
    let total = u64::from(CONTRACT_VERSIONS_LIMIT) + 6;
    for version in 1..=total {
        status.record_contract_version(renewal(version));
    }
    let versions: Vec<u64> = status.contract_versions.iter().map(|e| e.version).collect();
    let expected: Vec<u64> = (7..=total).collect();
    assert_eq!(versions, expected);
}

#[test]
fn cycle_history_is_bounded() {
    let mut status = BuildWorkItemStatus::materialized(LifecycleState::Building);
    for cycle in 1..=CYCLES_LIMIT + 3 {
        status.record_cycle(CycleRecord {
            cycle,
            tier: ModelTier::T4,
            outcome: CycleOutcome::TestFault,
            candidate_commit: None,
            start_time: time(i64::from(cycle)),
            end_time: None,
        });
    }
    assert_eq!(status.cycles.len(), CYCLES_LIMIT as usize);
    assert_eq!(status.cycles[0].cycle, 4);
}

#[test]
fn materialized_record_starts_at_contract_version_one_without_lease() {
    let status = BuildWorkItemStatus::materialized(LifecycleState::ReadyForBuilding);
    assert_eq!(status.contract_version, 1);
    assert_eq!(status.state, LifecycleState::ReadyForBuilding);
    assert!(status.lease.is_none() && status.owner.is_none());
    assert!(status.conditions.is_empty() && status.cycles.is_empty());
}
