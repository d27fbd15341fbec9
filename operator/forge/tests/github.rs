//! The GitHub shell against a fake GitHub on loopback (tests/support): every call the Job
//! Site makes, with GitHub's documented answers and failures.
//!
//! - approved merge: pagination, reviews, refusals;
//! - pull requests: open, reuse, already merged, a concurrent open (422);
//! - merge: the sha guard and `merge_method`, every documented refusal;
//! - rate limits: primary, `retry-after`, secondary, the budget, metrics;
//! - server errors: idempotent requests retried, a `POST` never repeated blindly;
//! - escalations: one issue per work item across retries and lost answers, reopened when closed;
//! - GitHub App: the JWT, installation tokens cached, refreshed, re-minted after a 401;
//! - untrusted bodies: malformed JSON is an error, never a panic.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{sync::Arc, time::Duration};

use axum::http::Method;
use protobot_forge::{
    ForgeError, GithubClient, GithubForge, GithubSettings, PullState,
    auth::{AppKey, Credentials},
    core::{
        approval::{ApprovalClaim, ReviewMode},
        coordinates::{ApiBase, RepoCoordinates},
        escalation::Escalation,
        merge::{MergeAnswer, MergeRefusal},
        status::{Stage, StageState, status_body},
    },
    metrics::{ForgeMetrics, Outcome},
};
use protobot_jobsite::landing::{
    EscalationRequest, ForgeRefusal, LandingSummary, PullRequestForge, PullRequestMerge,
};
use protobot_repo::remote::Sensitive;
use serde_json::json;
use support::{Fake, OWNER, REPO, pull_json};

const TOKEN: &str = "ghp_TESTTOKENdistinctive0123456789";
const TESTED: &str = "1234567890123456789012345678901234567890";

fn settings(fake: &Fake) -> GithubSettings {
    let mut s = GithubSettings::new(
        ApiBase::parse(&fake.base()).unwrap(),
        RepoCoordinates::new(OWNER, REPO).unwrap(),
    );
    s.timeout = Duration::from_secs(5);
    // Tests not about pacing run unpaced (they would wait real seconds between mutations);
    // `a_burst_of_fifty_items_*` runs the default pacing.
    s.pacing.min_spacing = Duration::ZERO;
    s
}

fn token_client(fake: &Fake) -> (GithubClient, ForgeMetrics) {
    let registry = prometheus::Registry::new();
    let metrics = ForgeMetrics::register(&registry).unwrap();
    let client = GithubClient::new(
        settings(fake),
        Credentials::Token {
            token: Sensitive::new(TOKEN.as_bytes().to_vec()),
            secret: "ns/github-token".into(),
        },
        Some(metrics.clone()),
    )
    .unwrap();
    (client, metrics)
}

fn claim(mode: ReviewMode, merge: &str) -> ApprovalClaim {
    ApprovalClaim {
        change_set_id: "CS-00042".into(),
        merge_commit: merge.into(),
        default_branch: "main".into(),
        branch_prefix: "cs/".into(),
        repository: RepoCoordinates::new(OWNER, REPO).unwrap(),
        review_mode: mode,
    }
}

// === approved merge ===

