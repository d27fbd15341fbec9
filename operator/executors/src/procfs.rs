//! `/proc` scans that prove a run left no process behind: by the run's
//! dedicated uid (the bubblewrap executor) or by an environment marker the
//! caller put in `RunSpec::env` (tests and conformance probes).

use std::{
    fs,
    os::unix::fs::MetadataExt,
    time::{Duration, Instant},
};

/// Whether `pid` has exited (zombie or dead, waiting to be reaped): such a
/// process runs nothing and holds no resources but its pid.
fn exited(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('Z' | 'X' | 'x') | None)
}

fn pids() -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .collect()
}

/// Live processes whose effective uid is `uid`. Exited processes not yet
/// reaped (zombies, which a slow host init may keep for seconds) are not live.
pub fn pids_with_uid(uid: u32) -> Vec<u32> {
    pids()
        .into_iter()
        .filter(|pid| {
            fs::metadata(format!("/proc/{pid}"))
                .map(|m| m.uid() == uid)
                .unwrap_or(false)
        })
        .filter(|pid| !exited(*pid))
        .collect()
}

/// Live processes whose initial environment holds `name=value` exactly.
/// Needs permission to read `/proc/<pid>/environ` (root, or the same user).
pub fn pids_with_env(name: &str, value: &str) -> Vec<u32> {
    let needle = format!("{name}={value}");
    pids()
        .into_iter()
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()))
                .unwrap_or(false)
        })
        .filter(|pid| !exited(*pid))
        .collect()
}

/// Polls `condition` every 10 ms until it holds or `timeout` passes; returns
/// whether it held. A bounded wait on a condition, never a fixed sleep.
pub async fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if start.elapsed() >= timeout {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
