//! Preparing a real cluster for the scenarios: the CRDs from `crds/` installed (so
//! structural schemas, CEL rules, formats, list-type keys and size limits are the
//! server's), the chart's RBAC objects rendered by `helm template` and applied, and a
//! client that authenticates as the chart's operator ServiceAccount.
//!
//! Knobs (environment):
//! - `HELM`: the helm binary (default `.tools/helm` of the repository, else `helm` on PATH);
//! - `PROTOBOT_E2E_CHART`: the chart directory (default `charts/protobot`);
//! - `PROTOBOT_E2E_RELEASE_NAMESPACE`: the release namespace the ServiceAccount lives in
//!   (default `protobot-system`).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use k8s_openapi::{
    api::{
        authentication::v1::TokenRequest,
        authorization::v1::SelfSubjectAccessReview,
        core::v1::{Namespace, ServiceAccount},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Config, ResourceExt,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    config::{AuthInfo, KubeConfigOptions, Kubeconfig},
};

/// The field manager the scenarios install with.
const MANAGER: &str = "protobot-e2e";

/// Why a cluster could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// A file of the repository could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A manifest did not parse.
    #[error("{what} is not a valid manifest: {source}")]
    Manifest {
        /// Which manifest.
        what: String,
        /// The cause.
        #[source]
        source: serde_yaml_ng::Error,
    },
    /// helm could not render the chart.
    #[error(
        "helm template of {chart} failed ({detail}); install helm with `scripts/install-helm.sh .tools` or set HELM"
    )]
    Helm {
        /// The chart.
        chart: PathBuf,
        /// What helm said.
        detail: String,
    },
    /// The API server refused a call.
    #[error("{verb} {object}: {source}")]
    Api {
        /// The verb.
        verb: &'static str,
        /// The object.
        object: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The chart renders no operator ServiceAccount.
    #[error("the chart renders no operator ServiceAccount (serviceAccount.create=false?)")]
    NoServiceAccount,
    /// The kubeconfig could not be read.
    #[error("reading the kubeconfig: {0}")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// A condition was not reached in time.
    #[error("{0}")]
    Timeout(String),
    /// A rendered object is of a kind the scenarios do not create (it needs a controller or
    /// a node they do not run).
    #[error("{kind} {name} is not a kind the scenarios apply; leave it out of the selection")]
    NotApplied {
        /// Its kind.
        kind: String,
        /// Its name.
        name: String,
    },
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// Installs the CRDs and the chart's RBAC; returns the operator's client and the sink that
/// saw its refused calls.
pub async fn prepare(
    admin: &Client,
) -> Result<(Client, protobot_controller::api_errors::ApiErrorSink), PrepareError> {
    let version = admin
        .apiserver_version()
        .await
        .map_err(|source| PrepareError::Api {
            verb: "get",
            object: "/version".into(),
            source,
        })?;
    eprintln!(
        "e2e: against a real API server, version {} (platform {})",
        version.git_version, version.platform
    );
    install_crds(admin).await?;
    let objects = chart_rbac()?;
    let namespace = release_namespace();
    ensure_namespace(admin, &namespace).await?;
    let service_account = apply_release(admin, &objects).await?;
    let sink = protobot_controller::api_errors::ApiErrorSink::new();
    let operator = operator_client(admin, &namespace, &service_account, &sink).await?;
    wait_for_rbac(&operator).await?;
    Ok((operator, sink))
}

/// Applies a rendering's RBAC objects; returns the name of its operator ServiceAccount.
async fn apply_release(admin: &Client, objects: &[DynamicObject]) -> Result<String, PrepareError> {
    let mut service_account = None;
    for object in objects {
        apply(admin, object).await?;
        if is_operator_account(object) {
            service_account = Some(object.name_any());
        }
    }
    service_account.ok_or(PrepareError::NoServiceAccount)
}

/// A second release of the chart, rendered with `sets` (a topology: `watchNamespace`,
/// `jobSite.sandboxNamespace`, …) and applied beside the default one: its RBAC objects, and a
/// client of its own operator ServiceAccount, which holds exactly the rights that rendering
/// grants. Waits until that account may list BuildWorkItems in `namespace`.
pub async fn prepare_release(
    admin: &Client,
    release: &str,
    sets: &[String],
    namespace: &str,
) -> Result<(Client, protobot_controller::api_errors::ApiErrorSink), PrepareError> {
    install_crds(admin).await?;
    let objects = chart_rbac_with(release, sets)?;
    ensure_namespace(admin, &release_namespace()).await?;
    let service_account = apply_release(admin, &objects).await?;
    let sink = protobot_controller::api_errors::ApiErrorSink::new();
    let operator = operator_client(admin, &release_namespace(), &service_account, &sink).await?;
    wait_for_rbac_in(&operator, Some(namespace)).await?;
    Ok((operator, sink))
}

/// The default release's sandbox rights in a scenario's own `namespace`: the Role
/// `protobot-sandboxes` and its RoleBinding exactly as the chart renders them for an install
/// with `jobSite.sandboxNamespace=<namespace>` (each scenario runs its sandbox pods in its own
/// namespace, and the chart grants pod rights in the sandbox namespace only). Waits until the
/// operator ServiceAccount may create pods there.
pub async fn grant_sandbox_rights(
    admin: &Client,
    operator: &Client,
    namespace: &str,
) -> Result<(), PrepareError> {
    let sets = [
        format!("jobSite.sandboxNamespace={namespace}"),
        "jobSite.staging.create=false".to_owned(),
    ];
    let objects = chart_rbac_with("protobot", &sets)?;
    let mut granted = false;
    for object in objects.iter().filter(|o| {
        o.namespace().as_deref() == Some(namespace)
            && o.types
                .as_ref()
                .is_some_and(|t| matches!(t.kind.as_str(), "Role" | "RoleBinding"))
    }) {
        apply(admin, object).await?;
        granted = true;
    }
    if !granted {
        return Err(PrepareError::Timeout(format!(
            "the chart rendered no sandbox Role for jobSite.sandboxNamespace={namespace}"
        )));
    }
    wait_until_allowed(operator, ("", "pods", "create"), Some(namespace)).await
}

/// The chart's sandbox ServiceAccount (bound to nothing), not the operator's.
const SANDBOX_SERVICE_ACCOUNT: &str = "protobot-sandbox";

/// The `app.kubernetes.io/component` of the chart's sandbox conformance Job and its RBAC.
const CONFORMANCE_COMPONENT: &str = "sandbox-conformance";

fn is_conformance(object: &DynamicObject) -> bool {
    object
        .labels()
        .get("app.kubernetes.io/component")
        .is_some_and(|c| c == CONFORMANCE_COMPONENT)
}

fn is_service_account(object: &DynamicObject) -> bool {
    object
        .types
        .as_ref()
        .is_some_and(|t| t.kind == "ServiceAccount")
}

/// The operator's ServiceAccount: neither the sandbox pods' nor the conformance Job's.
fn is_operator_account(object: &DynamicObject) -> bool {
    is_service_account(object)
        && object.name_any() != SANDBOX_SERVICE_ACCOUNT
        && !is_conformance(object)
}

/// The name of the chart's conformance Job ServiceAccount (default values).
pub fn conformance_service_account() -> Result<String, PrepareError> {
    chart_rbac()?
        .iter()
        .find(|o| is_service_account(o) && is_conformance(o))
        .map(|o| o.name_any())
        .ok_or(PrepareError::NoServiceAccount)
}

/// The namespace the chart is "installed" in.
pub fn release_namespace() -> String {
    std::env::var("PROTOBOT_E2E_RELEASE_NAMESPACE").unwrap_or_else(|_| "protobot-system".into())
}

async fn ensure_namespace(admin: &Client, name: &str) -> Result<(), PrepareError> {
    let api: Api<Namespace> = Api::all(admin.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name},
    }))
    .map_err(|e| PrepareError::Timeout(e.to_string()))?;
    match api.create(&PostParams::default(), &ns).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(source) => Err(PrepareError::Api {
            verb: "create",
            object: format!("namespace {name}"),
            source,
        }),
    }
}

