//! The usage port in a cluster (issue 34): after each sandbox run the Job Site reads what the
//! run spent on model calls from the egress proxy's admin port (`GET /usage/<run id>`,
//! `protobot egress-proxy --admin-listen`).
//!
//! The proxy may run several replicas behind one Service and a run's calls may have gone
//! through any of them, so the admin URL's host is resolved to every address it has (the
//! chart gives a headless Service, whose name resolves to each ready proxy pod) and every
//! proxy is asked; their records are summed ([`RunUsage::absorb`]). A proxy that metered
//! nothing of the run answers 404. One that cannot be reached fails the read: the item then
//! misses that run's usage and says so (a warning), rather than recording a partial figure as
//! the whole.

use std::{net::SocketAddr, time::Duration};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use protobot_jobsite::usage::{RunUsage, UsageFuture, UsageReadError, UsageSource};

/// Largest usage record read from a proxy (a run's record is a few hundred bytes per model).
const MAX_RECORD_BYTES: usize = 1 << 20;

/// How long one proxy gets to answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why an admin URL is refused.
#[derive(Debug, thiserror::Error)]
pub enum AdminUrlError {
    /// Not `http://host:port[/]`.
    #[error(
        "--egress-proxy-admin-url {0:?} is not http://HOST:PORT (the egress proxy's admin listener, e.g. http://protobot-egress-proxy-admin.NAMESPACE.svc:9090; TLS is not served there)"
    )]
    Malformed(String),
}

/// Reads runs' usage from every egress proxy behind one admin URL.
#[derive(Clone, Debug)]
pub struct ProxyAdminUsage {
    host: String,
    port: u16,
    url: String,
}

impl ProxyAdminUsage {
    /// From `http://host:port` (a trailing `/` is allowed; no path, user or query).
    pub fn new(url: &str) -> Result<ProxyAdminUsage, AdminUrlError> {
        let malformed = || AdminUrlError::Malformed(url.to_owned());
        let rest = url.strip_prefix("http://").ok_or_else(malformed)?;
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.is_empty() || authority.contains(['/', '@', '?', '#']) {
            return Err(malformed());
        }
        let (host, port) = authority.rsplit_once(':').ok_or_else(malformed)?;
        let port: u16 = port.parse().map_err(|_| malformed())?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || port == 0 {
            return Err(malformed());
        }
        Ok(ProxyAdminUsage {
            host: host.to_owned(),
            port,
            url: format!("http://{authority}"),
        })
    }

    async fn read(&self, run_id: &str) -> Result<Option<RunUsage>, ReadError> {
        let addresses: Vec<SocketAddr> = tokio::net::lookup_host((self.host.as_str(), self.port))
            .await
            .map_err(ReadError::Resolve)?
            .collect();
        self.read_from(addresses, run_id).await
    }

    /// Asks every proxy at `addresses` and sums their shares of the run.
    async fn read_from(
        &self,
        addresses: Vec<SocketAddr>,
        run_id: &str,
    ) -> Result<Option<RunUsage>, ReadError> {
        if addresses.is_empty() {
            return Err(ReadError::NoAddress);
        }
        let path = format!("/usage/{}", encode_segment(run_id));
        let mut total: Option<RunUsage> = None;
        for address in dedup(addresses) {
            let answer = tokio::time::timeout(TIMEOUT, get(address, &self.host, &path))
                .await
                .map_err(|_| ReadError::Timeout(address))??;
            if let Some(record) = answer {
                if record.run_id != run_id {
                    return Err(ReadError::OtherRun {
                        address,
                        got: record.run_id,
                    });
                }
                match &mut total {
                    Some(sum) => sum.absorb(&record),
                    None => total = Some(record),
                }
            }
        }
        Ok(total)
    }
}

impl UsageSource for ProxyAdminUsage {
    fn run_usage<'a>(&'a self, run_id: &'a str) -> UsageFuture<'a> {
        Box::pin(async move {
            self.read(run_id).await.map_err(|e| UsageReadError {
                run_id: run_id.to_owned(),
                from: self.url.clone(),
                source: Box::new(e),
            })
        })
    }
}

