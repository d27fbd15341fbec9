//! A work item's usage ledger: what each of its sandboxed runs spent on model calls, as the
//! Job Site read it back from the egress proxy after the run, and the bounded summary
//! (totals, per stage, per tier) that its status and `protobot status` show.
//!
//! Pure. Idempotent by run id: reading a run again replaces its entry with the field-wise
//! maximum of the two readings, never adds them — a proxy's record of a run only grows
//! while the proxy lives, so the larger reading is the later one, and a proxy that restarted
//! between two readings (and forgot the first part) cannot shrink what was already counted.
//! Bounded: the newest [`UsageLedger::RUNS_KEPT`] runs are kept by id; older ones are folded
//! into per-stage-and-tier buckets (there are at most stages × tiers of them), so the
//! summary stays exact while the ledger stays small. A run read again after it was folded
//! would count twice; the Job Site reads each run once when it ends (and again only when a
//! crash made it rerun the same run id, within the same cycle), far inside that window.

use std::{collections::BTreeMap, fmt};

use serde::{Deserialize, Serialize};

use crate::{
    price::{Microdollars, PriceTable},
    run::RunUsage,
    tokens::TokenCounts,
};

/// The build stage a sandboxed run belongs to: the `stage` of its egress session and the
/// key of the per-stage summary.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage {
    /// Worker A writing tests in a build cycle.
    WorkerA,
    /// Worker B writing the implementation in a build cycle.
    WorkerB,
    /// The integration runner building and testing a candidate.
    Integration,
    /// An Inspector or a mutation campaign on the sealed candidate.
    Inspection,
}

impl Stage {
    /// Every stage, in the order a build reaches them.
    pub const ALL: [Stage; 4] = [
        Stage::WorkerA,
        Stage::WorkerB,
        Stage::Integration,
        Stage::Inspection,
    ];

    /// Its name (`worker-a`, `worker-b`, `integration`, `inspection`).
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::WorkerA => "worker-a",
            Stage::WorkerB => "worker-b",
            Stage::Integration => "integration",
            Stage::Inspection => "inspection",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What some model calls spent: calls, tokens and the cost of the priced ones.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Spend {
    /// Calls whose answer reported usage.
    pub calls: u64,
    /// Calls whose answer reported no usage: their tokens are unknown, never guessed.
    pub calls_without_usage: u64,
    /// The reported tokens.
    pub tokens: TokenCounts,
    /// Cost of the calls whose model has a price, in micro-dollars.
    pub cost_microdollars: u64,
    /// Calls with tokens whose model has no price: while any exist, the cost is unknown
    /// (`cost_microdollars` is then only what the priced calls cost).
    pub unpriced_calls: u64,
}

impl Spend {
    /// What `run` spent, priced with `prices` (a worker class's table) where it names the
    /// model, else with the proxy's own price (its proxy-wide default table), else unpriced.
    pub fn of_run(run: &RunUsage, prices: &PriceTable) -> Spend {
        let mut spend = Spend::default();
        for (model, usage) in &run.models {
            spend.calls = spend.calls.saturating_add(usage.calls);
            spend.calls_without_usage = spend
                .calls_without_usage
                .saturating_add(usage.calls_without_usage);
            spend.tokens.add(&usage.tokens);
            if usage.calls == 0 {
                continue;
            }
            let cost = prices
                .cost(model, &usage.tokens)
                .or(usage.cost_microdollars.map(Microdollars));
            match cost {
                Some(c) => spend.cost_microdollars = spend.cost_microdollars.saturating_add(c.0),
                None => spend.unpriced_calls = spend.unpriced_calls.saturating_add(usage.calls),
            }
        }
        spend
    }

    /// The cost, or `None` while some call's model has no price.
    pub fn cost(&self) -> Option<Microdollars> {
        (self.unpriced_calls == 0).then_some(Microdollars(self.cost_microdollars))
    }