/// Server-side applies every CRD of `crds/` and waits until each is established.
async fn install_crds(admin: &Client) -> Result<(), PrepareError> {
    let dir = repo_root().join("crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|source| PrepareError::Read {
            path: dir.clone(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let api: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let mut names = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).map_err(|source| PrepareError::Read {
            path: path.clone(),
            source,
        })?;
        let crd: CustomResourceDefinition =
            serde_yaml_ng::from_str(&text).map_err(|source| PrepareError::Manifest {
                what: path.display().to_string(),
                source,
            })?;
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&crd),
        )
        .await
        .map_err(|source| PrepareError::Api {
            verb: "apply",
            object: format!("customresourcedefinition {name}"),
            source,
        })?;
        names.push(name);
    }
    for name in names {
        let established = poll(Duration::from_secs(30), || {
            let api = api.clone();
            let name = name.clone();
            async move {
                api.get(&name).await.ok().is_some_and(|crd| {
                    crd.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
            }
        })
        .await;
        if !established {
            return Err(PrepareError::Timeout(format!(
                "customresourcedefinition {name} was not established within 30 s"
            )));
        }
    }
    Ok(())
}

/// The helm binary: `HELM`, the repository's `.tools/helm`, else `helm` on PATH.
fn helm() -> PathBuf {
    if let Some(h) = std::env::var_os("HELM") {
        // A relative path is the repository's (tests run in their crate's directory).
        let h = PathBuf::from(h);
        return if h.is_relative() && h.components().count() > 1 {
            repo_root().join(h)
        } else {
            h
        };
    }
    let local = repo_root().join(".tools/helm");
    if local.is_file() {
        return local;
    }
    "helm".into()
}

/// The RBAC objects (ServiceAccounts, Roles, ClusterRoles and their bindings) the chart
/// renders with its default values, in the release namespace.
pub fn chart_rbac() -> Result<Vec<DynamicObject>, PrepareError> {
    chart_rbac_with("protobot", &[])
}

/// The chart's RBAC objects for release `release` rendered with `sets` (helm `--set`
/// values, e.g. `watchNamespace=team-a`), in the release namespace.
pub fn chart_rbac_with(release: &str, sets: &[String]) -> Result<Vec<DynamicObject>, PrepareError> {
    let mut objects = Vec::new();
    for value in render_chart(release, sets)? {
        let kind = value["kind"].as_str().unwrap_or_default();
        if !matches!(
            kind,
            "ServiceAccount" | "ClusterRole" | "ClusterRoleBinding" | "Role" | "RoleBinding"
        ) {
            continue;
        }
        let object: DynamicObject =
            serde_json::from_value(value).map_err(|e| PrepareError::Timeout(e.to_string()))?;
        objects.push(object);
    }
    Ok(objects)
}

/// Every object `helm template` renders for release `release` with `sets`, in the release
/// namespace (`PROTOBOT_E2E_CHART` names another chart directory).
pub fn render_chart(
    release: &str,
    sets: &[String],
) -> Result<Vec<serde_json::Value>, PrepareError> {
    let chart = std::env::var_os("PROTOBOT_E2E_CHART")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("charts/protobot"));
    let mut helm = Command::new(helm());
    helm.args(["template", release])
        .arg(&chart)
        .args(["--namespace", &release_namespace()]);
    for set in sets {
        helm.args(["--set", set]);
    }
    let out = helm.output().map_err(|e| PrepareError::Helm {
        chart: chart.clone(),
        detail: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(PrepareError::Helm {
            chart,
            detail: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut objects = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let value =
            <serde_json::Value as serde::Deserialize>::deserialize(doc).map_err(|source| {
                PrepareError::Manifest {
                    what: "the chart's rendered output".into(),
                    source,
                }
            })?;
        if !value.is_null() {
            objects.push(value);
        }
    }
    Ok(objects)
}

/// Server-side applies the objects of a rendering ([`render_chart`]) that `keep` selects, as
/// `helm install` would create them: ServiceAccounts, Roles, ClusterRoles, their bindings and
/// ConfigMaps (objects of other kinds are refused: they need controllers or a node the
/// scenarios do not run). Returns how many were applied.
pub async fn apply_rendered(
    admin: &Client,
    objects: &[serde_json::Value],
    keep: impl Fn(&serde_json::Value) -> bool,
) -> Result<usize, PrepareError> {
    let mut applied = 0;
    for value in objects.iter().filter(|o| keep(o)) {
        let object: DynamicObject = serde_json::from_value(value.clone())
            .map_err(|e| PrepareError::Timeout(e.to_string()))?;
        if resource_of(&object).is_none() {
            return Err(PrepareError::NotApplied {
                kind: value["kind"].as_str().unwrap_or_default().to_owned(),
                name: object.name_any(),
            });
        }
        apply(admin, &object).await?;
        applied += 1;
    }
    Ok(applied)
}

fn resource_of(object: &DynamicObject) -> Option<(ApiResource, bool)> {
    let types = object.types.as_ref()?;
    let (group, version) = match types.api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", types.api_version.as_str()),
    };
    let gvk = GroupVersionKind::gvk(group, version, &types.kind);
    let (plural, namespaced) = match types.kind.as_str() {
        "ServiceAccount" => ("serviceaccounts", true),
        "Role" => ("roles", true),
        "RoleBinding" => ("rolebindings", true),
        "ClusterRole" => ("clusterroles", false),
        "ClusterRoleBinding" => ("clusterrolebindings", false),
        "ConfigMap" => ("configmaps", true),
        _ => return None,
    };
    Some((ApiResource::from_gvk_with_plural(&gvk, plural), namespaced))
}

async fn apply(admin: &Client, object: &DynamicObject) -> Result<(), PrepareError> {
    let Some((resource, namespaced)) = resource_of(object) else {
        return Ok(());
    };
    let name = object.name_any();
    let api: Api<DynamicObject> = if namespaced {
        let ns = object.namespace().unwrap_or_else(release_namespace);
        ensure_namespace(admin, &ns).await?;
        Api::namespaced_with(admin.clone(), &ns, &resource)
    } else {
        Api::all_with(admin.clone(), &resource)
    };
    api.patch(
        &name,
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(|source| PrepareError::Api {
        verb: "apply",
        object: format!("{} {name}", resource.plural),
        source,
    })?;
    Ok(())
}

/// A client with the admin's server and CA that authenticates with a fresh token of the
/// operator's ServiceAccount (TokenRequest, one hour).
async fn operator_client(
    admin: &Client,
    namespace: &str,
    service_account: &str,
    sink: &protobot_controller::api_errors::ApiErrorSink,
) -> Result<Client, PrepareError> {
    let token = issue_token(admin, namespace, service_account).await?;
    let kubeconfig = Kubeconfig::read().map_err(PrepareError::Kubeconfig)?;
    let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(PrepareError::Kubeconfig)?;
    config.auth_info = serde_json::from_value::<AuthInfo>(serde_json::json!({"token": token}))
        .map_err(|e| PrepareError::Timeout(e.to_string()))?;
    // With the operator's own API-error layer: every 4xx it meets is a warning naming the
    // verb and the object, in the scenario's output.
    protobot_controller::api_errors::client(config, sink).map_err(|source| PrepareError::Api {
        verb: "connect",
        object: format!("as system:serviceaccount:{namespace}:{service_account}"),
        source,
    })
}

/// A fresh token (TokenRequest, one hour) of ServiceAccount `namespace/service_account`.
async fn issue_token(
    admin: &Client,
    namespace: &str,
    service_account: &str,
) -> Result<String, PrepareError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request: TokenRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"audiences": [], "expirationSeconds": 3600},
    }))
    .map_err(|e| PrepareError::Timeout(e.to_string()))?;
    let issued: TokenRequest = accounts
        .create_subresource("token", service_account, &PostParams::default(), &request)
        .await
        .map_err(|source| PrepareError::Api {
            verb: "create",
            object: format!("serviceaccounts/token {namespace}/{service_account}"),
            source,
        })?;
    Ok(issued.status.and_then(|s| s.token).unwrap_or_default())
}

