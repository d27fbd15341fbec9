#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The WMS Adapter API over HTTP against a real kube-apiserver: callers are
//! ServiceAccounts with TokenRequest tokens, authenticated by TokenReview and
//! authorized by SubjectAccessReview under real RBAC; the endpoint runs with
//! the chart's operator identity and the chart's `wmsApi` RBAC. Skipped on the
//! API double (it has no TokenReview), unless `PROTOBOT_E2E_REQUIRE_CLUSTER=1`
//! makes a missing cluster a failure.
//!
//! - `the_wms_api_authenticates_authorizes_and_answers_like_the_library`: no token, a
//!   garbage token, the wrong audience and no verb are refused with nothing written; an
//!   allowed caller gets the library's envelope and its audit events;
//! - `every_adapter_operation_answers_over_http_exactly_as_through_the_library`: the adapter
//!   tour (`protobot_stores::tour`), one ServiceAccount per role;
//! - `a_payload_ref_is_granted_only_by_its_own_review`: `record-merge` over HTTP with
//!   `wmsrefs` grants.

use std::{net::SocketAddr, process::Command, time::Duration};

use k8s_openapi::api::{
    authentication::v1::TokenRequest,
    core::v1::ServiceAccount,
    rbac::v1::{Role as RbacRole, RoleBinding},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    discovery::ApiResource,
};
use protobot_controller::wms_api::{self, Clock, WmsApiConfig, gate};
use protobot_e2e::Cluster;
use protobot_lifecycle::Role;
use protobot_stores::{
    Import, KubeStore, MemoryStore, Mode, WorkStore,
    conformance::{self, EnvelopeExt},
    tour,
};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PROJECT: &str = "shop";

/// A real cluster's scenario, or `None` (skipped) on the double.
async fn real_cluster(scenario: &str) -> Option<Cluster> {
    if std::env::var_os("KUBECONFIG").is_none() {
        assert!(
            std::env::var_os("PROTOBOT_E2E_REQUIRE_CLUSTER").is_none(),
            "PROTOBOT_E2E_REQUIRE_CLUSTER is set but KUBECONFIG is not"
        );
        eprintln!("e2e wms_api: skipped (needs a real API server: set KUBECONFIG)");
        return None;
    }
    Some(Cluster::connect(scenario).await)
}

/// Applies the chart's `wmsApi` RBAC (rendered with `wmsApi.enabled=true`) as the administrator.
async fn apply_wms_rbac(admin: &Client) {
    let helm = std::env::var("HELM")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../.tools/helm").to_string());
    let out = Command::new(helm)
        .args([
            "template",
            "protobot",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/protobot"),
        ])
        .args(["--namespace", &protobot_e2e::real::release_namespace()])
        .args([
            "--set",
            "wmsApi.enabled=true",
            "--show-only",
            "templates/wms-api.yaml",
        ])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let value: Value = serde::Deserialize::deserialize(doc).unwrap();
        if value.is_null() {
            continue;
        }
        let object: DynamicObject = serde_json::from_value(value).unwrap();
        let kind = object.types.as_ref().unwrap().kind.clone();
        let plural = match kind.as_str() {
            "ClusterRole" => "clusterroles",
            "ClusterRoleBinding" => "clusterrolebindings",
            other => panic!("unexpected {other} in templates/wms-api.yaml"),
        };
        let gvk = GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", &kind);
        let api: Api<DynamicObject> = Api::all_with(
            admin.clone(),
            &ApiResource::from_gvk_with_plural(&gvk, plural),
        );
        api.patch(
            &object.name_any(),
            &PatchParams::apply("protobot-e2e").force(),
            &Patch::Apply(&object),
        )
        .await
        .unwrap();
    }
}

/// A ServiceAccount token for `audience` (TokenRequest, ten minutes).
async fn token(admin: &Client, ns: &str, account: &str, audience: Option<&str>) -> String {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let request: TokenRequest = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": audience.map(|a| vec![a]).unwrap_or_default(), "expirationSeconds": 600},
    }))
    .unwrap();
    let issued: TokenRequest = accounts
        .create_subresource("token", account, &PostParams::default(), &request)
        .await
        .unwrap();
    issued
        .status
        .and_then(|s| s.token)
        .expect("the API server issued a token")
}

