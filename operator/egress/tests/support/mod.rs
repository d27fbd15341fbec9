//! The proxy's test harness over real sockets, shared by `proxy.rs` and `decision_events.rs`:
//! a fixture upstream and the broker on 127.0.0.1:0, requests sent as a sandbox would.
//!
//! Fixture upstream (plain HTTP, reached through `Upstream::plaintext_for_tests`
//! for `registry.example.invalid` and `evil.example.invalid`):
//! `/v2/allowed` → 200 `ok-payload` echoing the Authorization it received in
//! a header and the body; `/v2/redirect` → 302 to `/v2/secret`; `/v2/gzip` →
//! 200 with `Content-Encoding: gzip`; anything else → 403.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Method, Request, Response, StatusCode, body::Incoming};
use hyper_util::rt::TokioIo;
use prometheus::Registry;
use protobot_egress::{
    Broker, Credential, CredentialStore, EgressMetrics, EgressPolicy, Limits, Session,
    SessionRegistry, SessionSecret, Upstream, exec_token, server::serve, session_token,
};
use tokio::net::TcpListener;

pub const APPROVED: &str =
    "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
pub const CURL: &str = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
pub const CREDENTIAL: &str = "PROTOBOT-SANDBOX-BROKER-TOKEN";
pub const DEST: &str = "registry.example.invalid";

/// What the fixture upstream saw: one entry per request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub path: String,
    pub headers: HeaderMap,
}

pub type Log = Arc<Mutex<Vec<Seen>>>;

pub async fn fixture(request: Request<Incoming>, log: Log) -> Response<Full<Bytes>> {
    let auth = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    log.lock().unwrap().push(Seen {
        path: request.uri().path().to_owned(),
        headers: request.headers().clone(),
    });
    let builder = Response::builder();
    let (builder, status, body) = match request.uri().path() {
        "/v2/allowed" => (
            builder
                .header("x-echo-authorization", auth.clone())
                .header("set-cookie", "upstream-session=1")
                .header("content-type", "text/plain"),
            StatusCode::OK,
            format!("ok-payload; you sent: {auth}"),
        ),
        "/v2/redirect" => (
            builder.header("location", "/v2/secret"),
            StatusCode::FOUND,
            String::new(),
        ),
        "/v2/gzip" => (
            builder.header("content-encoding", "gzip"),
            StatusCode::OK,
            format!("pretend-compressed {auth}"),
        ),
        _ => (builder, StatusCode::FORBIDDEN, "forbidden".to_owned()),
    };
    builder
        .status(status)
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

pub const POLICY: &str = r#"
rules:
  - executableDigest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    role: worker-b
    destination: registry.example.invalid
    method: GET
    path: /v2/allowed
    credential: registry
  - executableDigest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    role: worker-b
    destination: registry.example.invalid
    method: GET
    path: /v2/redirect
    credential: registry
  - executableDigest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    role: worker-b
    destination: registry.example.invalid
    method: GET
    path: /v2/gzip
    credential: registry
  - executableDigest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    role: worker-b
    destination: registry.example.invalid
    method: GET
    path: /v2/missing
    credential: absent
  - executableDigest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    role: worker-b
    destination: registry.example.invalid
    method: POST
    path: /v2/upload
    credential: registry
  - executableDigest: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    role: worker-b
    destination: down.example.invalid
    method: GET
    path: /v2/allowed
"#;

pub struct Harness {
    pub proxy: SocketAddr,
    pub admin: SocketAddr,
    pub token: String,
    pub upstream_log: Log,
    pub metrics: EgressMetrics,
}

pub fn session() -> Session {
    Session {
        work_item: "wi-egress-1".into(),
        role: "worker-b".into(),
        trace_id: "trace-jobsite-sandbox-v1".into(),
        source_commit: "0123abcd".into(),
        ..Default::default()
    }
}

pub async fn start() -> Harness {
    start_with(Limits {
        upstream_timeout: Duration::from_secs(10),
        ..Limits::default()
    })
    .await
}

pub async fn start_with(limits: Limits) -> Harness {
    let upstream_log: Log = Arc::default();
    let fixture_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fixture_addr = fixture_listener.local_addr().unwrap();
    let log = upstream_log.clone();
    tokio::spawn(serve(
        fixture_listener,
        move |req| fixture(req, log.clone()),
        std::future::pending(),
    ));

    let secret = SessionSecret::new(vec![42u8; 32]);
    let sessions = SessionRegistry::new(secret.clone());
    sessions.replace(vec![session()]);
    let token = session_token(&secret, &session());

    let registry = Registry::new();
    let metrics = EgressMetrics::register(&registry).unwrap();
    let broker = Broker::new(
        EgressPolicy::from_yaml(POLICY, "<test>").unwrap(),
        CredentialStore::from_pairs([("registry", Credential::new(CREDENTIAL))]),
        sessions,
        Upstream::plaintext_for_tests(HashMap::from([
            (DEST.to_owned(), fixture_addr),
            ("evil.example.invalid".to_owned(), fixture_addr),
        ])),
        metrics.clone(),
        limits,
    );
    let proxy_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = proxy_listener.local_addr().unwrap();
    tokio::spawn(serve(
        proxy_listener,
        move |req| {
            let broker = broker.clone();
            async move { broker.handle(req).await }
        },
        std::future::pending(),
    ));
    let admin_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = admin_listener.local_addr().unwrap();
    tokio::spawn(serve(
        admin_listener,
        move |req| {
            let registry = registry.clone();
            async move { protobot_egress::admin::respond(&registry, None, &req) }
        },
        std::future::pending(),
    ));
    Harness {
        proxy,
        admin,
        token,
        upstream_log,
        metrics,
    }
}

/// The answer as the sandbox sees it.
#[derive(Debug)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    pub fn reason(&self) -> String {
        self.json()["reason"].as_str().unwrap().to_owned()
    }

    pub fn assert_denied(&self, reason: &str) {
        assert_eq!(self.status, StatusCode::FORBIDDEN, "{self:?}");
        let json = self.json();
        assert_eq!(json["code"], "sandbox.denied", "{self:?}");
        assert_eq!(json["reason"], reason, "{self:?}");
    }

    /// Nothing the sandbox receives holds the credential.
    pub fn assert_no_credential(&self) {
        assert!(!self.body.contains(CREDENTIAL), "body leaks: {}", self.body);
        for (name, value) in &self.headers {
            assert!(
                !String::from_utf8_lossy(value.as_bytes()).contains(CREDENTIAL),
                "header {name} leaks"
            );
        }
    }
}

