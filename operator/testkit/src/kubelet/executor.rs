//! How the simulated kubelet runs a container: the [`ContainerExecutor`] trait
//! (to be implemented by a bubblewrap sandbox later) and [`ProcessExecutor`],
//! which runs the command as a plain local process in its own process group.

use std::{
    future::Future, os::unix::process::ExitStatusExt, path::PathBuf, pin::Pin, process::Stdio,
};

use tokio::sync::watch;

/// A volume mounted into a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// Volume name from the pod spec; empty for a directory of the container's image
    /// (see [`super::Images`]), which comes before the volumes.
    pub volume: String,
    /// Directory on the host backing the volume.
    pub host_path: PathBuf,
    /// `mountPath` inside the container.
    pub container_path: String,
    /// `readOnly`.
    pub read_only: bool,
}

/// Everything an executor needs to start one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerLaunch {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Image (informational: executors run commands on the host).
    pub image: String,
    /// `command` followed by `args`.
    pub argv: Vec<String>,
    /// Literal `env` entries (`valueFrom` is not resolved).
    pub env: Vec<(String, String)>,
    /// `workingDir`, as a container path.
    pub working_dir: Option<String>,
    /// Volume mounts.
    pub mounts: Vec<Mount>,
    /// Where stdout and stderr go.
    pub log_path: PathBuf,
    /// How the node confines the container beyond its mounts (none by default).
    pub confinement: Confinement,
    /// The pod's network when a NetworkPolicy lets it reach a Service
    /// (`None`: no network at all). [`ProcessExecutor`] ignores it.
    pub network: Option<super::network::ContainerNetwork>,
}

/// What a node enforces of a container's security context and limits: the simulated
/// kubelet fills this only on a node that enforces them ([`super::NodeSpec`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Confinement {
    /// `runAsUser` and `runAsGroup`: the container's processes run as this uid and gid
    /// (with no supplementary groups), so per-user limits such as `RLIMIT_NPROC` bind them.
    pub run_as: Option<(u32, u32)>,
    /// `readOnlyRootFilesystem`: nothing but the volumes (and `/tmp`) is writable.
    pub read_only_root: bool,
    /// `resources.limits.memory` in bytes, enforced per process as `RLIMIT_DATA` (private
    /// memory: an allocation past it fails) rather than by a cgroup (no OOM kill).
    pub memory_limit: Option<u64>,
}

impl Confinement {
    /// The host command that starts `program` confined: `prlimit --data=N --` for the
    /// memory limit, `setpriv --reuid=U --regid=G --clear-groups --` for the user, each
    /// from util-linux, then `program`. Empty confinement: `program` alone.
    pub fn wrap(&self, program: &std::ffi::OsStr) -> Vec<std::ffi::OsString> {
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(bytes) = self.memory_limit {
            argv.extend([
                tool("prlimit"),
                format!("--data={bytes}").into(),
                "--".into(),
            ]);
        }
        if let Some((uid, gid)) = self.run_as {
            argv.extend([
                tool("setpriv"),
                format!("--reuid={uid}").into(),
                format!("--regid={gid}").into(),
                "--clear-groups".into(),
                "--".into(),
            ]);
        }
        argv.push(program.to_owned());
        argv
    }
}

/// How a container ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainerExit {
    /// Exit code (128 + signal when killed by a signal).
    pub exit_code: i32,
    /// Whether the kubelet killed it.
    pub killed: bool,
    /// Whether it was killed for exceeding its memory limit: the kubelet
    /// reports the container `terminated` with reason `OOMKilled`, as a
    /// node does after a cgroup OOM kill. The bundled executors enforce no
    /// memory limit and always say false; test executors set it to simulate
    /// an OOM kill.
    pub oom_killed: bool,
}

