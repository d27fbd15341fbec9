//! Proxied egress for the bubblewrap sandbox on one machine (issue 21).
//!
//! A run whose spec names an egress proxy gets a network namespace of its own
//! made with `ip netns` (so the control plane must be root) that holds only
//! `lo`. Inside it, `127.0.0.1:3128` is a listening socket the executor bound
//! there (a thread enters the namespace with `setns`, binds, and exits; the
//! socket stays in the namespace); each connection accepted on it is relayed
//! from the host's namespace to the proxy. Nothing else has a route: direct
//! connections fail at once with "network unreachable", and DNS fails at
//! once because the sandbox has no `/etc/resolv.conf` and nothing listens on
//! port 53 of its loopback. The sandbox joins the namespace through
//! `nsenter --net` instead of bwrap's own `--unshare-net`; the namespace
//! belongs to the host's user namespace, so the sandbox (in a user namespace
//! of its own) cannot reconfigure it.
//!
//! The run gets the same credentials as in the cluster
//! (docs/worker-harnesses.md): `PROTOBOT_EGRESS_PROXY` and
//! `PROTOBOT_EGRESS_SESSION_TOKEN_FILE`, pointing at a signed session token
//! (`protobot_egress::issue_session_token`) that expires with the run.
//!
//! [`MeterUsage`] is the usage port over an in-process proxy's meter: the Job
//! Site reads each run's model usage from it when the run ends (issue 34).
//!
//! Pure: [`ProxyAddress::parse`], [`session_for`], [`token_expiry`]. Edges,
//! shared with the simulated kubelet through `protobot_egress::netns`:
//! [`NetNs`] (runs `ip`), [`bind_inside`] (`setns` on a short-lived thread),
//! [`Relay`] (tokio sockets).

use std::{
    net::{IpAddr, Ipv4Addr},
    path::Path,
    time::Duration,
};

use protobot_egress::{Session, SessionSecret};
use protobot_jobsite::executor::RunSpec;

/// The port the proxy listens on inside the sandbox's namespace (the
/// cluster's proxy port, so harness configuration carries over).
pub const SANDBOX_PROXY_PORT: u16 = 3128;
/// Base URL of the egress proxy inside the sandbox.
pub const ENV_EGRESS_PROXY: &str = "PROTOBOT_EGRESS_PROXY";
/// Path of the session token file inside the sandbox.
pub const ENV_EGRESS_TOKEN_FILE: &str = "PROTOBOT_EGRESS_SESSION_TOKEN_FILE";
/// The token's file name under `/task`.
pub const TOKEN_FILE: &str = "egress-session-token";

/// What an executor needs to give runs proxied egress.
#[derive(Clone, Debug)]
pub struct LocalEgress {
    /// The proxy's session secret (the one `protobot egress-proxy
    /// --session-secret` reads): run tokens are signed with it.
    pub session_secret: SessionSecret,
    /// How long a token stays valid after the run's wall clock ran out.
    pub token_grace: Duration,
}

impl LocalEgress {
    /// Egress signed with `session_secret`, tokens valid for the run's wall
    /// clock plus 60 s.
    pub fn new(session_secret: SessionSecret) -> LocalEgress {
        LocalEgress {
            session_secret,
            token_grace: Duration::from_secs(60),
        }
    }
}

/// Why proxied egress could not be set up for a run (the run is refused).
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// The proxy URL is not `http://host:port`.
    #[error(
        "the egress proxy URL {url:?} is not usable: {why}; give the proxy's plain-HTTP base URL, e.g. http://127.0.0.1:3128"
    )]
    ProxyUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The control plane is not root.
    #[error(
        "local proxied egress needs root: the run's network namespace is made with `ip netns`; run the control plane as root, or run without egress"
    )]
    NotRoot,
    /// A host tool is missing.
    #[error(
        "`{tool}` was not found; install {package} (local proxied egress uses it to build the run's network namespace)"
    )]
    MissingTool {
        /// The tool.
        tool: &'static str,
        /// Its Debian package.
        package: &'static str,
    },
    /// Binding the listener inside the namespace failed.
    #[error("failed to bind 127.0.0.1:{SANDBOX_PROXY_PORT} inside the network namespace {netns}")]
    Bind {
        /// The namespace.
        netns: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The proxy's address on the host, read from its base URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyAddress {
    /// Host name or IP literal (brackets removed).
    pub host: String,
    /// Port.
    pub port: u16,
}

impl ProxyAddress {
    /// Reads `http://host[:port][/]` (port 80 when absent). Anything else —
    /// another scheme, user information, a path, a query — is refused: the
    /// relay forwards bytes to one address and the sandbox addresses the
    /// proxy by its own base URL.
    pub fn parse(url: &str) -> Result<ProxyAddress, EgressError> {
        let bad = |why| EgressError::ProxyUrl {
            url: url.to_owned(),
            why,
        };
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| bad("only http:// is supported (the proxy speaks HTTPS upstream)"))?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#']) {
            return Err(bad("it has a path, query or fragment"));
        }
        if authority.contains('@') {
            return Err(bad("it has user information"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            match after {
                "" => (host, None),
                p => (
                    host,
                    Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ']'"))?),
                ),
            }
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(bad("it names no host"));
        }
        let port = match port {
            None => 80,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad("the port is not a number in 1..=65535"))?,
        };
        Ok(ProxyAddress {
            host: host.to_owned(),
            port,
        })
    }
}

