#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `KubernetesExecutor` against the in-process API double, with the simulated
//! kubelet running each sandbox pod's container in bubblewrap (volumes,
//! including the staging claim's sub-paths, bind-mounted at their mount
//! paths).
//!
//! Test index:
//! - `a_run_that_writes_results_comes_back_with_its_output`: input in, `/out`
//!   out, the pod and policy built from the profile, everything removed after;
//! - `a_failing_command_exits_with_its_code`;
//! - `the_wall_clock_limit_ends_a_run_that_overstays`;
//! - `cancel_deletes_the_pod_and_reports_cancelled` (also: the pod carries the
//!   profile's fields and its NetworkPolicy exists while it runs);
//! - `a_missing_or_failing_report_refuses_and_creates_nothing`;
//! - `the_conformance_suite_through_this_backend_fails_closed_and_refuses`;
//! - `a_failed_watch_is_retried_until_the_run_ends`;
//! - `a_pod_deleted_by_someone_else_is_a_collect_error`;
//! - `the_report_is_read_from_the_profiles_config_map`;
//! - `a_second_run_with_a_live_run_id_is_refused`;
//! - `a_run_cancelled_before_it_starts_creates_nothing`;
//! - `an_oom_killed_sandbox_exceeded_its_memory_limit` (a kubelet executor
//!   reporting an OOM kill, as a node would);
//! - `a_run_with_the_egress_proxy_gets_one_egress_rule_and_the_proxy_env`;
//! - `a_failed_pod_create_leaves_nothing_behind`;
//! - `a_pod_that_never_starts_hits_the_executor_deadline_and_is_deleted`;
//! - `garbage_collection_removes_only_this_instances_leftovers`;
//! - `a_run_left_behind_by_another_replica_or_by_a_cut_off_start_is_replaced` (a replica
//!   that died mid-run, found on the real node; a start cut off by an API-server restart).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::{core::v1::Pod, networking::v1::NetworkPolicy};
use kube::{Api, api::ListParams};
use protobot_executors::{
    BackendIdentity, Capability, ConformanceCheck, ConformanceReport,
    conformance::{ALL_CAPABILITIES, ResourceLimitsReport},
};
use protobot_jobsite::executor::{
    Executor, ExecutorError, Limits, RunSpec, SandboxRole, Termination,
};
use protobot_kube_executor::{
    KubeExecutorConfig, KubernetesExecutor, SandboxProfile, StagingOwnership, StagingVolume,
    manifest::{LABEL_EXECUTOR, LABEL_MANAGED_BY, LABEL_RUN_ID},
    run_name,
};
use protobot_testkit::{
    ApiServer, BubblewrapContainerExecutor, ContainerExecutor, ContainerExit, ContainerLaunch,
    ExecFuture, FaultRule, KillSignal, Kubelet, Verb,
};
use serde_json::{Value, json};
use tokio::sync::watch;

const NS: &str = "default";
const CLAIM: &str = "protobot-staging";
const INSTANCE: &str = "test-replica";

fn bwrap() -> Option<BubblewrapContainerExecutor> {
    let found = BubblewrapContainerExecutor::from_path();
    if found.is_none() {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap is missing"
        );
        eprintln!("skipping: bubblewrap is not installed");
    }
    found
}

fn profile() -> SandboxProfile {
    SandboxProfile::load(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../sandbox-profiles/kata.yaml"
    )))
    .unwrap()
}

fn passing_report(profile: &str) -> ConformanceReport {
    ConformanceReport {
        contract_version: protobot_executors::CONTRACT_VERSION.into(),
        profile: profile.into(),
        backend: BackendIdentity {
            name: "protobot-kubernetes".into(),
            version: "test".into(),
        },
        policy_version: 0,
        policy_digest: String::new(),
        executable_digests: Default::default(),
        resource_limits: ResourceLimitsReport::from(&Limits::default()),
        capabilities: ALL_CAPABILITIES
            .iter()
            .map(|c| Capability::supported(c, "test fixture"))
            .collect(),
        required_capabilities: ALL_CAPABILITIES.iter().map(|c| (*c).to_owned()).collect(),
        checks: vec![ConformanceCheck {
            id: "SB-FS-005".into(),
            name: "host paths denied".into(),
            passed: true,
            skipped: false,
            detail: None,
        }],
        passed: true,
        autonomous_execution: true,
        fail_closed_reason: None,
        audit_head: None,
    }
}

