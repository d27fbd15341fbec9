//! Key fields of the generated schemas exist with the types the Rust model promises.
//! Expected values are derived from the Rust types (serde spellings, bound constants), so a
//! rename or a changed bound on one side only fails here.

use protobot_api::{
    BusinessPriority, ChangeType, LifecycleState,
    build_work_item::{CONTRACT_VERSIONS_LIMIT, CYCLES_LIMIT},
    common::{CHANGE_SET_ID_PATTERN, GIT_COMMIT_PATTERN},
    conditions::ConditionStatus,
};
use serde_json::Value;

use crate::util::{is_required, schema_at};

fn wire<T: serde::Serialize>(values: &[T]) -> Value {
    serde_json::to_value(values).unwrap()
}

#[test]
fn contract_version_is_a_required_integer_of_its_own() {
    let status = schema_at("BuildWorkItem", "status");
    assert!(is_required(&status, "contractVersion"));
    assert!(is_required(&status, "state"));
    let version = schema_at("BuildWorkItem", "status.contractVersion");
    assert_eq!(version["type"], "integer");
    assert_eq!(version["minimum"], 1.0);
}

#[test]
fn state_enumerates_exactly_the_eight_lifecycle_states() {
    let state = schema_at("BuildWorkItem", "status.state");
    assert_eq!(state["type"], "string");
    assert_eq!(state["enum"], wire(&LifecycleState::ALL));
    assert_eq!(
        state["enum"],
        serde_json::json!([
            "waiting",
            "ready-for-building",
            "building",
            "inspecting",
            "blocked",
            "merging",
            "completed",
            "abandoned"
        ])
    );
}

#[test]
fn lease_has_holder_string_token_times_and_duration() {
    let lease = schema_at("BuildWorkItem", "status.lease");
    assert_eq!(lease["type"], "object");
    assert_eq!(lease["nullable"], true, "a released lease is absent");
    for field in [
        "holder",
        "fencingToken",
        "acquireTime",
        "renewTime",
        "durationSeconds",
    ] {
        assert!(is_required(&lease, field), "lease.{field} must be required");
    }
    assert_eq!(
        schema_at("BuildWorkItem", "status.lease.holder")["type"],
        "string"
    );
    assert_eq!(
        schema_at("BuildWorkItem", "status.lease.fencingToken")["type"],
        "string"
    );
    for time in ["acquireTime", "renewTime"] {
        let field = schema_at("BuildWorkItem", &format!("status.lease.{time}"));
        assert_eq!(field["type"], "string");
        assert_eq!(field["format"], "date-time");
    }
    assert_eq!(
        schema_at("BuildWorkItem", "status.lease.durationSeconds")["type"],
        "integer"
    );
}

#[test]
fn business_priority_is_an_optional_closed_enum_on_change_sets_and_work_items() {
    let expected = wire(&[
        BusinessPriority::Low,
        BusinessPriority::Normal,
        BusinessPriority::High,
        BusinessPriority::Urgent,
    ]);
    assert_eq!(
        expected,
        serde_json::json!(["low", "normal", "high", "urgent"])
    );
    for kind in ["ChangeSet", "BugReport", "BuildWorkItem"] {
        let priority = schema_at(kind, "spec.businessPriority");
        assert_eq!(priority["enum"], expected, "{kind}");
        assert_eq!(priority["nullable"], true, "{kind}");
        assert!(
            !is_required(&schema_at(kind, "spec"), "businessPriority"),
            "{kind}"
        );
        // The field's own doc comment, not the enum's, is what kubectl explain shows.
        let description = priority["description"].as_str().unwrap();
        let description = description.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            description.contains("absent means `normal`"),
            "{kind}: {description}"
        );
    }
}

#[test]
fn change_type_is_a_closed_enum() {
    let expected = wire(&[
        ChangeType::Undefined,
        ChangeType::Changes,
        ChangeType::Contradicts,
    ]);
    assert_eq!(
        expected,
        serde_json::json!(["undefined", "changes", "contradicts"])
    );
    assert_eq!(
        schema_at("BuildWorkItem", "spec.changeType")["enum"],
        expected
    );
    assert_eq!(
        schema_at("ChangeSet", "status.impact.changeType")["enum"],
        expected
    );
}

