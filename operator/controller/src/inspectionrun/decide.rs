//! What an `InspectionRun`'s conditions say, from its spec and status (pure).
//!
//! The Job Site publishes a run's progress (`producersCompleted`, `sealed`);
//! this module turns it into the two conditions the CRD promises:
//! `ProducersComplete` (every required producer reported) and `Sealed` (the
//! finding ledger was sealed: every producer finished and every finding is
//! terminal), and names the Event a transition deserves.

use jiff::Timestamp;
use kube::runtime::events::{Event, EventType};
use protobot_api::{
    ConditionStatus, ConditionUpdate,
    conditions::{Condition, Health, reasons, set_condition, summary, types},
    inspection_run::{InspectionRunSpec, InspectionRunStatus},
};

/// Required producers that have not reported yet, in spec order.
pub fn missing_producers<'a>(
    spec: &'a InspectionRunSpec,
    status: Option<&InspectionRunStatus>,
) -> Vec<&'a str> {
    spec.required_producers
        .iter()
        .filter(|p| {
            !status.is_some_and(|s| s.producers_completed.iter().any(|c| &c.producer == *p))
        })
        .map(String::as_str)
        .collect()
}

/// The run's conditions after this observation (transition times kept for
/// conditions whose status did not change).
pub fn conditions(
    spec: &InspectionRunSpec,
    status: Option<&InspectionRunStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut out = status.map(|s| s.conditions.clone()).unwrap_or_default();
    let missing = missing_producers(spec, status);
    let producers = if missing.is_empty() {
        ConditionUpdate::new(
            types::PRODUCERS_COMPLETE,
            ConditionStatus::True,
            reasons::PASSED,
            format!(
                "all {} required producers reported",
                spec.required_producers.len()
            ),
        )
    } else {
        ConditionUpdate::new(
            types::PRODUCERS_COMPLETE,
            ConditionStatus::False,
            reasons::COLLECTING,
            format!("waiting for {}", missing.join(", ")),
        )
    };
    set_condition(&mut out, producers, generation, now);
    let sealed = match status.and_then(|s| s.sealed.as_ref()) {
        Some(seal) => ConditionUpdate::new(
            types::SEALED,
            ConditionStatus::True,
            reasons::SEALED,
            format!(
                "the finding ledger was sealed at sequence {}",
                seal.high_watermark
            ),
        ),
        None if missing.is_empty() => ConditionUpdate::new(
            types::SEALED,
            ConditionStatus::False,
            reasons::COLLECTING,
            "every producer reported; the ledger seals when every finding is terminal",
        ),
        None => ConditionUpdate::new(
            types::SEALED,
            ConditionStatus::False,
            reasons::COLLECTING,
            "producers are still reporting",
        ),
    };
    set_condition(&mut out, sealed, generation, now);
    // `Ready`/`Stalled` (docs/gitops.md). The Job Site publishes a run's producers and its
    // seal in one write when the run ends, so every required producer reported without a
    // seal means the run ended unsealed: findings sent the candidate back (the next
    // candidate gets a run of its own) or need a person. Such a run stays as it is.
    let seal = status.and_then(|s| s.sealed.as_ref());
    let (health, reason, message) = match seal {
        Some(seal) => (
            Health::Ready,
            reasons::SEALED,
            format!("sealed at ledger sequence {}", seal.high_watermark),
        ),
        None if missing.is_empty() && !spec.required_producers.is_empty() => (
            Health::Stalled,
            reasons::UNSEALED,
            format!(
                "every producer reported and the ledger was not sealed ({} open, {} confirmed finding(s)); see the work item's cycles for the rework",
                status.map_or(0, |s| s.finding_counts.open),
                status.map_or(0, |s| s.finding_counts.confirmed),
            ),
        ),
        None => (
            Health::Progressing,
            reasons::COLLECTING,
            if missing.is_empty() {
                "waiting for the seal".to_string()
            } else {
                format!("waiting for {}", missing.join(", "))
            },
        ),
    };
    for u in summary(health, reason, message) {
        set_condition(&mut out, u, generation, now);
    }
    out
}

fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
}

