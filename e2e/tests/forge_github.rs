#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! GitHub as a Project's forge, end to end (docs/forge-github.md): the operator's
//! registration and Job Site against the fake GitHub of `operator/forge/tests/support` (its
//! pull requests backed by the scenario's bare repository: the merge endpoint really merges
//! there, and refuses a `sha` that is not the branch's head, as GitHub does).
//!
//! - an approved change set is built and landed by a pull-request merge with the sha guard;
//! - a change set no approving pull request merged is refused with `NOT_APPROVED`, and
//!   nothing is materialized;
//! - the default branch moving before the merge leads to revalidation, then a merge guarded
//!   by the new tested head;
//! - a failing required check leaves the item `merging` with that reason, and however often
//!   the Job Site retries, one escalation issue;
//! - a change set whose pull request was merged as another commit is refused with
//!   `MERGE_COMMIT_MISMATCH`, one two pull requests claim with `AMBIGUOUS_PULL_REQUEST`;
//! - over the real HTTPS git server of `scripts/git-test-servers` (TLS with a test CA, basic
//!   auth as `x-access-token`), the forge's identity serves git too: a token Secret's token,
//!   or a GitHub App's installation token minted for each fetch and push;
//! - in each, the token is in no log line, status, Event or file the operator wrote.

#[path = "../../operator/forge/tests/support/mod.rs"]
mod support;

#[path = "../../operator/repo/tests/support/git_servers.rs"]
#[allow(dead_code)]
mod git_servers;

use std::{
    io::Write,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::http::Method;
use futures::StreamExt;
use k8s_openapi::api::events::v1::Event;
use kube::{Api, api::PostParams, runtime::WatchStreamExt};
use protobot_api::{BuildWorkItem, ChangeSet, ConditionStatus, LifecycleState, Project};
use protobot_controller::{
    forge::ForgeClients,
    jobsite::{ClaimSweeps, Settings},
    metrics::JobSiteMetrics,
};
use protobot_demo::example::{INTEGRATION, WORKER_A, WORKER_B, author};
use protobot_e2e::{
    Cluster, LOCAL_REPOSITORIES, NoCounts, bwrap_installed, create_object, timeout, worker_class,
};
use protobot_executors::{BubblewrapConfig, LocalExecutor};
use protobot_forge::metrics::{ForgeMetrics, Outcome};
use protobot_jobsite::testing::git;
use serde_json::json;
use support::{Fake, OWNER, REPO};

/// The token of the scenarios' GitHub identity: it must appear nowhere but in the
/// `Authorization` header GitHub receives (and, over HTTPS, the git server's basic auth).
const TOKEN: &str = "ghp_e2eForgeToken7c1d9b0a";

/// The installation token the fake GitHub mints for the App scenario (fixed, so the git
/// server behind it can accept it as the `x-access-token` password).
const INSTALLATION_TOKEN: &str = "ghs_e2eInstallationToken4f2a";

/// The App scenario's private key (the forge crate's test key).
const APP_KEY: &str = include_str!("../../operator/forge/tests/fixtures/test-app-key.pem");

/// Where a scenario's repository is served from, and as whom the operator reaches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Served {
    /// A bare repository beside the test, as `file://`.
    Local,
    /// The HTTPS git server; the token Secret of the forge authenticates git.
    HttpsToken,
    /// The HTTPS git server; a GitHub App's installation tokens authenticate git.
    HttpsApp,
}

impl Served {
    /// The credential GitHub and the git server see.
    fn token(self) -> &'static str {
        match self {
            Served::Local | Served::HttpsToken => TOKEN,
            Served::HttpsApp => INSTALLATION_TOKEN,
        }
    }
}

/// Every log line of this test process (the scenarios install this writer before the
/// cluster's default subscriber, at debug level for protobot).
static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "info,protobot_controller=debug,protobot_forge=debug,protobot_jobsite=debug,protobot_repo=debug",
        ))
        .with_ansi(false)
        .with_writer(|| LogWriter)
        .try_init();
}

