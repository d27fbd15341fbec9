//! `protobot operator`: runs the controllers in a cluster (or against
//! KUBECONFIG's cluster), with JSON logs and the admin server.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use crate::telemetry::Telemetry;
use clap::Args;
use protobot_controller::{jobsite::Settings, operator::JobSiteRuntime};
use protobot_kube_executor::{
    KubeExecutorConfig, KubernetesExecutor, SandboxProfile, StagingVolume, read_report_configmap,
};

/// Arguments of `protobot operator`.
#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Serve the WMS Adapter API over HTTP on this address (TokenReview + SubjectAccessReview;
    /// docs/wms-api.md). Absent: not served.
    #[arg(long)]
    pub wms_api_addr: Option<SocketAddr>,
    /// Token audience the WMS API accepts (repeatable). Callers mint tokens for it
    /// (`kubectl create token SA --audience protobot-wms`), so a token for the API server is
    /// not accepted here, nor one for here by the API server.
    #[arg(long = "wms-api-audience", default_value = protobot_controller::wms_api::DEFAULT_AUDIENCE)]
    pub wms_api_audiences: Vec<String>,
    /// Serve the WMS API over HTTPS with this PEM certificate chain (with
    /// `--wms-api-tls-key`); re-read when the file changes. Absent: plain HTTP.
    #[arg(long, requires = "wms_api_tls_key", requires = "wms_api_addr")]
    pub wms_api_tls_cert: Option<PathBuf>,
    /// The PEM private key of `--wms-api-tls-cert`.
    #[arg(long, requires = "wms_api_tls_cert")]
    pub wms_api_tls_key: Option<PathBuf>,
    /// Log filter (tracing `EnvFilter` syntax); `RUST_LOG` wins when set.
    #[arg(long, default_value = "info")]
    pub log: String,
    /// Run registration and metrics only: no Job Site in this replica.
    #[arg(long)]
    pub no_job_site: bool,
    /// This replica's identity (leases are held under it).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// The sandbox profile document the Job Site's pods are built from.
    #[arg(long, default_value = "/etc/protobot/sandbox-profiles/kata.yaml")]
    pub sandbox_profile: PathBuf,
    /// Where sandbox pods run and how they are staged (shared with `protobot sandbox
    /// conformance`, which measures the profile as these pods will run).
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// Accept Projects whose spec.repoUrl is a path on this machine or a file:// URL (tests,
    /// single-machine demos). Off: only https://, ssh:// and user@host:path URLs, so a Project
    /// cannot make the operator read repositories from its own filesystem.
    #[arg(long)]
    pub allow_local_repositories: bool,
    /// Builds this replica runs at once, across every project (each project's WIP limit
    /// still holds across replicas).
    #[arg(long, default_value_t = protobot_controller::jobsite::DEFAULT_MAX_CONCURRENT_BUILDS, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub max_concurrent_builds: u16,
    /// On SIGTERM or SIGINT, how long running builds get to reach their next effect
    /// boundary before the process exits (keep it below the pod's
    /// terminationGracePeriodSeconds). Their leases lapse and another replica resumes them.
    #[arg(long, default_value_t = 25)]
    pub shutdown_grace_seconds: u64,
    /// The egress proxies' admin listener (`http://HOST:PORT`), where each run's model usage
    /// is read back after the run for the item's `status.usage`. Every address the host
    /// resolves to is asked and their shares summed (the chart passes its headless admin
    /// Service, which resolves to each proxy pod). Absent: items record no usage.
    #[arg(long, value_name = "URL")]
    pub egress_proxy_admin_url: Option<String>,
}

