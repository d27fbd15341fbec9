//! Following a guide in `docs/` literally: its fenced `sh` blocks, run in one
//! bash session with `protobot` and `ears-manager` (the same binary under its
//! second name) on `PATH`, a fresh HOME with a Git identity, in an empty
//! folder. Shared by the tests of `docs/getting-started.md` and
//! `docs/tutorial-python.md`.

#![allow(dead_code)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// The fenced ```sh blocks of the guide, in order.
pub fn sh_blocks(doc: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in doc.lines() {
        let trimmed = line.trim_start();
        match &mut current {
            None if trimmed == "```sh" => current = Some(String::new()),
            Some(block) if trimmed == "```" => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
            None => {}
        }
    }
    assert!(current.is_none(), "an unterminated ```sh block");
    blocks
}

pub fn bwrap_available() -> bool {
    Command::new("bwrap")
        .args(["--ro-bind", "/", "/", "true"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// An empty folder, a HOME with a Git identity, and a PATH with both commands.
pub struct Session {
    tmp: tempfile::TempDir,
    path: String,
    repo_name: &'static str,
}

impl Session {
    /// A session whose guide works in `work/<repo_name>`.
    pub fn new(repo_name: &'static str) -> Session {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("bin");
        let home = tmp.path().join("home");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(tmp.path().join("work")).unwrap();
        let exe = PathBuf::from(env!("CARGO_BIN_EXE_protobot"));
        for name in ["protobot", "ears-manager"] {
            std::os::unix::fs::symlink(&exe, bin.join(name)).unwrap();
        }
        std::fs::write(
            home.join(".gitconfig"),
            "[user]\n\tname = New User\n\temail = new.user@example.invalid\n[init]\n\tdefaultBranch = main\n",
        )
        .unwrap();
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Session {
            tmp,
            path,
            repo_name,
        }
    }

    pub fn work(&self) -> PathBuf {
        self.tmp.path().join("work")
    }

    /// The guide's repository (`greet` in getting-started).
    pub fn repo(&self) -> PathBuf {
        self.work().join(self.repo_name)
    }

    /// Runs `script` with bash in `dir` (errors stop it, as in a careful shell).
    pub fn bash(&self, dir: &Path, script: &str) -> Output {
        Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(dir)
            .env("HOME", self.tmp.path().join("home"))
            .env("PATH", &self.path)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .output()
            .unwrap()
    }

    pub fn ok(&self, dir: &Path, script: &str) -> String {
        let out = self.bash(dir, script);
        assert!(
            out.status.success(),
            "{script}\nexit {:?}\nstdout:\n{}\nstderr:\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

pub fn skip_without_bwrap() -> bool {
    if bwrap_available() {
        return false;
    }
    assert!(
        std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
        "PROTOBOT_REQUIRE_BWRAP is set but bwrap cannot run"
    );
    eprintln!("skipping: bubblewrap is not usable here");
    true
}

/// The guide's blocks split at the one that runs `protobot run`.
pub fn split_at_run(blocks: &[String]) -> (String, String, String) {
    let at = blocks
        .iter()
        .position(|b| b.contains("protobot run "))
        .expect("the guide runs `protobot run`");
    (
        blocks[..at].concat(),
        blocks[at].clone(),
        blocks[at + 1..].concat(),
    )
}

pub fn merges_on_main(origin: &Path) -> usize {
    let out = Command::new("git")
        .args(["log", "--merges", "--first-parent", "--format=%s", "main"])
        .current_dir(origin)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("Merge wi/"))
        .count()
}
