//! Watches: initial events, bookmarks, selector transitions, resume from a
//! resourceVersion after a dropped connection (no lost events), 410 Gone.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use protobot_testkit::{ApiServer, ServerConfig};
use serde_json::json;

use crate::support::{cms, config_map, server, within};

fn name(c: &ConfigMap) -> String {
    c.metadata.name.clone().unwrap()
}

/// The next event that is not a periodic bookmark.
async fn next_change<S>(stream: &mut S, what: &str) -> WatchEvent<ConfigMap>
where
    S: futures::Stream<Item = kube::Result<WatchEvent<ConfigMap>>> + Unpin,
{
    within(what, async {
        loop {
            match stream.try_next().await.unwrap() {
                Some(WatchEvent::Bookmark(_)) => continue,
                Some(ev) => return ev,
                None => panic!("stream ended while waiting for {what}"),
            }
        }
    })
    .await
}

fn describe(ev: &WatchEvent<ConfigMap>) -> String {
    match ev {
        WatchEvent::Added(c) => format!("ADDED {}", name(c)),
        WatchEvent::Modified(c) => format!("MODIFIED {}", name(c)),
        WatchEvent::Deleted(c) => format!("DELETED {}", name(c)),
        WatchEvent::Bookmark(_) => "BOOKMARK".to_owned(),
        WatchEvent::Error(s) => format!("ERROR {} {}", s.code, s.reason),
    }
}

#[tokio::test]
async fn watch_from_zero_sends_initial_added_events_then_changes() {
    let server = server();
    let api = cms(&server);
    api.create(&PostParams::default(), &config_map("pre", &[]))
        .await
        .unwrap();
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let first = next_change(&mut stream, "initial event").await;
    assert_eq!(describe(&first), "ADDED pre");
    api.create(&PostParams::default(), &config_map("post", &[]))
        .await
        .unwrap();
    api.patch(
        "post",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "v"}})),
    )
    .await
    .unwrap();
    api.delete("post", &DeleteParams::default()).await.unwrap();
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(describe(&next_change(&mut stream, "changes").await));
    }
    assert_eq!(got, ["ADDED post", "MODIFIED post", "DELETED post"]);
}

#[tokio::test]
async fn watch_resume_after_dropped_connection_loses_no_event() {
    let server = server();
    let api = cms(&server);
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
    api.create(&PostParams::default(), &config_map("a", &[]))
        .await
        .unwrap();
    let ev = next_change(&mut stream, "a").await;
    assert_eq!(describe(&ev), "ADDED a");
    let last_rv = match &ev {
        WatchEvent::Added(c) => c.metadata.resource_version.clone().unwrap(),
        _ => unreachable!(),
    };

    // The connection breaks; changes keep happening while the client is away.
    server.faults().drop_watches();
    let end = within("stream end", stream.next()).await;
    assert!(
        matches!(end, None | Some(Err(_))),
        "stream should end after a drop: {end:?}"
    );
    api.create(&PostParams::default(), &config_map("b", &[]))
        .await
        .unwrap();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"x": "1"}})),
    )
    .await
    .unwrap();
    api.delete("b", &DeleteParams::default()).await.unwrap();

    let mut resumed = api
        .watch(&WatchParams::default(), &last_rv)
        .await
        .unwrap()
        .boxed();
    let mut got = Vec::new();
    while got.len() < 3 {
        got.push(describe(&next_change(&mut resumed, "resumed events").await));
    }
    assert_eq!(got, ["ADDED b", "MODIFIED a", "DELETED b"]);
}

#[tokio::test]
async fn watch_from_a_compacted_resource_version_gets_410_gone() {
    let server = ApiServer::with_config(ServerConfig {
        history_limit: 3,
        ..ServerConfig::default()
    });
    let api = cms(&server);
    let old_rv = server.resource_version().to_string();
    for i in 0..5 {
        api.create(&PostParams::default(), &config_map(&format!("c{i}"), &[]))
            .await
            .unwrap();
    }
    let mut stream = api
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    let ev = next_change(&mut stream, "410").await;
    match ev {
        WatchEvent::Error(s) => {
            assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
            assert!(
                s.message.starts_with("too old resource version"),
                "{}",
                s.message
            );
        }
        other => panic!("expected 410, got {}", describe(&other)),
    }
}

#[tokio::test]
async fn bookmarks_carry_the_latest_resource_version() {
    let server = ApiServer::with_config(ServerConfig {
        bookmark_interval: Duration::from_millis(50),
        ..ServerConfig::default()
    });
    server
        .register_crd_yaml(crate::support::WIDGET_CRDS)
        .unwrap();
    let api = cms(&server);
    let rv = server.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &config_map("z", &[]))
        .await
        .unwrap();
    let want = server.resource_version().to_string();
    let bookmark_rv = within("bookmark", async {
        loop {
            if let Some(WatchEvent::Bookmark(b)) = stream.try_next().await.unwrap() {
                break b.metadata.resource_version;
            }
        }
    })
    .await;
    assert_eq!(bookmark_rv, want);
}

#[tokio::test]
async fn streaming_list_ends_initial_events_with_an_annotated_bookmark() {
    let server = server();
    let api = cms(&server);
    api.create(&PostParams::default(), &config_map("one", &[]))
        .await
        .unwrap();
    let wp = WatchParams::streaming_lists();
    let mut stream = api.watch(&wp, "").await.unwrap().boxed();
    let first = next_change(&mut stream, "initial").await;
    assert_eq!(describe(&first), "ADDED one");
    match within("bookmark", stream.try_next())
        .await
        .unwrap()
        .unwrap()
    {
        WatchEvent::Bookmark(b) => {
            assert_eq!(
                b.metadata
                    .annotations
                    .get("k8s.io/initial-events-end")
                    .map(String::as_str),
                Some("true")
            )
        }
        other => panic!("expected bookmark, got {}", describe(&other)),
    }
}

#[tokio::test]
async fn label_selector_watches_see_objects_enter_and_leave() {
    let server = server();
    let api = cms(&server);
    let rv = server.resource_version().to_string();
    let mut stream = api
        .watch(&WatchParams::default().labels("app=web"), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &config_map("m", &[]))
        .await
        .unwrap();
    api.patch(
        "m",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "web"}}})),
    )
    .await
    .unwrap();
    api.patch(
        "m",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"app": "db"}}})),
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        got.push(describe(&next_change(&mut stream, "transitions").await));
    }
    assert_eq!(got, ["ADDED m", "DELETED m"]);
}
