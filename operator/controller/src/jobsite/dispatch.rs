//! One dispatch of one project ([`drive_project`]): read its worker classes, keep or build
//! its Job Site (fetching the clone), claim, resume and start builds, then publish what it
//! did, show its queue and sweep orphaned key claims.

use std::{collections::BTreeMap, sync::Arc};

use jiff::Timestamp;
use kube::{Client, ResourceExt};
use protobot_api::{BuildWorkItem, Project};
use protobot_jobsite::{builds::Builds, executor::Executor, site::SiteAction};
use protobot_stores::{AdapterConfig, KubeStore};

use super::{
    ProjectError, Settings,
    checks_waits::show_checks_waits,
    project_site::{
        ProjectFingerprint, ProjectRuntime, build_site, fetch_clone, project_items,
        reuse_project_site,
    },
    project_tag,
    publish::publish,
    queue::{QueueWrites, show_queue},
    worker_classes::read_worker_classes,
};
use crate::changeset::MATERIALIZER_SUBJECT;

/// Each project's kept Job Site, by namespace and name.
pub(super) type ProjectRuntimes<E> =
    Arc<std::sync::Mutex<BTreeMap<(String, String), ProjectRuntime<E>>>>;

/// What the dispatches of [`run`] share.
pub(super) struct Dispatching<E> {
    /// The builds running in this replica.
    pub(super) builds: Builds,
    /// The BuildWorkItem controller's watch cache.
    pub(super) items: kube::runtime::reflector::Store<BuildWorkItem>,
    /// Each project's long-lived Job Site, by namespace and name.
    pub(super) projects: ProjectRuntimes<E>,
    /// The node-room verdict the executor is gated by.
    pub(super) room: crate::capacity::RoomView,
    /// What this replica last wrote to each project's `status.queue`, and when.
    pub(super) queue_writes: QueueWrites,
}

impl<E> Clone for Dispatching<E> {
    fn clone(&self) -> Self {
        Dispatching {
            builds: self.builds.clone(),
            items: self.items.clone(),
            projects: Arc::clone(&self.projects),
            room: self.room.clone(),
            queue_writes: Arc::clone(&self.queue_writes),
        }
    }
}

/// One dispatch of one project: reads its worker classes, keeps or builds its Job Site,
/// and dispatches it. The project's Job Site is kept between dispatches and rebuilt (with
/// a fetch) only when the Project or its worker classes changed, an item arrived since the
/// last fetch, or [`super::REFETCH_EVERY`] passed ([`reuse_project_site`]); its store reads
/// the items from the watch cache; its builds start in tasks of their own and finish on
/// the builds' channel (published by [`super::run`]).
pub(super) async fn drive_project<E: Executor + 'static>(
    client: &Client,
    project: &Project,
    settings: &Settings,
    executor: Arc<E>,
    d: &Dispatching<E>,
) -> Result<Vec<SiteAction>, ProjectError> {
    let name = project.name_any();
    let ns = project.namespace().unwrap_or_default();
    let spec = &project.spec;
    if let Some(forges) = &settings.forges
        && let Some(forge) = forges.cached(project).await
    {
        show_checks_waits(client, &ns, &name, &forge).await;
    }
    let (classes, classes_version) = read_worker_classes(client, project).await?;
    let fingerprint = ProjectFingerprint {
        uid: project.metadata.uid.clone(),
        generation: project.metadata.generation,
        worker_classes: classes_version,
    };
    let key = (ns.clone(), name.clone());
    let now = Timestamp::now();
    let kept = {
        let projects = d
            .projects
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        projects.get(&key).and_then(|kept| {
        let items = project_items(&d.items, &ns, &name);
        let reuse = reuse_project_site(
            &kept.fingerprint,
            kept.fetched_at,
            &kept.known_items,
            &fingerprint,
            &items,
            now,
        );
        if !reuse {
            tracing::debug!(project = %name, kept = ?kept.fingerprint, now = ?fingerprint, fetched_at = %kept.fetched_at, new_items = items.difference(&kept.known_items).count(), "rebuilding the project's Job Site");
        }
        reuse.then(|| (Arc::clone(&kept.site), Arc::clone(&kept.store)))
        })
    };
    let (site, store) = match kept {
        Some(kept) => kept,
        None => {
            let clone = settings.workdir.join(&ns).join(&name).join("repo");
            // The items known before the fetch starts (see [`ProjectRuntime::known_items`]).
            let known_items = project_items(&d.items, &ns, &name);
            let fetched = fetch_clone(project, settings, &clone).await;
            if let Some(metrics) = &settings.metrics {
                let outcome = if fetched.is_ok() { "ok" } else { "failed" };
                metrics
                    .repository_fetches
                    .with_label_values(&[outcome])
                    .inc();
            }
            fetched?;
            let store = KubeStore::new(
                client.clone(),
                &ns,
                &name,
                AdapterConfig {
                    materializer_subject: MATERIALIZER_SUBJECT.into(),
                    lease_seconds: i64::from(spec.lease_duration_seconds),
                },
            )
            .with_item_cache(d.items.clone());
            let store = Arc::new(store);
            let site = Arc::new(
                build_site(
                    client,
                    project,
                    settings,
                    executor,
                    classes,
                    Arc::clone(&store),
                    clone,
                )
                .await?,
            );
            d.projects
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .insert(
                    key,
                    ProjectRuntime {
                        fingerprint,
                        fetched_at: now,
                        known_items,
                        site: Arc::clone(&site),
                        store: Arc::clone(&store),
                    },
                );
            (site, store)
        }
    };
    let actions = site
        .dispatch(&d.builds, &project_tag(&ns, &name))
        .await
        .map_err(|e| ProjectError::Pass {
            project: name.clone(),
            reason: e.to_string(),
        })?;
    publish(client, &ns, settings, &actions).await;
    show_queue(client, project, settings, &*site.engine.executor, d).await;
    if settings
        .claim_sweeps
        .due(&format!("{ns}/{name}"), std::time::Instant::now())
    {
        match store
            .collect_orphaned_claims(Timestamp::now(), settings.claim_sweeps.min_age)
            .await
        {
            Ok(swept) => {
                tracing::info!(project = %name, ?swept, "collected the key claims of deleted work items")
            }
            Err(e) => {
                tracing::warn!(project = %name, error = %e, "could not collect the key claims of deleted work items; retrying at the next sweep")
            }
        }
    }
    Ok(actions)
}
