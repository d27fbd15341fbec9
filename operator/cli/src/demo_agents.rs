//! `protobot demo --harness opencode` and `--harness claude-code`: Workers A
//! and B and the Inspector are a real agent CLI, OpenCode
//! (`harnesses/opencode/run.sh`, OpenAI chat completions) or Claude Code
//! (`harnesses/claude-code/run.sh`, the Anthropic Messages API), in the
//! bubblewrap sandbox, reaching a deterministic model endpoint only through
//! the egress proxy (issue 21).
//!
//! The demo starts, in its own process and on loopback only:
//! - the model double (`protobot-model-double`), scripted so that each
//!   Worker's first turn is one shell tool call running the bundled scripted
//!   Worker's edits (`examples/cli-sync/workers/worker-{a,b}.sh`, without its
//!   final copy to `/out`: the harness commits and copies), then a text turn;
//!   the Inspector's first turn runs the bundled Inspector's probes
//!   (`examples/cli-sync/workers/inspector.sh`), which write
//!   `/out/findings.jsonl`, and the harness checks every line's shape;
//! - the egress proxy and credential broker, whose policy lets Worker A,
//!   Worker B and the Inspector POST to the agent's API path on the model
//!   host, injecting a demo key the sandbox never sees.
//!
//! The broker reaches the double over plain HTTP on loopback
//! (`Upstream::plaintext_for_tests`): the double has no certificate the
//! proxy's TLS client would trust. The key is a random demo value that
//! authorizes nothing anywhere else. Needs root (the sandbox's network
//! namespace is made with `ip netns`) and the agent installed
//! (`scripts/install-agents.sh`).

use std::{
    collections::HashMap,
    io::Read,
    path::{Path, PathBuf},
};

use protobot_demo::example::{INSPECTOR, WORKER_A, WORKER_B};
use protobot_egress::{
    Broker, Credential, CredentialStore, EgressMetrics, EgressPolicy, Limits, SessionRegistry,
    SessionSecret, Upstream, UsageMeter, server::serve,
};
use protobot_executors::LocalEgress;
use protobot_jobsite::engine::WorkerClass;
use protobot_model_double::{ModelDouble, Recorded, Scenario, Script, Step, ToolCall};
use serde_json::json;
use tokio::net::TcpListener;

/// The demo's price of the model double's `scripted` model: $3 in and $15 out per million
/// tokens (illustrative: it makes the demo's cost figures non-zero and checkable).
pub fn demo_prices() -> protobot_usage::PriceTable {
    protobot_usage::PriceTable(
        [(
            "scripted".to_owned(),
            protobot_usage::ModelPrice {
                input: protobot_usage::PerMillion(3_000_000),
                output: protobot_usage::PerMillion(15_000_000),
                ..Default::default()
            },
        )]
        .into_iter()
        .collect(),
    )
}
/// [`demo_prices`] for the report (`illustrative $3 in / $15 out per million tokens`).
pub fn demo_price_note() -> String {
    match demo_prices().0.values().next() {
        Some(p) => format!(
            "illustrative ${} in / ${} out per million tokens",
            p.input, p.output
        ),
        None => "no prices".to_owned(),
    }
}

/// The model host the demo's policy allows.
pub const MODEL_HOST: &str = "model.protobot-demo.invalid";
/// The harness script, bundled into the binary.
const RUN_SH: &str = include_str!("../../../harnesses/opencode/run.sh");
/// The Claude Code harness script, bundled into the binary.
const CLAUDE_CODE_RUN_SH: &str = include_str!("../../../harnesses/claude-code/run.sh");

/// The agent CLI that runs as Workers A and B and the Inspector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Agent {
    /// OpenCode (`harnesses/opencode`), OpenAI chat completions.
    Opencode,
    /// Claude Code (`harnesses/claude-code`), the Anthropic Messages API.
    ClaudeCode,
}

impl Agent {
    /// Its name in messages.
    pub fn display_name(self) -> &'static str {
        match self {
            Agent::Opencode => "OpenCode",
            Agent::ClaudeCode => "Claude Code",
        }
    }
    /// The binary's name (under `.tools/agents/bin/` or on `PATH`).
    fn binary(self) -> &'static str {
        match self {
            Agent::Opencode => "opencode",
            Agent::ClaudeCode => "claude",
        }
    }
    /// The flag that names another binary.
    fn flag(self) -> &'static str {
        match self {
            Agent::Opencode => "--opencode",
            Agent::ClaudeCode => "--claude",
        }
    }
    /// The harness's folder under `harnesses/` and its script.
    fn harness(self) -> (&'static str, &'static str) {
        match self {
            Agent::Opencode => ("opencode", RUN_SH),
            Agent::ClaudeCode => ("claude-code", CLAUDE_CODE_RUN_SH),
        }
    }
    /// The variable through which the harness gets the binary.
    fn binary_variable(self) -> &'static str {
        match self {
            Agent::Opencode => "PROTOBOT_OPENCODE",
            Agent::ClaudeCode => "PROTOBOT_CLAUDE",
        }
    }
    /// The model API's path the policy allows.
    fn api_path(self) -> &'static str {
        match self {
            Agent::Opencode => "/v1/chat/completions",
            Agent::ClaudeCode => "/v1/messages",
        }
    }
    /// The name of the agent's shell tool.
    fn shell_tool(self) -> &'static str {
        match self {
            Agent::Opencode => "bash",
            Agent::ClaudeCode => "Bash",
        }
    }
}