#[tokio::test]
async fn approved_merge_reads_every_page_and_the_reviews_of_the_merged_head() {
    let fake = Fake::start().await;
    let merge = "a".repeat(40);
    fake.with(|m| {
        m.page_size = 2;
        for n in 1..=4 {
            m.commit_pulls.push((
                merge.clone(),
                pull_json(
                    n,
                    &format!("feature/{n}"),
                    "main",
                    TESTED,
                    "closed",
                    Some(&merge),
                    "acme/widgets",
                ),
            ));
        }
        // The change set's pull request is on the third page.
        m.commit_pulls.push((
            merge.clone(),
            pull_json(
                9,
                "cs/00042-sync",
                "main",
                TESTED,
                "closed",
                Some(&merge),
                "acme/widgets",
            ),
        ));
        m.reviews.push((
            9,
            json!({"user": {"login": "rita"}, "state": "APPROVED", "commit_id": TESTED}),
        ));
    });
    let (client, metrics) = token_client(&fake);
    let proof = client
        .approved_merge(&claim(ReviewMode::MultiPlayer, &merge))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(proof.number(), 9);
    assert_eq!(proof.approvers(), ["rita".to_string()]);
    let pages = fake.requests_to(Method::GET, &format!("/commits/{merge}/pulls"));
    assert_eq!(pages.len(), 3, "{pages:?}");
    assert!(pages[2].query.contains("page=3"), "{:?}", pages[2]);
    assert_eq!(metrics.calls("list-pulls-for-commit", Outcome::Success), 3);
    // The token went in the Authorization header, and only there.
    assert_eq!(
        pages[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert!(!pages[0].query.contains(TOKEN));
}

#[tokio::test]
async fn a_merge_without_the_required_review_or_from_a_fork_is_not_approved() {
    let fake = Fake::start().await;
    let merge = "b".repeat(40);
    fake.with(|m| {
        m.commit_pulls.push((
            merge.clone(),
            pull_json(
                3,
                "cs/00042-sync",
                "main",
                TESTED,
                "closed",
                Some(&merge),
                "acme/widgets",
            ),
        ));
        m.reviews.push((
            3,
            json!({"user": {"login": "author"}, "state": "APPROVED", "commit_id": TESTED}),
        ));
    });
    let (client, _) = token_client(&fake);
    let refused = client
        .approved_merge(&claim(ReviewMode::MultiPlayer, &merge))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code(), "NOT_APPROVED");
    // Under single-player review the same merge is the approval.
    assert!(
        client
            .approved_merge(&claim(ReviewMode::SinglePlayer, &merge))
            .await
            .unwrap()
            .is_ok()
    );
    let fork = "c".repeat(40);
    fake.with(|m| {
        m.commit_pulls.push((
            fork.clone(),
            pull_json(
                4,
                "cs/00042-sync",
                "main",
                TESTED,
                "closed",
                Some(&fork),
                "mallory/widgets",
            ),
        ))
    });
    let refused = client
        .approved_merge(&claim(ReviewMode::SinglePlayer, &fork))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refused.code(), "NOT_APPROVED");
    // A sha that is not one never reaches GitHub.
    let before = fake.requests().len();
    let e = client
        .approved_merge(&claim(ReviewMode::SinglePlayer, "HEAD"))
        .await
        .unwrap_err();
    assert!(matches!(e, ForgeError::InvalidInput { .. }), "{e}");
    assert_eq!(fake.requests().len(), before);
}

#[tokio::test]
async fn a_pagination_link_to_another_host_is_not_followed() {
    let fake = Fake::start().await;
    let merge = "d".repeat(40);
    fake.script(
        Method::GET,
        &format!("/commits/{merge}/pulls"),
        200,
        &[("link", "<https://evil.example/steal?page=2>; rel=\"next\"")],
        json!([]),
    );
    let (client, _) = token_client(&fake);
    let e = client.pulls_for_commit(&merge).await.unwrap_err();
    assert!(matches!(e, ForgeError::Page(_)), "{e}");
    assert!(e.to_string().contains("evil.example"), "{e}");
    assert_eq!(fake.requests().len(), 1);
}

// === pull requests and the merge ===

