//! Requirement and interface commands (§17): add, list, show, and the
//! requirement update / retire operations with their operation-merge rules
//! and symmetric inverse relationships (§13).

use std::collections::{BTreeMap, BTreeSet};

use super::{
    Env, Success,
    args::Opts,
    session::{Session, Staged},
};
use crate::{
    ears, ids,
    model::{
        AppliesTo, ChangeSet, INTERFACE_TYPES, Interface, InterfaceOp, RELATIONSHIP_TYPES,
        Relationship, Requirement, RequirementOp, Verification, is_symmetric,
    },
    node::Node,
    outcome::{Exit, Failure},
    validate::Scope,
    yaml,
};

fn req_not_found(id: &str) -> Failure {
    Failure::new(
        Exit::Validation,
        "requirement.not_found",
        format!("Requirement {id} was not found."),
    )
}

/// Operation merge table of §17.
fn merge(existing: Option<&str>, new: &str) -> Result<String, Failure> {
    match (existing, new) {
        (None, n) => Ok(n.to_owned()),
        (Some("add"), "revise") => Ok("add".to_owned()),
        (Some(e), n) if e == n => Ok(e.to_owned()),
        (Some("revise" | "add"), "retire") => Ok("retire".to_owned()),
        _ => Err(Failure::new(
            Exit::Conflict,
            "change_set.duplicate_operation",
            "The requirement already has a conflicting operation in this change set; use a new change set.",
        )),
    }
}

fn set_op(cs: &mut ChangeSet, id: &str, action: &str) -> Result<String, Failure> {
    let ops = cs.operations.get_or_insert_with(Vec::new);
    let existing = ops.iter().position(|o| o.requirement_id == id);
    let merged = merge(existing.map(|i| ops[i].action.as_str()), action)?;
    match existing {
        Some(i) => ops[i].action = merged.clone(),
        None => ops.push(RequirementOp {
            action: merged.clone(),
            requirement_id: id.to_owned(),
            rationale: String::new(),
        }),
    }
    Ok(merged)
}

fn parse_relationships(values: &[String]) -> Result<Vec<Relationship>, Failure> {
    values
        .iter()
        .map(|v| match v.find('=') {
            Some(i) if i > 0 && i + 1 < v.len() => Ok(Relationship {
                kind: v[..i].to_owned(),
                target: v[i + 1..].to_owned(),
            }),
            _ => Err(Failure::usage("--relationship takes TYPE=REQ-ID.")),
        })
        .collect()
}

fn canonical(r: &Requirement) -> Requirement {
    let mut r = r.clone();
    r.canonicalize();
    r
}

/// Writes for symmetric inverses: targets whose relationship lists change
/// because `id`'s symmetric links went from `old` to `new`.
fn inverse_writes(
    session: &Session,
    cs: &mut ChangeSet,
    id: &str,
    old: &[Relationship],
    new: &[Relationship],
) -> Result<Vec<(String, Vec<u8>)>, Failure> {
    let sym = |rels: &[Relationship]| -> BTreeSet<(String, String)> {
        rels.iter()
            .filter(|r| is_symmetric(&r.kind))
            .map(|r| (r.kind.clone(), r.target.clone()))
            .collect()
    };
    let (before, after) = (sym(old), sym(new));
    let mut targets: BTreeMap<String, Requirement> = BTreeMap::new();
    for (kind, target) in before.symmetric_difference(&after) {
        let Some(rec) = session.snap.requirement(target) else {
            continue;
        };
        if target == id {
            continue;
        }
        let t = targets
            .entry(target.clone())
            .or_insert_with(|| rec.record.clone());
        let inverse = Relationship {
            kind: kind.clone(),
            target: id.to_owned(),
        };
        if after.contains(&(kind.clone(), target.clone())) {
            if !t.relationships.contains(&inverse) {
                t.relationships.push(inverse);
            }
        } else {
            t.relationships.retain(|r| r != &inverse);
        }
    }
    let mut writes = Vec::new();
    for (tid, mut t) in targets {
        t.canonicalize();
        set_op(cs, &tid, "revise")?;
        writes.push((
            session.snap.requirement_path(&tid),
            yaml::emit_managed(&t.to_node()).into_bytes(),
        ));
    }
    Ok(writes)
}