    /// Adds `other` (saturating).
    pub fn add(&mut self, other: &Spend) {
        self.calls = self.calls.saturating_add(other.calls);
        self.calls_without_usage = self
            .calls_without_usage
            .saturating_add(other.calls_without_usage);
        self.tokens.add(&other.tokens);
        self.cost_microdollars = self
            .cost_microdollars
            .saturating_add(other.cost_microdollars);
        self.unpriced_calls = self.unpriced_calls.saturating_add(other.unpriced_calls);
    }

    /// The field-wise maximum of two readings of one run.
    pub fn max(&self, other: &Spend) -> Spend {
        let t = (&self.tokens, &other.tokens);
        Spend {
            calls: self.calls.max(other.calls),
            calls_without_usage: self.calls_without_usage.max(other.calls_without_usage),
            tokens: TokenCounts {
                input: t.0.input.max(t.1.input),
                output: t.0.output.max(t.1.output),
                cache_read: t.0.cache_read.max(t.1.cache_read),
                cache_write: t.0.cache_write.max(t.1.cache_write),
                reasoning: t.0.reasoning.max(t.1.reasoning),
            },
            cost_microdollars: self.cost_microdollars.max(other.cost_microdollars),
            unpriced_calls: self.unpriced_calls.max(other.unpriced_calls),
        }
    }

    /// Whether nothing was spent (no call at all).
    pub fn is_empty(&self) -> bool {
        self.calls == 0 && self.calls_without_usage == 0
    }
}

impl fmt::Display for Spend {
    /// `1,200 in + 300 out (400 cached) tokens, 3 calls, $0.003600` — or `cost unknown`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.tokens;
        write!(
            f,
            "{} calls, {} tokens in, {} out, {} cache read, {} cache write",
            self.calls, t.input, t.output, t.cache_read, t.cache_write
        )?;
        if self.calls_without_usage > 0 {
            write!(f, ", {} calls without usage", self.calls_without_usage)?;
        }
        match self.cost() {
            Some(cost) => write!(f, ", {cost}"),
            None => write!(
                f,
                ", cost unknown ({} calls unpriced; the priced ones {})",
                self.unpriced_calls,
                Microdollars(self.cost_microdollars)
            ),
        }
    }
}

/// One run's entry in the ledger.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSpend {
    /// The run id (the egress session's trace id): the idempotency key.
    pub run_id: String,
    /// Its stage.
    pub stage: Stage,
    /// Its escalation tier (`t1`…`t4`; empty outside build cycles).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tier: String,
    /// What it spent.
    pub spend: Spend,
}

/// Runs folded out of the ledger, by stage and tier.
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FoldedSpend {
    /// The stage.
    pub stage: Stage,
    /// The tier (empty outside build cycles).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tier: String,
    /// How many runs were folded in.
    pub runs: u64,
    /// What they spent.
    pub spend: Spend,
}

/// A work item's usage ledger (kept in its record; written only by a fenced trusted
/// observation of the Job Site).
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UsageLedger {
    /// The newest runs, oldest first, one per run id (at most [`UsageLedger::RUNS_KEPT`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunSpend>,
    /// Older runs, summed by stage and tier.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub folded: Vec<FoldedSpend>,
}

/// The summary of a ledger: totals, per stage and per tier.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UsageSummary {
    /// Runs counted.
    pub runs: u64,
    /// Everything.
    pub total: Spend,
    /// By stage (only stages that spent).
    pub by_stage: BTreeMap<Stage, Spend>,
    /// By tier (only tiers that spent; runs outside build cycles have none).
    pub by_tier: BTreeMap<String, Spend>,
}

impl UsageLedger {
    /// Runs kept by id before the oldest is folded.
    pub const RUNS_KEPT: usize = 64;

