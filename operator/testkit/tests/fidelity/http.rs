//! The loopback HTTP endpoint: a `kube::Client` built from a `kube::Config`
//! (the full hyper client stack) gets the same behaviour, including watch resume
//! after a dropped connection.

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};

use crate::support::{config_map, server, status_of, within};

#[tokio::test]
async fn a_client_from_config_works_over_loopback_http() {
    let server = server();
    let http = server.serve_http().await.unwrap();
    assert!(http.kubeconfig_yaml().contains(&http.url()));
    let client = kube::Client::try_from(http.config()).unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(client);
    api.create(&PostParams::default(), &config_map("over-http", &[]))
        .await
        .unwrap();
    let s = status_of(
        api.create(&PostParams::default(), &config_map("over-http", &[]))
            .await,
    );
    assert_eq!(s.code, 409);

    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &config_map("second", &[]))
        .await
        .unwrap();
    let first = within("event over http", async {
        loop {
            match stream.try_next().await.unwrap() {
                Some(WatchEvent::Added(c)) => break c,
                Some(_) => continue,
                None => panic!("stream ended"),
            }
        }
    })
    .await;
    assert_eq!(first.metadata.name.as_deref(), Some("second"));
    server.faults().drop_watches();
    let end = within("stream end", stream.next()).await;
    assert!(matches!(end, None | Some(Err(_))), "{end:?}");
    api.create(&PostParams::default(), &config_map("third", &[]))
        .await
        .unwrap();
    let mut resumed = api
        .watch(
            &WatchParams::default(),
            first.metadata.resource_version.as_deref().unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    let next = within("resumed over http", async {
        loop {
            match resumed.try_next().await.unwrap() {
                Some(WatchEvent::Added(c)) => break c,
                Some(_) => continue,
                None => panic!("stream ended"),
            }
        }
    })
    .await;
    assert_eq!(next.metadata.name.as_deref(), Some("third"));
}
