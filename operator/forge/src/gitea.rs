//! Gitea (or Forgejo) as the forge of a protobot Project: the thin HTTP shell over Gitea's
//! REST API (`/api/v1`), one method per call the Job Site makes, each handing status and body
//! to the pure core ([`crate::core::gitea`], and [`crate::core::approval`] /
//! [`crate::core::escalation`] for the decisions GitHub and Gitea share).
//!
//! The HTTP stack is the one the crate already has (octocrab's hyper + rustls client, used
//! only to send requests to the configured base URL; nothing GitHub-specific is called). The
//! token is sent as `Authorization: token …`, marked sensitive; redirects are never followed.
//! A `GET` is retried after a server error (three times, spaced); a mutation is not repeated
//! blindly (an issue is found again by its marker, a pull request by its branch).
//!
//! Listings are read page by page (`page`, `limit=50`: Gitea's default maximum) until a short
//! page, at most [`MAX_PAGES`] pages.

use std::time::Duration;

use http::{Method, StatusCode, header};
use http_body_util::BodyExt;
use octocrab::Octocrab;
use protobot_repo::remote::Sensitive;
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::json;

use crate::{
    auth::{AuthError, check_token},
    core::{
        approval::{
            ApprovalClaim, ApprovalRefusal, ApprovedPullRequest, ReaskPolicy, check_reviews,
            reask_after, select_merged_pull,
        },
        coordinates::{ApiBase, RepoCoordinates},
        escalation::{
            ESCALATION_LABEL, Escalation, IssueAction, body as issue_body, decide,
            title as issue_title,
        },
        gitea::{
            GiteaBranch, GiteaCombinedStatus, GiteaLabel, GiteaMergeAnswer, GiteaProtection,
            GiteaReview, classify_merge, label_id, pulls_of_branch, reviews_as_github,
        },
        merge::{MergePolicy, is_sha},
        render::sanitize_line,
        status::StatusBody,
        wire::{Issue, PullRequest, error_message},
    },
    metrics::{ForgeMetrics, Outcome},
};

pub mod landing;

pub use landing::GiteaForge;

/// Most pages read from one listing (50 per page: 2 500 items).
pub const MAX_PAGES: u32 = 50;

/// Items per page (Gitea's default `MAX_RESPONSE_ITEMS`).
const PAGE_SIZE: usize = 50;

/// Server errors retried for a `GET`.
const SERVER_RETRIES: u32 = 3;

/// Color of the escalation label when the Job Site creates it.
const ESCALATION_LABEL_COLOR: &str = "#d93f0b";

/// A Gitea call the Job Site makes (the metrics label, `gitea-…`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GiteaOperation {
    /// `GET /repos/{o}/{r}/commits/{sha}/pull`.
    PullForCommit,
    /// `GET /repos/{o}/{r}/pulls/{n}/reviews`.
    ListReviews,
    /// `GET /repos/{o}/{r}/pulls?state=all`.
    ListPulls,
    /// `POST /repos/{o}/{r}/pulls`.
    CreatePull,
    /// `PATCH /repos/{o}/{r}/pulls/{n}`.
    UpdatePull,
    /// `GET /repos/{o}/{r}/pulls/{n}`.
    GetPull,
    /// `POST /repos/{o}/{r}/pulls/{n}/merge`.
    MergePull,
    /// `GET /repos/{o}/{r}/branches/{branch}`.
    GetBranch,
    /// `GET /repos/{o}/{r}/branch_protections`.
    ListProtections,
    /// `GET /repos/{o}/{r}/commits/{sha}/status`.
    CombinedStatus,
    /// `POST /repos/{o}/{r}/statuses/{sha}`.
    CreateStatus,
    /// `GET /repos/{o}/{r}/issues`.
    ListIssues,
    /// `POST /repos/{o}/{r}/issues`.
    CreateIssue,
    /// `PATCH /repos/{o}/{r}/issues/{n}`.
    UpdateIssue,
    /// `GET /repos/{o}/{r}/labels`.
    ListLabels,
    /// `POST /repos/{o}/{r}/labels`.
    CreateLabel,
}

