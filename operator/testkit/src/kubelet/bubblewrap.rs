//! A `ContainerExecutor` that runs each container in a bubblewrap sandbox, so
//! pods the operator creates run isolated in tests as they would under a
//! sandboxed runtime class: their own mount, PID, network, IPC and UTS
//! namespaces (no route out; a pod whose NetworkPolicy lets it reach a
//! Service joins the network namespace `network.rs` built for it instead,
//! through `nsenter`), the host's `/usr` read-only, a private `/tmp`,
//! each volume bind-mounted at its `mountPath` (read-only when the pod says
//! so), a cleared environment with only the container's variables, and the
//! whole sandbox killed with its process group.

use std::{
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::Stdio,
};

use super::executor::{
    ContainerExecutor, ContainerExit, ContainerLaunch, ExecFuture, ExecutorError, KillSignal,
};

/// Runs containers under `bwrap`.
#[derive(Debug, Clone)]
pub struct BubblewrapContainerExecutor {
    bwrap: PathBuf,
}

impl BubblewrapContainerExecutor {
    /// Finds `bwrap` on `PATH`; `None` when bubblewrap is not installed.
    pub fn from_path() -> Option<Self> {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path)
            .map(|d| d.join("bwrap"))
            .find(|p| p.is_file())
            .map(|bwrap| Self { bwrap })
    }

    /// The bwrap arguments for one container (everything before the argv).
    pub fn arguments(launch: &ContainerLaunch) -> Vec<String> {
        // A pod with egress joined its network namespace already (through
        // `nsenter`): everything `--unshare-all` does but the network.
        let unshare: &[&str] = if launch.network.is_some() {
            &[
                "--unshare-user-try",
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ]
        } else {
            &["--unshare-all"]
        };
        let mut a: Vec<String> = unshare.iter().map(|s| s.to_string()).collect();
        a.extend(
            [
                "--die-with-parent",
                "--new-session",
                "--ro-bind",
                "/usr",
                "/usr",
                "--proc",
                "/proc",
                "--dev",
                "/dev",
                "--tmpfs",
                "/tmp",
                "--clearenv",
            ]
            .iter()
            .map(|s| s.to_string()),
        );
        // Merged-/usr systems link /bin, /lib… into /usr; others get read-only binds.
        for dir in ["bin", "sbin", "lib", "lib32", "lib64"] {
            let host = Path::new("/").join(dir);
            match std::fs::symlink_metadata(&host) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(&host) {
                        a.extend([
                            "--symlink".into(),
                            target.to_string_lossy().into_owned(),
                            host.to_string_lossy().into_owned(),
                        ]);
                    }
                }
                Ok(_) => a.extend([
                    "--ro-bind".into(),
                    host.to_string_lossy().into_owned(),
                    host.to_string_lossy().into_owned(),
                ]),
                Err(_) => {}
            }
        }
        for m in &launch.mounts {
            let flag = if m.read_only { "--ro-bind" } else { "--bind" };
            a.extend([
                flag.into(),
                m.host_path.to_string_lossy().into_owned(),
                m.container_path.clone(),
            ]);
        }
        a.extend([
            "--setenv".into(),
            "PATH".into(),
            "/usr/local/bin:/usr/bin:/bin".into(),
        ]);
        for (k, v) in &launch.env {
            a.extend(["--setenv".into(), k.clone(), v.clone()]);
        }
        if launch.confinement.read_only_root {
            a.extend([
                "--remount-ro".into(),
                "/dev".into(),
                "--remount-ro".into(),
                "/".into(),
            ]);
        }
        if let Some(dir) = &launch.working_dir {
            a.extend(["--chdir".into(), dir.clone()]);
        }
        a.push("--".into());
        a
    }
}

impl ContainerExecutor for BubblewrapContainerExecutor {
    fn run(&self, launch: ContainerLaunch, mut kill: KillSignal) -> ExecFuture {
        let bwrap = self.bwrap.clone();
        Box::pin(async move {
            if launch.argv.is_empty() {
                return Err(ExecutorError::NoCommand {
                    container: launch.container.clone(),
                });
            }
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
            // The pod's network first (entering a namespace needs root), then the node's
            // confinement (which may drop to the container's user), then bubblewrap.
            let mut wrapped: Vec<std::ffi::OsString> = Vec::new();
            if let Some(net) = &launch.network {
                let nsenter = super::network::find_on_path("nsenter").ok_or_else(|| {
                    spawn_err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "the pod has egress, but `nsenter` (util-linux) is not installed",
                    ))
                })?;
                wrapped.extend([
                    nsenter.into_os_string(),
                    format!("--net={}", net.netns.display()).into(),
                    "--".into(),
                ]);
            }
            wrapped.extend(launch.confinement.wrap(bwrap.as_os_str()));
            let mut cmd = tokio::process::Command::new(&wrapped[0]);
            cmd.args(&wrapped[1..])
                .args(Self::arguments(&launch))
                .args(&launch.argv)
                .env_clear()
                .stdin(Stdio::null())
                .stdout(Stdio::from(log))
                .stderr(Stdio::from(log2))
                .kill_on_drop(true)
                .process_group(0);
            let mut child = cmd.spawn().map_err(spawn_err)?;
            let code = |s: std::process::ExitStatus| {
                s.code()
                    .or_else(|| s.signal().map(|n| 128 + n))
                    .unwrap_or(137)
            };
            tokio::select! {
                status = child.wait() => Ok(ContainerExit { exit_code: code(status.map_err(spawn_err)?), killed: false, oom_killed: false }),
                () = kill.killed() => {
                    // bwrap dies with its session; its PID namespace takes every child along.
                    let _ = child.kill().await;
                    let status = child.wait().await.map_err(spawn_err)?;
                    Ok(ContainerExit { exit_code: code(status), killed: true, oom_killed: false })
                }
            }
        })
    }
}
