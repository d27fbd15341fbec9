//! A sandbox's network namespace whose only reachable addresses are relays to
//! the egress proxy (issue 21): the mechanism the bubblewrap executor
//! (`protobot_executors::egress`) and the simulated kubelet's pods
//! (`protobot_testkit`) share.
//!
//! [`NetNs::create`] makes a named namespace (`ip netns add`, so the caller
//! must be root) holding only `lo`, up; [`NetNs::add_local_address`] gives
//! `lo` one more address (a Service's cluster IP, say). [`bind_inside`] binds
//! a listening socket inside the namespace from a short-lived thread that
//! entered it with `setns`; the socket stays in the namespace, and
//! [`Relay`] accepts on it from the host's namespace and copies each
//! connection to the proxy. Nothing else has a route: a direct connection
//! fails at once with "network unreachable", and a name lookup fails at once
//! when the sandbox has no resolver configuration (nothing listens on port 53
//! of its loopback).

use std::{
    fs::File,
    net::IpAddr,
    os::fd::AsFd,
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::Duration,
};

use tokio::{net::TcpStream, sync::Semaphore, task::JoinSet};

/// Most relayed connections of one namespace's listener at once.
const MAX_RELAYED: usize = 64;
/// How long connecting to the proxy may take.
const PROXY_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `ip` failed while building or removing a namespace.
#[derive(Debug, thiserror::Error)]
#[error("failed to {what} with `ip {args}`: {message}")]
pub struct IpError {
    /// What was being done.
    pub what: &'static str,
    /// The arguments.
    pub args: String,
    /// stderr or the spawn error.
    pub message: String,
}

/// A named network namespace (`/run/netns/<name>`) with `lo` up, deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    ip: PathBuf,
    name: String,
}

fn run_ip(ip: &Path, what: &'static str, args: &[&str]) -> Result<(), IpError> {
    let failed = |message: String| IpError {
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
    /// Creates the namespace `name` with only `lo`, up, using the `ip` binary
    /// at `ip`. Blocking.
    pub fn create(ip: &Path, name: &str) -> Result<NetNs, IpError> {
        run_ip(
            ip,
            "create the sandbox's network namespace",
            &["netns", "add", name],
        )?;
        let ns = NetNs {
            ip: ip.to_path_buf(),
            name: name.to_owned(),
        };
        run_ip(
            ip,
            "bring up lo in the sandbox's network namespace",
            &["-n", name, "link", "set", "lo", "up"],
        )?;
        Ok(ns)
    }

    /// Adds `addr` (as a single-address prefix) to the namespace's `lo`, so a
    /// listener can be bound on it. It adds no route off `lo`. Blocking.
    pub fn add_local_address(&self, addr: IpAddr) -> Result<(), IpError> {
        if addr.is_loopback() && addr.is_ipv4() {
            return Ok(()); // 127.0.0.0/8 is on lo already.
        }
        let prefix = match addr {
            IpAddr::V4(_) => format!("{addr}/32"),
            IpAddr::V6(_) => format!("{addr}/128"),
        };
        run_ip(
            &self.ip,
            "add an address to lo in the sandbox's network namespace",
            &["-n", &self.name, "addr", "add", &prefix, "dev", "lo"],
        )
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
            "delete the sandbox's network namespace",
            &["netns", "delete", &self.name],
        ) {
            tracing::error!(netns = %self.name, "{e}; delete it with `ip netns delete`");
        }
    }
}

/// Binds `ip:port` inside the namespace at `ns_path`: a new thread enters it
/// with `setns`, binds, and exits, so no thread of the process stays in the
/// sandbox's namespace. Blocking.
pub fn bind_inside(
    ns_path: &Path,
    ip: IpAddr,
    port: u16,
) -> std::io::Result<std::net::TcpListener> {
    let path = ns_path.to_path_buf();
    std::thread::spawn(move || {
        let ns = File::open(&path)?;
        rustix::thread::move_into_link_name_space(
            ns.as_fd(),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )?;
        let listener = std::net::TcpListener::bind((ip, port))?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })
    .join()
    .map_err(|_| std::io::Error::other("the thread binding inside the namespace panicked"))?
}

/// Relays connections from a listener bound inside a namespace to the proxy
/// until dropped (dropping it ends every relayed connection too).
#[derive(Debug)]
pub struct Relay {
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Starts relaying `listener` (bound inside the namespace) to
    /// `host:port` as seen from the host's namespace. Must be called inside a
    /// Tokio runtime.
    pub fn start(
        listener: std::net::TcpListener,
        host: String,
        port: u16,
    ) -> std::io::Result<Relay> {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let target = Arc::new((host, port));
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
                let target = target.clone();
                conns.spawn(async move {
                    let _slot = slot;
                    relay_one(inside, &target.0, target.1).await;
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

async fn relay_one(mut inside: TcpStream, host: &str, port: u16) {
    let connect = TcpStream::connect((host, port));
    let mut outside = match tokio::time::timeout(PROXY_CONNECT_TIMEOUT, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(%host, port, "egress relay: failed to reach the proxy: {e}");
            return;
        }
        Err(_) => {
            tracing::warn!(%host, port, "egress relay: the proxy did not accept within {PROXY_CONNECT_TIMEOUT:?}");
            return;
        }
    };
    let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
}
