//! Landing and registration against the stateful GitHub double (tests/support): GitHub's
//! answers here follow from the double's state (mergeability computed in the background, a
//! head that lags behind a push, branch protection evaluated against the statuses, check runs
//! and reviews it stores, merges it makes itself), not from scripted refusal strings. Each
//! test sets up a state and asserts what protobot does about it.
//!
//! - transient answers: "Base branch was modified" and a lagging head are asked again, then
//!   land; a head someone else pushed is revalidated at once;
//! - required checks: "is expected" waits (shown in `LandingWaits`) and lands once CI
//!   reports; never reporting escalates once at the deadline naming what is pending; a
//!   failing check or a missing review is a person's;
//! - "require branches to be up to date": revalidation, not a retry;
//! - registration: a merge commit GitHub has not associated yet is asked again;
//! - issues: pull requests in the issues list are never the escalation issue; statuses on
//!   unknown commits are refused (422) and do not change the landing;
//! - rate: a burst of fifty items landing at once, every call counted, inside GitHub's
//!   secondary limits.
//!
//! Every test runs on paused time: the retries' and the checks wait's sleeps are virtual.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{sync::Arc, time::Duration};

use axum::http::Method;
use protobot_forge::{
    GithubClient, GithubForge, GithubSettings,
    auth::Credentials,
    core::{
        approval::{ApprovalClaim, ReviewMode},
        coordinates::{ApiBase, RepoCoordinates},
        escalation::Escalation,
        status::{Stage, StageState, status_body},
    },
    metrics::{ChecksWaitOutcome, ForgeMetrics, Outcome},
};
use protobot_jobsite::landing::{ForgeRefusal, LandingSummary, PullRequestForge, PullRequestMerge};
use protobot_repo::remote::Sensitive;
use serde_json::json;
use support::{Fake, OWNER, Protection, REPO, SecondaryLimit};

const TOKEN: &str = "ghp_TESTTOKENdistinctive0123456789";
const TESTED: &str = "1234567890123456789012345678901234567890";
const OLD: &str = "0000000000000000000000000000000000000aaa";

fn client(fake: &Fake, paced: bool) -> (Arc<GithubClient>, ForgeMetrics) {
    let registry = prometheus::Registry::new();
    let metrics = ForgeMetrics::register(&registry).unwrap();
    let mut settings = GithubSettings::new(
        ApiBase::parse(&fake.base()).unwrap(),
        RepoCoordinates::new(OWNER, REPO).unwrap(),
    );
    settings.timeout = Duration::from_secs(30);
    if !paced {
        settings.pacing.min_spacing = Duration::ZERO;
    }
    let client = GithubClient::new(
        settings,
        Credentials::Token {
            token: Sensitive::new(TOKEN.as_bytes().to_vec()),
            secret: "ns/github-token".into(),
        },
        Some(metrics.clone()),
    )
    .unwrap();
    (Arc::new(client), metrics)
}

fn forge(fake: &Fake) -> (GithubForge, ForgeMetrics) {
    let (client, metrics) = client(fake, false);
    (
        GithubForge::new(client, "https://github.com/acme/widgets", None),
        metrics,
    )
}

fn request(id: &str, tested: &str) -> PullRequestMerge {
    PullRequestMerge {
        work_item_id: id.into(),
        head_branch: format!("wi/{id}-build"),
        base_branch: "main".into(),
        tested_head: tested.into(),
        merge_message: format!("Merge wi/{id}-build into main\n\nWork-Item: {id}"),
        summary: LandingSummary {
            change_set_id: Some("CS-00042".into()),
            product_tree_digest: "sha256:abc".into(),
            inspection_run_id: "run-1".into(),
            findings: 0,
            cycles: 1,
            evidence: Vec::new(),
        },
    }
}

/// The default branch and the work item's pushed branch, as the engine leaves them.
fn pushed(fake: &Fake, id: &str, tested: &str) {
    fake.push("main", &"b".repeat(40));
    fake.push(&format!("wi/{id}-build"), tested);
}

fn merges(fake: &Fake) -> usize {
    fake.requests_to(Method::PUT, "/merge").len()
}

