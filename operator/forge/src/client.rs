//! The thin shell over octocrab: one request path ([`GithubClient::call`]) that adds the
//! bearer token, applies the rate-limit policy, counts every attempt, and hands status,
//! headers and body to the pure core, plus one method per GitHub call the Job Site makes.
//!
//! octocrab is used as the HTTP stack (hyper + rustls with ring, base URI, timeouts), built
//! without authentication: the `Authorization` header is added here per request, marked
//! sensitive, from [`Credentials`] (a Secret's token, or a GitHub App's installation token
//! minted and refreshed in memory). octocrab's redirect following and retry layers are not
//! compiled in: a redirect is never followed with the token, and retries are the policy's.
//!
//! Only idempotent requests are retried after a server error; a `POST` whose answer was lost
//! is not repeated blindly (the escalation issue is found again by its marker instead).
//!
//! Requests that create or change content are paced as GitHub documents
//! ([`crate::core::ratelimit::Pacing`]): one at a time per client, a second apart, within the
//! minute and hour budgets, so a burst of items landing together stays clear of the secondary
//! limits.

use std::{collections::VecDeque, time::Duration};

use http::{HeaderMap, Method, StatusCode, header};
use http_body_util::BodyExt;
use octocrab::Octocrab;
use protobot_repo::remote::Sensitive;
use serde::Serialize;
use serde_json::json;
use tokio::sync::Mutex;

use crate::{
    auth::{AuthError, Bearer, Credentials, authorization, parse_expiry},
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
        merge::{MergeAnswer, MergePolicy, classify_merge, is_sha},
        page::{PageError, next_page},
        ratelimit::{Pacing, RateLimited, RetryDecision, RetryPolicy, classify},
        status::StatusBody,
        wire::{
            CheckRuns, CombinedStatus, Comparison, DecodeError, GitRef, InstallationToken, Issue,
            PullRequest, Review, decode, error_message,
        },
    },
    metrics::{ForgeMetrics, Outcome},
};

/// Most pages read from one listing (GitHub's 100 per page: 5 000 items).
pub const MAX_PAGES: usize = 50;

/// Server errors retried for an idempotent request (ARCHITECTURE.md §5: network 3).
const SERVER_RETRIES: u32 = 3;

/// A GitHub call the Job Site makes (the metrics label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// `POST /app/installations/{id}/access_tokens`.
    MintToken,
    /// `GET /repos/{o}/{r}/commits/{sha}/pulls`.
    PullsForCommit,
    /// `GET /repos/{o}/{r}/pulls/{n}/reviews`.
    ListReviews,
    /// `GET /repos/{o}/{r}/pulls?head=…&base=…`.
    ListPulls,
    /// `POST /repos/{o}/{r}/pulls`.
    CreatePull,
    /// `PATCH /repos/{o}/{r}/pulls/{n}`.
    UpdatePull,
    /// `GET /repos/{o}/{r}/pulls/{n}`.
    GetPull,
    /// `GET /repos/{o}/{r}/git/ref/heads/{branch}`.
    GetRef,
    /// `PUT /repos/{o}/{r}/pulls/{n}/merge`.
    MergePull,
    /// `GET /repos/{o}/{r}/commits/{sha}/status`.
    CombinedStatus,
    /// `GET /repos/{o}/{r}/commits/{sha}/check-runs`.
    CheckRuns,
    /// `GET /repos/{o}/{r}/compare/{sha}...{branch}`.
    Compare,
    /// `POST /repos/{o}/{r}/statuses/{sha}`.
    CreateStatus,
    /// `GET /repos/{o}/{r}/issues?labels=…`.
    ListIssues,
    /// `POST /repos/{o}/{r}/issues`.
    CreateIssue,
    /// `PATCH /repos/{o}/{r}/issues/{n}`.
    UpdateIssue,
}

impl Operation {
    /// The metrics label, and the verb phrase in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::MintToken => "mint-installation-token",
            Operation::PullsForCommit => "list-pulls-for-commit",
            Operation::ListReviews => "list-reviews",
            Operation::ListPulls => "list-pulls",
            Operation::CreatePull => "create-pull",
            Operation::UpdatePull => "update-pull",
            Operation::GetPull => "get-pull",
            Operation::GetRef => "get-ref",
            Operation::MergePull => "merge-pull",
            Operation::CombinedStatus => "combined-status",
            Operation::CheckRuns => "list-check-runs",
            Operation::Compare => "compare",
            Operation::CreateStatus => "create-status",
            Operation::ListIssues => "list-issues",
            Operation::CreateIssue => "create-issue",
            Operation::UpdateIssue => "update-issue",
        }
    }
}

