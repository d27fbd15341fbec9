//! The Gitea landing against a small scripted Gitea double: the answers a real Gitea gives
//! only under a race or a fault, which `gitea_real.rs` cannot provoke on demand.
//!
//! - a 500, then 200: retried, lands;
//! - a merge whose answer was lost (500, but the pull request merged): reported as merged,
//!   never sent again;
//! - 409 "head out of date" while the head branch already is the tested head (Gitea's pull
//!   request lags behind the push): retried, lands with the same guard;
//! - 200 with an empty body: the merge commit comes from the pull request;
//! - the pull-request list holds every pull request (Gitea ignores `head=`): the landing
//!   picks its own, never another branch's or a fork's;
//! - 500 on every merge: unavailable, nothing reported merged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, Method, StatusCode, Uri},
    response::{IntoResponse, Response},
};
use protobot_forge::{
    GiteaClient, GiteaForge, GiteaSettings,
    core::{coordinates::RepoCoordinates, merge::MergePolicy},
    gitea::api_root,
};
use protobot_jobsite::landing::{ForgeRefusal, LandingSummary, PullRequestForge, PullRequestMerge};
use protobot_repo::remote::Sensitive;
use serde_json::{Value, json};

const TESTED: &str = "1111111111111111111111111111111111111111";
const OLD_HEAD: &str = "0000000000000000000000000000000000000000";
const MERGE_COMMIT: &str = "9999999999999999999999999999999999999999";
const TOKEN: &str = "gitea-double-token";

/// What the double answers and records.
#[derive(Default)]
struct Model {
    /// Answers to the merge requests, in order (status, body); when empty: 200.
    merge_answers: VecDeque<(u16, String)>,
    /// Whether the pull request reads as merged after merge request `n` (1-based).
    merged_after: Option<usize>,
    /// The head the pull request reports until merge request `n`, then the tested head.
    lagging_head_until: Option<usize>,
    merges: Vec<Value>,
    creates: usize,
    /// Requests to routes the double does not serve, or without the token.
    strays: Vec<String>,
}

type Shared = Arc<Mutex<Model>>;

fn pull_json(number: u64, head: &str, repo: &str, sha: &str, merged: bool) -> Value {
    json!({
        "number": number, "state": if merged { "closed" } else { "open" },
        "merged": merged,
        "merged_at": if merged { json!("2026-12-07T00:00:00Z") } else { Value::Null },
        "merge_commit_sha": if merged { json!(MERGE_COMMIT) } else { Value::Null },
        "mergeable": true,
        "head": {"ref": head, "sha": sha, "repo": {"full_name": repo}},
        "base": {"ref": "main", "sha": OLD_HEAD, "repo": {"full_name": "acme/widgets"}},
        "user": {"login": "protobot-bot"},
        "html_url": format!("http://gitea.invalid/acme/widgets/pulls/{number}"),
    })
}

async fn handle(
    State(model): State<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let mut m = model.lock().unwrap();
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("token {TOKEN}"))
    {
        m.strays.push(format!("{method} {uri} without the token"));
        return (StatusCode::UNAUTHORIZED, "{}").into_response();
    }
    let path = uri.path().trim_start_matches("/api/v1/repos/acme/widgets");
    let merged = m.merged_after.is_some_and(|n| m.merges.len() >= n);
    let head = if m.lagging_head_until.is_some_and(|n| m.merges.len() < n) {
        OLD_HEAD
    } else {
        TESTED
    };
    let json = |status: u16, v: Value| {
        (StatusCode::from_u16(status).unwrap(), v.to_string()).into_response()
    };
    match (method.as_str(), path) {
        ("GET", "/pulls") => {
            // Gitea ignores `head=`: every pull request, ours (#7) among others.
            let page = uri.query().unwrap_or_default().contains("page=1");
            if !page {
                return json(200, json!([]));
            }
            json(
                200,
                json!([
                    pull_json(5, "wi/WI-2-other", "acme/widgets", OLD_HEAD, false),
                    pull_json(6, "wi/WI-1-build", "mallory/widgets", OLD_HEAD, false),
                    pull_json(7, "wi/WI-1-build", "acme/widgets", head, merged),
                ]),
            )
        }
        ("PATCH", "/pulls/7") => json(
            201,
            pull_json(7, "wi/WI-1-build", "acme/widgets", head, merged),
        ),
        ("POST", "/pulls") => {
            m.creates += 1;
            json(409, json!({"message": "pull request already exists"}))
        }
        ("POST", "/pulls/7/merge") => {
            m.merges
                .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
            let (status, body) = m.merge_answers.pop_front().unwrap_or((200, String::new()));
            (StatusCode::from_u16(status).unwrap(), body).into_response()
        }
        ("GET", "/pulls/7") => json(
            200,
            pull_json(7, "wi/WI-1-build", "acme/widgets", head, merged),
        ),
        ("GET", "/branches/wi/WI-1-build") => json(200, json!({"commit": {"id": TESTED}})),
        ("POST", p) if p.starts_with("/statuses/") => json(201, json!({})),
        _ => {
            m.strays.push(format!("{method} {uri}"));
            json(404, json!({"message": format!("no route {method} {path}")}))
        }
    }
}

