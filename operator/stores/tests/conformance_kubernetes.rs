//! The WorkStore conformance suite against the Kubernetes backend, talking
//! through the real `kube::Client` to the in-process API double (testkit) with
//! the project's generated CRDs installed.

use protobot_stores::{AdapterConfig, KubeStore};

async fn store(project: String, cfg: AdapterConfig) -> KubeStore {
    let server = protobot_testkit::server::ApiServer::new();
    #[allow(clippy::expect_used)]
    server
        .register_crd_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds"))
        .expect("the generated CRDs register");
    let client = server.client();
    // The server lives as long as the client's in-process service.
    KubeStore::new(client, "default", &project, cfg)
}

protobot_stores::workstore_conformance!(store);
