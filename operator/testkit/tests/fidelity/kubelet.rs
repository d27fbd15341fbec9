//! The simulated kubelet: scheduling, phases, exit codes, `activeDeadlineSeconds`
//! kills, OOM-kill reporting, emptyDir volumes shared between containers,
//! claims with sub-paths, logs and deletion.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use protobot_testkit::Kubelet;
use serde_json::json;

use crate::support::{await_condition, server};

fn pod(name: &str, spec: serde_json::Value) -> Pod {
    serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}),
    )
    .unwrap()
}

fn phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

async fn await_phase(api: &Api<Pod>, name: &str, want: &[&str]) -> Pod {
    await_condition(
        &format!("pod {name} in {want:?}"),
        || api.get(name),
        |r| r.as_ref().is_ok_and(|p| want.contains(&phase(p))),
    )
    .await
    .unwrap()
}

fn terminated_exit_code(p: &Pod, container: &str) -> Option<i32> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)?
        .state
        .as_ref()?
        .terminated
        .as_ref()
        .map(|t| t.exit_code)
}

#[tokio::test]
async fn a_pod_with_a_failing_command_ends_failed_with_the_exit_code() {
    let server = server();
    let _kubelet = Kubelet::start(&server).unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let spec = json!({"restartPolicy": "Never", "containers": [
        {"name": "main", "image": "busybox", "command": ["sh", "-c", "echo failing; exit 3"]}
    ]});
    api.create(&PostParams::default(), &pod("fails", spec))
        .await
        .unwrap();
    let done = await_phase(&api, "fails", &["Failed", "Succeeded"]).await;
    assert_eq!(phase(&done), "Failed");
    assert_eq!(terminated_exit_code(&done, "main"), Some(3));
    assert_eq!(
        done.spec.unwrap().node_name.as_deref(),
        Some("testkit-node")
    );
    let logs = api.logs("fails", &LogParams::default()).await.unwrap();
    assert_eq!(logs, "failing\n");
}

#[tokio::test]
async fn a_pod_whose_containers_exit_zero_succeeds_and_shares_its_empty_dir() {
    let server = server();
    let _kubelet = Kubelet::start(&server).unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let spec = json!({
        "restartPolicy": "Never",
        "volumes": [{"name": "work", "emptyDir": {}}],
        "initContainers": [{"name": "init", "image": "busybox", "command": ["sh", "-c", "echo hello > /work/greeting"],
                            "volumeMounts": [{"name": "work", "mountPath": "/work"}]}],
        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "test \"$(cat /work/greeting)\" = hello"],
                        "volumeMounts": [{"name": "work", "mountPath": "/work"}]}]
    });
    api.create(&PostParams::default(), &pod("ok", spec))
        .await
        .unwrap();
    let done = await_phase(&api, "ok", &["Failed", "Succeeded"]).await;
    assert_eq!(phase(&done), "Succeeded", "{:?}", done.status);
    assert_eq!(terminated_exit_code(&done, "main"), Some(0));
}

#[tokio::test]
async fn a_pod_past_active_deadline_seconds_is_killed() {
    let server = server();
    let _kubelet = Kubelet::start(&server).unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let spec = json!({"restartPolicy": "Never", "activeDeadlineSeconds": 1, "containers": [
        {"name": "sleeper", "image": "busybox", "command": ["sleep", "60"]}
    ]});
    api.create(&PostParams::default(), &pod("slow", spec))
        .await
        .unwrap();
    await_phase(&api, "slow", &["Running"]).await;
    let done = await_phase(&api, "slow", &["Failed", "Succeeded"]).await;
    let status = done.status.clone().unwrap();
    assert_eq!(phase(&done), "Failed");
    assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
    assert_eq!(terminated_exit_code(&done, "sleeper"), Some(137));
}

