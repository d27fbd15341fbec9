//! Lists: label and field selectors, pagination with `limit` + `continue`, and
//! the list resourceVersion.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, PostParams};

use crate::support::{cms, config_map, server, status_of};

fn labelled(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let mut c = config_map(name, &[]);
    c.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    c
}

fn names(list: &kube::core::ObjectList<ConfigMap>) -> Vec<String> {
    list.items
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect()
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists() {
    let server = server();
    let api = cms(&server);
    for (name, labels) in [
        ("web-1", vec![("app", "web"), ("tier", "front")]),
        ("web-2", vec![("app", "web")]),
        ("db-1", vec![("app", "db"), ("tier", "back")]),
    ] {
        api.create(&PostParams::default(), &labelled(name, &labels))
            .await
            .unwrap();
    }
    let cases = [
        ("app=web", vec!["web-1", "web-2"]),
        ("app!=web", vec!["db-1"]),
        ("app in (db,cache)", vec!["db-1"]),
        ("app notin (db)", vec!["web-1", "web-2"]),
        ("tier", vec!["db-1", "web-1"]),
        ("!tier", vec!["web-2"]),
    ];
    for (sel, want) in cases {
        let got = api.list(&ListParams::default().labels(sel)).await.unwrap();
        assert_eq!(names(&got), want, "labelSelector {sel}");
    }
    let by_name = api
        .list(&ListParams::default().fields("metadata.name=web-2"))
        .await
        .unwrap();
    assert_eq!(names(&by_name), ["web-2"]);
    let s = status_of(api.list(&ListParams::default().fields("data.k=v")).await);
    assert_eq!(s.code, 400);
}

#[tokio::test]
async fn pagination_returns_every_item_once_with_continue_tokens() {
    let server = server();
    let api = cms(&server);
    for i in 0..7 {
        api.create(&PostParams::default(), &config_map(&format!("cm-{i}"), &[]))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut lp = ListParams::default().limit(3);
    let mut pages = 0;
    loop {
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        seen.extend(names(&page));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => lp = lp.continue_token(&token),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let want: Vec<String> = (0..7).map(|i| format!("cm-{i}")).collect();
    assert_eq!(seen, want);
}

#[tokio::test]
async fn list_resource_version_is_the_latest_and_too_large_versions_time_out() {
    let server = server();
    let api = cms(&server);
    api.create(&PostParams::default(), &config_map("x", &[]))
        .await
        .unwrap();
    let list = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        list.metadata.resource_version.unwrap(),
        server.resource_version().to_string()
    );
    let future = (server.resource_version() + 100).to_string();
    let s = status_of(api.list(&ListParams::default().at(&future)).await);
    assert_eq!(s.code, 504);
    // cluster-wide list across namespaces
    server.create_namespace("other").unwrap();
    let other: kube::Api<ConfigMap> = kube::Api::namespaced(server.client(), "other");
    other
        .create(&PostParams::default(), &config_map("y", &[]))
        .await
        .unwrap();
    let all: kube::Api<ConfigMap> = kube::Api::all(server.client());
    assert_eq!(
        all.list(&ListParams::default()).await.unwrap().items.len(),
        2
    );
}

#[tokio::test]
async fn a_continue_token_older_than_the_history_is_410() {
    use protobot_testkit::{ApiServer, ServerConfig};
    let server = ApiServer::with_config(ServerConfig {
        history_limit: 2,
        ..ServerConfig::default()
    });
    let api = cms(&server);
    for i in 0..3 {
        api.create(&PostParams::default(), &config_map(&format!("p{i}"), &[]))
            .await
            .unwrap();
    }
    let page = api.list(&ListParams::default().limit(1)).await.unwrap();
    let token = page.metadata.continue_.unwrap();
    for i in 3..6 {
        api.create(&PostParams::default(), &config_map(&format!("p{i}"), &[]))
            .await
            .unwrap();
    }
    let s = status_of(
        api.list(&ListParams::default().limit(1).continue_token(&token))
            .await,
    );
    assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
}

#[tokio::test]
async fn metadata_only_get_list_and_watch_serve_partial_object_metadata() {
    use futures::TryStreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let server = server();
    let api = cms(&server);
    api.create(&PostParams::default(), &labelled("meta", &[("a", "b")]))
        .await
        .unwrap();
    let m = api.get_metadata("meta").await.unwrap();
    assert_eq!(m.metadata.labels.unwrap()["a"], "b");
    let list = api.list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let mut stream = Box::pin(
        api.watch_metadata(&WatchParams::default(), "0")
            .await
            .unwrap(),
    );
    match crate::support::within("metadata watch", stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        WatchEvent::Added(o) => assert_eq!(o.metadata.name.as_deref(), Some("meta")),
        other => panic!("unexpected {other:?}"),
    }
}