async fn double(model: Model) -> (Shared, String) {
    let shared = Arc::new(Mutex::new(model));
    let app = Router::new().fallback(handle).with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (shared, format!("http://{addr}"))
}

fn forge(base: &str) -> GiteaForge {
    let mut settings = GiteaSettings::new(
        api_root(base).unwrap(),
        RepoCoordinates::new("acme", "widgets").unwrap(),
    );
    settings.merge = MergePolicy {
        transient_retries: 3,
        first_wait: Duration::from_millis(10),
        max_wait: Duration::from_millis(40),
        checks_deadline: Duration::from_secs(1),
        checks_poll: Duration::from_millis(50),
    };
    let client = GiteaClient::new(
        settings,
        Sensitive::new(TOKEN.as_bytes().to_vec()),
        "test/token",
        None,
    )
    .unwrap();
    GiteaForge::new(Arc::new(client), &format!("{base}/acme/widgets"), None)
}

fn request() -> PullRequestMerge {
    PullRequestMerge {
        work_item_id: "WI-1".into(),
        head_branch: "wi/WI-1-build".into(),
        base_branch: "main".into(),
        tested_head: TESTED.into(),
        merge_message: "Merge wi/WI-1-build into main\n\nWork-Item: WI-1".into(),
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

#[tokio::test]
async fn a_500_is_retried_and_the_empty_200_lands_with_the_pull_requests_commit() {
    let (model, base) = double(Model {
        merge_answers: VecDeque::from([(500, String::new()), (200, String::new())]),
        merged_after: Some(2),
        ..Model::default()
    })
    .await;
    let merged = forge(&base).merge(&request()).await.unwrap();
    assert_eq!(merged.pull_request, 7, "not another branch's or a fork's");
    assert_eq!(merged.merge_commit, MERGE_COMMIT);
    let m = model.lock().unwrap();
    assert_eq!(m.merges.len(), 2);
    assert_eq!(m.creates, 0, "the open pull request is reused");
    for sent in &m.merges {
        assert_eq!(sent["Do"], "merge");
        assert_eq!(sent["head_commit_id"], TESTED);
        assert_eq!(sent["MergeMessageField"], "Work-Item: WI-1");
    }
    assert!(m.strays.is_empty(), "{:?}", m.strays);
}

#[tokio::test]
async fn a_merge_whose_answer_was_lost_is_reported_merged_and_not_sent_again() {
    let (model, base) = double(Model {
        merge_answers: VecDeque::from([(500, String::new())]),
        merged_after: Some(1),
        ..Model::default()
    })
    .await;
    let merged = forge(&base).merge(&request()).await.unwrap();
    assert_eq!(merged.merge_commit, MERGE_COMMIT);
    assert_eq!(model.lock().unwrap().merges.len(), 1);
}

#[tokio::test]
async fn head_out_of_date_while_the_branch_is_already_the_tested_head_is_retried_with_the_same_guard()
 {
    let (model, base) = double(Model {
        merge_answers: VecDeque::from([(409, r#"{"message":"head out of date"}"#.to_string())]),
        lagging_head_until: Some(2),
        merged_after: Some(2),
        ..Model::default()
    })
    .await;
    let merged = forge(&base).merge(&request()).await.unwrap();
    assert_eq!(merged.merge_commit, MERGE_COMMIT);
    let m = model.lock().unwrap();
    assert_eq!(m.merges.len(), 2);
    assert!(m.merges.iter().all(|s| s["head_commit_id"] == TESTED));
    assert!(m.strays.is_empty(), "{:?}", m.strays);
}

#[tokio::test]
async fn server_errors_on_every_merge_end_unavailable_with_nothing_merged() {
    let (model, base) = double(Model {
        merge_answers: VecDeque::from(vec![(500, String::new()); 10]),
        ..Model::default()
    })
    .await;
    let refusal = forge(&base).merge(&request()).await.unwrap_err();
    let ForgeRefusal::Unavailable { reason } = &refusal else {
        panic!("{refusal:?}")
    };
    assert!(reason.contains("asked 4 times"), "{reason}");
    assert_eq!(model.lock().unwrap().merges.len(), 4);
}
