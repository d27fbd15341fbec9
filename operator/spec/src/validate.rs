//! Whole-project validation (§5–§13, §22): a pure function from a
//! [`Snapshot`] to diagnostics. Which change sets get the full impact check
//! is decided by the caller (§18 approval rule lives in the shell).

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::{
    diag::Diagnostic,
    digest, ears, graph, ids, impact,
    model::{
        ARTIFACT_KINDS, ARTIFACT_OWNERS, Artifact, ChangeSet, INTERFACE_TYPES, RELATIONSHIP_TYPES,
        StoreKind, is_symmetric, validator_kinds,
    },
    rules::{self, RemoteCheck},
    snapshot::{ProjectionState, Snapshot},
    vfs::{DirState, FileState, PROJECT_YAML},
};

/// What to validate beyond the always-on checks.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// Change sets that get the full impact check (the proposed ones).
    pub proposed: BTreeSet<String>,
    /// When set, impact diagnostics come only from this change set.
    pub impact_only: Option<String>,
}

/// Validates everything.
pub fn validate(snap: &Snapshot, scope: &Scope) -> Vec<Diagnostic> {
    let mut d = snap.load_diags.clone();
    project_metadata(snap, &mut d);
    stores(snap, &mut d);
    artifacts(snap, &mut d);
    projection(snap, &mut d);
    interfaces(snap, &mut d);
    requirements(snap, &mut d);
    relationship_graph(snap, &mut d);
    change_sets(snap, scope, &mut d);
    crate::diag::normalize(&mut d);
    d
}

fn project_diag(code: &str, field: &str, message: &str) -> Diagnostic {
    Diagnostic::new(code, message)
        .at(PROJECT_YAML)
        .field(field)
        .hint("Correct .protobot/project.yaml.")
}

fn project_metadata(snap: &Snapshot, d: &mut Vec<Diagnostic>) {
    let p = &snap.project;
    let meta = p.project.clone().unwrap_or_default();
    for (field, value) in [("project.id", &meta.id), ("project.name", &meta.name)] {
        if value.trim().is_empty() {
            d.push(project_diag(
                "project.missing_field",
                field,
                "A required project field is missing.",
            ));
        }
    }
    let repo = p.repository.clone().unwrap_or_default();
    match repo.canonical_remote.as_deref() {
        None | Some("") => d.push(project_diag("project.missing_field", "repository.canonical_remote", "The canonical remote is missing.")),
        Some(r) => match rules::check_remote(r) {
            RemoteCheck::Ok => {}
            RemoteCheck::Invalid => d.push(project_diag(
                "project.invalid_configuration",
                "repository.canonical_remote",
                "The canonical remote must be an https://, ssh:// or git@host:path URL.",
            )),
            RemoteCheck::Credentials => d.push(
                project_diag("project.remote_credentials", "repository.canonical_remote", "The canonical remote must not carry credentials.")
                    .hint("Remove the user information from the remote; credentials belong in a credential helper."),
            ),
        },
    }
    if let Some(b) = &repo.default_branch
        && !rules::is_valid_branch_name(b)
    {
        d.push(project_diag(
            "project.invalid_configuration",
            "repository.default_branch",
            "The default branch is not a valid branch name.",
        ));
    }
    match repo.review_mode.as_deref() {
        None | Some("") => d.push(project_diag(
            "project.missing_field",
            "repository.review_mode",
            "The review mode is missing.",
        )),
        Some("single-player" | "multi-player") => {}
        Some(_) => d.push(project_diag(
            "project.invalid_configuration",
            "repository.review_mode",
            "The review mode must be single-player or multi-player.",
        )),
    }
    if let Some(prefix) = &repo.branch_prefix
        && !rules::is_valid_branch_prefix(prefix)
    {
        d.push(project_diag(
            "project.invalid_configuration",
            "repository.branch_prefix",
            "The branch prefix must be a valid ref name ending in '/' and must not start with 'wi/'.",
        ));
    }
}

