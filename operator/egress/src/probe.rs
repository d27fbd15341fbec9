//! The credential-broker probes' fixture (jobsite-sandbox/v1 §2.14): the
//! destination, the policy rules that allow it, and the upstream behind it.
//!
//! The conformance suite's broker checks (SB-NET-*, SB-CRED-* through the
//! proxy) send their requests to [`PROBE_HOST`]. A proxy measured by them
//! holds [`probe_policy`]'s rules and a credential whose value is the suite's
//! sentinel, and reaches [`serve_upstream`] for that host. The upstream
//! answers `/v2/allowed` with `200 ok-payload auth=<the Authorization it
//! received>` only when that header is the broker's credential (else `401`),
//! so a broker that injects nothing fails the allowed request, and a broker
//! that does not scrub the response leaks the credential to the sandbox;
//! `/v2/redirect` is a `302` to `/v2/secret`; everything else is `403`.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode, body::Incoming, header};
use tokio::net::TcpListener;

/// The host every broker probe names.
pub const PROBE_HOST: &str = "registry.example.invalid";
/// The path the probe policy allows with the credential.
pub const ALLOWED_PATH: &str = "/v2/allowed";
/// A path the policy allows whose upstream answer is a redirect.
pub const REDIRECT_PATH: &str = "/v2/redirect";
/// A host no probe rule names (a proxy that forwards to it is wrong).
pub const UNAPPROVED_HOST: &str = "evil.example.invalid";
/// The body of the upstream's allowed answer, before `auth=`.
pub const OK_PAYLOAD: &str = "ok-payload";
/// The credential the probe rules name when the proxy serves the probe itself
/// (`protobot egress-proxy --conformance-probe`).
pub const PROBE_CREDENTIAL: &str = "protobot-conformance-probe";
/// Its value: the conformance suite's public sentinel
/// (`protobot_executors::BROKER_TOKEN_SENTINEL`), so a probe that finds it
/// where it must not be has found a leak. It guards nothing.
pub const PROBE_CREDENTIAL_VALUE: &str = "PROTOBOT-SANDBOX-BROKER-TOKEN";
/// The role the suite's probe runs have.
pub const PROBE_ROLE: &str = "worker-a";

/// Serves the probe for a deployed proxy: starts the probe upstream on a
/// loopback port of this process and returns `(policy, credentials,
/// upstream)` with the probe rules ([`probe_policy`] for [`PROBE_ROLE`]), the
/// sentinel credential [`PROBE_CREDENTIAL`] and [`PROBE_HOST`] routed to the
/// local upstream added. Must be called inside a Tokio runtime.
pub async fn serve_in_process(
    policy: crate::EgressPolicy,
    credentials: crate::CredentialStore,
    upstream: crate::Upstream,
) -> std::io::Result<(crate::EgressPolicy, crate::CredentialStore, crate::Upstream)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve_upstream(listener, PROBE_CREDENTIAL_VALUE.to_owned()));
    let rules = crate::EgressPolicy::from_yaml(
        &probe_policy(PROBE_ROLE, PROBE_CREDENTIAL),
        "<conformance probe rules>",
    )
    .map_err(std::io::Error::other)?;
    Ok((
        policy.with_rules_of(rules),
        credentials.with(
            PROBE_CREDENTIAL,
            crate::Credential::new(PROBE_CREDENTIAL_VALUE),
        ),
        upstream.with_local_host(PROBE_HOST, addr),
    ))
}

/// The policy rules the broker probes need: role `role` may `GET`
/// [`ALLOWED_PATH`] and [`REDIRECT_PATH`] on [`PROBE_HOST`] with the
/// credential named `credential`. YAML, as `protobot egress-proxy --policy`
/// reads it.
pub fn probe_policy(role: &str, credential: &str) -> String {
    format!(
        "rules:\n  - role: {role}\n    destination: {PROBE_HOST}\n    method: GET\n    path: {ALLOWED_PATH}\n    credential: {credential}\n  - role: {role}\n    destination: {PROBE_HOST}\n    method: GET\n    path: {REDIRECT_PATH}\n    credential: {credential}\n"
    )
}

