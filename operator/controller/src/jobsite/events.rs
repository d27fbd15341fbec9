//! The Kubernetes Events of a Job Site's actions: which event an action is reported with
//! ([`event_for`], pure; a blocked build's note carries its spend within the API's limit)
//! and their publication on the work items ([`publish_events`]).

use kube::{
    Api, Client, Resource,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use protobot_api::BuildWorkItem;
use protobot_jobsite::site::SiteAction;
use protobot_stores::kubernetes::item_name;

use crate::events::{NOTE_LIMIT, truncate};

/// The Kubernetes Event a Job Site action is reported with (pure): the work item
/// it concerns and the event.
pub fn event_for(action: &SiteAction) -> Option<(String, Event)> {
    let event = |type_, reason: &str, action: &str, note: String| Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    Some(match action {
        SiteAction::Built { report } => {
            let ev = match report.state {
                protobot_lifecycle::State::Completed => event(
                    EventType::Normal,
                    "Completed",
                    "Merge",
                    format!(
                        "merged into the default branch as {} after {} cycle(s)",
                        report.merge_commit.as_deref().unwrap_or("?"),
                        report.cycles.len()
                    ),
                ),
                protobot_lifecycle::State::Blocked => {
                    event(EventType::Warning, "Blocked", "Build", blocked_note(report))
                }
                other => event(EventType::Normal, "Built", "Build", format!("now {other}")),
            };
            (report.work_item_id.clone(), ev)
        }
        SiteAction::RecoveredLease { work_item_id } => (
            work_item_id.clone(),
            event(
                EventType::Warning,
                "LeaseRecovered",
                "Reconcile",
                "the lease expired; the item is ready again".into(),
            ),
        ),
        SiteAction::RecordedMerge {
            work_item_id,
            merge_commit,
        } => (
            work_item_id.clone(),
            event(
                EventType::Normal,
                "MergeRecorded",
                "Reconcile",
                format!("found merge {merge_commit} by its Work-Item trailer"),
            ),
        ),
        SiteAction::MergeNotApplied { work_item_id } => (
            work_item_id.clone(),
            event(
                EventType::Warning,
                "MergeNotApplied",
                "Reconcile",
                "the merge never landed; the item is ready again".into(),
            ),
        ),
        SiteAction::DependenciesRefreshed { work_item_id } => (
            work_item_id.clone(),
            event(
                EventType::Normal,
                "Ready",
                "RefreshDependencies",
                "every dependency completed".into(),
            ),
        ),
        SiteAction::Revalidated {
            work_item_id,
            reason,
        } => (
            work_item_id.clone(),
            event(EventType::Warning, "Blocked", "Revalidate", reason.clone()),
        ),
        SiteAction::Failed {
            work_item_id,
            error,
        }
        | SiteAction::MergeUnverified {
            work_item_id,
            error,
        } => (
            work_item_id.clone(),
            event(EventType::Warning, "BuildStopped", "Build", error.clone()),
        ),
        SiteAction::Claimed { .. } | SiteAction::LostClaim { .. } => return None,
    })
}

/// The note of a blocked build's Event: the block reason, then what the item's runs spent
/// per stage (issue 34), within the API's limit ([`NOTE_LIMIT`]; the spend stays whole, the
/// reason is cut first).
fn blocked_note(report: &protobot_jobsite::engine::BuildReport) -> String {
    let reason = report.block_reason.clone().unwrap_or_default();
    if report.usage.is_empty() {
        return truncate(&reason, NOTE_LIMIT);
    }
    let spent = format!(" (spent: {})", report.usage.summary().brief());
    let room = NOTE_LIMIT.saturating_sub(spent.len());
    truncate(&format!("{}{spent}", truncate(&reason, room)), NOTE_LIMIT)
}

pub(super) async fn publish_events(
    client: &Client,
    ns: &str,
    identity: &str,
    actions: &[SiteAction],
) {
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "protobot-jobsite".into(),
            instance: Some(identity.into()),
        },
    );
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), ns);
    for action in actions {
        let Some((id, event)) = event_for(action) else {
            continue;
        };
        let Ok(item) = items.get(&item_name(&id)).await else {
            continue;
        };
        if let Err(e) = recorder
            .publish(&crate::events::bounded(&event), &item.object_ref(&()))
            .await
        {
            tracing::warn!(work_item = %id, error = %e, "could not publish an event");
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use protobot_jobsite::engine::BuildReport;

    use super::*;

    #[test]
    fn a_blocked_build_s_event_says_what_was_spent_within_the_note_limit() {
        let mut report = BuildReport {
            work_item_id: "wi-1".into(),
            state: protobot_lifecycle::State::Blocked,
            cycles: Vec::new(),
            inspections: Vec::new(),
            revalidations: 0,
            merge_commit: None,
            product_tree_digest: None,
            block_reason: Some("the tests still fail after 3 cycles".into()),
            lease_renewals: Default::default(),
            usage: Default::default(),
        };
        let note = |report: &BuildReport| {
            let action = SiteAction::Built {
                report: Box::new(report.clone()),
            };
            event_for(&action).unwrap().1.note.unwrap()
        };
        assert_eq!(note(&report), "the tests still fail after 3 cycles");
        report.usage.record(protobot_usage::RunSpend {
            run_id: "wi-1-c1-b".into(),
            stage: protobot_usage::Stage::WorkerB,
            tier: "t1".into(),
            spend: protobot_usage::Spend {
                calls: 3,
                tokens: protobot_usage::TokenCounts {
                    input: 1000,
                    output: 200,
                    ..Default::default()
                },
                cost_microdollars: 4200,
                ..Default::default()
            },
        });
        assert_eq!(
            note(&report),
            "the tests still fail after 3 cycles (spent: worker-b 1200 tokens $0.004200; total 1200 tokens in 3 calls, $0.004200)"
        );
        report.block_reason = Some("é".repeat(2000));
        let long = note(&report);
        assert!(long.len() <= NOTE_LIMIT, "{}", long.len());
        assert!(
            long.ends_with("$0.004200)"),
            "the spend stays whole: {long}"
        );
    }
}
