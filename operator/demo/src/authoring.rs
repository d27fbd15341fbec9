//! Authoring harness: drive `git` and ears-manager (in-process) the way a
//! person does when writing and approving specifications. Used by the demo's
//! bundled project and by tests; it never touches a Job Site repository.

use std::{path::Path, process::Command};

use protobot_spec::cli::{Env, run};

/// A failed authoring step, with what the tool said.
#[derive(Debug, thiserror::Error)]
#[error("failed to {step}: {detail}")]
pub struct AuthoringError {
    /// What was being done.
    pub step: String,
    /// What the tool said.
    pub detail: String,
}

/// Runs `git` in `dir` with a fixed identity and no user or system config.
pub fn git(dir: &Path, args: &[&str]) -> Result<String, AuthoringError> {
    let fail = |detail: String| AuthoringError {
        step: format!("run git {}", args.join(" ")),
        detail,
    };
    let out = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "protobot demo")
        .env("GIT_AUTHOR_EMAIL", "demo@protobot.invalid")
        .env("GIT_COMMITTER_NAME", "protobot demo")
        .env("GIT_COMMITTER_EMAIL", "demo@protobot.invalid")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .map_err(|e| fail(format!("git is not runnable ({e}); install git")))?;
    if !out.status.success() {
        return Err(fail(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Runs ears-manager in-process with `--output json`; returns its JSON answer.
pub fn ears(dir: &Path, args: &[&str]) -> Result<serde_json::Value, AuthoringError> {
    let mut argv = vec!["--output".to_string(), "json".to_string()];
    argv.extend(args.iter().map(|s| s.to_string()));
    let mut stdin = std::io::empty();
    let mut env = Env {
        cwd: dir,
        stdin: &mut stdin,
        faults: Default::default(),
    };
    let ran = run(&argv, &mut env);
    let fail = |detail: String| AuthoringError {
        step: format!("run ears-manager {}", args.join(" ")),
        detail,
    };
    if ran.status != 0 {
        return Err(fail(format!("{} {}", ran.stdout.trim(), ran.stderr.trim())));
    }
    serde_json::from_str(&ran.stdout).map_err(|e| fail(e.to_string()))
}
