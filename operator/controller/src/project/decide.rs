//! The pure half of the Project pipeline: from what the controller observed to
//! the status the Project should show, the Event a `Ready` change is reported
//! with, and when to look again. Conditions keep `lastTransitionTime` when their
//! status does not change; `now` is passed in.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::{Event, EventType};
use protobot_api::{
    ConditionStatus, ConditionUpdate, ProjectSpec, ProjectStatus,
    conditions::{Health, find_condition, reasons, set_condition, summary, types},
    project::SandboxConformance,
};

/// `Ready=False`: the Project's spec is invalid; the message says which field.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// `Ready=False`: at least one of the other conditions is not `True`.
pub const NOT_READY: &str = "NotReady";
/// `Ready=True`: every condition holds.
pub const READY: &str = "Ready";
/// `Stalled=True`: `project.yaml` at the observed head is invalid; a commit must fix it.
pub const CONFIG_INVALID: &str = "ProjectConfigInvalid";
/// `Stalled=True`: the sandbox profile's conformance report failed or is missing; the Job
/// Site schedules nothing until a passing report is stored.
pub const NOT_CONFORMANT: &str = "SandboxNotConformant";

/// How often a healthy (or misconfigured) Project is looked at again, to
/// notice a moved default-branch head or a fixed `project.yaml`.
pub const RESYNC: Duration = Duration::from_secs(60);
/// First retry after the repository stopped answering.
pub const MIN_RETRY: Duration = Duration::from_secs(10);
/// Longest wait between retries of an unreachable repository.
pub const MAX_RETRY: Duration = Duration::from_secs(300);

/// Where the spec store lives in a repository; the only `spec.specPath` it reads.
pub const SPEC_STORE_DIR: &str = ".protobot";

/// What reading `<specPath>/project.yaml` at the observed head found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigCheck {
    /// The configuration decoded and validated.
    Valid,
    /// The configuration is missing or invalid: the first error.
    Invalid(String),
    /// The commit could not be read (a repository problem, not a config problem).
    Unreadable(String),
}

/// What the controller knows about the sandbox profile's conformance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Conformance {
    /// The summary of the profile's conformance report.
    Report(SandboxConformance),
    /// The profile names a report location, but no report is stored there: the
    /// Job Site refuses to schedule (why, for the condition message).
    Missing(String),
    /// No report is available to this controller: why.
    Unavailable(String),
}

/// The status summary of a profile's conformance report (pure): at most 32
/// failed check names, the count exact.
pub fn summarize(
    profile: &str,
    report: &protobot_executors::conformance::ConformanceReport,
    digest: Option<String>,
    now: Timestamp,
) -> SandboxConformance {
    let failed: Vec<String> = report
        .checks
        .iter()
        .filter(|c| !c.passed && !c.skipped)
        .map(|c| c.id.clone())
        .collect();
    SandboxConformance {
        profile: profile.to_string(),
        passed: report.passed,
        checks_passed: u32::try_from(report.checks.iter().filter(|c| c.passed).count())
            .unwrap_or(u32::MAX),
        checks_failed: u32::try_from(failed.len()).unwrap_or(u32::MAX),
        failed_checks: failed.into_iter().take(32).collect(),
        reason: (!report.passed())
            .then(|| {
                report
                    .fail_closed_reason
                    .clone()
                    .or_else(|| report.failure_reason())
            })
            .flatten()
            .map(|r| bounded(&r, CONFORMANCE_REASON_LIMIT)),
        report_digest: digest,
        checked_time: Time(now),
    }
}

/// Longest `status.sandboxConformance.reason` (the CRD's limit).
const CONFORMANCE_REASON_LIMIT: usize = 1024;

/// `text` cut to at most `limit` characters, marked with `…` when cut (pure).
fn bounded(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(limit.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// Why the repository could not be read: the `RepoReachable=False` reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RepoFailure {
    /// Network, a missing repository or branch, anything not about access.
    Unavailable,
    /// The server refused the credentials Secret's token, password or key.
    AuthenticationFailed,
    /// The SSH server's host key is not the one `known_hosts` lists for it.
    HostKeyChanged,
    /// The SSH server is not in `known_hosts`.
    HostKeyUnknown,
    /// The HTTPS certificate is not trusted.
    CertificateUntrusted,
    /// The credentials Secret is missing, unreadable or lacks keys.
    CredentialsUnavailable,
    /// The server asks for credentials and the Project names no Secret.
    CredentialsRequired,
}

/// `RepoReachable=False` reasons beside `RepositoryUnavailable`.
pub mod repo_reasons {
    /// The credentials were refused.
    pub const AUTHENTICATION_FAILED: &str = "AuthenticationFailed";
    /// The SSH host key changed.
    pub const HOST_KEY_CHANGED: &str = "HostKeyChanged";
    /// The SSH host is not in `known_hosts`.
    pub const HOST_KEY_UNKNOWN: &str = "HostKeyUnknown";
    /// The TLS certificate is not trusted.
    pub const CERTIFICATE_UNTRUSTED: &str = "CertificateUntrusted";
    /// The Secret cannot be used.
    pub const CREDENTIALS_UNAVAILABLE: &str = "CredentialsUnavailable";
    /// No Secret is named and the server wants one.
    pub const CREDENTIALS_REQUIRED: &str = "CredentialsRequired";
}

impl RepoFailure {
    /// The failure an access error is (pure).
    pub fn of(error: &protobot_repo::remote::AccessError) -> RepoFailure {
        use protobot_repo::remote::{AccessError as A, UrlError};
        match error {
            A::AuthenticationFailed { .. } => RepoFailure::AuthenticationFailed,
            A::HostKeyChanged { .. } => RepoFailure::HostKeyChanged,
            A::HostKeyUnknown { .. } => RepoFailure::HostKeyUnknown,
            A::Certificate { .. } => RepoFailure::CertificateUntrusted,
            A::CredentialsRequired { .. } => RepoFailure::CredentialsRequired,
            A::NoResolver { .. }
            | A::SecretMissing { .. }
            | A::SecretUnreadable { .. }
            | A::SecretIncomplete { .. }
            | A::PlainHttp { .. }
            | A::Url(UrlError::CredentialsInUrl { .. }) => RepoFailure::CredentialsUnavailable,
            A::Url(UrlError::Invalid { .. }) => RepoFailure::Unavailable,
        }
    }

    /// The condition reason.
    pub fn reason(self) -> &'static str {
        match self {
            RepoFailure::Unavailable => reasons::REPOSITORY_UNAVAILABLE,
            RepoFailure::AuthenticationFailed => repo_reasons::AUTHENTICATION_FAILED,
            RepoFailure::HostKeyChanged => repo_reasons::HOST_KEY_CHANGED,
            RepoFailure::HostKeyUnknown => repo_reasons::HOST_KEY_UNKNOWN,
            RepoFailure::CertificateUntrusted => repo_reasons::CERTIFICATE_UNTRUSTED,
            RepoFailure::CredentialsUnavailable => repo_reasons::CREDENTIALS_UNAVAILABLE,
            RepoFailure::CredentialsRequired => repo_reasons::CREDENTIALS_REQUIRED,
        }
    }
}