/// A kubeconfig (JSON, which every kubeconfig reader takes) for a separate process that
/// authenticates as the chart's operator ServiceAccount: the admin's server and CA
/// (from `KUBECONFIG`) with a fresh token of that account.
pub async fn operator_kubeconfig(admin: &Client) -> Result<String, PrepareError> {
    let service_account = chart_rbac()?
        .iter()
        .find(|o| is_operator_account(o))
        .map(|o| o.name_any())
        .ok_or(PrepareError::NoServiceAccount)?;
    service_account_kubeconfig(admin, &release_namespace(), &service_account).await
}

/// A kubeconfig (JSON) for a separate process that authenticates as ServiceAccount
/// `namespace/service_account`: the admin's server and CA (from `KUBECONFIG`) with a fresh
/// token of that account.
pub async fn service_account_kubeconfig(
    admin: &Client,
    namespace: &str,
    service_account: &str,
) -> Result<String, PrepareError> {
    let token = issue_token(admin, namespace, service_account).await?;
    let mut kubeconfig = Kubeconfig::read().map_err(PrepareError::Kubeconfig)?;
    let user = format!("system:serviceaccount:{namespace}:{service_account}");
    kubeconfig.auth_infos = vec![
        serde_json::from_value(serde_json::json!({
            "name": user, "user": {"token": token},
        }))
        .map_err(|e| PrepareError::Timeout(e.to_string()))?,
    ];
    for context in &mut kubeconfig.contexts {
        if let Some(c) = context.context.as_mut() {
            c.user = Some(user.clone());
        }
    }
    serde_json::to_string(&kubeconfig).map_err(|e| PrepareError::Timeout(e.to_string()))
}