#[tokio::test]
async fn a_pull_request_is_opened_once_then_reused_and_a_merged_one_is_reported() {
    let fake = Fake::start().await;
    fake.with(|m| m.branch_heads.push(("wi/WI-1-build".into(), TESTED.into())));
    let (client, _) = token_client(&fake);
    let first = client
        .open_or_reuse_pull("wi/WI-1-build", "main", "t1", "b1")
        .await
        .unwrap();
    let PullState::Open { number, head_sha } = first else {
        panic!("{first:?}")
    };
    assert_eq!(head_sha, TESTED);
    let created = fake.requests_to(Method::POST, "/repos/acme/widgets/pulls");
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].body["head"], "wi/WI-1-build");
    assert_eq!(created[0].body["base"], "main");
    // Again: the open one is reused and its body brought up to date.
    let again = client
        .open_or_reuse_pull("wi/WI-1-build", "main", "t2", "b2")
        .await
        .unwrap();
    assert_eq!(
        again,
        PullState::Open {
            number,
            head_sha: TESTED.into()
        }
    );
    assert_eq!(
        fake.requests_to(Method::POST, "/repos/acme/widgets/pulls")
            .len(),
        1
    );
    let patched = fake.requests_to(Method::PATCH, &format!("/pulls/{number}"));
    assert_eq!(patched[0].body["body"], "b2");
    let listed = fake.requests_to(Method::GET, "/repos/acme/widgets/pulls");
    assert!(
        listed[0].query.contains("head=acme:wi/WI-1-build"),
        "{:?}",
        listed[0]
    );
    assert!(listed[0].query.contains("state=all"), "{:?}", listed[0]);
    // Merged (a rerun after a crash): reported, nothing opened.
    let merge = "e".repeat(40);
    fake.with(|m| {
        let p = m.pulls.iter_mut().find(|p| p["number"] == number).unwrap();
        p["state"] = json!("closed");
        p["merged_at"] = json!("2026-12-01T00:00:00Z");
        p["merge_commit_sha"] = json!(merge.clone());
    });
    let merged = client
        .open_or_reuse_pull("wi/WI-1-build", "main", "t", "b")
        .await
        .unwrap();
    assert_eq!(
        merged,
        PullState::Merged {
            number,
            merge_commit: merge
        }
    );
    assert_eq!(
        fake.requests_to(Method::POST, "/repos/acme/widgets/pulls")
            .len(),
        1
    );
}

#[tokio::test]
async fn a_concurrently_opened_pull_request_is_found_after_the_422() {
    let fake = Fake::start().await;
    let (client, _) = token_client(&fake);
    // The first listing misses the pull request another replica opens meanwhile.
    fake.script(
        Method::GET,
        "/repos/acme/widgets/pulls",
        200,
        &[],
        json!([]),
    );
    let n = fake.add_pull("wi/WI-2-build", "main", TESTED, "open", None);
    let state = client
        .open_or_reuse_pull("wi/WI-2-build", "main", "t", "b")
        .await
        .unwrap();
    assert_eq!(
        state,
        PullState::Open {
            number: n,
            head_sha: TESTED.into()
        }
    );
    assert_eq!(
        fake.requests_to(Method::POST, "/repos/acme/widgets/pulls")
            .len(),
        1
    );
}