#[tokio::test]
async fn on_failure_restarts_count_up() {
    let server = server();
    let _kubelet = Kubelet::start(&server).unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    // Fails until the marker file exists, then succeeds.
    let spec = json!({"restartPolicy": "OnFailure", "volumes": [{"name": "s", "emptyDir": {}}], "containers": [
        {"name": "flaky", "image": "busybox", "volumeMounts": [{"name": "s", "mountPath": "/state"}],
         "command": ["sh", "-c", "if [ -f /state/m ]; then exit 0; fi; touch /state/m; exit 1"]}
    ]});
    api.create(&PostParams::default(), &pod("flaky", spec))
        .await
        .unwrap();
    let done = await_phase(&api, "flaky", &["Failed", "Succeeded"]).await;
    assert_eq!(phase(&done), "Succeeded");
    let cs = &done.status.unwrap().container_statuses.unwrap()[0];
    assert_eq!(cs.restart_count, 1);
}

#[tokio::test]
async fn deleting_a_running_pod_kills_it_and_removes_it() {
    let server = server();
    let _kubelet = Kubelet::start(&server).unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let spec =
        json!({"containers": [{"name": "s", "image": "busybox", "command": ["sleep", "60"]}]});
    api.create(&PostParams::default(), &pod("victim", spec))
        .await
        .unwrap();
    await_phase(&api, "victim", &["Running"]).await;
    let pending = api
        .delete("victim", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        pending
            .left()
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    await_condition(
        "pod removed",
        || api.get_opt("victim"),
        |r| matches!(r, Ok(None)),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn container_env_resolves_config_maps_secrets_and_field_refs() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let server = server();
    let _kubelet = Kubelet::start(&server).unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(server.client());
    cms.create(
        &PostParams::default(),
        &crate::support::config_map("settings", &[("MODE", "fast")]),
    )
    .await
    .unwrap();
    let secrets: Api<Secret> = Api::default_namespaced(server.client());
    let secret: Secret = serde_json::from_value(
        json!({"metadata": {"name": "creds"}, "data": {"token": "czNjcjN0"}}),
    )
    .unwrap();
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let spec = json!({"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "busybox",
        "command": ["sh", "-c", "echo \"$MODE $TOKEN $POD $GREETING\""],
        "envFrom": [{"configMapRef": {"name": "settings"}}],
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "GREETING", "value": "hi-$(POD)"}
        ]
    }]});
    api.create(&PostParams::default(), &pod("env-pod", spec))
        .await
        .unwrap();
    let done = await_phase(&api, "env-pod", &["Failed", "Succeeded"]).await;
    assert_eq!(phase(&done), "Succeeded");
    let logs = api.logs("env-pod", &LogParams::default()).await.unwrap();
    assert_eq!(logs, "fast s3cr3t env-pod hi-env-pod\n");
}

#[tokio::test]
async fn a_missing_config_map_key_keeps_the_container_waiting() {
    let server = server();
    let _kubelet = Kubelet::start(&server).unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let spec = json!({"restartPolicy": "Never", "containers": [{
        "name": "main", "image": "busybox", "command": ["true"],
        "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "absent", "key": "k"}}}]
    }]});
    api.create(&PostParams::default(), &pod("waits", spec))
        .await
        .unwrap();
    let waiting = await_condition(
        "CreateContainerConfigError",
        || api.get("waits"),
        |r| {
            r.as_ref().is_ok_and(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .is_some_and(|cs| {
                        cs[0]
                            .state
                            .as_ref()
                            .and_then(|s| s.waiting.as_ref())
                            .and_then(|w| w.reason.as_deref())
                            == Some("CreateContainerConfigError")
                    })
            })
        },
    )
    .await
    .unwrap();
    assert_eq!(phase(&waiting), "Pending");
}

mod custom_executor {
    //! The `ContainerExecutor` seam the bubblewrap executor will implement:
    //! the kubelet hands it a complete launch spec and reports what it returns.

