//! `jobsite-sandbox/v1` conformance of a cluster profile, measured in the cluster.
//!
//! [`measure`] is what `protobot sandbox conformance --profile NAME` (and the chart's
//! conformance Job) does: it checks that the platform objects a sandbox pod of the profile
//! needs exist ([`preflight`]: the RuntimeClass, the sandbox ServiceAccount, the staging
//! claim, a probe image), then runs the suite's probes ([`protobot_executors::run_conformance`])
//! as pods of the profile through a [`KubernetesExecutor`] built for probing
//! ([`KubernetesExecutor::for_conformance`]). A missing platform object is a failing check
//! that names it, and no probe runs: the report fails, is stored, and every run stays refused
//! (never a silent fallback to a weaker profile).
//!
//! When the executor has the credential broker (the profile allows egress to its proxy, and
//! the executor holds the proxy's URL and session secret), the NET and CRED checks are the
//! broker's (SB-NET-001..010, SB-CRED-001..007): a probe pod with egress sends requests through
//! the proxy to `protobot_egress::probe::PROBE_HOST`, so the proxy must hold
//! `protobot_egress::probe::probe_policy`'s rules and reach the probe upstream for that host
//! with the suite's sentinel as the credential.
//!
//! [`store_report`] writes the report into the ConfigMap the profile names
//! (`spec.conformance`), where the operator watches it: storing a passing report admits runs,
//! a failing one refuses them, without a restart.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    core::v1::{ConfigMap, PersistentVolumeClaim, ServiceAccount},
    node::v1::RuntimeClass,
};
use kube::{
    Api, Client,
    api::{Patch, PatchParams},
};
use protobot_executors::{
    ConformanceCheck, ConformanceReport, SandboxBackend, run_broker_checks, run_conformance,
};
use serde_json::json;

use crate::KubernetesExecutor;

/// Field manager of the report ConfigMap's server-side apply.
pub const FIELD_MANAGER: &str = "protobot/sandbox-conformance";

/// Label on the report ConfigMap naming the profile it is for.
pub const PROFILE_LABEL: &str = "protobot.dev/sandbox-profile";

/// What one preflight look-up found (pure input of [`preflight_checks`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// The object exists (with what is worth knowing about it, if anything).
    Present(Option<String>),
    /// The API server answered 404.
    Missing,
    /// The look-up failed otherwise (forbidden, unreachable): the reason.
    Unknown(String),
}

/// What the cluster holds for a profile's sandbox pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Platform {
    /// The profile's RuntimeClass.
    pub runtime_class: Found,
    /// The profile's ServiceAccount in the sandbox namespace (`None`: the profile names none,
    /// so the namespace's `default` account is used).
    pub service_account: Option<Found>,
    /// The staging claim in the sandbox namespace; `Present` carries its phase.
    pub staging_claim: Found,
}

/// The names [`preflight_checks`] reports against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlatformNames {
    /// Sandbox namespace.
    pub namespace: String,
    /// RuntimeClass name.
    pub runtime_class: String,
    /// ServiceAccount name, if the profile names one.
    pub service_account: Option<String>,
    /// Staging claim name.
    pub staging_claim: String,
    /// The image probe pods run (`None`: none configured).
    pub probe_image: Option<String>,
}

fn check(id: &str, name: &str, passed: bool, detail: String) -> ConformanceCheck {
    ConformanceCheck {
        id: id.to_owned(),
        name: name.to_owned(),
        passed,
        skipped: false,
        detail: Some(detail),
    }
}