fn logs() -> String {
    String::from_utf8_lossy(&LOGS.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
}

/// One scenario's world: the cluster, the example repository (authored and its change set
/// merged), the fake GitHub serving it, and the Project naming both.
struct Forged {
    cluster: Cluster,
    served: Served,
    /// The HTTPS git server (kept running for the scenario's life).
    servers: Option<git_servers::GitServers>,
    tmp: tempfile::TempDir,
    fake: Fake,
    work: PathBuf,
    origin: PathBuf,
    merge: String,
    registry: prometheus::Registry,
    forge_metrics: ForgeMetrics,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn forged(scenario: &str) -> Forged {
    match forged_on(scenario, Served::Local).await {
        Some(f) => f,
        None => unreachable!("a local repository needs no server"),
    }
}

/// The scenario's world with its repository served as `served`; `None` when the git servers
/// cannot run here (and `PROTOBOT_REQUIRE_GIT_SERVERS` is not set).
async fn forged_on(scenario: &str, served: Served) -> Option<Forged> {
    capture_logs();
    let servers = match served {
        Served::Local => None,
        // GitHub's git user for tokens (what the operator sends when a Secret names none).
        Served::HttpsToken | Served::HttpsApp => Some(git_servers::GitServers::start_as(Some((
            "x-access-token",
            served.token(),
        )))?),
    };
    let cluster = Cluster::connect(scenario).await;
    let ns = cluster.namespace.clone();
    let client = cluster.client.clone();
    let tmp = tempfile::tempdir().unwrap();
    let (work, authored) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    let merge = author(&work, &authored).unwrap();
    // The repository the Project names, and the bare repository behind it on disk.
    let (repo_url, origin) = match &servers {
        None => (format!("file://{}", authored.display()), authored),
        Some(servers) => {
            // The example's history becomes the served repository's.
            git(
                &authored,
                &[
                    "push",
                    "-q",
                    "--force",
                    &servers.bare.display().to_string(),
                    "main:main",
                ],
            );
            (servers.https_url.clone(), servers.bare.clone())
        }
    };
    let fake = Fake::start().await;
    fake.serve_repository(&origin);
    fake.with(|m| m.fixed_installation_token = Some(INSTALLATION_TOKEN.into()));
    {
        use k8s_openapi::{ByteString, api::core::v1::Secret};
        let ca = servers.as_ref().map(|s| s.ca_pem.clone());
        let (name, mut data) = match served {
            Served::Local | Served::HttpsToken => {
                ("github-token", vec![("token", TOKEN.as_bytes().to_vec())])
            }
            Served::HttpsApp => (
                "github-app",
                vec![("private-key.pem", APP_KEY.as_bytes().to_vec())],
            ),
        };
        if let Some(ca) = ca {
            data.push(("ca.crt", ca));
        }
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            data: Some(
                data.into_iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v)))
                    .collect(),
            ),
            ..Default::default()
        };
        Api::<Secret>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    create_object(
        &Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cli-sync-workers", "namespace": ns},
            "data": {
                "worker-a": worker_class(WORKER_A),
                "worker-b": worker_class(WORKER_B),
                "integration": worker_class(INTEGRATION),
            },
        }),
    )
    .await;
    let mut github = json!({
        "apiBaseUrl": fake.base(),
        "owner": OWNER,
        "repository": REPO,
        "workItemUrl": "https://console.example.invalid/items/{name}",
    });
    github[match served {
        Served::HttpsApp => "app",
        Served::Local | Served::HttpsToken => "tokenSecretRef",
    }] = match served {
        Served::HttpsApp => json!({
            "appId": 4242, "installationId": 77, "privateKeySecretRef": {"name": "github-app"},
        }),
        Served::Local | Served::HttpsToken => json!({"name": "github-token"}),
    };
    create_object(
        &Api::<Project>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "cli-sync", "namespace": ns},
            "spec": {
                "repoUrl": repo_url,
                "sandboxProfile": "local",
                "workerClassesRef": {"name": "cli-sync-workers"},
                "forge": {"github": github},
            },
        }),
    )
    .await;
    let registry = prometheus::Registry::new();
    let forge_metrics = ForgeMetrics::register(&registry).unwrap();
    Some(Forged {
        cluster,
        served,
        servers,
        tmp,
        fake,
        work,
        origin,
        merge,
        registry,
        forge_metrics,
        tasks: Vec::new(),
    })
}

impl Forged {
    fn ns(&self) -> String {
        self.cluster.namespace.clone()
    }

