//! `artifact put | get` (§17): registered opaque text artifacts tracked by
//! digest, and the `shared` projection entry a new path needs.

use std::{collections::BTreeSet, sync::Arc};

use super::{
    Env, Success,
    args::Opts,
    cmd_change_set::read_input,
    session::{Session, Staged},
};
use crate::{
    diag::Diagnostic,
    digest, fsio, ids,
    model::{ARTIFACT_KINDS, Artifact, ArtifactOp},
    node::Node,
    outcome::{Exit, Failure},
    projection, rules,
    snapshot::ProjectionState,
    validate::Scope,
    vfs::FileState,
    yaml,
};

/// `artifact put`.
pub fn put(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let cs_id = opts.required("change-set")?;
    let id = opts.required("id")?;
    let kind = opts.required("kind")?;
    let path = opts.required("path")?;
    let owner = opts.required("owner")?;
    let validator = opts
        .get("validator")
        .map(str::trim)
        .unwrap_or("")
        .to_owned();
    let source = match (opts.get("content-file"), opts.flag("content-stdin")) {
        (Some(f), false) => f.to_owned(),
        (None, true) => "-".to_owned(),
        _ => {
            return Err(Failure::usage(
                "Give exactly one of --content-file or --content-stdin.",
            ));
        }
    };
    if !ids::is_kebab_id(&id) {
        return Err(Failure::new(
            Exit::Validation,
            "artifact.invalid_id",
            "The artifact ID must be lowercase kebab-case.",
        ));
    }
    let raw = read_input(&source, env)?;
    if !rules::is_canonical_path(&path) {
        return Err(Failure::new(
            Exit::Validation,
            "artifact.invalid_path",
            "The artifact path must be a canonical project-relative path.",
        ));
    }
    let content = digest::canonical_text(&raw).map_err(|e| {
        Failure::new(
            Exit::Validation,
            "artifact.invalid_content",
            format!("The artifact {e}."),
        )
    })?;
    let mut session = Session::open(env.cwd, env.faults)?;
    let mut cs = session.writable_change_set(&cs_id)?;
    let mut project = session.snap.project.clone();
    let existing = project.artifacts.iter().position(|a| a.id == id);
    if let Some(i) = existing
        && project.artifacts[i].owner != owner
    {
        return Err(Failure::new(
            Exit::Conflict,
            "artifact.owner_immutable",
            "The owner of a registered artifact cannot change.",
        ));
    }
    let action = if existing.is_some() { "revise" } else { "add" };
    // An existing operation stays as it is: add stays add, revise stays revise.
    if !cs.artifact_operations.iter().any(|o| o.artifact_id == id) {
        cs.artifact_operations.push(ArtifactOp {
            action: action.to_owned(),
            artifact_id: id.clone(),
            rationale: String::new(),
        });
    }
    cs.canonicalize();
    let artifact = Artifact {
        id: id.clone(),
        kind,
        path: path.clone(),
        digest: digest::sha256(&content),
        owner,
        validator,
    };
    match existing {
        Some(i) => project.artifacts[i] = artifact.clone(),
        None => project.artifacts.push(artifact.clone()),
    }
    let projection_write = match &session.snap.projection {
        ProjectionState::Invalid(d) => {
            return Err(Failure::new(
                Exit::Validation,
                "validation.failed",
                crate::outcome::VALIDATION_FAILED_MESSAGE,
            )
            .with_diagnostics(d.clone()));
        }
        ProjectionState::Valid(p) if p.class_of(&path) == Some("shared") => None,
        ProjectionState::Valid(p) => Some(p.with_shared(&path).into_bytes()),
        ProjectionState::Absent => None,
    };
    // Observe the target as it is now, so a concurrent change is detected.
    let root = session.git.root.clone();
    if !session.vfs.artifacts.contains_key(&path) {
        let now = fsio::read_file(&root, &path);
        Arc::make_mut(&mut session.vfs)
            .artifacts
            .insert(path.clone(), now);
    }
    if matches!(session.vfs.artifacts.get(&path), Some(FileState::Symlink)) {
        return Err(Failure::new(
            Exit::Validation,
            "validation.failed",
            crate::outcome::VALIDATION_FAILED_MESSAGE,
        )
        .with_diagnostics(vec![
            Diagnostic::new(
                "artifact.invalid_path",
                "The artifact path goes through a symlink.",
            )
            .at(crate::vfs::PROJECT_YAML)
            .record(&id)
            .field(format!("artifacts[id={id}].path")),
        ]));
    }
    let manifest_path = session.snap.change_set_path(&cs_id);
    let staged = Staged {
        writes: vec![
            (path.clone(), content),
            (
                manifest_path,
                yaml::emit_managed(&cs.to_node()).into_bytes(),
            ),
        ],
        project,
        projection: projection_write,
    };
    let scope = Scope {
        proposed: BTreeSet::from([cs_id.clone()]),
        impact_only: None,
    };
    let paths = session.finish(staged, &scope, true)?;
    let data = Node::map().with("artifact", artifact.to_data()).with(
        "operation",
        Node::map()
            .with("action", Node::s(action))
            .with("artifact_id", Node::s(&id)),
    );
    let _ = projection::CLASSES;
    Ok(Success { data, paths })
}

