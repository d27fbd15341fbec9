//! Sample objects of every kind round-trip through serde and validate against the generated
//! `openAPIV3Schema`: no field the API server would prune or reject, required fields present,
//! patterns and enums honoured. Negative cases prove the validator is not vacuous.

use kube::Resource;
use protobot_api::{
    BugReport, BugReportSpec, BugReportStatus, BuildWorkItem, BuildWorkItemSpec,
    BuildWorkItemStatus, BusinessPriority, ChangeSet, ChangeSetSpec, ChangeSetStatus, ChangeType,
    InspectionRun, InspectionRunSpec, InspectionRunStatus, Lease, LifecycleState, LocalRef,
    Project, ProjectQueue, ProjectSpec, ProjectStatus, QueueReason,
    bug_report::{RecordedBugFacts, RecordedImpact},
    build_work_item::{
        CompletionEvidence, ContractVersionEntry, CycleOutcome, CycleRecord, DependencyStatus,
        GitMutation, MergeEnvelope, Readiness, Reconciliation, ReconciliationStatus,
    },
    change_set::{ImpactSummary, MaterializationOutcome, MaterializationReservation},
    common::{LifecycleCommand, ModelTier},
    conditions::{ConditionStatus, ConditionUpdate, reasons, set_condition, types},
    inspection_run::{FindingCounts, MutationConfig, ProducerCompletion, Seal},
    lease::leased_condition,
    project::{ChangeSetPolling, SandboxConformance},
};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

use crate::util::{root_schema, t, time, validate};

const SPEC_COMMIT: &str = "1111111111111111111111111111111111111111";
const CANDIDATE: &str = "2222222222222222222222222222222222222222";
const MERGE: &str = "3333333333333333333333333333333333333333";

/// Serializes `object`, checks it deserializes back to itself, and returns the violations of
/// its `spec` and `status` against the CRD schema of `kind`.
fn check<K>(kind: &str, object: &K) -> Vec<String>
where
    K: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let json = serde_json::to_value(object).unwrap();
    let back: K = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(&back, object, "{kind} does not round-trip");
    let schema = root_schema(kind);
    let mut errors = validate(&schema["properties"]["spec"], &json["spec"], "spec");
    if !json["status"].is_null() {
        errors.extend(validate(
            &schema["properties"]["status"],
            &json["status"],
            "status",
        ));
    }
    errors
}

fn project() -> Project {
    let mut project = Project::new(
        "cli-sync",
        ProjectSpec {
            repo_url: "https://git.example.invalid/cli-sync.git".to_owned(),
            default_branch: "main".to_owned(),
            spec_path: ".protobot/".to_owned(),
            sandbox_profile: "kata-restricted".to_owned(),
            wip_limit: 2,
            lease_duration_seconds: 900,
            credentials_secret_ref: Some(LocalRef::new("cli-sync-git")),
            worker_classes_ref: Some(LocalRef::new("cli-sync-workers")),
            poll_approved_change_sets: Some(ChangeSetPolling {
                since_commit: Some(MERGE.to_owned()),
            }),
            forge: Some(protobot_api::project::ForgeSpec {
                github: Some(protobot_api::project::GithubForge {
                    api_base_url: "https://ghe.example.invalid/api/v3".to_owned(),
                    owner: Some("acme".to_owned()),
                    repository: Some("cli-sync".to_owned()),
                    token_secret_ref: None,
                    app: Some(protobot_api::project::GithubApp {
                        app_id: 1,
                        installation_id: 2,
                        private_key_secret_ref: LocalRef::new("cli-sync-app"),
                    }),
                    review_mode: Some(protobot_api::project::ReviewMode::MultiPlayer),
                    landing: protobot_api::project::LandingMode::PullRequest,
                    work_item_url: Some("https://console.example.invalid/bwi/{name}".to_owned()),
                }),
                gitea: None,
            }),
            budget: Some(protobot_api::project::BudgetSpec {
                per_item: Some("2.50".to_owned()),
            }),
        },
    );
    let mut conditions = Vec::new();
    set_condition(
        &mut conditions,
        ConditionUpdate::new(
            types::READY,
            ConditionStatus::True,
            reasons::PASSED,
            "ready",
        ),
        Some(1),
        t(0),
    );
    project.status = Some(ProjectStatus {
        observed_generation: Some(1),
        repo_reachable: Some(true),
        project_config_valid: Some(true),
        default_branch_head: Some(MERGE.to_owned()),
        head_observed_time: Some(time(0)),
        sandbox_conformance: Some(SandboxConformance {
            profile: "kata-restricted".to_owned(),
            passed: false,
            checks_passed: 11,
            checks_failed: 1,
            failed_checks: vec!["egress-dns-denied".to_owned()],
            reason: None,
            report_digest: Some("sha256:abc".to_owned()),
            checked_time: time(0),
        }),
        poll_baseline: None,
        conditions,
        queue: Some(ProjectQueue {
            ready: 1000,
            queued: 992,
            reason: QueueReason::NoFreeSlot,
            message: "992 of 1000 ready item(s) wait for a build slot (0 free on this replica)"
                .to_owned(),
            reported_by: "protobot-7d9f-x2".to_owned(),
            observed_time: time(0),
        }),
    });
    project
}