/// Creates the Project, two ServiceAccounts and a Role granting `drafting` what the example
/// Drafting Table role grants (bound to `drafting` only).
async fn setup(cluster: &Cluster) {
    let ns = cluster.namespace.as_str();
    let admin = &cluster.client;
    let gvk = GroupVersionKind::gvk("protobot.dev", "v1alpha1", "Project");
    let projects: Api<DynamicObject> = Api::namespaced_with(
        admin.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&gvk, "projects"),
    );
    let project: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
        "metadata": {"name": PROJECT, "namespace": ns},
        "spec": {"repoUrl": "https://git.example/shop.git", "sandboxProfile": "kata"},
    }))
    .unwrap();
    projects
        .create(&PostParams::default(), &project)
        .await
        .unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    for name in ["drafting", "stranger"] {
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
        accounts.create(&PostParams::default(), &sa).await.unwrap();
    }
    let role: RbacRole = serde_json::from_value(json!({
        "metadata": {"name": "wms-drafting-table"},
        "rules": [
            {"apiGroups": ["protobot.dev"], "resources": ["wmsoperations/drafting-table"],
             "resourceNames": [PROJECT], "verbs": ["request.create", "request.get", "blocked-work.query"]},
            {"apiGroups": ["protobot.dev"], "resources": ["wmsreads/request"], "verbs": ["get"]},
        ],
    }))
    .unwrap();
    Api::<RbacRole>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "wms-drafting-table"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "wms-drafting-table"},
        "subjects": [{"kind": "ServiceAccount", "name": "drafting", "namespace": ns}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// Starts the endpoint with the operator's identity; waits until its Gate may review and the
/// caller's binding took effect.
async fn start(cluster: &Cluster) -> SocketAddr {
    let (addr, _task) = wms_api::serve(
        cluster.operator.clone(),
        WmsApiConfig::new("127.0.0.1:0".parse().unwrap()),
    )
    .await
    .unwrap();
    let caller = gate::Caller {
        username: format!("system:serviceaccount:{}:drafting", cluster.namespace),
        uid: String::new(),
        groups: vec!["system:serviceaccounts".into()],
        extra: Default::default(),
    };
    let access = gate::Access::operation(
        "request.create",
        Role::DraftingTable,
        &cluster.namespace,
        PROJECT,
    );
    granted(cluster, &caller, &access).await;
    addr
}

/// Waits until the API server allows `caller` to `access` (RBAC takes effect asynchronously).
async fn granted(cluster: &Cluster, caller: &gate::Caller, access: &gate::Access) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match gate::authorize(&cluster.operator, caller, access).await {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() > deadline => {
                panic!("RBAC never took effect: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// The caller a ServiceAccount token of `account` in `ns` authenticates as.
fn account_caller(ns: &str, account: &str) -> gate::Caller {
    gate::Caller {
        username: format!("system:serviceaccount:{ns}:{account}"),
        uid: String::new(),
        groups: vec!["system:serviceaccounts".into()],
        extra: Default::default(),
    }
}

/// One HTTP/1.1 POST on the wire; returns the status and the JSON body.
async fn post(addr: SocketAddr, path: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(rest).unwrap_or(Value::Null))
}

fn create(key: &str) -> Value {
    json!({"operation": "request.create", "actor_context_ref": "drafting-table", "idempotency_key": key,
           "payload": {"intent": "Show sync status", "rationale": "Users cannot see progress",
                       "affected_interfaces": ["cli"], "affected_scopes": ["status"]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wms_api_authenticates_authorizes_and_answers_like_the_library() {
    let Some(cluster) = real_cluster("wms-api").await else {
        return;
    };
    apply_wms_rbac(&cluster.client).await;
    setup(&cluster).await;
    let addr = start(&cluster).await;
    let ns = cluster.namespace.clone();
    let ops = format!("/wms/v1/namespaces/{ns}/projects/{PROJECT}/operations?role=drafting-table");
    let reads = format!("/wms/v1/namespaces/{ns}/projects/{PROJECT}/reads");
    let store = KubeStore::new(cluster.client.clone(), &ns, PROJECT, Default::default());
    let drafting = token(
        &cluster.client,
        &ns,
        "drafting",
        Some(wms_api::DEFAULT_AUDIENCE),
    )
    .await;
    let stranger = token(
        &cluster.client,
        &ns,
        "stranger",
        Some(wms_api::DEFAULT_AUDIENCE),
    )
    .await;
    let api_server_token = token(&cluster.client, &ns, "drafting", None).await;

    // 1. Refusals, each with nothing written.
    let (status, body) = post(addr, &ops, None, &create("k-1")).await;
    assert_eq!(
        (status, body["reason"].as_str()),
        (401, Some("Unauthenticated")),
        "no token"
    );
    let (status, _) = post(addr, &ops, Some("not-a-token"), &create("k-1")).await;
    assert_eq!(status, 401, "a token the API server does not know");
    let (status, _) = post(addr, &ops, Some(&api_server_token), &create("k-1")).await;
    assert_eq!(
        status, 401,
        "a token for the API server's audience is not one for the WMS API"
    );
    let (status, body) = post(addr, &ops, Some(&stranger), &create("k-1")).await;
    assert_eq!(status, 403, "no verb: {body}");
    assert!(
        body["message"].as_str().unwrap().contains("request.create"),
        "{body}"
    );
    let hm = format!("/wms/v1/namespaces/{ns}/projects/{PROJECT}/operations?role=human-maintainer");
    let (status, _) = post(addr, &hm, Some(&drafting), &create("k-1")).await;
    assert_eq!(status, 403, "the verb in another role is another grant");
    let refine = json!({"operation": "request.refine", "actor_context_ref": "dt", "request_id": "request-001",
                        "expected_request_revision": 1, "idempotency_key": "rf-1"});
    let (status, _) = post(addr, &ops, Some(&drafting), &refine).await;
    assert_eq!(status, 403, "a verb the Role does not grant");
    assert_eq!(
        store.request("request-001").await.unwrap(),
        None,
        "nothing was written"
    );
    assert!(
        store.audit_events().await.unwrap().is_empty(),
        "no audit event"
    );

    // 2. A dry run answers and writes nothing.
    let (status, dry) = post(
        addr,
        &format!("{ops}&dryRun=true"),
        Some(&drafting),
        &create("k-1"),
    )
    .await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(
        (dry["dry_run"].clone(), dry["audit"]["count"].clone()),
        (json!(true), json!(1))
    );
    assert_eq!(
        store.request("request-001").await.unwrap(),
        None,
        "the dry run wrote nothing"
    );
    assert!(store.audit_events().await.unwrap().is_empty());

    // 3. The allowed call: the library's envelope, the trusted actor, its audit event.
    let (status, got) = post(addr, &ops, Some(&drafting), &create("k-1")).await;
    assert_eq!(status, 200, "{got}");
    let subject = format!("system:serviceaccount:{ns}:drafting");
    assert_eq!(got["actor"]["subject"], subject.as_str());
    assert_eq!(got["audit"]["count"], 1);
    assert_eq!(got["audit"]["events"][0]["subject"], subject.as_str());
    let library = MemoryStore::new(PROJECT, Default::default());
    let caller = gate::Caller {
        username: subject.clone(),
        uid: String::new(),
        groups: vec![],
        extra: Default::default(),
    };
    let now = jiff::Timestamp::now();
    let ctx = gate::context(
        &caller,
        Role::DraftingTable,
        PROJECT,
        "request.create",
        &[],
        protobot_controller::changeset::POLICY_VERSION,
        now,
    );
    let env = serde_json::from_value(create("k-1")).unwrap();
    let want = wms_api::wire::operate(&library, &ctx, &env, now, Mode::Apply)
        .await
        .unwrap();
    assert_eq!(
        got["result"],
        serde_json::to_value(&want.result).unwrap(),
        "the library's envelope"
    );
    assert_eq!(
        got["audit"],
        serde_json::to_value(&want.audit).unwrap(),
        "the library's audit events"
    );
    assert_eq!(store.audit_events().await.unwrap().len(), 1);
    // A replay is an ordinary answer, no new event; a rejection too (with its stable code).
    let (_, replay) = post(addr, &ops, Some(&drafting), &create("k-1")).await;
    assert_eq!(
        (
            replay["result"]["outcome"].clone(),
            replay["audit"]["count"].clone()
        ),
        (json!("replayed"), json!(0))
    );
    let (status, dup) = post(addr, &ops, Some(&drafting), &create("k-2")).await;
    assert_eq!(
        (status, dup["result"]["error"]["code"].clone()),
        (200, json!("DUPLICATE_REQUEST"))
    );
    // A body that tries to carry its own context is unusable (400), nothing written.
    let mut forged = create("k-3");
    forged["role"] = json!("human-maintainer");
    let (status, _) = post(addr, &ops, Some(&drafting), &forged).await;
    assert_eq!(status, 400);
    assert_eq!(store.audit_events().await.unwrap().len(), 1);

    // 4. Reads: granted kinds answer, others are refused.
    let (status, r) = post(
        addr,
        &reads,
        Some(&drafting),
        &json!({"read": "request", "id": "request-001"}),
    )
    .await;
    assert_eq!(
        (
            status,
            r["found"].clone(),
            r["value"]["request_revision"].clone()
        ),
        (200, json!(true), json!(1))
    );
    let (status, _) = post(
        addr,
        &reads,
        Some(&drafting),
        &json!({"read": "work-item", "id": "wi-1"}),
    )
    .await;
    assert_eq!(status, 403, "the full record is not a Drafting Table's");
    let (status, _) = post(
        addr,
        &reads,
        None,
        &json!({"read": "request", "id": "request-001"}),
    )
    .await;
    assert_eq!(status, 401);

    cluster.cleanup().await;
}

/// Creates Project `name` (as `setup` does) in the cluster's namespace.
async fn create_project(cluster: &Cluster, name: &str) {
    let gvk = GroupVersionKind::gvk("protobot.dev", "v1alpha1", "Project");
    let projects: Api<DynamicObject> = Api::namespaced_with(
        cluster.client.clone(),
        &cluster.namespace,
        &ApiResource::from_gvk_with_plural(&gvk, "projects"),
    );
    let project: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
        "metadata": {"name": name, "namespace": cluster.namespace},
        "spec": {"repoUrl": "https://git.example/shop.git", "sandboxProfile": "kata"},
    }))
    .unwrap();
    projects
        .create(&PostParams::default(), &project)
        .await
        .unwrap();
}

/// Creates ServiceAccount `account`, a Role with `rules` and its binding to the account.
async fn account_with_rules(cluster: &Cluster, account: &str, rules: Value) {
    let (admin, ns) = (&cluster.client, cluster.namespace.as_str());
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": account}})).unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    if accounts.get_opt(account).await.unwrap().is_none() {
        accounts.create(&PostParams::default(), &sa).await.unwrap();
    }
    let role: RbacRole =
        serde_json::from_value(json!({"metadata": {"name": account}, "rules": rules})).unwrap();
    Api::<RbacRole>::namespaced(admin.clone(), ns)
        .patch(
            account,
            &PatchParams::apply("protobot-e2e").force(),
            &Patch::Apply(&role),
        )
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": account},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": ns}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), ns)
        .patch(
            account,
            &PatchParams::apply("protobot-e2e").force(),
            &Patch::Apply(&binding),
        )
        .await
        .unwrap();
}