    /// GitHub lists the change set's merged pull request for the merge commit (single-player
    /// review, as the example declares: the merge is the approval).
    fn approve(&self) {
        self.list_pulls(&[&self.merge.clone()]);
    }

    /// GitHub lists, for the merge commit, one merged pull request of the change set's
    /// branch per entry, each merged as that commit; returns their numbers.
    fn list_pulls(&self, merged_as: &[&str]) -> Vec<u64> {
        let branch = git(
            &self.work,
            &[
                "for-each-ref",
                "--format=%(refname:short)",
                "refs/heads/cs/",
            ],
        );
        assert!(branch.starts_with("cs/00001-"), "{branch}");
        let head = git(&self.work, &["rev-parse", &format!("{}^2", self.merge)]);
        let merge = self.merge.clone();
        self.fake.with(|m| {
            merged_as
                .iter()
                .map(|sha| {
                    let number = m.next_number;
                    m.next_number += 1;
                    m.commit_pulls.push((
                        merge.clone(),
                        support::pull_json(
                            number,
                            &branch,
                            "main",
                            &head,
                            "closed",
                            Some(sha),
                            &format!("{OWNER}/{REPO}"),
                        ),
                    ));
                    number
                })
                .collect()
        })
    }

    async fn register(&self) {
        create_object(
            &Api::<ChangeSet>::namespaced(self.cluster.client.clone(), &self.ns()),
            json!({
                "apiVersion": "protobot.dev/v1alpha1", "kind": "ChangeSet",
                "metadata": {"name": "cs-00001", "namespace": self.ns()},
                "spec": {"projectRef": {"name": "cli-sync"}, "changeSetId": "CS-00001", "mergeCommit": self.merge},
            }),
        )
        .await;
    }

    fn forges(&self) -> Arc<ForgeClients> {
        Arc::new(
            ForgeClients::new(
                self.cluster.operator.clone(),
                Some(self.forge_metrics.clone()),
            )
            .with_timeout(Duration::from_secs(5)),
        )
    }

    fn settings(&self, forges: Arc<ForgeClients>, metrics: Option<JobSiteMetrics>) -> Settings {
        let workdir = self.tmp.path().join("jobsite");
        Settings {
            interval: Duration::from_millis(200),
            claim_sweeps: ClaimSweeps::new(Duration::ZERO, Duration::ZERO),
            metrics,
            repositories: LOCAL_REPOSITORIES,
            forges: Some(forges),
            ..Settings::new("protobot-0", workdir, 8)
        }
    }

    fn executor(&self) -> Arc<LocalExecutor> {
        Arc::new(LocalExecutor::new(
            BubblewrapConfig::under(&self.tmp.path().join("sandbox")),
            false,
        ))
    }

    /// Starts the registration controllers (and, with `job_site`, the Job Site) as the
    /// operator runs them, sharing one set of forge clients.
    fn start(&mut self, job_site: bool) -> Arc<ForgeClients> {
        let operator = self.cluster.operator.clone();
        let ns = self.ns();
        let metrics = JobSiteMetrics::register(&self.registry, Arc::new(NoCounts)).unwrap();
        let forges = self.forges();
        let mut project_ctx = protobot_controller::project::Context::new(
            operator.clone(),
            self.tmp.path().join("projects"),
        );
        project_ctx.repositories = LOCAL_REPOSITORIES;
        project_ctx.forges = Some(Arc::clone(&forges));
        self.tasks
            .push(tokio::spawn(protobot_controller::project::run_context(
                Some(ns.clone()),
                Arc::new(project_ctx),
            )));
        self.tasks
            .push(tokio::spawn(protobot_controller::changeset::run_forged(
                operator.clone(),
                Some(ns.clone()),
                self.tmp.path().join("registry"),
                LOCAL_REPOSITORIES,
                Some(metrics.clone()),
                Arc::clone(&forges),
            )));
        if job_site {
            self.tasks.push(tokio::spawn(
                protobot_controller::inspectionrun::run_metered(
                    operator.clone(),
                    Some(ns.clone()),
                    Some(metrics.clone()),
                ),
            ));
            let settings = self.settings(Arc::clone(&forges), Some(metrics));
            self.tasks
                .push(tokio::spawn(protobot_controller::jobsite::run(
                    operator,
                    Some(ns),
                    settings,
                    self.executor(),
                )));
        }
        forges
    }

