//! The `BuildWorkItem` controller: a kube-runtime [`Controller`] that reconciles each
//! item on its own, beside the per-Project dispatcher of [`crate::jobsite::run`].
//!
//! For each item it keeps the [`FINALIZER`] while work may still land and removes it once
//! the item is finished, wakes the item's project dispatcher when the item is claimable,
//! held by this replica and not building here, or its lease has expired (the dispatcher
//! claims, resumes and recovers: claims are decided per project, within its WIP limit),
//! and comes back when another replica's lease expires, so a lapsed lease is recovered
//! without waiting for a timer. Its watch passes on an item only when its state,
//! generation, lease holder or finalizers changed ([`motion`]): lease renewals and ledger
//! writes do not cause reconciles. A failed reconcile (the API refused a finalizer write)
//! is retried for that item alone after 1 s, doubling to 5 min.
//!
//! Pure: [`decide`] and [`motion`]. Edge: [`run`].

use std::{
    collections::HashMap,
    hash::{Hash, Hasher},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        Controller, PredicateConfig, WatchStreamExt,
        controller::Action,
        reflector::{self, ObjectRef},
        watcher,
    },
};
use protobot_api::{BuildWorkItem, LifecycleState};
use protobot_jobsite::builds::Builds;
use tokio::sync::mpsc;

use crate::jobsite::{FINALIZER, project_tag};

/// Longest wait before a failing item is reconciled again.
pub const MAX_ITEM_RETRY: Duration = Duration::from_secs(300);
/// When to look again at an item whose expired lease the dispatcher was woken for.
pub const EXPIRED_LEASE_RECHECK: Duration = Duration::from_secs(30);

/// What reconciling one item decided (pure).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemDecision {
    /// The finalizers to write, when they must change.
    pub finalizers: Option<Vec<String>>,
    /// Wake the item's project dispatcher.
    pub wake: bool,
    /// Reconcile the item again after this long, changed or not (`None`: on change).
    pub requeue: Option<Duration>,
}

/// Decides for `item` at `now`, as replica `identity`; `building_here` says whether this
/// replica is building it (pure).
pub fn decide(
    item: &BuildWorkItem,
    identity: &str,
    now: Timestamp,
    building_here: bool,
) -> ItemDecision {
    let state = item.status.as_ref().map(|s| s.state);
    let finished = matches!(
        state,
        Some(LifecycleState::Completed | LifecycleState::Abandoned)
    );
    let mut finalizers = item.finalizers().to_vec();
    let has = finalizers.iter().any(|f| f == FINALIZER);
    let finalizers = match (finished, has) {
        (true, true) => {
            finalizers.retain(|f| f != FINALIZER);
            Some(finalizers)
        }
        (false, false) if item.metadata.deletion_timestamp.is_none() => {
            finalizers.push(FINALIZER.to_owned());
            Some(finalizers)
        }
        _ => None,
    };
    let (wake, requeue) = match state {
        // No status yet: the store writes it; that write is a change.
        None => (false, None),
        Some(
            LifecycleState::ReadyForBuilding | LifecycleState::Waiting | LifecycleState::Blocked,
        ) => (
            // Ready: claimable; waiting: the dispatcher refreshes dependencies; blocked:
            // it may be unblocked by a dependency's abandonment being re-planned.
            state != Some(LifecycleState::Blocked),
            None,
        ),
        Some(LifecycleState::Building | LifecycleState::Inspecting | LifecycleState::Merging) => {
            match item.status.as_ref().and_then(|s| s.lease.as_ref()) {
                // Active without a lease: the dispatcher's reconcile decides.
                None => (true, Some(EXPIRED_LEASE_RECHECK)),
                Some(lease) if !lease.is_live_at(now) => (true, Some(EXPIRED_LEASE_RECHECK)),
                Some(lease) => {
                    let left = Duration::try_from(lease.expires_at().duration_since(now))
                        .unwrap_or_default();
                    // Back when the lease would have lapsed: recovered then, if it did.
                    let recheck = left + Duration::from_secs(1);
                    if lease.holder == identity {
                        // Held here: resumed by the dispatcher unless it is building.
                        (!building_here, Some(recheck))
                    } else {
                        (false, Some(recheck))
                    }
                }
            }
        }
        Some(_) => (false, None),
    };
    ItemDecision {
        finalizers,
        wake,
        requeue,
    }
}