fn answer(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

/// The upstream's answer to one request (pure).
pub fn upstream_answer(
    path: &str,
    authorization: Option<&str>,
    credential: &str,
) -> Response<Full<Bytes>> {
    match path {
        ALLOWED_PATH => match authorization {
            Some(a) if a == format!("Bearer {credential}") => {
                answer(StatusCode::OK, format!("{OK_PAYLOAD} auth={a}\n"))
            }
            _ => answer(
                StatusCode::UNAUTHORIZED,
                "no credential: the broker did not inject it\n".to_owned(),
            ),
        },
        REDIRECT_PATH => {
            let mut r = answer(StatusCode::FOUND, String::new());
            r.headers_mut().insert(
                header::LOCATION,
                header::HeaderValue::from_static("/v2/secret"),
            );
            r
        }
        _ => answer(StatusCode::FORBIDDEN, "forbidden\n".to_owned()),
    }
}

/// Serves the probe upstream (plain HTTP; the broker reaches it through
/// [`crate::Upstream::plaintext_for_tests`]) on `listener` until dropped,
/// expecting `credential` from the broker.
pub async fn serve_upstream(listener: TcpListener, credential: String) {
    crate::server::serve(
        listener,
        move |req: Request<Incoming>| {
            let credential = credential.clone();
            async move {
                let auth = req
                    .headers()
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned);
                upstream_answer(req.uri().path(), auth.as_deref(), &credential)
            }
        },
        std::future::pending::<()>(),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EgressPolicy;

    #[test]
    fn the_probe_policy_parses() {
        EgressPolicy::from_yaml(&probe_policy("worker-a", "probe"), "<probe>").unwrap();
    }

    #[tokio::test]
    async fn serving_the_probe_in_process_adds_its_rules_credential_and_host() {
        use http_body_util::BodyExt;
        let base = EgressPolicy::from_yaml(
            "rules:\n  - role: worker-b\n    destination: api.example.com\n    method: POST\n    path: /v1/x\n",
            "<base>",
        )
        .unwrap();
        let (policy, credentials, upstream) = serve_in_process(
            base,
            crate::CredentialStore::default(),
            crate::Upstream::plaintext_for_tests(Default::default()),
        )
        .await
        .unwrap();
        assert_eq!(
            policy.rules().len(),
            3,
            "the base rule and the two probe rules"
        );
        assert_eq!(policy.rules()[0].destination, "api.example.com");
        assert_eq!(
            credentials.get(PROBE_CREDENTIAL).map(|c| c.expose()),
            Some(PROBE_CREDENTIAL_VALUE)
        );
        let request = |auth: &str| {
            hyper::Request::get(format!("https://{PROBE_HOST}{ALLOWED_PATH}"))
                .header(header::AUTHORIZATION, auth)
                .body(Full::new(Bytes::new()))
                .unwrap()
        };
        let ok = upstream
            .send(request(&format!("Bearer {PROBE_CREDENTIAL_VALUE}")))
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let body = ok.into_body().collect().await.unwrap().to_bytes();
        assert!(body.starts_with(OK_PAYLOAD.as_bytes()));
        let refused = upstream.send(request("Bearer other")).await.unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    }

    #[test]
    fn the_upstream_serves_only_the_injected_credential() {
        assert_eq!(
            upstream_answer(ALLOWED_PATH, Some("Bearer s3cret"), "s3cret").status(),
            StatusCode::OK
        );
        for wrong in [None, Some("Bearer other"), Some("s3cret")] {
            assert_eq!(
                upstream_answer(ALLOWED_PATH, wrong, "s3cret").status(),
                StatusCode::UNAUTHORIZED
            );
        }
        assert_eq!(
            upstream_answer(REDIRECT_PATH, None, "s").status(),
            StatusCode::FOUND
        );
        assert_eq!(
            upstream_answer("/v2/secret", None, "s").status(),
            StatusCode::FORBIDDEN
        );
    }
}
