//! The dispatcher of a replica ([`run`]): a `Controller<Project>` whose reconcile is one
//! dispatch of the project ([`super::dispatch::drive_project`]), woken by the project's
//! items (the BuildWorkItem controller), by its finished builds and by its own requeue;
//! failing projects back off alone ([`ProjectSchedule`], pure bookkeeping); a raised stop
//! ends the controller and drains the builds.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use kube::{
    Client, ResourceExt,
    runtime::{
        Controller,
        controller::Action,
        reflector::{ObjectRef, Store},
        watcher,
    },
};
use protobot_api::{BuildWorkItem, Project};
use protobot_jobsite::{builds::Builds, executor::Executor, site::SiteAction};

use super::{
    ProjectError, Settings,
    dispatch::{Dispatching, drive_project},
    project_tag,
    publish::publish_finished,
};
use crate::drive::{Categorized, Runner, scoped_api};

/// Longest wait before a failing project is driven again.
const MAX_PROJECT_BACKOFF: Duration = Duration::from_secs(300);

/// When a project may be driven next (pure bookkeeping of the dispatcher).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProjectSchedule {
    /// Passes that failed in a row.
    pub failures: u32,
    /// Not before this instant (after a failure).
    pub not_before: Option<std::time::Instant>,
}

impl ProjectSchedule {
    /// Records a pass outcome at `now`: success clears the backoff; a failure doubles it
    /// (1 s, 2 s, 4 s … at most [`MAX_PROJECT_BACKOFF`]).
    pub fn finished(&mut self, ok: bool, now: std::time::Instant) {
        if ok {
            self.failures = 0;
            self.not_before = None;
        } else {
            self.failures = self.failures.saturating_add(1);
            let wait = Duration::from_secs(1u64 << self.failures.min(10).saturating_sub(1))
                .min(MAX_PROJECT_BACKOFF);
            self.not_before = Some(now + wait);
        }
    }

    /// Whether the project may be driven at `now`.
    pub fn due(&self, now: std::time::Instant) -> bool {
        self.wait(now).is_zero()
    }

    /// How long from `now` until the project may be driven (zero when it may now).
    pub fn wait(&self, now: std::time::Instant) -> Duration {
        self.not_before
            .map_or(Duration::ZERO, |t| t.saturating_duration_since(now))
    }
}

/// A project's key in the dispatcher's maps: namespace and name.
type ProjectKey = (String, String);

/// What every dispatch of a replica shares (the controller's context).
struct Dispatcher<E> {
    client: Client,
    settings: Arc<Settings>,
    executor: Arc<E>,
    dispatching: Dispatching<E>,
    /// The Projects this replica sees (the controller's own cache).
    projects: Store<Project>,
    /// Each project's backoff.
    schedules: std::sync::Mutex<BTreeMap<ProjectKey, ProjectSchedule>>,
}

impl<E> Dispatcher<E> {
    fn schedules(&self) -> std::sync::MutexGuard<'_, BTreeMap<ProjectKey, ProjectSchedule>> {
        self.schedules
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Forgets the Job Sites, backoffs and queue figures of Projects that are gone.
    fn forget_gone(&self) {
        let present: std::collections::BTreeSet<ProjectKey> = self
            .projects
            .state()
            .iter()
            .map(|p| (p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        self.dispatching
            .projects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|key, _| present.contains(key));
        let mut schedules = self.schedules();
        if let Some(metrics) = &self.settings.metrics {
            for (ns, name) in schedules.keys().filter(|k| !present.contains(*k)) {
                let _ = metrics
                    .items_queued
                    .remove_label_values(&[&project_tag(ns, name)]);
            }
        }
        schedules.retain(|key, _| present.contains(key));
    }
}

impl Categorized for ProjectError {
    fn category(&self) -> &'static str {
        ProjectError::category(self)
    }
}

