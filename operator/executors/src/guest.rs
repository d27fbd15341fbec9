//! The in-guest resource-limit supervisor (contract §2.8, research note §9.3):
//! `protobot sandbox supervise --cpu-seconds N --processes N --file-size-bytes N
//! --open-files N -- CMD ARGS…` sets those rlimits on its own process and then
//! becomes the role's command.
//!
//! A pod has no field for accumulated CPU time, a process count, the largest
//! file or open descriptors, so the Kubernetes executor runs the role's command
//! through this mode of the protobot binary (delivered into the pod by an init
//! container, see `protobot-kube-executor`). Limits are inherited across `fork`
//! and `exec`, so every process of the run is bound by them:
//! - `--cpu-seconds N`: `RLIMIT_CPU` soft N (SIGXCPU), hard N+1 (SIGKILL for a
//!   process that ignores SIGXCPU);
//! - `--processes N`: `RLIMIT_NPROC` = N. The kernel counts the processes of the
//!   sandbox's uid in its user namespace (in a Kata guest or a gVisor sandbox: the
//!   pod's own); root is exempt, which the restricted profile rules out;
//! - `--file-size-bytes N`: `RLIMIT_FSIZE` = N (SIGXFSZ, or `EFBIG` where the
//!   signal is ignored);
//! - `--open-files N`: `RLIMIT_NOFILE` = N (`EMFILE`).
//!
//! The process then `exec`s the command, so it is the command (same pid, same
//! environment). One exception: PID 1 of a PID namespace (a container's first
//! process) is immune to signals it has no handler for, SIGXCPU and SIGXFSZ
//! included, so a command exec'd as PID 1 would never see its CPU soft limit or
//! its file-size signal. As PID 1 the supervisor therefore runs the command as its
//! child instead, reaps every orphan the command leaves, and exits with the
//! command's status (128 + the signal when a signal ended it, as a shell does).
//!
//! Failures never run the command: a limit that cannot be set (above the hard
//! limit the supervisor inherited, or refused by the kernel) exits 125, a command
//! that cannot be executed 126, one that does not exist 127; each prints one line
//! naming the limit or the program and what to do.
//!
//! No `unsafe`: `setrlimit`, `getrlimit` and `wait` come from `rustix`'s safe API
//! and `exec` from [`std::os::unix::process::CommandExt`].

use std::{ffi::OsString, io, os::unix::process::CommandExt, process::Command};

use rustix::process::{Resource, Rlimit, WaitOptions};

/// Exit status when a limit cannot be set or the arguments are wrong.
pub const EXIT_LIMIT_NOT_SET: u8 = 125;
/// Exit status when the command exists but cannot be executed.
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// Exit status when the command does not exist.
pub const EXIT_NOT_FOUND: u8 = 127;

/// The limits to set; `None` leaves a limit as inherited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GuestLimits {
    /// CPU seconds (`RLIMIT_CPU`).
    pub cpu_seconds: Option<u64>,
    /// Processes of the sandbox user (`RLIMIT_NPROC`).
    pub processes: Option<u64>,
    /// Largest file, bytes (`RLIMIT_FSIZE`).
    pub file_size_bytes: Option<u64>,
    /// Open file descriptors (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
}

/// One rlimit to set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSetting {
    /// The contract's limit name (`cpu`, `process-count`, `file-size`, `open-files`).
    pub limit: &'static str,
    /// The option that configures it.
    pub option: &'static str,
    /// The resource.
    pub resource: Resource,
    /// Soft limit.
    pub soft: u64,
    /// Hard limit.
    pub hard: u64,
}