    /// The registered work item's name.
    async fn registered(&self) -> String {
        let change_sets: Api<ChangeSet> = Api::namespaced(self.cluster.client.clone(), &self.ns());
        let registered = protobot_testkit::wait::until(
            &change_sets,
            "cs-00001",
            timeout(),
            |cs: Option<&ChangeSet>| {
                cs.and_then(|c| c.status.as_ref())
                    .is_some_and(|s| s.work_item_ref.is_some())
            },
        )
        .await;
        match registered {
            Ok(Some(cs)) => cs.status.unwrap().work_item_ref.unwrap().name,
            other => {
                let now = change_sets.get_opt("cs-00001").await.ok().flatten();
                panic!(
                    "the ChangeSet was not registered: {other:?}\nits status: {:?}\nthe operator's log:\n{}",
                    now.and_then(|c| c.status),
                    logs()
                )
            }
        }
    }

    async fn until_state(&self, name: &str, state: LifecycleState) -> BuildWorkItem {
        let items: Api<BuildWorkItem> = Api::namespaced(self.cluster.client.clone(), &self.ns());
        let reached = protobot_testkit::wait::until(
            &items,
            name,
            timeout() * 6,
            |i: Option<&BuildWorkItem>| {
                i.and_then(|i| i.status.as_ref())
                    .is_some_and(|s| s.state == state)
            },
        )
        .await;
        match reached {
            Ok(Some(item)) => item,
            other => {
                let now = items.get(name).await.ok().and_then(|i| i.status);
                panic!("{name} did not reach {state:?} ({other:?}); its status: {now:#?}")
            }
        }
    }

    /// The Work-Item trailers of the merges on `main`, newest first.
    fn landed(&self) -> Vec<String> {
        git(
            &self.origin,
            &[
                "log",
                "--first-parent",
                "--merges",
                "--format=%(trailers:key=Work-Item,valueonly)",
                "main",
            ],
        )
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
    }

    /// The pushed work-item branch and its head on the origin.
    fn tested_head(&self) -> (String, String) {
        let branch = git(
            &self.origin,
            &[
                "for-each-ref",
                "--format=%(refname:short)",
                "refs/heads/wi/",
            ],
        );
        let head = git(
            &self.origin,
            &["rev-parse", &format!("refs/heads/{branch}")],
        );
        (branch, head)
    }

    fn merges(&self) -> Vec<support::Recorded> {
        self.fake.requests_to(Method::PUT, "/merge")
    }

    /// The token (and an App's key) is in no log line, no object's status or spec, no Event,
    /// no file the operator wrote and no request body GitHub received; GitHub received it only
    /// as the bearer token (an App authenticates its token requests with a signed JWT).
    async fn assert_no_token_leaked(&self) {
        let (client, ns) = (self.cluster.client.clone(), self.ns());
        let token = self.served.token();
        let key_line = APP_KEY.lines().nth(1).unwrap();
        let mut written = String::new();
        macro_rules! dump {
            ($kind:ty) => {
                for o in Api::<$kind>::namespaced(client.clone(), &ns)
                    .list(&Default::default())
                    .await
                    .unwrap()
                    .items
                {
                    written.push_str(&serde_json::to_string(&o).unwrap());
                }
            };
        }
        dump!(ChangeSet);
        dump!(BuildWorkItem);
        dump!(Project);
        dump!(protobot_api::InspectionRun);
        dump!(Event);
        dump!(k8s_openapi::api::core::v1::ConfigMap);
        assert!(!written.is_empty());
        assert!(
            !written.contains(token),
            "the token is in an object or Event"
        );
        assert!(!written.contains(key_line), "the App key is in an object");
        let logs = logs();
        assert!(
            logs.contains("built the forge client"),
            "the log capture works"
        );
        assert!(!logs.contains(token), "the token is in the logs");
        assert!(!logs.contains(key_line), "the App key is in the logs");
        for needle in [token, key_line] {
            let files = git_servers::files_containing(self.tmp.path(), needle.as_bytes());
            assert!(
                files.is_empty(),
                "a credential is in files the operator wrote: {files:?}"
            );
        }
        let requests = self.fake.requests();
        assert!(!requests.is_empty());
        for r in &requests {
            assert!(
                !r.body.to_string().contains(token),
                "the token is in a request body"
            );
            let minting = r.path.ends_with("/access_tokens");
            match (self.served, minting) {
                (Served::HttpsApp, true) => assert!(
                    r.authorization
                        .as_deref()
                        .is_some_and(|a| a.starts_with("Bearer ey") && !a.contains(token)),
                    "an installation token is asked for with the App's JWT: {:?}",
                    r.authorization
                ),
                _ => assert_eq!(
                    r.authorization.as_deref(),
                    Some(format!("Bearer {token}").as_str()),
                    "{} {}",
                    r.method,
                    r.path
                ),
            }
        }
    }

