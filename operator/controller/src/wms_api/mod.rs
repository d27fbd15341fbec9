//! The WMS Adapter API over HTTP: every adapter operation and the store reads,
//! served by the operator so a Drafting Table (or a script) in the cluster
//! goes through the rules-checked boundary instead of writing CRDs.
//!
//! Pipeline per request, only the edges touch the API server:
//! bearer token → [`gate::authenticate`] (TokenReview; none or refused: 401) →
//! parse the body ([`wire::WmsRequest`]; unusable: 400) → [`gate::authorize`]
//! (SubjectAccessReview of the operation's verb, then of each ref the payload
//! names; refused: 403) → the Project
//! (absent: 404) → [`wire::answer`] on the Project's [`KubeStore`] → 200 with
//! the answer (a rejection is an ordinary answer with its stable code). Nothing
//! is read from or written to the work store before the Gate allowed the call.
//! The trusted context is built by [`gate::context`] from the reviewed caller;
//! nothing in the body can widen it. Every API-server call goes through the
//! operator's client, so each 4xx is a warning naming verb and object
//! (`crate::api_errors`).
//!
//! Routes (docs/wms-api.md, docs/wms-api.openapi.json):
//! - `POST /wms/v1/namespaces/{namespace}/projects/{project}/operations?role=<role>[&dryRun=true]`
//! - `POST /wms/v1/namespaces/{namespace}/projects/{project}/reads`
//! - `GET /wms/v1/openapi.json`

pub mod gate;
pub mod openapi;
pub mod tls;
pub mod wire;

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Router,
    body::Bytes,
    extract::{Path, State as AxumState},
    http::{HeaderMap, StatusCode, Uri, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use jiff::Timestamp;
use kube::{Api, Client};
use protobot_api::Project;
use protobot_lifecycle::Role;
use protobot_stores::{AdapterConfig, KubeStore, Mode};
use serde::Serialize;
use tokio::{net::TcpListener, task::JoinHandle};

use self::{
    gate::{Access, GateError},
    wire::{RequestError, WmsRequest},
};

/// Settings of the endpoint.
#[derive(Clone, Debug)]
pub struct WmsApiConfig {
    /// Listen address.
    pub addr: SocketAddr,
    /// Token audiences the endpoint accepts (empty: the API server's default audience).
    pub audiences: Vec<String>,
    /// The Gate's policy version (recorded on every decision and audit event).
    pub policy_version: String,
    /// The time decisions are taken at.
    pub clock: Clock,
    /// Serve HTTPS with this certificate (re-read when it changes); `None`: plain HTTP.
    pub tls: Option<tls::TlsFiles>,
}

/// The time the endpoint decides at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Clock {
    /// The system clock (production).
    #[default]
    System,
    /// A fixed instant (replays and tests that compare answers with the library's).
    Fixed(Timestamp),
}

impl Clock {
    /// The current time by this clock.
    pub fn now(self) -> Timestamp {
        match self {
            Clock::System => Timestamp::now(),
            Clock::Fixed(at) => at,
        }
    }
}

impl WmsApiConfig {
    /// The endpoint on `addr` with the operator's policy version and the
    /// audience `protobot-wms`.
    pub fn new(addr: SocketAddr) -> WmsApiConfig {
        WmsApiConfig {
            addr,
            audiences: vec![DEFAULT_AUDIENCE.to_string()],
            policy_version: crate::changeset::POLICY_VERSION.to_string(),
            clock: Clock::System,
            tls: None,
        }
    }
}

/// The token audience the chart configures by default.
pub const DEFAULT_AUDIENCE: &str = "protobot-wms";

/// Why the endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum WmsApiError {
    /// Binding the listen address failed.
    #[error("failed to bind the WMS API to {addr}; pick another --wms-api-addr or free the port")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The TLS certificate could not be loaded.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
}

/// How long a client has to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Clone)]
struct App {
    client: Client,
    cfg: Arc<WmsApiConfig>,
}

/// The error body of every non-200 answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct Problem {
    /// The HTTP status.
    pub status: u16,
    /// `Unauthenticated`, `Forbidden`, `BadRequest`, `NotFound` or `Unavailable`.
    pub reason: String,
    /// What went wrong and what to do.
    pub message: String,
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_vec(body) {
        Ok(bytes) => (status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            format!("failed to encode the answer: {e}"),
        )
            .into_response(),
    }
}