fn op_node(action: &str, key: &str, id: &str) -> Node {
    Node::map()
        .with("action", Node::s(action))
        .with(key, Node::s(id))
}

/// `requirement add`.
pub fn requirement_add(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let cs_id = opts.required("change-set")?;
    let id = opts.required("id")?;
    let kind = opts.required("type")?;
    let text = opts.required("text")?;
    let mode = opts.required("verification-mode")?;
    let provenance = opts.required("provenance")?;
    let created = opts.created_or_now()?;
    let rationale = opts
        .get("verification-rationale")
        .map(str::trim)
        .unwrap_or("")
        .to_owned();
    let relationships = parse_relationships(&opts.list("relationship"))?;
    if !ids::is_requirement_id(&id) {
        return Err(Failure::new(
            Exit::Validation,
            "requirement.invalid_id",
            "The requirement ID must look like REQ-<SCOPE>-<NNNNN>.",
        ));
    }
    let session = Session::open(env.cwd, env.faults)?;
    if session.snap.requirement(&id).is_some() {
        return Err(Failure::new(
            Exit::Conflict,
            "requirement.duplicate_id",
            format!("Requirement {id} already exists; choose another ID."),
        ));
    }
    let mut cs = session.writable_change_set(&cs_id)?;
    let action = set_op(&mut cs, &id, "add")?;
    let req = canonical(&Requirement {
        id: id.clone(),
        kind,
        text,
        applies_to: Some(AppliesTo {
            interfaces: opts.list("interface"),
            scopes: opts.list("scope"),
        }),
        verification: Some(Verification { mode, rationale }),
        provenance,
        created,
        relationships: relationships.clone(),
        status: String::new(),
    });
    let mut writes = vec![(
        session.snap.requirement_path(&id),
        yaml::emit_managed(&req.to_node()).into_bytes(),
    )];
    writes.extend(inverse_writes(&session, &mut cs, &id, &[], &relationships)?);
    cs.canonicalize();
    writes.push((
        session.snap.change_set_path(&cs_id),
        yaml::emit_managed(&cs.to_node()).into_bytes(),
    ));
    let staged = Staged {
        writes,
        project: session.snap.project.clone(),
        projection: None,
    };
    let scope = Scope {
        proposed: BTreeSet::from([cs_id]),
        impact_only: None,
    };
    let paths = session.finish(staged, &scope, true)?;
    let data = Node::map()
        .with("requirement", req.to_node())
        .with("operation", op_node(&action, "requirement_id", &id));
    Ok(Success { data, paths })
}

