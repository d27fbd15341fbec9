//! The egress proxy and credential broker of protobot sandboxes
//! (ARCHITECTURE.md §4; jobsite-sandbox/v1 network and credential checks).
//!
//! Sandbox pods reach nothing but this proxy (their NetworkPolicy allows
//! only TCP to pods labelled `app.kubernetes.io/name: protobot-egress-proxy`
//! on port 3128). They talk plain HTTP to it inside the cluster; the proxy
//! decides, and for allowed requests speaks HTTPS upstream itself, so it sees
//! every method, path and header without intercepting TLS.
//!
//! Deny by default: a request passes only when a rule of the
//! [`EgressPolicy`] names its executable digest (optional), role,
//! destination, method and exact path. The decision order, its reasons and
//! codes (`sandbox.denied`, `sandbox.fail_closed`) are in [`decide`].
//! Credentials are injected only after the decision allowed the request and
//! are stripped from response headers and bodies; upstream redirects are
//! never followed and reach the sandbox as denials.
//!
//! Identity: each sandbox run has a session registered by the control plane
//! and a session token derived from it ([`session`]); the proxy answers 401
//! without a valid token and 403 when the caller sends its own
//! `Authorization`. The executable digest comes from an optional
//! `X-Sandbox-Exec-Token` that an in-guest supervisor can compute; that
//! attestation is only as strong as the supervisor's keeping the session
//! token away from the workload, and without it a request has no executable
//! identity and digest-pinned rules do not match.
//!
//! Pipeline: [`policy`] (parse, validate) → [`form`] (read the request) →
//! [`decide`] (pure) → [`broker`] (inject, forward, strip, record) with
//! [`upstream`] as the only network edge; [`metrics`] and [`admin`] expose
//! `protobot_egress_decisions_total{outcome}`.
//!
//! Metering: the answer of every model call ([`usage`]) is read for the
//! tokens it reports, priced ([`price`], integer micro-dollars) and recorded
//! per run ([`meter`]) — where the agent cannot touch the count.

pub mod address;
pub mod admin;
pub mod broker;
pub mod credentials;
pub mod decide;
pub mod form;
pub mod meter;
pub mod metrics;
pub mod netns;
pub mod policy;
pub mod price;
pub mod probe;
pub mod redact;
pub mod server;
pub mod session;
pub mod upstream;
pub mod usage;

pub use broker::{Broker, Limits};
pub use credentials::{Credential, CredentialError, CredentialStore};
pub use decide::{Code, Decision, Denial, EgressRequest, Grant, Outcome, Reason, decide};
pub use meter::{RunUsage, UsageMeter, UsageMetrics};
pub use metrics::EgressMetrics;
pub use policy::{EgressPolicy, PolicyError, Rule};
pub use price::{Microdollars, ModelPrice, PriceTable};
pub use session::{
    Session, SessionRegistry, SessionSecret, exec_token, issue_session_token, session_token,
    verify_session_token,
};
pub use upstream::{Upstream, UpstreamError};
pub use usage::{Metered, ModelApi, TokenCounts};
