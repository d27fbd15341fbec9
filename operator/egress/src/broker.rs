//! The broker: one HTTP request from a sandbox in, at most one HTTPS request
//! upstream, one answer back, one decision recorded.
//!
//! Pipeline per request: authenticate the session (401) → refuse a
//! caller-supplied `Authorization` (403) → verify the optional executable
//! attestation → read the request form → [`decide`] → on allow, build the
//! upstream request, inject the credential, send it → refuse redirects and
//! encoded bodies → strip credentials from headers and body → answer. Every
//! request ends in exactly one `protobot::egress` event and one increment of
//! `protobot_egress_decisions_total`.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{
    HeaderMap, Request, Response, StatusCode, Uri,
    body::Incoming,
    header::{self, HeaderValue},
};
use serde::Serialize;

use crate::{
    credentials::CredentialStore,
    decide::{Code, Decision, Denial, EgressRequest, Grant, Outcome, Reason, decide},
    form::{Target, parse_target},
    meter::UsageMeter,
    metrics::{EgressMetrics, LimitKind},
    policy::EgressPolicy,
    redact::{forwardable_request_headers, scrub_body, scrub_text, strip_response_headers},
    session::{
        EXEC_DIGEST_HEADER, EXEC_TOKEN_HEADER, SESSION_TOKEN_HEADER, Session, SessionRegistry,
        exec_token, tokens_equal,
    },
    upstream::Upstream,
    usage::ModelApi,
};

/// Size and time limits of one exchange.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Largest request body forwarded.
    pub max_request_body: usize,
    /// Largest response body returned (bodies are buffered to be scrubbed).
    pub max_response_body: usize,
    /// Whole upstream exchange, body included.
    pub upstream_timeout: Duration,
    /// How long the sandbox may take to send the whole request body.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_request_body: 16 << 20,
            max_response_body: 64 << 20,
            upstream_timeout: Duration::from_secs(300),
            body_timeout: Duration::from_secs(30),
        }
    }
}

/// Everything a request is handled with.
#[derive(Clone, Debug)]
struct Inner {
    policy: EgressPolicy,
    credentials: CredentialStore,
    sessions: SessionRegistry,
    upstream: Upstream,
    metrics: EgressMetrics,
    limits: Limits,
    meter: Option<UsageMeter>,
}

/// The egress proxy and credential broker (cheap to clone).
#[derive(Clone, Debug)]
pub struct Broker {
    inner: Arc<Inner>,
}

/// The JSON body of a refusal.
#[derive(Debug, Serialize)]
struct DenialBody<'a> {
    code: &'a str,
    reason: &'a str,
    detail: &'a str,
}

/// What the sandbox asked, scrubbed, for the log event.
struct Seen<'a> {
    session: Option<&'a Session>,
    method: String,
    destination: String,
    path: String,
}

impl Broker {
    /// A broker deciding with `policy` and injecting from `credentials`.
    pub fn new(
        policy: EgressPolicy,
        credentials: CredentialStore,
        sessions: SessionRegistry,
        upstream: Upstream,
        metrics: EgressMetrics,
        limits: Limits,
    ) -> Broker {
        Broker {
            inner: Arc::new(Inner {
                policy,
                credentials,
                sessions,
                upstream,
                metrics,
                limits,
                meter: None,
            }),
        }
    }

    /// This broker, metering the usage of every model call it forwards
    /// ([`UsageMeter`]).
    pub fn with_meter(mut self, meter: UsageMeter) -> Broker {
        Arc::make_mut(&mut self.inner).meter = Some(meter);
        self
    }

    /// The meter, when the broker meters.
    pub fn meter(&self) -> Option<&UsageMeter> {
        self.inner.meter.as_ref()
    }

    /// Answers one request from a sandbox.
    pub async fn handle(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let token = header_str(request.headers(), SESSION_TOKEN_HEADER).unwrap_or_default();
        let mut secrets: Vec<String> = self
            .inner
            .credentials
            .values()
            .map(|c| c.expose().to_owned())
            .collect();
        if !token.is_empty() {
            secrets.push(token.to_owned());
        }
        let secret_refs: Vec<&str> = secrets.iter().map(String::as_str).collect();
        let session = self.inner.sessions.authenticate(token);
        let (destination, path) = match parse_target(request.method(), request.uri()) {
            Ok(target) => (target.destination, target.path),
            Err(_) => (
                request
                    .uri()
                    .authority()
                    .map_or_else(|| "-".to_owned(), |a| a.as_str().to_owned()),
                request.uri().path().to_owned(),
            ),
        };
        let seen = Seen {
            session: session.as_deref(),
            method: scrub_text(request.method().as_str(), &secret_refs),
            destination: scrub_text(&destination, &secret_refs),
            path: scrub_text(&path, &secret_refs),
        };
        let (response, outcome, reason, code) = self
            .respond(request, session.as_deref(), &secret_refs)
            .await;
        record(&seen, outcome, reason, code, response.status());
        self.inner.metrics.observe(outcome);
        response
    }