/// Why the supervisor did not run the command.
#[derive(Debug, thiserror::Error)]
pub enum SuperviseError {
    /// A limit of zero.
    #[error(
        "sandbox.fail_closed: {option} 0 would deny everything (limit {limit}); give a positive value"
    )]
    Zero {
        /// The limit.
        limit: &'static str,
        /// Its option.
        option: &'static str,
    },
    /// No limit at all.
    #[error(
        "sandbox.fail_closed: no limit given; pass at least one of --cpu-seconds, --processes, --file-size-bytes, --open-files"
    )]
    NoLimit,
    /// No command.
    #[error("no command given; write the role's command after `--`")]
    NoCommand,
    /// The pod's NetworkPolicy was not in force in time: an address it denies still answered.
    #[error(
        "sandbox.fail_closed: the pod's NetworkPolicy is not in force after {waited:?}: the API server at {canary}, which a sandbox may not reach, still accepts connections; check that the cluster's network plugin enforces NetworkPolicy"
    )]
    PolicyNotEnforced {
        /// The address that answered.
        canary: std::net::SocketAddr,
        /// How long the supervisor waited.
        waited: std::time::Duration,
    },
    /// The inherited hard limit is lower than the one asked for: an unprivileged
    /// process cannot raise it.
    #[error(
        "sandbox.fail_closed: cannot set {option} {value} (limit {limit}): the inherited hard limit is {hard}, and a process may only lower it; lower the run's limit or raise the container runtime's default"
    )]
    AboveHardLimit {
        /// The limit.
        limit: &'static str,
        /// Its option.
        option: &'static str,
        /// The hard limit asked for.
        value: u64,
        /// The inherited hard limit.
        hard: u64,
    },
    /// `setrlimit` failed.
    #[error("sandbox.fail_closed: setting {option} {value} (limit {limit}) failed")]
    Set {
        /// The limit.
        limit: &'static str,
        /// Its option.
        option: &'static str,
        /// The value.
        value: u64,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// The limit read back is not the one set.
    #[error(
        "sandbox.fail_closed: {option} reads back as soft {soft:?} hard {hard:?} after setting {value} (limit {limit}); the kernel did not apply it"
    )]
    NotApplied {
        /// The limit.
        limit: &'static str,
        /// Its option.
        option: &'static str,
        /// The value set.
        value: u64,
        /// Soft limit read back.
        soft: Option<u64>,
        /// Hard limit read back.
        hard: Option<u64>,
    },
    /// The command could not be executed.
    #[error("sandbox.fail_closed: cannot execute {program:?}")]
    Exec {
        /// The program.
        program: OsString,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Waiting for the command (as PID 1) failed.
    #[error("waiting for {program:?} failed")]
    Wait {
        /// The program.
        program: OsString,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl SuperviseError {
    /// The supervisor's exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            SuperviseError::Exec { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                EXIT_NOT_FOUND
            }
            SuperviseError::Exec { .. } => EXIT_CANNOT_EXECUTE,
            _ => EXIT_LIMIT_NOT_SET,
        }
    }
}

/// The rlimits `limits` stand for (pure): refuses zeros and an empty set.
pub fn plan(limits: &GuestLimits) -> Result<Vec<LimitSetting>, SuperviseError> {
    let entries = [
        ("cpu", "--cpu-seconds", Resource::Cpu, limits.cpu_seconds),
        (
            "process-count",
            "--processes",
            Resource::Nproc,
            limits.processes,
        ),
        (
            "file-size",
            "--file-size-bytes",
            Resource::Fsize,
            limits.file_size_bytes,
        ),
        (
            "open-files",
            "--open-files",
            Resource::Nofile,
            limits.open_files,
        ),
    ];
    let mut out = Vec::new();
    for (limit, option, resource, value) in entries {
        let Some(value) = value else { continue };
        if value == 0 {
            return Err(SuperviseError::Zero { limit, option });
        }
        // CPU: SIGXCPU at the soft limit, SIGKILL one second later for a process that
        // ignores it (soft = hard would send SIGKILL straight away, hiding the cause).
        let hard = if resource == Resource::Cpu {
            value.saturating_add(1)
        } else {
            value
        };
        out.push(LimitSetting {
            limit,
            option,
            resource,
            soft: value,
            hard,
        });
    }
    if out.is_empty() {
        return Err(SuperviseError::NoLimit);
    }
    Ok(out)
}

/// Sets every limit of `plan` on this process and reads each back.
pub fn apply(plan: &[LimitSetting]) -> Result<(), SuperviseError> {
    for s in plan {
        let inherited = rustix::process::getrlimit(s.resource);
        if let Some(hard) = inherited.maximum
            && hard < s.hard
        {
            return Err(SuperviseError::AboveHardLimit {
                limit: s.limit,
                option: s.option,
                value: s.hard,
                hard,
            });
        }
        rustix::process::setrlimit(
            s.resource,
            Rlimit {
                current: Some(s.soft),
                maximum: Some(s.hard),
            },
        )
        .map_err(|e| SuperviseError::Set {
            limit: s.limit,
            option: s.option,
            value: s.soft,
            source: e.into(),
        })?;
        let now = rustix::process::getrlimit(s.resource);
        if now.current != Some(s.soft) || now.maximum != Some(s.hard) {
            return Err(SuperviseError::NotApplied {
                limit: s.limit,
                option: s.option,
                value: s.soft,
                soft: now.current,
                hard: now.maximum,
            });
        }
    }
    Ok(())
}

