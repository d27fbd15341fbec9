//! `check [--change-set CS]` (§22) and `impact --change-set CS` (§20).

use super::{
    Env, Success,
    args::Opts,
    cmd_change_set::check_local_base,
    session::{self, AtCommit, Session},
};
use crate::{
    ids, impact,
    node::Node,
    outcome::{self, Exit, Failure},
    snapshot::{self, Snapshot},
    validate::{self, Scope},
    vfs::{FileState, PROJECT_YAML, PROJECTION_YAML},
};

fn optional_cs(opts: &Opts) -> Result<Option<String>, Failure> {
    match opts.get("change-set") {
        None => Ok(None),
        Some(id) if ids::is_change_set_id(id.trim()) => Ok(Some(id.trim().to_owned())),
        Some(_) => Err(Failure::new(
            Exit::Validation,
            "change_set.invalid_id",
            "The change-set ID must look like CS-<NNNNN>.",
        )),
    }
}

fn ensure_change_set(snap: &Snapshot, only: Option<&String>) -> Result<(), Failure> {
    match only {
        Some(id) if snap.change_set(id).is_none() => Err(Failure::new(
            Exit::Validation,
            "change_set.not_found",
            format!("Change set {id} was not found."),
        )),
        _ => Ok(()),
    }
}

/// `check [--change-set CS] [--at SHA]`.
pub fn check(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let only = optional_cs(opts)?;
    // With `--at`, the project of that commit (read through libgit2, no
    // checkout), with the approval rule as of that commit.
    let (snap, proposed) = match opts.get("at") {
        None => {
            let session = Session::open(env.cwd, env.faults)?;
            ensure_change_set(&session.snap, only.as_ref())?;
            let proposed = session.proposed()?;
            (session.snap, proposed)
        }
        Some(at) => {
            let at = AtCommit::open(env.cwd, at)?;
            ensure_change_set(&at.snap, only.as_ref())?;
            let proposed = at.proposed()?;
            (at.snap, proposed)
        }
    };
    let snap = &snap;
    let scope = match &only {
        Some(id) => Scope {
            proposed: proposed.iter().filter(|p| *p == id).cloned().collect(),
            impact_only: Some(id.clone()),
        },
        None => Scope {
            proposed,
            impact_only: None,
        },
    };
    if let Some(f) = outcome::wrap(validate::validate(snap, &scope), false) {
        return Err(f);
    }
    // Sorted and unique (one sort of a vector: the stores are large).
    let mut paths: Vec<String> = Vec::with_capacity(
        snap.requirements.len() + snap.interfaces.len() + snap.change_sets.len() + 8,
    );
    paths.push(PROJECT_YAML.to_owned());
    paths.extend(snap.requirements.iter().map(|r| r.path.clone()));
    paths.extend(snap.interfaces.iter().map(|r| r.path.clone()));
    paths.extend(snap.change_sets.iter().map(|r| r.path.clone()));
    paths.extend(snap.project.artifacts.iter().map(|a| a.path.clone()));
    if !matches!(snap.vfs.projection_yaml, FileState::Absent) {
        paths.push(PROJECTION_YAML.to_owned());
    }
    paths.sort_unstable();
    paths.dedup();
    let counts = Node::map()
        .with("requirements", Node::Int(snap.requirements.len() as i64))
        .with("interfaces", Node::Int(snap.interfaces.len() as i64))
        .with("change_sets", Node::Int(snap.change_sets.len() as i64))
        .with("artifacts", Node::Int(snap.project.artifacts.len() as i64));
    Ok(Success::read(
        Node::map()
            .with("valid", Node::Bool(true))
            .with("checked_paths", Node::strs(paths))
            .with("record_counts", counts),
    ))
}

/// `impact --change-set CS [--at SHA]` (structural load only, no
/// validation).
pub fn impact(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let id = opts.required("change-set")?;
    if !ids::is_change_set_id(&id) {
        return Err(Failure::new(
            Exit::Validation,
            "change_set.invalid_id",
            "The change-set ID must look like CS-<NNNNN>.",
        ));
    }
    // With `--at`, the manifest and requirements of that commit.
    let (snap, git) = match opts.get("at") {
        None => {
            let session = Session::open(env.cwd, env.faults)?;
            (session.snap, session.git)
        }
        Some(at) => {
            // As `change-set show --at`: a commit without the project has
            // no such change set.
            let (git, commit) = session::resolve_at(env.cwd, at)?;
            let vfs = git.commit_vfs(commit)?;
            if vfs.project_yaml == FileState::Absent {
                return Err(Failure::new(
                    Exit::Validation,
                    "change_set.not_found",
                    format!("Change set {id} was not found."),
                ));
            }
            (snapshot::open(vfs)?, git)
        }
    };
    let Some(rec) = snap.change_set(&id) else {
        return Err(Failure::new(
            Exit::Validation,
            "change_set.not_found",
            format!("Change set {id} was not found."),
        ));
    };
    check_local_base(&git, &rec.record)?;
    let mut cs = rec.record.clone();
    cs.canonicalize();
    let reqs: Vec<_> = snap
        .requirements
        .iter()
        .map(|r| {
            let mut r = r.record.clone();
            r.canonicalize();
            r
        })
        .collect();
    let cands = impact::candidates(&cs, reqs.iter());
    let status = impact::status(&cs, reqs.iter());
    Ok(Success::read(
        Node::map()
            .with("change_set_id", Node::s(&id))
            .with(
                "against_commit",
                Node::s(cs.base_commit.to_ascii_lowercase()),
            )
            .with(
                "candidates",
                Node::List(cands.iter().map(impact::candidate_node).collect()),
            )
            .with("assessment_status", Node::s(status.as_str())),
    ))
}