/// `requirement update`.
pub fn requirement_update(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let cs_id = opts.required("change-set")?;
    let id = opts.required("id")?;
    if opts.has("created") || opts.has("new-id") {
        return Err(Failure::new(
            Exit::Validation,
            "requirement.immutable_field",
            "The requirement ID and creation time cannot change; retire it and add a new one instead.",
        ));
    }
    let fields = [
        "type",
        "text",
        "interface",
        "scope",
        "verification-mode",
        "verification-rationale",
        "provenance",
        "relationship",
        "status",
    ];
    if !fields.iter().any(|f| opts.has(f)) {
        return Err(Failure::usage("Give at least one field to update."));
    }
    let relationships = if opts.has("relationship") {
        Some(parse_relationships(&opts.list("relationship"))?)
    } else {
        None
    };
    let session = Session::open(env.cwd, env.faults)?;
    let before = session
        .snap
        .requirement(&id)
        .ok_or_else(|| req_not_found(&id))?
        .record
        .clone();
    match (opts.get("status"), before.status()) {
        (Some("retired"), "active") => {
            return Err(Failure::new(
                Exit::Validation,
                "requirement.use_retire",
                "Retire a requirement with 'requirement retire'.",
            ));
        }
        (Some("active"), "retired") => {
            return Err(Failure::new(
                Exit::Conflict,
                "requirement.already_retired",
                "A retired requirement cannot be reactivated; add a new one.",
            ));
        }
        _ => {}
    }
    let mut cs = session.writable_change_set(&cs_id)?;
    let mut after = before.clone();
    if let Some(v) = opts.get("type") {
        after.kind = v.trim().to_owned();
    }
    if let Some(v) = opts.get("text") {
        after.text = v.trim().to_owned();
    }
    let applies = after.applies_to.get_or_insert_with(AppliesTo::default);
    if opts.has("interface") {
        applies.interfaces = opts.list("interface");
    }
    if opts.has("scope") {
        applies.scopes = opts.list("scope");
    }
    let verification = after.verification.get_or_insert_with(Verification::default);
    if let Some(v) = opts.get("verification-mode") {
        verification.mode = v.trim().to_owned();
    }
    if let Some(v) = opts.get("verification-rationale") {
        verification.rationale = v.trim().to_owned();
    }
    if let Some(v) = opts.get("provenance") {
        after.provenance = v.trim().to_owned();
    }
    if let Some(v) = opts.get("status") {
        after.status = v.trim().to_owned();
    }
    if let Some(r) = &relationships {
        after.relationships = r.clone();
    }
    after.canonicalize();
    let action = set_op(&mut cs, &id, "revise")?;
    let mut writes = vec![(
        session.snap.requirement_path(&id),
        yaml::emit_managed(&after.to_node()).into_bytes(),
    )];
    writes.extend(inverse_writes(
        &session,
        &mut cs,
        &id,
        &before.relationships,
        &after.relationships,
    )?);
    cs.canonicalize();
    writes.push((
        session.snap.change_set_path(&cs_id),
        yaml::emit_managed(&cs.to_node()).into_bytes(),
    ));
    let staged = Staged {
        writes,
        project: session.snap.project.clone(),
        projection: None,
    };
    let scope = Scope {
        proposed: BTreeSet::from([cs_id]),
        impact_only: None,
    };
    let paths = session.finish(staged, &scope, true)?;
    let data = Node::map()
        .with("before", canonical(&before).to_node())
        .with("after", after.to_node())
        .with("operation", op_node(&action, "requirement_id", &id));
    Ok(Success { data, paths })
}

/// `requirement retire`.
pub fn requirement_retire(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let cs_id = opts.required("change-set")?;
    let id = opts.required("id")?;
    let session = Session::open(env.cwd, env.faults)?;
    let before = session
        .snap
        .requirement(&id)
        .ok_or_else(|| req_not_found(&id))?
        .record
        .clone();
    if before.status() == "retired" {
        return Err(Failure::new(
            Exit::Conflict,
            "requirement.already_retired",
            format!("Requirement {id} is already retired."),
        ));
    }
    let mut cs = session.writable_change_set(&cs_id)?;
    let mut after = canonical(&before);
    after.status = "retired".to_owned();
    let action = set_op(&mut cs, &id, "retire")?;
    cs.canonicalize();
    let writes = vec![
        (
            session.snap.requirement_path(&id),
            yaml::emit_managed(&after.to_node()).into_bytes(),
        ),
        (
            session.snap.change_set_path(&cs_id),
            yaml::emit_managed(&cs.to_node()).into_bytes(),
        ),
    ];
    let staged = Staged {
        writes,
        project: session.snap.project.clone(),
        projection: None,
    };
    let scope = Scope {
        proposed: BTreeSet::from([cs_id]),
        impact_only: None,
    };
    let paths = session.finish(staged, &scope, true)?;
    let data = Node::map()
        .with("before", canonical(&before).to_node())
        .with("after", after.to_node())
        .with("operation", op_node(&action, "requirement_id", &id));
    Ok(Success { data, paths })
}

