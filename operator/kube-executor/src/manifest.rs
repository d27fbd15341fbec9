//! Pure construction of a run's Kubernetes objects: the sandbox Pod and its
//! NetworkPolicy, from the profile, the executor configuration and the
//! `RunSpec`. No client here; everything is unit-tested.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::{
        core::v1::{
            Capabilities, Container, EmptyDirVolumeSource, EnvVar, LocalObjectReference,
            PersistentVolumeClaimVolumeSource, Pod, PodDNSConfig, PodSecurityContext, PodSpec,
            ResourceRequirements, SeccompProfile, SecurityContext, Volume, VolumeMount,
        },
        networking::v1::{
            NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort,
            NetworkPolicySpec,
        },
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference},
        util::intstr::IntOrString,
    },
};
use protobot_jobsite::executor::{RunSpec, SandboxRole};

use crate::{config::KubeExecutorConfig, names::run_name, profile::SandboxProfile};

/// `app.kubernetes.io/managed-by` value on everything this crate creates.
pub const MANAGED_BY: &str = "protobot";
/// Label: who manages the object.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label: the object's part (`sandbox`).
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
/// Label: the run's name ([`run_name`] of the run id).
pub const LABEL_RUN_ID: &str = "protobot.dev/run-id";
/// Label: the sandboxed role (`worker-a`, `integration-runner`, …).
pub const LABEL_ROLE: &str = "protobot.dev/role";
/// Label: the sandbox profile.
pub const LABEL_PROFILE: &str = "protobot.dev/profile";
/// Label: the executor instance (scopes garbage collection).
pub const LABEL_EXECUTOR: &str = "protobot.dev/executor";
/// Annotation: the exact run id (free text, not a valid label value).
pub const ANNOTATION_RUN_ID: &str = "protobot.dev/run-id";
/// The sandbox container's name.
pub const CONTAINER: &str = "sandbox";
/// Directory of the staging volume holding `<instance>/<run name>` per run.
pub const RUNS_DIR: &str = "runs";
/// File under `/task` holding the run's egress session token (runs with egress only).
pub const EGRESS_TOKEN_FILE: &str = "egress-session-token";
/// Base URL of the egress proxy inside the sandbox (runs with egress only).
pub const ENV_EGRESS_PROXY: &str = "PROTOBOT_EGRESS_PROXY";
/// Path of the session token file inside the sandbox (runs with egress only).
pub const ENV_EGRESS_TOKEN_FILE: &str = "PROTOBOT_EGRESS_SESSION_TOKEN_FILE";
/// The init container that delivers the supervisor.
pub const SUPERVISOR_INIT_CONTAINER: &str = "install-supervisor";
/// The `emptyDir` volume holding the supervisor binary.
pub const SUPERVISOR_VOLUME: &str = "protobot-supervisor";
/// Where that volume is mounted (read-only in the sandbox container).
pub const SUPERVISOR_DIR: &str = "/protobot-supervisor";
/// The supervisor binary inside the pod.
pub const SUPERVISOR_BINARY: &str = "/protobot-supervisor/protobot";
/// Size limit of the supervisor's `emptyDir` (the static release binary is far smaller).
pub const SUPERVISOR_VOLUME_SIZE: &str = "256Mi";

/// Where a run's supervisor comes from: the profile's `spec.supervisor` with its
/// image resolved (the profile's, else the executor's `supervisor_image`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Supervisor {
    /// Image holding the protobot binary.
    pub image: String,
    /// The binary's path in that image.
    pub binary_path: String,
}

/// The supervisor a profile and configuration put into pods: `Ok(None)` when the
/// profile configures none, `Err` with why when it configures one but names no image
/// and the executor has none either.
pub fn supervisor(
    profile: &SandboxProfile,
    config: &KubeExecutorConfig,
) -> Result<Option<Supervisor>, String> {
    let Some(sup) = &profile.spec().supervisor else {
        return Ok(None);
    };
    let image = Some(sup.image.clone())
        .filter(|i| !i.is_empty())
        .or_else(|| config.supervisor_image.clone().filter(|i| !i.is_empty()));
    match image {
        Some(image) => Ok(Some(Supervisor {
            image,
            binary_path: sup.binary_path.clone(),
        })),
        None => Err(format!(
            "profile {} configures the supervisor (spec.supervisor) without an image, and the executor has no supervisor image: set spec.supervisor.image (the chart writes the operator's image there) or KubeExecutorConfig::supervisor_image",
            profile.name()
        )),
    }
}

