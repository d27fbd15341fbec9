//! Shared helpers for the integration tests: temporary Git repositories
//! (through git2), running the real `ears-manager` binary with a sanitized
//! environment, and an order-preserving JSON tree for envelope comparisons.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    fmt,
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A JSON value that keeps object key order (serde_json's `Value` sorts).
#[derive(Debug, Clone, PartialEq)]
pub enum Ordered {
    Null,
    Bool(bool),
    Num(serde_json::Number),
    Str(String),
    List(Vec<Ordered>),
    Map(Vec<(String, Ordered)>),
}

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<Ordered, E> {
                Ok(Ordered::Null)
            }
            fn visit_bool<E>(self, v: bool) -> Result<Ordered, E> {
                Ok(Ordered::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<Ordered, E> {
                Ok(Ordered::Num(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<Ordered, E> {
                Ok(Ordered::Num(v.into()))
            }
            fn visit_f64<E>(self, v: f64) -> Result<Ordered, E> {
                Ok(serde_json::Number::from_f64(v).map_or(Ordered::Null, Ordered::Num))
            }
            fn visit_str<E>(self, v: &str) -> Result<Ordered, E> {
                Ok(Ordered::Str(v.to_owned()))
            }
            fn visit_string<E>(self, v: String) -> Result<Ordered, E> {
                Ok(Ordered::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Ordered, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Ordered::List(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Ordered, A::Error> {
                let mut v = Vec::new();
                while let Some((k, x)) = a.next_entry()? {
                    v.push((k, x));
                }
                Ok(Ordered::Map(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Ordered {
    pub fn parse(s: &str) -> Ordered {
        serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
    }

    pub fn get(&self, key: &str) -> Option<&Ordered> {
        match self {
            Ordered::Map(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, key: &str) -> Option<&mut Ordered> {
        match self {
            Ordered::Map(m) => m.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub fn at(&self, path: &[&str]) -> Option<&Ordered> {
        path.iter().try_fold(self, |n, k| n.get(k))
    }

    pub fn str(&self) -> Option<&str> {
        match self {
            Ordered::Str(s) => Some(s),
            _ => None,
        }
    }

    pub fn remove(&mut self, key: &str) -> Option<Ordered> {
        match self {
            Ordered::Map(m) => m.iter().position(|(k, _)| k == key).map(|i| m.remove(i).1),
            _ => None,
        }
    }
}

/// A temporary Git repository with a `main` branch.
pub struct Repo {
    pub dir: tempfile::TempDir,
}

impl Repo {
    pub fn new() -> Repo {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = git2::RepositoryInitOptions::new();
        opts.initial_head("main");
        let repo = git2::Repository::init_opts(dir.path(), &opts).unwrap();
        let mut cfg = repo.config().unwrap();
        cfg.set_str("user.name", "fixture").unwrap();
        cfg.set_str("user.email", "fixture@example.invalid")
            .unwrap();
        Repo { dir }
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    pub fn write(&self, rel: &str, content: &[u8]) {
        let p = self.root().join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    pub fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.root().join(rel)).unwrap()
    }

    pub fn git(&self) -> git2::Repository {
        git2::Repository::open(self.root()).unwrap()
    }

    /// Stages everything and commits on the current branch.
    pub fn commit_all(&self, message: &str) -> git2::Oid {
        let repo = self.git();
        let mut index = repo.index().unwrap();
        index
            .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
            .unwrap();
        index.update_all(["*"], None).unwrap();
        index.write().unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = repo.signature().unwrap();
        let parents: Vec<git2::Commit> = repo
            .head()
            .ok()
            .and_then(|h| h.peel_to_commit().ok())
            .into_iter()
            .collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &refs)
            .unwrap()
    }

    pub fn head_branch(&self) -> String {
        self.git().head().unwrap().shorthand().unwrap().to_owned()
    }

    pub fn branches(&self) -> Vec<String> {
        let repo = self.git();
        let mut v: Vec<String> = repo
            .branches(Some(git2::BranchType::Local))
            .unwrap()
            .map(|b| b.unwrap().0.name().unwrap().unwrap().to_owned())
            .collect();
        v.sort();
        v
    }

    /// Every file under the working tree except `.git`, with contents.
    pub fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                let p = e.path();
                let rel = p
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                if rel == ".git" {
                    continue;
                }
                let ft = std::fs::symlink_metadata(&p).unwrap().file_type();
                if ft.is_dir() {
                    out.insert(format!("{rel}/"), Vec::new());
                    walk(root, &p, out);
                } else {
                    out.insert(rel, std::fs::read(&p).unwrap_or_default());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(&self.root(), &self.root(), &mut out);
        out
    }
}

/// Output of one binary run.
pub struct Out {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    pub fn json(&self) -> Ordered {
        Ordered::parse(&self.stdout)
    }

    pub fn json_value(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {}", self.stdout))
    }

    pub fn code(&self) -> String {
        self.json_value()["error"]["code"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    pub fn diag_codes(&self) -> Vec<String> {
        self.json_value()["error"]["diagnostics"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|d| d["code"].as_str().unwrap_or("").to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Runs the real binary in `cwd` with a sanitized Git environment.
pub fn run(cwd: &Path, args: &[&str], stdin: Option<&str>) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ears-manager"));
    cmd.args(args)
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_CONFIG_PARAMETERS",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
    ] {
        cmd.env_remove(var);
    }
    let mut child = cmd.spawn().unwrap();
    {
        let mut input = child.stdin.take().unwrap();
        if let Some(s) = stdin {
            // The command may legitimately exit before reading stdin (an
            // early usage or ID error); a broken pipe is not a test failure.
            let _ = input.write_all(s.as_bytes());
        }
    }
    let out = child.wait_with_output().unwrap();
    Out {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Runs with `--output json` prepended.
pub fn json(cwd: &Path, args: &[&str]) -> Out {
    let mut full = vec!["--output", "json"];
    full.extend_from_slice(args);
    run(cwd, &full, None)
}

/// A repository initialized the way §24 describes: committed Vision and
/// Architecture, `project init`, committed on `main`.
pub fn initialized() -> Repo {
    let repo = Repo::new();
    repo.write("docs/architecture.md", b"# Architecture\n");
    repo.write("docs/vision.md", b"# Vision\n");
    repo.commit_all("base");
    let out = json(
        &repo.root(),
        &[
            "project",
            "init",
            "--id",
            "demo",
            "--name",
            "Demo",
            "--canonical-remote",
            "https://example.invalid/demo.git",
            "--review-mode",
            "single-player",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    repo.commit_all("project init");
    repo
}

/// `initialized()` plus a change set `CS-00001` (on its new branch).
pub fn with_change_set() -> Repo {
    let repo = initialized();
    let out = json(
        &repo.root(),
        &[
            "change-set",
            "create",
            "--intent",
            "Try things",
            "--implementation-required",
            "true",
            "--created",
            "2026-09-15T12:00:00Z",
        ],
    );
    assert_eq!(out.status, 0, "{}", out.stdout);
    repo
}

/// Recomputes the three store digests in `project.yaml` after a direct
/// edit, so a test isolates the one finding it provokes.
pub fn reseal(repo: &Repo) {
    use protobot_spec::{digest, model::Project, yaml};
    let root = repo.root();
    let mut project: Project = yaml::decode(&repo.read(".protobot/project.yaml")).unwrap();
    let digests = project.store_digests.as_mut().unwrap();
    for (slot, dir) in [
        (&mut digests.requirements, ".protobot/requirements"),
        (&mut digests.interfaces, ".protobot/interfaces"),
        (&mut digests.change_sets, ".protobot/change-sets"),
    ] {
        let mut files = Vec::new();
        if let Ok(rd) = std::fs::read_dir(root.join(dir)) {
            for e in rd {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                if !name.starts_with('.') {
                    files.push((
                        format!("{dir}/{name}"),
                        std::fs::read(root.join(dir).join(&name)).unwrap_or_default(),
                    ));
                }
            }
        }
        *slot = digest::store_digest(files.iter().map(|(p, b)| (p.as_str(), b.as_slice()))).ok();
    }
    repo.write(
        ".protobot/project.yaml",
        yaml::emit_managed(&project.to_node()).as_bytes(),
    );
}

/// `requirement add` in CS-00001 with sensible defaults; `extra` overrides.
pub fn req_add(repo: &Repo, id: &str, text: &str, extra: &[&str]) -> Out {
    let mut args = vec![
        "requirement",
        "add",
        "--change-set",
        "CS-00001",
        "--id",
        id,
        "--type",
        "ubiquitous",
        "--text",
        text,
        "--verification-mode",
        "isolated-interface",
        "--provenance",
        "user-authored",
        "--created",
        "2026-09-15T12:03:00Z",
    ];
    if !extra.iter().any(|e| *e == "--scope" || *e == "--interface") {
        args.extend_from_slice(&["--scope", "cli"]);
    }
    args.extend_from_slice(extra);
    json(&repo.root(), &args)
}

/// Asserts a failure envelope: status, code, and (when given) a diagnostic.
#[track_caller]
pub fn assert_fails(out: &Out, status: i32, code: &str, diag: Option<&str>) {
    assert_eq!(out.status, status, "status; stdout: {}", out.stdout);
    assert!(
        out.stderr.is_empty(),
        "JSON mode writes nothing to stderr: {}",
        out.stderr
    );
    let v = out.json_value();
    assert_eq!(v["ok"], false);
    assert_eq!(v["error"]["exit_code"], status);
    assert_eq!(out.code(), code, "code; stdout: {}", out.stdout);
    if let Some(d) = diag {
        assert!(
            out.diag_codes().iter().any(|c| c == d),
            "missing diagnostic {d}: {}",
            out.stdout
        );
    }
}