/// The Event for a run that became sealed with this observation.
pub fn sealed_event(before: &[Condition], after: &[Condition]) -> Option<Event> {
    if is_true(before, types::SEALED) || !is_true(after, types::SEALED) {
        return None;
    }
    let note = after
        .iter()
        .find(|c| c.type_ == types::SEALED)
        .map(|c| c.message.clone());
    Some(Event {
        type_: EventType::Normal,
        reason: "Sealed".into(),
        note,
        action: "Seal".into(),
        secondary: None,
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use protobot_api::{
        LocalRef,
        inspection_run::{ProducerCompletion, Seal},
    };

    use super::*;

    fn now() -> Timestamp {
        "2026-11-30T10:00:00Z".parse().unwrap()
    }

    fn spec() -> InspectionRunSpec {
        InspectionRunSpec {
            work_item_ref: LocalRef {
                name: "wi-1".into(),
            },
            contract_version: 3,
            candidate_commit: "a".repeat(40),
            product_tree_digest: "sha256:0".into(),
            required_producers: vec!["inspector-a".into(), "mutation".into()],
            mutation: None,
            findings_to_recheck: Vec::new(),
            ledger_sequence_at_start: 7,
        }
    }

    fn completed(producer: &str) -> ProducerCompletion {
        ProducerCompletion {
            producer: producer.into(),
            findings: 1,
            completed_time: Time(now()),
        }
    }

    fn get<'a>(conditions: &'a [Condition], type_: &str) -> &'a Condition {
        conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn a_run_collects_until_every_producer_reported_then_seals() {
        let spec = spec();
        let fresh = conditions(&spec, None, Some(1), now());
        let producers = get(&fresh, types::PRODUCERS_COMPLETE);
        assert_eq!(producers.status, ConditionStatus::False);
        assert_eq!(producers.message, "waiting for inspector-a, mutation");
        assert_eq!(get(&fresh, types::SEALED).status, ConditionStatus::False);
        let summary_of = |c: &[Condition]| {
            let (r, st) = (get(c, types::READY), get(c, types::STALLED));
            (r.status, r.reason.clone(), st.status)
        };
        assert_eq!(
            summary_of(&fresh),
            (
                ConditionStatus::False,
                reasons::COLLECTING.to_string(),
                ConditionStatus::False
            ),
            "a fresh run progresses"
        );

        let mut status = InspectionRunStatus {
            producers_completed: vec![completed("inspector-a")],
            conditions: fresh.clone(),
            ..InspectionRunStatus::default()
        };
        let partial = conditions(&spec, Some(&status), Some(1), now());
        assert_eq!(
            get(&partial, types::PRODUCERS_COMPLETE).message,
            "waiting for mutation"
        );

        status.producers_completed.push(completed("mutation"));
        let reported = conditions(&spec, Some(&status), Some(1), now());
        assert_eq!(
            get(&reported, types::PRODUCERS_COMPLETE).status,
            ConditionStatus::True
        );
        let open = get(&reported, types::SEALED);
        assert_eq!(open.status, ConditionStatus::False);
        assert!(
            open.message.contains("every finding is terminal"),
            "{}",
            open.message
        );
        assert!(sealed_event(&fresh, &reported).is_none());
        assert_eq!(
            summary_of(&reported),
            (
                ConditionStatus::False,
                reasons::UNSEALED.to_string(),
                ConditionStatus::True
            ),
            "every producer reported without a seal: the run stopped unsealed"
        );

        status.conditions = reported.clone();
        status.sealed = Some(Seal {
            high_watermark: 12,
            at: Time(now()),
        });
        let later: Timestamp = "2026-11-30T10:05:00Z".parse().unwrap();
        let sealed = conditions(&spec, Some(&status), Some(1), later);
        let seal = get(&sealed, types::SEALED);
        assert_eq!(seal.status, ConditionStatus::True);
        assert_eq!(seal.reason, reasons::SEALED);
        assert!(seal.message.contains("12"));
        assert_eq!(seal.last_transition_time, Time(later), "a transition");
        assert_eq!(
            get(&sealed, types::PRODUCERS_COMPLETE).last_transition_time,
            Time(now()),
            "unchanged conditions keep their transition time"
        );
        assert_eq!(
            summary_of(&sealed),
            (
                ConditionStatus::True,
                reasons::SEALED.to_string(),
                ConditionStatus::False
            ),
            "a sealed run is ready and no longer stalled"
        );
        let event = sealed_event(&reported, &sealed).unwrap();
        assert_eq!(event.reason, "Sealed");
        assert!(sealed_event(&sealed, &sealed).is_none(), "once per seal");
    }

    #[test]
    fn a_run_with_no_required_producers_waits_only_for_the_seal() {
        let mut spec = spec();
        spec.required_producers.clear();
        let c = conditions(&spec, None, None, now());
        assert_eq!(
            get(&c, types::PRODUCERS_COMPLETE).status,
            ConditionStatus::True
        );
        assert_eq!(get(&c, types::SEALED).status, ConditionStatus::False);
    }

    #[test]
    fn an_unchanged_observation_changes_nothing() {
        let spec = spec();
        let first = conditions(&spec, None, Some(2), now());
        let status = InspectionRunStatus {
            conditions: first.clone(),
            ..InspectionRunStatus::default()
        };
        let later: Timestamp = "2026-11-30T11:00:00Z".parse().unwrap();
        assert_eq!(conditions(&spec, Some(&status), Some(2), later), first);
    }
}
