//! dev-only: an in-process Kubernetes API double and a simulated kubelet for controller tests.