/// The egress session of a run: its work item (from the task document, else
/// the run id), its role, the run id as trace id, the source commit when the
/// task names one, and what its model usage is attributed to (project, stage,
/// cycle, tier: [`RunSpec::attribution`] and the audit's cycle). The one
/// derivation both executors use (the Kubernetes executor's
/// `manifest::egress_session` calls it), so one policy and one meter serve
/// both.
pub fn session_for(spec: &RunSpec) -> Session {
    let field = |name: &str| {
        spec.task
            .get(name)
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    Session {
        work_item: field("work_item_id").unwrap_or_else(|| spec.run_id.clone()),
        role: spec.role.as_str().to_owned(),
        trace_id: spec.run_id.clone(),
        source_commit: field("source_commit").unwrap_or_default(),
        project: spec.attribution.project.clone(),
        stage: spec
            .attribution
            .stage
            .map(|s| s.as_str().to_owned())
            .unwrap_or_default(),
        cycle: spec.audit.cycle,
        tier: spec
            .attribution
            .tier
            .map(|t| t.as_str().to_owned())
            .unwrap_or_default(),
    }
}

/// When a run's token expires (unix seconds): `now` plus its wall clock plus
/// the grace.
pub fn token_expiry(now: Duration, wall_clock: Duration, grace: Duration) -> i64 {
    let at = now.saturating_add(wall_clock).saturating_add(grace);
    i64::try_from(at.as_secs()).unwrap_or(i64::MAX)
}

/// The environment a run with egress gets.
pub fn sandbox_env() -> [(String, String); 2] {
    [
        (
            ENV_EGRESS_PROXY.to_owned(),
            format!("http://127.0.0.1:{SANDBOX_PROXY_PORT}"),
        ),
        (
            ENV_EGRESS_TOKEN_FILE.to_owned(),
            format!("/task/{TOKEN_FILE}"),
        ),
    ]
}

/// The usage port on one machine: the in-process egress proxy's meter
/// (`protobot_egress::UsageMeter`), read directly after each run. Reading it
/// cannot fail.
#[derive(Clone, Debug)]
pub struct MeterUsage(pub protobot_egress::UsageMeter);

impl protobot_jobsite::usage::UsageSource for MeterUsage {
    fn run_usage<'a>(&'a self, run_id: &'a str) -> protobot_jobsite::usage::UsageFuture<'a> {
        Box::pin(async move { Ok(self.0.run(run_id)) })
    }
}

pub use protobot_egress::netns::NetNs;

/// Binds `127.0.0.1:port` inside the namespace at `ns_path`
/// ([`protobot_egress::netns::bind_inside`]). Blocking.
pub fn bind_inside(ns_path: &Path, port: u16) -> std::io::Result<std::net::TcpListener> {
    protobot_egress::netns::bind_inside(ns_path, IpAddr::V4(Ipv4Addr::LOCALHOST), port)
}

/// Relays connections from the sandbox's listener to the proxy until dropped
/// (dropping it ends every relayed connection too).
#[derive(Debug)]
pub struct Relay {
    _inner: protobot_egress::netns::Relay,
}

impl Relay {
    /// Starts relaying `listener` (bound inside the namespace) to `proxy`.
    pub fn start(listener: std::net::TcpListener, proxy: ProxyAddress) -> std::io::Result<Relay> {
        protobot_egress::netns::Relay::start(listener, proxy.host, proxy.port)
            .map(|inner| Relay { _inner: inner })
    }
}

#[cfg(test)]
mod tests {
    use protobot_jobsite::executor::{Limits, RunAudit, SandboxRole};

    use super::*;

    #[test]
    fn proxy_urls_are_plain_http_host_and_port() {
        let ok = |url: &str, host: &str, port: u16| {
            assert_eq!(
                ProxyAddress::parse(url).unwrap(),
                ProxyAddress {
                    host: host.to_owned(),
                    port
                },
                "{url}"
            );
        };
        ok("http://127.0.0.1:3128", "127.0.0.1", 3128);
        ok("http://127.0.0.1:3128/", "127.0.0.1", 3128);
        ok("http://proxy.internal", "proxy.internal", 80);
        ok("http://[::1]:9000", "::1", 9000);
        for bad in [
            "https://127.0.0.1:3128",
            "127.0.0.1:3128",
            "http://127.0.0.1:3128/v1",
            "http://user@127.0.0.1:3128",
            "http://:3128",
            "http://127.0.0.1:0",
            "http://127.0.0.1:99999",
            "http://127.0.0.1:x",
            "http://[::1",
            "http://[::1]x",
            "http://h?q",
        ] {
            let err = ProxyAddress::parse(bad).unwrap_err();
            assert!(
                err.to_string().contains("http://127.0.0.1:3128"),
                "{bad}: {err}"
            );
        }
    }

    fn spec(task: serde_json::Value) -> RunSpec {
        RunSpec {
            run_id: "wi-7-c1-worker-a-0".into(),
            role: SandboxRole::WorkerA,
            workspace: "/nonexistent".into(),
            task,
            command: vec!["true".into()],
            image: None,
            env: Default::default(),
            limits: Limits::default(),
            egress_proxy: Some("http://127.0.0.1:3128".into()),
            audit: RunAudit::default(),
            attribution: Default::default(),
        }
    }

    #[test]
    fn the_session_names_the_work_item_role_and_run() {
        let s = session_for(&spec(
            serde_json::json!({"work_item_id": "wi-7", "source_commit": "abc123"}),
        ));
        assert_eq!(
            s,
            Session {
                work_item: "wi-7".into(),
                role: "worker-a".into(),
                trace_id: "wi-7-c1-worker-a-0".into(),
                source_commit: "abc123".into(),
                ..Default::default()
            }
        );
        // A task without those fields falls back to the run id and no commit.
        let s = session_for(&spec(serde_json::json!({"work_item_id": 7})));
        assert_eq!(s.work_item, "wi-7-c1-worker-a-0");
        assert_eq!(s.source_commit, "");
    }

    #[test]
    fn the_session_carries_the_runs_attribution_and_the_meter_counts_by_it() {
        use protobot_egress::{ModelApi, UsageMeter, UsageMetrics, usage::TokenKind};
        use protobot_jobsite::{escalation::Tier, executor::RunAttribution};
        use protobot_usage::Stage;

        let mut attributed = spec(serde_json::json!({"work_item_id": "wi-7"}));
        attributed.audit.cycle = 2;
        attributed.attribution = RunAttribution {
            project: "shop".into(),
            stage: Some(Stage::WorkerA),
            tier: Some(Tier::T3),
        };
        let session = session_for(&attributed);
        assert_eq!(
            (
                session.project.as_str(),
                session.stage.as_str(),
                session.cycle,
                session.tier.as_str(),
                session.role.as_str()
            ),
            ("shop", "worker-a", 2, "t3", "worker-a")
        );
        // The signed token the sandbox gets carries it to the proxy unchanged.
        let secret = SessionSecret::new(vec![7u8; 32]);
        let token = protobot_egress::issue_session_token(&secret, &session, i64::MAX);
        let verified = protobot_egress::verify_session_token(&secret, &token, 0).unwrap();
        assert_eq!(verified, session);
        // The proxy's meter keys the run by its id and labels its metrics by
        // project, role and tier.
        let registry = prometheus::Registry::new();
        let meter = UsageMeter::new(
            Default::default(),
            Some(UsageMetrics::register(&registry).unwrap()),
        );
        meter.record_answer(
            &verified,
            ModelApi::OpenAiChat,
            None,
            br#"{"model":"m","usage":{"prompt_tokens":12,"completion_tokens":5}}"#,
        );
        let run = meter.run("wi-7-c1-worker-a-0").unwrap();
        assert_eq!(run.tokens().input, 12);
        let family = registry
            .gather()
            .into_iter()
            .find(|f| f.name() == "protobot_model_tokens_total")
            .unwrap();
        let labels = |m: &prometheus::proto::Metric| {
            m.get_label()
                .iter()
                .map(|l| (l.name().to_owned(), l.value().to_owned()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let input = family
            .get_metric()
            .iter()
            .find(|m| labels(m)["kind"] == TokenKind::Input.as_str())
            .unwrap();
        let l = labels(input);
        assert_eq!(
            (
                l["project"].as_str(),
                l["role"].as_str(),
                l["tier"].as_str()
            ),
            ("shop", "worker-a", "t3")
        );
        assert_eq!(input.get_counter().get_value(), 12.0);
        // The usage port over this meter reads the same record back.
        let port = MeterUsage(meter.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        use protobot_jobsite::usage::UsageSource;
        let read = runtime
            .block_on(port.run_usage("wi-7-c1-worker-a-0"))
            .unwrap();
        assert_eq!(read, Some(run));
        assert_eq!(runtime.block_on(port.run_usage("other")).unwrap(), None);
        // A run without attribution keeps the session (and token) it always had.
        let bare = session_for(&spec(serde_json::json!({})));
        assert_eq!(
            (bare.project.as_str(), bare.stage.as_str(), bare.cycle),
            ("", "", 0)
        );
    }

    #[test]
    fn the_probe_credential_is_the_suites_sentinel() {
        // The broker checks look for the sentinel where the probe credential must not be.
        assert_eq!(
            protobot_egress::probe::PROBE_CREDENTIAL_VALUE,
            crate::BROKER_TOKEN_SENTINEL
        );
    }

    #[test]
    fn the_token_expires_after_the_wall_clock_and_the_grace() {
        let s = Duration::from_secs;
        assert_eq!(token_expiry(s(1000), s(600), s(60)), 1660);
        assert_eq!(token_expiry(Duration::MAX, s(1), s(1)), i64::MAX);
    }
}