fn stores(snap: &Snapshot, d: &mut Vec<Diagnostic>) {
    let p = &snap.project;
    for kind in StoreKind::ALL {
        let dir = p.store_dir(kind);
        let field = format!("stores.{}", kind.key());
        if !rules::is_valid_store_path(&dir) {
            d.push(project_diag(
                "project.invalid_path",
                &field,
                "The store path is not a valid project-relative store directory.",
            ));
        } else if matches!(
            snap.vfs.stores.get(&dir),
            Some(DirState::Symlink | DirState::NotDir)
        ) {
            d.push(project_diag(
                "project.invalid_path",
                &field,
                "The store path must be a real directory inside the project.",
            ));
        }
        let dfield = format!("store_digests.{}", kind.key());
        let recorded = p.store_digests.as_ref().and_then(|s| s.get(kind));
        let computed = snap.digests.get(&kind).cloned().flatten();
        match recorded {
            None => d.push(
                project_diag(
                    "project.missing_field",
                    &dfield,
                    "The store digest is missing.",
                )
                .hint("Rewrite the store through ears-manager so that the digest is recorded."),
            ),
            Some(r) if !digest::is_digest(r) => d.push(project_diag(
                "project.invalid_digest",
                &dfield,
                "The store digest is not sha256:<64 lowercase hex>.",
            )),
            Some(r) => match computed {
                None => d.push(project_diag(
                    "project.store_digest_unreadable",
                    &dfield,
                    "The store cannot be digested; it may only hold regular .yaml files.",
                )),
                Some(c) if &c != r => d.push(
                    project_diag(
                        "project.store_digest_mismatch",
                        &dfield,
                        "The store content does not match its recorded digest.",
                    )
                    .hint("Undo direct edits to the store or make them through ears-manager."),
                ),
                Some(_) => {}
            },
        }
    }
}

fn art_field(a: &Artifact, field: &str) -> String {
    if a.id.is_empty() {
        format!("artifacts[].{field}")
    } else {
        format!("artifacts[id={}].{field}", a.id)
    }
}

fn art_diag(a: &Artifact, code: &str, field: &str, message: &str) -> Diagnostic {
    Diagnostic::new(code, message)
        .at(PROJECT_YAML)
        .record(&a.id)
        .field(art_field(a, field))
}

/// Whether an artifact path is syntactically allowed (not reserved, not in a store).
pub fn artifact_path_allowed(snap: &Snapshot, path: &str) -> bool {
    rules::is_canonical_path(path)
        && !rules::is_reserved_artifact_path(path)
        && !StoreKind::ALL
            .iter()
            .any(|k| rules::is_inside(path, &snap.project.store_dir(*k)))
}

