//! `protobot_egress_decisions_total{outcome}` (ARCHITECTURE.md §6): one
//! increment per request the proxy answers, labelled `allowed` or `denied`.

use prometheus::{IntCounterVec, Opts, Registry};

use crate::decide::Outcome;

/// The proxy's metrics.
#[derive(Clone, Debug)]
pub struct EgressMetrics {
    /// `protobot_egress_decisions_total{outcome}`.
    pub decisions: IntCounterVec,
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
        Ok(EgressMetrics { decisions })
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