/// `requirement list`.
pub fn requirement_list(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let f = |k: &str| opts.get(k).map(|s| s.trim().to_owned());
    let (iface, scope, kind, status, rel) = (
        f("interface"),
        f("scope"),
        f("type"),
        f("status"),
        f("relationship"),
    );
    if iface.as_ref().is_some_and(|i| !ids::is_kebab_id(i)) {
        return Err(Failure::new(
            Exit::Validation,
            "interface.invalid_id",
            "The interface filter is not a valid interface ID.",
        ));
    }
    if kind
        .as_ref()
        .is_some_and(|k| !ears::TYPES.contains(&k.as_str()))
    {
        return Err(Failure::new(
            Exit::Validation,
            "requirement.invalid_type",
            "The type filter is not a supported EARS pattern.",
        ));
    }
    if status
        .as_ref()
        .is_some_and(|s| s != "active" && s != "retired")
    {
        return Err(Failure::new(
            Exit::Validation,
            "requirement.invalid_status",
            "The status filter must be active or retired.",
        ));
    }
    if rel
        .as_ref()
        .is_some_and(|r| !RELATIONSHIP_TYPES.contains(&r.as_str()))
    {
        return Err(Failure::new(
            Exit::Validation,
            "relationship.invalid_type",
            "The relationship filter is not a supported relationship type.",
        ));
    }
    let snap = super::session::read_snapshot(opts.get("at"), env)?;
    let mut reqs: Vec<Requirement> = snap
        .requirements
        .iter()
        .map(|r| canonical(&r.record))
        .collect();
    reqs.sort_by(|a, b| a.id.cmp(&b.id));
    let items = reqs
        .iter()
        .filter(|r| {
            iface.as_ref().is_none_or(|i| r.interfaces().contains(i))
                && scope.as_ref().is_none_or(|s| r.scopes().contains(s))
                && kind.as_ref().is_none_or(|k| &r.kind == k)
                && status.as_ref().is_none_or(|s| r.status() == s)
                && rel
                    .as_ref()
                    .is_none_or(|t| r.relationships.iter().any(|x| &x.kind == t))
        })
        .map(Requirement::to_node)
        .collect();
    Ok(Success::read(
        Node::map().with("requirements", Node::List(items)),
    ))
}

/// `requirement show`.
pub fn requirement_show(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let id = opts.required("id")?;
    let snap = super::session::read_snapshot(opts.get("at"), env)?;
    let rec = snap.requirement(&id).ok_or_else(|| req_not_found(&id))?;
    Ok(Success::read(
        Node::map().with("requirement", canonical(&rec.record).to_node()),
    ))
}

/// `interface add`.
pub fn interface_add(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let cs_id = opts.required("change-set")?;
    let id = opts.required("id")?;
    let name = opts.required("name")?;
    let kind = opts.required("type")?;
    let created = opts.created_or_now()?;
    if !ids::is_kebab_id(&id) {
        return Err(Failure::new(
            Exit::Validation,
            "interface.invalid_id",
            "The interface ID must be lowercase kebab-case.",
        ));
    }
    let session = Session::open(env.cwd, env.faults)?;
    if session.snap.interface(&id).is_some() {
        return Err(Failure::new(
            Exit::Conflict,
            "interface.duplicate_id",
            format!("Interface {id} already exists; choose another ID."),
        ));
    }
    let mut cs = session.writable_change_set(&cs_id)?;
    if cs.interface_operations.iter().any(|o| o.interface_id == id) {
        return Err(Failure::new(
            Exit::Conflict,
            "change_set.duplicate_operation",
            "The interface already has an operation in this change set.",
        ));
    }
    cs.interface_operations.push(InterfaceOp {
        action: "add".to_owned(),
        interface_id: id.clone(),
        rationale: String::new(),
    });
    cs.canonicalize();
    let mut iface = Interface {
        id: id.clone(),
        name,
        kind,
        spec_approach: opts
            .get("spec-approach")
            .map(str::trim)
            .unwrap_or("")
            .to_owned(),
        description: opts
            .get("description")
            .map(str::trim)
            .unwrap_or("")
            .to_owned(),
        created,
        status: String::new(),
    };
    iface.canonicalize();
    let writes = vec![
        (
            session.snap.interface_path(&id),
            yaml::emit_managed(&iface.to_node()).into_bytes(),
        ),
        (
            session.snap.change_set_path(&cs_id),
            yaml::emit_managed(&cs.to_node()).into_bytes(),
        ),
    ];
    let staged = Staged {
        writes,
        project: session.snap.project.clone(),
        projection: None,
    };
    let scope = Scope {
        proposed: BTreeSet::from([cs_id]),
        impact_only: None,
    };
    let paths = session.finish(staged, &scope, true)?;
    let data = Node::map()
        .with("interface", iface.to_node())
        .with("operation", op_node("add", "interface_id", &id));
    Ok(Success { data, paths })
}