fn change_set() -> ChangeSet {
    let mut change_set = ChangeSet::new(
        "cs-00042",
        ChangeSetSpec {
            project_ref: LocalRef::new("cli-sync"),
            change_set_id: "CS-00042".to_owned(),
            merge_commit: MERGE.to_owned(),
            business_priority: Some(BusinessPriority::High),
        },
    );
    change_set.status = Some(ChangeSetStatus {
        observed_generation: Some(1),
        work_item_ref: Some(LocalRef::new("wi-cs-00042")),
        reservation: Some(MaterializationReservation {
            materialization_key: "cli-sync/CS-00042".to_owned(),
            source_fingerprint: "sha3-256:xyz".to_owned(),
            outcome: MaterializationOutcome::ReadyForBuilding,
        }),
        impact: Some(ImpactSummary {
            change_type: ChangeType::Undefined,
            implementation_required: true,
            changed_requirements: vec!["REQ-SYNC-001".to_owned()],
            applicable_requirements: vec!["REQ-SYNC-001".to_owned(), "REQ-SYNC-002".to_owned()],
            dependencies: Vec::new(),
        }),
        approval: Some(protobot_api::change_set::ApprovingPullRequest {
            number: 42,
            url: "https://github.com/acme/cli-sync/pull/42".to_owned(),
            merge_commit: MERGE.to_owned(),
            approvers: vec!["rita".to_owned()],
        }),
        conditions: Vec::new(),
    });
    change_set
}

fn bug_report() -> BugReport {
    let mut bug = BugReport::new(
        "gh-17",
        BugReportSpec {
            project_ref: LocalRef::new("cli-sync"),
            bug_id: "GH-17".to_owned(),
            violated_requirements: vec!["REQ-CLI-00001".to_owned()],
            affected_scopes: vec!["cli".to_owned()],
            business_priority: Some(BusinessPriority::High),
            summary: Some("sync deletes files it should keep".to_owned()),
        },
    );
    bug.status = Some(BugReportStatus {
        observed_generation: Some(1),
        work_item_ref: Some(LocalRef::new("wi-bug-gh-17-1111111111")),
        recorded_facts: Some(RecordedBugFacts {
            spec_commit: SPEC_COMMIT.to_owned(),
            materialization_key: format!("cli-sync/bug:GH-17@{SPEC_COMMIT}"),
            work_item_id: "wi-bug-gh-17-1111111111".to_owned(),
            violated_requirements: vec!["REQ-CLI-00001".to_owned()],
            affected_scopes: vec!["cli".to_owned()],
            priority: "high".to_owned(),
            impact: vec![RecordedImpact {
                requirement_id: "REQ-CLI-00002".to_owned(),
                rationale: "shares the interface cli-main".to_owned(),
            }],
            touched_paths: vec!["tests/test_dry_run.sh".to_owned()],
        }),
        impact: Some(ImpactSummary {
            change_type: ChangeType::Contradicts,
            implementation_required: true,
            changed_requirements: vec!["REQ-CLI-00001".to_owned()],
            applicable_requirements: vec!["REQ-CLI-00001".to_owned(), "REQ-CLI-00002".to_owned()],
            dependencies: Vec::new(),
        }),
        conditions: Vec::new(),
    });
    bug
}

fn envelope(merge_commit: Option<&str>) -> MergeEnvelope {
    MergeEnvelope {
        product_tree_digest: "sha256:tree".to_owned(),
        inspection_run_id: "ir-1".to_owned(),
        integration_head: CANDIDATE.to_owned(),
        target: "main".to_owned(),
        contract_version: 7,
        merge_commit: merge_commit.map(str::to_owned),
    }
}

