//! The accept loop shared by the proxy and the admin listener: HTTP/1.1 on a
//! bound TCP listener, one task per connection, until `shutdown` resolves.
//!
//! Every connection is bounded ([`ServeLimits`]): at most `max_connections` at
//! once (one more is answered `503` and closed), a request head within
//! `header_timeout` (else `408` and closed) and at most `max_head_bytes` long
//! (else `431`, written by hyper). Request bodies are bounded by the broker
//! (`413`, and `408` when the body does not arrive in time). Each refusal is
//! counted in `protobot_egress_limit_refusals_total{limit}` when metrics are
//! given.

use std::{convert::Infallible, future::Future, sync::Arc, time::Duration};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

use crate::metrics::{EgressMetrics, LimitKind};

/// Resource limits of the accept loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeLimits {
    /// Most connections served at once.
    pub max_connections: usize,
    /// How long a client may take to send a request head.
    pub header_timeout: Duration,
    /// Largest request head (request line and headers), in bytes.
    pub max_head_bytes: usize,
}

impl Default for ServeLimits {
    fn default() -> ServeLimits {
        ServeLimits {
            max_connections: 512,
            header_timeout: Duration::from_secs(30),
            max_head_bytes: 64 * 1024,
        }
    }
}

/// Serves `handler` on `listener` until `shutdown` resolves, with the default
/// [`ServeLimits`] and no metrics. Connections already accepted finish on their
/// own tasks.
pub async fn serve<H, Fut>(listener: TcpListener, handler: H, shutdown: impl Future<Output = ()>)
where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    serve_with(listener, handler, shutdown, ServeLimits::default(), None).await;
}

/// [`serve`] with explicit limits; refusals are counted in `metrics`.
pub async fn serve_with<H, Fut>(
    listener: TcpListener,
    handler: H,
    shutdown: impl Future<Output = ()>,
    limits: ServeLimits,
    metrics: Option<EgressMetrics>,
) where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => return,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(error) => {
                // Per-connection errors (a reset before accept, too many open
                // files) must not stop the listener; back off briefly.
                tracing::warn!(target: "protobot::egress::server", error = %error, "failed to accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            count(&metrics, LimitKind::Connections);
            tracing::warn!(target: "protobot::egress::server", max = limits.max_connections, "connection cap reached; answering 503");
            tokio::spawn(refuse(
                stream,
                "503 Service Unavailable",
                "too-many-connections",
                "the proxy is at its connection limit; retry later",
            ));
            continue;
        };
        let handler = handler.clone();
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _slot = slot;
            connection(stream, handler, limits, metrics).await;
        });
    }
}

async fn connection<H, Fut>(
    stream: TcpStream,
    handler: H,
    limits: ServeLimits,
    metrics: Option<EgressMetrics>,
) where
    H: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<Full<Bytes>>> + Send + 'static,
{
    // A second handle on the socket answers `408` when a head does not arrive in
    // time (hyper closes without a status).
    let (stream, spare) = match duplicate(stream) {
        Ok(pair) => pair,
        Err(error) => {
            tracing::debug!(target: "protobot::egress::server", error = %error, "failed to set up a connection");
            return;
        }
    };
    let service = service_fn(move |req| {
        let handler = handler.clone();
        async move { Ok::<_, Infallible>(handler(req).await) }
    });
    let result = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(limits.max_head_bytes.max(8192))
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(error) = result {
        if error.is_timeout() {
            // hyper closes without a status; the spare handle says why.
            count(&metrics, LimitKind::HeaderTimeout);
            refuse(
                spare,
                "408 Request Timeout",
                "header-timeout",
                "the request head did not arrive in time",
            )
            .await;
            return;
        }
        if error.is_parse_too_large() {
            // hyper has answered 431 itself.
            count(&metrics, LimitKind::HeadTooLarge);
        }
        tracing::debug!(target: "protobot::egress::server", error = %error, "connection ended with an error");
    }
}

fn duplicate(stream: TcpStream) -> std::io::Result<(TcpStream, TcpStream)> {
    let std = stream.into_std()?;
    let spare = std.try_clone()?;
    Ok((TcpStream::from_std(std)?, TcpStream::from_std(spare)?))
}

fn count(metrics: &Option<EgressMetrics>, kind: LimitKind) {
    if let Some(metrics) = metrics {
        metrics.limit_refused(kind);
    }
}

/// Writes a one-shot JSON refusal and closes the connection.
async fn refuse(stream: TcpStream, status: &str, reason: &str, detail: &str) {
    let body =
        serde_json::json!({"code": "denied", "reason": reason, "detail": detail}).to_string();
    let text = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut rest = text.as_bytes();
    let deadline = tokio::time::sleep(Duration::from_secs(5));
    tokio::pin!(deadline);
    while !rest.is_empty() {
        tokio::select! {
            ready = stream.writable() => {
                if ready.is_err() {
                    return;
                }
                match stream.try_write(rest) {
                    Ok(n) => rest = &rest[n..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
            () = &mut deadline => return,
        }
    }
    if let Ok(std) = stream.into_std() {
        let _ = std.shutdown(std::net::Shutdown::Write);
    }
}
