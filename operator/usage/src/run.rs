//! What one run used, by model: the record the egress proxy's meter keeps per run and
//! serves as JSON on its admin port (`GET /usage/<run id>`), and the Job Site reads back
//! after the run. Pure data with the sums over its models.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{price::Microdollars, tokens::TokenCounts};

/// What one model used in one run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelUsage {
    /// Calls answered with usage.
    pub calls: u64,
    /// Calls whose answer carried no usage (their tokens are unknown).
    pub calls_without_usage: u64,
    /// The reported tokens.
    pub tokens: TokenCounts,
    /// Their cost in micro-dollars; `None` when the price table does not
    /// price this model (cost unknown, tokens still counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_microdollars: Option<u64>,
}

/// Everything one run used, by model (`unknown` when the answer named none).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunUsage {
    /// The run (the session's trace id).
    pub run_id: String,
    /// By model name.
    pub models: BTreeMap<String, ModelUsage>,
}

impl ModelUsage {
    /// Adds what `other` metered of the same model (another proxy replica's share of the
    /// run). A cost stays known only while every side that answered with usage priced it.
    pub fn absorb(&mut self, other: &ModelUsage) {
        self.cost_microdollars = match (self.calls, other.calls) {
            (_, 0) => self.cost_microdollars,
            (0, _) => other.cost_microdollars,
            _ => match (self.cost_microdollars, other.cost_microdollars) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                _ => None,
            },
        };
        self.calls = self.calls.saturating_add(other.calls);
        self.calls_without_usage = self
            .calls_without_usage
            .saturating_add(other.calls_without_usage);
        self.tokens.add(&other.tokens);
    }
}

impl RunUsage {
    /// Adds `other`'s models (the same run metered by another proxy replica).
    pub fn absorb(&mut self, other: &RunUsage) {
        for (model, usage) in &other.models {
            self.models.entry(model.clone()).or_default().absorb(usage);
        }
    }

    /// Tokens of every model.
    pub fn tokens(&self) -> TokenCounts {
        let mut total = TokenCounts::default();
        for usage in self.models.values() {
            total.add(&usage.tokens);
        }
        total
    }

    /// The cost of every model, or `None` when some model with reported
    /// tokens has no price (the total would understate it).
    pub fn cost(&self) -> Option<Microdollars> {
        self.models
            .values()
            .filter(|u| u.calls > 0)
            .try_fold(Microdollars::default(), |sum, u| {
                u.cost_microdollars
                    .map(|c| sum.saturating_add(Microdollars(c)))
            })
    }

    /// Calls whose answer carried no usage, over every model.
    pub fn calls_without_usage(&self) -> u64 {
        self.models.values().map(|u| u.calls_without_usage).sum()
    }
}

/// Model name used when an answer names none.
pub const UNKNOWN_MODEL: &str = "unknown";

#[cfg(test)]
mod tests {
    use super::*;

    fn model(calls: u64, without: u64, input: u64, cost: Option<u64>) -> ModelUsage {
        ModelUsage {
            calls,
            calls_without_usage: without,
            tokens: TokenCounts {
                input,
                ..TokenCounts::default()
            },
            cost_microdollars: cost,
        }
    }

    #[test]
    fn two_replicas_shares_of_a_run_add_up() {
        let mut a = RunUsage {
            run_id: "r".into(),
            models: BTreeMap::from([
                ("m".into(), model(2, 0, 100, Some(30))),
                ("only-a".into(), model(0, 1, 0, None)),
            ]),
        };
        let b = RunUsage {
            run_id: "r".into(),
            models: BTreeMap::from([
                ("m".into(), model(1, 1, 50, Some(15))),
                ("only-a".into(), model(1, 0, 7, Some(2))),
                ("unpriced".into(), model(1, 0, 9, None)),
            ]),
        };
        a.absorb(&b);
        assert_eq!(a.models["m"], model(3, 1, 150, Some(45)));
        // A side with no priced call takes the other's cost.
        assert_eq!(a.models["only-a"], model(1, 1, 7, Some(2)));
        assert_eq!(a.models["unpriced"], model(1, 0, 9, None));
        assert_eq!(a.tokens().input, 166);
        assert_eq!(a.calls_without_usage(), 2);
        // An unpriced model with calls leaves the run's cost unknown.
        assert_eq!(a.cost(), None);
    }

    #[test]
    fn a_priced_and_an_unpriced_share_of_one_model_make_its_cost_unknown() {
        let mut a = model(1, 0, 1, Some(5));
        a.absorb(&model(1, 0, 1, None));
        assert_eq!(a.cost_microdollars, None);
        let mut saturating = model(1, 0, u64::MAX, Some(u64::MAX));
        saturating.absorb(&model(1, 0, 1, Some(1)));
        assert_eq!(saturating.tokens.input, u64::MAX);
        assert_eq!(saturating.cost_microdollars, Some(u64::MAX));
    }
}
