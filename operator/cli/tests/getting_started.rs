//! `docs/getting-started.md`, followed literally: the fenced `sh` blocks of the
//! document are the commands these tests run (one bash session, in order), with
//! `protobot` and `ears-manager` (the same binary under its second name) on
//! `PATH`, a fresh HOME with a Git identity, in an empty folder.
//!
//! Test index:
//! - `the_getting_started_guide_runs_as_written`: an empty repository to a
//!   merged change set; the user's clone stays clean (`git commit -am` commits
//!   nothing of the build away) until they pull the merge;
//! - `the_same_harness_builds_a_second_change_set_without_catalog_lines`: after
//!   the guide, a second change set (a new requirement) is built by the guide's
//!   harness unchanged: Worker A sees the test it wrote in the first build
//!   (no catalog line) and rewriting it identically changes nothing;
//! - `protobot_init_changes_nothing_when_it_refuses`: refused inputs (a branch
//!   that does not exist, credentials in the remote, a blank name
//!   ears-manager refuses after the template commit) leave no commit and no file; the
//!   current branch (`trunk`) is the default; a local remote is accepted;
//! - `a_harness_whose_integration_needs_what_the_sandbox_lacks_stops_before_the_first_cycle`:
//!   a `requires` line the sandbox cannot resolve, and a `path` line that is
//!   no directory, stop `protobot run` before any cycle, naming them;
//! - `a_change_set_approved_without_its_impact_review_is_refused_and_a_follow_up_builds_it`:
//!   a change set merged although `check` failed on its impact assessment is
//!   refused before anything is registered, naming the review and the way on;
//!   the follow-up change set the message describes builds;
//! - `a_projection_that_forgets_src_blocks_naming_the_path_and_retry_completes_it`:
//!   the same guide with `src/` removed from the policy: the run ends blocked
//!   naming `src/greet.sh` and the fix, and `protobot retry` after the fix on
//!   `main` completes it through a new contract version.

#![allow(clippy::unwrap_used, clippy::expect_used)]

const GUIDE: &str = include_str!("../../../docs/getting-started.md");

#[path = "support/guide.rs"]
mod guide;

use guide::{Session, merges_on_main, sh_blocks, skip_without_bwrap, split_at_run};

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
    let s = Session::new("greet");
    let blocks = sh_blocks(GUIDE);
    let (before, run, after) = split_at_run(&blocks);
    // The blocks run in one session: `cd greet` carries over.
    let init = s.ok(&s.work(), &before);
    assert!(init.contains("src/"), "protobot init listed src/: {init}");
    let built = s.ok(&s.work(), &format!("cd greet\n{run}"));
    assert!(built.contains("is completed"), "{built}");
    assert!(
        built.contains("warning: merged without inspection"),
        "the guide's harness has no inspector.sh, and the report says so: {built}"
    );
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
    // No lock file is left in the origin or beside the work store.
    let locks = s.ok(
        &s.work(),
        "find greet-origin.git greet/.git/protobot -maxdepth 1 -name '*lock*'",
    );
    assert_eq!(locks, "", "lock files left behind");
    let rest = s.ok(&s.repo(), &after);
    assert!(rest.contains("Hello, World!"), "{rest}");
    assert_eq!(s.ok(&s.repo(), "git status --porcelain"), "");
}

#[test]
fn protobot_init_changes_nothing_when_it_refuses() {
    let s = Session::new("greet");
    let work = s.work();
    s.ok(&work, "git init -q --bare t-origin.git && git init -q -b trunk t && git -C t remote add origin ../t-origin.git");
    let repo = work.join("t");
    let untouched = |what: &str| {
        let head = s.bash(&repo, "git rev-parse -q --verify HEAD");
        assert!(!head.status.success(), "{what}: a commit was left behind");
        assert_eq!(
            s.ok(&repo, "git status --porcelain --ignored"),
            "",
            "{what}"
        );
        assert_eq!(
            s.ok(&repo, "ls -A | grep -v '^.git$' || true"),
            "",
            "{what}"
        );
    };
    // A default branch that does not exist: refused up front, naming the flag to pass.
    let wrong = s.bash(&repo, "protobot init --id t --default-branch main");
    let stderr = String::from_utf8_lossy(&wrong.stderr).into_owned();
    assert_eq!(wrong.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--default-branch trunk"), "{stderr}");
    untouched("missing branch");
    // Credentials in the remote.
    let creds = s.bash(
        &repo,
        "protobot init --id t --canonical-remote https://me:secret@git.example/t.git",
    );
    assert_eq!(creds.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&creds.stderr).contains("credentials"));
    untouched("credentials");
    // A blank name, which ears-manager refuses only after the templates were
    // committed: the commit and the templates are rolled back.
    let blank = s.bash(&repo, "protobot init --id t --name ' '");
    assert!(!blank.status.success());
    assert!(String::from_utf8_lossy(&blank.stderr).contains("--name"));
    untouched("refused name");
    // The current branch is the default and a local remote is accepted.
    let done = s.ok(
        &repo,
        "protobot init --id t --canonical-remote ../t-origin.git",
    );
    assert!(done.contains("local repository"), "{done}");
    let project = s.ok(&repo, "cat .protobot/project.yaml");
    assert!(project.contains("trunk"), "{project}");
    assert!(
        project.contains("https://example.invalid/t.git"),
        "{project}"
    );
    assert!(done.contains("git push origin trunk"), "{done}");
}

