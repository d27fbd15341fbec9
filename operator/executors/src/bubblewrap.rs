//! [`BubblewrapExecutor`]: the single-machine sandbox of the execution
//! contract (ARCHITECTURE.md §4, jobsite-sandbox/v1 local profile).
//!
//! Each run:
//! - copies `RunSpec::workspace` into a fresh directory under the scratch
//!   root (never bind-mounting the export directory), refusing a workspace
//!   whose git metadata reaches outside it (alternates, remotes, gitdir
//!   links) and scrubbing reflogs;
//! - starts `bwrap --unshare-all --die-with-parent --new-session` with only
//!   `/usr` (plus the `/bin`, `/lib*`, `/sbin` links), a short `/etc`
//!   allowlist, a fresh `/proc`, a minimal `/dev`, a private size-capped
//!   tmpfs `/tmp`, the copy at `/workspace`, `/out`, and `/task/task.json`
//!   read-only; the root and `/dev` are remounted read-only (so there is no
//!   `/dev/shm`). Nothing else of the host exists inside: no home
//!   directories, no control-plane state, no credentials;
//! - gives it an environment of `PATH`, `HOME=/tmp`, `PROTOBOT_WORKSPACE`,
//!   `PROTOBOT_OUT`, `PROTOBOT_TASK` and `RunSpec::env` (plus `PWD`, which
//!   bwrap sets), nothing else;
//! - has no network: its own network namespace holds only `lo`. A run that
//!   asks for an egress proxy gets, when the executor has a
//!   [`BubblewrapConfig::egress`] session secret and runs as root, a network
//!   namespace whose only reachable address is `127.0.0.1:3128`, relayed to
//!   the proxy, and a signed session token at `/task/egress-session-token`
//!   ([`crate::egress`]); without a secret such a run is refused, unless
//!   [`BubblewrapConfig::no_network_instead_of_proxy`] allows running it with
//!   no network at all;
//! - applies rlimits by executing `bwrap` through util-linux `prlimit`
//!   (`RLIMIT_CPU`, `RLIMIT_AS`, `RLIMIT_NPROC`, `RLIMIT_FSIZE`,
//!   `RLIMIT_NOFILE`, no core files): the crate forbids `unsafe`, so no
//!   `pre_exec` hook. When the control plane is root, the sandbox runs under a
//!   dedicated uid per run (via `setpriv`), which makes `RLIMIT_NPROC` a real
//!   per-run process limit (root is exempt from it) and lets the executor
//!   prove with `/proc` that nothing of the run survives;
//! - enforces the wall clock and `cancel` by killing `bwrap`: its PID
//!   namespace init has a parent-death SIGKILL (`--die-with-parent`), and
//!   the kernel kills every process of a PID namespace when its init dies;
//! - copies `/out` into a new control-plane-owned directory under the output
//!   root, then removes the ephemeral directory.
//!
//! Termination mapping: bwrap reports a command killed by signal `n` as exit
//! code `128 + n`, so exit codes 129..=192 are reported as
//! [`Termination::Signaled`] (SIGXCPU as `LimitExceeded{cpu}`, SIGXFSZ as
//! `LimitExceeded{file-size}`); a command that deliberately exits with such a
//! code is indistinguishable. The address-space limit makes allocations fail
//! inside the command, which then exits however it handles that. `RLIMIT_CPU`
//! is per process; `RLIMIT_NPROC` counts bwrap's own two processes.

