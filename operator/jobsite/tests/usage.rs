#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Usage read back into the build (issue 34): after each run with egress the engine reads
//! what the run spent from the usage port, prices it with the class's prices and records it
//! on the item, once per run id; a source that cannot be read never fails the build.

use std::sync::{Arc, Mutex};

use protobot_jobsite::{
    scripted::{SiteOptions, World, ids, site},
    site::SiteAction,
    usage::{RunUsage, UsageFuture, UsageReadError, UsageSource},
};
use protobot_lifecycle::State;
use protobot_stores::{AdapterConfig, MemoryStore, WorkStore};
use protobot_usage::{ModelUsage, Stage, TokenCounts};

/// A proxy's meter as the port sees it: every run made one call of model `priced`
/// (1,000 tokens in, 500 out) and one of `unlisted` without usage; or, failing, no answer.
#[derive(Debug)]
struct Meter {
    reads: Mutex<Vec<String>>,
    fail: bool,
}

impl UsageSource for Meter {
    fn run_usage<'a>(&'a self, run_id: &'a str) -> UsageFuture<'a> {
        Box::pin(async move {
            self.reads.lock().unwrap().push(run_id.to_owned());
            if self.fail {
                return Err(UsageReadError {
                    run_id: run_id.to_owned(),
                    from: "http://egress.invalid:9090".into(),
                    source: "connection refused".into(),
                });
            }
            let priced = ModelUsage {
                calls: 1,
                calls_without_usage: 0,
                tokens: TokenCounts {
                    input: 1000,
                    output: 500,
                    ..TokenCounts::default()
                },
                cost_microdollars: None,
            };
            let unlisted = ModelUsage {
                calls_without_usage: 1,
                ..ModelUsage::default()
            };
            Ok(Some(RunUsage {
                run_id: run_id.to_owned(),
                models: [
                    ("priced".to_owned(), priced),
                    ("unlisted".to_owned(), unlisted),
                ]
                .into_iter()
                .collect(),
            }))
        })
    }
}

/// One ready item in a fresh store and a meter that answers (or, `fail`ing, does not).
async fn metered_world(fail: bool) -> (World<MemoryStore>, Arc<Meter>, String) {
    let items = ids(1);
    let store = Arc::new(MemoryStore::new(
        "demo",
        AdapterConfig {
            // The subject `resolution::resolve_block` delegates approvals to.
            materializer_subject: "materializer".into(),
            lease_seconds: protobot_jobsite::scripted::LEASE,
        },
    ));
    let w = protobot_jobsite::scripted::world(store, &items).await;
    let meter = Arc::new(Meter {
        reads: Mutex::new(Vec::new()),
        fail,
    });
    (w, meter, items[0].clone())
}