    /// Whether no run was recorded.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty() && self.folded.is_empty()
    }

    /// Records a reading of one run: a run id seen before keeps the field-wise maximum of
    /// its readings (so re-reading never double-counts); a new one is appended, folding the
    /// oldest kept run when more than [`UsageLedger::RUNS_KEPT`] would be kept.
    pub fn record(&mut self, reading: RunSpend) {
        if let Some(kept) = self.runs.iter_mut().find(|r| r.run_id == reading.run_id) {
            kept.spend = kept.spend.max(&reading.spend);
            return;
        }
        self.runs.push(reading);
        while self.runs.len() > Self::RUNS_KEPT {
            let oldest = self.runs.remove(0);
            self.fold(oldest);
        }
    }

    fn fold(&mut self, run: RunSpend) {
        match self
            .folded
            .iter_mut()
            .find(|f| f.stage == run.stage && f.tier == run.tier)
        {
            Some(bucket) => {
                bucket.runs = bucket.runs.saturating_add(1);
                bucket.spend.add(&run.spend);
            }
            None => self.folded.push(FoldedSpend {
                stage: run.stage,
                tier: run.tier,
                runs: 1,
                spend: run.spend,
            }),
        }
    }

    /// The summary: every kept and folded run, in total, by stage and by tier.
    pub fn summary(&self) -> UsageSummary {
        let mut summary = UsageSummary::default();
        let kept = self.runs.iter().map(|r| (r.stage, &r.tier, 1, &r.spend));
        let folded = self
            .folded
            .iter()
            .map(|f| (f.stage, &f.tier, f.runs, &f.spend));
        for (stage, tier, runs, spend) in kept.chain(folded) {
            summary.runs = summary.runs.saturating_add(runs);
            summary.total.add(spend);
            summary.by_stage.entry(stage).or_default().add(spend);
            if !tier.is_empty() {
                summary.by_tier.entry(tier.clone()).or_default().add(spend);
            }
        }
        summary
    }
}

impl UsageSummary {
    /// One short line for an Event note: tokens and cost per stage, then the total
    /// (`worker-a 1500 tokens $0.003600; …; total 3000 tokens in 4 calls, cost unknown`).
    pub fn brief(&self) -> String {
        let cost = |s: &Spend| match s.cost() {
            Some(c) => c.to_string(),
            None => "cost unknown".to_owned(),
        };
        let mut parts: Vec<String> = self
            .by_stage
            .iter()
            .map(|(stage, s)| format!("{stage} {} tokens {}", s.tokens.total(), cost(s)))
            .collect();
        parts.push(format!(
            "total {} tokens in {} calls, {}",
            self.total.tokens.total(),
            self.total
                .calls
                .saturating_add(self.total.calls_without_usage),
            cost(&self.total)
        ));
        parts.join("; ")
    }
}

