//! The `Project` kind: one repository under protobot's care, written by a platform engineer
//! (kubectl or GitOps), and what the operator observed about it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{
    common::{GIT_COMMIT_PATTERN, LocalRef},
    conditions::Condition,
};

/// Default `spec.defaultBranch`.
pub const DEFAULT_BRANCH: &str = "main";
/// Default `spec.specPath`.
pub const DEFAULT_SPEC_PATH: &str = ".protobot/";
/// Default `spec.wipLimit`.
pub const DEFAULT_WIP_LIMIT: u32 = 4;
/// Default `spec.leaseDurationSeconds` (the contract's default lease of 15 minutes).
pub const DEFAULT_LEASE_DURATION_SECONDS: u32 = 900;
/// Bound of `status.sandboxConformance.failedChecks`.
pub const FAILED_CHECKS_LIMIT: u32 = 32;
/// Largest `spec.wipLimit`.
pub const MAX_WIP_LIMIT: u32 = 256;
/// Shortest `spec.leaseDurationSeconds`: a lease is renewed at a third of its length, and
/// renewals need a few seconds of slack.
pub const MIN_LEASE_DURATION_SECONDS: u32 = 30;
/// Longest `spec.leaseDurationSeconds` (a day): a lost Job Site's items are recovered within it.
pub const MAX_LEASE_DURATION_SECONDS: u32 = 86_400;
/// Longest `spec.repoUrl`.
pub const REPO_URL_MAX_LENGTH: u32 = 2048;
/// Longest `spec.defaultBranch`.
pub const BRANCH_MAX_LENGTH: u32 = 255;
/// Pattern of `spec.defaultBranch`: a branch name (`git check-ref-format --branch`), further
/// restricted to portable characters; the CEL rules and the controller refuse the rest.
pub const BRANCH_PATTERN: &str = "^[A-Za-z0-9_][A-Za-z0-9._/+-]*$";

