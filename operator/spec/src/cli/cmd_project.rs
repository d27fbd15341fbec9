//! `project init` (§17, EM-06): registers Vision and Architecture, writes
//! `project.yaml` and `projection.yaml` in one transaction. Touches neither
//! the index nor history.

use std::{collections::BTreeMap, fs, path::Path};

use super::{Env, Success, args::Opts};
use crate::{
    diag::Diagnostic,
    digest,
    fsio::{self, Faults},
    git::Git,
    model::{
        Artifact, Project, ProjectMeta, RepositoryMeta, SchemaVersions, StoreKind, StoreTriple,
    },
    node::Node,
    outcome::{Exit, Failure},
    projection,
    rules::{self, RemoteCheck},
    vfs::{DirState, FileState, PROJECT_YAML, PROJECTION_YAML, Vfs},
    yaml,
};

fn invalid_path(field: &str, message: &str) -> Failure {
    Failure::new(
        Exit::Validation,
        "project.invalid_path",
        "A selected project path is not usable.",
    )
    .with_diagnostics(vec![
        Diagnostic::new("project.invalid_path", message)
            .field(field)
            .hint("Select a committed, unmodified regular file."),
    ])
}

/// [`invalid_path`] for a named project file (the diagnostic points at it).
fn invalid_path_at(field: &str, message: &str, path: &str) -> Failure {
    Failure::new(
        Exit::Validation,
        "project.invalid_path",
        "A selected project path is not usable.",
    )
    .with_diagnostics(vec![
        Diagnostic::new("project.invalid_path", message)
            .at(path)
            .field(field)
            .hint("Select a committed, unmodified regular file."),
    ])
}