fn artifacts(snap: &Snapshot, d: &mut Vec<Diagnostic>) {
    let mut ids_seen = BTreeSet::new();
    let mut paths_seen = BTreeSet::new();
    for a in &snap.project.artifacts {
        if a.id.is_empty() {
            d.push(art_diag(
                a,
                "artifact.missing_field",
                "id",
                "The artifact ID is missing.",
            ));
        } else if !ids::is_kebab_id(&a.id) {
            d.push(art_diag(
                a,
                "artifact.invalid_id",
                "id",
                "The artifact ID must be lowercase kebab-case.",
            ));
        } else if !ids_seen.insert(a.id.clone()) {
            d.push(art_diag(
                a,
                "artifact.duplicate_id",
                "id",
                "The artifact ID is registered twice.",
            ));
        }
        if a.kind.is_empty() {
            d.push(art_diag(
                a,
                "artifact.missing_field",
                "kind",
                "The artifact kind is missing.",
            ));
        } else if !ARTIFACT_KINDS.contains(&a.kind.as_str()) {
            d.push(art_diag(
                a,
                "artifact.unknown_kind",
                "kind",
                "The artifact kind is not supported.",
            ));
        }
        if a.owner.is_empty() {
            d.push(art_diag(
                a,
                "artifact.missing_field",
                "owner",
                "The artifact owner is missing.",
            ));
        } else if !ARTIFACT_OWNERS.contains(&a.owner.as_str()) {
            d.push(art_diag(
                a,
                "artifact.invalid_owner",
                "owner",
                "The artifact owner must be user or ears-manager.",
            ));
        }
        if !a.validator.is_empty() {
            match validator_kinds(&a.validator) {
                None => d.push(art_diag(
                    a,
                    "artifact.validator_not_allowed",
                    "validator",
                    "The validator is not in the built-in registry.",
                )),
                Some(kinds) if !kinds.contains(&a.kind.as_str()) => {
                    d.push(art_diag(
                        a,
                        "artifact.validator_incompatible",
                        "validator",
                        "The validator does not apply to this artifact kind.",
                    ));
                }
                Some(_) => {}
            }
        }
        let digest_ok = if a.digest.is_empty() {
            d.push(art_diag(
                a,
                "artifact.missing_field",
                "digest",
                "The artifact digest is missing.",
            ));
            false
        } else if !digest::is_digest(&a.digest) {
            d.push(art_diag(
                a,
                "artifact.invalid_digest",
                "digest",
                "The artifact digest is not sha256:<64 lowercase hex>.",
            ));
            false
        } else {
            true
        };
        if a.path.is_empty() {
            d.push(art_diag(
                a,
                "artifact.missing_field",
                "path",
                "The artifact path is missing.",
            ));
            continue;
        }
        if !artifact_path_allowed(snap, &a.path) {
            d.push(art_diag(
                a,
                "artifact.invalid_path",
                "path",
                "The artifact path is invalid, reserved or inside a store.",
            ));
            continue;
        }
        if !paths_seen.insert(a.path.to_ascii_lowercase()) {
            d.push(art_diag(
                a,
                "artifact.duplicate_path",
                "path",
                "Two artifacts are registered at the same path.",
            ));
        }
        match snap
            .vfs
            .artifacts
            .get(&a.path)
            .unwrap_or(&FileState::Absent)
        {
            FileState::Absent => d.push(art_diag(
                a,
                "artifact.path_not_found",
                "path",
                "The registered artifact file does not exist.",
            )),
            FileState::Symlink => d.push(art_diag(
                a,
                "artifact.invalid_path",
                "path",
                "The artifact path goes through a symlink.",
            )),
            FileState::NotRegular | FileState::Unreadable => {
                d.push(art_diag(
                    a,
                    "artifact.path_unreadable",
                    "path",
                    "The artifact file is not a readable regular file.",
                ));
            }
            FileState::Bytes(b) => match digest::text_digest(b) {
                Err(e) => d.push(art_diag(
                    a,
                    "artifact.invalid_content",
                    "path",
                    &format!("The artifact content is not canonical text: {e}."),
                )),
                Ok(actual) if digest_ok && actual != a.digest => d.push(
                    art_diag(
                        a,
                        "artifact.digest_mismatch",
                        "digest",
                        "The artifact content does not match its recorded digest.",
                    )
                    .hint("Write the artifact through 'ears-manager artifact put'."),
                ),
                Ok(_) => {}
            },
        }
    }
}

fn projection(snap: &Snapshot, d: &mut Vec<Diagnostic>) {
    let hint = "Classify the path as shared through a reviewed edit of .protobot/projection.yaml.";
    let proj = match &snap.projection {
        ProjectionState::Invalid(diags) => {
            d.extend(diags.iter().cloned());
            return;
        }
        ProjectionState::Absent => None,
        ProjectionState::Valid(p) => Some(p),
    };
    let classify = |path: &str| proj.and_then(|p| p.class_of(path)).map(str::to_owned);
    for a in &snap.project.artifacts {
        if a.path.is_empty() {
            continue;
        }
        let class = classify(&a.path);
        if class.as_deref() != Some("shared") {
            let msg = if class.is_some() {
                "The artifact path is not classified as shared."
            } else {
                "The artifact path is unclassified."
            };
            d.push(
                Diagnostic::new("projection.unclassified", msg)
                    .at(&a.path)
                    .record(&a.id)
                    .field("class")
                    .hint(hint),
            );
        }
    }
    for kind in StoreKind::ALL {
        let dir = snap.project.store_dir(kind);
        let class = proj.and_then(|p| p.class_of(&dir)).map(str::to_owned);
        if class.as_deref() != Some("shared") {
            let msg = if class.is_some() {
                "The store directory is not classified as shared."
            } else {
                "The store directory is unclassified."
            };
            d.push(
                Diagnostic::new("projection.unclassified", msg)
                    .at(format!("{dir}/"))
                    .field("class")
                    .hint(hint),
            );
        }
    }
}

