//! Progressive escalation: which worker tier an attempt runs at, and how many
//! retries each error class gets (ARCHITECTURE.md §5).
//!
//! A work item starts at its WorkerClass's cheapest tier and moves up only on
//! *genuine* failures (a failed gate, a rejected inspection); transient errors
//! (timeouts, executor errors, rate limits, network, image pulls) retry at the
//! same tier within their own budget. The attempt history is persisted in the
//! work item, so a restarted Job Site resumes at the right tier by replaying it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Worker tiers, cheapest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Cheapest.
    T1,
    /// Second.
    T2,
    /// Third.
    T3,
    /// Most capable.
    T4,
}

impl Tier {
    /// Its name as a worker class writes it (`t1`…`t4`).
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::T1 => "t1",
            Tier::T2 => "t2",
            Tier::T3 => "t3",
            Tier::T4 => "t4",
        }
    }

    /// The tier named `t1`…`t4` (as [`Tier::as_str`] writes it).
    pub fn parse(name: &str) -> Option<Tier> {
        [Tier::T1, Tier::T2, Tier::T3, Tier::T4]
            .into_iter()
            .find(|t| t.as_str() == name)
    }

    /// The tier of the `n`-th genuine attempt (0-based) for an item that starts at `self`.
    ///
    /// Starting at t1 the attempts run t1, t1, t2, t3, then t4 forever; at t2:
    /// t2, t2, t3, t4, t4…; at t3: t3, t4, t4…; at t4: t4 always.
    pub fn for_attempt(self, n: usize) -> Tier {
        let schedule: &[Tier] = match self {
            Tier::T1 => &[Tier::T1, Tier::T1, Tier::T2, Tier::T3],
            Tier::T2 => &[Tier::T2, Tier::T2, Tier::T3],
            Tier::T3 => &[Tier::T3],
            Tier::T4 => &[],
        };
        schedule.get(n).copied().unwrap_or(Tier::T4)
    }
}

/// Why an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The attempt did what it was asked.
    Succeeded,
    /// The building gate failed (tests still failing after the cycle).
    FailedGate,
    /// Inspection rejected the candidate.
    RejectedInspection,
    /// Tests failed within a cycle (escalates after its budget).
    TestFailure,
    /// A network error.
    Network,
    /// A git conflict while integrating.
    GitConflict,
    /// A provider rate limit.
    RateLimit,
    /// The sandbox exceeded its deadline.
    Timeout,
    /// The executor failed (image pull, scheduling, crash of the harness).
    ExecutorError,
}

impl Outcome {
    /// Genuine failures move the tier up; transient ones never do.
    pub fn is_genuine_failure(self) -> bool {
        matches!(
            self,
            Outcome::FailedGate | Outcome::RejectedInspection | Outcome::TestFailure
        )
    }

    /// The retry policy of this class, `None` for success.
    pub fn retry_policy(self) -> Option<RetryPolicy> {
        use Backoff::*;
        let (budget, backoff) = match self {
            Outcome::Succeeded => return None,
            Outcome::Network | Outcome::Timeout | Outcome::ExecutorError => (
                3,
                Exponential {
                    base: Duration::from_secs(1),
                    cap: Duration::from_secs(60),
                },
            ),
            Outcome::GitConflict => (2, Fixed(Duration::ZERO)),
            Outcome::TestFailure | Outcome::FailedGate | Outcome::RejectedInspection => {
                (3, Fixed(Duration::ZERO))
            }
            Outcome::RateLimit => (5, Fixed(Duration::from_secs(60))),
        };
        Some(RetryPolicy { budget, backoff })
    }
}

/// How long to wait before a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backoff {
    /// Always the same delay.
    Fixed(Duration),
    /// `base * 2^(retry-1)`, capped.
    Exponential {
        /// First delay.
        base: Duration,
        /// Ceiling.
        cap: Duration,
    },
}

/// Retries allowed for one error class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How many retries the class gets.
    pub budget: u32,
    /// Delay between them.
    pub backoff: Backoff,
}

