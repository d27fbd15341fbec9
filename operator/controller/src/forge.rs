//! Forge clients per Project: a Project's `spec.forge.github` (or `spec.forge.gitea`) and its
//! Secret become one [`ProjectForge`] (a `protobot_forge::GithubClient` or
//! `protobot_forge::GiteaClient` with what the controllers need around it), cached per
//! Project and rebuilt when the spec or the Secret changes.
//!
//! Pure: [`forge_config`] (the typed settings from the spec: API base, coordinates,
//! identity, review mode, landing), [`credentials`] (the identity from the Secret's data),
//! [`git_secret`] (which Secret the git transport authenticates with), [`web_base`].
//! Edge: [`ForgeClients::for_project`] reads the Secret through
//! [`crate::repo_cache::read_secret`] (the path repository credentials take) and builds the
//! client. The token or private key lives only in the client's memory: it is never written
//! to status, Events or logs, and no error here carries it.
//!
//! The token also serves the git transport over HTTPS (docs/forge-github.md "Identity",
//! docs/forge-gitea.md; Gitea takes the token as the password of any user name):
//! with a token Secret, the clone's `origin` is bound to that Secret (key `token`, user
//! `x-access-token`); with an App, to the private-key Secret, and the process's credential
//! resolver asks the App's client for a current installation token instead of reading the
//! key ([`app_token_for`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, LazyLock, Mutex, RwLock},
    time::Duration,
};

use jiff::Timestamp;
use kube::{Client, ResourceExt};
use protobot_api::{
    BuildWorkItem, BuildWorkItemStatus, Project,
    build_work_item::awaiting_checks_condition,
    conditions::{ConditionStatus, find_condition, set_condition, types},
    project::{
        ForgeSpec, GiteaForge as GiteaSpec, GithubForge as GithubSpec, LandingMode,
        ReviewMode as SpecReviewMode,
    },
};
use protobot_forge::{
    ForgeError, GiteaClient, GiteaError, GiteaForge, GiteaSettings, GithubClient, GithubForge,
    GithubSettings,
    auth::{AppKey, AuthError, Credentials},
    core::{
        approval::{ApprovalClaim, ApprovalRefusal, ApprovedPullRequest, ReviewMode},
        coordinates::{ApiBase, CoordinatesError, DEFAULT_API_BASE, RepoCoordinates},
    },
    landing::{ChecksWait, LandingWaits},
    metrics::ForgeMetrics,
};
use protobot_jobsite::landing::Landing;
use protobot_repo::remote::{SecretRef, Sensitive};

/// Secret key of a token identity.
pub const TOKEN_KEY: &str = "token";
/// Secret key of a GitHub App's private key.
pub const PRIVATE_KEY_KEY: &str = "private-key.pem";

/// Who the operator is on GitHub, and which Secret says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// A token (`tokenSecretRef`, key `token`).
    Token {
        /// Its Secret.
        secret: SecretRef,
    },
    /// A GitHub App installation (`app`, key `private-key.pem`).
    App {
        /// App id.
        app_id: u64,
        /// Installation id.
        installation_id: u64,
        /// The private key's Secret.
        secret: SecretRef,
    },
}

impl Identity {
    /// The Secret the identity is read from.
    pub fn secret(&self) -> &SecretRef {
        match self {
            Identity::Token { secret } | Identity::App { secret, .. } => secret,
        }
    }
}

/// Which host's API a Project's forge speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForgeKind {
    /// GitHub or GitHub Enterprise Server (`spec.forge.github`).
    Github,
    /// Gitea or Forgejo (`spec.forge.gitea`).
    Gitea,
}

/// A Project's forge settings, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForgeConfig {
    /// Which host.
    pub kind: ForgeKind,
    /// The REST API.
    pub api_base: ApiBase,
    /// The repository.
    pub repository: RepoCoordinates,
    /// Who the operator acts as.
    pub identity: Identity,
    /// The review mode the spec pins (absent: the one `project.yaml` declares).
    pub review_mode: Option<ReviewMode>,
    /// How work items land.
    pub landing: LandingMode,
    /// `workItemUrl`.
    pub work_item_url: Option<String>,
    /// The repository's web page (evidence links).
    pub web_base: String,
}

