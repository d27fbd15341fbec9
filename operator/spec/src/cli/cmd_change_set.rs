//! `change-set create | list | show | update | compare` (§17, §18, §19, §21).

use std::{collections::BTreeSet, io::Read, path::Path};

use super::{
    Env, Success,
    args::Opts,
    session::{self, AtCommit, Session, Staged},
};
use crate::{
    compare, fsio,
    git::Git,
    ids, impact,
    model::{Assessment, ChangeSet, StoreKind},
    node::Node,
    outcome::{self, Exit, Failure},
    rules, snapshot,
    validate::{self, Scope},
    vfs::{FileState, PROJECT_YAML},
    yaml,
};

fn not_found(id: &str) -> Failure {
    Failure::new(
        Exit::Validation,
        "change_set.not_found",
        format!("Change set {id} was not found."),
    )
}

fn required_cs(opts: &Opts) -> Result<String, Failure> {
    let id = opts.required("change-set")?;
    if !ids::is_change_set_id(&id) {
        return Err(Failure::new(
            Exit::Validation,
            "change_set.invalid_id",
            "The change-set ID must look like CS-<NNNNN>.",
        ));
    }
    Ok(id)
}

/// `change-set create` (EM-07: cuts and checks out the change-set branch).
pub fn create(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let intent = opts.required("intent")?;
    let required = opts
        .boolean("implementation-required")?
        .ok_or_else(|| Failure::usage("Option --implementation-required is required."))?;
    let created = opts.created_or_now()?;
    let rationale = opts
        .get("implementation-rationale")
        .map(str::trim)
        .unwrap_or("")
        .to_owned();
    if !required && rationale.is_empty() {
        return Err(Failure::usage(
            "Option --implementation-rationale is required when --implementation-required is false.",
        ));
    }
    let session = Session::open(env.cwd, env.faults)?;
    let project = session.snap.project.clone();
    let default_branch = project.default_branch();
    let prefix = project.branch_prefix();
    let canonical = project.canonical_remote();
    let git = &session.git;
    let base = git.local_branch(&default_branch).ok_or_else(|| {
        Failure::new(
            Exit::Project,
            "project.default_branch_unresolved",
            "The local default branch does not resolve to a commit.",
        )
    })?;
    let head_branch = git.head_branch();
    let init_branch = format!("{prefix}00001-project-init");
    let cs_dir = project.store_dir(StoreKind::ChangeSets);

    let (id, branch, cut) = if head_branch.as_deref() == Some(init_branch.as_str())
        && session.snap.change_sets.is_empty()
    {
        let head = session.head.ok_or_else(|| {
            Failure::new(
                Exit::Conflict,
                "change_set.base_mismatch",
                "The initialization branch has no commit.",
            )
        })?;
        if !git.is_ancestor(base, head)? {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.base_mismatch",
                "The initialization branch does not descend from the default branch; recut it.",
            ));
        }
        (ids::change_set_id(1), init_branch, false)
    } else {
        if head_branch.is_none() || !git.path_in_commit(base, PROJECT_YAML)? {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.unexpected_branch",
                "Create change sets from a branch of an initialized project whose default branch holds .protobot/project.yaml.",
            ));
        }
        if git.has_tracked_changes()? {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.uncommitted_changes",
                "Commit or stash tracked changes before creating a change set.",
            ));
        }
        let mut used: BTreeSet<u32> = session
            .snap
            .change_sets
            .iter()
            .filter_map(|r| ids::change_set_number(&r.record.id))
            .collect();
        for name in session
            .vfs
            .stores
            .get(&cs_dir)
            .map(list_names)
            .unwrap_or_default()
        {
            used.extend(number_of_manifest(&name));
        }
        for r in git.approval_refs(&project)? {
            for name in git.dir_names_in_commit(r, &cs_dir)? {
                used.extend(number_of_manifest(&name));
            }
        }
        used.extend(git.branch_numbers(&prefix, &canonical)?);
        let next = used.iter().max().copied().unwrap_or(0) + 1;
        if next > 99_999 {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.sequence_exhausted",
                "Every change-set number up to 99999 is in use.",
            ));
        }
        let branch = format!("{prefix}{next:05}-{}", rules::slug(&intent));
        if let Some(place) = git.branch_location(&branch, &canonical)? {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.branch_exists",
                format!(
                    "The change-set branch already exists {place}; pick another intent or remove the branch."
                ),
            ));
        }
        (ids::change_set_id(next), branch, true)
    };

    let original = if cut {
        Some(git.cut_branch(&branch, base)?)
    } else {
        None
    };
    let fail_restore = env.faults.fail_branch_restore;
    let undo = |session: &Session, failure: Failure| -> Failure {
        if fail_restore {
            return Failure::new(Exit::Io, "git.write_unknown", "Restoring the original branch could not be confirmed; inspect the repository before retrying.").unknown();
        }
        match &original {
            Some(orig) => match session.git.undo_cut(orig, &branch) {
                Ok(()) => failure,
                Err(unknown) => unknown,
            },
            None => failure,
        }
    };
    // Reload on the new branch: the tree may differ from where we started.
    let session = match Session::open(env.cwd, env.faults) {
        Ok(s) => s,
        Err(f) => return Err(undo(&session, f)),
    };
    let base_hex = base.to_string();
    let mut cs = ChangeSet {
        id: id.clone(),
        base_commit: base_hex.clone(),
        intent,
        operations: Some(Vec::new()),
        affected_interfaces: Some(opts.list("affected-interface")),
        affected_scopes: opts.list("affected-scope"),
        implementation_required: Some(required),
        implementation_rationale: rationale,
        impact_assessment_base_commit: base_hex.clone(),
        created,
        ..ChangeSet::default()
    };
    cs.canonicalize();
    let manifest_path = session.snap.change_set_path(&id);
    let staged = Staged {
        writes: vec![(
            manifest_path.clone(),
            yaml::emit_managed(&cs.to_node()).into_bytes(),
        )],
        project: session.snap.project.clone(),
        projection: None,
    };
    let scope = Scope {
        proposed: BTreeSet::from([id.clone()]),
        impact_only: None,
    };
    let paths = match session.finish(staged, &scope, true) {
        Ok(p) => p,
        Err(f) => return Err(undo(&session, f)),
    };
    let data = Node::map().with(
        "change_set",
        Node::map()
            .with("id", Node::s(&id))
            .with("base_commit", Node::s(&base_hex))
            .with("branch", Node::s(&branch))
            .with("manifest_path", Node::s(&manifest_path)),
    );
    Ok(Success { data, paths })
}

