//! The sandbox audit chain of jobsite-sandbox/v1 (contract §2.9): per session, a SHA-256 hash
//! chain of private events.
//!
//! - `event_digest` is the digest of the event's canonical JSON with `event_digest` left out;
//!   `previous_digest` is the prior event's digest, and the first event's is the SHA-256 of
//!   empty input. Digests are written `sha256:<hex>`.
//! - The canonical JSON is what Go's `encoding/json` writes for the reference struct: fields in
//!   declaration order, `omitempty` fields dropped when empty, no spaces, and HTML-safe
//!   escaping (`<`, `>`, `&`, U+2028 and U+2029 as `\uXXXX`). [`canonical_json`] reproduces it
//!   byte for byte, so a chain written here verifies with the reference implementation.
//! - [`verify_audit_chain`] checks the sequence numbers, the links and every digest: moving,
//!   dropping or editing any event breaks it.
//!
//! Pure: executors build chains with [`AuditChain`] and keep them as private Job Site evidence
//! (never repository content, never a WMS resource). Events never hold credentials, remote
//! URLs, peer source or raw Worker output.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::executor::{Limits, RunSpec, SandboxRole, Termination};

/// `contract_version` of every event.
pub const CONTRACT_VERSION: &str = "jobsite-sandbox/v1";
/// The decision of an allowed action.
pub const ACCEPT: &str = "accept";
/// The decision of a denied action.
pub const REJECT: &str = "reject";

/// Event types (§2.9).
pub mod event_type {
    /// A session (run) was opened.
    pub const OPEN: &str = "sandbox.open";
    /// A command ran.
    pub const EXEC: &str = "sandbox.exec";
    /// A path was read.
    pub const READ: &str = "sandbox.read";
    /// A path was written.
    pub const WRITE: &str = "sandbox.write";
    /// A git command ran.
    pub const GIT: &str = "sandbox.git";
    /// A network request was decided.
    pub const NETWORK: &str = "sandbox.network";
    /// A denial (used as the `action` of denials).
    pub const DENY: &str = "sandbox.deny";
    /// A resource limit ended or refused something.
    pub const LIMIT: &str = "sandbox.limit";
    /// The session was cancelled.
    pub const CANCEL: &str = "sandbox.cancel";
    /// The session's workspace was removed.
    pub const CLEANUP: &str = "sandbox.cleanup";
}

/// One audit event. Field order is the canonical order; do not reorder.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxAuditEvent {
    /// 1-based position in the chain.
    pub sequence: u64,
    /// One of [`event_type`].
    pub event_type: String,
    /// [`CONTRACT_VERSION`].
    pub contract_version: String,
    /// Backend name (`bubblewrap`, `kubernetes`).
    pub backend_name: String,
    /// Backend version.
    pub backend_version: String,
    /// Version of the policy the session enforces.
    pub policy_version: i64,
    /// Digest of that policy.
    pub policy_digest: String,
    /// Executable involved, if any.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub executable: String,
    /// Its digest, if known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub executable_digest: String,
    /// [`ACCEPT`] or [`REJECT`].
    pub decision: String,
    /// Why it was rejected.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub rejection_reason: String,
    /// The work item (the only WMS identity in audit).
    pub work_item: String,
    /// The role.
    pub role: String,
    /// The trace the session belongs to.
    pub trace_id: String,
    /// The build cycle.
    pub cycle: i64,
    /// The action (for denials: what was denied).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub action: String,
    /// What the action was applied to.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub target: String,
    /// The limit involved (`wall-clock`, `memory`, …).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub limit_name: String,
    /// That limit's configured value.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub limit_configured: String,
    /// How cleanup went.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cleanup_result: String,
    /// The previous event's digest ([`zero_digest`] for the first).
    pub previous_digest: String,
    /// This event's digest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub event_digest: String,
}

/// The `previous_digest` of a chain's first event: SHA-256 of empty input.
pub fn zero_digest() -> String {
    sha256_digest(b"")
}