fn problem(status: StatusCode, reason: &str, message: impl Into<String>) -> Response {
    let body = Problem {
        status: status.as_u16(),
        reason: reason.to_string(),
        message: message.into(),
    };
    let mut response = json(status, &body);
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

impl IntoResponse for GateError {
    fn into_response(self) -> Response {
        match &self {
            GateError::Unauthenticated(_) => problem(
                StatusCode::UNAUTHORIZED,
                "Unauthenticated",
                self.to_string(),
            ),
            GateError::Forbidden { .. } => {
                problem(StatusCode::FORBIDDEN, "Forbidden", self.to_string())
            }
            GateError::Review { .. } => {
                tracing::error!(error = %crate::wms_api::chain(&self), "the WMS API cannot review callers");
                problem(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Unavailable",
                    self.to_string(),
                )
            }
        }
    }
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The bearer token of `headers`, if any.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The query of an operation call.
#[derive(Debug, PartialEq, Eq)]
struct OperationQuery {
    role: Role,
    mode: Mode,
}

fn operation_query(uri: &Uri) -> Result<OperationQuery, String> {
    let mut role = None;
    let mut mode = Mode::Apply;
    for pair in uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "role" => {
                role = Some(Role::parse(value).ok_or_else(|| {
                    format!("role `{value}` is not one of human-maintainer, drafting-table, materializer, job-site, reconciler")
                })?)
            }
            "dryRun" => {
                mode = match value {
                    "true" | "" => Mode::DryRun,
                    "false" => Mode::Apply,
                    other => return Err(format!("dryRun `{other}` is not true or false")),
                }
            }
            other => return Err(format!("query parameter `{other}` is unknown (role, dryRun)")),
        }
    }
    let role = role.ok_or("name the role you act in: ?role=drafting-table (or another role)")?;
    Ok(OperationQuery { role, mode })
}

/// The router (exposed for in-process tests and embedding).
pub fn router(client: Client, cfg: WmsApiConfig) -> Router {
    Router::new()
        .route(
            "/wms/v1/namespaces/{namespace}/projects/{project}/operations",
            post(operation),
        )
        .route(
            "/wms/v1/namespaces/{namespace}/projects/{project}/reads",
            post(read),
        )
        .route("/wms/v1/openapi.json", get(openapi_document))
        .with_state(App {
            client,
            cfg: Arc::new(cfg),
        })
}

async fn openapi_document() -> Response {
    json(StatusCode::OK, &openapi::document())
}

/// The adapter settings of Project `namespace/project` (`None`: no such
/// Project): the Project's lease length and the operator's Materializer
/// subject, exactly as the in-cluster Job Site opens its store.
pub async fn project_adapter_config(
    client: &Client,
    namespace: &str,
    project: &str,
) -> Result<Option<AdapterConfig>, kube::Error> {
    let projects: Api<Project> = Api::namespaced(client.clone(), namespace);
    Ok(projects.get_opt(project).await?.map(|p| AdapterConfig {
        materializer_subject: crate::changeset::MATERIALIZER_SUBJECT.into(),
        lease_seconds: i64::from(p.spec.lease_duration_seconds),
    }))
}

/// The work store of Project `namespace/project` (`None`: no such Project),
/// configured by [`project_adapter_config`].
pub async fn project_store(
    client: &Client,
    namespace: &str,
    project: &str,
) -> Result<Option<KubeStore>, kube::Error> {
    Ok(project_adapter_config(client, namespace, project)
        .await?
        .map(|cfg| KubeStore::new(client.clone(), namespace, project, cfg)))
}

/// The Project's store, or the answer saying why not.
async fn store(app: &App, namespace: &str, project: &str) -> Result<KubeStore, Response> {
    match project_store(&app.client, namespace, project).await {
        Ok(Some(store)) => Ok(store),
        Ok(None) => Err(problem(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("no Project {namespace}/{project}; check the namespace and the Project's name"),
        )),
        Err(e) => Err(problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            format!("failed to read Project {namespace}/{project}: {e}"),
        )),
    }
}

/// The caller named by the request's bearer token (TokenReview), or the 401 to answer.
async fn authenticated(app: &App, headers: &HeaderMap) -> Result<gate::Caller, Response> {
    let Some(token) = bearer(headers) else {
        return Err(
            GateError::Unauthenticated("send `Authorization: Bearer <token>`".into())
                .into_response(),
        );
    };
    gate::authenticate(&app.client, token, &app.cfg.audiences)
        .await
        .map_err(IntoResponse::into_response)
}

