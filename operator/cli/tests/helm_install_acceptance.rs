#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Issue 18's acceptance, "`helm install` builds work", on the real kube-apiserver
//! (`KUBECONFIG`) with the simulated kubelet running pods in bubblewrap:
//!
//! 1. the chart's manifests from `helm template` applied (its RBAC, the conformance Job's
//!    ServiceAccount and Role, the sandbox ServiceAccount and the sandbox profiles'
//!    ConfigMap as rendered); the platform (RuntimeClass, staging claim) as a platform team
//!    provides it;
//! 2. a Project on the repository served by a real server on loopback, over HTTPS (TLS with
//!    the test CA, basic auth) or SSH (host key checked against `known_hosts`), with its
//!    credentials in a Secret, and a ChangeSet;
//! 3. `protobot operator` with the arguments of the chart's Deployment, authenticated as the
//!    chart's operator ServiceAccount, reading the profile from the rendered ConfigMap;
//! 4. the egress proxy as the chart's Deployment runs it (`protobot egress-proxy` with its
//!    rendered arguments, `--conformance-probe` included, on loopback), reached by pods
//!    through its Service's cluster IP (the simulated node relays it), and given, as in the
//!    chart, to the operator and the conformance Job (`--egress-proxy-url`,
//!    `--egress-session-secret`; the rendered `<svc>.<ns>.svc` name becomes the cluster IP
//!    the operator would resolve it to, since this machine has no cluster DNS);
//! 5. the conformance Job's rendered command run as the Job's ServiceAccount: the profile's
//!    probes as pods (the supervisor's init container copies this build's binary from the
//!    operator's image on the node; the credential-broker probes through the proxy), a
//!    passing report stored in the profile's ConfigMap;
//! 6. the operator, watching that ConfigMap, admits runs: the item is `completed` and its
//!    merge is on the served repository's `main`;
//! 7. the credential is in no log line (debug level) of the operator or the proxy, Event,
//!    object or status of the namespace, file the operator, the proxy or the node wrote, nor
//!    in what the Job printed.
//!
//! The chart is rendered with `egressProxy.enabled`; the sandbox profile's proxy selector
//! names the scenario namespace (where the proxy's Service is) instead of `protobot-system`.

use std::{process::Child, time::Duration};

use kube::Api;
use protobot_api::{BuildWorkItem, ChangeSet, ConditionStatus, LifecycleState, Project};
use protobot_demo::example::{INTEGRATION, WORKER_A, WORKER_B, author};
use protobot_e2e::{create_object, real, timeout, worker_class};
use serde_json::{Value, json};

#[path = "support/conformance_job.rs"]
mod conformance_job;

#[path = "support/admin_http.rs"]
mod admin_http;

#[path = "../../repo/tests/support/git_servers.rs"]
#[allow(dead_code)]
mod git_servers;

use conformance_job::{Node, PROFILE, Scenario, bubblewrap, refusals, skip_without_cluster};
use git_servers::{GitServers, files_containing};

/// How the operator reaches the served repository.
#[derive(Clone, Copy, Debug)]
enum Transport {
    Https,
    Ssh,
}