/// Why a Project's forge cannot be used (no message carries a secret value).
#[derive(Debug, thiserror::Error)]
pub enum ForgeSetupError {
    /// Owner/repository are missing and not derivable, or invalid.
    #[error("Project {project}: {source}")]
    Coordinates {
        /// `namespace/name`.
        project: String,
        /// Why.
        #[source]
        source: CoordinatesError,
    },
    /// `apiBaseUrl` is not one the client accepts.
    #[error("Project {project}: {source}")]
    ApiBase {
        /// `namespace/name`.
        project: String,
        /// Why.
        #[source]
        source: CoordinatesError,
    },
    /// Neither or both of `tokenSecretRef` and `app` (the CRD refuses this; an old object may
    /// still hold it).
    #[error(
        "Project {project}: set exactly one of spec.forge.github.tokenSecretRef and spec.forge.github.app"
    )]
    Identity {
        /// `namespace/name`.
        project: String,
    },
    /// An App id or installation id is not positive.
    #[error("Project {project}: spec.forge.github.app.{field} must be a positive number")]
    AppId {
        /// `namespace/name`.
        project: String,
        /// `appId` or `installationId`.
        field: &'static str,
    },
    /// The Secret does not exist.
    #[error(
        "the forge identity Secret {secret} does not exist; create it with key `{key}` (docs/forge-github.md, docs/forge-gitea.md)"
    )]
    SecretMissing {
        /// The Secret.
        secret: SecretRef,
        /// The key it needs.
        key: &'static str,
    },
    /// The Secret lacks its key.
    #[error(
        "the forge identity Secret {secret} has no key `{key}`; store the {what} under `{key}`"
    )]
    SecretKeyMissing {
        /// The Secret.
        secret: SecretRef,
        /// The key.
        key: &'static str,
        /// What belongs there.
        what: &'static str,
    },
    /// The Secret could not be read.
    #[error("failed to read the forge identity Secret {secret}: {source}")]
    ReadSecret {
        /// The Secret.
        secret: SecretRef,
        /// Why.
        #[source]
        source: Box<crate::repo_cache::ReadSecretError>,
    },
    /// The token or key is unusable.
    #[error(transparent)]
    Credentials(#[from] AuthError),
    /// The client could not be built.
    #[error(transparent)]
    Client(Box<ForgeError>),
    /// The Gitea client could not be built.
    #[error(transparent)]
    GiteaClient(Box<GiteaError>),
    /// Both `spec.forge.github` and `spec.forge.gitea` (the CRD refuses this; an old object
    /// may still hold it).
    #[error("Project {project}: set at most one of spec.forge.github and spec.forge.gitea")]
    TwoForges {
        /// `namespace/name`.
        project: String,
    },
}

impl ForgeSetupError {
    /// A stable label (metrics, Event reasons).
    pub fn category(&self) -> &'static str {
        match self {
            ForgeSetupError::Coordinates { .. }
            | ForgeSetupError::ApiBase { .. }
            | ForgeSetupError::Identity { .. }
            | ForgeSetupError::AppId { .. }
            | ForgeSetupError::TwoForges { .. } => "forge-config",
            ForgeSetupError::SecretMissing { .. } | ForgeSetupError::SecretKeyMissing { .. } => {
                "forge-secret"
            }
            ForgeSetupError::ReadSecret { .. } => "forge-secret-read",
            ForgeSetupError::Credentials(_) => "forge-credentials",
            ForgeSetupError::Client(_) | ForgeSetupError::GiteaClient(_) => "forge-client",
        }
    }
}

fn project_key(project: &Project) -> String {
    format!(
        "{}/{}",
        project.namespace().unwrap_or_default(),
        project.name_any()
    )
}

/// The repository's web page: `https://github.com/o/r` for api.github.com, else the API's
/// origin (GitHub Enterprise Server serves both on one host).
pub fn web_base(api: &ApiBase, repository: &RepoCoordinates) -> String {
    let origin = if api.as_str() == DEFAULT_API_BASE {
        "https://github.com"
    } else {
        api.origin()
    };
    format!("{origin}/{repository}")
}

/// The forge settings of `project` (`None`: no forge), validated (pure).
pub fn forge_config(project: &Project) -> Result<Option<ForgeConfig>, ForgeSetupError> {
    let Some(forge) = project.spec.forge.as_ref() else {
        return Ok(None);
    };
    let key = project_key(project);
    let ns = project.namespace().unwrap_or_default();
    config_of(&key, &ns, &project.spec.repo_url, forge)
}