    async fn finish(self) {
        for t in &self.tasks {
            t.abort();
        }
        self.cluster.cleanup().await;
    }
}

fn verified(cs: &ChangeSet) -> Option<(ConditionStatus, String, String)> {
    cs.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Verified")
        .map(|c| (c.status, c.reason.clone(), c.message.clone()))
}

/// An approved change set is built, and lands through its pull request: one merge, guarded
/// by the tested head, verified on the default branch; the forge's calls are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approved_change_set_is_built_and_landed_by_a_pull_request_merge_with_the_sha_guard() {
    if !bwrap_installed() {
        return;
    }
    let mut f = forged("forge-land").await;
    f.approve();
    f.register().await;
    f.start(true);
    let name = f.registered().await;
    let item = f.until_state(&name, LifecycleState::Completed).await;
    // Registration saw the approving pull request.
    let cs = Api::<ChangeSet>::namespaced(f.cluster.client.clone(), &f.ns())
        .get("cs-00001")
        .await
        .unwrap();
    assert_eq!(
        verified(&cs).map(|v| v.0),
        Some(ConditionStatus::True),
        "{cs:?}"
    );
    assert!(
        !f.fake
            .requests_to(Method::GET, &format!("/commits/{}/pulls", f.merge))
            .is_empty()
    );
    // …and recorded which one, for the reviewer reading the ChangeSet.
    let approval = cs.status.as_ref().and_then(|s| s.approval.clone());
    let approval = approval.expect("status.approval names the approving pull request");
    assert_eq!(approval.number, 1);
    assert_eq!(approval.merge_commit, f.merge);
    assert!(approval.url.ends_with("/pull/1"), "{approval:?}");
    assert!(
        verified(&cs).unwrap().2.contains("pull request #1"),
        "{cs:?}"
    );
    // One pull-request merge, with merge_method=merge and sha = the tested head.
    let merges = f.merges();
    assert_eq!(merges.len(), 1, "{merges:?}");
    let (branch, tested) = f.tested_head();
    assert_eq!(merges[0].body["sha"], tested.as_str());
    assert_eq!(merges[0].body["merge_method"], "merge");
    let created = f.fake.requests_to(Method::POST, "/pulls");
    assert_eq!(created.len(), 1);
    assert_eq!(created[0].body["head"], branch.as_str());
    assert_eq!(created[0].body["base"], "main");
    // main is GitHub's two-parent merge of the tested head, carrying the item's trailer.
    let main = git(&f.origin, &["rev-parse", "main"]);
    assert_eq!(git(&f.origin, &["rev-parse", "main^2"]), tested);
    assert_eq!(
        item.status.as_ref().and_then(|s| s.merge_commit.clone()),
        Some(main)
    );
    assert_eq!(f.landed(), std::slice::from_ref(&item.spec.work_item_id));
    // The merge stage reported success on the tested head.
    let statuses = f.fake.with(|m| m.statuses.clone());
    assert!(
        statuses.iter().any(|(sha, s)| *sha == tested
            && s["context"] == "protobot/merge"
            && s["state"] == "success"),
        "{statuses:?}"
    );
    // Every call was counted on the operator's registry.
    assert_eq!(f.forge_metrics.calls("merge-pull", Outcome::Success), 1);
    assert!(
        f.forge_metrics
            .calls("list-pulls-for-commit", Outcome::Success)
            >= 1
    );
    assert!(
        f.registry
            .gather()
            .iter()
            .any(|m| m.name() == "protobot_forge_api_calls_total")
    );
    f.assert_no_token_leaked().await;
    f.finish().await;
}

