//! `protobot-model-double`: serves a model script on a local port (see the
//! library's documentation) until killed; prints `listening on http://ADDR`
//! once it accepts connections.

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::Parser;
use protobot_model_double::{ModelDouble, Script};

/// A deterministic model endpoint for tests (OpenAI chat completions and Anthropic messages).
#[derive(Debug, Parser)]
#[command(name = "protobot-model-double")]
struct Args {
    /// Address to listen on (port 0 picks one).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// The script: {"scenarios": [{"marker", "steps": [...], "failures": [429, 503]}]}
    /// (failures, optional: HTTP statuses answered before the steps, a scripted outage).
    #[arg(long)]
    script: PathBuf,
    /// Append every request as a JSON line to this file.
    #[arg(long)]
    record: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("protobot-model-double: failed to start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("protobot-model-double: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> Result<(), String> {
    let script = Script::load(&args.script).map_err(|e| e.to_string())?;
    let record = match &args.record {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("failed to open the record file {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("failed to listen on {}: {e}", args.listen))?;
    let double = ModelDouble::start_recording(listener, script, record)
        .map_err(|e| format!("failed to start: {e}"))?;
    println!("listening on http://{}", double.addr());
    std::future::pending::<()>().await;
    Ok(())
}