/// What the pipeline observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The spec is invalid ([`validate_spec`]); nothing was checked.
    InvalidSpec(String),
    /// The repository did not answer with the default branch (sanitized error).
    Unreachable {
        /// Why.
        reason: String,
        /// Which kind of failure (the condition reason).
        failure: RepoFailure,
        /// The sandbox profile's conformance.
        conformance: Conformance,
    },
    /// The repository answered.
    Observed {
        /// Full hex head of the default branch.
        head: String,
        /// The project configuration at `head`.
        config: ConfigCheck,
        /// The sandbox profile's conformance.
        conformance: Conformance,
    },
}

impl Outcome {
    /// The outcome as one word, for logs.
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::InvalidSpec(_) => "invalid-spec",
            Outcome::Unreachable { .. } => "unreachable",
            Outcome::Observed { .. } => "observed",
        }
    }
}

/// Checks the fields the schema cannot fully enforce (objects applied before the
/// schema, or written by a client that skips validation). All problems at once.
pub fn validate_spec(spec: &ProjectSpec) -> Result<(), String> {
    let mut problems = Vec::new();
    for (field, value) in [
        ("spec.repoUrl", &spec.repo_url),
        ("spec.defaultBranch", &spec.default_branch),
        ("spec.specPath", &spec.spec_path),
        ("spec.sandboxProfile", &spec.sandbox_profile),
    ] {
        if value.trim().is_empty() {
            problems.push(format!("{field} is empty"));
        }
    }
    if spec.wip_limit < 1 {
        problems.push("spec.wipLimit must be at least 1".to_string());
    }
    if spec.wip_limit > protobot_api::project::MAX_WIP_LIMIT {
        problems.push(format!(
            "spec.wipLimit must be at most {}",
            protobot_api::project::MAX_WIP_LIMIT
        ));
    }
    let lease = protobot_api::project::MIN_LEASE_DURATION_SECONDS
        ..=protobot_api::project::MAX_LEASE_DURATION_SECONDS;
    if !lease.contains(&spec.lease_duration_seconds) {
        problems.push(format!(
            "spec.leaseDurationSeconds must be between {} and {} (got {})",
            lease.start(),
            lease.end(),
            spec.lease_duration_seconds
        ));
    }
    if !spec.default_branch.trim().is_empty()
        && let Some(why) = branch_problem(&spec.default_branch)
    {
        problems.push(format!(
            "spec.defaultBranch {:?} {why}",
            spec.default_branch
        ));
    }
    if let Err(e @ protobot_repo::remote::UrlError::CredentialsInUrl { .. }) =
        protobot_repo::remote::RemoteUrl::parse(&spec.repo_url)
    {
        problems.push(format!("spec.repoUrl: {e}"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{}; fix the Project spec", problems.join("; ")))
    }
}

/// Which repository locations a Project may name: network URLs always, paths on the
/// operator's machine and `file://` URLs only with `allow_local` (the operator's
/// `--allow-local-repositories`, for tests and single-machine demos: a Project could
/// otherwise make the operator read any repository on its own filesystem).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RepositoryPolicy {
    /// Accept local paths and `file://` URLs.
    pub allow_local: bool,
}

/// Checks `spec.repoUrl`'s location against `policy` (pure): `https://host/path`,
/// `ssh://host/path` and scp-style `user@host:path` always; `file://` and paths only when
/// the policy allows local repositories. Credentials in the URL are [`validate_spec`]'s.
pub fn validate_location(repo_url: &str, policy: RepositoryPolicy) -> Result<(), String> {
    let url = repo_url.trim();
    if url.is_empty() {
        return Ok(()); // reported by validate_spec
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("spec.repoUrl must not contain spaces or control characters".into());
    }
    let network = |rest: &str| {
        let host = rest.split(['/', ':']).next().unwrap_or("");
        !host.rsplit('@').next().unwrap_or("").is_empty()
    };
    let local = url.starts_with("file://")
        || url.starts_with('/')
        || url.starts_with("./")
        || url.starts_with("../");
    let ok = if let Some(rest) = url.strip_prefix("https://") {
        network(rest) && rest.contains('/')
    } else if let Some(rest) = url.strip_prefix("ssh://") {
        network(rest)
    } else if local {
        if policy.allow_local {
            true
        } else {
            return Err(redact_credentials(&format!(
                "spec.repoUrl {url:?} names a repository on the operator's filesystem; this operator accepts only https://, ssh:// and user@host:path URLs (start it with --allow-local-repositories to allow paths and file://)"
            )));
        }
    } else {
        // scp-style user@host:path (git's short ssh form): no scheme, a colon before any slash.
        match (url.find('@'), url.find(':'), url.find('/')) {
            (Some(at), Some(colon), slash) => {
                at > 0 && colon > at + 1 && slash.is_none_or(|s| s > colon)
            }
            _ => false,
        }
    };
    if ok {
        Ok(())
    } else {
        Err(redact_credentials(&format!(
            "spec.repoUrl {url:?} is not a supported repository URL; use https://host/path, ssh://[user@]host[:port]/path or user@host:path"
        )))
    }
}

/// Why `name` is not a valid branch name (the rules of `git check-ref-format --branch`
/// that matter for a default branch), or `None`.
pub fn branch_problem(name: &str) -> Option<&'static str> {
    let bad_char = |c: char| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c);
    if name.len() > protobot_api::project::BRANCH_MAX_LENGTH as usize {
        Some("is too long (at most 255 bytes)")
    } else if name.starts_with('-') {
        Some("must not start with '-'")
    } else if name.chars().any(bad_char) {
        Some("must not contain spaces, control characters or any of ~ ^ : ? * [ \\")
    } else if name.contains("..") || name.contains("@{") || name == "@" {
        Some("must not contain '..' or '@{' and must not be '@'")
    } else if name.starts_with('/') || name.ends_with('/') || name.contains("//") {
        Some("must not start or end with '/' or contain '//'")
    } else if name.ends_with('.') {
        Some("must not end with '.'")
    } else if name
        .split('/')
        .any(|part| part.starts_with('.') || part.ends_with(".lock"))
    {
        Some("must not have a component starting with '.' or ending with '.lock'")
    } else {
        None
    }
}