/// Where sandbox pods run and how their runs are staged: the flags `protobot operator` and
/// `protobot sandbox conformance` share, so that the conformance Job measures pods built as
/// the operator builds them.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// Integration clones, repository cache, scratch and collected sandbox output.
    #[arg(long, default_value = "/var/lib/protobot/work")]
    pub workdir: PathBuf,
    /// Namespace of the sandbox pods (and of the profile's conformance ConfigMap).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub sandbox_namespace: String,
    /// The staging PersistentVolumeClaim shared with the sandbox pods.
    #[arg(long, default_value = "protobot-staging")]
    pub staging_claim: String,
    /// Where that claim is mounted in this process.
    #[arg(long, default_value = "/var/lib/protobot/staging")]
    pub staging_path: PathBuf,
    /// Who owns the staged run directories: `profile-user` chowns them to the profile's
    /// runAsUser (needs root), `keep` leaves them this process's (when it runs as that uid,
    /// or a node runs containers as its uid), `auto` picks `profile-user` when running as
    /// root.
    #[arg(long, value_enum, default_value_t = StagingOwnershipArg::Auto)]
    pub staging_ownership: StagingOwnershipArg,
    /// Image of the sandbox pods when a worker class names none (for `sandbox conformance`:
    /// of the probe pods, which need /bin/sh and git, like a Worker image).
    #[arg(long, value_name = "IMAGE")]
    pub sandbox_image: Option<String>,
    /// The in-guest supervisor's image, when the profile's spec.supervisor names none.
    #[arg(long, value_name = "IMAGE")]
    pub supervisor_image: Option<String>,
    /// Base URL of the egress proxy (`protobot egress-proxy`) as sandbox pods reach it, given
    /// to runs whose worker class asks for egress. With the session secret and a profile that
    /// allows egress, `credential-broker` is supported and `sandbox conformance` runs its
    /// probes (SB-NET, SB-CRED) as pods through it; the proxy must then hold the probe rules
    /// (`protobot egress-proxy --conformance-probe`, docs/egress-proxy.md). A host name (the
    /// chart's `<svc>.<ns>.svc`) is resolved once at start-up to the Service's cluster IP,
    /// since pods have no DNS. Needs --egress-session-secret.
    #[arg(long, requires = "egress_session_secret")]
    pub egress_proxy_url: Option<String>,
    /// File with the egress proxy's session secret (the same Secret the proxy mounts): each run
    /// with egress gets a session token signed with it.
    #[arg(long, requires = "egress_proxy_url")]
    pub egress_session_secret: Option<PathBuf>,
}

impl SandboxArgs {
    /// The Kubernetes executor's configuration these flags describe, collecting sandbox
    /// output into `collected` under the work directory (outside the staging volume), with
    /// the egress proxy's URL as pods reach it ([`proxy_url_for_pods`]). Fails when the
    /// egress proxy's session secret cannot be read.
    pub async fn executor_config(
        &self,
        collected: &str,
    ) -> Result<KubeExecutorConfig, protobot_egress::session::SessionError> {
        let mut config = KubeExecutorConfig::new(
            &self.sandbox_namespace,
            StagingVolume {
                claim_name: self.staging_claim.clone(),
                mount_path: self.staging_path.clone(),
            },
            self.workdir.join(collected),
        );
        config.default_image = self.sandbox_image.clone().filter(|i| !i.is_empty());
        config.supervisor_image = self.supervisor_image.clone().filter(|i| !i.is_empty());
        config.staging_ownership = self.staging_ownership.into();
        if let Some(path) = &self.egress_session_secret {
            config.egress_session_secret = Some(protobot_egress::SessionSecret::load(path)?);
            config.egress_proxy_url = match &self.egress_proxy_url {
                Some(url) => Some(proxy_url_for_pods(url).await),
                None => None,
            };
        }
        Ok(config)
    }
}