#[test]
fn a_harness_whose_integration_needs_what_the_sandbox_lacks_stops_before_the_first_cycle() {
    if skip_without_bwrap() {
        return;
    }
    let s = Session::new("greet");
    let blocks = sh_blocks(GUIDE);
    let (before, run, _) = split_at_run(&blocks);
    s.ok(&s.work(), &before);
    s.ok(
        &s.work(),
        "printf '# what the integration needs\nrequires /opt/nowhere/bin/pytest\nrequires sh\n' > greet-harness/sandbox",
    );
    let stopped = s.bash(&s.repo(), &run);
    let stderr = String::from_utf8_lossy(&stopped.stderr).into_owned();
    assert_eq!(stopped.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("the sandbox has no /opt/nowhere/bin/pytest"),
        "{stderr}"
    );
    assert!(stderr.contains("`path /dir`"), "names the fix: {stderr}");
    assert!(
        !stderr.contains("missing: sh"),
        "sh is in the sandbox: {stderr}"
    );
    let cycles = s.ok(&s.repo(), "ls .git/protobot/scratch");
    assert!(!cycles.contains("-c1"), "no cycle ran: {cycles}");
    // A `path` that is no directory is refused before anything, with its line.
    s.ok(
        &s.work(),
        "printf 'path /opt/nowhere\n' > greet-harness/sandbox",
    );
    let refused = s.bash(&s.repo(), &run);
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("`path /opt/nowhere` is not a directory"),
        "{stderr}"
    );
    // With a uid per run (root), a `path` under a directory closed to others is refused
    // up front, naming that directory.
    if s.ok(&s.work(), "id -u").trim() == "0" {
        s.ok(
            &s.work(),
            "mkdir -p private/venv && chmod 700 private && printf 'path %s/private/venv\n' \"$PWD\" > greet-harness/sandbox",
        );
        let closed = s.bash(&s.repo(), &run);
        let stderr = String::from_utf8_lossy(&closed.stderr).into_owned();
        assert_eq!(closed.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("cannot enter"), "{stderr}");
        assert!(stderr.contains("/work/private (mode 0700"), "{stderr}");
    }
    s.ok(&s.work(), "printf 'path etc\n' > greet-harness/sandbox");
    let relative = s.bash(&s.repo(), &run);
    assert!(String::from_utf8_lossy(&relative.stderr).contains("line 1"));
    assert_eq!(merges_on_main(&s.work().join("greet-origin.git")), 0);
}