/// `project init`.
pub fn init(opts: &Opts, env: &mut Env<'_>) -> Result<Success, Failure> {
    let id = opts.required("id")?;
    let name = opts.required("name")?;
    let remote = opts.required("canonical-remote")?;
    let review_mode = opts.required("review-mode")?;
    let default_branch = opts
        .get("default-branch")
        .unwrap_or("main")
        .trim()
        .to_owned();
    let prefix = opts.get("branch-prefix").unwrap_or("cs/").trim().to_owned();
    let vision = opts
        .get("vision")
        .unwrap_or("docs/vision.md")
        .trim()
        .to_owned();
    let architecture = opts
        .get("architecture")
        .unwrap_or("docs/architecture.md")
        .trim()
        .to_owned();

    let git = Git::discover(env.cwd)?;
    let root = git.root.clone();
    if fs::symlink_metadata(root.join(".protobot")).is_ok() {
        return Err(Failure::new(
            Exit::Conflict,
            "project.already_initialized",
            "This repository already has a .protobot entry; it is initialized.",
        )
        .with_diagnostics(vec![
            Diagnostic::new(
                "project.already_initialized",
                "Something named .protobot already exists.",
            )
            .at(".protobot"),
        ]));
    }
    let cwd = env
        .cwd
        .canonicalize()
        .unwrap_or_else(|_| env.cwd.to_path_buf());
    let mut dir = cwd.as_path();
    while dir != root && dir.starts_with(&root) {
        if dir.join(".protobot/project.yaml").exists() {
            let rel = dir
                .strip_prefix(&root)
                .map(|p| p.to_string_lossy().replace('\\', "/"))
                .unwrap_or_default();
            return Err(Failure::new(
                Exit::Project,
                "project.not_git_root",
                "A project file exists below the Git root; initialize at the working-tree root.",
            )
            .with_diagnostics(vec![
                Diagnostic::new(
                    "project.not_git_root",
                    "A misplaced project configuration was found.",
                )
                .at(format!("{rel}/.protobot/project.yaml")),
            ]));
        }
        match dir.parent() {
            Some(p) => dir = p,
            None => break,
        }
    }
    let Some(head) = git.head() else {
        return Err(Failure::new(
            Exit::Project,
            "project.invalid_configuration",
            "HEAD has no commit; write the Vision (docs/vision.md) and the Architecture (docs/architecture.md), commit them, then run project init.",
        ));
    };
    if vision.eq_ignore_ascii_case(&architecture) {
        return Err(invalid_path(
            "architecture",
            "Vision and Architecture must be different files.",
        ));
    }
    let mut contents = BTreeMap::new();
    for (field, path) in [("vision", &vision), ("architecture", &architecture)] {
        if !rules::is_canonical_path(path) || rules::is_reserved_artifact_path(path) {
            return Err(invalid_path(
                field,
                "The path is not a canonical, unreserved project path.",
            ));
        }
        let bytes = match fsio::read_file(&root, path) {
            FileState::Bytes(b) => b,
            FileState::Absent => {
                return Err(invalid_path_at(
                    field,
                    &format!(
                        "{path} does not exist: project init needs the project's {} there, committed (write it and commit it, or pass --{field} PATH).",
                        if field == "vision" {
                            "Vision"
                        } else {
                            "Architecture"
                        }
                    ),
                    path,
                ));
            }
            _ => {
                return Err(invalid_path_at(
                    field,
                    &format!("{path} is not a regular file reached without symlinks."),
                    path,
                ));
            }
        };
        if !committed_unmodified(&git, head, path, &bytes) {
            return Err(invalid_path_at(
                field,
                &format!(
                    "{path} must be committed at HEAD and unmodified: `git add {path} && git commit`."
                ),
                path,
            ));
        }
        if let Err(e) = digest::canonical_text(&bytes) {
            return Err(Failure::new(
                Exit::Validation,
                "project.invalid_configuration",
                "A selected file is not canonical text.",
            )
            .with_diagnostics(vec![
                Diagnostic::new("artifact.invalid_content", e.to_string())
                    .at(path.clone())
                    .field(field),
            ]));
        }
        contents.insert(field, bytes);
    }
    let request_invalid = |field: &str, msg: &str| {
        Failure::new(
            Exit::Validation,
            "project.invalid_configuration",
            "The requested configuration is not valid.",
        )
        .with_diagnostics(vec![
            Diagnostic::new("project.invalid_configuration", msg).field(field),
        ])
    };
    match rules::check_remote(&remote) {
        RemoteCheck::Ok => {}
        RemoteCheck::Credentials => {
            return Err(Failure::new(
                Exit::Validation,
                "project.remote_credentials",
                "The canonical remote must not carry credentials; remove the user information.",
            ));
        }
        RemoteCheck::Invalid => {
            return Err(request_invalid(
                "repository.canonical_remote",
                "The canonical remote must be an https://, ssh:// or git@host:path URL.",
            ));
        }
    }
    if !matches!(review_mode.as_str(), "single-player" | "multi-player") {
        return Err(request_invalid(
            "repository.review_mode",
            "The review mode must be single-player or multi-player.",
        ));
    }
    if !rules::is_valid_branch_prefix(&prefix) {
        return Err(request_invalid(
            "repository.branch_prefix",
            "The branch prefix must be a valid ref name ending in '/' and not under 'wi/'.",
        ));
    }
    if !rules::is_valid_branch_name(&default_branch) {
        return Err(request_invalid(
            "repository.default_branch",
            "The default branch is not a valid branch name.",
        ));
    }
    if git.local_branch(&default_branch).is_none() {
        return Err(Failure::new(
            Exit::Project,
            "project.invalid_configuration",
            "The default branch does not resolve to a commit; create it first.",
        ));
    }

    let mut stores = StoreTriple::default();
    let mut digests = StoreTriple::default();
    let mut observed = Vfs {
        protobot_is_dir: false,
        project_yaml: FileState::Absent,
        projection_yaml: FileState::Absent,
        stores: BTreeMap::new(),
        artifacts: BTreeMap::new(),
    };
    for kind in StoreKind::ALL {
        stores.set(kind, kind.default_dir().to_owned());
        observed
            .stores
            .insert(kind.default_dir().to_owned(), DirState::Absent);
        digests.set(kind, digest::EMPTY_STORE.to_owned());
    }
    let artifact = |id: &str, path: &str, field: &str| Artifact {
        id: id.to_owned(),
        kind: id.to_owned(),
        path: path.to_owned(),
        digest: contents
            .get(field)
            .and_then(|b| digest::text_digest(b).ok())
            .unwrap_or_default(),
        owner: "user".to_owned(),
        validator: String::new(),
    };
    let mut project = Project {
        project: Some(ProjectMeta {
            id: id.clone(),
            name: name.clone(),
        }),
        repository: Some(RepositoryMeta {
            canonical_remote: Some(remote.clone()),
            default_branch: Some(default_branch.clone()),
            review_mode: Some(review_mode.clone()),
            branch_prefix: Some(prefix.clone()),
        }),
        schema_versions: Some(SchemaVersions {
            specification: Some(1),
            project: Some(1),
        }),
        stores: Some(stores),
        store_digests: Some(digests.clone()),
        artifacts: vec![
            artifact("architecture", &architecture, "architecture"),
            artifact("vision", &vision, "vision"),
        ],
    };
    project.canonicalize();
    let mut registered: Vec<String> = vec![architecture.clone(), vision.clone()];
    registered.sort();
    let mut shared = registered.clone();
    for kind in StoreKind::ALL {
        shared.push(format!("{}/", kind.default_dir()));
    }
    let writes = vec![
        (
            PROJECT_YAML.to_owned(),
            yaml::emit_managed(&project.to_node()).into_bytes(),
        ),
        (
            PROJECTION_YAML.to_owned(),
            projection::initial(&shared).into_bytes(),
        ),
    ];
    fsio::commit(&root, &writes, &observed, env.faults, || Ok(()))?;
    let _ = Faults::default();

    let digest_node = |t: &StoreTriple| {
        let mut n = Node::map();
        for kind in StoreKind::ALL {
            n = n.with(
                kind.key(),
                Node::s(t.get(kind).cloned().unwrap_or_default()),
            );
        }
        n
    };
    let data = Node::map()
        .with(
            "project",
            Node::map()
                .with("id", Node::s(id))
                .with("name", Node::s(name))
                .with("canonical_remote", Node::s(remote))
                .with("default_branch", Node::s(default_branch))
                .with("review_mode", Node::s(review_mode))
                .with("branch_prefix", Node::s(prefix))
                .with(
                    "schema_versions",
                    Node::map()
                        .with("specification", Node::Int(1))
                        .with("project", Node::Int(1)),
                )
                .with(
                    "stores",
                    digest_node(project.stores.as_ref().unwrap_or(&StoreTriple::default())),
                )
                .with("store_digests", digest_node(&digests)),
        )
        .with("registered_paths", Node::strs(registered));
    Ok(Success {
        data,
        paths: writes.into_iter().map(|(p, _)| p).collect(),
    })
}

fn committed_unmodified(git: &Git, head: git2::Oid, path: &str, bytes: &[u8]) -> bool {
    let Ok(commit) = git.repo.find_commit(head) else {
        return false;
    };
    let Ok(tree) = commit.tree() else {
        return false;
    };
    let Ok(entry) = tree.get_path(Path::new(path)) else {
        return false;
    };
    git.repo
        .find_blob(entry.id())
        .is_ok_and(|b| b.content() == bytes)
}
