//! Real bubblewrap runs of the execution contract (ARCHITECTURE.md §4):
//! isolation, limits, cancellation, cleanup and the refusals, each observed
//! from the host (`/proc`, the scratch and output roots, a loopback listener).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    collections::BTreeSet,
    net::TcpListener,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use protobot_executors::{
    BROKER_TOKEN_SENTINEL, BubblewrapConfig, BubblewrapExecutor, LocalExecutor, procfs,
};
use protobot_jobsite::executor::{Executor, ExecutorError, Limits, Termination};
use tokio::sync::watch;

fn no_cancel() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    std::mem::forget(tx); // never cancelled
    rx
}

fn read(dir: &std::path::Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("read {name}: {e}"))
}

/// Marks every process of a run through its environment so `/proc` can find them.
fn marked(spec: &mut protobot_jobsite::executor::RunSpec) -> String {
    let marker = format!("m{}-{}", std::process::id(), spec.run_id);
    spec.env.insert("TEST_MARKER".into(), marker.clone());
    marker
}

async fn no_survivors(marker: &str) -> bool {
    procfs::wait_until(Duration::from_secs(5), || {
        procfs::pids_with_env("TEST_MARKER", marker).is_empty()
    })
    .await
}

#[tokio::test]
async fn runs_a_copy_of_the_workspace_with_the_task_and_collects_out() {
    if !common::bwrap_available("runs_a_copy_of_the_workspace_with_the_task_and_collects_out") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let ws = common::projection(tmp.path());
    let script = r#"set -e
cat /task/task.json > /out/task.json
cat src/lib.txt > /out/lib.txt
pwd > /out/pwd
id -u > /out/uid
echo new > /workspace/new.txt
git status --porcelain > /out/status
git remote > /out/remotes
ls -A / > /out/root
ls -A /tmp > /out/tmp"#;
    let spec = common::spec(&ws, script);
    let task = spec.task.clone();
    let out = ex.run(spec, no_cancel()).await.unwrap();
    assert_eq!(
        out.termination,
        Termination::Exited { code: 0 },
        "{}",
        out.stderr_tail
    );
    let got: serde_json::Value = serde_json::from_str(&read(&out.out_dir, "task.json")).unwrap();
    assert_eq!(got, task);
    assert_eq!(read(&out.out_dir, "lib.txt"), "hello from the projection\n");
    assert_eq!(read(&out.out_dir, "pwd"), "/workspace\n");
    assert_eq!(read(&out.out_dir, "status"), "?? new.txt\n");
    assert_eq!(read(&out.out_dir, "remotes"), "");
    assert_eq!(read(&out.out_dir, "tmp"), "", "a fresh private /tmp");
    let root: BTreeSet<String> = read(&out.out_dir, "root")
        .lines()
        .map(String::from)
        .collect();
    let allowed: BTreeSet<String> = [
        "bin",
        "dev",
        "etc",
        "lib",
        "lib64",
        "out",
        "proc",
        "sbin",
        "task",
        "tmp",
        "usr",
        "workspace",
        "lib32",
        "libx32",
    ]
    .map(String::from)
    .into();
    assert!(
        root.is_subset(&allowed),
        "unexpected top-level entries: {:?}",
        root.difference(&allowed)
    );
    if std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap()
        == 0
    {
        let uid: u32 = read(&out.out_dir, "uid").trim().parse().unwrap();
        assert!(
            uid >= 200_000,
            "a root control plane runs the sandbox under a per-run uid, got {uid}"
        );
    }
    assert!(
        !ws.join("new.txt").exists(),
        "the export directory is never written"
    );
    assert!(!out.out_dir.starts_with(tmp.path().join("scratch")));
    assert!(
        common::entries(&tmp.path().join("scratch")).is_empty(),
        "ephemeral workspace removed"
    );
}

