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
//! - in each, the token is in no log line, status or Event.

#[path = "../../operator/forge/tests/support/mod.rs"]
mod support;

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
    metrics::{JobSiteMetrics, StateCounts},
};
use protobot_e2e::{
    Cluster, LOCAL_REPOSITORIES, bwrap_installed, create_object, timeout, worker_class,
};
use protobot_executors::{BubblewrapConfig, LocalExecutor};
use protobot_forge::metrics::{ForgeMetrics, Outcome};
use protobot_jobsite::{
    example::{INTEGRATION, WORKER_A, WORKER_B, author},
    testing::git,
};
use serde_json::json;
use support::{Fake, OWNER, REPO};

/// The token of the scenarios' GitHub identity: it must appear nowhere but in the
/// `Authorization` header GitHub receives.
const TOKEN: &str = "ghp_e2eForgeToken7c1d9b0a";

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

struct NoCounts;

impl StateCounts for NoCounts {
    fn counts(&self) -> Vec<(protobot_lifecycle::State, u64)> {
        Vec::new()
    }
}

/// One scenario's world: the cluster, the example repository (authored and its change set
/// merged), the fake GitHub serving it, and the Project naming both.
struct Forged {
    cluster: Cluster,
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
    capture_logs();
    let cluster = Cluster::connect(scenario).await;
    let ns = cluster.namespace.clone();
    let client = cluster.client.clone();
    let tmp = tempfile::tempdir().unwrap();
    let (work, origin) = (tmp.path().join("work"), tmp.path().join("origin.git"));
    let merge = author(&work, &origin).unwrap();
    let fake = Fake::start().await;
    fake.serve_repository(&origin);
    {
        use k8s_openapi::{ByteString, api::core::v1::Secret};
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("github-token".into()),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            data: Some(
                [("token".to_string(), ByteString(TOKEN.as_bytes().to_vec()))]
                    .into_iter()
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
    create_object(
        &Api::<Project>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "cli-sync", "namespace": ns},
            "spec": {
                "repoUrl": format!("file://{}", origin.display()),
                "sandboxProfile": "local",
                "workerClassesRef": {"name": "cli-sync-workers"},
                "forge": {"github": {
                    "apiBaseUrl": fake.base(),
                    "owner": OWNER,
                    "repository": REPO,
                    "tokenSecretRef": {"name": "github-token"},
                    "workItemUrl": "https://console.example.invalid/items/{name}",
                }},
            },
        }),
    )
    .await;
    let registry = prometheus::Registry::new();
    let forge_metrics = ForgeMetrics::register(&registry).unwrap();
    Forged {
        cluster,
        tmp,
        fake,
        work,
        origin,
        merge,
        registry,
        forge_metrics,
        tasks: Vec::new(),
    }
}

impl Forged {
    fn ns(&self) -> String {
        self.cluster.namespace.clone()
    }

    /// GitHub lists the change set's merged pull request for the merge commit (single-player
    /// review, as the example declares: the merge is the approval).
    fn approve(&self) {
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
                    Some(&merge),
                    &format!("{OWNER}/{REPO}"),
                ),
            ));
        });
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
            other => panic!("the ChangeSet was not registered: {other:?}"),
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

    /// The token is in no log line, no object's status or spec, no Event, and in no request
    /// body GitHub received; GitHub received it only as the bearer token.
    async fn assert_no_token_leaked(&self) {
        let (client, ns) = (self.cluster.client.clone(), self.ns());
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
            !written.contains(TOKEN),
            "the token is in an object or Event"
        );
        let logs = logs();
        assert!(logs.contains("GitHub"), "the log capture works");
        assert!(!logs.contains(TOKEN), "the token is in the logs");
        let requests = self.fake.requests();
        assert!(!requests.is_empty());
        for r in &requests {
            assert!(
                !r.body.to_string().contains(TOKEN),
                "the token is in a request body"
            );
            assert_eq!(
                r.authorization.as_deref(),
                Some(format!("Bearer {TOKEN}").as_str()),
                "{} {}",
                r.method,
                r.path
            );
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
    let change_sets: Api<ChangeSet> = Api::namespaced(f.cluster.client.clone(), &f.ns());
    let refused = protobot_testkit::wait::until(
        &change_sets,
        "cs-00001",
        timeout(),
        |cs: Option<&ChangeSet>| {
            cs.and_then(verified)
                .is_some_and(|(s, _, _)| s != ConditionStatus::Unknown)
        },
    )
    .await
    .unwrap()
    .unwrap();
    let (status, reason, message) = verified(&refused).unwrap();
    assert_eq!(
        (status, reason.as_str()),
        (ConditionStatus::False, "NOT_APPROVED")
    );
    assert!(message.contains("CS-00001"), "{message}");
    assert!(message.contains(&f.merge), "{message}");
    assert_eq!(refused.status.as_ref().unwrap().work_item_ref, None);
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
    // Registration runs in the background; the Job Site's passes are driven here, so the
    // retries are counted.
    let forges = f.start(false);
    let name = f.registered().await;
    let settings = f.settings(forges, None);
    let executor = f.executor();
    let operator = f.cluster.operator.clone();
    let ns = f.ns();
    let mut passes = 0;
    while f.merges().is_empty() {
        passes += 1;
        assert!(passes < 40, "no merge was attempted");
        protobot_controller::jobsite::pass(&operator, Some(&ns), &settings, executor.clone()).await;
    }
    for _ in 0..3 {
        protobot_controller::jobsite::pass(&operator, Some(&ns), &settings, executor.clone()).await;
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