/// A change set no approving pull request merged is refused with NOT_APPROVED and nothing
/// is materialized; registration waits for a change instead of asking again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_set_without_an_approving_pull_request_is_refused_not_approved() {
    let mut f = forged("forge-refuse").await;
    f.register().await;
    f.start(false);
    let (reason, message) = refused(&f).await;
    assert_eq!(reason, "NOT_APPROVED", "{message}");
    assert!(message.contains("CS-00001"), "{message}");
    assert!(message.contains(&f.merge), "{message}");
    let asked = f
        .fake
        .requests_to(Method::GET, &format!("/commits/{}/pulls", f.merge))
        .len();
    assert!(asked >= 1);
    f.assert_no_token_leaked().await;
    f.finish().await;
}

/// Someone merges into main just before the Job Site's merge and GitHub refuses it as not
/// up to date: the item revalidates (the default branch merged in, every gate again) and
/// lands with the new tested head as the guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_branch_moving_before_the_merge_leads_to_revalidation() {
    if !bwrap_installed() {
        return;
    }
    let mut f = forged("forge-moved").await;
    let hook = support::main_moves_once_then(&f.origin, support::merge_in(&f.origin));
    f.fake.with(|m| m.merge_hook = Some(hook));
    f.approve();
    f.register().await;
    f.start(true);
    let name = f.registered().await;
    let item = f.until_state(&name, LifecycleState::Completed).await;
    let merges = f.merges();
    assert_eq!(
        merges.len(),
        2,
        "refused once, merged after revalidation: {merges:?}"
    );
    assert_ne!(
        merges[0].body["sha"], merges[1].body["sha"],
        "the guard is the new tested head"
    );
    let (_, tested) = f.tested_head();
    assert_eq!(merges[1].body["sha"], tested.as_str());
    let merge = item.status.as_ref().unwrap().merge_commit.clone().unwrap();
    let files = git(&f.origin, &["ls-tree", "-r", "--name-only", &merge]);
    assert!(
        files.contains("docs/other.md"),
        "the landed tree holds the other change: {files}"
    );
    assert_eq!(f.landed(), std::slice::from_ref(&item.spec.work_item_id));
    f.assert_no_token_leaked().await;
    f.finish().await;
}

/// A required check fails: the merge is refused, the item stays `merging` and the Job
/// Site says why (an Event naming the check); retried by later passes, it is refused again
/// and the one escalation issue is updated, never a second one opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_required_check_leaves_the_item_with_that_reason_and_one_escalation_issue() {
    if !bwrap_installed() {
        return;
    }
    let mut f = forged("forge-check").await;
    f.fake.with(|m| {
        m.merge_hook = Some(Box::new(|_, _, _| {
            Err((
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                json!({"message": "Required status check \"ci/test\" is failing.", "documentation_url": "https://docs.github.com/rest/pulls/pulls#merge-a-pull-request"}),
            ))
        }))
    });
    f.approve();
    f.register().await;
    // The Job Site retries the refused merge on its own (the item backs off between tries);
    // a retry's refusal updates the escalation issue (after its merge call).
    f.start(true);
    let name = f.registered().await;
    let ns = f.ns();
    let deadline = std::time::Instant::now() + timeout();
    while f.merges().len() < 2 || f.fake.requests_to(Method::PATCH, "/issues/").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the refused merge was not retried and escalated again: {} attempt(s)",
            f.merges().len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let items: Api<BuildWorkItem> = Api::namespaced(f.cluster.client.clone(), &ns);
    let item = items.get(&name).await.unwrap();
    assert_eq!(
        item.status.as_ref().unwrap().state,
        LifecycleState::Merging,
        "a refused merge leaves the item merging"
    );
    assert!(f.landed().is_empty(), "nothing merged");
    let attempts = f.merges().len();
    assert!(attempts >= 2, "retried: {attempts}");
    // One issue, opened once and updated by the retries, saying which check failed.
    let issues = f.fake.with(|m| m.issues.clone());
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert!(
        issues[0]["body"].as_str().unwrap().contains("ci/test"),
        "{issues:?}"
    );
    assert_eq!(f.fake.requests_to(Method::POST, "/issues").len(), 1);
    assert!(!f.fake.requests_to(Method::PATCH, "/issues/").is_empty());
    // The item's Events say why it stopped, naming the check.
    let events: Api<Event> = Api::namespaced(f.cluster.client.clone(), &ns);
    let stopped = tokio::time::timeout(timeout(), async {
        let mut seen = kube::runtime::watcher(events.clone(), Default::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(e)) = seen.next().await {
            if e.reason.as_deref() == Some("BuildStopped")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
                && e.note.as_deref().is_some_and(|n| n.contains("ci/test"))
            {
                return true;
            }
        }
        false
    })
    .await;
    assert!(
        matches!(stopped, Ok(true)),
        "no BuildStopped Event naming the check: {:?}",
        events
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|e| (&e.reason, &e.note))
            .collect::<Vec<_>>()
    );
    f.assert_no_token_leaked().await;
    f.finish().await;
}