fn sha256_digest(bytes: &[u8]) -> String {
    let hash = Sha256::digest(bytes);
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for byte in hash {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// The canonical JSON of `event` as Go's `encoding/json` writes it (see the module docs).
pub fn canonical_json(event: &SandboxAuditEvent) -> String {
    // Serializing a struct of strings and integers cannot fail.
    let plain = serde_json::to_string(event).unwrap_or_default();
    // These characters only occur inside JSON strings, so replacing them everywhere is exact.
    let mut out = String::with_capacity(plain.len());
    for c in plain.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// The digest of `event` (computed with its `event_digest` left out).
pub fn event_digest(event: &SandboxAuditEvent) -> String {
    let mut unsealed = event.clone();
    unsealed.event_digest.clear();
    sha256_digest(canonical_json(&unsealed).as_bytes())
}

/// A chain being written; [`AuditChain::append`] numbers, links and seals each event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuditChain {
    events: Vec<SandboxAuditEvent>,
}

impl AuditChain {
    /// An empty chain.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `event`, setting its `sequence`, `previous_digest` and `event_digest`.
    pub fn append(&mut self, mut event: SandboxAuditEvent) -> &SandboxAuditEvent {
        event.sequence = self.events.len() as u64 + 1;
        event.previous_digest = self
            .events
            .last()
            .map_or_else(zero_digest, |e| e.event_digest.clone());
        event.event_digest = event_digest(&event);
        self.events.push(event);
        &self.events[self.events.len() - 1]
    }

    /// The last event's digest (the report's `audit_head`).
    pub fn head(&self) -> Option<&str> {
        self.events.last().map(|e| e.event_digest.as_str())
    }

    /// The events, in order.
    pub fn events(&self) -> &[SandboxAuditEvent] {
        &self.events
    }

    /// The events, in order.
    pub fn into_events(self) -> Vec<SandboxAuditEvent> {
        self.events
    }
}

/// Why a chain does not verify.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuditChainError {
    /// An event is out of place.
    #[error("audit event {index} has sequence {found}; events were removed, added or reordered")]
    Sequence {
        /// 0-based position.
        index: usize,
        /// Its `sequence`.
        found: u64,
    },
    /// An event does not link to the one before it.
    #[error(
        "audit event {sequence} does not link to the event before it; the chain was cut or reordered"
    )]
    Link {
        /// Its `sequence`.
        sequence: u64,
    },
    /// An event's content does not match its digest.
    #[error("audit event {sequence} does not match its digest; it was edited after it was sealed")]
    Digest {
        /// Its `sequence`.
        sequence: u64,
    },
}

/// Verifies a chain (contract `VerifyAuditChain`): `sequence == index + 1`, each
/// `previous_digest` is the prior event's digest (the zero digest first), and each event's
/// digest matches its content. An empty chain verifies.
pub fn verify_audit_chain(events: &[SandboxAuditEvent]) -> Result<(), AuditChainError> {
    let mut previous = zero_digest();
    for (index, event) in events.iter().enumerate() {
        if event.sequence != index as u64 + 1 {
            return Err(AuditChainError::Sequence {
                index,
                found: event.sequence,
            });
        }
        if event.previous_digest != previous {
            return Err(AuditChainError::Link {
                sequence: event.sequence,
            });
        }
        if event.event_digest != event_digest(event) {
            return Err(AuditChainError::Digest {
                sequence: event.sequence,
            });
        }
        previous.clone_from(&event.event_digest);
    }
    Ok(())
}

/// What a backend observed of one session (one run), to be mapped onto the v1 events.
#[derive(Debug, Clone)]
pub struct SessionRecord<'a> {
    /// Backend name.
    pub backend_name: &'a str,
    /// Backend version.
    pub backend_version: &'a str,
    /// The sandbox profile the session ran under.
    pub profile: &'a str,
    /// The run.
    pub spec: &'a RunSpec,
    /// How it ended; `None` when it never started (the start was refused).
    pub termination: Option<&'a Termination>,
    /// Removing the session's workspace: `Ok` or what went wrong.
    pub cleanup: Result<(), String>,
}