/// RBAC bindings take effect through the server's informers: wait until the operator may
/// list BuildWorkItems.
async fn wait_for_rbac(operator: &Client) -> Result<(), PrepareError> {
    wait_for_rbac_in(operator, None).await
}

/// [`wait_for_rbac`] in `namespace` (`None`: cluster-wide).
async fn wait_for_rbac_in(operator: &Client, namespace: Option<&str>) -> Result<(), PrepareError> {
    wait_until_allowed(
        operator,
        ("protobot.dev", "buildworkitems", "list"),
        namespace,
    )
    .await
}

/// Waits (30 s at most) until the API server's authorizer allows `operator` the `verb` on
/// `group`/`resource` in `namespace` (`None`: cluster-wide).
async fn wait_until_allowed(
    operator: &Client,
    (group, resource, verb): (&str, &str, &str),
    namespace: Option<&str>,
) -> Result<(), PrepareError> {
    let reviews: Api<SelfSubjectAccessReview> = Api::all(operator.clone());
    let allowed = poll(Duration::from_secs(30), || {
        let reviews = reviews.clone();
        async move {
            let review: SelfSubjectAccessReview = match serde_json::from_value(serde_json::json!({
                "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {
                    "group": group, "resource": resource, "verb": verb,
                    "namespace": namespace,
                }},
            })) {
                Ok(r) => r,
                Err(_) => return false,
            };
            reviews
                .create(&PostParams::default(), &review)
                .await
                .ok()
                .and_then(|r| r.status)
                .is_some_and(|s| s.allowed)
        }
    })
    .await;
    if allowed {
        Ok(())
    } else {
        Err(PrepareError::Timeout(format!(
            "the operator ServiceAccount may not {verb} {resource} in {} 30 s after the chart's RBAC was applied",
            namespace.unwrap_or("the cluster")
        )))
    }
}

async fn poll<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