    async fn respond(
        &self,
        request: Request<Incoming>,
        session: Option<&Session>,
        secrets: &[&str],
    ) -> (Response<Full<Bytes>>, Outcome, Reason, Option<Code>) {
        let refuse = |status: StatusCode, denial: Denial| {
            let code = denial.code;
            let reason = denial.reason;
            (
                denial_response(status, &denial, secrets),
                Outcome::Denied,
                reason,
                Some(code),
            )
        };
        let Some(session) = session else {
            return refuse(
                StatusCode::UNAUTHORIZED,
                Denial::denied(
                    Reason::Unauthenticated,
                    format!(
                        "send the session token of a registered session in {SESSION_TOKEN_HEADER}"
                    ),
                ),
            );
        };
        if request.headers().contains_key(header::AUTHORIZATION) {
            return refuse(
                StatusCode::FORBIDDEN,
                Denial::denied(
                    Reason::CallerAuthorization,
                    "do not send Authorization: the broker adds the credential after authorization",
                ),
            );
        }
        let executable_digest = match attested_digest(request.headers()) {
            Ok(digest) => digest,
            Err(denial) => return refuse(StatusCode::FORBIDDEN, denial),
        };
        let target = match parse_target(request.method(), request.uri()) {
            Ok(target) => target,
            Err(why) => {
                return refuse(
                    StatusCode::FORBIDDEN,
                    Denial::denied(Reason::MalformedRequest, why),
                );
            }
        };
        let egress = EgressRequest {
            role: session.role.clone(),
            executable_digest,
            protocol: target.protocol.clone(),
            method: request.method().as_str().to_owned(),
            destination: target.destination.clone(),
            path: target.path.clone(),
        };
        let grant = match decide(&self.inner.policy, &egress, &self.inner.credentials) {
            Decision::Allow(grant) => grant,
            Decision::Deny(denial) => return refuse(StatusCode::FORBIDDEN, denial),
        };
        match self
            .forward(request, session, &target, &grant, secrets)
            .await
        {
            Forwarded::Answer(response) => (response, Outcome::Allowed, Reason::RuleMatched, None),
            Forwarded::Refused(status, denial) => refuse(status, denial),
            Forwarded::Failed(status, message) => {
                let body = DenialBody {
                    code: "upstream.unavailable",
                    reason: "upstream-failed",
                    detail: &scrub_text(&message, secrets),
                };
                (
                    json_response(status, &body),
                    Outcome::Allowed,
                    Reason::RuleMatched,
                    None,
                )
            }
        }
    }

