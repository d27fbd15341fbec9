//! Budgets (issue 34): how much an item may spend on model calls before its build stops and
//! asks a person. Pure: the Job Site checks an item's ledger ([`crate::UsageLedger`]) against
//! its budget at the effect boundary before each build cycle; a spent budget becomes a
//! `raise-spec-question` that names the budget, what each stage spent and the two ways on.
//!
//! What is checked is what the item's runs were metered to have spent, priced. A run cannot be
//! stopped halfway, so the last cycle before the stop may overshoot the budget by what one
//! cycle costs; nothing starts after the stop. Calls of a model without a price have unknown
//! cost: they are not counted against the budget, and the question says how many there were.

use std::{fmt, str::FromStr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{PerMillion, ledger::UsageSummary, price::Microdollars};

/// An amount of US dollars, written as a decimal with at most six fraction digits (`"5"`,
/// `"0.25"`), held exactly in micro-dollars.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dollars(pub Microdollars);

/// Why an amount is not an amount.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not an amount of dollars: write a decimal such as \"5\" or \"0.25\" (at most 6 decimals, no sign, no currency symbol, no exponent)"
)]
pub struct DollarsError {
    /// The text as written (its first 64 characters).
    pub text: String,
}

impl FromStr for Dollars {
    type Err = DollarsError;

    fn from_str(text: &str) -> Result<Dollars, DollarsError> {
        // The same exact decimal as a price (dollars held as micro-dollars).
        text.parse::<PerMillion>()
            .map(|p| Dollars(Microdollars(p.0)))
            .map_err(|_| DollarsError {
                text: text.chars().take(64).collect(),
            })
    }
}

impl fmt::Display for Dollars {
    /// As written in a configuration (`5`, `0.25`), without a currency symbol.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        PerMillion(self.0.0).fmt(f)
    }
}

impl Serialize for Dollars {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Dollars {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Dollars, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// One item's budget and where a person raises it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemBudget {
    /// The most an item may spend on priced model calls.
    pub limit: Dollars,
    /// Where the budget is set, for the question (`spec.budget.perItem of Project shop`,
    /// `--budget-per-item`).
    pub set_in: String,
}

/// A spent budget: the build stops with [`BudgetStop::question`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetStop {
    /// The budget.
    pub budget: ItemBudget,
    /// What the item spent, by stage.
    pub spent: UsageSummary,
}

impl ItemBudget {
    /// `Err` when the item's priced spending has reached the limit: no further run may
    /// start. Unpriced calls are not counted (their cost is unknown).
    pub fn check(&self, spent: &UsageSummary) -> Result<(), Box<BudgetStop>> {
        if spent.total.cost_microdollars >= self.limit.0.0 {
            return Err(Box::new(BudgetStop {
                budget: self.clone(),
                spent: spent.clone(),
            }));
        }
        Ok(())
    }
}

/// How every budget question begins ([`BudgetStop::question`]).
pub const QUESTION_PREFIX: &str = "the item's model budget of $";

/// Whether a block reason is a spent budget's question.
pub fn is_budget_question(question: &str) -> bool {
    question.starts_with(QUESTION_PREFIX)
}