fn interfaces(snap: &Snapshot, d: &mut Vec<Diagnostic>) {
    let mut seen = BTreeSet::new();
    for rec in &snap.interfaces {
        let i = &rec.record;
        let diag = |code: &str, field: &str, msg: &str| {
            Diagnostic::new(code, msg)
                .at(&rec.path)
                .record(&i.id)
                .field(field)
        };
        if i.id.is_empty() {
            d.push(diag(
                "interface.missing_field",
                "id",
                "The interface ID is missing.",
            ));
        } else if !ids::is_kebab_id(&i.id) {
            d.push(diag(
                "interface.invalid_id",
                "id",
                "The interface ID must be lowercase kebab-case.",
            ));
        } else if !seen.insert(i.id.clone()) {
            d.push(diag(
                "interface.duplicate_id",
                "id",
                "The interface ID is used twice.",
            ));
        }
        if i.name.trim().is_empty() {
            d.push(diag(
                "interface.missing_field",
                "name",
                "The interface name is missing.",
            ));
        }
        if i.kind.is_empty() {
            d.push(diag(
                "interface.missing_field",
                "type",
                "The interface type is missing.",
            ));
        } else if !INTERFACE_TYPES.contains(&i.kind.as_str()) {
            d.push(
                diag(
                    "interface.invalid_type",
                    "type",
                    "The interface type is not supported.",
                )
                .hint(format!("Use one of: {}.", INTERFACE_TYPES.join(", "))),
            );
        }
        if i.created.trim().is_empty() {
            d.push(diag(
                "interface.missing_field",
                "created",
                "The creation time is missing.",
            ));
        } else if !ids::is_timestamp(&i.created) {
            d.push(diag(
                "record.invalid_timestamp",
                "created",
                "The creation time must be a real UTC time as YYYY-MM-DDTHH:MM:SSZ.",
            ));
        }
        if !matches!(i.status.as_str(), "" | "active" | "retired") {
            d.push(diag(
                "interface.invalid_status",
                "status",
                "The interface status must be active or retired.",
            ));
        }
    }
}