impl RetryPolicy {
    /// The delay before retry number `retry` (1-based), `None` past the budget.
    pub fn delay(&self, retry: u32) -> Option<Duration> {
        if retry == 0 || retry > self.budget {
            return None;
        }
        Some(match self.backoff {
            Backoff::Fixed(d) => d,
            Backoff::Exponential { base, cap } => {
                let factor = 1u32.checked_shl(retry - 1).unwrap_or(u32::MAX);
                base.checked_mul(factor).unwrap_or(cap).min(cap)
            }
        })
    }
}

/// One persisted attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The tier it ran at.
    pub tier: Tier,
    /// How it ended.
    pub outcome: Outcome,
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Run again at this tier after this delay.
    Retry {
        /// Tier of the next attempt.
        tier: Tier,
        /// Delay before it.
        after: Duration,
    },
    /// The class exhausted its budget: stop and surface it (block or fail).
    GiveUp {
        /// The class that ran out.
        outcome: Outcome,
    },
    /// Nothing left to do.
    Done,
}

/// The escalation state of a work item, rebuilt from its persisted history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Escalation {
    /// The WorkerClass's cheapest tier.
    pub start: Tier,
    /// Every attempt so far, oldest first.
    pub history: Vec<Attempt>,
}

impl Escalation {
    /// A fresh item starting at `start`.
    pub fn new(start: Tier) -> Escalation {
        Escalation {
            start,
            history: Vec::new(),
        }
    }

    /// The tier the next attempt runs at: the start tier advanced by the number
    /// of genuine failures so far.
    pub fn current_tier(&self) -> Tier {
        let genuine = self
            .history
            .iter()
            .filter(|a| a.outcome.is_genuine_failure())
            .count();
        self.start.for_attempt(genuine)
    }

    /// Records an attempt and says what comes next.
    pub fn record(&mut self, outcome: Outcome) -> Next {
        let tier = self.current_tier();
        self.history.push(Attempt { tier, outcome });
        let Some(policy) = outcome.retry_policy() else {
            return Next::Done;
        };
        // Retries of this class since the last attempt of a different class.
        let streak = self
            .history
            .iter()
            .rev()
            .take_while(|a| a.outcome == outcome)
            .count() as u32;
        match policy.delay(streak) {
            Some(after) => Next::Retry {
                tier: self.current_tier(),
                after,
            },
            None => Next::GiveUp { outcome },
        }
    }
}

/// The model one tier runs: a provider (the harness's API family or the
/// gateway's name, e.g. `anthropic`, `openai`) and its model id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelChoice {
    /// The provider.
    pub provider: String,
    /// The model id the provider knows.
    pub model: String,
}

/// A WorkerClass's tiers mapped to models (`{"t1": {"provider", "model"}, …}`
/// in its `tiers` key). Not every tier needs a model: a tier without one runs
/// the model of the nearest configured tier below it, so escalating past the
/// most capable configured tier keeps that model.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(
    try_from = "std::collections::BTreeMap<Tier, ModelChoice>",
    into = "std::collections::BTreeMap<Tier, ModelChoice>"
)]
pub struct TierModels(pub std::collections::BTreeMap<Tier, ModelChoice>);

impl TryFrom<std::collections::BTreeMap<Tier, ModelChoice>> for TierModels {
    type Error = TierModelsError;

    /// Every configured tier names a provider and a model.
    fn try_from(
        models: std::collections::BTreeMap<Tier, ModelChoice>,
    ) -> Result<TierModels, TierModelsError> {
        for (tier, choice) in &models {
            for (field, v) in [("provider", &choice.provider), ("model", &choice.model)] {
                if v.trim().is_empty() {
                    return Err(TierModelsError::Empty { tier: *tier, field });
                }
            }
        }
        Ok(TierModels(models))
    }
}

impl From<TierModels> for std::collections::BTreeMap<Tier, ModelChoice> {
    fn from(models: TierModels) -> Self {
        models.0
    }
}

