//! Shared helpers of the executor integration tests: the bubblewrap gate,
//! fixtures, and spec builders.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, path::Path, process::Command, time::Duration};

use protobot_executors::{BubblewrapConfig, BubblewrapExecutor};
use protobot_jobsite::executor::{Limits, RunSpec, SandboxRole};

/// True when bubblewrap is usable. When it is missing, the test is skipped
/// with a message, unless `PROTOBOT_REQUIRE_BWRAP` is set, which fails it.
pub fn bwrap_available(test: &str) -> bool {
    let probe = BubblewrapExecutor::new(BubblewrapConfig::default());
    if probe.bwrap_path().is_some() {
        return true;
    }
    if std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_some() {
        panic!(
            "{test}: bubblewrap (`bwrap`) is missing but PROTOBOT_REQUIRE_BWRAP is set; \
             install it with `apt-get install -y --no-install-recommends bubblewrap`"
        );
    }
    eprintln!(
        "SKIPPED {test}: bubblewrap (`bwrap`) is not installed; install it \
         (`apt-get install -y --no-install-recommends bubblewrap`) or set PROTOBOT_REQUIRE_BWRAP=1 to make this a failure"
    );
    false
}

/// An executor whose scratch and output roots live under `base`.
pub fn executor(base: &Path) -> BubblewrapExecutor {
    BubblewrapExecutor::new(BubblewrapConfig::under(base))
}

/// A projection: a git repository with one synthetic commit and no remote.
pub fn projection(base: &Path) -> std::path::PathBuf {
    let ws = base.join("export");
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/lib.txt"), "hello from the projection\n").unwrap();
    let git = |args: &[&str]| {
        let st = Command::new("git")
            .args(args)
            .current_dir(&ws)
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@invalid")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@invalid")
            .status()
            .unwrap();
        assert!(st.success(), "git {args:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "-A"]);
    git(&["commit", "-q", "-m", "synthetic root"]);
    ws
}

/// Small limits for tests.
pub fn limits() -> Limits {
    Limits {
        wall_clock: Duration::from_secs(30),
        cpu: Duration::from_secs(30),
        memory_bytes: 1 << 30,
        processes: 64,
        file_size_bytes: 64 << 20,
        open_files: 256,
    }
}

/// A spec running `sh -c script` with a unique run id.
pub fn spec(workspace: &Path, script: &str) -> RunSpec {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    RunSpec {
        run_id: format!("test-{}-{n}", std::process::id()),
        role: SandboxRole::WorkerB,
        workspace: workspace.to_path_buf(),
        task: serde_json::json!({"role": "worker-b", "requirements": ["REQ-1"]}),
        command: vec!["/bin/sh".into(), "-c".into(), script.into()],
        image: None,
        env: BTreeMap::new(),
        limits: limits(),
        egress_proxy: None,
        audit: protobot_jobsite::executor::RunAudit {
            work_item: "wi-test".into(),
            cycle: 1,
            trace_id: format!("test-{}-{n}", std::process::id()),
        },
        attribution: Default::default(),
    }
}

/// Entries left in a directory (empty when it does not exist).
pub fn entries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