/// One API double, one kubelet (bubblewrap unless said otherwise), a staging
/// claim and an output root.
struct Env {
    server: ApiServer,
    _kubelet: Option<Kubelet>,
    staging: PathBuf,
    tmp: tempfile::TempDir,
}

impl Env {
    fn start() -> Option<Env> {
        let bwrap = bwrap()?;
        Some(Env::with_kubelet(Some(Arc::new(bwrap))))
    }

    /// With `None`, no kubelet: pods stay unscheduled.
    fn with_kubelet(executor: Option<Arc<dyn ContainerExecutor>>) -> Env {
        let server = ApiServer::new();
        let tmp = tempfile::tempdir().unwrap();
        let kubelet = executor.map(|e| Kubelet::start_with(&server, e, "sandbox-node").unwrap());
        let staging = match &kubelet {
            Some(k) => k.claim_dir(NS, CLAIM).unwrap(),
            None => tmp.path().join("unmounted-claim"),
        };
        Env {
            server,
            _kubelet: kubelet,
            staging,
            tmp,
        }
    }

    fn config(&self) -> KubeExecutorConfig {
        let mut c = KubeExecutorConfig::new(
            NS,
            StagingVolume {
                claim_name: CLAIM.into(),
                mount_path: self.staging.clone(),
            },
            self.tmp.path().join("collected"),
        );
        c.default_image = Some("registry.example.invalid/worker:test".into());
        c.instance = INSTANCE.into();
        c.grace_period = Duration::from_secs(1);
        c.start_allowance = Duration::from_secs(20);
        // `deletion_timeout` keeps its production default (60 s): it is a
        // bound, not a wait (the executor returns as soon as the deleted pod is
        // gone), and under load (the whole workspace's tests on 2 cores) the
        // kubelet took over 10 s to reap a cancelled sandbox.
        assert!(c.deletion_timeout >= Duration::from_secs(60));
        // The test kubelet runs containers as the test's own uid.
        c.staging_ownership = StagingOwnership::Keep;
        c.egress_session_secret = Some(egress_secret());
        c
    }

    fn executor(&self, report: Option<ConformanceReport>) -> KubernetesExecutor {
        KubernetesExecutor::new(self.server.client(), self.config(), profile(), report).unwrap()
    }

    fn admitted(&self) -> KubernetesExecutor {
        self.executor(Some(passing_report("kata")))
    }

    /// A sealed projection with one file.
    fn workspace(&self) -> PathBuf {
        let ws = self.tmp.path().join("projection");
        if !ws.exists() {
            std::fs::create_dir_all(ws.join(".git")).unwrap();
            std::fs::write(ws.join(".git/config"), "[core]\n\tbare = false\n").unwrap();
            std::fs::write(ws.join("README.md"), "the projection\n").unwrap();
        }
        ws
    }

    fn spec(&self, run_id: &str, script: &str) -> RunSpec {
        RunSpec {
            run_id: run_id.into(),
            role: SandboxRole::IntegrationRunner,
            workspace: self.workspace(),
            task: json!({"role": "integration-runner", "cycle": 1}),
            command: vec!["sh".into(), "-c".into(), script.into()],
            image: None,
            env: [("MODEL_TIER".to_owned(), "t1".to_owned())].into(),
            limits: Limits {
                wall_clock: Duration::from_secs(30),
                memory_bytes: 1 << 30,
                ..Limits::default()
            },
            egress_proxy: None,
            audit: protobot_jobsite::executor::RunAudit {
                work_item: "wi-11".into(),
                cycle: 1,
                trace_id: run_id.into(),
            },
            attribution: Default::default(),
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.server.client(), NS)
    }

    fn policies(&self) -> Api<NetworkPolicy> {
        Api::namespaced(self.server.client(), NS)
    }

    async fn pod_names(&self) -> Vec<String> {
        let list = self.pods().list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect()
    }

    async fn policy_names(&self) -> Vec<String> {
        let list = self.policies().list(&ListParams::default()).await.unwrap();
        list.items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect()
    }