    async fn forward(
        &self,
        request: Request<Incoming>,
        session: &Session,
        target: &Target,
        grant: &Grant,
        secrets: &[&str],
    ) -> Forwarded {
        let limits = self.inner.limits;
        let (parts, body) = request.into_parts();
        let too_large = || {
            Forwarded::Refused(
                StatusCode::PAYLOAD_TOO_LARGE,
                Denial::denied(
                    Reason::RequestTooLarge,
                    format!(
                        "the request body could not be read or exceeds {} bytes",
                        limits.max_request_body
                    ),
                ),
            )
        };
        // A declared length over the limit is refused before any byte is read.
        let declared =
            header_str(&parts.headers, "content-length").and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > limits.max_request_body as u64) {
            self.inner.metrics.limit_refused(LimitKind::RequestTooLarge);
            return too_large();
        }
        let collected = tokio::time::timeout(
            limits.body_timeout,
            Limited::new(body, limits.max_request_body).collect(),
        )
        .await;
        let body = match collected {
            Ok(Ok(collected)) => collected.to_bytes(),
            Err(_elapsed) => {
                self.inner.metrics.limit_refused(LimitKind::BodyTimeout);
                return Forwarded::Refused(
                    StatusCode::REQUEST_TIMEOUT,
                    Denial::denied(
                        Reason::RequestTimeout,
                        format!(
                            "the request body did not arrive within {} s",
                            limits.body_timeout.as_secs()
                        ),
                    ),
                );
            }
            Ok(Err(_)) => {
                self.inner.metrics.limit_refused(LimitKind::RequestTooLarge);
                return too_large();
            }
        };
        // One span per model call (docs/tracing.md): the GenAI attributes and the session's
        // run, never a body. A root of its own: the run's span lives in the operator's
        // process; `protobot.run_id` is that span's `run_id`.
        let call = match ModelApi::from_path(&target.path) {
            Some(api) => {
                let model = crate::usage::requested_model(&body);
                tracing::info_span!(
                    parent: None,
                    "gen_ai.call",
                    otel.name = %format!("{} {}", api.gen_ai_operation(), model.as_deref().unwrap_or("unknown")),
                    otel.kind = "client",
                    gen_ai.system = api.gen_ai_system(),
                    gen_ai.operation.name = api.gen_ai_operation(),
                    gen_ai.request.model = model.as_deref(),
                    gen_ai.response.model = tracing::field::Empty,
                    gen_ai.usage.input_tokens = tracing::field::Empty,
                    gen_ai.usage.output_tokens = tracing::field::Empty,
                    http.response.status_code = tracing::field::Empty,
                    protobot.run_id = %session.trace_id,
                    work_item = %session.work_item,
                    role = %session.role,
                )
            }
            None => tracing::Span::none(),
        };
        let path_and_query = match &target.query {
            Some(q) => format!("{}?{q}", target.path),
            None => target.path.clone(),
        };
        let uri = match format!("https://{}{path_and_query}", grant.host).parse::<Uri>() {
            Ok(uri) => uri,
            Err(_) => {
                return Forwarded::Refused(
                    StatusCode::FORBIDDEN,
                    Denial::denied(
                        Reason::MalformedRequest,
                        "the target does not form a valid upstream URL",
                    ),
                );
            }
        };
        let mut upstream = Request::new(Full::new(body));
        *upstream.method_mut() = parts.method;
        *upstream.uri_mut() = uri;
        *upstream.headers_mut() = forwardable_request_headers(&parts.headers);
        let headers = upstream.headers_mut();
        if let Ok(host) = HeaderValue::from_str(&grant.host) {
            headers.insert(header::HOST, host);
        }
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        // Injected only now: after the decision allowed this exact request.
        if let Some(name) = &grant.credential {
            let Some(value) = self
                .inner
                .credentials
                .get(name)
                .and_then(|c| HeaderValue::from_str(&format!("Bearer {}", c.expose())).ok())
            else {
                return Forwarded::Refused(
                    StatusCode::FORBIDDEN,
                    Denial {
                        code: Code::FailClosed,
                        reason: Reason::CredentialUnavailable,
                        detail: format!("credential {name:?} cannot be sent as a header"),
                    },
                );
            };
            let mut value = value;
            value.set_sensitive(true);
            headers.insert(header::AUTHORIZATION, value);
        }
        let exchange = async {
            let response = self
                .inner
                .upstream
                .send(upstream)
                .await
                .map_err(|e| (StatusCode::BAD_GATEWAY, e.to_string()))?;
            if response.status().is_redirection() {
                return Ok(Err(Denial::denied(
                    Reason::UpstreamRedirect,
                    format!(
                        "the upstream answered {} (a redirect); redirects are never followed",
                        response.status().as_u16()
                    ),
                )));
            }
            let encoded = response
                .headers()
                .get(header::CONTENT_ENCODING)
                .is_some_and(|v| !v.as_bytes().eq_ignore_ascii_case(b"identity"));
            if encoded {
                return Ok(Err(Denial::denied(
                    Reason::UpstreamEncoding,
                    "the upstream sent an encoded body the broker cannot scan for credentials",
                )));
            }
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, limits.max_response_body)
                .collect()
                .await
                .map_err(|_| {
                    (
                        StatusCode::BAD_GATEWAY,
                        format!(
                            "the upstream body could not be read or exceeds {} bytes",
                            limits.max_response_body
                        ),
                    )
                })?
                .to_bytes();
            Ok(Ok((parts, body)))
        };
        let exchange = tracing::Instrument::instrument(exchange, call.clone());
        let (parts, body) = match tokio::time::timeout(limits.upstream_timeout, exchange).await {
            Err(_) => {
                return Forwarded::Failed(
                    StatusCode::GATEWAY_TIMEOUT,
                    format!(
                        "the upstream did not answer within {}s",
                        limits.upstream_timeout.as_secs()
                    ),
                );
            }
            Ok(Err((status, message))) => return Forwarded::Failed(status, message),
            Ok(Ok(Err(denial))) => return Forwarded::Refused(StatusCode::FORBIDDEN, denial),
            Ok(Ok(Ok(answer))) => answer,
        };
        // Metered on the upstream's own bytes, which are only read; read for the call's span
        // too when it is exported and no meter is configured.
        let metered = match (&self.inner.meter, ModelApi::from_path(&target.path)) {
            (meter, Some(api)) if parts.status.is_success() => {
                let content_type = header_str(&parts.headers, "content-type");
                match meter {
                    Some(meter) => Some(meter.record_answer(session, api, content_type, &body)),
                    None if !call.is_disabled() => {
                        Some(crate::usage::read_usage(api, content_type, &body))
                    }
                    None => None,
                }
            }
            _ => None,
        };
        if let Some(metered) = metered {
            let (model, tokens) = match &metered {
                crate::usage::Metered::Reported { model, tokens } => (model, Some(tokens)),
                crate::usage::Metered::Absent { model } => (model, None),
            };
            if let Some(model) = model
                .as_deref()
                .filter(|m| crate::usage::plain_model_name(m))
            {
                call.record("gen_ai.response.model", model);
            }
            if let Some(tokens) = tokens {
                // The conventions' input is the whole prompt: cache reads and writes included.
                let input = tokens
                    .input
                    .saturating_add(tokens.cache_read)
                    .saturating_add(tokens.cache_write);
                call.record("gen_ai.usage.input_tokens", input);
                call.record("gen_ai.usage.output_tokens", tokens.output);
            }
        }
        call.record("http.response.status_code", parts.status.as_u16());
        let mut response = Response::new(Full::new(scrub_body(body, secrets)));
        *response.status_mut() = parts.status;
        *response.headers_mut() = parts.headers;
        strip_response_headers(response.headers_mut(), secrets);
        Forwarded::Answer(response)
    }
}