/// Why a run's objects could not be built (the run is refused before anything
/// is created).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// No command.
    #[error("the run has no command; the WorkerClass must name one")]
    NoCommand,
    /// No image and no default image.
    #[error(
        "the run names no image and the executor has no default image; set RunSpec::image or KubeExecutorConfig::default_image"
    )]
    NoImage,
    /// Memory above the profile's ceiling.
    #[error(
        "sandbox.limit: the run asks for {asked} bytes of memory, above profile {profile}'s maxMemory of {max}; lower the limit or raise spec.resources.maxMemory"
    )]
    MemoryAboveProfile {
        /// Profile name.
        profile: String,
        /// Requested bytes.
        asked: u64,
        /// Ceiling.
        max: u64,
    },
    /// A limit is zero.
    #[error("sandbox.fail_closed: the run's {limit} limit is zero; give it a positive value")]
    ZeroLimit {
        /// Which limit.
        limit: &'static str,
    },
    /// The run wants egress but the profile has no proxy.
    #[error(
        "sandbox.denied: the run asks for egress through {proxy:?}, but profile {profile} allows no egress (spec.egress.proxy is empty)"
    )]
    NoEgressInProfile {
        /// Profile name.
        profile: String,
        /// The asked proxy URL.
        proxy: String,
    },
    /// The run wants egress but the executor cannot give it a session.
    #[error(
        "sandbox.fail_closed: the run asks for egress through {proxy:?}, but the executor has no egress session secret to give it a session token; start the operator with --egress-session-secret (chart: egressProxy.enabled)"
    )]
    NoEgressSessions {
        /// The asked proxy URL.
        proxy: String,
    },
    /// The run's environment overrides a variable the executor sets.
    #[error("the run's environment sets {name}, which the executor owns; rename it")]
    ReservedEnv {
        /// The variable.
        name: String,
    },
    /// The run's environment holds the sentinel credential.
    #[error(
        "sandbox.denied: the run's command or environment contains a credential sentinel; credentials never enter a sandbox"
    )]
    Credential,
}

/// `s` as Kubernetes must be given it to pass it on unchanged: the kubelet expands `$(NAME)`
/// in a container's command, args and env values and reads `$$` as `$`, so every `$` is
/// doubled (a script's `$$` or `$(cmd)` reaches the shell as written).
pub fn literal(s: &str) -> String {
    s.replace('$', "$$")
}

/// The role's label value (its serde name).
pub fn role_label(role: SandboxRole) -> String {
    role.as_str().to_owned()
}

/// The egress session of a run: the one derivation of both executors
/// ([`protobot_executors::egress::session_for`]): work item, role, run id as
/// trace id, source commit, and the project, stage, cycle and tier its model
/// usage is attributed to. The proxy's rules match on the role.
pub fn egress_session(spec: &RunSpec) -> protobot_egress::Session {
    protobot_executors::egress::session_for(spec)
}