impl fmt::Display for UsageSummary {
    /// One line per stage that spent, then the total.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (stage, spend) in &self.by_stage {
            writeln!(f, "{stage}: {spend}")?;
        }
        write!(f, "total: {}", self.total)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::run::ModelUsage;

    fn spend(calls: u64, input: u64, cost: u64) -> Spend {
        Spend {
            calls,
            tokens: TokenCounts {
                input,
                ..TokenCounts::default()
            },
            cost_microdollars: cost,
            ..Spend::default()
        }
    }

    fn run(id: &str, stage: Stage, tier: &str, spend: Spend) -> RunSpend {
        RunSpend {
            run_id: id.into(),
            stage,
            tier: tier.into(),
            spend,
        }
    }

    #[test]
    fn reading_a_run_again_keeps_the_larger_reading_and_never_adds() {
        let mut ledger = UsageLedger::default();
        ledger.record(run("a", Stage::WorkerA, "t1", spend(2, 100, 10)));
        ledger.record(run("a", Stage::WorkerA, "t1", spend(2, 100, 10)));
        assert_eq!(ledger.summary().total, spend(2, 100, 10));
        // A later reading of the same meter has grown; a restarted proxy's has shrunk.
        ledger.record(run("a", Stage::WorkerA, "t1", spend(3, 150, 15)));
        ledger.record(run("a", Stage::WorkerA, "t1", spend(1, 20, 2)));
        let summary = ledger.summary();
        assert_eq!((summary.runs, summary.total), (1, spend(3, 150, 15)));
        ledger.record(run("b", Stage::WorkerB, "t2", spend(1, 1, 1)));
        let summary = ledger.summary();
        assert_eq!(summary.total, spend(4, 151, 16));
        assert_eq!(summary.by_stage[&Stage::WorkerA], spend(3, 150, 15));
        assert_eq!(summary.by_tier["t2"], spend(1, 1, 1));
    }

    #[test]
    fn the_brief_line_names_each_stage_and_the_total() {
        let mut ledger = UsageLedger::default();
        ledger.record(run("a", Stage::WorkerA, "t1", spend(2, 100, 10)));
        let mut unpriced = spend(1, 50, 0);
        unpriced.unpriced_calls = 1;
        ledger.record(run("b", Stage::WorkerB, "t1", unpriced));
        assert_eq!(
            ledger.summary().brief(),
            "worker-a 100 tokens $0.000010; worker-b 50 tokens cost unknown; total 150 tokens in 3 calls, cost unknown"
        );
    }

    #[test]
    fn old_runs_fold_into_buckets_and_the_summary_stays_exact() {
        let mut ledger = UsageLedger::default();
        let n = UsageLedger::RUNS_KEPT + 10;
        for i in 0..n {
            let stage = if i % 2 == 0 {
                Stage::WorkerA
            } else {
                Stage::Inspection
            };
            let tier = if i % 2 == 0 { "t1" } else { "" };
            ledger.record(run(&format!("r{i}"), stage, tier, spend(1, 10, 5)));
        }
        assert_eq!(ledger.runs.len(), UsageLedger::RUNS_KEPT);
        assert_eq!(ledger.folded.len(), 2);
        assert_eq!(ledger.runs[0].run_id, "r10");
        let summary = ledger.summary();
        assert_eq!(summary.runs, n as u64);
        assert_eq!(summary.total, spend(n as u64, 10 * n as u64, 5 * n as u64));
        assert_eq!(summary.by_tier.len(), 1, "inspection runs have no tier");
        assert_eq!(summary.by_tier["t1"].calls, (n as u64).div_ceil(2));
    }

    #[test]
    fn a_class_price_wins_the_proxy_price_is_the_fallback_and_unpriced_makes_cost_unknown() {
        let usage = |calls, input, cost| ModelUsage {
            calls,
            calls_without_usage: 1,
            tokens: TokenCounts {
                input,
                ..TokenCounts::default()
            },
            cost_microdollars: cost,
        };
        let reading = RunUsage {
            run_id: "r".into(),
            models: [
                ("class-priced".to_owned(), usage(1, 1_000_000, Some(7))),
                ("proxy-priced".to_owned(), usage(2, 10, Some(30))),
                ("no-answer-usage".to_owned(), usage(0, 0, None)),
            ]
            .into_iter()
            .collect(),
        };
        let class: PriceTable =
            serde_yaml_ng::from_str("class-priced: {input: \"2\", output: \"4\"}").unwrap();
        let s = Spend::of_run(&reading, &class);
        assert_eq!((s.calls, s.calls_without_usage), (3, 3));
        assert_eq!(s.cost(), Some(Microdollars(2_000_000 + 30)));
        let mut unpriced = reading.clone();
        unpriced
            .models
            .insert("nobody-prices".into(), usage(1, 5, None));
        let s = Spend::of_run(&unpriced, &class);
        assert_eq!((s.cost(), s.unpriced_calls), (None, 1));
        assert!(
            s.to_string().contains("cost unknown (1 calls unpriced"),
            "{s}"
        );
        assert!(Spend::of_run(&RunUsage::default(), &class).is_empty());
    }

    #[test]
    fn the_ledger_reads_back_what_it_wrote_and_an_empty_one_is_written_as_nothing() {
        let mut ledger = UsageLedger::default();
        assert_eq!(serde_json::to_string(&ledger).unwrap(), "{}");
        ledger.record(run("a", Stage::Integration, "", spend(1, 2, 3)));
        let text = serde_json::to_string(&ledger).unwrap();
        assert!(text.contains("\"stage\":\"integration\""), "{text}");
        let back: UsageLedger = serde_json::from_str(&text).unwrap();
        assert_eq!(back, ledger);
    }

    fn arb_spend() -> impl Strategy<Value = Spend> {
        (0u64..1000, 0u64..5, 0u64..1_000_000, 0u64..1000, 0u64..3).prop_map(
            |(calls, without, input, cost, unpriced)| Spend {
                calls,
                calls_without_usage: without,
                tokens: TokenCounts {
                    input,
                    output: input / 3,
                    ..TokenCounts::default()
                },
                cost_microdollars: cost,
                unpriced_calls: unpriced,
            },
        )
    }

    fn arb_stage() -> impl Strategy<Value = Stage> {
        prop::sample::select(Stage::ALL.to_vec())
    }

    proptest! {
        /// Any interleaving of re-readings gives the summary of one reading per run: the
        /// field-wise maximum of its readings.
        #[test]
        fn rereading_never_double_counts(
            runs in prop::collection::vec((arb_stage(), prop::sample::select(vec!["", "t1", "t4"]), arb_spend()), 1..20),
            rereads in prop::collection::vec((any::<prop::sample::Index>(), arb_spend()), 0..40),
        ) {
            let mut ledger = UsageLedger::default();
            let mut expected: Vec<RunSpend> = Vec::new();
            for (i, (stage, tier, s)) in runs.iter().enumerate() {
                let r = run(&format!("r{i}"), *stage, tier, *s);
                ledger.record(r.clone());
                expected.push(r);
            }
            for (index, s) in &rereads {
                let i = index.index(runs.len());
                let mut again = expected[i].clone();
                again.spend = *s;
                ledger.record(again);
                expected[i].spend = expected[i].spend.max(s);
            }
            let mut once = UsageLedger::default();
            for r in expected {
                once.record(r);
            }
            prop_assert_eq!(ledger.summary(), once.summary());
        }

        /// The ledger stays bounded, and totals equal the sum over stages and, for runs
        /// with a tier, over tiers.
        #[test]
        fn the_ledger_is_bounded_and_its_summary_adds_up(
            runs in prop::collection::vec((arb_stage(), prop::sample::select(vec!["", "t1", "t2", "t3", "t4"]), arb_spend()), 0..200),
        ) {
            let mut ledger = UsageLedger::default();
            let mut total = Spend::default();
            for (i, (stage, tier, s)) in runs.iter().enumerate() {
                ledger.record(run(&format!("r{i}"), *stage, tier, *s));
                total.add(s);
            }
            prop_assert!(ledger.runs.len() <= UsageLedger::RUNS_KEPT);
            prop_assert!(ledger.folded.len() <= Stage::ALL.len() * 5);
            let summary = ledger.summary();
            prop_assert_eq!(summary.runs, runs.len() as u64);
            prop_assert_eq!(summary.total, total);
            let mut by_stage = Spend::default();
            summary.by_stage.values().for_each(|s| by_stage.add(s));
            prop_assert_eq!(by_stage, total);
            let mut tiered = Spend::default();
            runs.iter().filter(|r| !r.1.is_empty()).for_each(|r| tiered.add(&r.2));
            let mut by_tier = Spend::default();
            summary.by_tier.values().for_each(|s| by_tier.add(s));
            prop_assert_eq!(by_tier, tiered);
        }
    }
}