/// Whether `name` is a variable every kubelet puts into every container whatever the pod
/// asks (`enableServiceLinks: false` removes the namespace's services, never these): the
/// API server's address as `KUBERNETES_SERVICE_*` and `KUBERNETES_PORT*`. The role's command
/// does not get them (SB-CRED-001: only allowlisted names in a sandbox's environment; found
/// on the real node, which the simulated one did not do).
pub fn injected_by_the_node(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| n.starts_with("KUBERNETES_SERVICE_") || n.starts_with("KUBERNETES_PORT"))
}

/// How long the supervisor waits for the pod's NetworkPolicy to be in force.
pub const POLICY_WAIT: std::time::Duration = std::time::Duration::from_secs(15);

/// The address the kubelet gave this container for the API server (`KUBERNETES_SERVICE_HOST`
/// and `KUBERNETES_SERVICE_PORT`): every sandbox's NetworkPolicy denies it, so it answers a
/// connection only while the policy is not yet in force. `None` outside a pod.
pub fn policy_canary(
    vars: impl IntoIterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> Option<std::net::SocketAddr> {
    let (mut host, mut port) = (None, None);
    for (name, value) in vars {
        match name.to_str() {
            Some("KUBERNETES_SERVICE_HOST") => host = value.into_string().ok(),
            Some("KUBERNETES_SERVICE_PORT") => port = value.into_string().ok(),
            _ => {}
        }
    }
    let ip: std::net::IpAddr = host?.trim().parse().ok()?;
    let port: u16 = port?.trim().parse().ok()?;
    Some(std::net::SocketAddr::new(ip, port))
}

/// Waits, at most `limit`, until `canary` no longer accepts a TCP connection (each attempt
/// bounded by `attempt`): the pod's NetworkPolicy is in force. Some enforcers (kube-router)
/// program a pod's rules from their pod watch, after its containers started; the role's
/// command must not run in that window (found on the real node). Returns how long it waited.
pub fn await_network_policy(
    canary: std::net::SocketAddr,
    limit: std::time::Duration,
    attempt: std::time::Duration,
) -> Result<std::time::Duration, SuperviseError> {
    let start = std::time::Instant::now();
    loop {
        match std::net::TcpStream::connect_timeout(&canary, attempt) {
            Err(_) => return Ok(start.elapsed()),
            Ok(_) if start.elapsed() >= limit => {
                return Err(SuperviseError::PolicyNotEnforced {
                    canary,
                    waited: start.elapsed(),
                });
            }
            // The network plugin offers no event to wait on from inside the sandbox: the
            // condition is polled, paced so the denied address is not hammered.
            #[expect(
                clippy::disallowed_methods,
                reason = "polls a condition with no notification, paced at 100 ms"
            )]
            Ok(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// Sets `limits` and becomes `command` (see the module documentation). Returns
/// only when the command did not run (`Err`), or, as PID 1, with the command's
/// exit status.
pub fn supervise(limits: &GuestLimits, command: &[OsString]) -> Result<u8, SuperviseError> {
    let settings = plan(limits)?;
    let Some((program, args)) = command.split_first() else {
        return Err(SuperviseError::NoCommand);
    };
    apply(&settings)?;
    if let Some(canary) = policy_canary(std::env::vars_os()) {
        await_network_policy(canary, POLICY_WAIT, std::time::Duration::from_millis(300))?;
    }
    let mut cmd = Command::new(program);
    cmd.args(args);
    for (name, _) in std::env::vars_os() {
        if injected_by_the_node(&name) {
            cmd.env_remove(&name);
        }
    }
    if !rustix::process::getpid().is_init() {
        let source = cmd.exec();
        return Err(SuperviseError::Exec {
            program: program.clone(),
            source,
        });
    }
    let child = cmd.spawn().map_err(|source| SuperviseError::Exec {
        program: program.clone(),
        source,
    })?;
    let pid = rustix::process::Pid::from_child(&child);
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((reaped, status))) if reaped == pid => {
                return Ok(exit_status_of(
                    status.exit_status(),
                    status.terminating_signal(),
                ));
            }
            // An orphan of the command, reparented to PID 1: reaped so it does not
            // count against the process limit.
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => {
                return Err(SuperviseError::Wait {
                    program: program.clone(),
                    source: e.into(),
                });
            }
        }
    }
}

