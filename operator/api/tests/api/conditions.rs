//! `set_condition`: `lastTransitionTime` moves only when the status changes; reason, message
//! and `observedGeneration` always follow the newest computation.

use protobot_api::conditions::{
    ConditionStatus, ConditionUpdate, find_condition, is_true, reasons, set_condition, types,
};

use crate::util::{t, time};

fn verified(status: ConditionStatus, reason: &'static str, message: &str) -> ConditionUpdate {
    ConditionUpdate::new(types::VERIFIED, status, reason, message)
}

#[test]
fn new_condition_is_appended_with_now_and_the_generation() {
    let mut conditions = Vec::new();
    let changed = set_condition(
        &mut conditions,
        verified(
            ConditionStatus::True,
            reasons::MERGE_COMMIT_VERIFIED,
            "found on main",
        ),
        Some(3),
        t(10),
    );
    assert!(changed);
    assert_eq!(conditions.len(), 1);
    let condition = &conditions[0];
    assert_eq!(condition.type_, types::VERIFIED);
    assert_eq!(condition.status, ConditionStatus::True);
    assert_eq!(condition.reason, reasons::MERGE_COMMIT_VERIFIED);
    assert_eq!(condition.message, "found on main");
    assert_eq!(condition.last_transition_time, time(10));
    assert_eq!(condition.observed_generation, Some(3));
}

#[test]
fn unchanged_status_keeps_last_transition_time_but_takes_the_new_message() {
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        verified(
            ConditionStatus::False,
            reasons::MERGE_COMMIT_NOT_FOUND,
            "not on main yet",
        ),
        Some(1),
        t(10),
    );
    let changed = set_condition(
        &mut conditions,
        verified(
            ConditionStatus::False,
            reasons::MANIFEST_INVALID,
            "manifest has no requirements",
        ),
        Some(2),
        t(500),
    );
    assert!(changed, "reason, message and generation changed");
    let condition = find_condition(&conditions, types::VERIFIED).unwrap();
    assert_eq!(
        condition.last_transition_time,
        time(10),
        "status stayed False"
    );
    assert_eq!(condition.reason, reasons::MANIFEST_INVALID);
    assert_eq!(condition.message, "manifest has no requirements");
    assert_eq!(condition.observed_generation, Some(2));
}

#[test]
fn identical_recomputation_reports_no_change() {
    let mut conditions = Vec::new();
    let update = verified(ConditionStatus::True, reasons::MERGE_COMMIT_VERIFIED, "ok");
    set_condition(&mut conditions, update.clone(), Some(4), t(10));
    let before = conditions.clone();
    assert!(!set_condition(&mut conditions, update, Some(4), t(999)));
    assert_eq!(conditions, before);
}

#[test]
fn changed_status_moves_last_transition_time_to_now() {
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        verified(
            ConditionStatus::Unknown,
            reasons::CHECK_ERROR,
            "repository unreachable",
        ),
        Some(1),
        t(10),
    );
    let changed = set_condition(
        &mut conditions,
        verified(
            ConditionStatus::True,
            reasons::MERGE_COMMIT_VERIFIED,
            "found on main",
        ),
        Some(1),
        t(70),
    );
    assert!(changed);
    let condition = find_condition(&conditions, types::VERIFIED).unwrap();
    assert_eq!(condition.status, ConditionStatus::True);
    assert_eq!(condition.last_transition_time, time(70));
    assert!(is_true(&conditions, types::VERIFIED));
}

#[test]
fn generation_alone_is_a_change_and_is_recorded() {
    let mut conditions = Vec::new();
    let update = verified(ConditionStatus::True, reasons::MERGE_COMMIT_VERIFIED, "ok");
    set_condition(&mut conditions, update.clone(), Some(1), t(10));
    assert!(set_condition(&mut conditions, update, Some(2), t(20)));
    assert_eq!(conditions[0].observed_generation, Some(2));
    assert_eq!(conditions[0].last_transition_time, time(10));
}

#[test]
fn other_conditions_keep_their_place_and_content() {
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        verified(ConditionStatus::True, reasons::MERGE_COMMIT_VERIFIED, "ok"),
        Some(1),
        t(10),
    );
    set_condition(
        &mut conditions,
        ConditionUpdate::new(
            types::MATERIALIZED,
            ConditionStatus::False,
            reasons::PENDING,
            "",
        ),
        Some(1),
        t(11),
    );
    let materialized_before = conditions[1].clone();
    set_condition(
        &mut conditions,
        verified(
            ConditionStatus::False,
            reasons::MERGE_COMMIT_NOT_FOUND,
            "force-pushed away",
        ),
        Some(1),
        t(12),
    );
    let order: Vec<&str> = conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(order, [types::VERIFIED, types::MATERIALIZED]);
    assert_eq!(conditions[1], materialized_before);
    assert!(!is_true(&conditions, types::VERIFIED));
    assert!(
        !is_true(&conditions, types::LEASED),
        "absent counts as not true"
    );
}

#[test]
fn condition_serializes_in_the_kubernetes_shape() {
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        verified(ConditionStatus::True, reasons::MERGE_COMMIT_VERIFIED, "ok"),
        None,
        t(0),
    );
    let json = serde_json::to_value(&conditions[0]).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "type": "Verified",
            "status": "True",
            "reason": "MergeCommitVerified",
            "message": "ok",
            "lastTransitionTime": "2026-09-18T12:00:00Z",
        }),
        "observedGeneration is omitted when unknown"
    );
}

#[test]
fn every_reason_constant_matches_the_reason_pattern() {
    let pattern = regex::Regex::new(protobot_api::conditions::REASON_PATTERN).unwrap();
    let all = [
        reasons::LEASE_HELD,
        reasons::LEASE_EXPIRED,
        reasons::NOT_LEASED,
        reasons::BLOCK_RECORDED,
        reasons::NOT_BLOCKED,
        reasons::MERGE_COMMIT_VERIFIED,
        reasons::MERGE_COMMIT_NOT_FOUND,
        reasons::MANIFEST_INVALID,
        reasons::WORK_ITEM_CREATED,
        reasons::OMITTED,
        reasons::SOURCE_CONFLICT,
        reasons::PENDING,
        reasons::PASSED,
        reasons::FAILED,
        reasons::CHECK_ERROR,
        reasons::SEALED,
        reasons::COLLECTING,
    ];
    for reason in all {
        assert!(pattern.is_match(reason), "{reason}");
    }
}

#[test]
fn summary_conditions_say_ready_progressing_or_stalled() {
    use protobot_api::conditions::{Health, summary};
    let of =
        |h| summary(h, reasons::PENDING, "why").map(|u| (u.type_, u.status, u.reason, u.message));
    assert_eq!(
        of(Health::Ready),
        [
            (
                types::READY,
                ConditionStatus::True,
                reasons::PENDING,
                "why".to_string()
            ),
            (
                types::STALLED,
                ConditionStatus::False,
                reasons::NOT_STALLED,
                String::new()
            ),
        ]
    );
    assert_eq!(
        of(Health::Progressing),
        [
            (
                types::READY,
                ConditionStatus::False,
                reasons::PENDING,
                "why".to_string()
            ),
            (
                types::STALLED,
                ConditionStatus::False,
                reasons::NOT_STALLED,
                "why".to_string()
            ),
        ]
    );
    assert_eq!(
        of(Health::Stalled),
        [
            (
                types::READY,
                ConditionStatus::False,
                reasons::PENDING,
                "why".to_string()
            ),
            (
                types::STALLED,
                ConditionStatus::True,
                reasons::PENDING,
                "why".to_string()
            ),
        ]
    );
}
