//! Real git servers on loopback for tests: smart HTTP over TLS with basic auth
//! (nginx + fcgiwrap + git-http-backend) and sshd, both serving one bare
//! repository seeded with a commit on `main`. Started by `scripts/git-test-servers`
//! in a temp dir on free ports; stopped and removed when the value drops.
//!
//! Shared by path (`#[path = ".../support/git_servers.rs"]`) with the tests of
//! other crates. When the Debian packages are missing, [`GitServers::start`]
//! returns `None` after printing why, or panics with the install command when
//! `PROTOBOT_REQUIRE_GIT_SERVERS=1` (CI) is set.

use std::{
    collections::BTreeMap,
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
};

/// Set to `1` (CI) to fail instead of skipping when the servers cannot run.
pub const REQUIRE_ENV: &str = "PROTOBOT_REQUIRE_GIT_SERVERS";

/// A directory under the system's temp dir, removed with everything in it on drop (no
/// tempfile dependency: this module is shared with crates that lack it).
pub struct Scratch(PathBuf);

impl Scratch {
    /// A new empty directory.
    pub fn new() -> Scratch {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let dir =
            std::env::temp_dir().join(format!("protobot-git-{}-{n}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        Scratch(dir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The running servers and what a client needs to reach them.
pub struct GitServers {
    dir: Scratch,
    script: PathBuf,
    /// `https://127.0.0.1:PORT/git/project.git`.
    pub https_url: String,
    /// `ssh://USER@127.0.0.1:PORT/…/project.git`.
    pub ssh_url: String,
    /// The served bare repository on disk.
    pub bare: PathBuf,
    /// Basic-auth user.
    pub username: String,
    /// Basic-auth password (random per start).
    pub password: String,
    /// PEM of the CA that signed the HTTPS certificate.
    pub ca_pem: Vec<u8>,
    /// The authorized client private key (OpenSSH format).
    pub ssh_key: String,
    /// `known_hosts` with the server's real host key.
    pub known_hosts: String,
    /// `known_hosts` listing another key for the same host (a changed host key).
    pub other_known_hosts: String,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("scripts/git-test-servers").is_file())
        .map(|d| d.join("scripts/git-test-servers"))
        .unwrap_or_else(|| {
            panic!(
                "scripts/git-test-servers not found above {}",
                env!("CARGO_MANIFEST_DIR")
            )
        })
}

impl GitServers {
    /// Starts both servers, or `None` (printing why) when they cannot run here.
    pub fn start() -> Option<GitServers> {
        GitServers::start_as(None)
    }

    /// Starts both servers with the HTTPS basic-auth `(username, password)` given, e.g. a
    /// forge's `x-access-token` and the token it mints; else as [`GitServers::start`].
    pub fn start_as(login: Option<(&str, &str)>) -> Option<GitServers> {
        GitServers::start_with(login, None)
    }

    /// Starts both servers listening on `host` (an address of this machine, e.g. the real
    /// node's address that pods reach), HTTPS on `https_port`; else as [`GitServers::start`].
    #[allow(dead_code)] // the real-node scenarios (operator/cli/tests/real_node.rs)
    pub fn start_on(host: &str, https_port: u16) -> Option<GitServers> {
        GitServers::start_with(None, Some((host, https_port)))
    }

    fn start_with(login: Option<(&str, &str)>, listen: Option<(&str, u16)>) -> Option<GitServers> {
        let script = script();
        let check = Command::new(&script)
            .arg("check")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        if !check.status.success() {
            let why = String::from_utf8_lossy(&check.stderr).trim().to_owned();
            if std::env::var(REQUIRE_ENV).as_deref() == Ok("1") {
                panic!("{why} ({REQUIRE_ENV}=1: these tests may not skip)");
            }
            eprintln!("skipped: {why} (set {REQUIRE_ENV}=1 to make this a failure)");
            return None;
        }
        let dir = Scratch::new();
        let root = dir.path().join("servers");
        let https_port = listen.map_or_else(free_port, |(_, port)| port);
        let ssh_port = free_port();
        let mut start = Command::new(&script);
        if let Some((host, _)) = listen {
            start.env("GIT_TEST_HOST", host);
        }
        start
            .arg("start")
            .arg(&root)
            .arg(https_port.to_string())
            .arg(ssh_port.to_string());
        if let Some((username, password)) = login {
            start
                .env("GIT_TEST_USERNAME", username)
                .env("GIT_TEST_PASSWORD", password);
        }
        let started = start
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let servers_env = root.join("servers.env");
        if !started.status.success() {
            let _ = Command::new(&script).arg("stop").arg(&root).status();
            panic!(
                "git test servers did not start: {}",
                String::from_utf8_lossy(&started.stderr)
            );
        }
        let text = std::fs::read_to_string(&servers_env).unwrap_or_else(|e| panic!("{e}"));
        let env: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let get = |k: &str| -> String {
            env.get(k)
                .map(|v| (*v).to_owned())
                .unwrap_or_else(|| panic!("servers.env has no {k}"))
        };
        let read = |k: &str| std::fs::read(get(k)).unwrap_or_else(|e| panic!("{k}: {e}"));
        let text_of = |k: &str| String::from_utf8(read(k)).unwrap_or_else(|e| panic!("{k}: {e}"));
        Some(GitServers {
            https_url: get("HTTPS_URL"),
            ssh_url: get("SSH_URL"),
            bare: PathBuf::from(get("BARE")),
            username: get("USERNAME"),
            password: get("PASSWORD"),
            ca_pem: read("CA_CRT"),
            ssh_key: text_of("SSH_KEY"),
            known_hosts: text_of("KNOWN_HOSTS"),
            other_known_hosts: text_of("OTHER_KNOWN_HOSTS"),
            script,
            dir,
        })
    }

    /// The head of `main` in the served repository, read on disk.
    pub fn main_head(&self) -> git2::Oid {
        git2::Repository::open_bare(&self.bare)
            .and_then(|r| r.refname_to_id("refs/heads/main"))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// HTTPS Secret data: `username`, `password` (or `wrong` instead) and `ca.crt`.
    pub fn https_secret(&self, password: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([
            ("username".to_owned(), self.username.clone().into_bytes()),
            ("password".to_owned(), password.as_bytes().to_vec()),
            ("ca.crt".to_owned(), self.ca_pem.clone()),
        ])
    }

    /// SSH Secret data: the client key and `known_hosts`.
    pub fn ssh_secret(&self, known_hosts: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([
            (
                "ssh-privatekey".to_owned(),
                self.ssh_key.clone().into_bytes(),
            ),
            ("known_hosts".to_owned(), known_hosts.as_bytes().to_vec()),
        ])
    }
}

impl Drop for GitServers {
    fn drop(&mut self) {
        let _ = Command::new(&self.script)
            .arg("stop")
            .arg(self.dir.path().join("servers"))
            .status();
    }
}

/// Every file under `dir` (recursively) whose bytes contain `needle`.
pub fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    // Regular files only (never a FIFO, socket or device: a node's state directories hold
    // them) and at most 64 MiB each (larger ones are images and binaries, never written
    // with a credential); links are not followed.
    const LARGEST: u64 = 64 << 20;
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file()
                && meta.len() <= LARGEST
                && std::fs::read(&path)
                    .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
            {
                found.push(path);
            }
        }
    }
    found
}
