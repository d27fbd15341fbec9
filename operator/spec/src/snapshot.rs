//! Decoding a [`Vfs`] into typed records (§2–§4, §12): the project
//! configuration (schema versions first), the three stores, the projection
//! manifest and the computed store digests. Pure; load problems become
//! diagnostics so that they aggregate with semantic ones (target contract).

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_yaml_ng::Value;

use crate::{
    diag::Diagnostic,
    digest, ids,
    model::{ChangeSet, Interface, Project, Requirement, StoreKind},
    outcome::{Exit, Failure, VALIDATION_FAILED_MESSAGE},
    projection::{self, Projection},
    vfs::{DirState, FileState, PROJECT_YAML, PROJECTION_YAML, Vfs},
    yaml,
};

/// A decoded record and where it lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rec<T> {
    /// Root-relative path.
    pub path: String,
    /// The record as decoded (not canonicalized).
    pub record: T,
}

/// The projection manifest as found.
#[derive(Debug, Clone, PartialEq)]
pub enum ProjectionState {
    /// No manifest: everything is unclassified.
    Absent,
    /// Present but invalid.
    Invalid(Vec<Diagnostic>),
    /// Parsed.
    Valid(Projection),
}

/// A decoded project.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The configuration.
    pub project: Project,
    /// Requirement records.
    pub requirements: Vec<Rec<Requirement>>,
    /// Interface records.
    pub interfaces: Vec<Rec<Interface>>,
    /// Change-set manifests.
    pub change_sets: Vec<Rec<ChangeSet>>,
    /// Load problems (decode failures, bad store entries).
    pub load_diags: Vec<Diagnostic>,
    /// Computed store digests (`None` when the store is unreadable).
    pub digests: BTreeMap<StoreKind, Option<String>>,
    /// The projection manifest.
    pub projection: ProjectionState,
    /// The files everything was decoded from.
    pub vfs: Vfs,
}

fn decode_failed(path: &str, why: &str) -> Diagnostic {
    Diagnostic::new(
        "storage.decode_failed",
        format!("The file cannot be decoded: {why}."),
    )
    .at(path)
    .hint("Restore the file from version control or rewrite it with ears-manager.")
}

/// Reads `schema_versions` before strict decoding, so a newer schema is
/// reported as such rather than as an unknown field (§4).
fn schema_diags(doc: &Value) -> Vec<Diagnostic> {
    let mut diags = Vec::new();
    for key in ["project", "specification"] {
        let v = doc
            .get("schema_versions")
            .and_then(|s| s.get(key))
            .and_then(Value::as_i64);
        if v != Some(1) {
            diags.push(
                Diagnostic::new(
                    "schema.unsupported_version",
                    format!("The {key} schema version is missing or not supported."),
                )
                .at(PROJECT_YAML)
                .field(format!("schema_versions.{key}"))
                .hint("Use schema version 1 or upgrade ears-manager."),
            );
        }
    }
    diags
}

/// Decodes the project configuration alone.
pub fn decode_project(state: &FileState) -> Result<Project, Failure> {
    let bytes = match state {
        FileState::Bytes(b) => b,
        FileState::Absent => {
            return Err(Failure::new(
                Exit::Project,
                "project.not_initialized",
                "This repository has no .protobot/project.yaml; run 'ears-manager project init' first.",
            ));
        }
        FileState::Unreadable => {
            return Err(Failure::new(
                Exit::Io,
                "storage.read_failed",
                "The project configuration could not be read; check file permissions.",
            ));
        }
        FileState::Symlink | FileState::NotRegular => {
            return Err(Failure::new(
                Exit::Io,
                "project.configuration_unreadable",
                "The project configuration is not a regular file; restore .protobot/project.yaml.",
            ));
        }
    };
    let validation = |d: Diagnostic| {
        Failure::new(
            Exit::Validation,
            "validation.failed",
            VALIDATION_FAILED_MESSAGE,
        )
        .with_diagnostics(vec![d])
    };
    let doc = yaml::parse(bytes).map_err(|e| validation(decode_failed(PROJECT_YAML, &e)))?;
    let schema = schema_diags(&doc);
    if !schema.is_empty() {
        return Err(Failure::new(
            Exit::Project,
            "project.invalid_configuration",
            "The project configuration is not valid.",
        )
        .with_diagnostics(schema));
    }
    if !doc.is_mapping() {
        return Err(validation(decode_failed(
            PROJECT_YAML,
            "the document is not a mapping",
        )));
    }
    serde_yaml_ng::from_value(doc)
        .map_err(|e| validation(decode_failed(PROJECT_YAML, &scrub(&e.to_string()))))
}

fn scrub(msg: &str) -> String {
    msg.lines()
        .next()
        .unwrap_or("invalid")
        .chars()
        .filter(|c| !c.is_control())
        .take(200)
        .collect()
}