/// A repository whose approved change sets protobot builds, inspects and merges.
// kube's `printcolumn(...)` repeats `type_ =` per column, which clippy mistakes for
// duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "protobot.dev",
    version = "v1alpha1",
    kind = "Project",
    plural = "projects",
    namespaced,
    status = "ProjectStatus",
    derive = "PartialEq",
    shortname = "pbproj",
    category = "protobot",
    doc = "A repository whose approved change sets protobot builds, inspects and merges.",
    printcolumn(
        name = "Repo",
        type_ = "string",
        json_path = ".spec.repoUrl",
        description = "repository URL"
    ),
    printcolumn(
        name = "Branch",
        type_ = "string",
        json_path = ".spec.defaultBranch",
        description = "default branch"
    ),
    printcolumn(
        name = "Reachable",
        type_ = "boolean",
        json_path = ".status.repoReachable",
        description = "whether the repository answered"
    ),
    printcolumn(
        name = "Conformant",
        type_ = "boolean",
        json_path = ".status.sandboxConformance.passed",
        description = "whether the sandbox profile passed its conformance report"
    ),
    printcolumn(
        name = "Head",
        type_ = "string",
        json_path = ".status.defaultBranchHead",
        description = "observed default-branch head",
        priority = 1
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status",
        description = "whether the Ready condition holds"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].reason",
        description = "reason of the Ready condition"
    ),
    printcolumn(
        name = "Queued",
        type_ = "integer",
        json_path = ".status.queue.queued",
        description = "ready items waiting beyond what the Job Site can claim now"
    ),
    printcolumn(
        name = "Waiting",
        type_ = "string",
        json_path = ".status.queue.reason",
        description = "why the first queued item waits",
        priority = 1
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ProjectSpec {
    /// URL of the canonical Git repository: `https://host/path`, `ssh://user@host[:port]/path`
    /// (or `user@host:path`), or a path on the operator's machine. It must not carry
    /// credentials (`user:password@`, a token as user name): those are refused; name a Secret
    /// in `credentialsSecretRef` instead. See docs/repositories.md. Paths and `file://` URLs
    /// are accepted only by an operator started with `--allow-local-repositories`.
    #[schemars(length(min = 1, max = REPO_URL_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "!self.matches('[[:space:][:cntrl:]]')", "message": "spec.repoUrl must not contain spaces or control characters"},
        {"rule": "self.matches('^(https://[^/@]+/|ssh://|file://|/|[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:)')", "message": "spec.repoUrl must be https://host/path, ssh://host/path or user@host:path (file:// and absolute paths only for an operator started with --allow-local-repositories)"},
        {"rule": "!self.matches('^[A-Za-z][A-Za-z0-9+.-]*://[^/@]*:[^/@]*@') && !self.matches('^[^/:@]*:[^/@]*@')", "message": "spec.repoUrl must not carry credentials (user:password@); name a Secret in spec.credentialsSecretRef"}
    ]))]
    pub repo_url: String,
    /// Secret in this namespace holding the repository's credentials, read for each fetch and
    /// push and kept only in the operator's memory for that operation. For https: `token`
    /// (optionally `username`) or `username` and `password` (`kubernetes.io/basic-auth`), and
    /// optionally `ca.crt` (PEM) for a private CA. For ssh: `ssh-privatekey`
    /// (`kubernetes.io/ssh-auth`), optionally `ssh-passphrase`, and `known_hosts` (the only
    /// host keys accepted: an unknown or changed host key is refused). Absent: the repository
    /// is read and pushed without credentials. See docs/repositories.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret_ref: Option<LocalRef>,
    /// Branch that change sets merge into and that protobot merges work items into: a valid
    /// branch name (no `..`, `//`, leading `-` or `.`, trailing `/`, `.` or `.lock`).
    #[serde(default = "default_branch")]
    #[schemars(length(min = 1, max = BRANCH_MAX_LENGTH), regex(pattern = BRANCH_PATTERN))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "!self.contains('..') && !self.contains('//') && !self.contains('/.') && !self.contains('.lock/') && !self.endsWith('/') && !self.endsWith('.') && !self.endsWith('.lock')", "message": "spec.defaultBranch must be a valid branch name (see git check-ref-format)"}
    ]))]
    pub default_branch: String,
    /// Directory of the spec store inside the repository; `project.yaml` lives here.
    #[serde(default = "default_spec_path")]
    #[schemars(length(min = 1))]
    pub spec_path: String,
    /// Name of the sandbox profile every sandboxed role of this project runs under. The Job
    /// Site refuses to schedule while the profile's conformance report fails; it never falls
    /// back to a weaker profile.
    #[schemars(length(min = 1))]
    pub sandbox_profile: String,
    /// Maximum number of this project's work items that may be active (`building`,
    /// `inspecting` or `merging`) at once.
    #[serde(default = "default_wip_limit")]
    #[schemars(range(min = 1, max = MAX_WIP_LIMIT))]
    pub wip_limit: u32,
    /// Length in seconds of the lease a claim issues (30 to 86400); renewals extend it by the
    /// same amount.
    #[serde(default = "default_lease_duration_seconds")]
    #[schemars(range(min = MIN_LEASE_DURATION_SECONDS, max = MAX_LEASE_DURATION_SECONDS))]
    pub lease_duration_seconds: u32,
    /// ConfigMap in this namespace that defines the project's WorkerClasses (image, command,
    /// model tier per role). Absent: the operator's built-in scripted workers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_classes_ref: Option<LocalRef>,
    /// Also register change sets by polling the default branch (the alternative to applying a
    /// `ChangeSet` manifest per change set): every change set whose manifest a merge brings
    /// onto the default branch after the baseline gets a `ChangeSet` object owned by this
    /// Project. Absent: registration is by `ChangeSet` manifests only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll_approved_change_sets: Option<ChangeSetPolling>,
    /// The Git host's API: approvals are checked against the pull request that merged each
    /// change set, work items land through pull requests (so branch protection and required
    /// checks apply), stages report commit statuses and blocked items open one escalation issue
    /// each. Absent: no host API; work items land by a direct push of the merge commit. See
    /// docs/forge-github.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forge: Option<ForgeSpec>,
    /// What this project's builds may spend on model calls (metered by the egress proxy).
    /// Absent: no budget. See docs/cost-and-review.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetSpec>,
}

/// Pattern of an amount of dollars in `spec.budget`: a decimal with at most six decimals.
pub const DOLLARS_PATTERN: &str = r"^[0-9]{1,12}(\.[0-9]{1,6})?$";

