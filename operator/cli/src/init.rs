//! `protobot init`: prepares a repository for the Job Site.
//!
//! Pipeline: read the work tree's top level (shell) → [`plan`] (pure: which
//! paths get which projection class, what stays unclassified) → write: the
//! Vision and Architecture ears-manager needs (templates, committed, only when
//! missing), `ears-manager project init` (in process, unless the project
//! exists), the planned entries appended to `.protobot/projection.yaml`, an
//! empty `.protobot/test-catalog.jsonl` → print what to review.
//!
//! Without the `implementation` and `test` entries every Worker patch is
//! refused (unclassified paths are denied to every role), so `init` always
//! leaves one of each: the layout it recognized (`src/`+`tests/`,
//! `lib/`+`test/`, Go's `cmd/`/`internal/`/`pkg/` with `*_test.go` files,
//! a Python package + `tests/`), or `src/` and `tests/` in a repository with
//! no code yet. It commits only the templates it wrote itself; the policy is
//! yours to review and commit.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use clap::Args;
use protobot_repo::manifest::ProjectionManifest;

use crate::demo::Output;

const VISION: &str = "docs/vision.md";
const ARCHITECTURE: &str = "docs/architecture.md";
const PROJECTION: &str = ".protobot/projection.yaml";
const CATALOG: &str = ".protobot/test-catalog.jsonl";

/// Arguments of `protobot init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    /// The repository (a Git working tree; default: the current directory).
    #[arg(long, default_value = ".")]
    pub repo: PathBuf,
    /// The project id, e.g. `todo-cli` (lower case, digits and dashes).
    #[arg(long)]
    pub id: String,
    /// The project's display name (default: the id).
    #[arg(long)]
    pub name: Option<String>,
    /// The canonical remote recorded in project.yaml (an https://, ssh:// or
    /// git@host:path URL; default: `origin` when it is one, else a placeholder
    /// to review). A local repository (a path or file:// URL, as a local
    /// `origin` is) is accepted: project.yaml then records a placeholder,
    /// since it holds only network URLs, and `protobot run` lands on `origin`.
    #[arg(long)]
    pub canonical_remote: Option<String>,
    /// `single-player` or `multi-player`.
    #[arg(long, default_value = "single-player", value_parser = ["single-player", "multi-player"])]
    pub review_mode: String,
    /// The default branch (default: the branch checked out now, even if it has
    /// no commit yet).
    #[arg(long)]
    pub default_branch: Option<String>,
    /// `human` or `json`.
    #[arg(long, value_enum, default_value = "human")]
    pub output: Output,
}

/// One top-level entry of the work tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopEntry {
    /// Its name.
    pub name: String,
    /// A directory.
    pub is_dir: bool,
    /// A directory holding `__init__.py` (a Python package).
    pub python_package: bool,
}

/// One entry `init` adds to the projection policy.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Entry {
    /// `src/` (a directory) or a file path.
    pub path: String,
    /// The projection class.
    pub class: &'static str,
    /// Why, for the review list.
    pub why: &'static str,
}

/// What [`plan`] decided.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Plan {
    /// Entries to append.
    pub add: Vec<Entry>,
    /// Top-level paths left unclassified (denied to every role): review them.
    pub unclassified: Vec<String>,
    /// No code layout was found; `src/` and `tests/` were assumed.
    pub assumed_layout: bool,
}

const IMPLEMENTATION_DIRS: [&str; 6] = ["src", "lib", "app", "cmd", "internal", "pkg"];
const TEST_DIRS: [&str; 4] = ["tests", "test", "spec", "__tests__"];
const SHARED_FILES: [&str; 16] = [
    "README.md",
    "LICENSE",
    "Cargo.toml",
    "Cargo.lock",
    "go.mod",
    "go.sum",
    "package.json",
    "package-lock.json",
    "pyproject.toml",
    "setup.py",
    "setup.cfg",
    "requirements.txt",
    "Makefile",
    ".gitignore",
    "rustfmt.toml",
    "tsconfig.json",
];

