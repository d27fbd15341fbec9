//! The Job Site engine landing through a GitHub pull request: the git half against a local
//! bare repository (the scripted world of `protobot_jobsite::scripted`), the API half against
//! the fake GitHub (tests/support), whose merge endpoint really merges in that repository.
//!
//! - a work item lands by a pull-request merge with the sha guard, verified by fetching;
//! - the default branch moving before the merge leads to revalidation, then a merge guarded by
//!   the new tested head;
//! - a failing required check stops the item in `merging` with that reason and one escalation
//!   issue, however often it is retried.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{sync::Arc, time::Duration};

use axum::http::Method;
use protobot_forge::{
    GithubClient, GithubForge, GithubSettings,
    auth::Credentials,
    core::coordinates::{ApiBase, RepoCoordinates},
};
use protobot_jobsite::{
    engine::{BuildReport, EngineError},
    landing::{ForgeRefusal, Landing},
    lease::{Claim, Clock, Held},
    scripted::{SiteOptions, World, ids, merges_on_main, site, world},
    testing::git,
};
use protobot_lifecycle::{Command, OperationEnvelope, State};
use protobot_repo::remote::Sensitive;
use protobot_stores::{AdapterConfig, MemoryStore, WorkStore};
use serde_json::json;
use support::{Fake, OWNER, REPO};

fn memory() -> Arc<MemoryStore> {
    Arc::new(MemoryStore::new(
        "demo",
        AdapterConfig {
            materializer_subject: "m".into(),
            lease_seconds: protobot_jobsite::scripted::LEASE,
        },
    ))
}

async fn github(w: &World<MemoryStore>) -> (Fake, Landing) {
    let fake = Fake::start().await;
    fake.serve_repository(&w.origin);
    let mut settings = GithubSettings::new(
        ApiBase::parse(&fake.base()).unwrap(),
        RepoCoordinates::new(OWNER, REPO).unwrap(),
    );
    settings.timeout = Duration::from_secs(5);
    // Pacing is the client's own concern (tests/github_stateful.rs); not real seconds here.
    settings.pacing.min_spacing = Duration::ZERO;
    let client = GithubClient::new(
        settings,
        Credentials::Token {
            token: Sensitive::new(b"ghp_enginetest".to_vec()),
            secret: "ns/token".into(),
        },
        None,
    )
    .unwrap();
    let forge = GithubForge::new(Arc::new(client), "https://github.com/acme/widgets", None);
    (fake, Landing::PullRequest(Arc::new(forge)))
}

/// Claims `id` as the site's engine would and builds it, landing as `landing` says.
async fn build(
    w: &World<MemoryStore>,
    js: &protobot_jobsite::site::JobSite<MemoryStore, protobot_jobsite::testing::InProcessExecutor>,
    id: &str,
    landing: &Landing,
) -> Result<BuildReport, EngineError> {
    let record = w.store.get(id).await.unwrap().unwrap();
    let env = OperationEnvelope {
        operation: Command::Claim.as_str().into(),
        actor_context_ref: "job-site".into(),
        work_item_id: id.into(),
        expected_state: Some(record.state.as_str().into()),
        expected_contract_version: Some(record.contract_version),
        idempotency_key: format!("{id}:claim:v{}", record.contract_version),
        ..OperationEnvelope::default()
    };
    let result = w
        .store
        .execute(Some(&js.engine.context), &env, w.clock.now())
        .await
        .unwrap();
    let decision = result
        .decision
        .clone()
        .filter(|_| result.ok)
        .expect("claimed");
    let claim = Claim::new(Held {
        work_item_id: id.into(),
        fencing_token: decision.fencing_token_issued.clone().unwrap(),
        state: decision.after.as_ref().unwrap().state,
        contract_version: decision.after.as_ref().unwrap().contract_version,
    });
    let contract = w.contracts.0.get(id).unwrap().clone();
    js.engine
        .build_landing(&claim, &contract, &js.repo_dir, landing)
        .await
}

