//! The `Leased` condition computed from `status.lease` at a passed-in evaluation time:
//! absent → False/NotLeased, live → True/LeaseHeld naming the holder, expiry ≤ now →
//! False/LeaseExpired (contract §6: "expired" means expiry ≤ now); and `mirror_conditions`,
//! which keeps `Leased` and `Blocked` in step with the record.

use protobot_api::{
    Lease,
    conditions::{ConditionStatus, reasons, set_condition, types},
    lease::leased_condition,
};

use crate::util::{t, time};

/// Holder and token are distinct strings so that a swapped field shows up in a message.
fn lease_renewed_at(renew: i64) -> Lease {
    Lease {
        holder: "job-site-holder-7".to_owned(),
        fencing_token: "fence-token-42".to_owned(),
        acquire_time: time(0),
        renew_time: time(renew),
        duration_seconds: 900,
    }
}

#[test]
fn no_lease_is_not_leased() {
    let condition = leased_condition(None, t(0));
    assert_eq!(condition.type_, types::LEASED);
    assert_eq!(condition.status, ConditionStatus::False);
    assert_eq!(condition.reason, reasons::NOT_LEASED);
}

#[test]
fn live_lease_is_held_and_names_the_holder_but_not_the_token() {
    let lease = lease_renewed_at(0);
    let condition = leased_condition(Some(&lease), t(899));
    assert_eq!(condition.status, ConditionStatus::True);
    assert_eq!(condition.reason, reasons::LEASE_HELD);
    assert!(
        condition.message.contains("job-site-holder-7"),
        "{}",
        condition.message
    );
    assert!(
        condition.message.contains(&t(900).to_string()),
        "{}",
        condition.message
    );
    assert!(
        !condition.message.contains("fence-token-42"),
        "the token stays out of messages"
    );
}

#[test]
fn lease_expires_exactly_at_renew_time_plus_duration() {
    let lease = lease_renewed_at(0);
    assert_eq!(lease.expires_at(), t(900));
    assert!(lease.is_live_at(t(899)));
    assert!(!lease.is_live_at(t(900)), "expiry <= now is expired");
    let condition = leased_condition(Some(&lease), t(900));
    assert_eq!(condition.status, ConditionStatus::False);
    assert_eq!(condition.reason, reasons::LEASE_EXPIRED);
}

#[test]
fn expired_lease_is_false_and_names_holder_and_expiry() {
    let lease = lease_renewed_at(0);
    let condition = leased_condition(Some(&lease), t(5_000));
    assert_eq!(condition.status, ConditionStatus::False);
    assert_eq!(condition.reason, reasons::LEASE_EXPIRED);
    assert!(
        condition.message.contains("job-site-holder-7"),
        "{}",
        condition.message
    );
    assert!(
        condition.message.contains(&t(900).to_string()),
        "{}",
        condition.message
    );
}

#[test]
fn expiry_counts_from_the_renewal_not_the_acquisition() {
    let lease = lease_renewed_at(600);
    assert_eq!(lease.expires_at(), t(1_500));
    assert_eq!(
        leased_condition(Some(&lease), t(1_000)).status,
        ConditionStatus::True
    );
}

#[test]
fn leased_condition_transitions_when_the_lease_runs_out() {
    let lease = lease_renewed_at(0);
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        leased_condition(Some(&lease), t(10)),
        Some(1),
        t(10),
    );
    set_condition(
        &mut conditions,
        leased_condition(Some(&lease), t(300)),
        Some(1),
        t(300),
    );
    assert_eq!(
        conditions[0].last_transition_time,
        time(10),
        "still held: no transition"
    );

    set_condition(
        &mut conditions,
        leased_condition(Some(&lease), t(901)),
        Some(1),
        t(901),
    );
    assert_eq!(conditions.len(), 1);
    assert_eq!(conditions[0].status, ConditionStatus::False);
    assert_eq!(conditions[0].reason, reasons::LEASE_EXPIRED);
    assert_eq!(conditions[0].last_transition_time, time(901));

    set_condition(
        &mut conditions,
        leased_condition(None, t(950)),
        Some(1),
        t(950),
    );
    assert_eq!(conditions[0].reason, reasons::NOT_LEASED);
    assert_eq!(
        conditions[0].last_transition_time,
        time(901),
        "False → False keeps the time"
    );
}

#[test]
fn mirror_conditions_reflects_lease_and_block_reason_of_the_record() {
    use protobot_api::{BuildWorkItemStatus, LifecycleState, conditions::find_condition};

    let mut status = BuildWorkItemStatus::materialized(LifecycleState::Building);
    status.lease = Some(lease_renewed_at(0));
    assert!(status.mirror_conditions(Some(2), t(10)));
    let leased = find_condition(&status.conditions, types::LEASED).unwrap();
    assert_eq!(leased.status, ConditionStatus::True);
    assert_eq!(leased.observed_generation, Some(2));
    let blocked = find_condition(&status.conditions, types::BLOCKED).unwrap();
    assert_eq!(blocked.status, ConditionStatus::False);
    assert_eq!(blocked.reason, reasons::NOT_BLOCKED);

    assert!(
        !status.mirror_conditions(Some(2), t(20)),
        "nothing changed within the lease"
    );

    status.state = LifecycleState::Blocked;
    status.lease = None;
    status.block_reason = Some("which timezone do timestamps use?".to_owned());
    assert!(status.mirror_conditions(Some(2), t(30)));
    let blocked = find_condition(&status.conditions, types::BLOCKED).unwrap();
    assert_eq!(blocked.status, ConditionStatus::True);
    assert_eq!(blocked.reason, reasons::BLOCK_RECORDED);
    assert_eq!(blocked.message, "which timezone do timestamps use?");
    assert_eq!(blocked.last_transition_time, time(30));
    let leased = find_condition(&status.conditions, types::LEASED).unwrap();
    assert_eq!(leased.reason, reasons::NOT_LEASED);
    assert_eq!(leased.last_transition_time, time(30));
}