// === transient answers ===

#[tokio::test(start_paused = true)]
async fn base_branch_modified_while_mergeability_is_computed_is_asked_again_then_lands() {
    let fake = Fake::start().await;
    // GitHub computes mergeability after the pull request opens: two answers of "Base
    // branch was modified" before it merges.
    fake.with(|m| m.unknown_window = 2);
    pushed(&fake, "WI-1", TESTED);
    let (forge, metrics) = forge(&fake);
    let merged = forge.merge(&request("WI-1", TESTED)).await.unwrap();
    assert_eq!(merges(&fake), 3, "two transient answers, then the merge");
    assert_eq!(metrics.merge_retries("base-modified"), 2);
    // The merge commit GitHub made is associated with the pull request and moved main.
    let main = fake.with(|m| m.branch_head("main")).unwrap();
    assert_eq!(main, merged.merge_commit);
    assert_eq!(
        fake.with(|m| m.commit_pulls.len()),
        1,
        "the double's own merge made the association"
    );
}

#[tokio::test(start_paused = true)]
async fn base_branch_modified_beyond_the_retry_budget_revalidates() {
    let fake = Fake::start().await;
    fake.with(|m| m.unknown_window = 100);
    pushed(&fake, "WI-2", TESTED);
    let (forge, metrics) = forge(&fake);
    let refusal = forge.merge(&request("WI-2", TESTED)).await.unwrap_err();
    assert!(
        matches!(&refusal, ForgeRefusal::HeadMoved { reason } if reason.contains("Base branch was modified") && reason.contains("asked 5 times")),
        "{refusal:?}"
    );
    assert_eq!(merges(&fake), 5, "the first answer and four retries");
    assert_eq!(metrics.merge_retries("base-modified"), 4);
}

#[tokio::test(start_paused = true)]
async fn a_head_github_has_not_caught_up_with_is_asked_again_then_lands() {
    let fake = Fake::start().await;
    // The pull request was opened at an earlier head; the engine pushed the tested head,
    // and GitHub's pull request still shows the old one for the next three requests.
    fake.push("main", &"b".repeat(40));
    fake.push("wi/WI-3-build", OLD);
    let number = fake.add_pull("wi/WI-3-build", "main", OLD, "open", None);
    fake.with(|m| m.head_lag = 3);
    fake.push("wi/WI-3-build", TESTED);
    let (forge, metrics) = forge(&fake);
    let merged = forge.merge(&request("WI-3", TESTED)).await.unwrap();
    assert_eq!(merged.pull_request, number);
    let puts = fake.requests_to(Method::PUT, "/merge");
    assert!(puts.len() >= 2, "a 409 first, then the merge: {puts:?}");
    assert!(
        puts.iter().all(|r| r.body["sha"] == TESTED),
        "the guard never changes"
    );
    assert!(metrics.merge_retries("head-moved") >= 1);
    assert!(
        !fake
            .requests_to(Method::GET, "/git/ref/heads/wi/WI-3-build")
            .is_empty(),
        "the branch was read to tell a lag from a push"
    );
}

#[tokio::test(start_paused = true)]
async fn a_head_someone_else_pushed_is_revalidated_without_retrying() {
    let fake = Fake::start().await;
    pushed(&fake, "WI-4", TESTED);
    let (forge, metrics) = forge(&fake);
    // Someone pushes to the work item's branch after it was tested.
    fake.add_pull("wi/WI-4-build", "main", TESTED, "open", None);
    fake.push("wi/WI-4-build", &"7".repeat(40));
    let refusal = forge.merge(&request("WI-4", TESTED)).await.unwrap_err();
    assert!(
        matches!(refusal, ForgeRefusal::HeadMoved { .. }),
        "{refusal:?}"
    );
    assert_eq!(merges(&fake), 1);
    assert_eq!(metrics.merge_retries("head-moved"), 0);
}

// === required checks ===

fn protect(fake: &Fake, protection: Protection) {
    fake.with(|m| m.protection = Some(protection));
}

