//! Pure reading of a sandbox pod's status: has the run ended, and how
//! ([`Termination`]), or can it never start.

use k8s_openapi::api::core::v1::Pod;
use protobot_jobsite::executor::Termination;

use crate::manifest::CONTAINER;

/// What a pod's status says about its run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodOutcome {
    /// Not ended yet (pending, pulling, running).
    Pending,
    /// The run ended.
    Ended(Termination),
    /// The sandbox can never start (bad image name, unbuildable container
    /// config, eviction for a reason other than a limit): why.
    CannotStart(String),
}

/// Waiting reasons that never resolve by themselves.
const FATAL_WAITING: [&str; 5] = [
    "CreateContainerConfigError",
    "CreateContainerError",
    "InvalidImageName",
    "ErrImageNeverPull",
    "RunContainerError",
];

/// Reads `pod`'s status (a pod without the in-guest supervisor).
pub fn outcome(pod: &Pod) -> PodOutcome {
    outcome_with(pod, false)
}

/// `128 + SIGXCPU`: how a shell (or the supervisor as PID 1) reports a command the
/// CPU-time limit ended.
pub const EXIT_SIGXCPU: i32 = 128 + 24;
/// `128 + SIGXFSZ`: the same for the file-size limit.
pub const EXIT_SIGXFSZ: i32 = 128 + 25;