    use std::sync::{Arc, Mutex};

    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Api, PostParams};
    use protobot_testkit::{
        ContainerExecutor, ContainerExit, ContainerLaunch, KillSignal, Kubelet, kubelet::ExecFuture,
    };
    use serde_json::json;

    use super::{await_phase, phase, pod, terminated_exit_code};
    use crate::support::server;

    #[derive(Default)]
    struct Recording(Mutex<Vec<ContainerLaunch>>);

    impl ContainerExecutor for Recording {
        fn run(&self, launch: ContainerLaunch, _kill: KillSignal) -> ExecFuture {
            let code = match launch.container.as_str() {
                "bad" => 42,
                "oom" => 137,
                _ => 0,
            };
            let oom_killed = launch.container == "oom";
            self.0.lock().unwrap().push(launch);
            Box::pin(async move {
                Ok(ContainerExit {
                    exit_code: code,
                    killed: false,
                    oom_killed,
                })
            })
        }
    }

    #[tokio::test]
    async fn the_executor_gets_argv_env_mounts_and_its_exit_code_is_reported() {
        let server = server();
        let exec = Arc::new(Recording::default());
        let _kubelet = Kubelet::start_with(&server, exec.clone(), "sandbox-node").unwrap();
        let api: Api<Pod> = Api::default_namespaced(server.client());
        let spec = json!({"restartPolicy": "Never", "volumes": [{"name": "work", "emptyDir": {}}], "containers": [
            {"name": "good", "image": "img", "command": ["run"], "args": ["--x"], "env": [{"name": "A", "value": "1"}],
             "volumeMounts": [{"name": "work", "mountPath": "/work", "readOnly": true}]},
            {"name": "bad", "image": "img", "command": ["fail"]}
        ]});
        api.create(&PostParams::default(), &pod("seam", spec))
            .await
            .unwrap();
        let done = await_phase(&api, "seam", &["Failed", "Succeeded"]).await;
        assert_eq!(phase(&done), "Failed");
        assert_eq!(terminated_exit_code(&done, "bad"), Some(42));
        assert_eq!(terminated_exit_code(&done, "good"), Some(0));
        assert_eq!(
            done.spec.unwrap().node_name.as_deref(),
            Some("sandbox-node")
        );
        let launches = exec.0.lock().unwrap().clone();
        let good = launches.iter().find(|l| l.container == "good").unwrap();
        assert_eq!(good.argv, ["run", "--x"]);
        assert_eq!(good.env, [("A".to_owned(), "1".to_owned())]);
        assert_eq!(good.mounts.len(), 1);
        assert_eq!(good.mounts[0].container_path, "/work");
        assert!(good.mounts[0].read_only);
        assert!(good.mounts[0].host_path.is_dir());
    }

    #[tokio::test]
    async fn an_executor_reporting_an_oom_kill_shows_as_oom_killed() {
        let server = server();
        let exec = Arc::new(Recording::default());
        let _kubelet = Kubelet::start_with(&server, exec, "sandbox-node").unwrap();
        let api: Api<Pod> = Api::default_namespaced(server.client());
        let spec = json!({"restartPolicy": "Never", "containers": [
            {"name": "oom", "image": "img", "command": ["allocate"]}
        ]});
        api.create(&PostParams::default(), &pod("oom", spec))
            .await
            .unwrap();
        let done = await_phase(&api, "oom", &["Failed", "Succeeded"]).await;
        assert_eq!(phase(&done), "Failed");
        let terminated = done.status.unwrap().container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .terminated
            .unwrap();
        assert_eq!(terminated.reason.as_deref(), Some("OOMKilled"));
        assert_eq!(terminated.exit_code, 137);
    }
}

