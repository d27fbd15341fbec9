//! How the broker reaches an allowed destination: HTTPS on port 443 with
//! rustls (ring) and the system's root certificates, never following
//! redirects (hyper never does). Tests swap in
//! [`Upstream::plaintext_for_tests`], which sends `host:443` to a local
//! plain-HTTP fixture instead; [`Upstream::with_local_host`] serves one host
//! from this process (the conformance probe upstream of
//! `protobot egress-proxy --conformance-probe`).

use std::{collections::HashMap, net::SocketAddr, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, Uri, body::Incoming};
use hyper_rustls::HttpsConnector;
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::{TokioExecutor, TokioIo},
};

/// Why an upstream request failed (the sandbox gets a 502).
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The TLS client could not be built.
    #[error(
        "failed to load the system's root certificates for upstream TLS; install ca-certificates in the image"
    )]
    Roots(#[source] std::io::Error),
    /// Connecting or exchanging the request failed.
    #[error("unable to reach {host}: {message}")]
    Unreachable {
        /// The destination host.
        host: String,
        /// What went wrong (from the HTTP client; holds no request headers).
        message: String,
    },
}

/// The upstream transport.
#[derive(Clone, Debug)]
pub enum Upstream {
    /// Production: HTTPS with rustls and native roots.
    Tls(Client<HttpsConnector<HttpConnector>, Full<Bytes>>),
    /// Tests only: plain HTTP to a fixed address per destination host. Never
    /// use outside tests: it sends credentials unencrypted.
    PlaintextForTests(Arc<HashMap<String, SocketAddr>>),
    /// Production HTTPS, except for hosts served inside this process over
    /// loopback (the conformance probe upstream, [`crate::probe`], whose
    /// credential is the suite's public sentinel).
    TlsWithLocal {
        /// The HTTPS client for every other host.
        tls: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
        /// Hosts served in this process, by loopback address.
        local: Arc<HashMap<String, SocketAddr>>,
    },
}

impl Upstream {
    /// The production transport (HTTPS only, HTTP/1.1).
    pub fn tls(connect_timeout: Duration) -> Result<Upstream, UpstreamError> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(connect_timeout));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(rustls::crypto::ring::default_provider())
            .map_err(UpstreamError::Roots)?
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        Ok(Upstream::Tls(
            Client::builder(TokioExecutor::new()).build(https),
        ))
    }

    /// Test-only transport: `host` → plain HTTP at the mapped address.
    pub fn plaintext_for_tests(map: HashMap<String, SocketAddr>) -> Upstream {
        Upstream::PlaintextForTests(Arc::new(map))
    }

    /// This transport, with `host` served by this process at `addr` (plain
    /// HTTP on loopback) instead of the network.
    pub fn with_local_host(self, host: &str, addr: SocketAddr) -> Upstream {
        let add = |map: &HashMap<String, SocketAddr>| {
            let mut map = map.clone();
            map.insert(host.to_owned(), addr);
            Arc::new(map)
        };
        match self {
            Upstream::Tls(tls) => Upstream::TlsWithLocal {
                tls,
                local: add(&HashMap::new()),
            },
            Upstream::TlsWithLocal { tls, local } => Upstream::TlsWithLocal {
                tls,
                local: add(&local),
            },
            Upstream::PlaintextForTests(map) => Upstream::PlaintextForTests(add(&map)),
        }
    }

    /// Sends `request` (absolute `https://host/…` URI) and returns the
    /// response head with its unread body.
    pub async fn send(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        let host = request.uri().host().unwrap_or_default().to_owned();
        let unreachable = |message: String| UpstreamError::Unreachable {
            host: host.clone(),
            message,
        };
        match self {
            Upstream::Tls(client) => client
                .request(request)
                .await
                .map_err(|e| unreachable(e.to_string())),
            Upstream::PlaintextForTests(map) => {
                let addr = map
                    .get(&host)
                    .ok_or_else(|| unreachable("no test fixture for this host".to_owned()))?;
                send_plain(*addr, request).await.map_err(unreachable)
            }
            Upstream::TlsWithLocal { tls, local } => match local.get(&host) {
                Some(addr) => send_plain(*addr, request).await.map_err(unreachable),
                None => tls
                    .request(request)
                    .await
                    .map_err(|e| unreachable(e.to_string())),
            },
        }
    }
}

/// Sends `request` over plain HTTP/1.1 to `addr`, in origin form.
async fn send_plain(
    addr: SocketAddr,
    request: Request<Full<Bytes>>,
) -> Result<Response<Incoming>, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let (mut parts, body) = request.into_parts();
    let origin = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    parts.uri = origin.parse::<Uri>().map_err(|e| e.to_string())?;
    sender
        .send_request(Request::from_parts(parts, body))
        .await
        .map_err(|e| e.to_string())
}
