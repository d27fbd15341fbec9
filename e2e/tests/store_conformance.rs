//! The WorkStore conformance suite (every VR and INV case of the lifecycle contract, the
//! 16-way claim race, lease recovery) on the Kubernetes backend, in the e2e cluster: on a
//! real API server (`KUBECONFIG`) the store runs as the chart's operator ServiceAccount
//! under the chart's RBAC, against the CRDs' real structural schemas, CEL rules and size
//! limits; without one, on the API double (as `protobot-stores` also runs it).

use protobot_stores::{AdapterConfig, KubeStore};

async fn store(project: String, cfg: AdapterConfig) -> KubeStore {
    let cluster = protobot_e2e::Cluster::connect("store").await;
    let store = KubeStore::new(cluster.operator.clone(), &cluster.namespace, &project, cfg);
    // The double must outlive the store's client; a real cluster's namespace is left for
    // the cluster's teardown (`make kube-down`), as the case may still be reading it.
    std::mem::forget(cluster);
    store
}

protobot_stores::workstore_conformance!(store);
