//! Small helpers shared by the backends: finding host tools on `PATH`,
//! run nonces, safe path components, and validation of a [`RunSpec`].

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::atomic::{AtomicU64, Ordering},
    time::{SystemTime, UNIX_EPOCH},
};

use protobot_jobsite::executor::{ExecutorError, RunSpec};

use crate::BROKER_TOKEN_SENTINEL;

/// Finds an executable named `name` on the control plane's `PATH` (or the
/// usual system directories when `PATH` is unset).
pub(crate) fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// Whether `path` is a regular file with an execute bit.
pub(crate) fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The effective uid of this process (owner of `/proc/self`), if readable.
pub(crate) fn effective_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// A fresh, unpredictable-enough token for naming run directories (not a secret).
pub(crate) fn nonce() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{:x}{:x}{:x}",
        std::process::id(),
        n,
        nanos & 0xffff_ffff_ffff
    )
}

/// `run_id` reduced to `[A-Za-z0-9._-]`, at most 64 characters, for use in a
/// directory name.
pub(crate) fn safe_component(run_id: &str) -> String {
    let mut s: String = run_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '.') {
        s = "run".to_owned();
    }
    s
}

/// Checks the parts of a spec every local backend refuses: an empty command, a
/// sentinel credential in the command or environment, malformed environment
/// names, and non-positive limits.
pub(crate) fn validate_spec(spec: &RunSpec) -> Result<(), ExecutorError> {
    let refuse = |reason: String| ExecutorError::Start {
        run_id: spec.run_id.clone(),
        reason,
    };
    if spec.command.is_empty() {
        return Err(refuse(
            "the command is empty; the WorkerClass must name a harness command".into(),
        ));
    }
    if spec
        .command
        .iter()
        .any(|a| a.contains(BROKER_TOKEN_SENTINEL))
    {
        return Err(refuse(
            "sandbox.denied: a command argument carries a credential sentinel; credentials never enter a sandbox".into(),
        ));
    }
    for (k, v) in &spec.env {
        if k.contains(BROKER_TOKEN_SENTINEL) || v.contains(BROKER_TOKEN_SENTINEL) {
            return Err(refuse(format!(
                "sandbox.denied: environment variable {k} carries a credential sentinel; credentials never enter a sandbox"
            )));
        }
        if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
            return Err(refuse(format!(
                "environment variable name {k:?} or its value is malformed"
            )));
        }
    }
    let l = &spec.limits;
    let zero = [
        ("wall-clock", l.wall_clock.is_zero()),
        ("cpu", l.cpu.is_zero()),
        ("memory", l.memory_bytes == 0),
        ("process-count", l.processes == 0),
        ("file-size", l.file_size_bytes == 0),
        ("open-files", l.open_files == 0),
    ];
    if let Some((name, _)) = zero.iter().find(|(_, z)| *z) {
        return Err(refuse(format!(
            "sandbox.fail_closed: limit {name} is zero; every limit must be positive"
        )));
    }
    Ok(())
}

/// `prlimit` arguments for the spec's limits. CPU: soft limit at the configured
/// seconds (SIGXCPU), hard limit one second later (SIGKILL).
pub(crate) fn prlimit_args(spec: &RunSpec) -> Vec<String> {
    let l = &spec.limits;
    let cpu = l.cpu.as_secs().max(1) + u64::from(l.cpu.subsec_nanos() > 0 && l.cpu.as_secs() > 0);
    vec![
        format!("--cpu={cpu}:{}", cpu + 1),
        format!("--as={}", l.memory_bytes),
        format!("--nproc={}", l.processes),
        format!("--fsize={}", l.file_size_bytes),
        format!("--nofile={}", l.open_files),
        "--core=0".to_owned(),
        "--".to_owned(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_component_keeps_names_harmless() {
        assert_eq!(safe_component("wi-1/cycle 2/../a"), "wi-1_cycle_2_.._a");
        assert_eq!(safe_component(".."), "run");
        assert_eq!(safe_component(""), "run");
        assert_eq!(safe_component(&"x".repeat(100)).len(), 64);
    }
}
