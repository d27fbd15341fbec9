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
//! Pure: [`ProxyAddress::parse`], [`session_for`], [`token_expiry`]. Edges:
//! [`NetNs`] (runs `ip`), [`bind_inside`] (`setns` on a short-lived thread),
//! [`Relay`] (tokio sockets).

use std::{
    fs::File,
    os::fd::AsFd,
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::Duration,
};

use protobot_egress::{Session, SessionSecret};
use protobot_jobsite::executor::RunSpec;
use tokio::{net::TcpStream, sync::Semaphore, task::JoinSet};

/// The port the proxy listens on inside the sandbox's namespace (the
/// cluster's proxy port, so harness configuration carries over).
pub const SANDBOX_PROXY_PORT: u16 = 3128;
/// Base URL of the egress proxy inside the sandbox.
pub const ENV_EGRESS_PROXY: &str = "PROTOBOT_EGRESS_PROXY";
/// Path of the session token file inside the sandbox.
pub const ENV_EGRESS_TOKEN_FILE: &str = "PROTOBOT_EGRESS_SESSION_TOKEN_FILE";
/// The token's file name under `/task`.
pub const TOKEN_FILE: &str = "egress-session-token";
/// Most relayed connections of one run at once.
const MAX_RELAYED: usize = 64;
/// How long connecting to the proxy may take.
const PROXY_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// `ip` failed.
    #[error("failed to {what} with `ip {args}`: {message}")]
    Ip {
        /// What was being done.
        what: &'static str,
        /// The arguments.
        args: String,
        /// stderr or the spawn error.
        message: String,
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
/// the run id), its role, the run id as trace id, and the source commit when
/// the task names one. The same derivation as the Kubernetes executor's
/// (`protobot_kube_executor::manifest::egress_session`), so one policy serves
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

/// A named network namespace (`/run/netns/<name>`) with `lo` up, deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    ip: PathBuf,
    name: String,
}

fn run_ip(ip: &Path, what: &'static str, args: &[&str]) -> Result<(), EgressError> {
    let failed = |message: String| EgressError::Ip {
        what,
        args: args.join(" "),
        message,
    };
    let out = Command::new(ip)
        .args(args)
        .env_clear()
        .output()
        .map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ))
    }
}

impl NetNs {
    /// Creates the namespace `name` with only `lo`, up. Blocking.
    pub fn create(ip: &Path, name: &str) -> Result<NetNs, EgressError> {
        run_ip(
            ip,
            "create the run's network namespace",
            &["netns", "add", name],
        )?;
        let ns = NetNs {
            ip: ip.to_path_buf(),
            name: name.to_owned(),
        };
        run_ip(
            ip,
            "bring up lo in the run's network namespace",
            &["-n", name, "link", "set", "lo", "up"],
        )?;
        Ok(ns)
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted namespace file (`nsenter --net=` takes it).
    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        if let Err(e) = run_ip(
            &self.ip,
            "delete the run's network namespace",
            &["netns", "delete", &self.name],
        ) {
            tracing::error!(netns = %self.name, "{e}; delete it with `ip netns delete`");
        }
    }
}

/// Binds `127.0.0.1:port` inside the namespace at `ns_path`: a new thread
/// enters it with `setns`, binds, and exits, so no thread of the process
/// stays in the sandbox's namespace. Blocking.
pub fn bind_inside(ns_path: &Path, port: u16) -> std::io::Result<std::net::TcpListener> {
    let path = ns_path.to_path_buf();
    std::thread::spawn(move || {
        let ns = File::open(&path)?;
        rustix::thread::move_into_link_name_space(
            ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )?;
        let listener = std::net::TcpListener::bind(("127.0.0.1", port))?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })
    .join()
    .map_err(|_| std::io::Error::other("the thread binding inside the namespace panicked"))?
}

/// Relays connections from the sandbox's listener to the proxy until dropped
/// (dropping it ends every relayed connection too).
#[derive(Debug)]
pub struct Relay {
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Starts relaying `listener` (bound inside the namespace) to `proxy`.
    pub fn start(listener: std::net::TcpListener, proxy: ProxyAddress) -> std::io::Result<Relay> {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let task = tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(MAX_RELAYED));
            let mut conns = JoinSet::new();
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    // Reap finished connections so the set stays small.
                    Some(_) = conns.join_next(), if !conns.is_empty() => continue,
                };
                let Ok((inside, _)) = accepted else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    tracing::warn!(
                        max = MAX_RELAYED,
                        "egress relay: too many connections from one sandbox; closing one"
                    );
                    continue;
                };
                let proxy = proxy.clone();
                conns.spawn(async move {
                    let _slot = slot;
                    relay_one(inside, &proxy).await;
                });
            }
        });
        Ok(Relay { task })
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay_one(mut inside: TcpStream, proxy: &ProxyAddress) {
    let connect = TcpStream::connect((proxy.host.as_str(), proxy.port));
    let mut outside = match tokio::time::timeout(PROXY_CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(host = %proxy.host, port = proxy.port, "egress relay: failed to reach the proxy: {e}");
            return;
        }
        Err(_) => {
            tracing::warn!(host = %proxy.host, port = proxy.port, "egress relay: the proxy did not accept within {PROXY_CONNECT_TIMEOUT:?}");
            return;
        }
    };
    let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
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
            }
        );
        // A task without those fields falls back to the run id and no commit.
        let s = session_for(&spec(serde_json::json!({"work_item_id": 7})));
        assert_eq!(s.work_item, "wi-7-c1-worker-a-0");
        assert_eq!(s.source_commit, "");
    }

    #[test]
    fn the_token_expires_after_the_wall_clock_and_the_grace() {
        let s = Duration::from_secs;
        assert_eq!(token_expiry(s(1000), s(600), s(60)), 1660);
        assert_eq!(token_expiry(Duration::MAX, s(1), s(1)), i64::MAX);
    }
}
