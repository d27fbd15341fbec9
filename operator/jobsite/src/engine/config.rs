//! What an engine is configured with: the worker classes (harnesses) of each role, the
//! Inspection Run's producers, limits, paths, landing, and the hooks a caller may set (stage
//! progress, fault injection, the shutdown signal). Data and one pure check (`egress_for`).

use std::{path::PathBuf, sync::Arc};

use protobot_usage::PriceTable;
use serde::{Deserialize, Serialize};

use crate::{
    escalation::Tier, escalation::TierModels, executor::Limits, inspection::ProducerKind,
    landing::Landing,
};

/// A progress callback: called with a one-line description of each stage.
pub type StageHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Fault injection: called at every named effect boundary; returning true stops
/// the engine right there, as if its process died ([`super::EngineError::Interrupted`]).
pub type FaultHook = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// A harness: the command a role runs in its sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerClass {
    /// argv.
    pub command: Vec<String>,
    /// Container image (Kubernetes only).
    pub image: Option<String>,
    /// Whether its runs may reach the egress proxy (and through it, as the
    /// proxy's policy allows, a model API with a credential the broker adds).
    /// Off by default: a run has no network at all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub egress: bool,
    /// The model each escalation tier runs (`{"t1": {"provider", "model"}, …}`); the task
    /// carries the current tier's as `model`. Empty: the harness chooses its own.
    #[serde(default, skip_serializing_if = "TierModels::is_empty")]
    pub tiers: TierModels,
    /// What the models of this class cost (`{"<model>": {"input": "3", "output": "15",
    /// "cacheRead": "0.3", "cacheWrite": "3.75"}}`, decimal dollars per million tokens): the
    /// Job Site prices its runs' usage with it, falling back to the egress proxy's own table
    /// (`--prices`, the chart's `egressProxy.prices`) for a model it does not name; a model
    /// neither names has its tokens counted and its cost unknown (docs/cost-and-review.md).
    #[serde(default, skip_serializing_if = "PriceTable::is_empty")]
    pub prices: PriceTable,
}

/// A finding producer of the Inspection Run: an Inspector or a mutation campaign
/// (a project-configured command), run through the Executor on the Inspector
/// projection of the candidate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Producer {
    /// Producer principal (unique within a run; independence is checked by it).
    pub name: String,
    /// What it writes.
    pub kind: ProducerKind,
    /// Its harness.
    pub class: WorkerClass,
}

/// The egress proxy a run of `class` gets: none unless the class asks for
/// egress, and then the configured proxy or a refusal that says what to set.
pub fn egress_for(class: &WorkerClass, proxy: Option<&str>) -> Result<Option<String>, String> {
    match (class.egress, proxy) {
        (false, _) => Ok(None),
        (true, Some(url)) => Ok(Some(url.to_owned())),
        (true, None) => Err("its worker class asks for egress, but the Job Site has no egress proxy configured; set the proxy URL (protobot operator --egress-proxy-url) or remove \"egress\" from the class".into()),
    }
}

/// Default of [`EngineConfig::model_retry_delay_cap`]: the classes' own backoff, whose longest
/// delay is 60 s.
pub const DEFAULT_MODEL_RETRY_DELAY_CAP: std::time::Duration = std::time::Duration::from_secs(60);

/// Engine settings.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most genuine build cycles before raising a spec question.
    pub max_cycles: u32,
    /// Transient failures (executor errors) retried at the same tier, per build.
    pub transient_retries: u32,
    /// The WorkerClass's cheapest tier (escalation starts here).
    pub start_tier: Tier,
    /// Worker A (tests).
    pub worker_a: WorkerClass,
    /// Worker B (implementation).
    pub worker_b: WorkerClass,
    /// The integration runner.
    pub integration: WorkerClass,
    /// Inspection Run producers (none: the run seals on the gate alone).
    pub producers: Vec<Producer>,
    /// Sandbox limits per run.
    pub limits: Limits,
    /// Scratch directory for projections, outputs and trace files.
    pub scratch: PathBuf,
    /// Remote to land on.
    pub remote: String,
    /// Default branch.
    pub target_branch: String,
    /// Base URL of the egress proxy given to runs whose class asks for egress
    /// (`None`: such runs are refused).
    pub egress_proxy: Option<String>,
    /// How [`super::Engine::build`] lands (the default: a direct push; a Project with a forge lands
    /// through a pull request: `crate::landing`).
    pub landing: Landing,
    /// Longest wait before retrying a Worker whose model failed transiently (the class's
    /// backoff is used up to this: 60 s after a 429, 1 s doubling to 60 s after a timeout or
    /// a 5xx). Tests set it to zero.
    pub model_retry_delay_cap: std::time::Duration,
    /// The most one item may spend on priced model calls (`None`: no budget). Checked at the
    /// effect boundary before each build cycle against the item's usage ledger; a spent budget
    /// stops the build with a spec question (`protobot_usage::BudgetStop::question`).
    pub item_budget: Option<protobot_usage::ItemBudget>,
}

