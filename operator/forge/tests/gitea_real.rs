//! The Gitea forge judged by a real Gitea (scripts/gitea up): landing with the
//! `head_commit_id` guard, a head pushed after the tests, the default branch moving first
//! under "block on outdated branch", a required status context missing then reported (and
//! missing until the deadline, then reported to a person), a conflicted pull request (405
//! "Please try again later", retried, then the conflict path), a review arriving, one escalation
//! issue across retries, and a change set's registration checked through Gitea's
//! commit → pull lookup and the pull request's reviews; the bot's token serves git over HTTP
//! as the password of `x-access-token` (what the operator's git transport sends).
//!
//! Each test makes its own repository (owned by the admin; the bot and the reviewer are
//! collaborators with write access) and commits through Gitea's contents API, so no git
//! client is involved. Without a configured Gitea (`PROTOBOT_GITEA_ENV`, the file `scripts/gitea
//! up` prints, or the `PROTOBOT_GITEA_*` variables) each test prints why and passes; with
//! `PROTOBOT_REQUIRE_GITEA=1` it fails instead (CI sets it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use base64::Engine;
use http::{Method, StatusCode, header};
use http_body_util::BodyExt;
use protobot_forge::{
    GiteaClient, GiteaForge, GiteaSettings,
    core::{
        approval::{ApprovalClaim, ApprovalRefusal, ReaskPolicy, ReviewMode},
        coordinates::RepoCoordinates,
        escalation::{ESCALATION_LABEL, marker},
        merge::MergePolicy,
    },
    gitea::api_root,
};
use protobot_jobsite::landing::{
    EscalationRequest, ForgeRefusal, LandingSummary, PullRequestForge, PullRequestMerge,
};
use protobot_repo::remote::Sensitive;
use serde_json::{Value, json};

/// What `scripts/gitea up` wrote.
#[derive(Clone, Debug)]
struct Env {
    url: String,
    version: String,
    admin: (String, String),
    bot: (String, String),
    reviewer: (String, String),
}

fn env() -> Option<Env> {
    let mut vars: BTreeMap<String, String> = std::env::vars().collect();
    if let Ok(file) = std::env::var("PROTOBOT_GITEA_ENV") {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("PROTOBOT_GITEA_ENV={file} cannot be read: {e}"));
        for line in text.lines() {
            if let Some((k, v)) = line.split_once('=') {
                vars.insert(k.trim().to_string(), v.trim().to_string());
            }
        }
    }
    let get = |k: &str| vars.get(k).cloned();
    let found = (|| {
        Some(Env {
            url: get("PROTOBOT_GITEA_URL")?,
            version: get("PROTOBOT_GITEA_VERSION").unwrap_or_default(),
            admin: (
                get("PROTOBOT_GITEA_ADMIN")?,
                get("PROTOBOT_GITEA_ADMIN_TOKEN")?,
            ),
            bot: (get("PROTOBOT_GITEA_BOT")?, get("PROTOBOT_GITEA_BOT_TOKEN")?),
            reviewer: (
                get("PROTOBOT_GITEA_REVIEWER")?,
                get("PROTOBOT_GITEA_REVIEWER_TOKEN")?,
            ),
        })
    })();
    if found.is_none() {
        let reason = "no Gitea configured (run `scripts/gitea up` and set PROTOBOT_GITEA_ENV to the file it prints)";
        if std::env::var("PROTOBOT_REQUIRE_GITEA").as_deref() == Ok("1") {
            panic!("PROTOBOT_REQUIRE_GITEA=1 but {reason}");
        }
        eprintln!("skipped: {reason}");
    }
    found
}

/// A plain API caller acting as one user (the test's own hands on Gitea).
struct As {
    http: octocrab::Octocrab,
    token: String,
}

