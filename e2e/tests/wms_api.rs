#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The WMS Adapter API over HTTP against a real kube-apiserver: callers are
//! ServiceAccounts with TokenRequest tokens, authenticated by TokenReview and
//! authorized by SubjectAccessReview under real RBAC; the endpoint runs with
//! the chart's operator identity and the chart's `wmsApi` RBAC. Skipped on the
//! API double (it has no TokenReview), unless `PROTOBOT_E2E_REQUIRE_CLUSTER=1`
//! makes a missing cluster a failure.
//!
//! - `no_token_wrong_audience_and_no_verb_are_refused_with_nothing_written`
//! - `an_allowed_caller_gets_the_library_envelope_and_its_audit_events`

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
use protobot_controller::wms_api::{self, WmsApiConfig, gate};
use protobot_e2e::Cluster;
use protobot_lifecycle::Role;
use protobot_stores::{KubeStore, MemoryStore, Mode, WorkStore};
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
    let access = gate::Access {
        verb: "request.create".into(),
        resource: gate::OPERATIONS,
        subresource: "drafting-table".into(),
        namespace: cluster.namespace.clone(),
        project: PROJECT.into(),
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match gate::authorize(&cluster.operator, &caller, &access).await {
            Ok(()) => break,
            Err(e) if tokio::time::Instant::now() > deadline => {
                panic!("RBAC never took effect: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    addr
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
