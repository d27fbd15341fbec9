//! The proxy over real sockets: a fixture upstream and the broker on
//! 127.0.0.1:0, requests sent as a sandbox would. The cases follow
//! jobsite-sandbox/v1's SB-NET-001..010 and SB-CRED checks; each names the
//! check it mirrors.
//!
//! The harness (fixture upstream, broker, requests) is `support/mod.rs`; the decision
//! events are tested alone in `decision_events.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode};
use prometheus::Registry;
use protobot_egress::{
    EgressMetrics, Limits, Session, SessionSecret, exec_token, issue_session_token,
};
use tokio::net::TcpListener;

mod support;

use support::*;

#[tokio::test]
async fn sb_net_001_and_cred_004_approved_request_gets_200_without_the_credential() {
    let h = start().await;
    for target in [allowed_url(), format!("https://{DEST}/v2/allowed")] {
        let a = Call::get(&h, &target).send().await;
        assert_eq!(a.status, StatusCode::OK, "{target}: {a:?}");
        assert!(a.body.starts_with("ok-payload"), "{a:?}");
        a.assert_no_credential();
        assert!(
            a.body.contains("[redacted]"),
            "the echo was scrubbed: {}",
            a.body
        );
        assert!(a.headers.get("x-echo-authorization").is_none());
        assert!(a.headers.get("set-cookie").is_none());
    }
    // The upstream saw the injected credential, and never the session token.
    let log = h.upstream_log.lock().unwrap().clone();
    assert_eq!(log.len(), 2);
    for seen in log {
        assert_eq!(
            seen.headers.get("authorization").unwrap(),
            &format!("Bearer {CREDENTIAL}")
        );
        assert_eq!(seen.headers.get("host").unwrap(), DEST);
        assert!(
            seen.headers
                .keys()
                .all(|k| !k.as_str().starts_with("x-sandbox-")),
            "sandbox headers forwarded: {:?}",
            seen.headers
        );
    }
}

#[tokio::test]
async fn sb_net_002_and_cred_006_other_binary_denied_then_approved_client_allowed() {
    let h = start().await;
    let curl = Call::get(&h, &allowed_url())
        .with("x-sandbox-exec-digest", CURL)
        .with("x-sandbox-exec-token", &exec_token(&h.token, CURL))
        .send()
        .await;
    curl.assert_denied("executable-not-approved");
    assert!(upstream_paths(&h).is_empty(), "nothing reached upstream");
    let approved = Call::get(&h, &allowed_url()).send().await;
    assert_eq!(approved.status, StatusCode::OK);
    assert_eq!(upstream_paths(&h), ["/v2/allowed"]);
}

#[tokio::test]
async fn unattested_or_forged_executables_are_denied() {
    let h = start().await;
    Call::get(&h, &allowed_url())
        .without("x-sandbox-exec-digest")
        .without("x-sandbox-exec-token")
        .send()
        .await
        .assert_denied("executable-not-approved");
    // A token for another digest does not attest the approved one.
    Call::get(&h, &allowed_url())
        .with("x-sandbox-exec-token", &exec_token(&h.token, CURL))
        .send()
        .await
        .assert_denied("executable-attestation-invalid");
    Call::get(&h, &allowed_url())
        .without("x-sandbox-exec-token")
        .send()
        .await
        .assert_denied("executable-attestation-invalid");
    assert!(upstream_paths(&h).is_empty());
}

#[tokio::test]
async fn sb_net_003_unapproved_destination_is_denied() {
    let h = start().await;
    Call::get(&h, "/evil.example.invalid/v2/allowed")
        .send()
        .await
        .assert_denied("no-matching-rule");
    Call::get(&h, "https://evil.example.invalid/v2/allowed")
        .send()
        .await
        .assert_denied("no-matching-rule");
    assert!(upstream_paths(&h).is_empty());
}

#[tokio::test]
async fn sb_net_004_direct_ip_forms_are_denied() {
    let h = start().await;
    for target in [
        "/127.0.0.1/v2/allowed",
        "/::1/v2/allowed",
        "https://[::1]/v2/allowed",
        "/127.1/v2/allowed",
        "/2130706433/v2/allowed",
        "/0x7f000001/v2/allowed",
        "/localhost/v2/allowed",
        "https://127.0.0.1:443/v2/allowed",
    ] {
        let a = Call::get(&h, target).send().await;
        assert_eq!(a.reason(), "direct-ip", "{target}: {a:?}");
        a.assert_denied("direct-ip");
    }
    assert!(upstream_paths(&h).is_empty());
}