/// `interface list`.
pub fn interface_list(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let kind = opts.get("type").map(|s| s.trim().to_owned());
    let status = opts.get("status").map(|s| s.trim().to_owned());
    if kind
        .as_ref()
        .is_some_and(|k| !INTERFACE_TYPES.contains(&k.as_str()))
    {
        return Err(Failure::new(
            Exit::Validation,
            "interface.invalid_type",
            "The type filter is not a supported interface type.",
        ));
    }
    if status
        .as_ref()
        .is_some_and(|s| s != "active" && s != "retired")
    {
        return Err(Failure::new(
            Exit::Validation,
            "interface.invalid_status",
            "The status filter must be active or retired.",
        ));
    }
    let snap = super::session::read_snapshot(opts.get("at"), env)?;
    let mut items: Vec<Interface> = snap
        .interfaces
        .iter()
        .map(|r| {
            let mut i = r.record.clone();
            i.canonicalize();
            i
        })
        .filter(|i| {
            kind.as_ref().is_none_or(|k| &i.kind == k)
                && status.as_ref().is_none_or(|s| &i.status == s)
        })
        .collect();
    items.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(Success::read(Node::map().with(
        "interfaces",
        Node::List(items.iter().map(Interface::to_node).collect()),
    )))
}

/// `interface show`.
pub fn interface_show(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let id = opts.required("id")?;
    let snap = super::session::read_snapshot(opts.get("at"), env)?;
    let rec = snap.interface(&id).ok_or_else(|| {
        Failure::new(
            Exit::Validation,
            "interface.not_found",
            format!("Interface {id} was not found."),
        )
    })?;
    let mut i = rec.record.clone();
    i.canonicalize();
    Ok(Success::read(Node::map().with("interface", i.to_node())))
}

/// `interface update` (target-only in the contract; the issue asks for it).
/// `--id` and `--created` cannot change (`interface.immutable_field`).
/// Retiring is `--status retired`, recorded as a `revise` operation (§10).
pub fn interface_update(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let cs_id = opts.required("change-set")?;
    let id = opts.required("id")?;
    if opts.has("created") || opts.has("new-id") {
        return Err(Failure::new(
            Exit::Validation,
            "interface.immutable_field",
            "The interface ID and creation time cannot change; add a new interface instead.",
        ));
    }
    let fields = ["name", "type", "spec-approach", "description", "status"];
    if !fields.iter().any(|f| opts.has(f)) {
        return Err(Failure::usage("Give at least one field to update."));
    }
    if !ids::is_kebab_id(&id) {
        return Err(Failure::new(
            Exit::Validation,
            "interface.invalid_id",
            "The interface ID must be lowercase kebab-case.",
        ));
    }
    let session = Session::open(env.cwd, env.faults)?;
    let before = session
        .snap
        .interface(&id)
        .ok_or_else(|| {
            Failure::new(
                Exit::Validation,
                "interface.not_found",
                format!("Interface {id} was not found."),
            )
        })?
        .record
        .clone();
    let mut cs = session.writable_change_set(&cs_id)?;
    let mut after = before.clone();
    let set = |slot: &mut String, key: &str| {
        if let Some(v) = opts.get(key) {
            *slot = v.trim().to_owned();
        }
    };
    set(&mut after.name, "name");
    set(&mut after.kind, "type");
    set(&mut after.spec_approach, "spec-approach");
    set(&mut after.description, "description");
    set(&mut after.status, "status");
    after.canonicalize();
    let action = match cs
        .interface_operations
        .iter()
        .find(|o| o.interface_id == id)
    {
        Some(o) => o.action.clone(),
        None => {
            cs.interface_operations.push(InterfaceOp {
                action: "revise".to_owned(),
                interface_id: id.clone(),
                rationale: String::new(),
            });
            "revise".to_owned()
        }
    };
    cs.canonicalize();
    let writes = vec![
        (
            session.snap.interface_path(&id),
            yaml::emit_managed(&after.to_node()).into_bytes(),
        ),
        (
            session.snap.change_set_path(&cs_id),
            yaml::emit_managed(&cs.to_node()).into_bytes(),
        ),
    ];
    let staged = Staged {
        writes,
        project: session.snap.project.clone(),
        projection: None,
    };
    let scope = Scope {
        proposed: BTreeSet::from([cs_id]),
        impact_only: None,
    };
    let paths = session.finish(staged, &scope, true)?;
    let mut before = before;
    before.canonicalize();
    let data = Node::map()
        .with("before", before.to_node())
        .with("after", after.to_node())
        .with("operation", op_node(&action, "interface_id", &id));
    Ok(Success { data, paths })
}