/// What the upstream exchange produced.
enum Forwarded {
    /// A scrubbed answer for the sandbox.
    Answer(Response<Full<Bytes>>),
    /// A denial decided after the policy allowed the request (body too
    /// large, redirect, encoded body), with its status.
    Refused(StatusCode, Denial),
    /// The upstream could not be reached or read.
    Failed(StatusCode, String),
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The digest attested by `X-Sandbox-Exec-Digest` + `X-Sandbox-Exec-Token`;
/// `None` without them; a denial when only one is present or they disagree.
fn attested_digest(headers: &HeaderMap) -> Result<Option<String>, Denial> {
    let digest = header_str(headers, EXEC_DIGEST_HEADER);
    let token = header_str(headers, EXEC_TOKEN_HEADER);
    let session = header_str(headers, SESSION_TOKEN_HEADER).unwrap_or_default();
    match (digest, token) {
        (None, None) => Ok(None),
        (Some(digest), Some(token)) if tokens_equal(&exec_token(session, digest), token) => {
            Ok(Some(digest.to_owned()))
        }
        _ => Err(Denial::denied(
            Reason::ExecutableAttestationInvalid,
            format!(
                "{EXEC_DIGEST_HEADER} and {EXEC_TOKEN_HEADER} must come together and the token must attest the digest"
            ),
        )),
    }
}

fn json_response<T: Serialize>(status: StatusCode, body: &T) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Full::new(Bytes::from(bytes)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn denial_response(status: StatusCode, denial: &Denial, secrets: &[&str]) -> Response<Full<Bytes>> {
    json_response(
        status,
        &DenialBody {
            code: denial.code.as_str(),
            reason: denial.reason.as_str(),
            detail: &scrub_text(&denial.detail, secrets),
        },
    )
}

fn record(
    seen: &Seen<'_>,
    outcome: Outcome,
    reason: Reason,
    code: Option<Code>,
    status: StatusCode,
) {
    let (work_item, role, trace_id) = match seen.session {
        Some(s) => (s.work_item.as_str(), s.role.as_str(), s.trace_id.as_str()),
        None => ("-", "-", "-"),
    };
    tracing::info!(
        target: "protobot::egress",
        work_item,
        role,
        trace_id,
        destination = %seen.destination,
        method = %seen.method,
        path = %seen.path,
        outcome = outcome.as_str(),
        reason = reason.as_str(),
        code = code.map_or("-", Code::as_str),
        status = status.as_u16(),
        "egress decision"
    );
}