/// Budgets of a Project's builds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetSpec {
    /// The most one work item may spend on priced model calls, in US dollars as a quoted
    /// decimal (`"5"`, `"0.50"`). Checked before each build cycle against what the item's
    /// runs spent; once reached, the build stops with a spec question naming the budget and
    /// the spend per stage. Raise it here and run `protobot retry` to go on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = DOLLARS_PATTERN))]
    pub per_item: Option<String>,
}

/// Default `spec.forge.github.apiBaseUrl`.
pub const DEFAULT_GITHUB_API_BASE_URL: &str = "https://api.github.com";
/// Pattern of `spec.forge.github.owner`: a GitHub user or organization name.
pub const GITHUB_OWNER_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9-]{0,38}$";
/// Pattern of `spec.forge.github.repository`: a GitHub repository name.
pub const GITHUB_REPOSITORY_PATTERN: &str = "^[A-Za-z0-9._-]{1,100}$";
/// Pattern of `spec.forge.gitea.owner` and `spec.forge.gitea.repository`.
pub const GITEA_NAME_PATTERN: &str = "^[A-Za-z0-9._-]{1,100}$";

/// The Git host's API (one host per Project: set at most one of `github` and `gitea`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!(has(self.github) && has(self.gitea))", "message": "set at most one of spec.forge.github and spec.forge.gitea"}
]))]
pub struct ForgeSpec {
    /// GitHub or GitHub Enterprise Server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub github: Option<GithubForge>,
    /// Gitea or Forgejo (docs/forge-gitea.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gitea: Option<GiteaForge>,
}

/// Gitea (or Forgejo) settings: the server, the repository and the token the Job Site acts
/// with (API and Git transport over HTTPS; it lives only in the operator's memory). See
/// docs/forge-gitea.md.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.owner) == has(self.repository)", "message": "set both spec.forge.gitea.owner and spec.forge.gitea.repository, or neither (then both are derived from spec.repoUrl)"}
]))]
pub struct GiteaForge {
    /// The server's base URL (`https://gitea.example`; the REST API is its `/api/v1`). No
    /// credentials, query or fragment. Plain `http://` only on loopback
    /// (`http://127.0.0.1[:port]`, `http://localhost[:port]`).
    #[schemars(length(min = 1, max = REPO_URL_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^https://[^/@?#[:space:]]+(/[^?#[:space:]]*)?$') || self.matches('^http://(127[.]0[.]0[.]1|localhost)(:[0-9]{1,5})?(/[^?#[:space:]]*)?$')", "message": "spec.forge.gitea.baseUrl must be https://HOST[/path] (http only for 127.0.0.1 or localhost), without credentials, query or fragment"}
    ]))]
    pub base_url: String,
    /// Repository owner (user or organization). Absent: derived from `spec.repoUrl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GITEA_NAME_PATTERN))]
    pub owner: Option<String>,
    /// Repository name. Absent: derived from `spec.repoUrl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GITEA_NAME_PATTERN))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self != '.' && self != '..'", "message": "spec.forge.gitea.repository must be a repository name"}
    ]))]
    pub repository: Option<String>,
    /// Secret in this namespace whose key `token` holds an access token of the user the Job
    /// Site acts as (scopes: repository and issue read and write; the user needs write access
    /// to the repository and merge rights on the default branch).
    pub token_secret_ref: LocalRef,
    /// Review mode approvals are checked under (see `github.reviewMode`). Absent: the mode
    /// declared in `<specPath>/project.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_mode: Option<ReviewMode>,
    /// How work items land: `pull-request` (merge a pull request from `wi/...` with the tested
    /// head as `head_commit_id`) or `direct-push`.
    #[serde(default)]
    pub landing: LandingMode,
    /// Page of a BuildWorkItem that commit statuses and pull requests link to, with `{name}`
    /// for the work item's name. Absent: no link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = REPO_URL_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^https://[^/@?#[:space:]]+/[^[:space:]]*$') && self.contains('{name}')", "message": "spec.forge.gitea.workItemUrl must be an https:// URL without credentials that contains {name}"}
    ]))]
    pub work_item_url: Option<String>,
}

