#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The simulated kubelet running containers through bubblewrap: a pod sees its
//! volumes at their mount paths and nothing of the host it should not, and a
//! failing command still ends the pod `Failed` with its exit code.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use protobot_testkit::{BubblewrapContainerExecutor, Kubelet, server::ApiServer};
use serde_json::json;

fn executor() -> Option<BubblewrapContainerExecutor> {
    let found = BubblewrapContainerExecutor::from_path();
    if found.is_none() {
        assert!(
            std::env::var_os("PROTOBOT_REQUIRE_BWRAP").is_none(),
            "PROTOBOT_REQUIRE_BWRAP is set but bwrap is missing"
        );
        eprintln!("skipping: bubblewrap is not installed");
    }
    found
}

async fn finished(api: &Api<Pod>, name: &str) -> Pod {
    let done = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
    };
    protobot_testkit::until(api, name, Duration::from_secs(30), done)
        .await
        .unwrap()
        .unwrap()
}

fn phase_and_code(p: &Pod) -> (String, Option<i32>) {
    let s = p.status.as_ref().unwrap();
    let code = s.container_statuses.as_ref().and_then(|cs| {
        cs[0]
            .state
            .as_ref()?
            .terminated
            .as_ref()
            .map(|t| t.exit_code)
    });
    (s.phase.clone().unwrap(), code)
}

#[tokio::test]
async fn pods_run_sandboxed_with_their_volumes() {
    let Some(exec) = executor() else { return };
    let server = ApiServer::new();
    let _kubelet = Kubelet::start_with(&server, Arc::new(exec), "sandboxed").unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let pod = |name: &str, script: &str| -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": "Never",
                "volumes": [{"name": "work", "emptyDir": {}}],
                "containers": [{"name": "main", "image": "none", "command": ["sh", "-c", script],
                                "volumeMounts": [{"name": "work", "mountPath": "/work"}]}]}
        }))
        .unwrap()
    };
    // The volume is writable at its mount path; the host's files and /usr are not reachable for writing.
    let isolated = "echo ok > /work/out && test ! -e /root/.cargo && test ! -e /home && ! touch /usr/protobot 2>/dev/null";
    api.create(&PostParams::default(), &pod("isolated", isolated))
        .await
        .unwrap();
    assert_eq!(
        phase_and_code(&finished(&api, "isolated").await),
        ("Succeeded".into(), Some(0))
    );
    api.create(&PostParams::default(), &pod("fails", "exit 3"))
        .await
        .unwrap();
    assert_eq!(
        phase_and_code(&finished(&api, "fails").await),
        ("Failed".into(), Some(3))
    );
}