#[test]
fn a_change_set_approved_without_its_impact_review_is_refused_and_a_follow_up_builds_it() {
    if skip_without_bwrap() {
        return;
    }
    let s = Session::new("greet");
    let blocks = sh_blocks(GUIDE);
    let (before, run, after) = split_at_run(&blocks);
    s.ok(&s.work(), &before);
    s.ok(&s.repo(), &run);
    s.ok(&s.repo(), &after);
    // CS-00002 is merged although `ears-manager check` fails on its impact assessment.
    let unreviewed: String = SECOND_CHANGE_SET
        .lines()
        .filter(|l| {
            !l.contains("impact")
                && !l.starts_with("for c in")
                && !l.starts_with("    c.update")
                && !l.starts_with("json.dump")
                && !l.starts_with("import json")
                && !l.starts_with("ears-manager check")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!unreviewed.contains("impact"), "{unreviewed}");
    s.ok(&s.repo(), &unreviewed);
    let second = run.replace("CS-00001", "CS-00002");
    let refused = s.bash(&s.repo(), &second);
    let stderr = String::from_utf8_lossy(&refused.stderr).into_owned();
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    for names in [
        "change set CS-00002 was approved",
        "incomplete impact assessment",
        "`ears-manager impact --change-set CS-00002 --at ",
        "for REQ-CLI-00002 `ears-manager requirement update --change-set CS-NEW",
        "--impact-file impact.json",
        "protobot run --change-set CS-NEW",
    ] {
        assert!(stderr.contains(names), "names {names}: {stderr}");
    }
    let items = s.ok(&s.repo(), "protobot status --repo . --output json");
    assert!(
        !items.contains("wi-cs-00002"),
        "nothing was registered: {items}"
    );
    // The way on, as the message says.
    s.ok(
        &s.repo(),
        r#"git checkout -q main
ears-manager change-set create --intent "Review the impact of CS-00002" --affected-scope cli --implementation-required true
ears-manager change-set update --change-set CS-00003 --affected-interface greet-cli
ears-manager requirement update --change-set CS-00003 --id REQ-CLI-00002   --text "The command-line tool shall end every greeting with an exclamation mark."
ears-manager --output json impact --change-set CS-00003 | python3 -c '
import json, sys
impact = json.load(sys.stdin)
for c in impact["data"]["candidates"]:
    c.update(disposition="not-applicable", rationale="reviewed: the greeting stays")
json.dump(impact, sys.stdout)' > ../impact.json
ears-manager change-set update --change-set CS-00003 --impact-file ../impact.json
ears-manager check --change-set CS-00003
git add -A
git commit -q -m "CS-00003: review the impact of CS-00002"
cs_branch=$(git branch --show-current)
git checkout -q main
git merge -q --no-ff -m "Merge CS-00003" "$cs_branch"
git push -q origin main
"#,
    );
    let built = s.ok(&s.repo(), &run.replace("CS-00001", "CS-00003"));
    assert!(built.contains("is completed"), "{built}");
    assert_eq!(merges_on_main(&s.work().join("greet-origin.git")), 2);
}

/// A second change set, authored and approved as the guide's first one is.
const SECOND_CHANGE_SET: &str = r#"
git checkout -q main
ears-manager change-set create --intent "Greet politely" --affected-scope cli --implementation-required true
ears-manager change-set update --change-set CS-00002 --affected-interface greet-cli
ears-manager requirement add --change-set CS-00002 --id REQ-CLI-00002 --type ubiquitous   --text "The command-line tool shall end every greeting with an exclamation mark."   --interface greet-cli --scope cli --verification-mode isolated-interface --provenance user-authored
ears-manager --output json impact --change-set CS-00002 | python3 -c '
import json, sys
impact = json.load(sys.stdin)
for c in impact["data"]["candidates"]:
    c.update(disposition="not-applicable", rationale="a new requirement beside it; the greeting stays")
json.dump(impact, sys.stdout)' > ../impact.json
ears-manager change-set update --change-set CS-00002 --impact-file ../impact.json
ears-manager check --change-set CS-00002
git add -A
git commit -q -m "CS-00002: greet politely"
cs_branch=$(git branch --show-current)
git checkout -q main
git merge -q --no-ff -m "Merge CS-00002: greet politely" "$cs_branch"
git push -q origin main
"#;

#[test]
fn the_same_harness_builds_a_second_change_set_without_catalog_lines() {
    if skip_without_bwrap() {
        return;
    }
    let s = Session::new("greet");
    let blocks = sh_blocks(GUIDE);
    let (before, run, after) = split_at_run(&blocks);
    s.ok(&s.work(), &before);
    s.ok(&s.repo(), &run);
    s.ok(&s.repo(), &after);
    let catalog = s.ok(&s.repo(), "cat .protobot/test-catalog.jsonl");
    assert_eq!(catalog.trim(), "", "nobody wrote a catalog line");
    // A completed item's cycle projections and run outputs are gone; its trace stays.
    let scratch = s.ok(
        &s.repo(),
        "ls .git/protobot/scratch .git/protobot/scratch/sandbox/out 2>/dev/null || true",
    );
    assert!(!scratch.contains("wi-"), "{scratch}");
    assert!(scratch.contains("traces"), "{scratch}");
    s.ok(&s.repo(), SECOND_CHANGE_SET);
    let second = run.replace("CS-00001", "CS-00002");
    assert_ne!(second, run, "the guide's run names its change set");
    let built = s.bash(&s.repo(), &second);
    let stdout = String::from_utf8_lossy(&built.stdout).into_owned();
    assert!(
        built.status.success() && stdout.contains("is completed"),
        "{stdout}
{}",
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(!stdout.contains("withheld-path"), "{stdout}");
    assert_eq!(merges_on_main(&s.work().join("greet-origin.git")), 2);
    // Worker A saw its own test of the first build: the rewrite was a no-op, so the
    // test on main is the first build's, byte for byte.
    let test_on_main = s.ok(
        &s.repo(),
        "git fetch -q origin && git show origin/main:tests/test_greet.sh",
    );
    assert!(test_on_main.contains("REQ-CLI-00001"), "{test_on_main}");
    let traces = s.ok(&s.repo(), "cat .git/protobot/scratch/traces/*.jsonl");
    assert!(!traces.contains("refused-patch"), "{traces}");
}

#[test]
fn a_projection_that_forgets_src_blocks_naming_the_path_and_retry_completes_it() {
    if skip_without_bwrap() {
        return;
    }
    let s = Session::new("greet");
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
    // `protobot inbox` lists the item with its question and the command that moves it on;
    // that command, run as printed, completes it.
    let inbox = s.ok(&s.repo(), "protobot inbox --repo .");
    assert!(inbox.contains("[question]"), "{inbox}");
    assert!(inbox.contains("src/greet.sh is not classified"), "{inbox}");
    let next = inbox
        .lines()
        .find_map(|l| l.trim().strip_prefix("next: "))
        .and_then(|l| l.split('`').nth(1))
        .unwrap_or_else(|| panic!("no command on the next: line of {inbox}"));
    assert!(
        next.starts_with("protobot retry --repo /") && next.contains("--change-set CS-00001"),
        "{next}"
    );
    assert!(
        !next.contains("HARNESS"),
        "the harness run used is known: {next}"
    );
    let retried = s.ok(&s.repo(), next);
    assert!(retried.contains("completed"), "{retried}");
    let status = s.ok(&s.repo(), "protobot status --repo . --output json");
    let records: serde_json::Value = serde_json::from_str(status.trim()).unwrap();
    assert_eq!(records[0]["state"], "completed", "{records}");
    assert_eq!(merges_on_main(&s.work().join("greet-origin.git")), 1);
    assert_eq!(
        s.ok(&s.repo(), "protobot inbox --repo .").trim(),
        "nothing waits on a person"
    );
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
    let s = Session::new("greet");
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
    let s = Session::new("greet");
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
        let out = s.ok(&s.repo(), "protobot status --repo . --output json");
        serde_json::from_str(&out).unwrap()
    };
    let items = status(&s);
    assert_eq!(items[0]["state"], "blocked", "{items}");
    let id = items[0]["id"].as_str().unwrap().to_owned();
    // A blocked item keeps what its cycles left (it explains the block) ...
    let scratch = |s: &Session| {
        s.ok(
            &s.repo(),
            "ls .git/protobot/scratch .git/protobot/scratch/sandbox/out 2>/dev/null || true",
        )
    };
    assert!(scratch(&s).contains(&format!("{id}-")), "{}", scratch(&s));
    let abandoned = s.ok(
        &s.repo(),
        &format!("protobot abandon --repo . --work-item {id}"),
    );
    assert!(
        abandoned.contains("is abandoned (was blocked)"),
        "{abandoned}"
    );
    // ... an abandoned one is never built again: it goes, its trace stays.
    let left = scratch(&s);
    assert!(!left.contains(&format!("{id}-")), "{left}");
    assert!(left.contains("traces"), "{left}");
    assert_eq!(status(&s)[0]["state"], "abandoned");
    // The old block reason is not shown under an item that is no longer blocked.
    let table = s.ok(&s.repo(), "protobot status --repo .");
    assert!(table.contains("abandoned"), "{table}");
    assert!(!table.contains("blocked:"), "{table}");
    let rerun = s.bash(&s.repo(), &run);
    let rerun = String::from_utf8_lossy(&rerun.stdout).into_owned();
    assert!(rerun.contains("is abandoned"), "{rerun}");
    assert!(!rerun.contains("blocked:"), "{rerun}");
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