impl GiteaOperation {
    /// The metrics label, and the verb phrase in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            GiteaOperation::PullForCommit => "gitea-pull-for-commit",
            GiteaOperation::ListReviews => "gitea-list-reviews",
            GiteaOperation::ListPulls => "gitea-list-pulls",
            GiteaOperation::CreatePull => "gitea-create-pull",
            GiteaOperation::UpdatePull => "gitea-update-pull",
            GiteaOperation::GetPull => "gitea-get-pull",
            GiteaOperation::MergePull => "gitea-merge-pull",
            GiteaOperation::GetBranch => "gitea-get-branch",
            GiteaOperation::ListProtections => "gitea-list-branch-protections",
            GiteaOperation::CombinedStatus => "gitea-combined-status",
            GiteaOperation::CreateStatus => "gitea-create-status",
            GiteaOperation::ListIssues => "gitea-list-issues",
            GiteaOperation::CreateIssue => "gitea-create-issue",
            GiteaOperation::UpdateIssue => "gitea-update-issue",
            GiteaOperation::ListLabels => "gitea-list-labels",
            GiteaOperation::CreateLabel => "gitea-create-label",
        }
    }
}

/// Why a Gitea call failed. No variant carries the token.
#[derive(Debug, thiserror::Error)]
pub enum GiteaError {
    /// The token is unusable.
    #[error("unable to authenticate to Gitea: {source}")]
    Credentials {
        /// Why.
        #[source]
        source: AuthError,
    },
    /// The request never got an HTTP answer.
    #[error(
        "failed to reach Gitea to {operation}: {source}; check the network path to spec.forge.gitea.baseUrl"
    )]
    Transport {
        /// Operation label.
        operation: &'static str,
        /// The HTTP client's error.
        #[source]
        source: octocrab::Error,
    },
    /// Gitea answered 5xx (after the retries a `GET` gets).
    #[error("Gitea answered {status} to {operation}; it is unavailable, retry later")]
    Unavailable {
        /// Operation label.
        operation: &'static str,
        /// Status.
        status: u16,
    },
    /// Gitea refused the request (4xx).
    #[error("Gitea refused to {operation}: {status} {message}{hint}")]
    Refused {
        /// Operation label.
        operation: &'static str,
        /// Status.
        status: u16,
        /// Gitea's message (sanitized).
        message: String,
        /// What to check.
        hint: &'static str,
    },
    /// A response did not have the documented shape.
    #[error(
        "failed to read Gitea's answer to {operation}: {source}; spec.forge.gitea.baseUrl may not point at a Gitea or Forgejo server"
    )]
    Decode {
        /// Operation label.
        operation: &'static str,
        /// What did not fit.
        #[source]
        source: serde_json::Error,
    },
    /// A listing did not end within [`MAX_PAGES`].
    #[error("Gitea's listing for {operation} did not end within {MAX_PAGES} pages")]
    TooManyPages {
        /// Operation label.
        operation: &'static str,
    },
    /// A value the Job Site was asked to send is not one Gitea routes accept.
    #[error("unable to {operation}: `{value}` is not a valid {what}")]
    InvalidInput {
        /// Operation label.
        operation: &'static str,
        /// What kind of value.
        what: &'static str,
        /// The value (a branch or a sha, never a secret).
        value: String,
    },
    /// The HTTP client could not be built.
    #[error("failed to build the Gitea client for {base}: {source}")]
    Build {
        /// The base URL.
        base: String,
        /// Why.
        #[source]
        source: octocrab::Error,
    },
}