/// The policy a run is held to, as its digest covers it.
#[derive(Serialize)]
struct EnforcedPolicy<'a> {
    profile: &'a str,
    role: SandboxRole,
    limits: &'a Limits,
    egress: bool,
}

/// Version of [`policy_digest`]'s input.
pub const POLICY_VERSION: i64 = 1;

/// Digest of the policy `spec` runs under in `profile`: its role, limits and whether it has
/// egress. Two runs with the same digest were held to the same rules.
pub fn policy_digest(profile: &str, spec: &RunSpec) -> String {
    let policy = EnforcedPolicy {
        profile,
        role: spec.role,
        limits: &spec.limits,
        egress: spec.egress_proxy.is_some(),
    };
    sha256_digest(
        serde_json::to_string(&policy)
            .unwrap_or_default()
            .as_bytes(),
    )
}

/// The configured value of `limit` in `limits`, as events record it.
fn configured(limits: &Limits, limit: &str) -> String {
    match limit {
        "wall-clock" | "lease" => format!("{}ms", limits.wall_clock.as_millis()),
        "cpu" => format!("{}ms", limits.cpu.as_millis()),
        "memory" => format!("{} bytes", limits.memory_bytes),
        "process-count" => limits.processes.to_string(),
        "file-size" | "writable-disk" => format!("{} bytes", limits.file_size_bytes),
        "open-files" => limits.open_files.to_string(),
        _ => "backend-defined".to_owned(),
    }
}