    fn staged_dirs(&self) -> Vec<String> {
        match std::fs::read_dir(self.staging.join("runs").join(INSTANCE)) {
            Ok(d) => d
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// A run's pod and NetworkPolicy as `instance` would have left them behind.
    fn leftover(&self, name: &str, instance: &str) {
        let labels =
            json!({LABEL_MANAGED_BY: "protobot", LABEL_EXECUTOR: instance, LABEL_RUN_ID: name});
        self.server
            .create_object(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "labels": labels},
                "spec": {"restartPolicy": "Never", "containers": [
                    {"name": "sandbox", "image": "x", "command": ["sleep", "60"]}]}
            }))
            .unwrap();
        self.server
            .create_object(json!({
                "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                "metadata": {"name": name, "namespace": NS, "labels": labels},
                "spec": {"podSelector": {"matchLabels": {LABEL_RUN_ID: name}}, "policyTypes": ["Ingress", "Egress"]}
            }))
            .unwrap();
    }

    /// The body of the client's create request for `plural`.
    fn created(&self, plural: &str) -> Vec<Value> {
        self.server
            .writes()
            .into_iter()
            .filter(|r| r.verb == Verb::Create && r.plural == plural)
            .filter_map(|r| r.body)
            .collect()
    }
}

fn egress_secret() -> protobot_egress::SessionSecret {
    protobot_egress::SessionSecret::new(vec![3u8; 32])
}

fn no_cancel() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    std::mem::forget(tx);
    rx
}

