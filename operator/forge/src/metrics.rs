//! Forge metrics: `protobot_forge_api_calls_total{operation, outcome}` counts every GitHub API
//! request (each attempt, retries included) by the operation it served and how it ended;
//! `protobot_forge_rate_limit_waits_total{kind}` counts the waits GitHub's limits imposed,
//! `protobot_forge_pacing_waits_total` the mutations protobot held back to stay inside
//! GitHub's documented pacing, `protobot_forge_merge_retries_total{refusal}` the transient
//! merge answers asked again, `protobot_forge_checks_waits_total{outcome}` how waits for
//! required checks ended, and `protobot_forge_approval_reasks_total` the approval lookups
//! asked again. Labels are closed sets (operations, [`Outcome`], refusal categories), never
//! free text or work-item ids.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};

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
    pacing_waits: IntCounter,
    merge_retries: IntCounterVec,
    checks_waits: IntCounterVec,
    approval_reasks: IntCounter,
}

/// How a wait for required checks ended (the label of `protobot_forge_checks_waits_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChecksWaitOutcome {
    /// The checks reported and passed; the merge was asked again.
    Reported,
    /// A check failed.
    Failing,
    /// The deadline passed with checks pending; escalated.
    Deadline,
}

impl ChecksWaitOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            ChecksWaitOutcome::Reported => "reported",
            ChecksWaitOutcome::Failing => "failing",
            ChecksWaitOutcome::Deadline => "deadline",
        }
    }
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
        let pacing_waits = IntCounter::new(
            "protobot_forge_pacing_waits_total",
            "GitHub mutations held back to keep GitHub's documented pacing (one at a time, a second apart, 80 a minute, 500 an hour).",
        )?;
        let merge_retries = IntCounterVec::new(
            Opts::new(
                "protobot_forge_merge_retries_total",
                "Transient merge answers asked again, by refusal category.",
            ),
            &["refusal"],
        )?;
        let checks_waits = IntCounterVec::new(
            Opts::new(
                "protobot_forge_checks_waits_total",
                "Waits for required checks of a tested head, by how they ended (reported, failing, deadline).",
            ),
            &["outcome"],
        )?;
        let approval_reasks = IntCounter::new(
            "protobot_forge_approval_reasks_total",
            "Approved-merge lookups asked again because GitHub had not associated the merge commit with its pull request yet.",
        )?;
        registry.register(Box::new(api_calls.clone()))?;
        registry.register(Box::new(rate_limit_waits.clone()))?;
        registry.register(Box::new(pacing_waits.clone()))?;
        registry.register(Box::new(merge_retries.clone()))?;
        registry.register(Box::new(checks_waits.clone()))?;
        registry.register(Box::new(approval_reasks.clone()))?;
        Ok(ForgeMetrics {
            api_calls,
            rate_limit_waits,
            pacing_waits,
            merge_retries,
            checks_waits,
            approval_reasks,
        })
    }

    /// Counts one mutation held back by the pacing.
    pub fn paced(&self) {
        self.pacing_waits.inc();
    }

    /// Counts one transient merge answer asked again (`refusal` is its category).
    pub fn merge_retried(&self, refusal: &'static str) {
        self.merge_retries.with_label_values(&[refusal]).inc();
    }

    /// Counts one ended wait for required checks.
    pub fn checks_wait_ended(&self, outcome: ChecksWaitOutcome) {
        self.checks_waits
            .with_label_values(&[outcome.as_str()])
            .inc();
    }

    /// Counts one approval lookup asked again.
    pub fn approval_reasked(&self) {
        self.approval_reasks.inc();
    }

    /// Mutations held back so far.
    pub fn pacing_waits(&self) -> u64 {
        self.pacing_waits.get()
    }

    /// Transient retries of `refusal` so far.
    pub fn merge_retries(&self, refusal: &str) -> u64 {
        self.merge_retries.with_label_values(&[refusal]).get()
    }

    /// Ended checks waits with `outcome` so far.
    pub fn checks_waits(&self, outcome: ChecksWaitOutcome) -> u64 {
        self.checks_waits
            .with_label_values(&[outcome.as_str()])
            .get()
    }

    /// Approval re-asks so far.
    pub fn approval_reasks(&self) -> u64 {
        self.approval_reasks.get()
    }

    /// Every API request counted so far, by outcome, over all operations.
    pub fn calls_by_outcome(&self, outcome: Outcome) -> u64 {
        use prometheus::core::Collector;
        self.api_calls
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .filter(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == "outcome" && l.value() == outcome.as_str())
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
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