/// Why the supervisor binary could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// This binary's path is unknown.
    #[error("cannot find this binary (/proc/self/exe)")]
    CurrentExe(#[source] io::Error),
    /// Copying failed.
    #[error("cannot copy {from} to {to}; the directory must exist and be writable (an emptyDir)")]
    Copy {
        /// This binary.
        from: std::path::PathBuf,
        /// The destination.
        to: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// Copies this binary to `to` with mode 0755, through a temporary name in the same
/// directory, so a reader never sees half a binary (the init container of a sandbox
/// pod runs this to deliver the supervisor into the pod's `emptyDir`).
pub fn install_self(to: &std::path::Path) -> Result<(), InstallError> {
    use std::os::unix::fs::PermissionsExt;
    let from = std::env::current_exe().map_err(InstallError::CurrentExe)?;
    let copy_err = |source| InstallError::Copy {
        from: from.clone(),
        to: to.to_owned(),
        source,
    };
    let mut partial = to.as_os_str().to_owned();
    partial.push(".partial");
    let partial = std::path::PathBuf::from(partial);
    std::fs::copy(&from, &partial).map_err(copy_err)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755)).map_err(copy_err)?;
    std::fs::rename(&partial, to).map_err(copy_err)
}

/// The exit status a shell would report for a child's end (pure).
pub fn exit_status_of(code: Option<i32>, signal: Option<i32>) -> u8 {
    match (code, signal) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(s)) => u8::try_from((128 + s).clamp(0, 255)).unwrap_or(255),
        (None, None) => 1,
    }
}

/// The supervisor's argument vector (after the program name) for `limits` and
/// `command`: `sandbox supervise --cpu-seconds … -- command…`. The Kubernetes
/// executor builds the sandbox container's command with it.
pub fn supervise_args(limits: &GuestLimits, command: &[String]) -> Vec<String> {
    let mut a = vec!["sandbox".to_owned(), "supervise".to_owned()];
    for (option, value) in [
        ("--cpu-seconds", limits.cpu_seconds),
        ("--processes", limits.processes),
        ("--file-size-bytes", limits.file_size_bytes),
        ("--open-files", limits.open_files),
    ] {
        if let Some(v) = value {
            a.push(option.to_owned());
            a.push(v.to_string());
        }
    }
    a.push("--".to_owned());
    a.extend(command.iter().cloned());
    a
}