/// The labels of every object of one run.
pub fn run_labels(
    profile: &SandboxProfile,
    config: &KubeExecutorConfig,
    spec: &RunSpec,
) -> BTreeMap<String, String> {
    [
        (LABEL_MANAGED_BY, MANAGED_BY.to_owned()),
        (LABEL_COMPONENT, "sandbox".to_owned()),
        (LABEL_RUN_ID, run_name(&spec.run_id)),
        (LABEL_ROLE, role_label(spec.role)),
        (LABEL_PROFILE, profile.name().to_owned()),
        (LABEL_EXECUTOR, config.instance.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The selector of one run's pod (what its NetworkPolicy applies to).
pub fn run_selector(spec: &RunSpec) -> BTreeMap<String, String> {
    [
        (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
        (LABEL_RUN_ID.to_owned(), run_name(&spec.run_id)),
    ]
    .into()
}

fn meta(
    profile: &SandboxProfile,
    config: &KubeExecutorConfig,
    spec: &RunSpec,
    owner: Option<&OwnerReference>,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(run_name(&spec.run_id)),
        namespace: Some(config.namespace.clone()),
        labels: Some(run_labels(profile, config, spec)),
        annotations: Some([(ANNOTATION_RUN_ID.to_owned(), spec.run_id.clone())].into()),
        owner_references: owner.map(|o| vec![o.clone()]),
        ..ObjectMeta::default()
    }
}

/// Seconds, rounded up, at least 1.
fn ceil_secs(d: std::time::Duration) -> i64 {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    i64::try_from(s.max(1)).unwrap_or(i64::MAX)
}

/// Environment variables the executor sets (a run may not override them).
const RESERVED_ENV: [&str; 10] = [
    "HOME",
    "PROTOBOT_WORKSPACE",
    "PROTOBOT_OUT",
    "PROTOBOT_TASK",
    ENV_EGRESS_PROXY,
    ENV_EGRESS_TOKEN_FILE,
    "HTTPS_PROXY",
    "HTTP_PROXY",
    "https_proxy",
    "http_proxy",
];

/// Checks what every run must satisfy before objects are built.
pub fn check_spec(
    profile: &SandboxProfile,
    config: &KubeExecutorConfig,
    spec: &RunSpec,
) -> Result<String, BuildError> {
    if spec.command.is_empty() {
        return Err(BuildError::NoCommand);
    }
    let image = spec
        .image
        .clone()
        .or_else(|| config.default_image.clone())
        .filter(|i| !i.is_empty())
        .ok_or(BuildError::NoImage)?;
    if spec.limits.wall_clock.is_zero() {
        return Err(BuildError::ZeroLimit {
            limit: "wall-clock",
        });
    }
    if spec.limits.memory_bytes == 0 {
        return Err(BuildError::ZeroLimit { limit: "memory" });
    }
    if spec.limits.memory_bytes > profile.max_memory_bytes() {
        return Err(BuildError::MemoryAboveProfile {
            profile: profile.name().to_owned(),
            asked: spec.limits.memory_bytes,
            max: profile.max_memory_bytes(),
        });
    }
    if let Some(proxy) = &spec.egress_proxy
        && profile.spec().egress.proxy.is_none()
    {
        return Err(BuildError::NoEgressInProfile {
            profile: profile.name().to_owned(),
            proxy: proxy.clone(),
        });
    }
    if let Some(proxy) = &spec.egress_proxy
        && config.egress_session_secret.is_none()
    {
        return Err(BuildError::NoEgressSessions {
            proxy: proxy.clone(),
        });
    }
    if let Some(name) = spec.env.keys().find(|k| RESERVED_ENV.contains(&k.as_str())) {
        return Err(BuildError::ReservedEnv { name: name.clone() });
    }
    let sentinel = protobot_executors::BROKER_TOKEN_SENTINEL;
    if spec.command.iter().any(|a| a.contains(sentinel))
        || spec
            .env
            .iter()
            .any(|(k, v)| k.contains(sentinel) || v.contains(sentinel))
    {
        return Err(BuildError::Credential);
    }
    Ok(image)
}

/// The sandbox pod of one run.
pub fn build_pod(
    profile: &SandboxProfile,
    config: &KubeExecutorConfig,
    spec: &RunSpec,
    owner: Option<&OwnerReference>,
) -> Result<Pod, BuildError> {
    let image = check_spec(profile, config, spec)?;
    let supervisor = supervisor(profile, config).ok().flatten();
    let name = run_name(&spec.run_id);
    let p = profile.spec();
    let sc = &p.security_context;
    let seccomp = SeccompProfile {
        type_: sc.seccomp_profile.type_.clone(),
        localhost_profile: sc.seccomp_profile.localhost_profile.clone(),
    };
    let mut env: Vec<EnvVar> = [
        ("HOME", "/tmp"),
        ("PROTOBOT_WORKSPACE", "/workspace"),
        ("PROTOBOT_OUT", "/out"),
        ("PROTOBOT_TASK", "/task/task.json"),
    ]
    .into_iter()
    .map(|(k, v)| EnvVar {
        name: k.to_owned(),
        value: Some(literal(v)),
        value_from: None,
    })
    .collect();
    // Egress is through the broker's base-URL form (`$PROTOBOT_EGRESS_PROXY/<host>/<path>`)
    // with the session token from the file: no `HTTPS_PROXY`, whose CONNECT tunnels the
    // proxy refuses because it could not see through them.
    if let Some(proxy) = &spec.egress_proxy {
        for (k, v) in [
            (ENV_EGRESS_PROXY, proxy.clone()),
            (ENV_EGRESS_TOKEN_FILE, format!("/task/{EGRESS_TOKEN_FILE}")),
        ] {
            env.push(EnvVar {
                name: k.to_owned(),
                value: Some(literal(&v)),
                value_from: None,
            });
        }
    }
    env.extend(spec.env.iter().map(|(k, v)| EnvVar {
        name: k.clone(),
        value: Some(literal(v)),
        value_from: None,
    }));
    // Memory and disk: request = limit. CPU: the profile's request (a share of a node's
    // cores), its limit the ceiling.
    let resources = |cpu_millis: u64| -> BTreeMap<String, Quantity> {
        [
            ("cpu", format!("{cpu_millis}m")),
            ("memory", spec.limits.memory_bytes.to_string()),
            (
                "ephemeral-storage",
                profile.ephemeral_storage_bytes().to_string(),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Quantity(v)))
        .collect()
    };
    let staged = |part: &str| format!("{RUNS_DIR}/{}/{name}/{part}", config.instance);
    let mount = |path: &str, sub: Option<String>, read_only: bool, volume: &str| VolumeMount {
        name: volume.to_owned(),
        mount_path: path.to_owned(),
        sub_path: sub,
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    // With the supervisor, the role's command runs through it: the rlimits are set in
    // the guest before the command starts and bind every process it forks.
    let command = match &supervisor {
        Some(_) => {
            let mut c = vec![SUPERVISOR_BINARY.to_owned()];
            c.extend(protobot_executors::guest::supervise_args(
                &protobot_executors::guest::guest_limits(&spec.limits),
                &spec.command,
            ));
            c
        }
        None => spec.command.clone(),
    };
    let security_context = SecurityContext {
        run_as_non_root: Some(sc.run_as_non_root),
        run_as_user: Some(sc.run_as_user),
        run_as_group: Some(sc.run_as_group),
        read_only_root_filesystem: Some(sc.read_only_root_filesystem),
        allow_privilege_escalation: Some(sc.allow_privilege_escalation),
        privileged: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(sc.capabilities.drop.clone()),
            add: None,
        }),
        seccomp_profile: Some(seccomp.clone()),
        ..SecurityContext::default()
    };
    let mut volume_mounts = vec![
        mount("/task", Some(staged("task")), true, "staging"),
        mount("/workspace", Some(staged("workspace")), false, "staging"),
        mount("/out", Some(staged("out")), false, "staging"),
        mount("/tmp", None, false, "tmp"),
    ];
    if supervisor.is_some() {
        volume_mounts.push(mount(SUPERVISOR_DIR, None, true, SUPERVISOR_VOLUME));
    }
    let requirements = ResourceRequirements {
        requests: Some(resources(profile.cpu_request_millis())),
        limits: Some(resources(profile.cpu_millis())),
        ..ResourceRequirements::default()
    };
    // The init container copies the binary with the binary itself (no shell or `cp`
    // needed in the image), under the same restricted context and the same resources
    // (a pod's effective request is the larger of the two, so it costs nothing).
    let init_containers = supervisor.as_ref().map(|sup| {
        vec![Container {
            name: SUPERVISOR_INIT_CONTAINER.to_owned(),
            image: Some(sup.image.clone()),
            image_pull_policy: Some("IfNotPresent".to_owned()),
            command: Some(
                [
                    sup.binary_path.as_str(),
                    "sandbox",
                    "install-supervisor",
                    "--to",
                    SUPERVISOR_BINARY,
                ]
                .map(literal)
                .to_vec(),
            ),
            resources: Some(requirements.clone()),
            security_context: Some(security_context.clone()),
            volume_mounts: Some(vec![mount(SUPERVISOR_DIR, None, false, SUPERVISOR_VOLUME)]),
            termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
            ..Container::default()
        }]
    });
    let container = Container {
        name: CONTAINER.to_owned(),
        image: Some(image),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        command: Some(command.iter().map(|a| literal(a)).collect()),
        working_dir: Some("/workspace".to_owned()),
        env: Some(env),
        resources: Some(requirements),
        security_context: Some(security_context),
        volume_mounts: Some(volume_mounts),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Container::default()
    };
    let mut volumes = vec![
        Volume {
            name: "staging".to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: config.staging.claim_name.clone(),
                read_only: None,
            }),
            ..Volume::default()
        },
        Volume {
            name: "tmp".to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("Memory".to_owned()),
                size_limit: Some(Quantity(profile.tmp_size_bytes().to_string())),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        },
    ];
    if supervisor.is_some() {
        volumes.push(Volume {
            name: SUPERVISOR_VOLUME.to_owned(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: None,
                size_limit: Some(Quantity(SUPERVISOR_VOLUME_SIZE.to_owned())),
                ..EmptyDirVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    let grace = i64::try_from(config.grace_period.as_secs()).unwrap_or(i64::MAX);
    Ok(Pod {
        metadata: meta(profile, config, spec, owner),
        spec: Some(PodSpec {
            runtime_class_name: Some(p.runtime_class_name.clone()),
            service_account_name: p.service_account_name.clone(),
            image_pull_secrets: (!p.image_pull_secrets.is_empty()).then(|| {
                p.image_pull_secrets
                    .iter()
                    .map(|name| LocalObjectReference { name: name.clone() })
                    .collect()
            }),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            // No resolver: the kubelet would otherwise write the cluster DNS into every
            // container's /etc/resolv.conf (SB-NET-005). DNS is denied by the NetworkPolicy
            // too; the only nameserver is the sandbox's own loopback, where nothing answers.
            dns_policy: Some("None".to_owned()),
            dns_config: Some(PodDNSConfig {
                nameservers: Some(vec!["127.0.0.1".to_owned()]),
                ..PodDNSConfig::default()
            }),
            host_network: Some(false),
            host_pid: Some(false),
            host_ipc: Some(false),
            share_process_namespace: Some(false),
            restart_policy: Some("Never".to_owned()),
            active_deadline_seconds: Some(ceil_secs(spec.limits.wall_clock)),
            termination_grace_period_seconds: Some(grace),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(sc.run_as_non_root),
                run_as_user: Some(sc.run_as_user),
                run_as_group: Some(sc.run_as_group),
                seccomp_profile: Some(seccomp),
                ..PodSecurityContext::default()
            }),
            init_containers,
            containers: vec![container],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    })
}

/// The NetworkPolicy of one run: selects only that run's pod, denies all
/// ingress, and denies all egress (DNS included) except TCP to the profile's
/// egress proxy when the run asked for it.
pub fn build_network_policy(
    profile: &SandboxProfile,
    config: &KubeExecutorConfig,
    spec: &RunSpec,
    owner: Option<&OwnerReference>,
) -> NetworkPolicy {
    let egress = match (&spec.egress_proxy, &profile.spec().egress.proxy) {
        (Some(_), Some(proxy)) => vec![NetworkPolicyEgressRule {
            to: Some(vec![NetworkPolicyPeer {
                namespace_selector: (!proxy.namespace_selector.is_empty()).then(|| LabelSelector {
                    match_labels: Some(proxy.namespace_selector.clone()),
                    match_expressions: None,
                }),
                pod_selector: Some(LabelSelector {
                    match_labels: Some(proxy.pod_selector.clone()),
                    match_expressions: None,
                }),
                ip_block: None,
            }]),
            ports: Some(vec![NetworkPolicyPort {
                protocol: Some("TCP".to_owned()),
                port: Some(IntOrString::Int(i32::from(proxy.port))),
                end_port: None,
            }]),
        }],
        _ => Vec::new(),
    };
    NetworkPolicy {
        metadata: meta(profile, config, spec, owner),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(run_selector(spec)),
                match_expressions: None,
            }),
            policy_types: Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            ingress: Some(Vec::new()),
            egress: Some(egress),
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::{path::PathBuf, time::Duration};

    use protobot_jobsite::executor::Limits;
    use serde_json::{Value, json};

    use super::*;
    use crate::config::StagingVolume;

    fn profile() -> SandboxProfile {
        SandboxProfile::parse(
            include_str!("../../../sandbox-profiles/kata.yaml"),
            "kata.yaml",
        )
        .unwrap()
    }

    fn config() -> KubeExecutorConfig {
        let mut c = KubeExecutorConfig::new(
            "sandboxes",
            StagingVolume {
                claim_name: "protobot-staging".into(),
                mount_path: PathBuf::from("/staging"),
            },
            PathBuf::from("/collected"),
        );
        c.default_image = Some("registry.example.invalid/worker:1".into());
        c.instance = "replica-0".into();
        c.egress_session_secret = Some(protobot_egress::SessionSecret::new(vec![5u8; 32]));
        c
    }

    fn spec() -> RunSpec {
        RunSpec {
            run_id: "wi-1/cycle-1/worker-b".into(),
            role: SandboxRole::WorkerB,
            workspace: PathBuf::from("/exports/wi-1/b"),
            task: json!({"role": "worker-b"}),
            command: vec!["harness".into(), "--task".into(), "/task/task.json".into()],
            image: None,
            env: [("MODEL_TIER".to_owned(), "t2".to_owned())].into(),
            limits: Limits {
                wall_clock: Duration::from_millis(90_500),
                memory_bytes: 1 << 30,
                ..Limits::default()
            },
            egress_proxy: None,
            audit: Default::default(),
            attribution: Default::default(),
        }
    }

    fn json_of<T: serde::Serialize>(t: &T) -> Value {
        serde_json::to_value(t).unwrap()
    }

    #[test]
    fn the_kubelet_runs_exactly_the_command_and_environment_the_run_asked_for() {
        // Found on the real node: the probes' `$$` reached the shell as `$`.
        let mut run = spec();
        run.command = vec![
            "sh".into(),
            "-c".into(),
            "echo $$ $(HOME) ${PATH} $(echo $$x) $$$ $".into(),
        ];
        run.env.insert("TRICKY".into(), "a$(HOME)b$$c$".into());
        let pod = json_of(&build_pod(&profile(), &config(), &run, None).unwrap());
        let c = &pod["spec"]["containers"][0];
        let env: Vec<(String, String)> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["name"].as_str().unwrap().to_owned(),
                    e["value"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        // Env values first (each sees the earlier ones), then the command with all of them.
        let mut expanded: Vec<(String, String)> = Vec::new();
        for (k, v) in &env {
            let value = protobot_testkit::kubelet::expand(v, &expanded);
            expanded.push((k.clone(), value));
        }
        let tricky = expanded.iter().find(|(k, _)| k == "TRICKY").unwrap();
        assert_eq!(tricky.1, "a$(HOME)b$$c$");
        let home = expanded.iter().find(|(k, _)| k == "HOME").unwrap();
        assert_eq!(home.1, "/tmp");
        let argv: Vec<String> = c["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| protobot_testkit::kubelet::expand(a.as_str().unwrap(), &expanded))
            .collect();
        assert!(
            argv.ends_with(&run.command),
            "the container runs {argv:?}, the run asked for {:?}",
            run.command
        );
        for property_case in ["", "$", "$$", "$(", "$()", "$(A)$(B", "x$$(y)$"] {
            assert_eq!(
                protobot_testkit::kubelet::expand(&literal(property_case), &expanded),
                property_case
            );
        }
    }

    #[test]
    fn image_pull_secrets_of_the_profile_reach_the_pod_and_bad_names_are_refused() {
        let text = include_str!("../../../sandbox-profiles/kata.yaml").replace(
            "  serviceAccountName: protobot-sandbox\n",
            "  serviceAccountName: protobot-sandbox\n  imagePullSecrets: [registry-a, registry-b]\n",
        );
        let profile = SandboxProfile::parse(&text, "kata.yaml").unwrap();
        let pod = json_of(&build_pod(&profile, &config(), &spec(), None).unwrap());
        assert_eq!(
            pod["spec"]["imagePullSecrets"],
            json!([{"name": "registry-a"}, {"name": "registry-b"}])
        );
        let bad = text.replace("registry-b", "Not_A_Name");
        let e = SandboxProfile::parse(&bad, "kata.yaml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("spec.imagePullSecrets"), "{e}");
    }

    #[test]
    fn the_pod_carries_every_profile_field() {
        let owner = OwnerReference {
            api_version: "protobot.dev/v1alpha1".into(),
            kind: "BuildWorkItem".into(),
            name: "wi-1".into(),
            uid: "uid-1".into(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        };
        let pod = json_of(&build_pod(&profile(), &config(), &spec(), Some(&owner)).unwrap());
        let name = run_name("wi-1/cycle-1/worker-b");
        assert_eq!(pod["metadata"]["name"], json!(name));
        assert_eq!(pod["metadata"]["namespace"], json!("sandboxes"));
        assert_eq!(
            pod["metadata"]["ownerReferences"][0]["kind"],
            json!("BuildWorkItem")
        );
        let labels = &pod["metadata"]["labels"];
        assert_eq!(labels[LABEL_MANAGED_BY], json!("protobot"));
        assert_eq!(labels[LABEL_RUN_ID], json!(name));
        assert_eq!(labels[LABEL_ROLE], json!("worker-b"));
        assert_eq!(labels[LABEL_EXECUTOR], json!("replica-0"));
        assert_eq!(
            pod["metadata"]["annotations"][ANNOTATION_RUN_ID],
            json!("wi-1/cycle-1/worker-b")
        );
        let s = &pod["spec"];
        assert_eq!(s["runtimeClassName"], json!("kata"));
        assert_eq!(s["serviceAccountName"], json!("protobot-sandbox"));
        assert!(s.get("imagePullSecrets").is_none(), "none unless named");
        assert_eq!(s["automountServiceAccountToken"], json!(false));
        assert_eq!(s["enableServiceLinks"], json!(false));
        assert_eq!(
            s["dnsPolicy"],
            json!("None"),
            "no cluster resolver in a sandbox"
        );
        assert_eq!(s["dnsConfig"], json!({"nameservers": ["127.0.0.1"]}));
        assert_eq!(s["restartPolicy"], json!("Never"));
        assert_eq!(s["activeDeadlineSeconds"], json!(91), "rounded up");
        assert_eq!(s["securityContext"]["runAsNonRoot"], json!(true));
        let c = &s["containers"][0];
        assert_eq!(c["image"], json!("registry.example.invalid/worker:1"));
        assert_eq!(
            c["command"],
            json!(["harness", "--task", "/task/task.json"])
        );
        let csc = &c["securityContext"];
        assert_eq!(csc["runAsNonRoot"], json!(true));
        assert_eq!(csc["runAsUser"], json!(65532));
        assert_eq!(csc["readOnlyRootFilesystem"], json!(true));
        assert_eq!(csc["allowPrivilegeEscalation"], json!(false));
        assert_eq!(csc["privileged"], json!(false));
        assert_eq!(csc["capabilities"]["drop"], json!(["ALL"]));
        assert_eq!(csc["seccompProfile"]["type"], json!("RuntimeDefault"));
        let want = json!({"cpu": "2000m", "memory": (1u64 << 30).to_string(), "ephemeral-storage": (2u64 << 30).to_string()});
        assert_eq!(c["resources"]["limits"], want);
        let mut requested = want.clone();
        requested["cpu"] = json!("250m");
        assert_eq!(
            c["resources"]["requests"], requested,
            "the profile's cpuRequest is reserved, its cpu the ceiling"
        );
        let mounts: Vec<(String, Option<String>, bool)> = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["mountPath"].as_str().unwrap().to_owned(),
                    m["subPath"].as_str().map(str::to_owned),
                    m["readOnly"] == json!(true),
                )
            })
            .collect();
        assert_eq!(
            mounts,
            vec![
                (
                    "/task".into(),
                    Some(format!("runs/replica-0/{name}/task")),
                    true
                ),
                (
                    "/workspace".into(),
                    Some(format!("runs/replica-0/{name}/workspace")),
                    false
                ),
                (
                    "/out".into(),
                    Some(format!("runs/replica-0/{name}/out")),
                    false
                ),
                ("/tmp".into(), None, false),
            ]
        );
        assert_eq!(
            s["volumes"][0]["persistentVolumeClaim"]["claimName"],
            json!("protobot-staging")
        );
        assert_eq!(
            s["volumes"][1]["emptyDir"]["sizeLimit"],
            json!((512u64 << 20).to_string())
        );
        let env: Vec<&str> = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert!(env.contains(&"MODEL_TIER"));
        assert!(!env.contains(&"HTTPS_PROXY"), "no proxy asked, none set");
    }

    #[test]
    fn with_a_supervisor_image_the_command_runs_through_the_supervisor() {
        // Without an image (the profile names none, the config neither): no supervisor.
        let pod = json_of(&build_pod(&profile(), &config(), &spec(), None).unwrap());
        assert!(pod["spec"].get("initContainers").is_none());
        assert!(supervisor(&profile(), &config()).is_err());
        let mut c = config();
        c.supervisor_image = Some("ghcr.io/protobot/protobot:1".into());
        let pod = json_of(&build_pod(&profile(), &c, &spec(), None).unwrap());
        let init = &pod["spec"]["initContainers"][0];
        assert_eq!(init["image"], json!("ghcr.io/protobot/protobot:1"));
        assert_eq!(
            init["command"],
            json!([
                "/usr/local/bin/protobot",
                "sandbox",
                "install-supervisor",
                "--to",
                SUPERVISOR_BINARY
            ])
        );
        assert_eq!(init["securityContext"]["runAsNonRoot"], json!(true));
        let main = &pod["spec"]["containers"][0];
        let cmd: Vec<String> = serde_json::from_value(main["command"].clone()).unwrap();
        assert_eq!(cmd[0], SUPERVISOR_BINARY);
        assert_eq!(&cmd[1..3], ["sandbox", "supervise"]);
        let sep = cmd.iter().position(|a| a == "--").unwrap();
        assert_eq!(&cmd[sep + 1..], ["harness", "--task", "/task/task.json"]);
        assert!(cmd.contains(&"--processes".to_owned()) && cmd.contains(&"256".to_owned()));
        let mounts = main["volumeMounts"].as_array().unwrap();
        assert!(
            mounts
                .iter()
                .any(|m| m["mountPath"] == json!(SUPERVISOR_DIR) && m["readOnly"] == json!(true))
        );
        let volumes = pod["spec"]["volumes"].as_array().unwrap();
        assert!(
            volumes
                .iter()
                .any(|v| v["name"] == json!(SUPERVISOR_VOLUME) && v.get("emptyDir").is_some())
        );
    }

    #[test]
    fn the_network_policy_denies_everything_without_a_proxy() {
        let np = json_of(&build_network_policy(&profile(), &config(), &spec(), None));
        let name = run_name("wi-1/cycle-1/worker-b");
        assert_eq!(
            np["spec"]["podSelector"]["matchLabels"],
            json!({LABEL_MANAGED_BY: "protobot", LABEL_RUN_ID: name})
        );
        assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(np["spec"]["ingress"], json!([]));
        assert_eq!(np["spec"]["egress"], json!([]));
    }

    #[test]
    fn the_network_policy_allows_only_the_proxy_when_asked() {
        let mut s = spec();
        s.egress_proxy = Some("http://10.0.0.9:3128".into());
        let np = json_of(&build_network_policy(&profile(), &config(), &s, None));
        assert_eq!(
            np["spec"]["egress"],
            json!([{
                "to": [{
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "protobot-system"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "protobot-egress-proxy"}}
                }],
                "ports": [{"protocol": "TCP", "port": 3128}]
            }])
        );
        let pod = json_of(&build_pod(&profile(), &config(), &s, None).unwrap());
        let env = pod["spec"]["containers"][0]["env"]
            .as_array()
            .unwrap()
            .clone();
        assert!(env.contains(&json!({"name": ENV_EGRESS_PROXY, "value": "http://10.0.0.9:3128"})));
        assert!(env.contains(
            &json!({"name": ENV_EGRESS_TOKEN_FILE, "value": "/task/egress-session-token"})
        ));
        assert!(
            env.iter().all(|e| !e["name"]
                .as_str()
                .unwrap()
                .eq_ignore_ascii_case("https_proxy")),
            "no CONNECT-style proxy variable: the proxy refuses tunnels"
        );
        // Without a session secret the executor cannot give the run a token.
        let mut c = config();
        c.egress_session_secret = None;
        assert!(matches!(
            build_pod(&profile(), &c, &s, None),
            Err(BuildError::NoEgressSessions { .. })
        ));
        // A run without egress needs none.
        assert!(build_pod(&profile(), &c, &spec(), None).is_ok());
    }

    #[test]
    fn the_egress_session_names_the_work_item_role_and_run() {
        let mut s = spec();
        s.task = json!({"work_item_id": "wi-1", "source_commit": "abc123"});
        let session = egress_session(&s);
        assert_eq!(session.work_item, "wi-1");
        assert_eq!(session.role, "worker-b");
        assert_eq!(session.trace_id, "wi-1/cycle-1/worker-b");
        assert_eq!(session.source_commit, "abc123");
        let bare = egress_session(&spec());
        assert_eq!(
            bare.work_item, "wi-1/cycle-1/worker-b",
            "falls back to the run id"
        );
        assert_eq!(bare.source_commit, "");
        // What its model usage is attributed to rides along (issue 34).
        s.audit.cycle = 1;
        s.attribution = protobot_jobsite::executor::RunAttribution {
            project: "shop".into(),
            stage: Some(protobot_usage::Stage::WorkerB),
            tier: Some(protobot_jobsite::escalation::Tier::T2),
        };
        let session = egress_session(&s);
        assert_eq!(
            (
                session.project.as_str(),
                session.stage.as_str(),
                session.cycle,
                session.tier.as_str()
            ),
            ("shop", "worker-b", 1, "t2")
        );
    }

    #[test]
    fn runs_the_profile_cannot_hold_are_refused() {
        let (p, c) = (profile(), config());
        let mut s = spec();
        s.limits.memory_bytes = 8 << 30;
        assert!(matches!(
            build_pod(&p, &c, &s, None),
            Err(BuildError::MemoryAboveProfile { .. })
        ));
        let mut s = spec();
        s.command.clear();
        assert_eq!(
            build_pod(&p, &c, &s, None).unwrap_err(),
            BuildError::NoCommand
        );
        let mut c2 = config();
        c2.default_image = None;
        assert_eq!(
            build_pod(&p, &c2, &spec(), None).unwrap_err(),
            BuildError::NoImage
        );
        let mut s = spec();
        s.env.insert("HOME".into(), "/root".into());
        assert!(matches!(
            build_pod(&p, &c, &s, None),
            Err(BuildError::ReservedEnv { .. })
        ));
        let mut s = spec();
        s.env.insert(
            "TOKEN".into(),
            protobot_executors::BROKER_TOKEN_SENTINEL.into(),
        );
        assert_eq!(
            build_pod(&p, &c, &s, None).unwrap_err(),
            BuildError::Credential
        );
        let mut s = spec();
        s.limits.wall_clock = Duration::ZERO;
        assert!(matches!(
            build_pod(&p, &c, &s, None),
            Err(BuildError::ZeroLimit {
                limit: "wall-clock"
            })
        ));
        let mut doc = p.document().clone();
        doc.spec.egress.proxy = None;
        let no_proxy = SandboxProfile::validate(doc, "no-proxy").unwrap();
        let mut s = spec();
        s.egress_proxy = Some("http://10.0.0.9:3128".into());
        assert!(matches!(
            build_pod(&no_proxy, &c, &s, None),
            Err(BuildError::NoEgressInProfile { .. })
        ));
    }
}