fn work_item() -> BuildWorkItem {
    let mut item = BuildWorkItem::new(
        "wi-cs-00042",
        BuildWorkItemSpec {
            work_item_id: "wi-001".to_owned(),
            project_ref: LocalRef::new("cli-sync"),
            change_set_ref: Some(LocalRef::new("cs-00042")),
            change_set_id: Some("CS-00042".to_owned()),
            materialization_key: "cli-sync/CS-00042".to_owned(),
            change_type: ChangeType::Undefined,
            implementation_required: true,
            changed_requirements: vec!["REQ-SYNC-001".to_owned()],
            applicable_requirements: vec!["REQ-SYNC-001".to_owned()],
            dependencies: vec!["wi-000".to_owned()],
            spec_commit: Some(SPEC_COMMIT.to_owned()),
            business_priority: Some(BusinessPriority::Urgent),
        },
    );
    let lease = Lease {
        holder: "job-site-001".to_owned(),
        fencing_token: "fence-3".to_owned(),
        acquire_time: time(0),
        renew_time: time(60),
        duration_seconds: 900,
    };
    let mut status = BuildWorkItemStatus::materialized(LifecycleState::Merging);
    status.contract_version = 7;
    status.record_contract_version(ContractVersionEntry {
        version: 7,
        command: LifecycleCommand::BeginMerge,
        state: LifecycleState::Merging,
        actor: Some("job-site-001".to_owned()),
        idempotency_key: Some("begin-merge-1".to_owned()),
        time: time(120),
    });
    status.owner = Some(lease.holder.clone());
    set_condition(
        &mut status.conditions,
        leased_condition(Some(&lease), t(120)),
        Some(1),
        t(120),
    );
    status.lease = Some(lease);
    status.readiness = Some(Readiness {
        contract_complete: true,
        source_immutable: true,
        specification_validated: true,
        requirement_references_valid: true,
        pipeline_entry_satisfied: true,
        impact_dispositioned: true,
        policy_compatible: true,
        unresolved_reasons: Vec::new(),
    });
    status.dependencies = vec![
        DependencyStatus {
            id: "wi-000".to_owned(),
            state: Some(LifecycleState::Completed),
        },
        DependencyStatus {
            id: "wi-unseen".to_owned(),
            state: None,
        },
    ];
    status.inspection_run_sealed = true;
    status.findings_terminal = true;
    status.final_tests_passed = true;
    status.expected_merge = Some(envelope(None));
    status.reconciliation = Some(Reconciliation {
        status: ReconciliationStatus::MergeRecorded,
        git_mutation: GitMutation::Merged,
        merge_envelope: Some(envelope(Some(MERGE))),
        observed_time: Some(time(130)),
    });
    status.branch = Some("wi/wi-001-sync-dirs".to_owned());
    status.record_cycle(CycleRecord {
        cycle: 1,
        tier: ModelTier::T1,
        outcome: CycleOutcome::Passed,
        candidate_commit: Some(CANDIDATE.to_owned()),
        start_time: time(0),
        end_time: Some(time(50)),
    });
    status.escalation_tier = Some(ModelTier::T1);
    status.candidate_commit = Some(CANDIDATE.to_owned());
    status.merge_commit = Some(MERGE.to_owned());
    status.completion = Some(CompletionEvidence {
        merge_envelope: envelope(Some(MERGE)),
        verified_on_target: true,
        completed_time: time(140),
    });
    status.observed_generation = Some(1);
    item.status = Some(status);
    item
}

fn inspection_run() -> InspectionRun {
    let mut run = InspectionRun::new(
        "ir-1",
        InspectionRunSpec {
            work_item_ref: LocalRef::new("wi-cs-00042"),
            contract_version: 5,
            candidate_commit: CANDIDATE.to_owned(),
            product_tree_digest: "sha256:tree".to_owned(),
            required_producers: vec!["inspector-a".to_owned(), "mutation".to_owned()],
            mutation: Some(MutationConfig {
                operators: vec!["negate-conditionals".to_owned()],
                max_mutants: 200,
                timeout_seconds: 600,
                minimum_score_percent: 80,
            }),
            findings_to_recheck: vec!["F-17".to_owned()],
            ledger_sequence_at_start: 41,
        },
    );
    run.status = Some(InspectionRunStatus {
        observed_generation: Some(1),
        producers_completed: vec![ProducerCompletion {
            producer: "inspector-a".to_owned(),
            findings: 2,
            completed_time: time(30),
        }],
        finding_counts: FindingCounts {
            open: 0,
            confirmed: 0,
            resolved: 1,
            rejected: 1,
            deferred: 0,
        },
        sealed: Some(Seal {
            high_watermark: 44,
            at: time(40),
        }),
        snapshot_digest: Some("sha256:snap".to_owned()),
        conditions: Vec::new(),
    });
    run
}

#[test]
fn sample_project_validates() {
    assert_eq!(check("Project", &project()), Vec::<String>::new());
}

#[test]
fn a_project_with_a_gitea_forge_validates() {
    let mut p = project();
    p.spec.forge = Some(protobot_api::project::ForgeSpec {
        github: None,
        gitea: Some(protobot_api::project::GiteaForge {
            base_url: "https://gitea.example.invalid".to_owned(),
            owner: Some("acme".to_owned()),
            repository: Some("cli-sync".to_owned()),
            token_secret_ref: LocalRef::new("cli-sync-gitea"),
            review_mode: Some(protobot_api::project::ReviewMode::SinglePlayer),
            landing: protobot_api::project::LandingMode::PullRequest,
            work_item_url: None,
        }),
    });
    assert_eq!(check("Project", &p), Vec::<String>::new());
}