/// The operator process (killed on drop) and its log.
struct Operator {
    child: Child,
    admin: String,
    log: std::path::PathBuf,
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Operator {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The egress proxy process (killed on drop), its log, and what pods and the operator are
/// given to reach it.
struct Proxy {
    child: Child,
    log: std::path::PathBuf,
    /// `--egress-proxy-url` as pods reach it: the Service's cluster IP.
    url: String,
    /// The session secret's file (the chart's mounted Secret key).
    session_secret: std::path::PathBuf,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proxy {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `args` (the operator's or the Job's, as rendered) with the egress proxy's URL and
    /// session secret as this machine has them; both must be there.
    fn map_args(&self, args: &[String]) -> Vec<String> {
        let url = args
            .iter()
            .find_map(|a| a.strip_prefix("--egress-proxy-url="))
            .unwrap_or_else(|| panic!("the chart gives no --egress-proxy-url: {args:?}"));
        assert!(
            url.starts_with("http://protobot-protobot-egress-proxy.") && url.ends_with(":3128"),
            "the rendered URL names the proxy's Service: {url}"
        );
        assert!(
            args.contains(&format!("--egress-session-secret={SESSION_SECRET_MOUNT}")),
            "{args:?}"
        );
        args.iter()
            .map(|a| {
                if a.starts_with("--egress-proxy-url=") {
                    format!("--egress-proxy-url={}", self.url)
                } else if a.starts_with("--egress-session-secret=") {
                    format!("--egress-session-secret={}", self.session_secret.display())
                } else {
                    a.clone()
                }
            })
            .collect()
    }
}

/// Where the chart mounts the session Secret's key in the operator's and the Job's pods.
const SESSION_SECRET_MOUNT: &str = "/etc/protobot/egress/session-secret/secret";

/// The chart values of this scenario: the egress proxy on, with its Secrets named.
fn egress_values() -> Vec<String> {
    vec![
        "egressProxy.enabled=true".into(),
        "egressProxy.credentialsSecret=protobot-egress-credentials".into(),
        "egressProxy.sessionSecret=protobot-egress-session".into(),
    ]
}

/// Starts `protobot egress-proxy` with the chart's Deployment's arguments (this machine's
/// files for its mounts: the rendered policy, an empty credentials Secret, the session
/// secret; loopback listeners), waits for its `/healthz`, and points the proxy Service (in
/// the scenario namespace, as the profile selects it) at it.
async fn start_proxy(s: &Scenario) -> Proxy {
    let dir = s.tmp.path().join("egress");
    let (policy, credentials) = (dir.join("policy.yaml"), dir.join("credentials"));
    let session_secret = dir.join("session-secret");
    std::fs::create_dir_all(&credentials).unwrap();
    let rendered_policy = s
        .objects
        .iter()
        .find(|o| {
            o["kind"] == "ConfigMap"
                && o["metadata"]["name"] == "protobot-protobot-egress-proxy-policy"
        })
        .expect("the chart renders the egress policy")["data"]["policy.yaml"]
        .as_str()
        .unwrap()
        .to_owned();
    std::fs::write(&policy, rendered_policy).unwrap();
    let mut secret = [0u8; 48];
    for (i, b) in secret.iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37).wrapping_add(11);
    }
    std::fs::write(&session_secret, secret).unwrap();
    let rendered =
        conformance_job::rendered_args(&s.objects, "Deployment", "protobot-protobot-egress-proxy");
    assert!(
        rendered.contains(&"--conformance-probe".to_owned()),
        "the deployed proxy serves the broker probes: {rendered:?}"
    );
    let (listen, admin) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let args: Vec<String> = rendered
        .into_iter()
        .map(|a| {
            if a.starts_with("--listen=") {
                format!("--listen={listen}")
            } else if a.starts_with("--admin-listen=") {
                format!("--admin-listen={admin}")
            } else if a.starts_with("--policy=") {
                format!("--policy={}", policy.display())
            } else if a.starts_with("--credentials-dir=") {
                format!("--credentials-dir={}", credentials.display())
            } else if a.starts_with("--session-secret=") {
                format!("--session-secret={}", session_secret.display())
            } else {
                a
            }
        })
        .collect();
    let log = s.tmp.path().join("egress-proxy.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(&args)
        // Every line the proxy's crate logs, for the credential grep.
        .env("RUST_LOG", "info,protobot=debug")
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = listen.parse().unwrap();
    let url = protobot_e2e::egress_proxy_service(&s.cluster, addr).await;
    let mut proxy = Proxy {
        child,
        log,
        url,
        session_secret,
    };
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some((200, _)) = admin_http::get(&admin, "/healthz").await {
                return;
            }
            if let Ok(Some(status)) = proxy.child.try_wait() {
                panic!("the egress proxy exited ({status}): {}", proxy.log());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        ready.is_ok(),
        "the egress proxy never served: {}",
        proxy.log()
    );
    proxy
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The operator container's arguments, as the chart's Deployment renders them.
fn deployment_args(objects: &[Value]) -> Vec<String> {
    let deployment = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "protobot-protobot")
        .expect("the chart renders the operator's Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "protobot-protobot");
    assert_eq!(
        pod["containers"][0]["image"],
        conformance_job::OPERATOR_IMAGE
    );
    pod["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// Starts `protobot operator` with the Deployment's arguments, this machine's paths in place
/// of the pod's mounts, watching the scenario namespace, as the chart's operator account.
async fn start_operator(s: &Scenario, proxy: &Proxy) -> Operator {
    let admin = format!("127.0.0.1:{}", free_port());
    let work = s.tmp.path().join("operator-work");
    let args: Vec<String> = proxy
        .map_args(&deployment_args(&s.objects))
        .into_iter()
        .map(|a| {
            if a.starts_with("--admin-addr=") {
                format!("--admin-addr={admin}")
            } else if let Some(file) =
                a.strip_prefix("--sandbox-profile=/etc/protobot/sandbox-profiles/")
            {
                format!(
                    "--sandbox-profile={}",
                    s.mounts.profiles.join(file).display()
                )
            } else if a.starts_with("--staging-path=") {
                format!("--staging-path={}", s.mounts.staging.display())
            } else if a.starts_with("--workdir=") {
                format!("--workdir={}", work.display())
            } else {
                a
            }
        })
        .collect();
    assert!(
        args.contains(&format!("--sandbox-namespace={}", s.ns)),
        "{args:?}"
    );
    let kubeconfig = s.tmp.path().join("operator.kubeconfig");
    std::fs::write(
        &kubeconfig,
        real::operator_kubeconfig(s.client()).await.unwrap(),
    )
    .unwrap();
    let log = s.tmp.path().join("operator.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_protobot"))
        .args(&args)
        // Other scenarios share the cluster: this operator watches its own namespace only.
        .args(["--namespace", &s.ns, "--identity", "protobot-0"])
        // The node runs pods as the profile's user; as root, the operator's default
        // (`--staging-ownership auto`) chowns staged directories to it.
        .env("KUBECONFIG", &kubeconfig)
        // Every line the operator's crates log, for the credential grep.
        .env(
            "RUST_LOG",
            "info,protobot_controller=debug,protobot_jobsite=debug,protobot_repo=debug,protobot_stores=debug,protobot_executors=debug,protobot_kube_executor=debug",
        )
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let operator = Operator { child, admin, log };
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if let Some((200, _)) = admin_http::get(&operator.admin, "/readyz").await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        ready.is_ok(),
        "the operator never became ready: {}",
        operator.log()
    );
    operator
}

/// Waits until the Project has condition `type_` with `status` and a message `accept`s.
async fn until_condition(
    projects: &Api<Project>,
    type_: &str,
    status: ConditionStatus,
    accept: impl Fn(&str) -> bool,
    operator: &Operator,
) -> String {
    // The Project controller re-reads a stored report on its resync (decide::RESYNC, 60 s);
    // only the executor watches the report's ConfigMap.
    let within = timeout() + protobot_controller::project::decide::RESYNC;
    let found = tokio::time::timeout(within, async {
        loop {
            let project = projects.get("cli-sync").await.unwrap();
            if let Some(c) = project.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == type_ && c.status == status && accept(&c.message))
                    .cloned()
            }) {
                return c.message;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    match found {
        Ok(message) => message,
        Err(_) => panic!(
            "the Project never reported {type_}={status:?} as expected: {:#?}\noperator log:\n{}",
            projects.get("cli-sync").await.ok().and_then(|p| p.status),
            operator.log()
        ),
    }
}

async fn acceptance(transport: Transport, name: &str) {
    if skip_without_cluster() {
        return;
    }
    let Some(bwrap) = bubblewrap() else { return };
    let Some(servers) = GitServers::start() else {
        return;
    };
    let s = Scenario::prepare_with(name, Node::Bubblewrap(bwrap), &egress_values(), |p, ns| {
        protobot_e2e::profile_with_proxy_in(&p, ns)
    })
    .await;
    let (client, ns) = (s.client().clone(), s.ns.clone());

    // 1. The chart's manifests as rendered: everything namespaced that `helm install` creates
    // before any pod runs (RBAC, ServiceAccounts, the profiles' ConfigMap).
    let applied = real::apply_rendered(&client, &s.objects, |o| {
        matches!(
            o["kind"].as_str(),
            Some("ServiceAccount" | "Role" | "RoleBinding" | "ConfigMap")
        )
    })
    .await
    .unwrap();
    assert!(applied >= 5, "only {applied} objects applied");
    // The profile the Job and the operator read is the ConfigMap's, as the server holds it.
    let profiles = conformance_job::profiles_configmap(&s.objects);
    let served = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        client.clone(),
        profiles["metadata"]["namespace"].as_str().unwrap(),
    )
    .get(profiles["metadata"]["name"].as_str().unwrap())
    .await
    .unwrap();
    let served = served.data.unwrap()[&format!("{PROFILE}.yaml")].clone();
    assert_ne!(
        served, s.profile,
        "the profile's proxy moved to the scenario namespace"
    );
    assert_eq!(
        protobot_e2e::profile_with_proxy_in(&served, &ns),
        s.profile,
        "the mounted profile is the rendered ConfigMap's, its proxy in the scenario namespace"
    );

    // 2. The Project on the served repository, its Secret, its worker classes.
    let tmp = s.tmp.path();
    let (work, origin) = (tmp.join("author"), tmp.join("origin.git"));
    let merge = author(&work, &origin).unwrap();
    let pushed = std::process::Command::new("git")
        .args(["push", "-q", "--force"])
        .arg(&servers.bare)
        .arg("main:main")
        .current_dir(&origin)
        .output()
        .unwrap();
    assert!(pushed.status.success(), "{pushed:?}");
    let (url, secret, credential) = match transport {
        Transport::Https => (
            servers.https_url.clone(),
            servers.https_secret(&servers.password),
            servers.password.clone(),
        ),
        Transport::Ssh => (
            servers.ssh_url.clone(),
            servers.ssh_secret(&servers.known_hosts),
            // A line from the middle of the private key's body.
            servers.ssh_key.lines().nth(2).unwrap().to_owned(),
        ),
    };
    assert!(credential.len() >= 16, "a credential too short to grep for");
    protobot_e2e::create_secret(&client, &ns, "cli-sync-git", secret).await;
    create_object(
        &Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "cli-sync-workers", "namespace": ns},
            "data": {
                "worker-a": worker_class(WORKER_A),
                "worker-b": worker_class(WORKER_B),
                "integration": worker_class(INTEGRATION),
            },
        }),
    )
    .await;
    create_object(
        &Api::<Project>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "Project",
            "metadata": {"name": "cli-sync", "namespace": ns},
            "spec": {
                "repoUrl": url,
                "sandboxProfile": PROFILE,
                "workerClassesRef": {"name": "cli-sync-workers"},
                "credentialsSecretRef": {"name": "cli-sync-git"},
            },
        }),
    )
    .await;

    // 3. The operator as the chart's Deployment runs it; no report yet, so it refuses runs.
    // 4. The egress proxy, before both: they take its address.
    let proxy = start_proxy(&s).await;
    let operator = start_operator(&s, &proxy).await;
    let projects: Api<Project> = Api::namespaced(client.clone(), &ns);
    until_condition(
        &projects,
        "RepoReachable",
        ConditionStatus::True,
        |_| true,
        &operator,
    )
    .await;

    // 5. The conformance Job: the report measured in pods (the broker's through the proxy)
    // and stored.
    let job = s.run_job(&proxy.map_args(&s.args));
    let job_stderr = String::from_utf8_lossy(&job.stderr).into_owned();
    assert!(
        job.status.success(),
        "the Job's process failed ({}): {job_stderr}",
        job.status
    );
    assert!(
        refusals(&job_stderr).is_empty(),
        "the Job's RBAC refused a call: {job_stderr}"
    );
    let report = s
        .stored_report()
        .await
        .expect("the Job stored the report in the profile's ConfigMap");
    let limits = report
        .capabilities
        .iter()
        .find(|c| c.name == "resource-limits")
        .unwrap();
    assert!(limits.supported, "the supervisor is in place: {limits:?}");
    assert!(
        report.passed(),
        "the measured report fails (missing {:?}: {:?}); the Job said: {job_stderr}\nproxy log:\n{}",
        report.missing_capabilities(),
        report.fail_closed_reason,
        proxy.log()
    );

    // 6. The ChangeSet: admitted, built in pods, inspected, merged on the served main.
    create_object(
        &Api::<ChangeSet>::namespaced(client.clone(), &ns),
        json!({
            "apiVersion": "protobot.dev/v1alpha1", "kind": "ChangeSet",
            "metadata": {"name": "cs-00001", "namespace": ns},
            "spec": {"projectRef": {"name": "cli-sync"}, "changeSetId": "CS-00001", "mergeCommit": merge},
        }),
    )
    .await;
    let change_sets: Api<ChangeSet> = Api::namespaced(client.clone(), &ns);
    let registered = protobot_testkit::wait::until(
        &change_sets,
        "cs-00001",
        timeout(),
        |cs: Option<&ChangeSet>| {
            cs.and_then(|c| c.status.as_ref())
                .is_some_and(|s| s.work_item_ref.is_some())
        },
    )
    .await;
    let item_name = match registered {
        Ok(Some(cs)) => cs.status.unwrap().work_item_ref.unwrap().name,
        other => panic!(
            "the ChangeSet was never registered ({other:?}): {}",
            operator.log()
        ),
    };
    let items: Api<BuildWorkItem> = Api::namespaced(client.clone(), &ns);
    let completed = protobot_testkit::wait::until(
        &items,
        &item_name,
        timeout() * 6,
        |i: Option<&BuildWorkItem>| {
            i.and_then(|i| i.status.as_ref())
                .is_some_and(|s| s.state == LifecycleState::Completed)
        },
    )
    .await;
    let completed = match completed {
        Ok(Some(item)) => item,
        other => panic!(
            "{item_name} did not complete ({other:?}); its status: {:#?}\noperator log:\n{}",
            items.get(&item_name).await.ok().and_then(|i| i.status),
            operator.log()
        ),
    };
    let merged = completed
        .status
        .as_ref()
        .and_then(|s| s.merge_commit.clone())
        .expect("the completed item names its merge commit");
    assert_eq!(servers.main_head().to_string(), merged);
    assert_eq!(
        protobot_e2e::work_item_trailers(&servers.bare),
        std::slice::from_ref(&completed.spec.work_item_id),
        "exactly one merge on the served main carries the item's trailer"
    );
    // 7. The credential went nowhere.
    let needle = credential.as_bytes();
    let objects = protobot_e2e::readable_objects(&client, &ns).await;
    assert!(
        !objects
            .as_bytes()
            .windows(needle.len())
            .any(|w| w == needle),
        "the credential is in an object of the namespace"
    );
    let operator_log = operator.log();
    assert!(
        operator_log.contains("egress proxy URL is an IP address"),
        "the operator gave pods the proxy's cluster IP as written: {operator_log}"
    );
    assert!(operator_log.contains("DEBUG") || operator_log.contains("\"level\":\"DEBUG\""));
    assert!(
        !operator_log.contains(&credential),
        "the credential is in the operator's log"
    );
    let proxy_log = proxy.log();
    assert!(
        proxy_log.contains("egress proxy started")
            && proxy_log.contains("\"conformance_probe\":true"),
        "the proxy served the probes, as the chart runs it: {proxy_log}"
    );
    assert!(
        !proxy_log.contains(&credential),
        "the credential is in the egress proxy's log"
    );
    for (what, bytes) in [("stdout", &job.stdout), ("stderr", &job.stderr)] {
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle),
            "the credential is in the Job's {what}"
        );
    }
    let on_disk = files_containing(tmp, needle);
    assert!(
        on_disk.is_empty(),
        "the credential is in files the operator, the proxy or the Job wrote: {on_disk:?}"
    );
    if let Some(kubelet) = &s.kubelet {
        // Pods' logs and volumes, claims; not the unpacked images (this build's binary).
        let on_node: Vec<_> = std::fs::read_dir(kubelet.root_dir())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name() != "images")
            .flat_map(|e| files_containing(&e.path(), needle))
            .collect();
        assert!(
            on_node.is_empty(),
            "the credential is on the node (pod logs, volumes): {on_node:?}"
        );
    }
    drop(operator);
    drop(proxy);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helm_installed_operator_builds_and_lands_a_change_set_over_https() {
    acceptance(Transport::Https, "helm-https").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_helm_installed_operator_builds_and_lands_a_change_set_over_ssh() {
    acceptance(Transport::Ssh, "helm-ssh").await;
}