fn config_of(
    key: &str,
    ns: &str,
    repo_url: &str,
    forge: &ForgeSpec,
) -> Result<Option<ForgeConfig>, ForgeSetupError> {
    match (&forge.github, &forge.gitea) {
        (None, None) => Ok(None),
        (Some(github), None) => github_config(key, ns, repo_url, github).map(Some),
        (None, Some(gitea)) => gitea_config(key, ns, repo_url, gitea).map(Some),
        (Some(_), Some(_)) => Err(ForgeSetupError::TwoForges {
            project: key.to_string(),
        }),
    }
}

fn spec_review_mode(mode: Option<SpecReviewMode>) -> Option<ReviewMode> {
    mode.map(|m| match m {
        SpecReviewMode::SinglePlayer => ReviewMode::SinglePlayer,
        SpecReviewMode::MultiPlayer => ReviewMode::MultiPlayer,
    })
}

fn gitea_config(
    key: &str,
    ns: &str,
    repo_url: &str,
    gitea: &GiteaSpec,
) -> Result<ForgeConfig, ForgeSetupError> {
    let api_base = protobot_forge::gitea::api_root(&gitea.base_url).map_err(|source| {
        ForgeSetupError::ApiBase {
            project: key.to_string(),
            source,
        }
    })?;
    let repository = match (&gitea.owner, &gitea.repository) {
        (Some(owner), Some(name)) => RepoCoordinates::new(owner, name),
        _ => RepoCoordinates::from_repo_url(repo_url),
    }
    .map_err(|source| ForgeSetupError::Coordinates {
        project: key.to_string(),
        source,
    })?;
    let web_base = format!(
        "{}/{repository}",
        api_base.as_str().trim_end_matches("/api/v1")
    );
    Ok(ForgeConfig {
        kind: ForgeKind::Gitea,
        api_base,
        repository,
        identity: Identity::Token {
            secret: SecretRef::new(ns, &gitea.token_secret_ref.name),
        },
        review_mode: spec_review_mode(gitea.review_mode),
        landing: gitea.landing,
        work_item_url: gitea.work_item_url.clone(),
        web_base,
    })
}

fn github_config(
    key: &str,
    ns: &str,
    repo_url: &str,
    github: &GithubSpec,
) -> Result<ForgeConfig, ForgeSetupError> {
    let api_base =
        ApiBase::parse(&github.api_base_url).map_err(|source| ForgeSetupError::ApiBase {
            project: key.to_string(),
            source,
        })?;
    let repository = match (&github.owner, &github.repository) {
        (Some(owner), Some(name)) => RepoCoordinates::new(owner, name),
        _ => RepoCoordinates::from_repo_url(repo_url),
    }
    .map_err(|source| ForgeSetupError::Coordinates {
        project: key.to_string(),
        source,
    })?;
    let identity = match (&github.token_secret_ref, &github.app) {
        (Some(token), None) => Identity::Token {
            secret: SecretRef::new(ns, &token.name),
        },
        (None, Some(app)) => {
            let positive = |v: i64, field| {
                u64::try_from(v)
                    .ok()
                    .filter(|v| *v > 0)
                    .ok_or(ForgeSetupError::AppId {
                        project: key.to_string(),
                        field,
                    })
            };
            Identity::App {
                app_id: positive(app.app_id, "appId")?,
                installation_id: positive(app.installation_id, "installationId")?,
                secret: SecretRef::new(ns, &app.private_key_secret_ref.name),
            }
        }
        _ => {
            return Err(ForgeSetupError::Identity {
                project: key.to_string(),
            });
        }
    };
    let web_base = web_base(&api_base, &repository);
    Ok(ForgeConfig {
        kind: ForgeKind::Github,
        api_base,
        repository,
        identity,
        review_mode: spec_review_mode(github.review_mode),
        landing: github.landing,
        work_item_url: github.work_item_url.clone(),
        web_base,
    })
}