/// GitHub settings. Exactly one of `tokenSecretRef` and `app` names the identity the Job Site
/// acts as; its token is used for the API and for the Git transport and lives only in the
/// operator's memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.tokenSecretRef) != has(self.app)", "message": "set exactly one of spec.forge.github.tokenSecretRef and spec.forge.github.app"},
    {"rule": "has(self.owner) == has(self.repository)", "message": "set both spec.forge.github.owner and spec.forge.github.repository, or neither (then both are derived from spec.repoUrl)"}
]))]
pub struct GithubForge {
    /// Base URL of the REST API: `https://api.github.com`, or `https://HOST/api/v3` for GitHub
    /// Enterprise Server. No credentials, query or fragment. Plain `http://` only on loopback
    /// (`http://127.0.0.1[:port]`, `http://localhost[:port]`: a local proxy or a test double).
    #[serde(default = "default_github_api_base_url")]
    #[schemars(length(min = 1, max = REPO_URL_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^https://[^/@?#[:space:]]+(/[^?#[:space:]]*)?$') || self.matches('^http://(127[.]0[.]0[.]1|localhost)(:[0-9]{1,5})?(/[^?#[:space:]]*)?$')", "message": "spec.forge.github.apiBaseUrl must be https://api.github.com or https://HOST/api/v3 (http only for 127.0.0.1 or localhost), without credentials, query or fragment"}
    ]))]
    pub api_base_url: String,
    /// Repository owner (user or organization). Absent: derived from `spec.repoUrl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GITHUB_OWNER_PATTERN))]
    pub owner: Option<String>,
    /// Repository name. Absent: derived from `spec.repoUrl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GITHUB_REPOSITORY_PATTERN))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self != '.' && self != '..'", "message": "spec.forge.github.repository must be a repository name"}
    ]))]
    pub repository: Option<String>,
    /// Secret in this namespace whose key `token` holds a token (fine-grained: contents,
    /// pull requests, issues and commit statuses read and write on the repository).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<LocalRef>,
    /// A GitHub App installed on the repository: the operator mints installation tokens
    /// (scoped to this repository) and refreshes them before they expire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<GithubApp>,
    /// Review mode approvals are checked under: `single-player` (the contributor merges their
    /// own pull request) or `multi-player` (a reviewer other than the author approved the merged
    /// head). Absent: the mode declared in `<specPath>/project.yaml`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_mode: Option<ReviewMode>,
    /// How work items land: `pull-request` (open or reuse a pull request from `wi/...` and
    /// merge it with the tested head as the expected-head guard) or `direct-push` (push the
    /// merge commit; needs a default branch without protection).
    #[serde(default)]
    pub landing: LandingMode,
    /// Page of a BuildWorkItem that commit statuses and pull requests link to, with `{name}`
    /// for the work item's name (for example a console URL). Absent: no link.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = REPO_URL_MAX_LENGTH))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.matches('^https://[^/@?#[:space:]]+/[^[:space:]]*$') && self.contains('{name}')", "message": "spec.forge.github.workItemUrl must be an https:// URL without credentials that contains {name}"}
    ]))]
    pub work_item_url: Option<String>,
}

/// A GitHub App installation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GithubApp {
    /// The App's id (its settings page shows it).
    #[schemars(range(min = 1))]
    pub app_id: i64,
    /// The id of the App's installation on the repository's owner.
    #[schemars(range(min = 1))]
    pub installation_id: i64,
    /// Secret in this namespace whose key `private-key.pem` holds the App's private key (the
    /// PEM file GitHub generated).
    pub private_key_secret_ref: LocalRef,
}

/// Review mode approvals are checked under: `single-player` (the contributor merges their own
/// pull request) or `multi-player` (a reviewer other than the author approved the merged head).
/// Absent: the mode declared in `<specPath>/project.yaml`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ReviewMode {
    /// The merge is the approval.
    SinglePlayer,
    /// A reviewer other than the author approved the merged head.
    MultiPlayer,
}

/// How work items land.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum LandingMode {
    /// Through a pull request and the merge API.
    #[default]
    PullRequest,
    /// A pushed merge commit.
    DirectPush,
}

fn default_github_api_base_url() -> String {
    DEFAULT_GITHUB_API_BASE_URL.to_owned()
}