/// Classifies the top level of a work tree. `go_tests` are the `*_test.go`
/// files found under implementation directories; `classified` says whether
/// the current policy already covers a path (those are left alone).
pub fn plan(top: &[TopEntry], go_tests: &[String], classified: &dyn Fn(&str) -> bool) -> Plan {
    let mut out = Plan::default();
    let push = |out: &mut Plan, path: String, class: &'static str, why: &'static str| {
        let probe = path.trim_end_matches('/').to_owned();
        if !classified(&probe) && !out.add.iter().any(|e| e.path == path) {
            out.add.push(Entry { path, class, why });
        }
    };
    let mut has_implementation = false;
    let mut has_tests = false;
    let mut entries: Vec<&TopEntry> = top.iter().collect();
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for e in entries {
        let name = e.name.as_str();
        if name == ".git" || name == ".protobot" {
            continue;
        }
        if e.is_dir && IMPLEMENTATION_DIRS.contains(&name) {
            has_implementation = true;
            push(
                &mut out,
                format!("{name}/"),
                "implementation",
                "source directory",
            );
        } else if e.is_dir && TEST_DIRS.contains(&name) {
            has_tests = true;
            push(&mut out, format!("{name}/"), "test", "test directory");
        } else if e.is_dir && e.python_package {
            has_implementation = true;
            push(
                &mut out,
                format!("{name}/"),
                "implementation",
                "Python package",
            );
        } else if e.is_dir && name == "docs" {
            push(&mut out, "docs/".into(), "shared", "documentation");
        } else if !e.is_dir && SHARED_FILES.contains(&name) {
            push(&mut out, name.to_owned(), "shared", "build or project file");
        } else if !classified(name) {
            out.unclassified.push(if e.is_dir {
                format!("{name}/")
            } else {
                name.to_owned()
            });
        }
    }
    for t in go_tests {
        has_tests = true;
        push(&mut out, t.clone(), "test", "Go test file");
    }
    if !has_implementation {
        out.assumed_layout = true;
        push(
            &mut out,
            "src/".into(),
            "implementation",
            "assumed: no source directory yet",
        );
    }
    if !has_tests {
        out.assumed_layout = true;
        push(
            &mut out,
            "tests/".into(),
            "test",
            "assumed: no test directory yet",
        );
    }
    push(&mut out, CATALOG.into(), "shared", "test catalog");
    out
}

/// The text appended to the policy for `entries`.
pub fn manifest_lines(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| format!("  - path: {}\n    class: {}\n", e.path, e.class))
        .collect()
}

#[derive(Debug, thiserror::Error)]
enum InitError {
    #[error("{0}")]
    Input(String),
    #[error("failed to {what}: {reason}")]
    Failed { what: String, reason: String },
}

fn io(what: &str, path: &Path) -> impl Fn(std::io::Error) -> InitError {
    let what = format!("{what} {}", path.display());
    move |e| InitError::Failed {
        what: what.clone(),
        reason: e.to_string(),
    }
}

