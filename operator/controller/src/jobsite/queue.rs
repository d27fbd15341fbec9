//! A project's queue after a dispatch ([`show_queue`]): the pure decision of
//! [`protobot_jobsite::capacity::queue`] shown on the Project's `status.queue`, in
//! `protobot_items_queued` and, when the wait becomes a fault, as a Warning Event.

use std::{collections::BTreeMap, sync::Arc};

use jiff::Timestamp;
use kube::{Client, ResourceExt};
use protobot_api::Project;
use protobot_jobsite::executor::Executor;

use super::{Settings, dispatch::Dispatching, project_tag};

/// What a replica last wrote to each project's `status.queue` (by namespace and name), and
/// when.
pub(super) type QueueWrites = Arc<
    std::sync::Mutex<BTreeMap<(String, String), (std::time::Instant, protobot_api::ProjectQueue)>>,
>;

/// The project's queue after a dispatch, from the watch cache, this replica's free slots
/// and its admission ([`protobot_jobsite::capacity::queue`]): written to the Project's
/// `status.queue` when it says something new, counted in `protobot_items_queued`, and a
/// Warning Event when the wait becomes a fault (no node room, runs refused).
pub(super) async fn show_queue<E: Executor>(
    client: &Client,
    project: &Project,
    settings: &Settings,
    executor: &E,
    d: &Dispatching<E>,
) {
    use protobot_api::LifecycleState as S;
    let name = project.name_any();
    let ns = project.namespace().unwrap_or_default();
    let (mut ready, mut active) = (0usize, 0usize);
    for item in d.items.state() {
        if item.namespace().as_deref() != Some(ns.as_str()) || item.spec.project_ref.name != name {
            continue;
        }
        match item.status.as_ref().map(|s| s.state) {
            Some(S::ReadyForBuilding) => ready += 1,
            Some(S::Building | S::Inspecting | S::Merging) => active += 1,
            _ => {}
        }
    }
    let input = protobot_jobsite::capacity::QueueInput {
        ready,
        active,
        wip_limit: usize::try_from(project.spec.wip_limit).unwrap_or(1),
        free_slots: settings.capacity.available_permits(),
        admission: crate::capacity::admission(&d.room.get(), executor.admit()),
    };
    let queue = protobot_jobsite::capacity::queue(&input);
    if let Some(metrics) = &settings.metrics {
        metrics
            .items_queued
            .with_label_values(&[&project_tag(&ns, &name)])
            .set(i64::try_from(queue.queued).unwrap_or(i64::MAX));
    }
    let next = crate::capacity::queue_status(&queue, &settings.identity, Timestamp::now());
    let key = (ns, name);
    let last = d
        .queue_writes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(&key)
        .cloned();
    // What the Project shows: the cached status, unless this replica wrote since (the
    // cache may lag its own write by a moment: it must not write, or warn, twice).
    let cached = project.status.as_ref().and_then(|s| s.queue.clone());
    let shown = match (cached, &last) {
        (Some(c), Some((_, mine))) if c.observed_time.0 < mine.observed_time.0 => {
            Some(mine.clone())
        }
        (None, Some((_, mine))) => Some(mine.clone()),
        (cached, _) => cached,
    };
    let since_last = last.as_ref().map(|(at, _)| at.elapsed());
    if crate::capacity::queue_write_due(shown.as_ref(), &next, since_last) {
        let event = crate::capacity::queue_event(shown.as_ref(), &next, queue.reason);
        let written =
            crate::capacity::publish_queue(client, project, &settings.identity, &next, event).await;
        if written {
            d.queue_writes
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(key, (std::time::Instant::now(), next));
        }
    }
}