impl GiteaError {
    /// A stable label (metrics, Event reasons).
    pub fn category(&self) -> &'static str {
        match self {
            GiteaError::Credentials { .. } => "credentials",
            GiteaError::Transport { .. } => "transport",
            GiteaError::Unavailable { .. } => "unavailable",
            GiteaError::Refused { .. } => "refused",
            GiteaError::Decode { .. } => "decode",
            GiteaError::TooManyPages { .. } => "pagination",
            GiteaError::InvalidInput { .. } => "invalid-input",
            GiteaError::Build { .. } => "build",
        }
    }

    /// Whether trying the whole step again later may succeed (network, 5xx).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            GiteaError::Transport { .. } | GiteaError::Unavailable { .. }
        )
    }
}

/// The API root of a Gitea server from its base URL (`https://gitea.example` →
/// `https://gitea.example/api/v1`); validated like GitHub's (https, or http on loopback).
pub fn api_root(base_url: &str) -> Result<ApiBase, crate::core::coordinates::CoordinatesError> {
    let trimmed = base_url.trim_end_matches('/');
    let api = if trimmed.ends_with("/api/v1") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/api/v1")
    };
    ApiBase::parse(&api)
}

/// Settings of a [`GiteaClient`].
#[derive(Clone, Debug)]
pub struct GiteaSettings {
    /// The REST API root (`…/api/v1`).
    pub api_base: ApiBase,
    /// The project's repository.
    pub repository: RepoCoordinates,
    /// Connect and read timeout per request.
    pub timeout: Duration,
    /// Transient merge answers and the wait for required contexts.
    pub merge: MergePolicy,
    /// Approval lookups of a merge commit Gitea has not associated yet.
    pub reask: ReaskPolicy,
}

impl GiteaSettings {
    /// Settings with the default policies and a 30 s timeout.
    pub fn new(api_base: ApiBase, repository: RepoCoordinates) -> GiteaSettings {
        GiteaSettings {
            api_base,
            repository,
            timeout: Duration::from_secs(30),
            merge: MergePolicy::default(),
            reask: ReaskPolicy::default(),
        }
    }
}

/// One HTTP answer.
#[derive(Debug)]
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
}

/// A pull request the Job Site opened (or found) for a work item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GiteaPull {
    /// Open: merge it.
    Open {
        /// Number.
        number: u64,
    },
    /// Already merged (a rerun after a crash): verify and record.
    Merged {
        /// Number.
        number: u64,
        /// Gitea's merge commit.
        merge_commit: String,
    },
}

/// A Gitea client for one repository.
pub struct GiteaClient {
    http: Octocrab,
    settings: GiteaSettings,
    token: Sensitive,
    metrics: Option<ForgeMetrics>,
}

impl std::fmt::Debug for GiteaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GiteaClient")
            .field("api_base", &self.settings.api_base)
            .field("repository", &self.settings.repository.to_string())
            .finish_non_exhaustive()
    }
}

fn decode<T: DeserializeOwned>(operation: GiteaOperation, body: &[u8]) -> Result<T, GiteaError> {
    serde_json::from_slice(body).map_err(|source| GiteaError::Decode {
        operation: operation.as_str(),
        source,
    })
}

impl GiteaClient {
    /// A client for `settings.repository` acting with `token` (`secret` names where it came
    /// from, for messages).
    pub fn new(
        settings: GiteaSettings,
        token: Sensitive,
        secret: &str,
        metrics: Option<ForgeMetrics>,
    ) -> Result<GiteaClient, GiteaError> {
        check_token(&token, secret).map_err(|source| GiteaError::Credentials { source })?;
        let build = |source| GiteaError::Build {
            base: settings.api_base.as_str().to_string(),
            source,
        };
        let http = Octocrab::builder()
            .base_uri(settings.api_base.as_str())
            .map_err(build)?
            .set_connect_timeout(Some(settings.timeout))
            .set_read_timeout(Some(settings.timeout))
            .build()
            .map_err(build)?;
        Ok(GiteaClient {
            http,
            settings,
            token,
            metrics,
        })
    }

