//! A token appears nowhere but in the `Authorization` header: not in any log line (every
//! level, every target, captured), not in any error's `Display` or `Debug`, not in the
//! client's or the credentials' `Debug`, not in anything written to GitHub (pull requests,
//! statuses, issues) — for a token Secret and for a GitHub App's installation tokens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::{
    io,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::http::Method;
use protobot_forge::{
    ForgeError, GithubClient, GithubForge, GithubSettings,
    auth::{AppKey, Credentials},
    core::{
        coordinates::{ApiBase, RepoCoordinates},
        escalation::Escalation,
    },
};
use protobot_jobsite::landing::{LandingSummary, PullRequestForge, PullRequestMerge};
use protobot_repo::remote::Sensitive;
use serde_json::json;
use support::{Fake, OWNER, REPO};

const TOKEN: &str = "ghp_LEAKCANARY7f3a9c2e1b0d";

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

fn settings(base: &str) -> GithubSettings {
    let mut s = GithubSettings::new(
        ApiBase::parse(base).unwrap(),
        RepoCoordinates::new(OWNER, REPO).unwrap(),
    );
    s.timeout = Duration::from_secs(2);
    s.pacing.min_spacing = Duration::ZERO;
    s
}

/// Every call, success and failure, with `client`; returns every error seen.
async fn exercise(fake: &Fake, client: Arc<GithubClient>) -> Vec<ForgeError> {
    let mut errors = Vec::new();
    let tested = "1".repeat(40);
    fake.with(|m| {
        m.branch_heads
            .push(("wi/WI-1-build".into(), tested.clone()))
    });
    let forge = GithubForge::new(client.clone(), "https://github.com/acme/widgets", None);
    let request = PullRequestMerge {
        work_item_id: "WI-1".into(),
        head_branch: "wi/WI-1-build".into(),
        base_branch: "main".into(),
        tested_head: tested.clone(),
        merge_message: "Merge\n\nWork-Item: WI-1".into(),
        summary: LandingSummary {
            change_set_id: None,
            product_tree_digest: "sha256:x".into(),
            inspection_run_id: "r".into(),
            findings: 0,
            cycles: 1,
            evidence: vec![],
        },
    };
    fake.script(
        Method::PUT,
        "/merge",
        405,
        &[],
        json!({"message": "Required status check \"ci\" is failing."}),
    );
    let refusal = forge.merge(&request).await.unwrap_err();
    assert!(!format!("{refusal} {refusal:?}").contains(TOKEN));
    let _ = forge.merge(&request).await;
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
    errors.extend(client.pulls_for_head("wi/x", "main").await.err());
    fake.script(Method::GET, "/pulls", 200, &[], json!({"broken": true}));
    errors.extend(client.pulls_for_head("wi/x", "main").await.err());
    fake.script(
        Method::GET,
        "/pulls",
        422,
        &[],
        json!({"message": "Validation Failed", "errors": [{"message": "bad head"}]}),
    );
    errors.extend(client.pulls_for_head("wi/x", "main").await.err());
    fake.script(
        Method::POST,
        "/issues",
        403,
        &[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "99999999999"),
        ],
        json!({"message": "API rate limit exceeded"}),
    );
    let escalation = Escalation {
        work_item_id: "WI-1".into(),
        reason: "r".into(),
        decision: "d".into(),
        work_item_url: None,
    };
    errors.extend(client.escalate(&escalation).await.err());
    client.escalate(&escalation).await.unwrap();
    errors.extend(client.merge_pull(1, "zz", "t", "m").await.err());
    errors
}

fn assert_clean(what: &str, text: &str, secret: &str) {
    assert!(!text.contains(secret), "{what} leaks the token: {text}");
}

#[tokio::test]
async fn a_token_secret_never_leaves_the_authorization_header() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(captured.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let fake = Fake::start().await;
    let credentials = Credentials::Token {
        token: Sensitive::new(TOKEN.as_bytes().to_vec()),
        secret: "ns/github-token".into(),
    };
    assert_clean("credentials Debug", &format!("{credentials:?}"), TOKEN);
    let client = Arc::new(GithubClient::new(settings(&fake.base()), credentials, None).unwrap());
    assert_clean("client Debug", &format!("{client:?}"), TOKEN);
    let errors = exercise(&fake, client.clone()).await;
    assert!(errors.len() >= 4, "{errors:?}");
    // A transport failure (nothing listens there).
    let dead = GithubClient::new(
        settings("http://127.0.0.1:9"),
        Credentials::Token {
            token: Sensitive::new(TOKEN.as_bytes().to_vec()),
            secret: "ns/github-token".into(),
        },
        None,
    )
    .unwrap();
    let transport = dead.pulls_for_head("wi/x", "main").await.unwrap_err();
    assert!(
        matches!(transport, ForgeError::Transport { .. }),
        "{transport}"
    );
    for e in errors.iter().chain([&transport]) {
        assert_clean("error Display", &e.to_string(), TOKEN);
        assert_clean("error Debug", &format!("{e:?}"), TOKEN);
        let mut source = std::error::Error::source(e);
        while let Some(s) = source {
            assert_clean("error source", &format!("{s} {s:?}"), TOKEN);
            source = s.source();
        }
    }
    // Written to GitHub: only the Authorization header carries it.
    for r in fake.requests() {
        assert_clean("request body", &r.body.to_string(), TOKEN);
        assert_clean("request query", &r.query, TOKEN);
        assert_eq!(
            r.authorization.as_deref(),
            Some(format!("Bearer {TOKEN}").as_str())
        );
    }
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("GitHub"),
        "the capture saw the forge's log lines: {logs}"
    );
    assert_clean("logs", &logs, TOKEN);
}

#[tokio::test]
async fn installation_tokens_and_the_app_key_never_leave_the_authorization_header() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(captured.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let fake = Fake::start().await;
    let pem = include_str!("fixtures/test-app-key.pem");
    let key = AppKey::from_pem(&Sensitive::new(pem.as_bytes().to_vec()), "ns/app").unwrap();
    let credentials = Credentials::App {
        app_id: 1,
        installation_id: 2,
        key,
    };
    let key_line = pem.lines().nth(1).unwrap();
    assert_clean("credentials Debug", &format!("{credentials:?}"), key_line);
    let client = Arc::new(GithubClient::new(settings(&fake.base()), credentials, None).unwrap());
    let errors = exercise(&fake, client.clone()).await;
    let minted = fake.with(|m| m.installation_tokens.clone());
    assert!(!minted.is_empty());
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    for token in &minted {
        assert_clean("logs", &logs, token);
        for e in &errors {
            assert_clean("error", &format!("{e} {e:?}"), token);
        }
        for r in fake.requests() {
            assert_clean("request body", &r.body.to_string(), token);
        }
    }
    assert_clean("logs", &logs, key_line);
    assert_clean("client Debug", &format!("{client:?}"), key_line);
}