/// `artifact get --id ID | --kind KIND`.
pub fn get(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let by_id = opts.get("id").map(|s| s.trim().to_owned());
    let by_kind = opts.get("kind").map(|s| s.trim().to_owned());
    if by_id.is_some() == by_kind.is_some() {
        return Err(Failure::usage("Give exactly one of --id or --kind."));
    }
    if let Some(id) = &by_id
        && !ids::is_kebab_id(id)
    {
        return Err(Failure::new(
            Exit::Validation,
            "artifact.invalid_id",
            "The artifact ID must be lowercase kebab-case.",
        ));
    }
    if let Some(k) = &by_kind
        && !ARTIFACT_KINDS.contains(&k.as_str())
    {
        return Err(Failure::new(
            Exit::Validation,
            "artifact.unknown_kind",
            "The artifact kind is not supported.",
        ));
    }
    let snap = super::session::read_snapshot(opts.get("at"), env)?;
    let matches: Vec<&Artifact> = snap
        .project
        .artifacts
        .iter()
        .filter(|a| {
            by_id.as_ref().is_none_or(|i| &a.id == i)
                && by_kind.as_ref().is_none_or(|k| &a.kind == k)
        })
        .collect();
    let a = match matches.as_slice() {
        [] => {
            return Err(Failure::new(
                Exit::Validation,
                "artifact.not_found",
                "No registered artifact matches.",
            ));
        }
        [one] => *one,
        _ => {
            return Err(Failure::new(
                Exit::Conflict,
                "artifact.ambiguous",
                "More than one artifact has this kind; select it by --id.",
            ));
        }
    };
    // The bytes validation saw (working tree or commit), not a second read.
    let content = match snap
        .vfs
        .artifacts
        .get(&a.path)
        .cloned()
        .unwrap_or(FileState::Absent)
    {
        FileState::Bytes(b) => String::from_utf8(b).map_err(|_| {
            Failure::new(
                Exit::Validation,
                "artifact.read_failed",
                "The artifact file is not UTF-8 text.",
            )
        })?,
        FileState::Unreadable => {
            return Err(Failure::new(
                Exit::Io,
                "artifact.read_failed",
                "The artifact file could not be read; check permissions.",
            ));
        }
        _ => {
            return Err(Failure::new(
                Exit::Validation,
                "artifact.read_failed",
                "The artifact file is missing or not a regular file.",
            ));
        }
    };
    Ok(Success::read(
        Node::map()
            .with("artifact", a.to_data())
            .with("content", Node::s(content)),
    ))
}

/// `artifact list [--kind K] [--owner O]` (target-only in the contract; the
/// issue asks for it): registry entries sorted by ID, without content.
pub fn list(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let kind = opts.get("kind").map(|s| s.trim().to_owned());
    let owner = opts.get("owner").map(|s| s.trim().to_owned());
    if kind
        .as_ref()
        .is_some_and(|k| !ARTIFACT_KINDS.contains(&k.as_str()))
    {
        return Err(Failure::new(
            Exit::Validation,
            "artifact.unknown_kind",
            "The artifact kind is not supported.",
        ));
    }
    if owner
        .as_ref()
        .is_some_and(|o| !crate::model::ARTIFACT_OWNERS.contains(&o.as_str()))
    {
        return Err(Failure::new(
            Exit::Validation,
            "artifact.invalid_owner",
            "The owner filter must be user or ears-manager.",
        ));
    }
    let session = Session::open(env.cwd, env.faults)?;
    session.validate_for_read()?;
    let mut items: Vec<&Artifact> = session
        .snap
        .project
        .artifacts
        .iter()
        .filter(|a| {
            kind.as_ref().is_none_or(|k| &a.kind == k)
                && owner.as_ref().is_none_or(|o| &a.owner == o)
        })
        .collect();
    items.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(Success::read(Node::map().with(
        "artifacts",
        Node::List(items.into_iter().map(Artifact::to_data).collect()),
    )))
}