/// Reads `pod`'s status. With `supervised` (the role ran through `protobot sandbox
/// supervise`), exit codes [`EXIT_SIGXCPU`] and [`EXIT_SIGXFSZ`] are the guest's CPU-time
/// and file-size limits (a command that deliberately exits with them is
/// indistinguishable, as with any shell). SIGXCPU and SIGXFSZ reported as signals are
/// those limits either way.
pub fn outcome_with(pod: &Pod, supervised: bool) -> PodOutcome {
    let Some(status) = &pod.status else {
        return PodOutcome::Pending;
    };
    if status.reason.as_deref() == Some("DeadlineExceeded") {
        return PodOutcome::Ended(Termination::LimitExceeded {
            limit: "wall-clock".into(),
        });
    }
    let container = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == CONTAINER);
    let state = container.and_then(|c| c.state.as_ref());
    // With `restartPolicy: Never` the phase turns terminal once the container
    // has terminated; the pod's reason (`DeadlineExceeded`) may arrive with
    // that later update, so a terminated container alone is not the end yet.
    let terminal = matches!(status.phase.as_deref(), Some("Failed" | "Succeeded"));
    if let Some(t) = state
        .and_then(|s| s.terminated.as_ref())
        .filter(|_| terminal)
    {
        return PodOutcome::Ended(match (t.reason.as_deref(), t.signal) {
            (Some("OOMKilled"), _) => Termination::LimitExceeded {
                limit: "memory".into(),
            },
            (_, Some(24)) => Termination::LimitExceeded {
                limit: "cpu".into(),
            },
            (_, Some(25)) => Termination::LimitExceeded {
                limit: "file-size".into(),
            },
            (_, Some(signal)) if signal > 0 => Termination::Signaled { signal },
            _ if supervised && t.exit_code == EXIT_SIGXCPU => Termination::LimitExceeded {
                limit: "cpu".into(),
            },
            _ if supervised && t.exit_code == EXIT_SIGXFSZ => Termination::LimitExceeded {
                limit: "file-size".into(),
            },
            _ => Termination::Exited { code: t.exit_code },
        });
    }
    if let Some(w) = state.and_then(|s| s.waiting.as_ref())
        && let Some(reason) = w.reason.as_deref()
        && FATAL_WAITING.contains(&reason)
    {
        return PodOutcome::CannotStart(format!(
            "{reason}: {}",
            w.message.as_deref().unwrap_or("no message")
        ));
    }
    // An init container (the supervisor's delivery) that failed: the sandbox never ran.
    if let Some((name, t)) = status
        .init_container_statuses
        .iter()
        .flatten()
        .find_map(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .filter(|t| t.exit_code != 0)
                .map(|t| (c.name.as_str(), t))
        })
    {
        return PodOutcome::CannotStart(format!(
            "init container {name} exited with {}{}",
            t.exit_code,
            t.message
                .as_deref()
                .map(|m| format!(": {}", m.trim()))
                .unwrap_or_default()
        ));
    }
    match status.phase.as_deref() {
        Some("Failed") => {
            let reason = status.reason.as_deref().unwrap_or("Failed");
            let message = status.message.as_deref().unwrap_or("no message");
            if reason == "Evicted" && message.contains("ephemeral") {
                PodOutcome::Ended(Termination::LimitExceeded {
                    limit: "writable-disk".into(),
                })
            } else {
                PodOutcome::CannotStart(format!("pod failed ({reason}): {message}"))
            }
        }
        Some("Succeeded") => PodOutcome::Ended(Termination::Exited { code: 0 }),
        _ => PodOutcome::Pending,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "status": status
        }))
        .unwrap()
    }

    fn terminated(t: serde_json::Value) -> Pod {
        pod(json!({"phase": "Failed", "containerStatuses": [{
            "name": "sandbox", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": t}
        }]}))
    }

    #[test]
    fn a_pod_without_status_or_still_running_is_pending() {
        assert_eq!(outcome(&pod(json!(null))), PodOutcome::Pending);
        assert_eq!(
            outcome(&pod(json!({"phase": "Running"}))),
            PodOutcome::Pending
        );
    }

    #[test]
    fn a_failed_init_container_means_the_sandbox_cannot_start() {
        let p = pod(json!({"phase": "Failed", "initContainerStatuses": [{
            "name": "install-supervisor", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 127, "message": "no such file"}}
        }]}));
        match outcome(&p) {
            PodOutcome::CannotStart(why) => {
                assert!(
                    why.contains("install-supervisor") && why.contains("127"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn supervised_exit_codes_of_the_guest_limits_map_to_limits() {
        let cpu = terminated(json!({"exitCode": 152, "reason": "Error"}));
        assert_eq!(
            outcome_with(&cpu, true),
            PodOutcome::Ended(Termination::LimitExceeded {
                limit: "cpu".into()
            })
        );
        assert_eq!(
            outcome_with(&cpu, false),
            PodOutcome::Ended(Termination::Exited { code: 152 }),
            "without the supervisor 152 is only an exit code"
        );
        let fsz = terminated(json!({"exitCode": 153, "reason": "Error"}));
        assert_eq!(
            outcome_with(&fsz, true),
            PodOutcome::Ended(Termination::LimitExceeded {
                limit: "file-size".into()
            })
        );
        let sig = terminated(json!({"exitCode": 0, "signal": 24, "reason": "Error"}));
        assert_eq!(
            outcome(&sig),
            PodOutcome::Ended(Termination::LimitExceeded {
                limit: "cpu".into()
            })
        );
    }

    #[test]
    fn terminated_containers_map_to_terminations() {
        assert_eq!(
            outcome(&terminated(json!({"exitCode": 3, "reason": "Error"}))),
            PodOutcome::Ended(Termination::Exited { code: 3 })
        );
        assert_eq!(
            outcome(&terminated(json!({"exitCode": 0, "reason": "Completed"}))),
            PodOutcome::Ended(Termination::Exited { code: 0 })
        );
        assert_eq!(
            outcome(&terminated(json!({"exitCode": 137, "reason": "OOMKilled"}))),
            PodOutcome::Ended(Termination::LimitExceeded {
                limit: "memory".into()
            })
        );
        assert_eq!(
            outcome(&terminated(json!({"exitCode": 0, "signal": 9}))),
            PodOutcome::Ended(Termination::Signaled { signal: 9 })
        );
    }

    #[test]
    fn a_terminated_container_ends_the_run_only_once_the_phase_is_terminal() {
        let mut p = terminated(json!({"exitCode": 137, "reason": "Error"}));
        if let Some(s) = p.status.as_mut() {
            s.phase = Some("Running".into());
        }
        assert_eq!(outcome(&p), PodOutcome::Pending);
    }

    #[test]
    fn deadline_exceeded_is_the_wall_clock_limit_even_with_a_killed_container() {
        let mut p = terminated(json!({"exitCode": 137, "reason": "Error"}));
        if let Some(s) = p.status.as_mut() {
            s.reason = Some("DeadlineExceeded".into());
        }
        assert_eq!(
            outcome(&p),
            PodOutcome::Ended(Termination::LimitExceeded {
                limit: "wall-clock".into()
            })
        );
    }

    #[test]
    fn unstartable_and_evicted_pods() {
        let p = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "sandbox", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "InvalidImageName", "message": "bad ref"}}
        }]}));
        assert_eq!(
            outcome(&p),
            PodOutcome::CannotStart("InvalidImageName: bad ref".into())
        );
        let p = pod(json!({"phase": "Pending", "containerStatuses": [{
            "name": "sandbox", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}
        }]}));
        assert_eq!(outcome(&p), PodOutcome::Pending);
        let p = pod(json!({"phase": "Failed", "reason": "Evicted",
            "message": "Pod ephemeral local storage usage exceeds the total limit of containers 2Gi."}));
        assert_eq!(
            outcome(&p),
            PodOutcome::Ended(Termination::LimitExceeded {
                limit: "writable-disk".into()
            })
        );
        let p = pod(
            json!({"phase": "Failed", "reason": "Evicted", "message": "node had memory pressure"}),
        );
        assert!(matches!(outcome(&p), PodOutcome::CannotStart(_)));
    }
}