async fn operation(
    AxumState(app): AxumState<App>,
    Path((namespace, project)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = match authenticated(&app, &headers).await {
        Ok(c) => c,
        Err(refused) => return refused,
    };
    let query = match operation_query(&uri) {
        Ok(q) => q,
        Err(e) => return problem(StatusCode::BAD_REQUEST, "BadRequest", e),
    };
    let env = match parse(&body) {
        Ok(WmsRequest::Operation(env)) => env,
        Ok(WmsRequest::Read(_)) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "a store read goes to .../reads, not .../operations",
            );
        }
        Err(e) => return problem(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let access = Access::operation(&env.operation, query.role, &namespace, &project);
    if let Err(e) = gate::authorize(&app.client, &caller, &access).await {
        tracing::info!(user = %caller.username, access = %access.describe(), "WMS API call refused");
        return e.into_response();
    }
    // Refs the payload names, each reviewed on its own (§3 item 7). A payload the rules
    // cannot decode names none; the adapter then answers its INVALID_REQUEST.
    let refs = protobot_lifecycle::prepare(&env)
        .map(|p| p.named_payload_refs(Some(query.role)))
        .unwrap_or_default();
    for named in &refs {
        let access = Access::reference(named, &namespace, &project);
        if let Err(e) = gate::authorize(&app.client, &caller, &access).await {
            tracing::info!(user = %caller.username, access = %access.describe(), field = named.field.as_str(), "WMS API call refused: a payload ref is not granted");
            return e.into_response();
        }
    }
    let store = match store(&app, &namespace, &project).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    let now = app.cfg.clock.now();
    let ctx = gate::context(
        &caller,
        query.role,
        &project,
        &env.operation,
        &refs,
        &app.cfg.policy_version,
        now,
    );
    match wire::operate(&store, &ctx, &env, now, query.mode).await {
        Ok(answer) => {
            tracing::info!(
                user = %caller.username,
                access = %access.describe(),
                dry_run = answer.dry_run,
                code = answer.result.error.as_ref().map(|r| r.code.as_str()).unwrap_or("ok"),
                audit_events = answer.audit.count,
                "WMS API call answered"
            );
            json(StatusCode::OK, &answer)
        }
        Err(e) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            format!("WMS_UNAVAILABLE: {e}; read first, then retry with the same idempotency key"),
        ),
    }
}