#[tokio::test]
async fn a_claim_is_a_node_directory_that_outlives_pods_and_sub_paths_select_inside_it() {
    let server = server();
    let kubelet = Kubelet::start(&server).unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let claim = kubelet.claim_dir("default", "staging").unwrap();
    std::fs::create_dir_all(claim.join("runs/a")).unwrap();
    std::fs::write(claim.join("runs/a/input"), "from the operator").unwrap();
    let spec = json!({
        "restartPolicy": "Never",
        "volumes": [{"name": "staging", "persistentVolumeClaim": {"claimName": "staging"}}],
        "containers": [{"name": "main", "image": "busybox",
            "command": ["sh", "-c", "cat /stage-in/input > /stage-out/copied && ls /stage-in > /stage-out/listing"],
            "volumeMounts": [
                {"name": "staging", "mountPath": "/stage-in", "subPath": "runs/a", "readOnly": true},
                {"name": "staging", "mountPath": "/stage-out", "subPath": "runs/a-out"}
            ]}]
    });
    api.create(&PostParams::default(), &pod("claims", spec))
        .await
        .unwrap();
    let done = await_phase(&api, "claims", &["Failed", "Succeeded"]).await;
    assert_eq!(phase(&done), "Succeeded", "{:?}", done.status);
    assert_eq!(
        std::fs::read_to_string(claim.join("runs/a-out/copied")).unwrap(),
        "from the operator",
        "the sub-path was created and the pod's writes landed in the claim"
    );
    assert_eq!(
        std::fs::read_to_string(claim.join("runs/a-out/listing")).unwrap(),
        "input\n",
        "a sub-path mount shows only that sub-directory"
    );
    api.delete("claims", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        claim.join("runs/a-out/copied").exists(),
        "the claim outlives the pod"
    );

    let escaping = json!({
        "restartPolicy": "Never",
        "volumes": [{"name": "staging", "persistentVolumeClaim": {"claimName": "staging"}}],
        "containers": [{"name": "main", "image": "busybox", "command": ["true"],
            "volumeMounts": [{"name": "staging", "mountPath": "/x", "subPath": "runs/../../etc"}]}]
    });
    let err = api
        .create(&PostParams::default(), &pod("escaping", escaping))
        .await
        .unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422);
            assert!(s.message.contains("subPath"), "{}", s.message);
        }
        other => panic!("expected 422, got {other}"),
    }
}

#[tokio::test]
async fn two_kubelets_bind_each_pod_once_and_only_its_node_runs_it() {
    use std::sync::Arc;

    use protobot_testkit::ProcessExecutor;
    let server = server();
    let _a = Kubelet::start_with(&server, Arc::new(ProcessExecutor), "node-a").unwrap();
    let _b = Kubelet::start_with(&server, Arc::new(ProcessExecutor), "node-b").unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    for i in 0..4 {
        let spec = json!({"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox", "command": ["true"]}]});
        api.create(&PostParams::default(), &pod(&format!("p{i}"), spec))
            .await
            .unwrap();
    }
    for i in 0..4 {
        let done = await_phase(&api, &format!("p{i}"), &["Succeeded", "Failed"]).await;
        assert_eq!(phase(&done), "Succeeded");
        let node = done.spec.unwrap().node_name.unwrap();
        assert!(node == "node-a" || node == "node-b", "{node}");
    }
}

#[tokio::test]
async fn following_a_log_streams_until_the_container_exits() {
    use futures::{AsyncBufReadExt, StreamExt};
    let server = server();
    let _kubelet = Kubelet::start(&server).unwrap();
    let api: Api<Pod> = Api::default_namespaced(server.client());
    let spec = json!({"restartPolicy": "Never", "containers": [{"name": "talker", "image": "busybox",
        "command": ["sh", "-c", "for i in 1 2 3; do echo line-$i; sleep 0.1; done"]}]});
    api.create(&PostParams::default(), &pod("talker", spec))
        .await
        .unwrap();
    await_phase(&api, "talker", &["Running", "Succeeded"]).await;
    let lp = LogParams {
        follow: true,
        ..LogParams::default()
    };
    let stream = api.log_stream("talker", &lp).await.unwrap();
    let lines: Vec<String> = crate::support::within(
        "followed log to end",
        stream.lines().map(|l| l.unwrap()).collect(),
    )
    .await;
    assert_eq!(lines, ["line-1", "line-2", "line-3"]);
    let tail = api
        .logs(
            "talker",
            &LogParams {
                tail_lines: Some(1),
                ..LogParams::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(tail, "line-3\n");
}
