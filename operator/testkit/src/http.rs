//! The double over real HTTP on 127.0.0.1: for clients that need a URL or a
//! kubeconfig (a `kube::Client` built from `kube::Config`, `kubectl`). Plain
//! HTTP/1.1, no TLS and no authentication; a dropped watch aborts the connection.

use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use tokio::{net::TcpListener, task::JoinHandle};

use crate::{handler, server::Shared};

/// A running loopback HTTP endpoint; dropping it stops accepting connections.
#[derive(Debug)]
pub struct HttpServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl HttpServer {
    /// Bind 127.0.0.1 on a free port and serve the double. Needs a Tokio runtime.
    pub(crate) async fn start(shared: Arc<Shared>) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(handler::handle(shared, req).await) }
                    });
                    // A failed connection (client gone, injected watch drop) only ends that connection.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig pointing at this endpoint (context `testkit`, namespace `default`).
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: testkit\n  cluster:\n    server: {url}\n\
             users:\n- name: testkit\n  user: {{}}\ncontexts:\n- name: testkit\n  context:\n    cluster: testkit\n    user: testkit\n    namespace: default\n\
             current-context: testkit\n",
            url = self.url()
        )
    }

    /// A `kube::Config` for this endpoint (default namespace `default`).
    pub fn config(&self) -> kube::Config {
        let mut config = kube::Config::new(
            self.url()
                .parse()
                .unwrap_or_else(|_| http::Uri::from_static("http://127.0.0.1")),
        );
        config.default_namespace = "default".to_owned();
        config
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