async fn build(fail: bool) -> (World<MemoryStore>, Arc<Meter>, String) {
    let (w, meter, id) = metered_world(fail).await;
    let js = site(
        &w,
        SiteOptions {
            usage: Some(meter.clone()),
            ..SiteOptions::default()
        },
    );
    let actions = js.run_until_idle().await.unwrap();
    let report = actions
        .iter()
        .find_map(|a| match a {
            SiteAction::Built { report } => Some(report.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no build in {actions:#?}"));
    assert_eq!(report.state, State::Completed, "{actions:?}");
    (w, meter, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_run_s_usage_is_read_once_priced_by_the_class_and_summed_per_stage_and_tier() {
    let (w, meter, id) = build(false).await;
    let reads = meter.reads.lock().unwrap().clone();
    let record = w.store.get(&id).await.unwrap().unwrap();
    let summary = record.usage.summary();
    assert_eq!(
        summary.runs as usize,
        reads.len(),
        "one entry per run read: {reads:?}"
    );
    let mut unique = reads.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), reads.len(), "no run read twice: {reads:?}");
    // Every stage of the build spent: Workers, integration, inspection.
    let stages: Vec<Stage> = summary.by_stage.keys().copied().collect();
    assert_eq!(stages, Stage::ALL);
    let runs = reads.len() as u64;
    assert_eq!(summary.total.calls, runs);
    assert_eq!(summary.total.calls_without_usage, runs);
    assert_eq!(summary.total.tokens.input, 1000 * runs);
    // The class prices `priced` at $1 in / $2 out per million: 1,000 + 1,000 micro-dollars.
    assert_eq!(summary.total.cost().map(|c| c.0), Some(2000 * runs));
    // Only Worker runs have a tier; the one cycle ran at t1.
    let workers = summary.by_stage[&Stage::WorkerA].calls + summary.by_stage[&Stage::WorkerB].calls;
    assert_eq!(summary.by_tier.keys().collect::<Vec<_>>(), ["t1"]);
    assert_eq!(summary.by_tier["t1"].calls, workers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_source_that_cannot_be_read_never_fails_the_build() {
    let (w, meter, id) = build(true).await;
    assert!(!meter.reads.lock().unwrap().is_empty(), "it was asked");
    let record = w.store.get(&id).await.unwrap().unwrap();
    assert!(record.usage.is_empty());
}

fn budget(limit: &str) -> Option<protobot_usage::ItemBudget> {
    Some(protobot_usage::ItemBudget {
        limit: limit.parse().unwrap(),
        set_in: "spec.budget.perItem of Project demo".into(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_budget_stops_the_build_before_its_next_cycle_and_a_raised_one_goes_on_after_retry()
{
    let (w, meter, id) = metered_world(false).await;
    // Every run costs $0.002; cycle 1 fails (a wrong implementation), so a second cycle
    // would start, but the item's budget of $0.001 is spent by then.
    let options = |limit: &str| SiteOptions {
        usage: Some(meter.clone()),
        item_budget: budget(limit),
        inspector: false,
        behaviour: protobot_jobsite::scripted::Behaviour {
            wrong_until_cycle: 1,
            ..Default::default()
        },
        ..SiteOptions::default()
    };
    let js = site(&w, options("0.001"));
    let actions = js.run_until_idle().await.unwrap();
    let blocked = w.store.get(&id).await.unwrap().unwrap();
    assert_eq!(blocked.state, State::Blocked, "{actions:#?}");
    for needle in [
        "model budget of $0.001 (spec.budget.perItem of Project demo) is spent",
        "raise the budget in spec.budget.perItem of Project demo and run `protobot retry`",
        "worker-a $0.002000",
        "worker-b $0.002000",
    ] {
        assert!(
            blocked.block_reason.contains(needle),
            "{needle:?} not in {:?}",
            blocked.block_reason
        );
    }
    // Only cycle 1's runs spent: no run started after the budget was found spent.
    let spent = blocked.usage.summary();
    let reads = meter.reads.lock().unwrap().len();
    assert_eq!(spent.runs as usize, reads);
    assert!(
        blocked.attempts.iter().all(|a| a.cycle <= 2),
        "{:?}",
        blocked.attempts
    );
    assert_eq!(
        blocked
            .attempts
            .iter()
            .filter(|a| a.outcome != "blocked")
            .count(),
        1,
        "one genuine cycle ran: {:?}",
        blocked.attempts
    );
    // Without a retry, another pass leaves the blocked item alone.
    let again = site(&w, options("0.001"));
    again.run_until_idle().await.unwrap();
    assert_eq!(
        w.store.get(&id).await.unwrap().unwrap().state,
        State::Blocked
    );

    // A person raises the budget and retries: the build goes on from its ledger and lands.
    protobot_jobsite::resolution::resolve_block(
        w.store.as_ref(),
        "demo",
        &blocked,
        "CS-budget",
        "human:alice",
        "v1",
        jiff::Timestamp::now(),
    )
    .await
    .unwrap();
    assert_eq!(
        w.store.get(&id).await.unwrap().unwrap().state,
        State::ReadyForBuilding
    );
    let raised = site(&w, options("1"));
    raised.run_until_idle().await.unwrap();
    let done = w.store.get(&id).await.unwrap().unwrap();
    assert_eq!(done.state, State::Completed, "{:?}", done.block_reason);
    // The ledger kept what cycle 1 spent and added the rest.
    assert!(done.usage.summary().runs as usize > spent.runs as usize);
    assert_eq!(
        done.usage.summary().runs as usize,
        meter.reads.lock().unwrap().len()
    );
}