#[tokio::test]
async fn the_merge_sends_the_sha_guard_and_merge_method_and_maps_every_refusal() {
    let fake = Fake::start().await;
    let (client, _) = token_client(&fake);
    let n = fake.add_pull("wi/WI-3-build", "main", TESTED, "open", None);
    let answer = client
        .merge_pull(
            n,
            TESTED,
            "Merge wi/WI-3-build into main",
            "Work-Item: WI-3",
        )
        .await
        .unwrap();
    assert_eq!(
        answer,
        MergeAnswer::Merged {
            sha: "e".repeat(40)
        }
    );
    let put = fake.requests_to(Method::PUT, &format!("/pulls/{n}/merge"));
    assert_eq!(put[0].body["merge_method"], "merge");
    assert_eq!(put[0].body["sha"], TESTED);
    assert_eq!(put[0].body["commit_message"], "Work-Item: WI-3");

    // The head moved: GitHub's own 409.
    let m = fake.add_pull("wi/WI-4-build", "main", &"9".repeat(40), "open", None);
    let answer = client.merge_pull(m, TESTED, "t", "").await.unwrap();
    assert!(
        matches!(answer, MergeAnswer::Refused(MergeRefusal::HeadMoved { .. })),
        "{answer:?}"
    );

    let cases = [
        (
            405,
            "Head branch was modified. Review and try the merge again.",
            "head-moved",
        ),
        (
            405,
            "Required status check \"ci/test\" is expected.",
            "checks-pending",
        ),
        (
            405,
            "Required status check \"ci/test\" is failing.",
            "required-check",
        ),
        (
            405,
            "Base branch was modified. Review and try the merge again.",
            "base-modified",
        ),
        (405, "Pull Request is not mergeable", "conflict"),
        (
            405,
            "At least 1 approving review is required by reviewers with write access.",
            "protected",
        ),
        (
            409,
            "Head branch was modified. Review and try the merge again.",
            "head-moved",
        ),
        (422, "Validation Failed", "invalid"),
    ];
    for (status, message, category) in cases {
        fake.script(Method::PUT, "/merge", status, &[], json!({"message": message, "documentation_url": "https://docs.github.com/rest/pulls/pulls#merge-a-pull-request", "status": status.to_string()}));
        let answer = client.merge_pull(m, TESTED, "t", "").await.unwrap();
        match answer {
            MergeAnswer::Refused(r) => assert_eq!(r.category(), category, "{status} {message}"),
            other => panic!("{status} {message}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn malformed_or_unexpected_bodies_are_errors_never_panics() {
    let fake = Fake::start().await;
    let (client, metrics) = token_client(&fake);
    fake.script(Method::PUT, "/merge", 200, &[], json!("not an object"));
    let e = client.merge_pull(1, TESTED, "t", "").await.unwrap_err();
    assert!(matches!(e, ForgeError::Decode(_)), "{e}");
    assert_eq!(metrics.calls("merge-pull", Outcome::DecodeError), 1);
    fake.script(
        Method::GET,
        "/pulls",
        200,
        &[],
        json!([{"number": "seven"}]),
    );
    let e = client.pulls_for_head("wi/x", "main").await.unwrap_err();
    assert!(e.to_string().contains("list-pulls"), "{e}");
    fake.script(Method::GET, "/compare/", 200, &[], json!({"nope": 1}));
    assert!(client.branch_contains("main", TESTED).await.is_err());
    // Branch names that are not ours never reach GitHub.
    for bad in ["../x", "-x", "a b", "a&state=closed"] {
        assert!(matches!(
            client.pulls_for_head(bad, "main").await,
            Err(ForgeError::InvalidInput { .. })
        ));
    }
}

#[tokio::test]
async fn branch_contains_reads_the_comparison() {
    let fake = Fake::start().await;
    let (client, _) = token_client(&fake);
    fake.with(|m| m.contains.push(("main".into(), TESTED.into())));
    assert!(client.branch_contains("main", TESTED).await.unwrap());
    assert!(
        !client
            .branch_contains("main", &"5".repeat(40))
            .await
            .unwrap()
    );
    fake.script(
        Method::GET,
        "/compare/",
        404,
        &[],
        json!({"message": "Not Found"}),
    );
    assert!(!client.branch_contains("main", TESTED).await.unwrap());
}

// === rate limits and server errors ===

#[tokio::test(start_paused = true)]
async fn rate_limits_wait_as_the_headers_say_then_succeed() {
    let fake = Fake::start().await;
    let (client, metrics) = token_client(&fake);
    let reset = (jiff::Timestamp::now().as_second() + 30).to_string();
    fake.script(
        Method::GET,
        "/pulls",
        403,
        &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", &reset), ("x-ratelimit-limit", "5000")],
        json!({"message": "API rate limit exceeded for installation ID 1.", "documentation_url": "https://docs.github.com/rest/overview/resources-in-the-rest-api#rate-limiting"}),
    );
    fake.script(
        Method::GET,
        "/pulls",
        429,
        &[("retry-after", "7")],
        json!({"message": "You have exceeded a secondary rate limit."}),
    );
    fake.script(
        Method::GET,
        "/pulls",
        403,
        &[],
        json!({"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you try again."}),
    );
    let started = tokio::time::Instant::now();
    let pulls = client.pulls_for_head("wi/x", "main").await.unwrap();
    assert!(pulls.is_empty());
    let waited = started.elapsed();
    // ~31 s until the reset, 7 s retry-after, then the second secondary limit of this
    // request without headers: 60 s doubled once.
    assert!(waited >= Duration::from_secs(30 + 7 + 120), "{waited:?}");
    assert!(
        waited < Duration::from_secs(30 + 7 + 120 + 10),
        "{waited:?}"
    );
    assert_eq!(metrics.calls("list-pulls", Outcome::RateLimited), 3);
    assert_eq!(metrics.calls("list-pulls", Outcome::Success), 1);
    assert_eq!(fake.requests_to(Method::GET, "/pulls").len(), 4);
}

#[tokio::test(start_paused = true)]
async fn a_limit_beyond_the_budget_is_reported_not_looped() {
    let fake = Fake::start().await;
    let (client, _) = token_client(&fake);
    for _ in 0..6 {
        fake.script(
            Method::POST,
            "/issues",
            429,
            &[("retry-after", "1")],
            json!({"message": "secondary rate limit"}),
        );
    }
    let e = client
        .escalate(&Escalation {
            work_item_id: "WI-9".into(),
            reason: "r".into(),
            decision: "d".into(),
            work_item_url: None,
        })
        .await
        .unwrap_err();
    assert!(matches!(e, ForgeError::RateLimited { .. }), "{e}");
    assert!(e.is_transient());
    // The first attempt and five retries, nothing more.
    assert_eq!(fake.requests_to(Method::POST, "/issues").len(), 6);
    // An hour's wait is given up at once.
    let reset = (jiff::Timestamp::now().as_second() + 3600).to_string();
    fake.script(
        Method::GET,
        "/pulls",
        403,
        &[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset),
        ],
        json!({"message": "API rate limit exceeded"}),
    );
    let before = fake.requests().len();
    let e = client.pulls_for_head("wi/x", "main").await.unwrap_err();
    assert!(e.to_string().contains("primary"), "{e}");
    assert_eq!(fake.requests().len(), before + 1);
}

#[tokio::test(start_paused = true)]
async fn server_errors_retry_reads_but_never_repeat_a_post() {
    let fake = Fake::start().await;
    let (client, metrics) = token_client(&fake);
    fake.script(
        Method::GET,
        "/pulls",
        502,
        &[],
        json!({"message": "Server Error"}),
    );
    fake.script(
        Method::GET,
        "/pulls",
        503,
        &[],
        json!({"message": "Server Error"}),
    );
    assert!(client.pulls_for_head("wi/x", "main").await.is_ok());
    assert_eq!(metrics.calls("list-pulls", Outcome::ServerError), 2);
    for _ in 0..4 {
        fake.script(Method::GET, "/pulls", 500, &[], json!({}));
    }
    let e = client.pulls_for_head("wi/x", "main").await.unwrap_err();
    assert!(
        matches!(e, ForgeError::Unavailable { status: 500, .. }),
        "{e}"
    );
    fake.script(Method::POST, "/statuses/", 502, &[], json!({}));
    let e = client
        .set_status(
            TESTED,
            &status_body(Stage::Merge, StageState::Pending, "x", None),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(e, ForgeError::Unavailable { status: 502, .. }),
        "{e}"
    );
    assert_eq!(fake.requests_to(Method::POST, "/statuses/").len(), 1);
}

// === escalations ===

fn escalation(reason: &str) -> Escalation {
    Escalation {
        work_item_id: "WI-00042".into(),
        reason: reason.into(),
        decision: "Fix the check, then run `protobot retry`.".into(),
        work_item_url: Some("https://console.example/bwi/WI-00042".into()),
    }
}

#[tokio::test]
async fn retries_create_the_escalation_issue_once() {
    let fake = Fake::start().await;
    let (client, _) = token_client(&fake);
    let first = client
        .escalate(&escalation("check ci/test failed"))
        .await
        .unwrap();
    let second = client
        .escalate(&escalation("check ci/test still failing"))
        .await
        .unwrap();
    assert_eq!(first, second);
    assert_eq!(fake.requests_to(Method::POST, "/issues").len(), 1);
    let issues = fake.with(|m| m.issues.clone());
    assert_eq!(issues.len(), 1);
    assert!(
        issues[0]["body"]
            .as_str()
            .unwrap()
            .contains("still failing")
    );
    assert_eq!(issues[0]["labels"][0]["name"], "protobot-escalation");
    // Closing the issue does not end the escalation: the next one reopens it.
    fake.with(|m| m.issues[0]["state"] = json!("closed"));
    client.escalate(&escalation("again")).await.unwrap();
    let issues = fake.with(|m| m.issues.clone());
    assert_eq!(
        (issues.len(), issues[0]["state"].as_str()),
        (1, Some("open"))
    );
    // Another work item gets its own issue.
    client
        .escalate(&Escalation {
            work_item_id: "WI-00043".into(),
            ..escalation("x")
        })
        .await
        .unwrap();
    assert_eq!(fake.with(|m| m.issues.len()), 2);
}

#[tokio::test]
async fn a_lost_create_answer_does_not_open_a_second_issue_on_retry() {
    let fake = Fake::start().await;
    let (client, _) = token_client(&fake);
    // GitHub creates the issue, but the answer is a 502.
    fake.script_lost(Method::POST, "/issues", 502);
    assert!(client.escalate(&escalation("r")).await.is_err());
    assert_eq!(fake.with(|m| m.issues.len()), 1);
    // The retry finds it by its marker and updates it.
    client.escalate(&escalation("r")).await.unwrap();
    assert_eq!(fake.with(|m| m.issues.len()), 1);
    assert_eq!(fake.requests_to(Method::POST, "/issues").len(), 1);
    // Across pages too.
    fake.with(|m| {
        m.page_size = 1;
        for n in 0..3 {
            m.issues.insert(0, json!({"number": 100 + n, "state": "open", "body": "other", "labels": [{"name": "protobot-escalation"}]}));
        }
    });
    client.escalate(&escalation("r")).await.unwrap();
    assert_eq!(fake.with(|m| m.issues.len()), 4);
}

// === the GitHub App ===

const KEY: &str = include_str!("fixtures/test-app-key.pem");
const PUBLIC: &[u8] = include_bytes!("fixtures/test-app-key.pub.der");

fn app_client(fake: &Fake) -> GithubClient {
    let key = AppKey::from_pem(&Sensitive::new(KEY.as_bytes().to_vec()), "ns/app-key").unwrap();
    GithubClient::new(
        settings(fake),
        Credentials::App {
            app_id: 4242,
            installation_id: 77,
            key,
        },
        None,
    )
    .unwrap()
}

fn verify_jwt(authorization: &str) -> serde_json::Value {
    use base64::Engine as _;
    let jwt = authorization.strip_prefix("Bearer ").unwrap();
    let parts: Vec<&str> = jwt.split('.').collect();
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, PUBLIC)
        .verify(
            format!("{}.{}", parts[0], parts[1]).as_bytes(),
            &b64.decode(parts[2]).unwrap(),
        )
        .expect("the JWT is signed by the App's key");
    serde_json::from_slice(&b64.decode(parts[1]).unwrap()).unwrap()
}

#[tokio::test]
async fn an_app_mints_scoped_installation_tokens_caches_and_refreshes_them() {
    let fake = Fake::start().await;
    let client = app_client(&fake);
    client.pulls_for_head("wi/x", "main").await.unwrap();
    client.pulls_for_head("wi/x", "main").await.unwrap();
    let mints = fake.requests_to(Method::POST, "/app/installations/77/access_tokens");
    assert_eq!(mints.len(), 1, "the token is cached");
    let claims = verify_jwt(mints[0].authorization.as_deref().unwrap());
    assert_eq!(claims["iss"], "4242");
    assert_eq!(mints[0].body["repositories"], json!([REPO]));
    let listed = fake.requests_to(Method::GET, "/pulls");
    assert!(
        listed
            .iter()
            .all(|r| r.authorization.as_deref() == Some("Bearer ghs_installation1"))
    );

    // A 401 (revoked token) mints once more and retries once.
    fake.script(
        Method::GET,
        "/pulls",
        401,
        &[],
        json!({"message": "Bad credentials"}),
    );
    client.pulls_for_head("wi/x", "main").await.unwrap();
    assert_eq!(fake.requests_to(Method::POST, "/access_tokens").len(), 2);
    // A second 401 in a row is a refusal, not a loop.
    fake.script(
        Method::GET,
        "/pulls",
        401,
        &[],
        json!({"message": "Bad credentials"}),
    );
    fake.script(
        Method::GET,
        "/pulls",
        401,
        &[],
        json!({"message": "Bad credentials"}),
    );
    let e = client.pulls_for_head("wi/x", "main").await.unwrap_err();
    assert!(matches!(e, ForgeError::Refused { status: 401, .. }), "{e}");
    assert_eq!(fake.requests_to(Method::POST, "/access_tokens").len(), 3);

    // A token inside the refresh margin (5 min) is replaced before every use.
    fake.with(|m| m.token_lifetime_secs = 60);
    let short = app_client(&fake);
    short.pulls_for_head("wi/x", "main").await.unwrap();
    short.pulls_for_head("wi/x", "main").await.unwrap();
    assert_eq!(fake.requests_to(Method::POST, "/access_tokens").len(), 5);
    assert_eq!(
        fake.requests_to(Method::GET, "/pulls")
            .last()
            .unwrap()
            .authorization
            .as_deref(),
        Some("Bearer ghs_installation5")
    );
}

// === the adapter the engine uses ===

fn forge(fake: &Fake) -> GithubForge {
    let (client, _) = token_client(fake);
    GithubForge::new(
        Arc::new(client),
        "https://github.com/acme/widgets",
        Some("https://console.example/bwi/{name}".into()),
    )
}

fn request(id: &str) -> PullRequestMerge {
    PullRequestMerge {
        work_item_id: id.into(),
        head_branch: format!("wi/{id}-build"),
        base_branch: "main".into(),
        tested_head: TESTED.into(),
        merge_message: format!("Merge wi/{id}-build into main\n\nWork-Item: {id}"),
        summary: LandingSummary {
            change_set_id: Some("CS-00042".into()),
            product_tree_digest: "sha256:abc".into(),
            inspection_run_id: "run-1".into(),
            findings: 0,
            cycles: 1,
            evidence: vec![(
                "findings snapshot".into(),
                format!(".protobot/attestations/{id}/findings.jsonl"),
            )],
        },
    }
}

#[tokio::test]
async fn the_forge_opens_merges_and_reports_statuses_linking_the_work_item() {
    let fake = Fake::start().await;
    fake.with(|m| m.branch_heads.push(("wi/WI-5-build".into(), TESTED.into())));
    let forge = forge(&fake);
    let merged = forge.merge(&request("WI-5")).await.unwrap();
    assert_eq!(merged.merge_commit, "e".repeat(40));
    let put = fake.requests_to(Method::PUT, "/merge");
    assert_eq!(put.len(), 1);
    assert_eq!(put[0].body["sha"], TESTED);
    assert_eq!(put[0].body["merge_method"], "merge");
    assert_eq!(put[0].body["commit_title"], "Merge wi/WI-5-build into main");
    assert_eq!(put[0].body["commit_message"], "Work-Item: WI-5");
    let created = fake.requests_to(Method::POST, "/repos/acme/widgets/pulls");
    let body = created[0].body["body"].as_str().unwrap();
    assert!(body.contains(&format!("https://github.com/acme/widgets/blob/{TESTED}/.protobot/attestations/WI-5/findings.jsonl")), "{body}");
    assert!(body.contains("<!-- protobot:pull-request work-item=WI-5 -->"));
    let statuses = fake.with(|m| m.statuses.clone());
    let contexts: Vec<(String, String)> = statuses
        .iter()
        .map(|(_, b)| {
            (
                b["context"].as_str().unwrap().to_string(),
                b["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        contexts,
        [
            ("protobot/building", "success"),
            ("protobot/integration", "success"),
            ("protobot/inspection", "success"),
            ("protobot/merge", "pending"),
            ("protobot/merge", "success"),
        ]
        .map(|(c, s)| (c.to_string(), s.to_string()))
    );
    assert!(
        statuses
            .iter()
            .all(|(sha, b)| sha == TESTED && b["target_url"] == "https://console.example/bwi/WI-5")
    );
}

#[tokio::test]
async fn the_forge_maps_refusals_to_lifecycle_outcomes() {
    let fake = Fake::start().await;
    let forge = forge(&fake);
    // The pull request's head is not the tested head: revalidate.
    fake.add_pull("wi/WI-6-build", "main", &"9".repeat(40), "open", None);
    let r = forge.merge(&request("WI-6")).await.unwrap_err();
    assert!(matches!(r, ForgeRefusal::HeadMoved { .. }), "{r:?}");
    // A failing required check: blocked, with the check's name.
    fake.add_pull("wi/WI-7-build", "main", TESTED, "open", None);
    fake.script(
        Method::PUT,
        "/merge",
        405,
        &[],
        json!({"message": "Required status check \"ci/test\" is failing."}),
    );
    let r = forge.merge(&request("WI-7")).await.unwrap_err();
    match &r {
        ForgeRefusal::Blocked { reason } => assert!(reason.contains("ci/test"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let last = fake.with(|m| m.statuses.last().cloned()).unwrap();
    assert_eq!(
        (last.1["context"].as_str(), last.1["state"].as_str()),
        (Some("protobot/merge"), Some("failure"))
    );
    // A conflict whose earlier answer was lost: it merged, so it is reported merged.
    let n = fake.add_pull("wi/WI-8-build", "main", TESTED, "open", None);
    fake.with(|m| {
        m.scripted.push_back(support::Scripted {
            method: Method::PUT,
            path_suffix: format!("/pulls/{n}/merge"),
            status: axum::http::StatusCode::METHOD_NOT_ALLOWED,
            headers: vec![],
            body: json!({"message": "Pull Request is not mergeable"}),
            apply: true,
        })
    });
    let merged = forge.merge(&request("WI-8")).await.unwrap();
    assert_eq!(merged.pull_request, n);
    // GitHub down: unavailable (transient), nothing merged.
    for _ in 0..4 {
        fake.script(
            Method::GET,
            "/repos/acme/widgets/pulls",
            503,
            &[],
            json!({}),
        );
    }
    let r = tokio::time::timeout(Duration::from_secs(30), forge.merge(&request("WI-10")))
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(r, ForgeRefusal::Unavailable { .. }), "{r:?}");
    // Escalation through the adapter.
    forge
        .escalate(&EscalationRequest {
            work_item_id: "WI-7".into(),
            reason: r.to_string(),
            decision: "decide".into(),
        })
        .await
        .unwrap();
    assert_eq!(fake.with(|m| m.issues.len()), 1);
}