#[tokio::test]
async fn writes_outside_workspace_out_and_tmp_fail() {
    if !common::bwrap_available("writes_outside_workspace_out_and_tmp_fail") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let ws = common::projection(tmp.path());
    let host_marker =
        std::path::Path::new("/tmp").join(format!("protobot-test-{}", std::process::id()));
    let script = format!(
        r#"r=""
for p in /etc/passwd /etc/new /usr/bin/new /new /task/task.json /task/new /proc/new /dev/new {export}/new {scratch}/new; do
  (echo x > "$p") 2>/dev/null && r="$r $p"
done
echo private > {marker} || r="$r tmp"
echo ok > /workspace/ok || r="$r workspace"
echo ok > /out/ok || r="$r out"
printf '%s' "$r" > /out/writable"#,
        export = ws.display(),
        scratch = tmp.path().join("scratch").display(),
        marker = host_marker.display(),
    );
    let out = ex
        .run(common::spec(&ws, &script), no_cancel())
        .await
        .unwrap();
    assert_eq!(
        out.termination,
        Termination::Exited { code: 0 },
        "{}",
        out.stderr_tail
    );
    assert_eq!(
        read(&out.out_dir, "writable"),
        "",
        "only /workspace, /out and /tmp are writable"
    );
    assert!(!host_marker.exists(), "the sandbox /tmp is private");
    assert!(!ws.join("new").exists());
}