pub async fn send_raw(addr: SocketAddr, request: Request<Full<Bytes>>) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// A request builder with the session token and the approved executable.
pub struct Call<'a> {
    pub h: &'a Harness,
    pub method: Method,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

impl<'a> Call<'a> {
    pub fn new(h: &'a Harness, method: Method, target: &str) -> Call<'a> {
        Call {
            h,
            method,
            target: target.to_owned(),
            headers: vec![
                ("x-sandbox-session-token".into(), h.token.clone()),
                ("x-sandbox-exec-digest".into(), APPROVED.into()),
                (
                    "x-sandbox-exec-token".into(),
                    exec_token(&h.token, APPROVED),
                ),
            ],
            body: Bytes::new(),
        }
    }

    pub fn get(h: &'a Harness, target: &str) -> Call<'a> {
        Call::new(h, Method::GET, target)
    }

    /// The same call under another session token (the executable attested
    /// within it).
    pub fn in_session(self, token: &str) -> Call<'a> {
        self.with("x-sandbox-session-token", token)
            .with("x-sandbox-exec-token", &exec_token(token, APPROVED))
    }

    pub fn without(mut self, name: &str) -> Call<'a> {
        self.headers.retain(|(n, _)| n != name);
        self
    }

    pub fn with(mut self, name: &str, value: &str) -> Call<'a> {
        self = self.without(name);
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn body(mut self, body: &'static [u8]) -> Call<'a> {
        self.body = Bytes::from_static(body);
        self
    }

    pub async fn send(self) -> Answer {
        let mut builder = Request::builder().method(self.method).uri(&self.target);
        for (n, v) in &self.headers {
            builder = builder.header(n, v);
        }
        if !self.target.starts_with('/') {
            // Absolute and authority forms carry their own host.
            builder = builder.header("host", "proxy");
        } else {
            builder = builder.header("host", "protobot-egress-proxy:3128");
        }
        send_raw(self.h.proxy, builder.body(Full::new(self.body)).unwrap()).await
    }
}

pub fn allowed_url() -> String {
    format!("/{DEST}/v2/allowed")
}

pub fn upstream_paths(h: &Harness) -> Vec<String> {
    h.upstream_log
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.path.clone())
        .collect()
}