#[tokio::test]
async fn sb_net_005_dns_is_denied() {
    let h = start().await;
    Call::get(&h, "dns://resolver.example.invalid/")
        .send()
        .await
        .assert_denied("dns");
    Call::get(&h, "/dns-tunnel.invalid/v2/allowed")
        .send()
        .await
        .assert_denied("dns");
}

#[tokio::test]
async fn sb_net_006_redirects_are_not_followed_and_reach_the_sandbox_as_denials() {
    let h = start().await;
    let a = Call::get(&h, &format!("/{DEST}/v2/redirect")).send().await;
    a.assert_denied("upstream-redirect");
    assert!(a.headers.get("location").is_none());
    a.assert_no_credential();
    // The broker asked once and did not go to /v2/secret.
    assert_eq!(upstream_paths(&h), ["/v2/redirect"]);
}

#[tokio::test]
async fn sb_net_007_raw_sockets_are_denied() {
    let h = start().await;
    for scheme in ["tcp", "udp", "raw"] {
        Call::get(&h, &format!("{scheme}://{DEST}/v2/allowed"))
            .send()
            .await
            .assert_denied("raw-socket");
    }
}

#[tokio::test]
async fn sb_net_008_alternate_ports_are_denied() {
    let h = start().await;
    Call::get(&h, &format!("/{DEST}:8443/v2/allowed"))
        .send()
        .await
        .assert_denied("alternate-port");
    Call::get(&h, &format!("https://{DEST}:8443/v2/allowed"))
        .send()
        .await
        .assert_denied("alternate-port");
    // :443 is the same destination.
    let a = Call::get(&h, &format!("/{DEST}:443/v2/allowed"))
        .send()
        .await;
    assert_eq!(a.status, StatusCode::OK);
}

#[tokio::test]
async fn sb_net_009_plaintext_http_and_connect_tunnels_are_denied() {
    let h = start().await;
    Call::get(&h, &format!("http://{DEST}/v2/allowed"))
        .send()
        .await
        .assert_denied("plaintext-http");
    Call::new(&h, Method::CONNECT, &format!("{DEST}:443"))
        .send()
        .await
        .assert_denied("tls-bypass");
    Call::get(&h, &format!("/{DEST}/tls-bypass"))
        .send()
        .await
        .assert_denied("tls-bypass");
    assert!(upstream_paths(&h).is_empty());
}

#[tokio::test]
async fn sb_net_010_post_to_a_get_only_rule_is_denied() {
    let h = start().await;
    Call::new(&h, Method::POST, &allowed_url())
        .send()
        .await
        .assert_denied("no-matching-rule");
    assert!(upstream_paths(&h).is_empty());
}

#[tokio::test]
async fn missing_or_unknown_session_tokens_get_401() {
    let h = start().await;
    for call in [
        Call::get(&h, &allowed_url()).without("x-sandbox-session-token"),
        Call::get(&h, &allowed_url()).with("x-sandbox-session-token", &"0".repeat(64)),
    ] {
        let a = call.send().await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{a:?}");
        assert_eq!(a.reason(), "unauthenticated");
    }
    assert!(upstream_paths(&h).is_empty());
}