/// The guest limits of a run's [`protobot_jobsite::executor::Limits`]: CPU time
/// rounded up to whole seconds (at least 1), the rest as given.
pub fn guest_limits(l: &protobot_jobsite::executor::Limits) -> GuestLimits {
    let cpu = l.cpu.as_secs() + u64::from(l.cpu.subsec_nanos() > 0);
    GuestLimits {
        cpu_seconds: Some(cpu.max(1)),
        processes: Some(l.processes),
        file_size_bytes: Some(l.file_size_bytes),
        open_files: Some(l.open_files),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn the_policy_canary_is_the_api_servers_address_from_the_kubelet() {
        let vars = |pairs: &[(&str, &str)]| -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        assert_eq!(
            policy_canary(vars(&[
                ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
                ("KUBERNETES_SERVICE_PORT", "443"),
                ("PATH", "/bin"),
            ])),
            Some("10.96.0.1:443".parse().unwrap())
        );
        assert_eq!(policy_canary(vars(&[("PATH", "/bin")])), None, "not a pod");
        for (host, port) in [
            ("not-an-ip", "443"),
            ("10.96.0.1", "https"),
            ("10.96.0.1", ""),
        ] {
            assert_eq!(
                policy_canary(vars(&[
                    ("KUBERNETES_SERVICE_HOST", host),
                    ("KUBERNETES_SERVICE_PORT", port),
                ])),
                None,
                "{host}:{port}"
            );
        }
    }

    #[test]
    fn the_command_waits_until_the_denied_address_stops_answering_and_fails_closed_if_it_never_does()
     {
        // An address that answers: the policy is not in force; bounded, then refused.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let open = listener.local_addr().unwrap();
        let e = await_network_policy(open, Duration::from_millis(300), Duration::from_millis(100))
            .unwrap_err();
        assert!(matches!(e, SuperviseError::PolicyNotEnforced { canary, .. } if canary == open));
        assert!(e.to_string().contains("sandbox.fail_closed"), "{e}");
        assert_eq!(e.exit_code(), EXIT_LIMIT_NOT_SET);
        // Once nothing answers there, the command may start.
        drop(listener);
        let waited =
            await_network_policy(open, Duration::from_secs(5), Duration::from_millis(100)).unwrap();
        assert!(waited < Duration::from_secs(1), "{waited:?}");
    }

    #[test]
    fn the_kubelets_api_server_variables_are_dropped_and_nothing_else() {
        for name in [
            "KUBERNETES_SERVICE_HOST",
            "KUBERNETES_SERVICE_PORT",
            "KUBERNETES_SERVICE_PORT_HTTPS",
            "KUBERNETES_PORT",
            "KUBERNETES_PORT_443_TCP_ADDR",
        ] {
            assert!(injected_by_the_node(std::ffi::OsStr::new(name)), "{name}");
        }
        for name in [
            "PATH",
            "HOME",
            "PROTOBOT_OUT",
            "KUBERNETES",
            "MY_KUBERNETES_PORT",
            "",
        ] {
            assert!(!injected_by_the_node(std::ffi::OsStr::new(name)), "{name}");
        }
    }

    use super::*;

    #[test]
    fn the_plan_sets_soft_and_hard_and_gives_cpu_a_second_for_sigxcpu() {
        let p = plan(&GuestLimits {
            cpu_seconds: Some(3),
            processes: Some(16),
            file_size_bytes: Some(1 << 20),
            open_files: Some(32),
        })
        .unwrap();
        let got: Vec<(&str, u64, u64)> = p.iter().map(|s| (s.limit, s.soft, s.hard)).collect();
        assert_eq!(
            got,
            vec![
                ("cpu", 3, 4),
                ("process-count", 16, 16),
                ("file-size", 1 << 20, 1 << 20),
                ("open-files", 32, 32),
            ]
        );
    }

    #[test]
    fn zero_and_empty_plans_are_refused_with_exit_125() {
        let e = plan(&GuestLimits {
            open_files: Some(0),
            ..GuestLimits::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("--open-files 0"), "{e}");
        assert_eq!(e.exit_code(), EXIT_LIMIT_NOT_SET);
        let e = plan(&GuestLimits::default()).unwrap_err();
        assert!(matches!(e, SuperviseError::NoLimit), "{e}");
        assert_eq!(e.exit_code(), EXIT_LIMIT_NOT_SET);
    }

    #[test]
    fn exec_failures_map_to_126_and_127() {
        let nf = SuperviseError::Exec {
            program: "x".into(),
            source: io::Error::from(io::ErrorKind::NotFound),
        };
        assert_eq!(nf.exit_code(), EXIT_NOT_FOUND);
        let denied = SuperviseError::Exec {
            program: "x".into(),
            source: io::Error::from(io::ErrorKind::PermissionDenied),
        };
        assert_eq!(denied.exit_code(), EXIT_CANNOT_EXECUTE);
    }

    #[test]
    fn statuses_map_like_a_shell() {
        assert_eq!(exit_status_of(Some(0), None), 0);
        assert_eq!(exit_status_of(Some(3), None), 3);
        assert_eq!(exit_status_of(None, Some(24)), 152);
        assert_eq!(exit_status_of(None, Some(9)), 137);
    }

    #[test]
    fn run_limits_become_supervisor_arguments() {
        let limits = protobot_jobsite::executor::Limits {
            cpu: Duration::from_millis(1500),
            processes: 64,
            file_size_bytes: 1 << 20,
            open_files: 256,
            ..Default::default()
        };
        let args = supervise_args(
            &guest_limits(&limits),
            &["sh".into(), "-c".into(), "x".into()],
        );
        assert_eq!(
            args,
            [
                "sandbox",
                "supervise",
                "--cpu-seconds",
                "2",
                "--processes",
                "64",
                "--file-size-bytes",
                "1048576",
                "--open-files",
                "256",
                "--",
                "sh",
                "-c",
                "x"
            ]
        );
    }
}
