//! The meter: what every model call through the proxy used, by run, and the
//! `protobot_model_*` metrics (issue 34).
//!
//! The broker hands the meter each successful answer to a model call
//! ([`crate::usage::ModelApi`]) with the caller's [`Session`]; the meter
//! reads the usage ([`crate::usage::read_usage`]), prices it
//! ([`crate::price::PriceTable`]) and adds it to the run's record, keyed by
//! the session's trace id (the run id). The Job Site reads a run's record
//! when the run ends ([`UsageMeter::run`], or `GET /usage/<run id>` on the
//! admin port of a proxy in its own pod).
//!
//! Bounded: at most [`UsageMeter::DEFAULT_RUNS`] runs are kept; the oldest
//! record is dropped first (a run's record is read within seconds of its
//! end). Metrics carry project, role and tier, never an item or run id.

use std::{
    collections::{BTreeMap, BTreeSet, VecDeque},
    sync::{Arc, Mutex},
};

use crate::{
    price::PriceTable,
    session::Session,
    usage::{Metered, ModelApi, read_usage},
};
use prometheus::{IntCounterVec, Opts, Registry};

pub use protobot_usage::run::{ModelUsage, RunUsage, UNKNOWN_MODEL};

/// The `protobot_model_*` families.
#[derive(Clone, Debug)]
pub struct UsageMetrics {
    /// `protobot_model_tokens_total{project,role,tier,kind}`.
    pub tokens: IntCounterVec,
    /// `protobot_model_cost_microdollars_total{project,role,tier}`.
    pub cost: IntCounterVec,
    /// `protobot_model_calls_total{project,role,tier,api,usage}` with
    /// `usage` = `reported` | `absent` | `unpriced`.
    pub calls: IntCounterVec,
}

impl UsageMetrics {
    /// Creates the families and registers them with `registry`.
    pub fn register(registry: &Registry) -> Result<UsageMetrics, prometheus::Error> {
        let tokens = IntCounterVec::new(
            Opts::new(
                "protobot_model_tokens_total",
                "Model tokens reported in answers through the egress proxy, by kind.",
            ),
            &["project", "role", "tier", "kind"],
        )?;
        let cost = IntCounterVec::new(
            Opts::new(
                "protobot_model_cost_microdollars_total",
                "Cost of priced model calls through the egress proxy, in micro-dollars.",
            ),
            &["project", "role", "tier"],
        )?;
        let calls = IntCounterVec::new(
            Opts::new(
                "protobot_model_calls_total",
                "Successful model calls through the egress proxy, by whether their answer reported usage and its model has a price.",
            ),
            &["project", "role", "tier", "api", "usage"],
        )?;
        registry.register(Box::new(tokens.clone()))?;
        registry.register(Box::new(cost.clone()))?;
        registry.register(Box::new(calls.clone()))?;
        Ok(UsageMetrics {
            tokens,
            cost,
            calls,
        })
    }
}

#[derive(Debug, Default)]
struct State {
    runs: BTreeMap<String, RunUsage>,
    order: VecDeque<String>,
    warned: BTreeSet<String>,
}

/// The meter (cheap to clone; one per proxy).
#[derive(Clone, Debug)]
pub struct UsageMeter {
    prices: Arc<PriceTable>,
    metrics: Option<UsageMetrics>,
    capacity: usize,
    state: Arc<Mutex<State>>,
}

impl UsageMeter {
    /// Runs kept by default.
    pub const DEFAULT_RUNS: usize = 4096;

    /// A meter pricing with `prices`, counting into `metrics` when given.
    pub fn new(prices: PriceTable, metrics: Option<UsageMetrics>) -> UsageMeter {
        UsageMeter::with_capacity(prices, metrics, UsageMeter::DEFAULT_RUNS)
    }

    /// A meter keeping at most `capacity` runs (at least one).
    pub fn with_capacity(
        prices: PriceTable,
        metrics: Option<UsageMetrics>,
        capacity: usize,
    ) -> UsageMeter {
        UsageMeter {
            prices: Arc::new(prices),
            metrics,
            capacity: capacity.max(1),
            state: Arc::new(Mutex::new(State::default())),
        }
    }

    /// Reads and records one successful answer of `api` to `session`;
    /// returns what it read. The bytes are only read.
    pub fn record_answer(
        &self,
        session: &Session,
        api: ModelApi,
        content_type: Option<&str>,
        body: &[u8],
    ) -> Metered {
        let metered = read_usage(api, content_type, body);
        self.record(session, api, &metered);
        metered
    }