fn requirements(snap: &Snapshot, d: &mut Vec<Diagnostic>) {
    let iface_ids: BTreeSet<&str> = snap
        .interfaces
        .iter()
        .map(|r| r.record.id.as_str())
        .collect();
    let req_ids: BTreeSet<&str> = snap
        .requirements
        .iter()
        .map(|r| r.record.id.as_str())
        .collect();
    let mut seen = BTreeSet::new();
    for rec in &snap.requirements {
        let r = &rec.record;
        let diag = |code: &str, field: &str, msg: &str| {
            Diagnostic::new(code, msg)
                .at(&rec.path)
                .record(&r.id)
                .field(field)
        };
        if r.id.is_empty() {
            d.push(diag(
                "requirement.missing_field",
                "id",
                "The requirement ID is missing.",
            ));
        } else if !ids::is_requirement_id(&r.id) {
            d.push(diag(
                "requirement.invalid_id",
                "id",
                "The requirement ID must look like REQ-<SCOPE>-<NNNNN>.",
            ));
        } else if !seen.insert(r.id.clone()) {
            d.push(diag(
                "requirement.duplicate_id",
                "id",
                "The requirement ID is used twice.",
            ));
        }
        let known_type = ears::TYPES.contains(&r.kind.as_str());
        if r.kind.is_empty() {
            d.push(diag(
                "requirement.missing_field",
                "type",
                "The requirement type is missing.",
            ));
        } else if !known_type {
            d.push(
                diag(
                    "requirement.invalid_type",
                    "type",
                    "The requirement type is not a supported EARS pattern.",
                )
                .hint(format!("Use one of: {}.", ears::TYPES.join(", "))),
            );
        }
        if r.text.trim().is_empty() {
            d.push(diag(
                "requirement.missing_field",
                "text",
                "The requirement text is missing.",
            ));
        } else if !r.kind.is_empty() && !ears::matches(&r.kind, &r.text) {
            d.push(
                diag(
                    "requirement.ears_pattern_mismatch",
                    "text",
                    &ears::mismatch_message(&r.kind),
                )
                .hint(ears::hint(&r.kind)),
            );
        }
        match &r.applies_to {
            None => d.push(diag(
                "requirement.missing_field",
                "applies_to",
                "The applicability block is missing.",
            )),
            Some(a) => {
                if a.interfaces.is_empty() && a.scopes.is_empty() {
                    d.push(diag(
                        "requirement.invalid_applicability",
                        "applies_to",
                        "A requirement must apply to at least one interface or scope.",
                    ));
                }
                let mut seen_if = BTreeSet::new();
                for i in &a.interfaces {
                    if !ids::is_kebab_id(i) {
                        d.push(diag(
                            "requirement.invalid_applicability",
                            "applies_to.interfaces",
                            "An interface selector is not a valid interface ID.",
                        ));
                    } else if !iface_ids.contains(i.as_str()) {
                        d.push(diag(
                            "reference.not_found",
                            "applies_to.interfaces",
                            &format!("Interface {i} is not registered."),
                        ));
                    } else if !seen_if.insert(i) {
                        d.push(diag(
                            "requirement.duplicate_selector",
                            "applies_to.interfaces",
                            "An interface selector is repeated.",
                        ));
                    }
                }
                let mut seen_sc = BTreeSet::new();
                for s in &a.scopes {
                    if s.trim().is_empty() {
                        d.push(diag(
                            "requirement.invalid_applicability",
                            "applies_to.scopes",
                            "A scope selector is blank.",
                        ));
                    } else if !seen_sc.insert(s) {
                        d.push(diag(
                            "requirement.duplicate_selector",
                            "applies_to.scopes",
                            "A scope selector is repeated.",
                        ));
                    }
                }
            }
        }
        match &r.verification {
            None => d.push(diag(
                "requirement.missing_field",
                "verification",
                "The verification block is missing.",
            )),
            Some(v) => match v.mode.as_str() {
                "" | "isolated-interface" => {}
                "implementation-aware" => {
                    if v.rationale.trim().is_empty() {
                        d.push(diag(
                            "requirement.missing_field",
                            "verification.rationale",
                            "Implementation-aware verification needs a rationale.",
                        ));
                    }
                }
                _ => d.push(diag(
                    "requirement.invalid_verification",
                    "verification.mode",
                    "The verification mode must be isolated-interface or implementation-aware.",
                )),
            },
        }
        if r.provenance.is_empty() {
            d.push(diag(
                "requirement.missing_field",
                "provenance",
                "The provenance is missing.",
            ));
        } else if !matches!(
            r.provenance.as_str(),
            "user-authored" | "agent-suggested" | "kit-imported"
        ) {
            d.push(diag(
                "requirement.invalid_provenance",
                "provenance",
                "The provenance must be user-authored, agent-suggested or kit-imported.",
            ));
        }
        if r.created.trim().is_empty() {
            d.push(diag(
                "requirement.missing_field",
                "created",
                "The creation time is missing.",
            ));
        } else if !ids::is_timestamp(&r.created) {
            d.push(diag(
                "record.invalid_timestamp",
                "created",
                "The creation time must be a real UTC time as YYYY-MM-DDTHH:MM:SSZ.",
            ));
        }
        if !matches!(r.status.as_str(), "" | "active" | "retired") {
            d.push(diag(
                "requirement.invalid_status",
                "status",
                "The requirement status must be active or retired.",
            ));
        }
        let mut seen_rel = BTreeSet::new();
        for (i, rel) in r.relationships.iter().enumerate() {
            if !seen_rel.insert((rel.kind.clone(), rel.target.clone())) {
                d.push(diag(
                    "relationship.duplicate",
                    &format!("relationships[{i}]"),
                    "The relationship is listed twice.",
                ));
                continue;
            }
            if !RELATIONSHIP_TYPES.contains(&rel.kind.as_str()) {
                d.push(diag(
                    "relationship.invalid_type",
                    &format!("relationships[{i}].type"),
                    "The relationship type is not supported.",
                ));
            }
            // The contract names `.target` for a missing reference; the other target
            // diagnostics name the entry, as upstream's validator does. A target that is
            // not a requirement ID is not in the store either: both are reported.
            let entry = format!("relationships[{i}]");
            let tfield = format!("relationships[{i}].target");
            if rel.target.is_empty() {
                d.push(diag(
                    "relationship.missing_target",
                    &entry,
                    "The relationship has no target.",
                ));
                continue;
            }
            if !ids::is_requirement_id(&rel.target) {
                d.push(diag(
                    "relationship.invalid_target",
                    &entry,
                    "The relationship target is not a requirement ID.",
                ));
            }
            if !req_ids.contains(rel.target.as_str()) {
                d.push(diag(
                    "reference.not_found",
                    &tfield,
                    &format!("Requirement {} does not exist.", rel.target),
                ));
            } else if let Some(target) = snap.requirement(&rel.target) {
                if is_symmetric(&rel.kind)
                    && !target
                        .record
                        .relationships
                        .iter()
                        .any(|t| t.kind == rel.kind && t.target == r.id)
                {
                    d.push(diag(
                        "relationship.not_symmetric",
                        &entry,
                        &format!(
                            "{} must list the inverse {} relationship.",
                            rel.target, rel.kind
                        ),
                    ));
                }
                if rel.kind == "supersedes" && target.record.status() != "retired" {
                    d.push(diag(
                        "relationship.superseded_requirement_active",
                        &entry,
                        &format!("Superseded requirement {} must be retired.", rel.target),
                    ));
                }
            }
        }
    }
}