/// Why a `tiers` map was refused.
#[derive(Debug, thiserror::Error)]
pub enum TierModelsError {
    /// Not a map of tiers to models.
    #[error(
        "the worker class's tiers are not a map of t1…t4 to {{\"provider\", \"model\"}}: {source}"
    )]
    Parse {
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A provider or model is empty.
    #[error(
        "tier {} of the worker class names an empty {field}; give every tier a provider and a model", tier.as_str()
    )]
    Empty {
        /// The tier.
        tier: Tier,
        /// `provider` or `model`.
        field: &'static str,
    },
}

impl TierModels {
    /// Reads and checks a WorkerClass's `tiers` value.
    pub fn from_value(value: serde_json::Value) -> Result<TierModels, TierModelsError> {
        let models: std::collections::BTreeMap<Tier, ModelChoice> =
            serde_json::from_value(value).map_err(|source| TierModelsError::Parse { source })?;
        TierModels::try_from(models)
    }

    /// Whether no tier has a model (the class's harness chooses its own).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The cheapest tier with a model (where escalation starts), `None` when
    /// no tier has one.
    pub fn start_tier(&self) -> Option<Tier> {
        self.0.keys().next().copied()
    }

    /// The model `tier` runs: its own, else the nearest configured tier's
    /// below it, else the cheapest configured one.
    pub fn model_for(&self, tier: Tier) -> Option<&ModelChoice> {
        self.0
            .range(..=tier)
            .next_back()
            .or_else(|| self.0.iter().next())
            .map(|(_, m)| m)
    }
}

/// Attempt label: the model answered 429 (persisted; retried on the same tier).
pub const MODEL_RATE_LIMIT: &str = "model-rate-limit";
/// Attempt label: the model request timed out (or 408).
pub const MODEL_TIMEOUT: &str = "model-timeout";
/// Attempt label: the model was unreachable or answered 5xx.
pub const MODEL_NETWORK: &str = "model-network";

/// The escalation class of a persisted transient model attempt label (`None` for others).
pub fn outcome_of_label(label: &str) -> Option<Outcome> {
    match label {
        MODEL_RATE_LIMIT => Some(Outcome::RateLimit),
        MODEL_TIMEOUT => Some(Outcome::Timeout),
        MODEL_NETWORK => Some(Outcome::Network),
        _ => None,
    }
}

/// How a model request of a run failed, as the harness or the proxy's audit
/// reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelFailure {
    /// No answer in time.
    Timeout,
    /// The connection failed or was reset.
    Connection,
    /// The model API answered with this HTTP status.
    Status(u16),
}

/// The file a Worker harness writes into `/out` when it stopped because its model request
/// failed (docs/worker-harnesses.md): `{"status": 429}` for an HTTP answer, or
/// `{"error": "timeout"}` / `{"error": "connection"}` when no answer came. The Job Site reads
/// it only from a Worker that did not exit 0.
pub const MODEL_FAILURE_FILE: &str = "model-failure.json";

/// Longest model-failure report the Job Site reads (it comes from the sandbox).
pub const MAX_MODEL_FAILURE_BYTES: u64 = 4096;

/// Why a harness's model-failure report was not taken (the Worker's failure then counts as
/// an ordinary harness failure).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ModelFailureReportError {
    /// Longer than [`MAX_MODEL_FAILURE_BYTES`].
    #[error(
        "the model-failure report has {bytes} bytes, more than the {MAX_MODEL_FAILURE_BYTES} read"
    )]
    TooLarge {
        /// Its size.
        bytes: u64,
    },
    /// Not a JSON object of one of the two documented shapes.
    #[error(
        "the model-failure report is not {{\"status\": <100-599>}} or {{\"error\": \"timeout\"|\"connection\"}}: {reason}"
    )]
    Shape {
        /// What is wrong.
        reason: String,
    },
}

