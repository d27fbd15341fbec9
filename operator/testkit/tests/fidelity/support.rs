//! Shared fixtures: the `Widget` custom resource, a server with the fixture CRDs,
//! ConfigMap builders, and bounded waiting.

use std::{future::Future, time::Duration};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, CustomResource, api::ObjectMeta};
use protobot_testkit::ApiServer;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Upper bound for any wait in these tests.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// The fixture custom resource (see `tests/fixtures/widget-crd.yaml`).
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "testkit.example.com",
    version = "v1",
    kind = "Widget",
    namespaced,
    status = "WidgetStatus"
)]
pub struct WidgetSpec {
    pub image: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// Status of [`Widget`].
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WidgetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

pub const WIDGET_CRDS: &str = include_str!("../fixtures/widget-crd.yaml");

/// A server with the fixture CRDs registered.
pub fn server() -> ApiServer {
    let server = ApiServer::new();
    server.register_crd_yaml(WIDGET_CRDS).unwrap();
    server
}

pub fn widget(name: &str, image: &str) -> Widget {
    Widget::new(
        name,
        WidgetSpec {
            image: image.to_owned(),
            ..WidgetSpec::default()
        },
    )
}

pub fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

/// Await a future with the test timeout, failing with `what` when it expires.
pub async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// Poll `get` until `pred` holds (bounded by [`TIMEOUT`]), returning the last value.
pub async fn await_condition<T, F, Fut>(what: &str, mut get: F, pred: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = T>,
{
    within(what, async {
        loop {
            let v = get().await;
            if pred(&v) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
}

/// The `Status` of a failed API call.
pub fn status_of<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> Box<kube::core::Status> {
    match r {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

pub fn cms(server: &ApiServer) -> Api<ConfigMap> {
    Api::namespaced(server.client(), "default")
}