fn relationship_graph(snap: &Snapshot, d: &mut Vec<Diagnostic>) {
    let ids: HashSet<&str> = snap
        .requirements
        .iter()
        .map(|r| r.record.id.as_str())
        .collect();
    for kind in ["depends-on", "supersedes"] {
        let mut edges: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for rec in &snap.requirements {
            let entry = edges.entry(rec.record.id.as_str()).or_default();
            for rel in &rec.record.relationships {
                if rel.kind == kind && ids.contains(rel.target.as_str()) {
                    entry.push(rel.target.as_str());
                }
            }
        }
        for (at, cycle) in graph::back_edge_cycles(&edges) {
            let path = snap
                .requirement(&at)
                .map(|r| r.path.clone())
                .unwrap_or_default();
            d.push(
                Diagnostic::new(
                    "relationship.cycle",
                    format!(
                        "The {kind} relationships form a cycle {}.",
                        cycle.join("->")
                    ),
                )
                .at(path)
                .record(&at)
                .field("relationships"),
            );
        }
    }
}

fn change_sets(snap: &Snapshot, scope: &Scope, d: &mut Vec<Diagnostic>) {
    let mut seen = BTreeSet::new();
    let iface_ids: BTreeSet<&str> = snap
        .interfaces
        .iter()
        .map(|r| r.record.id.as_str())
        .collect();
    let art_ids: BTreeSet<&str> = snap
        .project
        .artifacts
        .iter()
        .map(|a| a.id.as_str())
        .collect();
    for rec in &snap.change_sets {
        let c = &rec.record;
        let diag = |code: &str, field: &str, msg: &str| {
            Diagnostic::new(code, msg)
                .at(&rec.path)
                .record(&c.id)
                .field(field)
        };
        if c.id.is_empty() {
            d.push(diag(
                "change_set.missing_field",
                "id",
                "The change-set ID is missing.",
            ));
        } else if !ids::is_change_set_id(&c.id) {
            d.push(diag(
                "change_set.invalid_id",
                "id",
                "The change-set ID must look like CS-<NNNNN>.",
            ));
        } else if !seen.insert(c.id.clone()) {
            d.push(diag(
                "change_set.duplicate_id",
                "id",
                "The change-set ID is used twice.",
            ));
        }
        if c.base_commit.is_empty() {
            d.push(diag(
                "change_set.missing_field",
                "base_commit",
                "The base commit is missing.",
            ));
        } else if !ids::is_full_sha(&c.base_commit) {
            d.push(diag(
                "change_set.invalid_base_commit",
                "base_commit",
                "The base commit must be a full 40-hex commit ID.",
            ));
        }
        if c.intent.trim().is_empty() {
            d.push(diag(
                "change_set.missing_field",
                "intent",
                "The intent is missing.",
            ));
        }
        if c.operations.is_none() {
            d.push(diag(
                "change_set.missing_field",
                "operations",
                "The operations list is missing; write [] when empty.",
            ));
        }
        let mut seen_req = BTreeSet::new();
        for (i, op) in c.ops().iter().enumerate() {
            if !matches!(op.action.as_str(), "add" | "revise" | "retire") {
                d.push(diag(
                    "change_set.invalid_operation",
                    &format!("operations[{i}].action"),
                    "The operation action must be add, revise or retire.",
                ));
            }
            let f = format!("operations[{i}].requirement_id");
            if !ids::is_requirement_id(&op.requirement_id) {
                d.push(diag(
                    "change_set.invalid_reference",
                    &f,
                    "The operation target is not a requirement ID.",
                ));
                continue;
            }
            if !seen_req.insert(op.requirement_id.clone()) {
                d.push(diag(
                    "change_set.duplicate_operation",
                    &f,
                    "The requirement has two operations in this change set.",
                ));
            }
            match snap.requirement(&op.requirement_id) {
                None => d.push(diag(
                    "reference.not_found",
                    &f,
                    &format!("Requirement {} does not exist.", op.requirement_id),
                )),
                Some(r) if op.action == "retire" && r.record.status() == "active" => {
                    d.push(diag(
                        "change_set.invalid_operation",
                        &format!("operations[{i}].action"),
                        "A retire operation targets a requirement that is still active.",
                    ));
                }
                Some(_) => {}
            }
        }
        let mut seen_if = BTreeSet::new();
        for (i, op) in c.interface_operations.iter().enumerate() {
            if !matches!(op.action.as_str(), "add" | "revise") {
                d.push(diag(
                    "change_set.invalid_operation",
                    &format!("interface_operations[{i}].action"),
                    "The interface operation action must be add or revise.",
                ));
            }
            let f = format!("interface_operations[{i}].interface_id");
            if !ids::is_kebab_id(&op.interface_id) {
                d.push(diag(
                    "change_set.invalid_reference",
                    &f,
                    "The operation target is not an interface ID.",
                ));
            } else if !seen_if.insert(op.interface_id.clone()) {
                d.push(diag(
                    "change_set.duplicate_operation",
                    &f,
                    "The interface has two operations in this change set.",
                ));
            } else if !iface_ids.contains(op.interface_id.as_str()) {
                d.push(diag(
                    "reference.not_found",
                    &f,
                    &format!("Interface {} is not registered.", op.interface_id),
                ));
            }
        }
        let mut seen_art = BTreeSet::new();
        for (i, op) in c.artifact_operations.iter().enumerate() {
            if !matches!(op.action.as_str(), "add" | "revise") {
                d.push(diag(
                    "change_set.invalid_operation",
                    &format!("artifact_operations[{i}].action"),
                    "The artifact operation action must be add or revise.",
                ));
            }
            let f = format!("artifact_operations[{i}].artifact_id");
            if !ids::is_kebab_id(&op.artifact_id) {
                d.push(diag(
                    "change_set.invalid_reference",
                    &f,
                    "The operation target is not an artifact ID.",
                ));
            } else if !seen_art.insert(op.artifact_id.clone()) {
                d.push(diag(
                    "change_set.duplicate_operation",
                    &f,
                    "The artifact has two operations in this change set.",
                ));
            } else if !art_ids.contains(op.artifact_id.as_str()) {
                d.push(diag(
                    "reference.not_found",
                    &f,
                    &format!("Artifact {} is not registered.", op.artifact_id),
                ));
            }
        }
        match &c.affected_interfaces {
            None => d.push(diag(
                "change_set.missing_field",
                "affected_interfaces",
                "The affected interfaces list is missing; write [] when empty.",
            )),
            Some(list) => {
                for i in list {
                    if !ids::is_kebab_id(i) {
                        d.push(diag(
                            "change_set.invalid_interface",
                            "affected_interfaces",
                            "An affected interface is not a valid interface ID.",
                        ));
                    } else if !iface_ids.contains(i.as_str()) {
                        d.push(diag(
                            "reference.not_found",
                            "affected_interfaces",
                            &format!("Interface {i} is not registered."),
                        ));
                    }
                }
            }
        }
        if c.affected_scopes.iter().any(|s| s.trim().is_empty()) {
            d.push(diag(
                "change_set.invalid_scope",
                "affected_scopes",
                "An affected scope is blank.",
            ));
        }
        match c.implementation_required {
            None => d.push(diag(
                "change_set.missing_field",
                "implementation_required",
                "implementation_required is missing.",
            )),
            Some(false) if c.implementation_rationale.trim().is_empty() => {
                d.push(diag(
                    "change_set.missing_field",
                    "implementation_rationale",
                    "Say why no implementation is required.",
                ));
            }
            Some(_) => {}
        }
        if c.created.trim().is_empty() {
            d.push(diag(
                "change_set.missing_field",
                "created",
                "The creation time is missing.",
            ));
        } else if !ids::is_timestamp(&c.created) {
            d.push(diag(
                "record.invalid_timestamp",
                "created",
                "The creation time must be a real UTC time as YYYY-MM-DDTHH:MM:SSZ.",
            ));
        }
        if scope.impact_only.as_ref().is_some_and(|only| only != &c.id) {
            continue;
        }
        assessment(snap, c, &rec.path, scope.proposed.contains(&c.id), d);
    }
}