/// The preflight checks for what was found (pure): one check per platform object, failing
/// with what to do when the object is missing or could not be read.
pub fn preflight_checks(names: &PlatformNames, found: &Platform) -> Vec<ConformanceCheck> {
    let mut checks = Vec::new();
    let rc = &names.runtime_class;
    checks.push(match &found.runtime_class {
        Found::Present(_) => check(
            "SB-K8S-001",
            "the profile's RuntimeClass exists",
            true,
            format!("RuntimeClass {rc} exists"),
        ),
        Found::Missing => check(
            "SB-K8S-001",
            "the profile's RuntimeClass exists",
            false,
            format!(
                "RuntimeClass {rc} does not exist: install its runtime on the nodes (for Kata Containers, kata-deploy creates the RuntimeClass), or choose a profile whose runtime the cluster has (chart value jobSite.sandboxProfile)"
            ),
        ),
        Found::Unknown(why) => check(
            "SB-K8S-001",
            "the profile's RuntimeClass exists",
            false,
            format!(
                "RuntimeClass {rc} could not be read: {why}; the conformance identity needs get on runtimeclasses.node.k8s.io (the chart's conformance ClusterRole)"
            ),
        ),
    });
    if let (Some(sa), Some(found)) = (&names.service_account, &found.service_account) {
        let ns = &names.namespace;
        checks.push(match found {
            Found::Present(_) => check(
                "SB-K8S-002",
                "the sandbox ServiceAccount exists",
                true,
                format!("ServiceAccount {ns}/{sa} exists"),
            ),
            Found::Missing => check(
                "SB-K8S-002",
                "the sandbox ServiceAccount exists",
                false,
                format!(
                    "ServiceAccount {ns}/{sa} does not exist: the profile's pods name it (spec.serviceAccountName) and the API server refuses pods whose account is missing; the chart creates it in jobSite.sandboxNamespace"
                ),
            ),
            Found::Unknown(why) => check(
                "SB-K8S-002",
                "the sandbox ServiceAccount exists",
                false,
                format!(
                    "ServiceAccount {ns}/{sa} could not be read: {why}; grant get on serviceaccounts in {ns}"
                ),
            ),
        });
    }
    let (ns, claim) = (&names.namespace, &names.staging_claim);
    checks.push(match &found.staging_claim {
        Found::Present(phase) if phase.as_deref() == Some("Lost") => check(
            "SB-K8S-003",
            "the staging claim exists and is usable",
            false,
            format!(
                "PersistentVolumeClaim {ns}/{claim} is Lost (its volume is gone): recreate the claim (chart value jobSite.staging)"
            ),
        ),
        Found::Present(phase) => check(
            "SB-K8S-003",
            "the staging claim exists and is usable",
            true,
            format!(
                "PersistentVolumeClaim {ns}/{claim} exists (phase {})",
                phase.as_deref().unwrap_or("unknown")
            ),
        ),
        Found::Missing => check(
            "SB-K8S-003",
            "the staging claim exists and is usable",
            false,
            format!(
                "PersistentVolumeClaim {ns}/{claim} does not exist: sandbox pods receive their input and return their output through it; create it (chart value jobSite.staging.create) or name an existing one (jobSite.staging.claimName)"
            ),
        ),
        Found::Unknown(why) => check(
            "SB-K8S-003",
            "the staging claim exists and is usable",
            false,
            format!(
                "PersistentVolumeClaim {ns}/{claim} could not be read: {why}; grant get on persistentvolumeclaims in {ns}"
            ),
        ),
    });
    checks.push(match &names.probe_image {
        Some(image) => check(
            "SB-K8S-004",
            "probe pods have an image",
            true,
            format!("probe pods run image {image}"),
        ),
        None => check(
            "SB-K8S-004",
            "probe pods have an image",
            false,
            "no image for the probe pods: pass --sandbox-image (chart value conformance.image, else jobSite.sandboxImage), an image with /bin/sh and git like your Worker images".to_owned(),
        ),
    });
    checks
}

fn found<T>(
    result: Result<Option<T>, kube::Error>,
    detail: impl Fn(&T) -> Option<String>,
) -> Found {
    match result {
        Ok(Some(object)) => Found::Present(detail(&object)),
        Ok(None) => Found::Missing,
        Err(e) => Found::Unknown(e.to_string()),
    }
}

/// Looks up the platform objects the profile's pods need, through `client`.
pub async fn look_up(client: &Client, names: &PlatformNames) -> Platform {
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &names.namespace);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &names.namespace);
    let runtime_class = found(classes.get_opt(&names.runtime_class).await, |_| None);
    let service_account = match &names.service_account {
        Some(sa) => Some(found(accounts.get_opt(sa).await, |_| None)),
        None => None,
    };
    let staging_claim = found(claims.get_opt(&names.staging_claim).await, |c| {
        c.status.as_ref().and_then(|s| s.phase.clone())
    });
    Platform {
        runtime_class,
        service_account,
        staging_claim,
    }
}

/// The names of the platform objects `executor`'s pods need.
pub fn platform_names(executor: &KubernetesExecutor) -> PlatformNames {
    let profile = executor.sandbox_profile().spec();
    let config = executor.config();
    PlatformNames {
        namespace: config.namespace.clone(),
        runtime_class: profile.runtime_class_name.clone(),
        service_account: profile.service_account_name.clone(),
        staging_claim: config.staging.claim_name.clone(),
        probe_image: config.default_image.clone().filter(|i| !i.is_empty()),
    }
}