use std::{
    collections::{BTreeMap, HashSet},
    ffi::OsString,
    fs,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use protobot_jobsite::{
    executor::{Executor, ExecutorError, RunOutput, RunSpec, Termination},
    sandbox_audit::{SessionRecord, session_chain},
};
use tokio::{process::Command, sync::watch};

use crate::{
    conformance::{BackendIdentity, Capability, SandboxBackend},
    egress::{self, LocalEgress, NetNs, ProxyAddress, Relay},
    procfs,
    rundir::{self, Owner, RunDir},
    supervise::{self, Ending, KILL_WAIT},
    tools,
};

/// The profile name of the bubblewrap executor.
pub const LOCAL_PROFILE: &str = "local";

/// The message telling an operator how to get bubblewrap.
pub const INSTALL_HINT: &str = "install bubblewrap (`apt-get install -y --no-install-recommends bubblewrap`, \
     or your distribution's `bubblewrap` package), or run with `--insecure-no-sandbox` \
     to execute project code with NO isolation";

/// The `PATH` inside the sandbox.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Host `/etc` entries exposed read-only (name resolution tables, dynamic
/// linker cache, CA certificates, alternatives links); nothing secret.
const ETC_ALLOWLIST: [&str; 14] = [
    "/etc/alternatives",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/protocols",
    "/etc/services",
    "/etc/ssl/certs",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
];

/// Which host uid the sandbox runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SandboxIdentity {
    /// A dedicated uid per run when the control plane is root, else the
    /// control plane's own uid.
    Auto,
    /// A dedicated uid per run from `base..base + span` (needs root and
    /// `setpriv`). Such uids must not be used by anything else on the host.
    PerRunUid {
        /// First uid of the range.
        base: u32,
        /// Size of the range.
        span: u32,
    },
    /// The control plane's uid. `RLIMIT_NPROC` then counts every process of
    /// that user, and a root control plane is exempt from it.
    Current,
}

/// Configuration of a [`BubblewrapExecutor`].
#[derive(Clone, Debug)]
pub struct BubblewrapConfig {
    /// The `bwrap` binary; `None` searches `PATH`.
    pub bwrap: Option<PathBuf>,
    /// Where ephemeral run directories are made (must be reachable by the
    /// sandbox uid: the executor makes it mode 0711).
    pub scratch_root: PathBuf,
    /// Where collected `/out` folders are kept (control-plane owned).
    pub output_root: PathBuf,
    /// Sandbox uid policy.
    pub identity: SandboxIdentity,
    /// Proxied egress for runs whose spec names an egress proxy (needs root).
    /// `None`: such runs are refused (or run with no network, see below).
    pub egress: Option<LocalEgress>,
    /// Without [`Self::egress`], run specs asking for an egress proxy with no
    /// network at all instead of refusing them.
    pub no_network_instead_of_proxy: bool,
    /// Extra host paths mounted read-only at the same place (e.g. a
    /// toolchain directory). Never mount secrets or control-plane state.
    pub extra_ro_binds: Vec<PathBuf>,
    /// Raw `bwrap` arguments appended after the executor's own mounts. They
    /// can weaken the sandbox; the conformance suite is what catches that.
    pub extra_bwrap_args: Vec<String>,
}

impl BubblewrapConfig {
    /// A configuration keeping scratch and output under `base`.
    pub fn under(base: &Path) -> Self {
        BubblewrapConfig {
            bwrap: None,
            scratch_root: base.join("scratch"),
            output_root: base.join("out"),
            identity: SandboxIdentity::Auto,
            egress: None,
            no_network_instead_of_proxy: false,
            extra_ro_binds: Vec::new(),
            extra_bwrap_args: Vec::new(),
        }
    }
}

impl Default for BubblewrapConfig {
    fn default() -> Self {
        BubblewrapConfig::under(&std::env::temp_dir().join("protobot-sandbox"))
    }
}

/// Run ids in flight and sandbox uids in use, per executor process.
#[derive(Debug, Default)]
struct InFlight {
    run_ids: HashSet<String>,
    uids: HashSet<u32>,
}

/// Releases a run id (and uid) when the run ends, however it ends.
struct InFlightGuard {
    state: Arc<Mutex<InFlight>>,
    run_id: String,
    uid: Option<u32>,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if let Ok(mut s) = self.state.lock() {
            s.run_ids.remove(&self.run_id);
            if let Some(uid) = self.uid {
                s.uids.remove(&uid);
            }
        }
    }
}

