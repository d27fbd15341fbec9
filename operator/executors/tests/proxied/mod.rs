//! Shared fixtures of the proxied-egress tests: the egress gate, a real
//! egress proxy and credential broker (`protobot_egress::Broker` on a
//! loopback port, as `protobot egress-proxy` serves it) in front of the
//! deterministic model double, and a capture of the proxy's decision events.
//!
//! The proxy speaks HTTPS upstream in production; here it reaches the double
//! over plain HTTP through `Upstream::plaintext_for_tests`, mapped for
//! `model.example.invalid` (allowed) and `evil.example.invalid` (no rule), so a
//! request the proxy wrongly forwarded to the other host would show up in the
//! double's record.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    io::Write,
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock},
};

pub mod harness;

use prometheus::Registry;
use protobot_egress::{
    Broker, Credential, CredentialStore, EgressMetrics, EgressPolicy, Limits, SessionRegistry,
    SessionSecret, Upstream, server::serve,
};
use protobot_model_double::{ModelDouble, Script};
use tokio::net::TcpListener;

/// The model host the policy allows.
pub const MODEL_HOST: &str = "model.example.invalid";
/// A host no rule names.
pub const OTHER_HOST: &str = "evil.example.invalid";
/// The API key only the broker holds.
pub const API_KEY: &str = "sk-protobot-test-7f3a9c1e5b";

/// The policy: Workers A and B may POST chat completions to the model host
/// with the `model` credential; nothing else.
pub const POLICY: &str = r#"
rules:
  - role: worker-a
    destination: model.example.invalid
    method: POST
    path: /v1/chat/completions
    credential: model
  - role: worker-b
    destination: model.example.invalid
    method: POST
    path: /v1/chat/completions
    credential: model
"#;

/// True when proxied egress can run here (bubblewrap, root, `ip`,
/// `nsenter`). Otherwise the test is skipped with the reason, unless
/// `PROTOBOT_REQUIRE_EGRESS` is set, which fails it.
pub fn egress_available(test: &str) -> bool {
    let missing = egress_missing();
    let Some(why) = missing else {
        return true;
    };
    if std::env::var_os("PROTOBOT_REQUIRE_EGRESS").is_some() {
        panic!("{test}: {why}, but PROTOBOT_REQUIRE_EGRESS is set");
    }
    eprintln!("SKIPPED {test}: {why}; set PROTOBOT_REQUIRE_EGRESS=1 to make this a failure");
    false
}

fn egress_missing() -> Option<String> {
    let probe = protobot_executors::BubblewrapExecutor::new(
        protobot_executors::BubblewrapConfig::default(),
    );
    if probe.bwrap_path().is_none() {
        return Some(
            "bubblewrap (`bwrap`) is not installed (apt-get install -y bubblewrap)".into(),
        );
    }
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_owned))
        });
    if uid.as_deref() != Some("0") {
        return Some("local proxied egress needs root (ip netns)".into());
    }
    for (tool, package) in [
        ("ip", "iproute2"),
        ("nsenter", "util-linux"),
        ("curl", "curl"),
    ] {
        let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
            .any(|d| d.join(tool).is_file());
        if !found {
            return Some(format!("`{tool}` is not installed ({package})"));
        }
    }
    None
}

/// The decision events of every proxy in this test binary, as text lines.
pub fn audit_log() -> Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log: Arc<Mutex<Vec<u8>>> = Arc::default();
        let sink = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new("protobot::egress=info"))
            .with_writer(move || Sink(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        log
    })
    .clone()
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The proxy's audit lines that mention `needle`.
pub fn audited(needle: &str) -> Vec<String> {
    let log = audit_log();
    let text = String::from_utf8_lossy(&log.lock().unwrap()).into_owned();
    text.lines()
        .filter(|l| l.contains("egress decision") && l.contains(needle))
        .map(str::to_owned)
        .collect()
}

/// A running proxy with the double behind it.
pub struct Proxied {
    /// The proxy's base URL on the host.
    pub proxy_url: String,
    /// The session secret the executor signs tokens with.
    pub secret: SessionSecret,
    /// The proxy's metrics.
    pub metrics: EgressMetrics,
    /// The model endpoint.
    pub double: ModelDouble,
}

impl Proxied {
    /// Decisions counted with `outcome`.
    pub fn decisions(&self, outcome: &str) -> u64 {
        self.metrics.decisions.with_label_values(&[outcome]).get()
    }
}

/// Starts the double with `script` and the proxy in front of it.
pub async fn start(script: Script) -> Proxied {
    start_with_policy(script, POLICY).await
}

/// [`start`] with the proxy deciding by `policy` (another model API's path, say).
pub async fn start_with_policy(script: Script, policy: &str) -> Proxied {
    audit_log();
    let double =
        ModelDouble::start(TcpListener::bind("127.0.0.1:0").await.unwrap(), script).unwrap();
    let upstream: HashMap<String, SocketAddr> = [
        (MODEL_HOST.to_owned(), double.addr()),
        (OTHER_HOST.to_owned(), double.addr()),
    ]
    .into();
    let secret = SessionSecret::new(b"protobot-test-session-secret-0123456789".to_vec());
    let registry = Registry::new();
    let metrics = EgressMetrics::register(&registry).unwrap();
    let broker = Broker::new(
        EgressPolicy::from_yaml(policy, "<test policy>").unwrap(),
        CredentialStore::from_pairs([("model", Credential::new(API_KEY))]),
        SessionRegistry::new(secret.clone()),
        Upstream::plaintext_for_tests(upstream),
        metrics.clone(),
        Limits::default(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(serve(
        listener,
        move |req| {
            let broker = broker.clone();
            async move { broker.handle(req).await }
        },
        std::future::pending(),
    ));
    Proxied {
        proxy_url,
        secret,
        metrics,
        double,
    }
}

/// The network namespaces the executor made for `run_id` that still exist
/// (the executor names them `protobot-<run id>-<nonce>`).
pub fn netns_of(run_id: &str) -> Vec<String> {
    let infix = format!("protobot-{run_id}-");
    netns_names()
        .into_iter()
        .filter(|n| n.starts_with(&infix))
        .collect()
}

/// The names of the host's network namespaces.
pub fn netns_names() -> Vec<String> {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Runs git in `dir` with a fixed identity and no user or system configuration.
pub fn git(dir: &std::path::Path, args: &[&str]) {
    let st = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@invalid")
        .status()
        .unwrap();
    assert!(st.success(), "git {args:?}");
}

/// A canonical repository with a projection manifest, a requirement, a test
/// and an implementation stub.
pub fn canonical(base: &std::path::Path) -> std::path::PathBuf {
    let repo = base.join("canonical");
    let files = [
        (
            ".protobot/projection.yaml",
            "version: 1\npaths:\n  - path: docs/\n    class: shared\n  - path: src/\n    class: implementation\n  - path: tests/\n    class: test\n  - path: .protobot/projection.yaml\n    class: shared\n",
        ),
        (
            "docs/requirements.md",
            "REQ-GREET-00001: When run, greet.sh shall print `hello`.\n",
        ),
        ("src/README", "implementation lives here\n"),
        ("tests/greet.sh", "test \"$(sh src/greet.sh)\" = hello\n"),
    ];
    for (path, body) in files {
        let p = repo.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    }
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-q", "-m", "canonical"]);
    repo
}
