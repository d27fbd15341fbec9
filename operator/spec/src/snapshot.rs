//! Decoding a [`Vfs`] into typed records (§2–§4, §12): the project
//! configuration (schema versions first), the three stores, the projection
//! manifest and the computed store digests. Pure; load problems become
//! diagnostics so that they aggregate with semantic ones (target contract).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

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
    /// The files everything was decoded from (shared with the session that
    /// read them, so opening a project copies no file contents).
    pub vfs: Arc<Vfs>,
    /// ID → position in `requirements` (first occurrence).
    req_index: HashMap<String, usize>,
    /// ID → position in `interfaces` (first occurrence).
    if_index: HashMap<String, usize>,
    /// ID → position in `change_sets` (first occurrence).
    cs_index: HashMap<String, usize>,
}

fn index<T>(recs: &[Rec<T>], id: impl Fn(&T) -> &str) -> HashMap<String, usize> {
    let mut m = HashMap::with_capacity(recs.len());
    for (i, r) in recs.iter().enumerate() {
        m.entry(id(&r.record).to_owned()).or_insert(i);
    }
    m
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
pub fn open(vfs: impl Into<Arc<Vfs>>) -> Result<Snapshot, Failure> {
    let vfs: Arc<Vfs> = vfs.into();
    let project = decode_project(&vfs.project_yaml)?;
    let mut load_diags = Vec::new();
    let mut digests = BTreeMap::new();
    let mut requirements = Vec::new();
    let mut interfaces = Vec::new();
    let mut change_sets = Vec::new();
    for kind in StoreKind::ALL {
        let dir = project.store_dir(kind);
        let state = vfs.stores.get(&dir).unwrap_or(&DirState::Absent);
        let mut files: Vec<(String, &[u8])> = Vec::new();
        let mut readable = true;
        match state {
            DirState::Absent => {}
            DirState::Listing(entries) => {
                for (name, st) in entries {
                    let path = format!("{dir}/{name}");
                    match st {
                        FileState::Bytes(b) if name.ends_with(".yaml") => {
                            files.push((path, b.as_slice()))
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
        // Decoding also computes each file's text digest, in the same
        // parallel pass, and returns the store digest that combines them.
        let store_digest = match kind {
            StoreKind::Requirements => {
                let check = |r: &Requirement, name: &str| {
                    filename_ok(
                        &r.id,
                        ids::is_requirement_id(&r.id),
                        &format!("{}.yaml", r.id),
                        name,
                    )
                };
                decode_all(files, check, &mut requirements, &mut load_diags)
            }
            StoreKind::Interfaces => {
                let check = |r: &Interface, name: &str| {
                    filename_ok(
                        &r.id,
                        ids::is_kebab_id(&r.id),
                        &format!("{}.yaml", r.id),
                        name,
                    )
                };
                decode_all(files, check, &mut interfaces, &mut load_diags)
            }
            StoreKind::ChangeSets => {
                let check = |r: &ChangeSet, name: &str| {
                    filename_ok(
                        &r.id,
                        ids::is_change_set_id(&r.id),
                        &ids::change_set_file_name(&r.id),
                        name,
                    )
                };
                decode_all(files, check, &mut change_sets, &mut load_diags)
            }
        };
        let computed = if readable { store_digest } else { None };
        digests.insert(kind, computed);
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
    let req_index = index(&requirements, |r| &r.id);
    let if_index = index(&interfaces, |r| &r.id);
    let cs_index = index(&change_sets, |r| &r.id);
    Ok(Snapshot {
        project,
        requirements,
        interfaces,
        change_sets,
        load_diags,
        digests,
        projection,
        vfs,
        req_index,
        if_index,
        cs_index,
    })
}

/// `Some(diagnostic)` when a valid ID does not match its file name.
fn filename_ok(id: &str, valid: bool, expected: &str, actual: &str) -> Option<(String, String)> {
    (valid && expected != actual).then(|| (id.to_owned(), expected.to_owned()))
}

/// Decodes the files of one store, in parallel chunks when there are many
/// (decoding dominates `check` on large stores), keeping file order. Each
/// file's text digest is computed in the same pass; returns the store digest
/// over them (`None` when some file is not canonical text).
fn decode_all<T, F>(
    files: Vec<(String, &[u8])>,
    check: F,
    out: &mut Vec<Rec<T>>,
    diags: &mut Vec<Diagnostic>,
) -> Option<String>
where
    T: DeserializeOwned + Send,
    F: Fn(&T, &str) -> Option<(String, String)> + Sync,
{
    let one = |(path, bytes): &(String, &[u8])| {
        let mut d = Vec::new();
        let name = path.rsplit('/').next().unwrap_or_default();
        let rec = decode_record(path, bytes, &mut d, |r: &T| check(r, name));
        (rec, d, digest::text_digest(bytes).ok())
    };
    // The decoder does not panic on any input (see the fuzz test); if it
    // ever did, the panic surfaces on this thread as in a sequential loop.
    let mut results = crate::par::map(&files, 256, 8, one);
    let store = results
        .iter_mut()
        .zip(&files)
        .map(|((_, _, d), (p, _))| d.take().map(|d| (p.as_str(), d)))
        .collect::<Option<Vec<_>>>()
        .map(digest::store_digest_of);
    // The paths move into the records: no copies.
    for ((rec, d, _), (path, _)) in results.into_iter().zip(files) {
        diags.extend(d);
        out.extend(rec.map(|record| Rec { path, record }));
    }
    store
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
        self.req_index
            .get(id)
            .and_then(|i| self.requirements.get(*i))
    }

    /// Finds an interface.
    pub fn interface(&self, id: &str) -> Option<&Rec<Interface>> {
        self.if_index.get(id).and_then(|i| self.interfaces.get(*i))
    }

    /// Finds a change set.
    pub fn change_set(&self, id: &str) -> Option<&Rec<ChangeSet>> {
        self.cs_index.get(id).and_then(|i| self.change_sets.get(*i))
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
