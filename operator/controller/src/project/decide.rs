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
    conditions::{find_condition, reasons, set_condition, types},
    project::SandboxConformance,
};

/// `Ready=False`: the Project's spec is invalid; the message says which field.
pub const INVALID_SPEC: &str = "InvalidSpec";
/// `Ready=False`: at least one of the other conditions is not `True`.
pub const NOT_READY: &str = "NotReady";
/// `Ready=True`: every condition holds.
pub const READY: &str = "Ready";

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
        report_digest: digest,
        checked_time: Time(now),
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
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{}; fix the Project spec", problems.join("; ")))
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
                "sandbox profile {} failed {} conformance check(s){}; the Job Site schedules nothing for this project until a passing report is stored",
                r.profile,
                r.checks_failed,
                if r.failed_checks.is_empty() {
                    String::new()
                } else {
                    format!(": {}", r.failed_checks.join(", "))
                }
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
            conformance,
        } => {
            s.repo_reachable = Some(false);
            updates.push(ConditionUpdate::new(
                types::REPO_REACHABLE,
                ConditionStatus::False,
                reasons::REPOSITORY_UNAVAILABLE,
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
    let readiness = match outcome {
        Outcome::InvalidSpec(why) => ConditionUpdate::new(
            types::READY,
            ConditionStatus::False,
            INVALID_SPEC,
            redact_credentials(why),
        ),
        _ => ready(&s.conditions),
    };
    set_condition(&mut s.conditions, readiness, generation, now);
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
        report.passed = true;
        report.checks.retain(|c| c.passed);
        assert!(summarize("kata", &report, None, now).passed);
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
}