#[tokio::test]
async fn exceeding_the_wall_clock_ends_limit_exceeded_and_kills_everything() {
    if !common::bwrap_available("exceeding_the_wall_clock_ends_limit_exceeded_and_kills_everything")
    {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let ws = common::projection(tmp.path());
    let mut spec = common::spec(&ws, "sleep 60 & (setsid sleep 60 &); sleep 60");
    spec.limits.wall_clock = Duration::from_secs(1);
    let marker = marked(&mut spec);
    let out = ex.run(spec, no_cancel()).await.unwrap();
    assert_eq!(
        out.termination,
        Termination::LimitExceeded {
            limit: "wall-clock".into()
        }
    );
    assert!(out.elapsed < Duration::from_secs(10), "{:?}", out.elapsed);
    assert!(
        no_survivors(&marker).await,
        "processes survived: {:?}",
        procfs::pids_with_env("TEST_MARKER", &marker)
    );
    assert!(common::entries(&tmp.path().join("scratch")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_bomb_is_contained_by_the_process_limit() {
    if !common::bwrap_available("a_fork_bomb_is_contained_by_the_process_limit") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let ws = common::projection(tmp.path());
    // `exec`: once the bomb holds every process slot, a forked `sleep` would fail and end
    // the script early (dash exits 2), which is a race with the bomb, not containment.
    let mut spec = common::spec(&ws, "f() { f | f & }; f; exec sleep 60");
    spec.limits = Limits {
        wall_clock: Duration::from_secs(3),
        processes: 24,
        ..common::limits()
    };
    let marker = marked(&mut spec);
    let (done_tx, done_rx) = watch::channel(false);
    let run = async {
        let r = ex.run(spec, no_cancel()).await;
        let _ = done_tx.send(true);
        r
    };
    let watch_count = async {
        let mut max = 0;
        let mut samples = 0;
        while !*done_rx.borrow() {
            max = max.max(procfs::pids_with_env("TEST_MARKER", &marker).len());
            samples += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (max, samples)
    };
    let (out, (max, samples)) = tokio::join!(run, watch_count);
    let out = out.unwrap();
    assert_eq!(
        out.termination,
        Termination::LimitExceeded {
            limit: "wall-clock".into()
        }
    );
    eprintln!("fork bomb: at most {max} processes over {samples} samples");
    assert!(samples > 10, "sampled {samples} times");
    if std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap()
        == 0
    {
        assert!(max > 2, "the bomb ran ({max} processes)");
        assert!(max <= 24, "at most the process limit, saw {max}");
    }
    assert!(no_survivors(&marker).await, "fork bomb processes survived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_kills_the_whole_process_tree_with_no_survivors() {
    if !common::bwrap_available("cancel_kills_the_whole_process_tree_with_no_survivors") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let ws = common::projection(tmp.path());
    let mut spec = common::spec(
        &ws,
        "sleep 300 & (setsid sleep 300 &); (nohup sleep 300 >/dev/null 2>&1 &); sleep 300",
    );
    let marker = marked(&mut spec);
    let (tx, rx) = watch::channel(false);
    let run = ex.run(spec, rx);
    let driver = async {
        let started = procfs::wait_until(Duration::from_secs(20), || {
            procfs::pids_with_env("TEST_MARKER", &marker).len() >= 6
        })
        .await;
        let before = procfs::pids_with_env("TEST_MARKER", &marker);
        tx.send(true).unwrap();
        (started, before, Instant::now())
    };
    let (out, (started, before, at)) = tokio::join!(run, driver);
    let out = out.unwrap();
    assert!(started, "the tree started: {before:?}");
    assert_eq!(out.termination, Termination::Cancelled);
    assert!(at.elapsed() < Duration::from_secs(5), "prompt termination");
    assert!(
        no_survivors(&marker).await,
        "survivors: {:?}",
        procfs::pids_with_env("TEST_MARKER", &marker)
    );
    for pid in before {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(
            stat.is_empty() || stat.contains(") Z"),
            "pid {pid} still alive: {stat}"
        );
    }
    assert!(
        common::entries(&tmp.path().join("scratch")).is_empty(),
        "ephemeral workspace removed after cancel"
    );
}

#[tokio::test]
async fn a_run_cancelled_before_it_starts_runs_nothing() {
    if !common::bwrap_available("a_run_cancelled_before_it_starts_runs_nothing") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let ws = common::projection(tmp.path());
    let (_tx, rx) = watch::channel(true);
    let out = ex
        .run(common::spec(&ws, "echo ran > /out/ran"), rx)
        .await
        .unwrap();
    assert_eq!(out.termination, Termination::Cancelled);
    assert!(common::entries(&out.out_dir).is_empty());
    assert!(common::entries(&tmp.path().join("scratch")).is_empty());
}

#[tokio::test]
async fn exit_codes_signals_and_rlimits_map_to_terminations() {
    if !common::bwrap_available("exit_codes_signals_and_rlimits_map_to_terminations") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let ws = common::projection(tmp.path());
    let cases: Vec<(&str, Limits, Termination)> = vec![
        ("exit 3", common::limits(), Termination::Exited { code: 3 }),
        (
            "kill -TERM $$",
            common::limits(),
            Termination::Signaled { signal: 15 },
        ),
        (
            "while :; do :; done",
            Limits {
                cpu: Duration::from_secs(1),
                ..common::limits()
            },
            Termination::LimitExceeded {
                limit: "cpu".into(),
            },
        ),
        (
            "exec dd if=/dev/zero of=/workspace/big bs=64K count=64",
            Limits {
                file_size_bytes: 1 << 20,
                ..common::limits()
            },
            Termination::LimitExceeded {
                limit: "file-size".into(),
            },
        ),
    ];
    for (script, limits, want) in cases {
        let mut spec = common::spec(&ws, script);
        spec.limits = limits;
        let out = ex.run(spec, no_cancel()).await.unwrap();
        assert_eq!(out.termination, want, "{script}: {}", out.stderr_tail);
    }
    // The address-space limit makes a large allocation fail inside.
    let mut spec = common::spec(&ws, "dd if=/dev/zero of=/dev/null bs=256M count=1");
    spec.limits.memory_bytes = 64 << 20;
    let out = ex.run(spec, no_cancel()).await.unwrap();
    assert_eq!(out.termination, Termination::Exited { code: 1 });
    assert!(
        out.stderr_tail.contains("memory exhausted"),
        "{}",
        out.stderr_tail
    );
    // Open files.
    let mut spec = common::spec(
        &ws,
        "bash -c 'for i in $(seq 1 64); do exec {fd}</dev/null || exit 7; done'",
    );
    spec.limits.open_files = 16;
    let out = ex.run(spec, no_cancel()).await.unwrap();
    assert_eq!(
        out.termination,
        Termination::Exited { code: 7 },
        "{}",
        out.stderr_tail
    );
}

#[tokio::test]
async fn the_host_loopback_and_the_network_are_unreachable() {
    if !common::bwrap_available("the_host_loopback_and_the_network_are_unreachable") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let ws = common::projection(tmp.path());
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let script = format!(
        r#"r=""
timeout 5 bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}' 2>/dev/null && r="$r loopback"
timeout 5 bash -c 'exec 3<>/dev/tcp/192.0.2.1/443' 2>/dev/null && r="$r internet"
getent hosts example.com >/dev/null 2>&1 && r="$r dns"
printf '%s' "$r" > /out/reached"#
    );
    let out = ex
        .run(common::spec(&ws, &script), no_cancel())
        .await
        .unwrap();
    assert_eq!(read(&out.out_dir, "reached"), "");
    assert_eq!(
        listener.accept().map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::WouldBlock),
        "nothing connected to the host listener"
    );
}

#[tokio::test]
async fn a_sentinel_in_the_parent_environment_never_reaches_the_sandbox() {
    const CHILD: &str = "PROTOBOT_TEST_SENTINEL_CHILD";
    const NAME: &str = "a_sentinel_in_the_parent_environment_never_reaches_the_sandbox";
    if !common::bwrap_available(NAME) {
        return;
    }
    if std::env::var_os(CHILD).is_none() {
        // Re-run this test in a child process whose environment holds the
        // sentinel (setting our own environment would need unsafe code).
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD, "1")
            .env("PROTOBOT_BROKER_TOKEN", BROKER_TOKEN_SENTINEL)
            .env("GITHUB_TOKEN", format!("ghp_{BROKER_TOKEN_SENTINEL}"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("1 passed"),
            "the child ran the test:\n{stdout}"
        );
        return;
    }
    assert_eq!(
        std::env::var("PROTOBOT_BROKER_TOKEN").unwrap(),
        BROKER_TOKEN_SENTINEL,
        "the parent holds it"
    );
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let ws = common::projection(tmp.path());
    let mut spec = common::spec(&ws, "cat /proc/$$/environ > /out/environ; env > /out/env");
    spec.env.insert("HARNESS_MODE".into(), "scripted".into());
    let out = ex.run(spec, no_cancel()).await.unwrap();
    let environ = read(&out.out_dir, "environ");
    assert!(!environ.contains(BROKER_TOKEN_SENTINEL), "{environ}");
    assert!(!read(&out.out_dir, "env").contains(BROKER_TOKEN_SENTINEL));
    let names: BTreeSet<&str> = environ
        .split('\0')
        .filter(|s| !s.is_empty())
        .map(|kv| kv.split('=').next().unwrap())
        .collect();
    let want: BTreeSet<&str> = [
        "PATH",
        "HOME",
        "PWD",
        "PROTOBOT_WORKSPACE",
        "PROTOBOT_OUT",
        "PROTOBOT_TASK",
        "HARNESS_MODE",
    ]
    .into();
    assert_eq!(names, want);
}

#[tokio::test]
async fn refusals_name_the_reason() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = common::projection(tmp.path());

    // No bubblewrap: refuse with an install hint, nothing runs.
    let mut config = BubblewrapConfig::under(tmp.path());
    config.bwrap = Some(tmp.path().join("missing-bwrap"));
    let missing = BubblewrapExecutor::new(config);
    let err = missing
        .run(common::spec(&ws, "true"), no_cancel())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ExecutorError::Start { reason, .. } if reason.contains("apt-get install -y --no-install-recommends bubblewrap")),
        "{err}"
    );

    if !common::bwrap_available("refusals_name_the_reason") {
        return;
    }
    let ex = common::executor(tmp.path());
    // A sentinel credential in the command or environment.
    let err = ex
        .run(
            common::spec(&ws, &format!("echo {BROKER_TOKEN_SENTINEL}")),
            no_cancel(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("sandbox.denied"), "{err}");
    let mut spec = common::spec(&ws, "true");
    spec.env
        .insert("TOKEN".into(), BROKER_TOKEN_SENTINEL.into());
    assert!(
        ex.run(spec, no_cancel())
            .await
            .unwrap_err()
            .to_string()
            .contains("sandbox.denied")
    );
    // Egress through a proxy needs the proxy's session secret (tests/egress.rs
    // runs it with one).
    let mut spec = common::spec(&ws, "true");
    spec.egress_proxy = Some("http://127.0.0.1:3128".into());
    let err = ex.run(spec.clone(), no_cancel()).await.unwrap_err();
    assert!(
        err.to_string().contains("no egress session secret"),
        "{err}"
    );
    // ... unless the operator allows running such runs with no network.
    let mut config = BubblewrapConfig::under(tmp.path());
    config.no_network_instead_of_proxy = true;
    let lenient = BubblewrapExecutor::new(config);
    spec.command = vec![
        "/bin/sh".into(),
        "-c".into(),
        "tail -n +2 /proc/net/route > /out/routes".into(),
    ];
    let out = lenient.run(spec, no_cancel()).await.unwrap();
    assert_eq!(read(&out.out_dir, "routes"), "", "no route out");
    // A workspace whose git metadata reaches outside it.
    let st = std::process::Command::new("git")
        .args([
            "remote",
            "add",
            "origin",
            "https://example.invalid/repo.git",
        ])
        .current_dir(&ws)
        .status()
        .unwrap();
    assert!(st.success());
    let err = ex
        .run(common::spec(&ws, "true"), no_cancel())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("configured remote"), "{err}");
    // Zero limits fail closed.
    let mut spec = common::spec(tmp.path(), "true");
    spec.limits.processes = 0;
    assert!(
        ex.run(spec, no_cancel())
            .await
            .unwrap_err()
            .to_string()
            .contains("sandbox.fail_closed")
    );
    assert!(common::entries(&tmp.path().join("scratch")).is_empty());
}

/// Counts WARN events whose message mentions INSECURE.
struct InsecureWarnings(Arc<AtomicUsize>);

struct Message(String);

impl tracing::field::Visit for Message {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for InsecureWarnings {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut m = Message(String::new());
        event.record(&mut m);
        if *event.metadata().level() == tracing::Level::WARN && m.0.contains("INSECURE") {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

#[tokio::test]
async fn without_bwrap_only_the_explicit_insecure_mode_runs_and_it_warns_every_run() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = common::projection(tmp.path());
    let mut config = BubblewrapConfig::under(tmp.path());
    config.bwrap = Some(tmp.path().join("missing-bwrap"));

    let refusing = LocalExecutor::new(config.clone(), false);
    assert!(matches!(refusing, LocalExecutor::Sandboxed(_)));
    assert!(
        refusing
            .run(common::spec(&ws, "true"), no_cancel())
            .await
            .is_err()
    );

    let warnings = Arc::new(AtomicUsize::new(0));
    let _guard = tracing::subscriber::set_default(InsecureWarnings(warnings.clone()));
    let insecure = LocalExecutor::new(config, true);
    assert!(matches!(insecure, LocalExecutor::Insecure(_)));
    assert_eq!(insecure.profile(), "insecure-no-sandbox");
    let after_build = warnings.load(Ordering::SeqCst);
    for i in 0..2 {
        let out = insecure
            .run(common::spec(&ws, "cat \"$PROTOBOT_TASK\" > \"$PROTOBOT_OUT/task.json\"; cat src/lib.txt > \"$PROTOBOT_OUT/lib\""), no_cancel())
            .await
            .unwrap();
        assert_eq!(
            out.termination,
            Termination::Exited { code: 0 },
            "{}",
            out.stderr_tail
        );
        assert_eq!(read(&out.out_dir, "lib"), "hello from the projection\n");
        assert_eq!(
            warnings.load(Ordering::SeqCst),
            after_build + i + 1,
            "a loud warning on every run"
        );
    }
    // Its wall clock and process-group kill still work.
    let mut spec = common::spec(&ws, "sleep 60 & sleep 60");
    spec.limits.wall_clock = Duration::from_millis(500);
    let marker = marked(&mut spec);
    let out = insecure.run(spec, no_cancel()).await.unwrap();
    assert_eq!(
        out.termination,
        Termination::LimitExceeded {
            limit: "wall-clock".into()
        }
    );
    assert!(no_survivors(&marker).await);
    assert!(common::entries(&tmp.path().join("scratch")).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_run_midway_kills_it_and_removes_its_workspace() {
    if !common::bwrap_available("dropping_a_run_midway_kills_it_and_removes_its_workspace") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    let ws = common::projection(tmp.path());
    let mut spec = common::spec(&ws, "sleep 300 & sleep 300");
    let marker = marked(&mut spec);
    let started = {
        let run = ex.run(spec, no_cancel());
        tokio::select! {
            r = run => panic!("the run ended on its own: {r:?}"),
            started = procfs::wait_until(Duration::from_secs(20), || procfs::pids_with_env("TEST_MARKER", &marker).len() >= 3) => started,
        }
        // The run future is dropped here, as when the engine's task is aborted.
    };
    assert!(started);
    assert!(
        no_survivors(&marker).await,
        "survivors: {:?}",
        procfs::pids_with_env("TEST_MARKER", &marker)
    );
    assert!(
        common::entries(&tmp.path().join("scratch")).is_empty(),
        "{:?}",
        common::entries(&tmp.path().join("scratch"))
    );
}

#[tokio::test]
async fn stale_run_directories_of_a_killed_control_plane_are_removed_at_startup() {
    let tmp = tempfile::tempdir().unwrap();
    let ex = common::executor(tmp.path());
    assert_eq!(
        ex.remove_stale_run_dirs().unwrap(),
        0,
        "no scratch root yet"
    );
    let stale = tmp
        .path()
        .join("scratch/run-wi-1-cycle-1-abc/workspace/src");
    std::fs::create_dir_all(&stale).unwrap();
    std::fs::write(stale.join("lib.txt"), "left by a killed run").unwrap();
    std::fs::create_dir_all(tmp.path().join("scratch/not-a-run")).unwrap();
    assert_eq!(ex.remove_stale_run_dirs().unwrap(), 1);
    assert_eq!(
        common::entries(&tmp.path().join("scratch")),
        vec!["not-a-run".to_owned()]
    );
}