impl std::fmt::Display for ModelFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelFailure::Timeout => f.write_str("timed out"),
            ModelFailure::Connection => f.write_str("could not connect"),
            ModelFailure::Status(s) => write!(f, "was answered with HTTP {s}"),
        }
    }
}

impl ModelFailure {
    /// Reads a harness's model-failure report ([`MODEL_FAILURE_FILE`]); hostile input is an
    /// error, never a panic.
    pub fn from_report(bytes: &[u8]) -> Result<ModelFailure, ModelFailureReportError> {
        let len = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
        if len > MAX_MODEL_FAILURE_BYTES {
            return Err(ModelFailureReportError::TooLarge { bytes: len });
        }
        let shape = |reason: &str| ModelFailureReportError::Shape {
            reason: reason.to_owned(),
        };
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| shape(&e.to_string()))?;
        let object = value.as_object().ok_or_else(|| shape("not an object"))?;
        match (object.get("status"), object.get("error"), object.len()) {
            (Some(status), None, 1) => status
                .as_u64()
                .and_then(|s| u16::try_from(s).ok())
                .filter(|s| (100..600).contains(s))
                .map(ModelFailure::Status)
                .ok_or_else(|| shape("status is not an HTTP status (100-599)")),
            (None, Some(error), 1) => match error.as_str() {
                Some("timeout") => Ok(ModelFailure::Timeout),
                Some("connection") => Ok(ModelFailure::Connection),
                _ => Err(shape("error is neither \"timeout\" nor \"connection\"")),
            },
            _ => Err(shape("it must hold exactly one of status and error")),
        }
    }

    /// The label an attempt that ended on this failure is persisted under (`None` when it
    /// is not transient); [`outcome_of_label`] reads it back.
    pub fn attempt_label(self) -> Option<&'static str> {
        self.outcome().map(|o| match o {
            Outcome::RateLimit => MODEL_RATE_LIMIT,
            Outcome::Timeout => MODEL_TIMEOUT,
            _ => MODEL_NETWORK,
        })
    }

    /// The attempt outcome it means: timeouts and 408 are [`Outcome::Timeout`],
    /// 429 is [`Outcome::RateLimit`], 5xx and connection failures are
    /// [`Outcome::Network`]; all transient, retried on the same tier with
    /// backoff. Any other status (400, 401, 403, 404…) is `None`: not
    /// transient and not the agent's failure either (a wrong model id or
    /// credential), so it stops the build with its reason instead of
    /// escalating.
    pub fn outcome(self) -> Option<Outcome> {
        match self {
            ModelFailure::Timeout | ModelFailure::Status(408) => Some(Outcome::Timeout),
            ModelFailure::Status(429) => Some(Outcome::RateLimit),
            ModelFailure::Connection => Some(Outcome::Network),
            ModelFailure::Status(s) if (500..600).contains(&s) => Some(Outcome::Network),
            ModelFailure::Status(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(start: Tier, n: usize) -> Vec<Tier> {
        (0..n).map(|i| start.for_attempt(i)).collect()
    }

    #[test]
    fn default_schedules_follow_the_architecture() {
        use Tier::*;
        assert_eq!(schedule(T1, 6), [T1, T1, T2, T3, T4, T4]);
        assert_eq!(schedule(T2, 5), [T2, T2, T3, T4, T4]);
        assert_eq!(schedule(T3, 3), [T3, T4, T4]);
        assert_eq!(schedule(T4, 3), [T4, T4, T4]);
    }

    #[test]
    fn transient_failures_never_escalate() {
        let mut e = Escalation::new(Tier::T1);
        for outcome in [
            Outcome::Timeout,
            Outcome::ExecutorError,
            Outcome::RateLimit,
            Outcome::Network,
        ] {
            e.record(outcome);
        }
        assert_eq!(e.current_tier(), Tier::T1);
        e.record(Outcome::FailedGate);
        e.record(Outcome::RejectedInspection);
        assert_eq!(
            e.current_tier(),
            Tier::T2,
            "two genuine failures from t1 reach t2"
        );
    }

    #[test]
    fn a_restart_resumes_at_the_persisted_tier() {
        let mut e = Escalation::new(Tier::T2);
        for _ in 0..3 {
            e.record(Outcome::FailedGate);
        }
        let persisted = serde_json::to_string(&e).unwrap();
        let resumed: Escalation = serde_json::from_str(&persisted).unwrap();
        assert_eq!(resumed.current_tier(), Tier::T4);
        assert_eq!(resumed, e);
    }

    #[test]
    fn budgets_and_backoff_per_class() {
        let net = Outcome::Network.retry_policy().unwrap();
        let delays: Vec<_> = (1..=4).map(|r| net.delay(r)).collect();
        assert_eq!(
            delays,
            [
                Some(Duration::from_secs(1)),
                Some(Duration::from_secs(2)),
                Some(Duration::from_secs(4)),
                None
            ]
        );
        let capped = RetryPolicy {
            budget: 10,
            backoff: Backoff::Exponential {
                base: Duration::from_secs(1),
                cap: Duration::from_secs(60),
            },
        };
        assert_eq!(capped.delay(10), Some(Duration::from_secs(60)));
        assert_eq!(Outcome::GitConflict.retry_policy().unwrap().budget, 2);
        assert_eq!(Outcome::TestFailure.retry_policy().unwrap().budget, 3);
        let rl = Outcome::RateLimit.retry_policy().unwrap();
        assert_eq!((rl.budget, rl.delay(5)), (5, Some(Duration::from_secs(60))));
    }

    #[test]
    fn a_class_gives_up_after_its_budget() {
        let mut e = Escalation::new(Tier::T1);
        assert!(matches!(e.record(Outcome::GitConflict), Next::Retry { .. }));
        assert!(matches!(e.record(Outcome::GitConflict), Next::Retry { .. }));
        assert_eq!(
            e.record(Outcome::GitConflict),
            Next::GiveUp {
                outcome: Outcome::GitConflict
            }
        );
        assert_eq!(e.record(Outcome::Succeeded), Next::Done);
        assert!(
            matches!(e.record(Outcome::GitConflict), Next::Retry { .. }),
            "a new streak has a fresh budget"
        );
    }

    #[test]
    fn test_failures_escalate_while_retrying() {
        let mut e = Escalation::new(Tier::T1);
        assert_eq!(
            e.record(Outcome::TestFailure),
            Next::Retry {
                tier: Tier::T1,
                after: Duration::ZERO
            }
        );
        assert_eq!(
            e.record(Outcome::TestFailure),
            Next::Retry {
                tier: Tier::T2,
                after: Duration::ZERO
            }
        );
        assert_eq!(
            e.record(Outcome::TestFailure),
            Next::Retry {
                tier: Tier::T3,
                after: Duration::ZERO
            }
        );
        assert_eq!(
            e.record(Outcome::TestFailure),
            Next::GiveUp {
                outcome: Outcome::TestFailure
            }
        );
    }

    fn models() -> TierModels {
        TierModels::from_value(serde_json::json!({
            "t1": {"provider": "anthropic", "model": "claude-haiku"},
            "t3": {"provider": "anthropic", "model": "claude-opus"},
        }))
        .unwrap()
    }

    #[test]
    fn tiers_map_to_models_and_unconfigured_tiers_take_the_nearest_below() {
        let m = models();
        assert_eq!(m.start_tier(), Some(Tier::T1));
        let model = |t| m.model_for(t).map(|c| c.model.as_str());
        assert_eq!(model(Tier::T1), Some("claude-haiku"));
        assert_eq!(model(Tier::T2), Some("claude-haiku"));
        assert_eq!(model(Tier::T3), Some("claude-opus"));
        assert_eq!(model(Tier::T4), Some("claude-opus"));
        let from_t2 = TierModels::from_value(
            serde_json::json!({"t2": {"provider": "openai", "model": "gpt-4.1"}}),
        )
        .unwrap();
        assert_eq!(from_t2.start_tier(), Some(Tier::T2));
        assert_eq!(
            from_t2.model_for(Tier::T1).map(|c| c.model.as_str()),
            Some("gpt-4.1")
        );
        assert_eq!(TierModels::default().model_for(Tier::T1), None);
    }

    #[test]
    fn a_worker_class_reads_and_checks_its_tiers() {
        use crate::engine::WorkerClass;
        let class: WorkerClass = serde_json::from_value(serde_json::json!({
            "command": ["harness"], "image": null,
            "tiers": {"t2": {"provider": "openai", "model": "m2"}},
        }))
        .unwrap();
        assert_eq!(
            class.tiers.model_for(Tier::T4).map(|m| m.model.as_str()),
            Some("m2")
        );
        let err = serde_json::from_value::<WorkerClass>(serde_json::json!({
            "command": ["harness"],
            "tiers": {"t1": {"provider": "openai", "model": " "}},
        }))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("tier t1") && err.contains("empty model"),
            "{err}"
        );
        let plain: WorkerClass =
            serde_json::from_value(serde_json::json!({"command": ["harness"]})).unwrap();
        assert!(plain.tiers.is_empty());
        assert!(
            serde_json::to_value(&plain).unwrap().get("tiers").is_none(),
            "a class without tiers is written as before"
        );
    }

    #[test]
    fn bad_tier_maps_are_refused_with_the_field() {
        let err =
            TierModels::from_value(serde_json::json!({"t9": {"provider": "a", "model": "b"}}))
                .unwrap_err();
        assert!(err.to_string().contains("t1…t4"), "{err}");
        let err = TierModels::from_value(
            serde_json::json!({"t1": {"provider": "a", "model": "b", "key": "sk"}}),
        )
        .unwrap_err();
        assert!(matches!(err, TierModelsError::Parse { .. }), "{err}");
        let err =
            TierModels::from_value(serde_json::json!({"t2": {"provider": "a", "model": " "}}))
                .unwrap_err();
        assert!(
            err.to_string().contains("t2") && err.to_string().contains("empty model"),
            "{err}"
        );
    }

    #[test]
    fn a_genuine_failure_moves_up_to_the_next_tiers_model_and_survives_a_restart() {
        let m = models();
        let mut e = Escalation::new(m.start_tier().unwrap());
        // Starting at t1 the schedule is t1, t1, t2, t3: the third genuine
        // failure reaches t3, Opus.
        for expected in ["claude-haiku", "claude-haiku", "claude-opus"] {
            let Next::Retry { tier, after } = e.record(Outcome::FailedGate) else {
                panic!("a failed gate is retried within its budget");
            };
            assert_eq!(after, Duration::ZERO);
            assert_eq!(m.model_for(tier).unwrap().model, expected, "{tier:?}");
        }
        let persisted = serde_json::to_string(&e).unwrap();
        let resumed: Escalation = serde_json::from_str(&persisted).unwrap();
        assert_eq!(resumed.current_tier(), Tier::T3);
        assert_eq!(
            m.model_for(resumed.current_tier()).unwrap().model,
            "claude-opus"
        );
    }

    #[test]
    fn a_transient_model_failure_retries_the_same_tiers_model_with_backoff() {
        use ModelFailure::*;
        assert_eq!(Timeout.outcome(), Some(Outcome::Timeout));
        assert_eq!(Status(408).outcome(), Some(Outcome::Timeout));
        assert_eq!(Status(429).outcome(), Some(Outcome::RateLimit));
        assert_eq!(Status(500).outcome(), Some(Outcome::Network));
        assert_eq!(Status(503).outcome(), Some(Outcome::Network));
        assert_eq!(Connection.outcome(), Some(Outcome::Network));
        for not_transient in [400, 401, 403, 404, 200, 600] {
            assert_eq!(Status(not_transient).outcome(), None, "{not_transient}");
        }
        let m = models();
        let mut e = Escalation::new(Tier::T1);
        e.record(Outcome::FailedGate);
        e.record(Outcome::FailedGate);
        assert_eq!(e.current_tier(), Tier::T2);
        // 503, 503, timeout: every retry stays on t2 (Haiku); the 5xx streak
        // backs off exponentially.
        let mut delays = Vec::new();
        for failure in [Status(503), Status(503)] {
            let Next::Retry { tier, after } = e.record(failure.outcome().unwrap()) else {
                panic!("a transient failure is retried");
            };
            assert_eq!(tier, Tier::T2);
            assert_eq!(m.model_for(tier).unwrap().model, "claude-haiku");
            delays.push(after);
        }
        assert_eq!(delays, [Duration::from_secs(1), Duration::from_secs(2)]);
        let Next::Retry { tier, after } = e.record(Status(429).outcome().unwrap()) else {
            panic!("a rate limit is retried");
        };
        assert_eq!((tier, after), (Tier::T2, Duration::from_secs(60)));
        assert_eq!(
            e.current_tier(),
            Tier::T2,
            "transient failures never escalate"
        );
    }

    #[test]
    fn a_model_failure_report_is_read_in_its_two_shapes_and_refused_otherwise() {
        let read = |t: &str| ModelFailure::from_report(t.as_bytes());
        assert_eq!(read(r#"{"status": 429}"#), Ok(ModelFailure::Status(429)));
        assert_eq!(read(r#"{"status":503}"#), Ok(ModelFailure::Status(503)));
        assert_eq!(read(r#"{"error": "timeout"}"#), Ok(ModelFailure::Timeout));
        assert_eq!(
            read(r#"{"error": "connection"}"#),
            Ok(ModelFailure::Connection)
        );
        for bad in [
            "",
            "429",
            "[]",
            "{}",
            r#"{"status": 99}"#,
            r#"{"status": 600}"#,
            r#"{"status": 70000}"#,
            r#"{"status": -1}"#,
            r#"{"status": "429"}"#,
            r#"{"status": 429, "error": "timeout"}"#,
            r#"{"status": 429, "extra": 1}"#,
            r#"{"error": "dns"}"#,
            "\u{0}\u{ff}",
        ] {
            assert!(
                matches!(read(bad), Err(ModelFailureReportError::Shape { .. })),
                "{bad:?} was taken: {:?}",
                read(bad)
            );
        }
        let huge = format!(r#"{{"status": 429, "pad": "{}"}}"#, "x".repeat(5000));
        assert!(matches!(
            read(&huge),
            Err(ModelFailureReportError::TooLarge { .. })
        ));
    }

    #[test]
    fn transient_model_failures_persist_under_labels_that_read_back_as_their_class() {
        for (failure, label, outcome) in [
            (
                ModelFailure::Status(429),
                MODEL_RATE_LIMIT,
                Outcome::RateLimit,
            ),
            (ModelFailure::Timeout, MODEL_TIMEOUT, Outcome::Timeout),
            (ModelFailure::Status(408), MODEL_TIMEOUT, Outcome::Timeout),
            (ModelFailure::Connection, MODEL_NETWORK, Outcome::Network),
            (ModelFailure::Status(502), MODEL_NETWORK, Outcome::Network),
        ] {
            assert_eq!(failure.attempt_label(), Some(label), "{failure:?}");
            assert_eq!(outcome_of_label(label), Some(outcome));
            assert!(!outcome.is_genuine_failure());
        }
        assert_eq!(ModelFailure::Status(401).attempt_label(), None);
        assert_eq!(outcome_of_label("passed"), None);
        // The budget of a class is counted from the persisted history: five 429s in a row
        // are retried, the sixth gives up.
        let mut e = Escalation::new(Tier::T2);
        for _ in 0..5 {
            assert!(matches!(
                e.record(Outcome::RateLimit),
                Next::Retry { tier: Tier::T2, .. }
            ));
        }
        assert_eq!(
            e.record(Outcome::RateLimit),
            Next::GiveUp {
                outcome: Outcome::RateLimit
            }
        );
    }
}