impl As {
    fn new(env: &Env, token: &str) -> As {
        As {
            http: octocrab::Octocrab::builder()
                .base_uri(format!("{}/api/v1", env.url))
                .unwrap()
                .build()
                .unwrap(),
            token: token.to_string(),
        }
    }

    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut request = self
            .http
            .build_request(
                http::Request::builder()
                    .method(method.clone())
                    .uri(path)
                    .header(header::ACCEPT, "application/json"),
                body.as_ref(),
            )
            .unwrap();
        request.headers_mut().insert(
            header::AUTHORIZATION,
            format!("token {}", self.token).parse().unwrap(),
        );
        let response = self.http.execute(request).await.unwrap();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, value)
    }

    async fn ok(&self, method: Method, path: &str, body: Option<Value>) -> Value {
        let (status, value) = self.call(method.clone(), path, body).await;
        assert!(status.is_success(), "{method} {path}: {status} {value}");
        value
    }
}

/// One test's repository on the real Gitea.
struct Repo {
    env: Env,
    owner: String,
    name: String,
    admin: As,
    reviewer: As,
}

impl Repo {
    async fn new(env: &Env, scenario: &str) -> Repo {
        let admin = As::new(env, &env.admin.1);
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            % 1_000_000_000;
        let name = format!("{scenario}-{nonce}");
        admin
            .ok(
                Method::POST,
                "/user/repos",
                Some(json!({"name": name, "auto_init": true, "default_branch": "main", "private": false})),
            )
            .await;
        let owner = env.admin.0.clone();
        for user in [&env.bot.0, &env.reviewer.0] {
            admin
                .ok(
                    Method::PUT,
                    &format!("/repos/{owner}/{name}/collaborators/{user}"),
                    Some(json!({"permission": "write"})),
                )
                .await;
        }
        eprintln!(
            "gitea {} at {}: repository {owner}/{name}",
            env.version, env.url
        );
        Repo {
            env: env.clone(),
            owner,
            name,
            admin,
            reviewer: As::new(env, &env.reviewer.1),
        }
    }

    fn route(&self) -> String {
        format!("/repos/{}/{}", self.owner, self.name)
    }

    /// Commits a new file on `branch` (created from `from` when given) as the admin; returns
    /// the commit.
    async fn commit(&self, branch: &str, from: Option<&str>, file: &str) -> String {
        self.commit_text(branch, from, file, &format!("{file}\n"))
            .await
    }

    /// [`Repo::commit`] with the file's text.
    async fn commit_text(
        &self,
        branch: &str,
        from: Option<&str>,
        file: &str,
        text: &str,
    ) -> String {
        let mut body = json!({
            "content": base64::engine::general_purpose::STANDARD.encode(text),
            "message": format!("add {file}"),
        });
        match from {
            Some(base) => {
                body["branch"] = json!(base);
                body["new_branch"] = json!(branch);
            }
            None => body["branch"] = json!(branch),
        }
        let v = self
            .admin
            .ok(
                Method::POST,
                &format!("{}/contents/{file}", self.route()),
                Some(body),
            )
            .await;
        v["commit"]["sha"].as_str().unwrap().to_string()
    }

    async fn branch_head(&self, branch: &str) -> String {
        let v = self
            .admin
            .ok(
                Method::GET,
                &format!("{}/branches/{branch}", self.route()),
                None,
            )
            .await;
        v["commit"]["id"].as_str().unwrap().to_string()
    }

    async fn protect(&self, rule: Value) {
        let mut rule = rule;
        rule["rule_name"] = json!("main");
        rule["enable_push"] = json!(true);
        self.admin
            .ok(
                Method::POST,
                &format!("{}/branch_protections", self.route()),
                Some(rule),
            )
            .await;
    }

    async fn pull(&self, number: u64) -> Value {
        self.admin
            .ok(
                Method::GET,
                &format!("{}/pulls/{number}", self.route()),
                None,
            )
            .await
    }

    async fn set_status(&self, sha: &str, context: &str, state: &str) {
        self.admin
            .ok(
                Method::POST,
                &format!("{}/statuses/{sha}", self.route()),
                Some(json!({"state": state, "context": context, "description": "test CI"})),
            )
            .await;
    }