/// Failure to start or wait for a container.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// The container has no command (images' entrypoints are not known here).
    #[error("container {container} has no command; testkit cannot run image entrypoints")]
    NoCommand {
        /// Container name.
        container: String,
    },
    /// Spawning failed.
    #[error("failed to start container {container}")]
    Spawn {
        /// Container name.
        container: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Resolves when the kubelet wants the container killed.
#[derive(Debug, Clone)]
pub struct KillSignal(watch::Receiver<bool>);

impl KillSignal {
    /// A signal and the sender that fires it.
    pub fn new() -> (watch::Sender<bool>, Self) {
        let (tx, rx) = watch::channel(false);
        (tx, Self(rx))
    }

    /// Wait until killed. A dropped sender (the kubelet went away) counts as a kill.
    pub async fn killed(&mut self) {
        let _ = self.0.wait_for(|k| *k).await;
    }

    /// Whether the kill has fired (or the kubelet went away).
    pub fn is_killed(&self) -> bool {
        *self.0.borrow() || self.0.has_changed().is_err()
    }
}

/// `name`'s path on `PATH` (so that it is found whatever environment the child gets), else
/// the bare name.
fn tool(name: &str) -> std::ffi::OsString {
    std::env::var_os("PATH")
        .and_then(|path| {
            std::env::split_paths(&path)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
        .map_or_else(|| name.into(), PathBuf::into_os_string)
}

/// Boxed future returned by executors.
pub type ExecFuture = Pin<Box<dyn Future<Output = Result<ContainerExit, ExecutorError>> + Send>>;

/// Runs containers for the simulated kubelet.
pub trait ContainerExecutor: Send + Sync + 'static {
    /// Run one container to completion, or until `kill` fires.
    fn run(&self, launch: ContainerLaunch, kill: KillSignal) -> ExecFuture;
}

/// Runs a container as a local process. Container mount paths cannot be honoured
/// without a sandbox, so every occurrence of a `mountPath` prefix in the command,
/// arguments, environment and working directory is rewritten to the host
/// directory, and `TESTKIT_VOLUME_<NAME>` points at each volume.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessExecutor;

/// Kills a container's whole process group if its task is dropped before the
/// container exited (test runtime shutting down, kubelet dropped): `kill_on_drop`
/// alone would leave a shell's children running.
struct GroupGuard(Option<u32>);

impl GroupGuard {
    fn kill(&mut self) {
        if let Some(pid) = self.0.take() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

fn rewrite(s: &str, mounts: &[Mount]) -> String {
    let mut sorted: Vec<&Mount> = mounts.iter().collect();
    sorted.sort_by_key(|m| std::cmp::Reverse(m.container_path.len()));
    let mut out = s.to_owned();
    for m in sorted {
        let host = m.host_path.to_string_lossy();
        out = out.replace(&m.container_path, &host);
    }
    out
}

impl ContainerExecutor for ProcessExecutor {
    fn run(&self, launch: ContainerLaunch, mut kill: KillSignal) -> ExecFuture {
        Box::pin(async move {
            let Some((program, args)) = launch.argv.split_first() else {
                return Err(ExecutorError::NoCommand {
                    container: launch.container.clone(),
                });
            };
            let spawn_err = |source| ExecutorError::Spawn {
                container: launch.container.clone(),
                source,
            };
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&launch.log_path)
                .map_err(spawn_err)?;
            let log2 = log.try_clone().map_err(spawn_err)?;
            let program = rewrite(program, &launch.mounts);
            let wrapped = launch.confinement.wrap(program.as_ref());
            let mut cmd = tokio::process::Command::new(&wrapped[0]);
            cmd.args(&wrapped[1..])
                .args(args.iter().map(|a| rewrite(a, &launch.mounts)))
                .stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(log2))
                .kill_on_drop(true)
                .process_group(0);
            for (k, v) in &launch.env {
                cmd.env(k, rewrite(v, &launch.mounts));
            }
            for m in launch.mounts.iter().filter(|m| !m.volume.is_empty()) {
                let var = m.volume.to_uppercase().replace(['-', '.'], "_");
                cmd.env(format!("TESTKIT_VOLUME_{var}"), &m.host_path);
            }
            if let Some(dir) = &launch.working_dir {
                cmd.current_dir(rewrite(dir, &launch.mounts));
            }
            let mut child = cmd.spawn().map_err(spawn_err)?;
            let mut guard = GroupGuard(child.id());
            tokio::select! {
                status = child.wait() => {
                    // The leader exited normally: do not signal a group id that may be reused.
                    guard.0 = None;
                    let status = status.map_err(spawn_err)?;
                    let code = status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1);
                    Ok(ContainerExit { exit_code: code, killed: false, oom_killed: false })
                }
                () = kill.killed() => {
                    // Kill the whole process group so shells' children die too.
                    guard.kill();
                    let _ = child.kill().await;
                    let status = child.wait().await.map_err(spawn_err)?;
                    let code = status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(137);
                    Ok(ContainerExit { exit_code: code, killed: true, oom_killed: false })
                }
            }
        })
    }
}
