//! dev-only: an in-process Kubernetes API double and a simulated kubelet for controller tests.
//!
//! The real `kube::Client` talks to [`ApiServer`] through an in-process tower
//! service, so requests, watches, conflicts and `Status` errors go through
//! kube's own serialization and error handling:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use protobot_testkit::{ApiServer, Kubelet};
//! let server = ApiServer::new();
//! server.register_crd_yaml(include_str!("../tests/fixtures/widget-crd.yaml"))?;
//! let client = server.client();
//! let kubelet = Kubelet::start(&server);
//! # drop((client, kubelet)); Ok(()) }
//! ```
//!
//! Module map: [`server`] (public handle, tower service), `http` (loopback
//! endpoint), `handler` (verbs), `record` (request log), `store` (objects,
//! resourceVersions, history), `write` / `delete` / `admission` (write rules),
//! `objectmeta` (labels, data keys, Secret stringData), `gc` (finalization,
//! owner GC, namespace termination), `watch` (streams), `apply` + `managed` +
//! `lists` (server-side apply), `schema` (structural validation), `selector`, `route`,
//! `discovery`, [`faults`], [`kubelet`], [`wait`].

mod admission;
mod apply;
mod body;
mod delete;
mod discovery;
mod error;
pub mod faults;
mod gc;
mod handler;
mod http;
pub mod kubelet;
mod lists;
mod managed;
mod objectmeta;
mod podcheck;
mod record;
mod resources;
mod route;
mod schema;
mod selector;
pub mod server;
mod store;
pub mod wait;
mod watch;
mod write;

pub use body::{BodyError, ResponseBody};
pub use error::{ApiError, Cause, TestkitError};
pub use faults::{FaultRule, Faults, Verb, WatchCut};
pub use http::HttpServer;
pub use kubelet::{
    BubblewrapContainerExecutor, ContainerExecutor, ContainerExit, ContainerLaunch, ExecFuture,
    ExecutorError, KillSignal, Kubelet, Mount, ProcessExecutor,
};
pub use record::RecordedRequest;
pub use resources::ResourceType;
pub use server::{ApiServer, ApiService, ServerConfig};
pub use wait::{WaitError, until};