impl EngineConfig {
    /// Settings with the defaults for everything but the harnesses and paths.
    pub fn new(
        worker_a: WorkerClass,
        worker_b: WorkerClass,
        integration: WorkerClass,
        scratch: PathBuf,
    ) -> EngineConfig {
        EngineConfig {
            max_cycles: 3,
            transient_retries: 3,
            start_tier: Tier::T1,
            worker_a,
            worker_b,
            integration,
            producers: Vec::new(),
            limits: Limits::default(),
            scratch,
            remote: "origin".into(),
            target_branch: "main".into(),
            egress_proxy: None,
            landing: Landing::DirectPush,
            model_retry_delay_cap: DEFAULT_MODEL_RETRY_DELAY_CAP,
            item_budget: None,
        }
    }
}

/// Raised when the process shuts down (SIGTERM, SIGINT): engines stop at their next effect
/// boundary and Job Sites claim nothing more. Shared by every engine of a process.
#[derive(Clone, Debug)]
pub struct StopSignal(Arc<tokio::sync::watch::Sender<bool>>);

impl Default for StopSignal {
    fn default() -> Self {
        StopSignal(Arc::new(tokio::sync::watch::Sender::new(false)))
    }
}

impl StopSignal {
    /// A signal not raised yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Raises it (idempotent).
    pub fn raise(&self) {
        self.0.send_replace(true);
    }

    /// Whether it was raised.
    pub fn is_raised(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once it is raised (at once if it already was).
    pub async fn raised(&self) {
        let mut rx = self.0.subscribe();
        // The sender lives in `self`: the channel cannot close while we wait.
        let _ = rx.wait_for(|raised| *raised).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(egress: bool) -> WorkerClass {
        WorkerClass {
            command: vec!["harness".into()],
            image: None,
            egress,
            tiers: Default::default(),
            prices: Default::default(),
        }
    }

    #[tokio::test]
    async fn a_stop_signal_wakes_its_waiters_once_raised_and_stays_raised() {
        let stop = StopSignal::new();
        let waiter = tokio::spawn({
            let stop = stop.clone();
            async move { stop.raised().await }
        });
        tokio::task::yield_now().await;
        assert!(!stop.is_raised() && !waiter.is_finished());
        stop.raise();
        waiter.await.unwrap();
        assert!(stop.is_raised());
        stop.raised().await;
    }

    #[test]
    fn only_classes_that_ask_for_egress_get_the_proxy() {
        let proxy = Some("http://egress:3128");
        assert_eq!(egress_for(&class(false), proxy), Ok(None));
        assert_eq!(
            egress_for(&class(true), proxy),
            Ok(Some("http://egress:3128".to_owned()))
        );
        let refused = egress_for(&class(true), None).unwrap_err();
        assert!(refused.contains("--egress-proxy-url"), "{refused}");
    }

    #[test]
    fn a_class_may_carry_prices_as_decimal_strings_and_refuses_a_bare_fraction() {
        let priced: WorkerClass = serde_json::from_str(
            r#"{"command":["h"],"image":null,"prices":{"gpt-4o":{"input":"2.5","output":"10","cacheRead":"1.25"}}}"#,
        )
        .unwrap();
        let price = priced.prices.price_of("gpt-4o-2024-08-06").unwrap();
        assert_eq!(
            (
                price.input.0,
                price.output.0,
                price.cache_read.0,
                price.cache_write.0
            ),
            (2_500_000, 10_000_000, 1_250_000, 0)
        );
        let unpriced: WorkerClass =
            serde_json::from_str(r#"{"command":["h"],"image":null}"#).unwrap();
        assert!(unpriced.prices.is_empty());
        assert!(!serde_json::to_string(&unpriced).unwrap().contains("prices"));
        let error = serde_json::from_str::<WorkerClass>(
            r#"{"command":["h"],"image":null,"prices":{"m":{"input":0.5,"output":"1"}}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("quote it"), "{error}");
        let error = serde_json::from_str::<WorkerClass>(
            r#"{"command":["h"],"image":null,"prices":{"m":{"input":"1","output":"1","cached":"1"}}}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("cached"), "{error}");
    }

    #[test]
    fn egress_is_off_unless_a_class_document_says_so() {
        let plain: WorkerClass = serde_json::from_str(r#"{"command":["h"],"image":null}"#).unwrap();
        assert!(!plain.egress);
        assert!(!serde_json::to_string(&plain).unwrap().contains("egress"));
        let asks: WorkerClass =
            serde_json::from_str(r#"{"command":["h"],"image":null,"egress":true}"#).unwrap();
        assert!(asks.egress);
    }
}
