//! The one loop every controller of this crate runs: watch one resource kind
//! (in one namespace or all), reconcile each object, requeue failures through
//! the controller's error policy, until shutdown.

use std::{fmt::Debug, future::Future, hash::Hash, sync::Arc};

use futures::StreamExt;
use kube::{
    Api, Client, Resource,
    runtime::{Controller, controller::Action, watcher},
};
use serde::de::DeserializeOwned;

/// `K` objects in `namespace`, or in every namespace.
pub fn scoped_api<K>(client: Client, namespace: Option<&str>) -> Api<K>
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    }
}

/// An error with a stable label for `protobot_reconcile_errors_total{category}`.
pub trait Categorized {
    /// The label.
    fn category(&self) -> &'static str;
}

impl Categorized for crate::registration::Error {
    fn category(&self) -> &'static str {
        crate::registration::Error::category(self)
    }
}

impl Categorized for crate::project::Error {
    fn category(&self) -> &'static str {
        crate::project::Error::category(self)
    }
}

impl Categorized for crate::inspectionrun::Error {
    fn category(&self) -> &'static str {
        crate::inspectionrun::Error::category(self)
    }
}

/// Where a controller's reconciles are timed and its failures counted:
/// `protobot_reconcile_duration_seconds{controller}` and
/// `protobot_reconcile_errors_total{controller,category}`.
#[derive(Clone, Debug)]
pub struct Metered {
    /// The registry's families.
    pub metrics: crate::metrics::JobSiteMetrics,
    /// The `controller` label.
    pub controller: &'static str,
}

impl Metered {
    /// `controller`'s metering in `metrics`, if the operator keeps metrics.
    pub fn of(
        metrics: Option<crate::metrics::JobSiteMetrics>,
        controller: &'static str,
    ) -> Option<Metered> {
        metrics.map(|metrics| Metered {
            metrics,
            controller,
        })
    }
}

/// Runs a controller over `api` until the stream ends (shutdown); with `metered`, every
/// reconcile is timed and every failure counted by category.
pub async fn run<K, C, E, Fut>(
    api: Api<K>,
    reconcile: impl FnMut(Arc<K>, Arc<C>) -> Fut,
    error_policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action,
    ctx: Arc<C>,
    metered: Option<Metered>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Debug + Unpin,
    E: std::error::Error + Categorized + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    run_controller(
        Controller::new(api, watcher::Config::default()),
        reconcile,
        error_policy,
        ctx,
        metered,
    )
    .await;
}

/// [`run`] over a prepared `controller` (one that also watches related objects).
pub async fn run_controller<K, C, E, Fut>(
    controller: Controller<K>,
    mut reconcile: impl FnMut(Arc<K>, Arc<C>) -> Fut,
    error_policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action,
    ctx: Arc<C>,
    metered: Option<Metered>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Debug + Unpin,
    E: std::error::Error + Categorized + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    let timed = move |object: Arc<K>, ctx: Arc<C>| {
        let timer = metered.as_ref().map(|m| m.metrics.reconcile(m.controller));
        let reconciled = reconcile(object, ctx);
        async move {
            let result = reconciled.await;
            if let (Some(timer), Err(e)) = (&timer, &result) {
                timer.fail(e.category());
            }
            result
        }
    };
    controller
        .run(timed, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
}