    /// Records what one answer reported.
    pub fn record(&self, session: &Session, api: ModelApi, metered: &Metered) {
        let (model, tokens) = match metered {
            Metered::Reported { model, tokens } => (model.as_deref(), Some(*tokens)),
            Metered::Absent { model } => (model.as_deref(), None),
        };
        let model = model.unwrap_or(UNKNOWN_MODEL);
        let cost = tokens.and_then(|t| self.prices.cost(model, &t));
        let unpriced = tokens.is_some() && cost.is_none();
        {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if unpriced && state.warned.insert(model.to_owned()) {
                tracing::warn!(
                    target: "protobot::egress",
                    model,
                    "no price for this model: its tokens are counted, its cost is unknown; add it to the worker classes' prices"
                );
            }
            let run_id = session.trace_id.as_str();
            if !state.runs.contains_key(run_id) {
                while state.runs.len() >= self.capacity {
                    let Some(oldest) = state.order.pop_front() else {
                        break;
                    };
                    state.runs.remove(&oldest);
                }
                state.order.push_back(run_id.to_owned());
                state.runs.insert(
                    run_id.to_owned(),
                    RunUsage {
                        run_id: run_id.to_owned(),
                        models: BTreeMap::new(),
                    },
                );
            }
            if let Some(run) = state.runs.get_mut(run_id) {
                let entry = run.models.entry(model.to_owned()).or_default();
                match tokens {
                    Some(t) => {
                        entry.calls += 1;
                        entry.tokens.add(&t);
                        // The table is fixed for the meter's life: a model is
                        // priced on every call or on none.
                        entry.cost_microdollars =
                            cost.map(|c| entry.cost_microdollars.unwrap_or(0).saturating_add(c.0));
                    }
                    None => entry.calls_without_usage += 1,
                }
            }
        }
        if let Some(metrics) = &self.metrics {
            let label = |s: &str| {
                if s.is_empty() {
                    "-".to_owned()
                } else {
                    s.to_owned()
                }
            };
            let (project, role, tier) = (
                label(&session.project),
                label(&session.role),
                label(&session.tier),
            );
            let usage = match (tokens.is_some(), unpriced) {
                (false, _) => "absent",
                (true, true) => "unpriced",
                (true, false) => "reported",
            };
            metrics
                .calls
                .with_label_values(&[&project, &role, &tier, api.as_str(), usage])
                .inc();
            if let Some(t) = tokens {
                for (kind, n) in t.by_kind() {
                    metrics
                        .tokens
                        .with_label_values(&[&project, &role, &tier, kind.as_str()])
                        .inc_by(n);
                }
            }
            if let Some(c) = cost {
                metrics
                    .cost
                    .with_label_values(&[&project, &role, &tier])
                    .inc_by(c.0);
            }
        }
    }

    /// The record of run `run_id`, if it made a model call this meter saw.
    pub fn run(&self, run_id: &str) -> Option<RunUsage> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.runs.get(run_id).cloned()
    }

    /// How many runs are kept.
    pub fn runs(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .runs
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::price::Microdollars;

    fn session(run: &str) -> Session {
        Session {
            work_item: "wi-1".into(),
            role: "worker-b".into(),
            trace_id: run.into(),
            project: "shop".into(),
            tier: "standard".into(),
            ..Session::default()
        }
    }

    fn prices() -> PriceTable {
        serde_yaml_ng::from_str("m1: {input: \"1\", output: \"2\", cacheRead: \"0.5\"}").unwrap()
    }

    const CHAT: &[u8] = br#"{"model":"m1","usage":{"prompt_tokens":1000,"completion_tokens":500,"prompt_tokens_details":{"cached_tokens":400}}}"#;

    #[test]
    fn a_run_adds_up_its_calls_with_cost_and_metrics_carry_no_run_id() {
        let registry = Registry::new();
        let meter = UsageMeter::new(prices(), Some(UsageMetrics::register(&registry).unwrap()));
        for _ in 0..2 {
            meter.record_answer(&session("run-1"), ModelApi::OpenAiChat, None, CHAT);
        }
        meter.record_answer(
            &session("run-1"),
            ModelApi::OpenAiChat,
            None,
            br#"{"model":"m1"}"#,
        );
        let run = meter.run("run-1").unwrap();
        let m1 = &run.models["m1"];
        assert_eq!((m1.calls, m1.calls_without_usage), (2, 1));
        assert_eq!(m1.tokens.input, 1200);
        assert_eq!(m1.tokens.cache_read, 800);
        assert_eq!(m1.tokens.output, 1000);
        // 1200*1 + 1000*2 + 800*0.5 = 3600 micro-dollars.
        assert_eq!(run.cost(), Some(Microdollars(3600)));
        assert_eq!(run.calls_without_usage(), 1);
        assert!(meter.run("run-2").is_none());

        let text = {
            use prometheus::Encoder;
            let mut out = Vec::new();
            prometheus::TextEncoder::new()
                .encode(&registry.gather(), &mut out)
                .unwrap();
            String::from_utf8(out).unwrap()
        };
        assert!(text.contains(
            "protobot_model_tokens_total{kind=\"input\",project=\"shop\",role=\"worker-b\",tier=\"standard\"} 1200"
        ), "{text}");
        assert!(text.contains(
            "protobot_model_cost_microdollars_total{project=\"shop\",role=\"worker-b\",tier=\"standard\"} 3600"
        ));
        assert!(text.contains("usage=\"absent\"} 1"));
        assert!(!text.contains("run-1") && !text.contains("wi-1"));
    }

    #[test]
    fn an_unpriced_model_has_tokens_and_no_cost() {
        let meter = UsageMeter::new(prices(), None);
        meter.record_answer(&session("r"), ModelApi::OpenAiChat, None, CHAT);
        meter.record_answer(
            &session("r"),
            ModelApi::AnthropicMessages,
            None,
            br#"{"model":"claude-x","usage":{"input_tokens":3,"output_tokens":4}}"#,
        );
        let run = meter.run("r").unwrap();
        assert_eq!(run.models["claude-x"].cost_microdollars, None);
        assert_eq!(run.models["claude-x"].tokens.output, 4);
        assert_eq!(
            run.cost(),
            None,
            "a total without claude-x would understate"
        );
        assert_eq!(run.tokens().input, 603);
    }

    #[test]
    fn the_oldest_run_is_dropped_at_capacity() {
        let meter = UsageMeter::with_capacity(prices(), None, 2);
        for run in ["a", "b", "c"] {
            meter.record_answer(&session(run), ModelApi::OpenAiChat, None, CHAT);
        }
        assert_eq!(meter.runs(), 2);
        assert!(meter.run("a").is_none());
        assert!(meter.run("b").is_some() && meter.run("c").is_some());
        meter.record_answer(&session("b"), ModelApi::OpenAiChat, None, CHAT);
        assert_eq!(meter.run("b").unwrap().models["m1"].calls, 2);
    }
}