    /// The repository this client works on.
    pub fn repository(&self) -> &RepoCoordinates {
        &self.settings.repository
    }

    /// The settings this client applies.
    pub fn settings(&self) -> &GiteaSettings {
        &self.settings
    }

    /// The metrics this client counts on, if any.
    pub fn metrics(&self) -> Option<&ForgeMetrics> {
        self.metrics.as_ref()
    }

    /// The token: the API's and the git transport's over HTTPS (Gitea takes a token as the
    /// password of any user name).
    pub fn token(&self) -> Sensitive {
        self.token.clone()
    }

    fn count(&self, operation: GiteaOperation, outcome: Outcome) {
        if let Some(m) = &self.metrics {
            m.call(operation.as_str(), outcome);
        }
    }

    fn authorization(&self) -> Result<http::HeaderValue, GiteaError> {
        let mut value = b"token ".to_vec();
        value.extend_from_slice(self.token.as_bytes());
        let value = Sensitive::new(value);
        let mut header = http::HeaderValue::from_bytes(value.as_bytes()).map_err(|_| {
            GiteaError::Credentials {
                source: AuthError::BadToken {
                    secret: "the configured Gitea token".into(),
                },
            }
        })?;
        header.set_sensitive(true);
        Ok(header)
    }

    async fn send<B: Serialize + ?Sized>(
        &self,
        operation: GiteaOperation,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Answer, GiteaError> {
        let op = operation.as_str();
        let transport = |source| GiteaError::Transport {
            operation: op,
            source,
        };
        let mut request = self
            .http
            .build_request(
                http::Request::builder()
                    .method(method)
                    .uri(path)
                    .header(header::ACCEPT, "application/json"),
                body,
            )
            .map_err(transport)?;
        request
            .headers_mut()
            .insert(header::AUTHORIZATION, self.authorization()?);
        let response = match self.http.execute(request).await {
            Ok(r) => r,
            Err(source) => {
                self.count(operation, Outcome::TransportError);
                return Err(transport(source));
            }
        };
        let (parts, body) = response.into_parts();
        let body = match body.collect().await {
            Ok(b) => b.to_bytes().to_vec(),
            Err(source) => {
                self.count(operation, Outcome::TransportError);
                return Err(transport(source));
            }
        };
        Ok(Answer {
            status: parts.status,
            body,
        })
    }

    /// A request with server-error retries for `GET` and a metric per attempt. Returns the
    /// answer (any status but a 5xx, which is [`GiteaError::Unavailable`]), except for the
    /// merge, whose 5xx the core decides.
    async fn call<B: Serialize + ?Sized>(
        &self,
        operation: GiteaOperation,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Answer, GiteaError> {
        let idempotent = method == Method::GET;
        let mut server_errors = 0u32;
        loop {
            let answer = self.send(operation, method.clone(), path, body).await?;
            if answer.status.is_server_error() {
                self.count(operation, Outcome::ServerError);
                server_errors += 1;
                if idempotent && server_errors <= SERVER_RETRIES {
                    let wait = Duration::from_millis(500 << (server_errors - 1));
                    tracing::warn!(
                        operation = operation.as_str(),
                        status = answer.status.as_u16(),
                        "Gitea server error; retrying"
                    );
                    tokio::time::sleep(wait).await;
                    continue;
                }
                if operation == GiteaOperation::MergePull {
                    return Ok(answer);
                }
                return Err(GiteaError::Unavailable {
                    operation: operation.as_str(),
                    status: answer.status.as_u16(),
                });
            }
            self.count(
                operation,
                if answer.status.is_success() {
                    Outcome::Success
                } else {
                    Outcome::Refused
                },
            );
            return Ok(answer);
        }
    }

    fn expect_success(
        &self,
        operation: GiteaOperation,
        answer: Answer,
    ) -> Result<Answer, GiteaError> {
        if answer.status.is_success() {
            Ok(answer)
        } else {
            Err(refused(operation, &answer))
        }
    }

    async fn get<T: DeserializeOwned>(
        &self,
        operation: GiteaOperation,
        path: &str,
    ) -> Result<T, GiteaError> {
        let answer = self.call(operation, Method::GET, path, None::<&()>).await?;
        let answer = self.expect_success(operation, answer)?;
        decode(operation, &answer.body).inspect_err(|_| self.count(operation, Outcome::DecodeError))
    }

    /// Every page of a listing (`path` has a query already or not).
    async fn get_all<T: DeserializeOwned>(
        &self,
        operation: GiteaOperation,
        path: &str,
    ) -> Result<Vec<T>, GiteaError> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut items = Vec::new();
        for page in 1..=MAX_PAGES {
            let batch: Vec<T> = self
                .get(
                    operation,
                    &format!("{path}{sep}limit={PAGE_SIZE}&page={page}"),
                )
                .await?;
            let short = batch.len() < PAGE_SIZE;
            items.extend(batch);
            if short {
                return Ok(items);
            }
        }
        Err(GiteaError::TooManyPages {
            operation: operation.as_str(),
        })
    }

    fn route(&self) -> String {
        self.settings.repository.route()
    }

    // === approvals ===

    /// The pull request Gitea associates with merge commit `sha` (`None`: none).
    pub async fn pull_for_commit(&self, sha: &str) -> Result<Option<PullRequest>, GiteaError> {
        let op = GiteaOperation::PullForCommit;
        check_sha(op, sha)?;
        let path = format!("{}/commits/{sha}/pull", self.route());
        let answer = self.call(op, Method::GET, &path, None::<&()>).await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let answer = self.expect_success(op, answer)?;
        decode(op, &answer.body)
            .inspect_err(|_| self.count(op, Outcome::DecodeError))
            .map(Some)
    }

    /// The reviews of pull request `number`.
    pub async fn reviews(&self, number: u64) -> Result<Vec<GiteaReview>, GiteaError> {
        self.get_all(
            GiteaOperation::ListReviews,
            &format!("{}/pulls/{number}/reviews", self.route()),
        )
        .await
    }

    /// `approved_merge` against Gitea (its commit → pull lookup and the pull request's
    /// reviews): the outer error is Gitea failing, the inner one the decision that the change
    /// set is not an approved merge.
    pub async fn approved_merge(
        &self,
        claim: &ApprovalClaim,
    ) -> Result<Result<ApprovedPullRequest, ApprovalRefusal>, GiteaError> {
        let mut asked = 0u32;
        loop {
            asked += 1;
            let pulls: Vec<PullRequest> = self
                .pull_for_commit(&claim.merge_commit)
                .await?
                .into_iter()
                .collect();
            let decision = select_merged_pull(claim, &pulls);
            if let Some(wait) = reask_after(&self.settings.reask, claim, &pulls, &decision, asked) {
                if let Some(m) = &self.metrics {
                    m.approval_reasked();
                }
                tracing::info!(
                    change_set = %claim.change_set_id,
                    merge_commit = %claim.merge_commit,
                    "Gitea associates no pull request with the merge commit yet; asking again"
                );
                tokio::time::sleep(wait).await;
                continue;
            }
            let pull = match decision {
                Ok(p) => p,
                Err(refusal) => return Ok(Err(refusal)),
            };
            let reviews = reviews_as_github(&self.reviews(pull.number).await?);
            return Ok(check_reviews(claim, pull, &reviews));
        }
    }

    // === landing ===

    /// Every pull request from `head` (a branch of this repository) into `base`, open or
    /// closed (listed and filtered here: Gitea ignores a `head=` filter).
    pub async fn pulls_for_head(
        &self,
        head: &str,
        base: &str,
    ) -> Result<Vec<PullRequest>, GiteaError> {
        check_branch(GiteaOperation::ListPulls, head)?;
        check_branch(GiteaOperation::ListPulls, base)?;
        let listed: Vec<PullRequest> = self
            .get_all(
                GiteaOperation::ListPulls,
                &format!("{}/pulls?state=all&sort=recentupdate", self.route()),
            )
            .await?;
        let repository = self.settings.repository.to_string();
        Ok(pulls_of_branch(&listed, &repository, head, base)
            .into_iter()
            .cloned()
            .collect())
    }

    /// Opens the pull request `head` → `base`, or reuses the open one (title and body brought
    /// up to date), or reports the one that already merged.
    pub async fn open_or_reuse_pull(
        &self,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<GiteaPull, GiteaError> {
        let existing = self.pulls_for_head(head, base).await?;
        if let Some(merged) = merged_of(&existing) {
            return Ok(merged);
        }
        if let Some(open) = existing.iter().find(|p| p.state == "open") {
            let op = GiteaOperation::UpdatePull;
            let path = format!("{}/pulls/{}", self.route(), open.number);
            let update = json!({"title": title, "body": body});
            let answer = self.call(op, Method::PATCH, &path, Some(&update)).await?;
            self.expect_success(op, answer)?;
            return Ok(GiteaPull::Open {
                number: open.number,
            });
        }
        let op = GiteaOperation::CreatePull;
        let create = json!({"title": title, "body": body, "head": head, "base": base});
        let path = format!("{}/pulls", self.route());
        let answer = self.call(op, Method::POST, &path, Some(&create)).await?;
        if answer.status == StatusCode::CONFLICT {
            // Opened concurrently, or our earlier answer was lost: list again.
            let again = self.pulls_for_head(head, base).await?;
            if let Some(open) = again.iter().find(|p| p.state == "open") {
                return Ok(GiteaPull::Open {
                    number: open.number,
                });
            }
        }
        let answer = self.expect_success(op, answer)?;
        let created: PullRequest = decode(op, &answer.body)?;
        Ok(GiteaPull::Open {
            number: created.number,
        })
    }

    /// Merges pull request `number` with a merge commit while its head is `tested_head`
    /// (`head_commit_id`, the expected-head guard).
    pub async fn merge_pull(
        &self,
        number: u64,
        tested_head: &str,
        title: &str,
        message: &str,
    ) -> Result<GiteaMergeAnswer, GiteaError> {
        let op = GiteaOperation::MergePull;
        check_sha(op, tested_head)?;
        let path = format!("{}/pulls/{number}/merge", self.route());
        let body = json!({
            "Do": "merge",
            "MergeTitleField": title,
            "MergeMessageField": message,
            "head_commit_id": tested_head,
            "delete_branch_after_merge": false,
        });
        let answer = self.call(op, Method::POST, &path, Some(&body)).await?;
        if answer.status == StatusCode::UNAUTHORIZED {
            // The credential, not the pull request: a configuration error.
            return Err(refused(op, &answer));
        }
        Ok(classify_merge(answer.status, &answer.body))
    }

    /// Pull request `number` as Gitea holds it now.
    pub async fn get_pull(&self, number: u64) -> Result<PullRequest, GiteaError> {
        self.get(
            GiteaOperation::GetPull,
            &format!("{}/pulls/{number}", self.route()),
        )
        .await
    }

    /// The commit `branch` points at now (`None`: no such branch).
    pub async fn branch_head(&self, branch: &str) -> Result<Option<String>, GiteaError> {
        let op = GiteaOperation::GetBranch;
        check_branch(op, branch)?;
        let path = format!("{}/branches/{branch}", self.route());
        let answer = self.call(op, Method::GET, &path, None::<&()>).await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let answer = self.expect_success(op, answer)?;
        let found: GiteaBranch = decode(op, &answer.body)?;
        Ok(Some(found.commit.id).filter(|s| is_sha(s)))
    }

    /// The branch protection rules (`None`: the identity may not read them; Gitea lets only
    /// repository admins).
    pub async fn protections(&self) -> Result<Option<Vec<GiteaProtection>>, GiteaError> {
        let op = GiteaOperation::ListProtections;
        let path = format!("{}/branch_protections", self.route());
        let answer = self.call(op, Method::GET, &path, None::<&()>).await?;
        if matches!(
            answer.status,
            StatusCode::FORBIDDEN | StatusCode::NOT_FOUND | StatusCode::UNAUTHORIZED
        ) {
            return Ok(None);
        }
        let answer = self.expect_success(op, answer)?;
        decode(op, &answer.body).map(Some)
    }

    /// The latest status per context of `sha`.
    pub async fn combined_status(&self, sha: &str) -> Result<GiteaCombinedStatus, GiteaError> {
        let op = GiteaOperation::CombinedStatus;
        check_sha(op, sha)?;
        self.get(
            op,
            &format!("{}/commits/{sha}/status?limit=50", self.route()),
        )
        .await
    }

    /// Sets a commit status on `sha` (Gitea takes GitHub's body).
    pub async fn set_status(&self, sha: &str, status: &StatusBody) -> Result<(), GiteaError> {
        let op = GiteaOperation::CreateStatus;
        check_sha(op, sha)?;
        let path = format!("{}/statuses/{sha}", self.route());
        let answer = self.call(op, Method::POST, &path, Some(status)).await?;
        self.expect_success(op, answer).map(|_| ())
    }

    // === escalation ===

    /// The id of the escalation label, created when the repository lacks it.
    async fn escalation_label(&self) -> Result<u64, GiteaError> {
        let labels: Vec<GiteaLabel> = self
            .get_all(
                GiteaOperation::ListLabels,
                &format!("{}/labels", self.route()),
            )
            .await?;
        if let Some(id) = label_id(&labels, ESCALATION_LABEL) {
            return Ok(id);
        }
        let op = GiteaOperation::CreateLabel;
        let create = json!({
            "name": ESCALATION_LABEL,
            "color": ESCALATION_LABEL_COLOR,
            "description": "a protobot work item is blocked and needs a person's decision",
        });
        let path = format!("{}/labels", self.route());
        let answer = self.call(op, Method::POST, &path, Some(&create)).await?;
        let answer = self.expect_success(op, answer)?;
        let created: GiteaLabel = decode(op, &answer.body)?;
        Ok(created.id)
    }

    /// Opens the work item's escalation issue, or updates (and reopens) the one it has.
    /// Returns the issue number. Idempotent: a retry finds the issue among the labelled ones
    /// by its marker (every page, open and closed).
    pub async fn escalate(&self, escalation: &Escalation) -> Result<u64, GiteaError> {
        let issues: Vec<Issue> = self
            .get_all(
                GiteaOperation::ListIssues,
                &format!(
                    "{}/issues?state=all&type=issues&labels={ESCALATION_LABEL}",
                    self.route()
                ),
            )
            .await?;
        let title = issue_title(escalation);
        let body = issue_body(escalation);
        match decide(&escalation.work_item_id, &issues) {
            IssueAction::Create => {
                let label = self.escalation_label().await?;
                let op = GiteaOperation::CreateIssue;
                let path = format!("{}/issues", self.route());
                let create = json!({"title": title, "body": body, "labels": [label]});
                let answer = self.call(op, Method::POST, &path, Some(&create)).await?;
                let answer = self.expect_success(op, answer)?;
                let created: Issue = decode(op, &answer.body)?;
                Ok(created.number)
            }
            IssueAction::Update { number, reopen } => {
                let op = GiteaOperation::UpdateIssue;
                let path = format!("{}/issues/{number}", self.route());
                let mut update = json!({"title": title, "body": body});
                if reopen {
                    update["state"] = json!("open");
                }
                let answer = self.call(op, Method::PATCH, &path, Some(&update)).await?;
                self.expect_success(op, answer)?;
                Ok(number)
            }
        }
    }
}

/// The merged pull request among `pulls` with its merge commit, if one merged.
fn merged_of(pulls: &[PullRequest]) -> Option<GiteaPull> {
    pulls
        .iter()
        .filter(|p| p.merged_at.is_some())
        .find_map(|p| {
            p.merge_commit_sha
                .clone()
                .filter(|s| is_sha(s))
                .map(|merge_commit| GiteaPull::Merged {
                    number: p.number,
                    merge_commit,
                })
        })
}

fn refused(operation: GiteaOperation, answer: &Answer) -> GiteaError {
    #[derive(Deserialize)]
    struct Errors {
        #[serde(default)]
        errors: Option<Vec<String>>,
    }
    let mut message = error_message(&answer.body).unwrap_or_default();
    if let Ok(Errors {
        errors: Some(errors),
    }) = serde_json::from_slice::<Errors>(&answer.body)
    {
        for e in errors {
            message.push_str("; ");
            message.push_str(&e);
        }
    }
    let hint = match answer.status {
        StatusCode::UNAUTHORIZED => {
            "; the token in spec.forge.gitea.tokenSecretRef is not accepted (create a new access token with repository and issue write scopes)"
        }
        StatusCode::FORBIDDEN => {
            "; the token's user lacks the permission (give it write access to the repository)"
        }
        StatusCode::NOT_FOUND => {
            "; check spec.forge.gitea.owner and repository, and that the token's user can see the repository"
        }
        _ => "",
    };
    GiteaError::Refused {
        operation: operation.as_str(),
        status: answer.status.as_u16(),
        message: sanitize_line(
            if message.is_empty() {
                answer.status.canonical_reason().unwrap_or("")
            } else {
                &message
            },
            300,
        ),
        hint,
    }
}

fn check_sha(operation: GiteaOperation, sha: &str) -> Result<(), GiteaError> {
    if is_sha(sha) {
        Ok(())
    } else {
        Err(GiteaError::InvalidInput {
            operation: operation.as_str(),
            what: "commit id (40 hex digits)",
            value: sha.chars().take(80).collect(),
        })
    }
}

/// Branch names the Job Site sends: `[A-Za-z0-9._/-]`, no `..`, not starting with `-` or `/`.
fn check_branch(operation: GiteaOperation, branch: &str) -> Result<(), GiteaError> {
    let ok = !branch.is_empty()
        && branch.len() <= 200
        && !branch.starts_with(['-', '/'])
        && !branch.contains("..")
        && branch
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-'));
    if ok {
        Ok(())
    } else {
        Err(GiteaError::InvalidInput {
            operation: operation.as_str(),
            what: "branch name",
            value: branch.chars().take(80).collect(),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_api_root_is_the_base_url_with_api_v1_once() {
        assert_eq!(
            api_root("https://gitea.example/").unwrap().as_str(),
            "https://gitea.example/api/v1"
        );
        assert_eq!(
            api_root("http://127.0.0.1:3000/api/v1").unwrap().as_str(),
            "http://127.0.0.1:3000/api/v1"
        );
        assert!(api_root("http://gitea.example").is_err());
    }

    #[test]
    fn refusals_say_what_to_check_and_never_name_the_token() {
        let e = refused(
            GiteaOperation::CreateIssue,
            &Answer {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                body: br#"{"message":"[Labels]: invalid","errors":["labels must be ids"]}"#
                    .to_vec(),
            },
        );
        let text = e.to_string();
        assert!(
            text.contains("422") && text.contains("labels must be ids"),
            "{text}"
        );
        let e = refused(
            GiteaOperation::GetPull,
            &Answer {
                status: StatusCode::UNAUTHORIZED,
                body: b"{}".to_vec(),
            },
        );
        assert!(e.to_string().contains("tokenSecretRef"), "{e}");
        assert!(!e.is_transient());
    }
}
