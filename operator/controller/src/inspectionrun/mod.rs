//! The InspectionRun controller: the conditions every `InspectionRun`
//! promises, on its status.
//!
//! Pipeline, one step per stage; only the edges touch the cluster:
//! read (the run, as the Job Site published it) → decide
//! ([`decide::conditions`], [`decide::sealed_event`]) → apply (the
//! conditions and `observedGeneration`, server-side applied under this
//! controller's field manager, so they never collide with the fields the Job
//! Site applies; a `Sealed` Event when the ledger seals).
//!
//! Every replica runs it: the conditions are a pure function of the object,
//! so replicas write the same thing, and an unchanged observation writes
//! nothing.

pub mod decide;

use std::{sync::Arc, time::Duration};

use jiff::Timestamp;
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        controller::Action,
        events::{Recorder, Reporter},
    },
};
use protobot_api::InspectionRun;

/// Field manager of this controller's server-side applies.
pub const FIELD_MANAGER: &str = "protobot/inspectionrun";
/// The `reportingController` of this controller's Events.
pub const EVENT_REPORTER: &str = "protobot-inspectionrun";

/// Errors of one reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The object has no namespace (the CRD is namespaced; this is a bug).
    #[error(
        "InspectionRun {0} has no namespace; InspectionRuns are namespaced, recreate it in a namespace"
    )]
    MissingNamespace(String),
    /// Writing the status failed.
    #[error(
        "failed to write the conditions of InspectionRun {name}: {source}; check the operator's RBAC for inspectionruns/status"
    )]
    WriteStatus {
        /// The run.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// Stable category for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            Error::MissingNamespace(_) => "missing-namespace",
            Error::WriteStatus { .. } => "write-status",
        }
    }
}

/// Shared state of the controller.
pub struct Context {
    /// The client.
    pub client: Client,
    /// Publishes Events.
    pub recorder: Recorder,
}

impl Context {
    /// A context publishing Events as [`EVENT_REPORTER`].
    pub fn new(client: Client) -> Context {
        Context {
            recorder: Recorder::new(client.clone(), Reporter::from(EVENT_REPORTER)),
            client,
        }
    }
}

/// One reconcile: decide the conditions and apply them if they changed.
pub async fn reconcile(run: Arc<InspectionRun>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = run.name_any();
    let ns = run
        .namespace()
        .ok_or_else(|| Error::MissingNamespace(name.clone()))?;
    let generation = run.metadata.generation;
    let status = run.status.as_ref();
    let before = status.map(|s| s.conditions.clone()).unwrap_or_default();
    let after = decide::conditions(&run.spec, status, generation, Timestamp::now());
    let observed = status.and_then(|s| s.observed_generation);
    if after == before && observed == generation {
        return Ok(Action::await_change());
    }
    let body = serde_json::json!({
        "apiVersion": "protobot.dev/v1alpha1",
        "kind": "InspectionRun",
        "status": {"observedGeneration": generation, "conditions": after},
    });
    Api::<InspectionRun>::namespaced(ctx.client.clone(), &ns)
        .patch_status(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(|source| Error::WriteStatus {
            name: name.clone(),
            source,
        })?;
    if let Some(event) = decide::sealed_event(&before, &after) {
        // Events are best effort: a lost Event never fails the reconcile.
        if let Err(e) = ctx
            .recorder
            .publish(&crate::events::bounded(&event), &run.object_ref(&()))
            .await
        {
            tracing::warn!(run = %name, error = %e, "could not publish an event");
        }
    }
    let ready = after
        .iter()
        .find(|c| c.type_ == protobot_api::conditions::types::READY)
        .map_or("", |c| c.reason.as_str());
    tracing::info!(run = %name, outcome = ready, "conditions applied");
    Ok(Action::await_change())
}

/// Requeues failed reconciles with a delay (the runtime adds its own backoff per object).
pub fn error_policy(_run: Arc<InspectionRun>, _error: &Error, _ctx: Arc<Context>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

/// Runs the controller until the stream ends (shutdown).
pub async fn run_with(client: Client, namespace: Option<String>) {
    run_metered(client, namespace, None).await;
}

/// [`run_with`], with reconciles timed and failures counted (`controller="inspectionrun"`).
pub async fn run_metered(
    client: Client,
    namespace: Option<String>,
    metrics: Option<crate::metrics::JobSiteMetrics>,
) {
    let ctx = Arc::new(Context::new(client));
    let api = crate::drive::scoped_api::<InspectionRun>(ctx.client.clone(), namespace.as_deref());
    let runner = crate::drive::Runner::new("inspectionrun")
        .metered(metrics)
        .publishing(ctx.client.clone());
    runner.watch(api, reconcile, error_policy, ctx).await;
}