impl BudgetStop {
    /// The spec question the build raises: the budget, the spend per stage, and the two ways
    /// on. `retry` is the command that moves the item on once resolved.
    pub fn question(&self, retry: &str) -> String {
        let stages: Vec<String> = self
            .spent
            .by_stage
            .iter()
            .map(|(stage, s)| format!("{stage} {}", Microdollars(s.cost_microdollars)))
            .collect();
        let unpriced = match self.spent.total.unpriced_calls {
            0 => String::new(),
            n => format!(" ({n} calls of unpriced models not counted)"),
        };
        format!(
            "{QUESTION_PREFIX}{} ({}) is spent: {} in {} calls ({}){unpriced}. Either raise the budget in {} and run `{retry}`, or simplify the requirement so that a cheaper build can pass, then run `{retry}`",
            self.budget.limit,
            self.budget.set_in,
            Microdollars(self.spent.total.cost_microdollars),
            self.spent
                .total
                .calls
                .saturating_add(self.spent.total.calls_without_usage),
            if stages.is_empty() {
                "no stage spent".to_owned()
            } else {
                stages.join(", ")
            },
            self.budget.set_in,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RunSpend, Spend, Stage, TokenCounts, UsageLedger};

    fn spent(runs: &[(Stage, u64, u64)]) -> UsageSummary {
        let mut ledger = UsageLedger::default();
        for (i, (stage, cost, unpriced)) in runs.iter().enumerate() {
            ledger.record(RunSpend {
                run_id: format!("run-{i}"),
                stage: *stage,
                tier: "t1".into(),
                spend: Spend {
                    calls: 2,
                    tokens: TokenCounts {
                        input: 100,
                        ..TokenCounts::default()
                    },
                    cost_microdollars: *cost,
                    unpriced_calls: *unpriced,
                    ..Spend::default()
                },
            });
        }
        ledger.summary()
    }

    fn budget(limit: &str) -> ItemBudget {
        ItemBudget {
            limit: limit.parse().expect("an amount"),
            set_in: "spec.budget.perItem of Project shop".into(),
        }
    }

    #[test]
    fn amounts_are_exact_decimal_dollars() {
        assert_eq!("5".parse::<Dollars>(), Ok(Dollars(Microdollars(5_000_000))));
        assert_eq!("0.000001".parse::<Dollars>(), Ok(Dollars(Microdollars(1))));
        assert_eq!(
            "0.25".parse::<Dollars>().map(|d| d.to_string()),
            Ok("0.25".into())
        );
        for bad in [
            "",
            "-1",
            "$5",
            "1e3",
            "0.1234567",
            "5.",
            ".5",
            "NaN",
            "18446744073710",
        ] {
            let error = bad.parse::<Dollars>().expect_err(bad);
            assert!(
                error.to_string().contains("not an amount of dollars"),
                "{error}"
            );
        }
        let parsed: Dollars = serde_json::from_str("\"1.5\"").expect("a quoted decimal");
        assert_eq!(parsed, Dollars(Microdollars(1_500_000)));
        assert_eq!(serde_json::to_string(&parsed).expect("json"), "\"1.5\"");
        assert!(
            serde_json::from_str::<Dollars>("1.5").is_err(),
            "a float is refused"
        );
    }

    #[test]
    fn a_budget_stops_once_the_priced_spend_reaches_it() {
        let b = budget("0.01");
        assert_eq!(b.check(&spent(&[])), Ok(()));
        assert_eq!(b.check(&spent(&[(Stage::WorkerA, 9_999, 0)])), Ok(()));
        let stop = b
            .check(&spent(&[
                (Stage::WorkerA, 6_000, 0),
                (Stage::WorkerB, 4_000, 0),
            ]))
            .expect_err("spent exactly the budget");
        let question = stop.question("protobot retry --work-item wi-1");
        assert!(is_budget_question(&question), "{question}");
        assert!(!is_budget_question("no passing candidate after 3 cycles"));
        for needle in [
            "budget of $0.01 (spec.budget.perItem of Project shop) is spent",
            "$0.010000 in 4 calls",
            "worker-a $0.006000, worker-b $0.004000",
            "raise the budget in spec.budget.perItem of Project shop and run `protobot retry --work-item wi-1`",
            "simplify the requirement",
        ] {
            assert!(question.contains(needle), "{needle:?} not in {question}");
        }
    }

    #[test]
    fn unpriced_calls_do_not_count_and_are_named() {
        let b = budget("0.001");
        let only_unpriced = spent(&[(Stage::WorkerB, 0, 2)]);
        assert_eq!(b.check(&only_unpriced), Ok(()));
        let stop = b
            .check(&spent(&[(Stage::WorkerB, 5_000, 1)]))
            .expect_err("spent");
        assert!(
            stop.question("r")
                .contains("(1 calls of unpriced models not counted)"),
            "{}",
            stop.question("r")
        );
        // A zero budget stops before the first run.
        assert!(budget("0").check(&spent(&[])).is_err());
    }
}