/// Why one read failed.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error("cannot resolve the proxy's admin host")]
    Resolve(#[source] std::io::Error),
    #[error("the proxy's admin host resolved to no address")]
    NoAddress,
    #[error("cannot connect to the proxy at {0}")]
    Connect(SocketAddr, #[source] std::io::Error),
    #[error("the HTTP exchange with the proxy at {0} failed")]
    Http(SocketAddr, #[source] hyper::Error),
    #[error("the proxy at {0} did not answer within {TIMEOUT:?}")]
    Timeout(SocketAddr),
    #[error("the proxy at {address} answered {status}")]
    Status {
        address: SocketAddr,
        status: StatusCode,
    },
    #[error("the proxy at {0} answered a record over {MAX_RECORD_BYTES} bytes or cut it short")]
    Body(SocketAddr),
    #[error("the proxy at {0} answered a record that is not a usage record")]
    Decode(SocketAddr, #[source] serde_json::Error),
    #[error("the proxy at {address} answered the record of run {got:?}")]
    OtherRun { address: SocketAddr, got: String },
}

/// One GET over HTTP/1.1: `Some(record)` on 200, `None` on 404.
async fn get(address: SocketAddr, host: &str, path: &str) -> Result<Option<RunUsage>, ReadError> {
    let stream = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| ReadError::Connect(address, e))?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ReadError::Http(address, e))?;
    let driver = tokio::spawn(connection);
    let request = Request::get(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .map_err(|_| ReadError::Status {
            address,
            status: StatusCode::BAD_REQUEST,
        })?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| ReadError::Http(address, e))?;
    let status = response.status();
    let body = Limited::new(response.into_body(), MAX_RECORD_BYTES)
        .collect()
        .await
        .map_err(|_| ReadError::Body(address))?
        .to_bytes();
    driver.abort();
    match status {
        StatusCode::OK => serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| ReadError::Decode(address, e)),
        StatusCode::NOT_FOUND => Ok(None),
        status => Err(ReadError::Status { address, status }),
    }
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn dedup(mut addresses: Vec<SocketAddr>) -> Vec<SocketAddr> {
    addresses.sort();
    addresses.dedup();
    addresses
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_urls_are_http_host_and_port_only() {
        let usage = ProxyAdminUsage::new("http://proxy-admin.ns.svc:9090/").expect("valid");
        assert_eq!(
            (usage.host.as_str(), usage.port),
            ("proxy-admin.ns.svc", 9090)
        );
        let v6 = ProxyAdminUsage::new("http://[::1]:9090").expect("valid");
        assert_eq!(v6.host, "::1");
        for bad in [
            "https://proxy:9090",
            "http://proxy",
            "http://proxy:0",
            "http://proxy:99999",
            "http://proxy:9090/usage",
            "http://user@proxy:9090",
            "http://:9090",
            "proxy:9090",
            "",
        ] {
            assert!(ProxyAdminUsage::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    const PRICES: &str = "m1: {input: \"1\", output: \"2\"}";
    const CHAT: &[u8] = br#"{"model":"m1","usage":{"prompt_tokens":1000,"completion_tokens":500}}"#;

    /// A real admin listener of the egress proxy (`protobot_egress::admin`) with its own meter.
    async fn proxy() -> (SocketAddr, protobot_egress::UsageMeter) {
        let prices = serde_yaml_ng::from_str(PRICES).expect("prices");
        let meter = protobot_egress::UsageMeter::new(prices, None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let served = meter.clone();
        tokio::spawn(protobot_egress::server::serve(
            listener,
            move |request| {
                let meter = served.clone();
                async move {
                    protobot_egress::admin::respond(
                        &prometheus::Registry::new(),
                        Some(&meter),
                        &request,
                    )
                }
            },
            std::future::pending(),
        ));
        (address, meter)
    }

    fn call(meter: &protobot_egress::UsageMeter, run: &str, body: &[u8]) {
        let session = protobot_egress::Session {
            work_item: "wi-1".into(),
            role: "worker-b".into(),
            trace_id: run.into(),
            ..Default::default()
        };
        meter.record_answer(
            &session,
            protobot_egress::ModelApi::OpenAiChat,
            Some("application/json"),
            body,
        );
    }

    fn reader(address: SocketAddr) -> ProxyAdminUsage {
        ProxyAdminUsage::new(&format!("http://{address}")).expect("url")
    }

    #[tokio::test]
    async fn every_replicas_share_of_a_run_is_read_and_summed() {
        let (a, meter_a) = proxy().await;
        let (b, meter_b) = proxy().await;
        call(&meter_a, "run-1", CHAT);
        call(&meter_a, "run-1", CHAT);
        call(&meter_b, "run-1", CHAT);
        call(&meter_b, "run-1", br#"{"model":"m1"}"#);
        call(&meter_b, "run-2", CHAT);

        let both = reader(a)
            .read_from(vec![a, b, a], "run-1")
            .await
            .expect("read")
            .expect("metered");
        assert_eq!(both.run_id, "run-1");
        let m1 = &both.models["m1"];
        assert_eq!((m1.calls, m1.calls_without_usage), (3, 1));
        assert_eq!((m1.tokens.input, m1.tokens.output), (3000, 1500));
        // 3 × (1000 × $1 + 500 × $2) per million tokens.
        assert_eq!(m1.cost_microdollars, Some(6000));

        // Through the port, by the URL's host (one address here).
        let alone = reader(a).run_usage("run-1").await.expect("read");
        assert_eq!(alone.map(|u| u.models["m1"].calls), Some(2));
        // No proxy metered run-3: none, not an error.
        assert_eq!(
            reader(a)
                .read_from(vec![a, b], "run-3")
                .await
                .expect("read"),
            None
        );
    }

    #[tokio::test]
    async fn an_unreachable_replica_fails_the_read_rather_than_undercount() {
        let (a, meter_a) = proxy().await;
        call(&meter_a, "run-1", CHAT);
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.local_addr().expect("address")
        };
        let error = reader(a)
            .read_from(vec![a, closed], "run-1")
            .await
            .expect_err("one proxy is down");
        assert!(
            matches!(error, ReadError::Connect(at, _) if at == closed),
            "{error}"
        );
        let port_error = reader(closed).run_usage("run-1").await.expect_err("down");
        let text = format!("{port_error}");
        assert!(
            text.contains("run-1") && text.contains("admin port"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_server_that_is_not_a_proxy_admin_is_an_error() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let answers: std::sync::Arc<std::sync::Mutex<Vec<(u16, &'static str)>>> =
            std::sync::Arc::new(std::sync::Mutex::new(vec![
                (200, r#"{"runId":"run-1","models":{}}"#),
                (200, r#"{"runId":"other","models":{}}"#),
                (200, "not json"),
                (500, "boom"),
            ]));
        let served = answers.clone();
        tokio::spawn(protobot_egress::server::serve(
            listener,
            move |_request| {
                let next = served.lock().map(|mut a| a.pop()).ok().flatten();
                async move {
                    let (status, body) = next.unwrap_or((404, ""));
                    let mut response = hyper::Response::new(http_body_util::Full::new(
                        Bytes::from_static(body.as_bytes()),
                    ));
                    *response.status_mut() = StatusCode::from_u16(status).expect("status");
                    response
                }
            },
            std::future::pending(),
        ));
        let usage = reader(address);
        let read = || usage.read_from(vec![address], "run-1");
        assert!(matches!(read().await, Err(ReadError::Status { status, .. }) if status == 500));
        assert!(matches!(read().await, Err(ReadError::Decode(..))));
        assert!(matches!(read().await, Err(ReadError::OtherRun { got, .. }) if got == "other"));
        assert_eq!(
            read()
                .await
                .expect("an empty record")
                .map(|u| u.models.len()),
            Some(0)
        );
        assert_eq!(read().await.expect("404"), None);
    }

    #[test]
    fn run_ids_are_one_path_segment() {
        assert_eq!(encode_segment("wi-a_1.2~x"), "wi-a_1.2~x");
        assert_eq!(encode_segment("../x y/%"), "..%2Fx%20y%2F%25");
    }
}