/// The egress proxy's URL as sandbox pods are given it. Their NetworkPolicy denies DNS, so a
/// host name (the chart passes the Service's `<svc>.<ns>.svc` name) is resolved here, once,
/// in this process (which has DNS), to the Service's cluster IP; an IP URL is kept as
/// written. When the name cannot be resolved, pods get it unchanged and a warning says that
/// their egress will fail.
pub async fn proxy_url_for_pods(url: &str) -> String {
    let parsed = match crate::egress::ProxyUrl::parse(url) {
        Ok(parsed) => parsed,
        Err(error) => {
            tracing::warn!(
                url,
                error = %error,
                "cannot read the egress proxy URL's host; sandbox pods get it as written, and their egress fails unless they can reach it without DNS"
            );
            return url.to_owned();
        }
    };
    let Some((host, port)) = parsed.name_to_resolve() else {
        tracing::info!(
            url,
            "egress proxy URL is an IP address; sandbox pods get it as written"
        );
        return url.to_owned();
    };
    let looked_up = tokio::net::lookup_host((host, port))
        .await
        .map(|addrs| crate::egress::pick_address(addrs.map(|a| a.ip())));
    match looked_up {
        Ok(Some(ip)) => {
            let resolved = parsed.with_ip(ip);
            tracing::info!(
                url,
                resolved = %resolved,
                "resolved the egress proxy's host for sandbox pods (they have no DNS)"
            );
            resolved
        }
        Ok(None) => {
            tracing::warn!(
                url,
                host,
                "the egress proxy's host resolved to no address; sandbox pods get the name, cannot resolve it (their NetworkPolicy denies DNS), and their egress will fail"
            );
            url.to_owned()
        }
        Err(error) => {
            tracing::warn!(
                url,
                host,
                error = %error,
                "cannot resolve the egress proxy's host; sandbox pods get the name, cannot resolve it either (their NetworkPolicy denies DNS), and their egress will fail: check the Service and this pod's DNS"
            );
            url.to_owned()
        }
    }
}

/// `--staging-ownership` (see [`protobot_kube_executor::StagingOwnership`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StagingOwnershipArg {
    /// `profile-user` as root, else `keep`.
    Auto,
    /// chown to the profile's runAsUser:runAsGroup.
    ProfileUser,
    /// Leave the operator's uid.
    Keep,
}

impl From<StagingOwnershipArg> for protobot_kube_executor::StagingOwnership {
    fn from(arg: StagingOwnershipArg) -> Self {
        match arg {
            StagingOwnershipArg::Auto => protobot_kube_executor::StagingOwnership::Auto,
            StagingOwnershipArg::ProfileUser => {
                protobot_kube_executor::StagingOwnership::ProfileUser
            }
            StagingOwnershipArg::Keep => protobot_kube_executor::StagingOwnership::Keep,
        }
    }
}

