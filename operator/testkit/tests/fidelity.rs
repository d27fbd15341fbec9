//! Fidelity tests of the in-process API double and the simulated kubelet, driven
//! through the real `kube::Client` and `kube-runtime`.
//!
//! Module index:
//! - `support`: fixtures (`Widget` CR, server with CRDs) and `await_condition`.
//! - `crud`: create/get/replace, AlreadyExists, stale-update Conflict, status isolation, generation.
//! - `lists`: label/field selectors, pagination with `continue`, list resourceVersion.
//! - `watches`: initial events, bookmarks, resume after a dropped connection, 410 Gone.
//! - `deletion`: finalizers, owner GC (background, foreground, orphan), namespaces.
//! - `apply`: server-side apply field managers, conflicts, force, merge and JSON patches.
//! - `schema`: structural validation (422 naming the field), pruning, defaults.
//! - `discovery`: `kube::Discovery` against the double, CRDs registered from YAML.
//! - `runtime`: kube-runtime `watcher` and `Controller`, unchanged.
//! - `faults`: injected errors, latency and dropped watches.
//! - `http`: the loopback HTTP endpoint with a client built from `kube::Config`.
//! - `kubelet`: pods run as processes: phases, exit codes, deadlines, volumes, logs.

// This whole crate is test code; clippy's `allow-unwrap-in-tests` only covers
// `#[test]` functions, not the fixture helpers they share.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "fidelity/apply.rs"]
mod apply;
#[path = "fidelity/crud.rs"]
mod crud;
#[path = "fidelity/deletion.rs"]
mod deletion;
#[path = "fidelity/discovery.rs"]
mod discovery;
#[path = "fidelity/faults.rs"]
mod faults;
#[path = "fidelity/http.rs"]
mod http;
#[path = "fidelity/kubelet.rs"]
mod kubelet;
#[path = "fidelity/lists.rs"]
mod lists;
#[path = "fidelity/runtime.rs"]
mod runtime;
#[path = "fidelity/schema.rs"]
mod schema;
#[path = "fidelity/support.rs"]
mod support;
#[path = "fidelity/watches.rs"]
mod watches;