#[tokio::test]
async fn a_signed_session_token_needs_no_registration_and_expires() {
    let h = start().await;
    let secret = SessionSecret::new(vec![42u8; 32]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    // Another run of the same role, never written to any sessions file.
    let run = Session {
        trace_id: "run-wi-egress-1-c2-b".into(),
        ..session()
    };
    let live = issue_session_token(&secret, &run, now + 600);
    let a = Call::get(&h, &allowed_url()).in_session(&live).send().await;
    assert_eq!(a.status, StatusCode::OK, "{a:?}");
    a.assert_no_credential();
    assert!(
        !a.body.contains(&live),
        "the token is scrubbed from answers"
    );
    for refused in [
        issue_session_token(&secret, &run, now - 1),
        issue_session_token(&SessionSecret::new(vec![7u8; 32]), &run, now + 600),
    ] {
        let a = Call::get(&h, &allowed_url())
            .in_session(&refused)
            .send()
            .await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{a:?}");
    }
    // Rules still match on the role the token names.
    let inspector = issue_session_token(
        &secret,
        &Session {
            role: "inspector".into(),
            ..run
        },
        now + 600,
    );
    let a = Call::get(&h, &allowed_url())
        .in_session(&inspector)
        .send()
        .await;
    assert_eq!(a.status, StatusCode::FORBIDDEN, "{a:?}");
    assert_eq!(upstream_paths(&h).len(), 1);
}

#[tokio::test]
async fn a_caller_supplied_authorization_gets_403_and_is_never_forwarded() {
    let h = start().await;
    let a = Call::get(&h, &allowed_url())
        .with("authorization", "Bearer my-own")
        .send()
        .await;
    a.assert_denied("caller-authorization");
    assert!(upstream_paths(&h).is_empty());
}

#[tokio::test]
async fn a_rule_whose_credential_is_missing_fails_closed() {
    let h = start().await;
    let a = Call::get(&h, &format!("/{DEST}/v2/missing")).send().await;
    assert_eq!(a.status, StatusCode::FORBIDDEN);
    assert_eq!(a.json()["code"], "sandbox.fail_closed");
    assert_eq!(a.reason(), "credential-unavailable");
    assert!(upstream_paths(&h).is_empty());
}

#[tokio::test]
async fn encoded_upstream_bodies_are_refused_because_they_cannot_be_scrubbed() {
    let h = start().await;
    let a = Call::get(&h, &format!("/{DEST}/v2/gzip")).send().await;
    a.assert_denied("upstream-encoding");
    a.assert_no_credential();
    // The broker asked for identity encoding.
    let log = h.upstream_log.lock().unwrap().clone();
    assert_eq!(log[0].headers.get("accept-encoding").unwrap(), "identity");
}

#[tokio::test]
async fn request_bodies_over_the_limit_are_refused_before_anything_is_sent() {
    let h = start_with(Limits {
        max_request_body: 8,
        ..Limits::default()
    })
    .await;
    let a = Call::new(&h, Method::POST, &format!("/{DEST}/v2/upload"))
        .body(b"far more than eight bytes")
        .send()
        .await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{a:?}");
    assert_eq!(a.reason(), "request-too-large");
    assert!(upstream_paths(&h).is_empty());
    // Within the limit the same rule reaches the upstream (which answers 403 itself).
    let a = Call::new(&h, Method::POST, &format!("/{DEST}/v2/upload"))
        .body(b"small")
        .send()
        .await;
    assert_eq!(
        (a.status, a.body.as_str()),
        (StatusCode::FORBIDDEN, "forbidden")
    );
    assert_eq!(upstream_paths(&h), ["/v2/upload"]);
}

#[tokio::test]
async fn an_unreachable_upstream_is_a_502_that_names_the_host() {
    let h = start().await;
    let a = Call::get(&h, "/down.example.invalid/v2/allowed")
        .send()
        .await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY, "{a:?}");
    assert!(a.body.contains("down.example.invalid"), "{a:?}");
}