/// One dispatch of `project` (the controller's reconcile): unless the project is backing
/// off, drive it once and come back within `settings.interval`.
async fn reconcile<E: Executor + Send + Sync + 'static>(
    project: Arc<Project>,
    ctx: Arc<Dispatcher<E>>,
) -> Result<Action, ProjectError> {
    let key = (project.namespace().unwrap_or_default(), project.name_any());
    ctx.forget_gone();
    let wait = ctx
        .schedules()
        .get(&key)
        .map_or(Duration::ZERO, |s| s.wait(std::time::Instant::now()));
    if !wait.is_zero() {
        return Ok(Action::requeue(wait));
    }
    let driven = drive_project(
        &ctx.client,
        &project,
        &ctx.settings,
        Arc::clone(&ctx.executor),
        &ctx.dispatching,
    )
    .await;
    ctx.schedules()
        .entry(key.clone())
        .or_default()
        .finished(driven.is_ok(), std::time::Instant::now());
    let actions = driven?;
    if !actions.is_empty() {
        tracing::info!(project = %key.1, actions = actions.len(), "job site pass");
    }
    Ok(Action::requeue(ctx.settings.interval))
}

/// A failed dispatch (logged and published by the runner): the project backs off alone
/// ([`ProjectSchedule::finished`]), the others go on.
fn error_policy<E>(
    project: Arc<Project>,
    _error: &ProjectError,
    ctx: Arc<Dispatcher<E>>,
) -> Action {
    let key = (project.namespace().unwrap_or_default(), project.name_any());
    let wait = ctx
        .schedules()
        .get(&key)
        .map_or(Duration::from_secs(1), |s| {
            s.wait(std::time::Instant::now())
        })
        .max(Duration::from_secs(1));
    tracing::debug!(project = %key.1, retry_in = ?wait, "this project backs off, the others go on");
    Action::requeue(wait)
}

/// The dispatcher of this replica, a controller of Projects: one dispatch per Project at a
/// time (the controller never reconciles one object twice at once, and a wake during a
/// dispatch runs it again after), started when one of the project's work items appears or
/// changes state (the BuildWorkItem controller wakes it), when the Project changes, when
/// one of its builds finishes (a slot is free), and at least every `settings.interval`. A
/// dispatch claims and resumes; every build then runs in a task of its own ([`Builds`]), so
/// a slow build holds up no dispatch, and the replica's capacity is shared by every
/// project. A finished build is published (inspection runs, Events, metrics) as soon as it
/// ends. A project whose dispatch fails (its repository unreachable, its worker classes
/// missing) backs off alone; an item whose build stopped with an error backs off alone
/// ([`protobot_jobsite::builds::item_backoff`]); the others go on. On [`Settings::stop`]
/// no dispatch starts any more, the running builds stop at their next effect boundary,
/// and [`Settings::drained`] is notified once they have.
pub async fn run<E: Executor + Send + Sync + 'static>(
    client: Client,
    namespace: Option<String>,
    settings: Settings,
    executor: Arc<E>,
) {
    use crate::capacity::{RoomGated, RoomState, RoomView};
    // Back-pressure: with the node-room check, runs are admitted only while a node has
    // room for a run's pod (claims wait until the first read says so).
    let room = RoomView::new(match &settings.node_room {
        None => RoomState::Off,
        Some(_) => RoomState::Unknown("the node-room check has not read the nodes yet".into()),
    });
    if let Some(check) = settings.node_room.clone() {
        tokio::spawn(crate::capacity::watch_node_room(
            client.clone(),
            check,
            room.clone(),
            settings.stop.clone(),
        ));
    }
    // Published capacity: the replica's Lease, deleted when it stops.
    let lease = settings.capacity_lease.clone().map(|lease| {
        tokio::spawn(crate::capacity::publish_capacity(
            client.clone(),
            lease,
            settings.identity.clone(),
            Arc::clone(&settings.capacity),
            settings.max_concurrent_builds,
            room.clone(),
            settings.stop.clone(),
        ))
    });
    let executor = Arc::new(RoomGated::new(executor, room.clone()));
    // One set of forge clients for every dispatch, so a Project's client (and its App's
    // installation token) is reused until its spec or Secret changes.
    let mut settings = settings;
    if settings.forges.is_none() {
        settings.forges = Some(Arc::new(crate::forge::ForgeClients::new(
            client.clone(),
            None,
        )));
    }
    let settings = Arc::new(settings);
    let (builds, finished) = Builds::new();
    // The BuildWorkItem controller reconciles each item and wakes its project's dispatch.
    let (wake, wakes) = tokio::sync::mpsc::unbounded_channel::<ProjectKey>();
    // Its watch cache is the dispatches' view of the items (no list call per dispatch).
    let (item_cache, item_writer) = kube::runtime::reflector::store::<BuildWorkItem>();
    let items = tokio::spawn(crate::build_items::run_with_cache(
        client.clone(),
        namespace.clone(),
        crate::build_items::ItemContext::new(
            client.clone(),
            settings.identity.clone(),
            builds.clone(),
            wake.clone(),
            settings.metrics.clone(),
        ),
        {
            let stop = settings.stop.clone();
            async move { stop.raised().await }
        },
        (item_cache.clone(), item_writer),
    ));
    let dispatching = Dispatching {
        builds: builds.clone(),
        items: item_cache,
        projects: Arc::default(),
        room,
        queue_writes: Arc::default(),
    };
    let published = tokio::spawn(publish_finished_builds(
        client.clone(),
        Arc::clone(&settings),
        Arc::clone(&dispatching.projects),
        finished,
        wake,
    ));
    let controller = Controller::new(
        scoped_api::<Project>(client.clone(), namespace.as_deref()),
        watcher::Config::default(),
    )
    .reconcile_on(futures::stream::unfold(wakes, |mut wakes| async move {
        let (ns, name) = wakes.recv().await?;
        Some((ObjectRef::<Project>::new(&name).within(&ns), wakes))
    }));
    let ctx = Arc::new(Dispatcher {
        client,
        settings: Arc::clone(&settings),
        executor,
        dispatching,
        projects: controller.store(),
        schedules: Default::default(),
    });
    let stop = settings.stop.clone();
    Runner::new("buildworkitem")
        .metered(settings.metrics.clone())
        .publishing(ctx.client.clone())
        .until(async move { stop.raised().await })
        .run(controller, reconcile, error_policy, ctx)
        .await;
    // The controller ends on the stop (its watch cannot end otherwise).
    if let Some(lease) = lease {
        // The publisher deletes the Lease once it sees the stop (bounded: a stuck API call
        // must not hold the shutdown; the Lease then goes stale).
        let _ = tokio::time::timeout(Duration::from_secs(5), lease).await;
    }
    tracing::info!(
        builds = builds.len(),
        "shutting down: claiming no more work; waiting for the running builds to reach an effect boundary"
    );
    builds.drained().await;
    tracing::info!("every build stopped; their leases lapse and another replica resumes them");
    settings.drained.notify_one();
    let _ = items.await;
    published.abort();
}

