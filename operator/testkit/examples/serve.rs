//! Run the API double (with a kubelet) on 127.0.0.1 for manual poking or e2e
//! scripts: `cargo run -p protobot-testkit --example serve -- [CRD_DIR] [KUBECONFIG_OUT]`.
//! Writes a kubeconfig (default `./testkit.kubeconfig`) and serves until Ctrl-C.

use protobot_testkit::{ApiServer, Kubelet};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let crd_dir = args.next();
    let out = args
        .next()
        .unwrap_or_else(|| "testkit.kubeconfig".to_owned());
    let server = ApiServer::new();
    if let Some(dir) = crd_dir {
        let names = server.register_crd_dir(&dir)?;
        println!("registered CRDs: {names:?}");
    }
    let _kubelet = Kubelet::start(&server)?;
    let http = server.serve_http().await?;
    std::fs::write(&out, http.kubeconfig_yaml())?;
    println!("serving {} (kubeconfig: {out})", http.url());
    tokio::signal::ctrl_c().await?;
    Ok(())
}