/// Maps one session onto its audit chain: `sandbox.open`, the network decision (`accept`
/// through the egress proxy, else `reject`), `sandbox.exec` of the harness, then
/// `sandbox.limit` or `sandbox.cancel` if that is how it ended, and `sandbox.cleanup`.
/// Never records the proxy's address, the task or any output.
pub fn session_chain(session: &SessionRecord<'_>) -> AuditChain {
    let spec = session.spec;
    let base = SandboxAuditEvent {
        contract_version: CONTRACT_VERSION.to_owned(),
        backend_name: session.backend_name.to_owned(),
        backend_version: session.backend_version.to_owned(),
        policy_version: POLICY_VERSION,
        policy_digest: policy_digest(session.profile, spec),
        decision: ACCEPT.to_owned(),
        work_item: spec.audit.work_item.clone(),
        role: spec.role.as_str().to_owned(),
        trace_id: spec.audit.trace_id.clone(),
        cycle: i64::from(spec.audit.cycle),
        ..SandboxAuditEvent::default()
    };
    let event = |event_type: &str| SandboxAuditEvent {
        event_type: event_type.to_owned(),
        ..base.clone()
    };
    let mut chain = AuditChain::new();
    chain.append(SandboxAuditEvent {
        target: "/workspace".to_owned(),
        ..event(event_type::OPEN)
    });
    chain.append(if spec.egress_proxy.is_some() {
        SandboxAuditEvent {
            target: "egress-proxy".to_owned(),
            ..event(event_type::NETWORK)
        }
    } else {
        SandboxAuditEvent {
            decision: REJECT.to_owned(),
            rejection_reason: "no egress for this run: no network at all".to_owned(),
            action: event_type::DENY.to_owned(),
            target: "network".to_owned(),
            ..event(event_type::NETWORK)
        }
    });
    let executable = spec.command.first().cloned().unwrap_or_default();
    match session.termination {
        None => {
            chain.append(SandboxAuditEvent {
                executable,
                decision: REJECT.to_owned(),
                rejection_reason: "the run did not start".to_owned(),
                action: event_type::DENY.to_owned(),
                ..event(event_type::EXEC)
            });
        }
        Some(termination) => {
            chain.append(SandboxAuditEvent {
                executable,
                action: "run".to_owned(),
                ..event(event_type::EXEC)
            });
            match termination {
                Termination::LimitExceeded { limit } => {
                    chain.append(SandboxAuditEvent {
                        decision: REJECT.to_owned(),
                        rejection_reason: format!("the {limit} limit was reached"),
                        limit_name: limit.clone(),
                        limit_configured: configured(&spec.limits, limit),
                        ..event(event_type::LIMIT)
                    });
                }
                Termination::Cancelled => {
                    chain.append(event(event_type::CANCEL));
                }
                Termination::Exited { .. } | Termination::Signaled { .. } => {}
            }
        }
    }
    chain.append(match &session.cleanup {
        Ok(()) => SandboxAuditEvent {
            cleanup_result: "removed".to_owned(),
            ..event(event_type::CLEANUP)
        },
        Err(reason) => SandboxAuditEvent {
            decision: REJECT.to_owned(),
            cleanup_result: format!("failed: {reason}"),
            ..event(event_type::CLEANUP)
        },
    });
    chain
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str) -> SandboxAuditEvent {
        SandboxAuditEvent {
            event_type: kind.into(),
            contract_version: CONTRACT_VERSION.into(),
            backend_name: "bubblewrap".into(),
            backend_version: "0.8.0".into(),
            policy_version: 1,
            policy_digest: "sha256:00".into(),
            decision: ACCEPT.into(),
            work_item: "wi-1".into(),
            role: "worker-b".into(),
            trace_id: "trace-1".into(),
            cycle: 2,
            ..SandboxAuditEvent::default()
        }
    }

    #[test]
    fn the_zero_digest_is_sha256_of_nothing() {
        assert_eq!(
            zero_digest(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn canonical_json_is_what_go_writes() {
        let mut e = event(event_type::EXEC);
        e.sequence = 1;
        e.executable = "/bin/sh <x> & y\u{2028}".into();
        e.previous_digest = zero_digest();
        // Declaration order, omitempty fields dropped, no spaces, HTML-safe escaping,
        // control characters as Go 1.22+ writes them.
        e.target = "a\tb\u{1}\"\\".into();
        assert_eq!(
            canonical_json(&e),
            concat!(
                r#"{"sequence":1,"event_type":"sandbox.exec","contract_version":"jobsite-sandbox/v1","#,
                r#""backend_name":"bubblewrap","backend_version":"0.8.0","policy_version":1,"#,
                r#""policy_digest":"sha256:00","executable":"/bin/sh \u003cx\u003e \u0026 y\u2028","#,
                r#""decision":"accept","work_item":"wi-1","role":"worker-b","trace_id":"trace-1","#,
                r#""cycle":2,"target":"a\tb\u0001\"\\","#,
                r#""previous_digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}"#
            )
        );
    }

    #[test]
    fn a_digest_is_sha256_of_the_canonical_json_without_the_digest() {
        let mut chain = AuditChain::new();
        let first = chain.append(event(event_type::OPEN)).clone();
        // Computed independently: printf '%s' "$json" | sha256sum.
        let json = r#"{"sequence":1,"event_type":"sandbox.open","contract_version":"jobsite-sandbox/v1","backend_name":"bubblewrap","backend_version":"0.8.0","policy_version":1,"policy_digest":"sha256:00","decision":"accept","work_item":"wi-1","role":"worker-b","trace_id":"trace-1","cycle":2,"previous_digest":"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}"#;
        assert_eq!(
            canonical_json(&SandboxAuditEvent {
                event_digest: String::new(),
                ..first.clone()
            }),
            json
        );
        assert_eq!(first.event_digest, sha256_digest(json.as_bytes()));
        assert_eq!(first.event_digest, EXPECTED_FIRST_DIGEST);
    }

    /// `printf '%s' '<the json above>' | sha256sum`
    const EXPECTED_FIRST_DIGEST: &str =
        "sha256:f90e1a003d09c0f9084575aa7ae3eea113aa585976f5c37fd6f316c769004f0f";

    fn sample_chain() -> Vec<SandboxAuditEvent> {
        let mut chain = AuditChain::new();
        chain.append(event(event_type::OPEN));
        let mut exec = event(event_type::EXEC);
        exec.executable = "/usr/bin/harness".into();
        chain.append(exec);
        let mut limit = event(event_type::LIMIT);
        limit.decision = REJECT.into();
        limit.limit_name = "wall-clock".into();
        limit.limit_configured = "30s".into();
        chain.append(limit);
        let mut cleanup = event(event_type::CLEANUP);
        cleanup.cleanup_result = "removed".into();
        chain.append(cleanup);
        assert_eq!(
            chain.head(),
            chain.events().last().map(|e| e.event_digest.as_str())
        );
        chain.into_events()
    }

    #[test]
    fn a_written_chain_verifies_and_links_each_event_to_the_one_before() {
        let events = sample_chain();
        assert_eq!(verify_audit_chain(&events), Ok(()));
        assert_eq!(verify_audit_chain(&[]), Ok(()));
        assert_eq!(events[0].previous_digest, zero_digest());
        for pair in events.windows(2) {
            assert_eq!(pair[1].previous_digest, pair[0].event_digest);
            assert_eq!(pair[1].sequence, pair[0].sequence + 1);
        }
        // It round-trips through JSON (how executors keep it).
        let text = serde_json::to_string(&events).unwrap();
        let back: Vec<SandboxAuditEvent> = serde_json::from_str(&text).unwrap();
        assert_eq!(verify_audit_chain(&back), Ok(()));
    }

    #[test]
    fn editing_dropping_or_reordering_an_event_breaks_verification() {
        let events = sample_chain();
        // SB-AUD-003: the first decision forged.
        let mut forged = events.clone();
        forged[0].decision = "forged".into();
        assert_eq!(
            verify_audit_chain(&forged),
            Err(AuditChainError::Digest { sequence: 1 })
        );
        // Any field, including ones left out when empty.
        let mut added = events.clone();
        added[2].rejection_reason = "x".into();
        assert_eq!(
            verify_audit_chain(&added),
            Err(AuditChainError::Digest { sequence: 3 })
        );
        // Re-sealing an edited event does not help: the next link breaks.
        let mut resealed = events.clone();
        resealed[1].executable = "/tmp/evil".into();
        resealed[1].event_digest = event_digest(&resealed[1]);
        assert_eq!(
            verify_audit_chain(&resealed),
            Err(AuditChainError::Link { sequence: 3 })
        );
        let mut dropped = events.clone();
        dropped.remove(1);
        assert_eq!(
            verify_audit_chain(&dropped),
            Err(AuditChainError::Sequence { index: 1, found: 3 })
        );
        let mut swapped = events.clone();
        swapped.swap(1, 2);
        assert!(verify_audit_chain(&swapped).is_err());
        let mut renumbered = events;
        renumbered.remove(0);
        for (i, e) in renumbered.iter_mut().enumerate() {
            e.sequence = i as u64 + 1;
            e.event_digest = event_digest(e);
        }
        assert_eq!(
            verify_audit_chain(&renumbered),
            Err(AuditChainError::Link { sequence: 1 })
        );
    }

    fn spec(egress: bool) -> RunSpec {
        RunSpec {
            run_id: "wi-1-c2-b".into(),
            role: SandboxRole::WorkerB,
            workspace: "/nonexistent".into(),
            task: serde_json::json!({"secret-looking": "task"}),
            command: vec!["/usr/bin/harness".into(), "--flag".into()],
            image: None,
            env: Default::default(),
            limits: Limits::default(),
            egress_proxy: egress.then(|| "http://proxy.internal:8080".to_owned()),
            audit: crate::executor::RunAudit {
                work_item: "wi-1".into(),
                cycle: 2,
                trace_id: "wi-1-c2-b".into(),
            },
            attribution: Default::default(),
        }
    }

    fn types(chain: &AuditChain) -> Vec<&str> {
        chain
            .events()
            .iter()
            .map(|e| e.event_type.as_str())
            .collect()
    }

    #[test]
    fn a_session_maps_onto_a_verifiable_chain_for_every_ending() {
        let limited = Termination::LimitExceeded {
            limit: "wall-clock".into(),
        };
        let cases = [
            (
                Some(Termination::Exited { code: 0 }),
                vec![
                    "sandbox.open",
                    "sandbox.network",
                    "sandbox.exec",
                    "sandbox.cleanup",
                ],
            ),
            (
                Some(limited),
                vec![
                    "sandbox.open",
                    "sandbox.network",
                    "sandbox.exec",
                    "sandbox.limit",
                    "sandbox.cleanup",
                ],
            ),
            (
                Some(Termination::Cancelled),
                vec![
                    "sandbox.open",
                    "sandbox.network",
                    "sandbox.exec",
                    "sandbox.cancel",
                    "sandbox.cleanup",
                ],
            ),
            (
                None,
                vec![
                    "sandbox.open",
                    "sandbox.network",
                    "sandbox.exec",
                    "sandbox.cleanup",
                ],
            ),
        ];
        for (termination, expected) in cases {
            let spec = spec(false);
            let chain = session_chain(&SessionRecord {
                backend_name: "bubblewrap",
                backend_version: "0.8.0",
                profile: "local",
                spec: &spec,
                termination: termination.as_ref(),
                cleanup: Ok(()),
            });
            assert_eq!(types(&chain), expected, "{termination:?}");
            assert_eq!(verify_audit_chain(chain.events()), Ok(()));
            for e in chain.events() {
                assert_eq!(
                    (e.work_item.as_str(), e.trace_id.as_str(), e.cycle),
                    ("wi-1", "wi-1-c2-b", 2)
                );
                assert_eq!(
                    (e.role.as_str(), e.contract_version.as_str()),
                    ("worker-b", CONTRACT_VERSION)
                );
                assert_eq!(e.policy_digest, policy_digest("local", &spec));
            }
            if let Some(limit) = chain
                .events()
                .iter()
                .find(|e| e.event_type == event_type::LIMIT)
            {
                assert_eq!(
                    (limit.decision.as_str(), limit.limit_name.as_str()),
                    (REJECT, "wall-clock")
                );
                assert_eq!(limit.limit_configured, "600000ms");
            }
            let exec = &chain.events()[2];
            assert_eq!(exec.executable, "/usr/bin/harness");
            assert_eq!(
                exec.decision,
                if termination.is_some() {
                    ACCEPT
                } else {
                    REJECT
                }
            );
        }
    }

    #[test]
    fn the_network_decision_and_cleanup_are_recorded_without_addresses() {
        let spec = spec(true);
        let chain = session_chain(&SessionRecord {
            backend_name: "kubernetes",
            backend_version: "v1",
            profile: "kata",
            spec: &spec,
            termination: Some(&Termination::Exited { code: 1 }),
            cleanup: Err("pod still terminating".into()),
        });
        let network = &chain.events()[1];
        assert_eq!(
            (network.decision.as_str(), network.target.as_str()),
            (ACCEPT, "egress-proxy")
        );
        let cleanup = chain.events().last().unwrap();
        assert_eq!(cleanup.decision, REJECT);
        assert!(cleanup.cleanup_result.contains("pod still terminating"));
        let text = serde_json::to_string(chain.events()).unwrap();
        assert!(
            !text.contains("proxy.internal") && !text.contains("secret-looking"),
            "{text}"
        );
        // A different policy (egress, profile) has a different digest.
        assert_ne!(
            policy_digest("kata", &spec),
            policy_digest("kata", &self::spec(false))
        );
        assert_ne!(policy_digest("kata", &spec), policy_digest("local", &spec));
    }
}
