//! The one runner every controller of this crate is run through ([`Runner`]): it watches
//! one resource kind (in one namespace or all), reconciles each object, and alone times
//! every reconcile and counts its failures under the controller's label, logs each failure
//! as a warning naming the object, publishes it as a Warning Event on that object, and
//! stops gracefully when asked. A controller's own `error_policy` only decides when to try
//! again.

use std::{fmt::Debug, future::Future, hash::Hash, pin::Pin, sync::Arc};

use futures::StreamExt;
use kube::{
    Api, Client, Resource,
    runtime::{
        Controller,
        controller::{self, Action},
        events::{Event, EventType, Recorder, Reporter},
        watcher,
    },
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

impl Categorized for crate::build_items::ItemError {
    fn category(&self) -> &'static str {
        "api"
    }
}

impl Categorized for crate::inspectionrun::Error {
    fn category(&self) -> &'static str {
        crate::inspectionrun::Error::category(self)
    }
}

/// The Event reason of a failed reconcile.
pub const RECONCILE_FAILED: &str = "ReconcileFailed";

/// A future that resolves when the controller must stop.
type Shutdown = Pin<Box<dyn Future<Output = ()> + Send + Sync>>;

/// How one controller is run: its name (the `controller` label of
/// `protobot_reconcile_duration_seconds` and `protobot_reconcile_errors_total`, and the
/// reporter `protobot-<name>` of its Events), where it is metered, where its failures are
/// published, and when it stops.
pub struct Runner {
    name: &'static str,
    metrics: Option<crate::metrics::JobSiteMetrics>,
    events: Option<Recorder>,
    shutdown: Option<Shutdown>,
}

impl Runner {
    /// The runner of the controller `name` (not metered, failures logged only, runs until
    /// its watch ends).
    pub fn new(name: &'static str) -> Self {
        Runner {
            name,
            metrics: None,
            events: None,
            shutdown: None,
        }
    }

    /// Times every reconcile and counts every failure by category in `metrics`, if the
    /// operator keeps metrics.
    pub fn metered(mut self, metrics: Option<crate::metrics::JobSiteMetrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// Publishes every failed reconcile as a Warning Event ([`RECONCILE_FAILED`]) on its
    /// object, reported as `protobot-<name>`.
    pub fn publishing(mut self, client: Client) -> Self {
        self.events = Some(Recorder::new(
            client,
            Reporter::from(format!("protobot-{}", self.name)),
        ));
        self
    }

    /// Stops when `trigger` resolves: no reconcile starts any more, and the running ones
    /// finish first.
    pub fn until(mut self, trigger: impl Future<Output = ()> + Send + Sync + 'static) -> Self {
        self.shutdown = Some(Box::pin(trigger));
        self
    }

    /// Runs a controller over `api` (a watch of every `K`) until it stops.
    pub async fn watch<K, C, E, Fut>(
        self,
        api: Api<K>,
        reconcile: impl FnMut(Arc<K>, Arc<C>) -> Fut,
        error_policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action,
        ctx: Arc<C>,
    ) where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Debug + Unpin,
        E: std::error::Error + Categorized + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        self.run(
            Controller::new(api, watcher::Config::default()),
            reconcile,
            error_policy,
            ctx,
        )
        .await;
    }

    /// Runs a prepared `controller` (one that also watches related objects, or is fed
    /// from a stream) until it stops.
    pub async fn run<K, C, E, Fut>(
        self,
        controller: Controller<K>,
        mut reconcile: impl FnMut(Arc<K>, Arc<C>) -> Fut,
        error_policy: impl Fn(Arc<K>, &E, Arc<C>) -> Action,
        ctx: Arc<C>,
    ) where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default + Eq + Hash + Clone + Debug + Unpin,
        E: std::error::Error + Categorized + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
    {
        let Runner {
            name,
            metrics,
            events,
            shutdown,
        } = self;
        let timed = move |object: Arc<K>, ctx: Arc<C>| {
            let timer = metrics.as_ref().map(|m| m.reconcile(name));
            let reconciled = reconcile(object, ctx);
            async move {
                let result = reconciled.await;
                if let (Some(timer), Err(e)) = (&timer, &result) {
                    timer.fail(e.category());
                }
                result
            }
        };
        let controller = match shutdown {
            Some(trigger) => controller.graceful_shutdown_on(trigger),
            None => controller,
        };
        let events = events.as_ref();
        controller
            .run(timed, error_policy, ctx)
            .for_each(|r| async move {
                if let Err(e) = r {
                    report(name, events, e).await;
                }
            })
            .await;
    }
}

/// A controller's failure, made visible: a failed reconcile is a warning naming the object
/// and the error's category (and a Warning Event on the object); a watch failure is a
/// warning (the watch retries with backoff); an object gone before its reconcile is not
/// a failure.
async fn report<E, Q>(name: &'static str, events: Option<&Recorder>, error: controller::Error<E, Q>)
where
    E: std::error::Error + Categorized + 'static,
    Q: std::error::Error + 'static,
{
    match error {
        controller::Error::ReconcilerFailed(error, object) => {
            tracing::warn!(controller = name, object = %object, category = error.category(), %error, "reconcile failed; retrying as its error policy says");
            if let Some(recorder) = events {
                let event = Event {
                    type_: EventType::Warning,
                    reason: RECONCILE_FAILED.into(),
                    note: Some(error.to_string()),
                    action: "Reconcile".into(),
                    secondary: None,
                };
                let reference = (*object).into();
                if let Err(e) = recorder
                    .publish(&crate::events::bounded(&event), &reference)
                    .await
                {
                    tracing::warn!(controller = name, error = %e, "could not publish a reconcile failure as an Event");
                }
            }
        }
        controller::Error::ObjectNotFound(object) => {
            tracing::debug!(controller = name, object = %object, "object gone before its reconcile");
        }
        controller::Error::QueueError(error) => {
            tracing::warn!(controller = name, %error, "watch failed; retrying with backoff");
        }
        other => tracing::warn!(controller = name, error = %other, "controller error"),
    }
}