/// A forge that cannot be reached is not a refusal: Verified stays Unknown with
/// ForgeUnavailable (asked again later) and nothing is materialized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_forge_is_forge_unavailable_not_a_refusal() {
    let mut f = forged("forge-down").await;
    // Nothing listens there (a port below 1024 no test binds).
    let patch = json!({"spec": {"forge": {"github": {"apiBaseUrl": "http://127.0.0.1:9"}}}});
    Api::<Project>::namespaced(f.cluster.client.clone(), &f.ns())
        .patch(
            "cli-sync",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    f.approve();
    f.register().await;
    f.start(false);
    let change_sets: Api<ChangeSet> = Api::namespaced(f.cluster.client.clone(), &f.ns());
    let waiting = protobot_testkit::wait::until(
        &change_sets,
        "cs-00001",
        timeout(),
        |cs: Option<&ChangeSet>| {
            cs.and_then(verified)
                .is_some_and(|(_, reason, _)| reason == "ForgeUnavailable")
        },
    )
    .await
    .unwrap()
    .unwrap();
    let (status, _, message) = verified(&waiting).unwrap();
    assert_eq!(status, ConditionStatus::Unknown);
    assert!(message.contains("failed to reach GitHub"), "{message}");
    assert_eq!(waiting.status.as_ref().unwrap().work_item_ref, None);
    let items: Api<BuildWorkItem> = Api::namespaced(f.cluster.client.clone(), &f.ns());
    assert!(
        items
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    f.finish().await;
}

/// Waits for the ChangeSet's `Verified` to be decided and returns (reason, message), after
/// checking that nothing was materialized.
async fn refused(f: &Forged) -> (String, String) {
    let change_sets: Api<ChangeSet> = Api::namespaced(f.cluster.client.clone(), &f.ns());
    let refused = protobot_testkit::wait::until(
        &change_sets,
        "cs-00001",
        timeout(),
        |cs: Option<&ChangeSet>| {
            cs.and_then(verified)
                .is_some_and(|(s, _, _)| s == ConditionStatus::False)
        },
    )
    .await
    .unwrap()
    .unwrap();
    let status = refused.status.as_ref().unwrap();
    assert_eq!(status.work_item_ref, None);
    assert_eq!(status.approval, None, "a refused merge records no approval");
    let items: Api<BuildWorkItem> = Api::namespaced(f.cluster.client.clone(), &f.ns());
    assert!(
        items
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "nothing was materialized"
    );
    let (_, reason, message) = verified(&refused).unwrap();
    (reason, message)
}

/// The change set's pull request was merged as another commit than the one registered:
/// `MERGE_COMMIT_MISMATCH`, naming both, and nothing is materialized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_request_merged_as_another_commit_is_refused_merge_commit_mismatch() {
    let mut f = forged("forge-mismatch").await;
    let other = "0123456789abcdef0123456789abcdef01234567";
    let numbers = f.list_pulls(&[other]);
    f.register().await;
    f.start(false);
    let (reason, message) = refused(&f).await;
    assert_eq!(reason, "MERGE_COMMIT_MISMATCH", "{message}");
    assert!(message.contains(other), "{message}");
    assert!(message.contains(&f.merge), "{message}");
    assert!(message.contains(&format!("#{}", numbers[0])), "{message}");
    f.assert_no_token_leaked().await;
    f.finish().await;
}

