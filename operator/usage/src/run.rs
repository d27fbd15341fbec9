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

impl RunUsage {
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