/// Why a GitHub call failed. No variant carries a token: messages name Secrets, never values.
#[derive(Debug, thiserror::Error)]
pub enum ForgeError {
    /// The credentials could not be prepared.
    #[error("unable to authenticate to GitHub: {source}")]
    Credentials {
        /// Why.
        #[source]
        source: AuthError,
    },
    /// The request never got an HTTP answer.
    #[error(
        "failed to reach GitHub to {operation}: {source}; check the network path to spec.forge.github.apiBaseUrl"
    )]
    Transport {
        /// Operation label.
        operation: &'static str,
        /// The HTTP client's error.
        #[source]
        source: octocrab::Error,
    },
    /// GitHub's rate limit outlasted the retry policy.
    #[error(
        "GitHub rate-limited {operation} ({kind} limit) beyond the retry policy; retry after {retry_after_secs} s"
    )]
    RateLimited {
        /// Operation label.
        operation: &'static str,
        /// `primary`, `secondary`, or `pacing` (the hour's budget of mutations is spent).
        kind: &'static str,
        /// GitHub's wait.
        retry_after_secs: u64,
    },
    /// GitHub answered 5xx (after the retries an idempotent request gets).
    #[error("GitHub answered {status} to {operation}; it is unavailable, retry later")]
    Unavailable {
        /// Operation label.
        operation: &'static str,
        /// Status.
        status: u16,
    },
    /// GitHub refused the request (4xx other than a rate limit).
    #[error("GitHub refused to {operation}: {status} {message}")]
    Refused {
        /// Operation label.
        operation: &'static str,
        /// Status.
        status: u16,
        /// GitHub's message (sanitized).
        message: String,
    },
    /// A response did not have the documented shape.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// Pagination left the API base.
    #[error(transparent)]
    Page(#[from] PageError),
    /// A listing did not end within [`MAX_PAGES`].
    #[error("GitHub's listing for {operation} did not end within {MAX_PAGES} pages")]
    TooManyPages {
        /// Operation label.
        operation: &'static str,
    },
    /// A value the Job Site was asked to send is not one GitHub routes accept.
    #[error("unable to {operation}: `{value}` is not a valid {what}")]
    InvalidInput {
        /// Operation label.
        operation: &'static str,
        /// What kind of value.
        what: &'static str,
        /// The value (a branch or a sha, never a secret).
        value: String,
    },
    /// The octocrab client could not be built.
    #[error("failed to build the GitHub client for {base}: {source}")]
    Build {
        /// The API base URL.
        base: String,
        /// Why.
        #[source]
        source: octocrab::Error,
    },
}

impl ForgeError {
    /// A stable label (metrics, Event reasons).
    pub fn category(&self) -> &'static str {
        match self {
            ForgeError::Credentials { .. } => "credentials",
            ForgeError::Transport { .. } => "transport",
            ForgeError::RateLimited { .. } => "rate-limited",
            ForgeError::Unavailable { .. } => "unavailable",
            ForgeError::Refused { .. } => "refused",
            ForgeError::Decode(_) => "decode",
            ForgeError::Page(_) | ForgeError::TooManyPages { .. } => "pagination",
            ForgeError::InvalidInput { .. } => "invalid-input",
            ForgeError::Build { .. } => "build",
        }
    }

    /// Whether trying the whole step again later may succeed (network, limits, 5xx).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ForgeError::Transport { .. }
                | ForgeError::RateLimited { .. }
                | ForgeError::Unavailable { .. }
        )
    }
}

/// Settings of a [`GithubClient`].
#[derive(Clone, Debug)]
pub struct GithubSettings {
    /// The REST API.
    pub api_base: ApiBase,
    /// The project's repository.
    pub repository: RepoCoordinates,
    /// Rate-limit retries.
    pub retry: RetryPolicy,
    /// Connect and read timeout per request.
    pub timeout: Duration,
    /// Pacing of the requests that create or change content.
    pub pacing: Pacing,
    /// Transient merge answers and the wait for required checks.
    pub merge: MergePolicy,
    /// Approval lookups of a merge commit GitHub has not associated yet.
    pub reask: ReaskPolicy,
}