fn list_names(state: &crate::vfs::DirState) -> Vec<String> {
    match state {
        crate::vfs::DirState::Listing(e) => e.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

fn number_of_manifest(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("cs-")?.strip_suffix(".yaml")?;
    if digits.len() == 5 && digits.bytes().all(|c| c.is_ascii_digit()) {
        digits.parse().ok()
    } else {
        None
    }
}

fn manifest_node(cs: &ChangeSet) -> Node {
    let mut cs = cs.clone();
    cs.canonicalize();
    cs.to_node()
}

/// `change-set list`.
pub fn list(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let status = opts.get("status").map(str::to_owned);
    if let Some(s) = &status
        && s != "proposed"
        && s != "approved"
    {
        return Err(Failure::new(
            Exit::Validation,
            "change_set.invalid_status",
            "The status filter must be proposed or approved.",
        ));
    }
    let iface = opts.get("interface").map(str::to_owned);
    if let Some(i) = &iface
        && !ids::is_kebab_id(i)
    {
        return Err(Failure::new(
            Exit::Validation,
            "interface.invalid_id",
            "The interface filter is not a valid interface ID.",
        ));
    }
    let scope = opts.get("scope").map(str::to_owned);
    let (snap, proposed) = match opts.get("at") {
        None => {
            let session = Session::open(env.cwd, env.faults)?;
            session.validate_for_read()?;
            let proposed = session.proposed()?;
            (session.snap, proposed)
        }
        Some(at) => {
            // The project as of that commit, validated as reads are.
            let at = AtCommit::open(env.cwd, at)?;
            if let Some(f) = outcome::wrap(validate::validate(&at.snap, &Scope::default()), true) {
                return Err(f);
            }
            let proposed = at.proposed()?;
            (at.snap, proposed)
        }
    };
    let mut items: Vec<&ChangeSet> = snap.change_sets.iter().map(|r| &r.record).collect();
    items.sort_by(|a, b| a.id.cmp(&b.id));
    let mut out = Vec::new();
    for cs in items {
        let st = if proposed.contains(&cs.id) {
            "proposed"
        } else {
            "approved"
        };
        if status.as_deref().is_some_and(|s| s != st)
            || iface
                .as_ref()
                .is_some_and(|i| !cs.affected_interfaces().contains(i))
            || scope
                .as_ref()
                .is_some_and(|s| !cs.affected_scopes.contains(s))
        {
            continue;
        }
        out.push(manifest_node(cs).with("status", Node::s(st)));
    }
    Ok(Success::read(
        Node::map().with("change_sets", Node::List(out)),
    ))
}

/// `change-set show [--at SHA]`.
pub fn show(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let id = required_cs(opts)?;
    let (snap, status) = match opts.get("at") {
        None => {
            let session = Session::open(env.cwd, env.faults)?;
            session.validate_for_read()?;
            let Some(rec) = session.snap.change_set(&id) else {
                return Err(not_found(&id));
            };
            let refs = session.git.approval_refs(&session.snap.project)?;
            let approved = session.is_approved(&rec.path, &refs)?;
            (session.snap, if approved { "approved" } else { "proposed" })
        }
        Some(at) => {
            let (git, commit) = session::resolve_at(env.cwd, at)?;
            let vfs = git.commit_vfs(commit)?;
            if vfs.project_yaml == FileState::Absent {
                return Err(not_found(&id));
            }
            let at = AtCommit {
                snap: snapshot::open(vfs)?,
                git,
                commit,
            };
            let Some(_) = at.snap.change_set(&id) else {
                return Err(not_found(&id));
            };
            let refs = at.git.approval_refs(&at.snap.project)?;
            let approved = at.commit_approved(&refs)?;
            (at.snap, if approved { "approved" } else { "proposed" })
        }
    };
    let Some(rec) = snap.change_set(&id) else {
        return Err(not_found(&id));
    };
    let cs = &rec.record;
    let mut paths: BTreeSet<String> = BTreeSet::from([rec.path.clone()]);
    for op in cs.ops() {
        paths.insert(snap.requirement_path(&op.requirement_id));
    }
    for op in &cs.interface_operations {
        paths.insert(snap.interface_path(&op.interface_id));
    }
    for op in &cs.artifact_operations {
        if let Some(a) = snap
            .project
            .artifacts
            .iter()
            .find(|a| a.id == op.artifact_id)
        {
            paths.insert(a.path.clone());
        }
    }
    let changed = cs.ops().len() + cs.interface_operations.len() + cs.artifact_operations.len();
    let applicable = cs
        .impact_assessment
        .iter()
        .filter(|a| a.disposition == "applicable")
        .count();
    let data = Node::map()
        .with("change_set", manifest_node(cs))
        .with("status", Node::s(status))
        .with("changed_count", Node::Int(changed as i64))
        .with("applicable_count", Node::Int(applicable as i64))
        .with("manifest_path", Node::s(&rec.path))
        .with("paths", Node::strs(paths));
    Ok(Success::read(data))
}

/// `change-set compare`.
pub fn compare(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let id = required_cs(opts)?;
    let session = Session::open(env.cwd, env.faults)?;
    let Some(rec) = session.snap.change_set(&id) else {
        return Err(not_found(&id));
    };
    let cs = rec.record.clone();
    // `--against` is deferred (§17, §25): always `change_set.invalid_base`.
    if opts.get("against").is_some() {
        return Err(Failure::new(
            Exit::Validation,
            "change_set.invalid_base",
            "change-set compare --against is not supported; compare against the recorded base.",
        ));
    }
    check_local_base(&session.git, &cs)?;
    let reqs: Vec<_> = session
        .snap
        .requirements
        .iter()
        .map(|r| &r.record)
        .collect();
    Ok(Success::read(compare::compare(&cs, &reqs)))
}

/// The recorded base must be a local commit (compare, impact).
pub fn check_local_base(git: &Git, cs: &ChangeSet) -> Result<(), Failure> {
    if cs.base_commit.trim().is_empty() {
        return Err(Failure::new(
            Exit::Validation,
            "change_set.invalid_base",
            "The change set has no base commit.",
        ));
    }
    session::base_oid(git, &cs.base_commit).map(|_| ())
}

fn summary(cs: &ChangeSet, opts: &Opts, status: impact::Status, with_assessment: bool) -> Node {
    let mut n = Node::map();
    if opts.has("intent") {
        n = n.with("intent", Node::s(&cs.intent));
    }
    if opts.has("base-commit") {
        n = n.with("base_commit", Node::s(&cs.base_commit));
    }
    n = n
        .with(
            "affected_interfaces",
            Node::strs(cs.affected_interfaces().iter().cloned()),
        )
        .with(
            "affected_scopes",
            Node::strs(cs.affected_scopes.iter().cloned()),
        );
    if opts.has("implementation-required") {
        n = n.with(
            "implementation_required",
            Node::Bool(cs.implementation_required.unwrap_or(false)),
        );
    }
    if opts.has("implementation-rationale") {
        n = n.with(
            "implementation_rationale",
            Node::s(&cs.implementation_rationale),
        );
    }
    n = n.with("assessment_status", Node::s(status.as_str()));
    // The fixture shows the assessment only when it is non-empty, whether or
    // not --impact-file was given.
    let _ = with_assessment;
    if !cs.impact_assessment.is_empty() {
        n = n.with(
            "impact_assessment",
            Node::List(
                cs.impact_assessment
                    .iter()
                    .map(Assessment::to_node)
                    .collect(),
            ),
        );
    }
    n
}

fn read_source(spec: &str, cwd: &Path, stdin: &mut dyn Read) -> Result<Vec<u8>, Failure> {
    let bad = || {
        Failure::new(
            Exit::Validation,
            "input.invalid_source",
            "The input source must be a readable regular file (not a symlink) or '-' for stdin.",
        )
    };
    if spec == "-" {
        let mut buf = Vec::new();
        stdin.read_to_end(&mut buf).map_err(|_| bad())?;
        return Ok(buf);
    }
    let path = cwd.join(spec);
    let meta = std::fs::symlink_metadata(&path).map_err(|_| bad())?;
    if !meta.is_file() {
        return Err(bad());
    }
    std::fs::read(&path).map_err(|_| bad())
}

/// Reads `--content-file` / `--impact-file` style sources.
pub fn read_input(spec: &str, env: &mut Env<'_>) -> Result<Vec<u8>, Failure> {
    read_source(spec, env.cwd, env.stdin)
}

/// Reads an impact file: a JSON array of assessments, or what `ears-manager
/// --output json impact` printed (its `candidates`, whole envelope or `data`
/// alone) with a `disposition` (or `recorded_disposition`) and a `rationale`
/// filled in for each candidate.
fn parse_impact_file(bytes: &[u8]) -> Result<Vec<Assessment>, Failure> {
    let bad = |m: &str| Failure::new(Exit::Validation, "change_set.invalid_impact", m.to_owned());
    const SHAPE: &str = "The impact file must be a JSON array of {requirement_id, disposition, rationale, origin}, or the output of `ears-manager --output json impact` with a disposition and a rationale filled in for each candidate.";
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|_| bad(SHAPE))?;
    let items = match &value {
        serde_json::Value::Array(items) => items,
        serde_json::Value::Object(_) => value
            .get("candidates")
            .or_else(|| value.get("data").and_then(|d| d.get("candidates")))
            .and_then(serde_json::Value::as_array)
            .ok_or_else(|| bad(SHAPE))?,
        _ => return Err(bad(SHAPE)),
    };
    let mut out = Vec::new();
    for item in items {
        let field = |k: &str| {
            item.get(k)
                .and_then(serde_json::Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        if let Some(id) = field("requirement_id")
            && field("disposition")
                .or_else(|| field("recorded_disposition"))
                .is_none()
        {
            return Err(bad(&format!(
                "Impact entry {id} has no disposition: set \"disposition\" to applicable or not-applicable, with a \"rationale\"."
            )));
        }
        match (
            field("requirement_id"),
            field("disposition").or_else(|| field("recorded_disposition")),
            field("rationale"),
            field("origin"),
        ) {
            (Some(requirement_id), Some(disposition), Some(rationale), Some(origin)) => {
                out.push(Assessment {
                    requirement_id,
                    disposition,
                    rationale,
                    origin,
                });
            }
            _ => {
                return Err(bad(
                    "Every impact entry needs a non-blank requirement_id, disposition, rationale and origin.",
                ));
            }
        }
    }
    Ok(out)
}

/// `change-set update`.
pub fn update(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let id = required_cs(opts)?;
    let fields = [
        "intent",
        "affected-interface",
        "affected-scope",
        "base-commit",
        "implementation-required",
        "implementation-rationale",
        "impact-file",
    ];
    if !fields.iter().any(|f| opts.has(f)) {
        return Err(Failure::usage("Give at least one field to update."));
    }
    let implementation_required = opts.boolean("implementation-required")?;
    let impact_bytes = match opts.get("impact-file") {
        Some(spec) => Some(read_input(spec, env)?),
        None => None,
    };
    let session = Session::open(env.cwd, env.faults)?;
    let before = session.writable_change_set(&id)?;
    let mut after = before.clone();
    if let Some(x) = opts.get("base-commit") {
        let new_base = session.base_oid(x)?;
        let head = session.head.ok_or_else(|| {
            Failure::new(
                Exit::Conflict,
                "change_set.base_mismatch",
                "HEAD has no commit.",
            )
        })?;
        let old = session.base_oid(&before.base_commit)?;
        if !session.git.is_ancestor(new_base, head)? || !session.git.is_ancestor(old, new_base)? {
            return Err(Failure::new(
                Exit::Conflict,
                "change_set.base_mismatch",
                "The new base must be an ancestor of HEAD and a descendant of the recorded base; merge the default branch first.",
            ));
        }
        after.base_commit = x.to_ascii_lowercase();
    }
    if let Some(v) = opts.get("intent") {
        after.intent = v.trim().to_owned();
    }
    if opts.has("affected-interface") {
        after.affected_interfaces = Some(opts.list("affected-interface"));
    }
    if opts.has("affected-scope") {
        after.affected_scopes = opts.list("affected-scope");
    }
    if let Some(b) = implementation_required {
        after.implementation_required = Some(b);
    }
    if let Some(v) = opts.get("implementation-rationale") {
        after.implementation_rationale = v.trim().to_owned();
    }
    if let Some(bytes) = &impact_bytes {
        after.impact_assessment = parse_impact_file(bytes)?;
        after.impact_assessment_base_commit = after.base_commit.clone();
    }
    after.canonicalize();
    let manifest_path = session.snap.change_set_path(&id);
    let staged = Staged {
        writes: vec![(
            manifest_path,
            yaml::emit_managed(&after.to_node()).into_bytes(),
        )],
        project: session.snap.project.clone(),
        projection: None,
    };
    let scope = Scope {
        proposed: BTreeSet::from([id.clone()]),
        impact_only: None,
    };
    let allow_draft = impact_bytes.is_none();
    let (_, staged_snap) = session.stage(
        Staged {
            writes: staged.writes.clone(),
            project: staged.project.clone(),
            projection: None,
        },
        &scope,
        allow_draft,
    )?;
    let before_status =
        impact::status(&before, session.snap.requirements.iter().map(|r| &r.record));
    let after_status = impact::status(&after, staged_snap.requirements.iter().map(|r| &r.record));
    let paths = session.finish(staged, &scope, allow_draft)?;
    let mut changed = paths.clone();
    changed.sort();
    let with = impact_bytes.is_some();
    let data = Node::map()
        .with("change_set_id", Node::s(&id))
        .with("before", summary(&before, opts, before_status, false))
        .with("after", summary(&after, opts, after_status, with))
        .with("assessment_status", Node::s(after_status.as_str()))
        .with("changed_paths", Node::strs(changed));
    let _ = fsio::Faults::default();
    Ok(Success { data, paths })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_impact_file_is_an_array_or_the_impact_output_with_dispositions_filled_in() {
        let array = br#"[{"requirement_id":"REQ-CLI-00001","disposition":"applicable","rationale":"r","origin":"mechanical"}]"#;
        assert_eq!(parse_impact_file(array).map(|a| a.len()).ok(), Some(1));
        let output = br#"{"ok":true,"data":{"change_set_id":"CS-00002","candidates":[
            {"requirement_id":"REQ-CLI-00001","origin":"mechanical","matched_by":["scope:cli"],
             "recommended_disposition":"applicable","recorded_disposition":null,"rationale":"the total moves",
             "disposition":"not-applicable"}]}}"#;
        let parsed = parse_impact_file(output).unwrap_or_else(|f| panic!("{}", f.message));
        assert_eq!(parsed[0].disposition, "not-applicable");
        assert_eq!(parsed[0].rationale, "the total moves");
        let unfilled = br#"{"candidates":[{"requirement_id":"REQ-CLI-00001","origin":"mechanical","recorded_disposition":null,"rationale":null}]}"#;
        let err = parse_impact_file(unfilled).unwrap_err();
        assert_eq!(err.code, "change_set.invalid_impact");
        assert!(
            err.message.contains("REQ-CLI-00001 has no disposition"),
            "{}",
            err.message
        );
        for bad in [&b"{}"[..], b"3", b"not json"] {
            assert!(
                parse_impact_file(bad)
                    .unwrap_err()
                    .message
                    .contains("ears-manager --output json impact")
            );
        }
    }
}