/// Registration of change sets by polling the default branch.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangeSetPolling {
    /// Register change sets merged after this commit (40 hex digits). Absent: after the
    /// default-branch head the operator observed when polling began (`status.pollBaseline`),
    /// so enabling polling on a repository with a history builds nothing old.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN), length(min = 40, max = 40))]
    pub since_commit: Option<String>,
}

fn default_branch() -> String {
    DEFAULT_BRANCH.to_owned()
}

fn default_spec_path() -> String {
    DEFAULT_SPEC_PATH.to_owned()
}

const fn default_wip_limit() -> u32 {
    DEFAULT_WIP_LIMIT
}

const fn default_lease_duration_seconds() -> u32 {
    DEFAULT_LEASE_DURATION_SECONDS
}

/// What the operator observed about a project.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectStatus {
    /// The `metadata.generation` this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Whether the repository answered with the default branch at the last check; the
    /// `RepoReachable` condition carries the detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_reachable: Option<bool>,
    /// Whether `<specPath>/project.yaml` was valid at the observed head; the
    /// `ProjectConfigValid` condition carries the first error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_config_valid: Option<bool>,
    /// Commit the default branch pointed at when last observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN))]
    pub default_branch_head: Option<String>,
    /// When `defaultBranchHead` was observed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_observed_time: Option<Time>,
    /// Summary of the sandbox profile's last conformance report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_conformance: Option<SandboxConformance>,
    /// The commit change-set polling counts from when `spec.pollApprovedChangeSets` names
    /// none: the default-branch head when polling began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = GIT_COMMIT_PATTERN))]
    pub poll_baseline: Option<String>,
    /// Conditions `RepoReachable`, `ProjectConfigValid`, `SandboxConformant`, and the summary
    /// `Ready` and `Stalled` that GitOps tools read (docs/gitops.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The project's ready items and how many of them wait beyond what the Job Site can
    /// claim now (no free build slot, the WIP limit, no node with room for a run's pod,
    /// runs refused), as the replica that dispatched the project last saw them. Written by
    /// the Job Site (field manager `protobot/jobsite`) when it changes. See
    /// docs/capacity.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<ProjectQueue>,
}

/// Why the first queued item of a project waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum QueueReason {
    /// Nothing is ready for building.
    Empty,
    /// Every ready item can be claimed now: the next dispatch claims them.
    Claimable,
    /// Every build slot of the replica is taken (`--max-concurrent-builds`).
    NoFreeSlot,
    /// The project's WIP limit (`spec.wipLimit`) is reached.
    WipLimit,
    /// No Ready, schedulable node has room for a run's pod (its CPU and memory requests):
    /// nothing is claimed until one has.
    NodeStarved,
    /// The sandbox executor refuses runs (the sandbox profile's conformance report).
    RunsRefused,
}

/// A project's queue of ready items (`status.queue`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectQueue {
    /// Items in `ready-for-building` (none of them claimed yet).
    pub ready: u32,
    /// Ready items beyond what can be claimed now, in dispatch order (priority, then
    /// conflict-free, then age).
    pub queued: u32,
    /// Why the first queued item waits.
    pub reason: QueueReason,
    /// What the wait is, in a sentence that says what to do when it is a fault.
    pub message: String,
    /// The replica (pod name) that saw this queue.
    pub reported_by: String,
    /// When the replica saw it.
    pub observed_time: Time,
}

