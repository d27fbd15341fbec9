//! The node's share of "claim → Worker pod Running" on the real node (`scripts/kube-node up`,
//! `KUBECONFIG`): a sandbox-shaped pod (restricted security context, no token, the Worker base
//! image already loaded) created, then `Running` as its watch reports it, for gVisor and runc
//! side by side. Pods are created one after another; each is deleted before the next.
//!
//!   cargo run --release -p protobot-e2e --example bench_pod_start -- [N] [IMAGE]
//!
//! Prints p50/p90/p99 per RuntimeClass (figures, never asserted: `make bench`).

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use serde_json::json;

fn pod(name: &str, image: &str, runtime_class: &str) -> Result<Pod, serde_json::Error> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "runtimeClassName": runtime_class,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "sandbox", "image": image, "imagePullPolicy": "Never",
                "command": ["/bin/sleep", "60"],
                "securityContext": {"readOnlyRootFilesystem": true, "allowPrivilegeEscalation": false,
                                    "capabilities": {"drop": ["ALL"]}},
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"},
                              "limits": {"cpu": "500m", "memory": "256Mi"}},
            }],
        },
    }))
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Creates the pod and returns how long until the watch shows it `Running`.
async fn start_once(pods: &Api<Pod>, body: &Pod, name: &str) -> Result<Duration, String> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut stream = watcher(pods.clone(), config).applied_objects().boxed();
    let started = Instant::now();
    pods.create(&PostParams::default(), body)
        .await
        .map_err(|e| format!("create {name}: {e}"))?;
    let running = tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(event) = stream.next().await {
            if let Ok(p) = event
                && p.status.and_then(|s| s.phase).as_deref() == Some("Running")
            {
                return true;
            }
        }
        false
    })
    .await;
    let took = started.elapsed();
    let _ = pods.delete(name, &DeleteParams::default()).await;
    match running {
        Ok(true) => Ok(took),
        _ => Err(format!("{name} was not Running within 120 s")),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(50), |a| a.parse())?;
    let image = args
        .next()
        .unwrap_or_else(|| "protobot.local/worker-base:2".to_owned());
    let client = Client::try_default().await?;
    let ns_name = format!("bench-pod-start-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns_name}}))?,
        )
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns_name);
    println!("pod create -> Running on the real node, {n} pods per RuntimeClass, image {image}");
    for class in ["gvisor", "runc"] {
        let mut took = Vec::with_capacity(n);
        for i in 0..n {
            let name = format!("{class}-{i}");
            match start_once(&pods, &pod(&name, &image, class)?, &name).await {
                Ok(d) => took.push(d),
                Err(e) => eprintln!("{e}"),
            }
        }
        took.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{class:>6}: p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms ({} of {n} started; goal for a cold pod: none set, warm pools are issue 35)",
            ms(percentile(&took, 50.0)),
            ms(percentile(&took, 90.0)),
            ms(percentile(&took, 99.0)),
            took.len()
        );
    }
    let _ = namespaces.delete(&ns_name, &DeleteParams::default()).await;
    Ok(())
}