/// The client credentials of `identity` from its Secret's `data` (pure; the bytes are moved
/// into [`Sensitive`] values at once).
pub fn credentials(
    identity: &Identity,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<Credentials, ForgeSetupError> {
    match identity {
        Identity::Token { secret } => {
            let token = data
                .get(TOKEN_KEY)
                .ok_or_else(|| ForgeSetupError::SecretKeyMissing {
                    secret: secret.clone(),
                    key: TOKEN_KEY,
                    what: "access token",
                })?;
            // A trailing newline (`echo token > file`) is not part of the token.
            let end = token
                .iter()
                .rposition(|b| !matches!(b, b'\n' | b'\r'))
                .map_or(0, |i| i + 1);
            let trimmed = &token[..end];
            let token = Sensitive::new(trimmed.to_vec());
            protobot_forge::auth::check_token(&token, &secret.to_string())?;
            Ok(Credentials::Token {
                token,
                secret: secret.to_string(),
            })
        }
        Identity::App {
            app_id,
            installation_id,
            secret,
        } => {
            let pem =
                data.get(PRIVATE_KEY_KEY)
                    .ok_or_else(|| ForgeSetupError::SecretKeyMissing {
                        secret: secret.clone(),
                        key: PRIVATE_KEY_KEY,
                        what: "GitHub App's PEM private key",
                    })?;
            let key = AppKey::from_pem(&Sensitive::new(pem.clone()), &secret.to_string())?;
            Ok(Credentials::App {
                app_id: *app_id,
                installation_id: *installation_id,
                key,
            })
        }
    }
}

/// The Secret the git transport of `project`'s repository authenticates with: with a
/// GitHub forge and an `https://` repository, the forge's identity (its token serves git
/// too); otherwise `spec.credentialsSecretRef` (pure).
pub fn git_secret(ns: &str, project: &Project) -> Option<SecretRef> {
    let https = project.spec.repo_url.starts_with("https://");
    if https && let Ok(Some(config)) = forge_config(project) {
        return Some(config.identity.secret().clone());
    }
    project
        .spec
        .credentials_secret_ref
        .as_ref()
        .map(|r| SecretRef::new(ns, &r.name))
}

/// A forge's API client.
#[derive(Clone, Debug)]
pub enum ForgeClient {
    /// GitHub.
    Github(Arc<GithubClient>),
    /// Gitea or Forgejo.
    Gitea(Arc<GiteaClient>),
}

/// A forge call that failed (the host's own error).
#[derive(Debug, thiserror::Error)]
pub enum ForgeCallError {
    /// GitHub's.
    #[error(transparent)]
    Github(#[from] ForgeError),
    /// Gitea's.
    #[error(transparent)]
    Gitea(#[from] GiteaError),
}

impl ForgeClient {
    /// `approved_merge` on the host: the outer error is the host failing, the inner one the
    /// decision that the change set is not an approved merge.
    pub async fn approved_merge(
        &self,
        claim: &ApprovalClaim,
    ) -> Result<Result<ApprovedPullRequest, ApprovalRefusal>, ForgeCallError> {
        match self {
            ForgeClient::Github(c) => Ok(c.approved_merge(claim).await?),
            ForgeClient::Gitea(c) => Ok(c.approved_merge(claim).await?),
        }
    }
}

/// A Project's forge: its settings and its client.
#[derive(Debug)]
pub struct ProjectForge {
    /// The settings it was built from.
    pub config: ForgeConfig,
    /// The host's client.
    pub client: ForgeClient,
    /// The landings of this Project waiting for required checks (shown as the
    /// `AwaitingChecks` condition of their items, [`crate::jobsite`]).
    pub waits: LandingWaits,
    /// Items this process showed `AwaitingChecks=True` on (`None`: none yet, so the first
    /// pass looks at every item once, for a `True` a previous process left).
    shown: Mutex<Option<BTreeSet<String>>>,
}

/// The `AwaitingChecks` statuses to write: `True` with the wait's message on each item whose
/// landing waits for checks, `False` on an item that shows `True` and no longer waits; only
/// items whose condition changes (`set_condition`), as (object name, resourceVersion, new
/// status).
pub fn awaiting_checks_updates(
    items: &[BuildWorkItem],
    waits: &[ChecksWait],
    now: Timestamp,
) -> Vec<(String, Option<String>, BuildWorkItemStatus)> {
    items
        .iter()
        .filter_map(|item| {
            let mut status = item.status.clone()?;
            let wait = waits
                .iter()
                .find(|w| w.work_item_id == item.spec.work_item_id);
            let shows = find_condition(&status.conditions, types::AWAITING_CHECKS)
                .is_some_and(|c| c.status == ConditionStatus::True);
            if wait.is_none() && !shows {
                return None;
            }
            let message = wait.map(ChecksWait::message);
            let changed = set_condition(
                &mut status.conditions,
                awaiting_checks_condition(message.as_deref()),
                item.metadata.generation,
                now,
            );
            changed.then(|| {
                (
                    item.name_any(),
                    item.metadata.resource_version.clone(),
                    status,
                )
            })
        })
        .collect()
}

impl ProjectForge {
    /// Whether a pass must look at the Project's items for `AwaitingChecks`: a landing
    /// waits, an item may still show a wait that ended, or this process has not looked yet.
    pub fn checks_to_show(&self) -> bool {
        let shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        shown.as_ref().is_none_or(|s| !s.is_empty()) || !self.waits.current().is_empty()
    }

    /// Records which items show `AwaitingChecks=True` now.
    pub fn showing(&self, items: BTreeSet<String>) {
        *self.shown.lock().unwrap_or_else(|e| e.into_inner()) = Some(items);
    }
}

impl ProjectForge {
    /// How the Job Site lands this Project's work items.
    pub fn landing(&self) -> Landing {
        match (self.config.landing, &self.client) {
            (LandingMode::PullRequest, ForgeClient::Github(client)) => {
                Landing::PullRequest(Arc::new(
                    GithubForge::new(
                        Arc::clone(client),
                        &self.config.web_base,
                        self.config.work_item_url.clone(),
                    )
                    .with_waits(self.waits.clone()),
                ))
            }
            (LandingMode::PullRequest, ForgeClient::Gitea(client)) => {
                Landing::PullRequest(Arc::new(
                    GiteaForge::new(
                        Arc::clone(client),
                        &self.config.web_base,
                        self.config.work_item_url.clone(),
                    )
                    .with_waits(self.waits.clone()),
                ))
            }
            (LandingMode::DirectPush, _) => Landing::DirectPush,
        }
    }
}

/// What a cached client was built from: the spec and the Secret's version.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Fingerprint {
    repo_url: String,
    forge: ForgeSpec,
    secret_uid: Option<String>,
    secret_version: Option<String>,
}

/// GitHub clients of App identities by the Secret of their key: the credential resolver
/// mints the git transport's installation token through them.
static APP_CLIENTS: LazyLock<RwLock<BTreeMap<SecretRef, Arc<GithubClient>>>> =
    LazyLock::new(RwLock::default);

/// The App client whose private key lives in `secret`, if one was built.
pub fn app_token_for(secret: &SecretRef) -> Option<Arc<GithubClient>> {
    APP_CLIENTS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(secret)
        .cloned()
}

/// Forge clients per Project, shared by the controllers of one operator process.
pub struct ForgeClients {
    client: Client,
    metrics: Option<ForgeMetrics>,
    timeout: Duration,
    cache: tokio::sync::Mutex<BTreeMap<String, (Fingerprint, Arc<ProjectForge>)>>,
}

impl std::fmt::Debug for ForgeClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForgeClients").finish_non_exhaustive()
    }
}