/// Two merged pull requests of the change set both claim the merge commit: the approval is
/// ambiguous (`AMBIGUOUS_PULL_REQUEST`, naming both) and nothing is materialized.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pull_requests_claiming_the_merge_are_refused_as_ambiguous() {
    let mut f = forged("forge-ambiguous").await;
    let merge = f.merge.clone();
    let numbers = f.list_pulls(&[&merge, &merge]);
    f.register().await;
    f.start(false);
    let (reason, message) = refused(&f).await;
    assert_eq!(reason, "AMBIGUOUS_PULL_REQUEST", "{message}");
    for n in numbers {
        assert!(message.contains(&n.to_string()), "{message}");
    }
    f.assert_no_token_leaked().await;
    f.finish().await;
}

/// Over the real HTTPS git server, the forge's identity serves git: registration mirrors,
/// the Job Site fetches and pushes `wi/…`, and verifies the pull request's merge, all with
/// `x-access-token` and the identity's token (a token Secret's, or an App installation's);
/// the merge lands on the served repository's `main`.
async fn lands_over_https(served: Served, scenario: &str) {
    if !bwrap_installed() {
        return;
    }
    let Some(mut f) = forged_on(scenario, served).await else {
        return;
    };
    f.approve();
    f.register().await;
    f.start(true);
    let name = f.registered().await;
    let item = f.until_state(&name, LifecycleState::Completed).await;
    let merges = f.merges();
    assert_eq!(merges.len(), 1, "{merges:?}");
    let (branch, tested) = f.tested_head();
    assert!(
        branch.starts_with("wi/"),
        "the Job Site pushed {branch} over HTTPS"
    );
    assert_eq!(merges[0].body["sha"], tested.as_str());
    let servers = f.servers.as_ref().unwrap();
    let main = servers.main_head().to_string();
    assert_eq!(
        item.status.as_ref().and_then(|s| s.merge_commit.clone()),
        Some(main.clone()),
        "the served main is the verified merge"
    );
    assert_eq!(git(&f.origin, &["rev-parse", "main^2"]), tested);
    let minted = f.fake.with(|m| m.installation_tokens.len());
    match served {
        Served::HttpsApp => assert!(minted >= 1, "git used minted installation tokens"),
        _ => assert_eq!(minted, 0, "a token identity mints nothing"),
    }
    f.assert_no_token_leaked().await;
    f.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_repository_is_landed_with_the_forge_token_serving_git() {
    lands_over_https(Served::HttpsToken, "forge-https-token").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_repository_is_landed_with_github_app_installation_tokens_serving_git() {
    lands_over_https(Served::HttpsApp, "forge-https-app").await;
}

/// Registration alone (no Job Site) of a repository served with a GitHub App's installation
/// tokens: the Project controller and the ChangeSet controller each set the App's client up
/// before reading the repository, so neither depends on another controller having minted a
/// token first (CI once saw the ChangeSet wait 30 s for the Job Site's first pass to do it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_served_repository_is_observed_and_registered_without_the_job_site() {
    let Some(mut f) = forged_on("forge-https-app-registration", Served::HttpsApp).await else {
        return;
    };
    f.approve();
    f.register().await;
    f.start(false);
    let projects: Api<Project> = Api::namespaced(f.cluster.client.clone(), &f.ns());
    let reachable =
        protobot_testkit::wait::until(&projects, "cli-sync", timeout(), |p: Option<&Project>| {
            p.and_then(|p| p.status.as_ref())
                .is_some_and(|s| s.repo_reachable == Some(true))
        })
        .await;
    assert!(
        matches!(reachable, Ok(Some(_))),
        "the Project never read its App-served repository: {:?}\n{}",
        projects
            .get_opt("cli-sync")
            .await
            .ok()
            .flatten()
            .and_then(|p| p.status),
        logs()
    );
    let name = f.registered().await;
    assert!(name.starts_with("wi-"), "{name}");
    assert!(
        f.fake.with(|m| m.installation_tokens.len()) >= 1,
        "git used minted installation tokens"
    );
    f.assert_no_token_leaked().await;
    f.finish().await;
}