fn assessment(snap: &Snapshot, c: &ChangeSet, path: &str, proposed: bool, d: &mut Vec<Diagnostic>) {
    let diag = |code: &str, field: &str, msg: &str| {
        Diagnostic::new(code, msg)
            .at(path)
            .record(&c.id)
            .field(field)
    };
    let reqs = snap.requirements.iter().map(|r| &r.record);
    let cands: BTreeSet<String> = if proposed {
        impact::candidates(c, reqs.clone())
            .into_iter()
            .map(|x| x.requirement_id)
            .collect()
    } else {
        BTreeSet::new()
    };
    let changed = impact::changed_ids(c);
    if proposed && !cands.is_empty() && c.impact_assessment.is_empty() {
        d.push(
            diag(
                "change_set.missing_field",
                "impact_assessment",
                "The impact assessment is missing; run 'ears-manager impact' and record it.",
            )
            .hint("Record the reviewed assessment with 'change-set update --impact-file'."),
        );
    }
    let mut seen = BTreeSet::new();
    for (i, a) in c.impact_assessment.iter().enumerate() {
        let f = |s: &str| format!("impact_assessment[{i}].{s}");
        if !ids::is_requirement_id(&a.requirement_id) {
            d.push(diag(
                "change_set.invalid_impact",
                &f("requirement_id"),
                "The assessed ID is not a requirement ID.",
            ));
        } else if !seen.insert(a.requirement_id.clone()) {
            d.push(diag(
                "change_set.duplicate_impact",
                &f("requirement_id"),
                "The requirement is assessed twice.",
            ));
        } else {
            match snap.requirement(&a.requirement_id) {
                None => d.push(diag(
                    "reference.not_found",
                    &f("requirement_id"),
                    &format!("Requirement {} does not exist.", a.requirement_id),
                )),
                Some(r) if proposed => {
                    if changed.contains(&a.requirement_id) {
                        d.push(diag(
                            "change_set.invalid_impact",
                            &f("requirement_id"),
                            "A requirement changed by this change set cannot be assessed.",
                        ));
                    } else if r.record.status() != "active" {
                        d.push(diag(
                            "change_set.invalid_impact",
                            &f("requirement_id"),
                            "Only active requirements can be assessed.",
                        ));
                    } else if a.origin == "mechanical" && !cands.contains(&a.requirement_id) {
                        d.push(diag("change_set.invalid_impact", &f("origin"), "A mechanical entry is not a current impact candidate; run 'ears-manager impact' again."));
                    } else if a.origin == "semantic" && cands.contains(&a.requirement_id) {
                        d.push(diag(
                            "change_set.invalid_impact",
                            &f("origin"),
                            "A current impact candidate must be recorded as mechanical.",
                        ));
                    }
                }
                Some(_) => {}
            }
        }
        if !matches!(a.disposition.as_str(), "applicable" | "not-applicable") {
            d.push(diag(
                "change_set.invalid_impact",
                &f("disposition"),
                "The disposition must be applicable or not-applicable.",
            ));
        }
        if a.rationale.trim().is_empty() {
            d.push(diag(
                "change_set.missing_field",
                &f("rationale"),
                "The assessment rationale is missing.",
            ));
        }
        if !matches!(a.origin.as_str(), "mechanical" | "semantic") {
            d.push(diag(
                "change_set.invalid_impact",
                &f("origin"),
                "The origin must be mechanical or semantic.",
            ));
        }
    }
    if !proposed {
        return;
    }
    for cand in &cands {
        if !c
            .impact_assessment
            .iter()
            .any(|a| &a.requirement_id == cand)
        {
            d.push(diag("change_set.incomplete_impact", "impact_assessment", &format!("Impact candidate {cand} has no recorded disposition."))
                .hint("Run 'ears-manager impact' and record every candidate with 'change-set update --impact-file'."));
        }
    }
    let base_ok = !c.impact_assessment_base_commit.is_empty()
        && c.impact_assessment_base_commit
            .eq_ignore_ascii_case(&c.base_commit);
    if !base_ok {
        d.push(diag("change_set.stale_impact", "impact_assessment_base_commit", "The impact assessment was reviewed against another base commit.")
            .hint("Rerun 'ears-manager impact' and record the review with 'change-set update --impact-file'."));
    }
}
