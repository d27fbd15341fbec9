#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `protobot sandbox supervise`, the in-guest resource-limit supervisor, run as a
//! real process: each limit is shown to be applied by a child that exceeds it (and,
//! where it matters, the same child without the limit is shown to get further), and
//! each failure is shown to run nothing and exit with its documented status.
//!
//! The process-count and PID-1 tests run the supervisor inside a new user namespace
//! (`unshare --user`, util-linux): there `RLIMIT_NPROC` counts only that namespace's
//! processes and binds even when the test runs as root (root is exempt in its own
//! namespace). Without `unshare` (or with unprivileged user namespaces disabled)
//! those tests fail when `PROTOBOT_REQUIRE_USERNS` is set, and say why otherwise.

use std::{
    os::unix::{fs::PermissionsExt, process::ExitStatusExt},
    path::Path,
    process::{Command, Output},
    time::{Duration, Instant},
};

const PROTOBOT: &str = env!("CARGO_BIN_EXE_protobot");

fn supervise(limits: &[&str], command: &[&str]) -> Command {
    let mut c = Command::new(PROTOBOT);
    c.args(["sandbox", "supervise"])
        .args(limits)
        .arg("--")
        .args(command);
    c
}

fn run(mut c: Command) -> Output {
    c.output().expect("the protobot binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// A signal that ended the process, directly or as a shell's `128 + n`.
fn ended_by(o: &Output) -> Option<i32> {
    o.status
        .signal()
        .or_else(|| o.status.code().filter(|c| *c > 128).map(|c| c - 128))
}

/// Whether `unshare --user` works here; fails the test when it is required.
fn userns() -> bool {
    let ok = Command::new("unshare")
        .args(["--user", "--", "true"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_USERNS").is_none(),
            "PROTOBOT_REQUIRE_USERNS is set but `unshare --user` (util-linux) does not work here"
        );
        eprintln!(
            "skipping: `unshare --user` does not work here (install util-linux, allow unprivileged user namespaces)"
        );
    }
    ok
}

#[test]
fn a_write_past_the_file_size_limit_is_stopped_by_sigxfsz() {
    let tmp = tempfile::tempdir().unwrap();
    let big = tmp.path().join("big");
    let dd = format!("dd if=/dev/zero of={} bs=4096 count=64", big.display());
    let o = run(supervise(
        &["--file-size-bytes", "65536"],
        &["sh", "-c", &dd],
    ));
    assert_eq!(
        ended_by(&o),
        Some(25),
        "SIGXFSZ: {:?} {}",
        o.status,
        stderr(&o)
    );
    assert_eq!(std::fs::metadata(&big).unwrap().len(), 65536);
    // A writer that ignores SIGXFSZ gets EFBIG instead and is still held at the limit.
    let ignoring = format!("trap '' XFSZ; {dd} 2>/dev/null; echo $?");
    let o = run(supervise(
        &["--file-size-bytes", "65536"],
        &["sh", "-c", &ignoring],
    ));
    assert_eq!(stdout(&o), "1", "dd fails with EFBIG: {}", stderr(&o));
    assert_eq!(std::fs::metadata(&big).unwrap().len(), 65536);
    // Without the limit the same write completes: the limit is what stopped it.
    let o = run(supervise(&["--open-files", "64"], &["sh", "-c", &dd]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&big).unwrap().len(), 64 * 4096);
}

#[test]
fn descriptors_past_the_open_files_limit_are_refused() {
    let script =
        "i=0; while [ $i -lt 100 ]; do exec {fd}</dev/null || break; i=$((i+1)); done; echo $i";
    let o = run(supervise(&["--open-files", "32"], &["bash", "-c", script]));
    let opened: u32 = stdout(&o)
        .parse()
        .unwrap_or_else(|_| panic!("{}", stderr(&o)));
    assert!(
        opened > 0 && opened < 32,
        "opened {opened} under a limit of 32"
    );
    assert!(stderr(&o).contains("Too many open files"), "{}", stderr(&o));
    let o = run(supervise(&["--open-files", "512"], &["bash", "-c", script]));
    assert_eq!(stdout(&o), "100", "{}", stderr(&o));
}

#[test]
fn the_cpu_limit_ends_a_spinning_loop_with_sigxcpu() {
    let started = Instant::now();
    let o = run(supervise(
        &["--cpu-seconds", "1"],
        &["sh", "-c", "while :; do :; done"],
    ));
    assert_eq!(
        ended_by(&o),
        Some(24),
        "SIGXCPU: {:?} {}",
        o.status,
        stderr(&o)
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn the_process_limit_contains_a_fork_bomb() {
    // Root (kuid 0) is exempt from RLIMIT_NPROC in every user namespace, so as root the
    // supervisor runs under a uid nothing else uses (setpriv); otherwise in a user
    // namespace of its own, where only its processes count.
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    if !root && !userns() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let count = tmp.path().join("count");
    // Background sleepers until fork fails; the loop records how many started.
    let bomb = format!(
        "i=0; while [ $i -lt 200 ]; do sleep 3 & i=$((i+1)); echo $i > {}; done; wait",
        count.display()
    );
    let started = |limit: &str| {
        let _ = std::fs::remove_file(&count);
        let mut c = if root {
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid",
                "64123",
                "--regid",
                "64123",
                "--clear-groups",
                "--",
            ]);
            c
        } else {
            let mut c = Command::new("unshare");
            c.args(["--user", "--"]);
            c
        };
        c.args([
            PROTOBOT,
            "sandbox",
            "supervise",
            "--processes",
            limit,
            "--",
            "sh",
            "-c",
            &bomb,
        ]);
        let o = run(c);
        let n: u32 = std::fs::read_to_string(&count)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        (n, o)
    };
    let (n, o) = started("16");
    assert!(
        n > 0 && n < 16,
        "{n} background processes under a limit of 16: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("fork"), "{}", stderr(&o));
    let (n, o) = started("1000");
    assert_eq!(n, 200, "without a binding limit all start: {}", stderr(&o));
}

#[test]
fn as_pid_1_the_command_runs_as_a_child_so_the_cpu_signal_still_arrives() {
    if !userns() {
        return;
    }
    // PID 1 of a namespace ignores SIGXCPU it has no handler for; the supervisor then
    // keeps PID 1 and the spinning shell, its child, gets the signal (exit 128 + 24).
    let o = run({
        let mut c = Command::new("unshare");
        c.args([
            "--user",
            "--pid",
            "--fork",
            "--",
            PROTOBOT,
            "sandbox",
            "supervise",
            "--cpu-seconds",
            "1",
            "--",
            "sh",
            "-c",
            "while :; do :; done",
        ]);
        c
    });
    assert_eq!(o.status.code(), Some(152), "{:?} {}", o.status, stderr(&o));
    // And an ordinary exit status passes through.
    let o = run({
        let mut c = Command::new("unshare");
        c.args([
            "--user",
            "--pid",
            "--fork",
            "--",
            PROTOBOT,
            "sandbox",
            "supervise",
            "--open-files",
            "64",
            "--",
            "sh",
            "-c",
            "exit 7",
        ]);
        c
    });
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));
}

#[test]
fn limits_that_cannot_be_set_run_nothing_and_exit_125() {
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("ran");
    let touch = format!("touch {}", marker.display());
    for limits in [
        vec!["--open-files", "0"],
        vec!["--cpu-seconds", "0"],
        vec![],
        // Far above any hard limit a process inherits (and above the kernel's nr_open).
        vec!["--open-files", "99999999999"],
    ] {
        let o = run(supervise(&limits, &["sh", "-c", &touch]));
        assert_eq!(o.status.code(), Some(125), "{limits:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("sandbox.fail_closed"),
            "{limits:?}: {}",
            stderr(&o)
        );
        assert!(!marker.exists(), "{limits:?} ran the command");
    }
    let o = run(supervise(&["--open-files", "99999999999"], &["true"]));
    assert!(stderr(&o).contains("hard limit"), "{}", stderr(&o));
}

#[test]
fn a_command_that_cannot_be_executed_exits_126_or_127() {
    let tmp = tempfile::tempdir().unwrap();
    let o = run(supervise(
        &["--open-files", "64"],
        &["/nonexistent/protobot-role"],
    ));
    assert_eq!(o.status.code(), Some(127), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("/nonexistent/protobot-role"),
        "{}",
        stderr(&o)
    );
    let plain = tmp.path().join("not-executable");
    std::fs::write(&plain, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = run(supervise(
        &["--open-files", "64"],
        &[plain.to_str().unwrap()],
    ));
    assert_eq!(o.status.code(), Some(126), "{}", stderr(&o));
    let o = run(supervise(&["--open-files", "64"], &[]));
    assert_eq!(o.status.code(), Some(125), "{}", stderr(&o));
    assert!(stderr(&o).contains("no command"), "{}", stderr(&o));
}

#[test]
fn the_command_is_exec_d_with_its_environment_and_the_limits_readable() {
    let o = run({
        let mut c = supervise(
            &[
                "--cpu-seconds",
                "7",
                "--processes",
                "300",
                "--file-size-bytes",
                "4096",
                "--open-files",
                "77",
            ],
            &[
                "bash",
                "-c",
                "echo $PROTOBOT_PROBE; ulimit -t; ulimit -u; ulimit -n; cat /proc/self/limits | grep -E 'Max (cpu time|file size)'",
            ],
        );
        c.env("PROTOBOT_PROBE", "kept");
        c
    });
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        &lines[..4],
        ["kept", "7", "300", "77"],
        "{out} {}",
        stderr(&o)
    );
    assert!(
        out.contains("Max cpu time              7                    8"),
        "{out}"
    );
    assert!(
        out.contains("Max file size             4096                 4096"),
        "{out}"
    );
}

#[test]
fn install_supervisor_copies_this_binary_executable() {
    let tmp = tempfile::tempdir().unwrap();
    let to = tmp.path().join("protobot");
    let o = run({
        let mut c = Command::new(PROTOBOT);
        c.args(["sandbox", "install-supervisor", "--to"]).arg(&to);
        c
    });
    assert!(o.status.success(), "{}", stderr(&o));
    let mode = std::fs::metadata(&to).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(
        std::fs::read(&to).unwrap(),
        std::fs::read(PROTOBOT).unwrap()
    );
    let o = run({
        let mut c = Command::new(&to);
        c.arg("--version");
        c
    });
    assert!(stdout(&o).starts_with("protobot"), "{}", stdout(&o));
    let o = run({
        let mut c = Command::new(PROTOBOT);
        c.args(["sandbox", "install-supervisor", "--to"])
            .arg(Path::new("/nonexistent/dir/protobot"));
        c
    });
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("emptyDir"), "{}", stderr(&o));
}
