//! `docs/getting-started.md`, followed literally: the fenced `sh` blocks of the
//! document are the commands these tests run (one bash session, in order), with
//! `protobot` and `ears-manager` (the same binary under its second name) on
//! `PATH`, a fresh HOME with a Git identity, in an empty folder.
//!
//! Test index:
//! - `the_getting_started_guide_runs_as_written`: an empty repository to a
//!   merged change set; the user's clone stays clean (`git commit -am` commits
//!   nothing of the build away) until they pull the merge;
//! - `a_projection_that_forgets_src_blocks_naming_the_path_and_retry_completes_it`:
//!   the same guide with `src/` removed from the policy: the run ends blocked
//!   naming `src/greet.sh` and the fix, and `protobot retry` after the fix on
//!   `main` completes it through a new contract version.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

const GUIDE: &str = include_str!("../../../docs/getting-started.md");

/// The fenced ```sh blocks of the guide, in order.
fn sh_blocks(doc: &str) -> Vec<String> {
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

fn bwrap_available() -> bool {
    Command::new("bwrap")
        .args(["--ro-bind", "/", "/", "true"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// An empty folder, a HOME with a Git identity, and a PATH with both commands.
struct Session {
    tmp: tempfile::TempDir,
    path: String,
}

impl Session {
    fn new() -> Session {
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
        Session { tmp, path }
    }

    fn work(&self) -> PathBuf {
        self.tmp.path().join("work")
    }

    fn repo(&self) -> PathBuf {
        self.work().join("greet")
    }

    /// Runs `script` with bash in `dir` (errors stop it, as in a careful shell).
    fn bash(&self, dir: &Path, script: &str) -> Output {
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

    fn ok(&self, dir: &Path, script: &str) -> String {
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

fn skip_without_bwrap() -> bool {
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
fn split_at_run(blocks: &[String]) -> (String, String, String) {
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

fn merges_on_main(origin: &Path) -> usize {
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

#[test]
fn the_guide_has_the_blocks_this_test_follows() {
    let blocks = sh_blocks(GUIDE);
    assert!(blocks.len() >= 6, "{blocks:?}");
    let all = blocks.concat();
    for command in [
        "protobot init",
        "ears-manager change-set create",
        "protobot run",
        "git merge -q --no-ff",
    ] {
        assert!(all.contains(command), "the guide runs {command}");
    }
    // Text blocks and console blocks are not run.
    assert!(
        !all.contains("cargo install"),
        "installation is not part of the run"
    );
    assert_eq!(
        sh_blocks("```sh\necho a\n```\n```text\nno\n```\n"),
        ["echo a\n"]
    );
}

#[test]
fn the_getting_started_guide_runs_as_written() {
    if skip_without_bwrap() {
        return;
    }
    let s = Session::new();
    let blocks = sh_blocks(GUIDE);
    let (before, run, after) = split_at_run(&blocks);
    // The blocks run in one session: `cd greet` carries over.
    let init = s.ok(&s.work(), &before);
    assert!(init.contains("src/"), "protobot init listed src/: {init}");
    let built = s.ok(&s.work(), &format!("cd greet\n{run}"));
    assert!(built.contains("is completed"), "{built}");
    // The user's clone is as they left it: nothing staged, nothing deleted,
    // and `git commit -am` has nothing of the build to commit away.
    assert_eq!(s.ok(&s.repo(), "git status --porcelain"), "");
    let commit = s.bash(&s.repo(), "git commit -qam 'my own work'");
    assert!(
        !commit.status.success(),
        "git commit -am found something to commit"
    );
    let branches = s.ok(&s.repo(), "git branch --list 'wi/*' 'int/*'");
    assert_eq!(
        branches, "",
        "internal branches stay out of the user's namespace"
    );
    assert_eq!(merges_on_main(&s.work().join("greet-origin.git")), 1);
    let rest = s.ok(&s.repo(), &after);
    assert!(rest.contains("Hello, World!"), "{rest}");
    assert_eq!(s.ok(&s.repo(), "git status --porcelain"), "");
}

#[test]
fn a_projection_that_forgets_src_blocks_naming_the_path_and_retry_completes_it() {
    if skip_without_bwrap() {
        return;
    }
    let s = Session::new();
    let blocks = sh_blocks(GUIDE);
    let (before, run, after) = split_at_run(&blocks);
    // The user's policy forgets src/ (removed right after protobot init wrote it).
    let forget = "sed -i '/^  - path: src\\/$/,+1d' .protobot/projection.yaml\n\
                  if grep -q 'path: src/' .protobot/projection.yaml; then exit 1; fi\n";
    let before = before.replacen(
        "cat .protobot/projection.yaml\n",
        &format!("cat .protobot/projection.yaml\n{forget}"),
        1,
    );
    assert!(
        before.contains("sed -i"),
        "the guide still prints the policy after init"
    );
    s.ok(&s.work(), &before);
    let blocked = s.bash(&s.work(), &format!("cd greet\n{run}"));
    let stdout = String::from_utf8_lossy(&blocked.stdout).into_owned();
    assert_eq!(
        blocked.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&blocked.stderr)
    );
    assert!(stdout.contains("is blocked"), "{stdout}");
    assert!(
        stdout.contains("src/greet.sh is not classified"),
        "names the path: {stdout}"
    );
    assert!(
        stdout.contains("`- path: src/` with `class: implementation`"),
        "names the fix: {stdout}"
    );
    assert!(stdout.contains("protobot retry"), "{stdout}");
    assert!(!stdout.contains("contradictory"), "{stdout}");
    // A rerun without the fix says the same, with the way out.
    let again = s.bash(&s.repo(), &run);
    assert!(String::from_utf8_lossy(&again.stdout).contains("src/greet.sh is not classified"));
    // The fix, reviewed and pushed like any policy change.
    s.ok(
        &s.repo(),
        "printf '  - path: src/\\n    class: implementation\\n' >> .protobot/projection.yaml\n\
         git commit -qam 'projection: src/ is the implementation'\n\
         git push -q origin main\n",
    );
    let retried = s.ok(
        &s.repo(),
        "protobot retry --repo . --change-set CS-00001 --harness ../greet-harness --output json",
    );
    let report: serde_json::Value = serde_json::from_str(retried.trim()).unwrap();
    assert_eq!(report["state"], "completed", "{report}");
    assert!(
        report["retried_at_contract_version"].as_u64().is_some(),
        "{report}"
    );
    assert_eq!(merges_on_main(&s.work().join("greet-origin.git")), 1);
    // Retrying a completed item is refused with the reason.
    let twice = s.bash(
        &s.repo(),
        "protobot retry --repo . --change-set CS-00001 --harness ../greet-harness",
    );
    assert_eq!(twice.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&twice.stderr).contains("not blocked"));
    let rest = s.ok(&s.repo(), &after);
    assert!(rest.contains("Hello, World!"), "{rest}");
}

#[test]
fn a_harness_that_exits_nonzero_after_committing_fails_with_its_code_and_stderr() {
    if skip_without_bwrap() {
        return;
    }
    let s = Session::new();
    let blocks = sh_blocks(GUIDE);
    let (before, run, _) = split_at_run(&blocks);
    s.ok(&s.work(), &before);
    // Worker B commits its work, then reports a failure.
    s.ok(
        &s.work(),
        "printf 'echo \"model quota exceeded\" >&2\\nexit 3\\n' >> greet-harness/worker-b.sh",
    );
    let failed = s.bash(&s.repo(), &run);
    let stderr = String::from_utf8_lossy(&failed.stderr).into_owned();
    assert_eq!(failed.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("worker-b"), "{stderr}");
    assert!(stderr.contains("exited with code 3"), "{stderr}");
    assert!(stderr.contains("model quota exceeded"), "{stderr}");
    assert_eq!(
        merges_on_main(&s.work().join("greet-origin.git")),
        0,
        "a failed run is never merged"
    );
    // The trace records the exit and the stderr tail too.
    let traces = s.ok(
        &s.repo(),
        "cat .git/protobot/scratch/traces/*.jsonl 2>/dev/null || true",
    );
    assert!(traces.contains("model quota exceeded"), "{traces}");
}

#[test]
fn a_blocked_item_is_abandoned_through_the_lifecycle_and_nothing_is_merged() {
    if skip_without_bwrap() {
        return;
    }
    let s = Session::new();
    let blocks = sh_blocks(GUIDE);
    let (before, run, _) = split_at_run(&blocks);
    let before = before.replacen(
        "cat .protobot/projection.yaml\n",
        "cat .protobot/projection.yaml\nsed -i '/^  - path: src\\/$/,+1d' .protobot/projection.yaml\n",
        1,
    );
    s.ok(&s.work(), &before);
    let blocked = s.bash(&s.repo(), &run);
    assert_eq!(blocked.status.code(), Some(1));
    let status = |s: &Session| -> serde_json::Value {
        let out = s.ok(
            &s.repo(),
            "protobot status --store .git/protobot/wms.sqlite --project greet --output json",
        );
        serde_json::from_str(&out).unwrap()
    };
    let items = status(&s);
    assert_eq!(items[0]["state"], "blocked", "{items}");
    let id = items[0]["id"].as_str().unwrap().to_owned();
    let abandoned = s.ok(
        &s.repo(),
        &format!("protobot abandon --repo . --work-item {id}"),
    );
    assert!(
        abandoned.contains("is abandoned (was blocked)"),
        "{abandoned}"
    );
    assert_eq!(status(&s)[0]["state"], "abandoned");
    // Abandoned is final: neither abandon nor retry moves it again.
    let again = s.bash(
        &s.repo(),
        &format!("protobot abandon --repo . --work-item {id}"),
    );
    assert_eq!(again.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&again.stderr).contains("ALREADY_TERMINAL"));
    let retry = s.bash(
        &s.repo(),
        "protobot retry --repo . --change-set CS-00001 --harness ../greet-harness",
    );
    assert_eq!(retry.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&retry.stderr).contains("is abandoned, not blocked"));
    let unknown = s.bash(&s.repo(), "protobot abandon --repo . --work-item wi-nope");
    assert_eq!(unknown.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("protobot status --store"));
    assert_eq!(merges_on_main(&s.work().join("greet-origin.git")), 0);
}