#[test]
fn change_set_id_and_commits_carry_their_patterns() {
    assert_eq!(
        schema_at("ChangeSet", "spec.changeSetId")["pattern"],
        CHANGE_SET_ID_PATTERN
    );
    assert_eq!(
        schema_at("ChangeSet", "spec.mergeCommit")["pattern"],
        GIT_COMMIT_PATTERN
    );
    assert_eq!(
        schema_at("BuildWorkItem", "spec.specCommit")["pattern"],
        GIT_COMMIT_PATTERN
    );
    assert_eq!(
        schema_at("InspectionRun", "spec.candidateCommit")["pattern"],
        GIT_COMMIT_PATTERN
    );
    let id = regex::Regex::new(CHANGE_SET_ID_PATTERN).unwrap();
    assert!(id.is_match("CS-00042"));
    assert!(!id.is_match("CS-42"));
    assert!(!id.is_match("cs-00042"));
    let commit = regex::Regex::new(GIT_COMMIT_PATTERN).unwrap();
    assert!(commit.is_match(&"a".repeat(40)));
    assert!(!commit.is_match(&"A".repeat(40)));
    assert!(!commit.is_match(&"a".repeat(39)));
}

#[test]
fn conditions_follow_the_kubernetes_convention_and_merge_by_type() {
    for kind in [
        "Project",
        "ChangeSet",
        "BugReport",
        "BuildWorkItem",
        "InspectionRun",
    ] {
        let conditions = schema_at(kind, "status.conditions");
        assert_eq!(conditions["type"], "array", "{kind}");
        assert_eq!(conditions["x-kubernetes-list-type"], "map", "{kind}");
        assert_eq!(
            conditions["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
        let item = schema_at(kind, "status.conditions.[]");
        for field in ["type", "status", "reason", "message", "lastTransitionTime"] {
            assert!(is_required(&item, field), "{kind}: condition.{field}");
        }
        assert!(!is_required(&item, "observedGeneration"), "{kind}");
        assert_eq!(
            item["properties"]["status"]["enum"],
            wire(&[
                ConditionStatus::True,
                ConditionStatus::False,
                ConditionStatus::Unknown
            ]),
            "{kind}"
        );
        assert_eq!(
            item["properties"]["lastTransitionTime"]["format"],
            "date-time"
        );
        assert_eq!(item["properties"]["observedGeneration"]["type"], "integer");
    }
}

#[test]
fn bounded_status_lists_carry_their_bound_as_max_items() {
    let bounds = [
        ("status.contractVersions", CONTRACT_VERSIONS_LIMIT),
        ("status.cycles", CYCLES_LIMIT),
    ];
    for (path, bound) in bounds {
        assert_eq!(
            schema_at("BuildWorkItem", path)["maxItems"],
            bound,
            "{path}"
        );
    }
}

#[test]
fn work_item_record_fields_of_the_contract_exist() {
    let paths = [
        ("status.owner", "string"),
        ("status.readiness.contractComplete", "boolean"),
        ("status.readiness.unresolvedReasons", "array"),
        ("status.dependencies.[].id", "string"),
        ("status.dependencies.[].state", "string"),
        ("status.blockReason", "string"),
        ("status.activeResolutionSubmissionId", "string"),
        ("status.inspectionRunSealed", "boolean"),
        ("status.findingsTerminal", "boolean"),
        ("status.finalTestsPassed", "boolean"),
        ("status.expectedMerge.productTreeDigest", "string"),
        ("status.expectedMerge.inspectionRunId", "string"),
        ("status.expectedMerge.integrationHead", "string"),
        ("status.expectedMerge.target", "string"),
        ("status.expectedMerge.contractVersion", "integer"),
        ("status.expectedMerge.mergeCommit", "string"),
        ("status.reconciliation.status", "string"),
        ("status.reconciliation.gitMutation", "string"),
        ("status.reconciliation.mergeEnvelope", "object"),
        ("status.branch", "string"),
        ("status.cycles.[].tier", "string"),
        ("status.escalationTier", "string"),
        ("status.candidateCommit", "string"),
        ("status.mergeCommit", "string"),
        ("status.completion.mergeEnvelope", "object"),
        ("spec.materializationKey", "string"),
        ("spec.implementationRequired", "boolean"),
        ("spec.changedRequirements", "array"),
        ("spec.applicableRequirements", "array"),
        ("spec.dependencies", "array"),
    ];
    for (path, ty) in paths {
        assert_eq!(
            schema_at("BuildWorkItem", path)["type"],
            ty,
            "BuildWorkItem {path}"
        );
    }
}

#[test]
fn other_kinds_carry_the_fields_of_the_architecture() {
    let paths = [
        ("Project", "spec.repoUrl", "string"),
        ("Project", "spec.defaultBranch", "string"),
        ("Project", "spec.specPath", "string"),
        ("Project", "spec.sandboxProfile", "string"),
        ("Project", "spec.wipLimit", "integer"),
        ("Project", "spec.leaseDurationSeconds", "integer"),
        ("Project", "spec.workerClassesRef.name", "string"),
        ("Project", "status.repoReachable", "boolean"),
        ("Project", "status.projectConfigValid", "boolean"),
        ("Project", "status.defaultBranchHead", "string"),
        ("Project", "status.sandboxConformance.passed", "boolean"),
        ("ChangeSet", "spec.projectRef.name", "string"),
        ("ChangeSet", "status.workItemRef.name", "string"),
        (
            "ChangeSet",
            "status.reservation.materializationKey",
            "string",
        ),
        (
            "ChangeSet",
            "status.reservation.sourceFingerprint",
            "string",
        ),
        ("ChangeSet", "status.reservation.outcome", "string"),
        ("InspectionRun", "spec.workItemRef.name", "string"),
        ("InspectionRun", "spec.contractVersion", "integer"),
        ("InspectionRun", "spec.productTreeDigest", "string"),
        ("InspectionRun", "spec.requiredProducers", "array"),
        ("InspectionRun", "spec.mutation.maxMutants", "integer"),
        ("InspectionRun", "spec.findingsToRecheck", "array"),
        ("InspectionRun", "spec.ledgerSequenceAtStart", "integer"),
        ("InspectionRun", "status.producersCompleted", "array"),
        ("InspectionRun", "status.findingCounts.open", "integer"),
        ("InspectionRun", "status.sealed.highWatermark", "integer"),
        ("InspectionRun", "status.sealed.at", "string"),
        ("InspectionRun", "status.snapshotDigest", "string"),
    ];
    for (kind, path, ty) in paths {
        assert_eq!(schema_at(kind, path)["type"], ty, "{kind} {path}");
    }
}

#[test]
fn project_defaults_are_explicit_in_the_schema() {
    assert_eq!(
        schema_at("Project", "spec.defaultBranch")["default"],
        "main"
    );
    assert_eq!(
        schema_at("Project", "spec.specPath")["default"],
        ".protobot/"
    );
    assert_eq!(
        schema_at("Project", "spec.leaseDurationSeconds")["default"],
        900
    );
}

#[test]
fn immutable_specs_carry_transition_rules() {
    let spec = schema_at("InspectionRun", "spec");
    assert_eq!(
        spec["x-kubernetes-validations"][0]["rule"],
        "self == oldSelf"
    );
    for field in [
        "materializationKey",
        "projectRef",
        "workItemId",
        "specCommit",
    ] {
        let schema = schema_at("BuildWorkItem", &format!("spec.{field}"));
        assert_eq!(
            schema["x-kubernetes-validations"][0]["rule"], "self == oldSelf",
            "{field}"
        );
    }
    let priority = schema_at("BuildWorkItem", "spec.businessPriority");
    assert!(
        priority.get("x-kubernetes-validations").is_none(),
        "humans edit businessPriority"
    );
}

/// `kubectl explain` shows `description`; every field of every kind must have one.
#[test]
fn every_schema_field_has_a_description() {
    fn walk(schema: &Value, path: &str, missing: &mut Vec<String>) {
        if let Some(properties) = schema["properties"].as_object() {
            for (name, field) in properties {
                let field_path = format!("{path}.{name}");
                let described = field["description"]
                    .as_str()
                    .is_some_and(|d| !d.trim().is_empty());
                if !described {
                    missing.push(field_path.clone());
                }
                walk(field, &field_path, missing);
            }
        }
        if schema["items"].is_object() {
            walk(&schema["items"], &format!("{path}[]"), missing);
        }
    }
    let mut missing = Vec::new();
    for kind in [
        "Project",
        "ChangeSet",
        "BugReport",
        "BuildWorkItem",
        "InspectionRun",
    ] {
        let root = crate::util::root_schema(kind);
        for part in ["spec", "status"] {
            walk(
                &root["properties"][part],
                &format!("{kind}.{part}"),
                &mut missing,
            );
        }
    }
    assert!(
        missing.is_empty(),
        "fields without a description: {missing:#?}"
    );
}
