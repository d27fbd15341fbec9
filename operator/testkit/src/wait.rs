//! Bounded waiting for tests: wait on a watch (kube-runtime's `await_condition`)
//! with a timeout, so a test fails with a message instead of hanging, and never
//! sleeps and hopes.

use std::{fmt::Debug, time::Duration};

use kube::{
    Api, Resource,
    runtime::wait::{Condition, await_condition},
};
use serde::de::DeserializeOwned;

/// Why a bounded wait failed.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The condition did not hold within the timeout.
    #[error("timed out after {timeout:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The bound.
        timeout: Duration,
    },
    /// The underlying watch failed.
    #[error("failed to watch {what}")]
    Watch {
        /// What was awaited.
        what: String,
        /// The watch error.
        #[source]
        source: kube::runtime::wait::Error,
    },
}

/// Wait (through a watch) until the named object satisfies `cond`, for at most
/// `timeout`. Returns the object (`None` if the condition holds for absence,
/// e.g. `kube::runtime::wait::conditions::is_deleted`).
pub async fn until<K>(
    api: &Api<K>,
    name: &str,
    timeout: Duration,
    cond: impl Condition<K>,
) -> Result<Option<K>, WaitError>
where
    K: Clone + Debug + Send + DeserializeOwned + Resource + 'static,
{
    let what = format!("{} {name}", std::any::type_name::<K>());
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, cond)).await {
        Ok(Ok(obj)) => Ok(obj),
        Ok(Err(source)) => Err(WaitError::Watch { what, source }),
        Err(_) => Err(WaitError::Timeout { what, timeout }),
    }
}
