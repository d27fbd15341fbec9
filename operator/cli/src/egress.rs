//! `protobot egress-proxy`: runs the egress proxy and credential broker
//! (docs/egress-proxy.md). Everything is loaded and both listeners are bound
//! before anything is served, so a bad policy, secret, credential or address
//! exits non-zero with one line and nothing started. The sessions file is
//! re-read whenever its modification time changes.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::Args;
use protobot_egress::{
    Broker, CredentialStore, EgressMetrics, EgressPolicy, Limits, SessionRegistry, SessionSecret,
    Upstream,
    decide::CredentialPresence,
    server::{ServeLimits, serve, serve_with},
};
use tokio::net::TcpListener;

use crate::operator::start_service;

/// How often the sessions file's modification time is checked.
const SESSIONS_POLL: Duration = Duration::from_secs(2);

/// Arguments of `protobot egress-proxy`.
#[derive(Debug, Args)]
pub struct EgressProxyArgs {
    /// Address sandboxes send their requests to.
    #[arg(long, default_value = "0.0.0.0:3128")]
    pub listen: SocketAddr,
    /// Address of `/metrics` and `/healthz` (keep it off the sandbox port).
    #[arg(long, default_value = "0.0.0.0:9090")]
    pub admin_listen: SocketAddr,
    /// The egress policy (YAML or JSON; docs/egress-proxy.md).
    #[arg(long)]
    pub policy: PathBuf,
    /// Directory with one file per credential, named as the policy names it.
    #[arg(long)]
    pub credentials_dir: PathBuf,
    /// A sessions file (`sessions:` list) of registered sessions, re-read when
    /// it changes. Optional: the operator gives each sandbox a signed session
    /// token, which needs no registration.
    #[arg(long)]
    pub sessions: Option<PathBuf>,
    /// File holding the secret session tokens are derived from (≥ 32 bytes).
    #[arg(long)]
    pub session_secret: PathBuf,
    /// Connect timeout to upstreams, in seconds.
    #[arg(long, default_value_t = 10)]
    pub connect_timeout_secs: u64,
    /// Serve the jobsite-sandbox/v1 credential-broker probes: adds the probe rules (role
    /// worker-a may GET /v2/allowed and /v2/redirect on registry.example.invalid), the
    /// suite's public sentinel as their credential, and the probe upstream for that host
    /// inside this process, so `protobot sandbox conformance --egress-proxy-url` can
    /// measure this proxy through pods (docs/egress-proxy.md). Real destinations are
    /// unaffected.
    #[arg(long)]
    pub conformance_probe: bool,
    /// Log filter (tracing `EnvFilter` syntax); `RUST_LOG` wins when set.
    #[arg(long, default_value = "info")]
    pub log: String,
}

/// Why the proxy did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The policy is unreadable or invalid.
    #[error(transparent)]
    Policy(#[from] protobot_egress::PolicyError),
    /// The secret or sessions file is unreadable or invalid.
    #[error(transparent)]
    Session(#[from] protobot_egress::session::SessionError),
    /// The credentials directory is unreadable or holds an unusable file.
    #[error(transparent)]
    Credentials(#[from] protobot_egress::CredentialError),
    /// The upstream TLS client could not be built.
    #[error(transparent)]
    Upstream(#[from] protobot_egress::UpstreamError),
    /// The metrics could not be registered.
    #[error("failed to register the egress metrics")]
    Metrics(#[source] prometheus::Error),
    /// The conformance probe upstream could not be started.
    #[error("failed to start the conformance probe upstream on loopback")]
    Probe(#[source] std::io::Error),
    /// A listener could not be bound.
    #[error("failed to listen on {addr}; is the address in use or the port privileged?")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// Runs the proxy until SIGINT or SIGTERM.
pub fn egress_proxy(args: EgressProxyArgs) -> ExitCode {
    let runtime = match start_service(&args.log) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    runtime.block_on(async {
        match run(&args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(error = %crate::one_line(&error), "egress proxy not started");
                crate::fail(&error)
            }
        }
    })
}

async fn run(args: &EgressProxyArgs) -> Result<(), StartError> {
    let policy = EgressPolicy::load(&args.policy)?;
    let secret = SessionSecret::load(&args.session_secret)?;
    let credentials = CredentialStore::load_dir(&args.credentials_dir)?;
    for name in policy.credential_names() {
        if !credentials.has(name) {
            tracing::warn!(
                credential = name,
                dir = %args.credentials_dir.display(),
                "the policy names a credential the directory does not hold; its rules fail closed"
            );
        }
    }
    let sessions = SessionRegistry::new(secret);
    let session_count = match &args.sessions {
        Some(path) => sessions.load_file(path)?,
        None => 0,
    };
    let upstream = Upstream::tls(Duration::from_secs(args.connect_timeout_secs))?;
    let (policy, credentials, upstream) = if args.conformance_probe {
        protobot_egress::probe::serve_in_process(policy, credentials, upstream)
            .await
            .map_err(StartError::Probe)?
    } else {
        (policy, credentials, upstream)
    };
    let registry = prometheus::Registry::new();
    let metrics = EgressMetrics::register(&registry).map_err(StartError::Metrics)?;
    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })
    };
    let proxy_listener = bind(args.listen).await?;
    let admin_listener = bind(args.admin_listen).await?;

    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        listen = %args.listen,
        admin_listen = %args.admin_listen,
        rules = policy.rules().len(),
        credentials = credentials.names().count(),
        sessions = session_count,
        conformance_probe = args.conformance_probe,
        "egress proxy started"
    );
    let watcher = args
        .sessions
        .clone()
        .map(|path| tokio::spawn(sessions.clone().watch_file(path, SESSIONS_POLL)));
    let broker = Broker::new(
        policy,
        credentials,
        sessions,
        upstream,
        metrics.clone(),
        Limits::default(),
    );
    let proxy = serve_with(
        proxy_listener,
        move |req| {
            let broker = broker.clone();
            async move { broker.handle(req).await }
        },
        shutdown_signal(),
        ServeLimits::default(),
        Some(metrics),
    );
    let admin = serve(
        admin_listener,
        move |req| {
            let registry = registry.clone();
            async move { protobot_egress::admin::respond(&registry, &req) }
        },
        shutdown_signal(),
    );
    tokio::join!(proxy, admin);
    if let Some(watcher) = watcher {
        watcher.abort();
    }
    tracing::info!("egress proxy stopped");
    Ok(())
}

/// Resolves on SIGINT or SIGTERM (Kubernetes stops pods with SIGTERM).
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(error = %error, "cannot watch SIGTERM; stop with SIGINT");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