impl GithubSettings {
    /// Settings with the default policies and a 30 s timeout.
    pub fn new(api_base: ApiBase, repository: RepoCoordinates) -> GithubSettings {
        GithubSettings {
            api_base,
            repository,
            retry: RetryPolicy::default(),
            timeout: Duration::from_secs(30),
            pacing: Pacing::default(),
            merge: MergePolicy::default(),
            reask: ReaskPolicy::default(),
        }
    }
}

/// One HTTP answer, as the core reads it.
#[derive(Debug)]
pub struct Answer {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body bytes.
    pub body: Vec<u8>,
}

/// A pull request the Job Site opened (or found) for a work item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullState {
    /// Open: merge it.
    Open {
        /// Number.
        number: u64,
        /// Its head commit as GitHub sees it.
        head_sha: String,
    },
    /// Already merged (a rerun after a crash): verify and record.
    Merged {
        /// Number.
        number: u64,
        /// GitHub's merge commit.
        merge_commit: String,
    },
}

/// A GitHub client for one repository.
pub struct GithubClient {
    crab: Octocrab,
    settings: GithubSettings,
    credentials: Credentials,
    cached: Mutex<Option<Bearer>>,
    metrics: Option<ForgeMetrics>,
    pacer: Mutex<Sent>,
}

/// When this client's mutations started, on the clock of its creation (the pacing's input).
struct Sent {
    origin: tokio::time::Instant,
    starts: VecDeque<Duration>,
}

impl std::fmt::Debug for GithubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubClient")
            .field("api_base", &self.settings.api_base)
            .field("repository", &self.settings.repository.to_string())
            .field("credentials", &self.credentials)
            .finish_non_exhaustive()
    }
}

fn now_epoch() -> i64 {
    jiff::Timestamp::now().as_second()
}

impl GithubClient {
    /// A client for `settings.repository` authenticated by `credentials`.
    pub fn new(
        settings: GithubSettings,
        credentials: Credentials,
        metrics: Option<ForgeMetrics>,
    ) -> Result<GithubClient, ForgeError> {
        let build = |source| ForgeError::Build {
            base: settings.api_base.as_str().to_string(),
            source,
        };
        let crab = Octocrab::builder()
            .base_uri(settings.api_base.as_str())
            .map_err(build)?
            .set_connect_timeout(Some(settings.timeout))
            .set_read_timeout(Some(settings.timeout))
            .build()
            .map_err(build)?;
        if let Credentials::Token { token, secret } = &credentials {
            crate::auth::check_token(token, secret)
                .map_err(|source| ForgeError::Credentials { source })?;
        }
        Ok(GithubClient {
            crab,
            settings,
            credentials,
            cached: Mutex::new(None),
            metrics,
            pacer: Mutex::new(Sent {
                origin: tokio::time::Instant::now(),
                starts: VecDeque::new(),
            }),
        })
    }

    /// The repository this client works on.
    pub fn repository(&self) -> &RepoCoordinates {
        &self.settings.repository
    }

    /// The settings (policies) this client applies.
    pub fn settings(&self) -> &GithubSettings {
        &self.settings
    }

    /// The metrics this client counts on, if any.
    pub fn metrics(&self) -> Option<&ForgeMetrics> {
        self.metrics.as_ref()
    }