/// Summary of a sandbox profile's conformance report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SandboxConformance {
    /// Name of the sandbox profile that was checked.
    pub profile: String,
    /// Whether every conformance check passed; only then does the Job Site schedule.
    pub passed: bool,
    /// Number of checks that passed.
    pub checks_passed: u32,
    /// Number of checks that failed.
    pub checks_failed: u32,
    /// Names of the failed checks, at most 32 (the count above is exact).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = FAILED_CHECKS_LIMIT))]
    pub failed_checks: Vec<String>,
    /// Why the report fails, as the measurement says it (for example the platform object
    /// the profile's pods need and the cluster lacks), at most 1,024 characters; absent when
    /// it passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub reason: Option<String>,
    /// Digest of the full report, for finding it in the operator's logs and events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_digest: Option<String>,
    /// When the report was produced.
    pub checked_time: Time,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kube::CustomResourceExt;
    use serde_json::{Value, json};

    use super::*;

    fn github_schema() -> Value {
        let crd = serde_json::to_value(Project::crd()).unwrap();
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["forge"]["properties"]["github"]
            .clone()
    }

    fn rules(schema: &Value) -> Vec<String> {
        schema["x-kubernetes-validations"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .map(|r| r["rule"].as_str().unwrap().to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn the_github_forge_requires_exactly_one_identity_and_owner_with_repository() {
        let github = github_schema();
        let object_rules = rules(&github);
        assert!(
            object_rules.contains(&"has(self.tokenSecretRef) != has(self.app)".to_string()),
            "{object_rules:?}"
        );
        assert!(
            object_rules.contains(&"has(self.owner) == has(self.repository)".to_string()),
            "{object_rules:?}"
        );
        let props = &github["properties"];
        assert_eq!(props["apiBaseUrl"]["default"], DEFAULT_GITHUB_API_BASE_URL);
        assert_eq!(props["landing"]["default"], "pull-request");
        assert_eq!(
            props["reviewMode"]["enum"],
            json!(["single-player", "multi-player"])
        );
        assert!(!rules(&props["apiBaseUrl"]).is_empty());
        assert_eq!(props["app"]["properties"]["appId"]["minimum"], 1.0);
        let required = props["app"]["required"].as_array().unwrap();
        for field in ["appId", "installationId", "privateKeySecretRef"] {
            assert!(required.contains(&json!(field)), "{required:?}");
        }
    }

    #[test]
    fn the_gitea_forge_needs_a_base_url_and_a_token_and_excludes_github() {
        let crd = serde_json::to_value(Project::crd()).unwrap();
        let forge = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
            ["properties"]["forge"];
        assert!(
            rules(forge).contains(&"!(has(self.github) && has(self.gitea))".to_string()),
            "{forge}"
        );
        let gitea = &forge["properties"]["gitea"];
        let required = gitea["required"].as_array().unwrap();
        for field in ["baseUrl", "tokenSecretRef"] {
            assert!(required.contains(&json!(field)), "{required:?}");
        }
        assert!(!rules(&gitea["properties"]["baseUrl"]).is_empty());
        assert!(rules(gitea).contains(&"has(self.owner) == has(self.repository)".to_string()));
    }

    #[test]
    fn a_forge_spec_reads_with_its_defaults_and_writes_its_wire_names() {
        let spec: ProjectSpec = serde_json::from_value(json!({
            "repoUrl": "https://github.com/acme/widgets.git",
            "sandboxProfile": "kata",
            "forge": {"github": {"tokenSecretRef": {"name": "gh"}}},
        }))
        .unwrap();
        let github = spec.forge.clone().unwrap().github.unwrap();
        assert_eq!(github.api_base_url, DEFAULT_GITHUB_API_BASE_URL);
        assert_eq!(github.landing, LandingMode::PullRequest);
        assert_eq!(github.review_mode, None);
        let wire = serde_json::to_value(&spec).unwrap();
        assert_eq!(wire["forge"]["github"]["landing"], "pull-request");
        assert!(wire["forge"]["github"].get("app").is_none());
        // A Gitea forge beside it: the wire names, its defaults.
        let gitea: ProjectSpec = serde_json::from_value(json!({
            "repoUrl": "https://gitea.example/acme/widgets.git",
            "sandboxProfile": "kata",
            "forge": {"gitea": {"baseUrl": "https://gitea.example", "tokenSecretRef": {"name": "gt"}}},
        }))
        .unwrap();
        let g = gitea.forge.clone().unwrap().gitea.unwrap();
        assert_eq!(g.token_secret_ref.name, "gt");
        assert_eq!(g.landing, LandingMode::PullRequest);
        let wire = serde_json::to_value(&gitea).unwrap();
        assert_eq!(wire["forge"]["gitea"]["baseUrl"], "https://gitea.example");
        assert!(wire["forge"].get("github").is_none());
        // A Project without a forge stays as it was on the wire.
        let plain: ProjectSpec = serde_json::from_value(json!({
            "repoUrl": "https://git.example/x.git",
            "sandboxProfile": "kata",
        }))
        .unwrap();
        assert!(serde_json::to_value(&plain).unwrap().get("forge").is_none());
    }
}
