//! `protobot egress-proxy`: runs the egress proxy and credential broker
//! (docs/egress-proxy.md). Everything is loaded and both listeners are bound
//! before anything is served, so a bad policy, secret, credential or address
//! exits non-zero with one line and nothing started. The sessions file is
//! re-read whenever its modification time changes.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode, time::Duration};

use clap::Args;
use protobot_egress::{
    Broker, CredentialStore, EgressMetrics, EgressPolicy, Limits, PriceTable, SessionRegistry,
    SessionSecret, Upstream, UsageMeter, UsageMetrics,
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
    /// Model prices (YAML: model → dollars per million tokens of input, output,
    /// cacheRead, cacheWrite; the `prices:` of the worker classes). Without it,
    /// tokens are metered and costs are unknown.
    #[arg(long)]
    pub prices: Option<PathBuf>,
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
    /// The price table is unreadable or invalid.
    #[error(transparent)]
    Prices(#[from] protobot_egress::price::PriceTableError),
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
    let service = match start_service(&args.log) {
        Ok(service) => service,
        Err(code) => return code,
    };
    service.block_on(async {
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
    let prices = match &args.prices {
        Some(path) => protobot_egress::price::load(path)?,
        None => PriceTable::default(),
    };
    let priced_models = prices.0.len();
    let meter = UsageMeter::new(
        prices,
        Some(UsageMetrics::register(&registry).map_err(StartError::Metrics)?),
    );
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
        priced_models,
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
    )
    .with_meter(meter.clone());
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
            let (registry, meter) = (registry.clone(), meter.clone());
            async move { protobot_egress::admin::respond(&registry, Some(&meter), &req) }
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

/// An egress proxy URL (`--egress-proxy-url`) taken apart where its host is, so that the
/// operator can hand sandbox pods an address they reach without DNS (their NetworkPolicy
/// denies it): `scheme://[userinfo@]host[:port][/rest]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyUrl<'a> {
    /// Everything before the host (`http://`, `user@` included).
    prefix: &'a str,
    /// The host as written (an IPv6 literal keeps its brackets).
    host: &'a str,
    /// Everything after the host (`:port`, path).
    suffix: &'a str,
    /// The port pods connect to (explicit, or the scheme's).
    port: u16,
}

/// Why a `--egress-proxy-url` cannot be taken apart.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProxyUrlError {
    /// Not `http://` or `https://`.
    #[error("{0:?} is not an http:// or https:// URL")]
    Scheme(String),
    /// No host after the scheme.
    #[error("{0:?} names no host")]
    NoHost(String),
    /// The port is not a number from 1 to 65535.
    #[error("{0:?} has an invalid port")]
    Port(String),
}

impl<'a> ProxyUrl<'a> {
    /// Takes `url` apart (pure).
    pub fn parse(url: &'a str) -> Result<Self, ProxyUrlError> {
        let (scheme_len, default_port) = if url
            .get(..7)
            .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
        {
            (7, 80)
        } else if url
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"))
        {
            (8, 443)
        } else {
            return Err(ProxyUrlError::Scheme(url.to_owned()));
        };
        let rest = &url[scheme_len..];
        let authority_len = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let authority = &rest[..authority_len];
        let host_start = authority.rfind('@').map_or(0, |at| at + 1);
        let host_port = &authority[host_start..];
        let (host, port) = if host_port.starts_with('[') {
            let end = host_port
                .find(']')
                .ok_or_else(|| ProxyUrlError::NoHost(url.to_owned()))?;
            (&host_port[..=end], &host_port[end + 1..])
        } else {
            match host_port.rfind(':') {
                Some(colon) => (&host_port[..colon], &host_port[colon..]),
                None => (host_port, ""),
            }
        };
        if host.is_empty() || host == "[]" {
            return Err(ProxyUrlError::NoHost(url.to_owned()));
        }
        let port = match port {
            "" => default_port,
            p => p
                .strip_prefix(':')
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|p| *p != 0)
                .ok_or_else(|| ProxyUrlError::Port(url.to_owned()))?,
        };
        let host_at = scheme_len + host_start;
        Ok(ProxyUrl {
            prefix: &url[..host_at],
            host,
            suffix: &url[host_at + host.len()..],
            port,
        })
    }

    /// The name to resolve and the port to resolve it for, or `None` when the host is
    /// already an IP address (pods reach it as written).
    pub fn name_to_resolve(&self) -> Option<(&'a str, u16)> {
        let bare = self.host.trim_start_matches('[').trim_end_matches(']');
        match bare.parse::<std::net::IpAddr>() {
            Ok(_) => None,
            Err(_) => Some((self.host, self.port)),
        }
    }

    /// The URL with `ip` in place of the host (everything else as written).
    pub fn with_ip(&self, ip: std::net::IpAddr) -> String {
        let host = match ip {
            std::net::IpAddr::V4(v4) => v4.to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        };
        format!("{}{host}{}", self.prefix, self.suffix)
    }
}