    /// The current bearer token: the Secret's, or a fresh installation token. Also what the
    /// git transport uses over HTTPS (user `x-access-token`, this as the password).
    pub async fn token(&self) -> Result<Sensitive, ForgeError> {
        match &self.credentials {
            Credentials::Token { token, .. } => Ok(token.clone()),
            Credentials::App {
                app_id,
                installation_id,
                key,
            } => {
                let mut cached = self.cached.lock().await;
                let now = now_epoch();
                if let Some(bearer) = cached.as_ref().filter(|b| b.fresh_at(now)) {
                    return Ok(bearer.token.clone());
                }
                let jwt = key
                    .jwt(*app_id, now)
                    .map_err(|source| ForgeError::Credentials { source })?;
                let path = format!("/app/installations/{installation_id}/access_tokens");
                let scope = json!({"repositories": [self.settings.repository.name()]});
                let answer = self
                    .send(
                        Operation::MintToken,
                        Method::POST,
                        &path,
                        Some(&scope),
                        &jwt,
                    )
                    .await?;
                let answer = self.expect_success(Operation::MintToken, answer)?;
                let minted: InstallationToken = decode(Operation::MintToken.as_str(), &answer.body)
                    .inspect_err(|_| self.count(Operation::MintToken, Outcome::DecodeError))?;
                let token = Sensitive::new(minted.token.into_bytes());
                crate::auth::check_token(&token, "the installation token GitHub minted")
                    .map_err(|source| ForgeError::Credentials { source })?;
                *cached = Some(Bearer {
                    token: token.clone(),
                    expires_at: parse_expiry(&minted.expires_at).or(Some(now + 50 * 60)),
                });
                tracing::debug!(installation_id, "minted a GitHub installation token");
                Ok(token)
            }
        }
    }

    fn count(&self, operation: Operation, outcome: Outcome) {
        if let Some(m) = &self.metrics {
            m.call(operation.as_str(), outcome);
        }
    }