fn git(repo: &Path, args: &[&str]) -> Result<String, InitError> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .output()
        .map_err(|e| InitError::Failed {
            what: format!("run git {}", args.join(" ")),
            reason: format!("{e} (is git installed? `sudo apt-get install -y git`)"),
        })?;
    if !out.status.success() {
        return Err(InitError::Failed {
            what: format!("run git {}", args.join(" ")),
            reason: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn template(path: &str, name: &str) -> String {
    if path == VISION {
        format!(
            "# Vision\n\n{name}: who it is for and what it must let them do. Edit this: the Drafting Table and ears-manager read it when you write requirements.\n"
        )
    } else {
        format!(
            "# Architecture\n\n{name}: the components, languages and interfaces, and where their code lives (`src/` for the implementation, `tests/` for tests unless .protobot/projection.yaml says otherwise).\n"
        )
    }
}

fn top_level(root: &Path) -> Result<Vec<TopEntry>, InitError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root).map_err(io("read", root))? {
        let entry = entry.map_err(io("read", root))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
        let python_package = is_dir && entry.path().join("__init__.py").is_file();
        out.push(TopEntry {
            name,
            is_dir,
            python_package,
        });
    }
    Ok(out)
}

/// `*_test.go` files under the Go source directories (bounded walk).
fn go_tests(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack: Vec<PathBuf> = ["cmd", "internal", "pkg"]
        .iter()
        .map(|d| root.join(d))
        .filter(|p| p.is_dir())
        .collect();
    let mut visited = 0;
    while let Some(dir) = stack.pop() {
        visited += 1;
        if visited > 10_000 {
            break;
        }
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in rd.flatten() {
            let path = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                stack.push(path);
            } else if path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().ends_with("_test.go"))
                && let Ok(rel) = path.strip_prefix(root)
            {
                found.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    found.sort();
    found
}

fn ears(root: &Path, args: &[&str]) -> Result<(), InitError> {
    let argv: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let mut stdin = std::io::empty();
    let mut env = protobot_spec::cli::Env {
        cwd: root,
        stdin: &mut stdin,
        faults: Default::default(),
    };
    let ran = protobot_spec::cli::run(&argv, &mut env);
    if ran.status == 0 {
        return Ok(());
    }
    Err(InitError::Failed {
        what: format!("run ears-manager {}", args.join(" ")),
        reason: format!("{} {}", ran.stdout.trim(), ran.stderr.trim())
            .trim()
            .replace('\n', " "),
    })
}

/// The canonical remote `init` records, and the note to print about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteChoice {
    /// What project.yaml records.
    pub remote: String,
    /// Why it is a placeholder, when it is one.
    pub note: Option<String>,
}

/// A remote given as a local repository: a path or a `file://` URL.
fn is_local(remote: &str) -> bool {
    remote.starts_with("file://") || !(remote.contains("://") || remote.starts_with("git@"))
}

/// Decides the canonical remote from `--canonical-remote` (`given`) and the
/// clone's `origin`. Pure. Refuses only what no project can use: a remote
/// with credentials or a malformed URL.
pub fn choose_remote(
    id: &str,
    given: Option<&str>,
    origin: Option<&str>,
) -> Result<RemoteChoice, String> {
    use protobot_spec::rules::{RemoteCheck, check_remote};
    let placeholder = format!("https://example.invalid/{id}.git");
    match given {
        Some(r) if !r.is_empty() && is_local(r) => Ok(RemoteChoice {
            note: Some(format!(
                "{r} is a local repository: protobot run lands merges on your clone's `origin` ({r} when that is it), and project.yaml records the placeholder {placeholder}, since it holds only https://, ssh:// or git@host:path URLs; set repository.canonical_remote there when the project gets one"
            )),
            remote: placeholder,
        }),
        Some(r) => match check_remote(r) {
            RemoteCheck::Ok => Ok(RemoteChoice {
                remote: r.to_owned(),
                note: None,
            }),
            RemoteCheck::Credentials => Err(format!(
                "--canonical-remote {r} carries credentials: remove the user information from the URL (credentials belong in a credential helper)"
            )),
            RemoteCheck::Invalid => Err(format!(
                "--canonical-remote {r} is not an https://, ssh:// or git@host:path URL, nor a local repository path"
            )),
        },
        None => match origin.filter(|o| check_remote(o) == RemoteCheck::Ok) {
            Some(o) => Ok(RemoteChoice {
                remote: o.to_owned(),
                note: None,
            }),
            None => Ok(RemoteChoice {
                note: Some(format!(
                    "project.yaml records the placeholder canonical remote {placeholder}: set repository.canonical_remote to your project's https:// or ssh:// URL"
                )),
                remote: placeholder,
            }),
        },
    }
}

/// Decides the default branch: `--default-branch` (`given`) or the branch
/// checked out now (`current`, `None` on a detached HEAD). `resolves` says
/// whether a branch has a commit; the current branch may have none yet (the
/// template commit creates it). Pure.
pub fn choose_branch(
    given: Option<&str>,
    current: Option<&str>,
    resolves: &dyn Fn(&str) -> bool,
) -> Result<String, String> {
    match (given, current) {
        (Some(b), _) if resolves(b) || Some(b) == current => Ok(b.to_owned()),
        (Some(b), Some(c)) => Err(format!(
            "--default-branch {b} has no commit in this repository (the branch checked out is {c}): pass `--default-branch {c}`, or create {b} first (`git branch {b}` or `git checkout -b {b}`)"
        )),
        (Some(b), None) => Err(format!(
            "--default-branch {b} has no commit in this repository and HEAD is detached: check out the default branch, or create {b} first"
        )),
        (None, Some(c)) => Ok(c.to_owned()),
        (None, None) => Err(
            "HEAD is detached: check out the default branch, or name it with `--default-branch BRANCH`".into(),
        ),
    }
}

/// Whether `refs/heads/<branch>` names a commit.
fn branch_resolves(root: &Path, branch: &str) -> bool {
    git(
        root,
        &[
            "rev-parse",
            "-q",
            "--verify",
            &format!("refs/heads/{branch}^{{commit}}"),
        ],
    )
    .is_ok()
}

/// What `init` changed so far, so a refusal can put the repository back.
#[derive(Default)]
struct Undo {
    /// HEAD's commit before the template commit (`None`: the branch was unborn).
    head_before: Option<Option<String>>,
    /// Files written (relative to the root).
    files: Vec<String>,
    /// Directories created for them, outermost first (removed when empty).
    dirs: Vec<PathBuf>,
    /// `.protobot/` did not exist before.
    protobot_created: bool,
}

impl Undo {
    /// Puts back what `init` changed: the template commit is undone (the index
    /// and work tree keep nothing of it), written files and a new `.protobot/`
    /// are removed. Best effort: every step runs even if one fails.
    fn roll_back(&self, root: &Path, branch: &str) {
        match &self.head_before {
            Some(Some(before)) => {
                let _ = git(root, &["reset", "-q", "--soft", before]);
            }
            Some(None) => {
                let _ = git(root, &["update-ref", "-d", &format!("refs/heads/{branch}")]);
            }
            None => {}
        }
        if !self.files.is_empty() {
            let mut rm = vec!["rm", "-q", "--cached", "--ignore-unmatch", "--"];
            rm.extend(self.files.iter().map(String::as_str));
            let _ = git(root, &rm);
        }
        for f in &self.files {
            let _ = std::fs::remove_file(root.join(f));
        }
        for d in self.dirs.iter().rev() {
            let _ = std::fs::remove_dir(d);
        }
        if self.protobot_created {
            let _ = std::fs::remove_dir_all(root.join(".protobot"));
        }
    }
}

fn init_inner(args: &InitArgs) -> Result<serde_json::Value, InitError> {
    let root = args.repo.canonicalize().map_err(|e| {
        InitError::Input(format!(
            "repository {}: {e}; create it with `git init -b {} {}`",
            args.repo.display(),
            args.default_branch.as_deref().unwrap_or("main"),
            args.repo.display()
        ))
    })?;
    let top = git(&root, &["rev-parse", "--show-toplevel"]).map_err(|_| {
        InitError::Input(format!(
            "{} is not a Git working tree; run `git init -b {}` there first",
            root.display(),
            args.default_branch.as_deref().unwrap_or("main")
        ))
    })?;
    if Path::new(&top).canonicalize().ok().as_deref() != Some(root.as_path()) {
        return Err(InitError::Input(format!(
            "run protobot init at the working tree's root ({top}), not in {}",
            root.display()
        )));
    }
    let current = git(&root, &["symbolic-ref", "-q", "--short", "HEAD"]).ok();
    let resolves = |b: &str| branch_resolves(&root, b);
    let branch = choose_branch(
        args.default_branch.as_deref(),
        current.as_deref(),
        &resolves,
    )
    .map_err(InitError::Input)?;
    let mut undo = Undo {
        protobot_created: !root.join(".protobot").exists(),
        ..Undo::default()
    };
    match init_steps(args, &root, &branch, &mut undo) {
        Ok(report) => Ok(report),
        Err(e) => {
            undo.roll_back(&root, &branch);
            Err(e)
        }
    }
}

/// Everything `init` writes, after the checks that need no write; on an error
/// the caller rolls back what `undo` recorded.
fn init_steps(
    args: &InitArgs,
    root: &Path,
    branch: &str,
    undo: &mut Undo,
) -> Result<serde_json::Value, InitError> {
    let root = root.to_path_buf();
    let name = args.name.clone().unwrap_or_else(|| args.id.clone());
    let mut wrote = Vec::new();
    let mut notes = Vec::new();
    let project_exists = root.join(".protobot/project.yaml").is_file();
    if !project_exists {
        // Every input is checked before the first write.
        let origin = git(&root, &["remote", "get-url", "origin"]).ok();
        let choice = choose_remote(
            &args.id,
            args.canonical_remote.as_deref(),
            origin.as_deref(),
        )
        .map_err(InitError::Input)?;
        let dirty = git(
            &root,
            &["status", "--porcelain", "--", VISION, ARCHITECTURE],
        )?;
        if !dirty.is_empty() {
            return Err(InitError::Input(format!(
                "{VISION} and {ARCHITECTURE} must be committed before the project is initialized: `git add {VISION} {ARCHITECTURE} && git commit -m 'Vision and Architecture'`, then run protobot init again"
            )));
        }
        let will_write = [VISION, ARCHITECTURE]
            .iter()
            .any(|p| !root.join(p).exists());
        if !will_write && !branch_resolves(&root, branch) {
            return Err(InitError::Input(format!(
                "the default branch {branch} has no commit yet: commit {VISION} and {ARCHITECTURE} on it, then run protobot init again"
            )));
        }
        if will_write {
            for key in ["user.name", "user.email"] {
                if git(&root, &["config", key]).is_err() {
                    return Err(InitError::Input(format!(
                        "protobot init commits the Vision and Architecture templates, and git has no {key}: set your identity with `git config user.name NAME` and `git config user.email EMAIL`, then run protobot init again"
                    )));
                }
            }
        }
        if let Some(note) = &choice.note {
            notes.push(note.clone());
        }
        // ears-manager's prerequisites: Vision and Architecture, committed.
        for path in [VISION, ARCHITECTURE] {
            let file = root.join(path);
            if !file.exists() {
                if let Some(parent) = file.parent() {
                    if !parent.exists() {
                        undo.dirs.push(parent.to_path_buf());
                    }
                    std::fs::create_dir_all(parent).map_err(io("create", parent))?;
                }
                std::fs::write(&file, template(path, &name)).map_err(io("write", &file))?;
                wrote.push(path.to_owned());
                undo.files.push(path.to_owned());
            }
        }
        if !wrote.is_empty() {
            undo.head_before = Some(git(&root, &["rev-parse", "-q", "--verify", "HEAD"]).ok());
            let mut add = vec!["add", "--"];
            add.extend(wrote.iter().map(String::as_str));
            git(&root, &add)?;
            let mut commit = vec![
                "commit",
                "-q",
                "-m",
                "protobot init: Vision and Architecture templates",
                "--",
            ];
            commit.extend(wrote.iter().map(String::as_str));
            git(&root, &commit).map_err(|e| match e {
                InitError::Failed { what, reason } => InitError::Failed {
                    what,
                    reason: format!(
                        "{reason} (set your identity with `git config user.name NAME` and `git config user.email EMAIL`)"
                    ),
                },
                other => other,
            })?;
        }
        let remote = choice.remote;
        ears(
            &root,
            &[
                "project",
                "init",
                "--id",
                &args.id,
                "--name",
                &name,
                "--canonical-remote",
                &remote,
                "--review-mode",
                &args.review_mode,
                "--default-branch",
                branch,
            ],
        )?;
    }
    let policy_path = root.join(PROJECTION);
    let mut policy = std::fs::read_to_string(&policy_path).map_err(io("read", &policy_path))?;
    let manifest = ProjectionManifest::parse(&policy).map_err(|e| {
        InitError::Input(format!(
            "{PROJECTION} is not a valid projection policy ({e}); fix it by hand, then run protobot init again"
        ))
    })?;
    let classified = |p: &str| manifest.classify(p).is_some();
    let planned = plan(&top_level(&root)?, &go_tests(&root), &classified);
    if !planned.add.is_empty() {
        if !policy.ends_with('\n') {
            policy.push('\n');
        }
        if !policy.contains("\npaths:") && !policy.starts_with("paths:") {
            policy.push_str("paths:\n");
        }
        policy.push_str(&manifest_lines(&planned.add));
        ProjectionManifest::parse(&policy).map_err(|e| InitError::Failed {
            what: format!("extend {PROJECTION}"),
            reason: e.to_string(),
        })?;
        std::fs::write(&policy_path, &policy).map_err(io("write", &policy_path))?;
    }
    let catalog = root.join(CATALOG);
    let catalog_created = !catalog.exists();
    if catalog_created {
        std::fs::write(&catalog, "").map_err(io("write", &catalog))?;
        undo.files.push(CATALOG.to_owned());
    }
    if planned.assumed_layout {
        notes.push(
            "no source or test directory was found: src/ (implementation) and tests/ (test) were assumed; change them in .protobot/projection.yaml if your layout differs".into(),
        );
    }
    if !go_tests(&root).is_empty() {
        notes.push("Go tests live beside the code: each existing *_test.go has its own `test` entry, and a new test file needs one too (or a test directory) before Worker A may write it".into());
    }
    Ok(serde_json::json!({
        "repo": root,
        "project_initialized": !project_exists,
        "committed_templates": wrote,
        "added": planned.add,
        "unclassified": planned.unclassified,
        "catalog_created": catalog_created,
        "notes": notes,
        "review": [PROJECTION, CATALOG, VISION, ARCHITECTURE],
        "default_branch": branch,
        "next": format!("review, then `git add .protobot && git commit -m 'protobot: projection policy and test catalog' && git push origin {branch}`"),
    }))
}

fn human(report: &serde_json::Value) -> String {
    let mut lines = Vec::new();
    if report["project_initialized"] == serde_json::json!(true) {
        lines.push("initialized the project with ears-manager (.protobot/project.yaml)".to_owned());
    }
    for w in report["committed_templates"]
        .as_array()
        .into_iter()
        .flatten()
    {
        lines.push(format!(
            "wrote and committed the template {} (edit it)",
            w.as_str().unwrap_or_default()
        ));
    }
    let added = report["added"].as_array().cloned().unwrap_or_default();
    if !added.is_empty() {
        lines.push(format!("{PROJECTION}: added"));
        for e in &added {
            lines.push(format!(
                "  {:<32} {:<15} ({})",
                e["path"].as_str().unwrap_or_default(),
                e["class"].as_str().unwrap_or_default(),
                e["why"].as_str().unwrap_or_default()
            ));
        }
    }
    let unclassified = report["unclassified"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !unclassified.is_empty() {
        lines.push(
            "left unclassified (no role sees or writes them; classify any a Worker needs):".into(),
        );
        for u in unclassified {
            lines.push(format!("  {}", u.as_str().unwrap_or_default()));
        }
    }
    if report["catalog_created"] == serde_json::json!(true) {
        lines.push(format!(
            "{CATALOG}: created empty (one line per test: test_id, paths, verifies)"
        ));
    }
    for n in report["notes"].as_array().into_iter().flatten() {
        lines.push(format!("note: {}", n.as_str().unwrap_or_default()));
    }
    lines.push(format!(
        "next: {}",
        report["next"].as_str().unwrap_or_default()
    ));
    lines.join("\n")
}

/// Runs `protobot init`.
pub fn init(args: InitArgs) -> ExitCode {
    match init_inner(&args) {
        Ok(report) => {
            let text = if args.output == Output::Json {
                report.to_string()
            } else {
                human(&report)
            };
            crate::output::print_line(&text)
        }
        Err(InitError::Input(e)) => {
            eprintln!("protobot: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("protobot: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> TopEntry {
        TopEntry {
            name: name.into(),
            is_dir: true,
            python_package: false,
        }
    }

    fn file(name: &str) -> TopEntry {
        TopEntry {
            name: name.into(),
            is_dir: false,
            python_package: false,
        }
    }

    fn classes(p: &Plan) -> Vec<(String, &'static str)> {
        p.add.iter().map(|e| (e.path.clone(), e.class)).collect()
    }

    fn none(_: &str) -> bool {
        false
    }

    #[test]
    fn src_and_tests_are_implementation_and_test() {
        let p = plan(
            &[dir("src"), dir("tests"), file("Cargo.toml"), dir("assets")],
            &[],
            &none,
        );
        assert_eq!(
            classes(&p),
            [
                ("Cargo.toml".to_owned(), "shared"),
                ("src/".to_owned(), "implementation"),
                ("tests/".to_owned(), "test"),
                (CATALOG.to_owned(), "shared"),
            ]
        );
        assert_eq!(p.unclassified, ["assets/"]);
        assert!(!p.assumed_layout);
    }

    #[test]
    fn lib_and_test_python_packages_and_go_layouts_are_recognized() {
        let p = plan(&[dir("lib"), dir("test")], &[], &none);
        assert_eq!(
            &classes(&p)[..2],
            [
                ("lib/".to_owned(), "implementation"),
                ("test/".to_owned(), "test")
            ]
        );
        let mut pkg = dir("todo");
        pkg.python_package = true;
        let p = plan(&[pkg, dir("tests"), file("pyproject.toml")], &[], &none);
        assert!(
            classes(&p).contains(&("todo/".to_owned(), "implementation")),
            "{p:?}"
        );
        let p = plan(
            &[dir("cmd"), dir("internal"), file("go.mod")],
            &["internal/store/store_test.go".to_owned()],
            &none,
        );
        let c = classes(&p);
        assert!(c.contains(&("cmd/".to_owned(), "implementation")), "{c:?}");
        assert!(
            c.contains(&("internal/".to_owned(), "implementation")),
            "{c:?}"
        );
        assert!(
            c.contains(&("internal/store/store_test.go".to_owned(), "test")),
            "{c:?}"
        );
        assert!(
            !c.contains(&("tests/".to_owned(), "test")),
            "Go tests were found: {c:?}"
        );
    }

    #[test]
    fn an_empty_repository_gets_src_and_tests_and_says_so() {
        let p = plan(&[dir(".git"), dir("docs")], &[], &none);
        assert!(p.assumed_layout);
        let c = classes(&p);
        assert!(c.contains(&("src/".to_owned(), "implementation")), "{c:?}");
        assert!(c.contains(&("tests/".to_owned(), "test")), "{c:?}");
        assert!(c.contains(&("docs/".to_owned(), "shared")), "{c:?}");
        assert!(p.unclassified.is_empty(), "{p:?}");
    }

    #[test]
    fn paths_the_policy_already_classifies_are_left_alone() {
        let classified = |p: &str| p == "src" || p == CATALOG;
        let p = plan(&[dir("src"), dir("tests")], &[], &classified);
        assert_eq!(classes(&p), [("tests/".to_owned(), "test")]);
    }

    #[test]
    fn a_local_canonical_remote_is_accepted_as_a_placeholder_and_a_bad_one_refused() {
        for local in [
            "../greet-origin.git",
            "/srv/git/greet.git",
            "file:///srv/greet.git",
        ] {
            let c = choose_remote("greet", Some(local), None).unwrap();
            assert_eq!(c.remote, "https://example.invalid/greet.git", "{local}");
            assert!(c.note.as_deref().unwrap_or_default().contains(local));
        }
        let url = choose_remote("greet", Some("https://git.example/greet.git"), None).unwrap();
        assert_eq!(url.remote, "https://git.example/greet.git");
        assert_eq!(url.note, None);
        let creds = choose_remote("greet", Some("https://me:pw@git.example/g.git"), None);
        assert!(creds.unwrap_err().contains("credentials"));
        assert!(choose_remote("greet", Some("ftp://git.example/g.git"), None).is_err());
        // No flag: origin when it is a URL, else the placeholder with a note.
        let from_origin = choose_remote("greet", None, Some("git@git.example:g.git")).unwrap();
        assert_eq!(from_origin.remote, "git@git.example:g.git");
        let local_origin = choose_remote("greet", None, Some("../greet-origin.git")).unwrap();
        assert!(local_origin.remote.contains("example.invalid"));
        assert!(local_origin.note.is_some());
    }

    #[test]
    fn the_default_branch_is_the_current_one_and_a_missing_one_names_the_flag() {
        let none = |_: &str| false;
        let main_only = |b: &str| b == "main";
        assert_eq!(choose_branch(None, Some("trunk"), &none).unwrap(), "trunk");
        assert_eq!(
            choose_branch(Some("main"), Some("trunk"), &main_only).unwrap(),
            "main"
        );
        // The unborn current branch is fine: the template commit creates it.
        assert_eq!(
            choose_branch(Some("trunk"), Some("trunk"), &none).unwrap(),
            "trunk"
        );
        let refused = choose_branch(Some("main"), Some("trunk"), &none).unwrap_err();
        assert!(refused.contains("--default-branch trunk"), "{refused}");
        assert!(
            choose_branch(None, None, &none)
                .unwrap_err()
                .contains("--default-branch")
        );
    }

    #[test]
    fn appended_lines_parse_as_a_policy() {
        let p = plan(&[dir("src"), dir("tests")], &[], &none);
        let text = format!("version: 1\npaths:\n{}", manifest_lines(&p.add));
        let m = ProjectionManifest::parse(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            m.classify("src/main.rs").map(|c| c.as_str()),
            Some("implementation")
        );
        assert_eq!(m.classify("tests/a.rs").map(|c| c.as_str()), Some("test"));
        assert_eq!(m.classify("other.txt"), None);
    }
}
