//! The egress decision: a pure function of the policy, the request and which
//! credentials the broker holds. No I/O, no clock, no logging: the broker
//! records what this returns.
//!
//! The checks run in the order of jobsite-sandbox/v1's network decision order
//! and the first failing one is the reason:
//!
//! 1. the executable (with its digest) is approved for the session's role;
//! 2. the protocol and method are ones the proxy understands;
//! 3. no direct IP (loopback names, IP literals in any notation);
//! 4. no DNS (`dns` protocol, `dns-` destination prefix);
//! 5. no raw sockets (`tcp`, `udp`, `raw`);
//! 6. no port other than 443;
//! 7. no plaintext `http`, no `CONNECT` tunnel, no `/tls-bypass` path;
//! 8. a rule matches exactly (role, digest, destination, method, path);
//! 9. the broker holds the rule's credential, else `sandbox.fail_closed`.
//!
//! Step 2 differs from the upstream wording ("protocol https and method
//! GET"): rules here may allow other methods, and refusing every non-`https`
//! protocol there would make steps 4, 5 and 7 unreachable and their more
//! specific reasons useless. So step 2 only refuses protocols and methods the
//! proxy has no later step for; `https` is still the only protocol that can
//! pass, because steps 4, 5 and 7 refuse the others.

use serde::Serialize;

use crate::{
    address::{is_direct_ip, split_authority},
    policy::{EgressPolicy, RULE_METHODS, Rule},
};

/// Protocols a request may claim; all but `https` are refused by a later step.
pub const KNOWN_PROTOCOLS: [&str; 6] = ["https", "http", "dns", "tcp", "udp", "raw"];

/// What the sandbox asked for, as the broker understood it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressRequest {
    /// The session's sandboxed role.
    pub role: String,
    /// The attested executable's digest (`sha256:…`), if any.
    pub executable_digest: Option<String>,
    /// Lowercase protocol (`https` for the base-URL form, else the scheme).
    pub protocol: String,
    /// The HTTP method as sent.
    pub method: String,
    /// The authority as sent (`host`, `host:port`, `[v6]:port`).
    pub destination: String,
    /// The path without query string.
    pub path: String,
}

/// Which credentials the broker can inject.
pub trait CredentialPresence {
    /// Whether a credential called `name` is loaded.
    fn has(&self, name: &str) -> bool;
}

impl CredentialPresence for std::collections::BTreeSet<String> {
    fn has(&self, name: &str) -> bool {
        self.contains(name)
    }
}

/// `allowed` or `denied` (the label of `protobot_egress_decisions_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Forwarded upstream.
    Allowed,
    /// Refused (including fail-closed).
    Denied,
}

impl Outcome {
    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
        }
    }
}

/// The contract's error code of a denial.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Code {
    /// `sandbox.denied`: the policy forbids it.
    #[serde(rename = "sandbox.denied")]
    Denied,
    /// `sandbox.fail_closed`: the policy would allow it, but the broker cannot
    /// enforce it safely (its credential is missing).
    #[serde(rename = "sandbox.fail_closed")]
    FailClosed,
}

impl Code {
    /// `sandbox.denied` or `sandbox.fail_closed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Code::Denied => "sandbox.denied",
            Code::FailClosed => "sandbox.fail_closed",
        }
    }
}

/// Stable machine reasons (log field, JSON `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A rule matched.
    RuleMatched,
    /// Step 1: no rule admits this executable for this role.
    ExecutableNotApproved,
    /// Step 2: protocol unknown.
    UnsupportedProtocol,
    /// Step 2: method unknown or never allowed (`TRACE`, …).
    UnsupportedMethod,
    /// Step 3.
    DirectIp,
    /// Step 4.
    Dns,
    /// Step 5.
    RawSocket,
    /// Step 6.
    AlternatePort,
    /// Step 7: plaintext upstream.
    PlaintextHttp,
    /// Step 7: `CONNECT` or `/tls-bypass`.
    TlsBypass,
    /// Step 8.
    NoMatchingRule,
    /// Step 9.
    CredentialUnavailable,
    /// Broker: no or unknown `X-Sandbox-Session-Token` (401).
    Unauthenticated,
    /// Broker: the caller sent its own `Authorization` (403).
    CallerAuthorization,
    /// Broker: an `X-Sandbox-Exec-Token` that does not attest the digest.
    ExecutableAttestationInvalid,
    /// Broker: the request target could not be read as any request form.
    MalformedRequest,
    /// Broker: the request body is larger than the broker forwards.
    RequestTooLarge,
    /// Broker: the upstream answered with a redirect (never followed).
    UpstreamRedirect,
    /// Broker: the upstream sent a compressed or otherwise encoded body,
    /// which could hide a credential from the scrubber.
    UpstreamEncoding,
    /// Broker: the request body did not arrive within the body timeout (408).
    RequestTimeout,
}