#[test]
fn sample_change_set_validates() {
    assert_eq!(check("ChangeSet", &change_set()), Vec::<String>::new());
}

#[test]
fn sample_bug_report_validates_and_a_malformed_one_does_not() {
    assert_eq!(check("BugReport", &bug_report()), Vec::<String>::new());
    let mut bad = bug_report();
    bad.spec.bug_id = "17 is not an id".to_owned();
    bad.spec.violated_requirements.clear();
    let errors = check("BugReport", &bad);
    assert!(
        errors.iter().any(|e| e.starts_with("spec.bugId")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("spec.violatedRequirements")),
        "{errors:?}"
    );
    let mut bad = bug_report();
    if let Some(facts) = bad.status.as_mut().and_then(|s| s.recorded_facts.as_mut()) {
        facts.spec_commit = "main".to_owned();
    }
    let errors = check("BugReport", &bad);
    assert!(
        errors
            .iter()
            .any(|e| e.starts_with("status.recordedFacts.specCommit")),
        "{errors:?}"
    );
}

#[test]
fn fully_populated_work_item_validates() {
    assert_eq!(check("BuildWorkItem", &work_item()), Vec::<String>::new());
}

#[test]
fn sample_inspection_run_validates() {
    assert_eq!(
        check("InspectionRun", &inspection_run()),
        Vec::<String>::new()
    );
    assert!(
        inspection_run()
            .status
            .unwrap()
            .finding_counts
            .all_terminal()
    );
}

#[test]
fn objects_carry_their_api_version_and_kind() {
    let item = serde_json::to_value(work_item()).unwrap();
    assert_eq!(item["apiVersion"], "protobot.dev/v1alpha1");
    assert_eq!(item["kind"], "BuildWorkItem");
    assert_eq!(BuildWorkItem::plural(&()), "buildworkitems");
}

#[test]
fn absent_options_are_omitted_not_null() {
    let mut item = work_item();
    item.spec.business_priority = None;
    item.status = Some(BuildWorkItemStatus::materialized(LifecycleState::Waiting));
    let json = serde_json::to_value(&item).unwrap();
    assert!(json["spec"].get("businessPriority").is_none());
    let status = json["status"].as_object().unwrap();
    assert!(
        status.values().all(|v| !v.is_null()),
        "a null would be owned by SSA: {status:?}"
    );
    let keys: Vec<&str> = status.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "contractVersion",
            "finalTestsPassed",
            "findingsTerminal",
            "inspectionRunSealed",
            "state"
        ]
    );
}

#[test]
fn validator_rejects_what_the_api_server_would() {
    let mut cs = change_set();
    cs.spec.change_set_id = "CS-42".to_owned();
    cs.spec.merge_commit = "main".to_owned();
    let errors = check("ChangeSet", &cs);
    assert!(
        errors.iter().any(|e| e.starts_with("spec.changeSetId")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.starts_with("spec.mergeCommit")),
        "{errors:?}"
    );

    let mut json = serde_json::to_value(work_item()).unwrap();
    json["status"]["state"] = Value::from("initial");
    json["status"]["leaseOwner"] = Value::from("someone");
    json["status"]
        .as_object_mut()
        .unwrap()
        .remove("contractVersion");
    let schema = root_schema("BuildWorkItem");
    let errors = validate(&schema["properties"]["status"], &json["status"], "status");
    assert!(
        errors.iter().any(|e| e.starts_with("status.state")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("leaseOwner")),
        "{errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.contains("contractVersion")),
        "{errors:?}"
    );
}

#[test]
fn project_defaults_fill_in_when_deserializing_a_minimal_spec() {
    let project: Project = serde_json::from_value(serde_json::json!({
        "apiVersion": "protobot.dev/v1alpha1",
        "kind": "Project",
        "metadata": {"name": "p"},
        "spec": {"repoUrl": "https://x.invalid/r.git", "sandboxProfile": "kata"}
    }))
    .unwrap();
    assert_eq!(
        project.spec.default_branch,
        protobot_api::project::DEFAULT_BRANCH
    );
    assert_eq!(
        project.spec.spec_path,
        protobot_api::project::DEFAULT_SPEC_PATH
    );
    assert_eq!(
        project.spec.wip_limit,
        protobot_api::project::DEFAULT_WIP_LIMIT
    );
    assert_eq!(
        project.spec.lease_duration_seconds,
        protobot_api::project::DEFAULT_LEASE_DURATION_SECONDS
    );
    assert_eq!(project.spec.worker_classes_ref, None);
}