/// The watch's filter: a hash of what the controller decides on — state, generation,
/// lease holder, whether the item is being deleted and its finalizers — so an event that
/// changed none of them (a lease renewal, a ledger write) causes no reconcile (pure).
pub fn motion(item: &BuildWorkItem) -> Option<u64> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let status = item.status.as_ref();
    status.map(|s| s.state.to_string()).hash(&mut hasher);
    item.metadata.generation.hash(&mut hasher);
    status
        .and_then(|s| s.lease.as_ref())
        .map(|l| (&l.holder, &l.fencing_token))
        .hash(&mut hasher);
    item.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    item.finalizers().hash(&mut hasher);
    Some(hasher.finish())
}

/// Why an item could not be reconciled.
#[derive(Debug, thiserror::Error)]
pub enum ItemError {
    /// The API server refused a write.
    #[error(
        "failed to {verb} BuildWorkItem {namespace}/{name}: {source}; check the operator's RBAC (patch on buildworkitems) and the API server"
    )]
    Api {
        /// What was attempted.
        verb: &'static str,
        /// The item's namespace.
        namespace: String,
        /// The item.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// What the controller's reconciles share.
pub struct ItemContext {
    /// The operator's client.
    pub client: Client,
    /// This replica's trusted subject.
    pub identity: String,
    /// The builds running in this replica.
    pub builds: Builds,
    /// Wakes a project's dispatcher (`(namespace, project)`).
    pub wake: mpsc::UnboundedSender<(String, String)>,
    /// Reconcile failures in a row, per item.
    failures: Mutex<HashMap<ObjectRef<BuildWorkItem>, u32>>,
    /// Where reconciles are counted.
    pub metrics: Option<crate::metrics::JobSiteMetrics>,
}

impl ItemContext {
    /// A context with no failures recorded.
    pub fn new(
        client: Client,
        identity: String,
        builds: Builds,
        wake: mpsc::UnboundedSender<(String, String)>,
        metrics: Option<crate::metrics::JobSiteMetrics>,
    ) -> ItemContext {
        ItemContext {
            client,
            identity,
            builds,
            wake,
            failures: Mutex::default(),
            metrics,
        }
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<BuildWorkItem>, u32>> {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The wait after `failures` failed reconciles of one item: 1 s, 2 s, 4 s … at most
/// [`MAX_ITEM_RETRY`] (pure).
pub fn retry_after(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.clamp(1, 10).saturating_sub(1)).min(MAX_ITEM_RETRY)
}

async fn reconcile(item: Arc<BuildWorkItem>, ctx: Arc<ItemContext>) -> Result<Action, ItemError> {
    let _timer = ctx
        .metrics
        .as_ref()
        .map(|m| m.reconcile("buildworkitem-item"));
    let ns = item.namespace().unwrap_or_default();
    let name = item.name_any();
    let project = item.spec.project_ref.name.clone();
    let building_here = ctx
        .builds
        .is_running(&project_tag(&ns, &project), &item.spec.work_item_id);
    let decision = decide(&item, &ctx.identity, Timestamp::now(), building_here);
    if let Some(finalizers) = &decision.finalizers {
        let items: Api<BuildWorkItem> = Api::namespaced(ctx.client.clone(), &ns);
        // Guarded by the resourceVersion: a concurrent change fails this write, and the
        // change's own event reconciles the item again.
        let patch = serde_json::json!({"metadata": {
            "finalizers": finalizers,
            "resourceVersion": item.resource_version(),
        }});
        match items
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            // Not a failure: the item changed since it was read, and that change's own
            // event reconciles it again (with the finalizers decided from it).
            Err(kube::Error::Api(status)) if status.code == 409 => {
                tracing::debug!(work_item = %name, "finalizer write raced a newer version; its event reconciles the item again");
                return Ok(Action::await_change());
            }
            Err(source) => {
                return Err(ItemError::Api {
                    verb: "patch the finalizers of",
                    namespace: ns.clone(),
                    name: name.clone(),
                    source,
                });
            }
        }
    }
    if decision.wake {
        // The dispatcher is gone only when the replica stops.
        let _ = ctx.wake.send((ns, project));
    }
    ctx.failures().remove(&ObjectRef::from_obj(item.as_ref()));
    Ok(decision
        .requeue
        .map_or_else(Action::await_change, Action::requeue))
}

fn error_policy(item: Arc<BuildWorkItem>, _error: &ItemError, ctx: Arc<ItemContext>) -> Action {
    let failures = {
        let mut all = ctx.failures();
        let n = all.entry(ObjectRef::from_obj(item.as_ref())).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    if let Some(metrics) = &ctx.metrics {
        metrics
            .reconcile_errors
            .with_label_values(&["buildworkitem", "api"])
            .inc();
    }
    let wait = retry_after(failures);
    tracing::debug!(work_item = %item.name_any(), failures, retry_in = ?wait, "retrying this item alone");
    Action::requeue(wait)
}

/// Runs the controller over the items of `namespace` (all namespaces when `None`) until
/// `stopped` resolves.
pub async fn run(
    client: Client,
    namespace: Option<String>,
    ctx: ItemContext,
    stopped: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (reader, writer) = reflector::store::<BuildWorkItem>();
    run_with_cache(client, namespace, ctx, stopped, (reader, writer)).await;
}

/// [`run`], filling `cache` (a reflector's store and writer) as it watches: the
/// dispatcher reads the same cache ([`protobot_stores::KubeStore::with_item_cache`]).
pub async fn run_with_cache(
    client: Client,
    namespace: Option<String>,
    ctx: ItemContext,
    stopped: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    cache: (
        reflector::Store<BuildWorkItem>,
        reflector::store::Writer<BuildWorkItem>,
    ),
) {
    let items: Api<BuildWorkItem> = match &namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let (reader, writer) = cache;
    let moved = watcher(items, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(motion, PredicateConfig::default());
    // Not metered by the runner: the `buildworkitem` durations are the dispatches'
    // ([`crate::jobsite::run`]); a failure is counted by the error policy.
    crate::drive::Runner::new("buildworkitem")
        .publishing(ctx.client.clone())
        .until(stopped)
        .run(
            Controller::for_stream(moved, reader),
            reconcile,
            error_policy,
            Arc::new(ctx),
        )
        .await;
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use jiff::SignedDuration;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use protobot_api::{BuildWorkItemStatus, Lease};

    use super::*;

    fn item(
        state: Option<LifecycleState>,
        lease: Option<(&str, i64)>,
        finalized: bool,
    ) -> BuildWorkItem {
        let now = Timestamp::now();
        let mut item: BuildWorkItem = serde_json::from_value(serde_json::json!({
            "apiVersion": "protobot.dev/v1alpha1",
            "kind": "BuildWorkItem",
            "metadata": {"name": "wi-1", "namespace": "team", "generation": 1},
            "spec": {
                "workItemId": "WI-1",
                "projectRef": {"name": "demo"},
                "materializationKey": "demo/CS-1@0",
                "changeType": "changes",
                "implementationRequired": true,
                "changedRequirements": [],
                "applicableRequirements": [],
                "dependencies": [],
            },
        }))
        .unwrap();
        if finalized {
            item.metadata.finalizers = Some(vec!["other".into(), FINALIZER.into()]);
        }
        item.status = state.map(|state| {
            let mut status: BuildWorkItemStatus =
                serde_json::from_value(serde_json::json!({"state": state, "contractVersion": 1}))
                    .unwrap();
            status.lease = lease.map(|(holder, secs_left)| Lease {
                holder: holder.into(),
                fencing_token: "fence-1".into(),
                acquire_time: Time(now),
                renew_time: Time(now + SignedDuration::from_secs(secs_left - 900)),
                duration_seconds: 900,
            });
            status
        });
        item
    }

    #[test]
    fn unfinished_items_get_the_finalizer_and_finished_ones_lose_only_it() {
        let d = decide(
            &item(Some(LifecycleState::Waiting), None, false),
            "me",
            Timestamp::now(),
            false,
        );
        assert_eq!(d.finalizers, Some(vec![FINALIZER.to_owned()]));
        let d = decide(
            &item(Some(LifecycleState::Completed), None, true),
            "me",
            Timestamp::now(),
            false,
        );
        assert_eq!(d.finalizers, Some(vec!["other".to_owned()]));
        assert!(!d.wake);
        assert_eq!(d.requeue, None);
        let d = decide(
            &item(Some(LifecycleState::Building), Some(("me", 600)), true),
            "me",
            Timestamp::now(),
            true,
        );
        assert_eq!(d.finalizers, None, "already there");
    }

    #[test]
    fn claimable_held_and_expired_items_wake_their_dispatcher_others_wait_for_the_lease() {
        let now = Timestamp::now();
        let ready = decide(
            &item(Some(LifecycleState::ReadyForBuilding), None, true),
            "me",
            now,
            false,
        );
        assert!(ready.wake);
        assert_eq!(ready.requeue, None);
        let blocked = decide(
            &item(Some(LifecycleState::Blocked), None, true),
            "me",
            now,
            false,
        );
        assert!(!blocked.wake);

        // Held here and building: nothing to do until the lease would lapse.
        let building = decide(
            &item(Some(LifecycleState::Building), Some(("me", 600)), true),
            "me",
            now,
            true,
        );
        assert!(!building.wake);
        let recheck = building.requeue.unwrap();
        assert!(
            recheck > Duration::from_secs(590) && recheck < Duration::from_secs(602),
            "{recheck:?}"
        );
        // Held here but not building (this replica restarted): resumed.
        assert!(
            decide(
                &item(Some(LifecycleState::Inspecting), Some(("me", 600)), true),
                "me",
                now,
                false
            )
            .wake
        );
        // Another replica's live lease: back when it would lapse.
        let theirs = decide(
            &item(Some(LifecycleState::Merging), Some(("other", 30)), true),
            "me",
            now,
            false,
        );
        assert!(!theirs.wake);
        assert!(theirs.requeue.unwrap() < Duration::from_secs(32));
        // Expired: the dispatcher recovers it.
        let expired = decide(
            &item(Some(LifecycleState::Building), Some(("other", -5)), true),
            "me",
            now,
            false,
        );
        assert!(expired.wake);
        assert_eq!(expired.requeue, Some(EXPIRED_LEASE_RECHECK));
    }

    #[test]
    fn renewals_do_not_move_an_item_but_a_new_holder_or_state_does() {
        let a = item(Some(LifecycleState::Building), Some(("me", 600)), true);
        let renewed = item(Some(LifecycleState::Building), Some(("me", 900)), true);
        assert_eq!(motion(&a), motion(&renewed), "a renewal is no motion");
        let other = item(Some(LifecycleState::Building), Some(("other", 600)), true);
        assert_ne!(motion(&a), motion(&other));
        let inspecting = item(Some(LifecycleState::Inspecting), Some(("me", 600)), true);
        assert_ne!(motion(&a), motion(&inspecting));
        let unfinalized = item(Some(LifecycleState::Building), Some(("me", 600)), false);
        assert_ne!(motion(&a), motion(&unfinalized));
        let mut edited = a.clone();
        edited.metadata.generation = Some(2);
        assert_ne!(motion(&a), motion(&edited), "a spec edit (priority)");
        let mut versioned = a.clone();
        if let Some(s) = versioned.status.as_mut() {
            s.contract_version = 5;
        }
        assert_eq!(
            motion(&a),
            motion(&versioned),
            "a renewal's new contract version"
        );
    }

    #[test]
    fn retries_double_per_item_up_to_five_minutes() {
        assert_eq!(retry_after(1), Duration::from_secs(1));
        assert_eq!(retry_after(3), Duration::from_secs(4));
        assert_eq!(retry_after(30), MAX_ITEM_RETRY);
    }
}
