//! `protobot operator`: runs the controllers in a cluster (or against
//! KUBECONFIG's cluster), with JSON logs and the admin server.

use std::{net::SocketAddr, process::ExitCode};

use clap::Args;

/// Arguments of `protobot operator`.
#[derive(Debug, Args)]
pub struct OperatorArgs {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Address of `/metrics`, `/healthz` and `/readyz`.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub admin_addr: SocketAddr,
    /// Log filter (tracing `EnvFilter` syntax); `RUST_LOG` wins when set.
    #[arg(long, default_value = "info")]
    pub log: String,
}

/// Runs the operator until interrupted.
pub fn operator(args: OperatorArgs) -> ExitCode {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(&args.log))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("protobot: failed to start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(async {
        tokio::select! {
            result = protobot_controller::operator::run(args.namespace, args.admin_addr) => match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "operator stopped");
                    ExitCode::from(1)
                }
            },
            _ = tokio::signal::ctrl_c() => {
                tracing::info!("interrupted; shutting down");
                ExitCode::SUCCESS
            }
        }
    })
}