async fn read(
    AxumState(app): AxumState<App>,
    Path((namespace, project)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let caller = match authenticated(&app, &headers).await {
        Ok(c) => c,
        Err(refused) => return refused,
    };
    let read = match parse(&body) {
        Ok(WmsRequest::Read(r)) => r,
        Ok(WmsRequest::Operation(_)) => {
            return problem(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                "an operation goes to .../operations?role=<role>; a read names `read`",
            );
        }
        Err(e) => return problem(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let access = Access::read(read.kind(), &namespace, &project);
    if let Err(e) = gate::authorize(&app.client, &caller, &access).await {
        tracing::info!(user = %caller.username, access = %access.describe(), "WMS API read refused");
        return e.into_response();
    }
    let store = match store(&app, &namespace, &project).await {
        Ok(s) => s,
        Err(r) => return r,
    };
    match wire::read(&store, &read).await {
        Ok(answer) => json(StatusCode::OK, &answer),
        Err(e) => problem(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            format!("WMS_UNAVAILABLE: {e}"),
        ),
    }
}

fn parse(body: &[u8]) -> Result<WmsRequest, RequestError> {
    let text = std::str::from_utf8(body).map_err(|e| RequestError::NotJson(e.to_string()))?;
    WmsRequest::parse(text)
}

/// Binds `cfg.addr` and serves the endpoint until the task is aborted.
/// Returns the bound address (useful with port 0) and the server task.
pub async fn serve(
    client: Client,
    cfg: WmsApiConfig,
) -> Result<(SocketAddr, JoinHandle<()>), WmsApiError> {
    let addr = cfg.addr;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| WmsApiError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| WmsApiError::Bind { addr, source })?;
    let tls = match &cfg.tls {
        Some(files) => {
            let resolver = Arc::new(tls::ReloadingCert::new(files.clone())?);
            Some(tokio_rustls::TlsAcceptor::from(Arc::new(
                resolver.server_config()?,
            )))
        }
        None => None,
    };
    let app = router(client, cfg);
    let task = match tls {
        None => {
            tracing::info!(%bound, "WMS API listening (plain HTTP)");
            tokio::spawn(async move {
                if let Err(e) = axum::serve(listener, app).await {
                    tracing::error!(error = %e, "WMS API server stopped");
                }
            })
        }
        Some(acceptor) => {
            tracing::info!(%bound, "WMS API listening (HTTPS)");
            tokio::spawn(serve_tls(listener, acceptor, app))
        }
    };
    Ok((bound, task))
}

/// Accepts TLS connections and serves each with HTTP/1.1 on its own task. A client
/// that fails or stalls its handshake costs only its own connection.
async fn serve_tls(listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor, app: Router) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and similar: wait, then accept again.
                tracing::warn!(error = %e, "the WMS API could not accept a connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "WMS API TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "WMS API TLS handshake timed out");
                    return;
                }
            };
            let service = hyper_util::service::TowerToHyperService::new(app);
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "WMS API connection ended with an error");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// GET `path` over TLS trusting `ca`; the status line's code, the body and the leaf
    /// certificate the server presented.
    async fn get_tls(
        addr: SocketAddr,
        ca: &std::path::Path,
        path: &str,
    ) -> std::io::Result<(u16, String, Vec<u8>)> {
        use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut tls = connector.connect(name, tcp).await?;
        let leaf = tls.get_ref().1.peer_certificates().unwrap()[0]
            .as_ref()
            .to_vec();
        tls.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut raw = Vec::new();
        let _ = tls.read_to_end(&mut raw).await;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        Ok((status, body.to_string(), leaf))
    }

    #[tokio::test]
    async fn with_a_certificate_the_endpoint_speaks_only_https_and_serves_a_rotated_certificate() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let dir = tempfile::tempdir().unwrap();
        let first = tls::tests::self_signed(dir.path(), "first");
        let second = tls::tests::self_signed(dir.path(), "second");
        let live = tls::TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        std::fs::copy(&first.cert, &live.cert).unwrap();
        std::fs::copy(&first.key, &live.key).unwrap();
        // The endpoint's own routes need no API server: an unreachable one will do.
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let mut cfg = WmsApiConfig::new("127.0.0.1:0".parse().unwrap());
        cfg.tls = Some(live.clone());
        let (addr, task) = serve(client, cfg).await.unwrap();
        let ca = dir.path().join("ca.crt");

        let (status, body, leaf) = get_tls(addr, &ca, "/wms/v1/openapi.json").await.unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("protobot WMS Adapter API"));
        let first_der = CertificateDerPem::read(&first.cert);
        assert_eq!(leaf, first_der, "the mounted certificate is presented");

        // Plain HTTP on the TLS port gets no HTTP answer (and no token crosses in clear).
        let mut plain = tokio::net::TcpStream::connect(addr).await.unwrap();
        plain
            .write_all(b"GET /wms/v1/openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut raw = Vec::new();
        let _ = plain.read_to_end(&mut raw).await;
        assert!(
            !String::from_utf8_lossy(&raw).contains("HTTP/1.1 200"),
            "no plain answer"
        );

        // A rotated Secret is served from the next handshake on.
        std::fs::copy(&second.cert, &live.cert).unwrap();
        std::fs::copy(&second.key, &live.key).unwrap();
        let later = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
        for p in [&live.cert, &live.key] {
            std::fs::File::options()
                .append(true)
                .open(p)
                .unwrap()
                .set_modified(later)
                .unwrap();
        }
        let (status, _, leaf) = get_tls(addr, &ca, "/wms/v1/openapi.json").await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            leaf,
            CertificateDerPem::read(&second.cert),
            "the rotated certificate"
        );
        task.abort();
    }

    /// The DER of the first certificate of a PEM file.
    struct CertificateDerPem;
    impl CertificateDerPem {
        fn read(path: &std::path::Path) -> Vec<u8> {
            use rustls::pki_types::{CertificateDer, pem::PemObject};
            CertificateDer::from_pem_file(path)
                .unwrap()
                .as_ref()
                .to_vec()
        }
    }

    #[tokio::test]
    async fn an_unloadable_certificate_stops_the_endpoint_from_starting() {
        let dir = tempfile::tempdir().unwrap();
        let client =
            Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
        let mut cfg = WmsApiConfig::new("127.0.0.1:0".parse().unwrap());
        cfg.tls = Some(tls::TlsFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        });
        let e = serve(client, cfg).await.unwrap_err().to_string();
        assert!(
            e.contains("tls.crt") && e.contains("--wms-api-tls-cert"),
            "{e}"
        );
    }

    #[test]
    fn only_a_bearer_token_is_a_credential() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "Bearer ".parse().unwrap());
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, "bearer tok".parse().unwrap());
        assert_eq!(bearer(&h), Some("tok"));
    }

    #[test]
    fn the_query_names_a_known_role_and_an_optional_dry_run() {
        let q = |s: &str| operation_query(&s.parse::<Uri>().unwrap());
        assert_eq!(
            q("/x?role=drafting-table&dryRun=true"),
            Ok(OperationQuery {
                role: Role::DraftingTable,
                mode: Mode::DryRun
            })
        );
        assert_eq!(q("/x?role=job-site").map(|q| q.mode), Ok(Mode::Apply));
        assert!(q("/x").is_err(), "a role is required");
        assert!(q("/x?role=admin").is_err());
        assert!(q("/x?role=job-site&dryRun=maybe").is_err());
        assert!(
            q("/x?role=job-site&subject=root").is_err(),
            "no identity in the query"
        );
    }
}