#[tokio::test(start_paused = true)]
async fn is_expected_waits_for_the_check_then_lands_once_it_reports() {
    let fake = Fake::start().await;
    protect(
        &fake,
        Protection {
            required_contexts: vec!["ci/test".into()],
            ..Protection::default()
        },
    );
    pushed(&fake, "WI-5", TESTED);
    let (forge, metrics) = forge(&fake);
    let waits = forge.waits();
    let forge = Arc::new(forge);
    let landing = tokio::spawn({
        let forge = forge.clone();
        async move { forge.merge(&request("WI-5", TESTED)).await }
    });
    // The landing waits, and says so.
    let wait = loop {
        if let Some(w) = waits.of("WI-5") {
            break w;
        }
        assert!(!landing.is_finished(), "{:?}", landing.await);
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(wait.pending, vec!["ci/test".to_string()]);
    assert_eq!(wait.tested_head, TESTED);
    assert!(wait.message().contains("\"ci/test\""), "{}", wait.message());
    assert_eq!(merges(&fake), 1, "asked once, then waiting on the checks");
    // A few polls later CI reports on the tested head.
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert!(!landing.is_finished());
    fake.report(TESTED, "ci/test", "success");
    let merged = landing.await.unwrap().unwrap();
    assert_eq!(merges(&fake), 2);
    assert_eq!(waits.of("WI-5"), None, "the wait is over");
    assert_eq!(metrics.checks_waits(ChecksWaitOutcome::Reported), 1);
    assert_eq!(
        fake.with(|m| m.branch_head("main")).unwrap(),
        merged.merge_commit
    );
    // The wait was shown on the tested head's merge status, once, then success.
    let merge_statuses: Vec<(String, String)> = fake.with(|m| {
        m.statuses
            .iter()
            .filter(|(_, b)| b["context"] == "protobot/merge")
            .map(|(_, b)| {
                (
                    b["state"].as_str().unwrap().to_string(),
                    b["description"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    });
    assert_eq!(merge_statuses.len(), 3, "{merge_statuses:?}");
    assert!(
        merge_statuses[1].1.contains("waiting for"),
        "{merge_statuses:?}"
    );
    assert_eq!(merge_statuses[2].0, "success");
    // The statuses and check runs of the tested head were what it read.
    assert!(
        !fake
            .requests_to(Method::GET, &format!("/commits/{TESTED}/status"))
            .is_empty()
    );
    assert!(
        !fake
            .requests_to(Method::GET, &format!("/commits/{TESTED}/check-runs"))
            .is_empty()
    );
}

#[tokio::test(start_paused = true)]
async fn a_check_run_reporting_later_counts_like_a_status() {
    let fake = Fake::start().await;
    protect(
        &fake,
        Protection {
            required_contexts: vec!["build".into()],
            ..Protection::default()
        },
    );
    pushed(&fake, "WI-6", TESTED);
    fake.check_run(TESTED, "build", "queued", None);
    let (forge, _) = forge(&fake);
    let waits = forge.waits();
    let forge = Arc::new(forge);
    let landing = tokio::spawn({
        let forge = forge.clone();
        async move { forge.merge(&request("WI-6", TESTED)).await }
    });
    while waits.of("WI-6").is_none() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    fake.check_run(TESTED, "build", "completed", Some("success"));
    landing.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn checks_that_never_report_escalate_once_at_the_deadline_naming_what_is_pending() {
    let fake = Fake::start().await;
    protect(
        &fake,
        Protection {
            required_contexts: vec!["ci/test".into(), "lint".into()],
            ..Protection::default()
        },
    );
    pushed(&fake, "WI-7", TESTED);
    // lint reports, ci/test never does.
    fake.report(TESTED, "lint", "success");
    let (forge, metrics) = forge(&fake);
    let refusal = forge.merge(&request("WI-7", TESTED)).await.unwrap_err();
    match &refusal {
        ForgeRefusal::Blocked { reason } => {
            assert!(reason.contains("\"ci/test\""), "{reason}");
            assert!(!reason.contains("\"lint\""), "{reason}");
            assert!(reason.contains("had not reported"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        merges(&fake),
        1,
        "one merge; then the wait, then one escalation"
    );
    assert_eq!(metrics.checks_waits(ChecksWaitOutcome::Deadline), 1);
    assert!(forge.waits().current().is_empty());
    // The merge status says why, as a failure a person acts on.
    let last = fake.with(|m| m.statuses.last().cloned()).unwrap();
    assert_eq!(last.1["context"], "protobot/merge");
    assert_eq!(last.1["state"], "failure");
}

#[tokio::test(start_paused = true)]
async fn a_failing_check_or_a_missing_review_is_a_persons_without_waiting() {
    let fake = Fake::start().await;
    protect(
        &fake,
        Protection {
            required_contexts: vec!["ci/test".into()],
            ..Protection::default()
        },
    );
    pushed(&fake, "WI-8", TESTED);
    fake.report(TESTED, "ci/test", "failure");
    let (forge, metrics) = forge(&fake);
    let refusal = forge.merge(&request("WI-8", TESTED)).await.unwrap_err();
    assert!(
        matches!(&refusal, ForgeRefusal::Blocked { reason } if reason.contains("ci/test") && reason.contains("is failing")),
        "{refusal:?}"
    );
    assert_eq!(merges(&fake), 1);
    assert_eq!(metrics.checks_waits(ChecksWaitOutcome::Reported), 0);

    // CI passes after a fix, but the rule also wants an approving review.
    fake.report(TESTED, "ci/test", "success");
    protect(
        &fake,
        Protection {
            required_contexts: vec!["ci/test".into()],
            required_approvals: 1,
            ..Protection::default()
        },
    );
    let refusal = forge.merge(&request("WI-8", TESTED)).await.unwrap_err();
    assert!(
        matches!(&refusal, ForgeRefusal::Blocked { reason } if reason.contains("approving review")),
        "{refusal:?}"
    );
    // The author's own approval does not count; a reviewer's does.
    let number = fake.with(|m| m.pulls[0]["number"].as_u64().unwrap());
    fake.approve(number, "author");
    assert!(forge.merge(&request("WI-8", TESTED)).await.is_err());
    fake.approve(number, "rita");
    forge.merge(&request("WI-8", TESTED)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn merge_commits_not_allowed_is_a_persons() {
    let fake = Fake::start().await;
    protect(
        &fake,
        Protection {
            allowed_methods: vec!["squash".into()],
            ..Protection::default()
        },
    );
    pushed(&fake, "WI-9", TESTED);
    let (forge, _) = forge(&fake);
    let refusal = forge.merge(&request("WI-9", TESTED)).await.unwrap_err();
    assert!(
        matches!(&refusal, ForgeRefusal::Blocked { reason } if reason.contains("Merge commits are not allowed")),
        "{refusal:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_base_that_moved_under_require_up_to_date_is_revalidated_not_retried() {
    let fake = Fake::start().await;
    protect(
        &fake,
        Protection {
            strict: true,
            ..Protection::default()
        },
    );
    pushed(&fake, "WI-10", TESTED);
    pushed(&fake, "WI-11", &"c".repeat(40));
    let (forge, metrics) = forge(&fake);
    // WI-10's pull request is open against main as it is now.
    let (other, _) = client(&fake, false);
    other
        .open_or_reuse_pull("wi/WI-10-build", "main", "t", "b")
        .await
        .unwrap();
    // WI-11 lands first; main moves to its merge.
    forge
        .merge(&request("WI-11", &"c".repeat(40)))
        .await
        .unwrap();
    let refusal = forge.merge(&request("WI-10", TESTED)).await.unwrap_err();
    assert!(
        matches!(&refusal, ForgeRefusal::HeadMoved { reason } if reason.contains("not up to date")),
        "{refusal:?}"
    );
    assert_eq!(merges(&fake), 2);
    assert_eq!(metrics.merge_retries("not-up-to-date"), 0);
}

// === registration ===

fn claim(merge: &str) -> ApprovalClaim {
    ApprovalClaim {
        change_set_id: "CS-00042".into(),
        merge_commit: merge.into(),
        default_branch: "main".into(),
        branch_prefix: "cs/".into(),
        repository: RepoCoordinates::new(OWNER, REPO).unwrap(),
        review_mode: ReviewMode::SinglePlayer,
    }
}

#[tokio::test(start_paused = true)]
async fn a_fresh_merge_commit_is_asked_again_until_github_associates_its_pull_request() {
    let fake = Fake::start().await;
    fake.with(|m| m.association_lag = 2);
    fake.push("main", &"b".repeat(40));
    fake.push("cs/00042-sync", TESTED);
    let (client, metrics) = client(&fake, false);
    // The change set's pull request merges on GitHub (the double makes the merge).
    let number = fake.add_pull("cs/00042-sync", "main", TESTED, "open", None);
    let merge = match client.merge_pull(number, TESTED, "t", "").await.unwrap() {
        protobot_forge::core::merge::MergeAnswer::Merged { sha } => sha,
        other => panic!("{other:?}"),
    };
    let proof = client
        .approved_merge(&claim(&merge))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(proof.number(), number);
    assert_eq!(metrics.approval_reasks(), 2);
    assert_eq!(
        fake.requests_to(Method::GET, &format!("/commits/{merge}/pulls"))
            .len(),
        3
    );
    // A commit no pull request ever made: asked a bounded number of times, then refused.
    let stray = "d".repeat(40);
    let refusal = client
        .approved_merge(&claim(&stray))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refusal.code(), "NOT_APPROVED");
    assert_eq!(
        fake.requests_to(Method::GET, &format!("/commits/{stray}/pulls"))
            .len(),
        4,
        "the first lookup and three re-asks"
    );
}

// === issues and statuses ===

#[tokio::test(start_paused = true)]
async fn a_pull_request_in_the_issues_list_is_never_taken_for_the_escalation_issue() {
    let fake = Fake::start().await;
    let (client, _) = client(&fake, false);
    // A pull request that carries the label and quotes the marker (someone pasted it).
    let number = fake.add_pull("feature/x", "main", TESTED, "open", None);
    fake.with(|m| {
        let p = m.pulls.iter_mut().find(|p| p["number"] == number).unwrap();
        p["labels"] = json!([{"name": "protobot-escalation"}]);
        p["body"] = json!("<!-- protobot:escalation work-item=WI-00042 -->");
    });
    let issue = client
        .escalate(&Escalation {
            work_item_id: "WI-00042".into(),
            reason: "r".into(),
            decision: "d".into(),
            work_item_url: None,
        })
        .await
        .unwrap();
    assert_ne!(issue, number);
    assert_eq!(fake.requests_to(Method::POST, "/issues").len(), 1);
    assert!(fake.requests_to(Method::PATCH, "/issues/").is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_status_on_an_unknown_commit_is_refused_and_never_decides_a_landing() {
    let fake = Fake::start().await;
    let (client, metrics) = client(&fake, false);
    let unknown = "5".repeat(40);
    let e = client
        .set_status(
            &unknown,
            &status_body(Stage::Merge, StageState::Pending, "x", None),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, protobot_forge::ForgeError::Refused { status: 422, .. }),
        "{e}"
    );
    assert_eq!(metrics.calls("create-status", Outcome::Refused), 1);
    // Once the commit is pushed, the same status is accepted.
    fake.push("wi/WI-12-build", &unknown);
    client
        .set_status(
            &unknown,
            &status_body(Stage::Merge, StageState::Pending, "x", None),
        )
        .await
        .unwrap();
}

// === rate ===

/// Fifty items reach `merging` together: every landing opens its pull request, writes its
/// statuses and merges, against a double that enforces GitHub's secondary limits (80
/// mutations a minute) and measures concurrency. With the default pacing no request is
/// limited, mutations never overlap, and every call is counted by outcome.
#[tokio::test(start_paused = true)]
async fn a_burst_of_fifty_items_landing_at_once_stays_inside_the_secondary_limits() {
    let fake = Fake::start().await;
    fake.with(|m| {
        m.secondary = Some(SecondaryLimit::default());
        m.unknown_window = 1;
    });
    fake.push("main", &"b".repeat(40));
    let ids: Vec<String> = (0..50).map(|n| format!("WI-{n:05}")).collect();
    let heads: Vec<String> = (0..50).map(|n| format!("{:040x}", n + 1)).collect();
    for (id, head) in ids.iter().zip(&heads) {
        fake.push(&format!("wi/{id}-build"), head);
    }
    let (client, metrics) = client(&fake, true);
    let forge = Arc::new(GithubForge::new(
        client,
        "https://github.com/acme/widgets",
        None,
    ));
    let landings: Vec<_> = ids
        .iter()
        .zip(&heads)
        .map(|(id, head)| {
            let forge = forge.clone();
            let request = request(id, head);
            tokio::spawn(async move { forge.merge(&request).await })
        })
        .collect();
    for landing in landings {
        landing.await.unwrap().unwrap();
    }
    let (refusals, max_in_flight, pulls_merged) = fake.with(|m| {
        (
            m.secondary_refusals,
            m.max_in_flight,
            m.pulls.iter().filter(|p| !p["merged_at"].is_null()).count(),
        )
    });
    assert_eq!(pulls_merged, 50);
    assert_eq!(refusals, 0, "no secondary limit was hit");
    assert_eq!(max_in_flight, 1, "mutations are serialized");
    let per_minute = fake.max_mutations_per_minute();
    assert!(per_minute <= 80, "{per_minute} mutations within a minute");
    assert_eq!(metrics.calls_by_outcome(Outcome::RateLimited), 0);
    assert!(metrics.pacing_waits() > 0, "the pacing held mutations back");
    // Every request the double saw was counted once, by its outcome.
    let seen = fake.requests().len() as u64;
    let counted: u64 = [
        Outcome::Success,
        Outcome::Refused,
        Outcome::RateLimited,
        Outcome::ServerError,
        Outcome::TransportError,
    ]
    .into_iter()
    .map(|o| metrics.calls_by_outcome(o))
    .sum();
    assert_eq!(counted, seen);
    // The one transient answer per pull request was retried, not escalated.
    assert_eq!(metrics.merge_retries("base-modified"), 50);
}

/// The control of the burst above: the same fifty landings with the pacing's spacing and
/// budgets lifted hit the double's secondary limit, which the client then waits out (counted
/// as `rate-limited`): the limit the pacing keeps clear of is real in the double.
#[tokio::test(start_paused = true)]
async fn without_the_pacing_budgets_the_same_burst_hits_the_secondary_limit() {
    let fake = Fake::start().await;
    fake.with(|m| m.secondary = Some(SecondaryLimit::default()));
    fake.push("main", &"b".repeat(40));
    let (client, metrics) = {
        let registry = prometheus::Registry::new();
        let metrics = ForgeMetrics::register(&registry).unwrap();
        let mut settings = GithubSettings::new(
            ApiBase::parse(&fake.base()).unwrap(),
            RepoCoordinates::new(OWNER, REPO).unwrap(),
        );
        settings.timeout = Duration::from_secs(30);
        settings.pacing = protobot_forge::core::ratelimit::Pacing {
            min_spacing: Duration::ZERO,
            per_minute: usize::MAX,
            per_hour: usize::MAX,
        };
        let credentials = Credentials::Token {
            token: Sensitive::new(TOKEN.as_bytes().to_vec()),
            secret: "ns/github-token".into(),
        };
        let client = GithubClient::new(settings, credentials, Some(metrics.clone())).unwrap();
        (Arc::new(client), metrics)
    };
    let forge = Arc::new(GithubForge::new(
        client,
        "https://github.com/acme/widgets",
        None,
    ));
    let landings: Vec<_> = (0..50)
        .map(|n| {
            let id = format!("WI-{n:05}");
            let head = format!("{:040x}", n + 1);
            fake.push(&format!("wi/{id}-build"), &head);
            let forge = forge.clone();
            tokio::spawn(async move { forge.merge(&request(&id, &head)).await })
        })
        .collect();
    for landing in landings {
        // Some may give up as unavailable (the limit outlasted the retry policy): the point
        // here is the limit, not the landings.
        let _ = landing.await.unwrap();
    }
    assert!(fake.with(|m| m.secondary_refusals) > 0);
    assert!(fake.max_mutations_per_minute() > 80);
    assert!(metrics.calls_by_outcome(Outcome::RateLimited) > 0);
}