async fn job_site(
    args: &OperatorArgs,
    sink: &protobot_controller::api_errors::ApiErrorSink,
) -> Result<Option<JobSiteRuntime<KubernetesExecutor>>, String> {
    if args.no_job_site {
        return Ok(None);
    }
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .ok_or("no identity: pass --identity or set POD_NAME")?;
    let profile = SandboxProfile::load(&args.sandbox_profile).map_err(|e| e.to_string())?;
    let client = protobot_controller::api_errors::infer_client(sink)
        .await
        .map_err(|e| e.to_string())?;
    // A missing report is not fatal: the executor then refuses and the Job Site
    // claims nothing until a passing report is stored (watched below: no restart).
    let report = read_report_configmap(client.clone(), &args.sandbox.sandbox_namespace, &profile)
        .await
        .map_err(|e| e.to_string())?;
    let mut config = args
        .sandbox
        .executor_config("collected")
        .await
        .map_err(|e| e.to_string())?;
    config.instance = identity.clone();
    // Sandbox objects of an item in the sandbox namespace go with the item. An owner
    // reference cannot cross namespaces, so an operator that watches only another namespace
    // looks for no owner there (where it may not even read BuildWorkItems).
    config.work_item_owner =
        owners_in_sandbox_namespace(args.namespace.as_deref(), &args.sandbox.sandbox_namespace)
            .then_some(protobot_kube_executor::WorkItemOwner {
                api_version: "protobot.dev/v1alpha1".into(),
                kind: "BuildWorkItem".into(),
                plural: "buildworkitems".into(),
                name_of: protobot_stores::kubernetes::item_name,
            });
    let executor =
        KubernetesExecutor::new(client, config, profile, report).map_err(|e| e.to_string())?;
    // The report's ConfigMap is watched: storing, replacing or deleting it admits or
    // refuses later runs without a restart.
    tokio::spawn(executor.clone().watch_report());
    if let Err(refusal) = protobot_jobsite::executor::Executor::admit(&executor) {
        tracing::warn!(error = %refusal, "the sandbox executor refuses runs; this replica will claim no work");
    }
    match executor.collect_garbage().await {
        Ok(report) => tracing::info!(?report, "collected leftovers of earlier runs"),
        Err(e) => tracing::warn!(error = %e, "could not collect leftovers of earlier runs"),
    }
    let usage = match &args.egress_proxy_admin_url {
        Some(url) => Some(Arc::new(
            protobot_controller::proxy_usage::ProxyAdminUsage::new(url)
                .map_err(|e| e.to_string())?,
        ) as Arc<dyn protobot_jobsite::usage::UsageSource>),
        None => None,
    };
    Ok(Some(JobSiteRuntime {
        settings: Settings {
            identity,
            usage,
            workdir: args.sandbox.workdir.clone(),
            interval: Duration::from_secs(15),
            limits: Default::default(),
            egress_proxy: args.sandbox.egress_proxy_url.clone(),
            claim_sweeps: Default::default(),
            // Set by `protobot_controller::operator::run`, which owns the registry.
            metrics: None,
            ..Settings::new(
                String::new(),
                args.sandbox.workdir.clone(),
                usize::from(args.max_concurrent_builds),
            )
        },
        executor: Arc::new(executor),
    }))
}

/// Starts a long-running service process (the operator, the egress proxy):
/// JSON logs filtered by `RUST_LOG` or `log`, OTLP trace export when `OTEL_EXPORTER_OTLP_*`
/// asks for it (docs/tracing.md), and a multi-threaded runtime.
pub(crate) fn start_service(log: &str) -> Result<Service, ExitCode> {
    let telemetry = crate::telemetry::init_service(log);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map(|runtime| Service { runtime, telemetry })
        .map_err(|e| {
            eprintln!("protobot: failed to start the async runtime: {e}");
            ExitCode::from(1)
        })
}

/// A started service: its runtime and its trace exporter.
pub(crate) struct Service {
    runtime: tokio::runtime::Runtime,
    telemetry: Telemetry,
}

impl Service {
    /// Runs `main` to completion, stops the runtime (its tasks' spans end), then exports the
    /// last spans.
    pub(crate) fn block_on<F: std::future::Future>(self, main: F) -> F::Output {
        let Service { runtime, telemetry } = self;
        let out = runtime.block_on(main);
        drop(runtime);
        telemetry.shutdown();
        out
    }
}

