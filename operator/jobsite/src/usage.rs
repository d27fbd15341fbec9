//! The usage port (issue 34): where the Job Site reads back what a sandboxed run spent on
//! model calls once the run ended. The egress proxy meters every model call of a run under the
//! run's id (its session's trace id); an adapter reads that record — from the proxy's meter in
//! this process on one machine, from the proxy's admin `GET /usage/<run id>` in a cluster —
//! and the engine prices it with the worker class's prices and records it on the item
//! (`protobot_stores::Observation::Usage`, idempotent by run id).
//!
//! Reading usage never fails a build: an unreachable proxy is a warning, and the item's usage
//! then misses that run.

use std::{future::Future, pin::Pin};

pub use protobot_usage::RunUsage;

/// The answer of [`UsageSource::run_usage`].
pub type UsageFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Option<RunUsage>, UsageReadError>> + Send + 'a>>;

/// Where a run's metered usage is read from.
pub trait UsageSource: Send + Sync + std::fmt::Debug {
    /// The usage the proxy metered for run `run_id`; `None` when it metered no model call of
    /// that run (it made none, or the record was dropped).
    fn run_usage<'a>(&'a self, run_id: &'a str) -> UsageFuture<'a>;
}

/// Why a run's usage could not be read.
#[derive(Debug, thiserror::Error)]
#[error(
    "failed to read the model usage of run {run_id} from {from}; the item's usage misses this run (check that the egress proxy's admin port is reachable from the operator)"
)]
pub struct UsageReadError {
    /// The run.
    pub run_id: String,
    /// Where it was read from (the proxy's admin URL, say).
    pub from: String,
    /// Why.
    #[source]
    pub source: Box<dyn std::error::Error + Send + Sync>,
}