/// The bubblewrap sandbox executor (profile `local`).
#[derive(Clone, Debug)]
pub struct BubblewrapExecutor {
    config: BubblewrapConfig,
    in_flight: Arc<Mutex<InFlight>>,
}

/// Host tools a sandboxed run needs.
struct Tools {
    bwrap: PathBuf,
    prlimit: PathBuf,
    setpriv: Option<PathBuf>,
}

/// What a run with egress needs, checked before anything is made.
struct EgressPlan {
    proxy: ProxyAddress,
    ip: PathBuf,
    nsenter: PathBuf,
}

/// The network of one run with proxied egress: kept alive for the run, torn
/// down (relay stopped, namespace deleted) when dropped.
struct EgressSetup {
    nsenter: PathBuf,
    // Field order is drop order: stop relaying before deleting the namespace.
    _relay: Relay,
    netns: NetNs,
}

impl BubblewrapExecutor {
    /// An executor with `config`. Never fails: a missing `bwrap` makes every
    /// run refuse with [`ExecutorError::Start`] and [`INSTALL_HINT`].
    pub fn new(config: BubblewrapConfig) -> Self {
        BubblewrapExecutor {
            config,
            in_flight: Arc::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &BubblewrapConfig {
        &self.config
    }

    /// The `bwrap` binary this executor would use, if present.
    pub fn bwrap_path(&self) -> Option<PathBuf> {
        match &self.config.bwrap {
            Some(p) => tools::is_executable(p).then(|| p.clone()),
            None => tools::find_on_path("bwrap"),
        }
    }

    /// Removes ephemeral run directories (`run-*`) left in the scratch root
    /// by a control plane that was killed mid-run; returns how many. Call it
    /// at startup, only when no other process shares this scratch root;
    /// refuses while this executor has runs in flight.
    pub fn remove_stale_run_dirs(&self) -> std::io::Result<usize> {
        let busy = self
            .in_flight
            .lock()
            .map(|s| !s.run_ids.is_empty())
            .unwrap_or(true);
        if busy {
            return Err(std::io::Error::other(
                "runs are in flight; remove stale run directories only at startup",
            ));
        }
        let entries = match fs::read_dir(&self.config.scratch_root) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut removed = 0;
        for entry in entries {
            let entry = entry?;
            if entry.file_name().to_string_lossy().starts_with("run-") {
                rundir::remove_tree(&entry.path())?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Whether runs get a dedicated uid.
    fn per_run_uid(&self) -> Option<(u32, u32)> {
        match self.config.identity {
            SandboxIdentity::PerRunUid { base, span } => Some((base, span.max(1))),
            SandboxIdentity::Auto if tools::effective_uid() == Some(0) => Some((200_000, 60_000)),
            _ => None,
        }
    }

    fn tools(&self, run_id: &str) -> Result<Tools, ExecutorError> {
        let refuse = |reason: String| ExecutorError::Start {
            run_id: run_id.to_owned(),
            reason,
        };
        let bwrap = self.bwrap_path().ok_or_else(|| {
            refuse(format!(
                "sandbox.fail_closed: bubblewrap (`bwrap`) was not found{}; {INSTALL_HINT}",
                self.config
                    .bwrap
                    .as_ref()
                    .map(|p| format!(" at {}", p.display()))
                    .unwrap_or_default()
            ))
        })?;
        let prlimit = tools::find_on_path("prlimit").ok_or_else(|| {
            refuse("sandbox.fail_closed: `prlimit` (util-linux) was not found; install util-linux to enforce resource limits".into())
        })?;
        let setpriv = match self.per_run_uid() {
            None => None,
            Some(_) => Some(tools::find_on_path("setpriv").ok_or_else(|| {
                refuse("sandbox.fail_closed: `setpriv` (util-linux) was not found; install util-linux to run sandboxes under a per-run uid".into())
            })?),
        };
        Ok(Tools {
            bwrap,
            prlimit,
            setpriv,
        })
    }

    /// Reserves the run id and, in per-run-uid mode, a uid no live process uses.
    fn reserve(&self, run_id: &str) -> Result<InFlightGuard, ExecutorError> {
        let refuse = |reason: String| ExecutorError::Start {
            run_id: run_id.to_owned(),
            reason,
        };
        let mut state = self.in_flight.lock().map_err(|_| {
            refuse("the executor's run registry is poisoned; restart the process".into())
        })?;
        if !state.run_ids.insert(run_id.to_owned()) {
            return Err(refuse(
                "a run with this id is already executing; wait for it to end".into(),
            ));
        }
        let mut uid = None;
        if let Some((base, span)) = self.per_run_uid() {
            let seed = tools::nonce()
                .bytes()
                .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
            let free = (0..span.min(4096))
                .map(|i| base + (seed.wrapping_add(i) % span))
                .find(|uid| !state.uids.contains(uid) && procfs::pids_with_uid(*uid).is_empty());
            let Some(free) = free else {
                state.run_ids.remove(run_id);
                return Err(refuse(format!(
                    "no free sandbox uid in {base}..{}; too many concurrent runs",
                    base + span
                )));
            };
            state.uids.insert(free);
            uid = Some(free);
        }
        let guard = InFlightGuard {
            state: self.in_flight.clone(),
            run_id: run_id.to_owned(),
            uid,
        };
        Ok(guard)
    }

    fn bwrap_args(&self, dir: &RunDir, spec: &RunSpec, own_netns: bool) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push =
            |items: &[&std::ffi::OsStr]| a.extend(items.iter().map(|s| s.to_os_string()));
        if own_netns {
            push(&["--unshare-all".as_ref()]);
        } else {
            // Everything `--unshare-all` does but the network: the run joined
            // the namespace the executor made for its egress already.
            push(&[
                "--unshare-ipc".as_ref(),
                "--unshare-pid".as_ref(),
                "--unshare-uts".as_ref(),
                "--unshare-cgroup-try".as_ref(),
            ]);
        }
        push(&[
            "--unshare-user".as_ref(),
            "--die-with-parent".as_ref(),
            "--new-session".as_ref(),
            "--hostname".as_ref(),
            "protobot-sandbox".as_ref(),
            "--ro-bind".as_ref(),
            "/usr".as_ref(),
            "/usr".as_ref(),
        ]);
        for top in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
            match fs::symlink_metadata(top) {
                Ok(m) if m.file_type().is_symlink() => {
                    if let Ok(target) = fs::read_link(top) {
                        push(&["--symlink".as_ref(), target.as_os_str(), top.as_ref()]);
                    }
                }
                Ok(m) if m.is_dir() => push(&["--ro-bind".as_ref(), top.as_ref(), top.as_ref()]),
                _ => {}
            }
        }
        for etc in ETC_ALLOWLIST {
            push(&["--ro-bind-try".as_ref(), etc.as_ref(), etc.as_ref()]);
        }
        let tmp_size = spec
            .limits
            .memory_bytes
            .min(spec.limits.file_size_bytes.saturating_mul(16))
            .to_string();
        push(&[
            "--proc".as_ref(),
            "/proc".as_ref(),
            "--dev".as_ref(),
            "/dev".as_ref(),
            "--size".as_ref(),
            tmp_size.as_ref(),
            "--tmpfs".as_ref(),
            "/tmp".as_ref(),
            "--bind".as_ref(),
            dir.workspace.as_os_str(),
            "/workspace".as_ref(),
            "--bind".as_ref(),
            dir.out.as_os_str(),
            "/out".as_ref(),
            "--ro-bind".as_ref(),
            dir.task_dir.as_os_str(),
            "/task".as_ref(),
        ]);
        for p in &self.config.extra_ro_binds {
            push(&["--ro-bind".as_ref(), p.as_os_str(), p.as_os_str()]);
        }
        // The root and /dev are bwrap's private tmpfs: make them read-only so
        // that only /workspace, /out and /tmp are writable.
        push(&[
            "--remount-ro".as_ref(),
            "/dev".as_ref(),
            "--remount-ro".as_ref(),
            "/".as_ref(),
            "--chdir".as_ref(),
            "/workspace".as_ref(),
        ]);
        a.extend(self.config.extra_bwrap_args.iter().map(OsString::from));
        a.push("--".into());
        a.extend(spec.command.iter().map(OsString::from));
        a
    }

    fn sandbox_env(spec: &RunSpec, egress: bool) -> BTreeMap<String, String> {
        let mut env: BTreeMap<String, String> = [
            ("PATH", SANDBOX_PATH),
            ("HOME", "/tmp"),
            ("PROTOBOT_WORKSPACE", "/workspace"),
            ("PROTOBOT_OUT", "/out"),
            ("PROTOBOT_TASK", "/task/task.json"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        env.extend(spec.env.clone());
        if egress {
            env.extend(egress::sandbox_env());
        }
        env
    }

    /// Checks that a run asking for egress can get it, before anything is made.
    fn egress_plan(&self, run_id: &str, proxy: &str) -> Result<EgressPlan, ExecutorError> {
        let refuse = |e: egress::EgressError| ExecutorError::Start {
            run_id: run_id.to_owned(),
            reason: format!("sandbox.fail_closed: {e}"),
        };
        let address = ProxyAddress::parse(proxy).map_err(refuse)?;
        if tools::effective_uid() != Some(0) {
            return Err(refuse(egress::EgressError::NotRoot));
        }
        let ip = tools::find_on_path("ip").ok_or(egress::EgressError::MissingTool {
            tool: "ip",
            package: "iproute2",
        });
        let nsenter = tools::find_on_path("nsenter").ok_or(egress::EgressError::MissingTool {
            tool: "nsenter",
            package: "util-linux",
        });
        Ok(EgressPlan {
            proxy: address,
            ip: ip.map_err(refuse)?,
            nsenter: nsenter.map_err(refuse)?,
        })
    }

    /// Stages the token and builds the run's namespace and relay.
    async fn egress_setup(
        &self,
        spec: &RunSpec,
        egress: &LocalEgress,
        plan: EgressPlan,
        dir: &RunDir,
        owner: Option<Owner>,
    ) -> Result<EgressSetup, ExecutorError> {
        let start_err = |reason: String| ExecutorError::Start {
            run_id: spec.run_id.clone(),
            reason: format!("sandbox.fail_closed: {reason}"),
        };
        let EgressPlan { proxy, ip, nsenter } = plan;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let token = protobot_egress::issue_session_token(
            &egress.session_secret,
            &egress::session_for(spec),
            egress::token_expiry(now, spec.limits.wall_clock, egress.token_grace),
        );
        let token_file = dir.task_dir.join(egress::TOKEN_FILE);
        // Named after the run, so a namespace left by a killed control plane says whose it was.
        let ns_name = format!(
            "protobot-{}-{}",
            tools::safe_component(&spec.run_id),
            tools::nonce()
        );
        let built = tokio::task::spawn_blocking(move || {
            crate::tree::write_new_file(&token_file, 0o400, token.as_bytes())
                .map_err(|e| e.to_string())?;
            if let Some(o) = owner {
                o.apply(&token_file).map_err(|e| e.to_string())?;
            }
            let netns = NetNs::create(&ip, &ns_name).map_err(|e| e.to_string())?;
            let listener = egress::bind_inside(&netns.path(), egress::SANDBOX_PROXY_PORT).map_err(
                |source| {
                    egress::EgressError::Bind {
                        netns: netns.name().to_owned(),
                        source,
                    }
                    .to_string()
                },
            )?;
            Ok::<_, String>((netns, listener))
        })
        .await
        .map_err(|e| start_err(format!("setting up egress panicked: {e}")))?
        .map_err(start_err)?;
        let (netns, listener) = built;
        let relay = Relay::start(listener, proxy)
            .map_err(|e| start_err(format!("failed to start the egress relay: {e}")))?;
        Ok(EgressSetup {
            nsenter,
            _relay: relay,
            netns,
        })
    }

    async fn run_checked(
        &self,
        mut spec: RunSpec,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        tools::validate_spec(&spec)?;
        let run_id = spec.run_id.clone();
        let mut egress_plan = None;
        if let Some(proxy) = &spec.egress_proxy {
            match &self.config.egress {
                Some(_) => egress_plan = Some(self.egress_plan(&run_id, proxy)?),
                None if self.config.no_network_instead_of_proxy => {
                    tracing::warn!(
                        run_id,
                        "egress proxy requested but this executor has no egress session secret: running with NO network"
                    );
                    spec.egress_proxy = None;
                }
                None => {
                    return Err(ExecutorError::Start {
                        run_id,
                        reason: format!(
                            "sandbox.fail_closed: the run asks for egress through the proxy {proxy:?}, but this \
                             bubblewrap executor has no egress session secret to give it a session token; \
                             configure one (BubblewrapConfig::egress, the proxy's --session-secret), or enable \
                             `no_network_instead_of_proxy` to run it without network"
                        ),
                    });
                }
            }
        }
        let tools = self.tools(&run_id)?;
        let guard = self.reserve(&run_id)?;
        let owner = guard.uid.map(|uid| Owner { uid, gid: uid });
        let name = format!("{}-{}", tools::safe_component(&run_id), tools::nonce());
        let (scratch, output) = (
            self.config.scratch_root.clone(),
            self.config.output_root.clone(),
        );
        let (source, task, dir_name) = (spec.workspace.clone(), spec.task.clone(), name.clone());
        let start_err = |reason: String| ExecutorError::Start {
            run_id: run_id.clone(),
            reason,
        };
        let dir = tokio::task::spawn_blocking(move || {
            rundir::ensure_dir(&scratch, 0o711)?;
            rundir::ensure_dir(&output, 0o700)?;
            RunDir::create(&scratch, &dir_name, &source, &task, owner)
        })
        .await
        .map_err(|e| start_err(format!("preparing the run directory panicked: {e}")))?
        .map_err(|e| start_err(format!("preparing the ephemeral workspace failed: {e}")))?;

        let result = match (&self.config.egress, egress_plan) {
            (Some(egress), Some(plan)) => {
                match self.egress_setup(&spec, egress, plan, &dir, owner).await {
                    Ok(setup) => {
                        let r = self
                            .execute(
                                &spec,
                                &dir,
                                &tools,
                                (guard.uid, &name),
                                Some(&setup),
                                cancel,
                            )
                            .await;
                        drop(setup);
                        r
                    }
                    Err(e) => Err(e),
                }
            }
            _ => {
                self.execute(&spec, &dir, &tools, (guard.uid, &name), None, cancel)
                    .await
            }
        };
        let root = dir.root.clone();
        let removed = tokio::task::spawn_blocking(move || rundir::remove_tree(&root)).await;
        let mut out = result?;
        match removed {
            Ok(Ok(())) => {
                let identity = self.identity();
                // Cancelled before the sandbox started: nothing ran.
                let started = !(out.termination == Termination::Cancelled && out.elapsed.is_zero());
                out.audit = session_chain(&SessionRecord {
                    backend_name: &identity.name,
                    backend_version: &identity.version,
                    profile: LOCAL_PROFILE,
                    spec: &spec,
                    termination: started.then_some(&out.termination),
                    cleanup: Ok(()),
                })
                .into_events();
                Ok(out)
            }
            Ok(Err(e)) => Err(ExecutorError::Collect {
                run_id,
                reason: format!(
                    "removing the ephemeral workspace {} failed: {e}; remove it by hand",
                    dir.root.display()
                ),
            }),
            Err(e) => Err(ExecutorError::Collect {
                run_id,
                reason: format!("removing the ephemeral workspace panicked: {e}"),
            }),
        }
    }

    async fn execute(
        &self,
        spec: &RunSpec,
        dir: &RunDir,
        tools: &Tools,
        (uid, name): (Option<u32>, &str),
        egress: Option<&EgressSetup>,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        let run_id = spec.run_id.as_str();
        // With egress, the whole chain starts inside the run's namespace.
        let mut prefix = match egress {
            Some(e) => {
                let mut c = Command::new(&e.nsenter);
                c.arg(format!("--net={}", e.netns.path().display()))
                    .arg("--");
                Some(c)
            }
            None => None,
        };
        let mut begin = |program: &Path| match prefix.take() {
            Some(mut c) => {
                c.arg(program);
                c
            }
            None => Command::new(program),
        };
        let mut cmd;
        match (&tools.setpriv, uid) {
            (Some(setpriv), Some(uid)) => {
                cmd = begin(setpriv);
                cmd.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .arg("--clear-groups")
                    .arg("--inh-caps=-all")
                    .arg("--")
                    .arg(&tools.prlimit);
            }
            _ => cmd = begin(&tools.prlimit),
        }
        cmd.args(tools::prlimit_args(spec))
            .arg(&tools.bwrap)
            .args(self.bwrap_args(dir, spec, egress.is_none()));
        cmd.env_clear()
            .envs(Self::sandbox_env(spec, egress.is_some()))
            .current_dir("/");

        let cancelled_before = *cancel.borrow();
        let sup = if cancelled_before {
            None
        } else {
            Some(supervise::supervise(cmd, run_id, spec.limits.wall_clock, cancel, None).await?)
        };

        // Nothing of the run may outlive it.
        if let Some(uid) = uid
            && !procfs::wait_until(KILL_WAIT, || procfs::pids_with_uid(uid).is_empty()).await
        {
            let left = procfs::pids_with_uid(uid);
            return Err(ExecutorError::Collect {
                run_id: run_id.to_owned(),
                reason: format!(
                    "processes {left:?} of sandbox uid {uid} survived the run; kill them and check the host"
                ),
            });
        }

        let (termination, elapsed, stderr_tail) = match sup {
            None => (Termination::Cancelled, Duration::ZERO, String::new()),
            Some(s) => {
                let termination = match s.ending {
                    Ending::WallClock => Termination::LimitExceeded {
                        limit: "wall-clock".into(),
                    },
                    Ending::Cancelled => Termination::Cancelled,
                    Ending::Exited(status) => {
                        let code = std::os::unix::process::ExitStatusExt::signal(&status);
                        match (status.code(), code) {
                            (Some(1), _) if is_setup_failure(&s.stderr_tail) => {
                                return Err(ExecutorError::Start {
                                    run_id: run_id.to_owned(),
                                    reason: format!(
                                        "the sandbox could not be set up: {}",
                                        s.stderr_tail.trim()
                                    ),
                                });
                            }
                            (Some(c), _) if (129..=192).contains(&c) => {
                                supervise::signal_termination(c - 128)
                            }
                            (Some(c), _) => Termination::Exited { code: c },
                            (None, Some(sig)) => supervise::signal_termination(sig),
                            (None, None) => Termination::Exited { code: -1 },
                        }
                    }
                };
                (termination, s.elapsed, s.stderr_tail)
            }
        };

        let out_dir = self.config.output_root.join(name);
        let (from, to) = (dir.out.clone(), out_dir.clone());
        let skipped = tokio::task::spawn_blocking(move || rundir::collect_out(&from, &to))
            .await
            .map_err(|e| ExecutorError::Collect {
                run_id: run_id.to_owned(),
                reason: format!("collecting /out panicked: {e}"),
            })?
            .map_err(|e| ExecutorError::Collect {
                run_id: run_id.to_owned(),
                reason: format!("copying /out failed: {e}"),
            })?;
        if !skipped.is_empty() {
            tracing::warn!(
                run_id,
                ?skipped,
                "symlinks and special files in /out were not collected"
            );
        }
        Ok(RunOutput {
            out_dir,
            termination,
            elapsed,
            stderr_tail,
            // Sealed by `run_checked` once the workspace is removed.
            audit: Vec::new(),
        })
    }
}

/// Whether stderr shows that a wrapper (not the command) failed before the
/// command ran.
fn is_setup_failure(stderr: &str) -> bool {
    let first = stderr.trim_start();
    ["bwrap: ", "prlimit: ", "setpriv: ", "nsenter: "]
        .iter()
        .any(|p| first.starts_with(p))
}

impl Executor for BubblewrapExecutor {
    fn profile(&self) -> &str {
        LOCAL_PROFILE
    }

    async fn run(
        &self,
        spec: RunSpec,
        cancel: watch::Receiver<bool>,
    ) -> Result<RunOutput, ExecutorError> {
        self.run_checked(spec, cancel).await
    }
}

impl SandboxBackend for BubblewrapExecutor {
    fn identity(&self) -> BackendIdentity {
        BackendIdentity {
            name: "protobot-bubblewrap".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        }
    }

    fn capabilities(&self) -> Vec<Capability> {
        if self.bwrap_path().is_none() {
            return crate::conformance::ALL_CAPABILITIES
                .iter()
                .map(|n| {
                    Capability::unsupported(n, "bubblewrap (`bwrap`) not found on this machine")
                })
                .collect();
        }
        let network = if self.config.egress.is_some() {
            "deny-all: own network namespace with only lo; a run asking for egress gets a namespace (ip netns, needs root) whose only reachable address is 127.0.0.1:3128, relayed to the egress proxy; DNS and direct connections fail at once"
        } else {
            "deny-all: own network namespace with only lo; runs asking for an egress proxy are refused (this executor has no egress session secret)"
        };
        // The conformance suite does not drive the broker through this
        // executor yet (its probes run with no egress), so the capability
        // stays unsupported even when runs can reach the proxy.
        let broker = Capability::unsupported(
            "credential-broker",
            if self.config.egress.is_some() {
                "credentials stay with the egress proxy (protobot egress-proxy), which injects them after its decision; the sandbox holds only a signed session token. The conformance probes do not exercise the broker yet, so it is not claimed"
            } else {
                "no broker locally: the sandbox gets no credential and no egress, so nothing is ever injected"
            },
        );
        let nproc = if self.per_run_uid().is_some() {
            "RLIMIT_NPROC under a dedicated per-run uid"
        } else {
            "RLIMIT_NPROC counts every process of the control plane's user (not root: root is exempt)"
        };
        vec![
            Capability::supported(
                "filesystem-isolation",
                "mount namespace: only /workspace (a copy), /out and a private /tmp are writable; /usr, an /etc allowlist and /task are read-only; no other host path exists",
            ),
            Capability::supported(
                "git-isolation",
                "the workspace is a copy; repositories with remotes, alternates or gitdir links are refused; reflogs scrubbed; host repositories are not mounted",
            ),
            Capability::supported("network-policy", network),
            broker,
            Capability::supported(
                "lifecycle-cleanup",
                "wall clock and cancel kill bwrap, whose PID-namespace init dies with it; ephemeral directory removed after every run",
            ),
            Capability::supported(
                "resource-limits",
                format!(
                    "prlimit: RLIMIT_CPU (per process), RLIMIT_AS, {nproc}, RLIMIT_FSIZE, RLIMIT_NOFILE; wall clock by the supervisor; /tmp tmpfs size-capped"
                ),
            ),
            Capability::supported(
                "audit-chain",
                "a SHA-256 chain per run: open, network decision, exec, limit or cancel, cleanup",
            ),
        ]
    }

    fn scratch_root(&self) -> &Path {
        &self.config.scratch_root
    }
}