/// The address of the resolved ones pods are given: the first IPv4 one (a Service's
/// cluster IP in a single-stack or IPv4-first cluster), else the first.
pub fn pick_address(addrs: impl IntoIterator<Item = std::net::IpAddr>) -> Option<std::net::IpAddr> {
    let addrs: Vec<_> = addrs.into_iter().collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::{ProxyUrl, ProxyUrlError, pick_address};

    #[test]
    fn a_service_name_is_resolved_and_replaced_by_the_address() {
        let url = ProxyUrl::parse("http://protobot-egress-proxy.protobot-system.svc:3128").unwrap();
        assert_eq!(
            url.name_to_resolve(),
            Some(("protobot-egress-proxy.protobot-system.svc", 3128))
        );
        assert_eq!(
            url.with_ip("10.96.12.34".parse().unwrap()),
            "http://10.96.12.34:3128"
        );
    }

    #[test]
    fn the_rest_of_the_url_is_kept_and_the_port_defaults_to_the_schemes() {
        let url = ProxyUrl::parse("HTTP://user@proxy.svc/base?x=1").unwrap();
        assert_eq!(url.name_to_resolve(), Some(("proxy.svc", 80)));
        assert_eq!(
            url.with_ip("10.0.0.7".parse().unwrap()),
            "HTTP://user@10.0.0.7/base?x=1"
        );
        let tls = ProxyUrl::parse("https://proxy.svc").unwrap();
        assert_eq!(tls.name_to_resolve(), Some(("proxy.svc", 443)));
        let v6: IpAddr = "fd00::10".parse().unwrap();
        assert_eq!(tls.with_ip(v6), "https://[fd00::10]");
    }

    #[test]
    fn an_ip_url_needs_no_resolution() {
        for url in [
            "http://10.96.0.5:3128",
            "http://[fd00::5]:3128/",
            "http://127.0.0.1",
        ] {
            assert_eq!(
                ProxyUrl::parse(url).unwrap().name_to_resolve(),
                None,
                "{url}"
            );
        }
    }

    #[test]
    fn urls_that_cannot_be_taken_apart_are_refused() {
        assert!(matches!(
            ProxyUrl::parse("proxy.svc:3128"),
            Err(ProxyUrlError::Scheme(_))
        ));
        assert!(matches!(
            ProxyUrl::parse("socks5://proxy:1080"),
            Err(ProxyUrlError::Scheme(_))
        ));
        assert!(matches!(
            ProxyUrl::parse("http://:3128"),
            Err(ProxyUrlError::NoHost(_))
        ));
        assert!(matches!(
            ProxyUrl::parse("http://"),
            Err(ProxyUrlError::NoHost(_))
        ));
        assert!(matches!(
            ProxyUrl::parse("http://[fd00::5"),
            Err(ProxyUrlError::NoHost(_))
        ));
        for bad in [
            "http://proxy:port",
            "http://proxy:0",
            "http://proxy:70000",
            "http://proxy:",
        ] {
            assert!(
                matches!(ProxyUrl::parse(bad), Err(ProxyUrlError::Port(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn pods_get_an_ipv4_address_when_there_is_one() {
        let v6: IpAddr = "fd00::1".parse().unwrap();
        let v4: IpAddr = "10.96.0.9".parse().unwrap();
        assert_eq!(pick_address([v6, v4]), Some(v4));
        assert_eq!(pick_address([v6]), Some(v6));
        assert_eq!(pick_address([]), None);
    }
}
