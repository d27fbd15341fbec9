//! Prints the NetworkPolicy and Pod one run would get from a sandbox profile,
//! as a YAML stream (nothing is sent anywhere):
//!
//! ```sh
//! cargo run -p protobot-kube-executor --example render -- sandbox-profiles/kata.yaml [--egress]
//! ```
//!
//! Useful to review a profile, or to validate the objects offline, e.g.
//! `… | kubernetes-validate --strict -k 1.33.0 -`.

use std::{path::PathBuf, process::ExitCode, time::Duration};

use protobot_jobsite::executor::{Limits, RunSpec, SandboxRole};
use protobot_kube_executor::{
    KubeExecutorConfig, SandboxProfile, StagingVolume,
    manifest::{build_network_policy, build_pod},
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.iter().find(|a| !a.starts_with("--")) else {
        eprintln!("usage: render PROFILE.yaml [--egress]");
        return ExitCode::from(2);
    };
    let profile = match SandboxProfile::load(&PathBuf::from(path)) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut config = KubeExecutorConfig::new(
        "protobot-sandboxes",
        StagingVolume {
            claim_name: "protobot-staging".into(),
            mount_path: PathBuf::from("/var/lib/protobot/staging"),
        },
        PathBuf::from("/var/lib/protobot/collected"),
    );
    config.default_image = Some("ghcr.io/example/protobot-worker:latest".into());
    let spec = RunSpec {
        run_id: "wi-cs-00001-6966004e95/cycle-1/worker-b".into(),
        role: SandboxRole::WorkerB,
        workspace: PathBuf::from("/var/lib/protobot/projections/worker-b"),
        task: serde_json::json!({}),
        command: vec![
            "protobot-worker".into(),
            "--task".into(),
            "/task/task.json".into(),
        ],
        image: None,
        env: [("PROTOBOT_MODEL_TIER".to_owned(), "t1".to_owned())].into(),
        limits: Limits {
            wall_clock: Duration::from_secs(600),
            memory_bytes: profile.max_memory_bytes().min(2 << 30),
            ..Limits::default()
        },
        egress_proxy: args
            .iter()
            .any(|a| a == "--egress")
            .then(|| "http://10.96.0.42:3128".to_owned()),
        audit: Default::default(),
        attribution: Default::default(),
    };
    let pod = match build_pod(&profile, &config, &spec, None) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(1);
        }
    };
    let policy = build_network_policy(&profile, &config, &spec, None);
    let with_kind = |kind: &str, api: &str, v: serde_json::Value| {
        let mut v = v;
        v["apiVersion"] = api.into();
        v["kind"] = kind.into();
        v
    };
    let docs = [
        with_kind(
            "NetworkPolicy",
            "networking.k8s.io/v1",
            serde_json::to_value(&policy).unwrap_or_default(),
        ),
        with_kind("Pod", "v1", serde_json::to_value(&pod).unwrap_or_default()),
    ];
    for d in docs {
        match serde_yaml_ng::to_string(&d) {
            Ok(y) => print!("---\n{y}"),
            Err(e) => {
                eprintln!("failed to render YAML: {e}");
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}