impl Reason {
    /// The stable string.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::RuleMatched => "rule-matched",
            Reason::ExecutableNotApproved => "executable-not-approved",
            Reason::UnsupportedProtocol => "unsupported-protocol",
            Reason::UnsupportedMethod => "unsupported-method",
            Reason::DirectIp => "direct-ip",
            Reason::Dns => "dns",
            Reason::RawSocket => "raw-socket",
            Reason::AlternatePort => "alternate-port",
            Reason::PlaintextHttp => "plaintext-http",
            Reason::TlsBypass => "tls-bypass",
            Reason::NoMatchingRule => "no-matching-rule",
            Reason::CredentialUnavailable => "credential-unavailable",
            Reason::Unauthenticated => "unauthenticated",
            Reason::CallerAuthorization => "caller-authorization",
            Reason::ExecutableAttestationInvalid => "executable-attestation-invalid",
            Reason::MalformedRequest => "malformed-request",
            Reason::RequestTooLarge => "request-too-large",
            Reason::UpstreamRedirect => "upstream-redirect",
            Reason::UpstreamEncoding => "upstream-encoding",
            Reason::RequestTimeout => "request-timeout",
        }
    }
}

/// What the broker may do: reach `host` (port 443, HTTPS) with `credential`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// Index of the matching rule in the policy.
    pub rule: usize,
    /// The normalised upstream host.
    pub host: String,
    /// The credential to inject, if the rule names one.
    pub credential: Option<String>,
}

/// A refusal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// The contract code.
    pub code: Code,
    /// The stable reason.
    pub reason: Reason,
    /// One sentence for humans; names the request, never a credential.
    pub detail: String,
}

impl Denial {
    /// A `sandbox.denied` denial.
    pub fn denied(reason: Reason, detail: impl Into<String>) -> Denial {
        Denial {
            code: Code::Denied,
            reason,
            detail: detail.into(),
        }
    }
}

/// The decision on one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Forward it.
    Allow(Grant),
    /// Refuse it.
    Deny(Denial),
}

impl Decision {
    /// `allowed` or `denied`.
    pub fn outcome(&self) -> Outcome {
        match self {
            Decision::Allow(_) => Outcome::Allowed,
            Decision::Deny(_) => Outcome::Denied,
        }
    }

    /// The stable reason.
    pub fn reason(&self) -> Reason {
        match self {
            Decision::Allow(_) => Reason::RuleMatched,
            Decision::Deny(d) => d.reason,
        }
    }
}

/// Decides `request` against `policy` (see the module docs for the order).
pub fn decide(
    policy: &EgressPolicy,
    request: &EgressRequest,
    credentials: &dyn CredentialPresence,
) -> Decision {
    match check(policy, request, credentials) {
        Ok(grant) => Decision::Allow(grant),
        Err(denial) => Decision::Deny(denial),
    }
}

fn deny(reason: Reason, detail: String) -> Result<Grant, Denial> {
    Err(Denial::denied(reason, detail))
}

fn executable_fits(rule: &Rule, request: &EgressRequest) -> bool {
    rule.role.as_deref().is_none_or(|r| r == request.role)
        && rule
            .executable_digest
            .as_deref()
            .is_none_or(|d| Some(d) == request.executable_digest.as_deref())
}