    /// One attempt with `token`.
    async fn send<B: Serialize + ?Sized>(
        &self,
        operation: Operation,
        method: Method,
        path: &str,
        body: Option<&B>,
        token: &Sensitive,
    ) -> Result<Answer, ForgeError> {
        let op = operation.as_str();
        let mut request = self.crab.build_request(
            http::Request::builder()
                .method(method.clone())
                .uri(path)
                .header(header::ACCEPT, "application/vnd.github+json"),
            body,
        );
        if let Ok(r) = request.as_mut() {
            match authorization(token) {
                Some(value) => {
                    r.headers_mut().insert(header::AUTHORIZATION, value);
                }
                None => {
                    return Err(ForgeError::Credentials {
                        source: AuthError::BadToken {
                            secret: "the configured credential".into(),
                        },
                    });
                }
            }
        }
        let request = request.map_err(|source| ForgeError::Transport {
            operation: op,
            source,
        })?;
        let response = match self.crab.execute(request).await {
            Ok(r) => r,
            Err(source) => {
                self.count(operation, Outcome::TransportError);
                return Err(ForgeError::Transport {
                    operation: op,
                    source,
                });
            }
        };
        let (parts, body) = response.into_parts();
        let body = match body.collect().await {
            Ok(b) => b.to_bytes().to_vec(),
            Err(source) => {
                self.count(operation, Outcome::TransportError);
                return Err(ForgeError::Transport {
                    operation: op,
                    source,
                });
            }
        };
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// A request with the rate-limit policy, server-error retries for idempotent methods, one
    /// fresh installation token after a 401, and a metric per attempt. Returns the final
    /// answer (any status but a limit or a 5xx).
    pub async fn call<B: Serialize + ?Sized>(
        &self,
        operation: Operation,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Answer, ForgeError> {
        let op = operation.as_str();
        let idempotent = matches!(method, Method::GET | Method::HEAD);
        let mut limited_hits = 0u32;
        let mut secondary_hits = 0u32;
        let mut server_errors = 0u32;
        let mut refreshed = false;
        loop {
            let token = self.token().await?;
            // A mutation holds the pacer while it is in flight: one at a time, spaced.
            let paced = if idempotent {
                None
            } else {
                Some(self.pace(operation).await?)
            };
            let answer = self
                .send(operation, method.clone(), path, body, &token)
                .await;
            drop(paced);
            let answer = answer?;
            let status = answer.status;
            let message = error_message(&answer.body);
            if let Some(limited) = classify(
                status,
                &answer.headers,
                message.as_deref(),
                now_epoch(),
                secondary_hits,
            ) {
                self.count(operation, Outcome::RateLimited);
                limited_hits += 1;
                if limited.kind == crate::core::ratelimit::LimitKind::Secondary {
                    secondary_hits += 1;
                }
                match self.settings.retry.decide(limited, limited_hits) {
                    RetryDecision::Wait(wait) => {
                        self.wait(operation, limited, wait).await;
                        continue;
                    }
                    RetryDecision::GiveUp => {
                        return Err(ForgeError::RateLimited {
                            operation: op,
                            kind: limited.kind.as_str(),
                            retry_after_secs: limited.wait.as_secs(),
                        });
                    }
                }
            }
            if status.is_server_error() {
                self.count(operation, Outcome::ServerError);
                server_errors += 1;
                if idempotent && server_errors <= SERVER_RETRIES {
                    let wait = Duration::from_secs(1 << (server_errors - 1));
                    tracing::warn!(
                        operation = op,
                        status = status.as_u16(),
                        wait_secs = wait.as_secs(),
                        "GitHub server error; retrying"
                    );
                    tokio::time::sleep(wait).await;
                    continue;
                }
                return Err(ForgeError::Unavailable {
                    operation: op,
                    status: status.as_u16(),
                });
            }
            if status == StatusCode::UNAUTHORIZED
                && !refreshed
                && matches!(self.credentials, Credentials::App { .. })
            {
                // The installation token was revoked or expired early: mint once more.
                self.count(operation, Outcome::Refused);
                refreshed = true;
                *self.cached.lock().await = None;
                continue;
            }
            if status.is_success() {
                self.count(operation, Outcome::Success);
            } else {
                self.count(operation, Outcome::Refused);
            }
            return Ok(answer);
        }
    }

    /// Waits until the pacing lets a mutation start, and records its start. The guard is
    /// held until the request's answer is in.
    async fn pace(
        &self,
        operation: Operation,
    ) -> Result<tokio::sync::MutexGuard<'_, Sent>, ForgeError> {
        let mut sent = self.pacer.lock().await;
        let now = sent.origin.elapsed();
        Pacing::prune(&mut sent.starts, now);
        let starts: Vec<Duration> = sent.starts.iter().copied().collect();
        let wait = self.settings.pacing.wait(&starts, now);
        if wait > self.settings.retry.max_wait {
            // The hour's budget is spent: report it as the limit it would become.
            return Err(ForgeError::RateLimited {
                operation: operation.as_str(),
                kind: "pacing",
                retry_after_secs: wait.as_secs(),
            });
        }
        if !wait.is_zero() {
            if let Some(m) = &self.metrics {
                m.paced();
            }
            tracing::debug!(
                operation = operation.as_str(),
                wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "pacing a GitHub mutation"
            );
            tokio::time::sleep(wait).await;
        }
        let started = sent.origin.elapsed();
        sent.starts.push_back(started);
        Ok(sent)
    }

    async fn wait(&self, operation: Operation, limited: RateLimited, wait: Duration) {
        if let Some(m) = &self.metrics {
            m.waited(limited.kind.as_str());
        }
        tracing::warn!(
            operation = operation.as_str(),
            kind = limited.kind.as_str(),
            wait_secs = wait.as_secs(),
            "GitHub rate limit; waiting"
        );
        tokio::time::sleep(wait).await;
    }

    fn expect_success(&self, operation: Operation, answer: Answer) -> Result<Answer, ForgeError> {
        if answer.status.is_success() {
            Ok(answer)
        } else {
            Err(refused(operation, &answer))
        }
    }

    async fn get_all<T: for<'de> serde::Deserialize<'de>>(
        &self,
        operation: Operation,
        first: String,
    ) -> Result<Vec<T>, ForgeError> {
        let mut items = Vec::new();
        let mut next = Some(first);
        let mut pages = 0;
        while let Some(path) = next.take() {
            pages += 1;
            if pages > MAX_PAGES {
                return Err(ForgeError::TooManyPages {
                    operation: operation.as_str(),
                });
            }
            let answer = self
                .call(operation, Method::GET, &path, None::<&()>)
                .await?;
            let answer = self.expect_success(operation, answer)?;
            let page: Vec<T> = decode(operation.as_str(), &answer.body)
                .inspect_err(|_| self.count(operation, Outcome::DecodeError))?;
            items.extend(page);
            let link = answer
                .headers
                .get(header::LINK)
                .and_then(|v| v.to_str().ok());
            next = next_page(link, &self.settings.api_base)?;
        }
        Ok(items)
    }

    fn route(&self) -> String {
        self.settings.repository.route()
    }

    // === the calls ===

    /// The pull requests associated with commit `sha` (every page).
    pub async fn pulls_for_commit(&self, sha: &str) -> Result<Vec<PullRequest>, ForgeError> {
        check_sha(Operation::PullsForCommit, sha)?;
        self.get_all(
            Operation::PullsForCommit,
            format!("{}/commits/{sha}/pulls?per_page=100", self.route()),
        )
        .await
    }

    /// The reviews of pull request `number` (every page, oldest first).
    pub async fn reviews(&self, number: u64) -> Result<Vec<Review>, ForgeError> {
        self.get_all(
            Operation::ListReviews,
            format!("{}/pulls/{number}/reviews?per_page=100", self.route()),
        )
        .await
    }

    /// `approved_merge` against GitHub: the outer error is GitHub failing, the inner one is
    /// the decision that the change set is not an approved merge.
    pub async fn approved_merge(
        &self,
        claim: &ApprovalClaim,
    ) -> Result<Result<ApprovedPullRequest, ApprovalRefusal>, ForgeError> {
        let mut asked = 0u32;
        loop {
            asked += 1;
            let pulls = self.pulls_for_commit(&claim.merge_commit).await?;
            let decision = select_merged_pull(claim, &pulls);
            if let Some(wait) = reask_after(&self.settings.reask, claim, &pulls, &decision, asked) {
                if let Some(m) = &self.metrics {
                    m.approval_reasked();
                }
                tracing::info!(
                    change_set = %claim.change_set_id,
                    merge_commit = %claim.merge_commit,
                    wait_secs = wait.as_secs(),
                    "GitHub lists no pull request for the merge commit yet; asking again"
                );
                tokio::time::sleep(wait).await;
                continue;
            }
            let pull = match decision {
                Ok(p) => p,
                Err(refusal) => return Ok(Err(refusal)),
            };
            let reviews = self.reviews(pull.number).await?;
            return Ok(check_reviews(claim, pull, &reviews));
        }
    }

    /// Every pull request (open or closed) from `head` (a branch of this repository) into
    /// `base`.
    pub async fn pulls_for_head(
        &self,
        head: &str,
        base: &str,
    ) -> Result<Vec<PullRequest>, ForgeError> {
        check_branch(Operation::ListPulls, head)?;
        check_branch(Operation::ListPulls, base)?;
        self.get_all(
            Operation::ListPulls,
            format!(
                "{}/pulls?state=all&head={}:{head}&base={base}&per_page=100",
                self.route(),
                self.settings.repository.owner()
            ),
        )
        .await
    }

    /// Opens the pull request `head` → `base`, or reuses the open one (its title and body
    /// are brought up to date), or reports the one that already merged.
    pub async fn open_or_reuse_pull(
        &self,
        head: &str,
        base: &str,
        title: &str,
        body: &str,
    ) -> Result<PullState, ForgeError> {
        let existing = self.pulls_for_head(head, base).await?;
        if let Some(merged) = existing
            .iter()
            .filter(|p| p.merged_at.is_some())
            .find_map(|p| {
                p.merge_commit_sha
                    .clone()
                    .filter(|s| is_sha(s))
                    .map(|s| (p.number, s))
            })
        {
            return Ok(PullState::Merged {
                number: merged.0,
                merge_commit: merged.1,
            });
        }
        if let Some(open) = existing.iter().find(|p| p.state == "open") {
            let path = format!("{}/pulls/{}", self.route(), open.number);
            let update = json!({"title": title, "body": body});
            let answer = self
                .call(Operation::UpdatePull, Method::PATCH, &path, Some(&update))
                .await?;
            let answer = self.expect_success(Operation::UpdatePull, answer)?;
            let updated: PullRequest = decode(Operation::UpdatePull.as_str(), &answer.body)?;
            return Ok(PullState::Open {
                number: updated.number,
                head_sha: updated.head.sha,
            });
        }
        let create = json!({"title": title, "body": body, "head": head, "base": base, "maintainer_can_modify": false});
        let path = format!("{}/pulls", self.route());
        let answer = self
            .call(Operation::CreatePull, Method::POST, &path, Some(&create))
            .await?;
        if answer.status == StatusCode::UNPROCESSABLE_ENTITY
            && error_text(&answer.body).contains("already exists")
        {
            // Opened concurrently (or our earlier answer was lost): list again.
            let again = self.pulls_for_head(head, base).await?;
            if let Some(open) = again.iter().find(|p| p.state == "open") {
                return Ok(PullState::Open {
                    number: open.number,
                    head_sha: open.head.sha.clone(),
                });
            }
        }
        let answer = self.expect_success(Operation::CreatePull, answer)?;
        let created: PullRequest = decode(Operation::CreatePull.as_str(), &answer.body)?;
        Ok(PullState::Open {
            number: created.number,
            head_sha: created.head.sha,
        })
    }

    /// Merges pull request `number` with a merge commit, only if its head is still
    /// `tested_head` (the expected-head guard).
    pub async fn merge_pull(
        &self,
        number: u64,
        tested_head: &str,
        commit_title: &str,
        commit_message: &str,
    ) -> Result<MergeAnswer, ForgeError> {
        check_sha(Operation::MergePull, tested_head)?;
        let path = format!("{}/pulls/{number}/merge", self.route());
        let body = json!({
            "merge_method": "merge",
            "sha": tested_head,
            "commit_title": commit_title,
            "commit_message": commit_message,
        });
        let answer = self
            .call(Operation::MergePull, Method::PUT, &path, Some(&body))
            .await?;
        if answer.status == StatusCode::UNAUTHORIZED {
            // The credential, not the pull request: a configuration error.
            return Err(refused(Operation::MergePull, &answer));
        }
        classify_merge(answer.status, &answer.body).map_err(|e| {
            self.count(Operation::MergePull, Outcome::DecodeError);
            ForgeError::Decode(e)
        })
    }

    /// Pull request `number` as GitHub holds it now (its head, state and `mergeable`).
    pub async fn get_pull(&self, number: u64) -> Result<PullRequest, ForgeError> {
        let path = format!("{}/pulls/{number}", self.route());
        let answer = self
            .call(Operation::GetPull, Method::GET, &path, None::<&()>)
            .await?;
        let answer = self.expect_success(Operation::GetPull, answer)?;
        decode(Operation::GetPull.as_str(), &answer.body)
            .inspect_err(|_| self.count(Operation::GetPull, Outcome::DecodeError))
            .map_err(ForgeError::from)
    }

    /// The commit branch `branch` points at now (`None`: no such branch).
    pub async fn branch_head(&self, branch: &str) -> Result<Option<String>, ForgeError> {
        check_branch(Operation::GetRef, branch)?;
        let path = format!("{}/git/ref/heads/{branch}", self.route());
        let answer = self
            .call(Operation::GetRef, Method::GET, &path, None::<&()>)
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let answer = self.expect_success(Operation::GetRef, answer)?;
        let reference: GitRef = decode(Operation::GetRef.as_str(), &answer.body)
            .inspect_err(|_| self.count(Operation::GetRef, Outcome::DecodeError))?;
        Ok(Some(reference.object.sha).filter(|s| is_sha(s)))
    }

    /// The combined status of `sha` (the latest status per context).
    pub async fn combined_status(&self, sha: &str) -> Result<CombinedStatus, ForgeError> {
        check_sha(Operation::CombinedStatus, sha)?;
        let path = format!("{}/commits/{sha}/status?per_page=100", self.route());
        let answer = self
            .call(Operation::CombinedStatus, Method::GET, &path, None::<&()>)
            .await?;
        let answer = self.expect_success(Operation::CombinedStatus, answer)?;
        decode(Operation::CombinedStatus.as_str(), &answer.body)
            .inspect_err(|_| self.count(Operation::CombinedStatus, Outcome::DecodeError))
            .map_err(ForgeError::from)
    }

    /// The check runs of `sha` (the first 100).
    pub async fn check_runs(&self, sha: &str) -> Result<CheckRuns, ForgeError> {
        check_sha(Operation::CheckRuns, sha)?;
        let path = format!("{}/commits/{sha}/check-runs?per_page=100", self.route());
        let answer = self
            .call(Operation::CheckRuns, Method::GET, &path, None::<&()>)
            .await?;
        let answer = self.expect_success(Operation::CheckRuns, answer)?;
        decode(Operation::CheckRuns.as_str(), &answer.body)
            .inspect_err(|_| self.count(Operation::CheckRuns, Outcome::DecodeError))
            .map_err(ForgeError::from)
    }

    /// Whether `branch` is `sha` or descends from it (`GET …/compare/{sha}...{branch}`).
    pub async fn branch_contains(&self, branch: &str, sha: &str) -> Result<bool, ForgeError> {
        check_sha(Operation::Compare, sha)?;
        check_branch(Operation::Compare, branch)?;
        let path = format!("{}/compare/{sha}...{branch}", self.route());
        let answer = self
            .call(Operation::Compare, Method::GET, &path, None::<&()>)
            .await?;
        if answer.status == StatusCode::NOT_FOUND {
            return Ok(false);
        }
        let answer = self.expect_success(Operation::Compare, answer)?;
        let comparison: Comparison = decode(Operation::Compare.as_str(), &answer.body)?;
        Ok(matches!(comparison.status.as_str(), "identical" | "ahead"))
    }

    /// Sets a commit status on `sha`.
    pub async fn set_status(&self, sha: &str, status: &StatusBody) -> Result<(), ForgeError> {
        check_sha(Operation::CreateStatus, sha)?;
        let path = format!("{}/statuses/{sha}", self.route());
        let answer = self
            .call(Operation::CreateStatus, Method::POST, &path, Some(status))
            .await?;
        self.expect_success(Operation::CreateStatus, answer)
            .map(|_| ())
    }

    /// Opens the work item's escalation issue, or updates (and reopens) the one it has.
    /// Returns the issue number. Idempotent: a retry finds the issue by its marker.
    pub async fn escalate(&self, escalation: &Escalation) -> Result<u64, ForgeError> {
        let issues: Vec<Issue> = self
            .get_all(
                Operation::ListIssues,
                format!(
                    "{}/issues?state=all&labels={ESCALATION_LABEL}&per_page=100",
                    self.route()
                ),
            )
            .await?;
        let title = issue_title(escalation);
        let body = issue_body(escalation);
        match decide(&escalation.work_item_id, &issues) {
            IssueAction::Create => {
                let path = format!("{}/issues", self.route());
                let create = json!({"title": title, "body": body, "labels": [ESCALATION_LABEL]});
                let answer = self
                    .call(Operation::CreateIssue, Method::POST, &path, Some(&create))
                    .await?;
                let answer = self.expect_success(Operation::CreateIssue, answer)?;
                let created: Issue = decode(Operation::CreateIssue.as_str(), &answer.body)?;
                Ok(created.number)
            }
            IssueAction::Update { number, reopen } => {
                let path = format!("{}/issues/{number}", self.route());
                let mut update = json!({"title": title, "body": body});
                if reopen {
                    update["state"] = json!("open");
                }
                let answer = self
                    .call(Operation::UpdateIssue, Method::PATCH, &path, Some(&update))
                    .await?;
                self.expect_success(Operation::UpdateIssue, answer)?;
                Ok(number)
            }
        }
    }
}

fn error_text(body: &[u8]) -> String {
    let mut text = error_message(body).unwrap_or_default();
    // 422s put the detail in `errors[].message`.
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body)
        && let Some(errors) = v.get("errors").and_then(|e| e.as_array())
    {
        for e in errors {
            if let Some(m) = e.get("message").and_then(|m| m.as_str()) {
                text.push_str("; ");
                text.push_str(m);
            }
        }
    }
    text
}

fn refused(operation: Operation, answer: &Answer) -> ForgeError {
    let message = error_text(&answer.body);
    ForgeError::Refused {
        operation: operation.as_str(),
        status: answer.status.as_u16(),
        message: crate::core::render::sanitize_line(
            if message.is_empty() {
                answer.status.canonical_reason().unwrap_or("")
            } else {
                &message
            },
            300,
        ),
    }
}

fn check_sha(operation: Operation, sha: &str) -> Result<(), ForgeError> {
    if is_sha(sha) {
        Ok(())
    } else {
        Err(ForgeError::InvalidInput {
            operation: operation.as_str(),
            what: "commit id (40 hex digits)",
            value: sha.chars().take(80).collect(),
        })
    }
}

/// Branch names the Job Site sends: `[A-Za-z0-9._/-]`, no `..`, not starting with `-` or `/`.
fn check_branch(operation: Operation, branch: &str) -> Result<(), ForgeError> {
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
        Err(ForgeError::InvalidInput {
            operation: operation.as_str(),
            what: "branch name",
            value: branch.chars().take(80).collect(),
        })
    }
}
