//! The admin HTTP server: `/metrics` (Prometheus text format), `/healthz`
//! (the process serves requests) and `/readyz` (true only after the caches
//! synced, flipped by the caller through [`Readiness`]).

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Router,
    extract::State as AxumState,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::{net::TcpListener, task::JoinHandle};

/// Readiness flag shared between the controllers and `/readyz`.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Marks the process ready (caches synced).
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Marks the process not ready (e.g. a watch lost its stream).
    pub fn set_not_ready(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// Current value.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Why the admin server could not start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Binding the listen address failed.
    #[error(
        "failed to bind the admin server to {addr}; pick another --admin-addr or free the port"
    )]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

#[derive(Clone)]
struct AdminState {
    registry: Registry,
    readiness: Readiness,
}

/// The router (exposed for in-process tests and embedding).
pub fn router(registry: Registry, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { (StatusCode::OK, "ok\n") }))
        .route("/readyz", get(readyz))
        .with_state(AdminState {
            registry,
            readiness,
        })
}

async fn metrics(AxumState(state): AxumState<AdminState>) -> impl IntoResponse {
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&state.registry.gather(), &mut body) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, encoder.format_type().to_string())],
            body,
        ),
        Err(e) => {
            tracing::error!(error = %e, "failed to encode metrics");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/plain".to_string())],
                e.to_string().into_bytes(),
            )
        }
    }
}

async fn readyz(AxumState(state): AxumState<AdminState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced\n")
    }
}

/// Binds `addr` and serves the admin endpoints until the task is aborted.
/// Returns the bound address (useful with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    registry: Registry,
    readiness: Readiness,
) -> Result<(SocketAddr, JoinHandle<()>), AdminError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| AdminError::Bind { addr, source })?;
    let app = router(registry, readiness);
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "admin server stopped");
        }
    });
    tracing::info!(%bound, "admin server listening");
    Ok((bound, task))
}