/// Publishes every finished build as it ends ([`publish_finished`]) and wakes its project,
/// whose slot is free. A build that stopped with an error may have met a stale clone: the
/// project's next dispatch fetches and builds its Job Site afresh.
async fn publish_finished_builds<E>(
    client: Client,
    settings: Arc<Settings>,
    projects: super::dispatch::ProjectRuntimes<E>,
    mut finished: tokio::sync::mpsc::UnboundedReceiver<protobot_jobsite::builds::Finished>,
    wake: tokio::sync::mpsc::UnboundedSender<ProjectKey>,
) {
    while let Some(done) = finished.recv().await {
        if let Some((ns, name)) = done.tag.split_once('/') {
            let key = (ns.to_owned(), name.to_owned());
            if matches!(
                done.action,
                SiteAction::Failed { .. } | SiteAction::MergeUnverified { .. }
            ) {
                projects
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&key);
            }
            let _ = wake.send(key);
        }
        let (client, settings) = (client.clone(), Arc::clone(&settings));
        tokio::spawn(async move { publish_finished(&client, &settings, done).await });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_project_backs_off_exponentially_alone_and_recovers_at_once() {
        let start = std::time::Instant::now();
        let mut failing = ProjectSchedule::default();
        let healthy = ProjectSchedule::default();
        assert!(failing.due(start));
        let mut waits = Vec::new();
        for _ in 0..12 {
            failing.finished(false, start);
            waits.push(failing.not_before.unwrap() - start);
        }
        assert_eq!(waits[0], Duration::from_secs(1));
        assert_eq!(waits[1], Duration::from_secs(2));
        assert_eq!(waits[2], Duration::from_secs(4));
        assert_eq!(*waits.last().unwrap(), MAX_PROJECT_BACKOFF);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]));
        assert!(!failing.due(start + Duration::from_secs(299)));
        assert!(failing.due(start + MAX_PROJECT_BACKOFF));
        assert!(healthy.due(start), "another project is not delayed");
        failing.finished(true, start);
        assert!(failing.due(start) && failing.failures == 0);
    }
}