/// An audit log as its timelines per work item (an event without one on its own): the
/// order every store keeps (`WorkStore::audit_events`).
fn by_item(
    events: Vec<protobot_lifecycle::AuditEvent>,
) -> std::collections::BTreeMap<String, Vec<protobot_lifecycle::AuditEvent>> {
    let mut timelines: std::collections::BTreeMap<String, Vec<_>> = Default::default();
    for e in events {
        let home = if e.work_item_id.is_empty() {
            format!("key:{}", e.idempotency_key)
        } else {
            format!("item:{}", e.work_item_id)
        };
        timelines.entry(home).or_default().push(e);
    }
    timelines
}

/// The endpoint with the operator's identity deciding at the conformance evaluation time.
async fn start_at_eval_time(cluster: &Cluster) -> SocketAddr {
    let mut cfg = WmsApiConfig::new("127.0.0.1:0".parse().unwrap());
    cfg.clock = Clock::Fixed(conformance::eval_time());
    wms_api::serve(cluster.operator.clone(), cfg)
        .await
        .unwrap()
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_adapter_operation_answers_over_http_exactly_as_through_the_library() {
    let Some(cluster) = real_cluster("wms-api-tour").await else {
        return;
    };
    apply_wms_rbac(&cluster.client).await;
    let ns = cluster.namespace.clone();
    let project = conformance::PROJECT;
    create_project(&cluster, project).await;
    // One ServiceAccount per role, each granted every operation in its own role only.
    let roles = [
        Role::DraftingTable,
        Role::HumanMaintainer,
        Role::Materializer,
        Role::JobSite,
        Role::Reconciler,
    ];
    let mut tokens = std::collections::BTreeMap::new();
    for role in roles {
        let account = format!("tour-{}", role.as_str());
        account_with_rules(
            &cluster,
            &account,
            json!([{"apiGroups": ["protobot.dev"], "resources": [format!("wmsoperations/{}", role.as_str())],
                    "resourceNames": [project], "verbs": ["*"]}]),
        )
        .await;
        let probe = gate::Access::operation("schedule", role, &ns, project);
        granted(&cluster, &account_caller(&ns, &account), &probe).await;
        let token = token(
            &cluster.client,
            &ns,
            &account,
            Some(wms_api::DEFAULT_AUDIENCE),
        )
        .await;
        tokens.insert(role.as_str(), (account, token));
    }
    let addr = start_at_eval_time(&cluster).await;
    let now = conformance::eval_time();
    // Both stores start from the tour's seeds, with the adapter settings the endpoint uses.
    let cfg = wms_api::project_adapter_config(&cluster.client, &ns, project)
        .await
        .unwrap()
        .expect("the Project exists");
    let served = KubeStore::new(cluster.client.clone(), &ns, project, cfg.clone());
    tour::seed(&served).await.unwrap();
    let library = MemoryStore::new(project, cfg);
    tour::seed(&library).await.unwrap();

    let mut covered = std::collections::BTreeSet::new();
    let mut codes = Vec::new();
    let mut fence = protobot_lifecycle::FencingToken::default();
    for (i, (role, mut env)) in tour::steps().into_iter().enumerate() {
        if env.fencing_token == tour::FENCE {
            env.fencing_token = fence.clone();
        }
        let (account, token) = &tokens[role.as_str()];
        let path = format!(
            "/wms/v1/namespaces/{ns}/projects/{project}/operations?role={}",
            role.as_str()
        );
        let (status, got) = post(
            addr,
            &path,
            Some(token),
            &serde_json::to_value(&env).unwrap(),
        )
        .await;
        assert_eq!(status, 200, "step {i} ({}): {got}", env.operation);
        let refs = protobot_lifecycle::prepare(&env)
            .map(|p| p.named_payload_refs(Some(role)))
            .unwrap_or_default();
        let ctx = gate::context(
            &account_caller(&ns, account),
            role,
            project,
            &env.operation,
            &refs,
            protobot_controller::changeset::POLICY_VERSION,
            now,
        );
        let want = wms_api::wire::operate(&library, &ctx, &env, now, Mode::Apply)
            .await
            .unwrap();
        assert_eq!(
            got,
            serde_json::to_value(&want).unwrap(),
            "step {i} ({}): the endpoint's answer differs from the library's",
            env.operation
        );
        if let Some(t) = want
            .result
            .decision
            .as_ref()
            .and_then(|d| d.fencing_token_issued.clone())
        {
            fence = t;
        }
        codes.push((
            env.operation.clone(),
            want.result.code().map(|c| c.as_str()),
            want.audit.count,
        ));
        if let Some(op) = protobot_lifecycle::Operation::parse(&env.operation) {
            covered.insert(op);
        }
    }
    let all: std::collections::BTreeSet<_> =
        protobot_lifecycle::Operation::ALL.iter().copied().collect();
    assert_eq!(covered, all, "every adapter operation went over HTTP");
    let applied = codes
        .iter()
        .filter(|(_, c, n)| c.is_none() && *n == 1)
        .count();
    assert!(applied >= 8, "successful mutations: {codes:?}");
    let rejected: std::collections::BTreeSet<&str> =
        codes.iter().filter_map(|(_, c, _)| *c).collect();
    for code in [
        "UNAUTHORIZED_ACTION",
        "DUPLICATE_REQUEST",
        "NOT_FOUND",
        "STALE_FENCING_TOKEN",
    ] {
        assert!(
            rejected.contains(code),
            "{code} among the rejections: {codes:?}"
        );
    }
    assert_eq!(
        by_item(served.audit_events().await.unwrap()),
        by_item(library.audit_events().await.unwrap()),
        "the served store holds the library's audit log"
    );
    assert_eq!(
        served.list(&Default::default()).await.unwrap(),
        library.list(&Default::default()).await.unwrap(),
        "and its records"
    );
    cluster.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payload_ref_is_granted_only_by_its_own_review() {
    let Some(cluster) = real_cluster("wms-api-refs").await else {
        return;
    };
    apply_wms_rbac(&cluster.client).await;
    let ns = cluster.namespace.clone();
    let project = conformance::PROJECT;
    create_project(&cluster, project).await;
    let account = "landing";
    let caller = account_caller(&ns, account);
    let operations = json!({"apiGroups": ["protobot.dev"], "resources": ["wmsoperations/job-site"],
                            "resourceNames": [project], "verbs": ["record-merge"]});
    // The Job Site may record merges, and name commits and inspection runs, but may land
    // only on `release`.
    account_with_rules(
        &cluster,
        account,
        json!([operations,
               {"apiGroups": ["protobot.dev"], "resources": [format!("wmsrefs/{project}")],
                "verbs": ["commit", "inspection-run"]},
               {"apiGroups": ["protobot.dev"], "resources": [format!("wmsrefs/{project}")],
                "resourceNames": ["release"], "verbs": ["target"]}]),
    )
    .await;
    let inspection = protobot_lifecycle::NamedRef {
        field: protobot_lifecycle::RefField::InspectionRunId,
        name: "run-1".into(),
    };
    granted(
        &cluster,
        &caller,
        &gate::Access::reference(&inspection, &ns, project),
    )
    .await;
    let token = token(
        &cluster.client,
        &ns,
        account,
        Some(wms_api::DEFAULT_AUDIENCE),
    )
    .await;
    let cfg = wms_api::project_adapter_config(&cluster.client, &ns, project)
        .await
        .unwrap()
        .unwrap();
    let store = KubeStore::new(cluster.client.clone(), &ns, project, cfg);
    let mut record = conformance::leased(
        conformance::item("wi-m", protobot_lifecycle::State::Merging, 9),
        &caller.username,
        "fence-m",
        3600,
    );
    record.expected_merge = Some(conformance::candidate(9, ""));
    store.import(Import::Record(record)).await.unwrap();
    let addr = start_at_eval_time(&cluster).await;
    let path = format!("/wms/v1/namespaces/{ns}/projects/{project}/operations?role=job-site");
    let merge = serde_json::to_value(
        conformance::cmd(
            protobot_lifecycle::Command::RecordMerge,
            "wi-m",
            protobot_lifecycle::State::Merging,
            9,
            "rm-1",
        )
        .fence("fence-m")
        .payload(json!({"merge_envelope": conformance::candidate(9, "merge-1")})),
    )
    .unwrap();

    let (status, body) = post(addr, &path, Some(&token), &merge).await;
    assert_eq!(status, 403, "landing on main is not granted: {body}");
    let message = body["message"].as_str().unwrap();
    assert!(
        message.contains("target wmsrefs.protobot.dev/fixture-project")
            && message.contains("/main"),
        "the refusal names the verb and the ref: {message}"
    );
    assert!(
        store.audit_events().await.unwrap().is_empty(),
        "nothing written"
    );
    assert_eq!(
        store.get("wi-m").await.unwrap().unwrap().state,
        protobot_lifecycle::State::Merging
    );

    // Granting `main` as a target (and nothing else changed) lets the merge be recorded.
    account_with_rules(
        &cluster,
        account,
        json!([operations,
               {"apiGroups": ["protobot.dev"], "resources": [format!("wmsrefs/{project}")],
                "verbs": ["commit", "inspection-run"]},
               {"apiGroups": ["protobot.dev"], "resources": [format!("wmsrefs/{project}")],
                "resourceNames": ["release", "main"], "verbs": ["target"]}]),
    )
    .await;
    let main = protobot_lifecycle::NamedRef {
        field: protobot_lifecycle::RefField::Target,
        name: "main".into(),
    };
    granted(
        &cluster,
        &caller,
        &gate::Access::reference(&main, &ns, project),
    )
    .await;
    let (status, body) = post(addr, &path, Some(&token), &merge).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["ok"], true, "{body}");
    assert_eq!(
        store.get("wi-m").await.unwrap().unwrap().state,
        protobot_lifecycle::State::Completed
    );
    assert_eq!(store.audit_events().await.unwrap().len(), 1);
    cluster.cleanup().await;
}
