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

/// Runs a controller over `api` until the stream ends (shutdown).
pub async fn run<K, C, E, Fut>(
    api: Api<K>,
    reconcile: impl FnMut(Arc<K>, Arc<C>) -> Fut,
    error_policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action,
    ctx: Arc<C>,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Debug + Unpin,
    E: std::error::Error + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
{
    Controller::new(api, watcher::Config::default())
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
}
