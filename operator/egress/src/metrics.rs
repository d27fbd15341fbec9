//! `protobot_egress_decisions_total{outcome}` (ARCHITECTURE.md §6): one
//! increment per request the proxy answers, labelled `allowed` or `denied`;
//! `protobot_egress_limit_refusals_total{limit}`: connections and requests
//! refused by a resource limit (`connections`, `header-timeout`, `body-timeout`,
//! `request-too-large`, `head-too-large`).

use prometheus::{IntCounterVec, Opts, Registry};

use crate::decide::Outcome;

/// The resource limits the proxy refuses by (the `limit` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitKind {
    /// The connection cap was reached (503).
    Connections,
    /// The request head did not arrive in time (408).
    HeaderTimeout,
    /// The request body did not arrive in time (408).
    BodyTimeout,
    /// The request body is over the limit (413).
    RequestTooLarge,
    /// The request head is over the limit (431).
    HeadTooLarge,
}

impl LimitKind {
    /// Every kind, for pre-registering the label values.
    pub const ALL: [LimitKind; 5] = [
        LimitKind::Connections,
        LimitKind::HeaderTimeout,
        LimitKind::BodyTimeout,
        LimitKind::RequestTooLarge,
        LimitKind::HeadTooLarge,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Connections => "connections",
            LimitKind::HeaderTimeout => "header-timeout",
            LimitKind::BodyTimeout => "body-timeout",
            LimitKind::RequestTooLarge => "request-too-large",
            LimitKind::HeadTooLarge => "head-too-large",
        }
    }
}

/// The proxy's metrics.
#[derive(Clone, Debug)]
pub struct EgressMetrics {
    /// `protobot_egress_decisions_total{outcome}`.
    pub decisions: IntCounterVec,
    /// `protobot_egress_limit_refusals_total{limit}`.
    pub limit_refusals: IntCounterVec,
}

impl EgressMetrics {
    /// Creates the families and registers them with `registry`. Both outcomes
    /// start at zero so dashboards see them before the first request.
    pub fn register(registry: &Registry) -> Result<EgressMetrics, prometheus::Error> {
        let decisions = IntCounterVec::new(
            Opts::new(
                "protobot_egress_decisions_total",
                "Egress proxy decisions by outcome.",
            ),
            &["outcome"],
        )?;
        registry.register(Box::new(decisions.clone()))?;
        for outcome in [Outcome::Allowed, Outcome::Denied] {
            decisions.with_label_values(&[outcome.as_str()]);
        }
        let limit_refusals = IntCounterVec::new(
            Opts::new(
                "protobot_egress_limit_refusals_total",
                "Connections and requests the egress proxy refused by a resource limit.",
            ),
            &["limit"],
        )?;
        registry.register(Box::new(limit_refusals.clone()))?;
        for kind in LimitKind::ALL {
            limit_refusals.with_label_values(&[kind.as_str()]);
        }
        Ok(EgressMetrics {
            decisions,
            limit_refusals,
        })
    }

    /// Counts one refusal by a resource limit.
    pub fn limit_refused(&self, kind: LimitKind) {
        self.limit_refusals
            .with_label_values(&[kind.as_str()])
            .inc();
    }

    /// Counts one answered request.
    pub fn observe(&self, outcome: Outcome) {
        self.decisions.with_label_values(&[outcome.as_str()]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_counted_separately() {
        let registry = Registry::new();
        let m = EgressMetrics::register(&registry).unwrap();
        m.observe(Outcome::Denied);
        m.observe(Outcome::Denied);
        m.observe(Outcome::Allowed);
        let families = registry.gather();
        assert_eq!(families[0].name(), "protobot_egress_decisions_total");
        assert_eq!(m.decisions.with_label_values(&["denied"]).get(), 2);
        assert_eq!(m.decisions.with_label_values(&["allowed"]).get(), 1);
        assert!(
            EgressMetrics::register(&registry).is_err(),
            "registered twice"
        );
    }
}
