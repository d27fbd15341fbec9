//! protobot's operator side: the Job Site health surface today (metrics,
//! liveness, readiness), the kube-runtime controllers as they land.

pub mod admin;
pub mod changeset;
pub mod metrics;
pub mod operator;