#[tokio::test]
async fn decisions_are_counted_by_outcome_and_served_on_the_admin_port() {
    let h = start().await;
    Call::get(&h, &allowed_url()).send().await;
    Call::get(&h, &allowed_url()).send().await;
    Call::new(&h, Method::POST, &allowed_url()).send().await;
    Call::get(&h, &allowed_url())
        .without("x-sandbox-session-token")
        .send()
        .await;
    Call::get(&h, &format!("/{DEST}/v2/redirect")).send().await;
    assert_eq!(h.metrics.decisions.with_label_values(&["allowed"]).get(), 2);
    assert_eq!(h.metrics.decisions.with_label_values(&["denied"]).get(), 3);
    let get = |path: &str| {
        Request::builder()
            .uri(path)
            .header("host", "admin")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let metrics = send_raw(h.admin, get("/metrics")).await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(
        metrics
            .body
            .contains("protobot_egress_decisions_total{outcome=\"allowed\"} 2"),
        "{}",
        metrics.body
    );
    assert!(
        metrics
            .body
            .contains("protobot_egress_decisions_total{outcome=\"denied\"} 3"),
        "{}",
        metrics.body
    );
    let health = send_raw(h.admin, get("/healthz")).await;
    assert_eq!(
        (health.status, health.body.as_str()),
        (StatusCode::OK, "ok\n")
    );
    assert_eq!(
        send_raw(h.admin, get("/nope")).await.status,
        StatusCode::NOT_FOUND
    );
}

/// Issue #16: slow, stalled, oversized and too many connections are each refused with a
/// clear status and counted.
mod limits {
    use super::*;
    use protobot_egress::server::{ServeLimits, serve_with};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Sends raw bytes and reads whatever comes back until the server closes (or 10 s).
    async fn raw(addr: SocketAddr, bytes: &[u8]) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = stream.write_all(bytes).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn an_allowed_request_whose_body_never_arrives_gets_408_and_is_counted() {
        let h = start_with(Limits {
            body_timeout: Duration::from_millis(500),
            upstream_timeout: Duration::from_secs(10),
            ..Limits::default()
        })
        .await;
        let head = format!(
            "POST /{DEST}/v2/upload HTTP/1.1\r\nhost: proxy\r\nx-sandbox-session-token: {}\r\nx-sandbox-exec-digest: {APPROVED}\r\nx-sandbox-exec-token: {}\r\ncontent-length: 100\r\n\r\nonly part",
            h.token,
            exec_token(&h.token, APPROVED)
        );
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(Duration::from_secs(5), async {
            let mut stream = tokio::net::TcpStream::connect(h.proxy).await.unwrap();
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = stream.read(&mut buf).await.unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        })
        .await
        .expect("the proxy held a stalled body open");
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("request-timeout"), "{answer}");
        assert!(started.elapsed() < Duration::from_secs(3));
        assert_eq!(
            h.metrics
                .limit_refusals
                .with_label_values(&["body-timeout"])
                .get(),
            1
        );
        assert!(upstream_paths(&h).is_empty());
    }

    #[tokio::test]
    async fn a_declared_body_over_the_limit_is_refused_before_it_is_read() {
        let h = start_with(Limits {
            max_request_body: 8,
            body_timeout: Duration::from_secs(30),
            ..Limits::default()
        })
        .await;
        let head = format!(
            "POST /{DEST}/v2/upload HTTP/1.1\r\nhost: proxy\r\nx-sandbox-session-token: {}\r\nx-sandbox-exec-digest: {APPROVED}\r\nx-sandbox-exec-token: {}\r\ncontent-length: 1000000000\r\n\r\n",
            h.token,
            exec_token(&h.token, APPROVED)
        );
        let answer = tokio::time::timeout(Duration::from_secs(5), async {
            let mut stream = tokio::net::TcpStream::connect(h.proxy).await.unwrap();
            stream.write_all(head.as_bytes()).await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = stream.read(&mut buf).await.unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        })
        .await
        .expect("the proxy waited for a body it would refuse");
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert_eq!(
            h.metrics
                .limit_refusals
                .with_label_values(&["request-too-large"])
                .get(),
            1
        );
    }

    async fn limited(limits: ServeLimits) -> (SocketAddr, EgressMetrics) {
        let registry = Registry::new();
        let metrics = EgressMetrics::register(&registry).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(serve_with(
            listener,
            |_req| async { Response::new(Full::new(Bytes::from_static(b"ok"))) },
            std::future::pending(),
            limits,
            Some(metrics.clone()),
        ));
        (addr, metrics)
    }

    #[tokio::test]
    async fn connections_over_the_cap_get_503_and_are_counted() {
        let (addr, metrics) = limited(ServeLimits {
            max_connections: 2,
            header_timeout: Duration::from_secs(30),
            ..ServeLimits::default()
        })
        .await;
        // Two idle connections hold both slots.
        let _a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _b = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answer = raw(addr, b"GET / HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("too-many-connections"), "{answer}");
        assert_eq!(
            metrics
                .limit_refusals
                .with_label_values(&["connections"])
                .get(),
            1
        );
        // A slot freed is a slot served.
        drop(_a);
        tokio::time::sleep(Duration::from_millis(100)).await;
        let answer = raw(
            addr,
            b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    #[tokio::test]
    async fn a_head_that_never_completes_gets_408_and_an_oversized_head_431() {
        let (addr, metrics) = limited(ServeLimits {
            header_timeout: Duration::from_millis(500),
            max_head_bytes: 16 * 1024,
            ..ServeLimits::default()
        })
        .await;
        let started = std::time::Instant::now();
        let answer = raw(addr, b"GET / HTTP/1.1\r\nhost: x\r\nx-slow: ").await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(started.elapsed() < Duration::from_secs(5));
        assert_eq!(
            metrics
                .limit_refusals
                .with_label_values(&["header-timeout"])
                .get(),
            1
        );
        let big = format!(
            "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
            "a".repeat(100 * 1024)
        );
        let answer = raw(addr, big.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        assert_eq!(
            metrics
                .limit_refusals
                .with_label_values(&["head-too-large"])
                .get(),
            1
        );
    }
}