/// Runs the operator until interrupted.
pub fn operator(args: OperatorArgs) -> ExitCode {
    let service = match start_service(&args.log) {
        Ok(service) => service,
        Err(code) => return code,
    };
    match protobot_repo::timeouts::ensure() {
        Ok(t) => tracing::info!(connect = ?t.connect, silence = ?t.silence, "git network timeouts"),
        Err(e) => {
            tracing::warn!(error = %e, "git network timeouts not set: a repository host that stops answering can hold its Project's pass until the connection drops")
        }
    }
    service.block_on(async {
        // One sink for every client of this process: each 4xx is a warning naming the verb
        // and object, counted once the operator's registry exists.
        let sink = protobot_controller::api_errors::ApiErrorSink::new();
        let job_site = match job_site(&args, &sink).await {
            Ok(j) => j,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the Job Site");
                eprintln!("protobot: cannot start the Job Site: {e}; fix it or pass --no-job-site");
                return ExitCode::from(2);
            }
        };
        // Every replica (with or without a Job Site) checks Projects' sandbox
        // profiles from the same profile documents and report ConfigMaps.
        let profiles = args.sandbox_profile.parent().map(|dir| {
            protobot_controller::project::ProfileReports {
                dir: dir.to_path_buf(),
                namespace: args.sandbox.sandbox_namespace.clone(),
            }
        });
        let drain = job_site
            .as_ref()
            .map(|j| (j.settings.stop.clone(), Arc::clone(&j.settings.drained)));
        let operator = protobot_controller::operator::run(
                args.namespace.clone(),
                args.admin_addr,
                job_site,
                profiles,
                sink,
                protobot_controller::project::decide::RepositoryPolicy {
                    allow_local: args.allow_local_repositories,
                },
                args.wms_api_addr.map(|addr| protobot_controller::wms_api::WmsApiConfig {
                    audiences: args.wms_api_audiences.clone(),
                    tls: args.wms_api_tls_cert.clone().zip(args.wms_api_tls_key.clone()).map(
                        |(cert, key)| protobot_controller::wms_api::tls::TlsFiles { cert, key },
                    ),
                    ..protobot_controller::wms_api::WmsApiConfig::new(addr)
                }),
            );
        tokio::pin!(operator);
        tokio::select! {
            result = &mut operator => match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "operator stopped");
                    ExitCode::from(1)
                }
            },
            signal = shutdown_signal() => {
                let Some((stop, drained)) = drain else {
                    tracing::info!(signal, "shutting down");
                    return ExitCode::SUCCESS;
                };
                tracing::info!(signal, grace_seconds = args.shutdown_grace_seconds, "shutting down: claiming no more work; running builds stop at their next effect boundary");
                stop.raise();
                let grace = Duration::from_secs(args.shutdown_grace_seconds);
                tokio::select! {
                    () = drained.notified() => tracing::info!("every build stopped at a boundary; their leases lapse and another replica resumes them"),
                    () = tokio::time::sleep(grace) => tracing::warn!("the grace period ended before every build reached a boundary; their leases lapse and another replica resumes them"),
                    _ = &mut operator => {}
                }
                ExitCode::SUCCESS
            }
        }
    })
}

/// Resolves on SIGTERM (what the kubelet sends a terminating pod) or SIGINT, naming it.
pub(crate) async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        },
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops this process");
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

/// Whether a work item can live in the sandbox namespace, so its pods may be owned by it:
/// always when every namespace is watched, else only when the watched one is the sandbox one.
fn owners_in_sandbox_namespace(watched: Option<&str>, sandbox_namespace: &str) -> bool {
    watched.is_none_or(|w| w == sandbox_namespace)
}

#[cfg(test)]
mod tests {
    /// The edge: a name is looked up (`localhost`, from the hosts file), an IP URL is not, and
    /// a name that resolves nowhere is passed on as written (with the warning).
    #[tokio::test]
    async fn pods_get_the_proxy_by_address() {
        assert_eq!(
            super::proxy_url_for_pods("http://localhost:3128/").await,
            "http://127.0.0.1:3128/"
        );
        assert_eq!(
            super::proxy_url_for_pods("http://10.96.0.10:3128").await,
            "http://10.96.0.10:3128"
        );
        for unresolved in [
            "http://protobot-egress-proxy.example.invalid:3128",
            "proxy:3128",
        ] {
            assert_eq!(super::proxy_url_for_pods(unresolved).await, unresolved);
        }
    }

    #[test]
    fn pods_are_owned_by_their_item_only_where_an_item_can_be() {
        assert!(super::owners_in_sandbox_namespace(None, "protobot-system"));
        assert!(super::owners_in_sandbox_namespace(Some("team-a"), "team-a"));
        assert!(!super::owners_in_sandbox_namespace(
            Some("team-a"),
            "sandboxes"
        ));
    }
}