impl ForgeClients {
    /// Clients reading Secrets with `client`, counting API calls on `metrics` (register
    /// them on the operator's registry: `ForgeMetrics::register`).
    pub fn new(client: Client, metrics: Option<ForgeMetrics>) -> ForgeClients {
        ForgeClients {
            client,
            metrics,
            timeout: Duration::from_secs(30),
            cache: tokio::sync::Mutex::default(),
        }
    }

    /// Per-request timeout of the clients built from now on (default 30 s).
    pub fn with_timeout(mut self, timeout: Duration) -> ForgeClients {
        self.timeout = timeout;
        self
    }

    /// The forge built for `project`, if any, without reading its Secret (what a pass shows
    /// while that forge's landings run).
    pub async fn cached(&self, project: &Project) -> Option<Arc<ProjectForge>> {
        self.cache
            .lock()
            .await
            .get(&project_key(project))
            .map(|(_, forge)| Arc::clone(forge))
    }

    /// The forge of `project` (`None`: it has none): the cached client while the spec and
    /// the Secret are unchanged, else a new one.
    pub async fn for_project(
        &self,
        project: &Project,
    ) -> Result<Option<Arc<ProjectForge>>, ForgeSetupError> {
        let key = project_key(project);
        let ns = project.namespace().unwrap_or_default();
        let forge_spec = project.spec.forge.clone().unwrap_or_default();
        let Some(config) = config_of(&key, &ns, &project.spec.repo_url, &forge_spec)? else {
            self.cache.lock().await.remove(&key);
            return Ok(None);
        };
        let secret = config.identity.secret().clone();
        let found = crate::repo_cache::read_secret(&self.client, &secret)
            .await
            .map_err(|source| ForgeSetupError::ReadSecret {
                secret: secret.clone(),
                source: Box::new(source),
            })?;
        let Some(found) = found else {
            return Err(ForgeSetupError::SecretMissing {
                secret,
                key: match config.identity {
                    Identity::Token { .. } => TOKEN_KEY,
                    Identity::App { .. } => PRIVATE_KEY_KEY,
                },
            });
        };
        let fingerprint = Fingerprint {
            repo_url: project.spec.repo_url.clone(),
            forge: forge_spec,
            secret_uid: found.uid,
            secret_version: found.resource_version,
        };
        let mut cache = self.cache.lock().await;
        if let Some((seen, forge)) = cache.get(&key)
            && *seen == fingerprint
        {
            return Ok(Some(Arc::clone(forge)));
        }
        let credentials = credentials(&config.identity, &found.data)?;
        let client = match config.kind {
            ForgeKind::Github => {
                let mut settings =
                    GithubSettings::new(config.api_base.clone(), config.repository.clone());
                settings.timeout = self.timeout;
                let client = Arc::new(
                    GithubClient::new(settings, credentials, self.metrics.clone())
                        .map_err(|e| ForgeSetupError::Client(Box::new(e)))?,
                );
                if matches!(config.identity, Identity::App { .. }) {
                    APP_CLIENTS
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(secret, Arc::clone(&client));
                }
                ForgeClient::Github(client)
            }
            ForgeKind::Gitea => {
                let Credentials::Token { token, secret } = credentials else {
                    // config_of gives a Gitea forge a token identity only.
                    return Err(ForgeSetupError::Identity { project: key });
                };
                let mut settings =
                    GiteaSettings::new(config.api_base.clone(), config.repository.clone());
                settings.timeout = self.timeout;
                ForgeClient::Gitea(Arc::new(
                    GiteaClient::new(settings, token, &secret, self.metrics.clone())
                        .map_err(|e| ForgeSetupError::GiteaClient(Box::new(e)))?,
                ))
            }
        };
        tracing::info!(project = %key, repository = %config.repository, api = config.api_base.as_str(), kind = ?config.kind, "built the forge client");
        let forge = Arc::new(ProjectForge {
            config,
            client,
            waits: LandingWaits::default(),
            shown: Mutex::new(None),
        });
        cache.insert(key, (fingerprint, Arc::clone(&forge)));
        Ok(Some(forge))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const KEY: &str = include_str!("../../forge/tests/fixtures/test-app-key.pem");

    fn project(forge: serde_json::Value, repo_url: &str) -> Project {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "widgets", "namespace": "team"},
            "spec": {
                "repoUrl": repo_url, "sandboxProfile": "local",
                "credentialsSecretRef": {"name": "git-creds"},
                "forge": forge,
            },
        }))
        .unwrap()
    }

    #[test]
    fn a_token_forge_derives_coordinates_from_the_repo_url_and_binds_git_to_its_secret() {
        let p = project(
            serde_json::json!({"github": {"tokenSecretRef": {"name": "gh"}, "reviewMode": "multi-player"}}),
            "https://github.com/acme/widgets.git",
        );
        let c = forge_config(&p).unwrap().unwrap();
        assert_eq!(c.repository.to_string(), "acme/widgets");
        assert_eq!(c.api_base.as_str(), "https://api.github.com");
        assert_eq!(c.web_base, "https://github.com/acme/widgets");
        assert_eq!(c.review_mode, Some(ReviewMode::MultiPlayer));
        assert_eq!(c.landing, LandingMode::PullRequest);
        assert_eq!(
            c.identity,
            Identity::Token {
                secret: SecretRef::new("team", "gh")
            }
        );
        // The forge's token serves the https git transport, not credentialsSecretRef.
        assert_eq!(git_secret("team", &p), Some(SecretRef::new("team", "gh")));
    }

    #[test]
    fn git_keeps_the_credentials_secret_without_a_forge_or_over_ssh() {
        let plain = project(
            serde_json::Value::Null,
            "https://github.com/acme/widgets.git",
        );
        assert_eq!(forge_config(&plain).unwrap(), None);
        assert_eq!(
            git_secret("team", &plain),
            Some(SecretRef::new("team", "git-creds"))
        );
        let ssh = project(
            serde_json::json!({"github": {"tokenSecretRef": {"name": "gh"}}}),
            "ssh://git@github.com/acme/widgets.git",
        );
        assert_eq!(
            git_secret("team", &ssh),
            Some(SecretRef::new("team", "git-creds"))
        );
    }

    #[test]
    fn an_enterprise_app_forge_is_validated_and_refusals_say_what_to_fix() {
        let p = project(
            serde_json::json!({"github": {
                "apiBaseUrl": "https://ghe.example.com/api/v3", "owner": "acme", "repository": "gadgets",
                "app": {"appId": 12, "installationId": 34, "privateKeySecretRef": {"name": "app-key"}},
                "landing": "direct-push"}}),
            "file:///srv/git/widgets.git",
        );
        let c = forge_config(&p).unwrap().unwrap();
        assert_eq!(c.web_base, "https://ghe.example.com/acme/gadgets");
        assert_eq!(c.landing, LandingMode::DirectPush);
        assert!(matches!(
            c.identity,
            Identity::App {
                app_id: 12,
                installation_id: 34,
                ..
            }
        ));
        // Not derivable from a file:// URL without owner/repository.
        let local = project(
            serde_json::json!({"github": {"tokenSecretRef": {"name": "gh"}}}),
            "file:///srv/git/widgets.git",
        );
        let e = forge_config(&local).unwrap_err();
        assert!(e.to_string().contains("spec.forge.github.owner"), "{e}");
        assert_eq!(e.category(), "forge-config");
        // A plain-http API is refused unless it is loopback.
        for (url, ok) in [
            ("http://ghe.example.com/api/v3", false),
            ("http://127.0.0.1:8080", true),
        ] {
            let p = project(
                serde_json::json!({"github": {"apiBaseUrl": url, "tokenSecretRef": {"name": "gh"}}}),
                "https://github.com/acme/widgets.git",
            );
            assert_eq!(forge_config(&p).is_ok(), ok, "{url}");
        }
        let bad_id = project(
            serde_json::json!({"github": {"app": {"appId": 0, "installationId": 3, "privateKeySecretRef": {"name": "k"}}}}),
            "https://github.com/acme/widgets.git",
        );
        assert!(
            forge_config(&bad_id)
                .unwrap_err()
                .to_string()
                .contains("app.appId")
        );
    }

    #[test]
    fn a_gitea_forge_reads_its_server_repository_and_token_secret() {
        let p = project(
            serde_json::json!({"gitea": {"baseUrl": "https://gitea.example/", "tokenSecretRef": {"name": "gt"}, "reviewMode": "single-player"}}),
            "https://gitea.example/acme/widgets.git",
        );
        let c = forge_config(&p).unwrap().unwrap();
        assert_eq!(c.kind, ForgeKind::Gitea);
        assert_eq!(c.api_base.as_str(), "https://gitea.example/api/v1");
        assert_eq!(c.repository.to_string(), "acme/widgets");
        assert_eq!(c.web_base, "https://gitea.example/acme/widgets");
        assert_eq!(c.review_mode, Some(ReviewMode::SinglePlayer));
        // The token serves git over https too.
        assert_eq!(git_secret("team", &p), Some(SecretRef::new("team", "gt")));
        let loopback = project(
            serde_json::json!({"gitea": {"baseUrl": "http://127.0.0.1:3000", "owner": "o", "repository": "r", "tokenSecretRef": {"name": "gt"}}}),
            "file:///srv/git/r.git",
        );
        assert_eq!(
            forge_config(&loopback)
                .unwrap()
                .unwrap()
                .repository
                .to_string(),
            "o/r"
        );
        let plain_http = project(
            serde_json::json!({"gitea": {"baseUrl": "http://gitea.example", "tokenSecretRef": {"name": "gt"}}}),
            "https://gitea.example/acme/widgets.git",
        );
        assert_eq!(
            forge_config(&plain_http).unwrap_err().category(),
            "forge-config"
        );
        let both = project(
            serde_json::json!({"gitea": {"baseUrl": "https://gitea.example", "tokenSecretRef": {"name": "gt"}},
                               "github": {"tokenSecretRef": {"name": "gh"}}}),
            "https://gitea.example/acme/widgets.git",
        );
        let e = forge_config(&both).unwrap_err();
        assert!(e.to_string().contains("at most one"), "{e}");
    }

    #[tokio::test]
    async fn a_gitea_project_lands_through_the_gitea_forge_unless_it_pushes_directly() {
        let forge_of = |landing: &str| {
            let p = project(
                serde_json::json!({"gitea": {"baseUrl": "http://127.0.0.1:3000", "owner": "acme",
                                   "repository": "widgets", "tokenSecretRef": {"name": "gt"},
                                   "landing": landing}}),
                "https://gitea.example/acme/widgets.git",
            );
            let config = forge_config(&p).unwrap().unwrap();
            let client = GiteaClient::new(
                GiteaSettings::new(config.api_base.clone(), config.repository.clone()),
                Sensitive::new(b"gitea-token".to_vec()),
                "team/gt",
                None,
            )
            .unwrap();
            ProjectForge {
                config,
                client: ForgeClient::Gitea(Arc::new(client)),
                waits: LandingWaits::default(),
                shown: Mutex::new(None),
            }
        };
        assert_eq!(
            format!("{:?}", forge_of("pull-request").landing()),
            "PullRequest(gitea acme/widgets)"
        );
        assert!(matches!(
            forge_of("direct-push").landing(),
            Landing::DirectPush
        ));
    }

    #[test]
    fn credentials_come_from_the_documented_keys_and_never_echo_a_value() {
        let token = Identity::Token {
            secret: SecretRef::new("team", "gh"),
        };
        let data = |k: &str, v: &[u8]| BTreeMap::from([(k.to_string(), v.to_vec())]);
        match credentials(&token, &data("token", b"ghp_secretvalue\n")).unwrap() {
            Credentials::Token { token, secret } => {
                assert_eq!(token.as_bytes(), b"ghp_secretvalue");
                assert_eq!(secret, "team/gh");
            }
            other => panic!("{other:?}"),
        }
        let missing = credentials(&token, &data("password", b"ghp_secretvalue")).unwrap_err();
        assert!(missing.to_string().contains("key `token`"), "{missing}");
        let bad = credentials(&token, &data("token", b"ghp secret value")).unwrap_err();
        assert!(!bad.to_string().contains("secret value"), "{bad}");
        let app = Identity::App {
            app_id: 1,
            installation_id: 2,
            secret: SecretRef::new("team", "app-key"),
        };
        assert!(matches!(
            credentials(&app, &data("private-key.pem", KEY.as_bytes())).unwrap(),
            Credentials::App {
                app_id: 1,
                installation_id: 2,
                ..
            }
        ));
        let e = credentials(&app, &data("private-key.pem", b"not a key")).unwrap_err();
        assert!(e.to_string().contains("team/app-key"), "{e}");
    }

    fn work_item(id: &str, conditions: serde_json::Value) -> BuildWorkItem {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "protobot.dev/v1alpha1",
            "kind": "BuildWorkItem",
            "metadata": {"name": id.to_ascii_lowercase(), "namespace": "team", "generation": 1, "resourceVersion": "7"},
            "spec": {
                "workItemId": id,
                "projectRef": {"name": "demo"},
                "materializationKey": "demo/CS-1@0",
                "changeType": "changes",
                "implementationRequired": true,
                "changedRequirements": [],
                "applicableRequirements": [],
                "dependencies": [],
            },
            "status": {"state": "merging", "contractVersion": 9, "conditions": conditions},
        }))
        .unwrap()
    }

    #[test]
    fn a_checks_wait_shows_on_its_item_and_is_cleared_once_it_ends() {
        let now = Timestamp::now();
        let wait = ChecksWait {
            work_item_id: "WI-1".into(),
            pull_request: 3,
            tested_head: "1".repeat(40),
            pending: vec!["ci/test".into()],
            since: now,
            deadline: None,
        };
        let idle = work_item("WI-2", serde_json::json!([]));
        let waiting = work_item("WI-1", serde_json::json!([]));
        let updates =
            awaiting_checks_updates(&[idle.clone(), waiting], std::slice::from_ref(&wait), now);
        // Only the waiting item is written, with its resourceVersion as the precondition.
        assert_eq!(updates.len(), 1);
        let (name, version, status) = &updates[0];
        assert_eq!((name.as_str(), version.as_deref()), ("wi-1", Some("7")));
        let shown = find_condition(&status.conditions, types::AWAITING_CHECKS).unwrap();
        assert_eq!(shown.status, ConditionStatus::True);
        assert!(shown.message.contains("\"ci/test\""), "{}", shown.message);
        // Shown already, still waiting: nothing to write.
        let shown_item = work_item("WI-1", serde_json::to_value(&status.conditions).unwrap());
        assert!(
            awaiting_checks_updates(
                std::slice::from_ref(&shown_item),
                std::slice::from_ref(&wait),
                now
            )
            .is_empty()
        );
        // The wait ended: False; an item that never waited is left alone.
        let cleared = awaiting_checks_updates(&[shown_item, idle], &[], now);
        assert_eq!(cleared.len(), 1);
        let after = find_condition(&cleared[0].2.conditions, types::AWAITING_CHECKS).unwrap();
        assert_eq!(after.status, ConditionStatus::False);
    }
}