/// Whether `spec_path` names the directory the spec store reads (`.protobot/`,
/// `./.protobot`, ...).
pub fn is_spec_store_dir(spec_path: &str) -> bool {
    let p = spec_path.trim().trim_end_matches('/');
    p.strip_prefix("./").unwrap_or(p) == SPEC_STORE_DIR
}

/// `text` with the user-info of every `scheme://user:secret@host` URL replaced
/// by `***`, so no credential reaches a status, an Event or a log line.
pub fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (before, after) = rest.split_at(i + 3);
        out.push_str(before);
        let end = after
            .find(|c: char| c == '/' || c.is_whitespace() || "'\"?#<>`,;".contains(c))
            .unwrap_or(after.len());
        let authority = &after[..end];
        match authority.rfind('@') {
            Some(at) => {
                out.push_str("***");
                out.push_str(&authority[at..]);
            }
            None => out.push_str(authority),
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

fn not_checked(type_: &'static str, why: &str) -> ConditionUpdate {
    ConditionUpdate::new(
        type_,
        ConditionStatus::Unknown,
        reasons::CHECK_ERROR,
        format!("not checked: {why}"),
    )
}

fn conformance_update(c: &Conformance) -> ConditionUpdate {
    match c {
        Conformance::Report(r) if r.passed => ConditionUpdate::new(
            types::SANDBOX_CONFORMANT,
            ConditionStatus::True,
            reasons::PASSED,
            format!(
                "sandbox profile {} passed {} conformance check(s)",
                r.profile, r.checks_passed
            ),
        ),
        Conformance::Report(r) => ConditionUpdate::new(
            types::SANDBOX_CONFORMANT,
            ConditionStatus::False,
            reasons::FAILED,
            format!(
                "sandbox profile {} failed {} conformance check(s){}{}; the Job Site schedules nothing for this project until a passing report is stored",
                r.profile,
                r.checks_failed,
                if r.failed_checks.is_empty() {
                    String::new()
                } else {
                    format!(": {}", r.failed_checks.join(", "))
                },
                r.reason
                    .as_deref()
                    .map(|why| format!(" ({why})"))
                    .unwrap_or_default()
            ),
        ),
        Conformance::Missing(why) => ConditionUpdate::new(
            types::SANDBOX_CONFORMANT,
            ConditionStatus::False,
            reasons::FAILED,
            why.clone(),
        ),
        Conformance::Unavailable(why) => ConditionUpdate::new(
            types::SANDBOX_CONFORMANT,
            ConditionStatus::Unknown,
            reasons::CHECK_ERROR,
            why.clone(),
        ),
    }
}

/// `Ready` from the other three conditions (pure): `True` only when all of
/// `RepoReachable`, `ProjectConfigValid` and `SandboxConformant` are `True`.
pub fn ready(conditions: &[protobot_api::Condition]) -> ConditionUpdate {
    let pending: Vec<String> = [
        types::REPO_REACHABLE,
        types::PROJECT_CONFIG_VALID,
        types::SANDBOX_CONFORMANT,
    ]
    .into_iter()
    .filter_map(|t| match find_condition(conditions, t) {
        Some(c) if c.status == ConditionStatus::True => None,
        Some(c) => Some(format!("{t} is {} ({})", c.status, c.reason)),
        None => Some(format!("{t} is not reported yet")),
    })
    .collect();
    if pending.is_empty() {
        ConditionUpdate::new(
            types::READY,
            ConditionStatus::True,
            READY,
            "repository reachable, project configuration valid, sandbox profile conformant",
        )
    } else {
        ConditionUpdate::new(
            types::READY,
            ConditionStatus::False,
            NOT_READY,
            pending.join("; "),
        )
    }
}

/// `Stalled` from the checks (pure): `True` when a check failed that no retry can fix
/// (`ProjectConfigValid=False` or `SandboxConformant=False`: someone must commit a valid
/// `project.yaml` or store a passing conformance report). An unreachable repository is not
/// stalled: it is retried.
pub fn stalled(conditions: &[protobot_api::Condition]) -> ConditionUpdate {
    let failed = |t| find_condition(conditions, t).filter(|c| c.status == ConditionStatus::False);
    if let Some(c) = failed(types::PROJECT_CONFIG_VALID) {
        return ConditionUpdate::new(
            types::STALLED,
            ConditionStatus::True,
            CONFIG_INVALID,
            format!("{}; commit a fixed project.yaml", c.message),
        );
    }
    if let Some(c) = failed(types::SANDBOX_CONFORMANT) {
        return ConditionUpdate::new(
            types::STALLED,
            ConditionStatus::True,
            NOT_CONFORMANT,
            c.message.clone(),
        );
    }
    ConditionUpdate::new(
        types::STALLED,
        ConditionStatus::False,
        reasons::NOT_STALLED,
        "",
    )
}

/// The status a Project should have after `outcome`, starting from `current`.
/// Fields describing the last observed head (`defaultBranchHead`,
/// `headObservedTime`, `projectConfigValid`) are kept when the repository could
/// not be read; `headObservedTime` moves only when the head does, so a periodic
/// reconcile of an unchanged repository writes nothing.
pub fn status(
    current: Option<&ProjectStatus>,
    outcome: &Outcome,
    generation: Option<i64>,
    now: Timestamp,
) -> ProjectStatus {
    let mut s = current.cloned().unwrap_or_default();
    s.observed_generation = generation;
    let mut updates = Vec::new();
    match outcome {
        Outcome::InvalidSpec(_) => {
            for t in [
                types::REPO_REACHABLE,
                types::PROJECT_CONFIG_VALID,
                types::SANDBOX_CONFORMANT,
            ] {
                updates.push(not_checked(t, "the Project spec is invalid"));
            }
        }
        Outcome::Unreachable {
            reason,
            failure,
            conformance,
        } => {
            s.repo_reachable = Some(false);
            updates.push(ConditionUpdate::new(
                types::REPO_REACHABLE,
                ConditionStatus::False,
                failure.reason(),
                redact_credentials(reason),
            ));
            updates.push(not_checked(
                types::PROJECT_CONFIG_VALID,
                "the repository is unreachable",
            ));
            s.sandbox_conformance = report(conformance);
            updates.push(conformance_update(conformance));
        }
        Outcome::Observed {
            head,
            config,
            conformance,
        } => {
            s.repo_reachable = Some(true);
            updates.push(ConditionUpdate::new(
                types::REPO_REACHABLE,
                ConditionStatus::True,
                reasons::PASSED,
                format!("the default branch is at {head}"),
            ));
            if s.default_branch_head.as_deref() != Some(head.as_str())
                || s.head_observed_time.is_none()
            {
                s.head_observed_time = Some(Time(now));
            }
            s.default_branch_head = Some(head.clone());
            updates.push(match config {
                ConfigCheck::Valid => {
                    s.project_config_valid = Some(true);
                    ConditionUpdate::new(
                        types::PROJECT_CONFIG_VALID,
                        ConditionStatus::True,
                        reasons::PASSED,
                        format!("project.yaml is valid at {head}"),
                    )
                }
                ConfigCheck::Invalid(why) => {
                    s.project_config_valid = Some(false);
                    ConditionUpdate::new(
                        types::PROJECT_CONFIG_VALID,
                        ConditionStatus::False,
                        reasons::FAILED,
                        redact_credentials(why),
                    )
                }
                ConfigCheck::Unreadable(why) => {
                    s.project_config_valid = None;
                    ConditionUpdate::new(
                        types::PROJECT_CONFIG_VALID,
                        ConditionStatus::Unknown,
                        reasons::CHECK_ERROR,
                        redact_credentials(why),
                    )
                }
            });
            s.sandbox_conformance = report(conformance);
            updates.push(conformance_update(conformance));
        }
    }
    for u in updates {
        set_condition(&mut s.conditions, u, generation, now);
    }
    let (readiness, stall) = match outcome {
        // An invalid spec waits for an edit of the Project: stalled.
        Outcome::InvalidSpec(why) => {
            let [r, st] = summary(Health::Stalled, INVALID_SPEC, redact_credentials(why));
            (r, st)
        }
        _ => (ready(&s.conditions), stalled(&s.conditions)),
    };
    set_condition(&mut s.conditions, readiness, generation, now);
    set_condition(&mut s.conditions, stall, generation, now);
    s
}

fn report(c: &Conformance) -> Option<SandboxConformance> {
    match c {
        Conformance::Report(r) => Some(r.clone()),
        Conformance::Missing(_) | Conformance::Unavailable(_) => None,
    }
}

/// The Event a change of `Ready` is reported with (pure): `None` when `Ready`
/// kept its status.
pub fn ready_event(before: Option<&ProjectStatus>, after: &ProjectStatus) -> Option<Event> {
    let was = before
        .and_then(|s| find_condition(&s.conditions, types::READY))
        .map(|c| c.status);
    let now = find_condition(&after.conditions, types::READY)?;
    if was == Some(now.status) {
        return None;
    }
    let (type_, reason) = match now.status {
        ConditionStatus::True => (EventType::Normal, "Ready"),
        ConditionStatus::False | ConditionStatus::Unknown => (EventType::Warning, "NotReady"),
    };
    Some(Event {
        type_,
        reason: reason.into(),
        note: Some(now.message.chars().take(1024).collect()),
        action: "Observe".into(),
        secondary: None,
    })
}

/// When to look at the Project again after `outcome`; `status` is the status
/// just computed. An unreachable repository is retried after about as long as
/// it has been unreachable (10 s, 10 s, 20 s, 40 s, ... up to 5 minutes), so a
/// long outage costs few fetches; `None` means wait for a change of the object.
pub fn requeue_after(
    outcome: &Outcome,
    status: &ProjectStatus,
    now: Timestamp,
) -> Option<Duration> {
    match outcome {
        Outcome::InvalidSpec(_) => None,
        Outcome::Observed { .. } => Some(RESYNC),
        Outcome::Unreachable { .. } => {
            let since = find_condition(&status.conditions, types::REPO_REACHABLE)
                .filter(|c| c.status == ConditionStatus::False)
                .map(|c| c.last_transition_time.0)
                .unwrap_or(now);
            let failing = now
                .duration_since(since)
                .try_into()
                .unwrap_or(Duration::ZERO);
            Some(failing.clamp(MIN_RETRY, MAX_RETRY))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "0123456789abcdef0123456789abcdef01234567";

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn find<'a>(s: &'a ProjectStatus, type_: &str) -> &'a protobot_api::Condition {
        s.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    fn of(s: &ProjectStatus, type_: &str) -> (ConditionStatus, String) {
        let c = find(s, type_);
        (c.status, c.reason.clone())
    }

    fn spec() -> ProjectSpec {
        serde_json::from_value(serde_json::json!({
            "repoUrl": "file:///srv/git/demo.git",
            "sandboxProfile": "kata",
        }))
        .unwrap()
    }

    fn passing() -> Conformance {
        Conformance::Report(SandboxConformance {
            profile: "kata".into(),
            passed: true,
            checks_passed: 12,
            checks_failed: 0,
            failed_checks: Vec::new(),
            reason: None,
            report_digest: Some("sha256:abc".into()),
            checked_time: Time(t("2026-09-18T11:00:00Z")),
        })
    }

    fn failing() -> Conformance {
        Conformance::Report(SandboxConformance {
            profile: "kata".into(),
            passed: false,
            checks_passed: 10,
            checks_failed: 2,
            failed_checks: vec!["egress-denied".into(), "no-host-pid".into()],
            reason: Some("RuntimeClass kata does not exist: install its runtime".into()),
            report_digest: None,
            checked_time: Time(t("2026-09-18T11:00:00Z")),
        })
    }

    fn observed(config: ConfigCheck, conformance: Conformance) -> Outcome {
        Outcome::Observed {
            head: HEAD.into(),
            config,
            conformance,
        }
    }

    #[test]
    fn a_missing_report_is_not_conformant_and_summaries_count_failed_checks() {
        let now = t("2026-09-18T12:00:00Z");
        let outcome = observed(
            ConfigCheck::Valid,
            Conformance::Missing("no conformance report is stored for kata".into()),
        );
        let s = status(None, &outcome, Some(1), now);
        assert_eq!(of(&s, types::SANDBOX_CONFORMANT).0, ConditionStatus::False);
        assert_eq!(of(&s, types::READY).0, ConditionStatus::False);
        assert_eq!(s.sandbox_conformance, None);

        let mut report: protobot_executors::conformance::ConformanceReport =
            serde_json::from_value(serde_json::json!({
                "contract_version": "jobsite-sandbox/v1",
                "profile": "kata",
                "backend": {"name": "protobot-kubernetes", "version": "t"},
                "policy_version": 0,
                "policy_digest": "",
                "executable_digests": {},
                "resource_limits": serde_json::to_value(
                    protobot_executors::conformance::ResourceLimitsReport::from(
                        &protobot_jobsite::executor::Limits::default()
                    )
                ).unwrap(),
                "capabilities": [],
                "required_capabilities": [],
                "checks": [
                    {"id": "SB-NET-001", "name": "no egress", "passed": false, "skipped": false},
                    {"id": "SB-FS-005", "name": "host paths", "passed": true, "skipped": false},
                    {"id": "SB-GPU-001", "name": "gpu", "passed": false, "skipped": true},
                ],
                "passed": false,
                "autonomous_execution": false,
            }))
            .unwrap();
        let summary = summarize("kata", &report, None, now);
        assert!(!summary.passed);
        assert_eq!((summary.checks_passed, summary.checks_failed), (1, 1));
        assert_eq!(
            summary.failed_checks,
            ["SB-NET-001"],
            "skipped checks are not failures"
        );
        let own = report.failure_reason();
        assert!(
            own.as_deref().is_some_and(|r| r.contains("SB-NET-001")),
            "{own:?}"
        );
        assert_eq!(
            summary.reason, own,
            "without a fail-closed reason, the report's own failure"
        );
        report.fail_closed_reason = Some(format!(
            "the cluster cannot run pods of profile kata: {}",
            "x".repeat(2000)
        ));
        let long = summarize("kata", &report, None, now).reason.unwrap();
        assert_eq!(long.chars().count(), CONFORMANCE_REASON_LIMIT);
        assert!(
            long.starts_with("the cluster cannot run pods of profile kata: xxx")
                && long.ends_with('…')
        );
        report.passed = true;
        report.autonomous_execution = true;
        report.fail_closed_reason = None;
        report.checks.retain(|c| c.passed);
        let passing = summarize("kata", &report, None, now);
        assert!(passing.passed);
        assert_eq!(passing.reason, None, "a passing report has no reason");
    }

    #[test]
    fn a_valid_spec_passes_and_every_empty_field_is_named() {
        assert_eq!(validate_spec(&spec()), Ok(()));
        let mut bad = spec();
        bad.repo_url = " ".into();
        bad.sandbox_profile = String::new();
        bad.wip_limit = 0;
        let why = validate_spec(&bad).unwrap_err();
        assert!(why.contains("spec.repoUrl is empty"), "{why}");
        assert!(why.contains("spec.sandboxProfile is empty"), "{why}");
        assert!(why.contains("spec.wipLimit must be at least 1"), "{why}");
        assert!(!why.contains("spec.defaultBranch"), "{why}");
    }

    #[test]
    fn an_invalid_spec_is_reported_and_waits_for_a_change() {
        let outcome = Outcome::InvalidSpec("spec.wipLimit must be at least 1".into());
        let s = status(None, &outcome, Some(2), t("2026-09-18T12:00:00Z"));
        assert_eq!(
            of(&s, types::READY),
            (ConditionStatus::False, INVALID_SPEC.into())
        );
        assert!(find(&s, types::READY).message.contains("wipLimit"));
        for ty in [
            types::REPO_REACHABLE,
            types::PROJECT_CONFIG_VALID,
            types::SANDBOX_CONFORMANT,
        ] {
            assert_eq!(of(&s, ty).0, ConditionStatus::Unknown, "{ty}");
        }
        assert_eq!(s.observed_generation, Some(2));
        assert_eq!(s.repo_reachable, None);
        assert_eq!(s.default_branch_head, None);
        assert_eq!(
            requeue_after(&outcome, &s, t("2026-09-18T12:00:00Z")),
            None,
            "no retry storm: only an edit changes an invalid spec"
        );
    }

    #[test]
    fn an_unreachable_repository_is_reported_without_credentials_and_retried_with_backoff() {
        let outcome = Outcome::Unreachable {
            reason: "repository https://bot:s3cret@git.example.com/demo.git could not be mirrored: connection refused".into(),
            failure: RepoFailure::Unavailable,
            conformance: passing(),
        };
        let t0 = t("2026-09-18T12:00:00Z");
        let s = status(None, &outcome, Some(1), t0);
        assert_eq!(s.repo_reachable, Some(false));
        assert_eq!(
            of(&s, types::REPO_REACHABLE),
            (
                ConditionStatus::False,
                reasons::REPOSITORY_UNAVAILABLE.into()
            )
        );
        let msg = &find(&s, types::REPO_REACHABLE).message;
        assert!(!msg.contains("s3cret") && !msg.contains("bot:"), "{msg}");
        assert!(
            msg.contains("https://***@git.example.com/demo.git"),
            "{msg}"
        );
        assert!(msg.contains("connection refused"), "{msg}");
        assert_eq!(
            of(&s, types::PROJECT_CONFIG_VALID).0,
            ConditionStatus::Unknown
        );
        assert_eq!(
            of(&s, types::READY),
            (ConditionStatus::False, NOT_READY.into())
        );
        assert_eq!(s.default_branch_head, None, "no head was observed");
        assert_eq!(s.project_config_valid, None);
        // Backoff grows with the length of the outage, bounded.
        assert_eq!(requeue_after(&outcome, &s, t0), Some(MIN_RETRY));
        let later = t("2026-09-18T12:01:00Z");
        let s2 = status(Some(&s), &outcome, Some(1), later);
        assert_eq!(s2, s, "a repeated failure writes nothing new");
        assert_eq!(
            requeue_after(&outcome, &s2, later),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            requeue_after(&outcome, &s2, t("2026-09-18T15:00:00Z")),
            Some(MAX_RETRY)
        );
    }

    #[test]
    fn an_outage_keeps_the_last_observed_head() {
        let t0 = t("2026-09-18T12:00:00Z");
        let ok = status(None, &observed(ConfigCheck::Valid, passing()), Some(1), t0);
        let down = status(
            Some(&ok),
            &Outcome::Unreachable {
                reason: "timeout".into(),
                failure: RepoFailure::Unavailable,
                conformance: passing(),
            },
            Some(1),
            t("2026-09-18T12:05:00Z"),
        );
        assert_eq!(down.default_branch_head.as_deref(), Some(HEAD));
        assert_eq!(down.head_observed_time, Some(Time(t0)));
        assert_eq!(down.project_config_valid, Some(true));
        assert_eq!(down.repo_reachable, Some(false));
        assert_eq!(of(&down, types::READY).0, ConditionStatus::False);
    }

    #[test]
    fn an_invalid_project_config_carries_the_first_error() {
        let s = status(
            None,
            &observed(
                ConfigCheck::Invalid("project.not_initialized: no project.yaml".into()),
                passing(),
            ),
            Some(1),
            t("2026-09-18T12:00:00Z"),
        );
        assert_eq!(s.repo_reachable, Some(true));
        assert_eq!(s.default_branch_head.as_deref(), Some(HEAD));
        assert_eq!(s.project_config_valid, Some(false));
        assert_eq!(
            of(&s, types::PROJECT_CONFIG_VALID),
            (ConditionStatus::False, reasons::FAILED.into())
        );
        assert!(
            find(&s, types::PROJECT_CONFIG_VALID)
                .message
                .contains("project.not_initialized")
        );
        assert_eq!(of(&s, types::READY).0, ConditionStatus::False);
        assert!(
            find(&s, types::READY)
                .message
                .contains("ProjectConfigValid is False")
        );
        let unreadable = status(
            None,
            &observed(
                ConfigCheck::Unreadable("revision.read_failed".into()),
                passing(),
            ),
            Some(1),
            t("2026-09-18T12:00:00Z"),
        );
        assert_eq!(
            of(&unreadable, types::PROJECT_CONFIG_VALID).0,
            ConditionStatus::Unknown
        );
        assert_eq!(unreadable.project_config_valid, None);
    }

    #[test]
    fn a_failing_conformance_report_is_summarized_and_not_ready() {
        let s = status(
            None,
            &observed(ConfigCheck::Valid, failing()),
            Some(1),
            t("2026-09-18T12:00:00Z"),
        );
        assert_eq!(
            of(&s, types::SANDBOX_CONFORMANT),
            (ConditionStatus::False, reasons::FAILED.into())
        );
        let msg = &find(&s, types::SANDBOX_CONFORMANT).message;
        assert!(
            msg.contains("egress-denied") && msg.contains("failed 2"),
            "{msg}"
        );
        assert!(
            msg.contains("(RuntimeClass kata does not exist: install its runtime)"),
            "the condition names what the measurement found missing: {msg}"
        );
        let summary = s.sandbox_conformance.as_ref().unwrap();
        assert!(!summary.passed);
        assert_eq!(summary.checks_failed, 2);
        assert_eq!(of(&s, types::READY).0, ConditionStatus::False);
    }

    #[test]
    fn no_conformance_information_is_unknown_never_a_pass() {
        let s = status(
            None,
            &observed(
                ConfigCheck::Valid,
                Conformance::Unavailable("no report for profile kata".into()),
            ),
            Some(1),
            t("2026-09-18T12:00:00Z"),
        );
        assert_eq!(
            of(&s, types::SANDBOX_CONFORMANT),
            (ConditionStatus::Unknown, reasons::CHECK_ERROR.into())
        );
        assert_eq!(s.sandbox_conformance, None);
        assert_eq!(
            of(&s, types::READY),
            (ConditionStatus::False, NOT_READY.into())
        );
        assert!(
            find(&s, types::READY)
                .message
                .contains("SandboxConformant is Unknown")
        );
    }

    #[test]
    fn everything_true_is_ready_and_a_resync_writes_nothing() {
        let t0 = t("2026-09-18T12:00:00Z");
        let outcome = observed(ConfigCheck::Valid, passing());
        let s = status(None, &outcome, Some(1), t0);
        assert_eq!(of(&s, types::READY), (ConditionStatus::True, READY.into()));
        assert_eq!(s.repo_reachable, Some(true));
        assert_eq!(s.project_config_valid, Some(true));
        assert_eq!(s.default_branch_head.as_deref(), Some(HEAD));
        assert_eq!(s.head_observed_time, Some(Time(t0)));
        assert_eq!(s.sandbox_conformance.as_ref().unwrap().checks_passed, 12);
        assert_eq!(requeue_after(&outcome, &s, t0), Some(RESYNC));
        let again = status(Some(&s), &outcome, Some(1), t("2026-09-18T12:01:00Z"));
        assert_eq!(again, s, "an unchanged repository writes nothing");
        let moved = status(
            Some(&s),
            &Outcome::Observed {
                head: "f".repeat(40),
                config: ConfigCheck::Valid,
                conformance: passing(),
            },
            Some(1),
            t("2026-09-18T12:02:00Z"),
        );
        assert_eq!(moved.default_branch_head, Some("f".repeat(40)));
        assert_eq!(
            moved.head_observed_time,
            Some(Time(t("2026-09-18T12:02:00Z")))
        );
        assert_eq!(
            find(&moved, types::READY).last_transition_time.0,
            t0,
            "Ready stayed True"
        );
    }

    #[test]
    fn ready_needs_all_three_conditions_true() {
        let t0 = t("2026-09-18T12:00:00Z");
        let mut conditions = Vec::new();
        assert_eq!(ready(&conditions).status, ConditionStatus::False);
        for ty in [
            types::REPO_REACHABLE,
            types::PROJECT_CONFIG_VALID,
            types::SANDBOX_CONFORMANT,
        ] {
            assert_eq!(ready(&conditions).status, ConditionStatus::False);
            set_condition(
                &mut conditions,
                ConditionUpdate::new(ty, ConditionStatus::True, reasons::PASSED, String::new()),
                None,
                t0,
            );
        }
        assert_eq!(ready(&conditions).status, ConditionStatus::True);
        set_condition(
            &mut conditions,
            ConditionUpdate::new(
                types::SANDBOX_CONFORMANT,
                ConditionStatus::Unknown,
                reasons::CHECK_ERROR,
                String::new(),
            ),
            None,
            t0,
        );
        assert_eq!(ready(&conditions).status, ConditionStatus::False);
    }

    #[test]
    fn an_event_is_emitted_only_when_ready_changes() {
        let t0 = t("2026-09-18T12:00:00Z");
        let down = status(None, &observed(ConfigCheck::Valid, failing()), Some(1), t0);
        let first = ready_event(None, &down).unwrap();
        assert_eq!(
            (first.type_, first.reason.as_str()),
            (EventType::Warning, "NotReady")
        );
        let same = status(
            Some(&down),
            &observed(ConfigCheck::Valid, failing()),
            Some(1),
            t0,
        );
        assert!(ready_event(Some(&down), &same).is_none());
        let up = status(
            Some(&down),
            &observed(ConfigCheck::Valid, passing()),
            Some(1),
            t0,
        );
        let ev = ready_event(Some(&down), &up).unwrap();
        assert_eq!((ev.type_, ev.reason.as_str()), (EventType::Normal, "Ready"));
    }

    #[test]
    fn credentials_are_redacted_from_every_url() {
        assert_eq!(
            redact_credentials("fetch https://u:p@h.example/x.git and ssh://git@h2/y failed"),
            "fetch https://***@h.example/x.git and ssh://***@h2/y failed"
        );
        assert_eq!(
            redact_credentials("'https://tok@h/x' no creds at file:///srv/x"),
            "'https://***@h/x' no creds at file:///srv/x"
        );
        assert_eq!(redact_credentials("plain text"), "plain text");
    }

    #[test]
    fn only_the_spec_store_directory_is_a_supported_spec_path() {
        for p in [".protobot/", ".protobot", "./.protobot/"] {
            assert!(is_spec_store_dir(p), "{p}");
        }
        for p in ["spec/", "docs/.protobot/", ""] {
            assert!(!is_spec_store_dir(p), "{p}");
        }
    }

    #[test]
    fn access_failures_get_their_own_reasons_and_name_the_secret() {
        use protobot_repo::remote::{AccessError, SecretRef};
        let secret = SecretRef::new("team-a", "shop-git");
        let refused = AccessError::AuthenticationFailed {
            url: "https://git.example.com/shop.git".into(),
            secret: secret.clone(),
            what: "token or username/password",
        };
        let changed = AccessError::HostKeyChanged {
            host: "[git.example.com]:2222".into(),
            fingerprint: "SHA256:abc".into(),
            listed: "ssh-ed25519".into(),
            source_name: format!("Secret {secret}"),
        };
        let missing = AccessError::SecretMissing { secret };
        for (error, reason) in [
            (&refused, repo_reasons::AUTHENTICATION_FAILED),
            (&changed, repo_reasons::HOST_KEY_CHANGED),
            (&missing, repo_reasons::CREDENTIALS_UNAVAILABLE),
        ] {
            let outcome = Outcome::Unreachable {
                reason: error.to_string(),
                failure: RepoFailure::of(error),
                conformance: passing(),
            };
            let s = status(None, &outcome, Some(1), t("2026-09-18T12:00:00Z"));
            assert_eq!(
                of(&s, types::REPO_REACHABLE),
                (ConditionStatus::False, reason.to_owned())
            );
            let message = &find(&s, types::REPO_REACHABLE).message;
            assert!(message.contains("team-a/shop-git"), "{message}");
            assert!(
                reason.chars().all(|c| c.is_ascii_alphanumeric()),
                "{reason} is a valid condition reason"
            );
        }
        assert_ne!(
            RepoFailure::of(&refused).reason(),
            RepoFailure::of(&changed).reason(),
            "a changed host key is told apart from refused credentials"
        );
        assert_eq!(
            RepoFailure::Unavailable.reason(),
            reasons::REPOSITORY_UNAVAILABLE
        );
    }

    #[test]
    fn a_repo_url_carrying_credentials_is_an_invalid_spec_that_does_not_echo_them() {
        let mut bad = spec();
        bad.repo_url = "https://bot:s3cret@git.example.com/demo.git".into();
        let why = validate_spec(&bad).unwrap_err();
        assert!(
            why.contains("spec.repoUrl") && why.contains("credentialsSecretRef"),
            "{why}"
        );
        assert!(!why.contains("s3cret") && !why.contains("bot:"), "{why}");
        let mut token = spec();
        token.repo_url = "https://ghp_abc123@github.com/o/r.git".into();
        assert!(!validate_spec(&token).unwrap_err().contains("ghp_abc123"));
        let mut fine = spec();
        fine.repo_url = "ssh://git@git.example.com:2222/demo.git".into();
        assert_eq!(
            validate_spec(&fine),
            Ok(()),
            "an ssh user name is not a credential"
        );
    }

    #[test]
    fn stalled_says_whether_only_a_person_can_move_the_project() {
        let now = t("2026-09-18T12:00:00Z");
        let invalid = status(
            None,
            &Outcome::InvalidSpec("spec.wipLimit must be at least 1".into()),
            Some(1),
            now,
        );
        assert_eq!(
            of(&invalid, types::STALLED),
            (ConditionStatus::True, INVALID_SPEC.into())
        );
        assert_eq!(
            of(&invalid, types::READY),
            (ConditionStatus::False, INVALID_SPEC.into())
        );
        let bad_config = status(
            None,
            &observed(ConfigCheck::Invalid("wip: not a number".into()), passing()),
            Some(1),
            now,
        );
        assert_eq!(
            of(&bad_config, types::STALLED),
            (ConditionStatus::True, CONFIG_INVALID.into())
        );
        assert!(
            find(&bad_config, types::STALLED)
                .message
                .contains("wip: not a number")
        );
        let not_conformant = status(None, &observed(ConfigCheck::Valid, failing()), Some(1), now);
        assert_eq!(
            of(&not_conformant, types::STALLED),
            (ConditionStatus::True, NOT_CONFORMANT.into())
        );
        // Retried by the controller: not stalled, only not ready.
        let down = status(
            None,
            &Outcome::Unreachable {
                reason: "connection refused".into(),
                failure: RepoFailure::Unavailable,
                conformance: passing(),
            },
            Some(1),
            now,
        );
        assert_eq!(
            of(&down, types::STALLED),
            (ConditionStatus::False, reasons::NOT_STALLED.into())
        );
        assert_eq!(of(&down, types::READY).0, ConditionStatus::False);
        // Fixed: ready, and the Stalled transition is recorded.
        let later = t("2026-09-18T12:05:00Z");
        let fixed = status(
            Some(&bad_config),
            &observed(ConfigCheck::Valid, passing()),
            Some(2),
            later,
        );
        assert_eq!(
            of(&fixed, types::READY),
            (ConditionStatus::True, READY.into())
        );
        assert_eq!(of(&fixed, types::STALLED).0, ConditionStatus::False);
        assert_eq!(
            find(&fixed, types::STALLED).last_transition_time,
            Time(later)
        );
    }

    #[test]
    fn repository_locations_are_network_urls_unless_local_ones_are_allowed() {
        let strict = RepositoryPolicy::default();
        let local = RepositoryPolicy { allow_local: true };
        for url in [
            "https://git.example.com/team/shop.git",
            "ssh://git@git.example.com:2222/team/shop.git",
            "git@github.com:team/shop.git",
        ] {
            assert_eq!(validate_location(url, strict), Ok(()), "{url}");
        }
        for url in ["file:///srv/git/demo.git", "/srv/git/demo.git", "./demo"] {
            let why = validate_location(url, strict).unwrap_err();
            assert!(why.contains("--allow-local-repositories"), "{url}: {why}");
            assert_eq!(validate_location(url, local), Ok(()), "{url}");
        }
        for url in [
            "http://git.example.com/shop.git",
            "git://git.example.com/shop.git",
            "https://",
            "https://host-without-path",
            "shop.git",
            "C:/repos/shop",
            "git@github.com team/shop.git",
        ] {
            let why = validate_location(url, local).unwrap_err();
            assert!(why.contains("spec.repoUrl"), "{url}: {why}");
        }
        let leaked = validate_location("http://me:s3cret@example.com/r.git", strict).unwrap_err();
        assert!(!leaked.contains("s3cret"), "{leaked}");
    }

    #[test]
    fn default_branches_must_be_valid_ref_names() {
        for fine in ["main", "release/2.x", "feature+x", "v1.0"] {
            assert_eq!(branch_problem(fine), None, "{fine}");
        }
        for bad in [
            "-main",
            "a..b",
            "a//b",
            "/main",
            "main/",
            "main.",
            "a/.hidden",
            "x.lock",
            "a.lock/b",
            "has space",
            "a:b",
            "a~1",
            "@",
            "a@{1}",
            "tab\t",
        ] {
            assert!(branch_problem(bad).is_some(), "{bad:?} accepted");
        }
        let mut s = spec();
        s.default_branch = "a..b".into();
        s.wip_limit = protobot_api::project::MAX_WIP_LIMIT + 1;
        s.lease_duration_seconds = 5;
        let why = validate_spec(&s).unwrap_err();
        for part in [
            "spec.defaultBranch",
            "spec.wipLimit must be at most",
            "spec.leaseDurationSeconds must be between 30 and 86400",
        ] {
            assert!(why.contains(part), "{part} missing from {why}");
        }
    }
}