fn merge_requests(fake: &Fake) -> Vec<support::Recorded> {
    fake.requests_to(Method::PUT, "/merge")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_work_item_lands_by_a_pull_request_merge_guarded_by_the_tested_head() {
    let items = ids(1);
    let w = world(memory(), &items).await;
    let js = site(&w, SiteOptions::default());
    let (fake, landing) = github(&w).await;
    let report = build(&w, &js, "wi-01", &landing).await.unwrap();
    assert_eq!(report.state, State::Completed, "{report:?}");
    // One merge on main, found by its Work-Item trailer, made by the pull-request merge.
    assert_eq!(merges_on_main(&w.origin), items);
    let merges = merge_requests(&fake);
    assert_eq!(merges.len(), 1);
    let wi_branch = git(
        &w.origin,
        &[
            "for-each-ref",
            "--format=%(refname:short)",
            "refs/heads/wi/",
        ],
    );
    let tested = git(
        &w.origin,
        &["rev-parse", &format!("refs/heads/{wi_branch}")],
    );
    assert_eq!(
        merges[0].body["sha"],
        tested.as_str(),
        "the sha guard is the tested head"
    );
    assert_eq!(merges[0].body["merge_method"], "merge");
    let merge = report.merge_commit.clone().unwrap();
    assert_eq!(merge, git(&w.origin, &["rev-parse", "main"]));
    assert_eq!(
        git(&w.origin, &["rev-parse", &format!("{merge}^2")]),
        tested
    );
    // The pull request went from wi/… to main and its body links the evidence.
    let created = fake.requests_to(Method::POST, "/repos/acme/widgets/pulls");
    assert_eq!(created[0].body["head"], wi_branch.as_str());
    assert_eq!(created[0].body["base"], "main");
    assert!(
        created[0].body["body"]
            .as_str()
            .unwrap()
            .contains(".protobot/attestations/wi-01/findings.jsonl")
    );
    let record = w.store.get("wi-01").await.unwrap().unwrap();
    assert_eq!(record.state, State::Completed);
    // The token is in no trace event, status or record.
    let trace = protobot_jobsite::engine::read_trace(&js.engine.config.scratch, "wi-01");
    assert!(trace.iter().any(|e| e.stage == "land"), "{trace:?}");
    let written = format!(
        "{} {} {:?}",
        serde_json::to_string(&trace).unwrap(),
        serde_json::to_string(&fake.with(|m| m.statuses.clone())).unwrap(),
        record
    );
    assert!(!written.contains("ghp_enginetest"), "{written}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_branch_moving_before_the_merge_leads_to_revalidation() {
    let items = ids(1);
    let w = world(memory(), &items).await;
    let js = site(&w, SiteOptions::default());
    let (fake, landing) = github(&w).await;
    // Someone merges into main just before the Job Site's merge; with "require branches to
    // be up to date" GitHub refuses ours.
    let hook = support::main_moves_once_then(&w.origin, support::merge_in(&w.origin));
    fake.with(|m| m.merge_hook = Some(hook));
    let report = build(&w, &js, "wi-01", &landing).await.unwrap();
    assert_eq!(report.state, State::Completed, "{report:?}");
    assert!(report.revalidations >= 1, "{report:?}");
    let merges = merge_requests(&fake);
    assert_eq!(merges.len(), 2, "refused once, merged after revalidation");
    assert_ne!(
        merges[0].body["sha"], merges[1].body["sha"],
        "the guard is the new tested head"
    );
    let merge = report.merge_commit.unwrap();
    let files = git(&w.origin, &["ls-tree", "-r", "--name-only", &merge]);
    assert!(
        files.contains("docs/other.md"),
        "the landed tree holds the other change: {files}"
    );
    assert_eq!(merges_on_main(&w.origin), items);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_required_check_stops_the_item_with_that_reason_and_one_issue() {
    let items = ids(1);
    let w = world(memory(), &items).await;
    let js = site(&w, SiteOptions::default());
    let (fake, landing) = github(&w).await;
    let failing = json!({"message": "Required status check \"ci/test\" is failing.", "documentation_url": "https://docs.github.com/rest/pulls/pulls#merge-a-pull-request"});
    fake.script(Method::PUT, "/merge", 405, &[], failing.clone());
    let e = build(&w, &js, "wi-01", &landing).await.unwrap_err();
    match &e {
        EngineError::MergeRefused {
            refusal: ForgeRefusal::Blocked { reason },
            ..
        } => {
            assert!(reason.contains("ci/test"), "{reason}")
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("ci/test"), "{e}");
    // Nothing merged; the item is still merging with its envelope, not silently retried.
    assert!(merges_on_main(&w.origin).is_empty());
    let record = w.store.get("wi-01").await.unwrap().unwrap();
    assert_eq!(record.state, State::Merging);
    assert_eq!(merge_requests(&fake).len(), 1);
    let issues = fake.with(|m| m.issues.clone());
    assert_eq!(issues.len(), 1);
    assert!(issues[0]["body"].as_str().unwrap().contains("ci/test"));
    // Retrying (a resumed Job Site) refuses again and updates the same issue.
    fake.script(Method::PUT, "/merge", 405, &[], failing);
    let record = w.store.get("wi-01").await.unwrap().unwrap();
    let lease = record.lease.clone().unwrap();
    let claim = Claim::new(Held {
        work_item_id: "wi-01".into(),
        fencing_token: lease.fencing_token,
        state: record.state,
        contract_version: record.contract_version,
    });
    let contract = w.contracts.0.get("wi-01").unwrap().clone();
    let again = js
        .engine
        .build_landing(&claim, &contract, &js.repo_dir, &landing)
        .await;
    assert!(
        matches!(again, Err(EngineError::MergeRefused { .. })),
        "{again:?}"
    );
    assert_eq!(
        fake.with(|m| m.issues.len()),
        1,
        "retries create the escalation issue once"
    );
    assert_eq!(fake.requests_to(Method::POST, "/issues").len(), 1);
    assert_eq!(fake.requests_to(Method::PATCH, "/issues/").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_the_pull_request_merged_is_recorded_on_restart_not_merged_again() {
    let items = ids(1);
    let w = world(memory(), &items).await;
    let crashed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let once = crashed.clone();
    let js = site(
        &w,
        SiteOptions {
            faults: Some(Arc::new(move |b: &str| {
                b == "after:land" && !once.swap(true, std::sync::atomic::Ordering::SeqCst)
            })),
            ..SiteOptions::default()
        },
    );
    let (fake, landing) = github(&w).await;
    let e = build(&w, &js, "wi-01", &landing).await.unwrap_err();
    assert!(matches!(e, EngineError::Interrupted { .. }), "{e}");
    // GitHub merged; the WMS does not know yet.
    assert_eq!(merges_on_main(&w.origin), items);
    let record = w.store.get("wi-01").await.unwrap().unwrap();
    assert_eq!(record.state, State::Merging);
    let lease = record.lease.clone().unwrap();
    let claim = Claim::new(Held {
        work_item_id: "wi-01".into(),
        fencing_token: lease.fencing_token,
        state: record.state,
        contract_version: record.contract_version,
    });
    let contract = w.contracts.0.get("wi-01").unwrap().clone();
    let report = js
        .engine
        .build_landing(&claim, &contract, &js.repo_dir, &landing)
        .await
        .unwrap();
    assert_eq!(report.state, State::Completed);
    // Found by its Work-Item trailer: one merge request, one merge.
    assert_eq!(merge_requests(&fake).len(), 1);
    assert_eq!(merges_on_main(&w.origin), items);
    assert_eq!(
        report.merge_commit.unwrap(),
        git(&w.origin, &["rev-parse", "main"])
    );
}