/// Decodes everything. Fails only when the configuration itself cannot be
/// decoded; everything else becomes diagnostics.
pub fn open(vfs: Vfs) -> Result<Snapshot, Failure> {
    let project = decode_project(&vfs.project_yaml)?;
    let mut load_diags = Vec::new();
    let mut digests = BTreeMap::new();
    let mut requirements = Vec::new();
    let mut interfaces = Vec::new();
    let mut change_sets = Vec::new();
    for kind in StoreKind::ALL {
        let dir = project.store_dir(kind);
        let state = vfs.stores.get(&dir).cloned().unwrap_or(DirState::Absent);
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        let mut readable = true;
        match &state {
            DirState::Absent => {}
            DirState::Listing(entries) => {
                for (name, st) in entries {
                    let path = format!("{dir}/{name}");
                    match st {
                        FileState::Bytes(b) if name.ends_with(".yaml") => {
                            files.push((path, b.clone()))
                        }
                        FileState::Absent => {}
                        FileState::Unreadable => {
                            return Err(Failure::new(
                                Exit::Io,
                                "storage.read_failed",
                                "A store file could not be read; check file permissions.",
                            ));
                        }
                        _ => {
                            readable = false;
                            load_diags.push(decode_failed(
                                &path,
                                "a store may only hold regular .yaml files",
                            ));
                        }
                    }
                }
            }
            DirState::Unreadable => {
                return Err(Failure::new(
                    Exit::Io,
                    "storage.read_failed",
                    "A store directory could not be listed; check its permissions.",
                ));
            }
            DirState::Symlink | DirState::NotDir => {
                readable = false;
            }
        }
        let computed = if readable {
            digest::store_digest(files.iter().map(|(p, b)| (p.as_str(), b.as_slice()))).ok()
        } else {
            None
        };
        digests.insert(kind, computed);
        for (path, bytes) in files {
            let name = path.rsplit('/').next().unwrap_or_default().to_owned();
            match kind {
                StoreKind::Requirements => {
                    let check = |r: &Requirement| {
                        let expected = format!("{}.yaml", r.id);
                        filename_ok(&r.id, ids::is_requirement_id(&r.id), &expected, &name)
                    };
                    if let Some(record) = decode_record(&path, &bytes, &mut load_diags, check) {
                        requirements.push(Rec { path, record });
                    }
                }
                StoreKind::Interfaces => {
                    let check = |r: &Interface| {
                        let expected = format!("{}.yaml", r.id);
                        filename_ok(&r.id, ids::is_kebab_id(&r.id), &expected, &name)
                    };
                    if let Some(record) = decode_record(&path, &bytes, &mut load_diags, check) {
                        interfaces.push(Rec { path, record });
                    }
                }
                StoreKind::ChangeSets => {
                    let check = |r: &ChangeSet| {
                        let expected = ids::change_set_file_name(&r.id);
                        filename_ok(&r.id, ids::is_change_set_id(&r.id), &expected, &name)
                    };
                    if let Some(record) = decode_record(&path, &bytes, &mut load_diags, check) {
                        change_sets.push(Rec { path, record });
                    }
                }
            }
        }
    }
    let projection = match &vfs.projection_yaml {
        FileState::Absent => ProjectionState::Absent,
        FileState::Bytes(b) => match projection::parse(b) {
            Ok(p) => ProjectionState::Valid(p),
            Err(d) => ProjectionState::Invalid(d),
        },
        _ => ProjectionState::Invalid(vec![
            Diagnostic::new(
                "projection.invalid",
                "The projection manifest is not a readable regular file.",
            )
            .at(PROJECTION_YAML)
            .hint("Restore .protobot/projection.yaml as a regular file."),
        ]),
    };
    Ok(Snapshot {
        project,
        requirements,
        interfaces,
        change_sets,
        load_diags,
        digests,
        projection,
        vfs,
    })
}

/// `Some(diagnostic)` when a valid ID does not match its file name.
fn filename_ok(id: &str, valid: bool, expected: &str, actual: &str) -> Option<(String, String)> {
    (valid && expected != actual).then(|| (id.to_owned(), expected.to_owned()))
}

fn decode_record<T: DeserializeOwned>(
    path: &str,
    bytes: &[u8],
    diags: &mut Vec<Diagnostic>,
    check_name: impl Fn(&T) -> Option<(String, String)>,
) -> Option<T> {
    match yaml::decode::<T>(bytes) {
        Ok(record) => {
            if let Some((id, expected)) = check_name(&record) {
                diags.push(
                    Diagnostic::new(
                        "record.filename_mismatch",
                        format!("The record file name does not match its ID; expected {expected}."),
                    )
                    .at(path)
                    .record(&id)
                    .field("id")
                    .hint("Rename the file to match the record ID."),
                );
                return None;
            }
            Some(record)
        }
        Err(e) => {
            diags.push(decode_failed(path, &e));
            None
        }
    }
}

impl Snapshot {
    /// Finds a requirement.
    pub fn requirement(&self, id: &str) -> Option<&Rec<Requirement>> {
        self.requirements.iter().find(|r| r.record.id == id)
    }

    /// Finds an interface.
    pub fn interface(&self, id: &str) -> Option<&Rec<Interface>> {
        self.interfaces.iter().find(|r| r.record.id == id)
    }

    /// Finds a change set.
    pub fn change_set(&self, id: &str) -> Option<&Rec<ChangeSet>> {
        self.change_sets.iter().find(|r| r.record.id == id)
    }

    /// Record path for a requirement ID.
    pub fn requirement_path(&self, id: &str) -> String {
        format!(
            "{}/{id}.yaml",
            self.project.store_dir(StoreKind::Requirements)
        )
    }

    /// Record path for an interface ID.
    pub fn interface_path(&self, id: &str) -> String {
        format!(
            "{}/{id}.yaml",
            self.project.store_dir(StoreKind::Interfaces)
        )
    }

    /// Manifest path for a change-set ID.
    pub fn change_set_path(&self, id: &str) -> String {
        format!(
            "{}/{}",
            self.project.store_dir(StoreKind::ChangeSets),
            ids::change_set_file_name(id)
        )
    }
}