/// Measures `executor`'s profile in the cluster: the preflight checks, then (when they all
/// pass) the suite's probes as pods. The preflight checks come first in the report; a failing
/// one means no probe ran, and the report fails naming what is missing.
pub async fn measure(client: &Client, executor: &KubernetesExecutor) -> ConformanceReport {
    let names = platform_names(executor);
    let preflight = preflight_checks(&names, &look_up(client, &names).await);
    let profile = executor.sandbox_profile().name().to_owned();
    let failed: Vec<String> = preflight
        .iter()
        .filter(|c| !c.passed)
        .filter_map(|c| c.detail.clone())
        .collect();
    let mut report = if failed.is_empty() {
        let mut r = run_conformance(executor, &profile).await;
        // A missing capability (say resource-limits without the supervisor) stops the suite
        // before any probe; the broker's NET and CRED checks still run, so the report says
        // what the egress path enforces. They do not make such a report pass.
        if let Some(proxy) = executor.broker_probe_proxy()
            && !r.checks.iter().any(|c| c.id == "SB-NET-001")
        {
            r.checks.extend(run_broker_checks(executor, &proxy).await);
        }
        r
    } else {
        // The same report shape the suite writes when it fails closed, with the
        // capabilities the backend claims (none of which was measured).
        let mut r = run_conformance(&NoProbes(executor), &profile).await;
        r.checks.clear();
        r
    };
    let mut checks = preflight;
    checks.append(&mut report.checks);
    report.checks = checks;
    if !failed.is_empty() {
        report.fail_closed_reason = Some(format!(
            "the cluster cannot run pods of profile {profile}: {}; autonomous execution disabled",
            failed.join("; ")
        ));
    } else if let Some(check) = report.checks.iter().find(|c| !c.passed) {
        report.fail_closed_reason.get_or_insert_with(|| {
            format!(
                "check {} ({}) failed; autonomous execution disabled",
                check.id, check.name
            )
        });
    }
    report.passed = report.checks.iter().all(|c| c.passed && !c.skipped)
        && report.missing_capabilities().is_empty()
        && report.fail_closed_reason.is_none();
    report.autonomous_execution = report.passed;
    report
}

/// A backend that claims every capability unsupported, so the suite builds its fail-closed
/// report without running a probe (used when the preflight failed).
struct NoProbes<'a>(&'a KubernetesExecutor);

impl protobot_jobsite::executor::Executor for NoProbes<'_> {
    fn profile(&self) -> &str {
        protobot_jobsite::executor::Executor::profile(self.0)
    }

    fn admit(&self) -> Result<(), protobot_jobsite::executor::ExecutorError> {
        Err(
            protobot_jobsite::executor::ExecutorError::ProfileNotConformant {
                profile: protobot_jobsite::executor::Executor::profile(self.0).to_owned(),
                reason: "the preflight failed".into(),
            },
        )
    }

    async fn run(
        &self,
        spec: protobot_jobsite::executor::RunSpec,
        _cancel: tokio::sync::watch::Receiver<bool>,
    ) -> Result<protobot_jobsite::executor::RunOutput, protobot_jobsite::executor::ExecutorError>
    {
        Err(protobot_jobsite::executor::ExecutorError::Start {
            run_id: spec.run_id,
            reason: "the preflight failed; no probe runs".into(),
        })
    }
}

impl protobot_executors::SandboxBackend for NoProbes<'_> {
    fn identity(&self) -> protobot_executors::BackendIdentity {
        self.0.identity()
    }

    fn capabilities(&self) -> Vec<protobot_executors::Capability> {
        self.0
            .capabilities()
            .into_iter()
            .map(|c| {
                protobot_executors::Capability::unsupported(
                    &c.name,
                    "not measured: the platform preflight failed",
                )
            })
            .collect()
    }

    fn scratch_root(&self) -> &std::path::Path {
        self.0.scratch_root()
    }
}

/// Why a report could not be stored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The report does not encode (never for a report the suite built).
    #[error("the conformance report does not encode as JSON: {0}")]
    Encode(#[source] serde_json::Error),
    /// The API server refused or failed the write.
    #[error(
        "could not store the conformance report in ConfigMap {namespace}/{name}: {source}; the conformance identity needs create and patch on that ConfigMap (the chart's conformance Role)"
    )]
    Write {
        /// Namespace.
        namespace: String,
        /// ConfigMap.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
}