/// The demo's policy: Workers A and B and the Inspector may POST to
/// `api_path` on the model host, with the `model` credential; nothing else.
fn policy(api_path: &str) -> String {
    ["worker-a", "worker-b", "inspector"]
        .iter()
        .map(|role| {
            format!(
                "  - role: {role}\n    destination: {MODEL_HOST}\n    method: POST\n    path: {api_path}\n    credential: model\n"
            )
        })
        .fold("rules:\n".to_owned(), |acc, r| acc + &r)
}

/// Why the agent Workers could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// OpenCode is not installed.
    #[error(
        "OpenCode was not found at {0}; install it with scripts/install-agents.sh or pass --opencode PATH"
    )]
    NoOpencode(PathBuf),
    /// The agent is not installed.
    #[error(
        "{agent} was not found at {path}; install it with scripts/install-agents.sh or pass {flag} PATH"
    )]
    NoAgent {
        /// The agent.
        agent: &'static str,
        /// Where it was looked for.
        path: PathBuf,
        /// The flag naming another binary.
        flag: &'static str,
    },
    /// Not root.
    #[error(
        "the agent harnesses need root: the Workers' network namespace (their only route is the egress proxy) is made with `ip netns`"
    )]
    NotRoot,
    /// A file or socket could not be prepared.
    #[error("failed to {what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The bundled policy did not load (a defect of this binary).
    #[error("failed to load the demo's egress policy: {0}")]
    Policy(#[from] protobot_egress::PolicyError),
    /// The proxy's metrics did not register.
    #[error("failed to register the egress metrics: {0}")]
    Metrics(#[from] prometheus::Error),
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> AgentError {
    move |source| AgentError::Io { what, source }
}

/// The OpenCode binary: `--opencode`, else `.tools/agents/bin/opencode` under
/// the current directory, else `opencode` on `PATH`; symlinks resolved (the
/// sandbox mounts the directory of the real binary).
pub fn find_opencode(given: Option<&Path>) -> Result<PathBuf, AgentError> {
    find_agent(Agent::Opencode, given).map_err(|e| match e {
        AgentError::NoAgent { path, .. } => AgentError::NoOpencode(path),
        other => other,
    })
}

/// The agent's binary: `given`, else `.tools/agents/bin/<binary>` under the
/// current directory, else `<binary>` on `PATH`; symlinks resolved (the
/// sandbox mounts the directory of the real binary).
pub fn find_agent(agent: Agent, given: Option<&Path>) -> Result<PathBuf, AgentError> {
    let candidate = match given {
        Some(p) => p.to_path_buf(),
        None => {
            let local = PathBuf::from(".tools/agents/bin").join(agent.binary());
            if local.exists() {
                local
            } else {
                std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                    .map(|d| d.join(agent.binary()))
                    .find(|p| p.is_file())
                    .unwrap_or(local)
            }
        }
    };
    std::fs::canonicalize(&candidate)
        .ok()
        .filter(|p| p.is_file())
        .ok_or(AgentError::NoAgent {
            agent: agent.display_name(),
            path: candidate,
            flag: agent.flag(),
        })
}

/// The scripted Worker's edits as one shell command: its script without the
/// final copy to `/out/worker` (the harness commits and copies).
pub fn scripted_edits(script: &str) -> String {
    script
        .lines()
        .filter(|l| !l.trim_start().starts_with("cp -a /workspace /out/worker"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The double's script for `work_item` (Workers A and B and the Inspector),
/// with `agent`'s shell tool.
pub fn model_script_for(agent: Agent, work_item: &str) -> Script {
    let scenario = |role: &str, worker: &str| Scenario {
        marker: format!("{role} for {work_item}"),
        failures: Vec::new(),
        steps: vec![
            Step::ToolCalls {
                calls: vec![ToolCall {
                    name: agent.shell_tool().into(),
                    arguments: json!({
                        "command": scripted_edits(worker),
                        "description": format!("{role}: the bundled example's edits"),
                    }),
                }],
            },
            Step::Text {
                text: format!("{role}: done"),
            },
        ],
    };
    Script {
        scenarios: vec![
            scenario("worker-a", WORKER_A),
            scenario("worker-b", WORKER_B),
            scenario("inspector", INSPECTOR),
        ],
    }
}

/// The running model double and proxy, and what the engine needs from them.
pub struct AgentWorkers {
    /// Worker A's class.
    pub worker_a: WorkerClass,
    /// Worker B's class.
    pub worker_b: WorkerClass,
    /// The Inspector's class.
    pub inspector: WorkerClass,
    /// The proxy's base URL (host side).
    pub proxy_url: String,
    /// The executor's egress (the proxy's session secret).
    pub egress: LocalEgress,
    /// Host paths the sandbox must see read-only: the harness and the agent's CLI.
    pub binds: Vec<PathBuf>,
    /// The proxy's meter: the Job Site reads each run's model usage from it (issue 34).
    pub meter: UsageMeter,
    key: String,
    double: ModelDouble,
    metrics: EgressMetrics,
}

/// What the model endpoint saw, for the report.
#[derive(Debug, serde::Serialize)]
pub struct ModelEvidence {
    /// Requests that reached the endpoint.
    pub requests: usize,
    /// How many carried the demo key, injected by the broker.
    pub with_injected_key: usize,
    /// Decisions of the proxy that allowed a request.
    pub proxy_allowed: u64,
    /// Decisions of the proxy that denied one.
    pub proxy_denied: u64,
    /// The usage the double's answers reported, by its own count (the meter must agree).
    pub served: protobot_model_double::Served,
}

impl AgentWorkers {
    /// What the endpoint and the proxy saw so far.
    pub fn evidence(&self) -> ModelEvidence {
        let requests: Vec<Recorded> = self.double.requests();
        let bearer = format!("Bearer {}", self.key);
        ModelEvidence {
            requests: requests.len(),
            with_injected_key: requests
                .iter()
                .filter(|r| r.header("authorization") == Some(bearer.as_str()))
                .count(),
            proxy_allowed: self.metrics.decisions.with_label_values(&["allowed"]).get(),
            proxy_denied: self.metrics.decisions.with_label_values(&["denied"]).get(),
            served: self.double.served(),
        }
    }
}

impl AgentWorkers {
    /// Metadata of every request the endpoint received, for the evaluation
    /// trace: the role whose task marker the conversation carries, the model,
    /// the sizes, and whether the broker's key was on it (never the key itself
    /// or the conversation). A Messages API body (Claude Code) reads as a chat
    /// request too: both carry `model`, `messages`, `tools` and `stream`.
    pub fn model_requests(&self, work_item: &str) -> Vec<protobot_eval::evidence::ModelRequest> {
        let bearer = format!("Bearer {}", self.key);
        self.double
            .requests()
            .iter()
            .map(|r| {
                let chat: protobot_model_double::ChatRequest =
                    serde_json::from_value(r.body.clone()).unwrap_or_default();
                let user: Vec<String> = chat
                    .messages
                    .iter()
                    .filter(|m| m.role == "user")
                    .map(protobot_model_double::Message::text)
                    .collect();
                let role = ["worker-a", "worker-b", "inspector"]
                    .into_iter()
                    .find(|role| {
                        let marker = format!("{role} for {work_item}");
                        user.iter().any(|t| t.contains(&marker))
                    })
                    .map(str::to_owned);
                protobot_eval::evidence::ModelRequest {
                    role,
                    path: r.path.clone(),
                    model: chat.model.clone(),
                    messages: chat.messages.len(),
                    tools: chat.tools.as_ref().map_or(0, Vec::len),
                    stream: chat.stream,
                    key_injected: r.header("authorization") == Some(bearer.as_str()),
                }
            })
            .collect()
    }
}

fn random_hex(bytes: usize) -> Result<String, AgentError> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(io("read /dev/urandom"))?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Starts the double and the proxy and writes the OpenCode harness under `root`.
pub async fn start(
    root: &Path,
    opencode: &Path,
    work_item: &str,
) -> Result<AgentWorkers, AgentError> {
    start_agent(root, Agent::Opencode, opencode, work_item).await
}

/// Starts the double and the proxy and writes `agent`'s harness under `root`;
/// `binary` is the agent's CLI.
pub async fn start_agent(
    root: &Path,
    agent: Agent,
    binary: &Path,
    work_item: &str,
) -> Result<AgentWorkers, AgentError> {
    let uid_is_root = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(str::to_owned))
        })
        .is_some_and(|u| u == "0");
    if !uid_is_root {
        return Err(AgentError::NotRoot);
    }
    let (harness_name, harness_script) = agent.harness();
    let harness_dir = root.join("harness").join(harness_name);
    std::fs::create_dir_all(&harness_dir).map_err(io("create the harness directory"))?;
    let run_sh = harness_dir.join("run.sh");
    std::fs::write(&run_sh, harness_script).map_err(io("write the harness script"))?;

    let double = ModelDouble::start(
        TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(io("bind the model double"))?,
        model_script_for(agent, work_item),
    )
    .map_err(io("start the model double"))?;
    let secret = SessionSecret::new(random_hex(32)?.into_bytes());
    let key = format!("demo-model-key-{}", random_hex(16)?);
    let registry = prometheus::Registry::new();
    let metrics = EgressMetrics::register(&registry)?;
    let meter = UsageMeter::new(Default::default(), None);
    let broker = Broker::new(
        EgressPolicy::from_yaml(&policy(agent.api_path()), "<demo policy>")?,
        CredentialStore::from_pairs([("model", Credential::new(key.clone()))]),
        SessionRegistry::new(secret.clone()),
        Upstream::plaintext_for_tests(HashMap::from([(MODEL_HOST.to_owned(), double.addr())])),
        metrics.clone(),
        Limits::default(),
    )
    // Priced at nothing: the double's tokens are counted, their cost is unknown unless a
    // class names a price.
    .with_meter(meter.clone());
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(io("bind the egress proxy"))?;
    let proxy_url = format!(
        "http://{}",
        listener
            .local_addr()
            .map_err(io("read the proxy's address"))?
    );
    tokio::spawn(serve(
        listener,
        move |req| {
            let broker = broker.clone();
            async move { broker.handle(req).await }
        },
        std::future::pending(),
    ));
    let prices = demo_prices();
    let class = || WorkerClass {
        command: vec![
            "env".into(),
            format!("PROTOBOT_MODEL_HOST={MODEL_HOST}"),
            "PROTOBOT_MODEL=scripted".into(),
            format!("{}={}", agent.binary_variable(), binary.display()),
            "/bin/sh".into(),
            run_sh.display().to_string(),
        ],
        image: None,
        egress: true,
        tiers: Default::default(),
        prices: prices.clone(),
    };
    let binds = vec![
        harness_dir.clone(),
        binary
            .parent()
            .map_or_else(|| binary.to_path_buf(), Path::to_path_buf),
    ];
    Ok(AgentWorkers {
        worker_a: class(),
        worker_b: class(),
        inspector: class(),
        proxy_url,
        egress: LocalEgress::new(secret),
        binds,
        meter,
        key,
        double,
        metrics,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_states_the_demo_prices_it_charges() {
        assert_eq!(
            demo_price_note(),
            "illustrative $3 in / $15 out per million tokens"
        );
    }

    #[test]
    fn the_scripted_edits_leave_the_copy_to_the_harness() {
        let edits = scripted_edits(WORKER_B);
        assert!(WORKER_B.contains("cp -a /workspace /out/worker"));
        assert!(!edits.contains("/out/worker"));
        assert!(edits.contains("src/sync.sh"));
        let script = model_script_for(Agent::Opencode, "WI-1");
        assert_eq!(script.scenarios.len(), 3);
        assert_eq!(script.scenarios[0].marker, "worker-a for WI-1");
        assert_eq!(script.scenarios[2].marker, "inspector for WI-1");
    }

    #[test]
    fn each_agent_gets_its_api_path_and_shell_tool() {
        for (agent, path, tool) in [
            (Agent::Opencode, "/v1/chat/completions", "bash"),
            (Agent::ClaudeCode, "/v1/messages", "Bash"),
        ] {
            let p = EgressPolicy::from_yaml(&policy(agent.api_path()), "<test>").unwrap();
            let rules = format!("{p:?}");
            assert!(
                rules.contains(path) && rules.contains(MODEL_HOST),
                "{rules}"
            );
            assert!(
                rules.contains("worker-a")
                    && rules.contains("worker-b")
                    && rules.contains("inspector"),
                "{rules}"
            );
            let script = model_script_for(agent, "WI-2");
            assert_eq!(script.scenarios.len(), 3);
            assert_eq!(script.scenarios[2].marker, "inspector for WI-2");
            for scenario in &script.scenarios[1..] {
                let Step::ToolCalls { calls } = &scenario.steps[0] else {
                    panic!("the first step is a tool call");
                };
                assert_eq!(calls[0].name, tool);
                assert!(
                    calls[0].arguments["command"]
                        .as_str()
                        .unwrap()
                        .contains("src/sync.sh")
                );
            }
        }
        let missing = find_agent(Agent::ClaudeCode, Some(Path::new("/nonexistent/claude")))
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("Claude Code") && missing.contains("--claude PATH"),
            "{missing}"
        );
    }
}