/// Asserts the profile's fields on a pod (as JSON).
fn assert_profile_fields(pod: &Value, wall_clock_secs: i64) {
    let s = &pod["spec"];
    assert_eq!(s["runtimeClassName"], json!("kata"));
    assert_eq!(s["automountServiceAccountToken"], json!(false));
    assert_eq!(s["restartPolicy"], json!("Never"));
    assert_eq!(s["activeDeadlineSeconds"], json!(wall_clock_secs));
    let c = &s["containers"][0];
    let sc = &c["securityContext"];
    assert_eq!(sc["runAsNonRoot"], json!(true));
    assert_eq!(sc["readOnlyRootFilesystem"], json!(true));
    assert_eq!(sc["allowPrivilegeEscalation"], json!(false));
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(sc["seccompProfile"]["type"], json!("RuntimeDefault"));
    assert_eq!(
        c["resources"]["limits"]["memory"],
        json!((1u64 << 30).to_string())
    );
    assert_eq!(c["resources"]["limits"]["cpu"], json!("2000m"));
    assert!(c["resources"]["limits"]["ephemeral-storage"].is_string());
    assert_eq!(
        pod["metadata"]["labels"][LABEL_MANAGED_BY],
        json!("protobot")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_writes_results_comes_back_with_its_output() {
    let Some(env) = Env::start() else { return };
    let exec = env.admitted();
    let script = r#"set -e
cp /task/task.json /out/task-copy.json
ls /workspace > /out/workspace.txt
echo scribble > /workspace/README.md
mkdir -p /out/junit && echo '<testsuite/>' > /out/junit/report.xml
echo '{"passed": true}' > /out/results.json
echo "integration finished" >&2"#;
    let spec = env.spec("wi-cs-00001/cycle-1/integration", script);
    let out = exec.run(spec.clone(), no_cancel()).await.unwrap();

    assert_eq!(
        out.termination,
        Termination::Exited { code: 0 },
        "{}",
        out.stderr_tail
    );
    let read = |p: &str| std::fs::read_to_string(out.out_dir.join(p)).unwrap();
    assert_eq!(read("results.json").trim(), r#"{"passed": true}"#);
    assert_eq!(read("junit/report.xml").trim(), "<testsuite/>");
    let task: Value = serde_json::from_str(&read("task-copy.json")).unwrap();
    assert_eq!(task, spec.task);
    assert!(read("workspace.txt").contains("README.md"));
    assert!(out.stderr_tail.contains("integration finished"));
    // The pod's lifecycle as a verifiable audit chain, tied to the run.
    protobot_jobsite::sandbox_audit::verify_audit_chain(&out.audit).unwrap();
    let types: Vec<&str> = out.audit.iter().map(|e| e.event_type.as_str()).collect();
    assert_eq!(
        types,
        [
            "sandbox.open",
            "sandbox.network",
            "sandbox.exec",
            "sandbox.cleanup"
        ]
    );
    assert!(
        out.audit
            .iter()
            .all(|e| e.backend_name == "protobot-kubernetes"
                && e.work_item == "wi-11"
                && e.trace_id == spec.run_id)
    );
    assert!(
        !out.out_dir.starts_with(&env.staging),
        "output leaves the staging volume"
    );
    assert_eq!(
        std::fs::read_to_string(env.workspace().join("README.md")).unwrap(),
        "the projection\n",
        "the sandbox wrote to a copy, never to the projection"
    );

    // What was created: the policy first, then the pod, both from the profile.
    let name = run_name("wi-cs-00001/cycle-1/integration");
    let order: Vec<String> = env
        .server
        .writes()
        .iter()
        .filter(|r| r.verb == Verb::Create)
        .map(|r| r.plural.clone())
        .collect();
    assert_eq!(order, ["networkpolicies", "pods"]);
    let pod = &env.created("pods")[0];
    assert_eq!(pod["metadata"]["name"], json!(name));
    assert_eq!(pod["metadata"]["labels"][LABEL_RUN_ID], json!(name));
    assert_eq!(
        pod["metadata"]["labels"]["protobot.dev/role"],
        json!("integration-runner")
    );
    assert_profile_fields(pod, 30);
    let np = &env.created("networkpolicies")[0];
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"][LABEL_RUN_ID],
        json!(name)
    );
    assert_eq!(np["spec"]["egress"], json!([]));
    assert_eq!(np["spec"]["ingress"], json!([]));

    // Nothing is left behind.
    assert!(env.pod_names().await.is_empty());
    assert!(env.policy_names().await.is_empty());
    assert!(env.staged_dirs().is_empty());
    assert!(exec.live_runs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_exits_with_its_code() {
    let Some(env) = Env::start() else { return };
    let exec = env.admitted();
    let spec = env.spec(
        "wi-2/cycle-1/worker-b",
        "echo 'test failed: REQ-1' >&2; exit 3",
    );
    let out = exec.run(spec, no_cancel()).await.unwrap();
    assert_eq!(out.termination, Termination::Exited { code: 3 });
    assert!(out.stderr_tail.contains("test failed: REQ-1"));
    assert!(env.pod_names().await.is_empty());
    assert!(env.staged_dirs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wall_clock_limit_ends_a_run_that_overstays() {
    let Some(env) = Env::start() else { return };
    let exec = env.admitted();
    let mut spec = env.spec(
        "wi-3/cycle-1/worker-a",
        "echo partial > /out/partial; sleep 60",
    );
    spec.limits.wall_clock = Duration::from_secs(1);
    let started = Instant::now();
    let out = exec.run(spec, no_cancel()).await.unwrap();
    assert_eq!(
        out.termination,
        Termination::LimitExceeded {
            limit: "wall-clock".into()
        }
    );
    protobot_jobsite::sandbox_audit::verify_audit_chain(&out.audit).unwrap();
    let limit = out
        .audit
        .iter()
        .find(|e| e.event_type == "sandbox.limit")
        .expect("a sandbox.limit event");
    assert_eq!(
        (limit.limit_name.as_str(), limit.limit_configured.as_str()),
        ("wall-clock", "1000ms")
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        env.created("pods")[0]["spec"]["activeDeadlineSeconds"],
        json!(1)
    );
    assert_eq!(
        std::fs::read_to_string(out.out_dir.join("partial"))
            .unwrap()
            .trim(),
        "partial",
        "what the run wrote before the limit is still collected"
    );
    assert!(env.pod_names().await.is_empty());
    assert!(env.policy_names().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_deletes_the_pod_and_reports_cancelled() {
    let Some(env) = Env::start() else { return };
    let exec = env.admitted();
    let spec = env.spec(
        "wi-4/cycle-2/worker-a",
        "echo started > /out/started; sleep 60",
    );
    let name = run_name(&spec.run_id);
    let (cancel_tx, cancel) = watch::channel(false);
    let run = tokio::spawn({
        let exec = exec.clone();
        async move { exec.run(spec, cancel).await }
    });

    // Wait until the sandbox runs, then look at it from the outside.
    let pods = env.pods();
    let deadline = Instant::now() + Duration::from_secs(15);
    let pod = loop {
        if let Some(p) = pods.get_opt(&name).await.unwrap()
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && env
                .staging
                .join("runs")
                .join(INSTANCE)
                .join(&name)
                .join("out/started")
                .exists()
        {
            break p;
        }
        assert!(Instant::now() < deadline, "the sandbox pod never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_profile_fields(&serde_json::to_value(&pod).unwrap(), 30);
    let policy = env.policies().get(&name).await.unwrap();
    let selector = policy
        .spec
        .unwrap()
        .pod_selector
        .unwrap()
        .match_labels
        .unwrap();
    assert_eq!(
        selector.get(LABEL_RUN_ID),
        Some(&name),
        "the policy selects the running pod"
    );
    assert_eq!(
        exec.live_runs().into_iter().collect::<Vec<_>>(),
        vec![name.clone()]
    );

    cancel_tx.send_replace(true);
    let out = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(out.termination, Termination::Cancelled);
    let deleted =
        env.server.writes().iter().any(|r| {
            r.verb == Verb::Delete && r.plural == "pods" && r.name.as_deref() == Some(&name)
        });
    assert!(deleted, "cancel deletes the pod");
    assert!(env.pod_names().await.is_empty());
    assert!(env.policy_names().await.is_empty());
    assert!(env.staged_dirs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_failing_report_refuses_and_creates_nothing() {
    let Some(env) = Env::start() else { return };
    let mut failing = passing_report("kata");
    failing.checks[0].passed = false;
    failing.passed = false;
    failing.autonomous_execution = false;
    let mut unsupported = passing_report("kata");
    unsupported.capabilities[3] = Capability::unsupported("credential-broker", "no broker");
    // A report that claims to pass because it left the capability out of its
    // own required list: the profile still requires it.
    let mut trimmed = unsupported.clone();
    trimmed
        .required_capabilities
        .retain(|c| c != "credential-broker");
    let reports = [
        ("missing", None),
        ("failing", Some(failing)),
        ("capability unsupported", Some(unsupported)),
        (
            "capability left out of the report's required list",
            Some(trimmed),
        ),
        ("other profile", Some(passing_report("gvisor"))),
    ];
    for (case, report) in reports {
        let exec = env.executor(report);
        let err = exec
            .run(
                env.spec("wi-5/cycle-1/worker-b", "echo ran > /out/ran"),
                no_cancel(),
            )
            .await
            .unwrap_err();
        match &err {
            ExecutorError::ProfileNotConformant { profile, .. } => assert_eq!(profile, "kata"),
            other => panic!("{case}: expected a refusal, got {other}"),
        }
        assert!(exec.admit().is_err(), "{case}");
    }
    assert!(env.server.writes().is_empty(), "{:?}", env.server.writes());
    assert!(env.pod_names().await.is_empty());
    assert!(env.staged_dirs().is_empty());
    assert!(!env.tmp.path().join("collected").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_run_with_a_live_run_id_is_refused() {
    let Some(env) = Env::start() else { return };
    let exec = env.admitted();
    let spec = env.spec("wi-6/cycle-1/worker-a", "sleep 60");
    let name = run_name(&spec.run_id);
    let (cancel_tx, cancel) = watch::channel(false);
    let first = tokio::spawn({
        let (exec, spec) = (exec.clone(), spec.clone());
        async move { exec.run(spec, cancel).await }
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    while env.pods().get_opt(&name).await.unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the first run never created its pod"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let err = exec.run(spec, no_cancel()).await.unwrap_err();
    assert!(matches!(err, ExecutorError::Start { .. }), "{err}");
    assert!(err.to_string().contains("already executing"), "{err}");
    cancel_tx.send_replace(true);
    let out = first.await.unwrap().unwrap();
    assert_eq!(out.termination, Termination::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_removes_only_this_instances_leftovers() {
    let Some(env) = Env::start() else { return };
    let exec = env.admitted();
    env.leftover("pb-crashed-run-0123456789", INSTANCE);
    env.leftover("pb-other-replica-0123456789", "another-replica");
    env.server
        .create_object(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "unrelated", "namespace": NS},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "c", "image": "x", "command": ["sleep", "60"]}]}
        }))
        .unwrap();
    let stale = env
        .staging
        .join("runs")
        .join(INSTANCE)
        .join("pb-crashed-run-0123456789");
    std::fs::create_dir_all(stale.join("out")).unwrap();
    std::fs::write(stale.join("out/results.json"), "{}").unwrap();

    // The pod first has to go; its staged directory goes once it has.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut removed = protobot_kube_executor::GcReport::default();
    loop {
        let r = exec.collect_garbage().await.unwrap();
        removed.pods.extend(r.pods);
        removed.network_policies.extend(r.network_policies);
        removed.staging_dirs.extend(r.staging_dirs);
        if !stale.exists() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stale staging directory was never removed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        removed
            .pods
            .contains(&"pb-crashed-run-0123456789".to_owned())
    );
    assert_eq!(removed.network_policies, ["pb-crashed-run-0123456789"]);
    assert_eq!(removed.staging_dirs, ["pb-crashed-run-0123456789"]);
    let mut pods = env.pod_names().await;
    pods.sort();
    assert_eq!(pods, ["pb-other-replica-0123456789", "unrelated"]);
    assert_eq!(env.policy_names().await, ["pb-other-replica-0123456789"]);
    assert_eq!(
        exec.collect_garbage().await.unwrap(),
        Default::default(),
        "idempotent"
    );
}

/// The replica that held an item's lease died mid-run (found on the real node: the survivor
/// resumed the build and met the dead replica's pod and NetworkPolicy under the same
/// deterministic run id, and retried "already exists" forever). A leftover of another
/// executor instance is replaced — its pod deleted and waited for, its policy deleted — and
/// the run goes on. So is a leftover of this very instance whose start or cleanup was cut
/// off (found by the API-server restart fault: the policy was created, the API server went
/// away, the cleanup's delete failed, and every retry met "already exists" forever); no run
/// of that id is live in this instance, or this run could not have started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_left_behind_by_another_replica_or_by_a_cut_off_start_is_replaced() {
    let Some(env) = Env::start() else { return };
    let exec = env.admitted();
    for (item, left_by) in [("wi-12", "a-replica-that-died"), ("wi-13", INSTANCE)] {
        let spec = env.spec(
            &format!("{item}/cycle-1/worker-a"),
            "echo '{\"ok\": true}' > /out/results.json",
        );
        let name = run_name(&spec.run_id);
        env.leftover(&name, left_by);
        let out = exec.run(spec, no_cancel()).await.unwrap();
        assert_eq!(
            out.termination,
            Termination::Exited { code: 0 },
            "{left_by}: {out:?}"
        );
        assert!(
            std::fs::read_to_string(out.out_dir.join("results.json"))
                .unwrap()
                .contains("ok"),
            "the replacing run's own output ({left_by})"
        );
        // The replacing run cleaned up after itself: nothing of either is left.
        assert!(!env.pod_names().await.contains(&name), "{left_by}");
        assert!(!env.policy_names().await.contains(&name), "{left_by}");
    }
}

/// Reports every container as OOM-killed (exit 137), as a node does after a
/// cgroup OOM kill; the bundled kubelet executors enforce no memory limit.
struct OomKiller;

impl ContainerExecutor for OomKiller {
    fn run(&self, _launch: ContainerLaunch, _kill: KillSignal) -> ExecFuture {
        Box::pin(async {
            Ok(ContainerExit {
                exit_code: 137,
                killed: false,
                oom_killed: true,
            })
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_killed_sandbox_exceeded_its_memory_limit() {
    let env = Env::with_kubelet(Some(Arc::new(OomKiller)));
    let out = env
        .admitted()
        .run(
            env.spec("wi-7/cycle-1/worker-b", "allocate-everything"),
            no_cancel(),
        )
        .await
        .unwrap();
    assert_eq!(
        out.termination,
        Termination::LimitExceeded {
            limit: "memory".into()
        }
    );
    assert!(env.pod_names().await.is_empty());
    assert!(env.policy_names().await.is_empty());
    assert!(env.staged_dirs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_with_the_egress_proxy_gets_one_egress_rule_and_the_proxy_env() {
    let Some(env) = Env::start() else { return };
    let mut spec = env.spec(
        "wi-8/cycle-1/worker-b",
        "printf %s \"$PROTOBOT_EGRESS_PROXY\" > /out/proxy && cat \"$PROTOBOT_EGRESS_SESSION_TOKEN_FILE\" > /out/token && printf %s \"${HTTPS_PROXY:-unset}\" > /out/https_proxy",
    );
    spec.role = SandboxRole::WorkerB;
    spec.task = json!({"role": "worker-b", "work_item_id": "wi-8", "source_commit": "c0ffee"});
    spec.egress_proxy = Some("http://10.96.0.42:3128".into());
    let out = env.admitted().run(spec, no_cancel()).await.unwrap();
    assert_eq!(
        out.termination,
        Termination::Exited { code: 0 },
        "{}",
        out.stderr_tail
    );
    assert_eq!(
        std::fs::read_to_string(out.out_dir.join("proxy")).unwrap(),
        "http://10.96.0.42:3128"
    );
    assert_eq!(
        std::fs::read_to_string(out.out_dir.join("https_proxy")).unwrap(),
        "unset",
        "no CONNECT-style proxy variable"
    );
    // The sandbox holds a signed token for its own session, valid for now.
    let token = std::fs::read_to_string(out.out_dir.join("token")).unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let session = protobot_egress::verify_session_token(&egress_secret(), &token, now)
        .expect("a token the proxy accepts");
    assert_eq!(session.work_item, "wi-8");
    assert_eq!(session.role, "worker-b");
    assert_eq!(session.trace_id, "wi-8/cycle-1/worker-b");
    assert_eq!(session.source_commit, "c0ffee");
    assert!(
        protobot_egress::verify_session_token(&egress_secret(), &token, now + 3_600).is_none(),
        "it expires with the run"
    );
    let np = &env.created("networkpolicies")[0];
    assert_eq!(
        np["spec"]["egress"],
        json!([{
            "to": [{
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "protobot-system"}},
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": "protobot-egress-proxy"}}
            }],
            "ports": [{"protocol": "TCP", "port": 3128}]
        }])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_pod_create_leaves_nothing_behind() {
    let Some(env) = Env::start() else { return };
    env.server.faults().inject(
        FaultRule::on(Verb::Create)
            .resource("pods")
            .status(500)
            .times(1),
    );
    let err = env
        .admitted()
        .run(env.spec("wi-9/cycle-1/worker-a", "true"), no_cancel())
        .await
        .unwrap_err();
    assert!(matches!(err, ExecutorError::Start { .. }), "{err}");
    assert!(
        err.to_string().contains("failed to create sandbox pod"),
        "{err}"
    );
    assert!(
        env.policy_names().await.is_empty(),
        "the policy made for it is deleted"
    );
    assert!(env.pod_names().await.is_empty());
    assert!(env.staged_dirs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_never_starts_hits_the_executor_deadline_and_is_deleted() {
    // No kubelet: the pod is never scheduled, so `activeDeadlineSeconds`
    // never starts counting; the executor's own deadline must end the run.
    let env = Env::with_kubelet(None);
    let mut config = env.config();
    config.start_allowance = Duration::from_secs(1);
    let exec = KubernetesExecutor::new(
        env.server.client(),
        config,
        profile(),
        Some(passing_report("kata")),
    )
    .unwrap();
    let mut spec = env.spec("wi-10/cycle-1/worker-a", "true");
    spec.limits.wall_clock = Duration::from_secs(1);
    let started = Instant::now();
    let out = exec.run(spec, no_cancel()).await.unwrap();
    assert_eq!(
        out.termination,
        Termination::LimitExceeded {
            limit: "wall-clock".into()
        }
    );
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert!(env.pod_names().await.is_empty());
    assert!(env.policy_names().await.is_empty());
    assert!(env.staged_dirs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_suite_through_this_backend_fails_closed_and_refuses() {
    let env = Env::with_kubelet(None);
    let probe = env.executor(None);
    let report = protobot_executors::run_conformance(&probe, "kata").await;
    assert!(!report.passed());
    let mut missing = report.missing_capabilities();
    missing.sort();
    assert_eq!(missing, ["credential-broker", "resource-limits"]);
    assert!(
        env.server.writes().is_empty(),
        "failing closed runs no probe"
    );
    let exec = env.executor(Some(report));
    let err = exec
        .run(env.spec("wi-11/cycle-1/worker-a", "true"), no_cancel())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("credential-broker"), "{err}");
    assert!(env.server.writes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_is_read_from_the_profiles_config_map() {
    let env = Env::with_kubelet(None);
    let client = env.server.client();
    let kata = profile();
    let read = || protobot_kube_executor::read_report_configmap(client.clone(), NS, &kata);
    assert_eq!(read().await.unwrap(), None, "no ConfigMap: no report");
    let report = passing_report("kata");
    env.server
        .create_object(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "protobot-conformance-kata", "namespace": NS},
            "data": {"report.json": serde_json::to_string(&report).unwrap()}
        }))
        .unwrap();
    assert_eq!(read().await.unwrap(), Some(report.clone()));
    let exec = env.executor(read().await.unwrap());
    assert!(exec.admit().is_ok());

    env.server
        .create_object(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "protobot-conformance-gvisor", "namespace": NS},
            "data": {"report.json": "{not json"}
        }))
        .unwrap();
    let gvisor = SandboxProfile::load(Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../sandbox-profiles/gvisor.yaml"
    )))
    .unwrap();
    let err = protobot_kube_executor::read_report_configmap(client.clone(), NS, &gvisor)
        .await
        .unwrap_err();
    assert!(
        matches!(err, protobot_kube_executor::ReportError::Parse { .. }),
        "{err}"
    );

    let file = env.tmp.path().join("report.json");
    std::fs::write(&file, serde_json::to_vec(&report).unwrap()).unwrap();
    assert_eq!(
        protobot_kube_executor::read_report_file(&file).unwrap(),
        report
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_watch_is_retried_until_the_run_ends() {
    let Some(env) = Env::start() else { return };
    // The first watch on pods answers 500: the executor must watch again.
    env.server.faults().inject(
        FaultRule::on(Verb::Watch)
            .resource("pods")
            .status(500)
            .times(1),
    );
    let out = env
        .admitted()
        .run(
            env.spec(
                "wi-12/cycle-1/worker-b",
                "sleep 1; echo ok > /out/results.json",
            ),
            no_cancel(),
        )
        .await
        .unwrap();
    assert_eq!(
        out.termination,
        Termination::Exited { code: 0 },
        "{}",
        out.stderr_tail
    );
    assert!(out.out_dir.join("results.json").is_file());
    let watches: Vec<u16> = env
        .server
        .requests()
        .iter()
        .filter(|r| r.verb == Verb::Watch && r.plural == "pods")
        .map(|r| r.code)
        .collect();
    assert_eq!(watches.first(), Some(&500), "{watches:?}");
    assert!(
        watches.len() >= 2,
        "the executor watched again: {watches:?}"
    );
    assert!(env.pod_names().await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_by_someone_else_is_a_collect_error() {
    let Some(env) = Env::start() else { return };
    let exec = env.admitted();
    let spec = env.spec("wi-13/cycle-1/worker-a", "sleep 60");
    let name = run_name(&spec.run_id);
    let run = tokio::spawn({
        let exec = exec.clone();
        async move { exec.run(spec, no_cancel()).await }
    });
    let deadline = Instant::now() + Duration::from_secs(15);
    while env.pods().get_opt(&name).await.unwrap().is_none() {
        assert!(Instant::now() < deadline, "the run never created its pod");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    env.pods()
        .delete(&name, &kube::api::DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let err = tokio::time::timeout(Duration::from_secs(20), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, ExecutorError::Collect { .. }), "{err}");
    assert!(err.to_string().contains("deleted before it ended"), "{err}");
    assert!(env.policy_names().await.is_empty());
    assert!(env.staged_dirs().is_empty());
    assert!(exec.live_runs().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_cancelled_before_it_starts_creates_nothing() {
    let env = Env::with_kubelet(None);
    let (tx, cancel) = watch::channel(true);
    let out = env
        .admitted()
        .run(env.spec("wi-14/cycle-1/worker-a", "true"), cancel)
        .await
        .unwrap();
    drop(tx);
    assert_eq!(out.termination, Termination::Cancelled);
    assert!(out.out_dir.is_dir());
    assert_eq!(std::fs::read_dir(&out.out_dir).unwrap().count(), 0);
    assert!(env.server.writes().is_empty());
    assert!(env.staged_dirs().is_empty());
}