    /// The bot's client, with `merge` as the merge policy.
    fn client(&self, merge: MergePolicy) -> Arc<GiteaClient> {
        let mut settings = GiteaSettings::new(
            api_root(&self.env.url).unwrap(),
            RepoCoordinates::new(&self.owner, &self.name).unwrap(),
        );
        settings.merge = merge;
        settings.reask = ReaskPolicy {
            reasks: 1,
            first_wait: Duration::from_millis(200),
        };
        Arc::new(
            GiteaClient::new(
                settings,
                Sensitive::new(self.env.bot.1.clone().into_bytes()),
                "test/bot-token",
                None,
            )
            .unwrap(),
        )
    }

    fn forge(&self, merge: MergePolicy) -> GiteaForge {
        GiteaForge::new(
            self.client(merge),
            &format!("{}/{}/{}", self.env.url, self.owner, self.name),
            None,
        )
    }
}

fn quick() -> MergePolicy {
    MergePolicy {
        transient_retries: 6,
        first_wait: Duration::from_millis(300),
        max_wait: Duration::from_secs(2),
        checks_deadline: Duration::from_secs(60),
        checks_poll: Duration::from_millis(500),
    }
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

/// Every issue of the repository (pull requests excluded).
async fn issues(repo: &Repo) -> Vec<Value> {
    repo.admin
        .ok(
            Method::GET,
            &format!("{}/issues?state=all&type=issues&limit=50", repo.route()),
            None,
        )
        .await
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The open pull requests of the repository (the test reads them as the admin).
async fn pulls(repo: &Repo) -> Vec<Value> {
    repo.admin
        .ok(
            Method::GET,
            &format!("{}/pulls?state=all&limit=50", repo.route()),
            None,
        )
        .await
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn a_work_item_lands_with_the_head_guard_as_a_two_parent_merge_of_the_tested_head() {
    let Some(env) = env() else { return };
    let repo = Repo::new(&env, "land").await;
    let tested = repo
        .commit("wi/WI-1-build", Some("main"), "feature.txt")
        .await;
    // The default branch moves on (no conflict, no protection): Gitea merges into it.
    let moved_main = repo.commit("main", None, "unrelated.txt").await;
    let forge = repo.forge(quick());
    let merged = forge.merge(&request("WI-1", &tested)).await.unwrap();
    let commit = repo
        .admin
        .ok(
            Method::GET,
            &format!("{}/git/commits/{}", repo.route(), merged.merge_commit),
            None,
        )
        .await;
    let parents: Vec<&str> = commit["parents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["sha"].as_str().unwrap())
        .collect();
    assert_eq!(parents, vec![moved_main.as_str(), tested.as_str()]);
    assert_eq!(repo.branch_head("main").await, merged.merge_commit);
    assert!(
        commit["commit"]["message"]
            .as_str()
            .unwrap()
            .contains("Work-Item: WI-1"),
        "{commit}"
    );
    // The stage statuses are on the tested head, the merge's last.
    let statuses = repo
        .admin
        .ok(
            Method::GET,
            &format!("{}/commits/{tested}/status", repo.route()),
            None,
        )
        .await;
    let merge_status = statuses["statuses"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["context"] == "protobot/merge")
        .cloned()
        .unwrap();
    assert_eq!(merge_status["status"], "success");
    // Landing again (a rerun after a crash) reports the same merge, opening nothing.
    let again = forge.merge(&request("WI-1", &tested)).await.unwrap();
    assert_eq!(again, merged);
    assert_eq!(pulls(&repo).await.len(), 1);
}

#[tokio::test]
async fn a_head_pushed_after_the_tests_is_refused_by_the_guard_and_revalidates() {
    let Some(env) = env() else { return };
    let repo = Repo::new(&env, "guard").await;
    let tested = repo.commit("wi/WI-2-build", Some("main"), "a.txt").await;
    let pushed_later = repo.commit("wi/WI-2-build", None, "b.txt").await;
    let main_before = repo.branch_head("main").await;
    let forge = repo.forge(quick());
    let refusal = forge.merge(&request("WI-2", &tested)).await.unwrap_err();
    assert!(
        matches!(refusal, ForgeRefusal::HeadMoved { .. }),
        "{refusal:?}"
    );
    assert_eq!(
        repo.branch_head("main").await,
        main_before,
        "nothing merged"
    );
    let pull = &pulls(&repo).await[0];
    assert_eq!(pull["merged"], false);
    assert_eq!(pull["head"]["sha"], pushed_later.as_str());
}

#[tokio::test]
async fn the_default_branch_moving_first_revalidates_then_the_new_head_lands() {
    let Some(env) = env() else { return };
    let repo = Repo::new(&env, "behind").await;
    repo.protect(json!({"block_on_outdated_branch": true}))
        .await;
    let tested = repo.commit("wi/WI-3-build", Some("main"), "c.txt").await;
    let moved = repo.commit("main", None, "d.txt").await;
    let forge = repo.forge(quick());
    let refusal = forge.merge(&request("WI-3", &tested)).await.unwrap_err();
    let ForgeRefusal::HeadMoved { reason } = &refusal else {
        panic!("{refusal:?}")
    };
    assert!(reason.contains("behind"), "{reason}");
    assert_eq!(repo.branch_head("main").await, moved, "nothing merged");
    // Revalidation: the default branch merged into the work item's branch (Gitea's "update
    // branch"), a new tested head, landed with it as the guard.
    let number = pulls(&repo).await[0]["number"].as_u64().unwrap();
    repo.admin
        .ok(
            Method::POST,
            &format!("{}/pulls/{number}/update?style=merge", repo.route()),
            None,
        )
        .await;
    let retested = repo.branch_head("wi/WI-3-build").await;
    assert_ne!(retested, tested);
    let merged = forge.merge(&request("WI-3", &retested)).await.unwrap();
    assert_eq!(merged.pull_request, number);
    assert_eq!(repo.branch_head("main").await, merged.merge_commit);
}

#[tokio::test]
async fn a_conflict_answered_please_try_again_later_is_retried_then_takes_the_conflict_path() {
    let Some(env) = env() else { return };
    let repo = Repo::new(&env, "conflict").await;
    let tested = repo
        .commit_text(
            "wi/WI-9-build",
            Some("main"),
            "same.txt",
            "the work item's\n",
        )
        .await;
    let moved = repo
        .commit_text("main", None, "same.txt", "someone else's\n")
        .await;
    let forge = repo.forge(MergePolicy {
        transient_retries: 2,
        ..quick()
    });
    let refusal = forge.merge(&request("WI-9", &tested)).await.unwrap_err();
    let ForgeRefusal::Conflict { reason } = &refusal else {
        panic!("{refusal:?}")
    };
    // Gitea's answer to a conflicted pull request, asked again before it was believed.
    assert!(
        reason.contains("Please try again later") && reason.contains("asked 3 times"),
        "{reason}"
    );
    assert_eq!(repo.branch_head("main").await, moved, "nothing merged");
    assert_eq!(pulls(&repo).await[0]["mergeable"], false);
}

#[tokio::test]
async fn a_required_context_missing_is_awaited_and_the_merge_lands_once_it_reports() {
    let Some(env) = env() else { return };
    let repo = Repo::new(&env, "checks").await;
    repo.protect(json!({"enable_status_check": true, "status_check_contexts": ["ci/test"]}))
        .await;
    let tested = repo.commit("wi/WI-4-build", Some("main"), "e.txt").await;
    let forge = Arc::new(repo.forge(quick()));
    let waits = forge.waits();
    let landing = tokio::spawn({
        let forge = Arc::clone(&forge);
        let req = request("WI-4", &tested);
        async move { forge.merge(&req).await }
    });
    // The landing waits, and shows it.
    let mut shown = None;
    for _ in 0..200 {
        if let Some(w) = waits.of("WI-4") {
            shown = Some(w);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let shown = shown.expect("the landing never showed a checks wait");
    assert_eq!(shown.tested_head, tested);
    assert!(!landing.is_finished());
    assert_eq!(repo.branch_head("main").await.len(), 40);
    repo.set_status(&tested, "ci/test", "success").await;
    let merged = tokio::time::timeout(Duration::from_secs(60), landing)
        .await
        .expect("the landing did not end after the check reported")
        .unwrap()
        .unwrap();
    assert_eq!(repo.branch_head("main").await, merged.merge_commit);
    assert!(waits.of("WI-4").is_none(), "the wait is cleared");
}

#[tokio::test]
async fn a_required_context_that_never_reports_or_fails_is_reported_to_a_person() {
    let Some(env) = env() else { return };
    let repo = Repo::new(&env, "deadline").await;
    repo.protect(json!({"enable_status_check": true, "status_check_contexts": ["ci/test"]}))
        .await;
    let main_before = repo.branch_head("main").await;
    let tested = repo.commit("wi/WI-5-build", Some("main"), "f.txt").await;
    let short = MergePolicy {
        checks_deadline: Duration::from_secs(3),
        ..quick()
    };
    let forge = repo.forge(short);
    let refusal = forge.merge(&request("WI-5", &tested)).await.unwrap_err();
    let ForgeRefusal::Blocked { reason } = &refusal else {
        panic!("{refusal:?}")
    };
    assert!(
        reason.contains("did not report success") && reason.contains("protobot retry"),
        "{reason}"
    );
    // A failing context blocks at once, naming it.
    repo.set_status(&tested, "ci/test", "failure").await;
    let refusal = forge.merge(&request("WI-5", &tested)).await.unwrap_err();
    let ForgeRefusal::Blocked { reason } = &refusal else {
        panic!("{refusal:?}")
    };
    assert!(
        reason.contains("\"ci/test\"") && reason.contains("failed"),
        "{reason}"
    );
    assert_eq!(
        repo.branch_head("main").await,
        main_before,
        "nothing merged"
    );
}

#[tokio::test]
async fn required_approvals_block_until_a_review_arrives_then_the_merge_lands() {
    let Some(env) = env() else { return };
    let repo = Repo::new(&env, "review").await;
    repo.protect(json!({"required_approvals": 1})).await;
    let tested = repo.commit("wi/WI-6-build", Some("main"), "g.txt").await;
    let forge = repo.forge(quick());
    let refusal = forge.merge(&request("WI-6", &tested)).await.unwrap_err();
    let ForgeRefusal::Blocked { reason } = &refusal else {
        panic!("{refusal:?}")
    };
    assert!(reason.contains("approvals"), "{reason}");
    let number = pulls(&repo).await[0]["number"].as_u64().unwrap();
    repo.reviewer
        .ok(
            Method::POST,
            &format!("{}/pulls/{number}/reviews", repo.route()),
            Some(json!({"event": "APPROVED", "body": "looks right", "commit_id": tested})),
        )
        .await;
    let merged = forge.merge(&request("WI-6", &tested)).await.unwrap();
    assert_eq!(merged.pull_request, number);
    assert_eq!(repo.pull(number).await["merged"], true);
}

#[tokio::test]
async fn one_escalation_issue_per_work_item_across_retries_labelled_by_id_and_reopened() {
    let Some(env) = env() else { return };
    let repo = Repo::new(&env, "escalate").await;
    let forge = repo.forge(quick());
    let ask = |id: &str, reason: &str| EscalationRequest {
        work_item_id: id.into(),
        reason: reason.into(),
        decision: "retry or abandon".into(),
    };
    for n in 1..=3 {
        forge
            .escalate(&ask("WI-7", &format!("blocked, attempt {n}")))
            .await
            .unwrap();
    }
    let listed = issues(&repo).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let issue = &listed[0];
    let body = issue["body"].as_str().unwrap();
    assert!(body.contains("blocked, attempt 3") && body.contains(&marker("WI-7")));
    assert_eq!(issue["labels"][0]["name"], ESCALATION_LABEL);
    let number = issue["number"].as_u64().unwrap();
    // Closed by a person, escalated again: the same issue reopens.
    repo.admin
        .ok(
            Method::PATCH,
            &format!("{}/issues/{number}", repo.route()),
            Some(json!({"state": "closed"})),
        )
        .await;
    forge.escalate(&ask("WI-7", "blocked again")).await.unwrap();
    forge.escalate(&ask("WI-8", "another item")).await.unwrap();
    let listed = issues(&repo).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let reopened = listed
        .iter()
        .find(|i| i["number"].as_u64() == Some(number))
        .unwrap();
    assert_eq!(reopened["state"], "open");
    // Both carry the one label, created once.
    let labels = repo
        .admin
        .ok(Method::GET, &format!("{}/labels", repo.route()), None)
        .await;
    assert_eq!(labels.as_array().unwrap().len(), 1, "{labels}");
}

#[tokio::test]
async fn a_change_set_registration_is_checked_through_the_commit_pull_lookup_and_reviews() {
    let Some(env) = env() else { return };
    let repo = Repo::new(&env, "approval").await;
    let author = As::new(&env, &env.bot.1);
    // Change set CS-00042: a branch, a pull request by the bot, the reviewer's approval of its
    // head, merged by the admin.
    let head = repo
        .commit("cs/00042-widgets", Some("main"), "spec.txt")
        .await;
    let pr = author
        .ok(
            Method::POST,
            &format!("{}/pulls", repo.route()),
            Some(json!({"title": "CS-00042", "head": "cs/00042-widgets", "base": "main"})),
        )
        .await;
    let number = pr["number"].as_u64().unwrap();
    repo.reviewer
        .ok(
            Method::POST,
            &format!("{}/pulls/{number}/reviews", repo.route()),
            Some(json!({"event": "APPROVED", "body": "approved", "commit_id": head})),
        )
        .await;
    merge_as_admin(&repo, number).await;
    let merge_commit = repo.pull(number).await["merge_commit_sha"]
        .as_str()
        .unwrap()
        .to_string();
    let client = repo.client(quick());
    let claim = |cs: &str, merge: &str, mode| ApprovalClaim {
        change_set_id: cs.into(),
        merge_commit: merge.into(),
        default_branch: "main".into(),
        branch_prefix: "cs/".into(),
        repository: RepoCoordinates::new(&repo.owner, &repo.name).unwrap(),
        review_mode: mode,
    };
    let approved = client
        .approved_merge(&claim("CS-00042", &merge_commit, ReviewMode::MultiPlayer))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(approved.number(), number);
    assert_eq!(approved.approvers(), std::slice::from_ref(&env.reviewer.0));
    // CS-00043 merged without a review: NOT_APPROVED under multi-player, approved under
    // single-player.
    repo.commit("cs/00043-more", Some("main"), "more.txt").await;
    let pr = author
        .ok(
            Method::POST,
            &format!("{}/pulls", repo.route()),
            Some(json!({"title": "CS-00043", "head": "cs/00043-more", "base": "main"})),
        )
        .await;
    let unreviewed = pr["number"].as_u64().unwrap();
    merge_as_admin(&repo, unreviewed).await;
    let unreviewed_merge = repo.pull(unreviewed).await["merge_commit_sha"]
        .as_str()
        .unwrap()
        .to_string();
    let refusal = client
        .approved_merge(&claim(
            "CS-00043",
            &unreviewed_merge,
            ReviewMode::MultiPlayer,
        ))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(refusal, ApprovalRefusal::ReviewMissing { .. }),
        "{refusal:?}"
    );
    assert_eq!(refusal.code(), "NOT_APPROVED");
    assert!(
        client
            .approved_merge(&claim(
                "CS-00043",
                &unreviewed_merge,
                ReviewMode::SinglePlayer
            ))
            .await
            .unwrap()
            .is_ok()
    );
    // A commit no pull request merged (pushed straight to main): NOT_APPROVED.
    let direct = repo.commit("main", None, "direct.txt").await;
    let refusal = client
        .approved_merge(&claim("CS-00044", &direct, ReviewMode::SinglePlayer))
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(refusal, ApprovalRefusal::NotApproved { .. }),
        "{refusal:?}"
    );
    // The change set's pull request merged as another commit than the one claimed.
    let refusal = client
        .approved_merge(&claim(
            "CS-00042",
            &unreviewed_merge,
            ReviewMode::SinglePlayer,
        ))
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(refusal.code(), "NOT_APPROVED", "{refusal:?}");
}

/// Merges pull request `number` as the admin (retrying while Gitea still checks it).
async fn merge_as_admin(repo: &Repo, number: u64) {
    for _ in 0..60 {
        let (status, body) = repo
            .admin
            .call(
                Method::POST,
                &format!("{}/pulls/{number}/merge", repo.route()),
                Some(json!({"Do": "merge"})),
            )
            .await;
        if status.is_success() {
            return;
        }
        assert!(
            status == StatusCode::METHOD_NOT_ALLOWED || status.is_server_error(),
            "merge #{number}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("pull request #{number} never merged");
}

/// The forge's token serves git: a clone and a push as `x-access-token` with the bot's token
/// as the password (the user the operator's git transport sends), and a wrong token refused.
#[tokio::test]
async fn the_bot_token_serves_git_over_http_as_the_x_access_token_password() {
    let Some(env) = env() else { return };
    let repo = Repo::new(&env, "git").await;
    // A private repository: anonymous git is refused, the token is needed.
    repo.admin
        .ok(Method::PATCH, &repo.route(), Some(json!({"private": true})))
        .await;
    let url = format!("{}/{}/{}.git", env.url, repo.owner, repo.name);
    let tmp = tempfile::tempdir().unwrap();
    let git = |token: &str, args: &[&str]| {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!(
            "{}:{token}",
            protobot_repo::remote::DEFAULT_TOKEN_USERNAME
        ));
        std::process::Command::new("git")
            .arg("-c")
            .arg(format!("http.extraHeader=Authorization: Basic {basic}"))
            .args(args)
            .current_dir(tmp.path())
            .env("GIT_TERMINAL_PROMPT", "0")
            .output()
            .unwrap()
    };
    let refused = git("not-a-token", &["clone", "-q", &url, "refused"]);
    assert!(!refused.status.success(), "a wrong token cloned");
    let cloned = git(&env.bot.1, &["clone", "-q", &url, "work"]);
    assert!(
        cloned.status.success(),
        "{}",
        String::from_utf8_lossy(&cloned.stderr)
    );
    let work = tmp.path().join("work");
    let run = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=bot", "-c", "user.email=bot@protobot.test"])
            .args(args)
            .current_dir(&work)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    std::fs::write(work.join("pushed.txt"), "over http\n").unwrap();
    run(&["add", "pushed.txt"]);
    run(&["commit", "-q", "-m", "pushed with the token"]);
    let head = run(&["rev-parse", "HEAD"]);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!(
        "{}:{}",
        protobot_repo::remote::DEFAULT_TOKEN_USERNAME,
        env.bot.1
    ));
    run(&[
        "-c",
        &format!("http.extraHeader=Authorization: Basic {basic}"),
        "push",
        "-q",
        "origin",
        "HEAD:refs/heads/wi/WI-10-build",
    ]);
    // Gitea saw the push (its hooks ran): the branch is known to its API at that commit.
    assert_eq!(repo.branch_head("wi/WI-10-build").await, head);
}
