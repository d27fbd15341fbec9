//! Forge metrics: `protobot_forge_api_calls_total{operation, outcome}` counts every GitHub API
//! request (each attempt, retries included) by the operation it served and how it ended, and
//! `protobot_forge_rate_limit_waits_total{kind}` counts the waits GitHub's limits imposed.
//! Outcomes are a closed set ([`Outcome`]), never free text.

use prometheus::{IntCounterVec, Opts, Registry};

/// How one API request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx.
    Success,
    /// 403/429 with a rate limit.
    RateLimited,
    /// Another 4xx (a refusal: protection, conflict, not found, validation).
    Refused,
    /// 5xx.
    ServerError,
    /// No HTTP answer (connection, TLS, timeout).
    TransportError,
    /// A 2xx body that did not have the documented shape.
    DecodeError,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Success => "success",
            Outcome::RateLimited => "rate-limited",
            Outcome::Refused => "refused",
            Outcome::ServerError => "server-error",
            Outcome::TransportError => "transport-error",
            Outcome::DecodeError => "decode-error",
        }
    }
}

/// The forge's counters; clone freely (the families are shared).
#[derive(Clone, Debug)]
pub struct ForgeMetrics {
    api_calls: IntCounterVec,
    rate_limit_waits: IntCounterVec,
}

impl ForgeMetrics {
    /// Creates the families and registers them on `registry`.
    pub fn register(registry: &Registry) -> Result<ForgeMetrics, prometheus::Error> {
        let api_calls = IntCounterVec::new(
            Opts::new(
                "protobot_forge_api_calls_total",
                "GitHub API requests by operation and outcome (every attempt, retries included).",
            ),
            &["operation", "outcome"],
        )?;
        let rate_limit_waits = IntCounterVec::new(
            Opts::new(
                "protobot_forge_rate_limit_waits_total",
                "Waits imposed by GitHub's rate limits, by kind (primary, secondary).",
            ),
            &["kind"],
        )?;
        registry.register(Box::new(api_calls.clone()))?;
        registry.register(Box::new(rate_limit_waits.clone()))?;
        Ok(ForgeMetrics {
            api_calls,
            rate_limit_waits,
        })
    }

    /// Counts one request.
    pub fn call(&self, operation: &str, outcome: Outcome) {
        self.api_calls
            .with_label_values(&[operation, outcome.as_str()])
            .inc();
    }

    /// Counts one wait.
    pub fn waited(&self, kind: &str) {
        self.rate_limit_waits.with_label_values(&[kind]).inc();
    }

    /// The count for `operation` and `outcome` (tests and diagnostics).
    pub fn calls(&self, operation: &str, outcome: Outcome) -> u64 {
        self.api_calls
            .with_label_values(&[operation, outcome.as_str()])
            .get()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn families_register_once_and_count_by_label() {
        let registry = Registry::new();
        let m = ForgeMetrics::register(&registry).unwrap();
        m.call("merge-pull", Outcome::Refused);
        m.call("merge-pull", Outcome::Refused);
        m.call("merge-pull", Outcome::Success);
        assert_eq!(m.calls("merge-pull", Outcome::Refused), 2);
        assert_eq!(m.calls("merge-pull", Outcome::Success), 1);
        let names: Vec<String> = registry
            .gather()
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        assert!(
            names.contains(&"protobot_forge_api_calls_total".to_string()),
            "{names:?}"
        );
        // A second registration on the same registry is an error, not a silent duplicate.
        assert!(ForgeMetrics::register(&registry).is_err());
    }
}