/// The report ConfigMap's apply body (pure).
pub fn report_config_map(
    namespace: &str,
    executor: &KubernetesExecutor,
    report: &ConformanceReport,
) -> Result<serde_json::Value, StoreError> {
    let source = &executor.sandbox_profile().spec().conformance;
    let json = serde_json::to_string_pretty(report).map_err(StoreError::Encode)?;
    let data: BTreeMap<&str, String> = BTreeMap::from([(source.key.as_str(), json)]);
    Ok(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": source.config_map,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/managed-by": "protobot",
                "app.kubernetes.io/component": "sandbox-conformance",
                PROFILE_LABEL: executor.sandbox_profile().name(),
            },
        },
        "data": data,
    }))
}

/// Stores `report` in the ConfigMap `executor`'s profile names, in its sandbox namespace
/// (server-side apply: created or replaced, the key only).
pub async fn store_report(
    client: &Client,
    executor: &KubernetesExecutor,
    report: &ConformanceReport,
) -> Result<(), StoreError> {
    let namespace = executor.config().namespace.clone();
    let name = executor
        .sandbox_profile()
        .spec()
        .conformance
        .config_map
        .clone();
    let body = report_config_map(&namespace, executor, report)?;
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map(|_| ())
    .map_err(|source| StoreError::Write {
        namespace,
        name,
        source,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn names() -> PlatformNames {
        PlatformNames {
            namespace: "protobot-system".into(),
            runtime_class: "kata".into(),
            service_account: Some("protobot-sandbox".into()),
            staging_claim: "protobot-staging".into(),
            probe_image: Some("registry.example/worker:1".into()),
        }
    }

    fn all_there() -> Platform {
        Platform {
            runtime_class: Found::Present(None),
            service_account: Some(Found::Present(None)),
            staging_claim: Found::Present(Some("Bound".into())),
        }
    }

    fn failing(checks: &[ConformanceCheck]) -> Vec<(&str, &str)> {
        checks
            .iter()
            .filter(|c| !c.passed)
            .map(|c| (c.id.as_str(), c.detail.as_deref().unwrap_or("")))
            .collect()
    }

    #[test]
    fn a_complete_platform_passes_every_preflight_check() {
        let checks = preflight_checks(&names(), &all_there());
        assert_eq!(checks.len(), 4);
        assert!(failing(&checks).is_empty(), "{checks:?}");
    }

    #[test]
    fn each_missing_object_is_a_failing_check_that_names_it_and_what_to_do() {
        let mut platform = all_there();
        platform.runtime_class = Found::Missing;
        let f = preflight_checks(&names(), &platform);
        let failed = failing(&f);
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0].0, "SB-K8S-001");
        assert!(failed[0].1.contains("RuntimeClass kata does not exist"));

        let mut platform = all_there();
        platform.service_account = Some(Found::Missing);
        let f = preflight_checks(&names(), &platform);
        let failed = failing(&f);
        assert_eq!(failed[0].0, "SB-K8S-002");
        assert!(failed[0].1.contains("protobot-system/protobot-sandbox"));

        let mut platform = all_there();
        platform.staging_claim = Found::Missing;
        let f = preflight_checks(&names(), &platform);
        assert_eq!(failing(&f)[0].0, "SB-K8S-003");
        let mut platform = all_there();
        platform.staging_claim = Found::Present(Some("Lost".into()));
        let f = preflight_checks(&names(), &platform);
        assert!(failing(&f)[0].1.contains("is Lost"));

        let mut n = names();
        n.probe_image = None;
        let f = preflight_checks(&n, &all_there());
        let failed = failing(&f);
        assert_eq!(failed[0].0, "SB-K8S-004");
        assert!(failed[0].1.contains("--sandbox-image"));
    }

    #[test]
    fn a_pending_claim_is_usable_and_an_unreadable_object_is_not() {
        let mut platform = all_there();
        platform.staging_claim = Found::Present(Some("Pending".into()));
        assert!(failing(&preflight_checks(&names(), &platform)).is_empty());
        platform.runtime_class = Found::Unknown("403 Forbidden".into());
        let f = preflight_checks(&names(), &platform);
        let failed = failing(&f);
        assert_eq!(failed.len(), 1);
        assert!(failed[0].1.contains("403 Forbidden"));
        assert!(failed[0].1.contains("runtimeclasses.node.k8s.io"));
    }

    #[test]
    fn a_profile_without_a_service_account_is_not_checked_for_one() {
        let mut n = names();
        n.service_account = None;
        let mut platform = all_there();
        platform.service_account = None;
        let checks = preflight_checks(&n, &platform);
        assert!(checks.iter().all(|c| c.id != "SB-K8S-002"));
        assert_eq!(checks.len(), 3);
    }
}
