//! Configuration of a [`crate::KubernetesExecutor`].

use std::{path::PathBuf, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// The staging volume through which input goes in and output comes out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagingVolume {
    /// The PersistentVolumeClaim, in the sandbox namespace, that the operator
    /// also mounts (ReadWriteMany, or ReadWriteOnce with sandbox pods
    /// scheduled to the operator's node). Nothing else may mount it.
    pub claim_name: String,
    /// Where the operator process sees that claim.
    pub mount_path: PathBuf,
}

/// Who owns the staged directories the sandbox writes (`workspace`, `out`).
///
/// The sandbox runs as the profile's `runAsUser`. It can write its staged
/// directories, and the operator can later remove what it wrote, when both
/// run as that uid (the chart runs the operator as the profiles' uid), or when
/// the operator is root and hands the directories over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StagingOwnership {
    /// [`StagingOwnership::ProfileUser`] when the operator runs as root, else
    /// [`StagingOwnership::Keep`].
    #[default]
    Auto,
    /// `chown` to the profile's `runAsUser`:`runAsGroup` (needs root).
    ProfileUser,
    /// Keep the operator's own uid (the operator runs as the profile's uid,
    /// or a test kubelet runs containers as the operator's uid).
    Keep,
}

/// Configuration of a [`crate::KubernetesExecutor`].
#[derive(Clone, Debug)]
pub struct KubeExecutorConfig {
    /// Namespace of sandbox pods and their NetworkPolicies.
    pub namespace: String,
    /// The staging volume.
    pub staging: StagingVolume,
    /// Where collected `/out` folders are kept (control-plane owned, outside
    /// the staging volume so a later run can never see them).
    pub output_root: PathBuf,
    /// Image for runs whose `RunSpec::image` is `None`.
    pub default_image: Option<String>,
    /// Value of the `protobot.dev/executor` label on every object this
    /// executor creates; [`crate::KubernetesExecutor::collect_garbage`] only
    /// touches objects with its own value. Must be unique per operator
    /// replica sharing a namespace.
    pub instance: String,
    /// Grace period given to a sandbox that is cancelled or cleaned up
    /// (`terminationGracePeriodSeconds` and the delete's grace).
    pub grace_period: Duration,
    /// Time a pod may spend before it starts (scheduling, image pull), added
    /// to the wall clock for the executor's own deadline: `activeDeadlineSeconds`
    /// only counts once the kubelet has accepted the pod.
    pub start_allowance: Duration,
    /// How long to wait for a deleted pod to be gone before giving up on
    /// cleaning its staging directory (left for `collect_garbage`).
    pub deletion_timeout: Duration,
    /// Log bytes kept in `RunOutput::stderr_tail`.
    pub log_tail_bytes: usize,
    /// Who owns the staged `workspace` and `out` directories.
    pub staging_ownership: StagingOwnership,
    /// The egress proxy's session secret: each run that asks for egress gets a
    /// signed session token for its own session (work item, role, run),
    /// valid until its deadline (`protobot_egress::issue_session_token`).
    /// `None`: runs asking for egress are refused.
    pub egress_session_secret: Option<protobot_egress::SessionSecret>,
    /// The egress proxy's base URL as sandboxes reach it (the operator's
    /// `--egress-proxy-url`: the proxy Service's cluster IP, as the run's policy
    /// denies DNS). With the
    /// session secret and a profile that allows egress, the executor reports
    /// `credential-broker` supported and the conformance suite's broker probes
    /// run through this URL. `None`: the capability is reported unsupported.
    pub egress_proxy_url: Option<String>,
    /// Owner reference put on every pod and NetworkPolicy (e.g. the
    /// `BuildWorkItem` or `InspectionRun`), so Kubernetes garbage-collects
    /// them with their owner. Set per executor with
    /// [`crate::KubernetesExecutor::with_owner`].
    pub owner: Option<OwnerReference>,
    /// Without a fixed [`KubeExecutorConfig::owner`]: each run's pod and NetworkPolicy are
    /// owned by the object this names for the run's work item, when that object lives in
    /// the sandbox namespace (owner references never cross namespaces), so deleting a
    /// `BuildWorkItem` garbage-collects its sandbox objects.
    pub work_item_owner: Option<WorkItemOwner>,
    /// Image the in-guest supervisor is copied from when the profile's
    /// `spec.supervisor` names none (the chart writes the operator's image into the
    /// profiles it installs instead).
    pub supervisor_image: Option<String>,
}

/// The object that owns a work item's sandbox objects: its API version and kind, and the
/// object name of a work item ID.
#[derive(Clone, Debug)]
pub struct WorkItemOwner {
    /// E.g. `protobot.dev/v1alpha1`.
    pub api_version: String,
    /// E.g. `BuildWorkItem`.
    pub kind: String,
    /// Its plural, e.g. `buildworkitems`.
    pub plural: String,
    /// The object name of a work item ID.
    pub name_of: fn(&str) -> String,
}

impl KubeExecutorConfig {
    /// A configuration with defaults for everything but the namespace, the
    /// staging volume and the output root.
    pub fn new(namespace: &str, staging: StagingVolume, output_root: PathBuf) -> Self {
        KubeExecutorConfig {
            namespace: namespace.to_owned(),
            staging,
            output_root,
            default_image: None,
            instance: "default".to_owned(),
            grace_period: Duration::from_secs(5),
            start_allowance: Duration::from_secs(120),
            deletion_timeout: Duration::from_secs(60),
            log_tail_bytes: 4096,
            staging_ownership: StagingOwnership::Auto,
            egress_session_secret: None,
            egress_proxy_url: None,
            owner: None,
            work_item_owner: None,
            supervisor_image: None,
        }
    }
}