fn check(
    policy: &EgressPolicy,
    request: &EgressRequest,
    credentials: &dyn CredentialPresence,
) -> Result<Grant, Denial> {
    // 1. Executable identity.
    if !policy.rules().iter().any(|r| executable_fits(r, request)) {
        let who = request
            .executable_digest
            .as_deref()
            .unwrap_or("an unattested executable");
        return deny(
            Reason::ExecutableNotApproved,
            format!("{who} is not approved for egress in role {}", request.role),
        );
    }
    // 2. Protocol and method the proxy understands.
    if !KNOWN_PROTOCOLS.contains(&request.protocol.as_str()) {
        return deny(
            Reason::UnsupportedProtocol,
            format!(
                "protocol {:?} is not supported; use https",
                request.protocol
            ),
        );
    }
    if request.method != "CONNECT" && !RULE_METHODS.contains(&request.method.as_str()) {
        return deny(
            Reason::UnsupportedMethod,
            format!("method {:?} is never allowed", request.method),
        );
    }
    let authority = split_authority(&request.destination);
    // 3. Direct IP.
    if is_direct_ip(&authority.host) {
        return deny(
            Reason::DirectIp,
            format!(
                "{:?} is an IP address or loopback name; name the host",
                authority.host
            ),
        );
    }
    // 4. DNS.
    if request.protocol == "dns" || authority.host.starts_with("dns-") {
        return deny(
            Reason::Dns,
            format!("DNS to {:?} is not allowed from a sandbox", authority.host),
        );
    }
    // 5. Raw sockets.
    if matches!(request.protocol.as_str(), "tcp" | "udp" | "raw") {
        return deny(
            Reason::RawSocket,
            format!(
                "{} connections are not allowed; only HTTPS requests through the proxy",
                request.protocol
            ),
        );
    }
    // 6. Port.
    match &authority.port {
        None | Some(Ok(443)) => {}
        Some(Ok(port)) => {
            return deny(
                Reason::AlternatePort,
                format!("port {port} is not allowed; only 443"),
            );
        }
        Some(Err(port)) => {
            return deny(
                Reason::AlternatePort,
                format!("port {port:?} is not allowed; only 443"),
            );
        }
    }
    // 7. Plaintext or tunnels.
    if request.protocol == "http" {
        return deny(
            Reason::PlaintextHttp,
            "plaintext http upstream is not allowed; the proxy only speaks https upstream"
                .to_owned(),
        );
    }
    if request.method == "CONNECT" || request.path.starts_with("/tls-bypass") {
        return deny(
            Reason::TlsBypass,
            "tunnels are not allowed: send the request itself to the proxy".to_owned(),
        );
    }
    // 8. Exact rule.
    let found = policy.rules().iter().enumerate().find(|(_, r)| {
        executable_fits(r, request)
            && r.destination == authority.host
            && r.method == request.method
            && r.path == request.path
    });
    let Some((index, rule)) = found else {
        return deny(
            Reason::NoMatchingRule,
            format!(
                "no rule allows {} https://{}{} for role {}",
                request.method, authority.host, request.path, request.role
            ),
        );
    };
    // 9. Broker can enforce it.
    if let Some(name) = &rule.credential
        && !credentials.has(name)
    {
        return Err(Denial {
            code: Code::FailClosed,
            reason: Reason::CredentialUnavailable,
            detail: format!(
                "rule {index} needs credential {name:?}, which the broker does not hold"
            ),
        });
    }
    Ok(Grant {
        rule: index,
        host: authority.host,
        credential: rule.credential.clone(),
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::policy::PolicyDocument;

    const APPROVED: &str =
        "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const CURL: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn rule(method: &str, path: &str) -> Rule {
        Rule {
            executable_digest: Some(APPROVED.into()),
            role: Some("worker-b".into()),
            destination: "registry.example.invalid".into(),
            method: method.into(),
            path: path.into(),
            credential: Some("registry".into()),
        }
    }

    fn policy(rules: Vec<Rule>) -> EgressPolicy {
        EgressPolicy::new(PolicyDocument { rules }, "<test>").unwrap()
    }

    fn approved_request() -> EgressRequest {
        EgressRequest {
            role: "worker-b".into(),
            executable_digest: Some(APPROVED.into()),
            protocol: "https".into(),
            method: "GET".into(),
            destination: "registry.example.invalid".into(),
            path: "/v2/allowed".into(),
        }
    }

    fn held() -> BTreeSet<String> {
        BTreeSet::from(["registry".to_owned()])
    }

    fn run(req: &EgressRequest) -> Decision {
        decide(&policy(vec![rule("GET", "/v2/allowed")]), req, &held())
    }

    fn reason_of(f: impl FnOnce(&mut EgressRequest)) -> &'static str {
        let mut req = approved_request();
        f(&mut req);
        run(&req).reason().as_str()
    }

    #[test]
    fn the_approved_request_is_allowed_with_its_credential() {
        assert_eq!(
            run(&approved_request()),
            Decision::Allow(Grant {
                rule: 0,
                host: "registry.example.invalid".into(),
                credential: Some("registry".into()),
            })
        );
        // Case and an explicit :443 do not change the destination.
        let d = reason_of(|r| r.destination = "Registry.Example.Invalid:443".into());
        assert_eq!(d, "rule-matched");
    }

    #[test]
    fn an_empty_policy_denies_everything() {
        let d = decide(&policy(vec![]), &approved_request(), &held());
        assert_eq!(d.outcome(), Outcome::Denied);
        assert_eq!(d.reason(), Reason::ExecutableNotApproved);
    }

    #[test]
    fn step1_other_binary_or_no_attestation_or_other_role_is_not_approved() {
        assert_eq!(
            reason_of(|r| r.executable_digest = Some(CURL.into())),
            "executable-not-approved"
        );
        assert_eq!(
            reason_of(|r| r.executable_digest = None),
            "executable-not-approved"
        );
        assert_eq!(
            reason_of(|r| r.role = "worker-a".into()),
            "executable-not-approved"
        );
    }

    #[test]
    fn step1_a_digest_free_rule_admits_any_executable_of_the_role() {
        let mut r = rule("GET", "/v2/allowed");
        r.executable_digest = None;
        let mut req = approved_request();
        req.executable_digest = None;
        assert_eq!(
            decide(&policy(vec![r]), &req, &held()).outcome(),
            Outcome::Allowed
        );
    }

    #[test]
    fn step1_wins_over_every_later_step() {
        let d = reason_of(|r| {
            r.executable_digest = Some(CURL.into());
            r.protocol = "dns".into();
            r.destination = "127.0.0.1:8443".into();
            r.method = "TRACE".into();
        });
        assert_eq!(d, "executable-not-approved");
    }

    #[test]
    fn step2_unknown_protocols_and_methods_are_refused() {
        assert_eq!(
            reason_of(|r| r.protocol = "gopher".into()),
            "unsupported-protocol"
        );
        assert_eq!(
            reason_of(|r| r.method = "TRACE".into()),
            "unsupported-method"
        );
        assert_eq!(reason_of(|r| r.method = "get".into()), "unsupported-method");
        // Step 2 wins over direct IP.
        assert_eq!(
            reason_of(|r| {
                r.method = "TRACE".into();
                r.destination = "127.0.0.1".into();
            }),
            "unsupported-method"
        );
    }

    #[test]
    fn step3_every_direct_ip_form_is_refused() {
        for dest in [
            "127.0.0.1",
            "::1",
            "[::1]",
            "[::1]:443",
            "127.1",
            "2130706433",
            "0x7f000001",
            "0177.0.0.1",
            "localhost",
            "localhost:443",
        ] {
            assert_eq!(
                reason_of(|r| r.destination = dest.into()),
                "direct-ip",
                "{dest}"
            );
        }
        // Direct IP wins over DNS, raw sockets, port and http.
        assert_eq!(
            reason_of(|r| {
                r.destination = "127.0.0.1:53".into();
                r.protocol = "dns".into();
            }),
            "direct-ip"
        );
        assert_eq!(
            reason_of(|r| {
                r.destination = "10.0.0.1:80".into();
                r.protocol = "http".into();
            }),
            "direct-ip"
        );
    }

    #[test]
    fn step4_dns_protocol_or_prefix_is_refused() {
        assert_eq!(reason_of(|r| r.protocol = "dns".into()), "dns");
        assert_eq!(
            reason_of(|r| r.destination = "dns-tunnel.invalid".into()),
            "dns"
        );
        // DNS wins over raw sockets and ports.
        assert_eq!(
            reason_of(|r| {
                r.destination = "dns-tunnel.invalid:8443".into();
                r.protocol = "udp".into();
            }),
            "dns"
        );
    }

    #[test]
    fn step5_raw_sockets_are_refused() {
        for p in ["tcp", "udp", "raw"] {
            assert_eq!(reason_of(|r| r.protocol = p.into()), "raw-socket", "{p}");
        }
        assert_eq!(
            reason_of(|r| {
                r.protocol = "tcp".into();
                r.destination = "registry.example.invalid:22".into();
            }),
            "raw-socket"
        );
    }

    #[test]
    fn step6_ports_other_than_443_are_refused() {
        assert_eq!(
            reason_of(|r| r.destination = "registry.example.invalid:8443".into()),
            "alternate-port"
        );
        assert_eq!(
            reason_of(|r| r.destination = "registry.example.invalid:https".into()),
            "alternate-port"
        );
        // Port wins over plaintext http.
        assert_eq!(
            reason_of(|r| {
                r.destination = "registry.example.invalid:80".into();
                r.protocol = "http".into();
            }),
            "alternate-port"
        );
    }

    #[test]
    fn step7_http_connect_and_tls_bypass_are_refused() {
        assert_eq!(reason_of(|r| r.protocol = "http".into()), "plaintext-http");
        assert_eq!(reason_of(|r| r.method = "CONNECT".into()), "tls-bypass");
        assert_eq!(reason_of(|r| r.path = "/tls-bypass".into()), "tls-bypass");
        assert_eq!(reason_of(|r| r.path = "/tls-bypass/x".into()), "tls-bypass");
        // Plaintext wins over a missing rule.
        assert_eq!(
            reason_of(|r| {
                r.protocol = "http".into();
                r.path = "/v2/other".into();
            }),
            "plaintext-http"
        );
    }

    #[test]
    fn step8_anything_but_an_exact_match_is_refused() {
        for f in [
            (|r: &mut EgressRequest| r.destination = "evil.example.invalid".into())
                as fn(&mut EgressRequest),
            |r| r.method = "POST".into(),
            |r| r.path = "/v2/allowed/".into(),
            |r| r.path = "/v2/Allowed".into(),
            |r| r.path = "/v2/redirect".into(),
            |r| r.path = "/v2/allowed/../secret".into(),
            |r| r.destination = "registry.example.invalid.evil.example".into(),
        ] {
            assert_eq!(reason_of(f), "no-matching-rule");
        }
    }

    #[test]
    fn step8_role_and_digest_must_fit_the_same_rule() {
        // Worker A may GET /a with any executable; worker B only /v2/allowed with
        // the approved one. Worker B must not borrow worker A's path.
        let mut open = rule("GET", "/a");
        open.role = Some("worker-a".into());
        open.executable_digest = None;
        let p = policy(vec![open, rule("GET", "/v2/allowed")]);
        let mut req = approved_request();
        req.path = "/a".into();
        assert_eq!(decide(&p, &req, &held()).reason(), Reason::NoMatchingRule);
        req.role = "worker-a".into();
        req.executable_digest = None;
        assert_eq!(decide(&p, &req, &held()).outcome(), Outcome::Allowed);
    }

    #[test]
    fn step9_a_missing_credential_fails_closed() {
        let d = decide(
            &policy(vec![rule("GET", "/v2/allowed")]),
            &approved_request(),
            &BTreeSet::new(),
        );
        let Decision::Deny(denial) = d else {
            panic!("expected a denial")
        };
        assert_eq!(denial.code, Code::FailClosed);
        assert_eq!(denial.reason, Reason::CredentialUnavailable);
        // Fail-closed only happens after a rule matched.
        let d = decide(
            &policy(vec![rule("GET", "/v2/allowed")]),
            &EgressRequest {
                path: "/v2/other".into(),
                ..approved_request()
            },
            &BTreeSet::new(),
        );
        assert_eq!(d.reason(), Reason::NoMatchingRule);
    }

    #[test]
    fn a_rule_without_credential_needs_no_broker_secret() {
        let mut r = rule("GET", "/v2/allowed");
        r.credential = None;
        let d = decide(&policy(vec![r]), &approved_request(), &BTreeSet::new());
        assert!(matches!(
            d,
            Decision::Allow(Grant {
                credential: None,
                ..
            })
        ));
    }

    #[test]
    fn denials_carry_the_contract_codes() {
        let Decision::Deny(d) = run(&EgressRequest {
            protocol: "dns".into(),
            ..approved_request()
        }) else {
            panic!("expected a denial")
        };
        assert_eq!(d.code.as_str(), "sandbox.denied");
        assert_eq!(Code::FailClosed.as_str(), "sandbox.fail_closed");
        assert_eq!(
            serde_json::to_value(Code::FailClosed).unwrap(),
            serde_json::json!("sandbox.fail_closed")
        );
    }
}
