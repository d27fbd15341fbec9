//! One replica's Job Site settings ([`Settings`]) and the schedule of its claim sweeps
//! ([`ClaimSweeps`]): plain values the operator's flags fill and every other module of the
//! Job Site reads.

use std::{collections::BTreeMap, path::PathBuf, sync::Arc, time::Duration};

use protobot_jobsite::{engine::StopSignal, executor::Limits};

/// One replica's Job Site settings.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The replica's trusted subject (its pod name): leases are held under it.
    pub identity: String,
    /// Integration clones and scratch space.
    pub workdir: PathBuf,
    /// Longest time between passes.
    pub interval: Duration,
    /// Sandbox limits per run.
    pub limits: Limits,
    /// Base URL of the egress proxy for runs whose worker class asks for
    /// egress (`None`: such runs are refused).
    pub egress_proxy: Option<String>,
    /// How often each project's orphaned key claims are collected
    /// ([`KubeStore::collect_orphaned_claims`]), and how old a claim must be.
    pub claim_sweeps: ClaimSweeps,
    /// Where passes are counted (`None`: not recorded).
    pub metrics: Option<crate::metrics::JobSiteMetrics>,
    /// This replica's build slots, shared by every project (`--max-concurrent-builds`).
    pub capacity: Arc<tokio::sync::Semaphore>,
    /// How many permits [`Settings::capacity`] was made with (published as
    /// `protobot_build_slots{state="total"}`).
    pub max_concurrent_builds: usize,
    /// Raised on SIGTERM/SIGINT: no more claims, builds stop at their next boundary.
    pub stop: StopSignal,
    /// Notified once, after a raised [`Settings::stop`], when no pass runs any more.
    pub drained: Arc<tokio::sync::Notify>,
    /// Which repository locations Projects may name: network URLs only unless
    /// `--allow-local-repositories` (the default of [`Settings::new`]: network only).
    pub repositories: crate::project::decide::RepositoryPolicy,
    /// The forge clients of Projects with `spec.forge` (their items land through pull
    /// requests). `None`: [`run`] makes its own (API calls not counted).
    pub forges: Option<Arc<crate::forge::ForgeClients>>,
    /// Where runs' model usage is read back after each sandbox run (the egress proxies'
    /// admin port, [`crate::proxy_usage::ProxyAdminUsage`]); `None`: items record no usage.
    pub usage: Option<Arc<dyn protobot_jobsite::usage::UsageSource>>,
    /// Where this replica publishes its capacity Lease (`None`: nowhere). Default
    /// ([`Settings::new`]): `POD_NAMESPACE` when set ([`crate::capacity::CapacityLease::from_env`]).
    pub capacity_lease: Option<crate::capacity::CapacityLease>,
    /// The node-room check: claim only while a Ready node has room for a run's pod
    /// (`None`: off). Default ([`Settings::new`]): as `PROTOBOT_NODE_ROOM_CHECK` says
    /// ([`crate::capacity::NodeRoomCheck::from_env`]; the chart sets it).
    pub node_room: Option<crate::capacity::NodeRoomCheck>,
    /// The spec stores decoded at a commit, shared by every project's Job Site of this
    /// replica, so a Job Site rebuilt after a fetch does not decode again what an earlier
    /// one did ([`protobot_jobsite::snapshots::SnapshotCache`], bounded).
    pub snapshots: Arc<protobot_jobsite::snapshots::SnapshotCache>,
}

/// Default of `--max-concurrent-builds`.
pub const DEFAULT_MAX_CONCURRENT_BUILDS: u16 = 8;

impl Settings {
    /// Settings with `max_concurrent_builds` build slots and the defaults: a pass at
    /// least every 15 s, default limits, no egress proxy, hourly claim sweeps.
    pub fn new(
        identity: impl Into<String>,
        workdir: PathBuf,
        max_concurrent_builds: usize,
    ) -> Self {
        Self {
            identity: identity.into(),
            workdir,
            interval: Duration::from_secs(15),
            limits: Limits::default(),
            egress_proxy: None,
            claim_sweeps: ClaimSweeps::default(),
            metrics: None,
            capacity: Arc::new(tokio::sync::Semaphore::new(max_concurrent_builds.max(1))),
            max_concurrent_builds: max_concurrent_builds.max(1),
            stop: StopSignal::new(),
            drained: Arc::new(tokio::sync::Notify::new()),
            repositories: crate::project::decide::RepositoryPolicy::default(),
            forges: None,
            usage: None,
            capacity_lease: crate::capacity::CapacityLease::from_env(),
            node_room: crate::capacity::NodeRoomCheck::from_env(),
            snapshots: Arc::default(),
        }
    }
}

/// When to collect the key claims of deleted work items, per project.
#[derive(Clone, Debug)]
pub struct ClaimSweeps {
    /// Time between two sweeps of one project.
    pub every: Duration,
    /// Claims younger than this are kept (a command may be between its claim
    /// and its item).
    pub min_age: Duration,
    last: Arc<std::sync::Mutex<BTreeMap<String, std::time::Instant>>>,
}

impl ClaimSweeps {
    /// Sweeps each project at most every `every`, collecting claims older than `min_age`.
    pub fn new(every: Duration, min_age: Duration) -> Self {
        Self {
            every,
            min_age,
            last: Arc::default(),
        }
    }

    /// Whether `project` is due at `now`; if so, it counts as swept now.
    pub fn due(&self, project: &str, now: std::time::Instant) -> bool {
        let Ok(mut last) = self.last.lock() else {
            return false;
        };
        match last.get(project) {
            Some(at) if now.duration_since(*at) < self.every => false,
            _ => {
                last.insert(project.to_owned(), now);
                true
            }
        }
    }
}

impl Default for ClaimSweeps {
    /// Hourly, for claims at least an hour old.
    fn default() -> Self {
        Self::new(Duration::from_secs(3600), Duration::from_secs(3600))
    }
}
