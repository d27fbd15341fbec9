//! Supervision of one sandbox process: spawn, wait for exit, the wall-clock
//! deadline or cancellation, kill, and keep the tail of stderr.

use std::{
    os::unix::process::ExitStatusExt,
    process::{ExitStatus, Stdio},
    time::{Duration, Instant},
};

use protobot_jobsite::executor::{ExecutorError, Termination};
use tokio::{io::AsyncReadExt, process::Command, sync::watch};

/// How many bytes of stderr are kept.
const TAIL_BYTES: usize = 8 * 1024;
/// How long the supervisor waits for a killed process and its pipes.
pub(crate) const KILL_WAIT: Duration = Duration::from_secs(5);

/// How the supervised process ended, before mapping to a [`Termination`].
#[derive(Debug)]
pub(crate) enum Ending {
    /// The process exited on its own.
    Exited(ExitStatus),
    /// The supervisor killed it at the wall-clock deadline.
    WallClock,
    /// The supervisor killed it because `cancel` turned true.
    Cancelled,
}

/// The result of one supervised process.
#[derive(Debug)]
pub(crate) struct Supervised {
    pub(crate) ending: Ending,
    pub(crate) elapsed: Duration,
    pub(crate) stderr_tail: String,
}

/// Extra kill action for the whole tree (beyond killing the direct child),
/// e.g. signalling a process group.
pub(crate) type TreeKill = Box<dyn Fn(u32) + Send + Sync>;

async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    if cancel.wait_for(|c| *c).await.is_err() {
        // The sender is gone: nobody can cancel any more.
        std::future::pending::<()>().await;
    }
}

async fn read_tail(mut r: impl tokio::io::AsyncRead + Unpin) -> Vec<u8> {
    let mut tail = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return tail,
            Ok(n) => {
                tail.extend_from_slice(&buf[..n]);
                if tail.len() > 2 * TAIL_BYTES {
                    tail.drain(..tail.len() - TAIL_BYTES);
                }
            }
        }
    }
}

/// Spawns `cmd` (stdin closed, stdout discarded, stderr kept) and waits for
/// it, the `wall` deadline, or cancellation; on the latter two it kills the
/// child (and calls `tree_kill` with its pid).
pub(crate) async fn supervise(
    mut cmd: Command,
    run_id: &str,
    wall: Duration,
    mut cancel: watch::Receiver<bool>,
    tree_kill: Option<TreeKill>,
) -> Result<Supervised, ExecutorError> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|e| ExecutorError::Start {
        run_id: run_id.to_owned(),
        reason: format!("spawning the sandbox process failed: {e}"),
    })?;
    let pid = child.id();
    let stdout = child.stdout.take().map(|s| tokio::spawn(read_tail(s)));
    let stderr = child.stderr.take().map(|s| tokio::spawn(read_tail(s)));

    let ending = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => Ending::Exited(status),
            Err(e) => {
                let _ = child.start_kill();
                return Err(ExecutorError::Start {
                    run_id: run_id.to_owned(),
                    reason: format!("waiting for the sandbox process failed: {e}"),
                });
            }
        },
        () = tokio::time::sleep(wall) => Ending::WallClock,
        () = cancelled(&mut cancel) => Ending::Cancelled,
    };
    if !matches!(ending, Ending::Exited(_)) {
        if let (Some(kill), Some(pid)) = (&tree_kill, pid) {
            kill(pid);
        }
        let _ = child.start_kill();
        if tokio::time::timeout(KILL_WAIT, child.wait()).await.is_err() {
            tracing::error!(
                run_id,
                "the killed sandbox process did not exit within {KILL_WAIT:?}"
            );
        }
    }
    let elapsed = start.elapsed();
    if let Some(h) = stdout {
        // Drained only so a chatty command never blocks on a full pipe.
        match tokio::time::timeout(KILL_WAIT, h).await {
            Ok(_) => {}
            Err(_) => tracing::warn!(run_id, "stdout of the sandbox stayed open after it ended"),
        }
    }
    let mut stderr_tail = String::new();
    if let Some(h) = stderr
        && let Ok(Ok(bytes)) = tokio::time::timeout(KILL_WAIT, h).await
    {
        let start = bytes.len().saturating_sub(TAIL_BYTES);
        stderr_tail = String::from_utf8_lossy(&bytes[start..]).into_owned();
    }
    Ok(Supervised {
        ending,
        elapsed,
        stderr_tail,
    })
}

/// Maps a signal number that ended the command to a [`Termination`]:
/// SIGXCPU is the CPU rlimit, SIGXFSZ the file-size rlimit.
pub(crate) fn signal_termination(signal: i32) -> Termination {
    match signal {
        24 => Termination::LimitExceeded {
            limit: "cpu".into(),
        },
        25 => Termination::LimitExceeded {
            limit: "file-size".into(),
        },
        _ => Termination::Signaled { signal },
    }
}

/// Maps the exit status of a process that *is* the command (no wrapper that
/// folds signals into exit codes).
pub(crate) fn direct_termination(status: ExitStatus) -> Termination {
    match (status.code(), status.signal()) {
        (Some(code), _) => Termination::Exited { code },
        (None, Some(sig)) => signal_termination(sig),
        (None, None) => Termination::Exited { code: -1 },
    }
}
